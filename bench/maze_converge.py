"""
Table 4 at convergence: train one maze arm until it has converged by a rule fixed before any run
was looked at (RULE below, the same for every arm), evaluate it, and copy its small outputs into
the results folder that bench/maze_report.py rebuilds the tables and figures from.

    python maze.py --size 7 --steps 600 --lr 1e-3 --out_dir out/maze7_sft         # the warm start
    python bench/maze_converge.py --gamma 0.5 --seed 0                             # one arm, N = 8
    python bench/maze_converge.py --weighting passk --passk_k 4 --seed 0           # a rival (advantage.py)
    python bench/maze_report.py --runs "results/maze7/runs/*" --evals results/maze7/evals \\
        --sft results/maze7/evals/sft.json --sft_again results/maze7/evals/sft_seed1.json \\
        --table results/maze7/table.md --figure figures/maze7_curves.png

The run is train.py in chunks of --chunk steps (`--steps s --resume true`: the lr is constant and every
sample is seeded by (seed, step, prompt), so the chunks train exactly the steps of one long run).
After each chunk from --min_steps on, RULE reads the held-out evaluations train.py logged
(--eval_mazes mazes x --eval_samples samples every --eval_every steps) and the run stops at the
first s where it holds, or at --max_steps. Then evaluate.py scores out_dir/final on 256 held-out
mazes x --n samples into --results/evals. run.json and metrics.jsonl are copied to --results/runs after
every chunk, so a run still going is reported too (never a checkpoint). Rerunning the same command
continues where a killed one stopped. A results folder is one block: one warm start, whose sha256 the
first run writes to --results/warm_start.json, and a run from any other warm start is refused there.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fgrpo_utils.cli import check, check_min, parse_config, refuse  # noqa: E402
from fgrpo_utils.outputs import Damaged, atomic_write_json, read_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RULE = ("converged at step s: the mean held-out pass@1 over the evaluations in (3s/4, s] is within "
        "1 point of the mean over (s/2, 3s/4], or pass@64 - pass@1 < 2 points at the last two evaluations")
STAMP = "warm_start.json"         # in --results: the sha256 of the block's warm start (warm_start_id)


@dataclass
class Config:
    gamma: float = 0.0                    # focal exponent of the arm (train.py --gamma); 0 = GRPO
    weighting: str = "focal"              # train.py --weighting: focal (by --gamma) | maxrl | passk | wreinforce
    passk_k: int = 4                      # --weighting passk: k
    unlikely_beta: float = 0.0            # train.py --unlikely_beta (any weighting); 0 = off
    seed: int = 0                         # train.py --seed
    group_size: int = 8                   # N (train.py --group_size)
    model: str = "out/maze7_sft"          # maze.py's warm start
    out: str = "out/maze7"                # train.py's run folders (checkpoints stay here)
    results: str = "results/maze7"        # runs/NAME/{run.json,metrics.jsonl} and evals/NAME.json, committed
    chunk: int = 500                      # steps between checks of RULE
    min_steps: int = 1000                 # the first check
    max_steps: int = 4000                 # the cap: a run not converged by then is reported as such
    eval_every: int = 100                 # train.py's held-out evaluation, which RULE reads, every K steps
    eval_mazes: int = 128                 # of this many mazes
    eval_samples: int = 64                # x this many samples (RULE reads pass@64)
    n: int = 128                          # the final evaluation's samples per maze (256 mazes)
    threads: int = 1                      # CPU threads of train.py and evaluate.py

    def __post_init__(self):
        check_min(self, 1, "chunk", "min_steps", "max_steps", "eval_every", "eval_mazes", "n", "threads", "group_size")
        check_min(self, 0, "gamma", "seed")
        check(self.weighting in ("focal", "maxrl", "passk", "wreinforce"), f"--weighting {self.weighting}: expected "
              "focal, maxrl, passk or wreinforce")
        check(self.weighting == "focal" or self.gamma == 0, f"--gamma {self.gamma}: only --weighting focal reads it")
        check(1 <= self.passk_k <= self.group_size, f"--passk_k {self.passk_k}: must be in [1, --group_size]")
        check(0 <= self.unlikely_beta <= 1, f"--unlikely_beta {self.unlikely_beta}: must be in [0, 1]")
        check(self.eval_samples >= 64, f"--eval_samples {self.eval_samples}: RULE reads pass@64, so at least 64")
        check(self.chunk % self.eval_every == 0 and self.min_steps % self.chunk == 0
              and self.max_steps % self.chunk == 0, "--chunk must be a multiple of --eval_every, and --min_steps "
              "and --max_steps multiples of --chunk (RULE is checked at evaluated steps)")
        check(Path(self.model, "sft.json").is_file(), f"--model {self.model}: no sft.json (run maze.py first)")
        for flag in ("results", "out"):                    # folders: a file there failed after a chunk's training
            check(not Path(getattr(self, flag)).exists() or Path(getattr(self, flag)).is_dir(),
                  f"--{flag} {getattr(self, flag)}: a file, not a folder")
        stamp = Path(self.results, STAMP)                  # a block: one warm start and the arms trained from it
        if stamp.is_file():
            check(read_json(stamp, ["sha256"])["sha256"] == warm_start_id(self.model), f"--model {self.model} is "
                  f"not the warm start of --results {self.results} (sha256 differs from its {stamp.name}); use "
                  "another --results")
        else:
            check(not any(Path(self.results, "runs").glob("*")), f"--results {self.results} holds runs but no "
                  f"{stamp.name}, so which warm start they share is unknown; use another --results")


def warm_start_id(model):
    """sha256 of the warm start's weights. The same maze.py command gives another warm start on another
    kind of CPU (float rounding, amplified by 600 steps), so a block records which one its runs share."""
    h = hashlib.sha256()
    for f in sorted(Path(model).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


COLLAPSE = 0.02                   # RULE's collapse: pass@64 - pass@1 under 2 points


def evaluations(metrics, rule="strict"):
    """(step, pass@1, pass@64) of each held-out evaluation in train.py's metrics."""
    return [(m["step"], m[f"eval/{rule}/pass@1"], m[f"eval/{rule}/pass@64"]) for m in metrics
            if f"eval/{rule}/pass@64" in m]


