"""
Write assignments/expected.json: seeded inputs and the reference advantage.py's outputs and gradients
for them, which the grading tests (assignments/tests/) compare a student's functions against.

    python assignments/make_expected.py                  # from the reference repo: rewrites expected.json
    python assignments/make_expected.py --check true     # only compare with the committed file (exit 1 if stale)

Run it against the reference only: it imports the advantage.py beside this folder and refuses a copy
whose graded functions are stubs. Everything is float64 (the float32 cases are labelled) and stored
as JSON lists, so the fixture does not depend on a torch version's random streams. The inputs are
chosen so that the plausible wrong versions differ from the reference by far more than the tests'
tolerance (tests/test_assignments.py plants each of them and checks that it loses its points).
"""
import argparse
import inspect
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import advantage as ref  # noqa: E402

OUT = Path(__file__).resolve().parent / "expected.json"
F64 = torch.float64


def enc(v):
    """JSON form of a value: tensors as {"tensor": nested list, "dtype": ...}, tuples as lists."""
    if isinstance(v, torch.Tensor):
        return {"tensor": v.detach().tolist(), "dtype": str(v.dtype).removeprefix("torch.")}
    if isinstance(v, (tuple, list)):
        return [enc(x) for x in v]
    if isinstance(v, dict):
        return {k: enc(x) for k, x in v.items()}
    return v


def bound(fn, args, kwargs):
    """The call's arguments by parameter name, defaults filled in: how the fakes match calls."""
    b = inspect.signature(fn).bind(*args, **kwargs)
    b.apply_defaults()
    return dict(b.arguments)


def recording(fn, log, transform=lambda args, out: out):
    """fn, also appending {"args": bound arguments, "out": result} of every call to log."""
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        log.append({"args": bound(fn, args, kwargs), "out": transform(args, out)})
        return out
    return wrapper


def lengths_mask(lengths, T):
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(F64)          # (B, T)


def token_mean_weights(mask, count):
    """d token_mean(x, mask, count) / dx: the (B, T) weights of the linear map, from the reference."""
    x = torch.zeros(mask.shape, dtype=F64, requires_grad=True)
    (w,) = torch.autograd.grad(ref.token_mean(x, mask, count), x)
    return w


# -----------------------------------------------------------------------------
# Inputs. Each comment says which wrong version the input is there to catch.

def reward_sets():
    g = torch.Generator().manual_seed(3)
    return {
        # N = 5: the unbiased std is sqrt(5/4) = 1.12 times the biased one; rows 3-4 are uniform.
        "binary_n5": torch.tensor([[1, 0, 0, 1, 1], [0, 0, 0, 0, 1], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0],
                                   [1, 1, 1, 1, 1], [1, 0, 1, 0, 0]], dtype=F64),
        # the N = 8 worked example that `python advantage.py` prints: X = 1 .. 7 correct.
        "paper_n8": (torch.arange(8)[None, :] < torch.arange(1, 8)[:, None]).to(F64),
        # Real-valued rewards: std + eps vs sqrt(var + eps) differ at eps = 0.5.
        "real_n4": torch.randn(3, 4, generator=g, dtype=F64) * 2,
        # Uniform groups whose float mean does not round back to the value: (R - mean) / (std + eps)
        # is then 1e-2 .. 1e-1, not 0, unless the code writes exact zeros. The last row is mixed.
        "uniform_f32": torch.tensor([[0.1] * 7, [0.7] * 7, [-1.3] * 7, [0.3] * 7,
                                     [0.1, 0.7, 0.1, 0.1, 0.7, 0.1, 0.1]], dtype=torch.float32),
        "uniform_f64": torch.tensor([[0.1] * 6, [0.7] * 6, [1.1] * 6, [0.2] * 6,
                                     [0.1, 1.1, 0.1, 0.2, 0.7, 0.1]], dtype=F64),
        # Rewards +1 / -1 (the simulation's levels), N = 6.
        "pm1_n6": torch.tensor([[1, -1, -1, 1, 1, 1], [-1, -1, -1, -1, -1, 1], [1, 1, 1, 1, 1, 1],
                                [-1, 1, -1, 1, -1, -1]], dtype=F64),
    }


def group_advantage_cases(R):
    cases = []
    for name in ("binary_n5", "paper_n8", "real_n4", "uniform_f32", "uniform_f64", "pm1_n6"):
        for kwargs in ({}, {"normalize_std": False}):
            cases.append({"name": name, "rewards": R[name], "kwargs": kwargs})
    cases.append({"name": "real_n4", "rewards": R["real_n4"], "kwargs": {"eps": 0.5}})
    for c in cases:
        c["out"] = ref.group_advantages(c["rewards"], **c["kwargs"])
    return cases


