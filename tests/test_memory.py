"""memory_plan.py: parameter counts from a meta build, the paper's runs fit on 8 x 80 GB and bad settings
do not, and the plan's formulas against measurements: bytes autograd saves in real decoder layers
(full width, or narrowed where bf16's slow CPU matmuls would take minutes), and the peak RSS of one real forward + backward + AdamW step in a child process."""
import json
import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
import torch

from fgrpo_utils import memory_plan
from conftest import ROOT

MODELS = "models"


def config(data, name, **kw):
    """A stand-in for train.Config with the fields memory_plan.plan reads; defaults are Table 5's."""
    base = dict(model=str(data / MODELS / name), device="auto", engine="auto", group_size=8, prompts_per_step=256,
                mini_batch_prompts=64, micro_batch_size=8, micro_batch_tokens=16384, max_prompt_len=1024,
                max_response_len=8192, share_prompts=False, padding_free=True, grad_checkpointing="auto", kv_cache_gb=16.0,
                gpu_memory_utilization=0.7, kl_coef=0.0, keep_checkpoints=2, steps=1530, vllm_sleep_level=2)
    base.update(kw)
    return SimpleNamespace(**base)


# -----------------------------------------------------------------------------
# (a) parameter counts

@pytest.mark.parametrize("name, billions, tied", [("qwen2.5-7b", 7.62, False), ("qwen2.5-1.5b", 1.54, True),
                                                   ("qwen3-4b-base", 4.02, True),
                                                   ("llama-3.2-3b-instruct", 3.21, True)])
def test_param_counts_from_meta_build(data, name, billions, tied):
    m = memory_plan.model_info(str(data / MODELS / name))
    assert m["total"] / 1e9 == pytest.approx(billions, abs=0.01)
    assert m["tied"] is tied
    assert m["root"] + m["layers"] * m["block"] == m["total"]
    # the root is the embeddings (+ an untied head) + the final norm
    assert m["root"] == m["V"] * m["h"] * (1 if tied else 2) + m["h"]


# -----------------------------------------------------------------------------
# (b) what fits on 8 x 80 GB

PAPER_RUNS = [("qwen2.5-7b", 8192), ("qwen3-4b-base", 4096), ("llama-3.2-3b-instruct", 8192)]


@pytest.mark.parametrize("name, response", PAPER_RUNS)
def test_paper_runs_fit(data, name, response):
    p = memory_plan.plan(config(data, name, max_response_len=response), 8, 80.0)
    text = memory_plan.format_plan(p)
    assert p.fits and memory_plan.verdict(p) is None, text
    assert text.splitlines()[-1] == f"per rank: {p.peak:.1f} GiB of 80.0 GiB"
    assert p.engine == "vllm" and p.micro_batch["checkpointing"]
    assert p.peak == max(p.phases.values()) == pytest.approx(sum(getattr(r, p.peak_phase) for r in p.rows))


