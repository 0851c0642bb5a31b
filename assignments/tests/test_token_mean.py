"""
Problem token_mean (1 point): sum(x * mask) / num_tokens, num_tokens = mask.sum() by default, and 0
(with gradient 0) when there are no tokens: the token-mean of App. B of arXiv 2602.06717.

    python -m pytest -q assignments/tests/test_token_mean.py
"""

import advantage
from grading import EXPECTED, close, dec, grad_of

CASES = dec(EXPECTED["token_mean"])


def check(c):
    x = c["x"].clone().requires_grad_(True)
    out = advantage.token_mean(x, c["mask"].clone(), **c["kwargs"])
    what = f"token_mean, {int(c['mask'].sum())} tokens, {c['kwargs']}"
    close(out, c["out"], what)
    close(grad_of(out, x), c["grad"], f"d {what} / dx")


def test_mean_over_tokens_not_over_sequences():
    """Rows of 6, 1, 3 and 4 tokens: the mean of the four row means weighs the 1-token row like the
    6-token one, and dividing by the padded size (24) counts padding. Only sum / 14 is right."""
    check(CASES[0])


def test_a_global_token_count_is_used_when_given():
    """num_tokens is the count of the WHOLE mini-batch (all micro-batches, all ranks), here 40 > 14:
    dividing by this micro-batch's own count instead is the bug of a mean of means."""
    check(CASES[1])
    check(CASES[2])                                  # the count as a tensor, as train.py passes it


def test_no_tokens_gives_zero_and_zero_gradient():
    """An all-padding micro-batch: 0 / 0 would be NaN, and one NaN gradient ruins the weights."""
    check(CASES[3])
    check(CASES[4])


def test_micro_batches_add_up_to_the_mini_batch_mean():
    """Split the rows into micro-batches, divide each by the global count: the sum is the token mean."""
    c = CASES[0]
    x, mask = c["x"], c["mask"]
    n = mask.sum()
    parts = [advantage.token_mean(x[i:i + 2], mask[i:i + 2], n) for i in (0, 2)]
    close(sum(parts), c["out"], "token_mean of two micro-batches with the global count, summed")
