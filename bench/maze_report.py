"""
The maze experiment's figure and table (RESULTS.md, "Maze RL on CPU"; the paper's Sec. 5.2, Fig. 7 and
Table 4), from train.py's run folders and evaluate.py's result files. Nothing is sampled here.

    python bench/maze_report.py --runs "out/maze_rl/N*" --evals runs/maze --sft runs/maze/sft.json

Every run folder (its run.json names N, the method and seed) gives a training curve: the training reward
(bins of --bin steps) and the held-out pass@1 and pass@64 that train.py logged every --eval_every
steps, under the run's own reward rule; step 0 is the SFT warm start, read from --sft with the same
estimator. Curves are the mean over seeds with a band from the lowest to the highest seed. Every
run with a final evaluation (EVALS/RUN.json, evaluate.py --benchmarks maze) gives a table row:
pass@1, pass@64 and pass@n per seed, the mean and its standard error over seeds, and for each seed
each method minus GRPO (and F-GRPO γ = 0.5) by the paired m-out-of-n test of evaluate.py (evaluation noise only). The early
drop is the SFT's pass@64 minus the lowest pass@64 a run logged in its first --early steps.
"Forget the rare", per maze: the held-out mazes are binned by how often the SFT warm start solved
them (its c/n, --sft_edges), and each arm's row gives, per bin, the share of mazes it still solves at
least once in n samples, and its mean per-maze pass@1 there. The warm start's own row is scored on
--sft_again, samples independent of those that binned the mazes (scored on the binning samples, its
"solved" would be 100% in every bin by construction). Every run found is reported: a run without a
final evaluation is listed as such. --runs and --evals may list several, comma-separated, the i-th
glob's evaluations in the i-th folder: a block's F-GRPO runs beside GRPO runs trained on to equal
steps in a folder of their own (bench/maze_converge.py --min_steps), say.

With --blocks, one table across blocks instead: a block is a results folder (runs/NAME/, evals/NAME.json,
evals/sft.json) of runs from one warm start, whose arms are paired by seed; the warm start itself
differs between blocks (maze.py's SFT does not reproduce bit for bit on another kind of CPU). Per block and
seed, each arm's pass@1 and pass@64 and its difference from GRPO; then the mean ± SE over all pairs.

    python bench/maze_report.py --blocks results/maze7,results/maze7_w2 --table results/maze7_blocks.md
"""
import dataclasses
import glob
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import evaluate  # noqa: E402
from maze_converge import COLLAPSE, STAMP, evaluations, read_jsonl, stop_step, warm_start_id  # noqa: E402
from advantage import pass_at_k_table, subsample_test  # noqa: E402
from fgrpo_utils.cli import check, check_min, parse_config, refuse  # noqa: E402
from fgrpo_utils.outputs import Damaged, check_out_file, png_metadata, read_json, write_table_out  # noqa: E402
from fgrpo_utils.run_folder import RESUME_MAY_CHANGE  # noqa: E402


SCRIPT = "bench/maze_report.py"      # the mark in its figure and table (outputs.is_ours)


