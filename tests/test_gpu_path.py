"""The work of the CUDA path, checked on the CPU: the padding-free row gives the padded layout's log-probs,
entropies and gradients; padded rows never leave a query with nothing to attend to, whatever attention
kernel runs; an idle pass is two tokens; mini-batch 0's pi_old is its own first forward; a hub id's weights
are fetched before the process group starts.    python -m pytest -q tests/test_gpu_path.py
"""
import contextlib
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import train
from test_train_scale import FakeEngine      # fixed completions: rl_step without sampling
from fgrpo_utils import policy
from fgrpo_utils.logprob import completion_logits, pack, policy_logp, token_logp

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15], [16, 17, 18, 19, 20]]   # left padding up to 6 columns
COMPLETIONS = [[21, 22], [23, 24, 25, 26, 27, 28], [29], [30, 31, 32, 33]]


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def tiny(family, seed=0):
    """A 2-layer model with grouped-query attention: Qwen2 (a decoder that takes a mapping of masks) or
    Llama (one that builds its mask from the restarting positions)."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)
    model = Qwen2ForCausalLM(Qwen2Config(**kw)) if family == "qwen2" else LlamaForCausalLM(LlamaConfig(**kw))
    return policy.use_attention(model.to(F64))


def logp_H_grads(model, batch, T=0.7):
    model.zero_grad(set_to_none=True)
    logp, H = policy_logp(model, batch, T, entropy=True)
    g = torch.Generator().manual_seed(3)
    ((torch.randn(logp.shape, generator=g, dtype=F64) * logp).sum() + 0.3 * H.sum()).backward()
    return logp.detach(), H.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family,impl", [("qwen2", "ours"), ("llama", "ours"), ("qwen2", "sdpa"), ("llama", "eager")])
def test_padding_free_row_gives_the_padded_values_and_gradients(family, impl):
    """One row, each sequence attending to itself alone, is the padded batch to float64's precision: the
    log-probs, the entropies, every parameter's gradient, and the direct (S, Tc, V) reference; with
    policy.attention or, for a model left on transformers' own, through the mask transformers builds.
    transformers' eager attention takes its softmax in float32, whose sums over a longer row round otherwise
    (1e-8 seen): float32's tolerance there; a sequence that saw its neighbours moves log-probs by 1e-1."""
    atol = 1e-5 if impl == "eager" else 1e-12
    model = tiny(family)
    if impl != "ours":
        model.set_attn_implementation(impl)
    padded, flat = pack(PROMPTS, COMPLETIONS, 0), pack(PROMPTS, COMPLETIONS, 0, padding_free=True)
    assert flat["input_ids"].shape == (1, sum(map(len, PROMPTS)) + sum(map(len, COMPLETIONS)))   # no padding
    assert padded["input_ids"].numel() > flat["input_ids"].numel()
    want, got = logp_H_grads(model, padded), logp_H_grads(model, flat)
    assert (want[0] != 0).sum() == sum(map(len, COMPLETIONS))
    for a, b in zip(want[:2], got[:2]):
        assert torch.allclose(a, b, atol=atol, rtol=0)
    assert max(g.abs().max() for g in want[2].values()) > 1e-3
    for n, g in want[2].items():
        assert torch.allclose(g, got[2][n], atol=atol, rtol=1e-9), n
    direct = token_logp(completion_logits(model, flat, 0.7), flat)
    assert torch.allclose(direct, want[0], atol=atol, rtol=0)


def test_a_sequence_in_the_row_sees_nothing_of_its_neighbours():
    """Changing one sequence's tokens leaves every other sequence's log-probs as they were."""
    model = tiny("qwen2")
    other = [list(PROMPTS[0]), [39] * 5, *PROMPTS[2:]]                 # sequence 1's prompt replaced
    a, _ = policy_logp(model, pack(PROMPTS, COMPLETIONS, 0, padding_free=True))
    b, _ = policy_logp(model, pack(other, COMPLETIONS, 0, padding_free=True))
    assert not torch.equal(a[1], b[1])
    for i in (0, 2, 3):
        assert torch.allclose(a[i], b[i], atol=1e-13, rtol=0), i


