"""
Problem focal_advantages (2 points): Eq. 13 of arXiv 2602.06717, A_i^F = g * A_i with one
g = (1 - mu_hat)^gamma per group (Eqs. 11-12), applied after the z-score of Eq. 3; returns (A^F, g).

    python -m pytest -q assignments/tests/test_focal_advantages.py

success_rate, focal_weight and group_advantages are answered with the reference's stored outputs
for the calls a correct focal_advantages makes (conftest.Memo), so this problem is graded on its
own: a bug in Problems 1-3 does not cost these points too.
"""
import pytest
import torch

import advantage
from grading import EXPECTED, Memo, close, dec

DATA = dec(EXPECTED["focal_advantages"])


@pytest.fixture(autouse=True)
def memos(monkeypatch):
    for name, calls in DATA["calls"].items():
        monkeypatch.setattr(advantage, name, Memo(getattr(advantage, name), calls))


def run(c):
    out = advantage.focal_advantages(c["rewards"].clone(), c["gamma"], **c["kwargs"])
    assert isinstance(out, tuple) and len(out) == 2, "focal_advantages returns (advantages, g)"
    return out


def test_values_and_weights():
    for c in DATA["cases"]:
        A, g = run(c)
        what = f"gamma {c['gamma']} {c['kwargs']}"
        close(A, c["out"], f"A^F, {what}")
        close(g, c["g"], f"g, {what}")


def test_one_weight_per_group():
    """g is one scalar per prompt group, shape (G,): every rollout of the group gets the same factor."""
    c = DATA["cases"][0]
    A, g = run(c)
    assert torch.as_tensor(g).shape == (c["rewards"].shape[0],), f"g has shape {tuple(torch.as_tensor(g).shape)}"


def test_weight_multiplies_after_the_z_score():
    """Scaling the rewards by g before Eq. 3 does nothing: a per-group constant cancels in
    (gR - mean gR) / std(gR). So A^F must be g times the plain advantage, row by row."""
    c = DATA["cases"][0]                               # binary N = 5, gamma 0.5: g < 1 on mixed rows
    A, g = run(c)
    close(A, c["out"], "A^F = g * A (is g applied to the rewards instead?)")


def test_settings_are_passed_on():
    """normalize_std and the reward levels R_c, R_w reach group_advantages and success_rate."""
    for c in DATA["cases"][1:3]:
        A, g = run(c)
        close(A, c["out"], f"A^F with {c['kwargs']}")
        close(g, c["g"], f"g with {c['kwargs']}")
