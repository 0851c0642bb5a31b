"""
The paper's math as pure functions: no I/O, no state, no imports of ours.

    python bench/weights.py      # the N = 8 advantages of a correct and a wrong sample under every weighting

What lives here, by equation of arXiv 2602.06717 (v2):
    group_advantages       Eq. 3          A_i = (R_i - mean R) / (std R + eps)
    success_rate           Eq. 11         mu_hat = (mean R - R_w) / (R_c - R_w) = X / N
    focal_advantages       Eqs. 11-13     g = (1 - mu_hat)^gamma, A_i^F = g * A_i: what train.py uses
    focal_weight           Eq. 12         g alone, for a tensor of mu_hat (simulate.py)
    weighted_advantages                   focal_advantages, or a rival in its slot (train.py --weighting):
                                          maxrl_, passk_, wreinforce_advantages, unlikely_rewards
    policy_loss            Eqs. 14-16     GRPO / DAPO clip, CISPO sg(clip(r)) * A * log pi, token-mean
    aggregate                             token-mean, or the original GRPO's / Dr. GRPO's aggregation
    kl_k3, entropy_from_logits            GRPO-KL and GRPO-H controls (Sec. 5.6)
    tis_weights                           the engine-trainer correction (truncated IS; not in the paper)
    ds_grpo_advantages                    DS-GRPO control: a best guess, the paper gives no formula
    low_lr_multiplier                     m_gamma of the low-LR control (Appendix N)
    tail_miss_probability  Lemma 3.1      Pr(active group that misses a rare correct subset E)
    delta_logits, delta_Q_pos, delta_Q_u_pos   Eq. 5, Hu et al. Eq. 17, Eq. 10 (Prop. 3.2): one step's change
    pass_at_k              Eq. 27         unbiased pass@k from c correct of n samples (and its tables)
    subsample_test         App. Q         the paired m-out-of-n test between two evaluations

Choices the paper leaves open (verl's defaults), the rivals' sources: DESIGN.md, "The math".
"""
import math

import numpy as np
import torch

# Clip widths (eps_low, eps_high) per loss, Appendix B (Eqs. 14-16) / L.2; CISPO's: a weight in [0, 6] (DESIGN.md)
CLIP_EPS = {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "cispo": (1.0, 5.0)}

# -----------------------------------------------------------------------------
# Group advantages and the focal weight (Eqs. 3, 11-13)
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    """GRPO group-relative advantage, Eq. 3: A_i = (R_i - mean_j R_j) / (std_j R_j + eps), std unbiased (N - 1).
    normalize_std=False gives the mean-only form A_i = R_i - mean R (the simulation's, Sec. 5.1, App. J).
    A group whose rewards are all equal (X = 0 or X = N) gets exactly 0: it carries no signal.
    rewards: (G, N), one row per prompt group  ->  (G, N)"""
    R = torch.as_tensor(rewards)
    R = R if R.is_floating_point() else R.float()
    if R.ndim != 2:
        raise ValueError(f"rewards must be (num_groups, N), got shape {tuple(R.shape)}")
    adv = R - R.mean(dim=1, keepdim=True)                                  # (G, N)
    if normalize_std and R.shape[1] > 1:
        adv = adv / (R.std(dim=1, keepdim=True) + eps)                     # unbiased std
    # Exact zeros for uniform groups (the mean of equal floats need not round back): A == 0 there is promised
    uniform = (R == R[:, :1]).all(dim=1, keepdim=True)                     # (G, 1)
    return adv.masked_fill(uniform, 0.0)

