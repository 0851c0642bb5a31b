"""
A toy task for train.py, written as the example to copy: reverse three digits.

    python train.py --task reverse --model tiny --device cpu --steps 2 --prompts_per_step 8 \\
        --mini_batch_prompts 8 --group_size 4 --warmup_steps 0 --lr 1e-3 --out_dir out/reverse  # seconds

Prompt `<bos> 3 1 4 =`, answer `4 1 3 <eos>`. The reward is the fraction of the answer's four tokens in place:
partial, in [0, 1], so even a random policy gets groups whose rewards differ (fgrpo_utils.task.Task: mu_hat, Eq. 11).

A new task is this file, copied (change VOCAB, prompt(i), score() and max_new_tokens), plus one row in
train.py's TASKS: README.md, "Add a task or change the weighting", step by step.
"""
import random

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from fgrpo_utils.task import Task
from rollout import mix_seed

VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>", "=", *"0123456789"]      # a token's id is its position
LENGTH = 3                                                             # digits to reverse

def build_tokenizer():
    """VOCAB as a Hugging Face tokenizer: whole words split on spaces; encoding adds no tokens."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")

def make_task(cfg, tokenizer, model_type):
    """--task reverse as a fgrpo_utils.task.Task. cfg is train.Config (this task reads only cfg.seed); model_type,
    the policy's config.model_type, matters only to math (its chat template)."""
    eos = tokenizer.eos_token_id

    def prompt(i):                   # keyed by (seed, i) alone: the same prompt on any rank or world size
        digits = [str(d) for d in random.Random(mix_seed(cfg.seed, i)).choices(range(10), k=LENGTH)]
        ids = tokenizer.encode(" ".join(["<bos>", *digits, "="]), add_special_tokens=False)
        return ids, tokenizer.convert_tokens_to_ids(digits[::-1]) + [eos]     # (prompt ids, answer ids)

    def score(answers, completions):     # one reward per completion, and counts logged as reward/NAME
        rewards = [sum(a == c for a, c in zip(answer, ids)) / len(answer) for answer, ids in zip(answers, completions)]
        return rewards, {"exact": sum(r == 1.0 for r in rewards)}

    return Task(prompt, score, stop_token_ids=[eos], max_new_tokens=LENGTH + 1,
                show=lambda ids: " ".join(tokenizer.convert_ids_to_tokens(ids)))
