"""memory_plan.plan against one REAL train.rl_step on the CPU, in a child process.

Qwen2.5-1.5B's config.json at full width (hidden 1536, intermediate 8960, its full 151,936-token tied
vocabulary) with 2 decoder layers, random init, fp32: distributed.init_dist("cpu") (a process group of one),
train.build_models (FSDP2 on one rank, TorchEngine's unsharded copy, AdamW) and one train.rl_step (rollouts
to the length cap, on-policy update, weight sync), with a math-shaped task as bench/gpu_check.py's.
The child's peak RSS above its RSS after the imports, read after each phase in the step's order
(ru_maxrss is monotone), is set beside the plan's phases for the same train.Config:

    rollout   the peak through engine.generate              plan's rollout phase
    update    the peak through forward/backward (read in an optimizer pre-step hook)  update phase
    step      ... through AdamW's step                      plan's step phase
    sync      ... through the weight sync (end of rl_step)  sync phase

AdamW's moments are created before the step (zeros, exactly what its lazy init makes), so that step 0
holds what every later step holds: the plan's steady state. The KV budget is 1.5x one prompt's worst
case, so TorchEngine must sample the 2 prompts in 2 batches; its peak KV must stay within budget.

    OMP_NUM_THREADS=1 python -m pytest -q -s tests/test_plan_vs_measured.py    # ~57 s, ~8.7 GiB peak RSS
"""
import json
import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig

from fgrpo_utils import memory_plan
import rollout
from conftest import ROOT

# The run's shape: 2 prompts x N = 4 on-policy in one mini-batch; every row is Lp + Lr = 128 tokens,
# so the one update micro-batch is 8 rows x 128 = 1024 tokens (256 completion tokens).
LAYERS, LP, LR, N, PROMPTS = 2, 96, 32, 4, 2

CHILD = textwrap.dedent("""
    import json, resource, sys, tempfile, time, zlib
    args = json.loads(sys.argv[1])
    sys.path.insert(0, args["root"])
    import torch
    torch.set_num_threads(1)
    import train
    from fgrpo_utils import distributed
    from fgrpo_utils.task import Task
    from rollout import mix_seed
    from transformers import AutoConfig, AutoModelForCausalLM

    def rss():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024      # KiB on Linux

    _, _, device = distributed.init_dist("cpu")
    config = AutoConfig.from_pretrained(args["model"])
    V, Lp, Lr, N = config.vocab_size, args["Lp"], args["Lr"], args["N"]
    pad = V - 1                                                  # in no prompt

    def load(cfg, tokenizer, dtype, meta=False):                 # gpu_check.random_loader
        torch.manual_seed(cfg.seed)
        with torch.device("meta" if meta else "cpu"):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)

    def prompt(i):                                               # gpu_check.math_shaped_task
        g = torch.Generator().manual_seed(mix_seed(0, i))
        return torch.randint(0, V - 1, (Lp,), generator=g).tolist(), None

    def score(answers, completions):
        return [float(zlib.crc32(str(c).encode()) % 2) for c in completions], {}

    task = Task(prompt, score, stop_token_ids=[], max_new_tokens=Lr, show=lambda ids: f"{len(ids)} tokens")
    out = tempfile.mkdtemp(prefix="plan_vs_measured.")
    cfg = train.Config(task="math", model=args["model"], tokenizer=args["tokenizer"], engine="torch",
                       device="cpu", threads=1, grad_checkpointing=args["ckpt"], kv_cache_gb=args["kv_cache_gb"],
                       prompts_per_step=args["prompts"], mini_batch_prompts=args["prompts"], group_size=N,
                       max_prompt_len=Lp, max_response_len=Lr, micro_batch_size=args["prompts"] * N,
                       micro_batch_tokens=0, warmup_steps=0, sample_every=0, out_dir=out)
    base = rss()
    t0 = time.perf_counter()
    model, ref_model, engine, opt = train.build_models(cfg, None, pad, device, load=load)
    for group in opt.param_groups:                               # AdamW's lazy init, done up front
        for p in group["params"]:
            opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                            "exp_avg_sq": torch.zeros_like(p)}
    fig = {"base": base, "built": peak() - base, "build_s": time.perf_counter() - t0}
    prompts = [task.prompt(i)[0] for i in range(cfg.prompts_per_step)]
    fig["chunks"] = engine.plan_chunks(prompts, N, Lr)
    fig["kv_one_prompt"] = engine.kv_worst_case(1, Lp, N, Lr)
    fig["kv_budget"] = engine.kv_cache_bytes

    generate = engine.generate
    def timed_generate(*a, **kw):
        fig["before_rollout"] = peak() - base
        r = generate(*a, **kw)
        fig["rollout"] = peak() - base
        return r
    engine.generate = timed_generate
    opt.register_step_pre_hook(lambda *a: fig.__setitem__("update", peak() - base))
    opt.register_step_post_hook(lambda *a: fig.__setitem__("step", peak() - base))
    t0 = time.perf_counter()
    r = train.rl_step(cfg, 0, task, model, ref_model, engine, opt, pad=pad, device=device, rank=0, world=1)
    fig["sync"] = peak() - base
    fig["step_s"] = time.perf_counter() - t0
    fig["seconds"] = r.seconds
    fig["lengths"] = sorted({len(c) for c in r.rollouts.token_ids})
    fig["rows"] = len(r.rollouts.token_ids)
    fig["peak_kv_bytes"] = engine.peak_kv_bytes
    fig["grad_norm"] = r.grad_norms[0]
    fig["micro_batches"] = [len(mb) for mb in train.micro_batches(cfg, [prompts[i] for i in r.rollouts.prompt_index],
                                                                  r.rollouts.token_ids)]
    print("FIGURES " + json.dumps(fig))
""")


