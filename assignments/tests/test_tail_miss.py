"""
Problem tail_miss (1 point): Lemma 3.1 of arXiv 2602.06717, the probability that a group is active
(0 < X < N) and yet no rollout lands in a rare correct subset E:
Pr(B) = (1 - tau)^N - (mu_pos - tau)^N - (1 - mu_pos)^N, broadcasting over numpy arrays.

    python -m pytest -q assignments/tests/test_tail_miss.py
"""
import numpy as np

import advantage
from grading import EXPECTED

DATA = EXPECTED["tail_miss"]


def test_grid_broadcasts_and_matches():
    """mu_pos (4, 1, 1), tau (4, 4, 1), N (1, 1, 7) -> (4, 4, 7). Leaving out one of the two inactive
    ways of missing E (all correct outside E, or all wrong) overstates the risk."""
    g = {k: np.asarray(v) for k, v in DATA["grid"].items()}
    got = np.asarray(advantage.tail_miss_probability(g["mu_pos"], g["tau"], g["n"]), dtype=np.float64)
    want = np.asarray(DATA["out"])
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_one_rollout_never_makes_an_active_group():
    """N = 1: a group of one is never mixed, so Pr(B) = 0."""
    assert abs(float(advantage.tail_miss_probability(0.5, 0.05, 1))) < 1e-12


def test_large_n_at_the_simulation_start():
    """mu_pos = 0.64, tau = 6.3e-5 (one non-anchor correct action of the simulation, Fig. 5): above
    0.9 up to N = 1,024, then 0.60, 0.127 and 2.6e-4 at N = 8,192, 32,768 and 131,072."""
    for c in DATA["scalars"]:
        got = float(advantage.tail_miss_probability(*c["args"]))
        assert abs(got - c["out"]) <= 1e-9, f"tail_miss_probability{tuple(c['args'])} = {got}, expected {c['out']:.6g}"


def test_argmax_table():
    """The integer argmax N* and the peak, by evaluating every N (tail_miss_argmax uses your function):
    e.g. mu_pos = 0.8, rho = 0.01 peaks at N* = 15 with 0.856."""
    for c in DATA["argmax"]:
        n, p = advantage.tail_miss_argmax(c["mu_pos"], c["rho"] * c["mu_pos"])
        assert n == c["out"][0] and abs(p - c["out"][1]) < 1e-9, \
            f"mu {c['mu_pos']}, rho {c['rho']}: got N* {n} ({p:.4f}), expected {c['out'][0]} ({c['out'][1]:.4f})"
