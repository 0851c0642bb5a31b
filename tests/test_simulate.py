"""Tests of simulate.py: the one-step theory, the fast simulator against per-sample autograd, Lemma 3.1.

    .venv/bin/python -m pytest -q tests/test_simulate.py          # ~20 s on 2 cores
"""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fgrpo_utils import outputs
import advantage
import simulate as S
from fgrpo_utils.cli import parse_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from simulate_step import naive_step  # noqa: E402   the N-sample autograd reference


def small_cfg(**kw):
    """50 actions, 10 correct: big enough for mixed groups and duplicates, small enough for autograd."""
    base = dict(num_actions=50, num_correct=10, anchor_logit=2.0, correct_logit=1.0, lr=0.05,
                steps=5, group_sizes=(4,), gammas=(0.0,), seeds=1, workers=1)
    return S.Config(**{**base, **kw})


def random_policy(K=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(K, generator=g, dtype=torch.float64)


# -----------------------------------------------------------------------------
# One-step theory (Sec. 2.3, Eq. 5; Prop. 3.2, Eq. 10)

# sampled: counts over 8 actions (0-3 correct). Action 3 is correct but unsampled; 7 is wrong, unsampled.
CORRECT = np.array([1, 1, 1, 1, 0, 0, 0, 0], bool)
COUNTS = np.array([2, 1, 0, 0, 1, 3, 1, 0])
N = int(COUNTS.sum())


def test_delta_logits_is_eta_times_gradient_of_distinct_surrogate():
    """Eq. 5 equals eta * grad_z of (1/N) sum_{A u B} R_j p_j, exactly (float64)."""
    z = random_policy().requires_grad_()
    p = torch.softmax(z, 0)
    s = torch.from_numpy(COUNTS > 0)
    R = torch.where(torch.from_numpy(CORRECT), 1.0, -1.0).double()
    ((R * p)[s].sum() / N).backward()
    eta = 0.3
    dz = advantage.delta_logits(p.detach().numpy(), CORRECT, COUNTS, 1.0, -1.0, eta, N)
    np.testing.assert_allclose(dz, eta * z.grad.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("r_correct, r_wrong", [(1.0, -1.0), (0.25, -1.75), (1.0, 0.0)])
def test_delta_Q_matches_exact_softmax_to_first_order(r_correct, r_wrong):
    """Hu et al. Eq. 17 and Eq. 10 against the real softmax after the Eq. 5 step: the error is O(eta^2).

    (0.25, -1.75) is the simulation's centred advantage R - rbar for rbar = 0.75 (S_R > 0 here).
    A wrong term would leave an O(eta) error, which the ratio check below catches."""
    z = random_policy().numpy()
    p = np.exp(z) / np.exp(z).sum()
    unsampled_correct = CORRECT & (COUNTS == 0)

    def exact(eta):
        dz = advantage.delta_logits(p, CORRECT, COUNTS, r_correct, r_wrong, eta, N)
        q = np.exp(z + dz) / np.exp(z + dz).sum()
        return q[CORRECT].sum() - p[CORRECT].sum(), q[unsampled_correct].sum() - p[unsampled_correct].sum()

    errors = []
    for eta in (1e-2, 1e-3):
        dQ, dQu = exact(eta)
        first = (advantage.delta_Q_pos(p, CORRECT, COUNTS, r_correct, r_wrong, eta, N),
                 advantage.delta_Q_u_pos(p, CORRECT, COUNTS, r_correct, r_wrong, eta, N))
        assert abs(first[0]) > 0 and abs(first[1]) > 0
        errors.append(np.abs(np.array([dQ, dQu]) - first))
        assert np.all(errors[-1] <= 10 * eta ** 2 / N), (eta, errors[-1])
    ratio = errors[0] / errors[1]                       # 100 for an O(eta^2) error, 10 for O(eta)
    assert np.all((ratio > 50) & (ratio < 200)), ratio


def test_unsampled_correct_mass_drops_when_baseline_positive():
    """Prop. 3.2's reading: a mostly-correct batch (S_R > 0) drains the correct actions it did not draw."""
    z = random_policy().numpy()
    p = np.exp(z) / np.exp(z).sum()
    counts = np.array([3, 2, 1, 0, 1, 0, 0, 0])         # 6 of 7 draws correct
    assert advantage.batch_sums(p, CORRECT, counts, 1.0, -1.0)["S_R"] > 0
    assert advantage.delta_Q_u_pos(p, CORRECT, counts, 1.0, -1.0, 0.01, 7) < 0


# -----------------------------------------------------------------------------
# The sampler and the closed-form gradient against per-sample autograd

@pytest.mark.parametrize("n", [30, 200])              # 30 <= 2K: inverse CDF; 200 > 2K: conditional binomials
def test_sample_counts_is_multinomial(n):
    K, draws = 50, 10_000
    p = torch.softmax(random_policy(K, seed=1).float() * 2, 0)
    p[7] = 0.0                                          # a zero-probability action is never drawn
    rng = np.random.default_rng(0)
    total = np.zeros(K)
    for _ in range(draws):
        idx, c = S.sample_counts(p, n, rng)
        assert c.sum().item() == n and bool((c > 0).all()) and bool((idx[1:] > idx[:-1]).all())
        total[idx.numpy()] += c.numpy()
    q = p.double().numpy() / p.double().sum().item()
    sigma = np.sqrt(n * q * (1 - q) / draws) + 1e-12
    assert total[7] == 0
    assert np.all(np.abs(total / draws - n * q) < 4.5 * sigma), np.max(np.abs(total / draws - n * q) / sigma)


def fast_and_naive(cfg, N, gamma, steps, seed=0):
    """Run both paths on the same samples (drawn by the naive one); yield both states after each step.
    The naive path uses PyTorch's reference (non-fused) optimizer, the fast one the fused kernel."""
    z0, R = S.initial_logits(cfg), S.reward_vector(cfg)
    z_fast = z0.clone()[None].requires_grad_()                              # (1, K)
    z_fast.grad = torch.zeros_like(z_fast)
    opt_fast = S.make_optimizer(z_fast, cfg)
    z_naive = z0.clone().requires_grad_()                                   # (K,)
    opt_naive = S.make_optimizer(z_naive, cfg, fused=False)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        a = torch.multinomial(torch.softmax(z_naive.detach(), 0), N, replacement=True, generator=gen)
        naive_step(z_naive, opt_naive, N, gamma, R, cfg.surrogate, a=a)
        idx, c = a.unique(return_counts=True)
        p = torch.softmax(z_fast.detach()[0], 0)
        z_fast.grad[0] = S.surrogate_grad(p, idx, c.float(), N, gamma, R, cfg.surrogate, cfg.r_correct, cfg.r_wrong)
        grads = z_fast.grad[0].clone(), z_naive.grad.clone()
        opt_fast.step()
        yield a, grads, z_fast.detach()[0], z_naive.detach()


@pytest.mark.parametrize("surrogate", ["distinct", "counts"])
@pytest.mark.parametrize("gamma", [0.0, 1.0])
@pytest.mark.parametrize("N", [1, 5, 64, 1000])
def test_fast_step_equals_naive_autograd(surrogate, gamma, N):
    """Same samples -> same gradient (before AdamW, which would hide a scale error) and same logits
    after 6 steps, within 1e-6."""
    check_fast_equals_naive(small_cfg(surrogate=surrogate), N, gamma)


# Every optimizer, at eps where it normalises nothing (1e-2 >> |grad|), the default, and far below
# every gradient; weight decay on and off; rewards other than +-1. The sgd lr is large because its
# steps are lr * grad, ~lr * 1e-3 here.
@pytest.mark.parametrize("opt", [dict(optimizer="adamw", adam_eps=1e-2), dict(optimizer="adamw", adam_eps=1e-8),
                                 dict(optimizer="adamw", adam_eps=1e-30, weight_decay=0.0),
                                 dict(optimizer="signsgd", adam_eps=1e-30), dict(optimizer="signsgd", adam_eps=1e-8),
                                 dict(optimizer="sgd", lr=20.0, weight_decay=0.01), dict(optimizer="sgd", lr=20.0, weight_decay=0.0)])
@pytest.mark.parametrize("rewards", [(1.0, -1.0), (1.0, 0.0)])
def test_fast_step_equals_naive_for_every_optimizer(opt, rewards):
    cfg = small_cfg(r_correct=rewards[0], r_wrong=rewards[1], **opt)
    for N, gamma in ((5, 1.0), (64, 0.0)):
        check_fast_equals_naive(cfg, N, gamma)


def check_fast_equals_naive(cfg, N, gamma):
    mixed = 0
    for a, (g_fast, g_naive), zf, zn in fast_and_naive(cfg, N, gamma, steps=6):
        mixed += bool(0 < (a < cfg.num_correct).sum() < N)
        np.testing.assert_allclose(g_fast, g_naive, rtol=1e-5, atol=1e-9 * g_naive.abs().max().item())
        np.testing.assert_allclose(zf, zn, atol=1e-6, rtol=0)
    assert N == 1 or mixed > 0, "no mixed group: every gradient was zero and the test proved nothing"
    assert N == 1 or (zf - S.initial_logits(cfg)).abs().max() > 1e-3, "the logits did not move"


@pytest.mark.parametrize("rival", [("maxrl", 4, 0.1), ("passk", 4, 0.1), ("passk", 1, 0.1), ("wreinforce", 4, 0.3)])
@pytest.mark.parametrize("surrogate", ["distinct", "counts"])
def test_a_rivals_gradient_is_autograd_of_its_advantages(rival, surrogate):
    """--weighting W: surrogate_grad is the gradient of -1/N sum A_a m_a p_a, A_a the rival's advantage of a's draws
    (advantage.weighted_advantages of the draws' correctness), on samples with duplicates and mixed groups."""
    cfg = small_cfg(surrogate=surrogate)
    R = S.reward_vector(cfg).double()
    gen = torch.Generator().manual_seed(3)
    seen_mixed = 0
    for N in (4, 9, 64):
        z = S.initial_logits(cfg).double().requires_grad_()
        p = torch.softmax(z, 0)
        a = torch.multinomial(p.detach(), N, replacement=True, generator=gen)                 # (N,)
        idx, c = a.unique(return_counts=True)
        correct = (a < cfg.num_correct).double()[None]                                        # (1, N)
        seen_mixed += bool(0 < correct.sum() < N)
        A = advantage.weighted_advantages(correct, rival[0], k=rival[1], lam=rival[2])[0][0]   # (N,) per draw
        per_action = {int(x): float(A[a == x][0]) for x in idx}
        assert all(torch.all(A[a == x] == v) for x, v in per_action.items())                 # one A per action
        if surrogate == "distinct":
            L = sum(per_action[int(x)] * p[x] for x in idx) / N
        else:
            L = (A * p[a]).sum() / N
        (-L).backward()
        got = S.surrogate_grad(p.detach(), idx, c.double(), N, 0.0, R, surrogate, 1.0, -1.0, rival)
        np.testing.assert_allclose(got, z.grad, rtol=1e-9, atol=1e-15)
    assert seen_mixed


def test_a_rivals_sweep_is_labelled_and_its_flags_checked(capsys):
    """A rival's run takes --gammas 0 only, pass@k's k at most the smallest N; its table names the method."""
    for argv, flag in ((["--weighting", "maxrl"], "--gammas"),
                       (["--weighting", "passk", "--gammas", "0", "--group_sizes", "2", "8"], "--passk_k 4")):
        with pytest.raises(SystemExit) as e:
            parse_config(S.Config, argv=argv)
        assert e.value.code == 2 and flag in capsys.readouterr().err
    cfg = small_cfg(weighting="passk", passk_k=2)
    runs, _, steps = S.simulate(cfg)
    assert "Q_pos passk | M_ret passk" in S.table({"config": {"weighting": "passk"}, "runs": runs})


def test_optimizers_are_what_their_names_say():
    """One step by hand: signsgd is lr * sign(grad) plus decoupled decay; sgd is lr * grad plus decay;
    adamw's first step with eps >> |grad| is ~lr * grad / eps (the un-normalised regime)."""
    g = torch.tensor([[3e-4, -2e-9, 0.0, 5e-12]])
    z0 = torch.tensor([[1.0, -1.0, 2.0, 0.5]])
    lr, wd = 0.1, 0.01

    def step(**kw):
        z = z0.clone().requires_grad_()
        z.grad = g.clone()
        S.make_optimizer(z, small_cfg(lr=lr, weight_decay=wd, **kw)).step()
        return z.detach()

    torch.testing.assert_close(step(optimizer="signsgd", adam_eps=1e-30), z0 * (1 - lr * wd) - lr * g.sign())
    torch.testing.assert_close(step(optimizer="sgd"), z0 * (1 - lr * wd) - lr * g)
    torch.testing.assert_close(step(optimizer="adamw", adam_eps=1e-8),
                               z0 * (1 - lr * wd) - lr * g / (g.abs() + 1e-8), rtol=1e-5, atol=1e-7)


def test_distinct_and_counts_readings_differ():
    """Regression guard: the --surrogate flag must change the update whenever an action is drawn twice."""
    grads = {}
    for surrogate in ("distinct", "counts"):
        cfg = small_cfg(surrogate=surrogate)
        a, (g, _), _, _ = next(fast_and_naive(cfg, 64, 0.0, steps=1))
        grads[surrogate] = g
    assert a.unique().numel() < 64
    assert (grads["distinct"] - grads["counts"]).abs().max() > 1e-3 * grads["counts"].abs().max()


def test_fast_simulator_matches_naive_in_distribution():
    """run_rows (numpy sampler, closed form, batched AdamW) against the naive loop (torch.multinomial,
    autograd), over 64 seeds each: mean Q_pos and M_ret at the end agree within 4 standard errors.
    Here the two surrogate readings differ by ~30 standard errors, so a mix-up would show."""
    cfg = small_cfg(steps=40, lr=0.1, surrogate="distinct")
    seeds = range(64)
    _, log, _ = S.run_rows([(16, 0.0, s) for s in seeds], cfg)
    fast = np.array([log["Q_pos"][-1], log["M_ret"][-1]])                   # (2, seeds)
    R, p0_pos = S.reward_vector(cfg), torch.softmax(S.initial_logits(cfg), 0)[: cfg.num_correct]
    naive = []
    for s in seeds:
        z = S.initial_logits(cfg).requires_grad_()
        opt = S.make_optimizer(z, cfg, fused=False)
        gen = torch.Generator().manual_seed(1000 + s)
        for _ in range(cfg.steps):
            naive_step(z, opt, 16, 0.0, R, cfg.surrogate, generator=gen)
        naive.append([v.item() for v in S.metrics(torch.softmax(z.detach(), 0), p0_pos, cfg.num_correct)])
    naive = np.array(naive).T
    se = np.sqrt(fast.var(1, ddof=1) / len(seeds) + naive.var(1, ddof=1) / len(seeds))
    assert np.all(se > 0)
    assert np.all(np.abs(fast.mean(1) - naive.mean(1)) < 4 * se), (fast.mean(1), naive.mean(1), se)
    assert abs(fast[0].mean() - log["Q_pos"][0][0]) > 4 * se[0], "Q_pos did not move: nothing was tested"


# -----------------------------------------------------------------------------
# The claims of Sec. 5.1 and the one-step mechanism

Q0 = 0.630
PAPER_PICTURE = {   # (N, gamma) -> (final Q_pos, final M_ret): every claim holds, as the paper describes
    (2, 0.0): (0.80, 0.60), (2, 1.0): (0.78, 0.65), (16, 0.0): (0.90, 0.45), (16, 1.0): (0.88, 0.50),
    (256, 0.0): (0.97, 0.20), (256, 1.0): (0.95, 0.30), (8192, 0.0): (0.98, 0.18), (8192, 1.0): (0.96, 0.28),
    (131072, 0.0): (0.95, 0.99), (131072, 1.0): (0.94, 0.99)}


def planted(picture=PAPER_PICTURE, coverage=None, M_ret_min=None):
    runs = []
    for (n, gm), (q, m) in picture.items():
        for seed in (0, 1):
            runs.append(dict(N=n, gamma=gm, seed=seed, Q_pos_final=q, M_ret_final=m,
                             M_ret_min=(M_ret_min or {}).get(n, m), coverage=(coverage or {}).get(n, 0.3 if n < 131072 else 0.999)))
    return runs


def held(runs):
    return {k: ok for k, (ok, _) in S.judge_claims(runs, Q0).items()}


def test_judge_claims_on_the_papers_picture_and_on_each_violation():
    """Every claim holds on a planted paper-like result, and each planted violation flips exactly its claims."""
    assert all(held(planted()).values())
    cases = [  # (planted result, claims that must fail)
        (planted({**PAPER_PICTURE, (2, 0.0): (0.60, 0.60)}), {"C1"}),               # small N shrinks
        (planted({**PAPER_PICTURE, (131072, 0.0): (0.62, 0.99)}), {"C1", "C5"}),     # III does not move
        (planted({**PAPER_PICTURE, (256, 0.0): (0.97, 0.05), (256, 1.0): (0.95, 0.10)}), {"C2"}),   # collapses too far
        (planted({**PAPER_PICTURE, (16, 0.0): (0.90, 0.22)}), {"C2"}),                # small N keeps no more
        (planted({**PAPER_PICTURE, (8192, 1.0): (0.96, 0.19)}), {"C3"}),              # gamma = 1 barely helps
        (planted(M_ret_min={131072: 0.7}), {"C4", "C5"}),                             # dips during training
        (planted({**PAPER_PICTURE, (2, 0.0): (0.80, 0.95)}), {"C4"}),                 # not the only one
        (planted(coverage={131072: 0.9}), {"C5"}),                                    # kept, but not by coverage
    ]
    for runs, failing in cases:
        got = held(runs)
        assert {k for k, ok in got.items() if not ok} == failing, (failing, got)


def sensitivity_study():
    """bench/sim_sensitivity.py as a module."""
    import importlib.util
    from conftest import ROOT
    spec = importlib.util.spec_from_file_location("sim_sensitivity", ROOT / "bench" / "sim_sensitivity.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    return study


def test_claims_table_and_preference():
    claims = S.judge_claims(planted(), Q0)
    assert json.loads(json.dumps(claims)) == {k: list(v) for k, v in claims.items()}    # results.json takes it
    text = S.claims_table([("planted", claims)])
    assert "| planted | 5/5 |" in text and text.count("✓") == 5
    a = dict(optimizer="adamw", lr=1e-2, adam_eps=1e-8, weight_decay=0.01)
    ranked = sorted([dict(a, adam_eps=1e-14), dict(a, optimizer="signsgd"), a, dict(a, lr=1e-3)],
                    key=lambda st: sensitivity_study().preference(st, 4))
    assert ranked[0] == a and ranked[1]["adam_eps"] == 1e-14
    preference = sensitivity_study().preference
    assert preference(dict(a, adam_eps=1e-30), 5) < preference(a, 4)    # more claims beats the defaults


def test_claims_on_a_small_policy_coverage_keeps_the_mass():
    """The claims' mechanism at 1/128 of the paper's size (1,000 actions, 100 correct), default optimizer:
    a group that samples every correct action every step (N = 8,192) moves Q_pos up and keeps the
    mass (C4, C5 at this size), while a group that misses most correct actions (N = 16) moves Q_pos as
    much and loses most of the mass (the collapse of C2). Q_pos grows at both (C1)."""
    cfg = small_cfg(num_actions=1000, num_correct=100, anchor_logit=5.0, correct_logit=3.0, lr=1e-2,
                    steps=1000, log_every=50)
    rows, log, _ = S.run_rows([(16, 0.0, 0), (8192, 0.0, 0)], cfg)
    runs = {r["N"]: r for r in S.collect(cfg, [(rows, log, {})])}
    q0 = runs[16]["Q_pos"][0]
    for n in (16, 8192):
        assert runs[n]["Q_pos_final"] > q0 + 0.2, n
    assert runs[8192]["coverage"] > 0.99 and runs[8192]["M_ret_min"] > 0.95
    assert runs[16]["coverage"] < 0.9 and runs[16]["M_ret_final"] < 0.4


def test_softmax_change_is_exact():
    z = random_policy(K=1000, seed=3)
    dz = torch.randn(1000, dtype=torch.float64) * 1e-3
    exact = (torch.softmax(z + dz, 0) - torch.softmax(z, 0)).numpy()
    got = S.softmax_change(torch.softmax(z, 0).numpy(), dz.numpy())
    np.testing.assert_allclose(got, exact, rtol=1e-6, atol=1e-15)


def test_one_step_check_theory_matches_simulation_and_shows_coverage():
    """Eq. 17 / Eq. 10 against the exact step (first order: agree to ~eta), and the coverage reading
    of regime III: at a group size that samples every correct action, no unsampled correct mass is left
    to drain, while at a middle N most of it is unsampled and drains."""
    cfg = S.Config(num_actions=400, num_correct=40, lr=1e-2)
    rows = {r["N"]: r for r in S.one_step_check(cfg, (4, 16, 20_000), draws=100)}
    for r in rows.values():
        assert r["theory_dQ"] > 0                                              # Hu et al.: Q_pos grows in expectation
        np.testing.assert_allclose(r["sim_dQ"], r["theory_dQ"], rtol=1e-2)
        np.testing.assert_allclose(r["sim_dQu"], r["theory_dQu"], rtol=1e-2, atol=1e-3 * abs(r["theory_dQ"]))
    assert rows[16]["Q_u_pos"] > 0.3 and rows[16]["theory_dQu"] < 0
    assert rows[20_000]["Q_u_pos"] < 1e-6 and abs(rows[20_000]["theory_dQu"]) < 1e-4 * rows[20_000]["theory_dQ"]


# -----------------------------------------------------------------------------
# Lemma 3.1 (Sec. 3.1, App. D) and its check against the simulation (Fig. 5)

@pytest.mark.parametrize("mu, tau, n", [(0.8, 0.008, 15), (0.5, 0.025, 6), (0.2, 0.04, 9), (0.64, 0.01, 64),
                                        (0.3, 0.1, 1), (0.9, 0.5, 3)])
def test_tail_miss_probability_matches_monte_carlo(mu, tau, n):
    """Categorical draws into E / other correct / wrong; B = active (0 < X < N) and no draw in E."""
    trials = 200_000
    c = np.random.default_rng(0).multinomial(n, [tau, mu - tau, 1 - mu], size=trials)    # (trials, 3)
    X = c[:, 0] + c[:, 1]
    hit = np.mean((X > 0) & (X < n) & (c[:, 0] == 0))
    P = float(S.tail_miss_probability(mu, tau, n))
    assert abs(hit - P) <= 3 * np.sqrt(P * (1 - P) / trials) + 1e-12, (hit, P)


@pytest.mark.parametrize("mu, rho, n_star, peak", [(0.8, 0.01, 15, 0.856), (0.8, 0.2, 4, 0.328),
                                                   (0.5, 0.05, 6, 0.832), (0.3, 0.1, 8, 0.726),
                                                   (0.2, 0.01, 21, 0.950), (0.2, 0.2, 9, 0.558)])
def test_tail_miss_argmax_table(mu, rho, n_star, peak):
    """Integer argmax N* and peak of Lemma 3.1, the peaks Fig. 3 marks (the paper gives no numbers: our own
    arithmetic from the Lemma)."""
    got_n, got_peak = S.tail_miss_argmax(mu, rho * mu, n_max=4096)
    assert got_n == n_star and round(got_peak, 3) == peak


def test_fig5_reference_values():
    """Fig. 5: Lemma 3.1 at mu_pos = 0.64, tau = 6.3e-5 (values from our own arithmetic, three significant digits)."""
    ref = {1: 0.0, 2: 0.461, 4: 0.815, 8: 0.971, 16: 0.998, 512: 0.968, 4096: 0.773, 8192: 0.597,
           16384: 0.356, 32768: 0.127, 65536: 0.016, 131072: 2.6e-4}
    got = S.tail_miss_probability(0.64, 6.3e-5, np.array(list(ref)))
    np.testing.assert_allclose(got, list(ref.values()), rtol=0.03, atol=5e-4)
    assert got[-1] < 1e-3


def test_initial_state_matches_paper():
    """The initial logits of Sec. 5.1 / App. J (from Hu et al.) give, by our arithmetic, Q_pos = 0.6301,
    anchor p = 4.65e-4, other correct 6.30e-5, wrong 3.13e-6."""
    p = torch.softmax(S.initial_logits(S.Config()).double(), 0)
    assert round(p[:10_000].sum().item(), 4) == 0.6301
    np.testing.assert_allclose([p[0].item(), p[1].item(), p[-1].item()], [4.65e-4, 6.30e-5, 3.13e-6], rtol=2e-3)


# -----------------------------------------------------------------------------
# The entry point

@pytest.mark.parametrize("argv, flag", [
    (["--group_sizes", "0"], "--group_sizes"), (["--gammas", "0", "-1"], "--gammas"),
    (["--num_actions", "100", "--num_correct", "100"], "--num_correct"), (["--num_correct", "0"], "--num_correct"),
    (["--steps", "0"], "--steps"), (["--seeds", "0"], "--seeds"), (["--lr", "0"], "--lr"),
    (["--weight_decay", "-1"], "--weight_decay"), (["--surrogate", "dups"], "--surrogate"),
    (["--log_every", "0"], "--log_every"), (["--r_correct", "-1"], "--r_correct"),
    (["--group_sizes", "2", "2"], "--group_sizes")])
def test_bad_flags_are_refused(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(S.Config, argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err


def test_main_reduced_run_and_plot_only(tmp_path):
    """The docstring's reduced run, in process; the worker split must not change any number."""
    argv = ["--num_actions", "1000", "--num_correct", "100", "--steps", "5", "--group_sizes", "2", "8",
            "--seeds", "2", "--log_every", "2", "--out_dir", str(tmp_path)]
    S.main(parse_config(S.Config, argv + ["--workers", "1"]))
    res = json.loads((tmp_path / "results.json").read_text())
    assert len(res["runs"]) == 2 * 2 * 2 and res["steps"] == [0, 2, 4, 5]
    run = res["runs"][0]
    assert len(run["Q_pos"]) == 4 and run["Q_pos"][-1] == run["Q_pos_final"] and 0 < run["M_ret_final"] <= 1
    assert res["config"]["surrogate"] == "distinct"
    for name in ("fig2.png", "fig3.png", "fig5.png"):
        (tmp_path / name).unlink()
    S.main(parse_config(S.Config, argv + ["--plot_only", "true"]))
    assert all((tmp_path / n).stat().st_size > 10_000 for n in ("fig2.png", "fig3.png", "fig5.png"))
    rows, log, _ = S.run_rows([(8, 1.0, 1), (2, 0.0, 0)], parse_config(S.Config, argv))   # other grouping
    mine = {(r["N"], r["gamma"], r["seed"]): r["Q_pos_final"] for r in res["runs"]}
    for i, key in enumerate(rows):
        assert abs(log["Q_pos"][-1][i] - mine[key]) < 1e-6


def test_sensitivity_keeps_each_settings_runs_apart():
    """bench/sim_sensitivity.py runs every setting in one pool; each setting must get back its own rows,
    equal to a run of that setting alone."""
    cfg = small_cfg(steps=20, workers=1)
    settings = [dict(optimizer="adamw", lr=0.05, adam_eps=1e-8, weight_decay=0.0),
                dict(optimizer="signsgd", lr=0.05, adam_eps=1e-30, weight_decay=0.0)]
    results = sensitivity_study().sensitivity(cfg, settings, group_sizes=(2, 16), seeds=2)
    assert [r["setting"] for r in results] == settings
    for r in results:
        assert {(x["N"], x["seed"]) for x in r["runs"]} == {(n, s) for n in (2, 16) for s in (0, 1)}
        alone = S.dataclasses.replace(cfg, group_sizes=(2, 16), seeds=2, **r["setting"])
        ref = {(x["N"], x["seed"]): x["Q_pos_final"] for x in S.simulate(alone)[0]}
        assert all(abs(x["Q_pos_final"] - ref[x["N"], x["seed"]]) < 1e-6 for x in r["runs"])
    assert results[0]["runs"][-1]["Q_pos_final"] != results[1]["runs"][-1]["Q_pos_final"]


def test_plot_only_on_a_broken_results_file_and_huge_group_sizes_are_refused(tmp_path, capsys):
    (tmp_path / "results.json").write_text('{"runs": []}')
    outputs.mark_out_dir(tmp_path, ["results.json"])                       # ours, but damaged
    (tmp_path / ".fig2.png.tmp.123").write_text("left by a killed run")
    with pytest.raises(SystemExit) as e:
        S.main(parse_config(S.Config, ["--out_dir", str(tmp_path), "--plot_only", "true"]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "not a whole results file" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / ".fig2.png.tmp.123").exists()                  # our temp name: tidied
    with pytest.raises(SystemExit) as e:
        parse_config(S.Config, ["--out_dir", str(tmp_path / "x"), "--group_sizes", str(2 ** 63)])
    assert e.value.code == 2 and "--group_sizes" in capsys.readouterr().err


def test_a_users_file_with_an_output_name_is_never_written_over(tmp_path, capsys):
    """--out_dir accepted any file named like an output (results.json, fig2.png) as ours and wrote
    over it; only what the marker lists is ours now."""
    (tmp_path / "results.json").write_text('{"mine": true}')
    with pytest.raises(SystemExit) as e:
        parse_config(S.Config, ["--out_dir", str(tmp_path), "--plot_only", "true"])
    assert e.value.code == 2 and "results.json" in capsys.readouterr().err
    assert (tmp_path / "results.json").read_text() == '{"mine": true}'


def test_sim_rivals_pairs_arm_files_by_their_content(tmp_path, monkeypatch, capsys):
    """bench/sim_rivals.py: every arm simulated (small), the table rebuilt from the files alone, arms named by
    their config (a renamed file keeps its method), and files of other settings or a method twice refused."""
    import dataclasses
    import importlib.util
    from conftest import ROOT
    spec = importlib.util.spec_from_file_location("sim_rivals", ROOT / "bench" / "sim_rivals.py")
    sr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sr)
    real = sr.arm_config
    monkeypatch.setattr(sr, "arm_config", lambda w, workers: dataclasses.replace(
        real(w, 1), num_actions=60, num_correct=8, steps=5, seeds=2, group_sizes=(4, 8)))
    out, fig = tmp_path / "o", tmp_path / "f.png"
    sr.main(sr.Config(run=True, out=str(out), figure=str(fig)))
    first = (out / "table.md").read_text()
    assert "| N | GRPO | F-GRPO γ=0.5 | F-GRPO γ=1 | MaxRL | pass@4 | W-REINFORCE λ=0.1 |" in first
    (out / "maxrl.json").rename(out / "focal_copy.json")                 # the name says nothing
    sr.main(sr.Config(out=str(out), figure=str(fig)))
    assert (out / "table.md").read_text() == first and fig.stat().st_size > 10_000
    data = json.loads((out / "passk.json").read_text())
    (out / "zz.json").write_text(json.dumps({**data, "config": {**data["config"], "steps": 6}}))
    with pytest.raises(SystemExit):
        sr.main(sr.Config(out=str(out), figure=str(fig)))
    err = capsys.readouterr().err
    assert "differs from" in err and "in steps;" in err, err
    (out / "zz.json").write_text(json.dumps(data))                       # pass@4 twice
    with pytest.raises(SystemExit):
        sr.main(sr.Config(out=str(out), figure=str(fig)))
    assert "pass@4 is also in another file" in capsys.readouterr().err
