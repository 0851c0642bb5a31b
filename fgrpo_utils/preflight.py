"""
What train.py checks before any work, each problem refused in one line with exit status 2: its flags and
inputs (check_config, the body of Config.__post_init__), then at start-up the device, packages and engine
flags (check_environment). `tasks` is train.py's TASKS table (a TaskEntry per name), so no script is imported.
"""
import dataclasses
import importlib.util
import math
from pathlib import Path

import torch.distributed as dist

from fgrpo_utils.cli import check, check_choices, check_device, check_min, check_positive, check_pretrained, refuse
from fgrpo_utils.distributed import device_type
from fgrpo_utils.outputs import check_out_dir
from fgrpo_utils.policy import engine_kind
from fgrpo_utils.run_folder import TRAIN_OUTPUTS

# The largest value each numeric flag's use allows, and why; the smallest are in check_config.
UPPER = {"seed": (2**32 - 1, "a 32-bit seed, as numpy's and the engines' take"),
         "threads": (1024, "CPU threads of one process; gloo and OpenMP fail far below a million"),
         "group_size": (4096, "N rollouts of one prompt sample as one engine batch; the paper's largest is 32"),
         "prompts_per_step": (1 << 20, "the step's prompt list is built before sampling"),
         "lr": (1.0, "AdamW moves each weight by about lr a step; the paper's is 1e-6"),
         "gamma": (100.0, "(1 - mu_hat)^gamma is 0 to float precision for every mixed group long before"),
         **dict.fromkeys(("steps", "warmup_steps", "save_every", "eval_every", "sample_every", "export_every",
                          "keep_checkpoints"), (10**8, "a count of steps")),
         **dict.fromkeys(("max_prompt_len", "max_response_len", "micro_batch_size", "micro_batch_tokens", "top_k",
                          "nproc", "maze_size"), (1 << 24, "a count of tokens or items")),
         **dict.fromkeys(("eval_mazes", "eval_samples"), (1 << 16, "held-out mazes, samples a maze")),
         **dict.fromkeys(("kl_coef", "entropy_coef", "weight_decay", "temperature", "grad_clip", "kv_cache_gb",
                          "gpu_memory_gb"), (1e6, "a coefficient, a norm or GiB"))}

