"""
Rollout engines behind one small interface, the trainer's log-prob forward, and weight sync.

    python rollout.py                      # two rollouts from a tiny random model, and a speed check

An engine turns prompt token ids into N completions per prompt:

    engine.generate(prompts, n, seeds, max_new_tokens=..., stop_token_ids=[...],
                    temperature=1.0, top_p=1.0, top_k=0) -> Rollouts
    engine.load_weights(named_tensors)     # trainer -> engine, after every optimizer step

Rollouts holds, prompt-major (prompt 0's n samples, then prompt 1's, ...), each completion's token
ids, the per-token log-probs of the distribution it was sampled from, and why it stopped.

TorchEngine is plain PyTorch + transformers (CPU and GPU): batched, KV cache, left padding with
correct position ids. Three things make it faster than model.generate on RL batches:
1) each prompt is prefilled once and its KV cache copied n times, instead of prefilling n copies;
2) finished rows leave the batch, so short completions stop costing compute;
3) no logits processors or stopping-criteria machinery per token.
Sampling is seeded by the data, not the rank: sample j of prompt i draws its uniforms from a
generator seeded by (seeds[i], j), and picks tokens by inverting the CDF. A prompt therefore gets
the same samples whatever batch it sits in and whatever rank runs it (STYLE.md §7).
"""
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Rollouts:
    prompt_index: list   # for each completion, the index of its prompt in the input list
    token_ids: list      # list[list[int]], completion tokens, the stop token included when sampled
    logprobs: list       # list[list[float]], log-prob of each token under the sampling distribution
    finish_reason: list  # "stop" (a stop token was sampled) or "length" (max_new_tokens reached)


