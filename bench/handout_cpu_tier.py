"""
Measure the handout's CPU tier in a student copy, as a student runs it: a fresh copy with the reference's
graded files in place, the commands of E1, E2 and E3 taken verbatim from assignments/HANDOUT.md and timed
one statement at a time, then a teacher's grading of that copy (hidden checks of --seed), and again with
--runs (E1-E3 checked: each E3 run's first two steps replayed, its last evaluation redone from its model). Writes
--out (results/course/cpu_tier.json): the figures HANDOUT.md states, which tests/test_assignments.py holds it to.

    python bench/handout_cpu_tier.py            # about 14 minutes on 2 idle cores; nothing else running

The E3 numbers are the reference's printed pass@k (held-out strict, %, step 80, mean ± sd over 2 runs).
"""
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "assignments"))
from fgrpo_utils.cli import parse_config  # noqa: E402
from problems import GRADED_FILES  # noqa: E402

HANDOUT = ROOT / "assignments" / "HANDOUT.md"
KS = ("1", "8", "64")                          # the pass@k the handout quotes


@dataclass
class Config:
    out: str = str(ROOT / "results" / "course" / "cpu_tier.json")      # the JSON to write
    seed: int = 11                     # seed of the hidden checks of the timed grading


def cpu_tier_blocks(text=None):
    """The ```bash blocks of the handout's CPU tier, in order (E1, E2, E3), each as its top-level
    statements: continuation lines joined, a for loop kept whole to its `done`."""
    text = text or HANDOUT.read_text()
    part = text[text.index("### CPU tier"):text.index("### Ablations")]
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", part, re.S):
        statements, depth, current = [], 0, ""
        for line in block.replace("\\\n", " ").splitlines():
            current += line + "\n"
            first = (line.split() or [""])[0]              # a shell loop opens and closes a line
            depth += (first in ("for", "while")) - (first == "done")
            if depth == 0 and current.strip():
                statements.append(current.strip())
                current = ""
        blocks.append(statements)
    return blocks


def run_timed(cmd, cwd, env):
    t = time.monotonic()
    subprocess.run(["bash", "-euc", cmd], cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    return round(time.monotonic() - t, 1)


def solved_copy(dst):
    subprocess.run([sys.executable, ROOT / "assignments" / "make_student_copy.py", dst], check=True, capture_output=True)
    for rel in GRADED_FILES:
        (dst / rel).write_text(subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True,
                                              text=True, check=True).stdout)


def e3_table(copy):
    """The reference's E3 numbers: warm start and each arm's pass@1/8/64 at the last step, % (mean, sd)."""
    sft = json.loads((copy / "out/class/sft_eval.json").read_text())["benchmarks"]["maze"]["pass@k_strict"]
    out = {"warm start": [round(100 * sft[k], 1) for k in KS]}
    for arm, g in (("GRPO", "0"), ("F-GRPO", "0.5")):
        last = [json.loads((copy / f"out/class/g{g}_s{s}/metrics.jsonl").read_text().splitlines()[-1]) for s in (0, 1)]
        out[arm] = [[round(100 * statistics.mean(m[f"eval/strict/pass@{k}"] for m in last), 1),
                     round(100 * statistics.stdev(m[f"eval/strict/pass@{k}"] for m in last), 1)] for k in KS]
    return out


def main(args):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}   # `python` is this one
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy"
        solved_copy(copy)
        (e1,), (e2,), (sft, sft_eval, runs, compare) = cpu_tier_blocks()
        seconds = {"E1": run_timed(e1, copy, env), "E2": run_timed(e2, copy, env)}
        for name, cmd in (("E3 SFT", sft), ("E3 warm start evaluation", sft_eval), ("E3 runs", runs),
                          ("E3 comparison", compare)):
            seconds[name] = run_timed(cmd, copy, env)
        grade = f"{sys.executable} {ROOT / 'assignments' / 'grade.py'} {copy} --seed {args.seed}"
        seconds["grading a correct hand-in"] = run_timed(grade, ROOT, env)
        # --runs: each E3 run's first two steps replayed and its last evaluation redone from its model (grade.check_run)
        seconds["grading it with --runs (E1-E3)"] = run_timed(f"{grade} --runs {copy} --json {tmp}/g.json", ROOT, env)
        report = json.loads((Path(tmp) / "g.json").read_text())
        result = {"written_by": "bench/handout_cpu_tier.py", "date": time.strftime("%Y-%m-%d"),
                  "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                  "seconds": seconds, "E3": e3_table(copy),
                  "checked": {e: report["experiments"][e] for e in ("E1", "E2", "E3")}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
