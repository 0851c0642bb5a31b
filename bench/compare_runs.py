"""
Do two groups of train.py runs learn alike? Built to check that `--engine vllm` reproduces the
PyTorch engine's maze learning curve (issue 6), usable for any A/B of runs made with --seed 0..S-1.

    python bench/compare_runs.py --a "out/curves/torch_s*" --b "out/curves/vllm_s*"

Each run directory holds train.py's metrics.jsonl. A run is the independent unit: once two runs'
samples differ their policies drift apart for many steps, so steps of one run are not independent
draws. We reduce each run to one number (its mean training reward over all steps, and over the
last 10) and compare the groups' means with a Welch standard error: |B - A| < 2 SE reads "agree".
The last logged held-out pass@k under the runs' own reward rule (train.py's --eval_every, every k
logged) is compared the same way. It is also the class version of the maze experiment (README):

    python bench/compare_runs.py --a "out/class/g0_s*" --b "out/class/g0.5_s*"     # GRPO vs F-GRPO

The runs are paired by what they are, read from their run.json, never by their folder names: refused in
one line are a run in both groups (overlapping globs: "g0*" also matches "g0.5_s0"), one run twice (a
copied folder: the same flags and seed), a group whose runs differ in more than the seed (and the flags a
resume may change), and groups of another task or maze. A killed run's cut last line is dropped.
"""
import glob
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))             # maze_converge, beside it
from fgrpo_utils.cli import check_min, parse_config, refuse  # noqa: E402
from fgrpo_utils.outputs import Damaged, read_json  # noqa: E402
from fgrpo_utils.run_folder import RESUME_MAY_CHANGE  # noqa: E402
from maze_converge import read_jsonl  # noqa: E402

SAME_FOR_BOTH = ("task", "maze_size", "maze_reward", "data", "group_size", "prompts_per_step")   # or no A/B


@dataclass
class Config:
    a: str = "out/curves/torch_s*"     # glob of run directories, group A
    b: str = "out/curves/vllm_s*"      # glob of run directories, group B
    bin: int = 5                       # steps per bin in the printed curve

    def __post_init__(self):
        check_min(self, 1, "bin")


def load(pattern, flag):
    """{folder: (config, metrics)} of the runs `pattern` matches; refused in one line: a folder without
    run.json, a run with no logged step, two copies of one run, runs that differ in more than the seed."""
    runs, seen = {}, {}
    for d in sorted(glob.glob(pattern)):
        f = Path(d) / "metrics.jsonl"
        if not f.exists():
            continue
        if not (Path(d) / "run.json").is_file():
            refuse(f"--{flag} matches {d}: a metrics.jsonl without run.json, so nothing says what run it is")
        config, metrics = read_json(Path(d) / "run.json", ["config"])["config"], read_jsonl(f)
        if not metrics or any("reward/mean" not in m for m in metrics):
            refuse(f"--{flag} matches {d}: {'no step logged' if not metrics else 'a row without reward/mean'} in {f}")
        key = json.dumps({k: v for k, v in sorted(config.items()) if k not in RESUME_MAY_CHANGE})
        if key in seen:
            refuse(f"--{flag}: {seen[key]} and {d} are one run (the same flags and seed): a copy counts once")
        seen[key] = d
        runs[d] = (config, metrics)
    if not runs:
        refuse(f"no run directory with a metrics.jsonl matches --{flag} {pattern!r}")
    differ = sorted({k for c, _ in runs.values() for k in c if k not in RESUME_MAY_CHANGE + ("seed",)
                     and len({json.dumps(c2.get(k)) for c2, _ in runs.values()}) > 1})
    if differ:
        refuse(f"--{flag} {pattern!r} mixes runs of other settings ({', '.join(differ)}): a group differs by seed only")
    return runs


def mean(xs):
    return sum(xs) / len(xs)