def attention_paths():
    """Every attention the trainer can run: ours on the CPU (SDPA, each CPU backend forced) and transformers'
    SDPA, which ours calls on CUDA; and eager, the tests' independent reference."""
    for backend in (None, SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        yield f"fgrpo_sdpa/{backend.name if backend else 'any'}", policy.ATTENTION, backend
    for backend in (None, SDPBackend.MATH):
        yield f"transformers sdpa/{backend.name if backend else 'any'}", "sdpa", backend
    yield "eager", "eager", None


@pytest.mark.parametrize("name,impl,backend", list(attention_paths()), ids=lambda x: str(x))
def test_left_padding_never_gives_a_nan(name, impl, backend):
    """A left-padded query with no key would be a row of -inf scores: NaN in some kernels, and through
    backward in every weight's gradient. pack pads on the right only, so every query has its row's first
    token to attend to, and log-probs and gradients are finite whatever runs."""
    batch = pack(PROMPTS, COMPLETIONS, 0)
    attn = batch["attention_mask"]                                   # (S, L): right padding only
    assert attn[:, 0].all() and (attn == 0).any()                    # causal: every query sees column 0
    model = tiny("qwen2").float()
    if impl != policy.ATTENTION:
        model.set_attn_implementation(impl)
    with sdpa_kernel([backend]) if backend else contextlib.nullcontext():
        model.zero_grad(set_to_none=True)
        logp, H = policy_logp(model, batch, 1.0, entropy=True)
        (logp.sum() + H.sum()).backward()
    assert torch.isfinite(logp).all() and torch.isfinite(H).all(), name
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), name


def small_cfg(**kw):
    base = {f.name: f.default for f in dataclasses.fields(train.Config)}
    base.update(group_size=4, micro_batch_size=4, micro_batch_tokens=0, kl_coef=0.0, entropy_coef=0.0, seed=0,
                max_response_len=16, loss="dapo", prompts_per_step=2, mini_batch_prompts=1, warmup_steps=0,
                lr=1e-3, weight_decay=0.0, engine="torch", model="tiny", grad_checkpointing="false")
    return SimpleNamespace(**{**base, **kw})


