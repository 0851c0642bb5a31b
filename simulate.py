"""
Categorical simulation of F-GRPO (arXiv 2602.06717, Sec. 5.1 and App. J): Q_pos and M_ret against
the group size N, and the one-step theory behind it (Eq. 5, Hu et al. Eq. 17, Prop. 3.2, Lemma 3.1).

    python simulate.py                                  # full sweep (17 N x 2 gamma x 4 seeds x 1000 steps)
    python simulate.py --num_actions 1000 --num_correct 100 --steps 5 --group_sizes 2 8   # seconds
    python simulate.py --surrogate counts               # duplicates-counted reading (PAPER §10 row 18)
    python simulate.py --weight_decay 0                 # PAPER §10 row 17
    python simulate.py --plot_only true                 # redraw the figures from out/simulate/results.json

One softmax policy over num_actions actions. Actions 0 .. num_correct-1 are correct (R_c = +1), the
rest wrong (R_w = -1); action 0 is the anchor (logit 5), the other correct ones start at 3, wrong ones
at 0. Each step draws N actions, gives each the mean-only advantage R_a - mean R (no std), and takes
one AdamW step on the surrogate L = g/N * sum_{a in A u B} (R_a - mean R) p_a, linear in p, with
g = (1 - mu_hat)^gamma (Eq. 12). Writes results.json and fig2/fig3/fig5.png under --out_dir.

Why it is fast: the update depends on the N draws only through the per-action counts c, so we draw
c ~ Multinomial(N, p) directly and use the surrogate's gradient in closed form,
dL/dz_i = p_i (w_i - sum_j p_j w_j) with w = dL/dp (the softmax Jacobian), instead of N indices and
autograd. `naive_step` is the per-sample autograd version; tests and bench/simulate_step.py compare them.

Choices (PAPER §5 and §10 rows 17-18):
1) optimizer: AdamW, lr 1e-2, PyTorch defaults otherwise (weight decay 0.01); the paper says only
   "gradient ascent". We use the fused kernel: same update as the default one to float rounding.
2) surrogate: every DISTINCT sampled action once (A u B of Eq. 5), divided by N; --surrogate counts
   counts each draw (the simulation paragraph's formula).
3) sampler (exact): inverse CDF with sorted uniforms while N <= 2 num_actions (cost O(K + N log N)),
   numpy's conditional binomials above (cost O(K) whatever N), so a step never costs more than O(K).
4) seeds: the row (N, gamma, seed) draws from numpy's Generator seeded by (seed, N), shared by every
   gamma, so gamma = 0 and gamma = 1 see the same first batch (common random numbers).
5) float32 logits and Adam state, as PyTorch's default; the sampler's CDF is float64.
"""
import ctypes
import dataclasses
import json
import multiprocessing as mp
import os
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from queue import Empty

import numpy as np
import torch

from advantage import focal_weight, group_advantages, success_rate, tail_miss_argmax, tail_miss_probability
from common import atomic_write_json, check, parse_config


@dataclass
class Config:
    num_actions: int = 128_000     # |A|: actions 0 .. num_correct-1 are correct, action 0 the anchor
    num_correct: int = 10_000      # |A+|
    anchor_logit: float = 5.0      # initial logits, from Hu et al.; wrong actions start at 0
    correct_logit: float = 3.0
    r_correct: float = 1.0         # R_c
    r_wrong: float = -1.0          # R_w
    group_sizes: tuple[int, ...] = tuple(2 ** k for k in range(1, 18))    # N = 2 .. 131,072
    gammas: tuple[float, ...] = (0.0, 1.0)                                 # focal exponent, Eq. 12
    seeds: int = 4                 # how many seeds: seed, seed + 1, ..., seed + seeds - 1
    seed: int = 0                  # the first seed
    steps: int = 1000              # T, optimizer steps per configuration
    lr: float = 1e-2               # the paper's one change to Hu et al. (1e-3)
    weight_decay: float = 0.01     # PyTorch's AdamW default; 0 is the paper's CPU check
    surrogate: str = "distinct"    # "distinct": each sampled action once (Eq. 5) | "counts": once per draw
    log_every: int = 10            # stride (in steps) of the saved Q_pos and M_ret trajectories
    workers: int = 0               # processes; 0 = one per CPU core
    out_dir: str = "out/simulate"
    plot_only: bool = False        # redraw the figures from out_dir/results.json, simulate nothing

    def __post_init__(self):
        check(self.num_actions >= 2, "--num_actions must be >= 2")
        check(1 <= self.num_correct < self.num_actions, "--num_correct must be >= 1 and < --num_actions")
        check(self.r_correct > self.r_wrong, "--r_correct must be greater than --r_wrong")
        check(len(self.group_sizes) > 0 and min(self.group_sizes) >= 1, "--group_sizes: every N must be >= 1")
        check(len(set(self.group_sizes)) == len(self.group_sizes), "--group_sizes: repeated value")
        check(len(self.gammas) > 0 and min(self.gammas) >= 0, "--gammas: every gamma must be >= 0")
        check(len(set(self.gammas)) == len(self.gammas), "--gammas: repeated value")
        check(self.seeds >= 1, "--seeds must be >= 1 (it is a count)")
        check(self.seed >= 0, "--seed must be >= 0")
        check(self.steps >= 1, "--steps must be >= 1")
        check(self.lr > 0, "--lr must be > 0")
        check(self.weight_decay >= 0, "--weight_decay must be >= 0")
        check(self.surrogate in ("distinct", "counts"), "--surrogate must be 'distinct' or 'counts'")
        check(self.log_every >= 1, "--log_every must be >= 1")
        check(self.workers >= 0, "--workers must be >= 0")


