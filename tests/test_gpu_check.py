"""bench/gpu_check.py on the CPU with tiny shapes, as CI runs it: it needs nothing the GPU image lacks
(vLLM, math-verify, datasets, the data folder, the network) and prints figures that add up.

    python -m pytest -q tests/test_gpu_check.py          # CPU, ~15 s
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The GPU image has PyTorch and transformers only: make these imports fail, as they would there.
ABSENT = ("vllm", "math_verify", "datasets")
RUN = ("import runpy, sys\n"
       f"for name in {ABSENT!r}:\n"
       "    sys.modules[name] = None\n"
       "sys.argv = sys.argv[1:]\n"
       "runpy.run_path(sys.argv[0], run_name='__main__')\n")


@pytest.mark.slow                          # a subprocess that builds and trains two models: seconds
def test_tiny_gpu_check_runs_on_the_cpu_with_only_torch_and_transformers(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "FGRPO_DATA": str(tmp_path / "no_data")}
    # --budget_s 1: the maze part starts after its deadline, so it stops after one timed step.
    r = subprocess.run([sys.executable, "-c", RUN, "bench/gpu_check.py", "--tiny", "true", "--device", "cpu",
                        "--threads", "1", "--steps", "2", "--budget_s", "1", "--out", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["total_s"] < 60                                # the CPU smoke run's budget
    assert report["parts"]["maze"]["timed_steps"] == 1 and "maze: stopping after 1 timed step" in r.stdout
    assert "| part | figure | value |" in r.stdout and "update TFLOP/s, MFU" in r.stdout
    llm, mz = report["parts"]["llm"], report["parts"]["maze"]
    # No stop token: every completion runs to its cap, so the token counts are known exactly.
    assert llm["completion_tokens_per_step"] == 4 * 4 * 8 and llm["update_tokens_per_step"] == 4 * 4 * (16 + 8)
    assert mz["completion_tokens_per_step"] == 8 * 4 * 34 and mz["prompt_tokens"] == 59 and mz["mini_batches"] == 1
    assert llm["mini_batches"] == 4 and mz["old_logp_s"] < 1e-3 < llm["old_logp_s"]   # on- / off-policy
    assert llm["mixed_groups_per_step"] > 0                      # the update had something to learn from
    for f in (llm, mz):
        parts = sum(f[k] for k in ("rollout_s", "reward_s", "old_logp_s", "train_s", "weight_sync_s"))
        assert 0 < parts <= f["step_s"] * (1 + 1e-6) and f["rollout_tok_s"] > 0 and f["update_tflop_s"] > 0
        assert f["mfu"] is None and f["peak_mem_gib"] is None   # no GPU: no peak to divide by, no CUDA memory
        assert f["syncs_per_decode_step"] is None                 # counted by CUDA's sync debug mode only
    assert llm["plan_gib"] > 0 and llm["plan_phase"] in ("rollout", "update", "step", "sync")   # beside the peak
    assert report["written_by"] == "fgrpo bench/gpu_check.py"


def test_peak_comes_from_the_gpu_name_or_the_flag():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    import torch
    assert gpu_check.peak_tflops(gpu_check.Config(peak_tflops=500), torch.device("cpu")) == (500, "--peak_tflops")
    assert gpu_check.peak_tflops(gpu_check.Config(), torch.device("cpu"))[0] is None
    names = {"NVIDIA H200": 989.0, "NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H100 PCIe": 756.0, "NVIDIA A100-SXM4-80GB": 312.0}
    for name, tflops in names.items():
        assert next(t for key, t in gpu_check.PEAK_TFLOPS if key in name) == tflops


def test_out_replaces_only_our_own_report(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    mine = tmp_path / "mine.json"
    mine.write_text('{"config": {}, "notes": "mine"}')
    with pytest.raises(ValueError, match="gpu_check.py did not write it"):
        gpu_check.Config(out=str(mine))
    mine.write_text(json.dumps({"written_by": "fgrpo evaluate.py"}))     # ours, but another script's result
    with pytest.raises(ValueError, match="gpu_check.py did not write it"):
        gpu_check.Config(out=str(mine))
    mine.write_text(json.dumps({"written_by": "fgrpo bench/gpu_check.py"}))
    gpu_check.Config(out=str(mine))                               # ours: may be replaced


@pytest.mark.slow                          # a subprocess that builds six small models: seconds
def test_first_contact_script_runs_every_part_without_vllm(tmp_path):
    """bench/gpu_contact.py --tiny true on the CPU, with vLLM, math-verify and datasets made absent as
    on the GPU image: each part writes its own JSON, the vLLM part says it was skipped and the others
    still run, with figures that add up (two layer counts extrapolated to 28, the plan beside each)."""
    out = tmp_path / "gc"
    out.mkdir()
    killed, theirs = out / ".gpu_contact_update.json.tmp.k1ll3d", out / ".notes.json.tmp.mine"   # a kill mid-write
    killed.write_text("{")
    theirs.write_text("mine")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "FGRPO_DATA": str(tmp_path / "no_data")}
    r = subprocess.run([sys.executable, "-c", RUN, "bench/gpu_contact.py", "--tiny", "true", "--device", "cpu",
                        "--threads", "1", "--budget_s", "60", "--out_dir", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    parts = {p: json.loads((out / f"gpu_contact_{p}.json").read_text()) for p in
             ("env", "vllm", "update", "engine", "check")}
    assert all(f["written_by"] == "fgrpo bench/gpu_contact.py" for f in parts.values())
    assert not killed.exists() and theirs.read_text() == "mine"
    env_ = parts["env"]
    assert env_["status"] == "ok" and env_["torch"] and env_["vllm"].startswith("not importable")
    assert parts["vllm"]["status"] == "skipped: vLLM not installed"
    shapes = parts["update"]["shapes"]
    assert parts["update"]["status"] == "ok" and set(shapes) == {"1x72", "2x64", "8x16"}
    for f in shapes.values():
        assert f["2"]["params"] < f["4"]["params"] and all(f[k]["seconds"] > 0 and f[k]["plan_update_gib"] > 0
                                                           for k in ("2", "4"))
        at28 = f["extrapolated_28_layers"]
        assert at28["params"] == pytest.approx(f["2"]["params"] + 13 * (f["4"]["params"] - f["2"]["params"]))
        assert at28["plan_update_gib"] > f["4"]["plan_update_gib"] and at28["mfu"] is None   # no GPU peak
    eng = parts["engine"]
    assert eng["status"] == "ok" and eng["rows"] == 16 and eng["tok_s"] > 0 and 0 < eng["peak_kv_gib"] < eng["plan_engine_gib"]
    assert parts["check"]["status"].startswith("skipped: ") and "under 120" in parts["check"]["status"]
    assert "done: env ok, vllm skipped: vLLM not installed, update ok, engine ok" in r.stdout
