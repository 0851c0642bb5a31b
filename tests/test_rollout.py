"""rollout.py: the engine samples what it says it samples. `python -m pytest -q tests/test_rollout.py`"""
import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from fgrpo_utils.logprob import completion_logits, completion_logp, pack, token_logp
from fgrpo_utils.memory_plan import kv_bytes_per_token
from rollout import (KV_CACHE_BYTES, TorchEngine, make_buckets, mix_seed, sample_from_uniform, sampling_logprobs, sync_weights)

V, STOP = 16, 1


def tiny_model(seed=0, vocab=V):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():                        # spread the logits (random init is near uniform)
        model.lm_head.weight.mul_(3.0)
    return model.eval()


PROMPTS = [[3, 4, 5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 2, 5]]          # uneven: left padding


def test_engine_logprobs_match_trainer_forward():
    """KV cache, left padding, position ids and row compaction are all right iff the log-probs the
    engine reports equal a fresh full forward pass over prompt + completion."""
    model = tiny_model()
    engine = TorchEngine(model, pad_token_id=0)
    r = engine.generate(PROMPTS, n=4, seeds=[1, 2, 3], max_new_tokens=12, stop_token_ids=[STOP])
    assert "stop" in r.finish_reason and "length" in r.finish_reason      # both paths exercised
    lens = {len(t) for t in r.token_ids}
    assert len(lens) > 2                                                  # rows left at different steps
    prompts = [PROMPTS[i] for i in r.prompt_index]
    ref = completion_logp(model, prompts, r.token_ids, pad_token_id=0, batch_size=5)
    for got, want in zip(r.engine_logp, ref):
        assert torch.allclose(torch.tensor(got), want, atol=1e-5)


def test_group_cache_matches_plain_attention():
    """The engine's own KV cache (each prompt's keys once for its n samples, rows dropping out as they
    stop, the per-row cache growing past its first 64 slots) gives the log-probs of transformers'
    eager attention on the whole sequence, a code path that shares nothing with it."""
    model = tiny_model()
    ref = tiny_model()
    ref.set_attn_implementation("eager")
    r = TorchEngine(model, pad_token_id=0).generate(PROMPTS, n=4, seeds=[1, 2, 3], max_new_tokens=70,
                                                    stop_token_ids=[STOP])
    assert max(len(t) for t in r.token_ids) > 64 and min(len(t) for t in r.token_ids) < 10
    want = completion_logp(ref, [PROMPTS[i] for i in r.prompt_index], r.token_ids, pad_token_id=0)
    for got, w in zip(r.engine_logp, want):
        assert torch.allclose(torch.tensor(got, dtype=torch.float32), w, atol=1e-5)


def test_completions_are_keyed_by_seed_not_batch():
    model = tiny_model()
    kw = dict(max_new_tokens=10, stop_token_ids=[STOP])
    together = TorchEngine(model, 0).generate(PROMPTS, n=3, seeds=[7, 8, 9], **kw)
    alone = TorchEngine(model, 0).generate(PROMPTS[1:2], n=3, seeds=[8], **kw)
    chunked = TorchEngine(model, 0, max_batch_size=3).generate(PROMPTS, n=3, seeds=[7, 8, 9], **kw)
    assert together.token_ids[3:6] == alone.token_ids
    assert together.token_ids == chunked.token_ids
    assert together.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2] == chunked.prompt_index
    assert len({tuple(t) for t in together.token_ids[3:6]}) > 1          # samples of a prompt differ
    other = TorchEngine(model, 0).generate(PROMPTS[1:2], n=3, seeds=[9], **kw)
    assert other.token_ids != alone.token_ids


def test_finish_reasons():
    model = tiny_model()
    r = TorchEngine(model, 0).generate(PROMPTS, n=8, seeds=[1, 2, 3], max_new_tokens=6,
                                       stop_token_ids=[STOP])
    for toks, why in zip(r.token_ids, r.finish_reason):
        if why == "stop":
            assert toks[-1] == STOP and STOP not in toks[:-1]
        else:
            assert len(toks) == 6 and STOP not in toks


def test_first_token_distribution():
    """Frequencies of the first sampled token over 4,000 seeds match softmax(logits) within 4 sigma."""
    model = tiny_model(seed=1)
    prompt = [3, 4, 5]
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt])).logits[0, -1], -1)
    r = TorchEngine(model, 0, max_batch_size=4000).generate([prompt], n=4000, seeds=[0],
                                                            max_new_tokens=1, stop_token_ids=[])
    freq = torch.bincount(torch.tensor([t[0] for t in r.token_ids]), minlength=V).double() / 4000
    sigma = (p * (1 - p) / 4000).sqrt().double()
    assert ((freq - p.double()).abs() <= 4 * sigma + 1e-3).all()


