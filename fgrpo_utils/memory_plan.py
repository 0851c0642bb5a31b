"""
The memory plan of a training run, per rank, from the model's config.json alone: no weights, no GPU,
no network, a few seconds.

    python train.py --plan true --model ../shared/data/models/qwen2.5-7b --nproc 8
    python train.py --plan true --model ../shared/data/models/qwen2.5-7b --grad_checkpointing false   # exit 2

train.py --plan true prints the plan (main) and, when it does not fit, exits 2 with verdict's one line; a
real CUDA run checks the same plan on its own world size and device before it loads anything (check_fits).
What it counts, term by term, and what it leaves out: DESIGN.md, "The memory plan".
"""
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed
from transformers import AutoConfig, AutoModelForCausalLM

from fgrpo_utils.cli import check, refuse
from fgrpo_utils.distributed import batch_problems
from fgrpo_utils.logprob import CHUNK_BYTES, CHUNK_TEMPS
from fgrpo_utils.policy import engine_kind, grad_checkpointing_on

GiB = 1 << 30
ENGINE_MAX_BATCH = 512          # TorchEngine's max_batch_size (rows sampled per forward)
CUDA_RUNTIME_GIB = 1.5          # CUDA context, NCCL buffers, cuBLAS workspace: an estimate, per rank
VLLM_OVERHEAD_GIB = 2.0         # vLLM's share less weights and KV: profiling activations, CUDA graphs (estimate)
GPUS_PER_NODE = 8               # ranks per node, for host RAM per node
# Host RAM per rank (host_plan), estimates (no node's RSS measured yet):
PROCESS_HOST_GIB = 3.0          # Python, torch + CUDA libs (cuBLAS, cuDNN, NCCL), the context's host side, transformers
SCORER_HOST_GIB = 0.75          # reward.Scorer (math): forkserver + 2 workers with sympy, math-verify, ~0.25 GiB each
VLLM_HOST_GIB = 2.0             # vLLM in the process: its imports, compiled graphs, CPU-side and pinned input buffers,
                                # level 2's saved buffers (rotary tables, MiBs); vLLM has inductor compile in 1 thread
ROLLOUT_TOKEN_BYTES = 500       # a sampled token on the host: vLLM's per-token logprob dict + Logprob, then our lists
NODE_RAM_GIB = (128, 256, 512, 1024)   # node sizes the plan checks
OS_RESERVE = 0.10               # of a node's RAM left to the OS, daemons and page cache: fits = peak <= 90%
MATH_PROMPTS = 39_202           # DeepScaleR: the math run exports once per epoch of these

# -----------------------------------------------------------------------------
# The model: parameter counts from a meta-device build, and the shapes the activations depend on

@functools.lru_cache(maxsize=None)
def model_info(folder):
    """Parameter counts and shapes of the model in `folder` (a config.json is all it reads)."""
    return config_info(load_config(folder))

# Far beyond any published model: a config past them is a typo or damage (a meta build of 2M layers: minutes)
CONFIG_BOUNDS = dict(hidden_size=1 << 17, intermediate_size=1 << 20, num_attention_heads=1 << 12,
                     num_hidden_layers=1000, vocab_size=1 << 24)