def test_micro_batch_shapes(data):
    """Padded (--padding_free false): the token budget caps r rows at 16384 // r tokens each, and a row
    over the budget goes alone: 1 x 9,216 unpadded, then 2 x 8,192 .. 8 x 2,048 padded; the plan takes
    the largest, 2 x 8,192 with its mask. Padding-free (the default): one unmasked row of 16,384 tokens
    (two sequences at least: 9,216 is the longest). Both peak in the last layer's backward (moment B, as
    bench/dry_run.py measures: 23.2 and 22.9 GiB less the CUDA runtime), 25-26 GiB with it."""
    padded = config(data, "qwen2.5-7b", padding_free=False)
    shapes = memory_plan.micro_batch_shapes(padded)
    assert [(r, t) for r, t, _ in shapes] == [(1, 9216), (2, 8192), (3, 5461), (4, 4096), (5, 3276), (6, 2730),
                                              (7, 2340), (8, 2048)]
    assert memory_plan.micro_batch_shapes(config(data, "qwen2.5-7b", micro_batch_tokens=0, padding_free=False))[-1] \
        == (8, 9216, 1)
    assert memory_plan.micro_batch_shapes(config(data, "qwen2.5-7b", share_prompts=True, micro_batch_tokens=0)) \
        == [(1, 1024 + 8 * 8192, 8)]
    assert memory_plan.micro_batch_shapes(padded, (59, 34))[0] == (1, 93, 1)   # a task's own rows
    assert memory_plan.micro_batch_shapes(config(data, "qwen2.5-7b")) == [(1, 16384, 2)]
    assert memory_plan.micro_batch_shapes(config(data, "qwen2.5-7b", micro_batch_tokens=4096)) == [(1, 9216, 1)]
    for cfg, shape, act in ((padded, (2, 8192), 8.45), (config(data, "qwen2.5-7b"), (1, 16384), 7.88)):
        p = memory_plan.plan(cfg, 8, 80.0)
        assert (p.micro_batch["rows"], p.micro_batch["row_len"]) == shape
        parts = {r.name: r.update for r in p.rows}
        assert parts["gradients (fp32, sharded)"] == 0 and parts["log-prob head (policy_logp)"] == 0   # moment B
        assert parts["activations"] == pytest.approx(act, abs=0.01), memory_plan.format_plan(p)
        assert 25 < p.phases["update"] < 26


def test_update_moments_peak_where_the_dry_run_measured(data):
    """The update's three moments at the 7B's defaults (bench/dry_run.py, fake tensors, rank 0 of 8, less
    the CUDA runtime): (A) the head's backward ~18.2 GiB, (B) the last layer's ~22.9, (C) the root's
    reduce-scatter ~19.3. The plan, on top of the sharded weights and moments (10.64 GiB), within 10%."""
    cfg = config(data, "qwen2.5-7b")
    m = memory_plan.model_info(cfg.model)
    moments = memory_plan.update_moments(cfg, m, 2, True, 8, 8192, 1, 16384, 2)
    total = {k: (memory_plan.sum_parts(v) + 12 * m["total"] / 8) / 2**30 for k, v in moments.items()}
    for k, measured in (("A", 18.2), ("B", 22.9), ("C", 19.3)):
        assert total[k] == pytest.approx(measured, rel=0.10), total
    assert max(total, key=total.get) == "B"


def test_host_ram_per_rank_and_node(data):
    """Sleep level 1 backs vLLM's bf16 weights (14.2 GiB at the 7B) up to pinned host memory in blocks
    rounded up to powers of two: ~27 GiB a rank, ~214 GiB a node of 8. Level 2 keeps no backup; the
    start-up load and each export are rank 0's one fp32 copy (28.4 GiB), not one per rank."""
    one = memory_plan.plan(config(data, "qwen2.5-7b", vllm_sleep_level=1), 8, 80.0)
    two = memory_plan.plan(config(data, "qwen2.5-7b", vllm_sleep_level=2), 8, 80.0)
    backup = {name: by_phase for name, by_phase, _ in one.host["rows"]}["vLLM pinned backup"]
    assert 26 < one.host["backup"] < 28 and backup["steady"] == pytest.approx(8 * one.host["backup"])
    assert one.host["backup"] == one.host_gib and two.host["backup"] == 0
    assert two.host["startup"] == two.host["export"] == pytest.approx(28.4, abs=0.1)
    assert two.host["export"] == pytest.approx(two.disk["export"])     # the export is fp32 in RAM as on disk
    assert "no backup at sleep level 2" in memory_plan.format_plan(two) and "pinned backup" in memory_plan.format_plan(one)


def test_host_ram_per_node_counts_the_processes_not_just_the_load(data):
    """The node figure was rank 0's fp32 load alone (28.4 GiB at the 7B, level 2). Eight processes with
    their libraries and vLLM stay resident beside it, and an export gathers another fp32 copy on top of
    the steady state: at least 8 x the per-rank baseline + the export copy, ~60-110 GiB (issue 39)."""
    p = memory_plan.plan(config(data, "qwen2.5-7b"), 8, 80.0)
    hs = p.host
    floor = 8 * (memory_plan.PROCESS_HOST_GIB + memory_plan.VLLM_HOST_GIB) + hs["export"]
    assert hs["node"] >= floor and 60 < hs["node"] < 110, memory_plan.format_plan(p)
    assert hs["per_rank"] * 8 == pytest.approx(hs["phases"]["steady"])
    assert hs["phases"]["export"] == pytest.approx(hs["phases"]["steady"] + hs["export"])


