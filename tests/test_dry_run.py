"""bench/dry_run.py: train.py's own update on fake tensors over a fake process group, set beside the memory plan.

    python -m pytest -q tests/test_dry_run.py          # ~40 s on 2 cores

Qwen2.5-1.5B's config.json at full width (its 151,936-token vocabulary), 8 ranks, a CUDA plan (bf16 compute,
checkpointing), 4 and 8 decoder layers extrapolated to 28: the same code and comparison as the 7B's run
(RESULTS.md), small enough for CI. The comparison must catch a plan that is wrong, and the measurement must
follow the code it runs, not the plan.
"""
import re
import sys

import pytest

from conftest import ROOT
from launch import run

pytestmark = pytest.mark.slow          # six dry runs, ~70 s

SMALL = ["--nproc", "8", "--layers", "8", "--max_response_len", "2048"]
# the dry run in a child whose memory plan is broken first: `patch` edits fgrpo_utils.memory_plan
PATCHED = ("import runpy, sys\n"
           "sys.path.insert(0, {root!r})\n"
           "from fgrpo_utils import memory_plan\n"
           "{patch}\n"
           "sys.argv = ['bench/dry_run.py', *sys.argv[1:]]\n"
           "runpy.run_path('bench/dry_run.py', run_name='__main__')\n")


def dry_run(data, *flags, patch="pass"):
    cmd = [sys.executable, "-c", PATCHED.format(root=str(ROOT), patch=patch), "--model",
           str(data / "models" / "qwen2.5-1.5b"), *SMALL, *flags]
    return run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def table(out):
    """{(phase, layers): (measured, plan)} from the printed table."""
    rows = re.findall(r"^(old_logp|update|step)\s+(\d+)\s+([\d.]+)\s+([\d.]+|-)", out, re.M)
    return {(ph, int(n)): (float(m), None if p == "-" else float(p)) for ph, n, m, p in rows}


def test_the_plan_agrees_with_the_update_it_plans(data):
    r = dry_run(data)
    assert r.returncode == 0, r.stdout + r.stderr
    t = table(r.stdout)
    assert set(t) == {(ph, n) for ph in ("old_logp", "update", "step") for n in (4, 8)}, r.stdout
    for (ph, n), (measured, plan) in t.items():
        if plan is not None:
            assert measured == pytest.approx(plan, rel=0.10), (ph, n, r.stdout)
    # each measured layer adds its shard of weights, gradients and moments and its kept input: the update grows
    assert t[("update", 8)][0] > t[("update", 4)][0] and t[("step", 8)][0] > t[("step", 4)][0]
    assert re.search(r"extrapolated to 28 layers from 4 and 8: update [\d.]+ GiB \(plan [\d.]+\)", r.stdout)
    assert "CUDA runtime 1.50 GiB" in r.stdout and "modelled, not measured" in r.stdout
    assert "agree with the measurement within 10%" in r.stdout


def test_a_plan_that_misses_memory_is_caught(data):
    """A plan that keeps a quarter of the activations it should: exit 1, one line naming the phase and both
    figures. A tolerance no plan meets: exit 1 too."""
    quarter = ("f = memory_plan.activation_bytes_per_token\n"
               "memory_plan.activation_bytes_per_token = lambda c, d, ckpt, *a, **k: f(c, d, ckpt, *a, **k) // 4")
    r = dry_run(data, patch=quarter)
    assert r.returncode == 1, r.stdout + r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: the plan's update phase differs from the measurement by more than 10%"), line
    assert re.search(r"update at \d+ layers measured [\d.]+ GiB, plan [\d.]+", line)
    r = dry_run(data, "--tolerance", "0.001")
    assert r.returncode == 1 and "differs from the measurement by more than 0%" in r.stderr, r.stderr


def test_the_measurement_follows_the_code_not_the_plan(data):
    """Without checkpointing the trainer keeps every layer's activations: the measured update grows by
    about what the plan says it should, so the measurement reads the code and not the plan's numbers."""
    on, off = (table(dry_run(data, "--grad_checkpointing", flag).stdout) for flag in ("true", "false"))
    assert off[("update", 8)][0] > 1.5 * on[("update", 8)][0]
    assert off[("update", 8)][0] == pytest.approx(off[("update", 8)][1], rel=0.10)
    assert on[("step", 8)] == off[("step", 8)]


def test_bad_flags_are_one_line(data):
    r = run([sys.executable, "bench/dry_run.py", "--model", str(data / "models" / "qwen2.5-1.5b"), "--layers", "1"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--layers 1" in r.stderr, r.stderr
    r = run([sys.executable, "bench/dry_run.py", "--model", str(data / "models" / "qwen2.5-1.5b"), "--nproc", "3"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--nproc 3" in r.stderr, r.stderr
