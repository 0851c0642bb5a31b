"""The docs tell the truth: README.md, RESULTS.md and DESIGN.md. The README's test command is the one
CI runs; every flag a command in the docs or in a script's docstring names exists; every
`file.py:N` reference points at a line that holds the name written beside it; every relative link
resolves; the README stays short enough to read in 15 minutes.

    python -m pytest -q tests/test_readme.py
"""
import ast
import dataclasses
import importlib.util
import re
import shlex
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ["README.md", "RESULTS.md", "DESIGN.md"]     # every doc file that ships


def doc(name):
    return (ROOT / name).read_text()


def commands(text=README):
    """Every `python X.py ...` / `torchrun ... X.py ...` command in `text` (code blocks and inline code
    alike), as (script, [tokens after it])."""
    text = text.replace("\\\n", " ")
    found = []
    for m in re.finditer(r"(?:python3?|torchrun[^`\n]*?)\s+((?:bench/)?\w+\.py)([^`\n|]*)", text):
        found.append((m.group(1), shlex.split(m.group(2).split("#")[0].replace("$", "X"))))
    return found


def config_fields(script):
    spec = importlib.util.spec_from_file_location(Path(script).stem + "_readme", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)                    # importing does nothing but define things
    return {f.name for f in dataclasses.fields(module.Config)} if hasattr(module, "Config") else set()


def docstring_commands():
    """The commands in the opening docstring of every script and module (*.py, fgrpo_utils/*.py, bench/*.py)."""
    found = []
    for path in sorted([*ROOT.glob("*.py"), *ROOT.glob("fgrpo_utils/*.py"), *ROOT.glob("bench/*.py")]):
        found += commands(ast.get_docstring(ast.parse(path.read_text())) or "")
    return found


def test_the_docs_exist_and_the_readme_is_short():
    for name in DOCS:
        assert (ROOT / name).is_file(), f"{name} is missing"
    n = len(README.splitlines())
    assert n <= 300, f"README.md has {n} lines: keep it under 300 (results go to RESULTS.md, reference to DESIGN.md)"


def test_every_flag_in_the_docs_and_the_docstrings_exists():
    per_doc = {name: commands(doc(name)) for name in DOCS}
    assert len(per_doc["README.md"]) > 5                # the regex still finds the commands
    assert len(per_doc["RESULTS.md"]) > 20
    doc_cmds = docstring_commands()
    assert len(doc_cmds) > 10
    fields = {}
    for where, cmds in [*per_doc.items(), ("a docstring", doc_cmds)]:
        for script, tokens in cmds:
            if script not in fields:
                fields[script] = config_fields(script)
            for t in tokens:
                if t.startswith("--"):
                    flag = t[2:].split("=")[0]
                    assert flag in fields[script], f"{where}: {script} has no flag --{flag}"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    quick = re.search(r"## Quick start.*?```bash\n(.*?)```", README, re.S).group(1)
    test_cmd = [line for line in quick.splitlines() if "pytest" in line][0].split("&& ")[-1].strip()
    assert test_cmd == "python -m pytest -q tests"
    assert f"\n{test_cmd}\n" in ci


# `name` (`file.py:N`) or `name`, `file.py:N` ... and, failing a name before it, `file.py:N` `name`.
REF = re.compile(r"`((?:bench/|tests/|fgrpo_utils/)?\w+\.py):(\d+)`")
NAME_BEFORE = re.compile(r"`([^`\n]+)`[ \t\n]*[(,]?[ \t\n]*$")
NAME_AFTER = re.compile(r"^\)?[ \t\n]*`([^`\n]+)`")


def line_refs(text):
    """(file, line, name) for every `file.py:N` in text; name is None when none is written beside it."""
    for m in REF.finditer(text):
        before = NAME_BEFORE.search(text[max(0, m.start() - 120):m.start()])
        after = NAME_AFTER.search(text[m.end():m.end() + 120])
        name = before.group(1) if before else after.group(1) if after else None
        yield m.group(1), int(m.group(2)), name


def identifier(name):
    """What must appear on the line: `engine.sleep()` -> sleep, `TorchEngine.generate` -> generate."""
    return re.sub(r"\(.*\)$", "", name.strip()).split(".")[-1]