def success_rate(rewards, r_correct=1.0, r_wrong=0.0):
    """Empirical success rate of each group, Eq. 11: mu_hat = (mean R - R_w) / (R_c - R_w) = X / N.
    Every reward must be finite and within [R_w, R_c], and R_c > R_w (ValueError otherwise), so mu_hat is
    in [0, 1]. With two reward levels it is the fraction of correct rollouts, from the very rollouts whose
    advantages it scales (no smoothing, nothing carried between steps).
    rewards: (G, N)  ->  (G,)"""
    if not r_correct > r_wrong:
        raise ValueError(f"need r_correct > r_wrong, got {r_correct} and {r_wrong}")
    R = torch.as_tensor(rewards)
    R = R if R.is_floating_point() else R.float()
    # A reward outside [R_w, R_c] gives a rate outside [0, 1]: g = (1 - mu_hat)^gamma would then
    # silently exceed 1 or be clipped to 0. A NaN reward would poison its whole group. Refuse both.
    if not torch.isfinite(R).all():
        raise ValueError("rewards must be finite, got NaN or inf")
    if ((R < r_wrong) | (R > r_correct)).any():
        raise ValueError(f"rewards must lie in [r_wrong, r_correct] = [{r_wrong}, {r_correct}], "
                         f"got values in [{R.min().item()}, {R.max().item()}]")
    return (R.mean(dim=1) - r_wrong) / (r_correct - r_wrong)

def focal_advantages(rewards, gamma, r_correct=1.0, r_wrong=0.0, normalize_std=True):
    """F-GRPO advantage, Eqs. 11-13: A_i^F = g * A_i with g = (1 - mu_hat)^gamma, one g per group.
    normalize_std=False: A_i is the mean-only form (Dr. GRPO's), as in group_advantages. gamma = 0 gives
    g = 1 exactly, even at mu_hat = 1 (0^0 = 1): plain GRPO. Solved groups (mu_hat near 1), whose updates
    concentrate probability on the sampled correct answers (App. H), get g near 0.
    rewards: (G, N)  ->  (advantages (G, N), g (G,))"""
    mu_hat = success_rate(rewards, r_correct, r_wrong)                             # (G,), Eq. 11
    g = focal_weight(mu_hat, gamma)                                                # (G,), Eq. 12
    # g multiplies AFTER the z-score: scaling the rewards by g instead cancels in (R - mean) / std.
    return g[:, None] * group_advantages(rewards, normalize_std), g                # (G, N), Eq. 13

def focal_weight(mu_hat, gamma):
    """Focal weight, Eq. 12, for a tensor of success rates: g = (1 - mu_hat)^gamma, 1 - mu_hat clamped at 0;
    ValueError for gamma < 0. The one place the formula lives: focal_advantages and simulate.py call it."""
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    # mean R can round just past R_c (seven 0.1s do in float32): a negative base makes g NaN at a fractional gamma
    return (1 - mu_hat).clamp(min=0.0) ** gamma

def ds_grpo_advantages(rewards, mean_logp_old, c_pos=0.05, c_neg=0.05, r_correct=1.0, eps=1e-6):
    """DS-GRPO control (Gai et al. 2025), a BEST GUESS (DESIGN.md, "The math"). A_i = z_i - c+ [correct] lbar_i
    + c- [incorrect] lbar_i, z the group z-score with the POPULATION std, lbar_i rollout i's length-averaged
    log-prob under pi_old. Uniform groups get non-zero advantages. rewards, mean_logp_old: (G, N)  ->  (G, N)"""
    R = torch.as_tensor(rewards)
    R = R if R.is_floating_point() else R.float()
    lbar = torch.as_tensor(mean_logp_old, dtype=R.dtype)
    # The population std is c times the unbiased one, c = sqrt((N - 1) / N), so the z-score is Eq. 3's
    # with eps / c, divided by c: (R - mean) / (c std + eps) = group_advantages(R, eps / c) / c.
    c = math.sqrt((R.shape[1] - 1) / R.shape[1]) if R.shape[1] > 1 else 1.0
    z = group_advantages(R, eps=eps / c) / c
    correct = (R == r_correct).to(R.dtype)
    return z - c_pos * correct * lbar + c_neg * (1 - correct) * lbar

# The rivals, each in focal_advantages' slot (train.py --weighting): rewards (P, N) -> advantages (P, N)
def maxrl_advantages(rewards, eps=1e-6):
    """MaxRL (Tajwar et al. 2026): A = (r - rbar) / (rbar + eps), 0 where rbar = 0; rewards in [0, 1]."""
    R = torch.as_tensor(rewards)
    R = R if R.is_floating_point() else R.float()
    if R.ndim != 2 or not ((R >= 0) & (R <= 1)).all():
        raise ValueError("MaxRL needs (num_groups, N) rewards in [0, 1]")
    rbar = R.mean(dim=1, keepdim=True)                                            # (P, 1)
    return torch.where(rbar > 0, (R - rbar) / (rbar + eps), torch.zeros_like(R))

