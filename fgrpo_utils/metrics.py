"""
What one RL step logs: rl_step's StepResult becomes one row of metrics.jsonl (step_metrics; every key is
in DESIGN.md, "Logged metrics"), each mean over the global batch, and the phases' wall clock (Stopwatch).
"""
import time
from dataclasses import dataclass

import torch

from fgrpo_utils.distributed import all_max, all_sum

class Stopwatch:
    """Wall-clock seconds per phase of one step, logged as time/NAME: lap(name) ends a phase."""

    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.seconds = {}

    def lap(self, name):
        now = time.perf_counter()
        self.seconds[name], self.last = now - self.last, now

    def done(self, **more):
        """The laps, then `more` (seconds timed elsewhere), then the whole step as "step"."""
        return {**self.seconds, **more, "step": time.perf_counter() - self.start}

@dataclass
class StepResult:
    """What one RL step produced on this rank: the inputs of step_metrics."""
    step: int                 # 1-based, as logged
    R: torch.Tensor           # (P, N) rewards
    A_pre: torch.Tensor       # (P, N) advantages before the focal weight (Eq. 3)
    A: torch.Tensor           # (P, N) advantages the update used (Eq. 13, or DS-GRPO)
    g: torch.Tensor           # (P,) focal weight (Eq. 12)
    rollouts: object          # rollout.Rollouts: token ids, engine log-probs, finish reasons
    old_logp: list            # per completion, the trainer's log-probs under pi_old (None: skipped)
    reward_stats: dict        # task.score's counts, logged as reward/NAME
    update_stats: dict        # update_minibatch's metrics, averaged over mini-batches (ratio/max: max)
    grad_norms: list          # pre-clip, one per optimizer step
    lr: float
    seconds: dict             # wall-clock per phase, logged as time/NAME

def step_metrics(r):
    """This step's metrics; collective: counts summed over ranks, then divided, so means are global."""
    R, A_pre, A, g = r.R, r.A_pre, r.A, r.g
    mixed = R.std(1) > 0                                                  # (P,) groups with signal
    lens = torch.tensor([len(c) for c in r.rollouts.token_ids], dtype=torch.float64)
    gap = torch.cat([(torch.tensor(e) - o).abs() for e, o in zip(r.rollouts.engine_logp, r.old_logp)
                     if o is not None] or [torch.zeros(0)])        # skipped groups have no trainer logp
    sums = {"groups": R.shape[0], "rollouts": R.numel(), "reward": R.sum(),
            "all_correct": (R.min(1).values >= 1).sum(),
            "all_wrong": (R.max(1).values <= 0).sum(), "g": g.sum(), "g_mixed": g[mixed].sum(),
            "mixed": mixed.sum(), "adv_pre": A_pre.abs().sum(), "adv_post": A.abs().sum(),
            "tokens": lens.sum(), "trunc": sum(f == "length" for f in r.rollouts.finish_reason),
            "gap": gap.sum(), "gap_n": gap.numel(), **r.reward_stats}
    s = dict(zip(sums, all_sum([float(v) for v in sums.values()]).tolist()))
    len_max, gap_max = all_max([lens.max(), gap.max() if gap.numel() else 0.0]).tolist()
    n = s["rollouts"]
    metrics = {"step": r.step, "reward/mean": s["reward"] / n,
               "groups/all_correct": s["all_correct"] / s["groups"], "groups/all_wrong": s["all_wrong"] / s["groups"],
               "focal/g_mean": s["g"] / s["groups"],
               "adv/abs_mean_pre": s["adv_pre"] / n, "adv/abs_mean_post": s["adv_post"] / n,
               "len/mean": s["tokens"] / n, "len/max": len_max, "trunc/frac": s["trunc"] / n,
               "logp/diff_abs_mean": s["gap"] / max(s["gap_n"], 1), "logp/diff_max": gap_max,
               "grad_norm": sum(r.grad_norms) / len(r.grad_norms), "lr": r.lr, "tokens": s["tokens"]}
    if s["mixed"]:                    # a mean over no groups is undefined; 0 would drag run averages down
        metrics["focal/g_mean_mixed"] = s["g_mixed"] / s["mixed"]
    metrics.update({f"reward/{k}": s[k] for k in r.reward_stats})
    metrics.update(r.update_stats)
    metrics.update({f"time/{k}": v for k, v in r.seconds.items()})
    metrics.update({"tok_per_s": s["tokens"] / r.seconds["step"],
                    "tok_per_s/rollout": s["tokens"] / r.seconds["rollout"]})
    return metrics
