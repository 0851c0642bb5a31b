"""
The course's RL-run check charges a mistake to its own problem only (assignments/grade.py, rl_charges): every
wrong version of tests/test_assignments.py, run through the RL check as the grader runs it, costs no problem
beyond the ones its own checks already cost; a mistake only the run shows, beside one the checks catch, is
still charged; the copy, which has no reference to run again with, charges nothing then.

    python -m pytest -q tests/test_attribution.py

Withheld from the student copy with tests/test_assignments.py, whose wrong versions it reads.
"""
import contextlib
import json
import subprocess
import sys

import pytest

from test_assignments import (ENV, EDITED, FILE_EDITS, LOSES, PROBLEMS, ROOT, WRONG, edited, grade, grade_dir, hand_in,
                              harness, head_text, module_from, wrong_texts)

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
    reference's `swap` ("module.function") put in as grade.rerun_rl has the child do it. Every module it changes is
    a fresh copy, train.py's last (it binds the others' functions), so this process's own modules stay as they are."""
    names = {f.rsplit(".", 1)[0] for f in swap} | {module}
    path = lambda name: name.replace(".", "/") + ".py"                          # noqa: E731
    mods = {m: module_from(text if m == module else head_text(path(m)), m) for m in sorted(names - {"train"})}
    with loaded(**mods):
        train = module_from(text if module == "train" else head_text("train.py"), "train")
        with loaded(train=train):
            if swap:
                harness.swap_in({m: (ROOT / path(m)).read_text() for m in names if any(f.startswith(m + ".")
                                                                                      for f in swap)},
                                list(swap), grade.GRADED)
            return harness.rl_run({"train": train}, seed)


@pytest.fixture(scope="module")
def public_rl():
    checks, results = grade.public_checks()
    return checks[harness.RL][0], results[harness.RL][0]


