"""bench/compare_runs.py pairs runs by their run.json, never by folder names: overlapping globs, a copied
run, a group of mixed settings or another task are refused in one line; a killed run's cut last line is
dropped; an empty log is one line. `python -m pytest -q tests/test_compare_runs.py`"""
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import compare_runs  # noqa: E402


def plant(root, name, seed, gamma=0.0, task="maze", steps=12, rewards=None):
    run = root / name
    run.mkdir(parents=True)
    config = {"task": task, "gamma": gamma, "seed": seed, "group_size": 8, "out_dir": str(run), "engine": "torch"}
    (run / "run.json").write_text(json.dumps({"config": config}))
    rows = [{"step": t, "reward/mean": (rewards or (lambda t: 0.1 + gamma * 0.01 * t + 0.01 * seed))(t),
             "logp/diff_max": 1e-6, "time/rollout": 0.1, "time/weight_sync": 0.01} for t in range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def refused(cfg, capsys):
    with pytest.raises(SystemExit) as e:
        compare_runs.main(cfg)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_groups_are_paired_by_content(tmp_path, capsys):
    for s in (0, 1, 2):
        plant(tmp_path, f"g0_s{s}", s)
        plant(tmp_path, f"g0.5_s{s}", s, gamma=0.5)
    ok = compare_runs.Config(a=str(tmp_path / "g0_s*"), b=str(tmp_path / "g0.5_s*"))
    compare_runs.main(ok)
    out = capsys.readouterr().out
    assert "A: 3 runs" in out and "B: 3 runs" in out and "A and B differ in gamma 0.0 vs 0.5" in out
    # "g0*" also matches the gamma 0.5 runs: the group mixes settings, and the two globs overlap
    assert "mixes runs of other settings (gamma)" in refused(compare_runs.Config(a=str(tmp_path / "g0*"),
                                                                                 b=str(tmp_path / "g0.5_s*")), capsys)
    assert "both match" in refused(compare_runs.Config(a=str(tmp_path / "g0.5_s[01]"), b=str(tmp_path / "g0.5_s*")),
                                   capsys)
    shutil.copytree(tmp_path / "g0_s1", tmp_path / "g0_s1_copy")             # the same run, counted twice
    assert "are one run" in refused(compare_runs.Config(a=str(tmp_path / "g0_s*"), b=ok.b), capsys)
    shutil.rmtree(tmp_path / "g0_s1_copy")
    plant(tmp_path / "other", "g0_s0", 0, task="math")
    assert "another task (maze vs math)" in refused(compare_runs.Config(a=ok.a, b=str(tmp_path / "other" / "*")), capsys)


def test_a_killed_runs_cut_line_is_dropped_and_an_empty_log_refused(tmp_path, capsys):
    for s in (0, 1):
        plant(tmp_path, f"a_s{s}", s)
        plant(tmp_path, f"b_s{s}", s, gamma=0.5)
    with open(tmp_path / "b_s1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "reward/me')                                     # killed mid-line
    cfg = compare_runs.Config(a=str(tmp_path / "a_s*"), b=str(tmp_path / "b_s*"))
    compare_runs.main(cfg)
    assert "first 12 steps" in capsys.readouterr().out
    (tmp_path / "b_s1" / "metrics.jsonl").write_text("")
    assert "no step logged" in refused(cfg, capsys)
    (tmp_path / "b_s1" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "reward/mean": 0.1}\n')
    assert "a row without reward/mean" in refused(cfg, capsys)
    (tmp_path / "b_s1" / "run.json").unlink()
    assert "without run.json" in refused(cfg, capsys)
