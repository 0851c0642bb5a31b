"""
The maze RL step timed end to end: `train.py --task maze` with RESULTS.md's maze flags (32 prompts x
N = 8, one mini-batch, --share_prompts true) in this tree and in a reference commit, in the same run,
from one or more starting points (--models: the SFT warm start, where most groups are mixed, and a
late GRPO checkpoint, where ~80% of groups carry no signal and --skip_dead_groups skips them).

    python bench/maze_step.py --models out/maze_sft,out/maze_long/N8_g0_s0/step_000300   # vs ace3d8d
    python bench/maze_step.py --models out/maze_sft --ref HEAD~5 --steps 6 --threads 1
    python bench/maze_step.py --models out/maze_sft --profile true       # where the time goes, this tree

The reference is a git worktree of --ref (made under a temp dir, removed after). Both trees run the
same flags for --steps steps, alternately, --repeats times each; the first step of every run (warm-up)
is dropped and the rest are read from metrics.jsonl. Both run the same flags, so they sample the
same rollouts from the same weights; the first timed step's reward must agree exactly and its
gradient norm to float rounding (printed: the update is the same, only cheaper). Printed per tree: seconds per step split into rollout and
update, response tokens per second, the update's GFLOP/s (6 x parameters x tokens through the model,
prompts included; attention's own FLOPs left out) beside a plain fp32 matmul's GFLOP/s measured in
this process with the same threads, and the ratio this tree / reference. --profile true instead
profiles one rollout and one update of this tree with torch.profiler, by kind of operation.
The machine is shared and noisy: read the ratios of one run, not absolute times across runs.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import maze  # noqa: E402
from fgrpo_utils.cli import check, check_min, check_pretrained, parse_config  # noqa: E402


@dataclass
class Config:
    models: str = "out/maze_sft"    # comma-separated maze checkpoints to start from (maze.py's, or a
                                    # train.py export of a maze run: it keeps sft.json)
    ref: str = "ace3d8d"            # the reference commit (main before --skip_dead_groups)
    steps: int = 4                  # RL steps per run; the first is warm-up and not counted
    repeats: int = 2                # runs per tree, alternating
    threads: int = 2                # torch threads of each run (runs never overlap)
    group_size: int = 8             # N
    prompts: int = 32               # prompts per step
    profile: bool = False           # profile one rollout and one update of this tree instead

    def __post_init__(self):
        check_min(self, 2, "steps", "group_size")
        check_min(self, 1, "repeats", "threads", "prompts")
        for model in self.models.split(","):
            check_pretrained(model, "--models")
            check((Path(model) / "sft.json").is_file(), f"--models {model}: not a maze checkpoint (no sft.json)")


def train_flags(cfg, model, out_dir):
    """RESULTS.md's maze RL flags, understood by the reference's train.py too."""
    return ["--task", "maze", "--model", str(Path(model).resolve()), "--device", "cpu", "--lr", "1e-4",
            "--prompts_per_step", str(cfg.prompts), "--mini_batch_prompts", str(cfg.prompts), "--warmup_steps", "0",
            "--group_size", str(cfg.group_size), "--micro_batch_size", "64", "--share_prompts", "true",
            "--steps", str(cfg.steps), "--save_every", "100000", "--eval_mazes", "0", "--sample_every", "0",
            "--threads", str(cfg.threads), "--out_dir", str(out_dir)]


def run_train(tree, cfg, model):
    """One train.py run in `tree` from `model`; its metrics per step after the first."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads), "TRANSFORMERS_VERBOSITY": "error",
               "HF_HUB_OFFLINE": "1"}
        r = subprocess.run([sys.executable, "train.py", *train_flags(cfg, model, Path(tmp) / "run")], cwd=tree,
                           env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"train.py failed in {tree}:\n{r.stderr[-3000:]}")
        return [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()][1:]


def matmul_gflops(threads, size=1024, repeats=20):
    """fp32 GFLOP/s of a plain (2 size) x size x size matmul: the machine's practical peak."""
    torch.set_num_threads(threads)
    a, b = torch.randn(2 * size, size), torch.randn(size, size)
    a @ b
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * 2 * size ** 3 * repeats / (time.perf_counter() - t0) / 1e9


def summarize(steps, params, prompt_tokens):
    """Median seconds per phase, response tokens/s, and the update's GFLOP/s."""
    med = {k: statistics.median(m[f"time/{k}"] for m in steps) for k in ("step", "rollout", "train")}
    tokens = statistics.median(m["tokens"] for m in steps)
    flops = 6 * params * (prompt_tokens + tokens)                     # forward + backward, prompts once per group
    return {**med, "tokens": tokens, "tok_per_s": statistics.median(m["tokens"] / m["time/step"] for m in steps),
            "update_gflops": flops / med["train"] / 1e9}


