"""The program stays small enough to read: its line budgets, the top level the card promises, and a
README walk through one RL step that a reader can follow in one sitting.

    python -m pytest -q tests/test_budgets.py          # seconds

The program is every tracked .py outside tests/, bench/, assignments/ and results/. In a course's student
copy (assignments/release.json) the graded bodies are the student's: they count for none of the budgets.
"""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"train.py", "rollout.py", "advantage.py", "reward.py", "evaluate.py", "maze.py", "simulate.py",
           "toy_task.py"}                      # the card's seven, and the template task beside them
SUPPORT = "fgrpo_utils"                        # every other module of the program lives here
TOTAL, TRAIN, FILE, FUNCTION = 6000, 550, 700, 80
WALK, WALK_LINES, WALK_FILES = 30, 600, 5      # the README's trace of one RL step
STUDENT_COPY = (ROOT / "assignments" / "release.json").exists()


def graded_bodies(f, tree):
    """The graded functions' nodes in file f, in a student copy (none in the reference)."""
    if not STUDENT_COPY:
        return []
    sys.path.insert(0, str(ROOT / "assignments"))
    from problems import GRADED, file_of
    names = {g.rsplit(".", 1)[1] for g in GRADED if file_of(g) == f}
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]


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
    trees = {f: ast.parse(text) for f, text in files.items()}
    theirs = {f: graded_bodies(f, tree) for f, tree in trees.items()}       # one parse: nodes compare by identity
    lines = {f: len(text.splitlines()) - sum(body_lines(n) for n in theirs[f]) for f, text in files.items()}
    assert sum(lines.values()) <= TOTAL, f"the program is {sum(lines.values())} lines, over {TOTAL}"
    assert lines["train.py"] <= TRAIN, f"train.py is {lines['train.py']} lines, over {TRAIN}"
    over = {f: n for f, n in lines.items() if n > FILE}
    assert not over, f"files over {FILE} lines: {over}"
    long = [f"{f}:{n.lineno} {n.name} ({body_lines(n)} lines)" for f, tree in trees.items()
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and body_lines(n) > FUNCTION and n not in theirs[f]]
    assert not long, f"function bodies over {FUNCTION} lines (docstrings aside): {long}"
    if STUDENT_COPY:                      # the README counts the reference's bodies
        return
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
        tree = ast.parse(text)
        theirs = {id(n) for g in graded_bodies(f, tree) for n in ast.walk(g)}     # a student may import advantage
        for node in [n for n in ast.walk(tree) if id(n) not in theirs]:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            bad += [f"{f}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in scripts]
    assert not bad, bad


SKIPPED = "### What the walk skips"               # the README's list of machinery a reader may skip
REF = re.compile(r"`((?:fgrpo_utils/)?\w+\.py):(\d+)`")


def walk_sections():
    """(the walk, the list of what it skips): the README's text of each."""
    text = (ROOT / "README.md").read_text()
    walk = text[text.index("## One RL step, through the code"):]
    walk = walk[:walk.index("\n## ", 3)]
    return walk[:walk.index(SKIPPED)], walk[walk.index(SKIPPED):]


def named(text, defs):
    """The definitions `name` (`file.py:N`) references in text name, in order: [(file, qualname, node)]."""
    refs = list(dict.fromkeys((m.group(1), int(m.group(2))) for m in REF.finditer(text)))
    missing = [f"{f}:{n}" for f, n in refs if (f, n) not in defs]
    assert not missing, f"README walk references that are no def or class line: {missing}"
    return [(f, *defs[f, n]) for f, n in refs]


def definitions(files):
    """{(file, line): (qualname, node)} for every def and class of the program, nested ones too."""
    out = {}

    def visit(f, node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = prefix + child.name
                out[f, child.lineno] = q, child
                visit(f, child, q + ("." if isinstance(child, ast.ClassDef) else ".<locals>."))
            else:
                visit(f, child, prefix)
    for f, text in files.items():
        visit(f, ast.parse(text), "")
    return out


def covers(name, qualname):
    """A named function covers itself and what it defines; a named class, its methods."""
    return qualname == name or qualname.startswith(name + ".")


# The walk follows the reference's bodies: a student copy's README cites the graded files without line numbers,
# and a student's correct body may call other helpers than the reference's
walks_the_reference = pytest.mark.skipif(STUDENT_COPY, reason="a student copy: the walk is the reference's")


@walks_the_reference
def test_the_readme_walk_is_one_sitting_and_depth_first():
    """The walk names 30 functions at most, 600 lines of their full text, in 5 files, each reached from a
    function named before it (a method by its name, as `engine.generate` reaches TorchEngine.generate),
    starting at train.main: the path a reader traces from main to the optimizer step and the log line."""
    walk, _ = walk_sections()
    nodes = named(walk, definitions(program()))
    assert nodes[0][:2] == ("train.py", "main"), nodes[0][:2]
    assert len(nodes) <= WALK, f"the walk names {len(nodes)} functions, over {WALK}"
    size = sum(node.end_lineno - node.lineno + 1 for _, _, node in nodes)     # a class counts whole
    assert size <= WALK_LINES, f"the walk's functions hold {size} lines, over {WALK_LINES}"
    files = sorted({f for f, _, _ in nodes})
    assert len(files) <= WALK_FILES, f"the walk reads {len(files)} files, over {WALK_FILES}: {files}"

    def referenced(node):                  # the names a function calls or passes on
        return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
                if isinstance(n, (ast.Name, ast.Attribute))}
    for i, (f, q, node) in enumerate(nodes[1:], 1):
        reached = set().union(*(referenced(n) for _, _, n in nodes[:i]))
        assert node.name in reached, f"{f} {q} is not reached from any function named before it in the walk"


@walks_the_reference
def test_the_walk_and_its_skip_list_name_every_function_a_step_runs(tmp_path):
    """One maze step at one rank, profiled (tests/step_profile.py): every program function it runs is walked
    or in the list of what the walk skips, and every walked function ran."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "step_profile.py"), "--task", "maze", "--model",
                          "tiny", "--maze_size", "7", "--device", "cpu", "--threads", "1", "--steps", "2",
                          "--prompts_per_step", "4", "--mini_batch_prompts", "4", "--group_size", "4",
                          "--skip_dead_groups", "false", "--eval_mazes", "4", "--out_dir", str(tmp_path / "run")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    ran = {tuple(x) for x in json.loads(out.stdout.strip().splitlines()[-1])}
    walk, skipped = walk_sections()
    defs = definitions(program())
    walked, listed = named(walk, defs), named(skipped, defs)
    loose = sorted(f"{f} {q}" for f, q in ran
                   if not any(g == f and covers(n, q) for g, n, _ in walked + listed))
    assert not loose, f"a step runs these, which the README neither walks nor lists as skipped: {loose}"
    idle = [f"{f} {n}" for f, n, _ in walked if not any(g == f and covers(n, q) for g, q in ran)]
    assert not idle, f"the walk names these, which one maze step does not run: {idle}"
