"""
The course (assignments/): the student copy scores 0, the reference full points; each plausible
wrong version of a graded function loses the points of its problem (its neighbours are graded on
the reference's recorded answers), correct alternatives keep them; gaming attempts with the stubs
left in score at most 1 point; a broken or hanging import ends in a `total:` line.

    python -m pytest -q tests/test_assignments.py

This file is withheld from the student copy (assignments/problems.WITHHELD): the wrong versions
below are one edit away from the solutions.
"""
import ast
import copy
import errno
import functools
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "assignments"))
import advantage  # noqa: E402
import grade  # noqa: E402
import harness  # noqa: E402
import make_expected  # noqa: E402
import make_student_copy  # noqa: E402
from problems import GRADED_FILES, PROBLEMS, WITHHELD  # noqa: E402
import launch  # noqa: E402

POINTS = {pid: points for pid, points, _, _ in PROBLEMS}
FULL = sum(POINTS.values())
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}


def run(*args, cwd=ROOT):
    return launch.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, env=ENV)


# The grader's sandbox (bubblewrap). CI installs it and sets FGRPO_REQUIRE_SANDBOX=1, so there its
# absence fails; elsewhere the tests that need it skip, and the others grade with --no_sandbox true.
SANDBOX, NO_SANDBOX = grade.sandbox()
if SANDBOX is None and os.environ.get("FGRPO_REQUIRE_SANDBOX") == "1":
    raise RuntimeError(f"FGRPO_REQUIRE_SANDBOX=1 but no sandbox: {NO_SANDBOX}")
needs_sandbox = pytest.mark.skipif(SANDBOX is None, reason=f"no sandbox here: {NO_SANDBOX}")


def grade_dir(d, tmp, *flags):
    """grade.py's JSON report for folder d (it must end with a total line)."""
    out = Path(tmp) / f"{Path(d).name}.json"
    r = run(ROOT / "assignments" / "grade.py", d, "--json", out, "--seed", 5, *flags,
            *(() if SANDBOX else ("--no_sandbox", "true")))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("total: "), r.stdout
    return json.loads(out.read_text())


def reference_text():
    """advantage.py as committed: the student copy is built from HEAD too."""
    return subprocess.run(["git", "show", "HEAD:advantage.py"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    d = tmp_path_factory.mktemp("release") / "student"
    r = run(ROOT / "assignments" / "make_student_copy.py", d)
    assert r.returncode == 0, r.stderr                 # its own checks: parses, imports, no solution line
    return d


# -----------------------------------------------------------------------------
# Wrong versions, graded in this process on the public and one seed's hidden checks: (function,
# source of a wrong def, the problems it must lose). A correct alternative must lose nothing.

WRONG = {
    "biased_std": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards).double()
    adv = R - R.mean(1, keepdim=True)
    if normalize_std:
        adv = adv / (R.std(1, keepdim=True, correction=0) + eps)
    return adv.masked_fill((R == R[:, :1]).all(1, keepdim=True), 0.0)
""", {"group_advantages"}),
    "eps_inside_sqrt": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards).double()
    adv = R - R.mean(1, keepdim=True)
    if normalize_std:
        adv = adv / (R.var(1, keepdim=True) + eps).sqrt()
    return adv.masked_fill((R == R[:, :1]).all(1, keepdim=True), 0.0)
""", {"group_advantages"}),
    "uniform_not_zeroed": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards)
    R = R if R.is_floating_point() else R.double()
    adv = R - R.mean(1, keepdim=True)
    return adv / (R.std(1, keepdim=True) + eps) if normalize_std else adv
""", {"group_advantages", "focal_properties"}),
    "uniform_by_small_std": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards).double()
    adv = R - R.mean(1, keepdim=True)
    if normalize_std:
        adv = adv / (R.std(1, keepdim=True) + eps)
    return adv.masked_fill(R.std(1, keepdim=True) < 1e-6, 0.0)
""", {"group_advantages"}),
    "integer_rewards_kept": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards)
    adv = R - R.mean(1, keepdim=True)
    if normalize_std:
        adv = adv / (R.std(1, keepdim=True) + eps)
    return adv.masked_fill((R == R[:, :1]).all(1, keepdim=True), 0.0)
""", {"group_advantages"}),
    "rewards_changed_in_place": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards)
    R = R if R.is_floating_point() else R.double()
    uniform = (R == R[:, :1]).all(1, keepdim=True)
    std = R.std(1, keepdim=True)
    R -= R.mean(1, keepdim=True)
    return (R / (std + eps) if normalize_std else R).masked_fill(uniform, 0.0)
""", {"group_advantages", "focal_properties"}),        # Problem 5 runs the chain: the change shows there too
    "group_advantages_zeros": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards)
    return torch.zeros_like(R if R.is_floating_point() else R.double())
""", {"group_advantages", "focal_properties"}),
    "focal_advantages_constants": ("focal_advantages", """
def focal_advantages(rewards, gamma, r_correct=1.0, r_wrong=0.0, normalize_std=True):
    A = group_advantages(rewards, normalize_std)
    return A, torch.ones(A.shape[0], dtype=A.dtype)
""", {"focal_advantages", "focal_properties"}),
    "x_over_n_minus_1": ("success_rate", """
def success_rate(rewards, r_correct=1.0, r_wrong=0.0):
    R = torch.as_tensor(rewards).double()
    if r_correct <= r_wrong or not torch.isfinite(R).all() or ((R < r_wrong) | (R > r_correct)).any():
        raise ValueError("rewards outside the levels")
    return (R - r_wrong).sum(1) / (r_correct - r_wrong) / (R.shape[1] - 1)
""", {"success_rate", "focal_properties"}),        # Problem 5 runs the chain: a weight above 1
    "gamma_on_mu": ("focal_weight", """
def focal_weight(mu_hat, gamma):
    return mu_hat.clamp(min=0.0) ** gamma
""", {"focal_weight", "focal_properties"}),        # easier groups weigh more: Problem 5's order
    "no_clamp": ("focal_weight", """
def focal_weight(mu_hat, gamma):
    return (1 - mu_hat) ** gamma
""", {"focal_weight", "focal_properties"}),
    "inverse_sqrt_weighting": ("focal_weight", """
def focal_weight(mu_hat, gamma):
    return mu_hat ** (-gamma / 2)
""", {"focal_weight", "focal_properties"}),
    "weight_before_zscore": ("focal_advantages", """
def focal_advantages(rewards, gamma, r_correct=1.0, r_wrong=0.0, normalize_std=True):
    g = focal_weight(success_rate(rewards, r_correct, r_wrong), gamma)
    return group_advantages(g[:, None] * rewards, normalize_std), g
""", {"focal_advantages", "focal_properties"}),    # A is not g times the base: Eq. 13
    "token_mean_of_sequence_means": ("token_mean", """
def token_mean(x, mask, num_tokens=None):
    return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
""", {"token_mean"}),
    "token_mean_local_count": ("token_mean", """
def token_mean(x, mask, num_tokens=None):
    return (x * mask).sum() / mask.sum().clamp(min=1)
""", {"token_mean"}),
    "token_mean_nan_when_empty": ("token_mean", """
def token_mean(x, mask, num_tokens=None):
    return (x * mask).sum() / (mask.sum() if num_tokens is None else num_tokens)
""", {"token_mean"}),
    "aggregate_dr_grpo_longest_row": ("aggregate", """
def aggregate(x, mask, loss_agg="token-mean", num_tokens=None, num_seqs=None, max_len=None):
    mask = mask.to(x.dtype)
    S = mask.shape[0] if num_seqs is None else num_seqs
    if loss_agg == "token-mean":
        return token_mean(x, mask, num_tokens)
    if loss_agg == "seq-mean-token-mean":
        return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / S
    if loss_agg == "seq-mean-token-sum-norm":
        return (x * mask).sum() / (S * (mask.sum(-1).max() if max_len is None else max_len))
    raise ValueError(loss_agg)
""", {"aggregate"}),
    "aggregate_dr_grpo_counts_tokens": ("aggregate", """
def aggregate(x, mask, loss_agg="token-mean", num_tokens=None, num_seqs=None, max_len=None):
    mask = mask.to(x.dtype)
    S = mask.shape[0] if num_seqs is None else num_seqs
    if loss_agg == "seq-mean-token-mean":
        return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / S
    if loss_agg not in LOSS_AGG:
        raise ValueError(loss_agg)
    return token_mean(x, mask, num_tokens)
""", {"aggregate"}),
    "clip_bounds_swapped": ("clip_bounds", """
def clip_bounds(loss_type, eps_low=None, eps_high=None):
    d_low, d_high = CLIP_EPS[loss_type]
    return 1.0 - (d_high if eps_high is None else eps_high), 1.0 + (d_low if eps_low is None else eps_low)
