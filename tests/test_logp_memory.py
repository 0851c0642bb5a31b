"""logprob.policy_logp: the trainer's log-probs and entropy without the (tokens, V) logits.

    python -m pytest -q tests/test_logp_memory.py

policy_logp must give the numbers (and gradients) of the direct formula, token_logp(completion_logits)
and advantage.entropy_from_logits, on a plain and on an FSDP2-sharded model, while its memory stays
flat as tokens x vocabulary grows. The FSDP2 check runs this file as a torchrun worker:

    python -m torch.distributed.run --standalone --nproc_per_node 1 tests/test_logp_memory.py fsdp OUT.json
    python tests/test_logp_memory.py rss {policy,direct} TOKENS      # one peak-RSS measurement
"""
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advantage import entropy_from_logits  # noqa: E402
from fgrpo_utils.logprob import (CHUNK_TEMPS, _ChunkedHead, completion_logits, completion_logp, head_logp, pack, policy_logp, register_policy_forward, token_logp)  # noqa: E402
from fgrpo_utils.policy import use_attention  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
V = 40
PROMPTS = [[3, 4, 5, 6, 7]] * 3 + [[8, 9]] * 2 + [[10, 11, 12]]       # groups of 3, 2 and 1 (share_prompts)
COMPLETIONS = [[5, 6, 7], [8], [9, 10, 11, 12, 13, 14, 15], [3, 3], [2, 30, 31, 32], [4]]  # 18 tokens, padded


def tiny(tie=True, dtype=torch.float64, vocab=V, hidden=32, seed=0):
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4 if hidden >= 32 else 2, num_key_value_heads=2 if hidden >= 32 else 1,
        max_position_embeddings=8192, tie_word_embeddings=tie)).to(dtype)
    with torch.no_grad():                       # spread the logits (random init is near uniform)
        model.get_output_embeddings().weight.mul_(3.0)
    return use_attention(model)


def direct(model, batch, T):
    """The reference: full logits, then the two formulas the trainer used before policy_logp. The
    entropy is advantage.entropy_from_logits's formula, written out here because that function
    computes in float32 and these checks are float64 (test_policy_logp_float32... calls it as is)."""
    logits = completion_logits(model, batch, T)
    H = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
    return token_logp(logits, batch), H * batch["completion_mask"]


def chunk_bytes_for(tokens, model):
    """The chunk_bytes that make head_logp take `tokens` tokens per chunk (float64 model)."""
    return tokens * model.config.vocab_size * 8 * CHUNK_TEMPS


# -----------------------------------------------------------------------------
# The autograd Function alone

@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_chunked_head_gradcheck(chunk):
    """gradcheck (float64) w.r.t. hidden states, weight and bias: 7 tokens in chunks of 1, 3 (7 is
    not a multiple), 7 and more than all, T != 1, with and without entropy, and with only one of
    the two outputs receiving gradient (backward gets None for the other)."""
    torch.manual_seed(0)
    h = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    W = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 11, (7,))
    assert torch.autograd.gradcheck(lambda h, W, b: _ChunkedHead.apply(h, W, b, t, 0.7, True, chunk), (h, W, b))
    assert torch.autograd.gradcheck(lambda h, W, b: _ChunkedHead.apply(h, W, b, t, 0.7, False, chunk)[0], (h, W, b))
    assert torch.autograd.gradcheck(lambda h, W: _ChunkedHead.apply(h, W, None, t, 1.0, True, chunk)[0], (h, W))
    assert torch.autograd.gradcheck(lambda h, W: _ChunkedHead.apply(h, W, None, t, 1.3, True, chunk)[1], (h, W))


