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
Hugging Face model folders: final, epoch_E after every epoch of the math data, step_NNNNNN every
--export_every steps (checkpoint selection, App. L.4, picks from them: evaluate.py --models 'out/train/epoch_*').

One step (rl_step): rollouts -> rewards -> mu_hat and focal weight g -> advantages -> mini-batches -> old
log-probs -> an update per mini-batch with the global token count -> weight sync -> one log line. Every rank
runs the same code: one process starts a (one-member) process group, so 1 CPU process and 8 GPUs share it.
Read top-down: Config, TASKS, main -> train_loop -> rl_step -> update_minibatch; what is not the RL
is one call into fgrpo_utils/ (preflight, distributed, policy, logprob, run_folder, metrics, memory_plan).

At the paper's scale, on CUDA: vLLM rollouts, per-layer activation checkpointing, micro-batches of at most
--micro_batch_tokens, log-probs without the (tokens, vocabulary) logits, the K newest checkpoints (memory_plan.py).
Defaults are Table 5's.

Deviations from the paper that live here, numbered as in the README's list:
1) Eq. 3 uses the unbiased std and eps = 1e-6; a dual clip c = 3 and a +-20 log-ratio clamp apply (verl's).
   Groups with X in {0, N} stay in the batch with A = 0 and count in the token mean.
2) "dapo" is GRPO + clip-higher (0.2/0.28) + token-mean: no dynamic sampling, no overlong shaping.
3) The rollout engine is ours (TorchEngine) or vLLM, not sglang; sampling is T = 1, top-p 1, no top-k.
4) Warm-up is linear from lr/15 (not from 0, which would waste step 0) and steps once per RL step.
5) Old log-probs are the trainer's; a step's first mini-batch reuses its first forward (ratio == 1).
"""
import gc
import math
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import transformers

import maze
import reward
import toy_task
from advantage import (CLIP_EPS, LOSS_AGG, TIS_LEVELS, WEIGHTINGS, aggregate, clip_bounds, ds_grpo_advantages,
                       group_advantages, kl_k3, ks_up_to, pass_at_k_table, policy_loss, tis_weights, token_mean,
                       unlikely_rewards, weighted_advantages)
from fgrpo_utils import memory_plan, policy, preflight
from fgrpo_utils.cli import parse_config
from fgrpo_utils.distributed import (all_max, all_sum, balance_ranks, batch_problems, init_dist, pass_rows,
                                    pass_tokens, print0, token_bins)
from fgrpo_utils.logprob import pack, padded, policy_logp
from fgrpo_utils.metrics import StepResult, Stopwatch, log_line, step_metrics
from fgrpo_utils.run_folder import (DiskTrouble, check_run, due_exports, export, progress, resume_from, save_checkpoint,
                                    start_logging)
from fgrpo_utils.task import TaskEntry
from rollout import make_engine, mix_seed, sync_weights

@dataclass
class Config:
    # task, model, engine
    task: str = "math"                # "math" (DeepScaleR, math-verify) | "maze" (Sec. 5.2) | "reverse" (toy_task.py)
    model: str = "Qwen/Qwen2.5-7B"    # HF id or local dir; maze: the SFT dir; "tiny": a random small policy
    tokenizer: str = ""               # default: the model's own; --model tiny: the task's own (math: pass one)
    data: str = "agentica-org/DeepScaleR-Preview-Dataset"   # math: a local jsonl, or DeepScaleR from the
                                      # hub (this id or "deepscaler", needs `datasets`); no other hub id
    engine: str = "auto"              # rollout engine: "torch" | "vllm" | "auto" (vLLM on CUDA, torch on CPU)
    # algorithm (each paper row is a flag or two; README "Reproducing the paper")
    loss: str = "grpo"                # "grpo" (Eq. 14) | "dapo" (clip-higher) | "cispo" (Eqs. 15-16)
    gamma: float = 0.0                # focal exponent, Eq. 12; 0 = the base method
    weighting: str = "focal"          # each group's weight: "focal" (Eq. 12) | a rival (advantage.py): "maxrl" |
                                      # "passk" (pass@k training) | "wreinforce" (no baseline)
    passk_k: int = 4                  # --weighting passk: k, 1 <= k <= N
    wreinforce_lambda: float = 0.1    # --weighting wreinforce: a correct sample's advantage (a wrong one's -1)
    unlikely_beta: float = 0.0        # unlikeliness reward (any weighting): rewards x (1 - beta rank / N); 0 = off
    tis_cap: float = 0.0              # engine-trainer correction (not the paper's): each token's loss x
    tis_level: str = "token"          # min(pi_old / pi_engine, C), or per sequence; 0 = off (advantage.tis_weights)
    group_size: int = 8               # N rollouts per prompt
    eps_low: float | None = None      # clip widths; None = the --loss default (0.2/0.2, 0.2/0.28, 1/5)
    eps_high: float | None = None     # the upper one, 1 + eps_high
    dual_clip: float = 3.0            # cap on the loss of A < 0 tokens, > 1 (verl; GRPO/DAPO only)
    kl_coef: float = 0.0              # GRPO-KL control: k3 to the initial model (paper best 0.001)
    entropy_coef: float = 0.0         # GRPO-H control: loss -= coef * H (paper best 0.001)
    ds_grpo: bool = False             # DS-GRPO control: best-guess advantages (advantage.py)
    norm_std: bool = True             # Eq. 3 divides by the group's std; false: Dr. GRPO's mean-only A
    loss_agg: str = "token-mean"      # token-mean (the paper) | seq-mean-token-mean (original GRPO) |
                                      # seq-mean-token-sum-norm (Dr. GRPO)
    skip_dead_groups: bool = True     # groups with A = 0 everywhere skip the update (exact; off with KL or entropy)
    # batch and optimizer (Table 5)
    prompts_per_step: int = 256       # global, whatever the world size
    mini_batch_prompts: int = 64      # prompts per optimizer step: 256/64 = 4 updates per RL step
    micro_batch_size: int = 8         # at most this many sequences per forward pass (memory only: the math ignores it)
    micro_batch_tokens: int = 16384   # and at most this many tokens, padding included (0 = no cap); longer go alone
    padding_free: bool = True         # the update packs a micro-batch in one row without padding (logprob.pack)
    attention: str = "loop"           # padding-free: "loop" (SDPA a sequence) | "varlen" (one kernel a layer; CUDA)
    share_prompts: bool = False       # forward each group's prompt once (logprob.pack; over padding_free); maze: ~5x
    steps: int = 1530                 # ~10 epochs of 39,202 prompts
    lr: float = 1e-6                  # AdamW's peak learning rate
    warmup_steps: int = 15            # 0 = none
    weight_decay: float = 0.01        # AdamW's, decoupled
    adam_beta1: float = 0.9           # AdamW's betas, each in [0, 1)
    adam_beta2: float = 0.999         # (beta1, beta2) = (0.9, 0.999), Table 5
    grad_clip: float = 1.0            # max gradient norm, > 0 (there is no "off")
    # sampling
    temperature: float = 1.0          # > 0: greedy's N equal samples give no group signal; the log-probs divide by T
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
    grad_checkpointing: str = "auto"  # per decoder layer: "true" | "false" | "auto" (on for CUDA, off on the CPU)
    kv_cache_gb: float = 16.0         # TorchEngine: KV-cache budget per rank (it admits prompts to fit)
    gpu_memory_utilization: float = 0.7   # vLLM on GPU: its share of the device while it samples (the largest
                                      # that leaves 10% free for the 7B on 80 GiB: memory_plan)
    enforce_eager: bool = False       # vLLM on GPU: no torch.compile or CUDA graphs, if they fail (Model Runner V2
                                      # failing: VLLM_USE_V2_MODEL_RUNNER=0 instead)
    vllm_sleep_level: int = 2         # vLLM on GPU, during the update: 2 drops its weights (the sync rewrites
                                      # them all), 1 backs them up to pinned host RAM (~2x their size)
    seed: int = 0                     # model init (--model tiny), prompt order and every rollout's sampling
    out_dir: str = "out/train"        # holds only what we write (TRAIN_OUTPUTS), or is refused
    resume: bool = False              # continue from the newest whole checkpoint in out_dir
    save_every: int = 100             # checkpoint every K steps (and at the end)
    keep_checkpoints: int = 2         # keep the K newest whole checkpoints, delete older ckpt/step_* of ours
    export_every: int = 0             # export out_dir/step_NNNNNN every K steps (0 = off); math: epoch_E regardless
    eval_every: int = 0               # maze: held-out pass@1 every K steps (0 = only at the end)
    eval_mazes: int = 256             # maze: held-out mazes, evaluated every --eval_every steps and at the end
    eval_samples: int = 4             # maze: samples per held-out maze; pass@k is logged for k = 1, 2, 4 .. this
    sample_every: int = 10            # print a decoded rollout every K steps
    wandb: bool = False               # also log to Weights & Biases (pip install wandb)
    # memory plan (memory_plan.py)
    plan: bool = False                # print the memory plan for these flags and exit: 0 if it fits, 2 if not
    nproc: int = 8                    # --plan: the world size (a real run checks its own before any work)
    gpu_memory_gb: float = 80.0       # --plan: memory of one device (a real run reads its device's)

    def __post_init__(self):
        preflight.check_config(self, TASKS)      # every flag in range, then the inputs: ValueError('--flag ...')

    @staticmethod
    def choices():
        """The flags with a fixed set of values: __post_init__ refuses any other, --help lists them."""
        return {"task": tuple(TASKS), "engine": ("auto", "torch", "vllm"), "loss": tuple(CLIP_EPS),
                "loss_agg": LOSS_AGG, "maze_reward": maze.RULES, "device": ("auto", "cpu", "cuda"),
                "grad_checkpointing": ("auto", "true", "false"), "attention": ("loop", "varlen"),
                "weighting": WEIGHTINGS, "tis_level": TIS_LEVELS}

# --task picks one row (a TaskEntry: fgrpo_utils/task.py). A new task: toy_task.py.
TASKS = {
    "math": TaskEntry(reward.make_task, check=reward.check_flags, packages=reward.needed_packages,
                      flags=("data", "max_prompt_len", "max_response_len")),
    "maze": TaskEntry(maze.make_task, tokenizer=maze.build_tokenizer, model=maze.build_model, check=maze.check_flags,
                      flags=("maze_size", "maze_reward", "eval_every", "eval_mazes", "eval_samples")),
    "reverse": TaskEntry(toy_task.make_task, tokenizer=toy_task.build_tokenizer, partial=True),
}

# -----------------------------------------------------------------------------
# The RL loop: main sets up and calls train_loop, which calls rl_step once per step

def main(cfg):
    entry = TASKS[cfg.task]
    # 0) set up: checks, process group, tokenizer, policy + engine (+ reference), optimizer, task, resume
    preflight.check_environment(cfg, entry)          # packages, the device, engine flags: one line, exit 2
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    policy.fetch_weights({"--model": cfg.model, "--tokenizer": cfg.tokenizer})   # before any rank waits on one
    rank, world, device = init_dist(cfg.device)
    if device.type == "cuda" and cfg.model != "tiny":   # the same plan, with this run's world and device
        memory_plan.check_fits(cfg, world, device, entry)
    transformers.utils.logging.disable_progress_bar()
    out = Path(cfg.out_dir)
    ckpt, meta = check_run(cfg, out, batch_problems(cfg, world))   # out_dir locked, checked, --resume's checkpoint
    tokenizer = load_tokenizer(cfg)
    pad = reward.pad_id(tokenizer)
    lo, hi = clip_bounds(cfg.loss, cfg.eps_low, cfg.eps_high)
    print0(f"loss {cfg.loss}: ratio bounds [{lo:.2f}, {hi:.2f}]"
           + (" (CISPO weight bounds)" if cfg.loss == "cispo" else f", dual clip {cfg.dual_clip}")
           + f" | gamma {cfg.gamma} | N {cfg.group_size} | world {world} | device {device}")
    model, ref_model, engine, opt = build_models(cfg, tokenizer, pad, device)
    task = entry.make(cfg, tokenizer, model.config.model_type)
    preflight.check_engine_fits(cfg, engine, task.max_new_tokens, pad)
    start = resume_from(model, opt, ckpt, meta) if ckpt is not None else 0
    sync_weights(model, engine)                    # the engine samples from exactly these weights
    try:
        logger = start_logging(cfg, out, task, world, start)
        train_loop(cfg, start, task, model, ref_model, engine, opt, logger, tokenizer, out, pad, device, rank, world)
        # 8) export, then free all that holds the process group (FSDP's device mesh) before destroying it:
        # freed at interpreter exit, it can abort a gloo rank ("terminate called without an active exception").
        export(model, tokenizer, out, ["final"], cfg, progress(cfg, max(start, cfg.steps), task.num_prompts))
    except (NonFinite, DiskTrouble) as e:    # before any checkpoint or export of this step; a save cut
        print(f"error: {e}", file=sys.stderr, flush=True)     # short leaves only temp names, and resume
        sys.exit(1)                                          # takes the last whole checkpoint
    except KeyboardInterrupt:                # Ctrl-C: one line, not a traceback per rank
        print0(f"interrupted: the newest whole checkpoint in {out / 'ckpt'} stays; --resume true goes on from it")
        sys.exit(130)
    dist.barrier()
    engine.close()          # vLLM destroys the process groups it joined, the default one included
    del model, opt, ref_model, engine
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()

def train_loop(cfg, start, task, model, ref_model, engine, opt, logger, tokenizer, out, pad, device, rank, world):
    """Steps start .. cfg.steps - 1: rl_step (phases 1-6), then 7) the log line, evaluation, exports, a checkpoint."""
    for step in range(start, cfg.steps):
        # 1) - 6) rollouts, rewards, advantages, updates, weight sync
        r = rl_step(cfg, step, task, model, ref_model, engine, opt, pad=pad, device=device, rank=rank, world=world)

        # 7) metrics (all-reduced), held-out evaluation, one log line, a sample, exports, a checkpoint
        metrics = step_metrics(r)
        if task.evaluate and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or step + 1 == cfg.steps):
            metrics.update(evaluate_heldout(task, engine, rank, world))
        if rank == 0:
            logger(metrics)
            print(log_line(metrics, cfg.steps), flush=True)
            if cfg.sample_every and step % cfg.sample_every == 0:
                print(f"  sample (reward {float(r.R.flatten()[0]):.3g}): {task.show(r.rollouts.token_ids[0])[-300:]!r}",
                      flush=True)
        # Export first: a kill before the checkpoint redoes the step on resume and finds the export kept
        names = due_exports(cfg, step + 1, task.num_prompts, out)
        if names:
            export(model, tokenizer, out, names, cfg, progress(cfg, step + 1, task.num_prompts))
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(model, opt, step + 1, cfg, out)

def rl_step(cfg, step, task, model, ref_model, engine, opt, *, pad, device, rank, world):
    """One RL step (0-based `step`) on this rank, phases 1-6: returns the StepResult that step_metrics logs.
    bench/gpu_check.py times this same function."""
    num_minibatches = cfg.prompts_per_step // cfg.mini_batch_prompts   # optimizer steps per RL step
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

    # 3) advantages: the group z-score, then each group's weight: g = (1 - mu_hat)^gamma, or a rival's
    lbar = (torch.tensor([sum(e) / max(len(e), 1) for e in rollouts.engine_logp]).view_as(R)  # mean log pi_old
            if cfg.ds_grpo or cfg.unlikely_beta else None)
    shaped = unlikely_rewards(R, lbar, cfg.unlikely_beta) if cfg.unlikely_beta else R       # --unlikely_beta
    A_pre = group_advantages(shaped, cfg.norm_std)                                 # Eq. 3
    A, g = (ds_grpo_advantages(R, lbar), torch.ones(len(idx))) if cfg.ds_grpo else weighted_advantages(
        shaped, cfg.weighting, cfg.gamma, cfg.passk_k, cfg.wreinforce_lambda, cfg.norm_std)    # Eqs. 11-13
    if all_max(float(not torch.isfinite(A).all())) > 0:    # any rank's: all stop together
        raise NonFinite(f"step {step + 1}: non-finite advantages (rewards {R.flatten().tolist()[:16]} ...); "
                        "a task's score or a weighting gave NaN or inf")
    watch.lap("reward")

    # 4) mini-batches of whole groups: the k-th holds this rank's share of global mini-batch k (prompt_indices)
    S = len(completions) // num_minibatches                  # sequences per mini-batch on this rank
    E = rollouts.engine_logp if cfg.tis_cap else [None] * len(completions)   # for --tis_cap
    mbs = [(prompts[k * S:(k + 1) * S], completions[k * S:(k + 1) * S], A.flatten()[k * S:(k + 1) * S],
            E[k * S:(k + 1) * S]) for k in range(num_minibatches)]           # (prompts, completions, A, E)
    if world > 1:                         # whole live groups move so that every rank forwards about as many tokens
        mbs, back, busiest = balance_ranks(cfg, mbs, [live_rows(cfg, mb[2]) for mb in mbs], rank, world)
    watch.lap("balance")

    # pi_old's log-probs: mini-batch 0's is its own first forward, before any step (deviation 5); those of
    # mini-batches 1, 2, .. come from one forward now, while the policy is still pi_old
    old_logp = [None] * num_minibatches
    model.eval()                          # inference only; the update below runs in training mode
    if num_minibatches > 1:
        P, C, adv = ([x for mb in mbs[1:] for x in mb[j]] for j in (0, 1, 2))
        rest = iter(old_log_probs(model, P, C, cfg, pad, device, keep=live_rows(cfg, torch.stack(adv))))
        old_logp[1:] = [[next(rest) for _ in mb[1]] for mb in mbs[1:]]
    watch.lap("old_logp")

    # 5) one optimizer step per mini-batch
    lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
    update_stats, grad_norms = {}, []
    model.train()                         # activation checkpointing acts only in training mode
    for k, (P, C, adv, E) in enumerate(mbs):
        stats, logp = update_minibatch(model, ref_model, P, C, adv, old_logp[k], cfg=cfg, pad_id=pad, device=device,
                                       world=world, max_len=task.max_new_tokens, engine_logp=E if cfg.tis_cap else None)
        old_logp[k] = logp if old_logp[k] is None else old_logp[k]      # mini-batch 0's: its first forward
        grad_norms.append(clip_and_step(model, opt, cfg, lr))
        for key, v in stats.items():
            update_stats[key] = (max(update_stats.get(key, 0.0), v) if key == "ratio/max"
                                 else update_stats.get(key, 0.0) + v / num_minibatches)
    model.eval()
    old_logp = [lp for mb in old_logp for lp in mb]      # per completion, in mbs' order
    if world > 1:
        old_logp = back(old_logp)                         # each rank's own, in its rollouts' order
        update_stats["balance/busiest_before"], update_stats["balance/busiest"] = busiest
        update_stats["balance/lockstep"] = lockstep(cfg, mbs, world)
    watch.lap("train")

    # 6) weight sync, so the next rollouts come from the updated policy
    engine.wake_up()
    t_sync = sync_weights(model, engine)  # timed by itself: the sync alone, without wake_up
    return StepResult(step + 1, R, A_pre, A, g, rollouts, old_logp, reward_stats, update_stats, grad_norms, lr,
                      watch.done(weight_sync=t_sync))

def evaluate_heldout(task, engine, rank, world):
    """eval/RULE/pass@k (Eq. 27), k = 1, 2, 4, .. eval_samples, on the task's held-out problems: per-problem
    estimates summed over ranks, then divided by the number of problems (a rank may hold none)."""
    counts = task.evaluate(engine, rank, world)                       # {rule: [c_i] on this rank}
    ks = ks_up_to(task.eval_samples)
    sums = [[float(pass_at_k_table(task.eval_samples, k)[np.asarray(c, dtype=np.int64)].sum()) for k in ks]
            + [len(c)] for c in counts.values()]
    summed = all_sum(sums)                                              # (rules, len(ks) + 1)
    return {f"eval/{rule}/pass@{k}": float(row[j] / max(row[-1], 1))
            for rule, row in zip(counts, summed) for j, k in enumerate(ks)}

def prompt_indices(cfg, step, rank, world):
    """This rank's prompt indices for `step`: global mini-batch k holds step * prompts_per_step + k *
    mini_batch_prompts + [0, mini_batch_prompts), each rank a slice, so any world size forms the same ones."""
    per_rank = cfg.mini_batch_prompts // world          # this rank's prompts in each mini-batch
    return [step * cfg.prompts_per_step + k * cfg.mini_batch_prompts + rank * per_rank + j
            for k in range(cfg.prompts_per_step // cfg.mini_batch_prompts) for j in range(per_rank)]

# -----------------------------------------------------------------------------
# The update: token-mean over the whole mini-batch, across micro-batches and ranks

def update_minibatch(model, ref_model, prompts, completions, A, old_logp, *, cfg, pad_id, device, world,
                     max_len=None, engine_logp=None):
    """Accumulate the gradient of one mini-batch of whole groups (the caller steps the optimizer).

    prompts, completions: token-id lists, N consecutive sequences a group; A: (S,) advantages; old_logp: per-
    sequence log-probs under pi_old, or None: then the first forward IS pi_old (deviation 5) and the ratio is 1.
    max_len: seq-mean-token-sum-norm's budget; ref_model: for --kl_coef > 0; engine_logp: the engine's per-
    sequence log-probs for --tis_cap (None: off), which make the advantages w_t A (advantage.tis_weights).
    The sequences live_rows keeps are forwarded in micro_batches' passes; each pass's loss (policy_loss,
    Eqs. 14-16; - entropy_coef x entropy, GRPO-H; + kl_coef x kl_k3, GRPO-KL) divides by the mini-batch's
    GLOBAL token and sequence counts (all_sum, skipped groups included), so the accumulated gradient is the
    mini-batch loss's however it is cut (App. B / L.2); x world undoes FSDP's mean over ranks.
    Returns (metrics, logp). metrics, over all ranks: policy_loss's diagnostics, "entropy" (and "tis/mean",
    "tis/capped") as token means over the live tokens; "loss/pg" the policy losses summed; "kl/k3";
    "ratio/max"; "skip/live_frac" the live sequences' share. logp: each completion's log-probs from this
    forward, before the step (pi_old when old_logp is None): 1-D CPU tensors, None for a skipped one.
    """
    keep = live_rows(cfg, A)
    counts = all_sum([sum(len(c) for c in completions), len(completions),
                      sum(len(completions[i]) for i in keep), len(keep)]).tolist()
    n_tok, n_seq = (torch.tensor(c, device=device, dtype=torch.float32) for c in counts[:2])
    diag_scale = counts[0] / max(counts[2], 1)            # token means over the live tokens
    agg = dict(loss_agg=cfg.loss_agg, num_tokens=n_tok, num_seqs=n_seq, max_len=max_len or cfg.max_response_len)
    on_policy, first_logp = old_logp is None, [None] * len(completions)

    def pass_loss(mb):                      # one pass's loss and diagnostics; [] is an idle pass
        batch = micro_batch(cfg, prompts, completions, mb, pad_id, device)
        mask = batch["completion_mask"]                                              # (b, Tc)
        logp, H_tok = policy_logp(model, batch, cfg.temperature, entropy=True)       # (b, Tc) each
        old = padded([old_logp[i] for i in mb], logp) if mb and not on_policy else logp.detach()   # (b, Tc)
        adv = A[mb or [0]].to(device)                                                # (b,)
        if engine_logp is not None:                    # --tis_cap: the engine-trainer correction, per token
            eng = padded([torch.as_tensor(engine_logp[i]) for i in mb], logp) if mb else old      # (b, Tc)
            w, capped = tis_weights(old, eng, mask, cfg.tis_cap, cfg.tis_level)     # (b, Tc) each
            adv = adv[:, None] * w
        loss, diag = policy_loss(logp, old, adv, mask, cfg.loss, cfg.eps_low, cfg.eps_high,
                                 cfg.dual_clip, **agg)                               # Eqs. 14-16
        if engine_logp is not None:
            diag.update({"tis/mean": token_mean(w, mask, n_tok), "tis/capped": token_mean(capped.to(w), mask, n_tok)})
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
        return loss, diag, logp.detach().cpu()

    sums, passes = {}, micro_batches(cfg, prompts, completions, keep)
    for mb in [mb for mb in passes if mb]:
        loss, diag, logp = pass_loss(mb)
        (loss * world).backward()           # each pass's graph freed as soon as it is done
        for i, lp in zip(mb, logp):
            first_logp[i] = lp[:len(completions[i])]
        for k, v in diag.items():
            sums[k] = max(sums.get(k, 0.0), float(v)) if k == "ratio/max" else sums.get(k, 0.0) + float(v)
    # Idle passes: every rank makes as many passes as the busiest (FSDP's collectives wait for all), an idle
    # one of weight 0; it also gives a rank without live rows the metrics' keys, which all_sum lines up
    for _ in range(len(passes) - sum(map(bool, passes))):
        loss, diag, _ = pass_loss([])
        (loss * 0.0).backward()
        for k in diag:
            sums.setdefault(k, 0.0)
    ratio_max = sums.pop("ratio/max")
    out = dict(zip(sums, all_sum(list(sums.values())).tolist()))
    out["ratio/max"] = float(all_max(ratio_max))
    out["skip/live_frac"] = counts[3] / max(counts[1], 1)
    return out, first_logp

def live_rows(cfg, A):
    """The sequences the update must forward: with --skip_dead_groups those of groups (N consecutive
    sequences) with some A != 0, as the rest add exactly 0; all when the KL or entropy term needs every token.
    A: (S,) advantages of this rank's whole groups."""
    if not cfg.skip_dead_groups or cfg.kl_coef != 0 or cfg.entropy_coef != 0:
        return list(range(len(A)))
    alive = (A.view(-1, cfg.group_size) != 0).any(1)                                 # (groups,)
    return [i for i in range(len(A)) if alive[i // cfg.group_size]]

@torch.no_grad()
def old_log_probs(model, prompts, completions, cfg, pad_id, device, keep=None):
    """pi_old's log-probs of each completion (1-D CPU tensors) in the update's micro-batches; None outside `keep`."""
    out = [None] * len(completions)
    for mb in micro_batches(cfg, prompts, completions, keep):
        logp, _ = policy_logp(model, micro_batch(cfg, prompts, completions, mb, pad_id, device), cfg.temperature)
        for i, lp in zip(mb, logp.cpu()):
            out[i] = lp[:len(completions[i])]
    return out

def micro_batch(cfg, prompts, completions, mb, pad_id, device):
    """pack() of the sequences `mb` in the update's layout; an empty one (an idle pass, there only for FSDP's
    collectives) is a two-token row: never a real row's forward and backward, up to 9,216 tokens."""
    if not mb:                        # sequence 0's last prompt token and first completion token
        return pack([prompts[0][-1:] or [pad_id]], [completions[0][:1] or [pad_id]], pad_id, device)
    return pack([prompts[i] for i in mb], [completions[i] for i in mb], pad_id, device,
                share_prompts=cfg.share_prompts, padding_free=cfg.padding_free)

def micro_batches(cfg, prompts, completions, keep=None):
    """The forward passes of one mini-batch on this rank: lists of sequence indices (of `keep`, when given).
    FSDP's collectives make each pass wait for the slowest rank, so a mini-batch costs the sum over passes
    of the largest rank's pass: every rank makes as many passes, K, the most any rank needs (all_max), its
    rows cut into K of about equal cost, costliest first, so pass j is about as large on every rank (verl's
    balanced micro-batches; token_bins). An empty pass ([]) is an idle one (micro_batch)."""
    rows = pass_rows(cfg, prompts, completions, range(len(completions)) if keep is None else sorted(keep))
    cap = cfg.micro_batch_tokens      # a pass holds <= micro_batch_size rows and, unless alone, <= cap tokens
    lo = max(-(-len(rows) // cfg.micro_batch_size), -(-sum(min(p + c, cap) for _, p, c in rows) // cap) if cap else 0)
    fewest, bins = next((k, b) for k in range(lo, len(rows) + 1) if (b := token_bins(cfg, rows, k)) is not None)
    K = max(int(all_max(fewest)), 1)                     # one (idle) pass when no rank has anything live
    bins = bins if K == fewest else token_bins(cfg, rows, K) or bins + [[]] * (K - fewest)
    return [[i for seqs, _, _ in b for i in seqs] for b in bins]

def lockstep(cfg, mbs, world):
    """balance/lockstep: the update's passes, each waiting for its slowest rank, cost sum_j max_r tokens(r, j):
    that over sum_j mean_r tokens(r, j) (1: pass j as large on every rank). mbs: balance_ranks'. Collective."""
    costs = torch.tensor([float(pass_tokens(cfg, pass_rows(cfg, P, C, mb))) for P, C, adv, _ in mbs
                          for mb in micro_batches(cfg, P, C, live_rows(cfg, adv))], dtype=torch.float64)
    return float(world * all_max(costs).sum() / all_sum(costs).sum().clamp(min=1))

class NonFinite(RuntimeError):
    """A NaN or inf on its way to the weights: the run stops (exit 1) before any step, checkpoint or export."""

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

def load_tokenizer(cfg):
    """--tokenizer, else the model's own; --model tiny without --tokenizer: the task's own (TASKS)."""
    if cfg.model == "tiny" and not cfg.tokenizer:
        return TASKS[cfg.task].tokenizer()
    return reward.load_tokenizer(cfg.tokenizer or cfg.model)

def build_models(cfg, tokenizer, pad, device, load=None):
    """policy.build's (policy, reference or None, engine synced to the policy, optimizer). load: the model
    builder (bench/gpu_check.py's random one); default policy.load_model (--model tiny: the task's own)."""
    def new_engine(kind, engine_model, dtype):
        return make_engine(kind, cfg.model, pad_token_id=pad, device=device, dtype=dtype, model=engine_model,
                           kv_cache_bytes=int(cfg.kv_cache_gb * 2**30),
                           gpu_memory_utilization=cfg.gpu_memory_utilization, seed=cfg.seed,
                           enforce_eager=cfg.enforce_eager or None, sleep_level=cfg.vllm_sleep_level,
                           **({"load_format": "dummy"} if kind == "vllm" else {}),
                           max_model_len=cfg.max_prompt_len + cfg.max_response_len)
    load = load or partial(policy.load_model, own=None if cfg.tokenizer else TASKS[cfg.task].model)
    model, ref_model, engine, opt = policy.build(cfg, tokenizer, device, new_engine, load)
    sync_weights(model, engine)
    return model, ref_model, engine, opt

if __name__ == "__main__":
    cfg = parse_config(Config, doc=__doc__)
    if cfg.plan:                          # --plan true: the memory plan for these flags, nothing else
        memory_plan.main(cfg, TASKS[cfg.task])
    else:
        main(cfg)
