"""
The public checks of each problem (assignments/expected.json), run in this process on your graded
functions and judged as grade.py judges them. The teacher's grading adds hidden checks of the same
kinds on other numbers, so passing these is necessary, not sufficient. A check of peak memory runs in a
process of its own, measured from outside (grade.peak_rss): grade.py runs it, these tests leave it out.

    python -m pytest -q assignments/tests                        # every problem
    python -m pytest -q assignments/tests -k group_advantages    # one problem, with each failing check
"""
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import grade  # noqa: E402
import harness  # noqa: E402
from problems import PROBLEMS  # noqa: E402

CHECKS, RESULTS = grade.public_checks()
MODULES = harness.graded_modules()


@pytest.mark.parametrize("pid", [pid for pid, *_ in PROBLEMS])
def test_public_checks(pid):
    checks, results = zip(*[(c, r) for c, r in zip(CHECKS[pid], RESULTS[pid]) if not c.get("peak")])
    got = [harness.run_check(MODULES, c)[0] for c in checks]
    failed = [m for i, (c, want) in enumerate(zip(checks, results)) if (m := grade.judge(c, want, got[i], got, i))]
    assert not failed, f"{len(failed)} of {len(got)} checks fail:\n" + "\n".join(failed[:10])


def test_the_rl_steps_train_as_the_reference():
    """Three RL steps of the toy task and one of the maze with all your functions (grade.py's run)."""
    charged, why, _ = grade.judge_rl(RESULTS[harness.RL][0], harness.rl_run(MODULES, CHECKS[harness.RL][0]["seed"]))
    assert not charged, why
