"""
Grade a class as a teacher would, and time it: ten hand-ins (the reference's graded files, two correct
alternatives, the fresh copy's stubs, four with one mistake each, two attacks with the stubs left in)
graded by assignments/grade.py, --parallel at a time, each in its own sandbox, the hidden checks of one
seed. Prints each hand-in's total beside the one it must get, each grading's seconds and the wall time,
and writes them to --out (results/course/class_grading.json, which HANDOUT.md quotes); exit 1 if any
total is not the one it must be.

    python bench/grade_class.py --parallel 2 --seed 11          # about 6 minutes on 2 idle cores

The expected totals follow from the problems' points (assignments/problems.py): a mistake costs its own
problem's points only. Timing is the machine's: run it on an idle one, and read the wall time against
--parallel 1 on the same machine.
"""
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "assignments"))
from fgrpo_utils.cli import check, parse_config  # noqa: E402
from problems import GRADED_FILES, PROBLEMS  # noqa: E402



@dataclass
class Config:
    parallel: int = 2                  # hand-ins graded at once (1 .. 16)
    seed: int = 11                     # seed of the hidden checks, one for the class
    out: str = str(ROOT / "results" / "course" / "class_grading.json")   # the JSON to write

    def __post_init__(self):
        check(1 <= self.parallel <= 16, f"--parallel {self.parallel}: must be 1 .. 16")


POINTS = {pid: points for pid, points, _, _ in PROBLEMS}
FULL = sum(POINTS.values())

# (file, the reference's line, its replacement) for each hand-in that edits the reference; the problems it loses
EDITS = {
    "alternative: cross_entropy log-probs": ([("fgrpo_utils/logprob.py",
        'logp = logits.log_softmax(-1).gather(-1, batch["targets"][..., None]).squeeze(-1)',
        'logp = -F.cross_entropy(logits.flatten(0, -2), batch["targets"].flatten(), reduction="none")'
        '.view(batch["targets"].shape)')], set()),
    "alternative: world from torch.distributed": ([("train.py", "(loss * world).backward()",
                                                    "(loss * dist.get_world_size()).backward()")], set()),
    "mistake: biased std": ([("advantage.py", "adv = adv / (R.std(dim=1, keepdim=True) + eps)",
                              "adv = adv / (R.std(dim=1, keepdim=True, correction=0) + eps)")], {"group_advantages"}),
    "mistake: KL always token-mean": ([("train.py", "loss = loss + cfg.kl_coef * aggregate(kl, mask, **agg)",
                                        "loss = loss + cfg.kl_coef * token_mean(kl, mask, n_tok)")], {"update"}),
    "mistake: reference forward with grad": ([("train.py", "            with torch.no_grad():\n                ref_logp, _ =",
                                               "            if True:\n                ref_logp, _ =")], {"update"}),
    "mistake: k3 sign": ([("advantage.py", "return (torch.exp(d) - d - 1)", "return (d - torch.exp(d) + 1)")], {"kl_k3"}),
}
ATTACKS = {   # appended to the stubs' advantage.py: each must score 0
    "attack: the reference on its paths": """
import os, sys, pathlib
for _p in list(set(sys.path) | {os.getcwd(), *os.environ.values()}):
    for _q in [pathlib.Path(_p), *pathlib.Path(_p).parents]:
        _f = _q / "advantage.py"
        if _f.is_file() and "NotImplementedError" not in _f.read_text():
            exec(_f.read_text(), globals())
""",
    "attack: a fork bomb at import": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
}


def git_text(rel):
    return subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def build_class(tmp):
    """{hand-in folder: the total it must get}: the graded files of each hand-in, nothing else."""
    copy = tmp / "copy"
    subprocess.run([sys.executable, ROOT / "assignments" / "make_student_copy.py", copy], check=True,
                   capture_output=True)
    ref = {rel: git_text(rel) for rel in GRADED_FILES}
    stubs = {rel: (copy / rel).read_text() for rel in GRADED_FILES}
    hand_ins = {"reference": (ref, FULL), "fresh copy (stubs)": (stubs, 0)}
    for name, (edits, loses) in EDITS.items():
        files = dict(ref)
        for rel, old, new in edits:
            assert files[rel].count(old) == 1, f"{name}: {rel} no longer has {old!r}"
            files[rel] = files[rel].replace(old, new)
        hand_ins[name] = (files, FULL - sum(POINTS[p] for p in loses))
    for name, code in ATTACKS.items():
        hand_ins[name] = ({**stubs, "advantage.py": stubs["advantage.py"] + code}, 0)
    out = {}
    for i, (name, (files, total)) in enumerate(hand_ins.items()):
        d = tmp / f"student{i:02d}"
        for rel, text in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
        out[d] = (name, total)
    shutil.rmtree(copy)
    return out


def grade(d, seed):
    t = time.monotonic()
    r = subprocess.run([sys.executable, ROOT / "assignments" / "grade.py", d, "--json", d / "grade.json",
                        "--seed", str(seed)], capture_output=True, text=True)
    last = (r.stdout.strip().splitlines() or [""])[-1]
    total = json.loads((d / "grade.json").read_text())["total"][0] if (d / "grade.json").exists() else None
    return total, last, time.monotonic() - t


def main(args):
    with tempfile.TemporaryDirectory() as tmp:
        hand_ins = build_class(Path(tmp))
        start = time.monotonic()
        with ThreadPoolExecutor(args.parallel) as pool:
            results = dict(zip(hand_ins, pool.map(lambda d: grade(d, args.seed), hand_ins)))
        wall = time.monotonic() - start
    wrong = 0
    print("| hand-in | must get | got | last line | seconds |\n|---|---|---|---|---|")
    for d, (name, want) in hand_ins.items():
        total, last, secs = results[d]
        wrong += total != want or last != f"total: {want} / {FULL}"
        print(f"| {name} | {want} | {total} | `{last}` | {secs:.0f} |")
    print(f"\n{len(hand_ins)} hand-ins, {args.parallel} at a time: {wall:.0f} s wall "
          f"({wall / len(hand_ins):.0f} s a hand-in); {wrong} graded wrong")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "written_by": "bench/grade_class.py", "date": time.strftime("%Y-%m-%d"), "parallel": args.parallel,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "seed": args.seed,
        "wall_s": round(wall), "graded_wrong": wrong,
        "hand_ins": [{"name": name, "must_get": want, "got": results[d][0], "seconds": round(results[d][2])}
                     for d, (name, want) in hand_ins.items()]}, indent=1) + "\n")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