def passk_advantages(rewards, k):
    """Analytic pass@k training (Chen et al. 2025, arXiv 2508.10751), c correct of N: Rbar = 1 - C(N-c, k) / C(N, k),
    sigma = sqrt(Rbar (1 - Rbar)); correct (1 - Rbar) / sigma, wrong (1 - Rbar - C(N-c-1, k-1) / C(N-1, k-1)) / sigma;
    0 where sigma = 0 (c = 0, or k > N - c). k = 1 is GRPO with the population std."""
    R = binary(rewards)
    N = R.shape[1]
    if not 1 <= k <= N:
        raise ValueError(f"pass@k training needs 1 <= k <= N = {N}, got k = {k}")
    def pair(c):                                                 # (correct's, wrong's) A at c correct
        rbar = 1 - math.comb(N - c, k) / math.comb(N, k)
        sigma, miss = math.sqrt(rbar * (1 - rbar)), math.comb(N - c - 1, k - 1) / math.comb(N - 1, k - 1) if c < N else 0
        return ((1 - rbar) / sigma, (1 - rbar - miss) / sigma) if sigma > 0 else (0.0, 0.0)
    row = torch.tensor([pair(int(c)) for c in R.sum(dim=1).round()], dtype=R.dtype)     # (P, 2)
    return torch.where(R == 1, row[:, :1], row[:, 1:])

def wreinforce_advantages(rewards, lam=0.1):
    """W-REINFORCE (Zhu et al. 2025, arXiv 2506.01347): no baseline, A = lam if correct else -1 (uniform groups too)."""
    if not 0 <= lam < math.inf:
        raise ValueError(f"lam must be >= 0 and finite, got {lam}")
    R = binary(rewards)
    return torch.where(R == 1, lam, -1.0).to(R.dtype)

def binary(rewards):
    R = torch.as_tensor(rewards)
    if R.ndim != 2 or not ((R == 0) | (R == 1)).all():
        raise ValueError(f"this weighting needs (num_groups, N) rewards in {{0, 1}}, got shape {tuple(R.shape)}")
    return R if R.is_floating_point() else R.float()

def unlikely_rewards(rewards, mean_logp, beta=0.25):
    """The unlikeliness reward (He, Fried, Welleck 2025, arXiv 2506.02355): rank each group's samples by mean token
    log pi_old, least likely first (rank 0; ties by position), rewards x (1 - beta rank / N); then Eq. 3."""
    if not 0 <= beta <= 1:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    R = torch.as_tensor(rewards)
    order = torch.as_tensor(mean_logp, dtype=torch.float64).argsort(dim=1, stable=True)
    return R * (1 - beta * order.argsort(dim=1, stable=True).to(R.dtype) / R.shape[1])      # (P, N)

WEIGHTINGS = ("focal", "maxrl", "passk", "wreinforce")      # train.py --weighting

def weighted_advantages(rewards, weighting="focal", gamma=0.0, k=4, lam=0.1, normalize_std=True):
    """(A (P, N), g (P,)) under one weighting: focal_advantages (Eqs. 11-13), or a rival's with g = 1."""
    if weighting == "focal":
        return focal_advantages(rewards, gamma, normalize_std=normalize_std)
    if weighting == "maxrl":
        A = maxrl_advantages(rewards)
    elif weighting == "passk":
        A = passk_advantages(rewards, k)
    elif weighting == "wreinforce":
        A = wreinforce_advantages(rewards, lam)
    else:
        raise ValueError(f"weighting {weighting!r}: expected one of {WEIGHTINGS}")
    return A, torch.ones(A.shape[0], dtype=A.dtype)