def mix_seed(*keys):
    """A 63-bit seed from integers, the same in every process and Python version (unlike hash()).

    train.py seeds prompt i of step t with mix_seed(cfg.seed, t, i); the engine seeds its sample j
    with mix_seed(seed_i, j). splitmix64-style mixing, so nearby keys give unrelated streams.
    """
    x = 0x9E3779B97F4A7C15
    for k in keys:
        x = (x ^ (int(k) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x >> 1


def sampling_logprobs(logits, temperature=1.0, top_p=1.0, top_k=0):
    """Log-probs of the distribution we sample from: softmax(logits / T), then top-k, then top-p.

    top_k = 0 and top_p = 1 mean off (the paper samples with T = 1, top-p 1, no top-k). Filtered
    tokens get -inf. The log-probs we return and train against are those of this distribution.
    logits: (B, V) -> (B, V) float32
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_k > 0 and top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]                                 # (B, 1)
        logp = torch.log_softmax(logp.masked_fill(logp < kth, -math.inf), dim=-1)
    if top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p: a token is dropped if the mass
        # BEFORE it already reaches top_p (so the first token is always kept)
        before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()
        drop = torch.zeros_like(logp, dtype=torch.bool).scatter(-1, order, before >= top_p)
        logp = torch.log_softmax(logp.masked_fill(drop, -math.inf), dim=-1)
    return logp


def sample_from_uniform(logp, u):
    """Inverse-CDF sampling: the token k with cdf[k-1] <= u < cdf[k]. logp (B, V), u (B,) in [0, 1).

    Zero-probability tokens are never chosen (their CDF step is empty). Given u, this is exactly a
    draw from exp(logp); feeding it seeded uniforms makes every row's draws reproducible.
    """
    cdf = logp.double().exp().cumsum(dim=-1)                                          # (B, V)
    target = (u.double() * cdf[:, -1]).unsqueeze(-1)                                  # (B, 1)
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logp.shape[-1] - 1)


class TorchEngine:
    """Generation with a Hugging Face causal LM in plain PyTorch. The engine owns its model: in
    training it is an unsharded copy of the policy that load_weights() refreshes every step."""

    def __init__(self, model, pad_token_id, max_batch_size=512):
        self.model = model.eval()
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size

    @torch.no_grad()
    def generate(self, prompts, n, seeds, *, max_new_tokens, stop_token_ids, temperature=1.0,
                 top_p=1.0, top_k=0):
        if len(seeds) != len(prompts):
            raise ValueError(f"need one seed per prompt: {len(seeds)} seeds, {len(prompts)} prompts")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token")
        out = Rollouts([], [], [], [])
        per_chunk = max(1, self.max_batch_size // n)                    # prompts per forward batch
        for start in range(0, len(prompts), per_chunk):
            chunk = self._generate_chunk(prompts[start:start + per_chunk], n,
                                         seeds[start:start + per_chunk], max_new_tokens,
                                         set(stop_token_ids), temperature, top_p, top_k)
            out.prompt_index += [start + i for i in chunk.prompt_index]
            out.token_ids += chunk.token_ids
            out.logprobs += chunk.logprobs
            out.finish_reason += chunk.finish_reason
        return out

    def _generate_chunk(self, prompts, n, seeds, max_new_tokens, stop, temperature, top_p, top_k):
        device = next(self.model.parameters()).device
        P, B = len(prompts), len(prompts) * n
        L = max(len(p) for p in prompts)
        ids = torch.full((P, L), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros(P, L, dtype=torch.long)
        for i, p in enumerate(prompts):                                 # left padding
            ids[i, L - len(p):] = torch.tensor(p)
            attn[i, L - len(p):] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)                        # (P, L) true positions

        # Prefill each prompt once, then copy its cache n times: row b = prompt b // n, sample b % n.
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                         logits_to_keep=1)
        cache = out.past_key_values
        cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1].repeat_interleave(n, dim=0)          # (B, V)
        attn = attn.repeat_interleave(n, dim=0)                         # (B, L)
        next_pos = pos[:, -1].repeat_interleave(n, dim=0) + 1           # (B,)

        # Every row's uniforms for the whole completion, from its own data-keyed generator.
        u = torch.stack([torch.rand(max_new_tokens, dtype=torch.float64,
                                    generator=torch.Generator().manual_seed(mix_seed(seeds[b // n], b % n)))
                         for b in range(B)]).to(device)                 # (B, max_new_tokens)

        out_tok = torch.zeros(B, max_new_tokens, dtype=torch.long)
        out_logp = torch.zeros(B, max_new_tokens, dtype=torch.float64)
        length = torch.full((B,), max_new_tokens)                     # set when a stop is sampled
        hit_stop = torch.zeros(B, dtype=torch.bool)
        stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=device)
        rows = torch.arange(B, device=device)                          # batch row -> completion
        done = torch.zeros(B, dtype=torch.bool, device=device)
        for t in range(max_new_tokens):
            logp = sampling_logprobs(logits, temperature, top_p, top_k)               # (b, V)
            tok = sample_from_uniform(logp, u[rows, t])                               # (b,)
            live = ~done
            out_tok[rows[live].cpu(), t] = tok[live].cpu()
            out_logp[rows[live].cpu(), t] = logp.gather(-1, tok[:, None]).squeeze(-1)[live].double().cpu()
            stopped = live & torch.isin(tok, stop_ids)
            length[rows[stopped].cpu()] = t + 1
            hit_stop[rows[stopped].cpu()] = True
            done |= stopped
            if done.all() or t == max_new_tokens - 1:
                break
            # Finished rows leave the batch once they are a quarter of it: every compaction copies
            # the whole KV cache, so doing it at each finish would cost more than it saves.
            if done.sum() * 4 >= len(rows):
                keep = (~done).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, tok, attn, next_pos, done = rows[keep], tok[keep], attn[keep], next_pos[keep], done[keep]
            # rows that are done but not yet dropped feed a pad token; their outputs are ignored
            tok = tok.masked_fill(done, self.pad_token_id)
            attn = torch.cat([attn, (~done).long()[:, None]], dim=1)
            out = self.model(input_ids=tok[:, None], attention_mask=attn,
                             position_ids=next_pos[:, None], past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]
            next_pos = next_pos + 1
        n_tok = length.tolist()
        return Rollouts([b // n for b in range(B)],
                        [out_tok[b, :n_tok[b]].tolist() for b in range(B)],
                        [out_logp[b, :n_tok[b]].tolist() for b in range(B)],
                        ["stop" if s else "length" for s in hit_stop.tolist()])

    @torch.no_grad()
    def load_weights(self, named_tensors):
        """Copy (name, tensor) pairs with Hugging Face names into the engine's model."""
        params = self.model.state_dict(keep_vars=True)     # tied weights appear under both names
        for name, t in named_tensors:
            if name not in params:
                raise KeyError(f"load_weights: the engine's model has no tensor named {name!r}")
            params[name].copy_(t)

    def reset_prefix_cache(self):
        """Nothing to reset: this engine keeps no cache between generate() calls."""


# -----------------------------------------------------------------------------
# The trainer's side: log-probs of given completions, in one padded batch

def pack(prompts, completions, pad_token_id, device="cpu"):
    """Lay out prompt + completion pairs so every completion starts in the same column.

    [pad pad p p p | c c c pad]   prompts left-padded to Lp, completions right-padded to Tc.
    Then the logits that predict the completions are one slice, columns Lp-1 .. Lp+Tc-2, so the
    model computes the vocabulary projection only there (logits_to_keep), never on prompt tokens.
    Returns input_ids, attention_mask, position_ids (B, Lp + Tc) and completion_mask (B, Tc).
    """
    Lp = max(len(p) for p in prompts)
    Tc = max(1, max(len(c) for c in completions))
    B = len(prompts)
    ids = torch.full((B, Lp + Tc), pad_token_id, dtype=torch.long)
    attn = torch.zeros(B, Lp + Tc, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, Lp - len(p):Lp + len(c)] = torch.tensor(list(p) + list(c))
        attn[i, Lp - len(p):Lp + len(c)] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids.to(device), "attention_mask": attn.to(device),
            "position_ids": pos.to(device), "completion_mask": attn[:, Lp:].bool().to(device)}


def completion_logits(model, batch, temperature=1.0):
    """Logits / T at the positions that predict each completion token. batch from pack(). (B, Tc, V)

    The trainer divides by the same temperature the engine sampled with, or its log-probs would be
    those of a different distribution (IMPLEMENTATION_NOTES R5).
    """
    Tc = batch["completion_mask"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], logits_to_keep=Tc + 1, use_cache=False)
    return out.logits[:, :-1].float() / temperature