@dataclass
class Config:
    runs: str = "out/maze_rl/N*"             # glob(s) of train.py run folders, comma-separated
    evals: str = "runs/maze"                 # folder(s) of evaluate.py results, RUN.json per run folder name
    sft: str = "runs/maze/sft.json"          # evaluate.py result of the SFT warm start (step 0)
    sft_again: str = "runs/maze/sft_seed1.json"  # the warm start evaluated again with another --seed (optional)
    figure: str = "figures/maze_curves.png"
    figure_n: str = ""                       # also Fig. 6: -log pass@K of the final policies against N (.png)
    table: str = "runs/maze/table4.md"
    bin: int = 10                            # steps per point of the training-reward curve
    early: int = 100                         # steps in which the early pass@64 drop is looked for
    last: int = 10                           # train.py evaluations averaged beside the final one
    m: int = 64                              # the paired test's subsample size (<= evaluate.py's n)
    iters: int = 20_000
    sft_edges: tuple[float, ...] = (0.05, 0.2, 0.5)  # upper edges of the bins of SFT success c/n
    blocks: str = ""                         # comma-separated results folders: the table across them instead

    def __post_init__(self):
        check_min(self, 1, "bin", "early", "last", "m", "iters")
        check(Path(self.figure).suffix == ".png" and Path(self.table).suffix == ".md",
              f"--figure {self.figure} / --table {self.table}: expected a .png and a .md")
        check_out_file(self.figure, "--figure", SCRIPT)        # replaced only if this script wrote it
        for b in filter(None, self.blocks.split(",")):
            check(Path(b, "runs").is_dir() and Path(b, "evals", "sft.json").is_file(),
                  f"--blocks {b}: expected a results folder with runs/ and evals/sft.json")
        check_out_file(self.table, "--table", SCRIPT)
        check(not self.figure_n or Path(self.figure_n).suffix == ".png", f"--figure_n {self.figure_n}: expected a .png")
        if self.figure_n:
            check_out_file(self.figure_n, "--figure_n", SCRIPT)
        e = self.sft_edges
        check(all(0 < x < 1 for x in e) and all(x < y for x, y in zip(e, e[1:])),
              f"--sft_edges {' '.join(map(str, e))}: must be increasing numbers inside (0, 1)")


def method(c):
    """The arm a run belongs to, from its run.json's flags (never its folder's name): (rank, parameter, label),
    sorted GRPO, F-GRPO by gamma, then the rivals (train.py --weighting, --unlikely_beta)."""
    w, beta = c.get("weighting", "focal"), float(c.get("unlikely_beta", 0.0))
    if w == "focal":
        gamma = float(c["gamma"])
        key = (0, 0.0, "GRPO") if gamma == 0 else (1, gamma, f"F-GRPO γ={gamma:g}")
    else:
        key = {"maxrl": (2, 0.0, "MaxRL"), "passk": (3, float(c.get("passk_k", 0)), f"pass@{c.get('passk_k')}"),
               "wreinforce": (4, float(c.get("wreinforce_lambda", 0)), f"W-REINFORCE λ={c.get('wreinforce_lambda')}")}[w]
    return key if not beta else (5 + key[0], beta, f"{key[2]} + unlikeliness β={beta:g}")


GRPO = (0, 0.0, "GRPO")                      # the arm every other is paired with by seed


def load_runs(cfg):
    """{(N, method): {seed: {"metrics": [...], "eval": result or None, "name": folder name, ...}}}. --runs
    may list globs and --evals folders, comma-separated: the i-th glob's evaluations are in the i-th
    folder (or the only one)."""
    runs, starts = defaultdict(dict), {}
    patterns, evals = cfg.runs.split(","), cfg.evals.split(",")
    for d, ev in sorted((Path(d), evals[i % len(evals)]) for i, p in enumerate(patterns) for d in glob.glob(p)):
        missing = [f for f in ("run.json", "metrics.jsonl") if not (d / f).is_file()]
        if missing:
            refuse(f"--runs matches {d}, which holds no {' or '.join(missing)}: not a train.py run folder, or one "
                   "that never logged a step; narrow the glob")
        c = read_json(d / "run.json", ["config"])["config"]
        metrics = read_jsonl(d / "metrics.jsonl")
        result = Path(ev) / f"{d.name}.json"
        arm = (c["group_size"], method(c))
        if c["seed"] in runs[arm]:
            refuse(f"--runs matches two runs of N {arm[0]}, {arm[1][2]}, seed {c['seed']}: "
                   f"{runs[arm][c['seed']]['path']} and {d}")
        starts[d] = warm_start(d.parent.parent if d.parent.name == "runs" else None, c.get("model", ""))
        runs[arm][c["seed"]] = {"path": d, "start": starts[d],
            "metrics": metrics, "name": d.name, "rule": c.get("maze_reward", "walk"), "config": c,
            "eval": evaluation_of(result, c, metrics) if result.is_file() else None}
    if not runs:
        refuse(f"no train.py run folder matches {cfg.runs!r}")
    variants = {variant(r["config"]) for seeds in runs.values() for r in seeds.values()}
    if len(variants) > 1:            # arms are keyed by (N, method): other knobs must agree
        refuse(f"--runs mixes runs of other settings ({'; '.join(sorted(variants))}); report one at a time")
    if len(set(starts.values())) > 1:   # arms are paired by seed: only runs of one warm start compare
        a, b = (next(d for d in starts if starts[d] == s) for s in sorted(set(starts.values()))[:2])
        refuse(f"--runs mixes warm starts: {a} ({starts[a]}) and {b} ({starts[b]}); pair arms within one block")
    size = {r["config"].get("maze_size") or 0 for seeds in runs.values() for r in seeds.values()}
    if len(size) > 1:
        refuse(f"--runs mixes maze sizes {sorted(size)}; report one size at a time")
    return runs


