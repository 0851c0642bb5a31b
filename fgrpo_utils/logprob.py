"""
The trainer's log-probs of given completions: pack() lays out a micro-batch, policy_logp() scores it with
gradient (and entropy) in bounded memory: the vocabulary head runs in chunks of tokens, recomputed in
backward, so the (S, Tc, V) logits never exist. token_logp(completion_logits(...)) is the tests' reference.

Log-probs, one name per idea, here and in train.py, rollout.py, evaluate.py and advantage.py:
    logp         log pi_theta of the sampled tokens under the trainer's current weights, with gradient
                 in the update: (S, Tc) per completion token, 0 where masked, or a 1-D tensor per completion
    old_logp     the same under pi_old, the weights that sampled this step's rollouts (before its first
                 optimizer step); the denominator of the ratio (Eq. 14). On-policy it IS the first logp.
    engine_logp  the rollout engine's, for the tokens it sampled: old_logp up to numerics (logp/diff_*)
    ref_logp     under the frozen initial model (GRPO-KL's k3, Sec. 5.6)
    logprobs     a whole distribution over the vocabulary, (B, V): sampling_logprobs
"""
import torch
import torch.nn.functional as F

ATTENTION, VARLEN = "fgrpo_sdpa", "fgrpo_varlen"   # policy.attention's, .varlen_attention's names in transformers

def pack(prompts, completions, pad_token_id, device="cpu", share_prompts=False, padding_free=False):
    """Lay out prompt + completion pairs for one forward pass: in one row without padding (padding_free,
    one_row), a right-padded row per sequence (padded_rows), or a row per group (share_prompts, shared_rows).
    In each, targets and completion_mask are (S, Tc) with one row per sequence, in input order, and
    hidden[row[i], src[i, t]] is the position that predicts completion i's token t."""
    S, Tc = len(prompts), max(1, max(len(c) for c in completions))
    targets = torch.full((S, Tc), pad_token_id, dtype=torch.long)
    for i, c in enumerate(completions):
        targets[i, :len(c)] = torch.tensor(c, dtype=torch.long)
    cmask = torch.arange(Tc)[None, :] < torch.tensor([len(c) for c in completions])[:, None]
    # the completion tokens as (sequence, column) indices, from the lengths: indexing by a boolean mask has a
    # data-dependent shape (a sync on CUDA; impossible for bench/dry_run.py's fake tensors)
    seq = torch.tensor([i for i, c in enumerate(completions) for _ in c], dtype=torch.long)
    col = torch.tensor([t for c in completions for t in range(len(c))], dtype=torch.long)
    batch = {"targets": targets, "completion_mask": cmask, "tok_seq": seq, "tok_col": col}
    layout = shared_rows if share_prompts else one_row if padding_free else padded_rows
    batch.update(layout(prompts, completions, pad_token_id, Tc))
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}

def one_row(prompts, completions, pad_token_id, Tc):
    """ONE row holding every sequence end to end, no padding (verl's remove-padding, TRL's padding-free),
    [p1 p1 c1 c1 c1 | p2 c2 | ...]; positions restart at 0 with each sequence and "segments" (its
    boundaries) lets policy.attention run each one causally on its own."""
    ids, pos, ends, src = [], [], [0], torch.zeros(len(prompts), Tc, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        src[i, :len(c)] = len(ids) + len(p) - 1 + torch.arange(len(c))   # c[t] from the column before it
        ids += list(p) + list(c)
        pos += range(len(p) + len(c))
        ends.append(len(ids))
    return dict(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]),
                row=torch.zeros(len(prompts), dtype=torch.long), src=src, segments=tuple(ends))

def padded_rows(prompts, completions, pad_token_id, Tc):
    """One row per sequence, [p p p c c c pad pad], right-padded only: every query has its row's first token
    to attend to, so no query row of the mask is empty, whatever kernel runs (a left-padded one is: NaN in
    some SDPA kernels, and through backward in every weight)."""
    S, L = len(prompts), max(len(p) + len(c) for p, c in zip(prompts, completions))
    ids = torch.full((S, L), pad_token_id, dtype=torch.long)
    attn, src = torch.zeros(S, L, dtype=torch.long), torch.zeros(S, Tc, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, :len(p) + len(c)] = torch.tensor(list(p) + list(c))
        attn[i, :len(p) + len(c)] = 1
        src[i, :len(c)] = len(p) - 1 + torch.arange(len(c))
    return dict(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                row=torch.arange(S), src=src)

