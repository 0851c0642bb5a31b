"""
Categorical simulation of F-GRPO (arXiv 2602.06717, Sec. 5.1 and App. J): Q_pos and M_ret against
the group size N, and the one-step theory behind it (Eq. 5, Hu et al. Eq. 17, Prop. 3.2, Lemma 3.1).

    python simulate.py                                  # full sweep (17 N x 2 gamma x 4 seeds x 1000 steps), ~2 min
    python bench/sim_sensitivity.py                     # which claims hold under which optimizer, ~11 min
    python simulate.py --num_actions 1000 --num_correct 100 --steps 5 --group_sizes 2 8 --out_dir out/sim_small
    python simulate.py --surrogate counts               # duplicates-counted reading (the paper is ambiguous)
    python simulate.py --adam_eps 1e-8                  # PyTorch's eps: C1 and C5 fail (RESULTS.md)
    python simulate.py --plot_only true                 # reprint and redraw from out/simulate/results.json

One softmax policy over num_actions actions, the first num_correct correct (action 0 the anchor); each step draws
N actions and takes one optimizer step on L = g/N * sum_{a in A u B} (R_a - mean R) p_a (mean-only advantage), with
g = (1 - mu_hat)^gamma (Eq. 12). Writes results.json and fig2/fig3/fig5.png; prints claims C1-C5 and the first step.

Choices the paper leaves open (fused AdamW lr 1e-2, wd 0.01, eps 1e-12; the distinct surrogate, Eq. 5; an exact
sampler; common random numbers; float32) and why a step is fast: DESIGN.md, "The categorical simulation".
"""
import ctypes
import dataclasses
import json
import math
import multiprocessing as mp
import os
import time
from collections import defaultdict
from contextlib import contextmanager, suppress
from pathlib import Path
from queue import Empty

import numpy as np
import torch

from advantage import (WEIGHTINGS, delta_Q_pos, delta_Q_u_pos, focal_weight, success_rate, tail_miss_argmax,
                       tail_miss_probability, weighted_advantages)
from fgrpo_utils.cli import check, check_choices, check_positive, parse_config, refuse
from fgrpo_utils.outputs import atomic_write_json, check_out_dir, code_hashes, mark_out_dir, remove_temp

OUTPUTS = ("results.json", "fig2.png", "fig3.png", "fig5.png", "sensitivity.json", "sensitivity.md",
           "fig2_sensitivity_wd0.png", "fig2_sensitivity_wd0.01.png")      # all we (and bench/sim_sensitivity.py) write
MAX_GROUP = 1 << 24                # the largest N: far past the paper's 131,072, and cheap to refuse