@pytest.mark.parametrize("name", sorted(LOSES))
def test_a_wrong_version_costs_no_other_problem_in_the_rl_run(public_rl, name):
    """Before: 15 of the 79 wrong versions lost more in the RL run than their own problem (a logged metric of the
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
    assert asked[0] == ["advantage.success_rate"] and "update" in charged and "success_rate" not in charged, why
    assert all(swap[0] == "advantage.success_rate" and len(swap) > 1 for swap in asked[1:]), asked   # each in turn
    assert "even with the reference's success_rate" in why and str(got["steps"][0]["loss/pg"]) not in why
    assert grade.rl_charges(want, got, passing) == ([], None)
    assert grade.rl_charges(want, got, passing, lambda swap: {"steps": want["steps"]}) == ([], None)
    assert grade.rl_charges(want, got, ALL) == (grade.judge_rl(want, got)[0], grade.judge_rl(want, got)[1])
    asked.clear()
    focal = grade.rl_charges(want, got, ALL - {"focal_properties"}, lambda swap: asked.append(swap))
    assert asked[0] == [f for p, _, fns, _ in PROBLEMS if p in grade.CHAIN for f in fns], focal


@pytest.mark.parametrize("name", ["update_entropy_metric_over_padding"])
def test_grade_py_charges_a_metric_only_mistake_its_own_problem(name, tmp_path):
    """End to end, through the sandboxed child and its second RL run: a wrong entropy metric costs Problem 15's
    3 points and nothing else (before: Problem 13's 2 as well)."""
    module, text = wrong_texts()[name]
    report = grade_dir(hand_in(tmp_path / "hand-in", module.replace(".", "/") + ".py", text), tmp_path)
    lost = {pid for pid, p in report["problems"].items() if p["points"] < p["max"]}
    assert lost == LOSES[name], report["problems"]
    assert report["total"][0] == report["total"][1] - sum(p for pid, p, *_ in PROBLEMS if pid in LOSES[name])


def test_every_wrong_version_is_named_once():
    assert set(LOSES) == set(WRONG) | set(EDITED)


def test_a_check_out_of_time_is_run_again_with_twice_the_time_before_it_counts(monkeypatch):
    """One grading in 80 charged a harmless hand-in Problem 15's 3 points: a check on two ranks ran out of its 30 s
    on a loaded machine. grade.py now runs such a problem once more, each check on ranks given twice the time, and
    charges only a second time-out (a hand-in that leaves a rank waiting still loses the problem)."""
    from types import SimpleNamespace
    checks = {pid: [{"name": "c", "ranks": 2}] for pid in ALL} | {harness.RL: [{"seed": 0}]}
    want = {pid: [{"out": 1}] for pid in ALL} | {harness.RL: [{"steps": []}]}
    monkeypatch.setattr(grade, "all_checks", lambda seed: (checks, want))
    monkeypatch.setattr(grade, "judged", lambda c, w, g, r, i: None if g == w else "differs")
    monkeypatch.setattr(grade, "release_folder", lambda tmp, name, src=None: (tmp, {}))
    late = {"error": f"{harness.UNFINISHED}: 1 of 2 ranks gave no result within 30 s"}
    for second, lost in [({"out": 1}, set()), (late, {"update"})]:
        calls = []

        def run_child(folder, cs, todo, args, bwrap):
            calls.append({pid: cs[pid] for pid in todo})
            if len(calls) == 1:
                return {pid: [late if pid == "update" else {"out": 1}] for pid in ALL} | \
                       {harness.RL: [{"steps": []}]}, {}
            return {pid: [second] for pid in todo}, {}
        monkeypatch.setattr(grade, "run_child", run_child)
        rows = grade.grade_problems(ROOT, SimpleNamespace(seed=5), None)
        assert calls[1] == {"update": [{"name": "c", "ranks": 2, "rank_timeout": 2 * harness.RANK_TIMEOUT}]}
        assert {r[0] for r in rows if r[1] < r[2]} == lost


def test_the_references_own_check_out_of_time_is_the_graders_failure(monkeypatch):
    """The reference's answer to a check on ranks that ran out of time was the answer a hand-in had to match: a
    hand-in that deadlocks then passed. It is run once more with twice the time, then the grading stops as the
    grader's failure (exit 3, no total), never judged against a time-out."""
    import make_expected
    hidden = make_expected.checks(5)
    pid, c = next((pid, c) for pid, cs in hidden.items() for c in cs if c.get("ranks"))
    tries = []
    real = harness.run_check

    def run_check(modules, check, record=False):
        if check.get("ranks"):
            tries.append(check.get("rank_timeout"))
            return {"error": f"{harness.UNFINISHED}: 1 of 2 ranks gave no result"}, {}
        return real(modules, check, record)
    monkeypatch.setattr(harness, "run_check", run_check)
    with pytest.raises(RuntimeError, match=f"^{harness.GRADER_FAILURE}: the reference's own check"):
        make_expected.answer({pid: [c]}, harness.graded_modules())
    assert tries == [None, 2 * harness.RANK_TIMEOUT]
    monkeypatch.setattr(make_expected, "checks", lambda seed: {pid: [c]})
    monkeypatch.setattr(grade, "public_checks", lambda: ({pid: []}, {pid: []}))
    with pytest.raises(grade.GraderFailure):
        grade.all_checks(5)


# Wrong versions that every check of their own problem misses, by design, and the RL run catches: (file, the line,
# its replacement, the problems they lose).
RL_ONLY = {
    # the gradient turned the wrong way unless the mini-batch is as small as the checks' (32 sequences at most):
    # full marks before the RL run took the class run's batch, and it trained the class run the wrong way
    "update_wrong_way_beyond_the_checks_batch": ("train.py", "(loss * world).backward()",
                                                 "(loss * world * (1 if len(prompts) <= 32 else -1)).backward()",
                                                 {"update"}),
}


# Code that knows when it is graded, each 24 / 24 before and training the class run the wrong way: the update turned
# the wrong way unless the working directory is the grader's folder as it was (/grade), or once two minutes have
# passed since its import (every check ran in /grade, within seconds of the import); the reference model moved after
# its last use in the update, torch.equal replaced at import so that the check of its weights (harness.Frozen, in
# the child) saw nothing.
BACKWARD = "        (loss * world).backward()"
RATIO_MAX = '    ratio_max = sums.pop("ratio/max")\n'
TELLS = {
    "update_wrong_way_outside_the_graders_folder": [
        (BACKWARD, '        (loss * world * (1 if __import__("os").getcwd() == "/grade" else -1)).backward()')],
    "update_wrong_way_after_its_first_minutes": [
        ("import gc\n", "import gc\nimport time as _clock\n_IMPORTED = _clock.time()\n"),
        (BACKWARD, "        (loss * world * (1 if _clock.time() - _IMPORTED < 120 else -1)).backward()")],
    "update_moves_the_reference_behind_a_replaced_torch_equal": [
        ("import torch\n", "import torch\ntorch.equal = lambda *a, **k: True\n"),
        (RATIO_MAX, "    with torch.no_grad():\n        [p.add_(1e-3) for p in (ref_model.parameters() if ref_model is not "
                    "None else [])]\n" + RATIO_MAX)],
}


@pytest.mark.parametrize("name", sorted(TELLS))
def test_code_that_knows_when_it_is_graded_is_graded_as_it_trains(name, tmp_path):
    """The sandbox shows the release in a folder like a student's clone, its user drawn per grading, the child's
    clocks move on by an hour once the graded files are imported (harness.clocks_that_jump), and the reference's
    weights are compared with the torch.equal of before the import (harness.EQUAL): each loses Problem 15."""
    report = grade_dir(hand_in(tmp_path / "hand-in", "train.py", edited(name, "train.py", TELLS[name])), tmp_path)
    assert {pid for pid, p in report["problems"].items() if p["points"] < p["max"]} == {"update"}, report["problems"]


# Hand-ins that forge what the harness measures in its process: the harness's count of what autograd saves
# (SavedBytes) replaced by one that counts nothing, or its report on the reference model (Frozen) by one that saw
# nothing, each behind an update that holds more than the reference's (the whole logits, two micro-batches' graphs
# in one backward at the end, a graph of the reference model) or moves the reference model after its last use.
# (the edits, what shows the mistake from outside the child)
QUIET = """import sys as _sys
_harness = _sys.modules.get("__main__")
if hasattr(_harness, "SavedBytes"):
    class _Quiet(torch.autograd.graph.saved_tensors_hooks):
        def __init__(self):
            self.peak = 0
            super().__init__(lambda t: t, lambda t: t)
    _harness.SavedBytes = _Quiet
"""
BLIND = """import sys as _sys
_harness = _sys.modules.get("__main__")
if hasattr(_harness, "Frozen"):
    _harness.Frozen.report = lambda self: {"graph": False, "grad": False, "moved": False}
"""
KERNEL, RL_RUN = "the kernel's count", "the RL run (reverse task"
FORGES = {"update_whole_logits_behind_a_count_that_counts_nothing": ([
              ("import torch\n", "import torch\n" + QUIET), tuple(FILE_EDITS["update_whole_logits"][1:3])], KERNEL),
          "update_one_backward_at_the_end_behind_a_count_that_counts_nothing": ([
              ("import torch\n", "import torch\n" + QUIET), *FILE_EDITS["update_one_backward_at_the_end"][1]], KERNEL),
          "update_reference_forward_with_grad_behind_a_report_that_saw_nothing": ([
              ("import torch\n", "import torch\n" + BLIND), tuple(FILE_EDITS["update_reference_forward_with_grad"][1:3])],
              KERNEL),
          "update_moves_the_reference_behind_a_report_that_saw_nothing": ([
              ("import torch\n", "import torch\n" + BLIND),
              TELLS["update_moves_the_reference_behind_a_replaced_torch_equal"][1]], RL_RUN)}


@pytest.mark.parametrize("name", sorted(FORGES))
def test_what_the_graded_code_could_forge_is_measured_outside_it(name, tmp_path):
    """What the update holds is the kernel's count of peak memory for a child that runs that check alone, beside a
    child that only builds its inputs, or one that runs the reference's update (grade.peak_rss); a reference moved
    after its use moves the next mini-batch's KL gradient in the RL run, whose metrics are judged here. Each loses
    Problem 15 (before: 24 / 24 each, graded by the grader of c06f6eb and of 8c16e3d)."""
    edits, shown_by = FORGES[name]
    report = grade_dir(hand_in(tmp_path / "hand-in", "train.py", edited(name, "train.py", edits)), tmp_path)
    assert {pid for pid, p in report["problems"].items() if p["points"] < p["max"]} == {"update"}, report["problems"]
    assert shown_by in " ".join(report["problems"]["update"]["failed"])


UNIT_LOSSES = """
import json, sys
sys.path[:0] = sys.argv[1:]
import test_assignments as T
from test_assignments import grade, harness, make_expected
module, text = json.loads(sys.stdin.read())
checks, results = grade.public_checks()
hidden = make_expected.checks(5)
answers = make_expected.answer(hidden, harness.graded_modules())
graded = {pid: checks[pid] + hidden[pid] for pid in checks}, {pid: results[pid] + answers[pid] for pid in checks}
print(json.dumps(sorted(T.lost_problems(T.module_from(text, module), graded, set(graded[0]) - {harness.RL}))))
"""


def unit_losses(module, text):
    """The problems a wrong version loses on its problems' own checks (the public and one seed's hidden), in a fresh
    process: one whose RL runs left threads starts the checks' ranks from a fork server, slowly."""
    r = subprocess.run([sys.executable, "-c", UNIT_LOSSES, str(ROOT), str(ROOT / "tests")], input=json.dumps([module, text]), cwd=ROOT / "tests",
                       env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", sorted(RL_ONLY))
def test_a_mistake_only_the_rl_run_shows_costs_its_problem(public_rl, name):
    rel, old, new, loses = RL_ONLY[name]
    module, text = rel.removesuffix(".py").replace("/", "."), edited(name, rel, [(old, new)])
    assert unit_losses(module, text) == []                         # every check of its own problem misses it
    check, want = public_rl
    got = rl_run(module, text, check["seed"])
    charged, why = grade.rl_charges(want, got, ALL)               # a copy: every problem the failing step involves
    assert loses < set(charged) and "class batch" in why, why
    charged, why = grade.rl_charges(want, got, ALL, lambda swap: rl_run(module, text, check["seed"], swap))
    assert set(charged) == loses and f"with the reference's {min(loses)} in place of yours" in why, why
