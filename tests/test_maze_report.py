"""bench/maze_report.py on planted run folders and results: every run is reported, the numbers are
the files' numbers. `python -m pytest -q tests/test_maze_report.py`"""
import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import maze_report  # noqa: E402
from advantage import pass_at_k_curve  # noqa: E402


def plant(tmp_path, name, N, gamma, seed, pass64, counts=None, **flags):
    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    config = {"group_size": N, "gamma": gamma, "seed": seed, "maze_reward": "strict", **flags}
    (run / "run.json").write_text(json.dumps({"config": config}))
    rows = [{"step": t, "reward/mean": 0.1 * t / 10} for t in range(1, 11)]
    rows[4].update({"eval/strict/pass@1": 0.2, "eval/strict/pass@64": pass64})
    rows[9].update({"eval/strict/pass@1": 0.3, "eval/strict/pass@64": pass64 + 0.1})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if counts is not None:
        c = np.asarray(counts)
        res = {"config": {}, "checkpoint": {"step": 10, "config": config}, "benchmarks": {"maze": {
            "n": 64, "rule": "strict", "c": c.tolist(), "c_strict": c.tolist(), "c_walk": c.tolist(),
            "pass@k": pass_at_k_curve(64, c), "pass@k_strict": pass_at_k_curve(64, c),
            "pass@k_walk": pass_at_k_curve(64, c)}}}
        (tmp_path / "evals").mkdir(exist_ok=True)
        (tmp_path / "evals" / f"{name}.json").write_text(json.dumps(res))