""", {"clip_bounds"}),
    "clip_bounds_truthiness": ("clip_bounds", """
def clip_bounds(loss_type, eps_low=None, eps_high=None):
    if loss_type not in CLIP_EPS:
        raise ValueError(loss_type)
    d_low, d_high = CLIP_EPS[loss_type]
    return 1.0 - (eps_low or d_low), 1.0 + (eps_high or d_high)
""", {"clip_bounds"}),
    "kl_reversed": ("kl_k3", """
def kl_k3(logp, ref_logp):
    d = (logp - ref_logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)
""", {"kl_k3"}),
    "kl_changes_ref_logp": ("kl_k3", """
def kl_k3(logp, ref_logp):
    d = ref_logp.sub_(logp.detach()).clamp(-20.0, 20.0) + logp.detach() - logp
    return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)
""", {"kl_k3"}),
    "tail_miss_one_term_short": ("tail_miss_probability", """
def tail_miss_probability(mu_pos, tau, n):
    mu, tau, n = (np.asarray(x, dtype=np.float64) for x in (mu_pos, tau, n))
    return (1 - tau) ** n - (mu - tau) ** n
""", {"tail_miss"}),
    "pass_at_k_biased": ("pass_at_k", """
def pass_at_k(n, c, k):
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError("k")
    return 1.0 - (1.0 - c / n) ** k
""", {"pass_at_k"}),
    "pass_at_k_float_binomials": ("pass_at_k", """
def pass_at_k(n, c, k):
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError("k")
    return 1.0 - float(math.comb(n - c, k)) / float(math.comb(n, k))
""", {"pass_at_k"}),
    "pass_at_k_table_list": ("pass_at_k_table", """
def pass_at_k_table(n, k):
    if not 1 <= k <= n:
        raise ValueError("k")
    return [pass_at_k(n, c, k) for c in range(n + 1)]
""", {"pass_at_k"}),
    "pass_at_k_table_float_comb": ("pass_at_k_table", """
def pass_at_k_table(n, k):
    if not 1 <= k <= n:
        raise ValueError("k")
    return np.array([1.0 - float(math.comb(n - c, k)) / float(math.comb(n, k)) for c in range(n + 1)])
""", {"pass_at_k"}),
    # correct alternatives: nothing lost
    "pass_at_k_lgamma": ("pass_at_k", """
def pass_at_k(n, c, k):
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError("k")
    if n - c < k:
        return 1.0
    lc = lambda a, b: math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)
    return 1.0 - math.exp(lc(n - c, k) - lc(n, k))
""", set()),
    "pass_at_k_table_big_ints": ("pass_at_k_table", """
def pass_at_k_table(n, k):
    if not 1 <= k <= n:
        raise ValueError("k")
    from fractions import Fraction
    return np.array([float(1 - Fraction(math.comb(n - c, k), math.comb(n, k))) for c in range(n + 1)])
""", set()),
}

# policy_loss: the reference with one line changed, so each version has exactly one mistake.
POLICY_EDITS = {
    "log_ratio_as_ratio": ("ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))", "ratio = logp - old_logp"),
    "ratio_clamped_after_exp": ("ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))",
                                "ratio = torch.exp(logp - old_logp).clamp(math.exp(-20.0), math.exp(20.0))"),
    "cispo_without_stop_gradient": ("w = ratio.clamp(lo, hi).detach()", "w = ratio.clamp(lo, hi)"),
    "no_dual_clip": ("per_tok = torch.where(A < 0, torch.minimum(per_tok, -A * dual_clip), per_tok)", "pass"),
    "ratio_max_over_padding": ('diag["ratio/max"] = (ratio * mask).max() if mask.any() else ratio.new_zeros(())',
                               'diag["ratio/max"] = ratio.max()'),
    "ratio_max_no_empty_guard": ('diag["ratio/max"] = (ratio * mask).max() if mask.any() else ratio.new_zeros(())',
                                 'diag["ratio/max"] = ratio[mask.bool()].max()'),
}


# The other graded files: (file, a line of the reference, its wrong replacement, the problems it must lose)
FILE_EDITS = {
    "logp_from_log_of_softmax": ("fgrpo_utils/logprob.py", "logp = logits.log_softmax(-1).gather(", "logp = logits.softmax(-1).log().gather(",
                                 {"logprobs"}),
    "logp_not_masked": ("fgrpo_utils/logprob.py", 'return logp * batch["completion_mask"]', "return logp", {"logprobs"}),
    "entropy_in_float32": ("advantage.py", "logits = logits.to(torch.promote_types(logits.dtype, torch.float32))",
                           "logits = logits.float()", {"logprobs"}),
    "update_local_counts": ("train.py", "agg = dict(loss_agg=cfg.loss_agg, num_tokens=n_tok, num_seqs=n_seq,",
                            "agg = dict(loss_agg=cfg.loss_agg, num_tokens=None, num_seqs=None,", {"update"}),
    "update_live_counts": ("train.py", "for c in counts[:2])", "for c in counts[2:])", {"update"}),
    "update_without_world": ("train.py", "(loss * world).backward()", "(loss * 1.0).backward()", {"update"}),
    "update_ignores_old_logp": ("train.py", "logp) if mb and not on_policy else logp.detach()",
                                "logp) if False else logp.detach()", {"update"}),
    "update_entropy_sign": ("train.py", "loss = loss - cfg.entropy_coef * aggregate(H_tok, mask, **agg)",
                            "loss = loss + cfg.entropy_coef * aggregate(H_tok, mask, **agg)", {"update"}),
    "update_diagnostics_over_all_tokens": ("train.py", "diag_scale = counts[0] / max(counts[2], 1)", "diag_scale = 1.0",
                                           {"update"}),
    "update_pi_old_not_detached": ("train.py", "logp) if mb and not on_policy else logp.detach()",
                                     "logp) if mb and not on_policy else logp", {"update"}),
    "update_counts_not_summed_over_ranks": ("train.py", "counts = all_sum([sum(len(c) for c in completions), len(completions),",
                                            "counts = torch.tensor([sum(len(c) for c in completions), len(completions),",
                                            {"update"}),
    "update_empty_pass_weight_one": ("train.py", "(loss * 0.0).backward()", "(loss * world).backward()", {"update"}),
    "update_empty_pass_skipped": ("train.py", "    for _ in range(len(passes) - sum(map(bool, passes))):\n",
                                  "    for _ in range(0):\n", {"update"}),
    "update_metrics_of_this_rank": ("train.py", "out = dict(zip(sums, all_sum(list(sums.values())).tolist()))",
                                    "out = dict(sums)", {"update"}),
    "update_kl_detached": ("train.py", "kl = kl_k3(logp, ref_logp)", "kl = kl_k3(logp.detach(), ref_logp)", {"update"}),
    "update_kl_sign": ("train.py", "loss = loss + cfg.kl_coef * aggregate(kl, mask, **agg)",
                       "loss = loss - cfg.kl_coef * aggregate(kl, mask, **agg)", {"update"}),
    "update_kl_arguments_swapped": ("train.py", "kl = kl_k3(logp, ref_logp)", "kl = kl_k3(ref_logp, logp)", {"update"}),
    "update_kl_reference_at_T_1": ("train.py", "ref_logp, _ = policy_logp(ref_model, batch, cfg.temperature)",
                                   "ref_logp, _ = policy_logp(ref_model, batch, 1.0)", {"update"}),
    "update_entropy_always_token_mean": ("train.py", "loss = loss - cfg.entropy_coef * aggregate(H_tok, mask, **agg)",
                                         "loss = loss - cfg.entropy_coef * token_mean(H_tok, mask, n_tok)", {"update"}),
    "update_one_backward_at_the_end": ("train.py", [
        ("    sums, passes = {}, micro_batches(cfg, prompts, completions, keep)\n",
         "    sums, passes, total = {}, micro_batches(cfg, prompts, completions, keep), 0\n"),
        ("        (loss * world).backward()", "        total = total + loss * world  #"),
        ("        (loss * 0.0).backward()\n", "        total = total + loss * 0.0\n"),
        ('    ratio_max = sums.pop("ratio/max")\n', '    total.backward()\n    ratio_max = sums.pop("ratio/max")\n')], {"update"}),
    "update_kl_always_token_mean": ("train.py", "loss = loss + cfg.kl_coef * aggregate(kl, mask, **agg)",
                                    "loss = loss + cfg.kl_coef * token_mean(kl, mask, n_tok)", {"update"}),
    "update_entropy_over_this_ranks_tokens": ("train.py", "loss = loss - cfg.entropy_coef * aggregate(H_tok, mask, **agg)",
                                              "loss = loss - cfg.entropy_coef * aggregate(H_tok, mask, **{**agg, "
                                              "'num_tokens': torch.tensor(float(sum(map(len, completions))))})", {"update"}),
    "update_dr_grpo_L_from_the_config": ("train.py", "max_len=max_len or cfg.max_response_len", "max_len=cfg.max_response_len",
                                         {"update"}),
    "update_reference_forward_with_grad": ("train.py", "            with torch.no_grad():\n                ref_logp, _ =",
                                           "            if True:\n                ref_logp, _ =", {"update"}),
    "update_reference_graph_then_detached": ("train.py", [
        ("            with torch.no_grad():\n                ref_logp, _ =", "            if True:\n                ref_logp, _ ="),
        ("            kl = kl_k3(logp, ref_logp)", "            kl = kl_k3(logp, ref_logp.detach())")], {"update"}),
    "update_whole_logits": ("train.py", "logp, H_tok = policy_logp(model, batch, cfg.temperature, entropy=True)",
                            "from fgrpo_utils.logprob import completion_logits, token_logp; from advantage import "
                            "entropy_from_logits; z = completion_logits(model, batch, cfg.temperature); "
                            "logp, H_tok = token_logp(z, batch), entropy_from_logits(z) * batch['completion_mask']", {"update"}),
    "update_returned_log_probs_keep_their_graph": ("train.py", "return loss, diag, logp.detach().cpu()",
                                              "return loss, diag, logp.cpu()", {"update"}),
    # the same, behind a subclass whose requires_grad says False (harness.REQUIRES_GRAD reads the C descriptor)
    "update_returned_log_probs_keep_their_graph_behind_a_subclass": ("train.py", [
        ("import torch\n", "import torch\n\n\nclass _Blind(torch.Tensor):\n    requires_grad = property(lambda s: False)\n"),
        ("return loss, diag, logp.detach().cpu()",
         "return loss, diag, logp.cpu().as_subclass(_Blind) if world == 1 else logp.detach().cpu()")], {"update"}),
    "update_kl_metric_over_padding": ("train.py", 'diag["kl/k3"] = token_mean(kl.detach(), mask, n_tok)',
                                      'diag["kl/k3"] = kl.detach().mean() * len(mb) / n_seq', {"update"}),
    "update_entropy_metric_over_padding": ("train.py", 'diag["entropy"] = token_mean(H_tok.detach(), mask, n_tok) * diag_scale',
                                           'diag["entropy"] = H_tok.detach().mean() * len(mb) / n_seq * diag_scale', {"update"}),
    # a rank without live rows returns the right keys at once: the other rank waits in its collectives
    "update_rank_without_signal_returns_early": ("train.py", "    keep = live_rows(cfg, A)\n",
                                                 "    keep = live_rows(cfg, A)\n    if not keep:\n        return {k: 0.0 for k in "
                                                 "('clip/low', 'clip/high', 'clip/dual', 'ratio/mean', 'entropy', 'loss/pg', "
                                                 "'ratio/max', 'skip/live_frac')}, [None] * len(completions)\n", {"update"}),
    "update_no_metrics_without_signal": ("train.py", "    keep = live_rows(cfg, A)\n",
                                         "    keep = live_rows(cfg, A)\n    if not keep:\n        return {}, [None] * len(completions)\n",
                                         {"update"}),
}

# Whole wrong definitions in fgrpo_utils/logprob.py and maze.py: (file, function, source, the problems it must lose)
HEAD = "def head_logp(h, weight, bias, targets, temperature=1.0, entropy=False, chunk_bytes=CHUNK_BYTES):\n"
# maze_reward's reading of a completion, right: the start of the wrong versions that read it so
READ = """
def maze_reward(grid, completion, rule="strict"):
    if rule not in RULES:
        raise ValueError(rule)
    tokens = WORD.findall(completion) if isinstance(completion, str) else completion
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens) or "<eos>" not in tokens:
        return 0.0
    tokens = tokens[:tokens.index("<eos>")]
