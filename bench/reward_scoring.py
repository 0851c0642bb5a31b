"""
Benchmark: the batch Scorer (process pool + (gold, answer) cache) against naive per-sample math-verify
(parse the gold, parse the whole completion, verify: what a plain reward function does), on the
workload of one evaluation: 1,024 completions for each of 100 MATH500 problems.

    python bench/reward_scoring.py                          # ~1-2 min on 2 cores
    python bench/reward_scoring.py --naive_samples 0        # time naive on all 102,400 (slow)
    python bench/reward_scoring.py --train_steps 5          # one rank's share of a training step, 5 steps

--train_steps S times what train.py's reward phase does on one rank of 8 at the paper's batch: 256 prompts
x 8 rollouts / 8 ranks = 256 completions a step, each --train_chars long (~8k tokens), every step new
problems, the pool warm (it lives across steps), for 0, 1 and --workers worker processes.

Completions are synthesised from MATH500's reference solutions: the solution text with its final
box replaced by an answer drawn from a skewed distribution per problem, as sampled models repeat
themselves: the gold in a few equivalent spellings, ~10 wrong answers near it, a few unboxed or
truncated outputs. Naive timing runs on a random subsample and is extrapolated (printed as such).
Goal: Scorer >= 10x faster.
"""
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reward  # noqa: E402
from fgrpo_utils.cli import check_min, data_dir, parse_config  # noqa: E402


@dataclass
class Config:
    problems: int = 100            # MATH-500 problems timed
    samples: int = 1024            # completions per problem
    naive_samples: int = 3000      # naive per-sample math-verify on this many (0 = all), extrapolated
    workers: int = 2               # math-verify worker processes (reward.py's pool)
    prompts_per_call: int = 8      # completions are scored in batches as evaluate.py does
    seed: int = 0                  # the synthetic completions' draws
    train_steps: int = 0           # > 0: time one rank's reward phase of this many training steps instead
    train_chars: int = 24000       # characters of a training completion (~8k tokens at ~3 chars a token)

    def __post_init__(self):
        check_min(self, 1, "problems", "samples", "prompts_per_call")
        check_min(self, 0, "naive_samples", "workers", "seed", "train_steps")
        check_min(self, 1, "train_chars")


def variants(gold, rng):
    """Equivalent spellings of the gold, and wrong answers near it."""
    right = [gold, f"{gold} ", f"\\displaystyle {gold}"]
    if re.fullmatch(r"-?\d+", gold):
        g = int(gold)
        right += [f"{g}.0", f"\\text{{{g}}}"]
        wrong = [str(g + d) for d in (-2, -1, 1, 2, 10)] + [str(2 * g), str(-g), str(g * g), str(rng.randint(0, 999))]
    else:
        wrong = [f"{gold}+1", f"2({gold})", f"-({gold})", f"\\frac{{1}}{{{gold}}}", "0", "1", str(rng.randint(2, 99))]
    return right, wrong


def synthesise(row, n, rng):
    body = re.sub(r"\\boxed\{", "", row["solution"])[:2000]      # reasoning text, its box removed
    right, wrong = variants(row["answer"], rng)
    p_correct = rng.choice([0.02, 0.2, 0.5, 0.8, 0.95])           # easy and hard problems
    out = []
    for _ in range(n):
        u = rng.random()
        if u < 0.03:
            out.append(body[: rng.randint(0, len(body))])          # truncated, no answer
        elif u < 0.05:
            out.append(body + f"\nThe answer is {rng.choice(right + wrong)}.")
        elif rng.random() < p_correct:
            out.append(body + f"\nSo the final answer is $\\boxed{{{rng.choice(right)}}}$.")
        else:   # wrong answers repeat with a skewed (Zipf-like) frequency
            w = wrong[min(int(rng.paretovariate(1.2)) - 1, len(wrong) - 1)]
            out.append(body + f"\nTherefore, the answer is $\\boxed{{{w}}}$.")
    return out


def naive(completion, gold):
    from math_verify import parse, verify
    return verify(parse("\\boxed{" + gold + "}"), parse(completion))


def train_step_times(cfg, rng):
    """Seconds of Scorer.score for one rank's 256 completions a step (32 prompts x 8), per worker count."""
    rows = reward.load_jsonl(data_dir() / "eval" / "math500.jsonl")
    for workers in sorted({0, 1, cfg.workers}):
        times = []
        with reward.Scorer(workers=workers) as scorer:
            scorer.score(["\\boxed{1}"], ["1"])                     # the pool starts once per run, not per step
            for step in range(cfg.train_steps):
                picked = rng.sample(rows, 32)
                comps = [(c * (cfg.train_chars // max(len(c), 1) + 1))[-cfg.train_chars:]
                         for r in picked for c in synthesise(r, 8, rng)]
                golds = [r["answer"] for r in picked for _ in range(8)]
                t = time.perf_counter()
                scorer.score(comps, golds)
                times.append(time.perf_counter() - t)
        times.sort()
        print(f"train step, {workers} workers: {times[len(times) // 2]:.2f} s median for 256 completions of "
              f"{cfg.train_chars:,} chars (min {times[0]:.2f}, max {times[-1]:.2f}, {len(times)} steps)")


def main(cfg):
    rng = random.Random(cfg.seed)
    if cfg.train_steps:
        return train_step_times(cfg, rng)
    rows = reward.load_jsonl(data_dir() / "eval" / "math500.jsonl")[: cfg.problems]
    comps = [synthesise(r, cfg.samples, rng) for r in rows]
    flat = [(c, r["answer"]) for r, cs in zip(rows, comps) for c in cs]
    print(f"{len(rows)} problems x {cfg.samples} completions = {len(flat):,}, "
          f"{sum(len(c) for c, _ in flat) / len(flat):.0f} chars on average")

    t0 = time.perf_counter()
    with reward.Scorer(workers=cfg.workers) as scorer:
        rewards, totals = [], {}
        for s in range(0, len(rows), cfg.prompts_per_call):
            batch = [x for cs, r in zip(comps[s:s + cfg.prompts_per_call], rows[s:s + cfg.prompts_per_call]) for x in cs]
            golds = [r["answer"] for r in rows[s:s + cfg.prompts_per_call] for _ in range(cfg.samples)]
            rw, st = scorer.score(batch, golds)
            rewards += rw
            totals = {k: totals.get(k, 0) + v for k, v in st.items()}
        distinct = len(scorer.cache)
    t_batch = time.perf_counter() - t0
    print(f"Scorer ({cfg.workers} workers, pool start included): {t_batch:.1f} s, {distinct:,} distinct (gold, answer) "
          f"pairs verified, accuracy {sum(rewards) / len(rewards):.3f}, {totals}")

    idx = list(range(len(flat))) if cfg.naive_samples == 0 else rng.sample(range(len(flat)), min(cfg.naive_samples, len(flat)))
    t0 = time.perf_counter()
    agree = sum(naive(*flat[i]) == bool(rewards[i]) for i in idx)
    t_naive_sub = time.perf_counter() - t0
    t_naive = t_naive_sub * len(flat) / len(idx)
    how = "measured" if len(idx) == len(flat) else f"extrapolated from {len(idx):,} samples ({t_naive_sub:.1f} s)"
    print(f"naive per-sample math-verify (1 process): {t_naive:.1f} s, {how}; agrees with Scorer on "
          f"{agree / len(idx):.1%} of them")
    print(f"speed-up: {t_naive / t_batch:.1f}x")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
