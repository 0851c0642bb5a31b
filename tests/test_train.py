"""train.py: distributed invariance, resume, the math and maze tasks. `python -m pytest -q tests/test_train.py`"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow             # every test here runs train.py or an SFT: minutes in all
ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error",
       "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


GRAD_CASES = [(1, 3, "plain", 0), (2, 3, "plain", 0), (2, 3, "shared", 0),       # world, mbs, layout, tokens
              (1, 16, "plain", 30), (2, 16, "plain", 30), (2, 16, "shared", 60)]
DEAD = ["", "1,2", "0,1,2,3"]
AGGS = ["seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGG_CASES = [(1, 3), (2, 3), (2, 16)]                                               # world, mbs
BALANCED = [(dead, layout, tokens) for dead in ("", "0,1") for layout, tokens in [("plain", 0), ("shared", 0),
                                                                                  ("plain", 30)]]


def ws_cases():
    """Every (world size, tests/ws_worker.py options) the tests below compare."""
    cases = []
    for loss in ("dapo", "cispo"):
        cases.append((1, dict(loss=loss)))
        cases += [(world, dict(loss=loss, micro_batch_size=mbs, layout=layout, micro_batch_tokens=tokens))
                  for world, mbs, layout, tokens in GRAD_CASES]
    for dead in DEAD:
        cases.append((1, dict(loss="dapo", micro_batch_size=3, dead=dead, skip_dead_groups="false")))
        cases += [(world, dict(loss="dapo", micro_batch_size=3, dead=dead, skip_dead_groups="true")) for world in (1, 2)]
    for agg in AGGS:
        cases.append((1, dict(loss="grpo", loss_agg=agg)))
        cases += [(world, dict(loss="grpo", loss_agg=agg, micro_batch_size=mbs)) for world, mbs in AGG_CASES]
    cases.append((1, dict(loss="grpo")))
    cases.append((1, dict(loss="dapo", micro_batch_size=3, dead="0,1", skip_dead_groups="false")))
    cases += [(2, dict(loss="dapo", micro_batch_size=3, dead=dead, layout=layout, micro_batch_tokens=tokens,
                       balance="true")) for dead, layout, tokens in BALANCED]
    cases += [(2, dict(loss="dapo", micro_batch_size=3, load=load)) for load in ("every", "rank0")]
    return cases


def case_key(world, opts):
    return world, tuple(sorted((k, str(v)) for k, v in opts.items()))


@pytest.fixture(scope="module")
def ws_runs(tmp_path_factory):
    """tests/ws_worker.py under torchrun, all of ws_cases() in one launch per world size (a launch
    costs more than all its updates): {case_key: the case's results}."""
    tmp, results = tmp_path_factory.mktemp("ws"), {}
    for world in sorted({w for w, _ in ws_cases()}):
        cases = [opts for w, opts in ws_cases() if w == world]
        (tmp / f"ws{world}.json").write_text(json.dumps(cases))
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
               str(ROOT / "tests" / "ws_worker.py"), str(tmp / f"ws{world}.pt"), str(tmp / f"ws{world}.json")]
        r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        results.update((case_key(world, opts), got) for opts, got in zip(cases, torch.load(tmp / f"ws{world}.pt")))
    return results


def assert_same_update(got, ref, what, stats=True):
    """The same gradient and parameters after the step, within 1e-6 (float64), and the same metrics."""
    for name, g in ref["grads"].items():
        assert torch.allclose(got["grads"][name], g, atol=1e-6, rtol=0), (what, name)
        assert torch.allclose(got["params"][name], ref["params"][name], atol=1e-6, rtol=0), (what, name)
    for k, v in ref["stats"].items() if stats else ():
        assert got["stats"][k] == pytest.approx(v, abs=1e-6), (what, k)