"""
FILE_WRONG = {
    "entropy_p_log_p": ("advantage.py", "entropy_from_logits", """
def entropy_from_logits(logits):
    p = logits.double().softmax(-1)
    return -(p * p.log()).sum(-1).to(torch.promote_types(logits.dtype, torch.float32))
""", {"logprobs"}),
    "head_without_temperature": ("fgrpo_utils/logprob.py", "head_logp", HEAD + """
    z = F.linear(h, weight, bias).to(torch.promote_types(h.dtype, torch.float32))
    from advantage import entropy_from_logits
    return z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1), entropy_from_logits(z) if entropy else None
""", {"logprobs"}),
    "head_temperature_after_log_softmax": ("fgrpo_utils/logprob.py", "head_logp", HEAD + """
    z = F.linear(h, weight, bias).to(torch.promote_types(h.dtype, torch.float32))
    from advantage import entropy_from_logits
    lp = z.log_softmax(-1) / temperature
    return lp.gather(-1, targets[:, None]).squeeze(-1), entropy_from_logits(z / temperature) if entropy else None
""", {"logprobs"}),
    "head_without_bias": ("fgrpo_utils/logprob.py", "head_logp", HEAD + """
    z = F.linear(h, weight).to(torch.promote_types(h.dtype, torch.float32)) / temperature
    from advantage import entropy_from_logits
    return z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1), entropy_from_logits(z) if entropy else None
""", {"logprobs"}),
    "head_entropy_always": ("fgrpo_utils/logprob.py", "head_logp", HEAD + """
    z = F.linear(h, weight, bias).to(torch.promote_types(h.dtype, torch.float32)) / temperature
    from advantage import entropy_from_logits
    return z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1), entropy_from_logits(z)
""", {"logprobs"}),
    "head_kept_in_bf16": ("fgrpo_utils/logprob.py", "head_logp", HEAD + """
    from advantage import entropy_from_logits
    z = F.linear(h, weight, bias) / temperature
    logp = z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    return logp, (entropy_from_logits(z).to(z.dtype) if entropy else None)
""", {"logprobs"}),
    "entropy_in_float64": ("advantage.py", "entropy_from_logits", """
def entropy_from_logits(logits):
    z = logits.double()
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
""", {"logprobs"}),
    "walk_ignores_other_words": ("maze.py", "maze_reward", READ + """    if rule == "strict":
        return float([t for t in tokens if t in MOVES or t == "DONE"] == solve(grid) + ["DONE"])
    return walk_reward(grid, [t for t in tokens if t in MOVES or t == "DONE"])
""", {"maze_reward"}),
    "walk_stops_reading_at_the_goal": ("maze.py", "maze_reward", READ + """    if rule == "strict":
        return float(tokens == solve(grid) + ["DONE"])
    if "DONE" not in tokens:
        return 0.0
    pos = find(grid, "S")
    for m in tokens[:tokens.index("DONE")]:
        if pos == find(grid, "G"):
            return 1.0
        if m not in MOVES:
            return 0.0
        pos = step(grid, pos, m)
        if pos is None:
            return 0.0
    return float(pos == find(grid, "G"))
""", {"maze_reward"}),
    "walk_refuses_a_bump_at_the_goal": ("maze.py", "maze_reward", READ + """    if rule == "strict":
        return float(tokens == solve(grid) + ["DONE"])
    if "DONE" not in tokens or any(m not in MOVES for m in tokens[:tokens.index("DONE")]):
        return 0.0
    pos, reached = find(grid, "S"), False
    for m in tokens[:tokens.index("DONE")]:
        pos = step(grid, pos, m)
        if pos is None:
            return 0.0
        reached = reached or pos == find(grid, "G")
    return float(reached)
""", {"maze_reward"}),
    "strict_without_eos": ("maze.py", "maze_reward", """
def maze_reward(grid, completion, rule="strict"):
    if rule not in RULES:
        raise ValueError(rule)
    tokens = WORD.findall(completion) if isinstance(completion, str) else list(completion or [])
    tokens = tokens[:tokens.index("<eos>")] if "<eos>" in tokens else tokens
    if rule == "strict":
        return float(tokens == solve(grid) + ["DONE"])
    return walk_reward(grid, tokens)
""", {"maze_reward"}),
    "strict_prefix_up_to_done": ("maze.py", "maze_reward", READ + """    if rule == "strict":
        return float("DONE" in tokens and tokens[:tokens.index("DONE") + 1] == solve(grid) + ["DONE"])
    return walk_reward(grid, tokens)
""", {"maze_reward"}),
    "walk_must_end_on_goal": ("maze.py", "maze_reward", READ + """    if rule == "strict":
        return float(tokens == solve(grid) + ["DONE"])
    if "DONE" not in tokens or any(m not in MOVES for m in tokens[:tokens.index("DONE")]):
        return 0.0
    pos = find(grid, "S")
    for m in tokens[:tokens.index("DONE")]:
        pos = step(grid, pos, m)
        if pos is None:
            return 0.0
    return float(pos == find(grid, "G"))
