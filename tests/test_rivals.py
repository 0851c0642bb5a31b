"""F-GRPO's rivals in the focal weight's slot (advantage.py): MaxRL, pass@k training, W-REINFORCE, the
unlikeliness reward; their formulas on hand-computed cases and against brute force, their edges (mu_hat 0
and 1, N = 1, c = N - 1, k > N - c), bad values refused, and train.py's step giving each function's advantages;
the engine-trainer correction (--tis_cap: advantage.tis_weights) by hand, in the update and on the torch engine.

    python -m pytest -q tests/test_rivals.py          # seconds
"""
import itertools
import math
from types import SimpleNamespace

import pytest
import torch

import train
from advantage import (WEIGHTINGS, focal_advantages, group_advantages, maxrl_advantages, passk_advantages,
                       tis_weights, unlikely_rewards, weighted_advantages, wreinforce_advantages)
from fgrpo_utils import policy
from test_gpu_path import group, mixed_lengths, small_cfg, tiny  # noqa: F401  (group: a process group of one)
from test_train_scale import FakeEngine, tiny_loader

F64 = torch.float64


def rewards(*rows):
    return torch.tensor(rows, dtype=F64)


def test_maxrl_by_hand_and_as_a_reweighted_grpo():
    """(r - rbar) / rbar: c = 1 of 4 gives 3 and -1, c = 3 of 4 gives 1/3 and -1; 0 at rbar = 0 and rbar = 1,
    and for N = 1. For binary rewards it is GRPO's population-std z-score times sqrt((1 - mu) / mu)."""
    A = maxrl_advantages(rewards([1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]), eps=0)
    assert torch.allclose(A, rewards([3, -1, -1, -1], [1 / 3, 1 / 3, 1 / 3, -1], [0] * 4, [0] * 4))
    assert torch.equal(maxrl_advantages(rewards([1], [0])), torch.zeros(2, 1, dtype=F64))
    g = torch.Generator().manual_seed(0)
    R = (torch.rand(64, 8, generator=g) < torch.rand(64, 1, generator=g)).to(F64)
    mu = R.mean(1, keepdim=True)
    pop = group_advantages(R, eps=0) * math.sqrt(8 / 7)                             # population std
    want = torch.where((mu > 0) & (mu < 1), pop * torch.sqrt((1 - mu) / mu.clamp(min=1e-9)), torch.zeros_like(R))
    assert torch.allclose(maxrl_advantages(R, eps=0), want, atol=1e-12)
    assert torch.allclose(maxrl_advantages([[1, 0, 0, 0]], eps=0), torch.tensor([[3.0, -1, -1, -1]]))  # ints, lists
    # partial rewards in [0, 1] are MaxRL's own (its paper's reward is any r >= 0 normalised by its mean)
    assert torch.allclose(maxrl_advantages(rewards([0.5, 0.25]), eps=0), rewards([1 / 3, -1 / 3]))


def brute_passk(row, k):
    """pass@k training's advantages by enumeration: each sample's mean max reward over the k-subsets holding
    it, less the group's mean over all k-subsets, over that mean's Bernoulli std."""
    N = len(row)
    subsets = list(itertools.combinations(range(N), k))
    rbar = sum(max(row[i] for i in s) for s in subsets) / len(subsets)
    sigma = math.sqrt(rbar * (1 - rbar))
    if sigma == 0:
        return [0.0] * N
    mine = [[max(row[j] for j in s) for s in subsets if i in s] for i in range(N)]
    return [(sum(m) / len(m) - rbar) / sigma for m in mine]


@pytest.mark.parametrize("N", [1, 2, 4, 8])
def test_passk_against_enumeration(N):
    for k in range(1, N + 1):
        for c in range(N + 1):
            row = [1.0] * c + [0.0] * (N - c)
            got = passk_advantages(rewards(row), k)[0].tolist()
            assert got == pytest.approx(brute_passk(row, k), abs=1e-12), (N, k, c)


