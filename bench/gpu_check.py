"""
GPU check in one command: what train.py's step costs at LLM scale and maze RL at the paper's scale, on
one GPU with nothing but PyTorch and transformers (no vLLM, no math-verify, no tokenizer, no data, no
internet). Prints the figures of each phase as it goes, then one summary table; --out also writes them
as JSON.

    python bench/gpu_check.py                                  # one H100 / H200: within --budget_s
    python bench/gpu_check.py --out runs/gpu_check.json        # the same, figures also as JSON
    python bench/gpu_check.py --tiny true --device cpu         # tiny shapes on the CPU, < 1 minute (CI)

(a) LLM: train.rl_step, the step train.py runs (TorchEngine rollouts, FSDP2 on one rank with bf16
    compute and fp32 master weights, AdamW, weight sync), on a Qwen2.5-1.5B-shaped model with random
    weights. Prompts are math-shaped: --prompt_len random token ids of the 151,936-token vocabulary,
    each answered N = 8 times; --prompts per step in 4 mini-batches, as Table 5's 256 / 64 (16 prompts
    is one GPU's share of 256 on the paper's 16 GPUs). The reward is the parity of a hash of the
    completion, so groups are mixed and the update does real work without math-verify. There is no
    stop token: every completion runs to --max_new_tokens, a fixed upper bound on the work.
    Figures: rollout tok/s (completion tokens / rollout time), update tok/s (prompt + completion tokens
    through forward and backward / update time), the step's time split, peak memory beside the memory
    plan's figure for the same flags (memory_plan.py: does the plan hold?), host-device syncs per decode
    step of TorchEngine (CUDA's sync debug mode counts them), and the update's
    MFU = 6 * params * update tokens / update time / the GPU's dense bf16 peak (--peak_tflops; 0 takes
    it from the GPU's name). Attention FLOPs are not counted, so MFU is a slight underestimate; the
    old-log-prob forward (4 mini-batches: off-policy) is timed apart and not in the update.
(b) maze at the paper's scale (Sec. 5.2, App. K): 17x17 mazes, the 3.9M policy (maze.build_model, random
    weights), 256 prompts x N = 8 in one mini-batch, as RESULTS.md's Table 4 command: seconds per step
    and its split. The stop token is taken away here too, so every completion runs to the maze's cap
    (203 tokens at 17x17), where a trained policy stops after its path: an upper bound again.

Budget: each part builds its model on the device, runs one warm-up step (kernel selection, allocator
growth; reported, not averaged) and up to --steps timed steps; the defaults cap the LLM part at 4 steps
of 128 completions x <= 512 new tokens and the maze at 4 steps of 2,048 x <= 203. A timed step after
the first is skipped when the last one says it would end past the part's deadline (the LLM's at 60% of
--budget_s, the maze's at 100%), so a slower GPU than planned still finishes in time, with fewer steps.
Not yet timed on a GPU: the default budget leaves 80 s of the 8 minutes for start-up and imports.
"""
import gc
import platform
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import maze  # noqa: E402
from fgrpo_utils import distributed, memory_plan  # noqa: E402
import train  # noqa: E402
from fgrpo_utils.cli import check, check_device, check_min, check_positive, parse_config  # noqa: E402
from fgrpo_utils.outputs import check_out_file, write_json_out  # noqa: E402
from fgrpo_utils.task import Task  # noqa: E402
from rollout import mix_seed, sync_weights  # noqa: E402


@dataclass
class Config:
    tiny: bool = False            # tiny shapes for a CPU smoke run (CI): a 2-layer LLM, 7x7 mazes, few prompts
    device: str = "auto"          # auto | cpu | cuda
    steps: int = 3                # timed steps per part, after one warm-up step
    prompts: int = 16             # LLM prompts per step, a multiple of 4 (4 mini-batches)
    group_size: int = 8           # N, both parts
    prompt_len: int = 256         # LLM prompt tokens (DeepScaleR's, chat template included, are ~100-400)
    max_new_tokens: int = 512     # LLM completion cap (a random model reaches it)
    micro_batch_size: int = 8     # sequences per forward in the update (train.py's default), both parts
    maze_size: int = 17           # Sec. 5.2, App. K
    maze_prompts: int = 256       # prompts per RL batch, Sec. 5.2 / App. K
    peak_tflops: float = 0.0      # dense bf16 peak for MFU; 0 = from the GPU's name (PEAK_TFLOPS)
    budget_s: int = 400           # seconds from start by which both parts end (see Budget above)
    threads: int = 0              # CPU threads, 0 = torch's default
    seed: int = 0                 # model init and sampling
    out: str = ""                 # also write the figures as JSON here

    def __post_init__(self):
        check(self.device in ("auto", "cpu", "cuda"), f"--device {self.device!r}: expected auto, cpu or cuda")
        check_device(self.device)
        check_min(self, 1, "steps", "prompts", "prompt_len", "max_new_tokens", "micro_batch_size", "maze_prompts",
                  "budget_s")
        check_min(self, 0, "threads", "seed", "peak_tflops")
        check(self.group_size >= 2, f"--group_size {self.group_size}: need >= 2 for a group baseline")
        check(self.prompts % 4 == 0, f"--prompts {self.prompts}: must be a multiple of 4 (4 mini-batches a step)")
        check(self.maze_size % 2 == 1 and maze.MIN_SIZE <= self.maze_size <= 17,
              f"--maze_size {self.maze_size}: expected an odd number in [{maze.MIN_SIZE}, 17]")
        if self.peak_tflops:
            check_positive(self, "peak_tflops")
        if self.out:
            check_out_file(self.out, "--out", SCRIPT)