def converged(metrics, rule="strict"):
    """RULE on train.py's metrics (rows with eval/RULE/pass@k), at the last evaluated step s."""
    ev = evaluations(metrics, rule)
    if len(ev) < 3:
        return False
    s = ev[-1][0]
    late = [p1 for t, p1, _ in ev if 3 * s / 4 < t <= s]
    mid = [p1 for t, p1, _ in ev if s / 2 < t <= 3 * s / 4]
    plateau = bool(late and mid) and abs(sum(late) / len(late) - sum(mid) / len(mid)) < 0.01
    collapsed = all(p64 - p1 < COLLAPSE for _, p1, p64 in ev[-2:])
    return plateau or collapsed


def stop_step(metrics, chunk=Config.chunk, min_steps=Config.min_steps, max_steps=Config.max_steps):
    """The step at which main stopped (or would stop) a run with these metrics: the first checked step
    where RULE holds, "cap" at max_steps, or None if the run has not got that far yet."""
    for s in range(min_steps, max_steps + 1, chunk):
        if max((m["step"] for m in metrics), default=0) < s:
            return None
        if converged([m for m in metrics if m["step"] <= s]):
            return s
    return "cap"


def read_jsonl(path):
    """The rows of a JSON-lines log (train.py's metrics.jsonl). A cut last line, what a kill mid-write
    leaves, is dropped, as train.py's resume drops it; a bad line before the last is Damaged."""
    try:
        lines = Path(path).read_text().splitlines()
    except UnicodeDecodeError as e:
        raise Damaged(f"damaged: {path} ({type(e).__name__})") from None
    rows = []
    for i, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                if i == len(lines):
                    break
                raise Damaged(f"damaged: {path}:{i} (not a JSON line)") from None
    return rows