def evaluation_of(path, c, metrics):
    """The maze result at `path` if it evaluates this run's final policy, told by its content: evaluate.py
    records the training run of the checkpoint it scored (run.json's config, the step), which must be this
    run's (flags a resume may change aside) at its last logged step. Anything else is refused in one line."""
    res = evaluate.load_result(path)
    done, ran = res.get("checkpoint") or {}, max((m["step"] for m in metrics), default=0)
    theirs = done.get("config") or {}
    differ = sorted(k for k in set(c) | set(theirs) if k not in RESUME_MAY_CHANGE and c.get(k) != theirs.get(k))
    if not theirs or differ or done.get("step") != ran:
        why = ("records no training run (evaluate.py's checkpoint field)" if not theirs else
               f"evaluates a run with other {', '.join(differ)}" if differ else
               f"evaluates step {done.get('step')}, the run's last is {ran}")
        refuse(f"--evals {path}: {why}; it is not the final evaluation of {path.stem}'s run")
    return maze_result(res, path)


def maze_result(res, path):
    """An evaluate.py result's maze entry, with what the tables read: refused in one line if it lacks a field
    or has fewer than 64 samples a maze (pass@64 and the paired test's m = 64 need them)."""
    b = (res.get("benchmarks") or {}).get("maze")
    missing = [k for k in ("n", "rule", "c_strict", "c_walk") if not isinstance(b, dict) or k not in b]
    if missing or b["n"] < 64:
        why = f"no {', '.join(missing)}" if missing else f"{b['n']} samples a maze"
        refuse(f"{path}: {why}; the tables need a maze result of evaluate.py with n >= 64")
    return b


def warm_start(block, model):
    """What a run started from, to tell two warm starts apart: the sha256 in its block's warm_start.json
    (a results folder BLOCK/runs/NAME: bench/maze_converge.py), else that of its --model folder's
    weights, else the folder (a block without the stamp whose warm start is gone pairs only with itself)."""
    if block is not None and (block / STAMP).is_file():
        return "sha256 " + read_json(block / STAMP, ["sha256"])["sha256"][:12]
    if Path(model, "model.safetensors").is_file():
        return "sha256 " + warm_start_id(model)[:12]
    return f"the warm start of {block or model}"


def variant(c):
    """The run's setting of the knobs that are not N or the method (the ablations), as a label."""
    return (f"norm_std {c.get('norm_std', True)}, loss_agg {c.get('loss_agg', 'token-mean')}, "
            f"loss {c.get('loss', 'grpo')}, lr {c.get('lr')}, tis_cap {c.get('tis_cap', 0.0)}")


def fmt(m, se, sign=""):
    """Percent, mean ± SE over seeds; the SE is left out for one seed, both for none."""
    if math.isnan(m):
        return "–"
    return f"{100 * m:{sign}.1f}" + ("" if math.isnan(se) else f" ± {100 * se:.1f}")


def pass_at(result, rule, k):
    """pass@k (Eq. 27) of an evaluate.py maze result under `rule`, from its per-maze counts."""
    return float(pass_at_k_table(result["n"], k)[np.asarray(result[f"c_{rule}"])].mean())