@dataclasses.dataclass
class Config:
    num_actions: int = 128_000     # |A|: actions 0 .. num_correct-1 are correct, action 0 the anchor
    num_correct: int = 10_000      # |A+|
    anchor_logit: float = 5.0      # initial logits, from Hu et al.; wrong actions start at 0
    correct_logit: float = 3.0     # the other correct actions' initial logit
    r_correct: float = 1.0         # R_c
    r_wrong: float = -1.0          # R_w
    group_sizes: tuple[int, ...] = tuple(2 ** k for k in range(1, 18))    # N = 2 .. 131,072
    gammas: tuple[float, ...] = (0.0, 1.0)                                 # focal exponent, Eq. 12
    weighting: str = "focal"       # focal: g (R_a - rbar) | a rival's advantage (advantage.py) of the draws' 1/0
    passk_k: int = 4               # --weighting passk: k, <= every N
    wreinforce_lambda: float = 0.1  # --weighting wreinforce: a correct draw's advantage (a wrong one's -1)
    seeds: int = 4                 # how many seeds: seed, seed + 1, ..., seed + seeds - 1
    seed: int = 0                  # the first seed
    steps: int = 1000              # T, optimizer steps per configuration
    optimizer: str = "adamw"       # "adamw" | "signsgd" (AdamW with betas 0: lr * sign(grad)) | "sgd" (gradient ascent)
    lr: float = 1e-2               # the paper's one change to Hu et al. (1e-3)
    adam_eps: float = 1e-12        # Adam's eps (adamw, signsgd); most claims at 1e-12 .. 1e-30, not PyTorch's 1e-8
    weight_decay: float = 0.01     # decoupled, z <- (1 - lr wd) z; PyTorch's AdamW default
    surrogate: str = "distinct"    # "distinct": each sampled action once (Eq. 5) | "counts": once per draw
    log_every: int = 10            # stride (in steps) of the saved Q_pos and M_ret trajectories
    workers: int = 0               # processes; 0 = one per CPU core
    out_dir: str = "out/simulate"  # results.json and the figures; holds only what we write, or is refused
    plot_only: bool = False        # redraw the figures from out_dir/results.json, simulate nothing

    @staticmethod
    def choices():
        return {"optimizer": ("adamw", "signsgd", "sgd"), "surrogate": ("distinct", "counts"), "weighting": WEIGHTINGS}

    def __post_init__(self):
        check(self.num_actions >= 2, "--num_actions must be >= 2")
        check(1 <= self.num_correct < self.num_actions, "--num_correct must be >= 1 and < --num_actions")
        for name in ("anchor_logit", "correct_logit", "r_correct", "r_wrong"):
            check(math.isfinite(getattr(self, name)), f"--{name} must be a finite number")
        check(self.r_correct > self.r_wrong, "--r_correct must be greater than --r_wrong")
        check(len(self.group_sizes) > 0 and min(self.group_sizes) >= 1, "--group_sizes: every N must be >= 1")
        check(max(self.group_sizes) <= MAX_GROUP, f"--group_sizes {max(self.group_sizes)}: at most {MAX_GROUP:,} "
              "(2^24; the paper's largest N is 131,072)")
        check(len(set(self.group_sizes)) == len(self.group_sizes), "--group_sizes: repeated value")
        check(len(self.gammas) > 0 and all(0 <= g < math.inf for g in self.gammas),
              "--gammas: every gamma must be >= 0 and finite")
        check(len(set(self.gammas)) == len(self.gammas), "--gammas: repeated value")
        check(self.weighting == "focal" or self.gammas == (0.0,), f"--gammas: --weighting {self.weighting} has no "
              "gamma; pass --gammas 0")
        check(1 <= self.passk_k <= (min(self.group_sizes) if self.weighting == "passk" else MAX_GROUP),
              f"--passk_k {self.passk_k}: must be in [1, the smallest N {min(self.group_sizes)}]")
        check(0 <= self.wreinforce_lambda < math.inf, "--wreinforce_lambda must be >= 0 and finite")
        check(self.seeds >= 1, "--seeds must be >= 1 (it is a count)")
        check(self.seed >= 0, "--seed must be >= 0")
        check(self.steps >= 1, "--steps must be >= 1")
        check_choices(self)
        check_positive(self, "lr", "adam_eps")           # eps = 0 divides 0 by 0 on an all-correct first batch
        check(0 <= self.weight_decay and self.lr * self.weight_decay < 1,
              "--weight_decay must be >= 0 with lr * weight_decay < 1")
        check(self.log_every >= 1, "--log_every must be >= 1")
        check(self.workers >= 0, "--workers must be >= 0")
        # Before any compute; a killed write's temps (main removes them) may predate the first marker.
        check_out_dir(self.out_dir, known=[f".{n}.tmp.*" for n in OUTPUTS])

# -----------------------------------------------------------------------------
# The simulation: policy, exact count sampler, closed-form gradient, metrics
def initial_logits(cfg):
    z = torch.zeros(cfg.num_actions)                        # (K,) wrong actions at 0
    z[: cfg.num_correct] = cfg.correct_logit
    z[0] = cfg.anchor_logit
    return z

def reward_vector(cfg):
    R = torch.full((cfg.num_actions,), cfg.r_wrong)         # (K,)
    R[: cfg.num_correct] = cfg.r_correct
    return R

