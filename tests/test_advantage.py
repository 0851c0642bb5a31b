"""advantage.py against hand-computed values and plain loops. `python -m pytest -q tests/test_advantage.py`"""
import math

import numpy as np
import pytest
import torch

from advantage import (clip_bounds, ds_grpo_advantages, entropy_from_logits, focal_advantages,
                       focal_weight, group_advantages, kl_k3, low_lr_multiplier, policy_loss,
                       success_rate, token_mean)



@pytest.fixture(autouse=True)
def float64():
    """Exact comparisons need float64; restore the default so other test files are unaffected."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# -----------------------------------------------------------------------------
# Eq. 3 and Eqs. 11-13

def test_group_advantages_against_loop():
    rewards = torch.tensor([[1., 0, 0, 1, 1], [0, 0, 0, 0, 1], [2.5, -1, 0.5, 0.5, 3]])
    adv = group_advantages(rewards)
    for g, row in enumerate(rewards.tolist()):
        n = len(row)
        mean = sum(row) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in row) / (n - 1))          # unbiased
        for i, r in enumerate(row):
            assert adv[g, i].item() == pytest.approx((r - mean) / (std + 1e-6), abs=1e-12)


def test_group_advantages_paper_table_n8():
    """Eq. 3 at N = 8, rewards 1/0, unbiased std: A+ = (1 - mu_hat) / std and A- = -mu_hat / std, before g."""
    a_pos = [2.475, 1.620, 1.208, 0.935, 0.725, 0.540, 0.354]
    for X in range(1, 8):
        rewards = torch.tensor([[1.0] * X + [0.0] * (8 - X)])
        adv = group_advantages(rewards)
        assert adv[0, 0].item() == pytest.approx(a_pos[X - 1], abs=1e-3)
        assert adv[0, -1].item() == pytest.approx(-a_pos[7 - X], abs=1e-3)


def test_uniform_groups_are_exactly_zero():
    rewards = torch.tensor([[0.1] * 7, [1.0] * 7, [0.0] * 7, [-1.0] * 7])
    assert (group_advantages(rewards) == 0).all()
    assert (group_advantages(rewards, normalize_std=False) == 0).all()
    assert (group_advantages(torch.tensor([[1.0], [0.0]])) == 0).all()       # N = 1: nothing to compare


def test_mean_only_advantages():
    rewards = torch.tensor([[1., -1, -1, 1], [1, 1, 1, -1]])
    assert torch.equal(group_advantages(rewards, normalize_std=False),
                       torch.tensor([[1., -1, -1, 1], [0.5, 0.5, 0.5, -1.5]]))


def test_group_advantages_rejects_flat_input():
    with pytest.raises(ValueError, match="num_groups"):
        group_advantages(torch.ones(8))


def test_success_rate_is_x_over_n():
    assert success_rate(torch.tensor([[1., 0, 1, 1]])).tolist() == [0.75]
    assert success_rate(torch.tensor([[1., -1, -1, -1]]), r_correct=1, r_wrong=-1).tolist() == [0.25]
    with pytest.raises(ValueError):
        success_rate(torch.tensor([[1., 0]]), r_correct=0, r_wrong=1)


@pytest.mark.parametrize("rewards, levels", [
    ([[1.5, 0.0, 1.0]], (1.0, 0.0)),                      # above R_c: mu_hat = 0.83 from one reward of 1.5
    ([[-1.0, 0.0, 0.0]], (1.0, 0.0)),                     # below R_w: mu_hat < 0, so g > 1
    ([[1.0, -1.0, -2.0]], (1.0, -1.0)),                   # same, with +-1 reward levels
])
def test_success_rate_rejects_rewards_outside_levels(rewards, levels):
    """A reward outside [R_w, R_c] used to give a rate outside [0, 1] (and focal_advantages a g
    above 1 or clipped to 0) without a word; the focal weight would then scale groups silently."""
    with pytest.raises(ValueError, match="must lie in"):
        success_rate(torch.tensor(rewards), *levels)
    with pytest.raises(ValueError, match="must lie in"):
        focal_advantages(torch.tensor(rewards), 0.5, r_correct=levels[0], r_wrong=levels[1])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_success_rate_rejects_non_finite_rewards(bad):
    """NaN compares False with everything, so a range check alone lets it through: test it first."""
    with pytest.raises(ValueError, match="finite"):
        success_rate(torch.tensor([[1.0, bad, 0.0]]))
    with pytest.raises(ValueError, match="finite"):
        focal_advantages(torch.tensor([[1.0, bad, 0.0]]), 1.0)


def test_success_rate_accepts_the_levels_and_partial_rewards():
    assert success_rate(torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.5, 0.0]])).tolist() == [0.0, 1.0, 0.25]


def test_focal_weight_paper_table():
    """g of Eq. 12 at N = 8 (mu_hat = X / 8), for focal_advantages (train.py) and focal_weight (simulate.py)."""
    table = {0.5: [0.935, 0.866, 0.791, 0.707, 0.612, 0.500, 0.354],
             1.0: [0.875, 0.750, 0.625, 0.500, 0.375, 0.250, 0.125],
             2.0: [0.766, 0.562, 0.391, 0.250, 0.141, 0.062, 0.016]}
    mu = torch.arange(1, 8) / 8
    rewards = (torch.arange(8)[None, :] < torch.arange(1, 8)[:, None]).double()   # row X-1: X correct
    for gamma, want in table.items():
        assert torch.allclose(focal_advantages(rewards, gamma)[1], torch.tensor(want), atol=6e-4)
        assert torch.allclose(focal_weight(mu, gamma), torch.tensor(want), atol=6e-4)
        assert focal_weight(mu[3], gamma).item() == pytest.approx(want[3], abs=6e-4)    # 0-d, as simulate.py


def test_gamma_zero_is_grpo():
    """gamma = 0 must reproduce GRPO bit for bit, including at mu_hat = 1 where 0^0 = 1."""
    rewards = torch.tensor([[1., 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    adv, g = focal_advantages(rewards, gamma=0.0)
    assert torch.equal(g, torch.ones(3))
    assert torch.equal(adv, group_advantages(rewards))
    assert focal_weight(torch.tensor(1.0), 0.0).item() == 1.0


def test_focal_scales_after_normalisation():
    rewards = torch.tensor([[1., 0, 0, 0], [1, 1, 1, 0]])
    adv, g = focal_advantages(rewards, gamma=1.0)
    assert torch.allclose(g, torch.tensor([0.75, 0.25]))
    assert torch.allclose(adv, g[:, None] * group_advantages(rewards))
    assert torch.all((0 <= g) & (g <= 1))
    with pytest.raises(ValueError):
        focal_weight(torch.tensor(0.5), -1.0)
    with pytest.raises(ValueError):
        focal_advantages(rewards, -1.0)


def test_focal_weight_is_finite_when_mu_hat_rounds_past_one():
    """The mean of seven rewards of 0.1 rounds to just above 0.1 in float32, so mu_hat = 1 + 1e-7:
    without the clamp, g = (1 - mu_hat)^0.5 would be NaN for a group the policy fully solves."""
    adv, g = focal_advantages(torch.full((1, 7), 0.1, dtype=torch.float32), 0.5, r_correct=0.1, r_wrong=0.0)
    assert g.tolist() == [0.0] and (adv == 0).all()
    assert focal_weight(torch.tensor([1 + 1e-7]), 0.5).tolist() == [0.0]


def test_low_lr_multiplier_closed_form_and_integral():
    assert low_lr_multiplier(0.0) == pytest.approx(1.0)
    assert low_lr_multiplier(0.5) == pytest.approx(0.6791, abs=5e-5)
    assert low_lr_multiplier(1.0) == pytest.approx(0.5)
    assert low_lr_multiplier(2.0) == pytest.approx(0.3125)
    mu = (np.arange(200_000) + 0.5) / 200_000                                   # midpoint rule
    w = np.sqrt(mu * (1 - mu))
    assert low_lr_multiplier(0.5) == pytest.approx(((1 - mu) ** 0.5 * w).sum() / w.sum(), abs=1e-6)


def test_ds_grpo_best_guess():
    rewards = torch.tensor([[1., 0, 0, 1]])
    lbar = torch.tensor([[-0.5, -2.0, -1.0, -0.1]])
    z = torch.tensor([[1., -1, -1, 1]])                            # population std of {0,0,1,1} is 0.5
    want = z + torch.tensor([[0.05 * 0.5, -0.05 * 2.0, -0.05 * 1.0, 0.05 * 0.1]])
    assert torch.allclose(ds_grpo_advantages(rewards, lbar), want, atol=1e-5)


# -----------------------------------------------------------------------------
# Eqs. 14-16: per-token losses

def naive_token_loss(lp, olp, a, loss_type, dual_clip=3.0):
    """One token, written out from the equations (to minimise)."""
    lo, hi = clip_bounds(loss_type)
    r = math.exp(max(-20.0, min(20.0, lp - olp)))
    if loss_type == "cispo":
        return -min(max(r, lo), hi) * a * lp                        # the weight's value; grad: see below
    l = max(-a * r, -a * min(max(r, lo), hi))
    return min(l, -a * dual_clip) if a < 0 else l


def make_batch(seed=0, B=6, T=9):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3
    old = logp + torch.randn(B, T, generator=g) * 0.4             # ratios spread around 1
    old[0, 0] = logp[0, 0] - math.log(4.0)                         # r = 4 > dual clip c = 3
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[:, 0] = True
    adv = torch.randn(B, generator=g)
    adv[0] = -1.0                                                  # row 0 has A < 0 for the dual clip
    return logp, old, adv, mask


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo"])
def test_loss_value_against_naive(loss_type):
    logp, old, adv, mask = make_batch()
    loss, _ = policy_loss(logp, old, adv, mask, loss_type)
    want = [naive_token_loss(logp[b, t].item(), old[b, t].item(), adv[b].item(), loss_type)
            for b in range(logp.shape[0]) for t in range(logp.shape[1]) if mask[b, t]]
    assert loss.item() == pytest.approx(sum(want) / len(want), abs=1e-12)


def test_clip_gradients_grpo_vs_dapo():
    """A > 0 tokens: the gradient is zero once r > 1 + eps_high, so r = 1.25 is clipped by GRPO
    (0.2) but not by DAPO's clip-higher (0.28). A < 0 tokens are clipped below 1 - 0.2 in both."""
    ratios = torch.tensor([1.25, 0.75, 1.1])
    adv = torch.tensor([1.0, -1.0, 1.0])
    for loss_type, live in [("grpo", [0, 0, 1]), ("dapo", [1, 0, 1])]:
        logp = torch.log(ratios).clone().requires_grad_()
        loss, diag = policy_loss(logp[:, None], torch.zeros(3, 1), adv, torch.ones(3, 1), loss_type)
        loss.backward()
        # d(-A r)/dlogp = -A r for live tokens, 0 for clipped ones; token mean over 3 tokens
        want = torch.tensor(live) * (-adv * ratios) / 3
        assert torch.allclose(logp.grad, want), (loss_type, logp.grad)
        assert diag["clip/low"].item() == pytest.approx(1 / 3)
        assert diag["clip/high"].item() == pytest.approx((1 - live[0]) / 3)