def test_sampling_logprobs_filters():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    assert torch.allclose(sampling_logprobs(logits).exp(), logits.exp())
    k2 = sampling_logprobs(logits, top_k=2).exp()
    assert torch.allclose(k2, torch.tensor([[2 / 3, 1 / 3, 0, 0]]))
    p = sampling_logprobs(logits, top_p=0.7).exp()                   # 0.5 < 0.7 <= 0.75: keep two
    assert torch.allclose(p, torch.tensor([[2 / 3, 1 / 3, 0, 0]]))
    assert torch.allclose(sampling_logprobs(logits, top_p=0.3).exp(), torch.tensor([[1., 0, 0, 0]]))
    t2 = sampling_logprobs(logits, temperature=2.0).exp()
    assert torch.allclose(t2, torch.softmax(logits / 2, -1))


def test_inverse_cdf_sampling():
    logp = torch.log(torch.tensor([[0.0, 0.5, 0.0, 0.5]]).expand(4, 4))
    u = torch.tensor([0.0, 0.49, 0.5, 0.999999])
    assert sample_from_uniform(logp, u).tolist() == [1, 1, 3, 3]      # zero-mass tokens never drawn


def test_mix_seed_is_stable_and_spread():
    assert mix_seed(1, 2, 3) == mix_seed(1, 2, 3)
    assert len({mix_seed(0, 0, i) for i in range(1000)}) == 1000
    assert 0 <= mix_seed(2**70, -5) < 2**63


def test_pack_layout():
    b = pack([[5, 6, 7], [8]], [[1, 2], [3, 4, 5]], pad_token_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7, 1, 2], [8, 3, 4, 5, 0]]           # right padding only
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 3]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert b["src"].tolist() == [[2, 3, 0], [0, 1, 2]]                  # the columns predicting each token
    assert b["completion_mask"].tolist() == [[True, True, False], [True, True, True]]
    f = pack([[5, 6, 7], [8]], [[1, 2], [3, 4, 5]], pad_token_id=0, padding_free=True)
    assert f["input_ids"].tolist() == [[5, 6, 7, 1, 2, 8, 3, 4, 5]] and f["segments"] == (0, 5, 9)
    assert f["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]] and f["src"].tolist() == [[2, 3, 0], [5, 6, 7]]


def test_buckets_and_sync():
    named = [(f"w{i}", torch.zeros(n)) for i, n in enumerate([10, 30, 5, 100, 7, 7])]   # float32
    buckets = list(make_buckets(iter(named), max_bytes=160))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]          # each exactly once
    for b in buckets:
        size = sum(t.numel() * 4 for _, t in b)
        assert size <= 160 or len(b) == 1                                      # oversized travels alone

    class FakeEngine:
        def __init__(self):
            self.calls = []

        def load_weights(self, bucket):
            self.calls.append(("load", [n for n, _ in bucket]))

        def reset_prefix_cache(self):
            self.calls.append(("reset", None))

    model = tiny_model()
    fake = FakeEngine()
    sync_weights(model, fake, bucket_bytes=4096)
    names = [n for kind, b in fake.calls if kind == "load" for n in b]
    assert names == list(model.state_dict()) and fake.calls[-1] == ("reset", None)

    engine = TorchEngine(tiny_model(seed=5), 0)
    sync_weights(model, engine)
    for (n, a), (_, b) in zip(model.state_dict().items(), engine.model.state_dict().items()):
        assert torch.equal(a, b), n
    with pytest.raises(KeyError, match="no tensor named"):
        engine.load_weights([("not.a.weight", torch.zeros(1))])


def test_bad_inputs():
    engine = TorchEngine(tiny_model(), 0)
    with pytest.raises(ValueError, match="one seed per prompt"):
        engine.generate(PROMPTS, n=2, seeds=[1], max_new_tokens=2, stop_token_ids=[STOP])
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[]], n=2, seeds=[1], max_new_tokens=2, stop_token_ids=[STOP])
    assert math.isfinite(sum(engine.generate([[3]], 1, [0], max_new_tokens=2,
                                             stop_token_ids=[STOP]).engine_logp[0]))


def test_shared_prompt_layout_gives_the_same_logprobs():
    """pack(share_prompts=True) computes each group's prompt once under a 4-D mask; the per-token
    log-probs must equal the one-row-per-sequence layout. Groups of unequal completion lengths, a
    group split over two runs of rows, and a different prompt in between."""
    model = tiny_model()
    prompts = [PROMPTS[0]] * 3 + [PROMPTS[1]] * 2 + [PROMPTS[0]] * 2
    completions = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [3, 3], [4], [14, 15], [2]]
    plain = pack(prompts, completions, 0)
    shared = pack(prompts, completions, 0, share_prompts=True)
    assert shared["input_ids"].shape[0] == 3                       # three runs of equal prompts
    with torch.no_grad():
        a = token_logp(completion_logits(model, plain), plain)
        b = token_logp(completion_logits(model, shared), shared)
    assert torch.equal(plain["completion_mask"], shared["completion_mask"])
    assert torch.allclose(a, b, atol=1e-5) and a.abs().sum() > 0


