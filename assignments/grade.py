"""
Grade a copy of this repository: the implementation problems (assignments/problems.py) by running
the grading tests against DIR's advantage.py, and, given --runs, the machine-checkable part of the
experiment problems of assignments/HANDOUT.md from the files the runs wrote.

    python assignments/grade.py                          # this repository (the reference: full points)
    python assignments/grade.py /tmp/fgrpo_student       # a student copy
    python assignments/grade.py /tmp/fgrpo_student --runs /tmp/fgrpo_student   # + the experiments

Prints the points of each problem (a problem scores when all its tests pass) with the first line of
each failure, and ends with `total: X / Y`. The tests are this folder's assignments/tests and
expected.json, whatever DIR holds there; they run in a subprocess with DIR as the working directory
and first on sys.path, so `import advantage` is DIR's file. --runs ROOT is the folder the handout's
commands ran in (out/class/g0_s0 etc. are looked up under it); plots and sentences are graded by hand.
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from problems import PROBLEMS  # noqa: E402

TESTS = HERE / "tests"


# -----------------------------------------------------------------------------
# Implementation problems: pytest in a subprocess, outcomes read from its junit XML

def limit_memory(gb):
    """A cap on the test process's address space: a pass@k that enumerates all k-subsets then fails
    with MemoryError in seconds, instead of filling the grading machine's memory until the timeout."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (gb << 30, gb << 30))


