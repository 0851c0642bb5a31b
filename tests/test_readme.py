"""The README and the scripts' docstrings tell the truth: the README's test command is the one CI
runs, and every flag a command in the README or in a script's docstring names exists.

    python -m pytest -q tests/test_readme.py
"""
import ast
import dataclasses
import importlib.util
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def commands(text=README):
    """Every `python X.py ...` / `torchrun ... X.py ...` command in `text` (the README: code blocks and
    inline code alike), as (script, [tokens after it])."""
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
    """The commands in the opening docstring of every script (*.py and bench/*.py)."""
    found = []
    for path in sorted([*ROOT.glob("*.py"), *ROOT.glob("bench/*.py")]):
        found += commands(ast.get_docstring(ast.parse(path.read_text())) or "")
    return found


def test_every_flag_in_the_readme_and_the_docstrings_exists():
    cmds = commands()
    assert len(cmds) > 20                              # the regex still finds the commands
    doc_cmds = docstring_commands()
    assert len(doc_cmds) > 10
    fields = {}
    for script, tokens in cmds + doc_cmds:
        if script not in fields:
            fields[script] = config_fields(script)
        for t in tokens:
            if t.startswith("--"):
                flag = t[2:].split("=")[0]
                assert flag in fields[script], f"README: {script} has no flag --{flag}"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    quick = re.search(r"## Quick start.*?```bash\n(.*?)```", README, re.S).group(1)
    test_cmd = [line for line in quick.splitlines() if "pytest" in line][0].split("&& ")[-1].strip()
    assert test_cmd == "python -m pytest -q tests"
    assert f"\n{test_cmd}\n" in ci