""", {"maze_reward"}),
}
# The walk rule, right, for the strict-rule mistakes above: the reference's maze_reward, renamed
def walk_text():
    ref = head_text("maze.py")
    node = make_student_copy.function_node(ast.parse(ref), "maze_reward")
    src = ast.get_source_segment(ref, node).replace("def maze_reward(", "def reference_reward(", 1)
    return "\n\n" + src + "\n\n\ndef walk_reward(grid, tokens):\n    return reference_reward(grid, tokens + ['<eos>'], 'walk')\n"


def head_text(rel):
    return subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def edited(name, rel, edits):
    """rel as committed with each (old, new) of edits made, each old found exactly once."""
    text = head_text(rel)
    for old, new in edits:
        assert text.count(old) == 1, f"{name}: {rel} no longer has the line {old!r}"
        text = text.replace(old, new)
    return text


def hand_in(d, rel, text):
    """Folder d as a hand-in: the committed graded files, with `text` as rel."""
    for f in GRADED_FILES:
        (d / f).parent.mkdir(parents=True, exist_ok=True)
        (d / f).write_text(text if f == rel else head_text(f))
    return d


@functools.cache
def wrong_texts():
    """{name: (module name, its wrong source)}, built once per process (HEAD does not change under a run)."""
    text = reference_text()
    out = {name: ("advantage", make_student_copy.replace_function(text, fn, src)) for name, (fn, src, _) in WRONG.items()}
    for name, (old, new) in POLICY_EDITS.items():
        assert text.count(old) == 1, f"{name}: the reference's policy_loss no longer has the line {old!r}"
        out[name] = ("advantage", text.replace(old, new))
    for name, (rel, *edits, _) in FILE_EDITS.items():
        out[name] = (rel.removesuffix(".py").replace("/", "."), edited(name, rel, edits[0] if len(edits) == 1 else [edits]))
    for name, (rel, fn, src, _) in FILE_WRONG.items():
        out[name] = (rel.removesuffix(".py").replace("/", "."), make_student_copy.replace_function(head_text(rel), fn, src)
                     + walk_text())
    return out


LOSES = {**{n: v[2] for n, v in WRONG.items()}, **{n: {"policy_loss"} for n in POLICY_EDITS},
         **{n: v[-1] for n, v in FILE_EDITS.items()}, **{n: v[3] for n, v in FILE_WRONG.items()}}
EDITED = {**{n: "policy_loss" for n in POLICY_EDITS}, **{n: v[1] for n, v in FILE_WRONG.items()},
          **{n: {"fgrpo_utils/logprob.py": "head_logp", "advantage.py": "entropy_from_logits", "train.py": "update_minibatch"}[v[0]]
             if "logp_" not in n else "token_logp" for n, v in FILE_EDITS.items()}}


def module_from(text, name="advantage"):
    mod = types.ModuleType(name)
    mod.__source__ = text                      # a check on several ranks builds the module again from it
    exec(compile(text, f"<{name}>", "exec"), mod.__dict__)
    return mod


@pytest.fixture(scope="module")
def graded_checks():
    """The public checks and one seed's hidden ones, answered by the reference."""
    checks, results = grade.public_checks()
    hidden = make_expected.checks(5)
    answers = make_expected.answer(hidden, harness.graded_modules())
    return {pid: checks[pid] + hidden[pid] for pid in checks}, {pid: results[pid] + answers[pid] for pid in checks}


CHAIN = {"group_advantages", "success_rate", "focal_weight", "focal_advantages"}     # what Problem 5 runs


def reach(fn, checks):
    """The problems whose checks can run function fn: its own, Problem 5 for the chain, and those
    that stand in for it (a correct caller gets the recorded answer, so only these can change)."""
    return {pid for pid, cs in checks.items() for c in cs if c["call"].endswith(f".{fn}")
            or (pid == "focal_properties" and fn in CHAIN)
            or any(fn in c.get(k, {}) for k in ("memo", "linear", "affine", "spy"))}


def lost_problems(mod, graded_checks, pids=None):
    """The problems mod (a graded module, maybe wrong) loses, the other graded modules the reference's, on
    the problems' own checks (the RL run, which charges problems by its own rule, is graded in a child)."""
    checks, want = graded_checks
    modules = {**harness.graded_modules(), mod.__name__: mod}
    lost = set()
    for pid in pids or (p for p in checks if p != harness.RL):
        got = []                            # in order, up to the first failure: a check reads only those before it
        for i, c in enumerate(checks[pid]):
            if c.get("peak"):               # measured by the kernel for a child of its own (grade.peak_rss)
                got.append({})
                continue
            got.append(harness.run_check(modules, c)[0])
            if grade.judge(c, want[pid][i], got[i], got, i):
                lost.add(pid)
                break
    return lost


@pytest.mark.parametrize("name", sorted(LOSES))
def test_each_wrong_version_loses_its_problem_only(graded_checks, name):
    fn = WRONG[name][0] if name in WRONG else EDITED[name]
    pids = reach(fn, graded_checks[0])
    assert LOSES[name] <= pids
    assert lost_problems(module_from(*reversed(wrong_texts()[name])), graded_checks, pids) == LOSES[name]


def test_the_reference_in_process_loses_nothing(graded_checks):
    assert lost_problems(advantage, graded_checks) == set()
    plain = module_from(make_student_copy.replace_function(head_text("fgrpo_utils/logprob.py"), "head_logp", PLAIN_HEAD),
                        "fgrpo_utils.logprob")
    assert lost_problems(plain, graded_checks, {"logprobs", "update"}) == set()      # the plain head is right


