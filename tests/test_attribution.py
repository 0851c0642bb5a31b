"""
The course's RL-run check charges a mistake to its own problem only (assignments/grade.py, rl_charges): every
wrong version of tests/test_assignments.py, run through the RL check as the grader runs it, costs no problem
beyond the ones its own checks already cost; a mistake only the run shows, beside one the checks catch, is
still charged; the copy, which has no reference to run again with, charges nothing then.

    python -m pytest -q tests/test_attribution.py

Withheld from the student copy with tests/test_assignments.py, whose wrong versions it reads.
"""
import contextlib
import sys

import pytest

from test_assignments import (EDITED, LOSES, PROBLEMS, ROOT, WRONG, grade, grade_dir, harness, head_text, module_from,
                              wrong_texts)

ALL = {pid for pid, *_ in PROBLEMS}


@contextlib.contextmanager
def loaded(**modules):
    """sys.modules with these in place (train.py's `from advantage import ...` then binds a wrong version)."""
    old = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, mod in old.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


def rl_run(module, text, seed, swap=()):
    """harness.rl_run in this process with `module` from `text` (a wrong version) and the rest as committed, and the
    reference's `swap` ("module.function") put in as grade.rerun_rl has the child do it."""
    mod = module_from(text, module)
    with loaded(**{module: mod}):
        train = mod if module == "train" else module_from(head_text("train.py"), "train")
        with loaded(train=train):
            if swap:
                harness.swap_in({f.rsplit(".", 1)[0]: (ROOT / (f.rsplit(".", 1)[0].replace(".", "/") + ".py"))
                                 .read_text() for f in swap}, list(swap), grade.GRADED)
            return harness.rl_run({"train": train}, seed)


@pytest.fixture(scope="module")
def public_rl():
    checks, results = grade.public_checks()
    return checks[harness.RL][0], results[harness.RL][0]


@pytest.mark.parametrize("name", sorted(LOSES))
def test_a_wrong_version_costs_no_other_problem_in_the_rl_run(public_rl, name):
    """Before: 13 of the 82 wrong versions lost more in the RL run than their own problem (a logged metric of the
    update wrong also cost logprobs; a wrong loss, through the second mini-batch, logprobs and update; a weight
    that turns the advantages NaN, update)."""
    check, want = public_rl
    module, text = wrong_texts()[name]
    got = rl_run(module, text, check["seed"])
    charged, why = grade.rl_charges(want, got, ALL - LOSES[name],
                                    lambda swap: rl_run(module, text, check["seed"], swap))
    assert charged == [], (name, why)


def test_the_reference_swapped_in_gives_the_reference_run(public_rl):
    """harness.swap_in puts the reference's functions where train.py binds them: a wrong update with the reference's
    update in place runs as the reference; left in, it does not."""
    check, want = public_rl
    module, text = wrong_texts()["update_local_counts"]
    assert grade.judge_rl(want, rl_run(module, text, check["seed"]))[0]
    assert grade.judge_rl(want, rl_run(module, text, check["seed"], ["train.update_minibatch"]))[0] == []


def test_a_mistake_only_the_run_shows_is_charged_beside_one_the_checks_catch(public_rl):
    """success_rate wrong (its checks catch it) and update_minibatch wrong in a way the run shows: setting
    success_rate right leaves the run wrong, so the passing problems the run involves are charged; with no reference
    to run again (a student copy) nothing beyond success_rate is; a run that matches then charges nothing."""
    check, want = public_rl
    module, text = wrong_texts()["update_local_counts"]
    got = rl_run(module, text, check["seed"])
    passing = ALL - {"success_rate"}
    asked = []

    def rerun(swap):
        asked.append(swap)
        return got
    charged, why = grade.rl_charges(want, got, passing, rerun)
    assert asked == [["advantage.success_rate"]] and "update" in charged and "success_rate" not in charged, why
    assert "even with the reference's success_rate" in why and str(got["steps"][0]["loss/pg"]) not in why
    assert grade.rl_charges(want, got, passing) == ([], None)
    assert grade.rl_charges(want, got, passing, lambda swap: {"steps": want["steps"]}) == ([], None)
    assert grade.rl_charges(want, got, ALL) == (grade.judge_rl(want, got)[0], grade.judge_rl(want, got)[1])
    focal = grade.rl_charges(want, got, ALL - {"focal_properties"}, lambda swap: asked.append(swap))
    assert asked[-1] == [f for pid in grade.CHAIN for p, _, fns, _ in PROBLEMS if p == pid for f in fns], focal


@pytest.mark.parametrize("name", ["update_entropy_metric_over_padding"])
def test_grade_py_charges_a_metric_only_mistake_its_own_problem(name, tmp_path):
    """End to end, through the sandboxed child and its second RL run: a wrong entropy metric costs Problem 15's
    3 points and nothing else (before: Problem 13's 2 as well)."""
    module, text = wrong_texts()[name]
    d = tmp_path / "hand-in"
    rel = module.replace(".", "/") + ".py"
    for f in grade.GRADED_FILES:
        (d / f).parent.mkdir(parents=True, exist_ok=True)
        (d / f).write_text(text if f == rel else head_text(f))
    report = grade_dir(d, tmp_path)
    lost = {pid for pid, p in report["problems"].items() if p["points"] < p["max"]}
    assert lost == LOSES[name], report["problems"]
    assert report["total"][0] == report["total"][1] - sum(p for pid, p, *_ in PROBLEMS if pid in LOSES[name])


def test_every_wrong_version_is_named_once():
    assert set(LOSES) == set(WRONG) | set(EDITED)
