"""
F-GRPO training: GRPO / DAPO / CISPO with the focal advantage weight (arXiv 2602.06717), FSDP2.

    torchrun --nproc_per_node 8 train.py --gamma 0.5                     # Table 1, F-GRPO, Qwen2.5-7B
    python train.py --task maze --model out/maze_sft --device cpu --lr 1e-4 --prompts_per_step 32 \\
        --mini_batch_prompts 32 --warmup_steps 0 --steps 100 --gamma 0.5   # maze RL on a laptop
    python train.py --task math --model tiny --tokenizer ../shared/data/tokenizers/qwen2.5 \\
        --data ../shared/data/train/deepscaler_partial.jsonl --device cpu --prompts_per_step 2 \\
        --mini_batch_prompts 1 --group_size 4 --max_response_len 16 --steps 1   # smoke test, seconds
    python train.py --task reverse --model tiny --device cpu --prompts_per_step 8 --mini_batch_prompts 8 \\
        --group_size 4 --steps 2                          # the toy task (toy_task.py, the template), seconds
    python train.py --plan true --model ../shared/data/models/qwen2.5-7b --nproc 8   # memory per rank, seconds

Writes in --out_dir: run.json, metrics.jsonl, ckpt/step_NNNNNN (DCP checkpoints, for --resume) and
Hugging Face model folders that from_pretrained and evaluate.py load: final, epoch_E after every epoch
of the math data, step_NNNNNN every --export_every steps (the exports checkpoint selection picks from,
App. L.4: evaluate.py --models 'out/train/epoch_*').

At the paper's scale (memory.py has the plan): on CUDA the rollouts come from vLLM (--engine auto),
each decoder layer is checkpointed (--grad_checkpointing auto), micro-batches hold at most
--micro_batch_tokens padded tokens, the log-probs never hold the (tokens, vocabulary) logits whole
(rollout.policy_logp), and the K newest checkpoints are kept (--keep_checkpoints).

Read top-down: Config and the tasks it picks from (TASKS), then main -> train_loop -> rl_step, then
the pieces rl_step calls (the update, then model setup and the process group). The run folder (logs,
checkpoints, resume, exports) is checkpoint.py's; a task is common.Task (toy_task.py is the template).

One step: rollouts (N per prompt, engine) -> rewards -> success rate mu_hat and focal weight g ->
advantages -> old log-probs from the trainer -> mini-batch updates with the global token count ->
weight sync to the engine -> one log line. Every rank runs the same code; with one process we still
start a (one-member) process group, so 1 CPU process and 8 GPUs share every line.

Defaults are Table 5 (Qwen2.5-7B, N = 8, 256 prompts a step, mini-batches of 64 prompts,
lr 1e-6 after 15 warm-up steps, AdamW (0.9, 0.999) wd 0.01, grad clip 1.0, T = 1, no KL, token-mean).

Deviations from the paper that live here, numbered as in the README's list:
1) Eq. 3 uses the unbiased std and eps = 1e-6; a dual clip c = 3 and a +-20 log-ratio clamp apply
   (verl defaults). Groups with X in {0, N} stay in the batch with A = 0 and count in the token mean.
2) "dapo" is GRPO + clip-higher (0.2/0.28) + token-mean: no dynamic sampling, no overlong shaping.
3) The rollout engine is ours (TorchEngine) or vLLM, not sglang; sampling is T = 1, top-p 1, no top-k.
4) Warm-up is linear from lr/15 (not from 0, which would waste step 0) and steps once per RL step.
5) Old log-probs are recomputed by the trainer; with one mini-batch per step the update is exactly
   on-policy, so we reuse the first forward pass (ratio == 1) instead of a second one.
"""
import contextlib
import dataclasses
import gc
import importlib.util
import math
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

import checkpoint
import maze
import memory
import reward
import toy_task
from advantage import (CLIP_EPS, LOSS_AGG, aggregate, clip_bounds, ds_grpo_advantages, focal_advantages,
                       group_advantages, kl_k3, ks_up_to, pass_at_k_table, policy_loss, token_mean)
from checkpoint import TRAIN_OUTPUTS, check_run, due_exports, export, progress, resume_from, save_checkpoint, start_logging
from common import (check, check_choices, check_device, check_min, check_out_dir, check_positive, check_pretrained, parse_config,
                    refuse)
from rollout import (Rollouts, make_engine, mix_seed, pack, policy_logp, register_policy_forward,
                     sync_weights, use_attention)


