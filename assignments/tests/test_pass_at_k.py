"""
Problem pass_at_k (2 points): the unbiased pass@k of Chen et al. (2021), Eq. 27 of arXiv 2602.06717:
1 - C(n - c, k) / C(n, k) for one problem, and pass_at_k_table(n, k) for every c = 0 .. n at once.

    python -m pytest -q assignments/tests/test_pass_at_k.py
"""
import math

import numpy as np

import advantage
from grading import EXPECTED

DATA = EXPECTED["pass_at_k"]


def test_values():
    for c in DATA["scalars"]:
        got = advantage.pass_at_k(*c["args"])
        assert math.isfinite(got) and abs(got - c["out"]) <= 1e-9, \
            f"pass_at_k{tuple(c['args'])} = {got}, expected {c['out']}"


def test_not_the_biased_estimator():
    """1 - (1 - c/n)^k draws k of the n samples WITH replacement and is biased low: with 1 correct of
    4, every 4-subset of the 4 samples holds it (pass@4 = 1), while 1 - (3/4)^4 = 0.68."""
    assert abs(advantage.pass_at_k(4, 1, 4) - 1.0) < 1e-12
    assert abs(advantage.pass_at_k(1024, 1, 256) - 0.25) < 1e-12        # one correct sample: k / n


def test_large_n_and_k_stay_finite():
    """n = 4096, k = 2048: C(4096, 2048) ~ 1e1231 is far past float range, so a ratio of float
    binomials gives inf / inf = nan. The paper's n = 1,024, k = 256 is close to that edge already."""
    got = advantage.pass_at_k(4096, 5, 2048)
    assert math.isfinite(got) and abs(got - 0.9688262846093288) < 1e-9, got


def test_table():
    for c in DATA["tables"]:
        n, k = c["args"]
        got = np.asarray(advantage.pass_at_k_table(n, k), dtype=np.float64)
        assert got.shape == (n + 1,), f"pass_at_k_table({n}, {k}) has shape {got.shape}, expected ({n + 1},)"
        np.testing.assert_allclose(got, c["out"], rtol=1e-9, atol=1e-12, err_msg=f"pass_at_k_table({n}, {k})")