def test_every_file_line_reference_points_at_its_name():
    """The traced RL step names functions by file:line. When code moves, this fails and says where
    each name now lives, so the trace is updated instead of rotting."""
    refs = [(d, *r) for d in DOCS for r in line_refs(doc(d))]
    # the trace is still there (a course's student copy drops the line numbers into graded files)
    assert len([r for r in refs if r[0] == "README.md"]) >= (4 if (ROOT / "assignments" / "release.json").exists() else 15)
    wrong = []
    for d, file, n, name in refs:
        path = ROOT / file
        assert path.is_file(), f"{d}: `{file}:{n}` names a file that does not exist"
        assert name, f"{d}: `{file}:{n}` has no `name` written right before (or after) it"
        lines = path.read_text().splitlines()
        ident = identifier(name)
        if not (1 <= n <= len(lines) and re.search(rf"\b{re.escape(ident)}\b", lines[n - 1])):
            defs = [i + 1 for i, line in enumerate(lines) if re.match(rf"\s*(def|class) {re.escape(ident)}\b", line)]
            uses = [i + 1 for i, line in enumerate(lines) if re.search(rf"\b{re.escape(ident)}\b", line)]
            wrong.append(f"{d}: `{name}` (`{file}:{n}`): that line does not hold `{ident}`"
                         + (f"; it is defined at {file}:{defs}" if defs else
                            f"; it appears at {file}:{uses[:8]}" if uses else f"; {file} has no `{ident}`"))
    assert not wrong, "\n".join(wrong)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(text):
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", strip_code(text), re.M)}


def strip_code(text):
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_every_relative_link_resolves():
    """Figures, files and #anchors, within a doc and across docs."""
    bad = []
    for d in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", strip_code(doc(d))):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            path, _, anchor = target.partition("#")
            where = ROOT / path if path else ROOT / d
            if not where.exists():
                bad.append(f"{d}: ({target}): {path} does not exist")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where.read_text()):
                bad.append(f"{d}: ({target}): no heading #{anchor} in {where.name}")
    assert not bad, "\n".join(bad)


UNSHIPPED = ("PAPER.md", "PAPER §", "PAPER App", "PAPER Table", "IMPLEMENTATION_NOTES", "STYLE.md", "../shared/PAPER")


def test_the_docs_and_the_code_cite_the_paper_not_files_that_do_not_ship():
    """A user who clones the repository must be able to follow every reference: the paper's own
    sections, equations, tables and appendices, or files that ship."""
    files = [*DOCS, *(str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("**/*.py")) + sorted(ROOT.glob("assignments/**/*.md"))
                      if not {".venv", ".venv-ci", "out", "runs"} & set(p.relative_to(ROOT).parts))]
    bad = [f"{f}: cites {w!r}" for f in files if f != "tests/test_readme.py" for w in UNSHIPPED if w in doc(f)]
    assert not bad, "cite the paper (Sec., Eq., Table, Appendix) or a shipped file instead:\n" + "\n".join(bad)


def numbered_items(text):
    """{n: text} of a numbered list: README's "1. **...**" items or a docstring's "1) ..." items."""
    items = re.split(r"\n(?=\d+[.)] )", "\n" + text)
    return {int(m.group(1)): m.group(2) for m in (re.match(r"(\d+)[.)] (.*)", i, re.S) for i in items) if m}


def test_numbered_deviations_agree_everywhere():
    """The README numbers the deviations; train.py's docstring lists those it implements, by the same
    numbers (each item shares the most words with the README's item of its number), and every
    "deviation N" in the code and docs names an item that exists."""
    section = re.search(r"## Deviations from the paper\n(.*?)\n## ", README, re.S).group(1)
    readme = numbered_items(section)
    assert sorted(readme) == list(range(1, len(readme) + 1)) and len(readme) >= 5
    doc_train = ast.get_docstring(ast.parse(doc("train.py")))
    listed = numbered_items(doc_train.split("numbered as in the README's list:")[1])
    words = lambda t: {w.lower() for w in re.findall(r"[A-Za-z]{4,}", t)}              # noqa: E731
    for n, text in listed.items():
        best = max(readme, key=lambda k: len(words(text) & words(readme[k])))
        assert best == n, f"train.py's deviation {n} reads like the README's {best}: {text[:60]!r}"
    for f in [*DOCS, *(str(p.relative_to(ROOT)) for p in [*ROOT.glob("*.py"), *ROOT.glob("fgrpo_utils/*.py")])]:
        for m in re.finditer(r"[Dd]eviation (\d+)", doc(f)):
            assert int(m.group(1)) in readme, f"{f}: deviation {m.group(1)} is not in the README's list"


def test_the_flags_a_resume_may_change_are_listed_as_the_code_has_them():
    """The list of flags a resume may change (DESIGN.md) had lost --skip_dead_groups; it is now read
    against run_folder.RESUME_MAY_CHANGE, the one list resume_conflicts uses."""
    from fgrpo_utils import run_folder
    text = (ROOT / "DESIGN.md").read_text()
    item = text[text.index("**Resume with other flags.**"):text.index("Any other difference")]
    listed = set(re.findall(r"`--(\w+)`", item))
    assert listed == set(run_folder.RESUME_MAY_CHANGE) - {"resume"}, listed ^ set(run_folder.RESUME_MAY_CHANGE)