def load_config(folder):
    """The transformers config of `folder`'s config.json, or ValueError in one line naming the file and
    what is wrong with it (not JSON, no causal LM, a size outside CONFIG_BOUNDS: zero heads, ...)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    path = Path(folder) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
    check(isinstance(raw, dict) and "model_type" in raw,
          f"{path}: expected a JSON object with a model_type, got {json.dumps(raw)[:60]}")

    def check_bounds(get):
        for name, high in CONFIG_BOUNDS.items():
            v = get(name)
            check(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= high,
                  f"{path}: {name} {v!r}: expected an integer in [1, {high:,}]")
    # the sizes given are checked before transformers reads them: it builds per-layer lists (2M layers: 20 s)
    both = {**raw, **(raw["text_config"] if isinstance(raw.get("text_config"), dict) else {})}
    check_bounds(lambda name: both.get(name, 1))
    hd = both.get("head_dim")
    check(hd is None or (isinstance(hd, int) and not isinstance(hd, bool) and 1 <= hd <= 1 << 12),
          f"{path}: head_dim {hd!r}: expected an integer in [1, 4,096] (or none: hidden_size / heads)")
    for where in (both, both.get("rope_parameters") if isinstance(both.get("rope_parameters"), dict) else {}):
        theta = where.get("rope_theta")
        check(theta is None or (isinstance(theta, (int, float)) and not isinstance(theta, bool)
                                and 1 < theta < math.inf), f"{path}: rope_theta {theta!r}: expected a number > 1")
    try:
        config = AutoConfig.from_pretrained(folder)
    except Exception as e:                          # transformers' own message, first line
        raise ValueError(f"{path}: transformers cannot read it ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
    check(config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
          f"{path}: model_type {config.model_type!r} is not a causal language model")
    text = config.get_text_config()
    check_bounds(lambda name: getattr(text, name, None))
    kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    check(isinstance(kv, int) and 1 <= kv and text.num_attention_heads % kv == 0,
          f"{path}: num_key_value_heads {kv!r}: must divide num_attention_heads {text.num_attention_heads}")
    check(getattr(text, "head_dim", None) or text.hidden_size % text.num_attention_heads == 0,
          f"{path}: hidden_size {text.hidden_size} is not a multiple of num_attention_heads {text.num_attention_heads}")
    return config

def config_info(config):
    """Parameter counts and shapes of a config's causal LM, built on the meta device: exact (biases, tied
    embeddings once), nothing allocated. root = what is not in a decoder layer: embeddings, final norm, head."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    blocks = set(getattr(model, "_no_split_modules", None) or ())      # e.g. {"Qwen2DecoderLayer"}
    layers = [m for m in model.modules() if type(m).__name__ in blocks]
    total = sum(p.numel() for p in model.parameters())                 # parameters() dedups tied ones
    block = sum(p.numel() for p in layers[0].parameters()) if layers else 0
    text = config.get_text_config()
    return dict(config=text, total=total, block=block, layers=len(layers), root=total - block * len(layers),
                largest=max(p.numel() for p in model.parameters()),
                tied=model.get_output_embeddings().weight is model.get_input_embeddings().weight,
                h=text.hidden_size, I=text.intermediate_size, V=text.vocab_size)

def heads(config):
    """(H, KV, hd) of a text config: attention heads, key/value heads, head dimension."""
    H, h = config.num_attention_heads, config.hidden_size
    return H, getattr(config, "num_key_value_heads", None) or H, getattr(config, "head_dim", None) or h // H

def layer_bytes_per_token(config, dtype_bytes, mask_len=0, repeat_kv=False):
    """Bytes autograd saves per token for one Llama/Qwen2/Qwen3 decoder layer, in d = dtype_bytes compute.
    mask_len: the row length T when a padding mask is passed (SDPA then saves a (T, T) float mask per row
    and layer); repeat_kv: k and v saved at all H heads (transformers' CUDA SDPA path with a mask)."""
    d, h, I = dtype_bytes, config.hidden_size, config.intermediate_size
    H, KV, hd = heads(config)
    norms = 2 * (4 * h + 2 * d * h + 4)       # x.float(), x * rsqrt (cast), weight * x; rsqrt (fp32)
    kv_heads = H if repeat_kv else KV
    attention = d * (2 * H * hd + 2 * kv_heads * hd) + 4 * H      # q, out, k, v; logsumexp
    qk_norm = (4 + d) * (H + KV) * hd + 4 * (H + KV) if config.model_type == "qwen3" else 0
    mlp = 4 * d * I                           # gate, up, silu(gate), silu(gate) * up
    return norms + attention + qk_norm + mlp + d * mask_len