def mean_se(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return float(np.mean(xs)), (float(np.std(xs, ddof=1) / math.sqrt(len(xs))) if len(xs) > 1 else float("nan"))


def curves(runs, sft, cfg):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    Ns = sorted({N for N, _ in runs})
    palette = {m: f"C{i % 10}" for i, m in enumerate(sorted({m for _, m in runs}))}
    fig, axes = plt.subplots(3, len(Ns), figsize=(4.2 * len(Ns), 8.5), squeeze=False, sharex="col")
    for col, N in enumerate(Ns):
        for (n, arm), seeds in sorted(runs.items()):
            if n != N:
                continue
            rule = next(iter(seeds.values()))["rule"]
            color = palette[arm]
            rows = [("reward/mean", None), (f"eval/{rule}/pass@1", 1), (f"eval/{rule}/pass@64", 64)]
            for row, (key, k) in enumerate(rows):
                series = []
                for run in seeds.values():
                    pts = [(m["step"], m[key]) for m in run["metrics"] if key in m]
                    if k is None:              # bins of the training reward
                        pts = [(s + cfg.bin, np.mean([v for t, v in pts if s < t <= s + cfg.bin]))
                               for s in range(0, pts[-1][0] if pts else 0, cfg.bin)]
                    elif sft is not None:      # step 0: the warm start
                        pts = [(0, sft[rule][k])] + pts
                    series.append(dict(pts))
                steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
                if not steps:
                    continue
                vals = np.array([[s[t] for t in steps] for s in series])
                ax = axes[row, col]
                ax.plot(steps, 100 * vals.mean(0), color=color, marker="." if k else None, label=f"{arm[2]} ({len(series)} seed{'s' * (len(series) > 1)})")
                ax.fill_between(steps, 100 * vals.min(0), 100 * vals.max(0), color=color, alpha=0.2)
                ax.set(ylabel=["train reward (%)", f"held-out {rule} pass@1 (%)", f"held-out {rule} pass@64 (%)"][row])
        axes[0, col].set_title(f"N = {N}")
        axes[-1, col].set_xlabel("RL step")
        axes[0, col].legend(fontsize=8)
    fig.tight_layout()
    Path(cfg.figure).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(cfg.figure, dpi=90, metadata=png_metadata(SCRIPT))
    plt.close(fig)


def against_n(runs, sft, cfg):
    """Fig. 6: -log pass@K of each arm's final policies against N (mean over seeds, a bar from the
    lowest to the highest seed), for K = 1, 64 and n; the warm start as a dashed line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), squeeze=False)
    n = next((r["eval"]["n"] for seeds in runs.values() for r in seeds.values() if r["eval"] is not None), "n")
    for col, k in enumerate((1, 64, "n")):
        ax = axes[0, col]
        for arm in sorted({a for _, a in runs}):
            pts = []
            for (N, a), seeds in sorted(runs.items()):
                vals = [-math.log(max(pass_at(r["eval"], r["rule"], r["eval"]["n"] if k == "n" else k), 1e-9))
                        for r in seeds.values() if r["eval"] is not None and a == arm]
                if vals:
                    pts.append((N, np.mean(vals), min(vals), max(vals)))
            if pts:
                N, m, lo, hi = map(np.array, zip(*pts))
                ax.errorbar(N, m, yerr=[m - lo, hi - m], marker="o", capsize=3, label=arm[2])
        if sft is not None:
            rule = sft["rule"]
            ax.axhline(-math.log(sft[rule][sft["n"] if k == "n" else k]), color="gray", ls="--", label="SFT warm start")
        K = n if k == "n" else k
        ax.set(xscale="log", xlabel="group size N", ylabel=f"-log pass@{K}", title=f"pass@{K}, final policies")
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(cfg.figure_n).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(cfg.figure_n, dpi=90, metadata=png_metadata(SCRIPT))
    plt.close(fig)


def table(runs, sft, cfg):
    lines = []
    if sft is not None:
        lines.append(f"SFT warm start: {sft['rule']} pass@1 {100 * sft[sft['rule']][1]:.1f}, "
                     f"pass@64 {100 * sft[sft['rule']][64]:.1f}, pass@{sft['n']} {100 * sft[sft['rule']][sft['n']]:.1f}\n")
    head = ("| N | method | seeds | pass@1 | pass@64 | pass@n | walk pass@1 | early pass@64 drop | per seed pass@1 "
            "| stopped (bench/maze_converge.RULE) |")
    lines += [head, "|---" * (head.count("|") - 1) + "|"]
    for (N, arm), seeds in sorted(runs.items()):
        evals = {s: r["eval"] for s, r in seeds.items() if r["eval"] is not None}
        rule = next(iter(seeds.values()))["rule"]
        cells = []
        for k in (1, 64, "n"):
            vals = [pass_at(e, rule, e["n"] if k == "n" else k) for e in evals.values()]
            m, se = mean_se(vals)
            cells.append(fmt(m, se))
        cells.append(fmt(*mean_se([pass_at(e, "walk", 1) for e in evals.values()])))
        drops = []
        for r in seeds.values():
            early = [m[f"eval/{rule}/pass@64"] for m in r["metrics"] if f"eval/{rule}/pass@64" in m and m["step"] <= cfg.early]
            drops.append(sft[rule][64] - min(early) if early and sft is not None else None)
        cells.append(fmt(*mean_se(drops), sign="+"))
        per_seed = ", ".join(f"s{s} {100 * pass_at(e, rule, 1):.1f}" for s, e in sorted(evals.items()))
        missing = [str(s) for s in seeds if s not in evals]
        per_seed += f" (no final eval: seed {', '.join(missing)})" if missing else ""
        stops = ", ".join(f"s{s} {stopped(r['metrics'])}" for s, r in sorted(seeds.items()))
        lines.append(f"| {N} | {arm[2]} | {len(seeds)} | " + " | ".join(cells) + f" | {per_seed} | {stops} |")
    for ref in [GRPO] + [m for m in sorted({m for _, m in runs}) if m[:2] == (1, 0.5)]:   # and F-GRPO γ=0.5
        lines.append(f"\nPaired m-out-of-n test per seed, each method minus {ref[2]} (points, 95% interval, "
                     f"* significant):\n\n| N | method | seed | pass@1 | pass@{cfg.m} |\n|---|---|---|---|---|")
        for (N, arm), seeds in sorted(runs.items()):
            base = runs.get((N, ref), {})
            for s, r in sorted(seeds.items()) if arm not in (ref, GRPO) else ():   # GRPO's: the first table
                a, b = base.get(s, {}).get("eval"), r["eval"]
                if a is None or b is None:
                    continue
                rule = r["rule"]
                res = subsample_test({"maze": (a["n"], np.asarray(a[f"c_{rule}"]))},
                                     {"maze": (b["n"], np.asarray(b[f"c_{rule}"]))}, cfg.m, cfg.iters)["maze"]
                cells = [f"{100 * res[k]['diff']:+.1f} [{100 * res[k]['lo']:+.1f}, {100 * res[k]['hi']:+.1f}]"
                         + ("*" if res[k]["significant"] else "") for k in (1, cfg.m)]
                lines.append(f"| {N} | {arm[2]} | {s} | " + " | ".join(cells) + " |")
    lines += per_run(runs, cfg)
    lines += by_step(runs, cfg)
    if sft is not None:
        lines += by_sft_difficulty(runs, sft, cfg)
    text = "\n".join(lines) + "\n"
    write_table_out(cfg.table, text, SCRIPT)
    print(text)


def per_run(runs, cfg):
    """Per run, the final evaluation beside the mean pass@1 of train.py's last --last evaluations (one
    such evaluation swings by points), both minus GRPO's at the same seed; and the plan's collapse test
    (maze_converge.RULE) run by run: pass@64 - pass@1 at the last two evaluations, how many of all the
    evaluations are under COLLAPSE, and the smallest gap."""
    head = (f"| N | method | seed | last step | final pass@1 | mean pass@1, last {cfg.last} evals | − GRPO: final / "
            f"last {cfg.last} | pass@64 − pass@1, last two evals | evals under {100 * COLLAPSE:g} points | smallest gap |")
    lines = [f"\nPer run: the final evaluation, and the mean of the last {cfg.last} of train.py's held-out "
             f"evaluations; the plan's collapse test (pass@64 − pass@1 < {100 * COLLAPSE:g} points at the last "
             "two evaluations: bench/maze_converge.RULE) run by run; points:\n", head, "|---" * (head.count("|") - 1) + "|"]

    def numbers(r):
        ev = evaluations(r["metrics"], r["rule"])
        final = pass_at(r["eval"], r["rule"], 1) if r["eval"] is not None else None
        return ev, final, (np.mean([p1 for _, p1, _ in ev[-cfg.last:]]) if ev else None)
    for (N, arm), seeds in sorted(runs.items()):
        for s, r in sorted(seeds.items()):
            ev, final, recent = numbers(r)
            gaps = [p64 - p1 for _, p1, p64 in ev]
            cells = ["–" if final is None else f"{100 * final:.1f}",
                     "–" if recent is None else f"{100 * recent:.1f} ({ev[-cfg.last:][0][0]}–{ev[-1][0]})"]
            base = runs.get((N, GRPO), {}).get(s)
            if arm != GRPO and base is not None:
                _, b_final, b_recent = numbers(base)
                d = ["–" if None in (a, b) else f"{100 * (a - b):+.1f}" for a, b in ((final, b_final), (recent, b_recent))]
                cells.append(" / ".join(d))
            else:
                cells.append("–")
            cells += [", ".join(f"{100 * g:.1f}" for g in gaps[-2:]) + (" (collapsed)" if len(gaps) >= 2 and
                      max(gaps[-2:]) < COLLAPSE else ""), f"{sum(g < COLLAPSE for g in gaps)} of {len(gaps)}",
                      f"{100 * min(gaps):.1f}" if gaps else "–"]
            last = max((m["step"] for m in r["metrics"]), default=0)
            lines.append(f"| {N} | {arm[2]} | {s} | {last} | " + " | ".join(cells) + " |")
    return lines


def stopped(metrics):
    """RULE's stopping step, and the last step when the run was trained on past it (for equal steps)."""
    s, last = stop_step(metrics), max((m["step"] for m in metrics), default=0)
    return "running" if s is None else f"{s}, trained on to {last}" if s != "cap" and last > s else s