def low_lr_multiplier(gamma):
    """m_gamma of the GRPO low-LR control (Appendix N), the average shrink of |A| under the focal weight:
    4/sqrt(pi) * Gamma(gamma + 3/2) / Gamma(gamma + 3); m_0.5 = 0.6791, m_1 = 0.5 (derivation: DESIGN.md)."""
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    return 4 / math.sqrt(math.pi) * math.exp(math.lgamma(gamma + 1.5) - math.lgamma(gamma + 3))

# -----------------------------------------------------------------------------
# Per-token losses (Eqs. 14-16) and token-mean aggregation
def clip_bounds(loss_type, eps_low=None, eps_high=None):
    """(lo, hi) = (1 - eps_low, 1 + eps_high) for a loss, the paper's widths unless overridden."""
    if loss_type not in CLIP_EPS:
        raise ValueError(f"loss_type {loss_type!r}: expected one of {sorted(CLIP_EPS)}")
    d_low, d_high = CLIP_EPS[loss_type]
    lo = 1.0 - (d_low if eps_low is None else eps_low)
    hi = 1.0 + (d_high if eps_high is None else eps_high)
    if not lo <= 1.0 <= hi:
        raise ValueError(f"{loss_type} clip bounds [{lo}, {hi}] must contain 1")
    return lo, hi

def token_mean(x, mask, num_tokens=None):
    """sum(x * mask) / num_tokens. num_tokens defaults to mask.sum(); with no tokens the mean is 0.
    For the paper's token mean (App. B / L.2) over a mini-batch split into micro-batches and ranks, pass
    the mini-batch's GLOBAL response-token count: the micro-batches' values then add up to the exact mean,
    where each divided by its own count gives a mean of means, wrong whenever response lengths differ."""
    if num_tokens is None:
        num_tokens = mask.sum()
    # No tokens at all (empty or all padding): 0 / max(0, 1) keeps loss and gradient 0, where 0 / 0 is NaN
    return (x * mask).sum() / torch.as_tensor(num_tokens).clamp(min=1)

# How the per-token losses of a mini-batch become one number (verl's loss_agg_mode names).
LOSS_AGG = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")

def aggregate(x, mask, loss_agg="token-mean", num_tokens=None, num_seqs=None, max_len=None):
    """This micro-batch's share of the mini-batch loss sum_t w_t x_t, for one of LOSS_AGG:
        token-mean               sum x / T                      T: response tokens (the paper, Sec. 3.3)
        seq-mean-token-mean      sum_i (sum_t x_it / |o_i|) / S  the original GRPO: a mean of sequence means
        seq-mean-token-sum-norm  sum x / (S * L_max)            Dr. GRPO: a constant normaliser
    x, mask: (B, T). num_tokens T, num_seqs S and max_len L_max are counts of the WHOLE mini-batch
    (all micro-batches and ranks; default: this one's), so the shares add up to the exact loss. L_max
    is the response budget (max new tokens), a constant; by default the width of x."""
    mask = mask.to(x.dtype)
    if loss_agg == "token-mean":
        return token_mean(x, mask, num_tokens)
    S = torch.as_tensor(mask.shape[0] if num_seqs is None else num_seqs).clamp(min=1)
    if loss_agg == "seq-mean-token-mean":
        return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / S
    if loss_agg == "seq-mean-token-sum-norm":
        return (x * mask).sum() / (S * (mask.shape[-1] if max_len is None else max_len))
    raise ValueError(f"loss_agg {loss_agg!r}: expected one of {LOSS_AGG}")

