"""
One step of the categorical simulation at N = 131,072 (Sec. 5.1's largest group) on the paper's
128,000-action policy, two ways, in the same run:

  fast   simulate.py's path: counts c ~ Multinomial(N, p) drawn directly (sample_counts), the
         surrogate's gradient in closed form (surrogate_grad), fused AdamW.
  naive  the simulation as Sec. 5.1 / App. J describe it: torch.multinomial of N indices, the
         surrogate built over the distinct sampled actions, autograd backward, PyTorch's reference
         (non-fused) AdamW (naive_step).

    .venv/bin/python bench/simulate_step.py                          # prints both and the ratio
    .venv/bin/python bench/simulate_step.py --group_size 1024 --surrogate counts

Times are medians over --repeats steps from the initial state, wall clock and CPU (process) time;
CPU time is the fairer number when other jobs share the cores, so both are printed with the load.
"""
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import simulate as S  # noqa: E402
from advantage import focal_weight, group_advantages, success_rate  # noqa: E402
from fgrpo_utils.cli import check, check_choices, parse_config  # noqa: E402


@dataclass
class Config:
    group_size: int = 131_072      # N
    num_actions: int = 128_000     # |A|, as simulate.py
    num_correct: int = 10_000      # |A+|
    surrogate: str = "distinct"    # as simulate.py
    gamma: float = 0.0             # focal exponent, Eq. 12
    repeats: int = 20              # timed steps per path (after one warm-up step)
    threads: int = 1               # torch threads for both paths; the sweep runs one per worker

    @staticmethod
    def choices():
        """The flags with a fixed set of values: __post_init__ refuses any other, --help lists them."""
        return {"surrogate": S.Config.choices()["surrogate"]}

    def __post_init__(self):
        check(self.group_size >= 1, "--group_size must be >= 1")
        check(1 <= self.num_correct < self.num_actions, "--num_correct must be >= 1 and < --num_actions")
        check_choices(self)
        check(0 <= self.gamma < float("inf"), "--gamma must be >= 0 and finite")
        check(self.repeats >= 1, "--repeats must be >= 1")
        check(self.threads >= 1, "--threads must be >= 1")


def timed(step, repeats):
    """Median wall and CPU seconds of step(), after one untimed warm-up call."""
    step()
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return np.median(wall), np.median(cpu)


def naive_step(z, opt, N, gamma, R, surrogate, a=None, generator=None):
    """Reference step as Sec. 5.1 / App. J describe it: N sampled indices, the surrogate per action, autograd.
    z: (K,) leaf; `a` (N,) overrides the draw (tests feed both paths the same samples). Returns the indices."""
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


def main(cfg):
    torch.set_num_threads(cfg.threads)
    S.keep_freed_memory()                    # as the sweep's workers do; helps both paths
    sim = S.Config(num_actions=cfg.num_actions, num_correct=cfg.num_correct, surrogate=cfg.surrogate)
    N, R = cfg.group_size, S.reward_vector(sim)

    # fast path, split into its phases so we can say where a step goes
    z_fast = S.initial_logits(sim)[None].clone().requires_grad_()              # (1, K)
    z_fast.grad = torch.zeros_like(z_fast)
    opt_fast = S.make_optimizer(z_fast, sim)
    rng = np.random.default_rng(0)
    phases = {"softmax": [], "sample": [], "grad": [], "adamw": []}

    def fast_step():
        t = [time.process_time()]
        with torch.no_grad():
            p = torch.softmax(z_fast[0], 0)                                       # (K,)
        t.append(time.process_time())
        idx, c = S.sample_counts(p, N, rng)                                      # (D,), (D,)
        t.append(time.process_time())
        z_fast.grad[0] = S.surrogate_grad(p, idx, c, N, cfg.gamma, R, sim.surrogate, sim.r_correct, sim.r_wrong)
        t.append(time.process_time())
        opt_fast.step()
        t.append(time.process_time())
        for k, a, b in zip(phases, t, t[1:]):
            phases[k].append(b - a)

    # naive path
    z_naive = S.initial_logits(sim).requires_grad_()                            # (K,)
    opt_naive = S.make_optimizer(z_naive, sim, fused=False)                     # PyTorch's reference loop
    gen = torch.Generator().manual_seed(0)

    def reference_step():
        naive_step(z_naive, opt_naive, N, cfg.gamma, R, sim.surrogate, generator=gen)

    fast_wall, fast_cpu = timed(fast_step, cfg.repeats)
    naive_wall, naive_cpu = timed(reference_step, cfg.repeats)
    print(f"one step, N = {N:,}, {cfg.num_actions:,} actions, surrogate {cfg.surrogate}, "
          f"torch threads {cfg.threads}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"fast   {fast_wall * 1e3:7.2f} ms wall  {fast_cpu * 1e3:7.2f} ms cpu   ("
          + ", ".join(f"{k} {np.median(v) * 1e3:.2f}" for k, v in phases.items()) + " ms cpu)")
    print(f"naive  {naive_wall * 1e3:7.2f} ms wall  {naive_cpu * 1e3:7.2f} ms cpu")
    print(f"ratio  {naive_wall / fast_wall:.1f}x wall, {naive_cpu / fast_cpu:.1f}x cpu (goal >= 3x)")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