def sample_counts(p, n, rng):
    """c ~ Multinomial(n, p) exactly, for one row p (K,). Returns the distinct sampled actions (D,) int64
    (A u B, sorted) and their counts (D,) float32, which sum to n."""
    K = p.shape[0]
    if n <= 2 * K:
        # Inverse CDF at sorted uniforms, made in O(n) from n + 1 exponentials (exact, ~5x faster than sorting):
        # the searches walk the CDF in order, the runs are the counts. O(K + n log K): cheaper below n = 2K (measured).
        cdf = torch.cumsum(p, 0, dtype=torch.float64).numpy()             # (K,)
        e = np.cumsum(rng.standard_exponential(n + 1))                      # (n + 1,)
        u = e[:n] / e[n] * cdf[-1]                                          # (n,) sorted, in [0, sum p)
        a = np.minimum(np.searchsorted(cdf, u, side="right"), K - 1)       # (n,) sampled actions, sorted
        first = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])               # (D,) start of each run
        idx, c = a[first], np.diff(np.r_[first, n])
    else:
        # Conditional binomials c_1 ~ Bin(n, p_1), c_2 ~ Bin(n - c_1, p_2 / (1 - p_1)), ...: O(K).
        p64 = p.double()
        c = rng.multinomial(n, (p64 / p64.sum()).numpy())                  # (K,)
        idx = np.flatnonzero(c)
        c = c[idx]
    return torch.from_numpy(idx), torch.from_numpy(c.astype(np.float32))

def surrogate_grad(p, idx, c, N, gamma, R, surrogate, r_correct, r_wrong, rival=None):
    """Closed-form gradient of the loss -g L w.r.t. the logits z, one row. L = 1/N sum_{A u B} (R_a - rbar) m_a p_a,
    m_a = 1 ("distinct") or c_a ("counts"), rbar the N draws' mean reward; with w = dL/dp (0 off the sampled
    actions), dL/dz_i = p_i (w_i - sum_j p_j w_j): one dense pass plus a scatter over the D sampled actions.
    rival: (weighting, k, lambda): g (R_a - rbar) becomes that weighting's advantage of a's draws (weighted_advantages
    of the N draws' correctness, 1 or 0: every draw of an action has the same one).
    p: (K,); idx, c: (D,) from sample_counts; R: (K,)  ->  (K,)"""
    r = R[idx]                                                     # (D,) rewards of A u B
    rbar = (c * r).sum() / N                                       # mean reward of the N draws
    draws = torch.repeat_interleave(r, c.long())[None]             # (1, N) the N rewards
    mu_hat = success_rate(draws, *R.new_tensor([r_correct, r_wrong]).tolist())[0]   # X / N, Eq. 11; levels in R's dtype
    m = torch.ones_like(c) if surrogate == "distinct" else c       # (D,)
    if rival is None:
        w = focal_weight(mu_hat, gamma) / N * (r - rbar) * m       # (D,) dL/dp_a, advantage R_a - rbar
    else:                                                          # each action's first draw's advantage
        A, _ = weighted_advantages((draws == r_correct).double(), rival[0], k=rival[1], lam=rival[2])   # (1, N)
        w = A[0, (c.cumsum(0) - c).long()].to(p.dtype) / N * m
    pw = p[idx] * w                                                # (D,)
    grad = p * pw.sum()                                            # (K,) -dL/dz_i = p_i (sum_j p_j w_j - w_i)
    grad[idx] -= pw
    return grad

def metrics(p, p0_pos, num_correct):
    """Q_pos = sum_{A+} p and M_ret = 1 - sum_{A+} max(0, p0 - p) / sum_{A+} p0 (Eq. 26). p: (..., K)."""
    p_pos = p[..., :num_correct]                                    # (..., |A+|)
    M_ret = 1 - (p0_pos - p_pos).clamp(min=0).sum(-1) / p0_pos.sum()
    return p_pos.sum(-1), M_ret

