"""
Benchmark: the update with and without padding, side by side in one run, on the CPU. The same
mini-batch of whole groups goes through train.update_minibatch twice per repeat, alternately:
--padding_free false (a row per sequence: prompts left-padded, completions right-padded, a 4-D mask)
and true (each micro-batch one row end to end, each sequence attending to itself only).

    python bench/padding_free.py --threads 1         # ~5 min on one core
    python bench/padding_free.py --repeats 1         # ~2-3 min

The length mix is a math step's, scaled to a CPU: the prompts are DeepScaleR's own (tokenized with
Qwen2.5's chat template, data/train/deepscaler_partial.jsonl), the completions --max_response_len at
most, drawn per group around a difficulty (a log-normal around a group median of 15-60% of the budget,
one in eight at the budget: truncated). Micro-batches are train.micro_batches' with the flags below.
Printed: real and padded tokens per layout, seconds per update (median of --repeats), the ratio, and
the largest gradient difference between the layouts (float32: rounding only).
"""
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import reward  # noqa: E402
import train  # noqa: E402
from fgrpo_utils import policy  # noqa: E402
from fgrpo_utils.cli import check_min, data_dir, parse_config  # noqa: E402


VOCAB = 1024


@dataclass
class Config:
    groups: int = 8                   # prompts in the mini-batch, each with --group_size completions
    group_size: int = 8
    max_response_len: int = 1024      # the completion budget (the paper's 8,192, scaled to a CPU)
    micro_batch_size: int = 8         # train.py's flags for cutting micro-batches
    micro_batch_tokens: int = 8192
    layers: int = 4                   # the model: a Qwen2 with grouped-query attention, random weights
    hidden: int = 256
    repeats: int = 3                  # timed updates per layout, alternating; the median is printed
    threads: int = 0                  # torch threads, 0 = its default
    seed: int = 0

    def __post_init__(self):
        check_min(self, 1, "groups", "group_size", "max_response_len", "micro_batch_size", "layers", "hidden",
                  "repeats")
        check_min(self, 0, "micro_batch_tokens", "threads", "seed")


def length_mix(cfg, rng):
    """(prompts, completions) token lists: DeepScaleR prompts, completions per group around a difficulty."""
    tok = reward.load_tokenizer(str(data_dir() / "tokenizers" / "qwen2.5"))
    rows = rng.sample(reward.load_jsonl(data_dir() / "train" / "deepscaler_partial.jsonl"), cfg.groups)
    prompts, completions = [], []
    for r in rows:
        ids = tok(reward.format_prompt(tok, r["problem"], "qwen"), add_special_tokens=False)["input_ids"]
        median = cfg.max_response_len * rng.uniform(0.15, 0.6)
        for _ in range(cfg.group_size):
            n = cfg.max_response_len if rng.random() < 1 / 8 else int(median * rng.lognormvariate(0, 0.5))
            prompts.append([t % VOCAB for t in ids])          # the real lengths; ids within the toy vocabulary
            completions.append([rng.randrange(10, VOCAB) for _ in range(max(1, min(n, cfg.max_response_len)))])
    return prompts, completions


def main(cfg):
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rng = random.Random(cfg.seed)
    prompts, completions = length_mix(cfg, rng)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        torch.manual_seed(cfg.seed)
        model = policy.shard(policy.use_attention(Qwen2ForCausalLM(Qwen2Config(
            vocab_size=VOCAB, hidden_size=cfg.hidden, intermediate_size=4 * cfg.hidden, num_hidden_layers=cfg.layers,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096))), torch.device("cpu"))
        A = torch.randn(len(completions), generator=torch.Generator().manual_seed(cfg.seed))
        base = {f.name: f.default for f in fields(train.Config)}
        layouts = {}
        for pf in (False, True):
            c = SimpleNamespace(**{**base, **{k: getattr(cfg, k) for k in ("group_size", "micro_batch_size",
                                                                          "micro_batch_tokens", "max_response_len")},
                                   "padding_free": pf, "loss": "grpo"})
            mbs = train.micro_batches(c, prompts, completions)
            real = sum(len(prompts[i]) + len(completions[i]) for mb in mbs for i in mb)
            padded = real if pf else sum(len(mb) * (max(len(prompts[i]) for i in mb) + max(len(completions[i])
                                                                                         for i in mb)) for mb in mbs)
            layouts[pf] = dict(cfg=c, passes=len(mbs), real=real, padded=padded, times=[])

        def update(pf):
            model.zero_grad(set_to_none=True)
            t = time.perf_counter()
            train.update_minibatch(model, None, prompts, completions, A, None, cfg=layouts[pf]["cfg"],
                                   pad_id=0, device=torch.device("cpu"), world=1)
            layouts[pf]["times"].append(time.perf_counter() - t)
            return {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}

        update(False), update(True)                                 # warm-up: first-call costs, not timed
        for lay in layouts.values():
            lay["times"].clear()
        for _ in range(cfg.repeats):
            g_padded, g_free = update(False), update(True)
        diff = max(float((g_padded[n] - g_free[n]).abs().max() / g_padded[n].abs().max().clamp(min=1e-30))
                   for n in g_padded)
        dist.destroy_process_group()
    print(f"{len(completions)} sequences ({cfg.groups} groups x {cfg.group_size}): prompts "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, completions "
          f"{min(map(len, completions))}-{max(map(len, completions))} (budget {cfg.max_response_len}); "
          f"micro-batches of <= {cfg.micro_batch_size} sequences, <= {cfg.micro_batch_tokens} tokens")
    for pf, lay in layouts.items():
        name = "padding-free" if pf else "padded"
        print(f"{name:>13}: {lay['passes']} passes, {lay['real']:,} real tokens, {lay['padded']:,} in the rows "
              f"({1 - lay['real'] / lay['padded']:.1%} padding), update {statistics.median(lay['times']):.2f} s "
              f"(median of {cfg.repeats})")
    t0, t1 = (statistics.median(layouts[pf]["times"]) for pf in (False, True))
    removed = layouts[False]["padded"] - layouts[True]["padded"]
    print(f"padding-free removes {removed:,} padded tokens ({removed / layouts[False]['padded']:.1%}); update time "
          f"padding-free / padded = {t1 / t0:.2f}; largest relative gradient difference {diff:.1e}")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
