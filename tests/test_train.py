"""train.py: distributed invariance, a killed run resumed, the math and maze tasks learning (the rest of
what goes wrong: tests/test_resume.py). `python -m pytest -q tests/test_train.py`"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import launch

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
    token budget (30 padded tokens: one or two rows each, the same number of passes on both ranks, each
    rank's rows spread over all of them), and the shared-prompt layout: the same loss and gradients within 1e-6
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
            assert got["live"] == [got["passes"]] * world, got             # no rank idles: rows spread over K
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
    """train.build_models reads the weights on rank 0 only and every rank receives its shard by broadcast
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
        r = launch.run([PY, "train.py", *flags], cwd=ROOT, env=ENV, capture_output=True, text=True)
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
    minutes on one core, this one 2.2 (its 600 steps are compute-bound: each process of the suite has a
    core). Cheaper warm starts were too weak for test_maze_rl_raises_heldout_pass_at_1's 0.05 gain:
    2 layers of 128 reached 0.035, 300 steps of maze.py's 0.04; 300 steps at lr 3e-3 0.03 (+0.04 after
    RL), 400 at 2.5e-3 0.04 (+0.04), hidden 96 at 600 steps 0.06 (+0.03), against this one's 0.19
    (+0.09), each one seed."""
    from dataclasses import asdict
    import maze
    out = tmp_path_factory.mktemp("maze") / "sft"
    cfg = maze.Config(size=7, steps=600, lr=2e-3, eval_mazes=0, out_dir=str(out))
    c = maze.model_config().to_dict()
    c.pop("layer_types", None)
    c.update(hidden_size=128, intermediate_size=512)
    torch.manual_seed(cfg.seed)
    model, tok = maze.Qwen2ForCausalLM(maze.Qwen2Config(**c)), maze.build_tokenizer()
    maze.sft(model, tok, cfg)
    maze.save_sft(model, tok, out, {"config": asdict(cfg)})
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
    r = launch.run(flags + ["--out_dir", str(whole)], cwd=ROOT, env=ENV, capture_output=True,
                   text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = read_metrics(whole)
    assert any(0 < m["reward/mean"] < 1 for m in ref) and max(m["grad_norm"] for m in ref) > 0

    cut = tmp_path / "cut"
    p = launch.popen(flags + ["--out_dir", str(cut)], cwd=ROOT, env=ENV,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 900
    while not (cut / "ckpt" / "step_000002").exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert (cut / "ckpt" / "step_000002").exists()
    again = launch.run(flags + ["--out_dir", str(cut)], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert again.returncode == 2 and "--resume" in again.stderr       # refuses to overwrite checkpoints
    r = launch.run(flags + ["--out_dir", str(cut), "--resume", "true"], cwd=ROOT, env=ENV,
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
    r = launch.run(train_cmd("--task", "math", "--model", "tiny", "--tokenizer",
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
    r = launch.run([PY, "evaluate.py", "--model", str(model_dir), "--benchmarks", "maze", "--n", str(n),
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
    r = launch.run(train_cmd("--model", str(maze_sft), "--task", "maze", "--lr", "1e-4",
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