def test_head_logp_values_and_chunk_size(monkeypatch):
    """head_logp equals log_softmax / entropy of the full logits, and sizes its chunks as documented:
    max(1, chunk_bytes // (V * 4 * CHUNK_TEMPS)) tokens for float32."""
    torch.manual_seed(0)
    head = torch.nn.Linear(6, 50, bias=True)
    h, t = torch.randn(9, 6), torch.randint(0, 50, (9,))
    z = head(h).float() / 0.8
    for chunk_bytes in (1, 4 * 50 * 4 * CHUNK_TEMPS, 1 << 30):
        logp, H = head_logp(h, head.weight, head.bias, t, 0.8, entropy=True, chunk_bytes=chunk_bytes)
        assert torch.allclose(logp, z.log_softmax(-1).gather(-1, t[:, None]).squeeze(-1), atol=1e-6)
        assert torch.allclose(H, entropy_from_logits(z), atol=1e-6)
    seen, orig = [], _ChunkedHead.apply
    monkeypatch.setattr(_ChunkedHead, "apply", lambda *a: seen.append(a[-1]) or orig(*a))
    head_logp(h, head.weight, head.bias, t, chunk_bytes=4 * 50 * 4 * CHUNK_TEMPS)
    head_logp(h.double(), head.double().weight, head.bias, t, chunk_bytes=4 * 50 * 4 * CHUNK_TEMPS)    # float64: 8 bytes
    head_logp(h, head.float().weight, head.bias, t, chunk_bytes=1)                                     # at least one token
    assert seen == [4, 2, 1]


# -----------------------------------------------------------------------------
# policy_logp on a tiny Qwen2: both layouts, tied and untied head, against the direct path

def grads_of(model, logp, H, a, b):
    """Parameter gradients of sum(a logp) (+ sum(b H) when b is given)."""
    model.zero_grad(set_to_none=True)
    loss = (a * logp).sum() + ((b * H).sum() if b is not None else 0)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("share_prompts", [False, True])
def test_policy_logp_matches_direct(tie, share_prompts):
    """Values and every parameter gradient within 1e-6 (float64) of the direct formula: chunks of 1
    token, 5 tokens (18 is not a multiple) and all at once; T = 1 and 0.7; entropy on (gradient
    through both) and off; entropy computed but only logp receiving gradient; padded positions 0."""
    model = tiny(tie)
    batch = pack(PROMPTS, COMPLETIONS, 0, share_prompts=share_prompts)
    mask = batch["completion_mask"]
    assert (~mask).any() and mask.sum() == 18
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randn(mask.shape, generator=g, dtype=torch.float64) for _ in range(2))   # loss weights
    for T in (1.0, 0.7):
        want_logp, want_H = direct(model, batch, T)
        want_g = grads_of(model, want_logp, want_H, a, b)
        want_g_logp_only = grads_of(model, *direct(model, batch, T), a, None)
        for tokens in (1, 5, 1000):
            cb = chunk_bytes_for(tokens, model)
            logp, H = policy_logp(model, batch, T, entropy=True, chunk_bytes=cb)
            assert logp.dtype == H.dtype == torch.float64 and logp.shape == mask.shape
            assert (logp[~mask] == 0).all() and (H[~mask] == 0).all()
            assert torch.allclose(logp, want_logp, atol=1e-6, rtol=0)
            assert torch.allclose(H, want_H, atol=1e-6, rtol=0)
            got_g = grads_of(model, logp, H, a, b)
            assert got_g.keys() == want_g.keys()
            for n in want_g:
                assert torch.allclose(got_g[n], want_g[n], atol=1e-6, rtol=0), (n, T, tokens)
            logp, H = policy_logp(model, batch, T, entropy=True, chunk_bytes=cb)   # H computed, unused
            got_g = grads_of(model, logp, H, a, None)
            for n in want_g_logp_only:
                assert torch.allclose(got_g[n], want_g_logp_only[n], atol=1e-6, rtol=0), (n, T, tokens)
            logp, H = policy_logp(model, batch, T, entropy=False, chunk_bytes=cb)
            assert H is None and torch.allclose(logp, want_logp, atol=1e-6, rtol=0)
            got_g = grads_of(model, logp, None, a, None)
            for n in want_g_logp_only:
                assert torch.allclose(got_g[n], want_g_logp_only[n], atol=1e-6, rtol=0), (n, T, tokens)