# Correct alternatives to the reference's bodies, which the docstrings allow: (file, [(line, replacement)],
# the problems whose checks run them). Each keeps every point.
CORRECT = {
    "logp_from_cross_entropy": ("fgrpo_utils/logprob.py", [(
        'logp = logits.log_softmax(-1).gather(-1, batch["targets"][..., None]).squeeze(-1)',
        'logp = -F.cross_entropy(logits.flatten(0, -2), batch["targets"].flatten(), reduction="none")'
        '.view(batch["targets"].shape)')], {"logprobs"}),
    "entropy_as_minus_p_log_p": ("advantage.py", [(
        "return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)",
        "return -(torch.softmax(logits, dim=-1) * torch.log_softmax(logits, dim=-1)).sum(dim=-1)")], {"logprobs"}),
    "update_zero_grad_first": ("train.py", [("    keep = live_rows(cfg, A)\n",
                                             "    model.zero_grad(set_to_none=True)\n    keep = live_rows(cfg, A)\n")],
                               {"update"}),
    "update_world_from_torch_distributed": ("train.py", [("(loss * world).backward()",
                                                          "(loss * dist.get_world_size()).backward()")], {"update"}),
    "update_reference_frozen_by_flag": ("train.py", [("            with torch.no_grad():\n                ref_logp, _ =",
                                                      "            if ref_model.requires_grad_(False):\n                ref_logp, _ =")],
                                        {"update"}),
    "update_reference_in_inference_mode": ("train.py", [(
        "            with torch.no_grad():\n                ref_logp, _ = policy_logp(ref_model, batch, cfg.temperature)\n",
        "            with torch.inference_mode():\n                ref_logp, _ = policy_logp(ref_model, batch, cfg.temperature)\n"
        "            ref_logp = ref_logp.clone()\n")], {"update"}),
    "update_kl_metric_without_the_mask": ("train.py", [('diag["kl/k3"] = token_mean(kl.detach(), mask, n_tok)',
                                                        'diag["kl/k3"] = kl.detach().sum() / n_tok')], {"update"}),
    "update_logp_returned_through_data": ("train.py", [("return loss, diag, logp.detach().cpu()",
                                                        "return loss, diag, logp.data.cpu().clone()")], {"update"}),
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_alternatives_keep_every_point(graded_checks, name):
    rel, edits, pids = CORRECT[name]
    text = edited(name, rel, edits)
    assert lost_problems(module_from(text, rel.removesuffix(".py").replace("/", ".")), graded_checks, pids) == set()


# -----------------------------------------------------------------------------
# grade.py end to end: a child process in a throwaway folder

def test_student_copy_scores_zero_and_reference_full(student, tmp_path):
    report = grade_dir(student, tmp_path)
    assert report["total"] == [0, FULL]
    assert all(p["passed"] == 0 and p["checks"] > 0 for p in report["problems"].values()), report["problems"]
    assert grade_dir(ROOT, tmp_path)["total"] == [FULL, FULL]


@pytest.mark.slow
def test_the_reference_grades_full_marks_beside_two_busy_loops(tmp_path):
    """A loaded machine (two CPU burners beside the grader on a 2-core machine) must not cost a hand-in a
    point, nor the grader its total: the suite once failed here on gloo's "Resource temporarily unavailable"
    in the 2-rank check."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        assert grade_dir(ROOT, tmp_path)["total"] == [FULL, FULL]
    finally:
        for b in burners:
            b.kill()
            b.wait()


def test_ranks_the_os_refuses_are_tried_again_then_the_graders_failure(monkeypatch):
    """harness.run_ranks: an OSError from the OS (EAGAIN: no process or thread for a rank) is tried again,
    a little later; once RANK_TRIES are spent the result is a GRADER_FAILURE error, which grade.py turns into
    "could not run" with exit 3 and no total, never a point lost."""
    import errno
    tries = []

    def flaky(modules, check, record):
        tries.append(1)
        if len(tries) < 3:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        return {"out": 1}, {}
    monkeypatch.setattr(harness, "ranks_once", flaky)
    monkeypatch.setattr("time.sleep", lambda s: None)                   # run_ranks waits 1, 2, 4 s between tries
    assert harness.run_ranks({}, {"ranks": 2}, False) == ({"out": 1}, {}) and len(tries) == 3
    tries.clear()
    monkeypatch.setattr(harness, "ranks_once", lambda *a: (_ for _ in ()).throw(OSError(errno.EAGAIN, "EAGAIN")))
    result, _ = harness.run_ranks({}, {"ranks": 2}, False)
    assert result["error"].startswith(harness.GRADER_FAILURE)

    failing = {pid: [{"error": f"{harness.GRADER_FAILURE}: rank 1 ended with no result"}] for pid, *_ in PROBLEMS}
    monkeypatch.setattr(grade, "run_child", lambda *a: (failing, {}))
    with pytest.raises(grade.GraderFailure):
        grade.grade_problems(ROOT, SimpleNamespace(seed=5), None)


ATTACKS = {
    # the reference's advantage.py looked for on the child's paths, arguments, cwd and environment
    "reference_on_paths": """
import os, sys, pathlib
_seen = set(sys.path) | {os.getcwd(), *sys.argv, *os.environ.values()}
for _p in list(_seen):
    for _q in [pathlib.Path(_p), *pathlib.Path(_p).parents]:
        _f = _q / "advantage.py"
        if _f.is_file() and "your code here" not in _f.read_text():
            exec(_f.read_text(), globals())
            break
""",
    # the grader's own command line (/proc/<parent>/cmdline) names the teacher's repository
    "grader_cmdline": """
import os, pathlib
for _pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        _args = open(f"/proc/{_pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    for _a in _args:
        for _q in [pathlib.Path(_a.decode(errors="ignore")), *pathlib.Path(_a.decode(errors="ignore")).parents]:
            _f = _q / "advantage.py"
            if _f.is_file() and "your code here" not in _f.read_text():
                exec(_f.read_text(), globals())
""",
    # public answers looked up by input, at every call and again at exit over whatever results files exist
    "lookup_and_atexit": """
import atexit, glob, json, torch
_data = json.load(open("assignments/expected.json"))
def _fake():
    for f in glob.glob(".grade/*/*.pt") + glob.glob("/tmp/**/*.pt", recursive=True):
        torch.save([{"out": {"kind": "float", "v": 0.5}, "mutated": False}] * 100, f)
atexit.register(_fake)
""",
    # a sitecustomize.py and a regenerated fixture in the hand-in (never taken: not graded files)
    "hand_in_extras": "",
    # whatever exits the child early
    "exit_at_import": "import os\nos._exit(0)\n",
}
# What outlives the grader or changes what it runs: a double-forked setsid process that, once the
# grader is done, writes a full score to every open stdout and over the --json file it finds; a .pth in
# the grading Python's site-packages (for the next student); an edit of every grade.py in reach.
ESCAPES = """
import os, site, glob, time, json, pathlib
for _d in site.getsitepackages():
    try:
        open(os.path.join(_d, "zz_fgrpo_attack.pth"), "w").write("import sys; sys.stdout.write('total: 24 / 24\\n')\\n")
    except OSError:
        pass
for _g in [g for r in ("/grade", "/tmp", "/work", "/root", "/home") for g in glob.glob(f"{r}/**/grade.py", recursive=True)]:
    try:
        open(_g, "a").write("\\nprint('total: 24 / 24')\\n")
    except OSError:
        pass
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(4)
        for _fd in glob.glob("/proc/*/fd/1") + glob.glob("/proc/*/fd/2"):
            try:
                open(_fd, "w").write("total: 24 / 24\\n")
            except OSError:
                pass
        for _c in glob.glob("/proc/*/cmdline"):
            try:
                for _a in open(_c, "rb").read().split(b"\\0"):
                    if _a.endswith(b".json") and os.path.exists(_a):
                        open(_a, "w").write(json.dumps({"total": [24, 24]}))
            except OSError:
                pass
        os._exit(0)
    os._exit(0)
"""


def attack_copy(student, tmp, name, code=None):
    d = tmp / name
    shutil.copytree(student, d)
    p = d / "advantage.py"
    p.write_text(p.read_text() + "\n" + (ATTACKS[name] if code is None else code))
    if name == "hand_in_extras":
        (d / "sitecustomize.py").write_text("import json\nprint('all passed')\n")
        (d / "assignments" / "expected.json").write_text(json.dumps({"checks": {}, "results": {}}))
    return d


@needs_sandbox
def test_gaming_attempts_score_at_most_one_point(student, tmp_path):
    with ThreadPoolExecutor(2) as pool:
        reports = dict(zip(ATTACKS, pool.map(lambda n: grade_dir(attack_copy(student, tmp_path, n), tmp_path),
                                             ATTACKS)))
    assert all(r["sandbox"] for r in reports.values()), "grading ran without its sandbox"
    assert {n: r["total"][0] for n, r in reports.items()} == {n: 0 for n in ATTACKS}


@needs_sandbox
def test_nothing_outlives_the_grader_or_reaches_its_files(student, tmp_path):
    """The child cannot see the grader's processes, files or Python: the last line and the --json file
    stay the grader's own, however long after it the attack's processes would have written."""
    site_dirs = [Path(d) for d in __import__("site").getsitepackages()]
    grade_py = (ROOT / "assignments" / "grade.py").read_bytes()
    d, report, log = attack_copy(student, tmp_path, "escapes", ESCAPES), tmp_path / "escapes.json", tmp_path / "log"
    with open(log, "w") as f:
        r = launch.run([sys.executable, ROOT / "assignments" / "grade.py", d, "--json", report, "--seed", "5"],
                       stdout=f, stderr=subprocess.STDOUT, env=ENV)
    time.sleep(6)                                       # the attack's processes would write at 4 s
    assert r.returncode == 0
    assert log.read_text().strip().splitlines()[-1] == f"total: 0 / {FULL}", log.read_text()[-500:]
    assert json.loads(report.read_text())["total"] == [0, FULL]
    assert not any((p / "zz_fgrpo_attack.pth").exists() for p in site_dirs)
    assert (ROOT / "assignments" / "grade.py").read_bytes() == grade_py


def test_syntax_error_raise_and_hang_at_import_end_in_a_total_line(student, tmp_path):
    """...and a graded function that prints forever: its output filled the grader's temporary folder,
    uncapped, and the grader died in torch.save with no total line; it is now read through a pipe and
    only its first 64 KiB kept, and the problem times out."""
    cases = {"syntax": "def broken(:\n", "raises": "raise RuntimeError('at import')\n",
             "hangs": "while True:\n    pass\n",
             "prints": "def group_advantages(*args, **kwargs):\n    while True:\n        print('x' * 4096)\n"}

    def one(item):
        name, code = item
        d = tmp_path / name
        shutil.copytree(student, d)
        p = d / "advantage.py"
        p.write_text(p.read_text() + code)
        # the hang waits out its timeout; the others import torch and transformers, slow on a busy machine.
        # The print loop times out in each of the 3 checks that call it: 4 s each (the copy's stubs fail fast)
        return name, grade_dir(d, tmp_path, "--import_timeout", 10 if name == "hangs" else 300, "--timeout", 4)
    with ThreadPoolExecutor(2) as pool:
        reports = dict(pool.map(one, cases.items()))
    for name, r in reports.items():
        assert r["total"] == [0, FULL], name
    assert "SyntaxError" in reports["syntax"]["problems"]["group_advantages"]["failed"][0]
    assert "RuntimeError: at import" in reports["raises"]["problems"]["pass_at_k"]["failed"][0]
    assert "took over 10" in reports["hangs"]["problems"]["pass_at_k"]["failed"][0]
    assert "timed out after 4" in reports["prints"]["problems"]["group_advantages"]["failed"][0]
    assert len(json.dumps(reports["prints"])) < 1 << 20


def test_json_over_a_users_file_is_refused(tmp_path):
    mine = tmp_path / "grades.json"
    mine.write_text("my notes")
    r = run(ROOT / "assignments" / "grade.py", ROOT, "--json", mine)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--json" in r.stderr, r.stderr
    assert mine.read_text() == "my notes"


# -----------------------------------------------------------------------------
# The student copy

# head_logp written the plain way, from the contract: the copy has no chunked head to call
PLAIN_HEAD = """
def head_logp(h, weight, bias, targets, temperature=1.0, entropy=False, chunk_bytes=CHUNK_BYTES):
    from advantage import entropy_from_logits
    z = F.linear(h, weight, bias).to(torch.promote_types(h.dtype, torch.float32)) / temperature
    logp = z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    return logp, entropy_from_logits(z) if entropy else None
"""


def solved_copy(student, tmp):
    """The student copy with every graded body written: the reference's, and PLAIN_HEAD."""
    d = tmp / "solved"
    shutil.copytree(student, d)
    for rel in GRADED_FILES:
        ref = subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        text = (d / rel).read_text()
        for _, name in make_student_copy.graded_in(rel):
            src = PLAIN_HEAD if name == "head_logp" else \
                ast.get_source_segment(ref, make_student_copy.function_node(ast.parse(ref), name))
            text = make_student_copy.replace_function(text, name, src)
        (d / rel).write_text(text)
    return d


def test_a_solved_copy_passes_its_own_tests_trains_and_scores_full(student, tmp_path):
    """Part I through one RL step: once solved, the copy's own public tests and docs tests pass,
    train.py runs a maze step on the student's functions (--skip_dead_groups false, so the update
    forwards the all-zero-reward groups of a random policy through head_logp and the loss), and the
    teacher's grading, hidden checks included, gives full marks to a plain head_logp."""
    d = solved_copy(student, tmp_path)
    r = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "assignments/tests", "tests/test_readme.py", "tests/test_budgets.py",
            cwd=d)
    assert r.returncode == 0, r.stdout[-3000:]
    r = run("train.py", "--task", "maze", "--model", "tiny", "--maze_size", "7", "--steps", "2", "--prompts_per_step",
            "2", "--mini_batch_prompts", "1", "--group_size", "4", "--eval_mazes", "4", "--skip_dead_groups", "false",
            "--out_dir", d / "run", cwd=d)
    assert r.returncode == 0 and "step 2/2" in r.stdout and " ent 0.000 " not in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert grade_dir(d, tmp_path)["total"] == [FULL, FULL]


def test_copy_holds_tracked_files_only_with_stubs_and_agents_md(student):
    agents = (student / "AGENTS.md").read_text()
    assert all(f"- `{name}` (Problem" in agents for name in make_student_copy.GRADED)
    for rel in WITHHELD:
        assert not (student / rel).exists(), rel
    assert not any((student / p).exists() for p in (".git", "out", "runs", ".venv"))
    copied = {str(p.relative_to(student)) for p in student.rglob("*") if p.is_file()}
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    assert copied - tracked == {"AGENTS.md", "assignments/release.json"}
    assert set(json.loads((student / "assignments" / "release.json").read_text())["files"]) == copied
    assert len(make_student_copy.solution_lines(reference_text())) > 20


def test_copy_leaves_out_what_the_graded_experiments_ask_for(student):
    """RESULTS.md's and README's numbers for E1 and E2 and their figures are not in the copy; the
    headings (link targets) are."""
    nums = lambda t: set(re.findall(r"\d+\.\d+", t))                         # noqa: E731
    for rel in {a[0] for a in make_student_copy.ANSWERS}:
        ref, copy = head_text(rel), (student / rel).read_text()
        passages = []
        for f, start, stop, _ in make_student_copy.ANSWERS:
            if f == rel:
                i = ref.index(start)
                passages.append(ref[i:ref.index(stop, i)])
        heads = [h.rstrip("\n") for p in passages for h in make_student_copy.headings(p.splitlines(keepends=True))]
        rest = ref
        for p in passages:
            rest = rest.replace(p, "")
        only_there = nums("".join(passages)) - nums(rest) - nums("".join(heads))
        assert len(only_there) >= 5 and not only_there & nums(copy), (rel, sorted(only_there & nums(copy))[:5])
        assert all(h in copy for h in heads)
    assert not any((student / f).exists() for f in WITHHELD if f.startswith("figures/"))


def test_copy_imports_and_fails_only_when_a_stub_is_called(student):
    r = run("-c", "import train, simulate, evaluate, maze, advantage\n"
                  "try:\n    advantage.group_advantages([[1.0, 0.0]])\nexcept NotImplementedError as e:\n"
                  "    print('stub:', e)", cwd=student)
    assert r.returncode == 0, r.stderr
    assert "stub: group_advantages: your code here" in r.stdout


@pytest.mark.parametrize("kind", ["file", "folder", "under_a_file", "a link to an empty folder"])
def test_make_student_copy_refuses_a_taken_or_impossible_dir(tmp_path, kind):
    """Refused before any work (a link was refused only after the whole copy was built), one line."""
    d = tmp_path / "taken"
    if kind == "a link to an empty folder":
        (tmp_path / "empty").mkdir()
        d.symlink_to(tmp_path / "empty")
    else:
        d.write_text("mine") if kind != "folder" else (d.mkdir(), (d / "notes.txt").write_text("mine"))
    target = d / "copy" if kind == "under_a_file" else d
    t0 = time.perf_counter()
    r = run(ROOT / "assignments" / "make_student_copy.py", target)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    if kind.startswith("a link"):
        assert "symbolic link" in r.stderr and time.perf_counter() - t0 < 5
        assert d.is_symlink() and not any((tmp_path / "empty").iterdir())
    else:
        assert (d / "notes.txt" if kind == "folder" else d).read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["taken"] + ["empty"] * kind.startswith("a link"))