def make_optimizer(z, cfg, fused=True):
    """The optimizer of --optimizer for the logits z (each one's update, and why eps matters: DESIGN.md, "The
    categorical simulation"); fused=False is PyTorch's reference loop (tests)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD([z], lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused or None)
    betas = (0.0, 0.0) if cfg.optimizer == "signsgd" else (0.9, 0.999)
    # The fused CPU kernel does the whole update in one pass (~10x the default loop at this size).
    return torch.optim.AdamW([z], lr=cfg.lr, betas=betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
                             fused=fused or None)

@contextmanager
def timed(tm, key):
    t0 = time.process_time()
    yield
    tm[key] += time.process_time() - t0

def run_rows(rows, cfg, progress=None):
    """Simulate `rows` = [(N, gamma, seed), ...] side by side: one (R, K) logit tensor and one fused AdamW, softmax,
    sampling and gradient row by row (why: DESIGN.md, "The categorical simulation"). Returns the logged
    trajectories, each row's coverage (mean over steps of sum_A p / Q_pos), CPU s per phase."""
    C = cfg.num_correct
    z0, R = initial_logits(cfg), reward_vector(cfg)
    p0_pos = torch.softmax(z0, 0)[:C]                                  # (|A+|,) pi_0 on A+
    z = z0.repeat(len(rows), 1).requires_grad_()                       # (R, K)
    z.grad = torch.zeros_like(z)
    opt = make_optimizer(z, cfg)
    rngs = [np.random.default_rng([seed, n]) for n, _, seed in rows]
    rival = None if cfg.weighting == "focal" else (cfg.weighting, cfg.passk_k, cfg.wreinforce_lambda)
    log = {"step": [], "Q_pos": [], "M_ret": []}
    coverage = [0.0] * len(rows)          # sum over steps of the fraction of Q_pos that was sampled
    tm = defaultdict(float)                                            # CPU seconds per phase
    for t in range(cfg.steps + 1):
        record = t % cfg.log_every == 0 or t == cfg.steps
        if record:
            log["step"].append(t)
            log["Q_pos"].append([])
            log["M_ret"].append([])
        for i, (n, gamma, _) in enumerate(rows):
            with timed(tm, "softmax"), torch.no_grad():
                p = torch.softmax(z[i], 0)                                    # (K,)
            if record:                                                        # metrics of pi_t, before step t
                with timed(tm, "metrics"):
                    for key, value in zip(("Q_pos", "M_ret"), metrics(p, p0_pos, C)):
                        log[key][-1].append(value.item())
            if t == cfg.steps:
                continue
            with timed(tm, "sample"):
                idx, c = sample_counts(p, n, rngs[i])                         # (D,), (D,)
            with timed(tm, "metrics"):                                        # sum_A p / Q_pos: coverage
                coverage[i] += (p[idx[idx < C]].sum() / p[:C].sum()).item() / cfg.steps
            with timed(tm, "grad"):
                z.grad[i] = surrogate_grad(p, idx, c, n, gamma, R, cfg.surrogate, cfg.r_correct, cfg.r_wrong, rival)
        if t < cfg.steps:
            with timed(tm, "adamw"):
                opt.step()                                                    # all rows at once
            if progress:
                progress(len(rows))
    log["coverage"] = coverage
    return rows, log, dict(tm)

def keep_freed_memory():
    """Ask glibc to keep freed blocks below 64 MB mapped, else each step's ~1 MB temporaries come back as fresh
    pages (what their faults cost: DESIGN.md, "The categorical simulation"). A no-op without glibc (macOS, musl)."""
    with suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 << 20)           # M_MMAP_THRESHOLD
        libc.mallopt(-1, 256 << 20)          # M_TRIM_THRESHOLD

def _worker(job):
    cfg, rows, queue = job
    torch.set_num_threads(1)                 # one process per core; numpy's sampler is single-threaded
    keep_freed_memory()
    return run_rows(rows, cfg, progress=queue.put)

def run_jobs(jobs, workers, desc="simulate"):
    from tqdm import tqdm
    bar = tqdm(total=sum(len(rows) * cfg.steps for cfg, rows in jobs), unit="step", unit_scale=True, desc=desc)
    if workers == 1:
        keep_freed_memory()
        out = [run_rows(rows, cfg, progress=bar.update) for cfg, rows in jobs]
    else:
        ctx = mp.get_context("spawn")        # no fork: torch's thread pools do not survive it
        with ctx.Manager() as manager, ctx.Pool(workers) as pool:
            queue = manager.Queue()
            job = pool.map_async(_worker, [(cfg, rows, queue) for cfg, rows in jobs], chunksize=1)
            while not job.ready() or not queue.empty():
                with suppress(Empty):
                    bar.update(queue.get(timeout=0.2))
            out = job.get()
    bar.close()
    return out

def deal(rows, workers):
    """Deal the rows out like cards, largest N first (a step costs more there): loads within one row."""
    rows = sorted(rows, reverse=True)
    return [rows[i::workers] for i in range(min(workers, len(rows)))]

def all_rows(cfg):
    return [(n, gm, s) for n in cfg.group_sizes for gm in cfg.gammas for s in range(cfg.seed, cfg.seed + cfg.seeds)]

def collect(cfg, outputs):
    runs = []
    for rows, log, _ in outputs:
        for i, (n, gm, seed) in enumerate(rows):
            Q, M = [q[i] for q in log["Q_pos"]], [m[i] for m in log["M_ret"]]
            runs.append(dict(N=n, gamma=gm, seed=seed, Q_pos_final=Q[-1], M_ret_final=M[-1], M_ret_min=min(M),
                             coverage=log["coverage"][i], Q_pos=Q, M_ret=M))
    return sorted(runs, key=lambda r: (r["N"], r["gamma"], r["seed"]))

