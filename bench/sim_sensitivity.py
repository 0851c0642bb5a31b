"""
Which of the paper's claims about Fig. 2 (Sec. 5.1, C1-C5) hold under which optimizer constants the paper
leaves unstated: simulate.py's sweep at 5 N (regimes I, II, III) x gamma 0, 1 x 2 seeds for every setting of
SENSITIVITY (AdamW's lr, eps and weight decay; sign-SGD; plain SGD at two lrs), each run judged by
simulate.judge_claims. Writes sensitivity.json, sensitivity.md (the claims table, most claims first) and
fig2_sensitivity_wd{0,0.01}.png into --out_dir.

    python bench/sim_sensitivity.py                          # ~11 min on 2 cores (RESULTS.md)
    python bench/sim_sensitivity.py --plot_only true         # rejudge and redraw from sensitivity.json

Every other flag is simulate.py's (the policy, the rewards, the surrogate), applied to every setting.
"""
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import simulate  # noqa: E402
from fgrpo_utils.cli import parse_config, refuse  # noqa: E402
from fgrpo_utils.outputs import atomic_write_json, atomic_write_text, mark_out_dir, remove_temp  # noqa: E402
from simulate import (OUTPUTS, STUDY_NS, all_rows, claims_table, collect, deal, initial_logits,  # noqa: E402
                      judge_claims, run_jobs, save)


@dataclass
class Config(simulate.Config):
    out_dir: str = "out/sensitivity"      # sensitivity.json, sensitivity.md and the figures


SENSITIVITY = dict(
    group_sizes=STUDY_NS, seeds=2,
    adamw=[dict(optimizer="adamw", lr=lr, adam_eps=eps, weight_decay=wd)
           for lr in (1e-2, 1e-3) for wd in (0.01, 0.0) for eps in (1e-6, 1e-8, 1e-10, 1e-12, 1e-14, 1e-30)],
    # Extremes: Adam's normalisation with no memory, and none; no SGD lr fits all N (grads ~ 1/N): two bracket it.
    others=[dict(optimizer="signsgd", lr=1e-2, adam_eps=1e-30, weight_decay=0.0),
            dict(optimizer="sgd", lr=1e2, adam_eps=1e-8, weight_decay=0.0),
            dict(optimizer="sgd", lr=1e5, adam_eps=1e-8, weight_decay=0.0)])


def setting_label(st):
    eps = "" if st["optimizer"] == "sgd" else f" eps {st['adam_eps']:g}"
    return f"{st['optimizer']} lr {st['lr']:g}{eps} wd {st['weight_decay']:g}"


def preference(st, held):
    """Sort key (smaller first): most claims, nearest the paper (AdamW, lr 1e-2), then PyTorch (wd 0.01, eps 1e-8)."""
    return (-held, st["optimizer"] != "adamw", st["lr"] != 1e-2, st["weight_decay"] != 0.01,
            abs(math.log10(st["adam_eps"]) + 8))


def sensitivity(cfg, settings, group_sizes, seeds):
    """Every setting over group_sizes x cfg.gammas x seeds: a list of {setting, runs} (no trajectories)."""
    workers = cfg.workers or os.cpu_count()
    jobs = []
    for st in settings:
        c = dataclasses.replace(cfg, group_sizes=tuple(group_sizes), seeds=seeds, **st)
        jobs += [(c, rows) for rows in deal(all_rows(c), workers)]
    outputs = run_jobs(jobs, workers, desc="sensitivity")
    results = []
    for st in settings:
        mine = [o for (c, _), o in zip(jobs, outputs) if all(getattr(c, k) == v for k, v in st.items())]
        runs = [{k: v for k, v in r.items() if k not in ("Q_pos", "M_ret")} for r in collect(cfg, mine)]
        results.append(dict(setting=st, runs=runs))
    return results


def plot_sensitivity(results, path, weight_decay, q0):
    """Final M_ret and Q_pos against N, a colour per Adam eps, a row per lr: eps deciding the regimes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    adam = [r for r in results if r["setting"]["optimizer"] == "adamw" and r["setting"]["weight_decay"] == weight_decay]
    lrs = sorted({r["setting"]["lr"] for r in adam}, reverse=True)
    epss = sorted({r["setting"]["adam_eps"] for r in adam}, reverse=True)
    fig, ax = plt.subplots(len(lrs), 2, figsize=(11, 3.8 * len(lrs)), squeeze=False)
    for i, lr in enumerate(lrs):
        for j, eps in enumerate(epss):
            runs = next(r["runs"] for r in adam if r["setting"]["lr"] == lr and r["setting"]["adam_eps"] == eps)
            Ns = sorted({r["N"] for r in runs})
            for k, key in enumerate(("M_ret_final", "Q_pos_final")):
                for gm, ls in ((0.0, "o-"), (1.0, "s--")):
                    y = [np.mean([r[key] for r in runs if r["N"] == n and r["gamma"] == gm]) for n in Ns]
                    ax[i, k].plot(Ns, y, ls, color=plt.cm.viridis(j / max(1, len(epss) - 1)), ms=4,
                                  label=f"eps {eps:g}" if gm == 0 else None)
        for k, name in enumerate(("M_ret", "Q_pos")):
            ax[i, k].set(xscale="log", xlabel="group size N", ylabel=f"{name} at the last step", ylim=(0, 1.02),
                         title=f"{name}, AdamW lr {lr:g}, wd {weight_decay:g} (γ=0 solid, γ=1 dashed)")
        ax[i, 1].axhline(q0, color="0.5", lw=0.8, ls=":")                     # Q_pos at step 0
    ax[0, 0].legend(fontsize=8)
    save(fig, path)


def main(cfg):
    out = Path(cfg.out_dir)
    remove_temp(out, OUTPUTS)
    settings = SENSITIVITY["adamw"] + SENSITIVITY["others"]
    path = out / "sensitivity.json"
    if cfg.plot_only:
        if not path.is_file():
            refuse(f"--plot_only: no {path}; run without --plot_only first")
        saved = json.loads(path.read_text())
        results, q0 = saved["results"], saved["q_pos0"]
    else:
        t0 = time.perf_counter()
        results = sensitivity(cfg, settings, SENSITIVITY["group_sizes"], SENSITIVITY["seeds"])
        q0 = float(torch.softmax(initial_logits(cfg), 0)[: cfg.num_correct].sum())   # Q_pos of pi_0: C1's level
        atomic_write_json(path, dict(config=dataclasses.asdict(cfg), wall_s=round(time.perf_counter() - t0, 1),
                                     q_pos0=q0, results=results))
        mark_out_dir(out, [path.name])
    for r in results:                       # judged from the saved runs, so a new threshold needs no rerun
        r["claims"] = judge_claims(r["runs"], q0)
    results.sort(key=lambda r: preference(r["setting"], sum(ok for ok, _ in r["claims"].values())))
    text = claims_table([(setting_label(r["setting"]), r["claims"]) for r in results])
    atomic_write_text(out / "sensitivity.md", text + "\n")
    mark_out_dir(out, ["sensitivity.md"])
    print(text)
    print(f"most claims, closest to the paper: {setting_label(results[0]['setting'])}")
    for wd in (0.0, 0.01):
        plot_sensitivity(results, out / f"fig2_sensitivity_wd{wd:g}.png", wd, q0)
    print(f"wrote {out}/sensitivity.json, sensitivity.md, fig2_sensitivity_wd*.png")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