def policy_loss(logp, old_logp, advantages, mask, loss_type="grpo", eps_low=None, eps_high=None,
                dual_clip=3.0, num_tokens=None, loss_agg="token-mean", num_seqs=None, max_len=None):
    """Policy loss (to minimise) of GRPO / DAPO (Eq. 14) or CISPO (Eqs. 15-16), token-mean by default.
    r = pi_theta / pi_old = exp(clamp(logp - old_logp, -20, 20))
    grpo, dapo:  l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), and for A < 0 also
                 l = min(l, -A c) (dual clip, c = dual_clip). Widths 0.2/0.2 (GRPO), 0.2/0.28 (DAPO).
    cispo:       l = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi, widths 1.0/5.0: weight in [0, 6].
    F-variants need nothing here: pass the focal advantages.
    logp, old_logp, mask: (B, T) per response token; advantages: (B,) per sequence or (B, T).
    num_tokens: the mini-batch's global token count (see token_mean); loss_agg, num_seqs, max_len:
    another aggregation of the per-token losses (see aggregate). Returns (loss, diagnostics): each
    diagnostic but ratio/max is a token-mean over num_tokens whatever loss_agg, so it sums over
    micro-batches and ranks to the mini-batch fraction."""
    lo, hi = clip_bounds(loss_type, eps_low, eps_high)
    A = advantages[:, None] if advantages.ndim == 1 else advantages                  # (B, 1) or (B, T)
    mask = mask.to(logp.dtype)
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))                         # (B, T)
    if loss_type == "cispo":
        w = ratio.clamp(lo, hi).detach()                  # stop-gradient: a constant weight per token
        per_tok = -w * A * logp                           # the gradient flows only through log pi
        flags = {"cispo/at_lo": ratio < lo, "cispo/at_hi": ratio > hi}
    else:
        per_tok = torch.maximum(-A * ratio, -A * ratio.clamp(lo, hi))                # Eq. 14, negated
        # Dual clip: for A < 0 a huge ratio would make the loss unbounded; cap it at |A| c (verl).
        per_tok = torch.where(A < 0, torch.minimum(per_tok, -A * dual_clip), per_tok)
        flags = {"clip/low": (A < 0) & (ratio < lo), "clip/high": (A > 0) & (ratio > hi),
                 "clip/dual": (A < 0) & (ratio > dual_clip)}
    loss = aggregate(per_tok, mask, loss_agg, num_tokens, num_seqs, max_len)
    with torch.no_grad():
        diag = {k: token_mean(v.to(logp.dtype), mask, num_tokens) for k, v in flags.items()}
        diag["ratio/mean"] = token_mean(ratio, mask, num_tokens)
        diag["ratio/max"] = (ratio * mask).max() if mask.any() else ratio.new_zeros(())
    return loss, diag