def test_dual_clip_caps_negative_advantage_loss():
    logp = torch.log(torch.tensor([[5.0, 2.0]])).requires_grad_()
    loss, diag = policy_loss(logp, torch.zeros(1, 2), torch.tensor([-2.0]), torch.ones(1, 2), "grpo")
    assert loss.item() == pytest.approx((2.0 * 3.0 + 2.0 * 2.0) / 2)   # r = 5 capped at c = 3
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0                                 # capped: no gradient
    assert logp.grad[0, 1].item() == pytest.approx(2.0 * 2.0 / 2)
    assert diag["clip/dual"].item() == pytest.approx(0.5)


def test_cispo_weight_is_stop_gradient_and_bounds_are_not_ppo_defaults():
    """The CISPO weight clip(r, 0, 6) is a constant: grad wrt logp is -w A, not -A r (PPO) and
    not involving dw/dlogp. With PPO bounds (0.8, 1.2) r = 3 would be weighted 1.2, not 3."""
    assert clip_bounds("cispo") == (0.0, 6.0)
    r = torch.tensor([[3.0, 10.0, 0.5]])
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = logp.detach() - torch.log(r)
    adv = torch.tensor([0.7])
    loss, diag = policy_loss(logp, old, adv, torch.ones(1, 3), "cispo")
    loss.backward()
    w = torch.tensor([[3.0, 6.0, 0.5]])
    assert torch.allclose(logp.grad, -w * 0.7 / 3)
    assert torch.allclose(loss, (-w * 0.7 * logp.detach()).mean())
    assert diag["cispo/at_hi"].item() == pytest.approx(1 / 3) and diag["cispo/at_lo"].item() == 0