@dataclass
class Config:
    # task, model, engine
    task: str = "math"                # a name in TASKS: "math" (DeepScaleR, math-verify reward) | "maze"
                                      # (Sec. 5.2) | "reverse" (toy_task.py, the template for a new task)
    model: str = "Qwen/Qwen2.5-7B"    # HF id or local dir; maze: the SFT dir; "tiny": a random small policy
    tokenizer: str = ""               # default: the model's own; with --model tiny, the task's own (math has
                                      # none: pass one)
    data: str = "agentica-org/DeepScaleR-Preview-Dataset"   # math: a local jsonl, or DeepScaleR from the
                                      # hub (this id or "deepscaler", needs `datasets`); no other hub id
    engine: str = "auto"              # rollout engine: "torch" | "vllm" | "auto" (vLLM on CUDA, torch on CPU)
    # algorithm (each paper row is a flag or two; README "Reproducing the paper")
    loss: str = "grpo"                # "grpo" (Eq. 14) | "dapo" (clip-higher) | "cispo" (Eqs. 15-16)
    gamma: float = 0.0                # focal exponent, Eq. 12; 0 = the base method
    group_size: int = 8               # N rollouts per prompt
    eps_low: float | None = None      # clip widths; None = the --loss default (0.2/0.2, 0.2/0.28, 1/5)
    eps_high: float | None = None     # the upper one, 1 + eps_high
    dual_clip: float = 3.0            # cap on the loss of A < 0 tokens, > 1 (verl; GRPO/DAPO only)
    kl_coef: float = 0.0              # GRPO-KL control: k3 to the initial model (paper best 0.001)
    entropy_coef: float = 0.0         # GRPO-H control: loss -= coef * H (paper best 0.001)
    ds_grpo: bool = False             # DS-GRPO control: best-guess advantages (advantage.py)
    norm_std: bool = True             # Eq. 3 divides by the group's std; false: Dr. GRPO's mean-only A
    loss_agg: str = "token-mean"      # token-mean (the paper) | seq-mean-token-mean (original GRPO) |
                                      # seq-mean-token-sum-norm (Dr. GRPO): advantage.aggregate
    skip_dead_groups: bool = True     # groups with A = 0 everywhere skip forward and backward (exact;
                                      # off by itself with a KL or entropy term, which need every token)
    # batch and optimizer (Table 5)
    prompts_per_step: int = 256       # global, whatever the world size
    mini_batch_prompts: int = 64      # prompts per optimizer step: 256/64 = 4 updates per RL step
    micro_batch_size: int = 8         # at most this many sequences per forward pass (memory knob; the
                                      # math ignores it)
    micro_batch_tokens: int = 16384   # and at most this many padded tokens (0 = no cap): whole rows,
                                      # longest first; a row longer than the cap goes alone
    share_prompts: bool = False       # forward each group's prompt once (rollout.pack); maze: ~5x faster
    steps: int = 1530                 # ~10 epochs of 39,202 prompts
    lr: float = 1e-6                  # AdamW's peak learning rate
    warmup_steps: int = 15            # 0 = none
    weight_decay: float = 0.01        # AdamW's, decoupled
    adam_beta1: float = 0.9           # AdamW's betas, each in [0, 1)
    adam_beta2: float = 0.999         # (beta1, beta2) = (0.9, 0.999), Table 5
    grad_clip: float = 1.0            # max gradient norm, > 0 (there is no "off")
    # sampling
    temperature: float = 1.0          # > 0. 0 (greedy) is refused: N equal samples give no group signal,
                                      # and the trainer's log-probs divide the logits by T
    top_p: float = 1.0                # in (0, 1]
    top_k: int = 0                    # 0 = off
    max_prompt_len: int = 1024        # math: longer prompts are filtered out (Sec. 5.3, App. L)
    max_response_len: int = 8192      # math; the maze uses maze.max_new_tokens_for(size)
    maze_size: int = 0                # maze: grid size (odd, 7..17); 0 = the SFT checkpoint's
    maze_reward: str = "strict"       # maze: "strict" (exactly the shortest path, Sec. 5.2) | "walk" (MaxRL's)
    # run
    device: str = "auto"              # "auto" | "cpu" | "cuda" (torchrun: one GPU per rank)
    threads: int = 0                  # CPU threads per process, 0 = torch's default. Use 1 when other
                                      # jobs share the cores: OpenMP spin-waits make oversubscription 10x slower
    grad_checkpointing: str = "auto"  # activation checkpointing per decoder layer: "true" | "false" |
                                      # "auto" (on for CUDA, off on the CPU)
    kv_cache_gb: float = 16.0         # TorchEngine: KV-cache budget per rank (it admits prompts to fit)
    gpu_memory_utilization: float = 0.5   # vLLM on GPU: its share of the device while it samples
    enforce_eager: bool = False       # vLLM on GPU: no torch.compile or CUDA graphs (if they fail; for Model
                                      # Runner V2 failing, set VLLM_USE_V2_MODEL_RUNNER=0 instead)
    vllm_sleep_level: int = 2         # vLLM on GPU, during the update: 2 drops its weights (the sync rewrites
                                      # them all), 1 backs them up to pinned host RAM (~2x their size)
    seed: int = 0                     # model init (--model tiny), prompt order and every rollout's sampling
    out_dir: str = "out/train"        # holds only what we write (TRAIN_OUTPUTS), or is refused
    resume: bool = False              # continue from the newest whole checkpoint in out_dir
    save_every: int = 100             # checkpoint every K steps (and at the end)
    keep_checkpoints: int = 2         # keep the K newest whole checkpoints, delete older ckpt/step_* of ours
    export_every: int = 0             # also export a HF model, out_dir/step_NNNNNN, every K steps (0 = off);
                                      # math exports out_dir/epoch_E at every epoch's end regardless
    eval_every: int = 0               # maze: held-out pass@1 every K steps (0 = only at the end)
    eval_mazes: int = 256             # maze: held-out mazes, evaluated every --eval_every steps and at the end
    eval_samples: int = 4             # maze: samples per held-out maze; pass@k is logged for k = 1, 2, 4 .. this
    sample_every: int = 10            # print a decoded rollout every K steps
    wandb: bool = False               # also log to Weights & Biases (pip install wandb)
    # memory plan (memory.py): print it for these flags and exit, 0 if it fits and 2 if not
    plan: bool = False                # print the memory plan for these flags and exit: 0 if it fits, 2 if not
    nproc: int = 8                    # --plan: the world size (a real run checks its own before any work)
    gpu_memory_gb: float = 80.0       # --plan: memory of one device (a real run reads its device's)

    def __post_init__(self):
        check_choices(self)
        check(self.group_size >= 2, f"--group_size {self.group_size}: need >= 2 for a group baseline")
        check_min(self, 1, "prompts_per_step", "mini_batch_prompts", "micro_batch_size", "steps",
                  "max_prompt_len", "max_response_len", "save_every", "eval_samples", "keep_checkpoints", "nproc")
        check_min(self, 0, "gamma", "kl_coef", "entropy_coef", "warmup_steps", "weight_decay", "top_k",
                  "maze_size", "threads", "seed", "eval_every", "eval_mazes", "sample_every", "export_every",
                  "micro_batch_tokens")
        check(self.prompts_per_step % self.mini_batch_prompts == 0,
              f"--prompts_per_step {self.prompts_per_step} must be a multiple of "
              f"--mini_batch_prompts {self.mini_batch_prompts}")
        check_positive(self, "lr", "grad_clip", "temperature", "kv_cache_gb", "gpu_memory_gb")
        check(0 < self.gpu_memory_utilization < 1,
              f"--gpu_memory_utilization {self.gpu_memory_utilization}: must be in (0, 1)")
        check(self.vllm_sleep_level in (1, 2), f"--vllm_sleep_level {self.vllm_sleep_level}: expected 1 or 2")
        # The clip range [1 - eps_low, 1 + eps_high] must hold 1, and a ratio is never below 0.
        check(self.eps_low is None or 0 <= self.eps_low <= 1, f"--eps_low {self.eps_low}: must be in [0, 1]")
        check(self.eps_high is None or 0 <= self.eps_high < math.inf,
              f"--eps_high {self.eps_high}: must be >= 0 and finite")
        # The dual clip caps a negative-advantage token's loss at c|A|; at c <= 1 it would cut
        # below the clipped PPO loss itself.
        check(1 < self.dual_clip < math.inf, f"--dual_clip {self.dual_clip}: must be > 1 and finite")
        for name in ("adam_beta1", "adam_beta2"):
            check(0 <= getattr(self, name) < 1, f"--{name} {getattr(self, name)}: must be in [0, 1)")
        check(0 < self.top_p <= 1, f"--top_p {self.top_p}: must be in (0, 1]")
        check(self.maze_size == 0 or (self.maze_size % 2 == 1 and maze.MIN_SIZE <= self.maze_size <= 17),
              f"--maze_size {self.maze_size}: expected 0 or an odd number in [{maze.MIN_SIZE}, 17]")
        self.check_task_flags()
        self.check_flags_act()
        if self.plan:               # a plan needs the model's config.json and nothing else
            check(Path(self.model, "config.json").is_file(), f"--model {self.model}: --plan needs a folder "
                  "with a config.json (e.g. ../shared/data/models/qwen2.5-7b)")
            return
        self.check_inputs()
        check_out_dir(self.out_dir, "--out_dir", known=TRAIN_OUTPUTS)

    def check_flags_act(self):
        """A flag set to a value that cannot act in this run is refused, never recorded in run.json as
        if it had acted (--ds_grpo true --gamma 1 trained exactly as --gamma 0)."""
        idle = {"gamma": self.ds_grpo and "--ds_grpo true weights no advantage by (1 - mu_hat)^gamma",
                "norm_std": self.ds_grpo and "--ds_grpo true always divides by the population std",
                "dual_clip": self.loss == "cispo" and "--loss cispo has no dual clip (Eqs. 15-16)",
                "eval_every": self.eval_mazes == 0 and "--eval_mazes 0 evaluates nothing",
                "eval_samples": self.eval_mazes == 0 and "--eval_mazes 0 evaluates nothing",
                "nproc": not self.plan and "only --plan true reads it (a run uses its own world size)",
                "gpu_memory_gb": not self.plan and "only --plan true reads it (a run reads its device's)"}
        for name, why in idle.items():
            value = getattr(self, name)
            check(not why or value == type(self).__dataclass_fields__[name].default,
                  f"--{name} {value}: {why}; leave it out")

    @staticmethod
    def choices():
        """The flags with a fixed set of values: __post_init__ refuses any other, --help lists them."""
        return {"task": tuple(TASKS), "engine": ("auto", "torch", "vllm"), "loss": tuple(CLIP_EPS),
                "loss_agg": LOSS_AGG, "maze_reward": maze.RULES, "device": ("auto", "cpu", "cuda"),
                "grad_checkpointing": ("auto", "true", "false")}

    def check_inputs(self):
        """The model, tokenizer and data exist and are what they claim, before anything loads."""
        check(self.model != "tiny" or self.tokenizer or TASKS[self.task].tokenizer, f"--tokenizer: --model tiny "
              f"has random weights and --task {self.task} brings no tokenizer of its own; pass a tokenizer folder, "
              "e.g. ../shared/data/tokenizers/qwen2.5")
        if self.model != "tiny":
            check_pretrained(self.model, "--model", tokenizer=not self.tokenizer)
        if self.tokenizer:
            check_pretrained(self.tokenizer, "--tokenizer", model=False)
        if self.task == "maze" and not self.maze_size:
            check((Path(self.model) / "sft.json").is_file(), f"--model {self.model}: no sft.json (not a maze.py "
                  "checkpoint), so no maze size; pass --maze_size")
        if self.task == "math" and not reward.is_hub_data(self.data):
            check(Path(self.data).is_file(), f"--data {self.data}: no such file")
            rows = reward.load_jsonl(self.data)          # file:line of the first bad row, before any work
            check(len(rows) >= self.prompts_per_step, f"--data {self.data}: {len(rows)} problems, fewer than "
                  f"--prompts_per_step {self.prompts_per_step}")

    def check_task_flags(self):
        """A task flag (one that some row of TASKS lists) that this task does not read must keep its
        default: a value the run would silently drop is refused instead."""
        reads = TASKS[self.task].flags
        for f in dataclasses.fields(self):
            if f.name in TASK_FLAGS and f.name not in reads and getattr(self, f.name) != f.default:
                check(False, f"--{f.name} {getattr(self, f.name)}: --task {self.task} ignores it (it reads "
                      f"{' '.join('--' + n for n in reads) or 'no task flag'}); leave it out")


