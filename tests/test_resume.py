"""train.py when things go wrong: kills at any moment, damaged checkpoints, resuming another experiment, a
full disk, retention; and the math task's exports. `python -m pytest -q tests/test_resume.py`"""
import json
import shutil

import pytest
import torch

from test_train import ENV, PY, ROOT, assert_same_metrics, read_metrics, train_cmd
import launch

pytestmark = pytest.mark.slow             # every test here runs train.py: minutes in all

# -----------------------------------------------------------------------------
# What goes wrong: kills at any moment, damaged checkpoints, resuming another experiment

TINY = ["--task", "maze", "--prompts_per_step", "2", "--mini_batch_prompts", "1", "--group_size", "2",
        "--warmup_steps", "0", "--save_every", "1", "--sample_every", "0", "--eval_mazes", "0"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """4 steps of maze RL from a random 3.9M policy, a checkpoint every step, --eval_mazes 0. Rewards
    are all 0, but weight decay moves the weights, so the logged entropy checks what a resume restored.
    All 4 checkpoints are kept (--keep_checkpoints 4) for the damage tests."""
    import maze
    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    maze.save_sft(maze.build_model(), maze.build_tokenizer(), root / "policy", {"config": {"size": 7}})
    flags = train_cmd("--model", str(root / "policy"), *TINY, "--keep_checkpoints", "4")
    r = launch.run(flags + ["--steps", "4", "--out_dir", str(root / "run")], cwd=ROOT, env=ENV,
                   capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return flags, root / "run"


def test_eval_mazes_zero_runs_to_the_export(tiny_run):
    """--eval_mazes 0 used to crash at the last step (an evaluation of no mazes), before the export."""
    _, run = tiny_run
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3, 4]
    assert not any(k.startswith("eval/") for m in read_metrics(run) for k in m) and (run / "final" / "model.safetensors").exists()


def test_run_json_records_the_code_that_ran(tiny_run):
    """The sha256 of each of the program's files the run imported, fgrpo_utils/'s included (the course's
    grader ties a run to the hand-in's graded files by them)."""
    import hashlib
    code = json.loads((tiny_run[1] / "run.json").read_text())["code"]
    assert {"advantage.py", "rollout.py", "maze.py", "train.py", "fgrpo_utils/run_folder.py", "fgrpo_utils/logprob.py",
            "fgrpo_utils/policy.py", "fgrpo_utils/distributed.py", "fgrpo_utils/metrics.py"} <= set(code), sorted(code)
    assert all(code[f] == hashlib.sha256((ROOT / f).read_bytes()).hexdigest() for f in code)


def resume(flags, run, steps):
    r = launch.run(flags + ["--steps", str(steps), "--out_dir", str(run), "--resume", "true"], cwd=ROOT,
                   env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_resume_after_a_kill_between_the_rename_and_latest(tiny_run, tmp_path):
    """The old save renamed step_000004 into place and then pointed ckpt/latest at it; a kill between
    the two left latest at step 3, and every resume redid step 4 and died renaming onto the existing
    step_000004 (OSError: Directory not empty). Resume now takes the newest whole step folder."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    (run / "ckpt" / "latest").write_text("step_000003\n")
    r = resume(flags, run, 5)                                  # --steps may change on resume
    assert "resumed from step 4" in r.stdout
    got = read_metrics(run)
    assert [m["step"] for m in got] == [1, 2, 3, 4, 5]
    assert_same_metrics(got[:4], read_metrics(whole))


def test_damaged_checkpoints_fall_back_to_the_last_whole_one(tiny_run, tmp_path):
    """A truncated shard (step 4), DCP .metadata (step 3) and meta.json (step 2): resume warns, naming
    each, continues from step 1 exactly as the first run went, and replaces the damaged folders.
    What killed runs left under our temp names goes; a file of someone else's stays."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    ckpt = run / "ckpt"
    for path, size in [(ckpt / "step_000004" / "__0_0.distcp", 1000), (ckpt / "step_000003" / ".metadata", 100),
                       (ckpt / "step_000002" / "meta.json", 50)]:
        with open(path, "r+b") as f:
            f.truncate(size)
    for leftover in (".step_000005.tmp", ".step_000002.old"):
        (ckpt / leftover).mkdir()
    (run / ".metrics.jsonl.tmp.x1y2z3").write_text("{")
    (ckpt / "notes.txt").write_text("not ours")
    r = resume(flags, run, 4)
    warning = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and all(f"step_00000{i}" in warning[0] for i in (2, 3, 4)), r.stderr
    assert "resuming from step_000001" in warning[0] and "resumed from step 1" in r.stdout
    assert_same_metrics(read_metrics(run), read_metrics(whole))
    from fgrpo_utils import run_folder
    assert [run_folder.checkpoint_meta(p)["step"] for p in run_folder.step_folders(ckpt)] == [4, 3, 2, 1]
    assert sorted(p.name for p in ckpt.iterdir()) == ["notes.txt"] + [f"step_00000{i}" for i in (1, 2, 3, 4)]
    assert not list(run.glob(".metrics*"))


def test_every_checkpoint_damaged_is_refused_and_nothing_changes(tiny_run, tmp_path):
    """meta.json or .metadata of every step folder damaged: the resume used to warn and retrain from step 0,
    rewriting metrics.jsonl and replacing the damaged folders' intact shards. Now: exit 2, one line naming
    the folder and each checkpoint's damage, before any step; every file as it was."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    for i in (1, 2, 3, 4):
        name = "meta.json" if i % 2 else ".metadata"
        with open(run / "ckpt" / f"step_00000{i}" / name, "r+b") as f:
            f.truncate(20)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".train.lock"}
    r = launch.run(flags + ["--steps", "5", "--out_dir", str(run), "--resume", "true"], cwd=ROOT, env=ENV,
                   capture_output=True, text=True, timeout=900)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr[-2000:]
    assert r.stderr.startswith("error: --resume: every checkpoint in") and "step_000001 (" in r.stderr
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".train.lock"}
    assert after == before


@pytest.mark.parametrize("name", ["metrics.jsonl", "run.json", ".fgrpo.json"])
def test_a_folder_where_a_log_goes_is_one_line(tiny_run, tmp_path, name):
    """metrics.jsonl, run.json or the marker replaced by a folder: the resume set everything up, then a
    traceback; now one line naming it, and nothing written."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    (run / name).unlink()
    (run / name).mkdir()
    r = launch.run(flags + ["--steps", "5", "--out_dir", str(run), "--resume", "true"], cwd=ROOT, env=ENV,
                   capture_output=True, text=True, timeout=900)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert r.stderr.startswith("error: --out_dir") and name in r.stderr
    assert [p.name for p in (run / "ckpt").iterdir() if p.name.startswith("step_")] == \
        [p.name for p in (whole / "ckpt").iterdir() if p.name.startswith("step_")]


def test_an_out_dir_that_is_a_dangling_symlink_is_one_line(tiny_run, tmp_path):
    flags, _ = tiny_run
    (tmp_path / "out").symlink_to(tmp_path / "gone")
    r = launch.run(flags + ["--steps", "1", "--out_dir", str(tmp_path / "out")], cwd=ROOT, env=ENV,
                   capture_output=True, text=True, timeout=900)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: --out_dir") and "symlink to nothing" in r.stderr
    assert not (tmp_path / "gone").exists()


def test_a_resume_after_the_model_folder_changed_is_refused(tmp_path):
    """The same --model string, other contents (the warm start regenerated between the kill and the resume):
    the flags compare equal, so the resume went on from another model. The checkpoint records the inputs'
    fingerprints (run_folder.inputs): refused in one line before any step."""
    import maze
    torch.manual_seed(0)
    maze.save_sft(maze.build_model(), maze.build_tokenizer(), tmp_path / "policy", {"config": {"size": 7}})
    flags = train_cmd("--model", str(tmp_path / "policy"), *TINY)
    r = launch.run(flags + ["--steps", "1", "--out_dir", str(tmp_path / "run")], cwd=ROOT, env=ENV,
                   capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    torch.manual_seed(1)                                           # another warm start under the same name
    maze.save_sft(maze.build_model(), maze.build_tokenizer(), tmp_path / "policy", {"config": {"size": 7}})
    r = launch.run(flags + ["--steps", "2", "--out_dir", str(tmp_path / "run"), "--resume", "true"], cwd=ROOT,
                   env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "its files changed since" in r.stderr and "--model" in r.stderr
    assert len(read_metrics(tmp_path / "run")) == 1


def test_resume_refuses_another_experiment(tiny_run, tmp_path):
    """--resume with another --gamma or --lr used to continue silently, one run with two settings.
    How it runs (--steps, --sample_every, ...) may change."""
    flags, whole = tiny_run
    r = launch.run(flags + ["--steps", "6", "--sample_every", "2", "--gamma", "0.5", "--lr", "0.001",
                            "--out_dir", str(whole), "--resume", "true"],
                   cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, err
    assert "--gamma 0.5 (was 0.0)" in err and "--lr 0.001 (was 1e-06)" in err
    assert "--steps 6" not in err and "--sample_every 2" not in err
    assert [m["step"] for m in read_metrics(whole)] == [1, 2, 3, 4]       # nothing was touched


# -----------------------------------------------------------------------------
# Per-epoch exports and checkpoint selection (App. L.4)

def test_math_exports_each_epoch_for_evaluate_py_and_a_resume_keeps_them(data, tmp_path):
    """8 problems, 3 prompts a step: epoch 1 ends in step 3 (prompts 7-9), epoch 2 in step 6, and
    --export_every 4 adds step_000004. Each export is a Hugging Face folder with its progress, which
    evaluate.py's loader reads and --models evaluates and selects from. A resume from step 4 redoes
    steps 5-6 and finds epoch_2 there from the killed try: kept as it was, not written again."""
    rows = (data / "train" / "deepscaler_partial.jsonl").read_text().splitlines()[:8]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    flags = train_cmd("--task", "math", "--model", "tiny", "--tokenizer", str(data / "tokenizers" / "qwen2.5"),
                      "--data", str(tmp_path / "train.jsonl"), "--prompts_per_step", "3", "--mini_batch_prompts", "1",
                      "--group_size", "2", "--max_response_len", "4", "--steps", "6", "--save_every", "2",
                      "--export_every", "4", "--sample_every", "0", "--lr", "1e-3", "--out_dir", str(out))
    r = launch.run(flags, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [".fgrpo.json", ".train.lock", "ckpt", "epoch_1", "epoch_2",
                                                     "final", "metrics.jsonl", "run.json", "step_000004"]
    progress = {name: json.loads((out / name / "progress.json").read_text()) for name in ("epoch_1", "epoch_2", "final")}
    assert [progress[n]["step"] for n in progress] == [3, 6, 6]
    assert progress["epoch_1"]["epochs"] == 9 / 8 and progress["epoch_1"]["rollouts"] == 3 * 3 * 2

    import evaluate
    from safetensors.torch import load_file
    model, tok, family = evaluate.load_model(evaluate.Config(model=str(out / "epoch_1"), out=str(tmp_path / "r.json")))
    assert family == "qwen2.5" and tok.decode(tok("1 + 1")["input_ids"]) == "1 + 1"
    w1, w2 = (load_file(out / name / "model.safetensors") for name in ("epoch_1", "epoch_2"))
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)         # two points of one run, not one copy
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in w1.items())

    # Kill after the step-6 export, before its checkpoint: resume from step 4 and redo steps 5-6.
    shutil.rmtree(out / "ckpt" / "step_000006")
    shutil.rmtree(out / "final")
    stamp = (out / "epoch_2" / "model.safetensors").stat().st_mtime_ns
    again = launch.run(flags, cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert again.returncode == 2 and "exports" in again.stderr and "--resume" in again.stderr   # a fresh run refuses
    r = launch.run(flags + ["--resume", "true"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "resumed from step 4" in r.stdout, r.stderr[-3000:]
    assert (out / "epoch_2" / "model.safetensors").stat().st_mtime_ns == stamp and (out / "final").is_dir()
    final = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(final[k], w2[k]) for k in w2)          # the redone steps reach the same weights

    ev = tmp_path / "eval"
    r = launch.run([PY, "evaluate.py", "--models", str(out / "epoch_*"), str(out / "step_000004"), "--benchmarks",
                    "math500", "--n", "2", "--max_problems", "1", "--max_new_tokens", "4", "--workers", "1",
                    "--out", str(ev)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in ev.iterdir()) == sorted(f"{n}.{x}" for n in ("epoch_1", "epoch_2", "step_000004",
                                                                               "selection") for x in ("json", "md"))
    result = json.loads((ev / "epoch_2.json").read_text())
    assert result["config"]["model"] == str(out / "epoch_2") and result["checkpoint"]["step"] == 6
    selection = json.loads((ev / "selection.json").read_text())
    assert len(selection["candidates"]) == 3 and selection["n"] == {"math500": 2}
    # A random tiny model scores 0 everywhere: the tie goes to the least compute, epoch_1.
    assert selection["best"]["result"] == "epoch_1.json" and selection["best"]["rollouts"] == 18


def test_focal_weight_over_mixed_groups_is_left_out_when_there_are_none(tmp_path):
    """A step without a mixed group has no mean focal weight over mixed groups: logging 0 there pulled
    a GRPO run's average below 1."""
    import torch.distributed as dist
    from rollout import Rollouts
    from train import StepResult, step_metrics
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        def metrics(R, g):
            R = torch.tensor(R, dtype=torch.float32)
            n = R.numel()
            rollouts = Rollouts([i // 2 for i in range(n)], [[1, 2]] * n, [[-0.5, -0.5]] * n, ["stop"] * n)
            return step_metrics(StepResult(1, R, torch.zeros_like(R), torch.zeros_like(R), torch.tensor(g),
                                           rollouts, [torch.tensor([-0.5, -0.5])] * n, {}, {}, [0.1], 1e-4,
                                           {"step": 1.0, "rollout": 0.5}))
        m = metrics([[0, 0], [1, 1]], [1.0, 0.0])
        assert "focal/g_mean_mixed" not in m and m["focal/g_mean"] == 0.5
        m = metrics([[0, 1], [1, 1]], [0.7, 0.0])
        assert m["focal/g_mean_mixed"] == pytest.approx(0.7) and m["groups/all_correct"] == 0.5
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("damage", ["zeroed header", "zeroed header, saved without CRCs", "flipped tensor bytes"])
def test_a_shard_damaged_inside_falls_back_to_the_checkpoint_before(tiny_run, tmp_path, damage):
    """Bytes changed inside a shard, its size unchanged, so the checks before loading pass. Flipped
    bytes inside a tensor's data DCP would load without an error (it stores no checksum), and the
    run would go on from weights nobody saved: the CRC-32 that meta.json keeps differs. A checkpoint
    saved without CRCs still falls back when DCP's load fails. Either way the run takes the
    checkpoint before, with a warning, and continues exactly as the first run."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    step4 = run / "ckpt" / "step_000004"
    shard, size = step4 / "__0_0.distcp", (step4 / "__0_0.distcp").stat().st_size
    with open(shard, "r+b") as f:
        if damage == "flipped tensor bytes":
            f.seek(size // 2)
            b = f.read(16)
            f.seek(size // 2)
            f.write(bytes(x ^ 0xFF for x in b))
        else:
            f.write(b"\0" * 64)
    if damage.endswith("without CRCs"):
        meta = json.loads((step4 / "meta.json").read_text())
        del meta["crc32"]
        (step4 / "meta.json").write_text(json.dumps(meta))
    assert shard.stat().st_size == size
    r = resume(flags, run, 4)
    why = "ValueError: __0_0.distcp: bytes differ" if "CRC" not in damage else ""
    assert f"warning: step_000004 could not be loaded ({why}" in r.stderr, r.stderr[-2000:]    # as every warning
    assert "resumed from step 3" in r.stdout
    assert_same_metrics(read_metrics(run), read_metrics(whole))


def test_retention_never_deletes_the_last_checkpoint_resume_would_load(tiny_run, tmp_path):
    """Step 4 damaged inside (a CRC off, meta.json whole), step 3 gone: a resume with --keep_checkpoints
    1 falls back to step 2, trains step 3 and saves it. Retention counted the damaged step 4 as the one
    to keep and deleted steps 3, 2 and 1, so the next resume found nothing to load (the window a kill
    after any save before step 4's opens, --save_every 1). Now step 3 stays and the next resume loads it."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    ckpt = run / "ckpt"
    shard = ckpt / "step_000004" / "__0_0.distcp"
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size // 2)
        b = f.read(16)
        f.seek(shard.stat().st_size // 2)
        f.write(bytes(x ^ 0xFF for x in b))
    shutil.rmtree(ckpt / "step_000003")
    r = resume(flags + ["--keep_checkpoints", "1"], run, 3)
    assert "resumed from step 2" in r.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_000003", "step_000004"]
    r = resume(flags + ["--keep_checkpoints", "1"], run, 4)
    assert "warning: step_000004 could not be loaded" in r.stderr and "resumed from step 3" in r.stdout
    assert_same_metrics(read_metrics(run), read_metrics(whole))


# train.py with one write made to fail as a full disk or a read-only folder would: {fault} patches it in
FAULTS = {
    # torch's writer at a full disk: no OSError, "unexpected pos", and the disk has no room left
    "a full disk during checkpoint 2": '''
import shutil, torch.distributed.checkpoint as dcp
real, calls = dcp.save, []
def save(*a, **k):
    calls.append(1)
    if len(calls) == 2:
        shutil.disk_usage = lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    return real(*a, **k)
dcp.save = save''',
    "a read-only out_dir at step 3's log line": '''
import builtins, errno
from fgrpo_utils import run_folder
calls = []
def ro_open(path, *a, **k):
    if str(path).endswith("metrics.jsonl") and a and a[0] == "a":
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
    return builtins.open(path, *a, **k)
run_folder.open = ro_open''',
    "a full disk during the final export": '''
import errno
from fgrpo_utils import outputs, run_folder
def full(path, write):
    outputs.atomic_dir(path, lambda tmp: (write(tmp), (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.safetensors")))))
run_folder.atomic_dir = full''',
    # safetensors' own error at a full disk (no OSError), the disk then full
    "a full disk in safetensors at the final export": '''
import shutil
import safetensors.torch
from transformers import modeling_utils
def full(*a, **k):
    shutil.disk_usage = lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0)
    raise safetensors.SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")
modeling_utils.safe_save_file = full''',
    "a full disk writing run.json at start-up": '''
import errno
from fgrpo_utils import run_folder
real = run_folder.atomic_write_json
def full(path, obj):
    if str(path).endswith("run.json"):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return real(path, obj)
run_folder.atomic_write_json = full''',
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_disk_trouble_mid_run_is_one_line_and_loses_nothing(tiny_run, tmp_path, fault):
    """A full disk during a checkpoint save ended in an 80-line traceback ending "unexpected pos 704 vs
    598"; a read-only out_dir mid-run in a traceback too. Each is now one line naming the path and why,
    exit 1, and a resume once the disk is fixed ends as the run never stopped."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    script = FAULTS[fault] + "\nimport runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path('train.py', run_name='__main__')\n"
    r = launch.run([PY, "-c", script, *flags[1:], "--steps", "4", "--out_dir", str(run)], cwd=ROOT, env=ENV,
                   capture_output=True, text=True, timeout=900)
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(err) == 1, r.stderr[-3000:]
    where, why = {"a full disk during checkpoint 2": ("ckpt/.step_000002.tmp", "no space left on the device"),
                  "a read-only out_dir at step 3's log line": ("metrics.jsonl", "Read-only file system"),
                  "a full disk during the final export": ("model.safetensors", "No space left on device"),
                  "a full disk in safetensors at the final export": ("final", "no space left on the device"),
                  "a full disk writing run.json at start-up": ("run.json", "No space left on device")}[fault]
    assert err[0].startswith(f"error: {run}/") and where in err[0] and why in err[0], err
    resume(flags, run, 4)
    assert_same_metrics(read_metrics(run), read_metrics(whole))
    assert (run / "final" / "model.safetensors").is_file() and not list(run.glob(".*tmp*"))


def test_a_kill_during_retentions_delete_leaves_no_half_deleted_checkpoint(tiny_run, tmp_path):
    """--keep_checkpoints 1: the final save deletes step 3. A kill halfway through that delete left a cut
    ckpt/step_000003 for good (no later save would delete it). The folder is now renamed aside first,
    and the rerun removes what is left under that temp name."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    kill = '''
import os, re, shutil
from fgrpo_utils import run_folder
real = shutil.rmtree
def rmtree(p, *a, **k):
    name = os.path.basename(str(p))
    if re.fullmatch(r"\\.?step_000003(\\.old)?", name) and os.path.isdir(p):
        os.remove(sorted(os.path.join(str(p), f) for f in os.listdir(p))[0])
        os._exit(9)                         # as a kill -9 halfway through the delete
    return real(p, *a, **k)
run_folder.shutil.rmtree = rmtree
import runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
'''
    keep = ["--keep_checkpoints", "1", "--steps", "4", "--out_dir", str(run)]
    r = launch.run([PY, "-c", kill, *flags[1:], *keep], cwd=ROOT, env=ENV, capture_output=True, text=True,
                   timeout=900)
    assert r.returncode == 9, r.stderr[-3000:]
    assert not (run / "ckpt" / "step_000003").exists()
    resume(flags + ["--keep_checkpoints", "1"], run, 4)
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["step_000004"]
    assert_same_metrics(read_metrics(run), read_metrics(whole))


def test_retention_that_cannot_delete_warns_and_the_run_and_its_resumes_go_on(tiny_run, tmp_path):
    """A checkpoint retention cannot delete (permissions: rmtree raises here, as root ignores chmod) was a
    traceback, and every later resume died the same way on the leftover. Now a warning, the run finishes,
    and a resume warns about the leftover and goes on."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    deny = '''
import errno, os, re, shutil
from fgrpo_utils import run_folder
real = shutil.rmtree
def rmtree(p, *a, **k):
    if re.fullmatch(r"\\.?step_00000[123](\\.old)?", os.path.basename(str(p))):
        raise PermissionError(errno.EACCES, "Permission denied", str(p))
    return real(p, *a, **k)
run_folder.shutil.rmtree = rmtree
import runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
'''
    for steps in (5, 6):
        r = launch.run([PY, "-c", deny, *flags[1:], "--keep_checkpoints", "1", "--steps", str(steps),
                        "--out_dir", str(run), "--resume", "true"], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "warning: could not delete" in r.stderr and "Permission denied" in r.stderr, r.stderr[-2000:]
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_ctrl_c_is_one_line_and_damaged_log_rows_are_named(tiny_run, tmp_path):
    """Ctrl-C mid-run (even inside a checkpoint's save) printed tracebacks, up to 93 lines; now one line saying
    the newest checkpoint stays and how to go on, exit 130. A resume that drops log rows that are no rows (not
    a kill's cut last line) says so."""
    import signal
    import subprocess
    import time
    flags, whole = tiny_run
    run = tmp_path / "run"
    p = subprocess.Popen(flags + ["--steps", "40", "--out_dir", str(run)], cwd=ROOT, env=ENV, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,    # a shell's background job ignores
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # SIGINT: not Python
    deadline = time.monotonic() + 300
    while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().count("\n") >= 2):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err and "interrupted: the newest whole checkpoint" in out, err
    from fgrpo_utils import run_folder
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0}\ngarbage\n{"step": 2, "rew')
    import contextlib
    import io
    with contextlib.redirect_stderr(io.StringIO()) as buf:
        run_folder.keep_metrics_until(run / "metrics.jsonl", 1)
    warned = buf.getvalue()
    assert "line 2 is no log row; dropped" in warned and "line 3" not in warned, warned
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "reward/mean": 0}\n'


def test_ctrl_c_inside_torchs_zip_writer_lets_the_save_finish(tiny_run, tmp_path):
    """A Ctrl-C that lands inside torch's zip writer (a write it calls back into Python) became 'RuntimeError:
    unexpected pos 704 vs 598', a traceback and exit 1 (CI, 2026-12-06): the KeyboardInterrupt was lost in C++.
    Now the save finishes first: exit 130, the one line, and the checkpoint being written is whole."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    interrupt = '''
import os, signal, torch
real = torch.save
class Interrupted:                          # the stream DCP hands torch.save, Ctrl-C at its second write
    def __init__(self, f):
        self.f, self.writes = f, 0
    def __getattr__(self, name):
        return getattr(self.f, name)
    def write(self, b):
        self.writes += 1
        if self.writes == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return self.f.write(b)
def save(obj, f, *a, **k):
    return real(obj, Interrupted(f) if hasattr(f, "write") else f, *a, **k)
torch.save = save
import runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
'''
    r = launch.run([PY, "-c", interrupt, *flags[1:], "--steps", "4", "--out_dir", str(run)], cwd=ROOT, env=ENV,
                   capture_output=True, text=True, timeout=900)
    assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "interrupted: the newest whole checkpoint" in r.stdout, r.stdout
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["step_000001"]
    resume(flags, run, 4)
    assert_same_metrics(read_metrics(run), read_metrics(whole))
