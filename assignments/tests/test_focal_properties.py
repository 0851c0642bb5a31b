"""
Problem focal_properties (1 point): what ANY focal weighting must keep, checked end to end on your
focal_advantages (with your group_advantages, success_rate and focal_weight). If you try another
weighting (1 / sqrt(mu_hat), a smoothed mu_hat, ...), these say what it broke.

    python -m pytest -q assignments/tests/test_focal_properties.py
"""
import pytest
import torch

import advantage
from grading import EXPECTED, dec

R = dec(EXPECTED["rewards"])
# (rewards, r_correct, r_wrong, the uniform rows): every X = 0 .. 8 at N = 8; rewards +-1; and seven
# rewards of 0.1 with R_c = 0.1, whose float32 mean rounds just past R_c (mu_hat = 1 + 1.2e-7).
BATCHES = [((torch.arange(8)[None, :] < torch.arange(9)[:, None]).double(), 1.0, 0.0, [0, 8]),
           (R["pm1_n6"], 1.0, -1.0, [2]),
           (torch.tensor([[0.1] * 7, [0.1, 0, 0, 0.1, 0, 0, 0]], dtype=torch.float32), 0.1, 0.0, [0])]
GAMMAS = (0.0, 0.5, 1.0, 2.0)


def each():
    for rewards, rc, rw, uniform in BATCHES:
        for gamma in GAMMAS:
            for norm in (True, False):
                A, g = advantage.focal_advantages(rewards.clone(), gamma, rc, rw, normalize_std=norm)
                yield rewards, uniform, gamma, norm, torch.as_tensor(A), torch.as_tensor(g)


def test_outputs_are_finite():
    """A weighting that blows up at mu_hat = 0 (1 / sqrt(mu_hat)) gives g = inf on all-wrong groups,
    and A^F = inf * 0 = NaN there; a fractional power of a negative 1 - mu_hat is NaN too. train.py
    stops on the first non-finite advantage."""
    for rewards, _, gamma, norm, A, g in each():
        assert torch.isfinite(g).all(), f"gamma {gamma}: g = {g.tolist()} for rewards {rewards.tolist()}"
        assert torch.isfinite(A).all(), f"gamma {gamma}, normalize_std {norm}: non-finite A^F"


def test_uniform_groups_get_exactly_zero():
    """X = 0 or X = N carries no signal, whatever the weight: A^F must be exactly 0 there."""
    for rewards, uniform, gamma, norm, A, g in each():
        assert (A[uniform] == 0).all(), f"gamma {gamma}, normalize_std {norm}: uniform groups got {A[uniform]}"


def test_weight_is_one_non_negative_number_per_group():
    """A negative g would flip the sign of a group's update: reward the wrong answers."""
    for rewards, _, gamma, norm, A, g in each():
        assert g.shape == (rewards.shape[0],), f"g has shape {tuple(g.shape)}, expected ({rewards.shape[0]},)"
        assert (g >= 0).all(), f"gamma {gamma}: negative g {g.tolist()}"
        assert A.shape == rewards.shape


@pytest.mark.parametrize("norm", [True, False])
def test_gamma_zero_is_the_base_method(norm):
    """gamma = 0 must give back GRPO (or its mean-only form) bit for bit, with g = 1 for every group,
    so that a paper row's baseline is the same code with --gamma 0."""
    for rewards, rc, rw, _ in BATCHES:
        A, g = advantage.focal_advantages(rewards.clone(), 0.0, rc, rw, normalize_std=norm)
        base = advantage.group_advantages(rewards.clone(), normalize_std=norm)
        assert torch.equal(torch.as_tensor(g).double(), torch.ones(rewards.shape[0], dtype=torch.float64)), g
        assert torch.equal(torch.as_tensor(A), torch.as_tensor(base)), "gamma = 0 differs from group_advantages"