def by_step(runs, cfg):
    """The held-out pass@1 and pass@64 train.py logged at each --eval_every step, per arm (mean ± SE
    over seeds), and F-GRPO minus GRPO paired by seed (mean ± SE of the per-seed differences): when a
    gap opens, if it does. A step counts the seeds that reached it (runs still going have fewer)."""
    lines = []
    for N in sorted({n for n, _ in runs}):
        base = runs.get((N, GRPO))
        arms = [(g, seeds) for (n, g), seeds in sorted(runs.items()) if n == N]
        if len(arms) < 2 or base is None:
            continue
        rule = next(iter(base.values()))["rule"]
        logged = {(g, s): {m["step"]: m for m in r["metrics"] if f"eval/{rule}/pass@1" in m}
                  for g, seeds in arms for s, r in seeds.items()}
        steps = sorted(set.union(*(set(v) for v in logged.values())))
        for k in (1, 64):
            key = f"eval/{rule}/pass@{k}"
            head = "| step | seeds | " + " | ".join(g[2] for g, _ in arms) + " | " + " | ".join(
                f"{g[2]} − GRPO" for g, _ in arms if g != GRPO) + " |"
            lines += [f"\nHeld-out {rule} pass@{k} by step, N = {N} (train.py's evaluation; mean ± SE over seeds; "
                      "differences paired by seed):\n", head, "|---" * (head.count("|") - 1) + "|"]
            for t in steps:
                has = {g: [s for s in seeds if t in logged[g, s]] for g, seeds in arms}
                cells = [fmt(*mean_se([logged[g, s][t][key] for s in has[g]])) for g, _ in arms]
                for g, _ in arms:
                    if g != GRPO:
                        paired = [logged[g, s][t][key] - logged[GRPO, s][t][key] for s in has[g] if s in has[GRPO]]
                        cells.append(fmt(*mean_se(paired), sign="+"))
                counts = "/".join(str(len(has[g])) for g, _ in arms)
                lines.append(f"| {t} | {counts} | " + " | ".join(cells) + " |")
    return lines