def test_policy_logp_float32_and_completion_logp():
    """An fp32 model: float32 results, close to the direct path; completion_logp (no gradient, now
    through policy_logp) returns each completion's own 1-D log-probs, in input order."""
    model = tiny(dtype=torch.float32)
    batch = pack(PROMPTS, COMPLETIONS, 0)
    logp, H = policy_logp(model, batch, 0.9, entropy=True, chunk_bytes=3 * V * 4 * CHUNK_TEMPS)
    logits = completion_logits(model, batch, 0.9)
    want_logp, want_H = token_logp(logits, batch), entropy_from_logits(logits) * batch["completion_mask"]
    assert logp.dtype == torch.float32
    assert torch.allclose(logp, want_logp, atol=1e-5) and torch.allclose(H, want_H, atol=1e-5)
    got = completion_logp(model, PROMPTS, COMPLETIONS, 0, temperature=0.9, batch_size=2, share_prompts=True)
    for i, c in enumerate(COMPLETIONS):
        assert got[i].shape == (len(c),) and torch.allclose(got[i], want_logp[i, :len(c)], atol=1e-5)


# -----------------------------------------------------------------------------
# FSDP2: the root's parameters (embeddings, norm, head) are unsharded only inside a registered forward

def fsdp_worker(out):
    """torchrun worker: a tiny float64 Qwen2, tied and untied, sharded per block + root like
    policy.shard, then policy_logp (values, entropy, parameter gradients) vs the unsharded direct
    path, twice in a row; completion_logp on the sharded model; and sync_weights into a bf16 engine."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from rollout import TorchEngine, sync_weights
    dist.init_process_group("gloo")
    result = {}
    for tie in (True, False):
        ref = tiny(tie)
        model = copy.deepcopy(ref)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        # the sharded parameters, as an optimizer holds them: after a no-grad forward (completion_logp)
        # FSDP2 leaves the root unsharded, and model.zero_grad() would then clear the unsharded
        # copies' grads, not these (train.py clears through opt.zero_grad)
        params = dict(model.named_parameters())
        if not tie:
            register_policy_forward(model)      # as policy.shard does; tied: policy_logp's own first-use call
        for share_prompts in (False, True):
            batch = pack(PROMPTS, COMPLETIONS, 0, share_prompts=share_prompts)
            g = torch.Generator().manual_seed(1)
            a, b = (torch.randn(batch["completion_mask"].shape, generator=g, dtype=torch.float64) for _ in range(2))
            want_logp, want_H = direct(ref, batch, 0.7)
            want_g = grads_of(ref, want_logp, want_H, a, b)
            gaps = []
            for _ in range(2):
                for p in params.values():
                    p.grad = None
                logp, H = policy_logp(model, batch, 0.7, entropy=True, chunk_bytes=chunk_bytes_for(5, ref))
                ((a * logp).sum() + (b * H).sum()).backward()
                got_g = {n: p.grad.full_tensor() for n, p in params.items() if p.grad is not None}
                assert got_g.keys() == want_g.keys(), (got_g.keys(), want_g.keys())
                gaps.append(max([(logp - want_logp).abs().max().item(), (H - want_H).abs().max().item()]
                                + [(got_g[n] - want_g[n]).abs().max().item() for n in want_g]))
            lp = completion_logp(model, PROMPTS, COMPLETIONS, 0, temperature=0.7, share_prompts=share_prompts)
            gaps.append(max((x - want_logp[i, :len(x)]).abs().max().item() for i, x in enumerate(lp)))
            result[f"tie={tie},share={share_prompts}"] = max(gaps)
        engine = TorchEngine(tiny(tie, dtype=torch.bfloat16, seed=5), 0)
        seen = []
        load = engine.load_weights
        engine.load_weights = lambda bucket: seen.extend(bucket) or load(bucket)
        sync_weights(model, engine, bucket_bytes=4096)
        result[f"tie={tie},sync_dtypes"] = sorted({str(t.dtype) for _, t in seen})
        result[f"tie={tie},sync_gap"] = max((engine.model.state_dict()[n].double() - p.to(torch.bfloat16).double())
                                            .abs().max().item() for n, p in ref.state_dict().items())
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_policy_logp_under_fsdp2(tmp_path, world):
    """Under fully_shard (gloo, CPU, float64), tied and untied heads, both layouts: policy_logp's
    values, entropy and full parameter gradients equal the unsharded direct path within 1e-6, and
    a sharded fp64 model syncs into a bf16 TorchEngine in bf16."""
    out = tmp_path / "fsdp.json"
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
                        __file__, "fsdp", str(out)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    for key, gap in result.items():
        if key.endswith("sync_dtypes"):
            assert gap == ["torch.bfloat16"], key
        else:
            assert gap < 1e-6, (key, gap)
    assert len(result) == 8


# -----------------------------------------------------------------------------
# Memory: flat in tokens x vocabulary

BIG_V = 150_000


def saved_bytes(fn):
    """Bytes of the tensors autograd saves for backward while fn() runs, parameters left out."""
    seen = {}

    def pack_hook(t):
        if not isinstance(t, torch.nn.Parameter):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        fn()
    return sum(seen.values())


def wide_batch(tokens, model):
    """4 sequences, `tokens` completion tokens in all, short prompts."""
    g = torch.Generator().manual_seed(0)
    n = tokens // 4
    completions = [torch.randint(0, BIG_V, (n,), generator=g).tolist() for _ in range(4)]
    return pack([[1, 2, 3]] * 4, completions, 0)


def test_saved_memory_is_flat_in_tokens_times_vocab():
    """A narrow model (hidden 16) with a 150k vocabulary: what policy_logp keeps for backward grows by
    a few bytes per token (hidden states, per-token lse and H), far below the 4 bytes x V per token
    of the logits; the direct path keeps at least one full (tokens, V) float tensor."""
    model = tiny(dtype=torch.float32, vocab=BIG_V, hidden=16)
    small, large = wide_batch(256, model), wide_batch(1024, model)      # 1k vs 4k: the slow RSS test
    policy = [saved_bytes(lambda: policy_logp(model, b, entropy=True, chunk_bytes=32 << 20)) for b in (small, large)]
    logits_growth = (1024 - 256) * BIG_V * 4                                # what full logits would add
    assert policy[1] - policy[0] < 0.01 * logits_growth, policy           # ~2.5 kB per token here
    assert policy[1] < 0.01 * 1024 * BIG_V * 4
    dpath = [saved_bytes(lambda: direct(model, wide_batch(n, model), 1.0)) for n in (64, 256)]
    assert dpath[0] >= 64 * BIG_V * 4 and dpath[1] >= 256 * BIG_V * 4     # at least one full logits tensor
    assert dpath[1] > 3.5 * dpath[0]


def rss_child(kind, tokens):
    """One measurement in a fresh process: the peak RSS above the RSS just before a forward +
    backward of policy_logp (entropy on, 32 MiB chunks) or of the direct path, in bytes."""
    torch.set_num_threads(1)
    model = tiny(dtype=torch.float32, vocab=BIG_V, hidden=16)
    batch = wide_batch(tokens, model)

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    Path("/proc/self/clear_refs").write_text("5")           # reset the peak (VmHWM) to the current RSS
    before = status("VmRSS:")
    logp, H = policy_logp(model, batch, entropy=True, chunk_bytes=32 << 20) if kind == "policy" \
        else direct(model, batch, 1.0)
    (logp.sum() + H.sum()).backward()
    print(status("VmHWM:") - before)


@pytest.mark.slow
def test_peak_rss_is_flat_in_tokens_times_vocab():
    """Peak RSS of forward + backward (fresh process per point, V = 150k, hidden 16): policy_logp at
    1k and 4k completion tokens grows far less than the 3 x 600 MB more logits a full-logits path
    would hold, and stays well under one (4k, V) logits tensor; the direct path at 1k tokens already
    peaks above one (1k, V) logits tensor."""
    def peak(kind, tokens):
        r = subprocess.run([PY, __file__, "rss", kind, str(tokens)], cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return int(r.stdout.split()[-1])
    logits_1k = 1024 * BIG_V * 4                                            # 614 MB
    p1, p4 = peak("policy", 1024), peak("policy", 4096)
    assert p4 - p1 < 0.1 * 3 * logits_1k, (p1, p4)
    assert p4 < 0.25 * 4 * logits_1k, p4
    d1 = peak("direct", 1024)
    assert d1 > logits_1k and d1 > 3 * p4, (d1, p4)


if __name__ == "__main__":
    if sys.argv[1] == "fsdp":
        fsdp_worker(sys.argv[2])
    else:
        rss_child(sys.argv[2], int(sys.argv[3]))