@pytest.mark.parametrize("loss", ["dapo", "cispo"])
def test_world_size_and_micro_batches_do_not_change_the_gradient(ws_runs, loss):
    """World size 1 vs 2 (gloo, FSDP2), 3 vs 16 sequences per micro-batch, micro-batches cut by a
    token budget (30 padded tokens: one or two rows each, 7 passes on rank 0 and 6 on rank 1, which
    then runs an empty one), and the shared-prompt layout: the same loss and gradients within 1e-6
    (float64). The fixture has uneven lengths and clipped tokens, so a per-micro-batch or per-rank
    token mean would fail this."""
    ref = ws_runs[case_key(1, dict(loss=loss))]
    assert max(g.abs().max() for g in ref["grads"].values()) > 1e-3       # not a vacuous gradient
    assert ref["passes"] == 1
    for world, mbs, layout, tokens in GRAD_CASES:
        got = ws_runs[case_key(world, dict(loss=loss, micro_batch_size=mbs, layout=layout, micro_batch_tokens=tokens))]
        if tokens:
            assert got["passes"] >= 2, (world, layout, tokens)             # the budget cut the micro-batches
        if tokens and world == 2 and layout == "plain":
            assert min(got["live"]) < got["passes"], got                   # a rank ran an empty pass
        assert got["logp_gap"] < 1e-9, (world, mbs, layout)              # logp comes back in input order
        assert_same_update(got, ref, (world, mbs, layout, tokens))
    if loss == "dapo":
        assert ref["stats"]["clip/low"] > 0 and ref["stats"]["clip/high"] > 0


@pytest.mark.parametrize("dead", DEAD)
def test_skipping_groups_without_signal_changes_nothing(ws_runs, dead):
    """--skip_dead_groups: groups whose advantages are all 0 are not forwarded, yet the gradient and
    the parameters after the step equal those of the full update within 1e-6 at world sizes 1 and 2,
    with no group dead, two (rank 1 of 2 then holds one live group of two) and all (every rank runs
    one empty pass). The policy loss is the same; the diagnostics are over the live tokens."""
    full = ws_runs[case_key(1, dict(loss="dapo", micro_batch_size=3, dead=dead, skip_dead_groups="false"))]
    assert full["skipped"] == 0
    for world in (1, 2):
        got = ws_runs[case_key(world, dict(loss="dapo", micro_batch_size=3, dead=dead, skip_dead_groups="true"))]
        assert got["skipped"] == 4 * len(dead.split(",")) // world if dead else got["skipped"] == 0, (world, got)
        assert_same_update(got, full, (world, dead), stats=not dead)
        assert got["stats"]["loss/pg"] == pytest.approx(full["stats"]["loss/pg"], abs=1e-9)
        assert got["stats"]["skip/live_frac"] == pytest.approx(1 - len([g for g in dead.split(",") if g]) / 4)
    if dead == "0,1,2,3":
        assert max(g.abs().max() for g in full["grads"].values()) == 0


@pytest.mark.parametrize("agg", AGGS)
def test_loss_aggregations_are_exact_across_micro_batches_and_ranks(ws_runs, agg):
    """--loss_agg: the original GRPO's mean of sequence means and Dr. GRPO's constant normaliser give
    the same gradient whatever the micro-batches and the world size, and not token-mean's."""
    ref = ws_runs[case_key(1, dict(loss="grpo", loss_agg=agg))]
    for world, mbs in AGG_CASES:
        assert_same_update(ws_runs[case_key(world, dict(loss="grpo", loss_agg=agg, micro_batch_size=mbs))], ref,
                           (agg, world, mbs))
    token_mean = ws_runs[case_key(1, dict(loss="grpo"))]
    name = next(iter(ref["grads"]))
    assert not torch.allclose(ref["grads"][name], token_mean["grads"][name], atol=1e-6)