def run_pytest(copy, files, timeout, memory_gb=4):
    """{problem id: [(test name, failure message or None)]} for the given test files, run on `copy`."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
               "--rootdir", str(TESTS), "--confcutdir", str(TESTS), f"--junitxml={xml}", *map(str, files)]
        env = {**os.environ, "PYTHONPATH": str(copy), "FGRPO_GRADE_DIR": str(copy),
               "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=limit_memory(memory_gb))
        if not xml.exists():
            raise RuntimeError(f"pytest wrote no report (exit {proc.returncode}):\n"
                               f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        results = {}
        for case in ET.parse(xml).iter("testcase"):
            # classname "test_policy_loss" (a test) or "" with name "test_policy_loss" (collection error)
            module = (case.get("classname") or case.get("name", "")).split(".")[-1]
            bad = next((c for c in case if c.tag in ("failure", "error")), None)
            skipped = next((c for c in case if c.tag == "skipped"), None)
            message = None
            if bad is not None:
                message = (bad.get("message") or bad.text or bad.tag).strip().splitlines()[0][:200]
            elif skipped is not None:                  # a graded test that did not run earns nothing
                message = f"skipped: {skipped.get('message', '')}"[:200]
            results.setdefault(module.removeprefix("test_"), []).append((case.get("name"), message))
        return results


def grade_problems(copy, timeout):
    """[(problem id, points earned, points, description, [(test, message)])]."""
    files = [TESTS / f"test_{pid}.py" for pid, *_ in PROBLEMS]
    try:
        results = run_pytest(copy, files, timeout)
    except subprocess.TimeoutExpired:                  # find the slow problem: one file at a time
        results = {}
        for pid, f in zip([p for p, *_ in PROBLEMS], files):
            try:
                results.update(run_pytest(copy, [f], timeout=max(30, timeout // 4)))
            except subprocess.TimeoutExpired:
                results[pid] = [("(all)", "timed out: a function of this problem is far too slow")]
    rows = []
    for pid, points, _, about in PROBLEMS:
        tests = results.get(pid, [("(all)", "no test ran: see the pytest output with "
                                            f"python -m pytest -q assignments/tests/test_{pid}.py")])
        ok = all(m is None for _, m in tests)
        rows.append((pid, points if ok else 0, points, about, tests))
    return rows


# -----------------------------------------------------------------------------
# Experiment problems: what the files written by train.py, evaluate.py and simulate.py can show.
# Each check returns a list of what is wrong (empty: passed).

def read_json(path):
    try:
        return json.loads(Path(path).read_text()), None
    except (OSError, ValueError) as e:
        return None, f"{path}: {'missing' if isinstance(e, FileNotFoundError) else f'unreadable ({e})'}"


def finite_numbers(obj):
    """Every number inside obj is finite (json reads NaN and Infinity as floats)."""
    if isinstance(obj, dict):
        return all(finite_numbers(v) for v in obj.values())
    if isinstance(obj, list):
        return all(finite_numbers(v) for v in obj)
    return not isinstance(obj, float) or math.isfinite(obj)


def differs(got, want):
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    return got != want


def check_run(root, run, steps, world=None, last=(), **config):
    """train.py's out_dir: run.json's config has these values, metrics.jsonl every step 1..steps,
    every logged number finite, and the last line holds the keys in `last`."""
    d = Path(root) / run
    info, err = read_json(d / "run.json")
    if err:
        return [err]
    wrong = [f"{run}: --{k} {info['config'].get(k)!r}, required {v!r}" for k, v in
             {"steps": steps, **config}.items() if differs(info["config"].get(k), v)]
    if world is not None and info.get("world") != world:
        wrong.append(f"{run}: world size {info.get('world')}, required {world}")
    try:
        lines = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        return wrong + [f"{run}/metrics.jsonl: {e}"]
    done = {m.get("step") for m in lines}
    if done != set(range(1, steps + 1)):
        wrong.append(f"{run}: metrics.jsonl has {len(done)} of the {steps} steps (last {max(done, default=0)})")
    if not all(finite_numbers(m) for m in lines):
        wrong.append(f"{run}: metrics.jsonl holds NaN or inf")
    missing = [k for k in last if lines and k not in lines[-1]]
    if missing:
        wrong.append(f"{run}: the last step logged no {', '.join(missing)}")
    return wrong


def check_eval(root, path, benchmark, n, problems=None):
    """evaluate.py's result JSON: the benchmark finished with n samples per problem, pass@k finite."""
    r, err = read_json(Path(root) / path)
    if err:
        return [err]
    b = r.get("benchmarks", {}).get(benchmark)
    if not isinstance(b, dict) or "pass@k" not in b or benchmark in r.get("pending", []):
        return [f"{path}: no finished result for {benchmark}"]
    wrong = [] if b.get("n") == n else [f"{path}: {benchmark} has n = {b.get('n')}, required {n}"]
    if problems is not None and len(b.get("c", [])) != problems:
        wrong.append(f"{path}: {benchmark} has {len(b.get('c', []))} problems, required {problems}")
    if not finite_numbers(b["pass@k"]):
        wrong.append(f"{path}: {benchmark} pass@k holds NaN or inf")
    return wrong


def check_file(root, path, keys=()):
    """A file exists (a JSON one holding `keys`)."""
    p = Path(root) / path
    if not p.is_file():
        return [f"{path}: missing"]
    if keys:
        r, err = read_json(p)
        if err or not all(k in r for k in keys):
            return [err or f"{path}: lacks {', '.join(k for k in keys if k not in r)}"]
    return []


def check_simulation(root, path, steps, gammas, group_sizes, seeds):
    """simulate.py's results.json: the required sweep, every (N, gamma, seed) run, finite finals."""
    r, err = read_json(Path(root) / path / "results.json")
    if err:
        return [err]
    cfg = r.get("config", {})
    want = {"steps": steps, "gammas": list(gammas), "group_sizes": list(group_sizes), "seeds": seeds}
    wrong = [f"{path}: --{k} {cfg.get(k)}, required {v}" for k, v in want.items() if cfg.get(k) != v]
    runs = r.get("runs", [])
    if len(runs) != len(gammas) * len(group_sizes) * seeds:
        wrong.append(f"{path}: {len(runs)} runs, required {len(gammas) * len(group_sizes) * seeds}")
    if not all(finite_numbers([x.get("Q_pos_final"), x.get("M_ret_final")]) and "M_ret_final" in x for x in runs):
        wrong.append(f"{path}: a run has no finite final Q_pos / M_ret")
    return wrong + check_file(root, f"{path}/fig2.png")