def by_sft_difficulty(runs, sft, cfg):
    """The table of "forget the rare": per bin of the SFT's per-maze success c/n (a maze the warm start
    never solved, then (0, e1], (e1, e2], ...), the share of those mazes a policy still solves at least
    once in its n samples and its mean pass@1 on them; mean over seeds. A maze held out from training
    whose path the SFT sampled rarely is the maze analogue of a rare correct solution (the subset E of Sec. 3.1)."""
    rule = sft["rule"]
    c0 = np.asarray(sft["result"][f"c_{rule}"])
    p0 = c0 / sft["n"]
    edges = cfg.sft_edges
    names = ["unsolved", *(f"({a:g}, {b:g}]" for a, b in zip([0, *edges], edges)), f"> {edges[-1]:g}"]
    bin_of = np.where(c0 == 0, 0, 1 + np.searchsorted(edges, p0, side="left"))   # right-closed bins
    sizes = [int((bin_of == b).sum()) for b in range(len(names))]
    head = "| N | method | seeds | " + " | ".join(f"SFT {nm}: {sz} mazes" for nm, sz in zip(names, sizes)) + " |"
    lines = [f"\nForget the rare: the held-out mazes binned by the SFT warm start's {rule} success c/n "
             f"(n = {sft['n']}); each cell is the share of the bin's mazes a policy still solves in its n "
             "samples (solved at least once) / its mean pass@1 there, %, mean over seeds with a final "
             "evaluation:\n", head, "|---" * (head.count("|") - 1) + "|"]
    rows = [("–", "SFT warm start (again)" if "again" in sft else "SFT warm start (binning samples)",
             [sft.get("again", sft["result"])])]
    for (N, arm), seeds in sorted(runs.items()):
        rows.append((N, arm[2], [r["eval"] for r in seeds.values() if r["eval"] is not None]))
    for N, method, evals in rows:
        if not evals:
            continue
        if any(len(e[f"c_{rule}"]) != len(c0) or e["n"] != sft["n"] for e in evals):
            refuse(f"{method} at N={N} was evaluated on other mazes or another n than the SFT")
        counts = [np.asarray(e[f"c_{rule}"]) for e in evals]             # one array per seed, all mazes
        cells = []
        for b in range(len(names)):
            if not sizes[b]:
                cells.append("–")
                continue
            solved = np.mean([(c[bin_of == b] > 0).mean() for c in counts])
            p1 = np.mean([c[bin_of == b].mean() / sft["n"] for c in counts])
            cells.append(f"{100 * solved:.1f} / {100 * p1:.1f}")
        lines.append(f"| {N} | {method} | {len(evals)} | " + " | ".join(cells) + " |")
    return lines