def test_host_ram_peak_is_the_largest_phase_not_the_sum(data):
    """The fp32 load lives at start-up only and the export's copy at an export only: the peak is the
    largest phase. Summing every row would count rank 0's copy twice (the 7B: +28.4 GiB)."""
    hs = memory_plan.plan(config(data, "qwen2.5-7b"), 8, 80.0).host
    every_row = sum(sum(by_phase.values()) for _, by_phase, _ in hs["rows"])
    assert hs["node"] == max(hs["phases"].values()) == hs["phases"][hs["peak_phase"]]
    assert hs["node"] < every_row - hs["startup"]
    loads = {name: by_phase for name, by_phase, _ in hs["rows"]}
    assert loads["rank 0's fp32 load"]["export"] == loads["rank 0's export gather"]["startup"] == 0


def test_host_ram_node_sizes(data, monkeypatch):
    """Level 1's ~300 GiB a node swaps on 128 and 256 GiB nodes and fits on 512; level 2 fits on 128.
    A size fits when the peak leaves OS_RESERVE of it free (a node 5% over the peak swaps), and the
    report names every size."""
    one = memory_plan.plan(config(data, "qwen2.5-7b", vllm_sleep_level=1), 8, 80.0)
    two = memory_plan.plan(config(data, "qwen2.5-7b"), 8, 80.0)
    assert one.host["fits"] == {128: False, 256: False, 512: True, 1024: True}
    assert two.host["fits"][128] and list(two.host["fits"]) == list(memory_plan.NODE_RAM_GIB)
    for p in (one, two):
        assert all(ok == (p.host["node"] <= 0.9 * size) for size, ok in p.host["fits"].items())
    line = next(line for line in memory_plan.format_plan(one).splitlines() if line.startswith("host RAM:"))
    assert "128 GiB swaps, 256 GiB swaps, 512 GiB fits, 1024 GiB fits" in line and f"{one.host['node']:.1f} GiB" in line
    tight, roomy = round(two.host["node"] / 0.95), round(two.host["node"] / 0.85)
    monkeypatch.setattr(memory_plan, "NODE_RAM_GIB", (tight, roomy))
    assert memory_plan.plan(config(data, "qwen2.5-7b"), 8, 80.0).host["fits"] == {tight: False, roomy: True}


def test_host_ram_per_node_with_more_ranks(data):
    """16 ranks are 2 nodes of 8: rank 0's node still has 8 processes and the whole fp32 copy, while
    each rank samples half the rows (the rollouts' row halves)."""
    p8, p16 = (memory_plan.plan(config(data, "qwen2.5-7b"), w, 80.0).host for w in (8, 16))
    assert p16["ranks_per_node"] == 8 and p16["export"] == p8["export"]
    rollouts = [{n: b for n, b, _ in h["rows"]}["rollouts"]["steady"] for h in (p8, p16)]
    assert rollouts[1] == pytest.approx(rollouts[0] / 2)
    assert p16["node"] == pytest.approx(p8["node"] - rollouts[1])


EXPORT_CHILD = textwrap.dedent("""
    import json, struct, sys, torch
    from pathlib import Path
    from types import SimpleNamespace
    sys.path.insert(0, {root!r})
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from fgrpo_utils import distributed, policy, run_folder
    distributed.init_dist("cpu")
    model = policy.tiny_qwen(100)
    model.config.save_pretrained({src!r})
    for layer in model.model.layers:          # CUDA's policy (policy.shard): bf16 compute, fp32 master weights
        fully_shard(layer, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    run_folder.export(model, None, Path({out!r}), ["final"], SimpleNamespace(model={src!r}), dict(step=0))
    f = open(Path({out!r}) / "final" / "model.safetensors", "rb")
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    header.pop("__metadata__", None)
    print(json.dumps(dict(dtypes=sorted({{v["dtype"] for v in header.values()}}),
                          bytes=sum(v["data_offsets"][1] - v["data_offsets"][0] for v in header.values()),
                          params=sum(p.numel() for p in model.parameters()))))
""")


