"""
Problem group_advantages (2 points): the GRPO advantage, Eq. 3 of arXiv 2602.06717,
A_i = (R_i - mean_j R_j) / (std_j R_j + eps), unbiased std, eps = 1e-6; mean-only when asked.

    python -m pytest -q assignments/tests/test_group_advantages.py
"""
import torch

import advantage
from grading import EXPECTED, close, dec

CASES = dec(EXPECTED["group_advantages"])


def cases(name=None, **kwargs):
    return [c for c in CASES if (name is None or c["name"] == name) and c["kwargs"] == kwargs]


def check(c):
    R = c["rewards"]
    tol = 1e-5 if R.dtype == torch.float32 else 1e-7
    close(advantage.group_advantages(R.clone(), **c["kwargs"]), c["out"],
          f"group_advantages({c['name']}, {c['kwargs']})", atol=tol, rtol=tol)


def test_binary_rewards_use_the_unbiased_std():
    """N = 5 and N = 8 with rewards 1/0 (N = 8 is the worked example `python advantage.py` prints). The paper does not
    say which std; we use the unbiased (N - 1) one, the default of verl (the paper's framework). The
    population std (N) makes every |A| sqrt(N / (N - 1)) times larger: 1.12 at N = 5."""
    for c in cases("binary_n5") + cases("paper_n8") + cases("pm1_n6"):
        check(c)


def test_eps_is_added_to_the_std():
    """eps goes on the std, (std + eps), not inside the square root: at eps = 0.5 the two differ."""
    for c in cases("real_n4") + cases("real_n4", eps=0.5):
        check(c)


def test_mean_only_when_normalize_std_is_false():
    """normalize_std=False: A_i = R_i - mean R, no division (the simulation's and Dr. GRPO's form)."""
    for c in cases(normalize_std=False):
        check(c)


def test_uniform_groups_are_exactly_zero():
    """X = 0 or X = N: every A_i must be exactly 0. The float mean of seven 0.1s is not exactly 0.1, so
    (R - mean) / (std + eps) is 1e-8 / (1e-8 + 1e-6) ~ 0.01 there (0.1 for -1.3 in float32): a
    group with no signal would still push. The mixed last row must keep its advantages."""
    for name in ("uniform_f32", "uniform_f64", "binary_n5"):
        for c in cases(name) + cases(name, normalize_std=False):
            R = c["rewards"]
            A = advantage.group_advantages(R.clone(), **c["kwargs"])
            uniform = (c["out"] == 0).all(1)             # the reference's exact zeros mark them
            assert (A[uniform] == 0).all(), f"{name} {c['kwargs']}: uniform groups got {A[uniform].abs().max():.3g}"
            check(c)


def test_rewards_are_not_changed_in_place():
    """train.py uses its reward tensor again after group_advantages (the focal weight, the logs)."""
    R = cases("real_n4")[0]["rewards"]
    before = R.clone()
    advantage.group_advantages(R)
    advantage.group_advantages(R, normalize_std=False)
    assert torch.equal(R, before), "group_advantages modified its input"
