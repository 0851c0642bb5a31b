"""The program stays small enough to read: its line budgets, the top level the card promises, and a
README walk through one RL step that a reader can follow in one sitting.

    python -m pytest -q tests/test_budgets.py          # seconds

The program is every tracked .py outside tests/, bench/, assignments/ and results/.
"""
import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"train.py", "rollout.py", "advantage.py", "reward.py", "evaluate.py", "maze.py", "simulate.py",
           "toy_task.py"}                      # the card's seven, and the template task beside them
SUPPORT = "fgrpo_utils"                        # every other module of the program lives here
TOTAL, TRAIN, FILE, FUNCTION = 6500, 550, 700, 80
WALK, WALK_LINES = 30, 600                     # the README's trace of one RL step


def program():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    files = [f for f in tracked if f.split("/")[0] not in ("tests", "bench", "assignments", "results")]
    if not files:                              # a folder without git (an archive): what is on disk
        files = [str(p.relative_to(ROOT)) for p in [*ROOT.glob("*.py"), *ROOT.glob(f"{SUPPORT}/*.py")]]
    return {f: (ROOT / f).read_text() for f in files if (ROOT / f).is_file()}


def body_lines(node):
    """A function's lines without its docstring."""
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return node.end_lineno - body[0].lineno + 1


def test_the_top_level_is_the_card_and_the_rest_is_one_folder():
    files = program()
    top = {f for f in files if "/" not in f}
    assert top == SCRIPTS, f"top-level Python files: {sorted(top ^ SCRIPTS)} differ from the card's"
    assert {f.split("/")[0] for f in files if "/" in f} == {SUPPORT}, sorted(f for f in files if "/" in f)


def test_the_line_budgets_hold():
    files = program()
    lines = {f: len(text.splitlines()) for f, text in files.items()}
    assert sum(lines.values()) <= TOTAL, f"the program is {sum(lines.values())} lines, over {TOTAL}"
    assert lines["train.py"] <= TRAIN, f"train.py is {lines['train.py']} lines, over {TRAIN}"
    over = {f: n for f, n in lines.items() if n > FILE}
    assert not over, f"files over {FILE} lines: {over}"
    long = [f"{f}:{n.lineno} {n.name} ({body_lines(n)} lines)" for f, text in files.items()
            for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and body_lines(n) > FUNCTION]
    assert not long, f"function bodies over {FUNCTION} lines (docstrings aside): {long}"
    stated = re.search(r"([\d,]+) lines of Python in all", (ROOT / "README.md").read_text())
    assert stated and abs(int(stated[1].replace(",", "")) - sum(lines.values())) <= 100, \
        f"README's file map states {stated and stated[1]} lines; the program is {sum(lines.values())}"


def test_support_modules_import_no_script():
    """Imports run one way: the scripts import fgrpo_utils, never the other way, so no cycle."""
    scripts = {s.removesuffix(".py") for s in SCRIPTS}
    bad = []
    for f, text in program().items():
        if not f.startswith(SUPPORT + "/"):
            continue
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            bad += [f"{f}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in scripts]
    assert not bad, bad


def walk_refs():
    """(file, line) of each `name` (`file.py:N`) in the README's walk through one RL step, in order."""
    text = (ROOT / "README.md").read_text()
    walk = text[text.index("## One RL step, through the code"):]
    walk = walk[:walk.index("\n## ", 3)]
    return [(m.group(1), int(m.group(2))) for m in re.finditer(r"`((?:fgrpo_utils/)?\w+\.py):(\d+)`", walk)]


def defined_at(files):
    """{(file, line): function node} for every def (and class) of the program."""
    out = {}
    for f, text in files.items():
        for n in ast.walk(ast.parse(text)):
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
                out[f, n.lineno] = n
    return out


def test_the_readme_walk_is_one_sitting_and_depth_first():
    """The walk names ~30 functions and ~600 lines at most, each one reached from a function named
    before it (a method by its name, as `engine.generate` reaches TorchEngine.generate), starting at
    train.main: the path a reader traces from main to the optimizer step and the log line."""
    files = program()
    defs = defined_at(files)
    refs = list(dict.fromkeys(walk_refs()))
    named = [(ref, defs.get(ref)) for ref in refs]
    missing = [f"{f}:{n}" for (f, n), node in named if node is None]
    assert not missing, f"README walk references that are no def or class line: {missing}"
    nodes = [node for _, node in named]
    assert nodes[0].name == "main" and refs[0][0] == "train.py"
    assert len(nodes) <= WALK, f"the walk names {len(nodes)} functions, over {WALK}"
    size = sum(body_lines(n) for n in nodes)               # a class named counts whole (its methods)
    assert size <= WALK_LINES, f"the walk's functions hold {size} lines, over {WALK_LINES}"

    def referenced(node):                  # the names a function calls or passes on
        return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
                if isinstance(n, (ast.Name, ast.Attribute))}
    for i, node in enumerate(nodes[1:], 1):
        reached = set().union(*(referenced(n) for n in nodes[:i]))
        assert node.name in reached, \
            f"{refs[i][0]}:{refs[i][1]} {node.name} is not reached from any function named before it in the walk"