def kl_k3(logp, ref_logp):
    """Per-token k3 estimate of KL(pi_theta || pi_ref) (Schulman's "k3", verl's low_var_kl).
    k3 = exp(d) - d - 1 with d = log pi_ref - log pi_theta, unbiased and >= 0; clamped like verl
    (d to +-20, k3 to [-10, 10]) so one outlier token cannot dominate. Aggregate with token_mean."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)

TIS_LEVELS = ("token", "sequence")                   # train.py --tis_level

def tis_weights(old_logp, engine_logp, mask, cap, level="token"):
    """Truncated importance sampling (not in the paper; verl's rollout correction): a token's loss weighted by
    w = min(pi_old / pi_engine, cap), or (sequence level) each of a row's by min(prod_t pi_old / pi_engine, cap).
    (B, T) inputs -> (w, 0 off the mask; capped, where the ratio passed the cap). w >= 0: use A_t = w_t A."""
    mask = mask.to(old_logp.dtype)
    d = (old_logp - engine_logp).clamp(-20.0, 20.0) * mask                          # (B, T) log-ratios
    if level == "sequence":
        d = d.sum(-1, keepdim=True).clamp(-20.0, 20.0).expand_as(d)                   # (B, T), one per row
    ratio = torch.exp(d)
    return ratio.clamp(max=cap) * mask, (ratio > cap) & (mask > 0)

def entropy_from_logits(logits):
    """Per-token entropy H = -sum_v p_v log p_v of p = softmax(logits) over the last dim. (..., V) -> (...)
    In float32, float64 staying float64; finite for any finite logits (a softmax that underflows to 0
    contributes 0, not 0 * -inf). Pass logits already divided by the sampling temperature. It
    materialises the whole (..., V) softmax: the trainer's head computes it per chunk (logprob.head_logp)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)

# -----------------------------------------------------------------------------
# Lemma 3.1: the tail-miss probability
def tail_miss_probability(mu_pos, tau, n):
    """Pr(B_{E,N}) of Lemma 3.1: the group is active (0 < X < N) yet no rollout lands in E.
    Pr(B) = (1 - tau)^N - (mu_pos - tau)^N - (1 - mu_pos)^N, for 0 < tau < mu_pos <= 1, N >= 1.
    The first term is "no rollout in E"; from it we subtract the two inactive ways of missing E:
    all rollouts correct but outside E, and all rollouts wrong. Broadcasts over numpy arrays."""
    mu, tau, n = (np.asarray(x, dtype=np.float64) for x in (mu_pos, tau, n))
    if np.any(tau <= 0) or np.any(tau >= mu) or np.any(mu > 1):
        raise ValueError("need 0 < tau < mu_pos <= 1")
    if np.any(n < 1):
        raise ValueError("need N >= 1")
    return (1 - tau) ** n - (mu - tau) ** n - (1 - mu) ** n

def tail_miss_argmax(mu_pos, tau, n_max=1 << 17):
    """Integer argmax over N = 1..n_max of the tail-miss probability (no closed form: every N), and the peak."""
    p = tail_miss_probability(mu_pos, tau, np.arange(1, n_max + 1))
    i = int(np.argmax(p))
    return i + 1, float(p[i])                                          # p[i] is at N = i + 1

# -----------------------------------------------------------------------------
# One-step theory of the categorical policy (Sec. 2.3, Eq. 5; Prop. 3.2, Eq. 10): simulate.py. The rewards R_c,
# R_w are whatever enters the surrogate: raw rewards as in Hu et al., or the simulation's centred R - mean R.
def batch_sums(p, correct, sampled, r_correct, r_wrong):
    """Sums of Eq. 5, Hu et al. Eq. 17 and Prop. 3.2 for a batch; p (K,), correct (K,) bool, sampled (K,) counts or bool."""
    p, pos, s = (np.asarray(p, dtype=np.float64), np.asarray(correct, bool), np.asarray(sampled) > 0)
    A, B, U = s & pos, s & ~pos, ~s                        # A, B: distinct sampled correct / wrong actions
    P_pos, P_neg = p[A].sum(), p[B].sum()
    return dict(Q_pos=p[pos].sum(), P_pos=P_pos, P_neg=P_neg, A_2=(p[A] ** 2).sum(), B_2=(p[B] ** 2).sum(),
                U_pos2=(p[U & pos] ** 2).sum(), U_neg2=(p[U & ~pos] ** 2).sum(), U_2=(p[U] ** 2).sum(),
                S_R=r_correct * P_pos + r_wrong * P_neg)      # batch baseline S_R

def delta_logits(p, correct, sampled, r_correct, r_wrong, eta, N):
    """Eq. 5: dz_i = eta/N p_i (R_i - S_R) on A u B, -eta/N S_R p_i on U; = eta * grad of (1/N) sum_{A u B} R p."""
    p, pos, s = (np.asarray(p, dtype=np.float64), np.asarray(correct, bool), np.asarray(sampled) > 0)
    S_R = batch_sums(p, pos, s, r_correct, r_wrong)["S_R"]
    R = np.where(pos, r_correct, r_wrong) * s                # unsampled actions carry no reward
    return eta / N * p * (R - S_R)                          # (K,)

def delta_Q_pos(p, correct, sampled, r_correct, r_wrong, eta, N):
    """First-order change of Q_pos, Hu et al. Eq. 17 (Sec. 2.3):
    eta/N [(R_c - S_R) Q_neg A_2 + (S_R - R_w) Q_pos B_2 + S_R (Q_pos U_neg,2 - Q_neg U_pos,2)]."""
    b = batch_sums(p, correct, sampled, r_correct, r_wrong)
    Q_pos, S_R = b["Q_pos"], b["S_R"]
    Q_neg = 1.0 - Q_pos
    return eta / N * ((r_correct - S_R) * Q_neg * b["A_2"] + (S_R - r_wrong) * Q_pos * b["B_2"]
                      + S_R * (Q_pos * b["U_neg2"] - Q_neg * b["U_pos2"]))

def delta_Q_u_pos(p, correct, sampled, r_correct, r_wrong, eta, N):
    """First-order change of the unsampled-correct mass Q_u,pos = Q_pos - P_pos, Eq. 10 (Prop. 3.2):
    eta/N [-S_R U_pos,2 - Q_u,pos ((R_c - S_R) A_2 + (R_w - S_R) B_2 - S_R U_2)]."""
    b = batch_sums(p, correct, sampled, r_correct, r_wrong)
    S_R, Q_u_pos = b["S_R"], b["Q_pos"] - b["P_pos"]
    coupling = (r_correct - S_R) * b["A_2"] + (r_wrong - S_R) * b["B_2"] - S_R * b["U_2"]
    return eta / N * (-S_R * b["U_pos2"] - Q_u_pos * coupling)

# -----------------------------------------------------------------------------
# pass@k (Chen et al. 2021; Eq. 27), unbiased, in product form: evaluate.py and the maze's held-out evaluation
def pass_at_k(n, c, k):
    """Unbiased pass@k of one problem with c correct out of n: 1 - C(n-c, k) / C(n, k).
    Product form: C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i), no huge binomials.
    It is the mean over all k-subsets of the n samples of "some member is correct"."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n; got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n; got c={c}, n={n}")
    if n - c < k:                                   # every k-subset holds a correct sample
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return 1.0 - float(np.prod(1.0 - k / i))

def pass_at_k_table(n, k):
    """pass@k for every c = 0..n at once, shape (n+1,): index it with an array of counts.
    ratio[c] = prod_{j<c} (1 - k / (n - j)) is the same product built up one factor per c; it hits
    exactly 0 at c = n - k + 1, which is where pass@k becomes 1."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n; got k={k}, n={n}")
    ratio = np.concatenate([[1.0], np.cumprod(1.0 - k / np.arange(n, 0, -1, dtype=np.float64))])
    return 1.0 - np.clip(ratio, 0.0, 1.0)