def run_child(folder, tokenizer, ckpt, kv_cache_gb):
    args = dict(root=str(ROOT), model=str(folder), tokenizer=str(tokenizer), ckpt=ckpt, kv_cache_gb=kv_cache_gb,
                Lp=LP, Lr=LR, N=N, prompts=PROMPTS)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    env.pop("RANK", None)                     # distributed.init_dist: a process group of one
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("FIGURES "))
    return json.loads(line[len("FIGURES "):])


def plan_for(folder, tokenizer, ckpt, kv_cache_gb, config):
    """memory_plan.plan of the child's train.Config (the fields plan reads, as the child sets them)."""
    cfg = SimpleNamespace(model=str(folder), device="cpu", engine="torch", group_size=N, prompts_per_step=PROMPTS,
                          mini_batch_prompts=PROMPTS, micro_batch_size=PROMPTS * N, micro_batch_tokens=0,
                          max_prompt_len=LP, max_response_len=LR, share_prompts=False, grad_checkpointing=ckpt,
                          kv_cache_gb=kv_cache_gb, gpu_memory_utilization=0.5, kl_coef=0.0, keep_checkpoints=2,
                          steps=1, task="math", export_every=0)
    return memory_plan.plan(cfg, 1, 24.0, config=config)


@pytest.fixture(scope="module")
def model_folder(data, tmp_path_factory):
    """Qwen2.5-1.5B's config.json with num_hidden_layers = 2, alone in a folder (train.Config checks it)."""
    c = json.loads((data / "models" / "qwen2.5-1.5b" / "config.json").read_text())
    c["num_hidden_layers"] = LAYERS
    folder = tmp_path_factory.mktemp("qwen2.5-1.5b-2l")
    (folder / "config.json").write_text(json.dumps(c))
    return folder


def kv_budget_gb(config):
    """1.5x the worst-case KV of one prompt's N rows: TorchEngine must take the prompts one at a time."""
    one = rollout.TorchEngine.kv_worst_case(SimpleNamespace(model=SimpleNamespace(config=config),
                                                            dtype=torch.float32), 1, LP, N, LR)
    return 1.5 * one / 2**30


