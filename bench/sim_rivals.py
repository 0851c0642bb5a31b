"""
F-GRPO beside its rivals in the categorical simulation (Sec. 5.1, Fig. 2's setting): Q_pos and M_ret after
1,000 steps at every N of Fig. 2, for GRPO, F-GRPO (gamma 0.5, 1), MaxRL, pass@4 training and W-REINFORCE, each
in the focal weight's slot (simulate.py --weighting; advantage.weighted_advantages), 4 seeds as Fig. 2.

    python bench/sim_rivals.py --run true          # simulate every arm into results/sim_rivals/, ~15 min on 2 cores
    python bench/sim_rivals.py                     # the table and figures/sim_rivals.png from the committed files

Each arm's file holds its simulate.Config and its runs' final values (no trajectories). The table and figure
are rebuilt from those files alone; arms are told apart by their config (the weighting and gamma), never by file
name, and files that differ in anything else the simulation reads (steps, seeds, policy, optimizer) are refused.
pass@4 starts at N = 4 (k <= N); the unlikeliness reward is not here: its ranks give the draws of one action
different rewards, which the simulation's one-advantage-per-sampled-action surrogate (Eq. 5) cannot hold.
"""
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import simulate  # noqa: E402
from fgrpo_utils.cli import check, parse_config, refuse  # noqa: E402
from fgrpo_utils.outputs import check_out_file, code_hashes, png_metadata, write_json_out, write_table_out  # noqa: E402

ARMS = {"focal": dict(gammas=(0.0, 0.5, 1.0)), "maxrl": {}, "passk": dict(passk_k=4), "wreinforce": {}}
SCRIPT = "bench/sim_rivals.py"         # the mark in what it writes (outputs.is_ours): it replaces nothing else
PAIRED = ("num_actions", "num_correct", "anchor_logit", "correct_logit", "r_correct", "r_wrong", "seeds", "seed",
          "steps", "optimizer", "lr", "adam_eps", "weight_decay", "surrogate")   # what every arm must share


@dataclass
class Config:
    run: bool = False                       # simulate every arm (else only rebuild from --out's files)
    out: str = "results/sim_rivals"         # ARM.json per arm and table.md
    figure: str = "figures/sim_rivals.png"
    workers: int = 0                        # simulate.py --workers; 0 = one per core

    def __post_init__(self):
        check(self.workers >= 0, "--workers must be >= 0")
        check(not Path(self.out).exists() or Path(self.out).is_dir(), f"--out {self.out}: a file, not a folder")
        for path in [Path(self.out, f"{w}.json") for w in ARMS if self.run] + [Path(self.out, "table.md")]:
            check_out_file(path, "--out", SCRIPT)
        check_out_file(self.figure, "--figure", SCRIPT)


def arm_config(weighting, workers):
    """Fig. 2's sweep (simulate.Config's defaults) under `weighting`; pass@k at the N where k <= N."""
    Ns = simulate.Config.group_sizes
    kw = dict(ARMS[weighting])
    if weighting == "passk":
        kw = {**kw, "group_sizes": tuple(n for n in Ns if n >= kw["passk_k"])}
    return simulate.Config(weighting=weighting, gammas=kw.pop("gammas", (0.0,)), workers=workers,
                           out_dir="/nonexistent/never-written", **kw)


def run_arm(weighting, cfg, out):
    sim = arm_config(weighting, cfg.workers)
    runs, timing, _ = simulate.simulate(sim)
    keep = ("N", "gamma", "seed", "Q_pos_final", "M_ret_final", "M_ret_min", "coverage")
    config = {k: v for k, v in dataclasses.asdict(sim).items() if k not in ("out_dir", "workers")}
    write_json_out(out / f"{weighting}.json", dict(config=config, code=code_hashes(), q0=runs[0]["Q_pos"][0],
                                                   runs=[{k: r[k] for k in keep} for r in runs]), SCRIPT)
    print(f"{weighting}: {len(runs)} runs, CPU s {sum(timing.values()):.0f}")


def label(config, gamma):
    w = config["weighting"]
    if w == "focal":
        return "GRPO" if gamma == 0 else f"F-GRPO γ={gamma:g}"
    return {"maxrl": "MaxRL", "passk": f"pass@{config['passk_k']}",
            "wreinforce": f"W-REINFORCE λ={config['wreinforce_lambda']:g}"}[w]


def load(out):
    """{label: {N: [run, ...]}} from every *.json in `out`, paired by content: refused in one line if two files
    hold the same method or differ in a setting of PAIRED."""
    arms, shared = {}, None
    for path in sorted(Path(out).glob("*.json")):
        try:
            data = json.loads(path.read_text())
            config, runs = data["config"], data["runs"]
            settings = {k: config[k] for k in PAIRED}
            by_gamma = {g: [r for r in runs if r["gamma"] == g] for g in config["gammas"]}
            if not all(by_gamma.values()) or not all(isinstance(r["M_ret_final"], float) for r in runs):
                raise ValueError("a gamma without runs, or a run without its final M_ret")
        except (ValueError, KeyError, TypeError):
            refuse(f"{path}: not a whole arm file of bench/sim_rivals.py (config and runs)")
        if shared is not None and settings != shared[1]:
            diff = sorted(k for k in PAIRED if settings[k] != shared[1][k])
            refuse(f"{path}: differs from {shared[0]} in {', '.join(diff)}; the arms must share every setting")
        shared = shared or (path, settings)
        for g, rows in by_gamma.items():
            name = label(config, g)
            if name in arms:
                refuse(f"{path}: {name} is also in another file of {out}; keep one")
            arms[name] = {n: [r for r in rows if r["N"] == n] for n in sorted({r["N"] for r in rows})}
    if not arms:
        refuse(f"{out}: no arm files; run with --run true first")
    return arms


def mean_se(rows, key):
    v = np.array([r[key] for r in rows])
    return v.mean(), (v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan"))


def table(arms):
    names = list(arms)
    Ns = sorted({n for a in arms.values() for n in a})
    lines = []
    for key in ("M_ret_final", "Q_pos_final"):
        lines += [f"{key.split('_final')[0]} after the last step, mean ± SE over seeds:", "",
                  "| N | " + " | ".join(names) + " |", "|---" * (1 + len(names)) + "|"]
        for n in Ns:
            cells = [("{:.3f} ± {:.3f}".format(*mean_se(arms[a][n], key)) if n in arms[a] else "—") for a in names]
            lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(arms, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    for j, (name, by_n) in enumerate(arms.items()):
        Ns = sorted(by_n)
        for k, key in enumerate(("Q_pos_final", "M_ret_final")):
            m = [mean_se(by_n[n], key)[0] for n in Ns]
            ax[k].plot(Ns, m, "o-", color=f"C{j}", ms=3, label=name)
    for k, key in enumerate(("Q_pos", "M_ret")):
        ax[k].set(xscale="log", xlabel="group size N", ylabel=f"{key} after the last step",
                  title=f"({'ab'[k]}) {key}: every weighting in the focal weight's slot")
        ax[k].axvspan(simulate.ZONE[0] / 1.4, simulate.ZONE[1] * 1.4, color="0.9", zorder=0)
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata=png_metadata(SCRIPT))


def main(cfg):
    out = Path(cfg.out)
    if cfg.run:
        out.mkdir(parents=True, exist_ok=True)
        for weighting in ARMS:
            run_arm(weighting, cfg, out)
    arms = load(out)
    text = table(arms)
    write_table_out(out / "table.md", text + "\n", SCRIPT)
    print(text)
    plot(arms, cfg.figure)
    print(f"wrote {out / 'table.md'} and {cfg.figure}")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