def test_live_groups_balanced_across_ranks_give_the_same_update(ws_runs):
    """train.rl_step moves whole live groups between ranks before the update (distributed.balance_ranks),
    so that each forwards about as many tokens. With groups 0 and 1 dead, rank 0 of 2 held no live
    group and rank 1 both: rank 1 forwarded every token, 2.0x the mean rank's; balanced, one group
    each. Plain, shared-prompt and token-budget micro-batches, with and without dead groups: the
    gradient, the parameters after the step and the loss are those of world size 1 within 1e-6, and
    each sequence's log-probs come back to its own rank in input order."""
    for dead, layout, tokens in BALANCED:
        ref = ws_runs[case_key(1, dict(loss="dapo", micro_batch_size=3, dead=dead, skip_dead_groups="false"))]
        got = ws_runs[case_key(2, dict(loss="dapo", micro_batch_size=3, dead=dead, layout=layout,
                                       micro_batch_tokens=tokens, balance="true"))]
        what = (dead, layout, tokens)
        assert got["logp_gap"] < 1e-9 and got["skipped"] == (8 if dead else 0), what
        assert_same_update(got, ref, what, stats=not dead)
        assert got["stats"]["loss/pg"] == pytest.approx(ref["stats"]["loss/pg"], abs=1e-9)
        before, after = got["busiest"]
        assert 1 <= after <= before and max(got["forwarded"]) / (sum(got["forwarded"]) / 2) == pytest.approx(after)
        if dead:
            assert before == 2.0 and after < 1.5 and min(got["forwarded"]) > 0, what


def test_weights_loaded_on_rank_0_alone_give_the_same_update(ws_runs):
    """train.build reads the weights on rank 0 only and every rank receives its shard by broadcast
    (shard_from_rank0), instead of every rank loading the whole fp32 model: at world size 2 (gloo,
    FSDP2) the gradients, the parameters after the step and the metrics are those of every rank
    building the model itself, within 1e-6 (float64). The rotary inv_freq, a buffer in no state dict,
    comes over too, or the log-probs and gradients would differ."""
    ref, got = (ws_runs[case_key(2, dict(loss="dapo", micro_batch_size=3, load=load))] for load in ("every", "rank0"))
    assert max(g.abs().max() for g in ref["grads"].values()) > 1e-3       # not a vacuous gradient
    assert_same_update(got, ref, "rank0")


def test_bad_flags_are_refused_in_one_line(capsys):
    """Two as the command line sees them (a launch costs seconds), the rest in-process; every flag of
    every script: tests/test_flags.py."""
    from fgrpo_utils.cli import parse_config
    from train import Config
    cases = [(["--gamma", "-1"], "--gamma"), (["--engine", "sglang"], "--engine"), (["--loss", "ppo"], "--loss"),
             (["--prompts_per_step", "100", "--mini_batch_prompts", "64"], "--prompts_per_step"),
             (["--group_size", "1"], "--group_size"), (["--loss_agg", "sum"], "--loss_agg"),
             (["--grad_checkpointing", "yes"], "--grad_checkpointing")]
    for flags, name in cases[:2]:
        r = subprocess.run([PY, "train.py", *flags], cwd=ROOT, env=ENV, capture_output=True, text=True)
        assert r.returncode == 2 and name in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for flags, name in cases[2:]:
        with pytest.raises(SystemExit) as e:
            parse_config(Config, flags)
        err = capsys.readouterr().err
        assert e.value.code == 2 and name in err and len(err.strip().splitlines()) == 1, err


# -----------------------------------------------------------------------------
# End-to-end runs (subprocesses, as a user would start them)

def train_cmd(*flags):
    return [PY, "train.py", "--device", "cpu", "--threads", "1", *flags]


def read_metrics(out_dir):
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


def assert_same_metrics(got, ref):
    """Every logged metric but the timings, step by step, as in the never-stopped run."""
    assert len(got) == len(ref)
    for a, b in zip(ref, got):
        for k, v in a.items():
            if not k.startswith(("time/", "tok_per_s")):
                assert b[k] == pytest.approx(v, rel=1e-9, abs=1e-12), (a["step"], k)


@pytest.fixture(scope="module")
def maze_sft(tmp_path_factory):
    """A small maze warm start: maze.py's SFT (7x7, 600 steps) of a policy of a quarter of its FLOPs
    (hidden size 128, not 256; 1.0M parameters) at lr 2e-3, in this process. Held-out strict pass@1
    about 0.15: sometimes right, so RL groups are mixed. maze.py's own policy (lr 1e-3, 0.22) took 14
    minutes on one core, this one 5 (under 3 on two). 2 layers of 128 reached only 0.035, and 300
    steps of maze.py's 0.04: there RL's first steps drift before they help, too slowly for a test."""
    from dataclasses import asdict
    import maze
    out = tmp_path_factory.mktemp("maze") / "sft"
    cfg = maze.Config(size=7, steps=600, lr=2e-3, eval_mazes=0, out_dir=str(out))
    c = maze.model_config().to_dict()
    c.pop("layer_types", None)
    c.update(hidden_size=128, intermediate_size=512)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)                     # the suite runs one test at a time: CI's two cores
    try:
        torch.manual_seed(cfg.seed)
        model, tok = maze.Qwen2ForCausalLM(maze.Qwen2Config(**c)), maze.build_tokenizer()
        maze.sft(model, tok, cfg)
        maze.save_sft(model, tok, out, {"config": asdict(cfg)})
    finally:
        torch.set_num_threads(threads)
    return out