def test_make_student_copy_removes_what_a_killed_run_left_and_only_that(tmp_path):
    ours, theirs = tmp_path / ".copy.tmp.k1ll3d00", tmp_path / ".copy.tmp.mynotes0"
    for d in (ours, theirs):
        d.mkdir()
        (d / "advantage.py").write_text("half a copy")
    (ours / make_student_copy.MARK).write_text("")
    r = run(ROOT / "assignments" / "make_student_copy.py", tmp_path / "copy")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".copy.tmp.mynotes0", "copy"]
    assert not (tmp_path / "copy" / make_student_copy.MARK).exists()


def test_make_student_copy_in_a_student_copy_is_one_line(student, tmp_path):
    r = run(student / "assignments" / "make_student_copy.py", tmp_path / "copy", cwd=student)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {student} is a student copy"), r.stderr
    assert not (tmp_path / "copy").exists()


def test_a_teacher_without_git_makes_the_same_copy_and_grades(student, tmp_path):
    """A release tarball or a code host's zip has no .git: make_student_copy and grade.py both ended
    in a `git ls-files` traceback. The tree's files (less what .gitignore leaves out: out/, a venv) give
    the copy made from HEAD, file for file; grade.py there grades."""
    tree = tmp_path / "unpacked"
    tree.mkdir()
    tar = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "xf", "-"], cwd=tree, input=tar, check=True)
    for junk in ("out/maze/ckpt.pt", ".venv/lib/site.py", "assignments/__pycache__/grade.cpython-311.pyc"):
        (tree / junk).parent.mkdir(parents=True, exist_ok=True)
        (tree / junk).write_text("not in the release")
    r = run(tree / "assignments" / "make_student_copy.py", tmp_path / "copy", cwd=tree)
    assert r.returncode == 0 and "no .git" in r.stdout, r.stderr
    files = lambda d: {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file()
                       and "__pycache__" not in p.parts}
    got, want = files(tmp_path / "copy"), files(student)
    assert set(got) == set(want)
    assert [f for f in got if got[f] != want[f]] == ["assignments/release.json"]
    r = run(tree / "assignments" / "grade.py", tmp_path / "copy", *(() if SANDBOX else ("--no_sandbox", "true")),
            cwd=tree)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("total: 0 / "), r.stdout[-2000:]