def test_kv_budget_splits_batches_without_changing_samples():
    """A KV budget that holds two prompts' worst case at a time: the engine runs several forward
    batches, never holds more KV than the budget (prompt KV, per-row caches grown past 64 slots, and
    the transient of a growth), and samples exactly the tokens an unlimited engine samples (their
    log-probs equal up to float rounding: the batches' padding differs)."""
    model = tiny_model()
    assert kv_bytes_per_token(model.config, torch.float32) == 2 * 2 * 2 * 8 * 4    # layers, KV heads, head_dim
    assert kv_bytes_per_token(model.config, torch.bfloat16) == 2 * 2 * 2 * 8 * 2
    prompts, seeds, kw = PROMPTS * 2, [1, 2, 3, 4, 5, 6], dict(max_new_tokens=70, stop_token_ids=[STOP])
    free = TorchEngine(model, 0)
    assert free.kv_cache_bytes == KV_CACHE_BYTES and free.dtype == torch.float32
    want = free.generate(prompts, 4, seeds, **kw)
    budget = free.kv_worst_case(2, max(map(len, PROMPTS)), 4, 70)
    tight = TorchEngine(model, 0, kv_cache_bytes=budget)
    assert len(tight.plan_chunks(prompts, 4, 70)) >= 3
    got = tight.generate(prompts, 4, seeds, **kw)
    assert got.token_ids == want.token_ids
    for a, b in zip(got.engine_logp, want.engine_logp):       # equal up to the batch shape's float rounding
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    assert got.prompt_index == want.prompt_index and got.finish_reason == want.finish_reason
    assert max(len(t) for t in got.token_ids) > 64                          # the caches grew twice
    assert 0.3 * budget < tight.peak_kv_bytes <= budget < free.peak_kv_bytes
    with pytest.raises(ValueError, match="kv_cache_bytes=.*needs"):
        TorchEngine(model, 0, kv_cache_bytes=free.kv_worst_case(1, 7, 4, 70) - 1).generate(prompts, 4, seeds, **kw)


def test_bf16_engine_scores_in_fp32():
    """A bf16 engine (attention scores q.k in float32, as the trainer's SDPA keeps them) reports
    log-probs close to a float64 forward of the same bf16 weights."""
    model = tiny_model()
    engine = TorchEngine(tiny_model().to(torch.bfloat16), 0)
    assert engine.dtype == torch.bfloat16
    r = engine.generate(PROMPTS, n=3, seeds=[1, 2, 3], max_new_tokens=10, stop_token_ids=[STOP])
    exact = model.double()
    with torch.no_grad():
        for p in exact.parameters():
            p.copy_(p.to(torch.bfloat16))
    want = completion_logp(exact, [PROMPTS[i] for i in r.prompt_index], r.token_ids, 0)
    gap = max((torch.tensor(g, dtype=torch.float64) - w).abs().max().item() for g, w in zip(r.engine_logp, want))
    assert gap < 0.1, gap


def test_sync_casts_to_the_engine_dtype():
    """fp32 trainer -> bf16 TorchEngine: the buckets carry bf16 tensors (cast before any gather: half
    the bytes), counted in bf16 bytes, and the engine ends up with the rounded trainer weights."""
    model = tiny_model()
    engine = TorchEngine(tiny_model(seed=5).to(torch.bfloat16), 0)
    buckets, load = [], engine.load_weights
    engine.load_weights = lambda bucket: buckets.append(bucket) or load(bucket)
    sync_weights(model, engine, bucket_bytes=4096)
    assert {t.dtype for b in buckets for _, t in b} == {torch.bfloat16}
    for b in buckets:
        assert sum(t.numel() * 2 for _, t in b) <= 4096 or len(b) == 1
    assert len(buckets) < len(list(make_buckets(model.state_dict().items(), 4096)))   # fp32 would need more
    for n, p in model.state_dict().items():
        assert torch.equal(engine.model.state_dict()[n], p.to(torch.bfloat16)), n


def test_vllm_wake_gives_pytorchs_free_blocks_back_first(monkeypatch):
    """vLLM maps its weights and KV cache through the driver, outside PyTorch's caching allocator: every wake
    must first return the blocks the update freed, or they stay reserved through the rollout. Provable without
    a GPU: the engine's wake calls torch.cuda.empty_cache before vLLM's wake_up, for each part that slept."""
    import rollout
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))

    class LLM:
        def wake_up(self, tags):
            calls.append(("wake_up", tuple(tags)))

        def sleep(self, level):
            calls.append(("sleep", level))
    engine = object.__new__(rollout.VLLMEngine)
    engine.llm, engine.on_cpu, engine.sleep_level, engine.asleep, engine.updating = LLM(), False, 2, set(), False
    engine.sleep()
    engine.wake_up()                     # before the weight sync: the weights only
    engine._ready()                      # before the rollout: the KV cache
    engine._ready()                      # awake: nothing to do
    assert calls == [("sleep", 2), "empty_cache", ("wake_up", ("weights",)), "empty_cache", ("wake_up", ("kv_cache",))]