def check_config(cfg, tasks):
    """Config.__post_init__: ValueError('--flag ...') for the first flag out of range, set for another
    task or where it cannot act; then, unless --plan, the inputs (check_inputs) and --out_dir."""
    check_choices(cfg)
    check(cfg.group_size >= 2, f"--group_size {cfg.group_size}: need >= 2 for a group baseline")
    check_min(cfg, 1, "prompts_per_step", "mini_batch_prompts", "micro_batch_size", "steps",
              "max_prompt_len", "max_response_len", "save_every", "eval_samples", "keep_checkpoints", "nproc")
    check_min(cfg, 0, "gamma", "kl_coef", "entropy_coef", "warmup_steps", "weight_decay", "top_k",
              "maze_size", "threads", "seed", "eval_every", "eval_mazes", "sample_every", "export_every",
              "micro_batch_tokens")
    for name, (high, why) in UPPER.items():     # past these a run fails after set-up, or never gets going
        check(getattr(cfg, name) <= high, f"--{name} {getattr(cfg, name)}: at most {high:,} ({why})")
    check(cfg.prompts_per_step % cfg.mini_batch_prompts == 0, f"--prompts_per_step {cfg.prompts_per_step} must be "
          f"a multiple of --mini_batch_prompts {cfg.mini_batch_prompts}")
    check_positive(cfg, "lr", "grad_clip", "temperature", "kv_cache_gb", "gpu_memory_gb")
    check(cfg.lr * cfg.weight_decay < 1, f"--weight_decay {cfg.weight_decay}: lr x weight_decay must be < 1 "
          "(AdamW multiplies each weight by 1 - lr x weight_decay a step)")
    check(0 < cfg.gpu_memory_utilization < 1,
          f"--gpu_memory_utilization {cfg.gpu_memory_utilization}: must be in (0, 1)")
    check(cfg.vllm_sleep_level in (1, 2), f"--vllm_sleep_level {cfg.vllm_sleep_level}: expected 1 or 2")
    # The clip range [1 - eps_low, 1 + eps_high] must hold 1, and a ratio is never below 0.
    check(cfg.eps_low is None or 0 <= cfg.eps_low <= 1, f"--eps_low {cfg.eps_low}: must be in [0, 1]")
    check(cfg.eps_high is None or 0 <= cfg.eps_high < math.inf, f"--eps_high {cfg.eps_high}: must be >= 0 and finite")
    # The dual clip caps a negative-advantage token's loss at c|A|; at c <= 1 it cuts below clipped PPO.
    check(1 < cfg.dual_clip < math.inf, f"--dual_clip {cfg.dual_clip}: must be > 1 and finite")
    for name in ("adam_beta1", "adam_beta2"):
        check(0 <= getattr(cfg, name) < 1, f"--{name} {getattr(cfg, name)}: must be in [0, 1)")
    check(0 < cfg.top_p <= 1, f"--top_p {cfg.top_p}: must be in (0, 1]")
    check(1 <= cfg.passk_k <= (cfg.group_size if cfg.weighting == "passk" else 1 << 20),
          f"--passk_k {cfg.passk_k}: must be in [1, --group_size {cfg.group_size}]")
    check(0 <= cfg.wreinforce_lambda < math.inf,
          f"--wreinforce_lambda {cfg.wreinforce_lambda}: must be >= 0 and finite")
    check(0 <= cfg.unlikely_beta <= 1, f"--unlikely_beta {cfg.unlikely_beta}: must be in [0, 1]")
    # A cap below 1 would shrink every token's loss, the on-policy ones too (w = 1 when the engine agrees).
    check(cfg.tis_cap == 0 or 1 <= cfg.tis_cap <= 1e4, f"--tis_cap {cfg.tis_cap}: must be 0 (off) or in [1, 1e4]")
    check_task_flags(cfg, tasks)
    check(not tasks[cfg.task].partial or cfg.weighting in ("focal", "maxrl"), f"--weighting {cfg.weighting}: "
          f"needs rewards of 0 or 1, and --task {cfg.task}'s are partial (focal and maxrl take them)")
    check_flags_act(cfg)
    if cfg.plan:               # a plan needs the model's config.json and nothing else
        check(Path(cfg.model, "config.json").is_file(), f"--model {cfg.model}: --plan needs a folder "
              "with a config.json (e.g. ../shared/data/models/qwen2.5-7b)")
        check_engine_flags(cfg, "cpu" if cfg.device == "cpu" else "cuda")     # as memory_plan.plan reads it
        return
    check_inputs(cfg, tasks[cfg.task])
    check_out_dir(cfg.out_dir, "--out_dir", known=TRAIN_OUTPUTS)

def check_flags_act(cfg):
    """A flag set to a value that cannot act in this run is refused, never recorded in run.json as
    if it had acted (--ds_grpo true --gamma 1 trained exactly as --gamma 0)."""
    rival = cfg.weighting != "focal" and f"--weighting {cfg.weighting} weights each group by its own rule"
    idle = {"gamma": cfg.ds_grpo and "--ds_grpo true weights no advantage by (1 - mu_hat)^gamma" or rival,
            "norm_std": cfg.ds_grpo and "--ds_grpo true always divides by the population std" or rival,
            "weighting": cfg.ds_grpo and "--ds_grpo true replaces the weighting",
            "unlikely_beta": cfg.ds_grpo and "--ds_grpo true has a likelihood term of its own",
            "passk_k": cfg.weighting != "passk" and "only --weighting passk reads it",
            "wreinforce_lambda": cfg.weighting != "wreinforce" and "only --weighting wreinforce reads it",
            "tis_level": cfg.tis_cap == 0 and "only --tis_cap > 0 reads it",
            "dual_clip": cfg.loss == "cispo" and "--loss cispo has no dual clip (Eqs. 15-16)",
            "eval_every": cfg.eval_mazes == 0 and "--eval_mazes 0 evaluates nothing",
            "eval_samples": cfg.eval_mazes == 0 and "--eval_mazes 0 evaluates nothing",
            "nproc": not cfg.plan and "only --plan true reads it (a run uses its own world size)",
            "gpu_memory_gb": not cfg.plan and "only --plan true reads it (a run reads its device's)",
            "attention": (not cfg.padding_free or cfg.share_prompts)
            and "acts only on the padding-free row (--padding_free true, --share_prompts false)"}
    for name, why in idle.items():
        check(not why or getattr(cfg, name) == type(cfg).__dataclass_fields__[name].default,
              f"--{name} {getattr(cfg, name)}: {why}; leave it out")

