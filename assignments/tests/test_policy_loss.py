"""
Problem policy_loss (3 points): the per-token losses of GRPO / DAPO (Eq. 14 of arXiv 2602.06717, with
verl's +-20 log-ratio clamp and dual clip) and CISPO (Eqs. 15-16), aggregated by aggregate(), with
the clip-fraction diagnostics.

    python -m pytest -q assignments/tests/test_policy_loss.py

The functions policy_loss builds on are stood in for (conftest): clip_bounds by the reference's
stored bounds, token_mean (the diagnostics) by its stored weights, and aggregate by a spy that
records the per-token losses it is given and returns sum(per_tok * W) for a fixed W. So the tests
see your per-token losses directly, and a bug in another problem does not cost these points.
"""
import math

import pytest
import torch

import advantage
from grading import EXPECTED, LinearMemo, Memo, Spy, close, dec, grad_of

DATA = dec(EXPECTED["policy_loss"])
CASES = DATA["cases"]
NAMES = ["grpo", "dapo", "cispo", "grpo_widths", "on_policy", "dapo_token_adv", "cispo_outliers",
         "grpo_seq_mean", "dapo_count"]


@pytest.fixture
def run(monkeypatch):
    monkeypatch.setattr(advantage, "clip_bounds", Memo(advantage.clip_bounds, DATA["clip_bounds"]))
    monkeypatch.setattr(advantage, "token_mean", LinearMemo(advantage.token_mean, DATA["token_mean"]))
    aggregate = advantage.aggregate                      # its signature, for the spy's argument names

    def go(c):
        spy = Spy(aggregate, DATA["cotangent"])
        monkeypatch.setattr(advantage, "aggregate", spy)
        logp = c["logp"].clone().requires_grad_(True)
        out = advantage.policy_loss(logp, c["old_logp"].clone(), c["advantages"].clone(), c["mask"].clone(),
                                    c["loss_type"], **c["kwargs"])
        assert isinstance(out, tuple) and len(out) == 2, "policy_loss returns (loss, diagnostics)"
        assert len(spy.calls) == 1, (f"policy_loss called aggregate {len(spy.calls)} times; aggregate the "
                                     "per-token losses with exactly one aggregate(per_tok, mask, loss_agg, ...)")
        return logp, out[0], out[1], spy.calls[0]
    return go


def per_token(c, call):
    """The per-token losses handed to aggregate, on the response tokens (padding may hold anything)."""
    x = torch.as_tensor(call["x"]).detach().to(torch.float64)
    m = c["mask"].bool()
    return x.expand(m.shape)[m], c["per_tok"][m]


@pytest.mark.parametrize("i", range(len(CASES)), ids=NAMES)
def test_per_token_losses(run, i):
    c = CASES[i]
    _, _, _, call = run(c)
    got, want = per_token(c, call)
    close(got, want, f"{NAMES[i]}: per-token loss on response tokens")


@pytest.mark.parametrize("i", range(len(CASES)), ids=NAMES)
def test_loss_and_gradient(run, i):
    """The gradient with respect to logp is what trains the model. For CISPO the clipped ratio is
    sg(.), a constant: without the stop-gradient the value is the same but the gradient is not."""
    c = CASES[i]
    logp, loss, _, _ = run(c)
    close(loss, c["loss"], f"{NAMES[i]}: loss")
    close(grad_of(loss, logp), c["grad"], f"{NAMES[i]}: d loss / d logp")


def test_ratio_is_the_exp_of_the_log_ratio(run):
    """On-policy, logp == old_logp, so r = exp(0) = 1 and every token's loss is -A. Using the
    log-ratio logp - old_logp (= 0) itself as r would give 0 everywhere."""
    c = CASES[NAMES.index("on_policy")]
    _, _, _, call = run(c)
    got, want = per_token(c, call)
    close(got, want, "on-policy per-token loss (should be -A)")


def test_dual_clip_caps_negative_advantage_tokens(run):
    """Tokens with A < 0 and r = 4 and 4.5 > c = 3: max(-A r, -A clip(r)) = 4|A| grows without bound
    as r does; the dual clip caps the loss at c |A| = 3|A| (gradient 0 there)."""
    c = CASES[NAMES.index("grpo")]
    _, _, _, call = run(c)
    x = torch.as_tensor(call["x"]).detach().to(torch.float64).expand(c["mask"].shape)
    A = c["advantages"]
    for b, t in ((1, 0), (3, 1)):
        assert math.isclose(float(x[b, t]), -3.0 * float(A[b]), rel_tol=1e-7), \
            f"token ({b}, {t}): r = {math.exp(c['logp'][b, t] - c['old_logp'][b, t]):.2f}, A = {A[b]:.2f}, " \
            f"loss {float(x[b, t]):.4f}, expected the dual-clip cap 3|A| = {-3 * float(A[b]):.4f}"


def test_aggregation_settings_are_passed_on(run):
    """loss_agg, num_tokens, num_seqs and max_len go to aggregate unchanged (train.py passes the
    mini-batch's global counts), with the response mask."""
    for i, c in enumerate(CASES):
        _, _, _, call = run(c)
        assert torch.equal(torch.as_tensor(call["mask"]).to(torch.float64), c["mask"]), f"{NAMES[i]}: mask"
        for k, want in c["aggregate_args"].items():
            got = call[k]
            ok = (got is None) if want is None else (got == want if isinstance(want, str) else
                                                       got is not None and math.isclose(float(got), float(want)))
            assert ok, f"{NAMES[i]}: aggregate got {k}={got!r}, expected {want!r}"


@pytest.mark.parametrize("i", range(len(CASES)), ids=NAMES)
def test_diagnostics(run, i):
    """Token fractions (token_mean over num_tokens) of: clip/low (A < 0 and r < lo), clip/high (A > 0
    and r > hi), clip/dual (A < 0 and r > c) for GRPO / DAPO; cispo/at_lo (r < lo), cispo/at_hi
    (r > hi) for CISPO; ratio/mean, and ratio/max over response tokens. The log-ratio clamp shows here:
    a log-ratio of 25 gives ratio/max = exp(20)."""
    c = CASES[i]
    _, _, diag, _ = run(c)
    assert set(diag) == set(c["diag"]), f"{NAMES[i]}: diagnostics {sorted(diag)}, expected {sorted(c['diag'])}"
    for k, want in c["diag"].items():
        close(diag[k], want, f"{NAMES[i]}: diag[{k!r}]")
