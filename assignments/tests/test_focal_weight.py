"""
Problem focal_weight (1 point): Eq. 12 of arXiv 2602.06717, g = (1 - mu_hat)^gamma for a tensor of
success rates.

    python -m pytest -q assignments/tests/test_focal_weight.py
"""
import torch

import advantage
from grading import EXPECTED, close, dec

CASES = dec(EXPECTED["focal_weight"])


def test_values():
    for c in CASES:
        close(advantage.focal_weight(c["mu_hat"].clone(), c["gamma"]), c["out"], f"focal_weight, gamma {c['gamma']}")


def test_weight_falls_as_the_group_gets_easier():
    """The point of Eq. 12: groups the policy already solves (mu_hat near 1) get a small weight, so
    g shrinks as mu_hat grows. mu_hat^gamma would do the opposite and shrink the hard groups."""
    mu = torch.tensor([0.125, 0.5, 0.875], dtype=torch.float64)
    for gamma in (0.5, 1.0, 2.0):
        g = advantage.focal_weight(mu, gamma)
        assert g[0] > g[1] > g[2], f"gamma {gamma}: g = {g.tolist()} for mu_hat = {mu.tolist()}"


def test_gamma_zero_is_exactly_one():
    """gamma = 0 is the base method: g = 1 everywhere, also at mu_hat = 1 (0^0 = 1 in torch)."""
    for c in CASES:
        if c["gamma"] == 0:
            g = advantage.focal_weight(c["mu_hat"].clone(), 0.0)
            assert torch.equal(torch.as_tensor(g, dtype=torch.float64), torch.ones_like(c["mu_hat"])), g


def test_finite_when_mu_hat_rounds_past_one():
    """A float mean of equal rewards can land just above R_c: mu_hat = 1 + 1e-7. Then 1 - mu_hat < 0,
    and a negative base to a fractional power is NaN. The weight must be 0 there, not NaN."""
    g = advantage.focal_weight(torch.tensor([1.0 + 1e-7], dtype=torch.float64), 0.5)
    assert torch.isfinite(g).all() and float(g[0]) == 0.0, f"g = {g.tolist()} at mu_hat = 1 + 1e-7; expected 0"