# -----------------------------------------------------------------------------
# One-step theory (PAPER §4.2-4.3). The rewards R_c, R_w are whatever enters the surrogate: raw
# rewards as in Hu et al., or the simulation's centred R - mean R.

def batch_sums(p, correct, sampled, r_correct, r_wrong):
    """The sums of PAPER §2 for one batch. p (K,), correct (K,) bool, sampled (K,) counts or bool."""
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
    """First-order change of Q_pos, Hu et al. Eq. 17 (PAPER §4.2):
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
        # n i.i.d. draws by inverse CDF. Sorted uniforms make the binary searches walk the CDF in
        # order (~4x faster than random probes into a 1 MB array) and give sorted indices, whose runs
        # are the counts. Cost O(K + n log n): below n = 2K (measured) cheaper than the branch below.
        cdf = torch.cumsum(p, 0, dtype=torch.float64).numpy()             # (K,)
        u = np.sort(rng.random(n)) * cdf[-1]                               # (n,) sorted, in [0, sum p)
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


def surrogate_grad(p, idx, c, N, gamma, R, surrogate, r_correct, r_wrong):
    """Gradient of the loss -g L w.r.t. the logits z, in closed form, for one row.

    L = 1/N sum_{a in A u B} (R_a - rbar) m_a p_a, m_a = 1 ("distinct") or c_a ("counts"), rbar the mean
    reward of the N draws. dL/dp is w_a on the sampled actions and 0 elsewhere, and through the softmax
    dL/dz_i = p_i (w_i - sum_j p_j w_j): one dense pass plus a scatter over the D sampled actions.
    p: (K,); idx, c: (D,) from sample_counts; R: (K,)  ->  (K,)
    """
    r = R[idx]                                                     # (D,) rewards of A u B
    rbar = (c * r).sum() / N                                       # mean reward of the N draws
    mu_hat = (rbar - r_wrong) / (r_correct - r_wrong)              # X / N, Eq. 11
    m = torch.ones_like(c) if surrogate == "distinct" else c       # (D,)
    w = focal_weight(mu_hat, gamma) / N * (r - rbar) * m           # (D,) dL/dp_a, advantage R_a - rbar
    pw = p[idx] * w                                                # (D,)
    grad = p * pw.sum()                                            # (K,) -dL/dz_i = p_i (sum_j p_j w_j - w_i)
    grad[idx] -= pw
    return grad


def metrics(p, p0_pos, num_correct):
    """Q_pos = sum_{A+} p and M_ret = 1 - sum_{A+} max(0, p0 - p) / sum_{A+} p0 (Eq. 26). p: (..., K)."""
    p_pos = p[..., :num_correct]                                    # (..., |A+|)
    M_ret = 1 - (p0_pos - p_pos).clamp(min=0).sum(-1) / p0_pos.sum()
    return p_pos.sum(-1), M_ret


def naive_step(z, opt, N, gamma, R, surrogate, a=None, generator=None):
    """Reference step: N sampled indices, the surrogate built per action, autograd. z: (K,) leaf.

    Follows PAPER §5's sketch line by line; `a` (N,) overrides the draw (tests feed both paths the
    same samples). Returns the indices used.
    """
    p = torch.softmax(z, 0)                                                          # (K,)
    if a is None:
        a = torch.multinomial(p.detach(), N, replacement=True, generator=generator)  # (N,)
    r = R[a]                                                                         # (N,)
    g = focal_weight(success_rate(r[None], R.max().item(), R.min().item())[0], gamma)
    if surrogate == "distinct":
        u = a.unique()                                              # A u B: distinct sampled actions
        L = ((R[u] - r.mean()) * p[u]).sum() / N
    else:
        L = (group_advantages(r[None], normalize_std=False)[0] * p[a]).sum() / N    # per draw
    opt.zero_grad()
    (-g * L).backward()                                             # AdamW minimises: ascend on g L
    opt.step()
    return a


def make_optimizer(z, cfg):
    # The fused CPU kernel does the whole update in one pass (~10x the default loop at this size).
    return torch.optim.AdamW([z], lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)


@contextmanager
def timed(tm, key):
    t0 = time.process_time()
    yield
    tm[key] += time.process_time() - t0


def run_rows(rows, cfg, progress=None):
    """Simulate the configurations `rows` = [(N, gamma, seed), ...] side by side.

    One (R, K) logit tensor and one AdamW: it is elementwise, so this equals R separate optimizers,
    and the fused kernel updates all rows in one pass. Softmax, sampling and gradient go row by row
    (each row has its own N), which also keeps temporaries at (K,): (R, K) ones cost more in page
    faults than in arithmetic. Returns the trajectories at the logged steps and CPU seconds per phase.
    """
    C = cfg.num_correct
    z0, R = initial_logits(cfg), reward_vector(cfg)
    p0_pos = torch.softmax(z0, 0)[:C]                                  # (|A+|,) pi_0 on A+
    z = z0.repeat(len(rows), 1).requires_grad_()                       # (R, K)
    z.grad = torch.zeros_like(z)
    opt = make_optimizer(z, cfg)
    rngs = [np.random.default_rng([seed, n]) for n, _, seed in rows]
    log = {"step": [], "Q_pos": [], "M_ret": []}
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
                    Q_pos, M_ret = metrics(p, p0_pos, C)
                    log["Q_pos"][-1].append(Q_pos.item())
                    log["M_ret"][-1].append(M_ret.item())
            if t == cfg.steps:
                continue
            with timed(tm, "sample"):
                idx, c = sample_counts(p, n, rngs[i])                         # (D,), (D,)
            with timed(tm, "grad"):
                z.grad[i] = surrogate_grad(p, idx, c, n, gamma, R, cfg.surrogate, cfg.r_correct, cfg.r_wrong)
        if t < cfg.steps:
            with timed(tm, "adamw"):
                opt.step()                                                    # all rows at once
            if progress:
                progress(len(rows))
    return rows, log, dict(tm)


def keep_freed_memory():
    """Ask glibc to keep freed blocks below 64 MB instead of unmapping them. Otherwise each step's
    ~1 MB temporaries (uniforms, indices, the CDF) come back as fresh pages, and at N = 131,072 the
    page faults cost about a third of the step. A no-op without glibc (macOS, musl)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 << 20)           # M_MMAP_THRESHOLD
        libc.mallopt(-1, 256 << 20)          # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _worker(args):
    rows, cfg, queue = args
    torch.set_num_threads(1)                 # one process per core; numpy's sampler is single-threaded
    keep_freed_memory()
    return run_rows(rows, cfg, progress=queue.put)


