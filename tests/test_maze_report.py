"""bench/maze_report.py on planted run folders and results: every run is reported, the numbers are
the files' numbers. `python -m pytest -q tests/test_maze_report.py`"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import maze_report  # noqa: E402
from advantage import pass_at_k_curve  # noqa: E402


def plant(tmp_path, name, N, gamma, seed, pass64, counts=None):
    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"config": {"group_size": N, "gamma": gamma, "seed": seed,
                                                         "maze_reward": "strict"}}))
    rows = [{"step": t, "reward/mean": 0.1 * t / 10} for t in range(1, 11)]
    rows[4].update({"eval/strict/pass@1": 0.2, "eval/strict/pass@64": pass64})
    rows[9].update({"eval/strict/pass@1": 0.3, "eval/strict/pass@64": pass64 + 0.1})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if counts is not None:
        c = np.asarray(counts)
        res = {"config": {}, "benchmarks": {"maze": {
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
                             figure=str(tmp_path / "f.png"), table=str(tmp_path / "t.md"), early=5, iters=2000)
    maze_report.main(cfg)
    text = (tmp_path / "t.md").read_text()
    grpo = next(line for line in text.splitlines() if "| GRPO |" in line)
    assert "| 37.5 ± 12.5 |" in grpo                       # mean of 50 and 25, SE 12.5
    assert "+55.0 ± 5.0" in grpo                           # SFT 1.0 minus the early pass@64 (0.5, 0.4)
    fgrpo = next(line for line in text.splitlines() if "| F-GRPO γ=0.5 |" in line)
    assert "no final eval: seed 1" in fgrpo and "| 2 | 50.0 | 100.0 |" in fgrpo
    paired = [line for line in text.splitlines() if line.startswith("| 8 | F-GRPO γ=0.5 | 0 |")]
    assert len(paired) == 1 and "+0.0" in paired[0].split("|")[4] and "*" in paired[0].split("|")[5]
    assert (tmp_path / "f.png").stat().st_size > 0
