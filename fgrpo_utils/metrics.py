"""
What one RL step logs: step_metrics turns rl_step's StepResult into a row of metrics.jsonl (each key in DESIGN.md,
"Logged metrics"; means over the global batch), Stopwatch times the phases, log_line prints a row as one line.
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
    return {**metrics, **{f"reward/{k}": s[k] for k in r.reward_stats}, **r.update_stats,
            **{f"time/{k}": v for k, v in r.seconds.items()},
            "tok_per_s": s["tokens"] / r.seconds["step"], "tok_per_s/rollout": s["tokens"] / r.seconds["rollout"]}

def log_line(m, steps):
    """The one grep-able line a step prints: m, step_metrics' row (and its evaluation's), of `steps` in all."""
    line = (f"step {m['step']}/{steps} | reward {m['reward/mean']:.3f} | g {m['focal/g_mean']:.2f} "
            f"| |A| {m['adv/abs_mean_post']:.3f} | zero_std {m['groups/all_correct']:.2f}/"
            f"{m['groups/all_wrong']:.2f} | clip {m.get('clip/low', m.get('cispo/at_lo', 0)):.3f}/"
            f"{m.get('clip/high', m.get('cispo/at_hi', 0)):.3f} | ent {m['entropy']:.3f} "
            f"| len {m['len/mean']:.0f} | trunc {m['trunc/frac']:.2f} | dlogp {m['logp/diff_abs_mean']:.1e} "
            f"| gnorm {m['grad_norm']:.3f} | sync {m['time/weight_sync']:.2f}s | dt {m['time/step']:.1f}s")
    evals = [k for k in m if k.startswith("eval/") and k.endswith("/pass@1")]
    if evals:
        line += " | eval pass@1 " + " ".join(f"{k.split('/')[1]} {m[k]:.3f}" for k in evals)
    return line
