"""
Rollout throughput on the maze policy: rollout.TorchEngine vs plain `model.generate` on the same
model and batch, and, where vLLM is installed, rollout.VLLMEngine vs TorchEngine with the weight-sync
time of each.

    python bench/rollout_speed.py --model out/maze_sft --prompts 32 --n 8       # the trainer's maze batch
    python bench/rollout_speed.py --model out/maze_sft --vllm false             # without vLLM

All engines sample the same prompts at T = 1, top-p 1, no top-k (generate's default top_k = 50 is
switched off), stop at <eos>, and count the same thing: generated tokens up to and including the
stop token. One warm-up call each, then the best of --repeats timed calls. Weight sync is what
train.py times every step: the trainer's parameters gathered, bucketed and loaded into the engine,
prefix cache reset (rollout.sync_weights). Speed targets are benchmarks, not tests: the machine is
shared and noisy, so compare the ratios printed by one run.
"""
import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import maze  # noqa: E402
from fgrpo_utils.cli import check_min, check_pretrained, parse_config  # noqa: E402
from rollout import TorchEngine, VLLMEngine, sync_weights  # noqa: E402


@dataclass
class Config:
    model: str = "out/maze_sft"     # a maze SFT checkpoint (python maze.py)
    prompts: int = 32               # prompts per batch (train.py --prompts_per_step on one rank)
    n: int = 8                      # samples per prompt (--group_size)
    repeats: int = 3                # timed batches per engine (the fastest is reported)
    threads: int = 1                # 1 unless the machine is otherwise idle (OpenMP oversubscription)
    vllm: bool = True               # also time VLLMEngine (skipped with a note when vLLM is not installed)

    def __post_init__(self):
        check_min(self, 1, "prompts", "n", "repeats", "threads")
        check_pretrained(self.model, "--model")


def count_tokens(rows, eos):
    """Generated tokens up to and including the first eos of each row."""
    return sum(row.index(eos) + 1 if eos in row else len(row) for row in map(list, rows))


def best_time(fn, repeats):
    fn()                                                        # warm-up
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def main(cfg):
    torch.set_num_threads(cfg.threads)
    load = lambda: AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32).eval()
    size = maze.checkpoint_size(cfg.model)
    grids = maze.heldout_mazes(size, cfg.prompts)
    prompts = maze.encode(maze.build_tokenizer(), [maze.prompt_text(g) for g in grids])
    max_new = maze.max_new_tokens_for(size)
    model = load()
    engines = {"TorchEngine": TorchEngine(model, pad_token_id=maze.PAD, max_batch_size=cfg.prompts * cfg.n)}
    if cfg.vllm and importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed: timing TorchEngine and model.generate only")
    elif cfg.vllm:
        engines["VLLMEngine"] = VLLMEngine(cfg.model, dtype=torch.float32, seed=0, max_num_seqs=cfg.prompts * cfg.n)
    print(f"batch: {cfg.prompts} prompts x {cfg.n} samples, {size}x{size} mazes, prompt {len(prompts[0])} "
          f"tokens, max_new_tokens {max_new}, float32, {torch.get_num_threads()} threads")

    ids = torch.tensor(prompts)                                 # maze prompts share one length
    @torch.no_grad()
    def plain():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, max_new_tokens=max_new, num_return_sequences=cfg.n,
                             eos_token_id=maze.EOS, pad_token_id=maze.PAD)
        return count_tokens(out[:, ids.shape[1]:].tolist(), maze.EOS)

    t, tokens = best_time(plain, cfg.repeats)
    speed = {"model.generate": tokens / t}
    print(f"{'model.generate':14s} {tokens:6d} tokens in {t:6.2f}s = {tokens / t:8.0f} tok/s")
    trainer = load()                                            # the fp32 copy train.py would sync from
    for name, engine in engines.items():
        def rollout():
            r = engine.generate(prompts, cfg.n, seeds=list(range(cfg.prompts)), max_new_tokens=max_new,
                                stop_token_ids=[maze.EOS])
            return sum(len(ids) for ids in r.token_ids)

        def step_sync():                                        # as train.py: wake_up, then sync_weights
            engine.wake_up()
            return sync_weights(trainer, engine)

        t, tokens = best_time(rollout, cfg.repeats)
        speed[name] = tokens / t
        sync, _ = best_time(step_sync, cfg.repeats)
        print(f"{name:14s} {tokens:6d} tokens in {t:6.2f}s = {speed[name]:8.0f} tok/s | weight sync {sync:.3f}s")
    print(f"ratio TorchEngine / model.generate (tok/s): {speed['TorchEngine'] / speed['model.generate']:.2f}x")
    if "VLLMEngine" in speed:
        print(f"ratio VLLMEngine / TorchEngine (tok/s): {speed['VLLMEngine'] / speed['TorchEngine']:.2f}x")
        engines["VLLMEngine"].close()


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