def simulate(cfg):
    """Run every (N, gamma, seed), split over worker processes; returns run_rows' output per worker."""
    from tqdm import tqdm
    rows = [(n, gm, s) for n in cfg.group_sizes for gm in cfg.gammas for s in range(cfg.seed, cfg.seed + cfg.seeds)]
    workers = min(cfg.workers or os.cpu_count(), len(rows))
    # Deal the rows out like cards, largest N first: a step costs more at large N (the sort), so
    # this keeps the workers' loads within one row of each other.
    chunks = [sorted(rows, reverse=True)[i::workers] for i in range(workers)]
    bar = tqdm(total=len(rows) * cfg.steps, unit="step", unit_scale=True, desc="simulate")
    if workers == 1:
        keep_freed_memory()
        out = [run_rows(chunks[0], cfg, progress=bar.update)]
    else:
        ctx = mp.get_context("spawn")        # no fork: torch's thread pools do not survive it
        with ctx.Manager() as manager, ctx.Pool(workers) as pool:
            queue = manager.Queue()
            job = pool.map_async(_worker, [(c, cfg, queue) for c in chunks])
            while not job.ready() or not queue.empty():
                try:
                    bar.update(queue.get(timeout=0.2))
                except Empty:
                    pass
            out = job.get()
    bar.close()
    return out


