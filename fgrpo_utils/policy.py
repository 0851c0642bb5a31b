"""
The policy: loaded from a Hugging Face folder (or --model tiny, or a task's own), its attention, FSDP2
sharding, and build(), which also makes the engine's copy, the reference and the optimizer. Nothing
here imports a script: train.py passes the engine factory and the task's policy in.
"""
import contextlib
import functools
import inspect
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from fgrpo_utils.cli import refuse
from fgrpo_utils.distributed import print0
from fgrpo_utils.logprob import ATTENTION, VARLEN, register_policy_forward

# -----------------------------------------------------------------------------
# Attention, for the trainer and TorchEngine, registered with transformers as ATTENTION
def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, decode=None, segments=None,
              **kwargs):
    """A transformers attention function (query (B, H, Tq, D), key/value (B, KV, Tk, D) -> (B, Tq, H, D)):
    transformers' SDPA, but on the CPU the KV heads are read in place (enable_gqa), not copied H / KV times
    (repeat_kv: a quarter of a maze rollout). `decode`: TorchEngine's GroupKV holds the cache. `segments`:
    logprob.pack's row boundaries 0 = e_0 < e_1 < ..., each sequence causal alone, maskless (flash on CUDA)."""
    if segments is not None:
        return torch.cat([attention(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None, dropout,
                                    scaling, **kwargs)[0] for s, e in zip(segments, segments[1:])], dim=1), None
    if decode is not None and decode.t >= 0:
        return decode.attend(module.layer_idx, query, key, value, scaling), None
    if decode is not None:                  # the prefill: keep the prompts' keys and values
        decode.prompt_k[module.layer_idx], decode.prompt_v[module.layer_idx] = key, value
    if query.device.type != "cpu":          # CUDA's fast kernels need repeat_kv when there is a mask
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    causal = attention_mask is None and query.shape[2] > 1
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None

def varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, segments=None, **kwargs):
    """--attention varlen: `attention`, but the padding-free row's sequences in ONE call a layer of torch's
    variable-length flash kernel (CUDA, bf16, no dropout). Its keywords changed, so its signature picks them
    (read in torch/nn/attention/varlen.py: 2.13's installed, 2.11's at pytorch 255ac567 and 2.10's in the code
    index, 2.12's docs): 2.10 is_causal; 2.11 scale, window_size; 2.12 adds enable_gqa. The rest is positional."""
    if segments is None:
        return attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    from torch.nn.attention.varlen import varlen_attn
    params, (cu, longest) = inspect.signature(varlen_attn).parameters, varlen_bounds(segments, query.device)
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))   # (1, H, T, D) -> (T, H, D)
    if "enable_gqa" not in params:          # before 2.12: the KV heads repeated, as transformers' repeat_kv does
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    kw = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}     # (-1, 0): causal
    kw |= {n: x for n, x in (("scale", scaling), ("enable_gqa", True)) if n in params}   # 2.10: 1/sqrt(D), Qwen's
    return varlen_attn(q, k, v, cu, cu, longest, longest, **kw)[None], None                  # (1, T, H, D)

@functools.lru_cache(maxsize=8)
def varlen_bounds(segments, device):
    """(cumulative lengths, int32 on the device; the longest) of logprob.pack's segments 0 = e_0 < e_1 < ...:
    cached, so a pass's layers and their recomputation copy them to the device once, not once a layer."""
    return torch.tensor(segments, dtype=torch.int32, device=device), max(b - a for a, b in zip(segments, segments[1:]))

def use_attention(model, kind="loop"):
    """Switch a transformers model to `attention` (kind "varlen": `varlen_attention`); its masks stay SDPA's."""
    name, fn = (VARLEN, varlen_attention) if kind == "varlen" else (ATTENTION, attention)
    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, sdpa_mask)
    model.set_attn_implementation(name)
    return model

# -----------------------------------------------------------------------------
# The policy: load, shard with FSDP2, build
WEIGHT_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]   # config, weights, tokenizer

def fetch_weights(flags):
    """Hub ids (ORG/NAME) into the local Hugging Face cache before the process group starts, so that no rank
    waits inside vLLM's set-up or a collective's timeout while rank 0 alone downloads 15 GB. Every rank
    calls it (huggingface_hub locks each file: one process per node downloads). flags: {"--model": name,
    ...}; local folders, "tiny" and "" are skipped. A failed fetch is one line naming the flag, exit 2."""
    for flag, name in flags.items():
        if not name or name == "tiny" or Path(name).expanduser().exists():
            continue
        from huggingface_hub import snapshot_download
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"fetching {name} from the Hugging Face hub before the ranks start; the other ranks of this "
                  "node wait for it", flush=True)
        try:
            snapshot_download(name, allow_patterns=WEIGHT_FILES)
        except Exception as e:          # the hub's errors have no common base: offline, 404, HTTP, disk
            first = (str(e).strip().splitlines() or [""])[0]
            refuse(f"{flag} {name}: cannot fetch it from the Hugging Face hub ({type(e).__name__}: {first})")