def test_on_policy_gradients_identical_across_losses():
    """At r = 1 (the first mini-batch of every step) all three losses have gradient -A grad log pi."""
    logp, _, adv, mask = make_batch(seed=3)
    grads = []
    for loss_type in ("grpo", "dapo", "cispo"):
        lp = logp.clone().requires_grad_()
        policy_loss(lp, logp, adv, mask, loss_type)[0].backward()
        grads.append(lp.grad)
    assert torch.allclose(grads[0], grads[1]) and torch.allclose(grads[0], grads[2])
    assert torch.allclose(grads[0], -adv[:, None] * mask / mask.sum())


def test_per_token_advantages_accepted():
    logp, old, adv, mask = make_batch()
    a = policy_loss(logp, old, adv, mask)[0]
    b = policy_loss(logp, old, adv[:, None].expand_as(logp), mask)[0]
    assert torch.allclose(a, b)


def test_bad_loss_type_and_bounds():
    with pytest.raises(ValueError, match="loss_type"):
        clip_bounds("ppo")
    with pytest.raises(ValueError, match="contain 1"):
        clip_bounds("grpo", eps_low=-0.5)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo"])
@pytest.mark.parametrize("num_tokens", [None, 0, torch.tensor(0.0)],
                         ids=["mask_sum", "int_zero", "tensor_zero"])