# -----------------------------------------------------------------------------
# Figures

def save(fig, path):
    """Write a figure atomically (a reader sees the old PNG or the new one) and close it."""
    import matplotlib.pyplot as plt
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    fig.tight_layout()
    fig.savefig(tmp, dpi=90, format="png")
    os.replace(tmp, path)
    plt.close(fig)


def concentration_zone(Ns, M_ret):
    """Regime II from the data: the N whose final M_ret (gamma = 0) lies below the midpoint of its range."""
    M_ret = np.asarray(M_ret)
    low = M_ret < (M_ret.min() + M_ret.max()) / 2
    idx = np.flatnonzero(low)
    return (Ns[idx[0]], Ns[idx[-1]]) if len(idx) else None


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
                           label=f"N={n}, $\\gamma$={gm:g}")
        ax[k].set(xlabel="step", ylabel=key, title=f"({'ab'[k]}) {key} vs step")
    ax[1].legend(fontsize=7)
    for gm in gammas:
        ls = "-" if gm == 0 else "--"
        ax[2].plot(Ns, [mean("M_ret_final", n, gm) for n in Ns], "o" + ls, color="C3", label=f"M_ret, $\\gamma$={gm:g}")
        ax[2].plot(Ns, [mean("Q_pos_final", n, gm) for n in Ns], "s" + ls, color="C0", label=f"Q_pos, $\\gamma$={gm:g}")
    zone = concentration_zone(Ns, [mean("M_ret_final", n, min(gammas)) for n in Ns])
    if zone:                              # shade half-way (in log N) to the neighbouring grid points
        ax[2].axvspan(zone[0] / 1.4, zone[1] * 1.4, color="0.88", zorder=0)
        for x, label in ((zone[0] / 2.5, "I"), (np.sqrt(zone[0] * zone[1]), "II"), (zone[1] * 2.5, "III")):
            ax[2].text(x, 0.3, label, ha="center", fontsize=16, color="0.4", transform=ax[2].get_xaxis_transform())
    ax[2].set(xscale="log", xlabel="group size N", ylim=(0, 1.05), title=f"(c) after {steps[-1]} steps")
    ax[2].legend(fontsize=7, loc="center")
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
    """Markdown table of final Q_pos and M_ret, mean +- std over seeds, one line per N."""
    runs = res["runs"]
    gammas = sorted({r["gamma"] for r in runs})
    lines = ["| N | " + " | ".join(f"Q_pos γ={g:g} | M_ret γ={g:g}" for g in gammas) + " |",
             "|---" * (1 + 2 * len(gammas)) + "|"]
    for n in sorted({r["N"] for r in runs}):
        cells = []
        for gm in gammas:
            for key in ("Q_pos_final", "M_ret_final"):
                v = [r[key] for r in runs if r["N"] == n and r["gamma"] == gm]
                cells.append(f"{np.mean(v):.3f} ± {np.std(v):.3f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------

def main(cfg):
    out = Path(cfg.out_dir)
    if cfg.plot_only:
        if not (out / "results.json").exists():
            raise SystemExit(f"error: --plot_only: no {out / 'results.json'}; run without --plot_only first")
        res = json.loads((out / "results.json").read_text())
    else:
        t0 = time.perf_counter()
        chunks = simulate(cfg)
        wall = time.perf_counter() - t0
        runs, timing = [], defaultdict(float)
        for rows, log, tm in chunks:
            for i, (n, gm, seed) in enumerate(rows):
                Q, M = [q[i] for q in log["Q_pos"]], [m[i] for m in log["M_ret"]]
                runs.append(dict(N=n, gamma=gm, seed=seed, Q_pos_final=Q[-1], M_ret_final=M[-1], Q_pos=Q, M_ret=M))
            for k, v in tm.items():
                timing[k] += v
        runs.sort(key=lambda r: (r["N"], r["gamma"], r["seed"]))
        timing = {"wall_s": round(wall, 2), **{f"{k}_cpu_s": round(v, 2) for k, v in timing.items()}}
        res = dict(config=dataclasses.asdict(cfg), steps=chunks[0][1]["step"], timing=timing, runs=runs)
        atomic_write_json(out / "results.json", res)
        print("timing: " + " | ".join(f"{k} {v}" for k, v in timing.items()))
    print(table(res))
    plot_fig2(res, out / "fig2.png")
    plot_fig3(out / "fig3.png")
    plot_fig5(out / "fig5.png")
    print(f"wrote {out}/results.json, fig2.png, fig3.png, fig5.png")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
