"""
Problem aggregate (2 points): one micro-batch's share of the mini-batch loss, for each of
advantage.LOSS_AGG: token-mean (the paper's, App. B of arXiv 2602.06717), the original GRPO's mean
of sequence means (Eq. 14 as printed), and Dr. GRPO's sum over a constant S * L_max.

    python -m pytest -q assignments/tests/test_aggregate.py

token_mean is answered with the reference's stored outputs for the calls a correct aggregate makes
(conftest.LinearMemo), so a bug in Problem token_mean does not cost these points too.
"""
import pytest

import advantage
from grading import EXPECTED, LinearMemo, close, dec, grad_of

DATA = dec(EXPECTED["aggregate"])


@pytest.fixture(autouse=True)
def memo(monkeypatch):
    monkeypatch.setattr(advantage, "token_mean", LinearMemo(advantage.token_mean, DATA["token_mean"]))


def cases(mode):
    return [c for c in DATA["cases"] if c["loss_agg"] == mode]


def check(c):
    x = c["x"].clone().requires_grad_(True)
    out = advantage.aggregate(x, c["mask"].clone(), c["loss_agg"], **c["kwargs"])
    what = f"aggregate({c['loss_agg']}, {c['kwargs']})"
    close(out, c["out"], what)
    close(grad_of(out, x), c["grad"], f"d {what} / dx")


def test_token_mean():
    """sum x / T over every response token (rows of 6, 2, 5, 3 tokens: T = 16, or the given 30)."""
    for c in cases("token-mean"):
        check(c)


def test_seq_mean_token_mean():
    """The original GRPO: each sequence's own token mean, then the mean over S sequences (S = the
    batch's rows, or the given num_seqs). Short sequences weigh as much as long ones."""
    for c in cases("seq-mean-token-mean"):
        check(c)


def test_seq_mean_token_sum_norm():
    """Dr. GRPO: sum x / (S * L_max), a constant normaliser: L_max is the response budget (max_len, by
    default the width of x), not the number of tokens present."""
    for c in cases("seq-mean-token-sum-norm"):
        check(c)


@pytest.mark.parametrize("mode", advantage.LOSS_AGG)
def test_micro_batches_add_up_with_global_counts(mode):
    """train.py calls aggregate once per micro-batch with the counts of the WHOLE mini-batch
    (num_tokens, num_seqs, max_len) and sums the results: they must add up to the mini-batch loss."""
    whole = next(c for c in cases(mode) if c["kwargs"] == {})
    x, mask, k = DATA["split"]["x"], DATA["split"]["mask"], DATA["split"]["rows"]
    counts = dict(num_tokens=int(mask.sum()), num_seqs=mask.shape[0], max_len=mask.shape[1])
    parts = [advantage.aggregate(x[:k], mask[:k], mode, **counts), advantage.aggregate(x[k:], mask[k:], mode, **counts)]
    close(parts[0] + parts[1], whole["out"], f"{mode}: two micro-batches with global counts, summed")
