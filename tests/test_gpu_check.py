"""bench/gpu_check.py and bench/gpu_contact.py on the CPU with tiny shapes, as CI runs them: they need
nothing the GPU image lacks (vLLM, math-verify, datasets, the data folder, the network) and write
figures that add up; gpu_contact's update part keeps each shape it measured when a later one fails.

    python -m pytest -q tests/test_gpu_check.py          # CPU, ~1 min
"""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

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
                       capture_output=True, text=True, timeout=300, check=False)
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


def bench(name):
    """bench/NAME.py imported as a module (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peak_comes_from_the_gpu_name_or_the_flag():
    gpu_check = bench("gpu_check")
    assert gpu_check.peak_tflops(gpu_check.Config(peak_tflops=500), torch.device("cpu")) == (500, "--peak_tflops")
    assert gpu_check.peak_tflops(gpu_check.Config(), torch.device("cpu"))[0] is None
    names = {"NVIDIA H200": 989.0, "NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H100 PCIe": 756.0, "NVIDIA A100-SXM4-80GB": 312.0}
    for name, tflops in names.items():
        assert next(t for key, t in gpu_check.PEAK_TFLOPS if key in name) == tflops


def test_out_replaces_only_our_own_report(tmp_path):
    gpu_check = bench("gpu_check")
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
    still run, with figures that add up (three layer counts fitted to 28, the plan beside each); the
    varlen sub-part says it needs CUDA, and reserved memory stands beside allocated (None on the CPU)."""
    out = tmp_path / "gc"
    out.mkdir()
    killed, theirs = out / ".gpu_contact_update.json.tmp.k1ll3d", out / ".notes.json.tmp.mine"   # a kill mid-write
    killed.write_text("{")
    theirs.write_text("mine")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "FGRPO_DATA": str(tmp_path / "no_data")}
    r = subprocess.run([sys.executable, "-c", RUN, "bench/gpu_contact.py", "--tiny", "true", "--device", "cpu",
                        "--threads", "1", "--budget_s", "60", "--out_dir", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    parts = {p: json.loads((out / f"gpu_contact_{p}.json").read_text()) for p in
             ("env", "vllm", "update", "engine", "check")}
    assert all(f["written_by"] == "fgrpo bench/gpu_contact.py" for f in parts.values())
    assert not killed.exists() and theirs.read_text() == "mine"
    env_ = parts["env"]
    assert env_["status"] == "ok" and env_["torch"] and env_["vllm"].startswith("not importable")
    assert parts["vllm"]["status"] == "skipped: vLLM not installed"
    update = parts["update"]
    assert update["status"] == "ok" and set(update["shapes"]) == {"1x72", "2x64", "8x16"}
    assert update["varlen"] == {"status": "skipped: varlen needs CUDA"}
    check_update_shapes(update["shapes"], iters=update["config"]["update_iters"])
    eng = parts["engine"]
    assert eng["peak_gib"] is None and "peak_reserved_gib" in eng and eng["peak_reserved_gib"] is None
    assert eng["status"] == "ok" and eng["rows"] == 16 and eng["tok_s"] > 0 and 0 < eng["peak_kv_gib"] < eng["plan_engine_gib"]
    # --tis_cap 2 on the engine's rows: fp32 on the CPU, so pi_old / pi_engine is 1 up to rounding
    assert set(eng["tis_cap2"]) == {"token", "sequence"}
    assert all(abs(v["mean"] - 1) < 1e-4 and v["capped"] == 0 for v in eng["tis_cap2"].values()), eng["tis_cap2"]
    assert parts["check"]["status"].startswith("skipped: ") and "under 120" in parts["check"]["status"]
    assert "done: env ok, vllm skipped: vLLM not installed, update ok, engine ok" in r.stdout


def check_update_shapes(shapes, iters):
    """What part (c) must measure: each shape in both layouts (no varlen one off CUDA), the multi-row ones
    with mixed lengths (the padded layout forwards padding, the padding-free one none); seconds the median
    of >= 2 timed iterations; FLOPs from the non-embedding weights; the attention ops the profiler saw;
    time, plan and weights fitted over 1, 2 and 4 layers and extrapolated to 28, or the time said too noisy."""
    vocab, hidden = 512, 128                                      # gpu_contact.TINY_LLM, untied
    for name, shape in shapes.items():
        pad, flat = shape["padded"], shape["padding_free"]
        assert set(shape) == {"rows", "row_len", "padded", "padding_free"}
        assert pad["tokens"] == flat["tokens"] == flat["padded_tokens"]      # the same sequences, no padding
        if shape["rows"] > 1:                                     # mixed lengths: the padded layout pads
            assert pad["padded_tokens"] == shape["rows"] * shape["row_len"] > pad["tokens"], name
        else:
            assert pad["padded_tokens"] == pad["tokens"] == shape["row_len"]
        for layout in (pad, flat):
            f1, f2, f4 = layout["layers"]["1"], layout["layers"]["2"], layout["layers"]["4"]
            for f in (f1, f2, f4):
                assert len(f["iteration_s"]) == iters >= 2 and f["seconds"] == statistics.median(f["iteration_s"])
                assert f["embedding_params"] == vocab * hidden
                assert f["non_embedding_params"] == f["params"] - f["embedding_params"]
                head = vocab * hidden                             # the LM head: completion tokens only
                assert f["flops"] == 6 * (f["non_embedding_params"] - head) * f["tokens"] \
                    + 6 * head * f["completion_tokens"]
                assert f["completion_tokens"] < f["tokens"] and f["plan_gib"] > 0 and f["mfu"] is None
                assert f["peak_gib"] is None and f["peak_reserved_gib"] is None    # no CUDA memory to read
            # the CPU's SDPA ran (the profiler's op names; CUDA's are kernel names), profiled at 1 layer only
            assert "aten::scaled_dot_product_attention" in f1["attention_kernels"], f1["attention_kernels"]
            assert f2["attention_kernels"] is None and f4["attention_kernels"] is None
            assert f1["params"] < f2["params"] < f4["params"]
            at28 = layout["extrapolated_28_layers"]
            assert at28["params"] == pytest.approx(f1["params"] + 27 * (f2["params"] - f1["params"]))   # exactly linear
            assert at28["plan_gib"] > f4["plan_gib"] and at28["mfu"] is None     # no GPU peak
            if at28["seconds"] is None:                                  # a 2-core CPU's timings: often noise
                assert "timing too noisy to extrapolate" in at28["note"] and at28["tok_s"] is None
            else:
                assert at28["seconds"] >= f4["seconds"]
                assert at28["tok_s"] == pytest.approx(layout["tokens"] / at28["seconds"])


@pytest.fixture
def group(tmp_path):
    """A process group of one (gloo) for FSDP2, gone after the test."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.slow                          # builds two tiny models and trains them: seconds
def test_update_part_keeps_each_shape_when_a_later_one_fails(tmp_path, monkeypatch, group):
    """The update part's JSON is rewritten, atomically, after each shape: when the second shape raises,
    the first one's figures are on disk already ("running", before the failure) and stay in the part's
    final JSON beside the error. Before, the part wrote only when it ended, and an error lost them all."""
    gc = bench("gpu_contact")
    cfg = gc.Config(tiny=True, device="cpu", out_dir=str(tmp_path), part="update")
    path, calls, on_disk = tmp_path / "gpu_contact_update.json", [], []
    time_update = gc.time_update

    def second_shape_fails(model, opt, batch, iters, device, profiled=False):
        calls.append(batch["input_ids"].shape)
        if len(calls) > len(gc.LAYOUTS):                          # the first shape, both layouts, is done
            on_disk.append(json.loads(path.read_text()))
            raise RuntimeError("the second shape fails")
        return time_update(model, opt, batch, iters, device, profiled)
    monkeypatch.setattr(gc, "time_update", second_shape_fails)
    fig = gc.run_part(cfg, "update", lambda record: gc.part_update(cfg, torch.device("cpu"), print,
                                                                   time.perf_counter() + 60, None, record), print)
    first = {"1x72"}                                              # gc.TINY_SHAPES[0]
    assert on_disk and on_disk[0]["status"] == "running" and set(on_disk[0]["shapes"]) == first
    final = json.loads(path.read_text())
    assert final["written_by"] == "fgrpo bench/gpu_contact.py" and fig["status"] == final["status"]
    assert final["status"] == "error: RuntimeError: the second shape fails" and "traceback" in final
    assert set(final["shapes"]) == first
    assert all(final["shapes"]["1x72"][k]["layers"]["1"]["seconds"] > 0 for k in gc.LAYOUTS)   # the first count
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".gpu_contact_update.json.tmp")]   # atomic


def test_update_sequences_are_mixed_and_seeded():
    """Part (c)'s multi-row shapes: the longest row is the shape's length (the plan row's padded width),
    the others 40-100% of it, longest first, the same for the same seed; each prompt T // 8 (<= 1,024)."""
    gc = bench("gpu_contact")
    for rows, T in gc.UPDATE_SHAPES + gc.TINY_SHAPES:
        prompts, completions = gc.update_sequences(rows, T, 512, rows)
        lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
        assert lengths[0] == T and lengths == sorted(lengths, reverse=True) and min(lengths) >= int(0.4 * T)
        assert all(len(p) == min(1024, T // 8) for p in prompts) and min(map(len, completions)) >= 1
        if rows > 1:
            assert len(set(lengths)) > 1                          # unequal: the padded layout pads
        assert gc.update_sequences(rows, T, 512, rows) == (prompts, completions)


def test_the_28_layer_fit_never_goes_below_what_was_measured():
    """The two-count line through noisy CPU timings once gave a negative 28-layer time. Now a least-squares
    line over three counts, refused (None) when it slopes down or lands below the largest count's figure;
    extrapolate then says so, keeps the measured figures, and leaves tok/s and MFU out."""
    gc = bench("gpu_contact")
    assert gc.fit_to([1, 2, 4], [3.0, 5.0, 9.0]) == pytest.approx(57.0)         # 1 + 2 x: exactly linear
    assert gc.fit_to([1, 2, 4], [0.3, 0.31, 0.29]) is None                        # slopes down: noise
    assert gc.fit_to([1, 2, 4], [0.1, 0.9, 0.2], at=5) is None                    # up, but under the 4-layer 0.2
    assert gc.fit_to([1, 2, 4], [1.0, 1.1, 1.35]) == pytest.approx(0.875 + 28 * 0.55 / (14 / 3))   # noisy, rising
    fig = lambda s, mem: {"seconds": s, "peak_gib": mem, "peak_reserved_gib": mem, "plan_gib": 2.0 * mem,
                          "params": 10, "non_embedding_params": 8, "flops": 60}
    entry = {"tokens": 100, "layers": {"1": fig(0.5, 1.0), "2": fig(0.4, 2.0), "4": fig(0.45, 4.0)}}
    gc.extrapolate(entry, peak=989.0)
    at28 = entry["extrapolated_28_layers"]
    assert at28["seconds"] is None and at28["tok_s"] is None and at28["mfu"] is None
    assert at28["note"].startswith("timing too noisy to extrapolate") and "the measured figures stand" in at28["note"]
    assert at28["peak_gib"] == pytest.approx(28.0) and at28["plan_gib"] == pytest.approx(56.0)
    assert entry["layers"]["4"]["seconds"] == 0.45                                # the measurement is kept
    entry["layers"]["4"] = fig(0.45, 0.5)                                           # memory noisy too
    gc.extrapolate(entry, peak=989.0)
    assert entry["extrapolated_28_layers"]["note"].startswith("memory and timing too noisy to extrapolate")
    entry["layers"] = {"1": fig(0.1, 1.0), "2": fig(0.2, 2.0), "4": fig(0.4, 4.0)}    # clean: a fit, and MFU
    gc.extrapolate(entry, peak=989.0)
    at28 = entry["extrapolated_28_layers"]
    assert at28["seconds"] == pytest.approx(2.8) and "note" not in at28 and at28["tok_s"] == pytest.approx(100 / 2.8)
    assert at28["mfu"] == pytest.approx(60 / 2.8 / 1e12 / 989.0)