# Shapes. Qwen2.5-1.5B's published config.json (the 1.5B model is what fits the 8-minute budget and
# one GPU's memory with room to spare; the 7B differs in width and depth, not in kind).
QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY_LLM = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)
# --tiny true replaces these flags (CPU, under a minute on 2 busy cores).
TINY = dict(prompts=4, group_size=4, prompt_len=16, max_new_tokens=8, maze_size=7, maze_prompts=8)
# Dense bf16 tensor-core peaks, TFLOP/s, by a substring of torch.cuda.get_device_name (first match).
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))


SCRIPT = "bench/gpu_check.py"       # the mark in its --out report (outputs.is_ours)


def random_loader(shape, device):
    """A loader for train.build_models: the model of `shape` with random weights, built on the device (a 1.5B
    init on the CPU takes minutes), the same on every call (seeded)."""
    def load(cfg, tokenizer, dtype, meta=False):
        torch.manual_seed(cfg.seed)
        with torch.device("meta" if meta else device):
            return shape().to(dtype)
    return load


def math_shaped_task(vocab, prompt_len, max_new_tokens, seed):
    """A Task (fgrpo_utils.task) of random prompts: prompt i is prompt_len token ids keyed by (seed, i); the reward
    of a completion is the parity of its crc32 (random, mixed groups, no math-verify); no stop token."""
    def prompt(i):
        g = torch.Generator().manual_seed(mix_seed(seed, i))
        return torch.randint(0, vocab - 1, (prompt_len,), generator=g).tolist(), None

    def score(answers, completions):
        return [float(zlib.crc32(str(c).encode()) % 2) for c in completions], {}

    return Task(prompt, score, stop_token_ids=[], max_new_tokens=max_new_tokens,
                show=lambda ids: f"{len(ids)} tokens")