def check_lemma(root, path):
    """The student's Lemma 3.1 table {"mu,rho": [N*, peak]} against the stored reference values."""
    r, err = read_json(Path(root) / path)
    if err:
        return [err]
    ref = json.loads((HERE / "expected.json").read_text())["tail_miss"]["argmax"]
    wrong = []
    for c in ref:
        key = f"{c['mu_pos']},{c['rho']}"
        got = r.get(key)
        if not (isinstance(got, list) and len(got) == 2 and got[0] == c["out"][0]
                and isinstance(got[1], (int, float)) and abs(got[1] - c["out"][1]) < 1e-3):
            wrong.append(f"{path}: {key} is {got}, not N* = {c['out'][0]} with {c['out'][1]:.3f}")
    return wrong[:3]


CLASS = dict(task="maze", lr=1e-4, prompts_per_step=32, mini_batch_prompts=32, group_size=8,
             eval_mazes=128, eval_samples=64)                        # README's 15-minute version
PASSK = ("eval/strict/pass@1", "eval/strict/pass@64")                # logged at the last step
TABLE1 = dict(task="math", loss="grpo", group_size=8, prompts_per_step=256, mini_batch_prompts=64, lr=1e-6)
G = ("0", "0.5")                   # gamma as the handout's shell loops spell it in folder names


def each(check, items):
    """One check over several (args, kwargs): passes when all pass."""
    return lambda root: sum((check(root, *a, **k) for a, k in items), [])


# (id, title, [(points, check(root) -> what is wrong)]); the ids and points are those of HANDOUT.md.
EXPERIMENTS = [
    ("E1", "categorical simulation (Sec. 5.1)",
     [(2, lambda root: check_simulation(root, "out/simulate", 1000, (0.0, 1.0), [2 ** k for k in range(1, 18)], 4))]),
    ("E2", "Lemma 3.1 table", [(1, lambda root: check_lemma(root, "out/lemma.json"))]),
    ("E3", "7x7 maze, GRPO vs F-GRPO (class run)",
     [(1, lambda root: check_eval(root, "out/class/sft_eval.json", "maze", 64, 128)),
      (2, each(check_run, [((f"out/class/g{g}_s{s}", 80), dict(CLASS, gamma=float(g), seed=s, last=PASSK))
                           for g in G for s in (0, 1)]))]),
    ("A1", "ablation: gamma sweep",
     [(1, each(check_run, [((f"out/ablate/gamma{g}", 80), dict(CLASS, gamma=float(g), seed=0, last=PASSK))
                           for g in ("0.25", "1", "2")]))]),
    ("A2", "ablation: group size N",
     [(1, each(check_run, [((f"out/ablate/N{n}_g{g}", 80), dict(CLASS, group_size=n, gamma=float(g), seed=0,
                                                                last=PASSK)) for n in (4, 16) for g in G]))]),
    ("A3", "ablation: no std normalisation",
     [(1, each(check_run, [((f"out/ablate/nostd_g{g}", 80), dict(CLASS, gamma=float(g), seed=0, norm_std=False,
                                                                 last=PASSK)) for g in G]))]),
    ("A4", "ablation: loss aggregation",
     [(1, each(check_run, [((f"out/ablate/agg_{a}", 80), dict(CLASS, gamma=0.0, seed=0, loss_agg=a, last=PASSK))
                           for a in ("seq-mean-token-mean", "seq-mean-token-sum-norm")]))]),
    ("A5", "ablation: pass@k at large k",
     [(1, each(check_eval, [((f"out/passk/{m}.json", "maze", 1024, 32), {}) for m in ("sft", "grpo", "fgrpo")]))]),
    ("G1", "one GPU: 17x17 maze",
     [(1, lambda root: check_file(root, "out/maze17/sft/sft.json")),
      (1, each(check_run, [((f"out/maze17/g{g}", 1000), dict(task="maze", group_size=8, prompts_per_step=256,
                                                             gamma=float(g), last=PASSK)) for g in G])),
      (1, lambda root: each(check_eval, [((f"out/maze17/g{g}.json", "maze", 256, 256), {}) for g in G])(root)
       + check_file(root, "out/maze17/cmp.json", ("tests",)))]),
    ("G2", "one GPU: a small LLM",
     [(1, each(check_run, [((f"out/llm/g{g}", 150), dict(task="math", group_size=8, prompts_per_step=64,
                                                         mini_batch_prompts=16, gamma=float(g))) for g in G])),
      (1, lambda root: each(check_eval, [((f"out/llm/g{g}.json", "math500", 64), {}) for g in G])(root)
       + check_file(root, "out/llm/cmp.json", ("tests",)))]),
    ("T1", "8xH100 node: one Table 1 row",
     [(2, each(check_run, [(("out/grpo", 1530), dict(TABLE1, world=8, gamma=0.0)),
                           (("out/fgrpo", 1530), dict(TABLE1, world=8, gamma=0.5))])),
      (1, lambda root: each(check_file, [((f"runs/eval/{a}/selection.json", ("best", "n")), {})
                                         for a in ("grpo", "fgrpo")])(root)
       + check_file(root, "runs/eval/cmp_grpo.json", ("tests",)) + check_file(root, "runs/eval/table1_grpo.md"))]),
]