def profile(cfg):
    """torch.profiler over one rollout and one update of this tree, self time by kind of operation."""
    import random
    from torch.profiler import profile as torch_profile

    import rollout
    from advantage import group_advantages, policy_loss
    from fgrpo_utils import logprob
    from fgrpo_utils.policy import use_attention
    torch.set_num_threads(cfg.threads)
    tok = maze.build_tokenizer()
    path = cfg.models.split(",")[0]
    model = use_attention(maze.AutoModelForCausalLM.from_pretrained(path))
    engine = rollout.TorchEngine(maze.build_model().eval(), maze.PAD)
    engine.model.load_state_dict(model.state_dict())
    size = maze.checkpoint_size(path)
    grids = maze.train_mazes(size, cfg.prompts, random.Random(0))
    prompts = maze.encode(tok, [maze.prompt_text(g) for g in grids])
    kinds = {"matmul": ("mm", "addmm", "bmm", "matmul", "linear"), "attention": ("scaled_dot_product",),
             "copies": ("copy_", "cat", "index", "clone", "contiguous", "index_put", "scatter", "gather"),
             "elementwise": ("mul", "add", "silu", "pow", "rsqrt", "mean", "neg", "div", "sub", "exp", "where",
                             "masked_fill", "softmax", "log_softmax", "sum", "fill_", "zero_")}

    def by_kind(prof):
        total, out = 0.0, dict.fromkeys([*kinds, "other"], 0.0)
        for e in prof.key_averages():
            if e.key.startswith("aten::") or "Backward" in e.key:
                name = e.key.removeprefix("aten::")
                kind = next((k for k, names in kinds.items() if any(name.lstrip("_").startswith(x) for x in names)),
                            "other")
                out[kind] += e.self_cpu_time_total / 1e6
                total += e.self_cpu_time_total / 1e6
        return out, total

    def rollout_once():
        return engine.generate(prompts, cfg.group_size, list(range(cfg.prompts)), max_new_tokens=maze.max_new_tokens_for(size),
                               stop_token_ids=[maze.EOS])

    def update_once(r):
        rewards = torch.tensor([maze.maze_reward(grids[i], tok.convert_ids_to_tokens(c))
                                for i, c in zip(r.prompt_index, r.token_ids)]).view(cfg.prompts, -1)
        A = group_advantages(rewards).flatten()
        seqs = [prompts[i] for i in r.prompt_index]
        n_tok = torch.tensor(float(sum(len(c) for c in r.token_ids)))
        for s in range(0, len(seqs), 64):
            batch = logprob.pack(seqs[s:s + 64], r.token_ids[s:s + 64], maze.PAD, share_prompts=True)
            logp = logprob.token_logp(logprob.completion_logits(model, batch), batch)
            loss, _ = policy_loss(logp, logp.detach(), A[s:s + 64], batch["completion_mask"], num_tokens=n_tok)
            loss.backward()

    r = rollout_once()
    update_once(r)                                                              # warm-up
    for phase, fn in (("rollout", rollout_once), ("update", lambda: update_once(r))):
        with torch_profile() as prof:
            t0 = time.perf_counter()
            fn()
            wall = time.perf_counter() - t0
        parts, total = by_kind(prof)
        print(f"{phase}: {wall:.2f} s wall | " + " | ".join(f"{k} {100 * v / total:.0f}%" for k, v in parts.items()))


def main(cfg):
    if cfg.profile:
        return profile(cfg)
    params = sum(p.numel() for p in maze.build_model().parameters())
    models = cfg.models.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        ref_tree = Path(tmp) / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", str(ref_tree), cfg.ref], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            runs = {(m, name): [] for m in models for name in ("reference", "this tree")}
            for _ in range(cfg.repeats):
                for m in models:
                    runs[m, "reference"] += run_train(ref_tree, cfg, m)
                    runs[m, "this tree"] += run_train(ROOT, cfg, m)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(ref_tree)], cwd=ROOT, capture_output=True)
    peak = matmul_gflops(cfg.threads)
    print(f"maze RL step, {cfg.prompts} prompts x N = {cfg.group_size}, {cfg.threads} threads, "
          f"{cfg.repeats} x {cfg.steps - 1} timed steps per tree and start, reference {cfg.ref}")
    for m in models:
        prompt_tokens = cfg.prompts * maze.prompt_len(maze.checkpoint_size(m))
        res = {name: summarize(runs[m, name], params, prompt_tokens) for name in ("reference", "this tree")}
        new_steps, ref_steps = runs[m, "this tree"], runs[m, "reference"]
        dead = statistics.mean(s["groups/all_correct"] + s["groups/all_wrong"] for s in new_steps)
        print(f"\nfrom {m}: {100 * dead:.0f}% of groups without signal")
        print(f"{'':12s} {'step s':>7s} {'rollout s':>9s} {'update s':>8s} {'resp tok':>8s} {'tok/s':>7s} "
              f"{'update GFLOP/s':>14s} {'of matmul peak':>14s}")
        for name, r in res.items():
            print(f"{name:12s} {r['step']:7.2f} {r['rollout']:9.2f} {r['train']:8.2f} {r['tokens']:8.0f} "
                  f"{r['tok_per_s']:7.0f} {r['update_gflops']:14.1f} {100 * r['update_gflops'] / peak:13.0f}%")
        new, ref = res["this tree"], res["reference"]
        # the first timed step of the first run of each tree: same weights, same rollouts
        same_reward = new_steps[0]["reward/mean"] == ref_steps[0]["reward/mean"]
        gnorm = abs(new_steps[0]["grad_norm"] - ref_steps[0]["grad_norm"]) / max(ref_steps[0]["grad_norm"], 1e-12)
        print(f"ratio this tree / reference: response tok/s {new['tok_per_s'] / ref['tok_per_s']:.2f}x | "
              f"rollout {ref['rollout'] / new['rollout']:.2f}x faster | update {ref['train'] / new['train']:.2f}x "
              f"faster | first step: reward {'identical' if same_reward else 'DIFFERENT'}, grad norm rel. "
              f"difference {gnorm:.1e}")
    print(f"plain fp32 matmul: {peak:.1f} GFLOP/s")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
