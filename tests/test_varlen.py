"""--attention varlen on the CPU: torch's variable-length kernel is CUDA-only, so each torch's varlen_attn
(2.10, 2.11 and 2.12+ signatures) is stood in for by SDPA per sequence, and policy.varlen_attention must give
it what the kernel needs (int32 cumulative lengths, the longest length, causal, the KV heads as that
version takes them, the scale) and the loop's log-probs and gradients back. The kernel itself is timed and
compared against the loop on a GPU by bench/gpu_contact.py.    python -m pytest -q tests/test_varlen.py
"""
import inspect
from types import SimpleNamespace

import pytest
import torch
import torch.nn.attention.varlen as varlen
import torch.nn.functional as F

from fgrpo_utils import policy
from fgrpo_utils.logprob import VARLEN, model_inputs, pack, policy_logp
from test_gpu_path import COMPLETIONS, PROMPTS, logp_H_grads, tiny

CALLS = []


def kernel(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, gqa):
    """What the flash kernel computes, checked for what it needs: (T, H, D) in and out, each sequence
    cu[i]:cu[i + 1] attending causally to itself alone."""
    assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and cu_q[0] == 0 and cu_q[-1] == q.shape[0]
    assert max_q == max_k == int((cu_q[1:] - cu_q[:-1]).max()) and causal
    assert gqa or k.shape[1] == q.shape[1], "this torch's kernel takes as many KV heads as query heads"
    CALLS.append(scale)
    cu = cu_q.tolist()
    return torch.cat([F.scaled_dot_product_attention(*(x[s:e].transpose(0, 1) for x in (q, k, v)), is_causal=True,
                                                     scale=scale, enable_gqa=gqa).transpose(0, 1)
                      for s, e in zip(cu, cu[1:])])


# The three signatures of torch.nn.attention.varlen.varlen_attn (policy.varlen_attention says where each was read).
def torch_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    return kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, None, False)


def torch_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
               window_size=(-1, -1)):
    return kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size == (-1, 0), scale, False)


def torch_2_12(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
               window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    return kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size == (-1, 0), scale, enable_gqa)


def test_the_installed_torch_has_one_of_the_known_signatures():
    """A torch whose varlen_attn takes other keywords fails here first: add its form above and to
    policy.varlen_attention."""
    known = [list(inspect.signature(f).parameters) for f in (torch_2_10, torch_2_11, torch_2_12)]
    assert list(inspect.signature(varlen.varlen_attn).parameters) in known


def test_the_bounds_are_int32_cumulative_lengths_and_the_longest():
    cu, longest = policy.varlen_bounds((0, 3, 7, 12), torch.device("cpu"))
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 7, 12] and longest == 5
    assert policy.varlen_bounds((0, 3, 7, 12), torch.device("cpu"))[0] is cu      # one copy for all the layers
    assert policy.varlen_bounds((0, 9), torch.device("cpu"))[1] == 9


@pytest.mark.parametrize("version", [torch_2_10, torch_2_11, torch_2_12], ids=lambda f: f.__name__)
def test_varlen_gives_the_loops_log_probs_and_gradients(version, monkeypatch):
    """One call a layer (2 layers: 2 calls a forward), the loop's values to float64's precision, the
    scale passed where the signature takes one; the padded layout (no segments) is the loop's own path."""
    monkeypatch.setattr(varlen, "varlen_attn", version)
    loop, fast = tiny("qwen2"), policy.use_attention(tiny("qwen2"), "varlen")
    assert fast.config._attn_implementation == VARLEN and loop.config.num_key_value_heads == 2   # GQA: 4 / 2
    flat = pack(PROMPTS, COMPLETIONS, 0, padding_free=True)
    assert isinstance(model_inputs(fast, flat)["attention_mask"], dict)    # no mask built: each layer's None
    CALLS.clear()
    want, got = logp_H_grads(loop, flat), logp_H_grads(fast, flat)
    assert len(CALLS) == 2 and all(s == (None if version is torch_2_10 else 8 ** -0.5) for s in CALLS)
    for a, b in zip(want[:2], got[:2]):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)
    for n, g in want[2].items():
        assert torch.allclose(g, got[2][n], atol=1e-12, rtol=1e-9), n
    padded = pack(PROMPTS, COMPLETIONS, 0)
    CALLS.clear()
    assert torch.equal(policy_logp(loop, padded)[0], policy_logp(fast, padded)[0]) and not CALLS


def test_the_trainer_loads_its_policy_with_the_flags_attention():
    """train.py's --attention reaches the policy through policy.load_model, which train.build_models calls for
    the policy and the reference; TorchEngine switches its own copy back to the loop (rollout.py)."""
    cfg = SimpleNamespace(model="tiny", seed=0, attention="varlen")
    assert policy.load_model(cfg, [0] * 40).config._attn_implementation == VARLEN
    assert policy.load_model(cfg, [0] * 40, meta=True).config._attn_implementation == VARLEN
    assert policy.use_attention(policy.load_model(cfg, [0] * 40)).config._attn_implementation == policy.ATTENTION