def simulate(cfg):
    """Every (N, gamma, seed) of cfg, split over worker processes: (runs, CPU seconds per phase, steps)."""
    workers = cfg.workers or os.cpu_count()
    outputs = run_jobs([(cfg, rows) for rows in deal(all_rows(cfg), workers)], workers)
    timing = {k: sum(tm[k] for _, _, tm in outputs) for k in outputs[0][2]}      # every job times every phase
    return collect(cfg, outputs), timing, outputs[0][1]["step"]

# -----------------------------------------------------------------------------
# The paper's claims about Fig. 2 (Sec. 5.1): its words as thresholds, fixed before any result (RESULTS.md).
# Sec. 5.1 / Fig. 2(c): regime I is N <= 16 (2 and 16 in Fig. 2), II "about 256 .. 8,192", III the largest N
SMALL, ZONE = 16, (256, 8192)
GROWS = 0.01          # C1 "Q_pos grows": final Q_pos above Q_pos(0) by more than this
ABOUT_0_2 = (0.1, 0.4)  # C2 "collapses ... to about 0.2": within a factor of 2 of 0.2
KEEPS_MORE = 0.05     # C2 "small N keeps more": every small N's M_ret above every zone N's by this
CLEARLY = (1.25, 0.02)  # C3 "clearly raises": M_ret(gamma=1) >= 1.25 x M_ret(gamma=0), and by >= 0.02
ABOUT_1 = 0.9         # C4 "M_ret ~ 1 throughout": the lowest M_ret over training, at every seed and gamma
COVERED = 0.99        # C5 coverage: the batches sampled >= 99% of the correct mass, on average over steps
MOVES = 0.5           # C5 "the policy moves": Q_pos gain >= half the zone's mean gain

def judge_claims(runs, q0):
    """C1-C5 of Sec. 5.1 (CLAIMS, by the thresholds above) on seed means at small N <= SMALL, the zone ZONE and
    the largest N: {claim: (holds, evidence)}."""
    def mean(key, n, gm):
        return float(np.mean([r[key] for r in runs if r["N"] == n and r["gamma"] == gm]))
    Ns = sorted({r["N"] for r in runs})
    small, zone, large = [n for n in Ns if n <= SMALL], [n for n in Ns if ZONE[0] <= n <= ZONE[1]], Ns[-1]
    gain = {(n, gm): mean("Q_pos_final", n, gm) - q0 for n in Ns for gm in (0.0, 1.0)}
    worst = min(gain, key=gain.get)
    c1 = (gain[worst] > GROWS, f"min dQ_pos {gain[worst]:+.2f} (N={worst[0]}, γ={worst[1]:g})")
    zone_m = [mean("M_ret_final", n, 0.0) for n in zone]
    small_m = [mean("M_ret_final", n, 0.0) for n in small]
    c2 = (all(ABOUT_0_2[0] <= m <= ABOUT_0_2[1] for m in zone_m) and min(small_m) > max(zone_m) + KEEPS_MORE,
          f"zone {min(zone_m):.2f}–{max(zone_m):.2f}, small N {min(small_m):.2f}–{max(small_m):.2f}")
    raised = [(mean("M_ret_final", n, 1.0), mean("M_ret_final", n, 0.0)) for n in zone]
    ratios = [m1 / max(m0, 1e-9) for m1, m0 in raised]
    c3 = (all(m1 >= CLEARLY[0] * m0 and m1 - m0 >= CLEARLY[1] for m1, m0 in raised),
          f"×{min(ratios):.1f}–{max(ratios):.1f}")
    kept = min(r["M_ret_min"] for r in runs if r["N"] == large)
    others = {n: mean("M_ret_final", n, 0.0) for n in Ns if n != large}
    best = max(others, key=others.get)
    c4 = (kept >= ABOUT_1 and others[best] < ABOUT_1, f"N={large} min {kept:.2f}, next {others[best]:.2f} (N={best})")
    zone_gain = np.mean([gain[n, 0.0] for n in zone])
    cover = min(r["coverage"] for r in runs if r["N"] == large)
    c5 = (kept >= ABOUT_1 and gain[large, 0.0] >= MOVES * zone_gain and cover >= COVERED,
          f"dQ_pos {gain[large, 0.0]:+.2f} vs zone {zone_gain:+.2f}, sampled {cover:.3f} of Q_pos")
    return {k: (bool(ok), ev) for k, (ok, ev) in dict(C1=c1, C2=c2, C3=c3, C4=c4, C5=c5).items()}   # JSON-able