def token_logprobs(logits, batch):
    """log pi(token) for each completion token: (B, Tc, V) logits -> (B, Tc), 0 where masked."""
    targets = batch["input_ids"][:, -logits.shape[1]:]                                # (B, Tc)
    logp = logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    return logp * batch["completion_mask"]


@torch.no_grad()
def completion_logprobs(model, prompts, completions, pad_token_id, temperature=1.0, batch_size=32):
    """Per-token log-probs of fixed completions under `model`: a list of 1-D float tensors.

    Used for the engine-vs-trainer gap and by evaluate.py's Delta NLL_rare.
    """
    device = next(model.parameters()).device
    result = []
    for s in range(0, len(prompts), batch_size):
        batch = pack(prompts[s:s + batch_size], completions[s:s + batch_size], pad_token_id, device)
        logp = token_logprobs(completion_logits(model, batch, temperature), batch).cpu()
        result += [logp[i, :len(c)] for i, c in enumerate(completions[s:s + batch_size])]
    return result


# -----------------------------------------------------------------------------
# Weight sync: trainer (maybe FSDP2-sharded) -> engine (IMPLEMENTATION_NOTES §2)

def iter_full_params(model):
    """(name, full tensor) for every entry of the state dict, one at a time, in the same order on
    every rank. A sharded (DTensor) entry is all-gathered: a collective, so ALL ranks must iterate.
    Wrapper prefixes (torch.compile's _orig_mod.) are stripped so names stay Hugging Face names."""
    for name, p in model.state_dict().items():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        yield name.replace("_orig_mod.", ""), t.detach()


def make_buckets(named_tensors, max_bytes):
    """Group (name, tensor) pairs into lists of at most max_bytes each. A tensor larger than the cap
    travels alone. Buckets bound the engine-side peak memory and the number of round trips."""
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


def sync_weights(model, engine, bucket_bytes=1 << 30, push=True):
    """Push the trainer's weights into the engine; returns the seconds it took.

    Every rank gathers (full_tensor is a collective); only ranks that own an engine push
    (push=False on the others). The prefix cache is reset afterwards: KV computed with the old
    weights must never be reused.
    """
    t0 = time.perf_counter()
    for bucket in make_buckets(iter_full_params(model), bucket_bytes):
        if push:
            engine.load_weights(bucket)
    if push:
        engine.reset_prefix_cache()
    return time.perf_counter() - t0


def make_engine(kind, model, pad_token_id, max_batch_size=512, **vllm_kwargs):
    """The engine train.py and evaluate.py ask for with --engine: "torch" (default) or "vllm"."""
    if kind == "torch":
        return TorchEngine(model, pad_token_id, max_batch_size)
    if kind == "vllm":
        raise NotImplementedError("--engine vllm: the vLLM engine is not built yet (issue 6)")
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
              f"logp {[round(x, 2) for x in r.logprobs[i]]}")