def across_blocks(cfg):
    """The --blocks table: rows (block, seed), per N a column per arm and per arm minus GRPO, for
    pass@1 and pass@64 of the final evaluations and the mean pass@1 of train.py's last --last
    evaluations; a last row of mean ± SE over the rows that have both."""
    rows, arms = [], set()
    for b in cfg.blocks.split(","):
        sub = dataclasses.replace(cfg, runs=str(Path(b, "runs", "*")), evals=str(Path(b, "evals")))
        sft = maze_result(evaluate.load_result(Path(b, "evals", "sft.json")), Path(b, "evals", "sft.json"))
        by_seed = defaultdict(dict)
        for (N, arm), seeds in load_runs(sub).items():
            arms.add((N, arm))
            for s, r in seeds.items():
                if r["eval"] is not None:
                    by_seed[s][(N, arm)] = r
        rows += [(b, pass_at(sft, sft["rule"], 1), s, got) for s, got in sorted(by_seed.items())]
    lines = []
    for k in (1, cfg.m, "last"):
        what = (f"Mean held-out pass@1 of train.py's last {cfg.last} evaluations" if k == "last" else
                f"Final held-out pass@{k}")
        for N in sorted({n for n, _ in arms}):
            mine = sorted(g for n, g in arms if n == N)
            head = (f"| block (SFT pass@1) | seed | " + " | ".join(g[2] for g in mine) + " | "
                    + " | ".join(f"{g[2]} − GRPO" for g in mine if g != GRPO) + " |")
            lines += [f"\n{what}, N = {N}, % (stopping step in brackets); differences paired "
                      "within a block and seed:\n", head, "|---" * (head.count("|") - 1) + "|"]
            cols = defaultdict(list)
            for b, sft_p1, s, got in rows:
                cells = []
                for g in mine:
                    r = got.get((N, g))
                    v = None if r is None else pass_at(r["eval"], r["rule"], k) if k != "last" else \
                        float(np.mean([p1 for _, p1, _ in evaluations(r["metrics"], r["rule"])[-cfg.last:]]))
                    cols[g].append(v)
                    cells.append("–" if r is None else f"{100 * v:.1f} ({stopped(r['metrics'])})")
                grpo = cols[GRPO][-1] if GRPO in mine else None
                for g in mine:
                    if g != GRPO:
                        d = None if None in (cols[g][-1], grpo) else cols[g][-1] - grpo
                        cols["d", g].append(d)
                        cells.append("–" if d is None else f"{100 * d:+.1f}")
                lines.append(f"| {Path(b).name} ({100 * sft_p1:.1f}) | {s} | " + " | ".join(cells) + " |")
            means = [fmt(*mean_se(cols[g])) for g in mine] + [fmt(*mean_se(cols["d", g]), sign="+") for g in mine
                                                              if g != GRPO]
            counts = "/".join(str(sum(x is not None for x in cols["d", g])) for g in mine if g != GRPO)
            lines.append(f"| mean ± SE | pairs {counts} | " + " | ".join(means) + " |")
    text = "\n".join(lines).lstrip("\n") + "\n"
    write_table_out(cfg.table, text, SCRIPT)
    print(text)