def check_inputs(cfg, entry):
    """The model, tokenizer and the task's own inputs (entry.check) are what they claim, before any load."""
    check(cfg.model != "tiny" or cfg.tokenizer or entry.tokenizer, f"--tokenizer: --model tiny "
          f"has random weights and --task {cfg.task} brings no tokenizer of its own; pass a tokenizer folder, "
          "e.g. ../shared/data/tokenizers/qwen2.5")
    if cfg.model != "tiny":
        check_pretrained(cfg.model, "--model", tokenizer=not cfg.tokenizer)
    if cfg.tokenizer:
        check_pretrained(cfg.tokenizer, "--tokenizer", model=False)
    if entry.check:
        entry.check(cfg)

def check_task_flags(cfg, tasks):
    """A flag of another task (a row of `tasks` lists it) is refused unless default: the run would drop it."""
    reads, task_flags = tasks[cfg.task].flags, {name for entry in tasks.values() for name in entry.flags}
    for f in dataclasses.fields(cfg):
        check(f.name not in task_flags or f.name in reads or getattr(cfg, f.name) == f.default,
              f"--{f.name} {getattr(cfg, f.name)}: --task {cfg.task} ignores it (it reads "
              f"{' '.join('--' + n for n in reads) or 'no task flag'}); leave it out")

def check_environment(cfg, entry):
    """At start-up, exit 2 in one line naming the flag and the fix for a GPU this torch cannot see (or
    --attention varlen's kernel), a package beyond requirements.txt not installed (the task's, vLLM, wandb)
    or an engine flag the engine does not read. Not part of check_config: a Config must build where these
    are missing (bench/gpu_check.py builds one on a GPU image)."""
    device = device_type(cfg)
    try:
        check_device(cfg.device)
        if cfg.attention == "varlen" and device != "cuda":
            refuse(f"--attention varlen: needs CUDA (a flash kernel) and this run is on the {device}; leave it out")
        if cfg.attention == "varlen" and importlib.util.find_spec("torch.nn.attention.varlen") is None:
            refuse("--attention varlen: this torch has no torch.nn.attention.varlen (2.10 and later do); leave it out")
        vllm_fix = ("needs vLLM: pip install -r requirements-gpu.txt" if cfg.engine == "vllm" else
                    "uses vLLM on CUDA, which is not installed: pip install -r requirements-gpu.txt, or pass "
                    "--engine torch")
        needs = [*(entry.packages(cfg) if entry.packages else []),
                 ("vllm", engine_kind(cfg, device) == "vllm", f"--engine {cfg.engine}", vllm_fix),
                 ("wandb", cfg.wandb, "--wandb true", "needs wandb (optional, not in any requirements file): "
                  "pip install wandb")]
        for package, needed, flag, fix in needs:
            if needed and importlib.util.find_spec(package) is None:
                refuse(f"{flag}: {fix}")
        check_engine_flags(cfg, device)
    except ValueError as e:                # check_device's and check_engine_flags' one line
        refuse(e)

def check_engine_fits(cfg, engine, max_new_tokens, pad_id):
    """TorchEngine's --kv_cache_gb holds one group (N rows of a one-token prompt and max_new_tokens), or one line."""
    try:
        if hasattr(engine, "plan_chunks"):
            engine.plan_chunks([[pad_id]], cfg.group_size, max_new_tokens)
    except ValueError as e:
        dist.destroy_process_group()
        refuse(f"--kv_cache_gb {cfg.kv_cache_gb}: too small for one group of N = {cfg.group_size} rollouts ({e})")

def check_engine_flags(cfg, device):
    """Engine flags act on one engine only: elsewhere refused, never recorded in run.json as if they
    acted (nor planned for by --plan true, whose device is CUDA unless --device cpu)."""
    engine = engine_kind(cfg, device)
    acts = {"enforce_eager": ("vllm", "cuda"), "vllm_sleep_level": ("vllm", "cuda"),
            "gpu_memory_utilization": ("vllm", "cuda"), "kv_cache_gb": ("torch", None)}
    for name, (kind, on) in acts.items():
        value = getattr(cfg, name)
        check(value == type(cfg).__dataclass_fields__[name].default or (engine == kind and on in (None, device)),
              f"--{name} {value}: acts only on {'vLLM on CUDA' if on else 'TorchEngine (--engine torch)'}, and "
              f"this run samples with --engine {engine} on {device}; leave it out")