@pytest.fixture(scope="module")
def step(data, model_folder):
    """(plan, measured figures, KV budget in GiB) of one real rl_step, checkpointing off (the CPU's
    default; with 2 layers checkpointing would move ~0.3 GiB, and a second child would pass 90 s).
    Prints the plan, the measured phases and the step's timings (pytest -s)."""
    t0 = time.perf_counter()
    config = AutoConfig.from_pretrained(model_folder)
    kv_gb = kv_budget_gb(config)
    tokenizer = data / "tokenizers" / "qwen2.5"
    p = plan_for(model_folder, tokenizer, "false", kv_gb, config)
    fig = run_child(model_folder, tokenizer, "false", kv_gb)
    print(f"\n{memory_plan.format_plan(p)}")
    print(f"measured (peak RSS above {fig['base'] / G:.2f} GiB after the imports), GiB: built "
          f"{fig['built'] / G:.2f} | rollout {fig['rollout'] / G:.2f} | update (fwd/bwd) {fig['update'] / G:.2f} | "
          f"AdamW step {fig['step'] / G:.2f} | sync {fig['sync'] / G:.2f} (monotone: a phase below an earlier "
          f"one's peak does not show)")
    print("planned, GiB: " + " | ".join(f"{k} {v:.2f}" for k, v in p.phases.items())
          + f" | peak {p.peak:.2f} ({p.peak_phase})")
    print(f"KV: peak {fig['peak_kv_bytes']:,} B of a {fig['kv_budget']:,} B budget, chunks {fig['chunks']}; "
          f"micro-batches {fig['micro_batches']}; build {fig['build_s']:.1f} s, step {fig['step_s']:.1f} s "
          f"{ {k: round(v, 1) for k, v in fig['seconds'].items()} }; child + plan {time.perf_counter() - t0:.1f} s")
    return p, fig, kv_gb


G = 2**30


@pytest.mark.slow
def test_step_has_the_planned_shapes_and_kv_stays_in_budget(step):
    """Every completion runs to its cap, the update is one micro-batch of all 8 rows (the plan's
    largest), and TorchEngine, whose budget holds one prompt's rows but not two, samples the prompts
    in 2 batches and never holds more KV than its budget."""
    p, fig, kv_gb = step
    assert fig["lengths"] == [LR] and fig["rows"] == PROMPTS * N
    assert fig["micro_batches"] == [PROMPTS * N]
    assert p.micro_batch["tokens"] == PROMPTS * N * (LP + LR) and p.micro_batch["rows"] == PROMPTS * N
    assert fig["kv_one_prompt"] <= fig["kv_budget"] < 2 * fig["kv_one_prompt"]
    assert fig["chunks"] == [[i, i + 1] for i in range(PROMPTS)]
    assert 0 < fig["peak_kv_bytes"] <= fig["kv_budget"] == int(kv_gb * G)


@pytest.mark.slow
def test_plan_rollout_phase_matches_measured(step):
    """The rollout phase: fp32 weights + AdamW moments + the engine's fp32 copy (+ its KV and sampling
    buffers, tiny here) against the peak RSS through engine.generate."""
    p, fig, _ = step
    assert p.device == "cpu" and not any(r.name == "CUDA runtime" for r in p.rows)
    assert p.phases["rollout"] == pytest.approx(fig["rollout"] / G, rel=0.25), (p.phases["rollout"], fig["rollout"] / G)


@pytest.mark.slow
def test_plan_peak_matches_measured_peak(step):
    """The plan's peak (CPU: no CUDA runtime row) within 25% of the measured peak of the whole step
    (rollout, forward/backward, AdamW's step and the weight sync): 7.8 planned vs 8.3-9.1 GiB of peak RSS
    measured (2026-12-04 and -05). The plan counts live tensors at the update's peak moment, as
    bench/dry_run.py measures them; RSS also keeps what the allocator does not give back to the system
    (rank 0's loaded copy after the broadcast: already 0.9 GiB above the plan once the step is built)."""
    p, fig, _ = step
    measured = max(fig["rollout"], fig["update"], fig["step"], fig["sync"]) / G
    assert p.peak == pytest.approx(measured, rel=0.25), (p.peak, measured)