def claims_table(rows):
    """rows: [(label, claims)] -> markdown, one line per setting, a cell per claim: yes/no and the evidence."""
    lines = ["| setting | held | " + " | ".join(CLAIMS) + " |", "|---" * (2 + len(CLAIMS)) + "|"]
    for label, claims in rows:
        held = sum(ok for ok, _ in claims.values())
        cells = [f"{'✓' if ok else '✗'} {ev}" for ok, ev in claims.values()]
        lines.append(f"| {label} | {held}/{len(claims)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

CLAIMS = ("C1 Q_pos grows at every N", "C2 zone collapses to ~0.2", "C3 γ=1 raises the zone",
          "C4 only N=131,072 keeps M_ret≈1", "C5 regime III is coverage")

# -----------------------------------------------------------------------------
# The mechanism: one step from pi_0, theory beside simulation
def softmax_change(p, dz):
    """softmax(z + dz) - softmax(z) for p = softmax(z), without cancellation: q_i - p_i =
    p_i (expm1(dz_i) - (Z - 1)) / Z with Z - 1 = sum_j p_j expm1(dz_j). float64, (K,) -> (K,)."""
    e = np.expm1(dz)
    z1 = (p * e).sum()
    return p * (e - z1) / (1 + z1)

ONE_STEP_DRAWS = 200     # batches per N in the default run's one-step check
STUDY_NS = (2, 16, 256, 8192, 131_072)   # its N, and bench/sim_sensitivity.py's: the regimes I, II, III

def one_step_check(cfg, group_sizes, draws):
    """The first step from pi_0 at each N, mean over `draws` batches (gamma = 0, float64): one dict per N of Pr(B)
    (Lemma 3.1, one non-anchor correct action), E[Q_u,pos] (the correct mass missed), dQ_pos (Hu Eq. 17) and
    dQ_u,pos (Eq. 10, Prop. 3.2) for a gradient step eta = lr beside the exact change, and after cfg's first step."""
    K, C = cfg.num_actions, cfg.num_correct
    z0, R = initial_logits(cfg).double(), reward_vector(cfg).double()
    p_t = torch.softmax(z0, 0)
    p, correct = p_t.numpy(), np.arange(K) < C
    out = []
    for n in group_sizes:
        rng = np.random.default_rng([0, n, 1])
        acc = defaultdict(list)
        for _ in range(draws):
            idx, c = sample_counts(p_t, n, rng)
            sampled = np.zeros(K)
            sampled[idx.numpy()] = c.numpy()
            missed = correct & (sampled == 0)                               # unsampled correct actions
            rbar = float((c.double() * R[idx]).sum()) / n
            rc, rw = cfg.r_correct - rbar, cfg.r_wrong - rbar               # the centred rewards R - rbar
            grad = surrogate_grad(p_t, idx, c.double(), n, 0.0, R, cfg.surrogate, cfg.r_correct, cfg.r_wrong)
            acc["Q_u_pos"].append(p[missed].sum())
            acc["theory_dQ"].append(delta_Q_pos(p, correct, sampled, rc, rw, cfg.lr, n))
            acc["theory_dQu"].append(delta_Q_u_pos(p, correct, sampled, rc, rw, cfg.lr, n))
            z = z0.clone()[None].requires_grad_()
            z.grad = grad[None].clone()
            make_optimizer(z, cfg).step()                                   # one step of cfg's optimizer
            ascent = -cfg.lr * grad.numpy()                                 # one gradient-ascent step, eta = lr
            for step, dz in (("sim", ascent), ("opt", (z.detach()[0] - z0).numpy())):
                dq = softmax_change(p, dz)
                acc[f"{step}_dQ"].append(dq[correct].sum())
                acc[f"{step}_dQu"].append(dq[missed].sum())
        row = dict(N=n, Pr_B=float(tail_miss_probability(p[:C].sum(), p[1], n)))
        for k, v in acc.items():
            row[k], row[k + "_se"] = float(np.mean(v)), float(np.std(v, ddof=1) / np.sqrt(len(v)))
        out.append(row)
    return out

def one_step_table(rows, cfg):
    lines = [f"| N | Pr(B), Lemma 3.1 | E[Q_u,pos] | dQ_pos Eq. 17 | dQ_pos simulated | dQ_u,pos Eq. 10 | "
             f"dQ_u,pos simulated | dQ_pos, {cfg.optimizer} step | dQ_u,pos, {cfg.optimizer} step |",
             "|---" * 9 + "|"]
    for r in rows:
        lines.append(f"| {r['N']} | {r['Pr_B']:.2g} | {r['Q_u_pos']:.3f} | " + " | ".join(
            f"{r[k]:+.2e}" for k in ("theory_dQ", "sim_dQ", "theory_dQu", "sim_dQu", "opt_dQ", "opt_dQu")) + " |")
    return "\n".join(lines)

# -----------------------------------------------------------------------------
# Figures
def save(fig, path):
    """Write a figure atomically (a reader sees the old PNG or the new one) and close it."""
    import matplotlib.pyplot as plt
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.{os.getpid()}")      # outputs.is_temp_of's pattern
    try:
        fig.tight_layout()
        fig.savefig(tmp, dpi=90, format="png")
        os.replace(tmp, path)
        mark_out_dir(Path(path).parent, [Path(path).name])
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(fig)

def arm_label(res, gm, tex=True):
    """A row's method: its gamma under the focal weight, else the rival's name (results.json's config)."""
    rival = res.get("config", {}).get("weighting", "focal")
    return ("$\\gamma$" if tex else "γ") + f"={gm:g}" if rival == "focal" else rival

def plot_fig2(res, path):
    import matplotlib.pyplot as plt
    runs, steps = res["runs"], res["steps"]
    Ns = sorted({r["N"] for r in runs})
    gammas = sorted({r["gamma"] for r in runs})
    mean = lambda key, n, gm: np.mean([r[key] for r in runs if r["N"] == n and r["gamma"] == gm], axis=0)
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    shown = [n for n in (2, 256, 8192, 131072) if n in Ns] or Ns[:: max(1, len(Ns) // 4)]
    for k, key in enumerate(("Q_pos", "M_ret")):
        for j, n in enumerate(shown):
            for gm in gammas:
                ax[k].plot(steps, mean(key, n, gm), color=f"C{j}", ls="-" if gm == 0 else "--",
                           label=f"N={n}, {arm_label(res, gm)}")
        ax[k].set(xlabel="step", ylabel=key, title=f"({'ab'[k]}) {key} vs step")
    ax[1].legend(fontsize=7)
    for gm in gammas:
        for key, marker, color in (("M_ret", "o", "C3"), ("Q_pos", "s", "C0")):
            ax[2].plot(Ns, [mean(f"{key}_final", n, gm) for n in Ns], marker + ("-" if gm == 0 else "--"), color=color,
                       label=f"{key}, {arm_label(res, gm)}")
    # The paper's regimes, where it places them (Sec. 5.1, Fig. 2(c)): the data are drawn over them, not fitted to them.
    ax[2].axvspan(ZONE[0] / 1.4, ZONE[1] * 1.4, color="0.88", zorder=0)
    for x, label in ((SMALL / 2, "I"), (np.sqrt(ZONE[0] * ZONE[1]), "II"), (ZONE[1] * 8, "III")):
        ax[2].text(x, 0.72, label, ha="center", fontsize=16, color="0.4", transform=ax[2].get_xaxis_transform())
    ax[2].set(xscale="log", xlabel="group size N", ylim=(0, 1.05), title=f"(c) after {steps[-1]} steps")
    ax[2].legend(fontsize=7, loc="center", bbox_to_anchor=(0.5, 0.45))
    save(fig, path)

def plot_fig3(path):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    N = np.arange(1, 513)
    for k, mu in enumerate((0.8, 0.5, 0.2)):
        for j, rho in enumerate((0.01, 0.05, 0.1, 0.2)):
            ax[k].plot(N, tail_miss_probability(mu, rho * mu, N), color=f"C{j}", label=f"$\\rho$={rho}")
            n_star, peak = tail_miss_argmax(mu, rho * mu, n_max=512)
            ax[k].plot(n_star, peak, "*", color=f"C{j}", ms=12)
        ax[k].set(xscale="log", xlabel="group size N", title=f"$\\mu_{{pos}}$ = {mu}")
    ax[0].set_ylabel("Pr(tail miss), Lemma 3.1")
    ax[0].legend()
    save(fig, path)

def plot_fig5(path, mu=0.64, tau=6.3e-5):
    """Lemma 3.1 at the simulation's starting point: Q_pos = 0.64, tau = one non-anchor correct action."""
    import matplotlib.pyplot as plt
    N = 2 ** np.arange(18)
    P = tail_miss_probability(mu, tau, N)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(N, P, "o-")
    ax.annotate(f"{P[-1]:.1e}", (N[-1], P[-1]), textcoords="offset points", xytext=(-10, 8), ha="right")
    ax.set(xscale="log", xlabel="group size N", ylabel="Pr(tail miss)",
           title=f"Lemma 3.1 at $\\mu_{{pos}}$={mu}, $\\tau$={tau:g} (Fig. 5)")
    save(fig, path)

def table(res):
    runs = res["runs"]
    gammas = sorted({r["gamma"] for r in runs})
    lines = ["| N | " + " | ".join(f"Q_pos {arm_label(res, g, False)} | M_ret {arm_label(res, g, False)}"
                                   for g in gammas) + " |",
             "|---" * (1 + 2 * len(gammas)) + "|"]
    for n in sorted({r["N"] for r in runs}):
        values = [[r[key] for r in runs if r["N"] == n and r["gamma"] == gm]
                  for gm in gammas for key in ("Q_pos_final", "M_ret_final")]
        lines.append(f"| {n} | " + " | ".join(f"{np.mean(v):.3f} ± {np.std(v):.3f}" for v in values) + " |")
    return "\n".join(lines)

def main(cfg):
    out = Path(cfg.out_dir)
    remove_temp(out, OUTPUTS)                    # what a killed run left under our temp names
    if cfg.plot_only:
        if not (out / "results.json").exists():
            refuse(f"--plot_only: no {out / 'results.json'}; run without --plot_only first")
        try:
            res = json.loads((out / "results.json").read_text())
            check(isinstance(res, dict) and res["runs"] and {"N", "gamma", "Q_pos", "M_ret"} <= set(res["runs"][0])
                  and isinstance(res["steps"], list), "")
        except (ValueError, KeyError, TypeError, IndexError):
            refuse(f"--plot_only: {out / 'results.json'} is not a whole results file of simulate.py; run "
                   "without --plot_only to write it again")
    else:
        t0 = time.perf_counter()
        runs, cpu, steps = simulate(cfg)
        timing = {"wall_s": round(time.perf_counter() - t0, 2), **{f"{k}_cpu_s": round(v, 2) for k, v in cpu.items()}}
        res = dict(config=dataclasses.asdict(cfg), code=code_hashes(), steps=steps, timing=timing, runs=runs)
        if cfg.surrogate == "distinct":                                       # Eq. 5 is the distinct reading
            res["one_step"] = one_step_check(cfg, STUDY_NS, draws=ONE_STEP_DRAWS)
        atomic_write_json(out / "results.json", res)
        mark_out_dir(out, ["results.json"])
        print("timing: " + " | ".join(f"{k} {v}" for k, v in timing.items()))
    print(table(res))
    Ns, gammas = {r["N"] for r in res["runs"]}, {r["gamma"] for r in res["runs"]}
    if {0.0, 1.0} <= gammas and min(Ns) <= SMALL < ZONE[1] < max(Ns) and any(ZONE[0] <= n <= ZONE[1] for n in Ns):
        q0 = res["runs"][0]["Q_pos"][0]                 # from the run itself: --plot_only has no other config
        claims = judge_claims([r for r in res["runs"] if r["gamma"] in (0, 1)], q0)
        print("\nThe paper's claims (Sec. 5.1), this run:\n" + claims_table([("this run", claims)]))
    if "one_step" in res:
        print(f"\nThe first step from pi_0, mean over {ONE_STEP_DRAWS} batches:")
        print(one_step_table(res["one_step"], cfg))
    plot_fig2(res, out / "fig2.png")
    plot_fig3(out / "fig3.png")
    plot_fig5(out / "fig5.png")
    print(f"wrote {out}/results.json, fig2.png, fig3.png, fig5.png")

if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