def test_passk_edges():
    """k = 1 is GRPO with the population std; k > N - c (every k-subset holds a correct sample), c = 0 and
    c = N give 0; c = N - 1 at k = 2 of 4: Rbar = 1, so 0 too; by hand c = 1 of 4 at k = 2: 1 and -1/3."""
    R = rewards([1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1])
    assert torch.allclose(passk_advantages(R, 1), group_advantages(R, eps=0) * math.sqrt(4 / 3))
    A = passk_advantages(R, 2)
    assert torch.allclose(A[0], rewards([1, -1 / 3, -1 / 3, -1 / 3])[0])
    assert torch.equal(A[2:], torch.zeros(3, 4, dtype=F64))
    assert torch.equal(passk_advantages(R, 4)[1], torch.zeros(4, dtype=F64))          # k = 4 > N - c = 2


def test_wreinforce_and_unlikeliness_by_hand():
    A = wreinforce_advantages(rewards([1, 0], [1, 1], [0, 0]), lam=0.1)
    assert torch.allclose(A, rewards([0.1, -1], [0.1, 0.1], [-1, -1]))                # uniform groups move it too
    # least likely first: index 3 (-4) rank 0 keeps its reward; index 0 (-1) rank 3 is scaled by 1 - 0.25 * 3/4
    R = rewards([1, 1, 0, 1])
    shaped = unlikely_rewards(R, torch.tensor([[-1.0, -2.0, -3.0, -4.0]]), 0.25)
    assert torch.allclose(shaped, rewards([1 - 0.25 * 3 / 4, 1 - 0.25 * 2 / 4, 0, 1]))
    A = group_advantages(shaped)
    assert A[0, 3] > A[0, 1] > A[0, 0] > 0 > A[0, 2]          # the rare correct rollout gains the most
    assert torch.equal(unlikely_rewards(R, torch.zeros(1, 4), 0.0), R)               # beta 0: unchanged
    ties = unlikely_rewards(rewards([1, 1]), torch.tensor([[-1.0, -1.0]]), 0.5)      # ties: by position
    assert torch.allclose(ties, rewards([1, 0.75]))


@pytest.mark.parametrize("call", [
    lambda: passk_advantages(rewards([0.5, 1.0]), 1),               # pass@k is defined on correctness
    lambda: passk_advantages(rewards([1.0, 0.0]), 3),               # k > N
    lambda: passk_advantages(rewards([1.0, 0.0]), 0),
    lambda: wreinforce_advantages(rewards([0.5, 1.0])),
    lambda: wreinforce_advantages(rewards([1.0, 0.0]), lam=-0.1),
    lambda: maxrl_advantages(rewards([1.5, 0.0])),
    lambda: maxrl_advantages(rewards([float("nan"), 0.0])),
    lambda: unlikely_rewards(rewards([1.0, 0.0]), torch.zeros(1, 2), 1.5),
    lambda: weighted_advantages(rewards([1.0, 0.0]), "focal2"),
])
def test_bad_values_are_one_line(call):
    with pytest.raises(ValueError) as e:
        call()
    assert "\n" not in str(e.value)


def test_focal_through_the_dispatch_is_focal_advantages():
    R = rewards([1, 0, 0, 0], [1, 1, 1, 0])
    A, g = weighted_advantages(R, "focal", gamma=0.5)
    want, want_g = focal_advantages(R, 0.5)
    assert torch.equal(A, want) and torch.equal(g, want_g)