@pytest.mark.parametrize("where", ["mkdtemp", "write_bytes"])
def test_make_student_copy_leaves_nothing_when_the_disk_fails(tmp_path, monkeypatch, capsys, where):
    """A read-only mount fails at the temporary folder, a full disk in the middle of the copy: one
    line, exit 1 or 2, and nothing left that a rerun would refuse."""
    calls = []

    def fail(*args, **kwargs):
        calls.append(1)
        if where == "mkdtemp" or len(calls) > 20:
            raise OSError(errno.EROFS if where == "mkdtemp" else errno.ENOSPC,
                          "Read-only file system" if where == "mkdtemp" else "No space left on device")
        return real(*args, **kwargs)
    target = make_student_copy.tempfile if where == "mkdtemp" else Path
    real = getattr(target, where)
    monkeypatch.setattr(target, where, fail)
    monkeypatch.setattr(sys, "argv", ["make_student_copy.py", str(tmp_path / "copy")])
    with pytest.raises(SystemExit) as e:
        make_student_copy.main()
    assert e.value.code in (1, 2)
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_expected_fixture_matches_the_reference():
    """The committed fixture is what the reference computes here, up to the last bits that another
    CPU changes (it was written on one machine and graded on others)."""
    committed = json.loads((ROOT / "assignments" / "expected.json").read_text())
    assert make_expected.fixture_agrees(committed, json.loads(make_expected.public_text(harness.graded_modules())))


def test_fixture_comparison_forgives_rounding_not_changes():
    """make_expected.fixture_agrees: float32 results one ulp off (another CPU's summation order) agree; a
    float32 result off by 1e-4, a float64 one off by 1e-9, another dtype, a check with one input
    fewer or another tolerance do not; harness.same, which matches a stand-in's arguments, alike. The
    RL run's metrics (float32 through three updates: 1e-7 apart on two CPUs) agree within
    harness.RL_TOL, what grade.judge_rl forgives a hand-in, and not 1e-2 apart or a step fewer."""
    fixture = json.loads((ROOT / "assignments" / "expected.json").read_text())

    def agrees(edit):
        f = copy.deepcopy(fixture)
        edit(f)
        return make_expected.fixture_agrees(f, fixture)

    def scale(t, by):
        dtype = getattr(torch, t["dtype"])
        t["tensor"] = (torch.tensor(t["tensor"], dtype=dtype) * (1 + by)).to(dtype).tolist()
    f32 = lambda f: f["results"]["logprobs"][1]["out"]["v"]           # logprob.token_logp in float32
    f64 = lambda f: f["results"]["logprobs"][0]["out"]["v"]
    assert f32(fixture)["dtype"] == "float32" and f64(fixture)["dtype"] == "float64"
    assert agrees(lambda f: None)
    assert agrees(lambda f: scale(f32(f), 1.2e-7))
    assert not agrees(lambda f: scale(f32(f), 1e-4))
    assert not agrees(lambda f: scale(f64(f), 1e-9))
    assert not agrees(lambda f: f32(f).update(dtype="float64"))
    assert not agrees(lambda f: f["checks"]["group_advantages"][0]["args"][0]["tensor"].pop())
    assert not agrees(lambda f: f["checks"]["group_advantages"][0].update(atol=1e-6))
    rl = lambda f: f["results"][harness.RL][0]["steps"]
    assert len(rl(fixture)) >= 2 and rl(fixture)[1]["loss/pg"] != 0
    for by, same in [(1.2e-7, True), (1e-2, False)]:
        assert agrees(lambda f: rl(f)[1].update({"loss/pg": rl(f)[1]["loss/pg"] * (1 + by)})) is same
    assert not agrees(lambda f: rl(f).pop())
    assert not agrees(lambda f: rl(f)[0].update(task="maze"))
    x = torch.tensor([-4.133371353, 0.5])                  # harness.same matches a stand-in's arguments alike
    assert harness.same(x.nextafter(torch.tensor(-9.0)), x) and not harness.same(x * (1 + 1e-4), x)
    assert not harness.same(x.double() * (1 + 1e-9), x.double())


def test_the_handout_names_every_error_a_check_expects(graded_checks):
    """A check that expects an exception (the reference raises it) is one the handout announces, in its problem."""
    text = (ROOT / "assignments" / "HANDOUT.md").read_text()
    for i, (pid, _, _, _) in enumerate(PROBLEMS, 1):
        section = re.search(rf"### Problem {i} .*?(?=\n### |\n---)", text, re.S)[0]
        for r in graded_checks[1][pid]:
            if isinstance(r, dict) and "error" in r:
                assert f"`{r['error'].split(':')[0]}`" in section, (pid, r["error"])


def duration(seconds):
    """How HANDOUT.md writes a measured time: "47 s", "1 min 38 s"."""
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def test_handout_states_the_measured_figures():
    """The CPU tier's times and E3's reference numbers are bench/handout_cpu_tier.py's, measured in a
    student copy; the grading times bench/grade_class.py's (a class of ten, two at a time)."""
    text = (ROOT / "assignments" / "HANDOUT.md").read_text().replace("\n", " ")
    tier = json.loads((ROOT / "results" / "course" / "cpu_tier.json").read_text())
    t, e3 = tier["seconds"], tier["E3"]
    assert tier["machine"].endswith(" 2 cores")
    e3_time = t["E3 SFT"] + t["E3 runs"] + t["E3 comparison"]
    pm = lambda arm: " / ".join(f"{m} ± {sd}" for m, sd in e3[arm])          # noqa: E731
    tier_s = sum(v for k, v in t.items() if k[0] == "E")                    # the experiments, not the grading
    for figure in (f"CPU tier (required; about {round(tier_s / 60)} minutes on 2 cores)",
                   f"It took {duration(t['E1'])} on 2 cores.",
                   f"It took {duration(e3_time)} on 2 cores (the SFT {duration(t['E3 SFT'])}), plus "
                   f"{duration(t['E3 warm start evaluation'])} for the warm start's evaluation.",
                   "warm start " + " / ".join(map(str, e3["warm start"])) + " (pass@1 / 8 / 64), GRPO " + pm("GRPO")
                   + ", F-GRPO " + pm("F-GRPO"),
                   f"A correct hand-in takes about {round(t['grading a correct hand-in'])} s, and "
                   f"{duration(t['grading it with --runs (E1-E3)'])} with `--runs`"):
        assert figure in " ".join(text.split()), figure
    assert all(e["points"] == e["max"] for e in tier["checked"].values()), tier["checked"]   # its runs tie
    cls = json.loads((ROOT / "results" / "course" / "class_grading.json").read_text())
    assert cls["graded_wrong"] == 0 and cls["machine"].endswith(" 2 cores") and len(cls["hand_ins"]) == 10
    figure = f"ten hand-ins graded {cls['parallel']} at a time in {duration(cls['wall_s'])} on 2 cores"
    assert figure in " ".join(text.split()), figure


def test_handout_commands_use_flags_that_exist():
    """Every `python X.py --flag` / `torchrun ... X.py --flag` in HANDOUT.md names a Config field of X
    (or, for the argparse tools in assignments/, an option the tool defines)."""
    text = (ROOT / "assignments" / "HANDOUT.md").read_text().replace("\\\n", " ")
    cmds = re.findall(r"(?:python3?|torchrun[^`\n]*?)\s+((?:bench/|assignments/)?\w+\.py)([^`\n|;]*)", text)
    cmds += [("train.py", flags) for flags in re.findall(r'^CLASS="([^"]*)"', text, re.M)]    # the ablations' prefix
    assert len(cmds) > 15
    for script, rest in cmds:
        flags = [t[2:].split("=")[0] for t in shlex.split(rest.split("#")[0].replace("$", "X")) if t.startswith("--")]
        source = (ROOT / script).read_text()
        fields = set(re.findall(r"^    (\w+): [\w\[\], .|]+ = ", source.split("class Config", 1)[1], re.M)) \
            if "class Config" in source else set(re.findall(r'"--(\w+)"', source))
        for flag in flags:
            assert flag in fields, f"HANDOUT.md: {script} has no flag --{flag}"