def run_part(name, cfg, train_cfg, load, task, pad, device, clock, deadline, config=None):
    """Build with train.build_models, then one warm-up and up to cfg.steps timed train.rl_step calls, none
    started when the last step's time says it would end past `deadline` (perf_counter) -> figures.
    With `config` (the model's transformers config) the peak memory is set beside memory_plan.plan's figure
    for the same flags: its peak phase less the CUDA runtime estimate, which the allocator's
    max_memory_allocated does not see."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model, ref_model, engine, opt = train.build_models(train_cfg, None, pad, device, load=load)
    sync_weights(model, engine)
    params = sum(p.numel() for p in model.parameters())        # global count, tied embeddings once
    clock(f"{name}: built {params / 1e6:,.1f}M parameters in {time.perf_counter() - t:.1f} s")
    prompt_tokens = len(task.prompt(0)[0])                      # every prompt of a part has this length
    steps = []
    for step in range(1 + cfg.steps):
        if step >= 2 and time.perf_counter() + steps[-1]["step"] > deadline:
            clock(f"{name}: stopping after {step - 1} timed step(s): another would pass the budget")
            break
        r = train.rl_step(train_cfg, step, task, model, ref_model, engine, opt, pad=pad, device=device,
                          rank=0, world=1)
        lens = [len(c) for c in r.rollouts.token_ids]
        steps.append({**r.seconds, "completion_tokens": sum(lens), "update_tokens": sum(lens) + prompt_tokens * len(lens),
                      "mixed_groups": int((r.R.std(1) > 0).sum()), "grad_norm": max(r.grad_norms)})
        clock(f"{name}: {'warm-up' if step == 0 else 'step'} {step}: {r.seconds['step']:.2f} s (rollout "
              f"{r.seconds['rollout']:.2f}, old_logp {r.seconds['old_logp']:.2f}, update {r.seconds['train']:.2f}, "
              f"sync {r.seconds['weight_sync']:.2f}), {sum(lens)} completion tokens")
    syncs = syncs_per_decode_step(engine, task, train_cfg.group_size, device)
    timed = steps[1:]
    total = {k: sum(s[k] for s in timed) for k in timed[0]}
    fig = {"params": params, "prompts": train_cfg.prompts_per_step, "group_size": train_cfg.group_size,
           "mini_batches": train_cfg.prompts_per_step // train_cfg.mini_batch_prompts, "prompt_tokens": prompt_tokens,
           "max_new_tokens": task.max_new_tokens, "timed_steps": len(timed), "warmup_step_s": steps[0]["step"],
           **{f"{k}_s": total[k] / len(timed) for k in ("step", "rollout", "reward", "balance", "old_logp", "train", "weight_sync")},
           "completion_tokens_per_step": total["completion_tokens"] / len(timed),
           "update_tokens_per_step": total["update_tokens"] / len(timed),
           "rollout_tok_s": total["completion_tokens"] / total["rollout"],
           "update_tok_s": total["update_tokens"] / total["train"],
           "mixed_groups_per_step": total["mixed_groups"] / len(timed),
           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
           "syncs_per_decode_step": syncs}
    fig["plan_gib"] = fig["plan_phase"] = None
    if config is not None:
        device_gib = (torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda"
                      else 80.0)
        p = memory_plan.plan(train_cfg, 1, device_gib, config=config)
        runtime = sum(r.rollout for r in p.rows if r.name == "CUDA runtime")
        fig["plan_gib"], fig["plan_phase"] = p.peak - runtime, p.peak_phase
        clock(f"{name}: plan {fig['plan_gib']:.1f} GiB ({p.peak_phase} phase, less {runtime} GiB of CUDA runtime)"
              + (f", measured peak {fig['peak_mem_gib']:.1f} GiB" if fig["peak_mem_gib"] is not None else ""))
    # The update's FLOPs: forward + backward, 6 per parameter per token (Kaplan et al.'s 6ND).
    fig["update_tflop_s"] = 6 * params * total["update_tokens"] / total["train"] / 1e12
    del model, ref_model, engine, opt
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return fig


def syncs_per_decode_step(engine, task, n, device):
    """Host-device synchronisations per decode step of one engine.generate call (2 prompts x n, the
    part's length cap), counted by CUDA's sync debug mode, which warns at every synchronising call. Each
    one stalls the CPU until the GPU drains its queue, so a decode loop wants as few as possible.
    None on the CPU."""
    if device.type != "cuda":
        return None
    prompts = [task.prompt(i)[0] for i in range(2)]
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            r = engine.generate(prompts, n, seeds=[0, 1], max_new_tokens=task.max_new_tokens,
                                stop_token_ids=task.stop_token_ids)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    steps = max(len(c) for c in r.token_ids)
    return sum("synchroniz" in str(w.message) for w in caught) / steps


def peak_tflops(cfg, device):
    """(dense bf16 peak in TFLOP/s or None, where the number comes from)."""
    if cfg.peak_tflops:
        return cfg.peak_tflops, "--peak_tflops"
    if device.type != "cuda":
        return None, "no GPU"
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS:
        if key in name:
            return tflops, f"assumed for {key} (dense bf16)"
    return None, f"unknown for {name!r}: pass --peak_tflops"


def summary(report):
    """The figures as one markdown table."""
    rows = []
    for part, f in report["parts"].items():
        label = {"llm": f"LLM ({report['llm_shape']})", "maze": f"maze ({report['maze_shape']})"}[part]
        rows += [(label, "batch", f"{f['prompts']} prompts x {f['group_size']}, {f['mini_batches']} mini-batch(es), "
                                  f"prompt {f['prompt_tokens']} + <= {f['max_new_tokens']} new tokens"),
                 (label, "step time (mean of timed)", f"{f['step_s']:.2f} s: rollout {f['rollout_s']:.2f}, reward "
                  f"{f['reward_s']:.3f}, old_logp {f['old_logp_s']:.2f}, update {f['train_s']:.2f}, weight sync "
                  f"{f['weight_sync_s']:.2f} (warm-up step {f['warmup_step_s']:.1f} s)"),
                 (label, "rollout tok/s", f"{f['rollout_tok_s']:,.0f} ({f['completion_tokens_per_step']:,.0f} tokens a step)"),
                 (label, "update tok/s", f"{f['update_tok_s']:,.0f} ({f['update_tokens_per_step']:,.0f} tokens a step)"),
                 (label, "update TFLOP/s, MFU", f"{f['update_tflop_s']:.1f}, " + (f"{100 * f['mfu']:.1f}%" if f["mfu"]
                                                 is not None else "n/a") + f" (6 x {f['params'] / 1e6:,.1f}M params x tokens)"),
                 (label, "peak memory", "n/a (CPU)" if f["peak_mem_gib"] is None else f"{f['peak_mem_gib']:.1f} GiB"
                  + ("" if f["plan_gib"] is None else f" (memory plan: {f['plan_gib']:.1f} GiB, {f['plan_phase']} phase)")),
                 (label, "host-device syncs per decode step", "n/a (CPU)" if f["syncs_per_decode_step"] is None
                  else f"{f['syncs_per_decode_step']:.1f}")]
    lines = ["| part | figure | value |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def main(cfg):
    t_start = time.perf_counter()
    clock = lambda msg: print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)
    if cfg.tiny:
        cfg = replace(cfg, **TINY)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    transformers.utils.logging.disable_progress_bar()
    _, _, device = distributed.init_dist(cfg.device)                 # a process group of one, as plain train.py
    peak, peak_source = peak_tflops(cfg, device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    clock(f"device {device} ({gpu}), torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peak {peak or 'n/a'} TFLOP/s ({peak_source})")
    shape = TINY_LLM if cfg.tiny else QWEN25_15B
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as unused:      # train.Config checks an out_dir
        # TorchEngine: the GPU image has no vLLM (train.py's default engine on CUDA)
        common = dict(device=cfg.device, engine="torch", group_size=cfg.group_size,
                      micro_batch_size=cfg.micro_batch_size, seed=cfg.seed, out_dir=unused, sample_every=0)
        # (a) the LLM: train.py's defaults but the batch; --model names the shape only, nothing loads it
        llm_cfg = train.Config(task="math", model="Qwen/Qwen2.5-1.5B", prompts_per_step=cfg.prompts,
                               max_prompt_len=cfg.prompt_len,
                               mini_batch_prompts=cfg.prompts // 4, max_response_len=cfg.max_new_tokens, **common)
        llm = run_part("LLM", cfg, llm_cfg, random_loader(lambda: Qwen2ForCausalLM(Qwen2Config(**shape)), device),
                       math_shaped_task(shape["vocab_size"], cfg.prompt_len, cfg.max_new_tokens, cfg.seed),
                       shape["vocab_size"] - 1, device, clock, t_start + 0.6 * cfg.budget_s,   # pad: in no prompt
                       config=Qwen2Config(**shape))
        # (b) the maze: RESULTS.md's Table 4 command (lr 1e-4, 256 prompts in one mini-batch, no warm-up)
        maze_cfg = train.Config(task="maze", model="tiny", maze_size=cfg.maze_size, lr=1e-4,
                                prompts_per_step=cfg.maze_prompts, mini_batch_prompts=cfg.maze_prompts,
                                warmup_steps=0, eval_mazes=0, **common)
        task = maze.maze_task(maze.build_tokenizer(), cfg.maze_size, cfg.seed, eval_mazes=0)
        mz = run_part("maze", cfg, maze_cfg, random_loader(maze.build_model, device),
                      replace(task, stop_token_ids=[]), maze.PAD, device, clock, t_start + cfg.budget_s)
    for f in (llm, mz):
        f["mfu"] = f["update_tflop_s"] / peak if peak else None
    report = {"config": asdict(cfg), "device": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
              "peak_tflops": peak, "peak_source": peak_source, "total_s": time.perf_counter() - t_start,
              "llm_shape": ("tiny 2-layer Qwen2" if cfg.tiny else "Qwen2.5-1.5B shape") + ", random init, "
                           + ("bf16 compute, fp32 master" if device.type == "cuda" else "fp32"),
              "maze_shape": f"{cfg.maze_size}x{cfg.maze_size}, 3.9M policy, random init",
              "parts": {"llm": llm, "maze": mz}}
    print(f"\nGPU check on {gpu}: {report['total_s']:.0f} s in all; MFU against {peak or 'n/a'} TFLOP/s ({peak_source})")
    print(summary(report))
    if cfg.out:
        write_json_out(cfg.out, report, SCRIPT)
        print(f"wrote {cfg.out}")
    dist.destroy_process_group()
    return report


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