def load_model(cfg, tokenizer, dtype=torch.float32, meta=False, own=None):
    """The policy as a transformers model with `attention`; meta=True: on the meta device, from its config
    alone (no weights read). --model tiny: own() (a task's policy, for its own tokenizer) or tiny_qwen."""
    with torch.device("meta") if meta else contextlib.nullcontext():
        if cfg.model == "tiny":                       # a random policy for tests and smoke runs
            torch.manual_seed(cfg.seed)               # same init on every rank
            model = (own() if own else tiny_qwen(len(tokenizer))).to(dtype)
        elif meta:
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.model), dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype)
    return use_attention(model, cfg.attention)

def tiny_qwen(vocab_size):
    """--model tiny's policy unless the task brings one: a random 2-layer Qwen2, 64 wide."""
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True))

def shard(model, device, mixed=None):
    """FSDP2 as DESIGN.md's "The trainer" says: each block (a class in _no_split_modules) a unit, then the
    root. mixed (default: on CUDA): bf16 compute, fp32 master weights and reductions (bench/dry_run.py: CPU)."""
    mixed = device.type == "cuda" if mixed is None else mixed
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed \
        else MixedPrecisionPolicy()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    blocks = set(getattr(model, "_no_split_modules", None) or ())     # e.g. {"Qwen2DecoderLayer"}
    for module in model.modules():
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    register_policy_forward(model)     # logprob.policy_logp's head runs where the root's weights are whole
    return model

def shard_from_rank0(model, full, device):
    """Every rank must call: shard `model` (built on the meta device) and fill it by broadcast from `full`,
    which rank 0 alone loaded (None elsewhere), so a node holds one full fp32 copy at start-up, not one
    per rank (8 x 28 GiB for the 7B); the buffers no state dict holds (rotary inv_freq) too."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    model = shard(model, device)
    model.to_empty(device=device)
    set_model_state_dict(model, full.state_dict() if full is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        for name, b in model.named_buffers():
            if full is not None:
                b.copy_(full.get_buffer(name))
            dist.broadcast(b, 0)
    return model

def engine_kind(cfg, device):
    """--engine auto: vLLM on CUDA (the engine the paper's class of trainers samples with), ours on the CPU."""
    return cfg.engine if cfg.engine != "auto" else ("vllm" if device == "cuda" else "torch")

def build(cfg, tokenizer, device, new_engine, load):
    """(policy sharded, reference sharded or None, rollout engine, optimizer), from load(cfg, tokenizer,
    dtype, meta) and new_engine(kind, its own model or None, dtype). Weights are read once, by rank 0;
    every other copy is built on the meta device and filled from that one, the engine's by the weight sync."""
    full = load(cfg, tokenizer, torch.float32) if dist.get_rank() == 0 else None
    model = load(cfg, tokenizer, torch.float32, meta=True)
    engine_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kind = engine_kind(cfg, device.type)
    engine_model = load(cfg, tokenizer, engine_dtype, meta=True).to_empty(device=device) if kind == "torch" else None
    engine = new_engine(kind, engine_model, engine_dtype)
    if kind == "vllm":
        print0(engine.describe())     # which runner, compile mode and sleep level ran: the first thing to check
    ref_model = (shard_from_rank0(load(cfg, tokenizer, torch.float32, meta=True), full, device).eval()
                 if cfg.kl_coef > 0 else None)
    model = shard_from_rank0(checkpointing(model, cfg, device.type), full, device)
    del full
    if engine_model is not None:                # buffers are in no sync: the policy's rotary tables
        with torch.no_grad():
            for name, b in engine_model.named_buffers():
                b.copy_(model.get_buffer(name))
    return model, ref_model, engine, optimizer(model, cfg)

def grad_checkpointing_on(cfg, device):
    """--grad_checkpointing auto: on for CUDA, where activations decide what fits; off on the CPU."""
    return cfg.grad_checkpointing == "true" or (cfg.grad_checkpointing == "auto" and device == "cuda")

def checkpointing(model, cfg, device_type):
    """Per-layer activation checkpointing when --grad_checkpointing says so; non-reentrant: the reentrant
    variant needs inputs that require grad and fights FSDP's hooks."""
    if grad_checkpointing_on(cfg, device_type):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model

def optimizer(model, cfg):
    """AdamW (Table 5). Its default implementation follows the device: foreach on CUDA, a loop on the CPU."""
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                             weight_decay=cfg.weight_decay)
