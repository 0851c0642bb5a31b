"""
Problem success_rate (1 point): Eq. 11 of arXiv 2602.06717, mu_hat = (mean R - R_w) / (R_c - R_w) = X / N,
one number per group, with a ValueError for rewards outside [R_w, R_c] or not finite.

    python -m pytest -q assignments/tests/test_success_rate.py
"""
import pytest
import torch

import advantage
from grading import EXPECTED, close, dec

DATA = dec(EXPECTED["success_rate"])


def test_binary_rewards_give_x_over_n():
    """X correct of N gives X / N: 3 of 5 is 0.6, not 3 / (N - 1) = 0.75."""
    for c in DATA["cases"][:2]:
        close(advantage.success_rate(c["rewards"], **c["kwargs"]), c["out"], "success_rate, rewards 1/0")


def test_other_reward_levels():
    """Rewards +1 / -1 (the simulation's) and 2 / -3: mean R must be mapped onto [0, 1] by R_w and R_c."""
    for c in DATA["cases"][2:4]:
        close(advantage.success_rate(c["rewards"], **c["kwargs"]), c["out"], f"success_rate {c['kwargs']}")


def test_partial_rewards_inside_the_levels_are_accepted():
    c = DATA["cases"][4]
    close(advantage.success_rate(c["rewards"], **c["kwargs"]), c["out"], "success_rate, rewards 0.5 and 0.25")


def test_one_rate_per_group():
    c = DATA["cases"][0]
    assert advantage.success_rate(c["rewards"]).shape == (c["rewards"].shape[0],)


@pytest.mark.parametrize("i", range(5))
def test_rewards_outside_the_levels_or_not_finite_are_refused(i):
    """A reward above R_c gives mu_hat > 1, and g = (1 - mu_hat)^gamma is then NaN or clipped silently;
    a NaN reward poisons its group. The docstring promises a ValueError for both."""
    c = DATA["invalid"][i]
    with pytest.raises(ValueError):
        advantage.success_rate(torch.tensor(c["rewards"], dtype=torch.float64), **c["kwargs"])