# -----------------------------------------------------------------------------
# Tasks: --task picks one row of TASKS. What a task is: common.Task; a new one: toy_task.py.

@dataclass(frozen=True)
class TaskEntry:
    make: Callable                      # (cfg, tokenizer, model_type) -> common.Task
    tokenizer: Callable | None = None   # () -> the task's own tokenizer, for --model tiny without --tokenizer
    model: Callable | None = None       # () -> a random policy for that tokenizer (None: tiny_qwen's)
    flags: tuple = ()                   # the task flags it reads; the others must keep their defaults


def math_task(cfg, tokenizer, model_type):
    task = reward.make_task(tokenizer, cfg.data, reward.model_family(model_type), cfg.max_prompt_len,
                            cfg.max_response_len, cfg.seed)
    check(task.num_prompts >= cfg.prompts_per_step, f"--data {cfg.data}: {task.num_prompts} problems "
          "survive the filter, fewer than --prompts_per_step")
    return task


def maze_task(cfg, tokenizer, model_type):
    return maze.make_task(tokenizer, cfg.maze_size or maze.checkpoint_size(cfg.model), cfg.seed,
                          cfg.maze_reward, cfg.eval_mazes, cfg.eval_samples)


TASKS = {
    "math": TaskEntry(math_task, flags=("data", "max_prompt_len", "max_response_len")),
    "maze": TaskEntry(maze_task, tokenizer=maze.build_tokenizer, model=maze.build_model,
                      flags=("maze_size", "maze_reward", "eval_every", "eval_mazes", "eval_samples")),
    "reverse": TaskEntry(toy_task.make_task, tokenizer=toy_task.build_tokenizer),
}
TASK_FLAGS = {name for entry in TASKS.values() for name in entry.flags}   # every other flag is the method's


def make_task(cfg, tokenizer, model_type):
    """The task --task names; model_type is the policy's config.model_type (math's chat template)."""
    return TASKS[cfg.task].make(cfg, tokenizer, model_type)


# -----------------------------------------------------------------------------
# The RL loop: main sets up and calls train_loop, which calls rl_step once per step

def main(cfg):
    if cfg.plan:                          # --plan true: the memory plan for these flags, nothing else
        problems = batch_problems(cfg, cfg.nproc)         # a world size the real run would refuse
        if problems:
            refuse(problems[0].replace("the world size", "--nproc"))
        plan = make_plan(cfg, cfg.nproc, cfg.gpu_memory_gb)
        print(memory.format_plan(plan))
        if not plan.fits:
            refuse(memory.verdict(plan))
        return
    # 0) set up: process group, checks, tokenizer, policy + engine (+ reference), optimizer, task, resume
    check_packages(cfg)
    check_engine_flags(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rank, world, device = init_dist(cfg.device)
    if device.type == "cuda" and cfg.model != "tiny":   # the same plan, with this run's world and device
        plan = make_plan(cfg, world, torch.cuda.get_device_properties(device).total_memory / 2**30)
        if not plan.fits:
            dist.destroy_process_group()
            refuse(memory.verdict(plan))
    transformers.utils.logging.disable_progress_bar()
    out = Path(cfg.out_dir)
    ckpt, meta = check_run(cfg, out, batch_problems(cfg, world))   # out_dir locked, checked, --resume's checkpoint
    tokenizer = load_tokenizer(cfg)
    pad = reward.pad_id(tokenizer)
    print0(describe(cfg, world, device))
    model, ref_model, engine, opt = build(cfg, tokenizer, pad, device)
    task = make_task(cfg, tokenizer, model.config.model_type)
    start = resume_from(model, opt, ckpt, meta) if ckpt is not None else 0
    sync_weights(model, engine)                    # the engine samples from exactly these weights
    logger = start_logging(cfg, out, task, world, start)
    try:
        train_loop(cfg, start, task, model, ref_model, engine, opt, logger, tokenizer, out, pad, device, rank, world)
    except NonFinite as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)                          # before any checkpoint or export of this step

    # 8) export, then free everything that holds the process group (FSDP's device mesh) before
    # destroying it: a group freed later, during interpreter exit, can abort a gloo rank
    # ("terminate called without an active exception") after all the work is done.
    export(model, tokenizer, out, ["final"], cfg, progress(cfg, max(start, cfg.steps), task.num_prompts))
    dist.barrier()
    engine.close()          # vLLM destroys the process groups it joined, the default one included
    del model, opt, ref_model, engine
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def train_loop(cfg, start, task, model, ref_model, engine, opt, logger, tokenizer, out, pad, device, rank, world):
    """Steps start .. cfg.steps - 1: phases 1-7 of main's loop."""
    for step in range(start, cfg.steps):
        # 1) - 6) rollouts, rewards, advantages, updates, weight sync
        r = rl_step(cfg, step, task, model, ref_model, engine, opt, pad=pad, device=device, rank=rank, world=world)

        # 7) metrics (all-reduced), held-out evaluation, one log line, a sample, exports, a checkpoint
        metrics = step_metrics(r)
        if task.evaluate and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or step + 1 == cfg.steps):
            metrics.update(evaluate_heldout(task, engine, rank, world))
        if rank == 0:
            logger(metrics)
            if cfg.sample_every and step % cfg.sample_every == 0:
                print(f"  sample (reward {float(r.R.flatten()[0]):.3g}): {task.show(r.rollouts.token_ids[0])[-300:]!r}",
                      flush=True)
        # Exports before the checkpoint of the same step: a kill between the two then redoes the step
        # on resume and finds the export there (kept, not written again); the other order would lose it.
        names = due_exports(cfg, step + 1, task.num_prompts, out)
        if names:
            export(model, tokenizer, out, names, cfg, progress(cfg, step + 1, task.num_prompts))
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(model, opt, step + 1, cfg, out)