def test_export_gathers_fp32(tmp_path):
    """The plan counts an export as 4 bytes a parameter on rank 0's host: run_folder.export of an FSDP2
    model with CUDA's bf16 compute policy writes fp32 (the master weights), every parameter once."""
    (tmp_path / "src").mkdir()
    code = EXPORT_CHILD.format(root=str(ROOT), src=str(tmp_path / "src"), out=str(tmp_path / "out"))
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["dtypes"] == ["F32"] and got["bytes"] == 4 * got["params"]


def test_kv_capacity_against_the_steps_worst_case(data):
    """vLLM's share (56 GiB at 0.7) less its weights and overhead holds ~746k tokens of the 7B's KV cache
    (56 KiB a token); a rank's 256 rows of 9,216 tokens need 2.36M at worst: ~80 rows at once."""
    p = memory_plan.plan(config(data, "qwen2.5-7b"), 8, 80.0)
    assert p.kv["worst_tokens"] == 256 * 9216 and 7.3e5 < p.kv["tokens"] < 7.6e5 and p.kv["rows_at_once"] == 80
    assert "at worst 80 rows at once" in memory_plan.format_plan(p)


BAD_CONFIGS = {"not json": "{not json", "empty": "", "an empty object": "{}", "a list": "[1, 2]",
               "not causal": json.dumps(dict(model_type="vit", hidden_size=64, num_attention_heads=4,
                                             num_hidden_layers=2, intermediate_size=128, vocab_size=100)),
               "an unknown type": '{"model_type": "qwen9"}'}
BAD_SIZES = {"zero hidden size": ("hidden_size", 0), "zero heads": ("num_attention_heads", 0),
             "a negative vocabulary": ("vocab_size", -5), "2,000,000 layers": ("num_hidden_layers", 2_000_000),
             "a head_dim of 0": ("head_dim", 0), "a head_dim of -5": ("head_dim", -5),
             "a string rope_theta": ("rope_theta", "big"), "a rope_theta of 0": ("rope_theta", 0)}