def activation_bytes_per_token(config, dtype_bytes, checkpointing, layers=None, mask_len=0, repeat_kv=False):
    """Peak bytes per token of the decoder's activations (embedding to final norm), rotary cos and sin included."""
    layers = config.num_hidden_layers if layers is None else layers
    full = layer_bytes_per_token(config, dtype_bytes, mask_len, repeat_kv)
    rotary = 2 * heads(config)[2] * dtype_bytes
    if checkpointing:
        return layers * dtype_bytes * config.hidden_size + full + rotary
    return layers * full + rotary

# -----------------------------------------------------------------------------
# The run: what one rank holds in each phase

PHASES = ("rollout", "update", "step", "sync")     # the parts of an RL step, in order

@dataclass
class Row:
    name: str
    rollout: float           # GiB per rank while the engine samples
    update: float            # ... during forward/backward of the largest micro-batch
    step: float              # ... in the optimizer step (activations freed, AdamW's temporaries)
    sync: float              # ... during the weight sync (vLLM awake again, weights only)
    note: str
    flag: str                # the flag that shrinks it ("" = none)

@dataclass
class Plan:
    model: str
    world: int
    device: str
    engine: str
    rows: list
    phases: dict             # phase -> GiB per rank
    peak: float              # GiB per rank, the largest phase
    peak_phase: str
    device_gib: float
    fits: bool
    largest: Row             # the largest part of the peak phase
    micro_batch: dict        # rows, row_len, tokens, completion_tokens, checkpointing
    params: dict             # total, root, block, layers, tied
    host_gib: float          # host RAM per rank the engine needs (vLLM asleep at level 1: its pinned backup)
    disk: dict               # GiB, whole run: checkpoint, checkpoints, export, exports
    host: dict               # host_plan's, GiB: per_rank (steady), startup, export, node (the peak), rows, fits, ...
    kv: dict                 # KV-cache tokens one rank holds against the step's worst case