def success_rate_cases(R):
    cases = [{"rewards": R["binary_n5"], "kwargs": {}},
             {"rewards": R["paper_n8"], "kwargs": {}},
             {"rewards": R["pm1_n6"], "kwargs": {"r_correct": 1.0, "r_wrong": -1.0}},
             {"rewards": torch.tensor([[2., -3, -3, 2], [-3, -3, -3, 2]], dtype=F64),
              "kwargs": {"r_correct": 2.0, "r_wrong": -3.0}},
             {"rewards": torch.tensor([[0.5, 1, 0, 0.25]], dtype=F64), "kwargs": {}}]     # partial credit
    for c in cases:
        c["out"] = ref.success_rate(c["rewards"], **c["kwargs"])
    invalid = [{"rewards": [[1.5, 0.0, 1.0]], "kwargs": {}},                   # above R_c
               {"rewards": [[-0.1, 1.0, 0.0]], "kwargs": {}},                  # below R_w
               {"rewards": [[-1.0, 1.0, 0.0]], "kwargs": {"r_correct": 1.0, "r_wrong": 0.0}},
               {"rewards": [[math.nan, 1.0, 0.0]], "kwargs": {}},
               {"rewards": [[math.inf, 0.0, 1.0]], "kwargs": {}}]
    return {"cases": cases, "invalid": invalid}


def focal_weight_cases():
    # 1 + 1e-7: a success rate that rounded just past 1 (seven rewards of 0.1 do in float32).
    mu = torch.tensor([0.0, 0.125, 0.3, 0.5, 0.875, 1.0, 1.0 + 1e-7], dtype=F64)
    return [{"mu_hat": mu, "gamma": gm, "out": ref.focal_weight(mu, gm)} for gm in (0.0, 0.5, 1.0, 2.0, 3.7)]


def focal_advantage_cases(R):
    """Cases, and every call the reference makes to the functions focal_advantages builds on: the
    tests answer those calls with the reference's outputs, so a bug in Problems 1-3 does not cost
    Problem 4 too."""
    calls = {"success_rate": [], "focal_weight": [], "group_advantages": []}
    originals = {name: getattr(ref, name) for name in calls}
    for name in calls:
        setattr(ref, name, recording(originals[name], calls[name]))
    try:
        cases = [{"rewards": R["binary_n5"], "gamma": 0.5, "kwargs": {}},
                 {"rewards": R["binary_n5"], "gamma": 2.0, "kwargs": {"normalize_std": False}},
                 {"rewards": R["pm1_n6"], "gamma": 1.0, "kwargs": {"r_correct": 1.0, "r_wrong": -1.0}},
                 {"rewards": R["paper_n8"], "gamma": 0.0, "kwargs": {}},
                 {"rewards": R["paper_n8"], "gamma": 1.0, "kwargs": {}}]
        for c in cases:
            c["out"], c["g"] = ref.focal_advantages(c["rewards"], c["gamma"], **c["kwargs"])
    finally:
        for name, fn in originals.items():
            setattr(ref, name, fn)
    return {"cases": cases, "calls": calls}


def token_mean_cases():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 6, generator=g, dtype=F64)
    mask = lengths_mask([6, 1, 3, 4], 6)                 # uneven: mean of row means != token mean
    empty = torch.zeros(4, 6, dtype=F64)
    cases = [{"x": x, "mask": mask, "kwargs": {}},
             {"x": x, "mask": mask, "kwargs": {"num_tokens": 40}},          # a global count (40 > 14)
             {"x": x, "mask": mask, "kwargs": {"num_tokens": torch.tensor(40.0)}},
             {"x": x, "mask": empty, "kwargs": {}},                         # no tokens: 0, not NaN
             {"x": x, "mask": empty, "kwargs": {"num_tokens": 0}}]
    for c in cases:
        xx = c["x"].clone().requires_grad_(True)
        out = ref.token_mean(xx, c["mask"], **c["kwargs"])
        c["out"], (c["grad"],) = out, torch.autograd.grad(out, xx)
    return cases