def rl_step(cfg, step, task, model, ref_model, engine, opt, *, pad, device, rank, world):
    """One RL step (0-based `step`) on this rank: phases 1-6 of main's loop. Returns the StepResult
    that step_metrics turns into the logged metrics. bench/gpu_check.py times this same function."""
    num_minibatches = cfg.prompts_per_step // cfg.mini_batch_prompts   # optimizer steps per RL step
    on_policy = num_minibatches == 1
    watch = Stopwatch()
    # 1) rollouts: N per prompt, seeded by (seed, step, prompt index), never by rank
    idx = prompt_indices(cfg, step, rank, world)
    items = [task.prompt(i) for i in idx]                   # (prompt ids, answer)
    rollouts = engine.generate([ids for ids, _ in items], cfg.group_size,
                               seeds=[mix_seed(cfg.seed, step, i) for i in idx],
                               max_new_tokens=task.max_new_tokens, stop_token_ids=task.stop_token_ids,
                               temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
    watch.lap("rollout")
    engine.sleep()                        # vLLM on GPU: free its memory for the update

    # 2) rewards, group by group (all N rollouts of a prompt are on this rank)
    prompts = [items[i][0] for i in rollouts.prompt_index]
    completions = rollouts.token_ids
    rewards, reward_stats = task.score([items[i][1] for i in rollouts.prompt_index], completions)
    R = torch.tensor(rewards, dtype=torch.float32).view(len(idx), cfg.group_size)  # (P, N)

    # 3) advantages: the group z-score, then the focal weight g = (1 - mu_hat)^gamma of each group
    A_pre = group_advantages(R, cfg.norm_std)                                      # Eq. 3
    if cfg.ds_grpo:
        lbar = torch.tensor([sum(e) / max(len(e), 1) for e in rollouts.engine_logp])
        A, g = ds_grpo_advantages(R, lbar.view_as(R)), torch.ones(len(idx))
    else:
        A, g = focal_advantages(R, cfg.gamma, normalize_std=cfg.norm_std)          # Eqs. 11-13
    if all_max(float(not torch.isfinite(A).all())) > 0:    # any rank's: all stop together
        raise NonFinite(f"step {step + 1}: non-finite advantages (rewards {R.flatten().tolist()[:16]} ...); "
                        "a task's score or a weighting gave NaN or inf")
    watch.lap("reward")

    # 4) whole live groups moved between ranks so that each forwards about as many tokens; then the
    #    old log-probs with the trainer's own forward, unless the update is exactly on-policy
    mbs, back, busiest = balance_ranks(cfg, prompts, completions, A.flatten(), num_minibatches, rank, world)
    watch.lap("balance")
    model.eval()                          # inference only; the update below runs in training mode
    if not on_policy:
        P, C = [p for mb in mbs for p in mb[0]], [c for mb in mbs for c in mb[1]]
        old_logp = old_log_probs(model, P, C, cfg, pad, device, keep=live_rows(cfg, torch.cat([mb[2] for mb in mbs])))
    watch.lap("old_logp")

    # 5) one optimizer step per mini-batch of whole groups
    lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
    update_stats, grad_norms, first_logp, at = {}, [], [], 0
    model.train()                         # activation checkpointing acts only in training mode
    for P, C, adv, _ in mbs:
        stats, logp = update_minibatch(model, ref_model, P, C, adv, None if on_policy else old_logp[at:at + len(C)],
                                       on_policy=on_policy, cfg=cfg, pad_id=pad, device=device, world=world,
                                       max_len=task.max_new_tokens)
        grad_norms.append(clip_and_step(model, opt, cfg, lr))
        first_logp, at = first_logp + logp, at + len(C)
        for key, v in stats.items():
            update_stats[key] = (max(update_stats.get(key, 0.0), v) if key == "ratio/max"
                                 else update_stats.get(key, 0.0) + v / num_minibatches)
    model.eval()
    old_logp = back(first_logp if on_policy else old_logp)   # the first forward IS pi_old (deviation 5)
    if world > 1:
        update_stats["balance/busiest_before"], update_stats["balance/busiest"] = busiest
    watch.lap("train")

    # 6) weight sync, so the next rollouts come from the updated policy
    engine.wake_up()
    t_sync = sync_weights(model, engine)  # timed by itself: the sync alone, without wake_up
    return StepResult(step + 1, R, A_pre, A, g, rollouts, old_logp, reward_stats, update_stats, grad_norms, lr,
                      watch.done(weight_sync=t_sync))


class Stopwatch:
    """Wall-clock seconds per phase of one step, logged as time/NAME: lap(name) ends a phase."""

    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.seconds = {}

    def lap(self, name):
        now = time.perf_counter()
        self.seconds[name], self.last = now - self.last, now

    def done(self, **more):
        """The laps, then `more` (seconds timed elsewhere), then the whole step as "step"."""
        return {**self.seconds, **more, "step": time.perf_counter() - self.start}


@dataclass
class StepResult:
    """What one RL step produced on this rank: the inputs of step_metrics."""
    step: int                 # 1-based, as logged
    R: torch.Tensor           # (P, N) rewards
    A_pre: torch.Tensor       # (P, N) advantages before the focal weight (Eq. 3)
    A: torch.Tensor           # (P, N) advantages the update used (Eq. 13, or DS-GRPO)
    g: torch.Tensor           # (P,) focal weight (Eq. 12)
    rollouts: Rollouts
    old_logp: list            # per completion, the trainer's log-probs under pi_old (None: skipped)
    reward_stats: dict        # task.score's counts, logged as reward/NAME
    update_stats: dict        # update_minibatch's metrics, averaged over mini-batches (ratio/max: max)
    grad_norms: list          # pre-clip, one per optimizer step
    lr: float
    seconds: dict             # wall-clock per phase, logged as time/NAME


def step_metrics(r):
    """This step's logged metrics (every key: DESIGN.md, "Logged metrics"), over all ranks.

    Counts are summed over ranks first and divided after, so every mean is over the global batch.
    """
    R, A_pre, A, g = r.R, r.A_pre, r.A, r.g
    mixed = R.std(1) > 0                                                  # (P,) groups with signal
    lens = torch.tensor([len(c) for c in r.rollouts.token_ids], dtype=torch.float64)
    gap = torch.cat([(torch.tensor(e) - o).abs() for e, o in zip(r.rollouts.engine_logp, r.old_logp)
                     if o is not None] or [torch.zeros(0)])        # skipped groups have no trainer logp
    sums = {"groups": R.shape[0], "rollouts": R.numel(), "reward": R.sum(),
            "all_correct": (R.min(1).values >= 1).sum(),
            "all_wrong": (R.max(1).values <= 0).sum(), "g": g.sum(), "g_mixed": g[mixed].sum(),
            "mixed": mixed.sum(), "adv_pre": A_pre.abs().sum(), "adv_post": A.abs().sum(),
            "tokens": lens.sum(), "trunc": sum(f == "length" for f in r.rollouts.finish_reason),
            "gap": gap.sum(), "gap_n": gap.numel(), **r.reward_stats}
    s = dict(zip(sums, all_sum([float(v) for v in sums.values()]).tolist()))
    len_max, gap_max = all_max([lens.max(), gap.max() if gap.numel() else 0.0]).tolist()
    n = s["rollouts"]
    metrics = {"step": r.step, "reward/mean": s["reward"] / n,
               "groups/all_correct": s["all_correct"] / s["groups"], "groups/all_wrong": s["all_wrong"] / s["groups"],
               "focal/g_mean": s["g"] / s["groups"],
               "adv/abs_mean_pre": s["adv_pre"] / n, "adv/abs_mean_post": s["adv_post"] / n,
               "len/mean": s["tokens"] / n, "len/max": len_max, "trunc/frac": s["trunc"] / n,
               "logp/diff_abs_mean": s["gap"] / max(s["gap_n"], 1), "logp/diff_max": gap_max,
               "grad_norm": sum(r.grad_norms) / len(r.grad_norms), "lr": r.lr, "tokens": s["tokens"]}
    if s["mixed"]:                    # a mean over no groups is undefined; 0 would drag run averages down
        metrics["focal/g_mean_mixed"] = s["g_mixed"] / s["mixed"]
    metrics.update({f"reward/{k}": s[k] for k in r.reward_stats})
    metrics.update(r.update_stats)
    metrics.update({f"time/{k}": v for k, v in r.seconds.items()})
    metrics.update({"tok_per_s": s["tokens"] / r.seconds["step"],
                    "tok_per_s/rollout": s["tokens"] / r.seconds["rollout"]})
    return metrics


def evaluate_heldout(task, engine, rank, world):
    """The task's held-out pass@k (Eq. 27) for k = 1, 2, 4, ..., eval_samples under each of its reward
    rules, logged as eval/RULE/pass@k: per-problem estimates summed over ranks, then divided by the
    number of problems (a rank may hold none)."""
    counts = task.evaluate(engine, rank, world)                       # {rule: [c_i] on this rank}
    ks = ks_up_to(task.eval_samples)
    sums = [[float(pass_at_k_table(task.eval_samples, k)[np.asarray(c, dtype=np.int64)].sum()) for k in ks]
            + [len(c)] for c in counts.values()]
    summed = all_sum(sums)                                              # (rules, len(ks) + 1)
    return {f"eval/{rule}/pass@{k}": float(row[j] / max(row[-1], 1))
            for rule, row in zip(counts, summed) for j, k in enumerate(ks)}


def prompt_indices(cfg, step, rank, world):
    """This rank's global prompt indices for `step`. Global mini-batch k of the step holds indices
    step * prompts_per_step + k * mini_batch_prompts + [0, mini_batch_prompts); rank r owns a slice
    of each, so every world size forms the same mini-batches."""
    per_rank = cfg.mini_batch_prompts // world          # this rank's prompts in each mini-batch
    return [step * cfg.prompts_per_step + k * cfg.mini_batch_prompts + rank * per_rank + j
            for k in range(cfg.prompts_per_step // cfg.mini_batch_prompts) for j in range(per_rank)]


# -----------------------------------------------------------------------------
# The update: token-mean over the whole mini-batch, across micro-batches and ranks

def padded(rows, like):
    """A list of 1-D per-token tensors -> (b, Tc) shaped like `like`, zero-padded."""
    out = torch.zeros_like(like)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r.to(out)
    return out


def update_minibatch(model, ref_model, prompts, completions, A, old_logp, *, on_policy, cfg, pad_id, device,
                     world, max_len=None):
    """Accumulate the gradient of one mini-batch of whole groups (the caller steps the optimizer).

    prompts, completions: token-id lists, one per sequence, N consecutive ones per group; A: (S,)
    advantages; old_logp: per-sequence log-probs under pi_old, or None when on_policy: then the first
    forward IS pi_old (the README's deviation 5) and the ratio is exactly 1. max_len: the response budget, for
    --loss_agg seq-mean-token-sum-norm (default --max_response_len). ref_model: for --kl_coef > 0.
    The forward passes are micro_batches(cfg, ...) of the sequences live_rows(cfg, A) keeps, each
    packed (rollout.pack) and scored by rollout.policy_logp with entropy. Groups without signal
    (A = 0 for all N) add exactly 0 to the loss and its gradient, so with skip_dead(cfg) they are
    not forwarded at all, but they still count.
    The loss (policy_loss, Eqs. 14-16; minus entropy_coef times the aggregated entropy, GRPO-H; plus
    kl_coef times the aggregated kl_k3, GRPO-KL) of every micro-batch is divided by the GLOBAL counts
    of the mini-batch: its tokens and sequences on all ranks (all_sum), skipped ones included, as
    advantage.aggregate's num_tokens and num_seqs. So the accumulated gradient is that of the exact
    mini-batch loss (the paper's token-mean, App. B / L.2), however the micro-batches are cut. FSDP
    averages gradients over ranks: multiplying each loss by world undoes that, leaving the global sum.
    Every rank must run as many passes: an empty micro-batch ([]) runs row 0 with weight 0.
    Returns (metrics, first_logp). metrics, over all ranks: policy_loss's diagnostics and "entropy"
    (the token mean of H) as means over the live tokens (each micro-batch's value, computed with the
    global token count, times all tokens / live tokens, summed); "loss/pg" the sum of the
    micro-batches' policy losses; "kl/k3" the token mean of kl_k3 with a reference model;
    "ratio/max" the max; "skip/live_frac" the live sequences' share. first_logp: each completion's
    log-probs from this update's forward (1-D CPU tensors of its length), None for a skipped one.
    """
    assert on_policy == (old_logp is None), "on-policy updates reuse the first forward; others need old_logp"
    keep = live_rows(cfg, A)
    counts = all_sum([sum(len(c) for c in completions), len(completions),
                      sum(len(completions[i]) for i in keep), len(keep)]).tolist()
    n_tok, n_seq = (torch.tensor(c, device=device, dtype=torch.float32) for c in counts[:2])
    diag_scale = counts[0] / max(counts[2], 1)            # token means over the live tokens
    agg = dict(loss_agg=cfg.loss_agg, num_tokens=n_tok, num_seqs=n_seq,
               max_len=max_len or cfg.max_response_len)
    sums, first_logp = {}, [None] * len(completions)
    for mb in micro_batches(cfg, prompts, completions, keep):
        live = bool(mb)                     # an empty one only joins the collectives: weight 0
        mb = mb or [0]
        batch = pack([prompts[i] for i in mb], [completions[i] for i in mb], pad_id, device,
                     share_prompts=cfg.share_prompts)
        mask = batch["completion_mask"]                                              # (b, Tc)
        logp, H_tok = policy_logp(model, batch, cfg.temperature, entropy=True)       # (b, Tc) each
        old = logp.detach() if on_policy or not live else padded([old_logp[i] for i in mb], logp)  # (b, Tc)
        loss, diag = policy_loss(logp, old, A[mb].to(device), mask, cfg.loss, cfg.eps_low, cfg.eps_high,
                                 cfg.dual_clip, **agg)                               # Eqs. 14-16
        diag = {k: v if k == "ratio/max" else v * diag_scale for k, v in diag.items()}
        diag["entropy"] = token_mean(H_tok.detach(), mask, n_tok) * diag_scale
        diag["loss/pg"] = loss.detach()
        if cfg.entropy_coef > 0:                                                     # GRPO-H
            loss = loss - cfg.entropy_coef * aggregate(H_tok, mask, **agg)
        if ref_model is not None:                                                    # GRPO-KL
            with torch.no_grad():
                ref_logp, _ = policy_logp(ref_model, batch, cfg.temperature)
            kl = kl_k3(logp, ref_logp)
            loss = loss + cfg.kl_coef * aggregate(kl, mask, **agg)
            diag["kl/k3"] = token_mean(kl.detach(), mask, n_tok)
        (loss * (world if live else 0.0)).backward()
        for i, lp in zip(mb if live else [], logp.detach().cpu()):
            first_logp[i] = lp[:len(completions[i])]
        for k, v in diag.items():           # every rank sums the same keys (a weight-0 pass adds 0)
            v = float(v) if live else 0.0
            sums[k] = max(sums.get(k, 0.0), v) if k == "ratio/max" else sums.get(k, 0.0) + v
    ratio_max = sums.pop("ratio/max")
    out = dict(zip(sums, all_sum(list(sums.values())).tolist()))
    out["ratio/max"] = float(all_max(ratio_max))
    out["skip/live_frac"] = counts[3] / max(counts[1], 1)
    return out, first_logp


def skip_dead(cfg):
    """Whether groups without signal may skip the update: exact unless a term needs every token."""
    return cfg.skip_dead_groups and cfg.kl_coef == 0 and cfg.entropy_coef == 0


def live_rows(cfg, A):
    """The sequences the update must forward: all, or with skip_dead(cfg) those of groups (N
    consecutive sequences) with some A != 0. A: (S,) advantages of this rank's whole groups."""
    if not skip_dead(cfg):
        return list(range(len(A)))
    alive = (A.view(-1, cfg.group_size) != 0).any(1)                                 # (groups,)
    return [i for i in range(len(A)) if alive[i // cfg.group_size]]


def assign_groups(costs, world):
    """costs[r]: the tokens each of rank r's groups forwards (0: skipped). Returns dest[r][j], the
    rank group j of rank r goes to: every rank keeps its groups, largest first, while its load stays
    within the mean; the rest go, largest first, to the least-loaded rank (LPT: the busiest ends
    within one group of the mean). Where that would not lower the busiest load, or would leave a
    rank with nothing to forward, nothing moves. Deterministic, so every rank computes the same answer."""
    mean = sum(map(sum, costs)) / world
    dest, load, pool = [[r] * len(c) for r, c in enumerate(costs)], [0] * world, []
    for r, cs in enumerate(costs):
        for j in sorted(range(len(cs)), key=lambda j: -cs[j]):
            if load[r] + cs[j] <= mean:
                load[r] += cs[j]
            else:
                pool.append((-cs[j], r, j))
    for c, r, j in sorted(pool):
        dest[r][j] = min(range(world), key=lambda q: (load[q], q))
        load[dest[r][j]] -= c
    if max(load) >= max(map(sum, costs)) or len(set(sum(dest, []))) < world:
        return [[r] * len(c) for r, c in enumerate(costs)]
    return dest


def balance_ranks(cfg, prompts, completions, A, num_minibatches, rank, world):
    """Whole live groups moved between ranks, mini-batch by mini-batch, so that every rank forwards
    about as many tokens: each update waits for its busiest rank, and the groups skip_dead skips and
    completions of unlike length leave some ranks far busier than others. A moved group takes its
    prompt, completions and advantages along; the skipped ones stay, so the global counts the loss
    divides by are unchanged, and the gradient with them (up to the order of the sum).
    Returns (mbs, back, busiest): mbs, this rank's mini-batches, each (prompts, completions, A,
    origin), origin[i] the (rank, index there) sequence i came from;
    back(rows) returns per-sequence results in mbs' order (log-probs, None for a skipped sequence)
    to the ranks the sequences came from, in this rank's own order; busiest, the sum over
    mini-batches of the busiest rank's tokens over that of the mean rank, (before, after)."""
    N, per_mb = cfg.group_size, len(completions) // num_minibatches
    keep = set(live_rows(cfg, A))
    share = cfg.share_prompts

    def cost(s):
        if s not in keep:
            return 0
        return sum(len(c) for c in completions[s:s + N]) + sum(len(p) for p in prompts[s:s + N][:1 if share else N])
    def gather(obj):                                  # every rank's obj; no collective in a group of one
        out = [obj] * world
        if world > 1:
            dist.all_gather_object(out, obj)
        return out

    def exchange(outgoing):                           # outgoing[q] goes to rank q only; returns what each rank sent here
        if world == 1:
            return outgoing
        arrived = []
        for src in range(world):
            part = [None]
            dist.scatter_object_list(part, outgoing if src == rank else None, src=src)
            arrived.append(part[0])
        return arrived
    starts = [list(range(k * per_mb, (k + 1) * per_mb, N)) for k in range(num_minibatches)]
    everyone = gather([[cost(s) for s in mb] for mb in starts])
    dests = [assign_groups([everyone[r][k] for r in range(world)], world) for k in range(num_minibatches)]
    outgoing = [[] for _ in range(world)]
    for k, mb in enumerate(starts):
        for j, s in enumerate(mb):
            if dests[k][rank][j] != rank:
                outgoing[dests[k][rank][j]].append((k, s, prompts[s:s + N], completions[s:s + N],
                                                        A[s:s + N].clone()))  # a view would pickle all of A
    arrived = exchange(outgoing)
    got = {(r, k, s): group for r in range(world) for k, s, *group in arrived[r]}
    mbs = []
    for k in range(num_minibatches):
        groups = [(r, s) for r in range(world) for j, s in enumerate(starts[k]) if dests[k][r][j] == rank]
        P, C, adv, origin = [], [], [], []
        for r, s in groups:
            p, c, a = (prompts[s:s + N], completions[s:s + N], A[s:s + N]) if r == rank else got[(r, k, s)]
            P += p
            C += c
            adv.append(a)
            origin += [(r, s + i) for i in range(N)]
        mbs.append((P, C, torch.cat(adv), origin))

    def back(rows):
        out, away = [None] * len(completions), [[] for _ in range(world)]
        for (r, i), row in zip((o for mb in mbs for o in mb[3]), rows):
            if r == rank:
                out[i] = row
            else:
                away[r].append((i, row))
        for i, row in (x for part in exchange(away) for x in part):
            out[i] = row
        return out

    def slowest(load_of):
        loads = [[sum(load_of(r, k)) for r in range(world)] for k in range(num_minibatches)]
        return sum(map(max, loads)) / max(sum(map(sum, loads)) / world, 1)
    before = slowest(lambda r, k: everyone[r][k])
    after = slowest(lambda r, k: [c for q in range(world) for c, d in zip(everyone[q][k], dests[k][q]) if d == r])
    return mbs, back, (before, after)


@torch.no_grad()
def old_log_probs(model, prompts, completions, cfg, pad_id, device, keep=None):
    """pi_old's log-probs of each completion (1-D CPU tensors), in the update's micro-batches; only
    of the sequences in `keep` when given (None for the others: the update skips them)."""
    out = [None] * len(completions)
    for mb in micro_batches(cfg, prompts, completions, keep):
        batch = pack([prompts[i] for i in mb or [0]], [completions[i] for i in mb or [0]], pad_id, device,
                     share_prompts=cfg.share_prompts)
        logp, _ = policy_logp(model, batch, cfg.temperature)
        for i, lp in zip(mb, logp.cpu()):
            out[i] = lp[:len(completions[i])]
    return out


def micro_batches(cfg, prompts, completions, keep=None):
    """The forward passes of one mini-batch on this rank: lists of sequence indices, longest first;
    only of the sequences in `keep` when given (whole groups: live_rows).

    A block is one packed row: one sequence, or with --share_prompts a group of N sharing its prompt
    (rollout.pack), never split. Blocks join a micro-batch while it holds at most --micro_batch_size
    sequences and at most --micro_batch_tokens padded tokens (rows x the longest row: what the forward
    computes); a block over a cap goes alone. Longest first, so neighbours of like length waste little
    padding (the maze's 32 groups of 8 in micro-batches of 64: 23% padding in input order, 9% sorted).
    Only the order of the gradient sum depends on the cut: every micro-batch divides by the global
    token count (update_minibatch).
    FSDP runs collectives in every forward and backward, so every rank must make as many passes: a rank
    with fewer micro-batches gets empty ones ([]) at the end, which update_minibatch runs on one row
    with weight 0."""
    group = cfg.group_size if cfg.share_prompts else 1
    blocks = [list(range(s, min(s + group, len(completions)))) for s in range(0, len(completions), group)]
    if keep is not None:
        keep = set(keep)
        blocks = [b for b in blocks if b[0] in keep]

    def shape(block):         # (prompt columns, completion columns) of its row in pack's layout
        if cfg.share_prompts:
            return 0, len(prompts[block[0]]) + sum(len(completions[i]) for i in block)
        return len(prompts[block[0]]), len(completions[block[0]])

    blocks.sort(key=lambda b: -sum(shape(b)))
    out, cur, rows, lp, lc = [], [], 0, 0, 0      # the micro-batch being filled: its sequences, rows, widths
    for b in blocks:
        p, c = shape(b)
        too_many = len(cur) + len(b) > cfg.micro_batch_size
        too_long = cfg.micro_batch_tokens and (rows + 1) * (max(lp, p) + max(lc, c)) > cfg.micro_batch_tokens
        if cur and (too_many or too_long):
            out.append(cur)
            cur, rows, lp, lc = [], 0, 0, 0
        cur, rows, lp, lc = cur + b, rows + 1, max(lp, p), max(lc, c)
    if cur or not out:
        out.append(cur)                    # [] when every group is skipped: one empty pass
    return out + [[]] * (int(all_max(len(out))) - len(out))


class NonFinite(RuntimeError):
    """A NaN or inf on its way to the weights: the run stops before any optimizer step, checkpoint or
    export is made from it (main turns it into one line and exit status 1)."""


def clip_and_step(model, opt, cfg, lr):
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()        # the global norm: every rank sees the same value
    if not math.isfinite(float(grad_norm)):
        opt.zero_grad(set_to_none=True)
        raise NonFinite(f"the gradient norm is {float(grad_norm)} (a NaN or inf loss or advantage); no optimizer "
                        "step was taken, the last checkpoint is the last good state")
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(grad_norm)


# -----------------------------------------------------------------------------
# Model: load, shard with FSDP2, and an unsharded copy for the rollout engine

def load_tokenizer(cfg):
    """--tokenizer, else the model's own (AutoTokenizer, and Llama-3 offline: reward.load_tokenizer);
    --model tiny without --tokenizer: the task's own (its row in TASKS)."""
    if cfg.model == "tiny" and not cfg.tokenizer:
        return TASKS[cfg.task].tokenizer()
    return reward.load_tokenizer(cfg.tokenizer or cfg.model)


def load_model(cfg, tokenizer, dtype=torch.float32, meta=False):
    """The policy as a transformers model, computing attention with rollout.attention (SDPA without
    copying the KV heads on the CPU; transformers' own SDPA on GPU). meta=True: the same model on the
    meta device, from its config alone (no weights read, nothing allocated)."""
    if cfg.model == "tiny":                           # a random policy for tests and smoke runs
        torch.manual_seed(cfg.seed)                   # same init on every rank
        own = None if cfg.tokenizer else TASKS[cfg.task].model     # the task's, made for its own tokenizer
        with torch.device("meta") if meta else contextlib.nullcontext():
            model = (own() if own else tiny_qwen(len(tokenizer))).to(dtype)
    elif meta:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.model), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype)
    return use_attention(model)


def tiny_qwen(vocab_size):
    """--model tiny's policy unless the task brings one: a random 2-layer Qwen2, 64 wide."""
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True))


def shard(model, device):
    """FSDP2: each transformer block is its own unit, then the root (embeddings, norm, head).
    The blocks are the modules whose class the model names in _no_split_modules, which every HF
    causal LM sets (a model that names none is one unit).
    The model arrives on the CPU: fully_shard moves one unit at a time to the device and keeps only
    this rank's shard there, so the whole fp32 model never sits on one GPU (28 GiB for a 7B).
    On GPU: bf16 compute, fp32 master weights and fp32 gradient reductions. On CPU: all fp32."""
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if device.type == "cuda" else MixedPrecisionPolicy()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    blocks = set(getattr(model, "_no_split_modules", None) or ())     # e.g. {"Qwen2DecoderLayer"}
    for module in model.modules():
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    register_policy_forward(model)     # rollout.policy_logp's head runs where the root's weights are whole
    return model


def shard_from_rank0(model, full, device):
    """Shard `model` (built on the meta device, as every rank builds it) and fill it with the weights
    of `full`, the model rank 0 alone loaded (None on the other ranks): each rank receives its shard
    by broadcast (set_model_state_dict's broadcast_from_rank0), so a node holds one full fp32 copy at
    start-up instead of one per rank (8 x 28 GiB for the 7B). The buffers no state dict holds (the
    rotary inv_freq) are broadcast from rank 0's too."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    model = shard(model, device)
    model.to_empty(device=device)
    set_model_state_dict(model, full.state_dict() if full is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        for name, b in model.named_buffers():
            if full is not None:
                b.copy_(full.get_buffer(name))
            dist.broadcast(b, 0)
    return model


def build(cfg, tokenizer, pad, device, load=load_model):
    """(policy sharded, reference sharded or None, rollout engine, optimizer), the engine already
    synced to the policy. The model comes from load(cfg, tokenizer, dtype, meta): load_model here, a
    random-init builder in bench/gpu_check.py. Weights are read once, by rank 0 (shard_from_rank0);
    every other copy is built on the meta device and filled from that one: the policy's shards, the
    reference's, and the engine's weights, which the sync writes (vLLM loads "dummy" weights: random,
    never read from disk, all of them rewritten, as after a level-2 sleep)."""
    full = load(cfg, tokenizer, torch.float32) if dist.get_rank() == 0 else None
    model = load(cfg, tokenizer, torch.float32, meta=True)
    # The engine holds its own unsharded copy of the policy (bf16 on GPU), refreshed every step.
    engine_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kind = memory.engine_kind(cfg, device.type)
    engine_model = load(cfg, tokenizer, engine_dtype, meta=True).to_empty(device=device) if kind == "torch" else None
    engine = make_engine(kind, cfg.model, pad_token_id=pad, device=device, dtype=engine_dtype, model=engine_model,
                         kv_cache_bytes=int(cfg.kv_cache_gb * 2**30),
                         gpu_memory_utilization=cfg.gpu_memory_utilization, seed=cfg.seed,
                         enforce_eager=cfg.enforce_eager or None, sleep_level=cfg.vllm_sleep_level,
                         **({"load_format": "dummy"} if kind == "vllm" else {}),
                         max_model_len=cfg.max_prompt_len + cfg.max_response_len)
    if kind == "vllm":
        print0(engine.describe())     # which runner, compile mode and sleep level ran: the first thing to check
    ref_model = (shard_from_rank0(load(cfg, tokenizer, torch.float32, meta=True), full, device).eval()
                 if cfg.kl_coef > 0 else None)
    if memory.checkpointing_on(cfg, device.type):
        # Non-reentrant: the reentrant variant needs inputs that require grad and fights FSDP's hooks.
        # It acts only in training mode, which rl_step sets for the update (model.train()).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = shard_from_rank0(model, full, device)
    del full
    if engine_model is not None:                # buffers are in no sync: the policy's rotary tables
        with torch.no_grad():
            for name, b in engine_model.named_buffers():
                b.copy_(model.get_buffer(name))
    sync_weights(model, engine)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            weight_decay=cfg.weight_decay)
    return model, ref_model, engine, opt


def describe(cfg, world, device):
    lo, hi = clip_bounds(cfg.loss, cfg.eps_low, cfg.eps_high)
    return (f"loss {cfg.loss}: ratio bounds [{lo:.2f}, {hi:.2f}]"
            + (" (CISPO weight bounds)" if cfg.loss == "cispo" else f", dual clip {cfg.dual_clip}")
            + f" | gamma {cfg.gamma} | N {cfg.group_size} | world {world} | device {device}")


# -----------------------------------------------------------------------------
# Checks that need more than the flags: installed packages, the device, the world size

def check_packages(cfg):
    """Exit 2 in one line, before any work, when the run needs a package beyond requirements.txt that
    is not installed (or a GPU this torch cannot see); the line names the flag and the fix. Not part of
    Config.__post_init__: a Config must build where these are missing (bench/gpu_check.py builds one on
    a GPU image without them)."""
    try:
        check_device(cfg.device)
    except ValueError as e:
        refuse(e)
    engine = memory.engine_kind(cfg, device_type(cfg))
    vllm_fix = ("needs vLLM: pip install -r requirements-gpu.txt" if cfg.engine == "vllm" else
                "uses vLLM on CUDA, which is not installed: pip install -r requirements-gpu.txt, or pass "
                "--engine torch")
    needs = [("datasets", cfg.task == "math" and reward.is_hub_data(cfg.data), f"--data {cfg.data}",
              reward.DATASETS_MISSING),
             ("vllm", engine == "vllm", f"--engine {cfg.engine}", vllm_fix),
             ("wandb", cfg.wandb, "--wandb true", "needs wandb (optional, not in any requirements file): "
              "pip install wandb")]
    for package, needed, flag, fix in needs:
        if needed and importlib.util.find_spec(package) is None:
            refuse(f"{flag}: {fix}")


def check_engine_flags(cfg):
    """Engine flags act on one engine only: --enforce_eager, --vllm_sleep_level and
    --gpu_memory_utilization on vLLM on CUDA, --kv_cache_gb on TorchEngine. Set for any other run
    they are refused in one line, never recorded in run.json as if they had acted."""
    device = device_type(cfg)
    kind = memory.engine_kind(cfg, device)
    acts = {"enforce_eager": ("vllm", "cuda"), "vllm_sleep_level": ("vllm", "cuda"),
            "gpu_memory_utilization": ("vllm", "cuda"), "kv_cache_gb": ("torch", None)}
    for name, (engine, on) in acts.items():
        value = getattr(cfg, name)
        if value != Config.__dataclass_fields__[name].default and (kind != engine or on not in (None, device)):
            where = "vLLM on CUDA" if on else "TorchEngine (--engine torch)"
            refuse(f"--{name} {value}: acts only on {where}, and this run samples with --engine {kind} "
                   f"on {device}; leave it out")


def plan_lengths(cfg):
    """(prompt, response) tokens of the task's rows, for the memory plan: math's are its flags; a task
    with its own tokenizer (maze, reverse) is built and asked (the longest of its first 16 prompts)."""
    entry = TASKS[cfg.task]
    if entry.tokenizer is None:
        return cfg.max_prompt_len, cfg.max_response_len
    if cfg.task == "maze" and not cfg.maze_size:
        check((Path(cfg.model) / "sft.json").is_file(), f"--model {cfg.model}: no sft.json (not a maze.py "
              "checkpoint), so no maze size; pass --maze_size")
    task = make_task(cfg, entry.tokenizer(), None)
    return max(len(task.prompt(i)[0]) for i in range(16)), task.max_new_tokens


def make_plan(cfg, world, gpu_memory_gb):
    """memory.plan of this run, or one line and exit 2 when its config.json cannot make one."""
    try:
        return memory.plan(cfg, world, gpu_memory_gb, lengths=plan_lengths(cfg))
    except ValueError as e:
        refuse(e)


def batch_problems(cfg, world):
    """The global batch is fixed by config; the world size only changes each rank's share, which must
    be whole. check_run refuses the first of these, in one line."""
    return [f"--{name} {getattr(cfg, name)} must be divisible by the world size {world}"
            for name in ("prompts_per_step", "mini_batch_prompts") if getattr(cfg, name) % world]


def device_type(cfg):
    """"cuda" or "cpu": what --device auto means on this machine."""
    return cfg.device if cfg.device != "auto" else auto_device()


def auto_device():
    """--device auto: CUDA when this torch sees a GPU, else the CPU, but only for one process. Under
    torchrun (WORLD_SIZE > 1) a node without usable CUDA (a CPU build of torch, or a driver older than
    the CUDA build needs) would otherwise become an N-rank CPU run holding N copies of the model in
    host RAM: refuse it in one line, before any work."""
    if torch.cuda.is_available():
        return "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        try:
            driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
        except (OSError, IndexError):
            driver = "no NVIDIA driver found"
        refuse(f"--device auto: WORLD_SIZE {world} but no usable CUDA (torch {torch.__version__}, CUDA build "
               f"{torch.version.cuda or 'none'}, torch.cuda.is_available() False, driver: {driver}); "
               "pass --device cpu to force a CPU run")
    return "cpu"


# -----------------------------------------------------------------------------
# Distributed setup: torchrun, or one process that still gets a process group

def init_dist(device):
    if "RANK" not in os.environ:                       # plain `python train.py`: a group of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    if device == "auto":
        device = auto_device()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = f"cuda:{os.environ['LOCAL_RANK']}"
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    checkpoint.start_io_group()       # the gloo group with a long timeout that checkpoints and exports wait in
    return dist.get_rank(), dist.get_world_size(), torch.device(device)


def print0(*args):
    if dist.get_rank() == 0:
        print(*args, flush=True)


def all_sum(x):
    """Sum a float or tensor over ranks (as float64 on the CPU, so gloo and nccl both work)."""
    t = torch.as_tensor(x, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return t.cpu()


def all_max(x):
    t = torch.as_tensor(x, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu()


def _comm_device():
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