MAZE_RL = ["--task", "maze", "--lr", "1e-4", "--prompts_per_step", "8", "--mini_batch_prompts", "4",
           "--warmup_steps", "0", "--group_size", "4", "--share_prompts", "true", "--eval_mazes", "8",
           "--eval_samples", "2", "--sample_every", "0", "--loss", "dapo", "--gamma", "0.5"]


def test_killed_run_resumes_as_if_never_stopped(maze_sft, tmp_path):
    """Kill -9 a run right after its step-2 checkpoint, resume it, and compare every logged metric
    (timings aside) with a run that was never stopped. Two mini-batches per step, so optimizer
    state, old log-probs and the data position all have to come back exactly."""
    flags = train_cmd("--model", str(maze_sft), "--steps", "5", "--save_every", "2", *MAZE_RL)
    whole = tmp_path / "whole"
    r = subprocess.run(flags + ["--out_dir", str(whole)], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = read_metrics(whole)
    assert any(0 < m["reward/mean"] < 1 for m in ref) and max(m["grad_norm"] for m in ref) > 0

    cut = tmp_path / "cut"
    p = subprocess.Popen(flags + ["--out_dir", str(cut)], cwd=ROOT, env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 900
    while not (cut / "ckpt" / "step_000002").exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert (cut / "ckpt" / "step_000002").exists()
    again = subprocess.run(flags + ["--out_dir", str(cut)], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert again.returncode == 2 and "--resume" in again.stderr       # refuses to overwrite checkpoints
    r = subprocess.run(flags + ["--out_dir", str(cut), "--resume", "true"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = read_metrics(cut)
    assert [m["step"] for m in got] == [1, 2, 3, 4, 5]
    assert_same_metrics(got, ref)
    # the exported model loads as is, with its tokenizer and maze size
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(cut / "final")
    assert json.loads((cut / "final" / "sft.json").read_text())["config"]["size"] == 7


def test_math_step_with_real_tokenizer(data, tmp_path):
    """One step of the math task on a random tiny Qwen2 with the real Qwen2.5 tokenizer: DeepScaleR
    rows through the chat template, rollouts, math-verify rewards, an update and an export."""
    rows = (data / "train" / "deepscaler_partial.jsonl").read_text().splitlines()[:8]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    r = subprocess.run(train_cmd("--task", "math", "--model", "tiny", "--tokenizer",
                                 str(data / "tokenizers" / "qwen2.5"), "--data", str(tmp_path / "train.jsonl"),
                                 "--prompts_per_step", "2", "--mini_batch_prompts", "1", "--group_size", "2",
                                 "--max_response_len", "8", "--steps", "1", "--out_dir", str(out)),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    m = read_metrics(out)[0]
    assert m["step"] == 1 and m["tokens"] > 0 and m["len/max"] <= 8 and "reward/unparseable" in m
    assert m["logp/diff_abs_mean"] < 1e-4                  # engine and trainer agree before the update
    assert "math train filter" in r.stdout and "kept 8" in r.stdout
    run = json.loads((out / "run.json").read_text())
    assert run["num_prompts"] == 8 and run["config"]["loss"] == "grpo"


def maze_pass1(model_dir, tmp_path, n=32, mazes=64):
    out = tmp_path / f"eval_{Path(model_dir).parent.name}.json"
    r = subprocess.run([PY, "evaluate.py", "--model", str(model_dir), "--benchmarks", "maze", "--n", str(n),
                        "--max_problems", str(mazes), "--out", str(out)], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())["benchmarks"]["maze"]["pass@k"]["1"]


def test_maze_rl_raises_heldout_pass_at_1(maze_sft, tmp_path):
    """F-GRPO on the maze from the SFT warm start: held-out pass@1 (64 mazes x 32 samples, the same
    sampling seeds before and after, so a standard error of about 0.012 on the difference) must rise
    within a minute of CPU training. Both are strict, the default: it went from 0.15 to 0.23 in 40
    steps (from 0.04 to 0.09 with a weaker warm start, too close to call)."""
    out = tmp_path / "rl"
    r = subprocess.run(train_cmd("--model", str(maze_sft), "--task", "maze", "--lr", "1e-4",
                                 "--prompts_per_step", "32", "--mini_batch_prompts", "32", "--warmup_steps", "0",
                                 "--group_size", "8", "--share_prompts", "true", "--micro_batch_size", "64",
                                 "--steps", "40", "--save_every", "40", "--eval_mazes", "16", "--sample_every", "0",
                                 "--gamma", "0.5", "--out_dir", str(out)),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    rewards = [m["reward/mean"] for m in read_metrics(out)]
    assert 0 < rewards[0] < 1                                    # mixed groups from the start
    before, after = maze_pass1(maze_sft, tmp_path), maze_pass1(out / "final", tmp_path)
    assert after > before + 0.05, (before, after)


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
    r = subprocess.run(flags + ["--steps", "4", "--out_dir", str(root / "run")], cwd=ROOT, env=ENV,
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
    r = subprocess.run(flags + ["--steps", str(steps), "--out_dir", str(run), "--resume", "true"], cwd=ROOT,
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


def test_resume_refuses_another_experiment(tiny_run, tmp_path):
    """--resume with another --gamma or --lr used to continue silently, one run with two settings.
    How it runs (--steps, --sample_every, ...) may change."""
    flags, whole = tiny_run
    r = subprocess.run(flags + ["--steps", "6", "--sample_every", "2", "--gamma", "0.5", "--lr", "0.001",
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
    r = subprocess.run(flags, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
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
    again = subprocess.run(flags, cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert again.returncode == 2 and "exports" in again.stderr and "--resume" in again.stderr   # a fresh run refuses
    r = subprocess.run(flags + ["--resume", "true"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "resumed from step 4" in r.stdout, r.stderr[-3000:]
    assert (out / "epoch_2" / "model.safetensors").stat().st_mtime_ns == stamp and (out / "final").is_dir()
    final = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(final[k], w2[k]) for k in w2)          # the redone steps reach the same weights

    ev = tmp_path / "eval"
    r = subprocess.run([PY, "evaluate.py", "--models", str(out / "epoch_*"), str(out / "step_000004"), "--benchmarks",
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
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_disk_trouble_mid_run_is_one_line_and_loses_nothing(tiny_run, tmp_path, fault):
    """A full disk during a checkpoint save ended in an 80-line traceback ending "unexpected pos 704 vs
    598"; a read-only out_dir mid-run in a traceback too. Each is now one line naming the path and why,
    exit 1, and a resume once the disk is fixed ends as the run never stopped."""
    flags, whole = tiny_run
    run = tmp_path / "run"
    script = FAULTS[fault] + "\nimport runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path('train.py', run_name='__main__')\n"
    r = subprocess.run([PY, "-c", script, *flags[1:], "--steps", "4", "--out_dir", str(run)], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=900)
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(err) == 1, r.stderr[-3000:]
    where, why = {"a full disk during checkpoint 2": ("ckpt/.step_000002.tmp", "no space left on the device"),
                  "a read-only out_dir at step 3's log line": ("metrics.jsonl", "Read-only file system"),
                  "a full disk during the final export": ("model.safetensors", "No space left on device")}[fault]
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
    r = subprocess.run([PY, "-c", kill, *flags[1:], *keep], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 9, r.stderr[-3000:]
    assert not (run / "ckpt" / "step_000003").exists()
    resume(flags + ["--keep_checkpoints", "1"], run, 4)
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["step_000004"]
    assert_same_metrics(read_metrics(run), read_metrics(whole))