@pytest.mark.parametrize("case", [*BAD_CONFIGS, *BAD_SIZES])
def test_a_bad_config_json_is_one_line_not_a_traceback(data, tmp_path, case, capsys):
    """train.py --plan true on a damaged or absurd config.json: one line naming the file, exit 2, fast."""
    import train
    if case in BAD_CONFIGS:
        text = BAD_CONFIGS[case]
    else:
        c = json.loads((data / MODELS / "qwen2.5-7b" / "config.json").read_text())
        key, c[key] = BAD_SIZES[case][0], BAD_SIZES[case][1]
        text = json.dumps(c)
    (tmp_path / "config.json").write_text(text)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"config\.json: ") as e:
        memory_plan.load_config(tmp_path)
    assert "\n" not in str(e.value) and time.perf_counter() - t0 < 5      # 2M layers took 20 s in transformers
    with pytest.raises(SystemExit) as e:
        memory_plan.main(train.Config(plan=True, model=str(tmp_path)), train.TASKS["math"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "config.json" in err, err


@pytest.mark.parametrize("flags", [dict(kv_cache_gb=5.0), dict(engine="torch", enforce_eager=True),
                                   dict(engine="torch", gpu_memory_utilization=0.6), dict(device="cpu", vllm_sleep_level=1)])
def test_plan_refuses_engine_flags_the_run_would_refuse(data, flags):
    """--plan true planned for --kv_cache_gb on vLLM, which a run refuses: the plan now refuses it too,
    as the flags are read (parse_config: one line, exit 2)."""
    import train
    name = next(k for k in flags if k not in ("engine", "device"))
    with pytest.raises(ValueError, match=rf"^--{name} .*leave it out"):
        train.Config(plan=True, model=str(data / MODELS / "qwen2.5-7b"), **flags)


@pytest.mark.parametrize("nproc", [7, 10**12])
def test_plan_refuses_a_world_size_the_run_would_refuse(data, nproc, capsys):
    import train
    if nproc > 1 << 24:                              # past any world size: the flag's bound, as the Config builds
        with pytest.raises(ValueError, match=f"^--nproc {nproc}: at most"):
            train.Config(plan=True, model=str(data / MODELS / "qwen2.5-7b"), nproc=nproc)
        return
    with pytest.raises(SystemExit) as e:
        cfg = train.Config(plan=True, model=str(data / MODELS / "qwen2.5-7b"), nproc=nproc)
        memory_plan.main(cfg, train.TASKS["math"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: --prompts_per_step 256 must be divisible by --nproc {nproc}")


def test_tasks_are_planned_with_their_own_rows(data):
    """The maze and the toy task are planned with their own prompt and response lengths, not math's
    1,024 + 8,192, which could refuse a real CUDA run of theirs that fits."""
    import maze
    import toy_task
    import train
    model = str(data / MODELS / "qwen2.5-1.5b")

    def lengths(**flags):
        cfg = train.Config(plan=True, model=model, **flags)
        return memory_plan.plan_lengths(cfg, train.TASKS[cfg.task])
    assert lengths() == (1024, 8192)
    assert lengths(task="maze", maze_size=7) == (59, maze.max_new_tokens_for(7))
    Lp, Lr = lengths(task="reverse")
    task = toy_task.make_task(train.Config(plan=True, model=model, task="reverse"), toy_task.build_tokenizer(), None)
    assert (Lp, Lr) == (len(task.prompt(0)[0]), task.max_new_tokens) and Lp + Lr < 100


@pytest.mark.parametrize("kw, part, flag", [
    (dict(grad_checkpointing="false", micro_batch_tokens=0), "activations", "--grad_checkpointing true"),
    (dict(engine="torch", kv_cache_gb=64.0), "rollout engine (TorchEngine)", "--kv_cache_gb"),
])
def test_bad_settings_do_not_fit(data, kw, part, flag):
    p = memory_plan.plan(config(data, "qwen2.5-7b", **kw), 8, 80.0)
    assert not p.fits, memory_plan.format_plan(p)
    line = memory_plan.verdict(p)
    assert "\n" not in line and part in line and flag in line
    assert memory_plan.format_plan(p).splitlines()[-1] == f"per rank: {p.peak:.1f} GiB of 80.0 GiB"


def test_plan_scales_with_world_and_reference(data):
    """Sharded state divides by the world size; the reference model adds a sharded fp32 copy."""
    p8, p4 = (memory_plan.plan(config(data, "qwen2.5-7b"), w) for w in (8, 4))
    row = {r.name: r for r in p8.rows}, {r.name: r for r in p4.rows}
    assert row[1]["AdamW moments (2 x fp32, sharded)"].update == pytest.approx(
        2 * row[0]["AdamW moments (2 x fp32, sharded)"].update)
    kl = memory_plan.plan(config(data, "qwen2.5-7b", kl_coef=0.001), 8)
    assert kl.phases["rollout"] == pytest.approx(p8.phases["rollout"] + 4 * p8.params["total"] / 8 / 2**30)
    assert p8.disk["checkpoint"] == pytest.approx(12 * p8.params["total"] / 2**30)
    assert p8.disk["exports"] == 10                    # ~10 epochs of DeepScaleR, one export each


# -----------------------------------------------------------------------------
# (c) the activation formula against the bytes autograd saves in real layers

def saved_bytes_per_token(folder, layers, dtype, checkpointing, tokens=128, pad=False, narrow=False):
    """Bytes autograd saves per token between the embedding and the final norm of a model built from
    `folder`'s config with `layers` layers and a 256-token vocabulary: every tensor the saved-tensor
    hooks see, deduplicated by storage, parameters left out. With non-reentrant checkpointing the
    hooks see each layer's saved inputs; the recomputation is not counted. narrow: the hidden and
    intermediate sizes and the head counts divided by the KV head count (one KV head, the same
    head_dim and query heads per KV head), for bf16, whose CPU matmuls are ~50x slower than fp32's."""
    from fgrpo_utils import policy
    from transformers import AutoConfig, AutoModelForCausalLM
    c = AutoConfig.from_pretrained(folder)
    c.num_hidden_layers, c.vocab_size = layers, 256
    if narrow:
        k, hd = c.num_key_value_heads, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        c.hidden_size, c.intermediate_size = c.hidden_size // k, c.intermediate_size // k
        c.num_attention_heads, c.num_key_value_heads, c.head_dim = c.num_attention_heads // k, 1, hd
    torch.manual_seed(0)
    model = policy.use_attention(AutoModelForCausalLM.from_config(c, dtype=dtype)).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, recording = {}, [False]

    def pack(t):
        s = t.untyped_storage()
        if recording[0] and s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    model.model.embed_tokens.register_forward_hook(lambda *a: recording.__setitem__(0, True))
    model.model.norm.register_forward_pre_hook(lambda *a: recording.__setitem__(0, False))
    kw = {}
    if pad:                                              # a padding mask, as micro-batches of >1 row have
        kw["attention_mask"] = torch.ones(1, tokens, dtype=torch.long)
        kw["attention_mask"][0, :3] = 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(input_ids=torch.randint(0, 256, (1, tokens)), use_cache=False, **kw).logits
    logits.float().sum().backward()
    return sum(seen.values()) / tokens, c


@pytest.mark.slow
@pytest.mark.parametrize("name, dtype, pad, tokens, narrow", [("qwen2.5-7b", torch.bfloat16, False, 8, False),
                                                              ("qwen2.5-7b", torch.float32, True, 128, False),
                                                              ("qwen3-4b-base", torch.bfloat16, False, 128, True),
                                                              ("llama-3.2-3b-instruct", torch.bfloat16, True, 128, True)])
def test_activation_formula_matches_saved_bytes(data, name, dtype, pad, tokens, narrow):
    """One layer, no checkpointing: the formula is exact on the CPU (SDPA's flash kernel saves q, k,
    v, out and logsumexp, never T^2 scores; a padding mask adds its float copy). Full width for the
    7B (bf16 over 8 tokens: the bytes per token do not depend on the count), narrowed otherwise."""
    measured, c = saved_bytes_per_token(data / MODELS / name, 1, dtype, False, tokens, pad, narrow)
    d = torch.empty(0, dtype=dtype).element_size()
    planned = memory_plan.activation_bytes_per_token(c, d, False, 1, mask_len=tokens if pad else 0)
    assert planned == pytest.approx(measured, rel=0.25)
    assert planned == pytest.approx(measured, rel=0.01)      # in fact exact up to the mask's few bytes


@pytest.mark.slow
def test_activation_formula_with_checkpointing(data):
    """Two layers checkpointed keep their inputs (d h per token each); backward recomputes one layer
    at a time, whose full set (measured without checkpointing) comes on top."""
    folder = data / MODELS / "llama-3.2-3b-instruct"
    kept, c = saved_bytes_per_token(folder, 2, torch.bfloat16, True, narrow=True)
    one_layer, _ = saved_bytes_per_token(folder, 1, torch.bfloat16, False, narrow=True)
    assert kept == pytest.approx(2 * 2 * c.hidden_size, rel=0.01)
    planned = memory_plan.activation_bytes_per_token(c, 2, True, 2)
    assert planned == pytest.approx(kept + one_layer, rel=0.25)
    # without checkpointing all of both layers: ~18x more per token
    assert memory_plan.activation_bytes_per_token(c, 2, False, 2) > 10 * 2 * 2 * c.hidden_size


def test_paper_ballpark(data):
    """Qwen2.5-7B in bf16 without checkpointing: ~6 MiB per token over its 28 layers."""
    c = memory_plan.model_info(str(data / MODELS / "qwen2.5-7b"))["config"]
    assert 5.8 < memory_plan.activation_bytes_per_token(c, 2, False) / 2**20 < 6.6


# -----------------------------------------------------------------------------
# (d) the plan against the peak RSS of one real step

CHILD = textwrap.dedent("""
    import json, resource, sys, torch
    torch.set_num_threads(1)
    sys.path.insert(0, {root!r})
    from fgrpo_utils import logprob, policy
    from transformers import AutoConfig, AutoModelForCausalLM
    def rss():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
    config = AutoConfig.from_pretrained({folder!r})
    base = rss()
    torch.manual_seed(0)
    model = policy.use_attention(AutoModelForCausalLM.from_config(config, dtype=torch.float32)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, config.vocab_size, ({Lp},), generator=g).tolist()
    completion = torch.randint(0, config.vocab_size, ({Lr},), generator=g).tolist()
    batch = logprob.pack([prompt], [completion], 0)
    logp, _ = logprob.policy_logp(model, batch, 1.0, entropy=True)
    (-logp.sum() / {Lr}).backward()
    opt.step()
    print(json.dumps(dict(peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base)))
""")


@pytest.mark.slow
def test_plan_matches_peak_rss_of_one_step(data, tmp_path):
    """Qwen2.5-1.5B's config with 2 layers at full width and its full 151,936-token vocabulary, fp32 on
    the CPU, one row of 64 + 448 tokens through logprob.policy_logp (the trainer's chunked head),
    backward and an AdamW step, in a child process: its peak RSS above the RSS after the imports
    against the plan's params + grads + Adam + activations + head (a plain model: no FSDP units,
    no engine). ~40 s and ~7 GiB."""
    c = json.loads((data / MODELS / "qwen2.5-1.5b" / "config.json").read_text())
    c["num_hidden_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(c))
    Lp, Lr = 64, 448
    cfg = config(data, "", model=str(tmp_path), device="cpu", engine="torch", micro_batch_size=1,
                 micro_batch_tokens=0, max_prompt_len=Lp, max_response_len=Lr, grad_checkpointing="false")
    p = memory_plan.plan(cfg, 1, 24.0)
    parts = ("weights", "AdamW", "gradients", "activations", "log-prob")   # a plain model: no units, no engine
    planned = max(sum(getattr(r, phase) for r in p.rows if r.name.startswith(parts)) for phase in ("update", "step"))
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), folder=str(tmp_path), Lp=Lp, Lr=Lr)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])["peak"] / 2**30
    print(f"plain 2-layer Qwen2.5-1.5B step: plan {planned:.2f} GiB, measured peak RSS {measured:.2f} GiB")
    assert planned == pytest.approx(measured, rel=0.25), (planned, measured)


def test_default_vllm_share_leaves_a_tenth_of_the_device(data):
    """train.py's --gpu_memory_utilization is the largest multiple of 0.05 whose rollout phase (vLLM's share
    on top of what the trainer keeps: sharded weights, AdamW's moments, the CUDA runtime) leaves 10% of an
    80 GiB device free for the 7B, the headline run; with PyTorch's free blocks given back before vLLM wakes
    (rollout.VLLMEngine._wake), the plan holds no cache row in that phase."""
    from train import Config
    share = Config.gpu_memory_utilization

    def rollout(u):
        return memory_plan.plan(config(data, "qwen2.5-7b", gpu_memory_utilization=u), 8, 80.0).phases["rollout"]
    assert rollout(share) <= 0.9 * 80 < rollout(round(share + 0.05, 2))
    p = memory_plan.plan(config(data, "qwen2.5-7b", gpu_memory_utilization=share), 8, 80.0)
    assert p.peak_phase == "rollout"
    assert [r.rollout for r in p.rows if r.name == "PyTorch's free blocks"] == [0.0]
