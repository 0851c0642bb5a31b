"""
Problem kl_k3 (1 point): the per-token k3 estimate of KL(pi_theta || pi_ref) of the GRPO-KL control
(Sec. 5.6 of arXiv 2602.06717): k3 = exp(d) - d - 1, d = log pi_ref - log pi_theta, d clamped to
+-20 and k3 to [-10, 10].

    python -m pytest -q assignments/tests/test_kl_k3.py
"""
import torch

import advantage
from grading import EXPECTED, close, dec, grad_of

DATA = dec(EXPECTED["kl_k3"])


def run():
    logp = DATA["logp"].clone().requires_grad_(True)
    out = advantage.kl_k3(logp, DATA["ref_logp"].clone())
    return logp, out


def test_values():
    """d = log pi_ref - log pi_theta, in that order: exp(-d) + d - 1 estimates the other KL."""
    _, out = run()
    close(out, DATA["out"], "kl_k3")


def test_gradient():
    logp, out = run()
    close(grad_of(torch.as_tensor(out).sum(), logp), DATA["grad"], "d sum(kl_k3) / d logp")


def test_non_negative_and_capped():
    """k3 >= 0 always (exp(d) >= 1 + d); one outlier token (d = -15, k3 = 14) is capped at 10."""
    _, out = run()
    assert (out >= 0).all() and (out <= 10).all(), out