def test_report_lists_every_run_with_its_numbers(tmp_path, capsys):
    plant(tmp_path, "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 20 + [64] * 20)           # pass@1 0.5
    plant(tmp_path, "N8_g0_s1", 8, 0.0, 1, 0.4, [0] * 30 + [64] * 10)           # pass@1 0.25
    plant(tmp_path, "N8_g0.5_s0", 8, 0.5, 0, 0.6, [32] * 40)                     # pass@1 0.5, pass@64 1
    plant(tmp_path, "N8_g0.5_s1", 8, 0.5, 1, 0.6)                                # still training
    sft = tmp_path / "evals" / "sft.json"
    sft.write_text((tmp_path / "evals" / "N8_g0.5_s0.json").read_text())        # SFT pass@64 = 1.0
    cfg = maze_report.Config(runs=str(tmp_path / "runs" / "N*"), evals=str(tmp_path / "evals"), sft=str(sft),
                             sft_again=str(tmp_path / "absent.json"), figure=str(tmp_path / "f.png"),
                             table=str(tmp_path / "t.md"), early=5, iters=2000)
    maze_report.main(cfg)
    text = (tmp_path / "t.md").read_text()
    grpo = next(line for line in text.splitlines() if "| GRPO |" in line)
    assert "| 37.5 ± 12.5 |" in grpo                       # mean of 50 and 25, SE 12.5
    assert "+55.0 ± 5.0" in grpo                           # SFT 1.0 minus the early pass@64 (0.5, 0.4)
    fgrpo = next(line for line in text.splitlines() if "| F-GRPO γ=0.5 |" in line)
    assert "no final eval: seed 1" in fgrpo and "| 2 | 50.0 | 100.0 |" in fgrpo
    paired = [line for line in text.splitlines() if line.startswith("| 8 | F-GRPO γ=0.5 | 0 |") and "[" in line]
    assert len(paired) == 1 and "+0.0" in paired[0].split("|")[4] and "*" in paired[0].split("|")[5]
    assert (tmp_path / "f.png").stat().st_size > 0
    by_step = text[text.index("pass@64 by step"):]                 # paired by seed: +10 and +20 points
    assert "| 5 | 2/2 | 45.0 ± 5.0 | 60.0 ± 0.0 | +15.0 ± 5.0 |" in by_step, by_step


def test_forget_the_rare_bins_mazes_by_the_warm_start(tmp_path):
    """Mazes binned by the SFT's c/n (n = 64): 0, 1/64, 10/64 and 40/64 land in the unsolved,
    (0, 0.05], (0.05, 0.2] and > 0.5 bins; (0.2, 0.5] is empty. Each cell: solved share / mean pass@1."""
    sft_counts = [0] * 4 + [1] * 4 + [10] * 4 + [40] * 4
    plant(tmp_path, "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 4 + [0, 0, 0, 5] + [10] * 4 + [64] * 4)
    plant(tmp_path, "N8_g0_s1", 8, 0.0, 1, 0.5, [0] * 4 + [0, 0, 5, 5] + [0] * 4 + [64] * 4)
    plant(tmp_path, "sft", 8, 0.0, 9, 0.5, sft_counts)           # an evaluate.py result like any other
    plant(tmp_path, "sft_again", 8, 0.0, 9, 0.5, [0] * 8 + [10] * 8)
    evals = tmp_path / "evals"
    cfg = maze_report.Config(runs=str(tmp_path / "runs" / "N*"), evals=str(evals), sft=str(evals / "sft.json"),
                             sft_again=str(evals / "sft_again.json"), figure=str(tmp_path / "f.png"),
                             table=str(tmp_path / "t.md"), iters=100)
    maze_report.main(cfg)
    lines = (tmp_path / "t.md").read_text().splitlines()
    head = next(line for line in lines if line.startswith("| N | method | seeds | SFT unsolved"))
    assert "unsolved: 4 mazes | SFT (0, 0.05]: 4 mazes | SFT (0.05, 0.2]: 4 mazes" in head
    assert "SFT (0.2, 0.5]: 0 mazes | SFT > 0.5: 4 mazes |" in head
    again = next(line for line in lines if "SFT warm start (again)" in line)
    assert again.split(" | ")[3:] == ["0.0 / 0.0", "0.0 / 0.0", "100.0 / 15.6", "–", "100.0 / 15.6 |"]
    grpo = [line for line in lines if line.startswith("| 8 | GRPO | 2 | ") and "/" in line][-1]
    # (0, 0.05]: seed 0 solves 1 of 4, seed 1 2 of 4 -> 37.5%; pass@1 (5/64 and 10/64)/4 -> 2.9%
    assert grpo.split(" | ")[3:] == ["0.0 / 0.0", "37.5 / 2.9", "50.0 / 7.8", "–", "100.0 / 100.0 |"]


def test_sft_edges_are_checked_before_any_work(tmp_path):
    for edges in ((0.2, 0.05), (0.0, 0.5), (0.5, 1.0)):
        with pytest.raises(ValueError, match="--sft_edges"):
            maze_report.Config(sft_edges=edges)


def test_runs_of_another_ablation_setting_are_not_pooled(tmp_path, capsys):
    """Arms are keyed by N and gamma: a --loss_agg or --norm_std run among them would be averaged in."""
    plant(tmp_path, "N8_g0_s0", 8, 0.0, 0, 0.5)
    plant(tmp_path, "N8_g0_s1", 8, 0.0, 1, 0.5)
    run = tmp_path / "runs" / "N8_g0_s1" / "run.json"
    c = json.loads(run.read_text())
    c["config"]["loss_agg"] = "seq-mean-token-mean"
    run.write_text(json.dumps(c))
    cfg = maze_report.Config(runs=str(tmp_path / "runs" / "N*"), evals=str(tmp_path / "evals"),
                             sft=str(tmp_path / "absent.json"), figure=str(tmp_path / "f.png"), table=str(tmp_path / "t.md"))
    assert "mixes runs of other settings" in refused(cfg, capsys)


def test_blocks_pair_arms_within_a_warm_start_only(tmp_path):
    """--blocks: two warm starts, GRPO and γ = 0.5 paired by seed inside each; a γ = 0.5 run whose
    block has no GRPO of its seed enters its column but no difference. pass@1 (64 samples, n = 64):
    block a: 50 vs 75 (seed 0), block b: 25 vs 12.5 (seed 0), 50 alone (seed 1) -> +25, -12.5. The planted
    runs end before RULE's first check, so their stop reads "running", as in the per-run table."""
    for block, runs in {"a": [(0.0, 0, [0] * 20 + [64] * 20), (0.5, 0, [0] * 10 + [64] * 30)],
                        "b": [(0.0, 0, [0] * 30 + [64] * 10), (0.5, 0, [32] * 10 + [0] * 30), (0.5, 1, [32] * 40)]}.items():
        for gamma, seed, counts in runs:
            plant(tmp_path / block, f"N8_g{gamma:g}_s{seed}", 8, gamma, seed, 0.5, counts)
        (tmp_path / block / "evals" / "sft.json").write_text((tmp_path / block / "evals" / "N8_g0_s0.json").read_text())
    with pytest.raises(ValueError, match="--blocks"):
        maze_report.Config(blocks=str(tmp_path / "a") + "," + str(tmp_path / "nothing"))
    cfg = maze_report.Config(blocks=f"{tmp_path / 'a'},{tmp_path / 'b'}", table=str(tmp_path / "t.md"),
                             figure=str(tmp_path / "f.png"))
    maze_report.main(cfg)
    p1 = (tmp_path / "t.md").read_text().split("pass@64")[0].splitlines()
    assert "| a (50.0) | 0 | 50.0 (running) | 75.0 (running) | +25.0 |" in p1
    assert "| b (25.0) | 0 | 25.0 (running) | 12.5 (running) | -12.5 |" in p1
    assert "| b (25.0) | 1 | – | 50.0 (running) | – |" in p1
    assert "| mean ± SE | pairs 2 | 37.5 ± 12.5 | 45.8 ± 18.2 | +6.2 ± 18.7 |" in p1
    recent = (tmp_path / "t.md").read_text().split("last 10 evaluations")[1].splitlines()   # every run: 20, 30
    assert "| a (50.0) | 0 | 25.0 (running) | 25.0 (running) | +0.0 |" in recent
    assert "| mean ± SE | pairs 2 | 25.0 ± 0.0 | 25.0 ± 0.0 | +0.0 ± 0.0 |" in recent
    assert not (tmp_path / "f.png").exists()


def test_runs_from_two_folders_each_with_its_own_evaluations(tmp_path, capsys):
    """A GRPO run trained on past its stop (bench/maze_converge --min_steps) in a folder of its own, beside
    the block's F-GRPO run: the i-th --runs glob reads the i-th --evals folder, the stop cell says how far
    the run went on, and two runs of one arm and seed are refused, not one silently dropped. The folders
    pair because their warm_start.json stamps name one warm start."""
    plant(tmp_path / "block", "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 20 + [64] * 20)      # pass@1 50 at its stop
    plant(tmp_path / "block", "N8_g0.5_s0", 8, 0.5, 0, 0.5, [64] * 40)
    plant(tmp_path / "long", "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 10 + [64] * 30)       # pass@1 75 at step 2,000
    rows = [{"step": t, "eval/strict/pass@1": 0.4, "eval/strict/pass@64": 0.6} for t in range(100, 2001, 100)]
    (tmp_path / "long" / "runs" / "N8_g0_s0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = tmp_path / "long" / "evals" / "N8_g0_s0.json"                                 # it evaluates step 2,000
    ev.write_text(json.dumps({**json.loads(ev.read_text()), "checkpoint": {"step": 2000, "config": json.loads(
        (tmp_path / "long" / "runs" / "N8_g0_s0" / "run.json").read_text())["config"]}}))
    stamp(tmp_path / "block", "1" * 64)
    stamp(tmp_path / "long", "1" * 64)
    common = dict(sft=str(tmp_path / "absent.json"), figure=str(tmp_path / "f.png"), table=str(tmp_path / "t.md"), iters=100)
    both = f"{tmp_path / 'long' / 'runs' / '*'},{tmp_path / 'block' / 'runs' / '*'}"
    evals = f"{tmp_path / 'long' / 'evals'},{tmp_path / 'block' / 'evals'}"
    assert "two runs of N 8, GRPO, seed 0" in refused(maze_report.Config(runs=both, evals=evals, **common), capsys)
    runs = f"{tmp_path / 'long' / 'runs' / '*'},{tmp_path / 'block' / 'runs' / 'N8_g0.5_s*'}"
    maze_report.main(maze_report.Config(runs=runs, evals=evals, **common))
    grpo = next(line for line in (tmp_path / "t.md").read_text().splitlines() if "| GRPO |" in line)
    assert "| 75.0 |" in grpo and grpo.endswith("| s0 1000, trained on to 2000 |"), grpo


def test_figure_and_table_replace_only_their_own_files(tmp_path):
    """--figure and --table wrote over whatever was there; now only over this script's own files."""
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"\x89PNG my plot")
    with pytest.raises(ValueError, match="--figure .*maze_report.py did not write it"):
        maze_report.Config(figure=str(mine), table=str(tmp_path / "t.md"))
    (tmp_path / "t.md").write_text("| my notes |\n")
    with pytest.raises(ValueError, match="--table .*maze_report.py did not write it"):
        maze_report.Config(figure=str(tmp_path / "f.png"), table=str(tmp_path / "t.md"))
    maze_report.Config()                                # the shipped figure carries the mark


def test_the_stopping_rule_reads_the_logged_evaluations():
    """bench/maze_converge.RULE, as the driver and the table apply it: checked at 1,000, 1,500, ...;
    a plateau (last quarter's mean pass@1 within 1 point of the quarter before) or a collapse
    (pass@64 - pass@1 < 2 points twice) stops the run; a run still rising goes on to the cap."""
    from maze_converge import converged, stop_step

    def rows(p1, p64=lambda t, p: p + 0.1, last=4000):
        return [{"step": t, "eval/strict/pass@1": p1(t), "eval/strict/pass@64": p64(t, p1(t))}
                for t in range(100, last + 1, 100)]
    rising = rows(lambda t: 0.2 + 0.1 * t / 1000)                          # +1 point per 100 steps
    assert not converged(rising[:10]) and stop_step(rising) == "cap"
    assert stop_step(rising[:15]) is None                                  # not at the cap yet: running
    slow = rows(lambda t: 0.2 + 0.1 * min(t, 1200) / 1000)                 # flat from step 1,200
    # 1,500: steps 1,200-1,500 (32%) against 800-1,100 (29.5%); 2,000: 32% against 31.8%
    assert stop_step(slow) == 2000
    collapsed = rows(lambda t: 0.2 + 0.1 * t / 1000, lambda t, p: p + (0.01 if t >= 900 else 0.1))
    assert stop_step(collapsed) == 1000


def test_fig6_is_drawn_against_n(tmp_path):
    plant(tmp_path, "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 20 + [64] * 20)
    plant(tmp_path, "N4_g0_s0", 4, 0.0, 0, 0.5, [0] * 30 + [64] * 10)
    cfg = maze_report.Config(runs=str(tmp_path / "runs" / "N*"), evals=str(tmp_path / "evals"),
                             sft=str(tmp_path / "absent.json"), figure=str(tmp_path / "f.png"),
                             figure_n=str(tmp_path / "n.png"), table=str(tmp_path / "t.md"), iters=100)
    maze_report.main(cfg)
    assert (tmp_path / "n.png").read_bytes()[:4] == b"\x89PNG"
    assert "| s0 running |" in (tmp_path / "t.md").read_text()              # 10 steps: no check yet


def test_the_driver_trains_in_chunks_until_the_rule_holds(tmp_path, monkeypatch):
    """bench/maze_converge.main with train.py and evaluate.py faked: chunks of 500 steps, each a
    resume of the one before; it stops at the first checked step where RULE holds (a plateau from
    step 1,200 holds at 2,000), evaluates once, and a second call does no work; a run from another warm
    start than the block's, or into a block whose warm start is unknown, is refused."""
    import maze_converge
    model = tmp_path / "sft"
    model.mkdir()
    (model / "sft.json").write_text("{}")
    calls = []

    def fake_run(cmd, env=None):
        args = dict(zip(cmd[2::2], cmd[3::2]))
        run = Path(args.get("--out_dir", ""))
        if cmd[1].endswith("train.py"):
            steps = int(args["--steps"])
            calls.append((steps, args["--resume"]))
            rows = [{"step": t, "eval/strict/pass@1": 0.2 + 0.1 * min(t, 1200) / 1000, "eval/strict/pass@64": 0.6}
                    for t in range(100, steps + 1, 100)]
            (run / "final").mkdir(parents=True, exist_ok=True)
            (run / "ckpt").mkdir(exist_ok=True)
            (run / "final" / "progress.json").write_text(json.dumps({"step": steps}))
            (run / "run.json").write_text("{}")
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            calls.append("evaluate")
            Path(args["--out"]).write_text("{}")
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(maze_converge.subprocess, "run", fake_run)
    cfg = maze_converge.Config(gamma=0.5, model=str(model), out=str(tmp_path / "out"), results=str(tmp_path / "res"))
    maze_converge.main(cfg)
    assert calls == [(500, "false"), (1000, "true"), (1500, "true"), (2000, "true"), "evaluate"]
    assert (tmp_path / "res" / "runs" / "N8_g0.5_s0" / "metrics.jsonl").is_file()
    maze_converge.main(cfg)
    assert len(calls) == 5
    (model / "model.safetensors").write_bytes(b"other weights")        # the block's runs share one warm start
    with pytest.raises(ValueError, match="not the warm start of --results"):
        maze_converge.Config(gamma=1, model=str(model), out=str(tmp_path / "out"), results=str(tmp_path / "res"))
    (tmp_path / "res" / "warm_start.json").unlink()                    # runs of an unknown warm start
    with pytest.raises(ValueError, match="which warm start they share is unknown"):
        maze_converge.Config(gamma=1, model=str(model), out=str(tmp_path / "out"), results=str(tmp_path / "res"))


def test_the_driver_trains_each_weighting_under_its_own_name(tmp_path, monkeypatch):
    """A rival's arm passes train.py its --weighting (and k, the unlikeliness beta) and no --gamma, under a name
    of its own; F-GRPO's arms keep theirs; a gamma with a rival, or a k over N, is refused."""
    import maze_converge
    model = tmp_path / "sft"
    model.mkdir()
    (model / "sft.json").write_text("{}")
    base = dict(model=str(model), out=str(tmp_path / "out"), results=str(tmp_path / "res"))
    for kw, name, flags in [(dict(gamma=0.5), "N8_g0.5_s0", ["--gamma", "0.5"]),
                            (dict(weighting="maxrl"), "N8_maxrl_s0", ["--weighting", "maxrl"]),
                            (dict(weighting="passk", seed=2), "N8_passk4_s2", ["--weighting", "passk", "--passk_k", "4"]),
                            (dict(unlikely_beta=0.25), "N8_g0_u0.25_s0", ["--gamma", "0.0", "--unlikely_beta", "0.25"])]:
        assert maze_converge.arm(maze_converge.Config(**kw, **base)) == (name, flags)
    for kw in (dict(weighting="maxrl", gamma=0.5), dict(weighting="passk", passk_k=9)):
        with pytest.raises(ValueError):
            maze_converge.Config(**kw, **base)


def test_the_driver_stops_where_train_py_failed(tmp_path, monkeypatch, capsys):
    """train.py refused (exit 2, its one line): the driver exits with its code, and the block gets no
    warm-start stamp nor a copy of a run that never trained."""
    import maze_converge
    model = tmp_path / "sft"
    model.mkdir()
    (model / "sft.json").write_text("{}")
    monkeypatch.setattr(maze_converge.subprocess, "run", lambda cmd, env=None: SimpleNamespace(returncode=2))
    cfg = maze_converge.Config(gamma=0.5, model=str(model), out=str(tmp_path / "out"), results=str(tmp_path / "res"))
    with pytest.raises(SystemExit) as e:
        maze_converge.main(cfg)
    assert e.value.code == 2 and not (tmp_path / "res").exists()


def report_cfg(tmp_path, runs="runs/N*", sft="absent.json"):
    return maze_report.Config(runs=str(tmp_path / runs), evals=str(tmp_path / "evals"), sft=str(tmp_path / sft),
                              figure=str(tmp_path / "f.png"), table=str(tmp_path / "t.md"), iters=10)


def refused(cfg, capsys):
    with pytest.raises(SystemExit) as e:
        maze_report.main(cfg)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def stamp(block, sha):
    (block / "warm_start.json").write_text(json.dumps({"model": "m", "sha256": sha}))


def test_runs_of_two_warm_starts_are_refused(tmp_path, capsys):
    """Arms are paired by seed: a GRPO run of one warm start against an F-GRPO run of another is no pair."""
    for block, sha in (("a", "1" * 64), ("b", "2" * 64)):
        plant(tmp_path / block, f"N8_g{0 if block == 'a' else 0.5}_s0", 8, 0.0 if block == "a" else 0.5, 0, 0.5)
        stamp(tmp_path / block, sha)
    cfg = report_cfg(tmp_path, runs="*/runs/N*")
    assert "mixes warm starts" in refused(cfg, capsys)
    stamp(tmp_path / "b", "1" * 64)                       # one warm start, stamped in two blocks
    maze_report.main(cfg)
    assert (tmp_path / "t.md").is_file()


def test_an_sft_evaluation_of_another_block_is_refused(tmp_path, capsys):
    plant(tmp_path / "a", "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 20 + [64] * 20)
    stamp(tmp_path / "a", "1" * 64)
    plant(tmp_path / "b", "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 20 + [64] * 20)
    stamp(tmp_path / "b", "2" * 64)
    (tmp_path / "b" / "evals" / "sft.json").write_text((tmp_path / "b" / "evals" / "N8_g0_s0.json").read_text())
    err = refused(report_cfg(tmp_path, runs="a/runs/N*", sft="b/evals/sft.json"), capsys)
    assert "--sft" in err and "sha256 222222222222" in err and "sha256 111111111111" in err


def test_mixed_maze_sizes_and_folders_that_are_not_runs_are_refused(tmp_path, capsys):
    plant(tmp_path, "N8_g0_s0", 8, 0.0, 0, 0.5)
    plant(tmp_path, "N8_g0.5_s0", 8, 0.5, 0, 0.5)
    run = tmp_path / "runs" / "N8_g0.5_s0" / "run.json"
    c = json.loads(run.read_text())
    c["config"]["maze_size"] = 9
    run.write_text(json.dumps(c))
    assert "mixes maze sizes" in refused(report_cfg(tmp_path), capsys)
    c["config"]["maze_size"] = 0
    run.write_text(json.dumps(c))
    (tmp_path / "runs" / "N8_notes").mkdir()                     # a folder the glob matches, no run in it
    err = refused(report_cfg(tmp_path), capsys)
    assert "N8_notes" in err and "run.json or metrics.jsonl" in err


@pytest.mark.parametrize("damage", ["run.json", "metrics.jsonl", "eval"])
def test_a_damaged_file_is_one_line_naming_it(tmp_path, capsys, damage):
    """A cut run.json, a cut line inside metrics.jsonl (not its last: a killed write train.py's resume
    drops) or a cut evaluation: exit 2 naming the file, no traceback, nothing written."""
    plant(tmp_path, "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 20 + [64] * 20)
    run = tmp_path / "runs" / "N8_g0_s0"
    f = {"run.json": run / "run.json", "metrics.jsonl": run / "metrics.jsonl",
         "eval": tmp_path / "evals" / "N8_g0_s0.json"}[damage]
    if damage == "metrics.jsonl":
        lines = f.read_text().splitlines()
        f.write_text("\n".join(lines[:3] + [lines[3][:9]] + lines[4:]) + "\n")
    else:
        f.write_text(f.read_text()[:20])
    err = refused(report_cfg(tmp_path), capsys)
    assert str(f) in err
    assert not (tmp_path / "t.md").exists()


def test_each_run_shows_its_recent_evaluations_and_the_collapse_test(tmp_path):
    """"None collapses" was said of runs one of which met the plan's own collapse test at its stop. The
    per-run table now says it run by run (pass@64 - pass@1 at the last two of train.py's evaluations,
    how many are under 2 points), beside the mean pass@1 of the last --last evaluations, both paired
    with GRPO at the seed. Planted: evaluations at steps 5 and 10 with pass@1 0.2 and 0.3."""
    plant(tmp_path, "N8_g0_s0", 8, 0.0, 0, 0.21, [0] * 20 + [64] * 20)      # gaps 1.0 and 1.0: collapsed
    plant(tmp_path, "N8_g0.5_s0", 8, 0.5, 0, 0.5, [32] * 40)                 # gaps 30 and 30
    rows = [json.loads(line) for line in (tmp_path / "runs" / "N8_g0.5_s0" / "metrics.jsonl").read_text().splitlines()]
    rows[9]["eval/strict/pass@1"] = 0.5                                       # its last evaluation: 0.5
    rows[9]["eval/strict/pass@64"] = 0.515                                    # gap 1.5: one under 2 points
    (tmp_path / "runs" / "N8_g0.5_s0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = maze_report.Config(runs=str(tmp_path / "runs" / "N*"), evals=str(tmp_path / "evals"), sft=str(tmp_path / "x"),
                             figure=str(tmp_path / "f.png"), table=str(tmp_path / "t.md"), iters=10, last=1)
    maze_report.main(cfg)
    text = (tmp_path / "t.md").read_text()
    part = text[text.index("Per run"):]
    assert "| 8 | GRPO | 0 | 10 | 50.0 | 30.0 (10–10) | – | 1.0, 1.0 (collapsed) | 2 of 2 | 1.0 |" in part, part
    assert "| 8 | F-GRPO γ=0.5 | 0 | 10 | 50.0 | 50.0 (10–10) | +0.0 / +20.0 | 30.0, 1.5 | 1 of 2 | 1.5 |" in part, part
    cfg = dataclasses.replace(cfg, last=2)
    maze_report.main(cfg)
    assert "| 8 | GRPO | 0 | 10 | 50.0 | 25.0 (5–10) |" in (tmp_path / "t.md").read_text()


def test_rivals_are_arms_of_their_own_told_apart_by_their_flags(tmp_path):
    """--weighting and --unlikely_beta runs are arms of their own, named by run.json's flags (the folder names
    here lie), each paired by seed with GRPO and with F-GRPO γ=0.5; two runs of one method and seed are refused."""
    plant(tmp_path, "a", 8, 0.0, 0, 0.5, [0] * 20 + [64] * 20)                                 # GRPO: 50
    plant(tmp_path, "b", 8, 0.5, 0, 0.5, [0] * 10 + [64] * 30)                                 # F-GRPO: 75
    plant(tmp_path, "N8_g0.5_s0", 8, 0.0, 0, 0.5, [0] * 30 + [64] * 10, weighting="maxrl")    # MaxRL: 25
    plant(tmp_path, "c", 8, 0.0, 0, 0.5, [64] * 40, weighting="passk", passk_k=4)              # pass@4: 100
    plant(tmp_path, "d", 8, 0.0, 0, 0.5, [0] * 40, unlikely_beta=0.25)                         # GRPO + unlikely: 0
    cfg = maze_report.Config(runs=str(tmp_path / "runs" / "*"), evals=str(tmp_path / "evals"),
                             sft=str(tmp_path / "absent.json"), figure=str(tmp_path / "f.png"),
                             table=str(tmp_path / "t.md"), iters=200)
    maze_report.main(cfg)
    text = (tmp_path / "t.md").read_text()
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| 8 | ") and "s0 " in line}
    assert list(rows) == ["GRPO", "F-GRPO γ=0.5", "MaxRL", "pass@4", "GRPO + unlikeliness β=0.25"]
    assert "| 25.0 |" in rows["MaxRL"] and "| 100.0 |" in rows["pass@4"] and "| 0.0 |" in rows["GRPO + unlikeliness β=0.25"]
    vs_grpo, vs_fgrpo = text.split("each method minus GRPO")[1].split("each method minus F-GRPO γ=0.5")
    assert "| 8 | MaxRL | 0 | -25.0" in vs_grpo and "| 8 | pass@4 | 0 | +50.0" in vs_grpo
    assert "| 8 | MaxRL | 0 | -50.0" in vs_fgrpo and "| 8 | GRPO | " not in vs_fgrpo.split("\n\n")[1]
    plant(tmp_path, "e", 8, 0.0, 0, 0.5, weighting="maxrl")
    with pytest.raises(SystemExit):
        maze_report.main(cfg)


def test_an_evaluation_is_paired_with_its_run_by_content(tmp_path, capsys):
    """EVALS/NAME.json must evaluate NAME's run: the training run evaluate.py recorded (its flags, its last
    step), not just the file name. Another seed's, another step's or an unrecorded one is refused in one
    line naming the file and why; an SFT evaluation of another warm start folder too."""
    plant(tmp_path, "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 20 + [64] * 20, model="out/sft_a")
    plant(tmp_path, "N8_g0_s1", 8, 0.0, 1, 0.5, [0] * 30 + [64] * 10, model="out/sft_a")
    evals = tmp_path / "evals"
    cfg = maze_report.Config(runs=str(tmp_path / "runs" / "N*"), evals=str(evals), sft=str(tmp_path / "absent.json"),
                             figure=str(tmp_path / "f.png"), table=str(tmp_path / "t.md"), iters=100)
    maze_report.main(cfg)                                                    # as planted: each its own
    good = {f: (evals / f).read_text() for f in ("N8_g0_s0.json", "N8_g0_s1.json")}
    for why, edit in [("other seed", lambda r: r["checkpoint"]["config"].update(seed=1)),
                      ("evaluates step 5", lambda r: r["checkpoint"].update(step=5)),
                      ("records no training run", lambda r: r.pop("checkpoint"))]:
        res = json.loads(good["N8_g0_s0.json"])
        edit(res)
        (evals / "N8_g0_s0.json").write_text(json.dumps(res))
        err = refused(cfg, capsys)
        assert why in err and "N8_g0_s0.json" in err, err
    (evals / "N8_g0_s0.json").write_text(good["N8_g0_s0.json"])
    sft = json.loads(good["N8_g0_s1.json"])
    sft["config"]["model"] = "elsewhere/sft_b"
    (evals / "sft.json").write_text(json.dumps(sft))
    assert "evaluates elsewhere/sft_b, the runs started from sft_a" in refused(
        dataclasses.replace(cfg, sft=str(evals / "sft.json")), capsys)


@pytest.mark.parametrize("damage", ["no c_walk", "32 samples a maze"])
def test_an_evaluation_without_what_the_tables_read_is_one_line(tmp_path, capsys, damage):
    """An evaluation missing a field the tables read, or with n < 64 (pass@64, the paired test's m = 64):
    a traceback before; now one line naming the file."""
    plant(tmp_path, "N8_g0_s0", 8, 0.0, 0, 0.5, [0] * 20 + [64] * 20)
    ev = tmp_path / "evals" / "N8_g0_s0.json"
    res = json.loads(ev.read_text())
    maze = res["benchmarks"]["maze"]
    if damage == "no c_walk":
        del maze["c_walk"]
    else:
        maze["n"] = 32
    ev.write_text(json.dumps(res))
    cfg = maze_report.Config(runs=str(tmp_path / "runs" / "N*"), evals=str(tmp_path / "evals"),
                             sft=str(tmp_path / "absent.json"), figure=str(tmp_path / "f.png"),
                             table=str(tmp_path / "t.md"), iters=100)
    err = refused(cfg, capsys)
    assert str(ev) in err and damage in err, err


def test_maze_converge_refuses_a_results_file_before_training(tmp_path, monkeypatch):
    import maze_converge
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "sft.json").write_text("{}")
    (tmp_path / "results").write_text("a file")
    with pytest.raises(ValueError, match="--results .*: a file, not a folder"):
        maze_converge.Config(model=str(tmp_path / "sft"), results=str(tmp_path / "results"), out=str(tmp_path / "o"))