def aggregate_cases():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, generator=g, dtype=F64)
    mask = lengths_mask([6, 2, 5, 3], 6)                 # 16 tokens, 4 sequences, width 6
    kw = [("token-mean", {}), ("token-mean", {"num_tokens": 30}),
          ("seq-mean-token-mean", {}), ("seq-mean-token-mean", {"num_seqs": 7}),
          ("seq-mean-token-sum-norm", {}), ("seq-mean-token-sum-norm", {"num_seqs": 7, "max_len": 10}),
          ("seq-mean-token-sum-norm", {"num_seqs": torch.tensor(7.0), "max_len": 10})]
    cases = []
    for mode, kwargs in kw:
        xx = x.clone().requires_grad_(True)
        out = ref.aggregate(xx, mask, mode, **kwargs)
        cases.append({"x": x, "mask": mask, "loss_agg": mode, "kwargs": kwargs, "out": out,
                      "grad": torch.autograd.grad(out, xx)[0]})
    # token_mean's answers for every (mask, count) a correct aggregate may ask for, whole or split in
    # two micro-batches (rows 0-1, 2-3): counts 16 (default), 30, and S * L_max for S in {4, 7}, L in {6, 10}.
    tm = [{"mask": m, "count": n, "W": token_mean_weights(m, n)}
          for m in (mask, mask[:2], mask[2:]) for n in (16, 30, 24, 40, 42, 70, int(m.sum()))]
    return {"cases": cases, "split": {"x": x, "mask": mask, "rows": 2}, "token_mean": tm}


def clip_bounds_cases():
    args = [("grpo", None, None), ("dapo", None, None), ("cispo", None, None), ("dapo", 0.1, None),
            ("grpo", None, 0.3), ("dapo", 0.0, 0.0), ("cispo", 0.5, 2.0)]   # 0.0: not "no override"
    return [{"args": list(a), "out": list(ref.clip_bounds(*a))} for a in args]


def policy_loss_batch():
    """logp, old_logp, mask, A, with tokens placed in every region of the clipped objective."""
    g = torch.Generator().manual_seed(6)
    B, T = 4, 5
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 3
    old = logp + torch.randn(B, T, generator=g, dtype=F64) * 0.3
    A = torch.tensor([1.3, -0.7, 0.4, -1.1], dtype=F64)
    old[1, 0] = logp[1, 0] - math.log(4.0)      # r = 4 > c = 3, A < 0: the dual clip caps it
    old[3, 1] = logp[3, 1] - 1.5                # r = 4.5, A < 0: dual clip again
    old[0, 2] = logp[0, 2] - 0.5                # r = 1.65 > 1 + eps_high, A > 0: clipped high
    old[2, 1] = logp[2, 1] + 0.5                # r = 0.61 < 1 - eps_low, A > 0: NOT clipped (min picks r A)
    old[1, 2] = logp[1, 2] + 0.6                # r = 0.55 < 1 - eps_low, A < 0: clipped low
    old[0, 3] = logp[0, 3] - 0.25               # r = 1.28 .. 1.2: inside DAPO's range, outside GRPO's
    mask = lengths_mask([5, 3, 4, 2], T)
    return logp, old, A, mask


def policy_loss_cases():
    logp, old, A, mask = policy_loss_batch()
    g = torch.Generator().manual_seed(7)
    W = torch.randn(logp.shape, generator=g, dtype=F64) * mask      # the fake aggregate's cotangent
    A_tok = torch.randn(logp.shape, generator=g, dtype=F64)
    out_old = old.clone()
    out_old[0, 0] = logp[0, 0] - 25.0           # log-ratio 25: clamped to 20 before exp
    out_old[1, 1] = logp[1, 1] + 30.0           # log-ratio -30: clamped to -20
    specs = [("grpo", old, A, {}), ("dapo", old, A, {}), ("cispo", old, A, {}),
             ("grpo", old, A, {"eps_low": 0.1, "eps_high": 0.3, "dual_clip": 2.0}),
             ("grpo", logp.clone(), A, {}),                                   # on-policy: r = 1
             ("dapo", old, A_tok, {}),                                        # per-token advantages
             ("cispo", out_old, A, {}),
             ("grpo", out_old, A, {"num_tokens": 30, "loss_agg": "seq-mean-token-mean", "num_seqs": 6,
                                   "max_len": 8}),
             ("dapo", old, A, {"num_tokens": torch.tensor(20.0)})]
    cases, clip_calls = [], []
    original_agg, original_clip = ref.aggregate, ref.clip_bounds
    ref.clip_bounds = recording(original_clip, clip_calls, lambda args, out: list(out))
    try:
        for loss_type, old_logp, adv, kwargs in specs:
            seen = []

            def spy(x, mask_, *args, **kw):
                seen.append({"x": x.detach().clone(), "args": bound(original_agg, (x, mask_, *args), kw)})
                return (x * W).sum()
            ref.aggregate = spy
            lp = logp.clone().requires_grad_(True)
            loss, diag = ref.policy_loss(lp, old_logp, adv, mask, loss_type, **kwargs)
            (grad,) = torch.autograd.grad(loss, lp)
            agg_args = {k: v for k, v in seen[0]["args"].items() if k not in ("x", "mask")}
            cases.append({"loss_type": loss_type, "logp": logp, "old_logp": old_logp, "advantages": adv,
                          "mask": mask, "kwargs": kwargs, "per_tok": seen[0]["x"], "loss": loss.detach(),
                          "grad": grad, "aggregate_args": agg_args, "diag": {k: float(v) for k, v in diag.items()}})
    finally:
        ref.aggregate, ref.clip_bounds = original_agg, original_clip
    tm = [{"mask": mask, "count": n, "W": token_mean_weights(mask, n)} for n in (int(mask.sum()), 30, 20)]
    return {"cases": cases, "cotangent": W, "clip_bounds": clip_calls, "token_mean": tm}