@pytest.mark.parametrize("weighting, beta", [(w, 0.0) for w in WEIGHTINGS] + [("focal", 0.25), ("maxrl", 0.25)])
def test_the_trainers_step_uses_the_weightings_advantages(group, weighting, beta):  # noqa: F811
    """train.rl_step with --weighting W (and --unlikely_beta): the advantages it trains on are the function's
    of the step's rewards (and of the engine's mean log-probs), and the update runs."""
    flags = {"passk": dict(passk_k=2), "wreinforce": dict(wreinforce_lambda=0.1)}.get(weighting, {})
    cfg = small_cfg(weighting=weighting, unlikely_beta=beta, gamma=0.5 if weighting == "focal" else 0.0,
                    prompts_per_step=4, mini_batch_prompts=4, **flags)
    model, _, _, opt = train.build_models(cfg, None, 0, torch.device("cpu"), load=tiny_loader(2))
    task = SimpleNamespace(prompt=lambda i: ([4, 5, 6, 4 + i % 3], None), max_new_tokens=8, stop_token_ids=[1],
                           score=lambda answers, comps: ([float(len(c) % 2) for c in comps], {}))
    r = train.rl_step(cfg, 0, task, model, None, FakeEngine(), opt, pad=0, device=torch.device("cpu"),
                      rank=0, world=1)
    lbar = torch.tensor([sum(e) / len(e) for e in r.rollouts.engine_logp]).view_as(r.R)
    shaped = unlikely_rewards(r.R, lbar, beta) if beta else r.R
    want, _ = weighted_advantages(shaped, weighting, cfg.gamma, cfg.passk_k, cfg.wreinforce_lambda)
    assert (r.R.sum(1) % 4 != 0).any(), r.R                      # some group has signal: not a vacuous check
    assert torch.allclose(r.A, want), (r.A, want)


def test_the_weight_table_is_each_methods_closed_form(tmp_path):
    """bench/weights.py's w(mu_hat) = A(correct) / GRPO's at c of N = 8: F-GRPO's is (1 - mu_hat)^gamma, MaxRL's
    sqrt((1 - mu_hat) / mu_hat) times sqrt(N / (N - 1)) (Eq. 3 divides by the unbiased std), W-REINFORCE's
    lam / GRPO's, pass@4's 0 once k > N - c; and the script writes its figure."""
    import importlib.util
    from conftest import ROOT
    spec = importlib.util.spec_from_file_location("weights", ROOT / "bench" / "weights.py")
    weights = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(weights)
    cfg = weights.Config(figure=str(tmp_path / "w.png"))
    rows, N = weights.table(cfg), 8
    for c in range(1, N):
        mu, grpo = c / N, rows["GRPO"][c - 1][0]
        w = {name: vals[c - 1][0] / grpo for name, vals in rows.items()}
        assert w["F-GRPO γ=0.5"] == pytest.approx((1 - mu) ** 0.5, rel=1e-9)
        assert w["F-GRPO γ=1"] == pytest.approx(1 - mu, rel=1e-9)
        assert w["MaxRL"] == pytest.approx(math.sqrt((1 - mu) / mu) * math.sqrt(N / (N - 1)), rel=1e-5)
        assert w["W-REINFORCE λ=0.1"] == pytest.approx(0.1 / grpo)
        assert (w["pass@4"] == 0) == (4 > N - c)
    weights.main(cfg)
    assert (tmp_path / "w.png").stat().st_size > 10_000


def test_a_weighting_defined_on_correctness_refuses_partial_rewards(tmp_path):
    """The template task scores partial rewards: pass@k training and W-REINFORCE are refused for it before any
    work, in one line; focal and MaxRL take them."""
    for weighting in ("passk", "wreinforce"):
        with pytest.raises(ValueError, match=rf"^--weighting {weighting}: needs rewards of 0 or 1"):
            train.Config(task="reverse", model="tiny", weighting=weighting, out_dir=str(tmp_path / "r"))
    for weighting in ("focal", "maxrl"):
        train.Config(task="reverse", model="tiny", weighting=weighting, out_dir=str(tmp_path / "r"))


# -----------------------------------------------------------------------------
# The engine-trainer correction: --tis_cap C, --tis_level token | sequence

def test_tis_weights_by_hand():
    """Token level: w_t = min(pi_old / pi_engine, C); sequence level: min(prod_t pi_old / pi_engine, C) on every
    token of the row; 0 off the mask, and `capped` marks the tokens whose ratio exceeded C."""
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]], dtype=F64))
    eng = torch.log(torch.tensor([[0.25, 0.4, 0.9], [0.1, 0.3, 0.6]], dtype=F64))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w, capped = tis_weights(old, eng, mask, cap=2.5)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0], [2.5, 1.0, 0.0]], dtype=F64))
    assert capped.tolist() == [[False, False, False], [True, False, False]]
    w, capped = tis_weights(old, eng, mask, cap=2.5, level="sequence")
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 1.0], [2.5, 2.5, 0.0]], dtype=F64))  # 2*0.5*1; min(3, 2.5)
    assert capped.tolist() == [[False, False, False], [True, True, False]]
    w, _ = tis_weights(old, old, mask, cap=1.0)                        # the engine agrees: exactly 1
    assert torch.equal(w, mask.to(F64))