def shared_rows(prompts, completions, pad_token_id, Tc):
    """Consecutive sequences with the same prompt (a GRPO group) share ONE row, [p p p | c1 c1 | c2 c2 c2 | ...
    pad]: each completion continues the prompt's positions and attends to the prompt and to itself only (a
    4-D mask): ~6x fewer tokens on the maze (long prompts, short answers), but the (rows, L, L) mask makes
    it a poor fit for long completions."""
    rows = []                            # per row: prompt, ids, positions, segments (0 = prompt)
    row_of, src = torch.zeros(len(prompts), dtype=torch.long), torch.zeros(len(prompts), Tc, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if not rows or rows[-1]["prompt"] != list(p):             # a new group starts a new row
            rows.append({"prompt": list(p), "ids": list(p), "pos": list(range(len(p))), "seg": [0] * len(p), "k": 0})
        r = rows[-1]
        r["k"] += 1
        # c[0] is predicted from the prompt's last token, c[t] from c[t-1]'s column
        src[i, :len(c)] = torch.tensor([len(p) - 1] + list(range(len(r["ids"]), len(r["ids"]) + len(c) - 1)))
        r["ids"] += c
        r["pos"] += range(len(p), len(p) + len(c))
        r["seg"] += [r["k"]] * len(c)
        row_of[i] = len(rows) - 1
    L = max(len(r["ids"]) for r in rows)
    ids = torch.full((len(rows), L), pad_token_id, dtype=torch.long)
    pos = torch.zeros(len(rows), L, dtype=torch.long)
    seg = torch.full((len(rows), L), -1)                            # -1 padding, 0 prompt, k c_k
    for j, r in enumerate(rows):
        n = len(r["ids"])
        ids[j, :n], pos[j, :n], seg[j, :n] = (torch.tensor(r[k]) for k in ("ids", "pos", "seg"))
    col = torch.arange(L)
    mask = ((col[:, None] >= col[None, :])                          # causal
            & ((seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == 0))   # own segment or prompt
            & (seg[:, None, :] >= 0) & (seg[:, :, None] >= 0))
    mask |= torch.eye(L, dtype=torch.bool)                          # padding attends to itself: no NaN
    return dict(input_ids=ids, attention_mask=mask[:, None], position_ids=pos, row=row_of, src=src)

def padded(rows, like):
    """A list of 1-D per-token tensors -> (b, Tc) shaped like `like` (a policy_logp output), zero-padded."""
    out = torch.zeros_like(like)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r.to(out)
    return out

def completion_logits(model, batch, temperature=1.0):
    """Logits / T at the positions that predict each completion token. batch from pack(). (S, Tc, V)
    The small-scale reference: the whole (S, Tc, V) float tensor is 37-148 GiB at the paper's scale
    (V = 152,064, 8 x 8k tokens). T must be the sampling temperature (a bug TRL users hit at T != 1)."""
    logits = model(**model_inputs(model, batch)).logits[batch["row"][:, None], batch["src"]]
    return logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature   # fp32 (fp64 stays)

def model_inputs(model, batch):
    """The keyword arguments of a transformers model (or its decoder) for a batch from pack()."""
    kw = dict(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    if "segments" not in batch:
        return kw | dict(attention_mask=batch["attention_mask"])
    # One row of whole sequences. policy.attention runs each alone without a mask: a decoder that takes a
    # mapping of masks (Qwen2, Qwen3) is given None for each. Any other case gets None, from which transformers
    # builds a block-diagonal mask out of the restarting positions: right for every attention, (L, L) in size.
    types = getattr(model.config, "layer_types", None)
    ours = types and getattr(model.config, "_attn_implementation", None) in (ATTENTION, VARLEN)
    return kw | dict(attention_mask=dict.fromkeys(types) if ours else None, segments=batch["segments"])

def token_logp(logits, batch):
    """logp of each completion token: logits (S, Tc, V) at the positions that predict the tokens
    batch["targets"] (S, Tc) -> (S, Tc), log softmax(logits)[target], exactly 0 where
    batch["completion_mask"] is False. Differentiable w.r.t. logits; finite for any finite logits.

    token_logp(completion_logits(...)) is the direct formula, which needs the whole (S, Tc, V) logits:
    the tests' reference for policy_logp, which gives the same values without ever building them."""
    logp = logits.log_softmax(-1).gather(-1, batch["targets"][..., None]).squeeze(-1)
    return logp * batch["completion_mask"]

CHUNK_BYTES = 1 << 30      # policy_logp's extra memory for the vocabulary head: ~1 GiB at any batch size
CHUNK_TEMPS = 2            # (chunk, V) float32 buffers alive at once in _ChunkedHead: z and p (see there)

def _chunk_logits(h, weight, bias, temperature, dtype):
    """z = (h W^T + b) / T for one chunk of tokens, (c, d) -> (c, V) in `dtype` (float32, or float64):
    F.linear as the model's own head, then one cast (for bf16 weights a half-size transient)."""
    z = F.linear(h, weight, bias).to(dtype)
    return z.div_(temperature) if temperature != 1.0 else z

class _ChunkedHead(torch.autograd.Function):
    """logp = z[target] - logsumexp(z) and H = logsumexp(z) - sum softmax(z) z, with z = (h W^T + b) / T,
    for N flattened tokens, `chunk` at a time. Saves h, W, b, the targets and per-token lse, H; never the
    logits. Backward recomputes each chunk's z and, with p = softmax(z) and dz the gradient w.r.t. z,
        dz = g_logp (onehot(target) - p) - g_H p (z - (lse - H))     [d H / dz = -p (z - sum p z)]
    then d(logits) = dz / T, dh = d(logits) W, dW += d(logits)^T h, db += sum d(logits).
    Memory per chunk: z and p, float32 (c, V) each, so CHUNK_TEMPS = 2 (bf16 temporaries are half-size,
    never alive with both); fixed on top: dW, (V, d) in the weight's dtype, as autograd's; matmuls in h's."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature, entropy, chunk):
        N, dtype = h.shape[0], torch.promote_types(h.dtype, torch.float32)
        logp = torch.empty(N, dtype=dtype, device=h.device)
        lse = torch.empty(N, dtype=dtype, device=h.device)
        H = torch.empty(N, dtype=dtype, device=h.device) if entropy else None
        for s in range(0, N, chunk):
            z = _chunk_logits(h[s:s + chunk], weight, bias, temperature, dtype)         # (c, V)
            m = z.amax(-1, keepdim=True)                                                # (c, 1)
            p = (z - m).exp_()                                      # unnormalised softmax, (c, V)
            total = p.sum(-1)                                                           # (c,)
            lse[s:s + chunk] = m.squeeze(-1) + total.log()
            logp[s:s + chunk] = z.gather(-1, targets[s:s + chunk, None]).squeeze(-1) - lse[s:s + chunk]
            if entropy:                                             # sum p z as a batched dot: no (c, V) temp
                p.div_(total[:, None])
                H[s:s + chunk] = lse[s:s + chunk] - (p[:, None, :] @ z[:, :, None]).view(-1)
            del z, p
        ctx.save_for_backward(h, weight, bias, targets, lse, H)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)                # an output without gradient arrives as None
        return logp, H

    @staticmethod
    def backward(ctx, g_logp, g_H):
        h, weight, bias, targets, lse, H = ctx.saved_tensors
        T, chunk, dtype = ctx.temperature, ctx.chunk, lse.dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dh = torch.zeros_like(h) if need_h else None
        # dW in the weight's own dtype, as autograd would deliver it: in bf16 an fp32 accumulator
        # would add 2 GiB at the 7B's (V, h); each chunk's product is exact in fp32 before the add.
        dw = torch.zeros_like(weight) if need_w else None
        db = torch.zeros(bias.shape, dtype=dtype, device=bias.device) if need_b else None
        if g_logp is None and g_H is None:
            return dh, dw, db, None, None, None, None
        for s in range(0, h.shape[0], chunk):
            h_c, t_c, lse_c = h[s:s + chunk], targets[s:s + chunk], lse[s:s + chunk]
            z = _chunk_logits(h_c, weight, bias, T, dtype)                               # (c, V)
            p = (z - lse_c[:, None]).exp_()                                              # softmax, (c, V)
            if g_H is not None:                 # dz = -g_H p (z - (lse - H)), built in z's own memory
                dz = z.sub_((lse_c - H[s:s + chunk])[:, None]).mul_(p).mul_(-g_H[s:s + chunk, None])
                if g_logp is not None:
                    dz.addcmul_(p, g_logp[s:s + chunk, None], value=-1)                 # - g_logp p
            else:
                del z
                dz = p.mul_(-g_logp[s:s + chunk, None])
            del p
            if g_logp is not None:                                                      # + g_logp onehot
                rows = torch.arange(len(t_c), device=dz.device)
                dz[rows, t_c] += g_logp[s:s + chunk].to(dtype)
            if T != 1.0:
                dz.div_(T)                                                 # z = logits / T
            dz = dz.to(h.dtype)
            if need_h:
                dh[s:s + chunk] = dz @ weight
            if need_w:
                dw.addmm_(dz.T, h_c)
            if need_b:
                db.add_(dz.sum(0))
            del dz
        return dh, dw, db.to(bias.dtype) if need_b else None, None, None, None, None

def head_logp(h, weight, bias, targets, temperature=1.0, entropy=False, chunk_bytes=CHUNK_BYTES):
    """Per-token log-probs of the sampled tokens, and optionally the entropy, from the vocabulary head.

    h: (N, d) hidden states, each predicting one token; weight (V, d) and bias (V,) or None: the head
    (an nn.Linear's, maybe tied to the embeddings); targets: (N,) token ids. With z = (h W^T + b) / T
    in float32 (float64 stays float64), returns (logp, H), each (N,): logp[i] = log softmax(z_i)[targets[i]]
    and H[i] = -sum_v p_v log p_v with p = softmax(z_i) (None unless entropy=True); differentiable
    w.r.t. h, weight and bias, finite for any finite logits. T must be the sampling temperature, or
    these are the log-probs of another distribution (a bug TRL users hit at T != 1).
    The plain form builds the (N, V) logits; the reference computes them in chunks of tokens
    (_ChunkedHead, which the course's student copy leaves out) so that the float32 (chunk, V) buffers
    take about chunk_bytes and the (N, V) logits never exist: 37-148 GiB at the paper's scale."""
    itemsize = torch.promote_types(h.dtype, torch.float32).itemsize
    chunk = max(1, chunk_bytes // (weight.shape[0] * itemsize * CHUNK_TEMPS))
    return _ChunkedHead.apply(h, weight, bias, targets, float(temperature), entropy, chunk)

POLICY_FORWARD = "fgrpo_policy_forward"     # the method register_policy_forward adds to FSDP2 roots

def _policy_forward(model, batch, temperature, entropy, chunk_bytes):
    """policy_logp's body; under FSDP2 a registered forward of the root, which unshards its own parameters."""
    hidden = model.get_decoder()(**model_inputs(model, batch)).last_hidden_state
    # only the N real completion tokens go through the head: padding costs nothing
    seq, col, shape = batch["tok_seq"], batch["tok_col"], batch["completion_mask"].shape   # (N,), (N,), (S, Tc)
    head = model.get_output_embeddings()
    logp, H = head_logp(hidden[batch["row"][seq], batch["src"][seq, col]], head.weight, head.bias,
                        batch["targets"][seq, col], temperature, entropy, chunk_bytes)    # (N,)
    out_logp = logp.new_zeros(shape).index_put((seq, col), logp)                         # (S, Tc)
    out_H = None if H is None else H.new_zeros(shape).index_put((seq, col), H)
    return out_logp, out_H

def register_policy_forward(model):
    """Let policy_logp run inside the FSDP2 root's forward; call right after fully_shard(model) (a no-op
    unsharded; policy_logp calls it on first use too). fully_shard unshards a module's parameters only
    around its forward(), and policy_logp calls the decoder and head itself: a second forward method."""
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
    if isinstance(model, FSDPModule) and POLICY_FORWARD not in model.__dict__:
        model.__dict__[POLICY_FORWARD] = _policy_forward.__get__(model)     # a bound method
        register_fsdp_forward_method(model, POLICY_FORWARD)
    return model

def policy_logp(model, batch, temperature=1.0, entropy=False, chunk_bytes=None):
    """The completion tokens' log-probs and entropy, batch from pack(): (logp, H), each (S, Tc) float32 (float64
    for a float64 model), 0 off completion_mask, H None unless entropy=True; token_logp(completion_logits(...))'s
    values and gradients with ~chunk_bytes extra (None: CHUNK_BYTES at the call), at any batch size, even FSDP2."""
    from torch.distributed.fsdp import FSDPModule
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    if isinstance(model, FSDPModule):
        return getattr(register_policy_forward(model), POLICY_FORWARD)(batch, temperature, entropy, chunk_bytes)
    return _policy_forward(model, batch, temperature, entropy, chunk_bytes)

@torch.no_grad()
def completion_logp(model, prompts, completions, pad_token_id, temperature=1.0, batch_size=32, share_prompts=False):
    """Per-token log-probs of fixed completions, no gradient, via policy_logp: one 1-D tensor per completion."""
    device = next(model.parameters()).device
    result = []
    for s in range(0, len(prompts), batch_size):
        batch = pack(prompts[s:s + batch_size], completions[s:s + batch_size], pad_token_id, device,
                     share_prompts=share_prompts)
        logp = policy_logp(model, batch, temperature)[0].cpu()
        result += [logp[i, :len(c)] for i, c in enumerate(completions[s:s + batch_size])]
    return result