def kl_cases():
    g = torch.Generator().manual_seed(8)
    logp = -torch.rand(3, 5, generator=g, dtype=F64) * 3
    ref_logp = logp + torch.randn(3, 5, generator=g, dtype=F64)
    ref_logp[0, 0] = logp[0, 0] - 15.0          # d = -15: k3 = 14, clamped to 10
    ref_logp[1, 1] = logp[1, 1] + 2.5           # d = 2.5: the direction of d matters most here
    ref_logp[2, 2] = logp[2, 2] + 25.0          # d = 25: clamped to 20, then k3 to 10
    lp = logp.clone().requires_grad_(True)
    out = ref.kl_k3(lp, ref_logp)
    (grad,) = torch.autograd.grad(out.sum(), lp)
    return {"logp": logp, "ref_logp": ref_logp, "out": out, "grad": grad}


def tail_miss_cases():
    mu = torch.tensor([0.8, 0.5, 0.3, 0.2], dtype=F64)[:, None, None]
    rho = torch.tensor([0.01, 0.05, 0.1, 0.2], dtype=F64)[None, :, None]
    n = torch.tensor([1, 2, 5, 8, 15, 64, 512])[None, None, :]
    grid = {"mu_pos": mu.numpy(), "tau": (rho * mu).numpy(), "n": n.numpy()}
    out = ref.tail_miss_probability(**grid)                                          # (4, 4, 7)
    scalars = [(0.64, 6.3e-5, N) for N in (8, 1024, 8192, 32768, 131072)]            # Fig. 5's values
    argmax = [{"mu_pos": m, "rho": r, "out": list(ref.tail_miss_argmax(m, r * m))}    # Lemma 3.1's peaks
              for m in (0.8, 0.5, 0.3, 0.2) for r in (0.01, 0.05, 0.1, 0.2)]
    return {"grid": {k: v.tolist() for k, v in grid.items()}, "out": out.tolist(),
            "scalars": [{"args": list(a), "out": float(ref.tail_miss_probability(*a))} for a in scalars],
            "argmax": argmax}


def pass_at_k_cases():
    # (4, 1, 4): unbiased 1.0, biased 1 - (3/4)^4 = 0.68. (4096, 5, 2048): binomials past float range.
    args = [(10, 0, 5), (10, 10, 5), (10, 7, 4), (10, 3, 1), (4, 1, 4), (8, 2, 3), (1, 0, 1), (1, 1, 1),
            (1024, 1, 256), (1024, 3, 256), (1024, 10, 512), (1024, 100, 1000), (1024, 1023, 1),
            (4096, 5, 2048), (5000, 1, 4999)]
    tables = [(16, 1), (16, 4), (16, 16), (1024, 256)]
    return {"scalars": [{"args": list(a), "out": ref.pass_at_k(*a)} for a in args],
            "tables": [{"args": [n, k], "out": ref.pass_at_k_table(n, k).tolist()} for n, k in tables]}


def build():
    R = reward_sets()
    return enc({
        "about": "written by assignments/make_expected.py from the reference advantage.py; do not edit",
        "group_advantages": group_advantage_cases(R),
        "success_rate": success_rate_cases(R),
        "focal_weight": focal_weight_cases(),
        "focal_advantages": focal_advantage_cases(R),
        "rewards": R,
        "token_mean": token_mean_cases(),
        "aggregate": aggregate_cases(),
        "clip_bounds": clip_bounds_cases(),
        "policy_loss": policy_loss_cases(),
        "kl_k3": kl_cases(),
        "tail_miss": tail_miss_cases(),
        "pass_at_k": pass_at_k_cases(),
    })


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", default="false", choices=["true", "false"],
                   help="compare with the committed expected.json instead of writing it")
    check = p.parse_args().check == "true"
    if "NotImplementedError" in inspect.getsource(ref.group_advantages):
        print(f"error: {ref.__file__} is a student copy (stubbed); run this in the reference repo", file=sys.stderr)
        sys.exit(2)
    text = json.dumps(build(), separators=(",", ":")) + "\n"
    if check:
        same = OUT.exists() and OUT.read_text() == text        # byte for byte (NaN != NaN as JSON values)
        print(f"{OUT}: {'up to date' if same else 'STALE: rerun python assignments/make_expected.py'}")
        sys.exit(0 if same else 1)
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