def test_empty_mask_gives_zero_loss_and_zero_gradient(loss_type, num_tokens):
    """A batch with no response tokens (all padding; or a global count of 0) used to divide 0 by 0:
    a NaN loss whose NaN gradient would wipe out the weights at the next optimizer step."""
    logp, old, adv, mask = make_batch()
    lp = logp.clone().requires_grad_()
    loss, diag = policy_loss(lp, old, adv, torch.zeros_like(mask), loss_type, num_tokens=num_tokens)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(lp.grad, torch.zeros_like(lp))
    assert all(v.item() == 0.0 for v in diag.values())


def test_empty_mask_kl_and_entropy_token_means_are_zero():
    """KL and entropy are per-token; their token mean over no tokens must be 0 with gradient 0 too."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    logits = torch.tensor([[[0.0, 1.0], [2.0, -1.0]]], requires_grad=True)
    empty = torch.zeros(1, 2, dtype=torch.bool)
    kl = token_mean(kl_k3(logp, torch.tensor([[-0.5, -0.5]])), empty)
    h = token_mean(entropy_from_logits(logits), empty)
    (kl + h).backward()
    assert kl.item() == 0.0 and h.item() == 0.0
    assert torch.equal(logp.grad, torch.zeros_like(logp))
    assert torch.equal(logits.grad, torch.zeros_like(logits))
    assert token_mean(torch.zeros(0, 5), torch.zeros(0, 5)).item() == 0.0       # no sequences at all


# -----------------------------------------------------------------------------
# Token-mean over micro-batches: divide by the global token count, never average per-micro-batch means

def varied_fixture():
    """2 prompts x 4 rollouts with lengths 3..40 and mixed rewards in every group."""
    torch.manual_seed(0)
    lengths = torch.tensor([3, 40, 7, 25, 12, 4, 33, 9])
    rewards = torch.tensor([[1., 0, 0, 1], [0, 1, 1, 1]])
    assert rewards.std(1).min() > 0                        # non-zero variance, or the test is vacuous
    T = int(lengths.max())
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = focal_advantages(rewards, gamma=0.5)[0].reshape(-1)
    x = torch.randn(8, T)                                  # stands in for per-token features
    old = torch.randn(8, T) * 0.1 - 1.0
    return x, old, adv, mask


def grad_with_splits(splits, naive=False, loss_type="dapo"):
    x, old, adv, mask = varied_fixture()
    w = torch.zeros((), requires_grad=True)               # one parameter: logp = old + w * x
    n_tok = mask.sum()
    for idx in splits:
        logp = old[idx] + w * x[idx]
        if naive:                                          # mean of per-micro-batch means
            loss = policy_loss(logp, old[idx], adv[idx], mask[idx], loss_type)[0] / len(splits)
        else:
            loss = policy_loss(logp, old[idx], adv[idx], mask[idx], loss_type, num_tokens=n_tok)[0]
        loss.backward()
    return w.grad


SPLITS = {1: [list(range(8))], 2: [[0, 1, 2], [3, 4, 5, 6, 7]], 4: [[0], [1, 2], [3, 4, 5], [6, 7]]}


def test_token_mean_invariant_to_micro_batches():
    ref = grad_with_splits(SPLITS[1])
    assert ref.abs() > 1e-3
    for k in (2, 4):
        assert torch.allclose(grad_with_splits(SPLITS[k]), ref, atol=1e-10, rtol=0)


def test_token_mean_is_not_mean_of_microbatch_means():
    """Uneven lengths make 'mean of per-micro-batch means' differ from the true token mean.
    This fixture must tell them apart, otherwise the invariance test above proves nothing."""
    ref = grad_with_splits(SPLITS[1])
    assert not torch.allclose(grad_with_splits(SPLITS[4], naive=True), ref, atol=1e-6)


def test_diagnostics_add_up_over_micro_batches():
    x, old, adv, mask = varied_fixture()
    logp = old + 0.3 * x
    full = policy_loss(logp, old, adv, mask, "grpo")[1]
    n = mask.sum()
    parts = [policy_loss(logp[i], old[i], adv[i], mask[i], "grpo", num_tokens=n)[1] for i in SPLITS[4]]
    for k in ("clip/low", "clip/high", "clip/dual", "ratio/mean"):
        assert sum(p[k] for p in parts).item() == pytest.approx(full[k].item(), abs=1e-12)
    assert max(p["ratio/max"] for p in parts).item() == pytest.approx(full["ratio/max"].item())
    assert full["clip/low"] > 0 and full["clip/high"] > 0               # the fixture exercises clipping


# -----------------------------------------------------------------------------
# KL and entropy

def test_kl_k3_values():
    logp = torch.tensor([-1.0, -2.0, -0.3])
    ref = torch.tensor([-1.0, -1.0, -2.3])
    d = ref - logp
    assert torch.allclose(kl_k3(logp, ref), torch.exp(d) - d - 1)
    assert kl_k3(logp, logp).abs().max() == 0
    assert (kl_k3(torch.tensor([-30.0]), torch.tensor([0.0])) == 10.0).all()      # clamped
    # k3 is an unbiased estimate of KL(pi || ref) when tokens are drawn from pi
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    kl = (p * (p / q).log()).sum()
    assert (p * kl_k3(p.log(), q.log())).sum().item() == pytest.approx(kl.item())


def test_entropy_from_logits():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, -10.0, -10.0, -10.0]])
    h = entropy_from_logits(logits)
    assert h[0].item() == pytest.approx(math.log(4))
    assert h[1].item() == pytest.approx(0.0, abs=1e-6)
    assert token_mean(h, torch.tensor([1.0, 0.0])).item() == pytest.approx(math.log(4))


# -----------------------------------------------------------------------------
# Loss aggregation (--loss_agg) and the mean-only advantage (--norm_std false)

def test_aggregations_follow_their_formulas_and_add_up_over_splits():
    from advantage import aggregate
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=g, dtype=torch.float64)
    lens = torch.tensor([7, 1, 3, 5, 2])
    mask = torch.arange(7)[None] < lens[:, None]
    seq_means = torch.stack([x[i, :n].mean() for i, n in enumerate(lens.tolist())])
    want = {"token-mean": x[mask].sum() / lens.sum(), "seq-mean-token-mean": seq_means.mean(),
            "seq-mean-token-sum-norm": x[mask].sum() / (5 * 10)}
    for agg, w in want.items():
        kw = dict(num_tokens=lens.sum(), num_seqs=5, max_len=10)
        assert aggregate(x, mask, agg, **kw) == pytest.approx(float(w), abs=1e-12), agg
        # the micro-batch shares, each with the whole mini-batch's counts, add up to the whole
        parts = sum(aggregate(x[s], mask[s], agg, **kw) for s in (slice(0, 2), slice(2, 3), slice(3, 5)))
        assert parts == pytest.approx(float(w), abs=1e-12), agg
    # a mean of sequence means weights a 1-token answer like a 7-token one: not the token mean
    assert abs(want["seq-mean-token-mean"] - want["token-mean"]) > 1e-3
    with pytest.raises(ValueError, match="loss_agg"):
        aggregate(x, mask, "sum")


def test_policy_loss_aggregates_as_asked_and_keeps_token_mean_diagnostics():
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    A = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    base, d0 = policy_loss(logp, old, A, mask, "dapo")
    per_seq, d1 = policy_loss(logp, old, A, mask, "dapo", loss_agg="seq-mean-token-mean")
    per_tok = torch.stack([policy_loss(logp[i:i + 1], old[i:i + 1], A[i:i + 1], mask[i:i + 1], "dapo")[0]
                           for i in range(3)])
    assert per_seq == pytest.approx(float(per_tok.mean()), abs=1e-12)
    assert not torch.isclose(base, per_seq)
    assert d0 == d1                                            # clip fractions are token fractions either way


def test_mean_only_advantages_and_gamma_zero():
    from advantage import focal_advantages
    R = torch.tensor([[1.0, 0, 0, 1], [1, 1, 1, 1], [0, 0, 1, 0]])
    A, g = focal_advantages(R, 0.0, normalize_std=False)
    assert torch.equal(A, R - R.mean(1, keepdim=True)) and torch.equal(g, torch.ones(3))   # Dr. GRPO's A
    assert torch.equal(focal_advantages(R, 0.0)[0], group_advantages(R))                  # gamma 0 = GRPO
    A5, g5 = focal_advantages(R, 0.5, normalize_std=False)
    assert torch.allclose(A5, g5[:, None] * (R - R.mean(1, keepdim=True)))