def micro_batch_shapes(cfg, lengths=None):
    """The micro-batches train.micro_batches can make, as (rows, padded row length, sequences per row), one per
    row count r: at most micro_batch_size sequences, each row at most min(row_len, micro_batch_tokens // r) long,
    a row over the budget alone; a share_prompts row is a group. --padding_free (the default): one unmasked row of
    up to micro_batch_tokens (a sequence over it alone). lengths: (prompt, response) tokens. The 7B's: DESIGN.md."""
    prompt, response = lengths or (cfg.max_prompt_len, cfg.max_response_len)
    per_row = cfg.group_size if cfg.share_prompts else 1
    row_len = prompt + per_row * response
    if getattr(cfg, "padding_free", False) and not cfg.share_prompts:   # one row, sequences end to end
        T = max(row_len, min(cfg.micro_batch_tokens or math.inf, cfg.micro_batch_size * row_len))
        return [(1, T, -(-T // row_len))]                                 # the fewest sequences filling it
    shapes = []
    for rows in range(1, max(1, cfg.micro_batch_size // per_row) + 1):
        T = min(row_len, cfg.micro_batch_tokens // rows) if cfg.micro_batch_tokens and rows > 1 else row_len
        if T >= 2:                                           # a prompt token and a completion token
            shapes.append((rows, T, per_row))
    return shapes

def plan(cfg, world, gpu_memory_gb=80.0, config=None, lengths=None):
    """The memory plan of `cfg` (a train.Config or anything with its fields) on `world` ranks of gpu_memory_gb
    GiB each, for `config` (a transformers config) or else cfg.model's config.json (load_config: ValueError
    in one line unless a sane causal LM's). lengths: (prompt, response) tokens (default: math's flags)."""
    m = config_info(config) if config is not None else \
        model_info(str(Path(cfg.model).resolve()) if Path(cfg.model).is_dir() else cfg.model)
    P, W = m["total"], world
    device = "cpu" if cfg.device == "cpu" else "cuda"
    engine = engine_kind(cfg, device)
    mixed = device == "cuda"
    d = 2 if mixed else 4                                  # compute dtype bytes
    ckpt = grad_checkpointing_on(cfg, device)
    Lp, Lr = lengths or (cfg.max_prompt_len, cfg.max_response_len)
    g = lambda b: b / GiB                                  # noqa: E731
    R = []

    def row(name, rollout_b, update_b, sync_b, note, flag="", step_b=None):
        """A part's bytes in each phase; in the optimizer step as in the update unless given."""
        R.append(Row(name, g(rollout_b), g(update_b), g(update_b if step_b is None else step_b), g(sync_b), note, flag))

    row("weights (fp32, sharded)", 4 * P / W, 4 * P / W, 4 * P / W, f"{P / 1e9:.2f}B params / {W} ranks", "--nproc")
    row("AdamW moments (2 x fp32, sharded)", 8 * P / W, 8 * P / W, 8 * P / W, "exp_avg, exp_avg_sq", "--nproc")
    shapes = micro_batch_shapes(cfg, (Lp, Lr))
    # the largest micro-batch at its peak moment: the largest of every shape's moments
    rows_, row_len, per_row, at, u = max(((*s, k, v) for s in shapes
                                          for k, v in update_moments(cfg, m, d, ckpt, W, Lr, *s).items()),
                                         key=lambda t: sum_parts(t[4]))
    completion = u["completion"]
    tokens = rows_ * row_len
    span = f"{shapes[0][0]} x {shapes[0][1]} .. {shapes[-1][0]} x {shapes[-1][1]}"
    row("gradients (fp32, sharded)", 0, u["grads"], 0, f"update: those reduced by the peak ({at}); all in the step",
        "--nproc", step_b=4 * P / W)
    # AdamW on CUDA (foreach) takes sqrt(exp_avg_sq) of all parameters at once: one more shard-sized buffer;
    # on the CPU it loops over parameters: sqrt(exp_avg_sq) and its quotient, of the largest one's shard
    row("AdamW step temporaries", 0, 0, 0, "foreach sqrt(exp_avg_sq), fp32 shard" if mixed else
        "sqrt(exp_avg_sq) and its quotient, the largest parameter's shard", "--nproc",
        step_b=4 * P / W if mixed else 2 * 4 * m["largest"] / W)
    row("unsharded units (params + grads)", 0, u["unsharded"], 0,
        f"root {m['root'] / 1e6:.0f}M ({'tied' if m['tied'] else 'untied'}) in {'bf16' if mixed else 'fp32'}, "
        f"its head's grad; blocks of {m['block'] / 1e6:.0f}M and reduce-scatter buffers as the moment holds them",
        step_b=0)
    row("activations", 0, u["activations"], 0,
        f"{rows_} x {row_len} {'tokens' if len(shapes) == 1 else f'padded tokens (the largest of {span})'}, "
        f"{u['activations'] / max(tokens, 1) / 2**20:.2f} MiB/token, checkpointing {'on' if ckpt else 'off'}",
        "--micro_batch_tokens" if ckpt else "--grad_checkpointing true", step_b=0)
    row("log-prob head (policy_logp)", 0, u["head"], 0,
        f"chunks + {completion} completion hidden states and their grads (in the head's backward only)",
        "--micro_batch_tokens", step_b=0)
    if cfg.kl_coef > 0:                       # its forward unshards the root + current + prefetched block
        row("reference model", 4 * P / W, 4 * P / W + d * (m["root"] + 2 * m["block"]), 4 * P / W,
            "sharded fp32 copy, its units unsharded in its forward", "--kl_coef 0", step_b=4 * P / W)

    rank_rows = cfg.prompts_per_step // W * cfg.group_size  # rows one rank samples per step
    host, level, kv_tokens = engine_rows(cfg, m, engine, d, gpu_memory_gb * GiB, rank_rows, Lp, Lr, row)
    # the KV cache against the step's worst case: every row of this rank's share at full length
    kv_info = dict(tokens=int(kv_tokens), worst_tokens=rank_rows * (Lp + Lr), rows=rank_rows,
                   rows_at_once=int(min(rank_rows, kv_tokens // (Lp + Lr))))
    V, h = m["V"], m["h"]
    # the sync gathers full tensors in the engine's dtype, in ~1 GiB buckets; a larger one travels alone
    row("weight-sync bucket", 0, 0, max(GiB, d * V * h), f"full {'bf16' if mixed else 'fp32'} tensors, one bucket")
    if mixed:
        row("CUDA runtime", CUDA_RUNTIME_GIB * GiB, CUDA_RUNTIME_GIB * GiB, CUDA_RUNTIME_GIB * GiB,
            "context, NCCL, cuBLAS (estimate)")
    if mixed and engine == "vllm":            # what the update freed, still reserved by PyTorch when vLLM maps its own
        row("PyTorch's free blocks", 0, 0, 0, "emptied before each vLLM wake (VLLMEngine._wake); blocks that live "
            "tensors pin: gpu_contact's reserved - allocated")

    phases = {p: sum(getattr(r, p) for r in R) for p in PHASES}
    peak_phase = max(phases, key=phases.get)
    peak = phases[peak_phase]
    return Plan(str(cfg.model), W, device, engine, R, phases, peak, peak_phase, float(gpu_memory_gb),
                peak <= gpu_memory_gb, max(R, key=lambda r: getattr(r, peak_phase)),
                dict(rows=rows_, row_len=row_len, per_row=per_row, response_len=Lr, tokens=tokens,
                     completion_tokens=completion, checkpointing=ckpt),
                {k: m[k] for k in ("total", "root", "block", "layers", "tied")}, g(host), disk_plan(cfg, P),
                host_plan(cfg, m, level, g(host), W, rank_rows * Lr, 0 if mixed else peak), kv_info)

UPDATE_PARTS = ("grads", "unsharded", "activations", "head")

def sum_parts(moment):
    return sum(moment[k] for k in UPDATE_PARTS)

def update_moments(cfg, m, d, ckpt, W, Lr, rows_, row_len, per_row):
    """What one rank holds beyond its sharded weights and AdamW moments at the three moments that can peak in the
    update of one micro-batch shape, {moment: {part: bytes, "completion": tokens}}: (A) the head's backward, (B) the
    last decoder layer's, (C) the root's reduce-scatter; one moment's parts coexist (DESIGN.md, "The memory plan")."""
    h, I, V, root, block = m["h"], m["I"], m["V"], m["root"], m["block"]
    masked = rows_ > 1 or cfg.share_prompts            # one unpadded row: causal, no mask
    mask_len, repeat_kv = (row_len if masked else 0), masked and d == 2
    # per token: each layer's kept tensors, and with checkpointing the one layer recomputed in its backward
    kept = activation_bytes_per_token(m["config"], d, ckpt, mask_len=mask_len, repeat_kv=repeat_kv)
    recomputed = layer_bytes_per_token(m["config"], d, mask_len, repeat_kv) if ckpt else 0
    T, mask = rows_ * row_len, rows_ * row_len ** 2 if masked else 0     # the bool (rows, 1, T, T) mask, once
    completion = rows_ * min(per_row * Lr, row_len - (1 if cfg.share_prompts else per_row))  # >= 1 prompt token each
    chunk = min(CHUNK_BYTES, completion * V * 4 * CHUNK_TEMPS)           # z and p, (chunk, V) fp32
    head_grad = d * V * h                               # the head's unsharded gradient, until (C)
    # backward through one layer's MLP at its peak: the gradients of its product and of both factors, while the
    # product's saved copy is already freed (one d I of the layer's set), and of the hidden state
    through = 2 * d * I + 2 * d * h
    return {"A": dict(grads=0, unsharded=d * root + head_grad, activations=T * (kept - recomputed + (4 + d) * h) + mask,
                      head=chunk + 2 * completion * h * d, completion=completion),
            "B": dict(grads=0, unsharded=d * root + head_grad + 2 * d * block + (d + 4) * block,
                      activations=T * (kept + through) + mask, head=0, completion=completion),
            "C": dict(grads=4 * (m["total"] - root) / W, unsharded=(d + 4) * root, activations=0, head=0,
                      completion=completion)}

def engine_rows(cfg, m, engine, d, device_bytes, rank_rows, Lp, Lr, row):
    """Add the engine's row; returns (host bytes per rank, vLLM sleep level or None, KV tokens per rank)."""
    P, V, h, mixed = m["total"], m["V"], m["h"], d == 2
    kv_tok = kv_bytes_per_token(m["config"], torch.bfloat16 if mixed else torch.float32)
    if engine == "vllm":
        share = cfg.gpu_memory_utilization * device_bytes if mixed else 0
        row("rollout engine (vLLM)", share, 0, 2 * P, f"{cfg.gpu_memory_utilization:.2f} of the device sampling; "
            "asleep in the update; bf16 weights in the sync", "--gpu_memory_utilization")
        level = getattr(cfg, "vllm_sleep_level", 2)
        host = vllm_pinned_bytes(m) if mixed and level == 1 else 0
        return host, level, (max(0, share - 2 * P - VLLM_OVERHEAD_GIB * GiB) // kv_tok if mixed else 0)
    weights = 2 * P if mixed else 4 * P
    b = min(ENGINE_MAX_BATCH, rank_rows)                # rows per engine forward
    prompts = max(1, b // cfg.group_size)
    kv = min(cfg.kv_cache_gb * GiB, kv_tok * (prompts * Lp + b * Lr))
    sampling = b * V * (4 + 8)                          # fp32 logprobs + float64 cdf
    prefill = prompts * Lp * (3 * m["I"] + 4 * h) * d   # one layer's MLP, transient
    row("rollout engine (TorchEngine)", weights + kv + max(sampling, prefill), weights, weights,
        f"unsharded {'bf16' if mixed else 'fp32'} weights always; KV {kv / GiB:.1f} GiB, sampling/prefill "
        "while it samples", "--kv_cache_gb")
    return 0, None, cfg.kv_cache_gb * GiB // kv_tok

def disk_plan(cfg, P):
    """GiB on disk for the whole run: a checkpoint (12 bytes a parameter), those kept while the newest is
    written, an export, and how many exports the run writes (one per math epoch, and --export_every)."""
    epochs = math.ceil(cfg.steps * cfg.prompts_per_step / MATH_PROMPTS) if getattr(cfg, "task", "math") == "math" else 0
    n_exports = epochs + (cfg.steps // cfg.export_every if getattr(cfg, "export_every", 0) else 0)
    return dict(checkpoint=12 * P / GiB, checkpoints=12 * P / GiB * (cfg.keep_checkpoints + 1),
                export=4 * P / GiB, exports=n_exports, exports_total=4 * P / GiB * n_exports)

def host_plan(cfg, m, level, backup, W, rollout_tokens, device_peak):
    """Host RAM on rank 0's node (DESIGN.md, "The memory plan"), GiB, in each phase: rows of (name, {phase: GiB},
    why), and the node's peak = the largest phase, not the sum of the rows. level: vLLM's sleep level (None:
    TorchEngine); backup: its level-1 pinned backup, GiB a rank; rollout_tokens: completion tokens a rank samples
    per step; device_peak: the plan's GiB a rank on the CPU, where it is host RAM (0 on CUDA)."""
    n, copy = min(W, GPUS_PER_NODE), 4 * m["total"] / GiB    # an fp32 copy of every weight, GiB
    math_task = getattr(cfg, "task", "math") == "math"
    rows = []

    # steady = the rollout and update phases (the rollouts at full length); an export comes on top of it
    def row(name, gib, why, startup=True, steady=True, export=True):
        rows.append((name, {"startup": gib * startup, "steady": gib * steady, "export": gib * export}, why))
    row("processes", n * PROCESS_HOST_GIB, f"{n} ranks x {PROCESS_HOST_GIB} GiB: Python, torch (+ CUDA), transformers")
    row("reward scorer", n * SCORER_HOST_GIB * math_task, f"{n} x {SCORER_HOST_GIB} GiB: forkserver + 2 math-verify "
        "workers, from the first score", startup=False)
    if level is not None:
        row("vLLM in the process", n * VLLM_HOST_GIB, f"{n} x {VLLM_HOST_GIB} GiB: imports, graphs, input buffers")
        # wake_up frees the backup into torch's pinned host cache, which keeps it: resident from the first sleep
        row("vLLM pinned backup", n * backup, f"level {level}: " + (f"{n} x {backup:.1f} GiB, power-of-two blocks"
            if level == 1 else "none, the sync rewrites every weight"), startup=False)
    row("rollouts", n * rollout_tokens * ROLLOUT_TOKEN_BYTES / GiB, f"{n} x {rollout_tokens:,} tokens (full length) "
        f"x {ROLLOUT_TOKEN_BYTES} B: the engine's outputs, our lists", startup=False)
    if device_peak:
        row("the plan above (CPU)", n * device_peak, f"{n} x {device_peak:.1f} GiB: on the CPU the device is host RAM")
    # policy.build: rank 0 reads the fp32 model once and broadcasts the shards (no copy per rank)
    row("rank 0's fp32 load", copy, "policy.build: read once, shards broadcast", steady=False, export=False)
    # run_folder.export: get_model_state_dict(full_state_dict, cpu_offload) gathers FSDP2's fp32 master weights
    # to rank 0's CPU; safetensors 0.8 writes them by pointer, no second copy
    row("rank 0's export gather", copy, "run_folder.export: full fp32 state dict", startup=False, steady=False)
    phases = {k: sum(r[1][k] for r in rows) for k in ("startup", "steady", "export")}
    peak_phase = max(phases, key=phases.get)
    node = phases[peak_phase]
    return {"per_rank": phases["steady"] / n, "backup": backup, "sleep_level": level, "ranks_per_node": n,
            "startup": copy, "export": copy, "rows": rows, "phases": phases, "peak_phase": peak_phase, "node": node,
            "fits": {size: node <= (1 - OS_RESERVE) * size for size in NODE_RAM_GIB}}

def vllm_pinned_bytes(m):
    """Host RAM one sleeping vLLM takes at sleep level 1: a pinned copy of each device block (vLLM 0.32's: its
    weight tensors in its fused layout, qkv_proj, gate_up_proj), which torch's pinned allocator rounds up (pow2)."""
    (H, KV, hd), h, I, V = heads(m["config"]), m["h"], m["I"], m["V"]

    def pow2(b):            # a large block: 2 MiB pages, then the next power of two; a small one as it is
        return 1 << math.ceil(math.log2(-(-b // (2 << 20)) * (2 << 20))) if b > 10 << 20 else b
    layer = sum(pow2(2 * n) for n in ((H + 2 * KV) * hd * h, H * hd * h, 2 * I * h, I * h))
    return m["layers"] * layer + pow2(2 * V * h) * (1 if m["tied"] else 2)

def format_plan(p):
    """The plan as a table; the last line reads `per rank: X GiB of Y GiB`."""
    def cells(name, values, spec="8.2f"):          # a row's name, then one column a phase
        return f"{name:36s} " + " ".join(f"{v:{spec}}" for v in values)
    mb, hs, kv, dk = p.micro_batch, p.host, p.kv, p.disk
    lines = [f"memory plan: {p.model} | {p.world} ranks | {p.device} | engine {p.engine} | micro-batch "
             f"{mb['rows']} x {mb['row_len']} tokens | checkpointing {'on' if mb['checkpointing'] else 'off'}",
             cells("part (GiB per rank)", PHASES, ">8s") + "  note [flag]"]
    lines += [cells(r.name, (getattr(r, k) for k in PHASES)) + f"  {r.note}" + (f" [{r.flag}]" if r.flag else "")
              for r in p.rows]
    lines.append(cells("total", (p.phases[k] for k in PHASES)) + f"  peak: {p.peak_phase}")
    lines.append(cells("host RAM (GiB per node)", ("startup", "steady", "export"), ">8s") + "  rank 0's node: why")
    lines += [cells(name, by_phase.values()) + f"  {why}" for name, by_phase, why in hs["rows"]]
    lines.append(cells("total", hs["phases"].values()) + f"  peak: {hs['peak_phase']}")
    asleep = ("no backup at sleep level 2 (the sync rewrites every weight)" if hs["sleep_level"] == 2 else
              f"{hs['backup']:.1f} GiB per rank, the sleeping vLLM's pinned backup (level 1: each block "
              "rounded up to a power of two)" if hs["sleep_level"] == 1 else "no engine backup (TorchEngine)")
    fits = ", ".join(f"{s} GiB {'fits' if ok else 'swaps'}" for s, ok in hs["fits"].items())
    lines.append(f"host RAM: {asleep}; per node of {hs['ranks_per_node']} ranks {hs['node']:.1f} GiB at most "
                 f"({hs['peak_phase']}; estimates): {fits} ({OS_RESERVE:.0%} left to the OS)")
    if kv["tokens"]:
        lines.append(f"KV cache: {kv['tokens']:,} tokens per rank "
                     f"({'vLLM, estimated' if p.engine == 'vllm' else '--kv_cache_gb'}) against the step's worst case "
                     f"{kv['worst_tokens']:,} ({kv['rows']} rows at full length): "
                     + ("all rows at once" if kv["rows_at_once"] >= kv["rows"] else
                        f"at worst {kv['rows_at_once']} rows at once, the rest wait"
                        + (" or are preempted and recomputed" if p.engine == "vllm" else " for a later batch")))
    lines.append(f"disk: checkpoint {dk['checkpoint']:.1f} GiB (12 B/param), up to {dk['checkpoints']:.1f} GiB "
                 f"kept while the newest is written; exports {dk['exports']} x {dk['export']:.1f} GiB = "
                 f"{dk['exports_total']:.1f} GiB")
    lines.append(f"{'fits' if p.fits else 'DOES NOT FIT'}: largest part {p.largest.name} "
                 f"{getattr(p.largest, p.peak_phase):.1f} GiB ({p.peak_phase})")
    lines.append(f"per rank: {p.peak:.1f} GiB of {p.device_gib:.1f} GiB")
    return "\n".join(lines)

def verdict(p):
    """None when the plan fits, else one line: what overflows, its largest part, the flag to change."""
    r = p.largest
    return None if p.fits else (
        f"memory plan: {p.peak:.1f} GiB per rank in the {p.peak_phase} phase > {p.device_gib:.1f} GiB; "
        f"largest part {r.name} ({getattr(r, p.peak_phase):.1f} GiB): shrink it with {r.flag or '--nproc'}")

def plan_lengths(cfg, entry):
    """(prompt, response) tokens of the rows of task `entry` (train.TASKS): math's are its flags; one with its
    own tokenizer (maze, reverse) is checked, built and asked (the longest of its first 16 prompts)."""
    if entry.tokenizer is None:
        return cfg.max_prompt_len, cfg.max_response_len
    if entry.check:
        entry.check(cfg)
    task = entry.make(cfg, entry.tokenizer(), None)
    return max(len(task.prompt(i)[0]) for i in range(16)), task.max_new_tokens

def make_plan(cfg, world, gpu_memory_gb, entry):
    """plan() of this run, or one line and exit 2 when its config.json or task flags cannot make one."""
    try:
        return plan(cfg, world, gpu_memory_gb, lengths=plan_lengths(cfg, entry))
    except ValueError as e:
        refuse(e)

def main(cfg, entry):
    """train.py --plan true: print the plan on --nproc ranks; exit 2 when it does not fit or --nproc is refused."""
    problems = batch_problems(cfg, cfg.nproc)         # a world size the real run would refuse
    if problems:
        refuse(problems[0].replace("the world size", "--nproc"))
    p = make_plan(cfg, cfg.nproc, cfg.gpu_memory_gb, entry)
    print(format_plan(p))
    if not p.fits:
        refuse(verdict(p))

def check_fits(cfg, world, device, entry):
    """A CUDA run's plan on its own world and device, before any load: exit 2 on every rank unless it fits."""
    p = make_plan(cfg, world, torch.cuda.get_device_properties(device).total_memory / 2**30, entry)
    if not p.fits:
        torch.distributed.destroy_process_group()
        refuse(verdict(p))

def kv_bytes_per_token(config, dtype):
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    _, kv_heads, head_dim = heads(config)
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype.itemsize