def ks_up_to(n):
    """k = 1, 2, 4, ... <= n, and n itself."""
    ks = [2 ** i for i in range(int(math.log2(n)) + 1)]
    return ks + ([n] if ks[-1] != n else [])

def pass_at_k_curve(n, counts):
    """{k: mean over problems of pass@k} for k in ks_up_to(n)."""
    c = np.asarray(counts, dtype=np.int64)
    return {k: float(pass_at_k_table(n, k)[c].mean()) for k in ks_up_to(n)}

# -----------------------------------------------------------------------------
# The paired m-out-of-n subsampling test (Appendix Q): evaluate.py --mode compare
def subsample_test(a, b, m=256, iters=50_000, seed=0, groups=(), block=1000):
    """B minus A, per benchmark and per average of `groups` ((name, benchmarks) pairs), per k = 1, 2, 4, ... <= m.
    a, b: {benchmark: (n, c array)} over the same problems. Each iteration draws, per problem and model, m of the
    n samples without replacement: c' ~ Hypergeometric(c, n - c, m) correct; averages are per iteration (DESIGN.md).
    Returns {name: {k: {diff, lo, hi, significant}}}; significant iff the 95% interval excludes 0."""
    rng = np.random.default_rng(seed)
    ks = [k for k in ks_up_to(m) if k <= m]
    tables = {k: pass_at_k_table(m, k) for k in ks}
    diffs = {name: {k: np.empty(iters) for k in ks} for name in a}
    for s in range(0, iters, block):
        size = min(block, iters - s)
        for name in a:
            (n, ca), (_, cb) = a[name], b[name]
            sa = rng.hypergeometric(ca, n - ca, m, size=(size, len(ca)))      # (size, P)
            sb = rng.hypergeometric(cb, n - cb, m, size=(size, len(cb)))
            for k in ks:
                diffs[name][k][s:s + size] = tables[k][sb].mean(1) - tables[k][sa].mean(1)
    for group, names in groups:
        present = [x for x in names if x in diffs]
        if present:
            diffs[group] = {k: np.mean([diffs[x][k] for x in present], axis=0) for k in ks}
    out = {name: {} for name in diffs}
    for name, per_k in diffs.items():
        for k, d in per_k.items():
            lo, hi = np.percentile(d, [2.5, 97.5])
            out[name][k] = {"diff": float(d.mean()), "lo": float(lo), "hi": float(hi),
                            "significant": bool(lo > 0 or hi < 0)}
    return out