def test_experiment_checks_on_synthetic_runs(tmp_path, monkeypatch):
    """grade.py --runs: synthetic run folders (the required flags, steps and evaluation, the hand-in's hashes)
    earn nothing, since no model ties them to a run (tests/test_runs_tied.py ties real ones); with the tie taken
    as given, a class run (E3) earns its points, and a NaN, a missing step or another --gamma loses them."""
    for rel in GRADED_FILES:                           # the hand-in's graded files, which the runs ran
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp_path / rel)
    code = {rel: grade.file_sha256(tmp_path / rel) for rel in GRADED_FILES}

    def write_run(d, gamma, seed, steps=80, nan=False):
        d.mkdir(parents=True)
        cfg = dict(grade.CLASS, gamma=gamma, seed=seed, steps=steps)
        (d / "run.json").write_text(json.dumps({"config": cfg, "world": 1, "code": code}))
        lines = [{"step": s, "reward/mean": 0.5, "loss/pg": float("nan") if nan and s == 7 else 0.1,
                  **({k: 0.3 for k in grade.PASSK} if s == steps else {})} for s in range(1, steps + 1)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    cls = tmp_path / "out" / "class"
    for g in ("0", "0.5"):
        for s in (0, 1):
            write_run(cls / f"g{g}_s{s}", float(g), s)
    (cls / "sft_eval.json").write_text(json.dumps({"config": {"model": "out/class/sft"}, "pending": [], "benchmarks": {
        "maze": {"n": 64, "rule": "strict", "c": [3] * 128, "pass@k": {"1": 0.05}}}}))
    rows = {r[0]: r for r in grade.grade_experiments(tmp_path)}
    assert rows["E3"][2:4] == (0.0, 3.0) and "no model at out/class/sft" in rows["E3"][4][0], rows["E3"][4]
    assert all("is no model folder" in w for w in rows["E3"][4][1:]), rows["E3"][4]
    monkeypatch.setattr(grade, "replayed", lambda *a: [])
    monkeypatch.setattr(grade, "tied_to_model", lambda *a, **k: [])
    rows = {r[0]: r for r in grade.grade_experiments(tmp_path)}
    assert rows["E3"][2:4] == (3.0, 3.0), rows["E3"][4]
    assert all(r[2] == 0 for k, r in rows.items() if k != "E3")
    shutil.rmtree(cls / "g0.5_s1")
    write_run(cls / "g0.5_s1", 0.5, 1, nan=True)
    assert any("NaN" in w for w in grade.check_run(tmp_path, "out/class/g0.5_s1", 80, **grade.CLASS))
    assert grade.check_run(tmp_path, "out/class/g0_s0", 100, **grade.CLASS)            # 80 of 100 steps
    assert grade.check_run(tmp_path, "out/class/g0_s0", 80, **dict(grade.CLASS, gamma=0.5))
    assert grade.check_eval(tmp_path, "out/class/sft_eval.json", "maze", 1024)
    # the runs must have run the graded files handed in: another advantage.py, or none recorded, loses
    (tmp_path / "advantage.py").write_text((ROOT / "advantage.py").read_text() + "\n# edited after the runs\n")
    assert any("ran another advantage.py" in w for w in grade.check_run(tmp_path, "out/class/g0_s0", 80, **grade.CLASS))
    (tmp_path / "advantage.py").write_bytes((ROOT / "advantage.py").read_bytes())
    info = json.loads((cls / "g0_s0" / "run.json").read_text())
    (cls / "g0_s0" / "run.json").write_text(json.dumps({k: v for k, v in info.items() if k != "code"}))
    assert any("records no hash" in w for w in grade.check_run(tmp_path, "out/class/g0_s0", 80, **grade.CLASS))
    (cls / "g0_s0" / "run.json").write_text(json.dumps(info))
    # E2 from a table that Problem 11's own code did not pass for: 0
    (tmp_path / "out" / "lemma.json").write_text(json.dumps(
        {f"{mu},{rho}": list(advantage.tail_miss_argmax(mu, rho * mu)) for mu in (0.8, 0.5, 0.3, 0.2)
         for rho in (0.01, 0.05, 0.1, 0.2)}))
    e2 = lambda passed: next(r for r in grade.grade_experiments(tmp_path, passed) if r[0] == "E2")   # noqa: E731
    assert e2({"tail_miss"})[2] == 1.0 and e2(set())[2] == 0.0
    # "pick two": of three ablations done, two count; the GPU and node tiers stay outside the total
    for g in ("0", "0.5"):
        for a, kw in (("nostd", dict(norm_std=False)), ("N4", dict(group_size=4)), ("N16", dict(group_size=16))):
            d = tmp_path / "out" / "ablate" / (f"{a}_g{g}")
            write_run(d, float(g), 0)
            info = json.loads((d / "run.json").read_text())
            (d / "run.json").write_text(json.dumps({**info, "config": {**info["config"], **kw}}))
    for a in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        d = tmp_path / "out" / "ablate" / f"agg_{a}"
        write_run(d, 0.0, 0)
        info = json.loads((d / "run.json").read_text())
        (d / "run.json").write_text(json.dumps({**info, "config": {**info["config"], "loss_agg": a}}))
    exp = grade.grade_experiments(tmp_path)
    assert [r[2] for r in exp if r[0] in ("A2", "A3", "A4")] == [1.0, 1.0, 1.0]
    counted, extra = grade.counted_experiments(exp)
    assert [r[0] for r in counted] == ["E1", "E2", "E3", "A2", "A3"] and sum(r[3] for r in counted) == 8
    assert [r[0] for r in extra] == ["G1", "G2", "T1"]


def test_compare_runs_says_no_se_with_one_run_per_arm(capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    import compare_runs
    compare_runs.compare("eval/strict/pass@1", [0.41], [0.43])
    out = capsys.readouterr().out
    assert "one run per arm: no SE" in out and "nan" not in out and "DIFFER" not in out, out


# -----------------------------------------------------------------------------
# pass@k against enumeration (moved here from test_evaluate.py: a brute-force pass@k would ship to students)

def brute_force_pass_at_k(n, c, k):
    """Fraction of the k-subsets of n samples (the first c correct) that contain a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                want = brute_force_pass_at_k(n, c, k)
                assert advantage.pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)
                assert advantage.pass_at_k_table(n, k)[c] == pytest.approx(want, abs=1e-12)


def test_pass_at_k_edge_cases():
    assert advantage.pass_at_k(10, 0, 5) == 0.0                       # c = 0
    assert advantage.pass_at_k(10, 10, 5) == 1.0                      # c = n
    assert advantage.pass_at_k(10, 7, 4) == 1.0                       # k > n - c
    assert advantage.pass_at_k(10, 3, 1) == pytest.approx(0.3)        # k = 1 is c / n
    # Large n stays exact: with one correct sample, pass@k = k / n.
    assert advantage.pass_at_k(1024, 1, 256) == pytest.approx(0.25, abs=1e-12)
    assert advantage.pass_at_k_table(1024, 256)[1] == pytest.approx(0.25, abs=1e-12)
    for bad in [(4, 1, 5), (4, 1, 0), (4, 5, 1)]:
        with pytest.raises(ValueError):
            advantage.pass_at_k(*bad)


def test_pass_at_k_is_not_bootstrap():
    """Drawing k of n WITH replacement estimates 1 - (1 - c/n)^k, which is biased low: with 1 correct
    of 4, best@4 is 0.68 where every 4-subset holds the correct sample (1.0). The enumeration test
    above must tell the two apart, or it would not catch a bootstrap implementation."""
    def bootstrap(n, c, k):
        return 1 - (1 - c / n) ** k
    assert bootstrap(4, 1, 4) == pytest.approx(0.68359375)
    assert advantage.pass_at_k(4, 1, 4) == brute_force_pass_at_k(4, 1, 4) == 1.0
    assert any(abs(bootstrap(n, c, k) - brute_force_pass_at_k(n, c, k)) > 0.05
               for n in range(2, 7) for c in range(1, n) for k in range(2, n + 1))


def test_every_hidden_seed_builds_its_checks():
    """The maze-reward builder once took the first move from S that hits a wall, and a maze whose S has
    none raised StopIteration: 2 of 60 gradings printed no total. Any seed must build every check."""
    for seed in range(500):
        checks = make_expected.checks(seed)
        assert set(checks) == set(POINTS) | {harness.RL} and all(checks[pid] for pid in POINTS), seed


def test_the_teachers_grading_without_a_sandbox_is_refused_unless_asked(tmp_path, student):
    """No bwrap on PATH: the teacher's repository refuses in one line (the reference and other students'
    grades would be in the graded code's reach); a student copy grades its own code with a note."""
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {**ENV, "PATH": str(bare)}
    r = launch.run([sys.executable, ROOT / "assignments" / "grade.py", student], capture_output=True, text=True,
                   env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--no_sandbox true" in r.stderr, r.stderr
    r = launch.run([sys.executable, "assignments/grade.py", "--budget", "1"], cwd=student, capture_output=True,
                   text=True, env=env)
    assert r.returncode == 0 and r.stdout.startswith("note: no sandbox") and r.stdout.strip().endswith(f"/ {FULL}"), \
        r.stdout[-500:] + r.stderr[-500:]


def test_a_python_under_tmp_is_seen_inside_the_sandbox(monkeypatch):
    """CI's virtual environment lives in a clone under /tmp: the sandbox's own /tmp (a tmpfs) must be laid
    down before the Python's folders are bound, or it hides them and the child cannot start."""
    monkeypatch.setattr(grade, "python_dirs", lambda: ["/tmp/clone/.venv-ci", "/usr"])
    argv = grade.child_argv(Path("/tmp/hand-in"), 3, "/usr/bin/bwrap")[0]
    assert argv.index("--tmpfs") < argv.index("/tmp/clone/.venv-ci")
