"""
Problem clip_bounds (1 point): (lo, hi) = (1 - eps_low, 1 + eps_high), the paper's widths per loss
(advantage.CLIP_EPS: GRPO 0.2 / 0.2, DAPO 0.2 / 0.28, CISPO 1.0 / 5.0; App. L.2 of arXiv 2602.06717)
unless a width is given.

    python -m pytest -q assignments/tests/test_clip_bounds.py
"""
import pytest

import advantage
from grading import EXPECTED

CASES = EXPECTED["clip_bounds"]


def check(c):
    lo, hi = advantage.clip_bounds(*c["args"])
    assert (lo, hi) == pytest.approx(tuple(c["out"]), abs=1e-12), f"clip_bounds{tuple(c['args'])} = {(lo, hi)}"


def test_the_paper_widths():
    """DAPO's clip-higher is asymmetric (0.8, 1.28), and CISPO's [0, 6] bounds an importance weight:
    swapping eps_low and eps_high gives (0.72, 1.2) and (-4, 2)."""
    for c in CASES[:3]:
        check(c)


def test_given_widths_override_the_defaults():
    """A width of 0.0 is a width, not "not given": test `is None`, not truthiness."""
    for c in CASES[3:]:
        check(c)