@pytest.mark.parametrize("level, on_policy", [("token", True), ("token", False), ("sequence", False)])
def test_tis_in_the_update_is_the_advantage_times_w(group, level, on_policy):  # noqa: F811
    """update_minibatch with engine log-probs pi_old - delta_i (delta_i > 0 per sequence): its gradient is the
    plain update's with A_i x min(e^delta_i, C) (token) or x min(e^(delta_i T_i), C) (sequence); tis/mean
    and tis/capped are those weights' token means."""
    model = policy.shard(tiny("qwen2"), torch.device("cpu"))
    prompts, completions = mixed_lengths()
    A = torch.randn(len(completions), generator=torch.Generator().manual_seed(1), dtype=F64)
    cfg = small_cfg(loss="grpo", tis_cap=1.5, tis_level=level)
    kw = dict(cfg=cfg, pad_id=0, device="cpu", world=1)
    model.zero_grad(set_to_none=True)
    _, old = train.update_minibatch(model, None, prompts, completions, A, None, **kw)
    delta = torch.linspace(0.01, 0.8, len(completions), dtype=F64)      # some weights over the cap, some not
    T = torch.tensor([len(c) for c in completions], dtype=F64)
    w = (delta.exp() if level == "token" else (delta * T).exp()).clamp(max=1.5)
    assert (w == 1.5).any() and (w < 1.5).any()

    def grads(A, engine_logp):
        model.zero_grad(set_to_none=True)
        stats, _ = train.update_minibatch(model, None, prompts, completions, A, None if on_policy else old,
                                          engine_logp=engine_logp, **kw)
        return stats, [p.grad.full_tensor().clone() for p in model.parameters()]
    stats, got = grads(A, [o - d for o, d in zip(old, delta)])
    _, want = grads(A * w, None)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(got, want))
    assert stats["tis/mean"] == pytest.approx(float((w * T).sum() / T.sum()))
    assert stats["tis/capped"] == pytest.approx(float(((w == 1.5) * T).sum() / T.sum()))


def test_tis_on_the_torch_engine_is_exactly_one(group):  # noqa: F811
    """With the torch engine the sampling log-probs are pi_old's up to float rounding: --tis_cap 2 at token and
    sequence level weights every token 1 (to 1e-5), caps none, and the step trains as without it."""
    task = SimpleNamespace(prompt=lambda i: ([4, 5, 6, 4 + i % 3], None), max_new_tokens=8, stop_token_ids=[1],
                           score=lambda answers, comps: ([float(c[0] % 2) for c in comps], {}))
    runs = {}
    for tis in ({}, dict(tis_cap=2.0), dict(tis_cap=2.0, tis_level="sequence")):
        cfg = small_cfg(prompts_per_step=4, mini_batch_prompts=2, **tis)          # mini-batch 1 is off-policy
        model, _, engine, opt = train.build_models(cfg, None, 0, torch.device("cpu"), load=tiny_loader(2))
        runs[str(tis)] = train.rl_step(cfg, 0, task, model, None, engine, opt, pad=0, device=torch.device("cpu"),
                                       rank=0, world=1)
    plain, *tis_runs = runs.values()
    assert (plain.R.sum(1) % 4 != 0).any()                                       # something trains
    for r in tis_runs:
        assert r.update_stats["tis/mean"] == pytest.approx(1.0, abs=1e-5) and r.update_stats["tis/capped"] == 0
        assert r.update_stats["loss/pg"] == pytest.approx(plain.update_stats["loss/pg"], abs=1e-6)
        assert r.grad_norms == pytest.approx(plain.grad_norms, rel=1e-5)