def read_metrics(run):
    """train.py's metrics.jsonl of `run`, a cut last line (a killed write) dropped as train.py's resume does."""
    f = run / "metrics.jsonl"
    return read_jsonl(f) if f.is_file() else []


def arm(cfg):
    """(the run's name, train.py's flags of its weighting): N8_g0.5_s0 for F-GRPO as before; a rival's
    N8_maxrl_s0, N8_passk4_s0; the unlikeliness reward adds _u0.25 (N8_g0_u0.25_s0 on GRPO)."""
    if cfg.weighting == "focal":
        label, flags = f"g{cfg.gamma:g}", ["--gamma", str(cfg.gamma)]
    else:
        label = cfg.weighting + (str(cfg.passk_k) if cfg.weighting == "passk" else "")
        flags = ["--weighting", cfg.weighting] + (["--passk_k", str(cfg.passk_k)] if cfg.weighting == "passk" else [])
    if cfg.unlikely_beta:
        label, flags = f"{label}_u{cfg.unlikely_beta:g}", flags + ["--unlikely_beta", str(cfg.unlikely_beta)]
    return f"N{cfg.group_size}_{label}_s{cfg.seed}", flags


def main(cfg):
    name, weighting = arm(cfg)
    run, results = Path(cfg.out) / name, Path(cfg.results)
    train = [sys.executable, str(ROOT / "train.py"), "--task", "maze", "--model", cfg.model, "--device", "cpu",
             "--threads", str(cfg.threads), "--lr", "1e-4", "--group_size", str(cfg.group_size),
             "--prompts_per_step", "32", "--mini_batch_prompts", "32", "--warmup_steps", "0",
             "--micro_batch_size", "64", "--share_prompts", "true", "--eval_every", str(cfg.eval_every),
             "--eval_mazes", str(cfg.eval_mazes), "--eval_samples", str(cfg.eval_samples),
             "--save_every", "100", "--sample_every", "0", *weighting, "--seed", str(cfg.seed),
             "--out_dir", str(run)]
    print(f"{name}: {RULE}", flush=True)
    stamp = results / STAMP

    def train_to(s):          # then the outputs so far, so that a run still going is reported too
        r = subprocess.run(train + ["--steps", str(s), "--resume", str((run / "ckpt").is_dir()).lower()])
        if r.returncode:      # train.py said why, in one line; nothing of this call is written
            sys.exit(r.returncode)
        if not stamp.is_file():   # the block's warm start, once a run of it has trained
            results.mkdir(parents=True, exist_ok=True)
            atomic_write_json(stamp, {"model": cfg.model, "sha256": warm_start_id(cfg.model)})
        (results / "runs" / name).mkdir(parents=True, exist_ok=True)
        for f in ("run.json", "metrics.jsonl"):
            shutil.copy(run / f, results / "runs" / name / f)

    for s in range(cfg.chunk, cfg.max_steps + 1, cfg.chunk):
        if max((m["step"] for m in read_metrics(run)), default=0) < s:
            train_to(s)
        if s >= cfg.min_steps and converged([m for m in read_metrics(run) if m["step"] <= s]):
            print(f"{name}: converged at step {s}", flush=True)
            break
    else:
        print(f"{name}: not converged by the cap, step {cfg.max_steps}", flush=True)
    final = run / "final" / "progress.json"
    if not final.is_file() or read_json(final, ["step"])["step"] != s:   # killed before its export
        train_to(s)
    result = results / "evals" / f"{name}.json"
    if result.is_file():                   # evaluated by an earlier call
        return
    result.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", str(run / "final"), "--benchmarks",
                        "maze", "--n", str(cfg.n), "--out", str(result)], env={**os.environ, "OMP_NUM_THREADS": str(cfg.threads)})
    if r.returncode:
        sys.exit(r.returncode)


if __name__ == "__main__":
    try:
        main(parse_config(Config, doc=__doc__))
    except Damaged as e:               # a cut metrics.jsonl line mid-file, a damaged stamp or progress.json
        refuse(e)