def grade_experiments(root):
    """[(id, title, points earned, points, [what is wrong])]."""
    rows = []
    for eid, title, checks in EXPERIMENTS:
        earned, total, wrong = 0.0, 0.0, []
        for points, check in checks:
            w = check(root)
            earned, total, wrong = earned + (0 if w else points), total + points, wrong + w
        rows.append((eid, title, earned, total, wrong))
    return rows


# -----------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", default=str(HERE.parent), help="the copy to grade (default: this repository)")
    p.add_argument("--runs", default="", help="folder the handout's commands ran in: also grade the experiments")
    p.add_argument("--json", default="", help="also write the scores to this file")
    p.add_argument("--timeout", type=int, default=300, help="seconds for all the grading tests together")
    args = p.parse_args()
    copy = Path(args.dir).resolve()
    if not (copy / "advantage.py").is_file():
        print(f"error: {copy} has no advantage.py; pass the folder of a copy", file=sys.stderr)
        sys.exit(2)

    rows = grade_problems(copy, args.timeout)
    print(f"implementation problems ({copy}):")
    for i, (pid, earned, points, about, tests) in enumerate(rows, 1):
        passed = sum(m is None for _, m in tests)
        print(f"  {i:2d}. {pid:17s} {earned:g} / {points}   {passed}/{len(tests)} tests   {about}")
        failed = {}                                    # one line per distinct message (stubs: one line)
        for name, message in tests:
            if message is not None:
                failed.setdefault(message, []).append(name)
        for message, names in failed.items():
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            print(f"        FAIL {names[0]}{more}: {message}")
    earned, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    report = {"problems": {r[0]: {"points": r[1], "max": r[2], "tests": len(r[4]),
                                  "passed": sum(m is None for _, m in r[4]), "failed": [t for t, m in r[4] if m]}
                           for r in rows},
              "implementation": [earned, total]}
    if args.runs:
        print(f"experiment problems, machine-checked part ({args.runs}; plots and sentences are graded by hand):")
        exp = grade_experiments(Path(args.runs))
        for eid, title, e, t, wrong in exp:
            print(f"  {eid:3s} {title:40s} {e:g} / {t:g}")
            for w in wrong[:4]:
                print(f"        {w}")
        e_sum, t_sum = sum(r[2] for r in exp), sum(r[3] for r in exp)
        print(f"experiments: {e_sum:g} / {t_sum:g}")
        report["experiments"] = {r[0]: {"points": r[2], "max": r[3], "wrong": r[4]} for r in exp}
        earned, total = earned + e_sum, total + t_sum
    report["total"] = [earned, total]
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"total: {earned:g} / {total:g}")


if __name__ == "__main__":
    main()