def main(cfg):
    try:
        report(cfg)
    except Damaged as e:             # a cut run.json, metrics.jsonl line or evaluation: one line, exit 2
        refuse(e)


def report(cfg):
    if cfg.blocks:
        return across_blocks(cfg)
    runs = load_runs(cfg)
    sft = None
    block = Path(cfg.sft).parent.parent
    if Path(cfg.sft).is_file() and (block / STAMP).is_file():      # a block's warm start: the runs' own?
        mine = next(r["start"] for seeds in runs.values() for r in seeds.values())
        theirs = warm_start(block, "")
        if theirs != mine:
            refuse(f"--sft {cfg.sft} evaluates {theirs}, the runs started from {mine}; use their block's")
    if Path(cfg.sft).is_file():      # the result, and {rule: {k: pass@k}} for k = 1, 64, n (Eq. 27)
        starts = {Path(r["config"].get("model", "")).name for seeds in runs.values() for r in seeds.values()}
        for f in (cfg.sft, cfg.sft_again):      # by content too: the folder the evaluation loaded (its name:
            model = evaluate.load_result(f)["config"].get("model") if Path(f).is_file() else None   # cwds differ)
            if model is not None and {Path(model).name} != starts:
                refuse(f"{f} evaluates {model}, the runs started from {', '.join(sorted(map(str, starts)))}")
        b = maze_result(evaluate.load_result(cfg.sft), cfg.sft)
        sft = {"n": b["n"], "rule": b["rule"], "result": b,
               **{rule: {k: pass_at(b, rule, k) for k in (1, 64, b["n"])} for rule in ("strict", "walk")}}
        if Path(cfg.sft_again).is_file():
            sft["again"] = maze_result(evaluate.load_result(cfg.sft_again), cfg.sft_again)
    curves(runs, sft, cfg)
    if cfg.figure_n:
        against_n(runs, sft, cfg)
    table(runs, sft, cfg)
    print(f"wrote {cfg.figure}{' and ' + cfg.figure_n if cfg.figure_n else ''} and {cfg.table}")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