def mixed_lengths(n=16, group=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for i in range(n):
        if i % group == 0:
            prompt = torch.randint(1, 40, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
        prompts.append(prompt)
        completions.append(torch.randint(1, 40, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist())
    return prompts, completions


@pytest.mark.parametrize("extra", [{}, {"entropy_coef": 0.05}, {"kl_coef": 0.1, "loss": "grpo", "temperature": 0.7}])
def test_update_gradient_is_the_same_without_padding(group, extra):
    """update_minibatch off-policy: --padding_free true gives --padding_free false's metrics and gradient
    within 1e-9 (float64), and its micro-batches count real tokens only."""
    model = policy.shard(tiny("qwen2"), torch.device("cpu"))
    ref = tiny("qwen2", seed=1) if extra.get("kl_coef") else None
    prompts, completions = mixed_lengths()
    A = torch.linspace(-1, 1, 16, dtype=F64)
    A[4:8] = 0.0
    g = torch.Generator().manual_seed(2)
    old = [-torch.rand(len(c), generator=g, dtype=F64) for c in completions]
    out = {}
    for pf in (False, True):
        cfg = small_cfg(padding_free=pf, **extra)
        model.zero_grad(set_to_none=True)
        stats, _ = train.update_minibatch(model, ref, prompts, completions, A, old, cfg=cfg,
                                          pad_id=0, device=torch.device("cpu"), world=1)
        out[pf] = stats, {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
    for k, v in out[False][0].items():
        assert v == pytest.approx(out[True][0][k], rel=1e-9, abs=1e-12), k
    for n, gr in out[False][1].items():
        assert torch.allclose(gr, out[True][1][n], atol=1e-9, rtol=1e-9), n
    cap = dict(micro_batch_size=16, micro_batch_tokens=60)
    tokens = lambda mb: sum(len(prompts[i]) + len(completions[i]) for i in mb)     # noqa: E731
    flat = train.micro_batches(small_cfg(padding_free=True, **cap), prompts, completions)
    rows = train.micro_batches(small_cfg(padding_free=False, **cap), prompts, completions)
    assert all(tokens(mb) <= 60 or len(mb) == 1 for mb in flat) and len(flat) < len(rows)


def test_an_idle_pass_is_two_tokens(group):
    """A rank with fewer micro-batches fills the gap with passes of weight 0 that only join FSDP's
    collectives: a two-token row each, never a real one; the gradient is unchanged."""
    model = policy.shard(tiny("qwen2"), torch.device("cpu"))
    prompts, completions = mixed_lengths()
    A = torch.linspace(-1, 1, 16, dtype=F64)
    seen = []
    model.get_decoder().embed_tokens.register_forward_hook(lambda m, args, out: seen.append(args[0].numel()))
    real = train.micro_batches

    def grads(extra, pf):
        seen.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(train, "micro_batches", lambda *a: real(*a) + [[]] * extra)
            model.zero_grad(set_to_none=True)
            train.update_minibatch(model, None, prompts, completions, A, None, cfg=small_cfg(padding_free=pf),
                                   pad_id=0, device=torch.device("cpu"), world=1)
        return list(seen), {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}

    for pf in (False, True):
        base, g0 = grads(0, pf)
        more, g2 = grads(2, pf)
        assert more == base + [2, 2]
        for n in g0:
            assert torch.equal(g0[n], g2[n]), n


def test_mini_batch_0_reuses_its_first_forward_as_pi_old(group, monkeypatch):
    """Off-policy with two mini-batches: old_log_probs forwards mini-batch 1's sequences only (mini-batch 0's
    pi_old is its update's first forward, before any optimizer step), and the pi_old log-probs the step
    returns are those of the weights before it, for every sequence."""
    cfg = small_cfg(loss="grpo", micro_batch_size=8)

    def load(cfg, tokenizer, dtype, meta=False):
        with torch.device("meta" if meta else "cpu"):
            torch.manual_seed(0)
            return Qwen2ForCausalLM(Qwen2Config(vocab_size=12, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                max_position_embeddings=128)).to(dtype)
    model, _, _, opt = train.build_models(cfg, None, 0, torch.device("cpu"), load=load)
    task = SimpleNamespace(prompt=lambda i: ([4, 5, 6, 4 + i % 3][: 2 + i % 3], None), max_new_tokens=8,
                           stop_token_ids=[1], score=lambda answers, comps: ([float(len(c) % 2) for c in comps], {}))
    rollouts = FakeEngine().generate([None, None], 4, None)
    prompts = [task.prompt(i // 4)[0] for i in range(8)]
    before = train.old_log_probs(model.eval(), prompts, rollouts.token_ids, cfg, 0, torch.device("cpu"))
    calls = []
    real = train.old_log_probs
    monkeypatch.setattr(train, "old_log_probs", lambda m, P, C, *a, **k: (calls.append(len(C)), real(m, P, C, *a, **k))[1])
    result = train.rl_step(cfg, 0, task, model, None, FakeEngine(), opt, pad=0, device=torch.device("cpu"),
                           rank=0, world=1)
    assert calls == [4]                                            # mini-batch 1's four sequences, not eight
    for a, b in zip(before, result.old_logp):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_hub_weights_are_fetched_before_the_process_group(monkeypatch, capsys):
    """main fetches a hub id's files before init_dist (so no rank waits in a collective while one downloads),
    skips local folders and "tiny", and a failed fetch is one line naming the flag, exit 2."""
    import huggingface_hub
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda name, **kw: calls.append(("fetch", name)))
    monkeypatch.setattr(train, "init_dist", lambda device: (calls.append(("init_dist",)), 1 / 0))
    monkeypatch.setattr(train.preflight, "check_environment", lambda cfg, entry: None)
    cfg = SimpleNamespace(**{**vars(small_cfg()), "model": "Qwen/Qwen2.5-7B", "tokenizer": "", "plan": False,
                             "task": "math", "threads": 0})
    with pytest.raises(ZeroDivisionError):
        train.main(cfg)
    assert calls == [("fetch", "Qwen/Qwen2.5-7B"), ("init_dist",)]
    assert "fetching Qwen/Qwen2.5-7B" in capsys.readouterr().out
    calls.clear()
    policy.fetch_weights({"--model": "tiny", "--tokenizer": str(ROOT)})
    assert calls == []

    def offline(name, **kw):
        raise OSError("We couldn't connect to 'https://huggingface.co'.\nmore")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(SystemExit) as e:
        policy.fetch_weights({"--model": "Org/Missing"})
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: --model Org/Missing:")