def sd(xs):
    return math.sqrt(sum((x - mean(xs)) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")


def compare(name, a, b):
    d = mean(b) - mean(a)
    if min(len(a), len(b)) < 2:                  # a spread needs two runs: no SE, so no verdict
        print(f"{name:28s} A {mean(a):.3f}  B {mean(b):.3f}  B - A {d:+.3f}, one run per arm: no SE")
        return
    head = f"{name:28s} A {mean(a):.3f} ± {sd(a):.3f}  B {mean(b):.3f} ± {sd(b):.3f}  (sd over runs)  B - A {d:+.3f}"
    se = math.sqrt(sd(a) ** 2 / len(a) + sd(b) ** 2 / len(b))
    print(f"{head}, SE {se:.3f}: {'agree' if abs(d) < 2 * se else 'DIFFER'} at 2 SE")


def heldout_pass1(metrics):
    """The key of the held-out pass@1 under the run's own reward rule (logged first), or None."""
    return next((k for k in metrics if k.startswith("eval/") and k.endswith("/pass@1")), None)


def main(cfg):
    try:
        groups = {"A": load(cfg.a, "a"), "B": load(cfg.b, "b")}
    except Damaged as e:
        refuse(e)
    both = sorted(set(groups["A"]) & set(groups["B"]))
    if both:
        refuse(f"--a and --b both match {', '.join(both)}: a run belongs to one group (narrow the globs)")
    ca, cb = (next(iter(groups[g].values()))[0] for g in "AB")
    other = [k for k in SAME_FOR_BOTH if ca.get(k) != cb.get(k)]
    if other:
        refuse(f"--a and --b are runs of another {', '.join(other)} ({', '.join(f'{ca.get(k)} vs {cb.get(k)}' for k in other)})")
    print("A and B differ in " + (", ".join(f"{k} {ca.get(k)} vs {cb.get(k)}" for k in sorted(set(ca) | set(cb))
          if k not in ("out_dir", "seed", "resume", "steps") and ca.get(k) != cb.get(k)) or "nothing but the seed"))
    groups = {g: {d: m for d, (_, m) in runs.items()} for g, runs in groups.items()}
    T = min(len(m) for runs in groups.values() for m in runs.values())      # common number of steps
    reward = {g: [[m[t]["reward/mean"] for t in range(T)] for m in runs.values()] for g, runs in groups.items()}
    print(f"A: {len(groups['A'])} runs ({cfg.a}), B: {len(groups['B'])} runs ({cfg.b}), first {T} steps")
    print(f"training reward, mean over runs, bins of {cfg.bin} steps:")
    for g, curves in reward.items():
        bins = [mean([c[t] for c in curves for t in range(s, min(s + cfg.bin, T))]) for s in range(0, T, cfg.bin)]
        print(f"  {g}  " + " ".join(f"{x:.3f}" for x in bins))
    compare("mean reward, all steps", *[[mean(c) for c in reward[g]] for g in "AB"])
    compare("mean reward, last 10 steps", *[[mean(c[-10:]) for c in reward[g]] for g in "AB"])
    evals = {g: [[m for m in run[:T] if heldout_pass1(m)][-1:] for run in runs.values()] for g, runs in groups.items()}
    if all(e for g in "AB" for e in evals[g]):
        last = evals["A"][0][0]
        rule = heldout_pass1(last).split("/")[1]                 # the training rule: its pass@k, every k logged
        for key in [k for k in last if k.startswith(f"eval/{rule}/pass@")]:
            compare(f"held-out {rule} {key.split('/')[-1]} (last)", *[[e[0][key] for e in evals[g]] for g in "AB"])
    for g, runs in groups.items():
        ms = [m for run in runs.values() for m in run[:T]]
        print(f"  {g}: max |logp engine - trainer| {max(m['logp/diff_max'] for m in ms):.1e}, "
              f"rollout {mean([m['time/rollout'] for m in ms]):.2f}s, "
              f"weight sync {mean([m['time/weight_sync'] for m in ms]):.3f}s per step")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
