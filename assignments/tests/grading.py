"""
What the grading tests share: the reference's outputs and gradients stored in assignments/expected.json,
tolerant comparisons, and stand-ins for the functions a problem builds on. One test file per problem
of assignments/problems.py, run by assignments/grade.py (or plain pytest) with the graded copy first
on sys.path, so the `import advantage` of the tests is the student's file. Nothing here runs; import it.
"""
import inspect
import json
from pathlib import Path

import torch

EXPECTED_FILE = Path(__file__).resolve().parents[1] / "expected.json"
EXPECTED = json.loads(EXPECTED_FILE.read_text())


def dec(v):
    """expected.json's form back to Python: {"tensor": ..., "dtype": ...} becomes a tensor."""
    if isinstance(v, dict) and "tensor" in v:
        return torch.tensor(v["tensor"], dtype=getattr(torch, v["dtype"]))
    if isinstance(v, dict):
        return {k: dec(x) for k, x in v.items()}
    if isinstance(v, list):
        return [dec(x) for x in v]
    return v


def close(got, want, what="", atol=1e-7, rtol=1e-6):
    """assert got == want within tolerance, saying where and by how much they differ."""
    want = torch.as_tensor(want, dtype=torch.float64)
    assert got is not None, f"{what}: got None (missing return?)"
    got = torch.as_tensor(got).detach().to(torch.float64)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    ok = torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=False)
    if not ok.all():
        i = tuple(int(j) for j in (~ok).nonzero()[0]) if got.ndim else ()
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.numel()} values differ; at index {i}: "
                             f"got {got[i].item():.8g}, expected {want[i].item():.8g}")


def grad_of(out, x):
    """d out / d x, zeros where out does not depend on x (e.g. a constant 0 for an empty mask)."""
    out = torch.as_tensor(out)
    if not out.requires_grad:
        return torch.zeros_like(x)
    (g,) = torch.autograd.grad(out, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def same(a, b):
    """Does argument value a (from the student's call) equal stored value b? Tensors within 1e-12."""
    if isinstance(b, torch.Tensor):
        try:
            a = torch.as_tensor(a).detach().to(torch.float64)
        except (TypeError, ValueError, RuntimeError):
            return False
        return a.shape == b.shape and bool(torch.allclose(a, b.to(torch.float64), rtol=0, atol=1e-12))
    if b is None or isinstance(b, str):
        return a == b if a is not None else b is None
    if a is None or isinstance(a, str):
        return False
    return abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(b)))


# -----------------------------------------------------------------------------
# Stand-ins for the graded functions that the function under test calls. They keep each problem's
# points to itself: a bug in token_mean must not also cost aggregate and policy_loss. They hold
# stored OUTPUTS of the reference, never its code.

class Memo:
    """The reference's stored answer to each call a correct caller makes; any other call goes on to
    the student's own function (so a wrong call still gives a wrong result, and fails the test)."""

    def __init__(self, fn, calls):
        self.fn, self.sig, self.calls = fn, inspect.signature(fn), calls

    def __call__(self, *args, **kwargs):
        b = self.sig.bind(*args, **kwargs)
        b.apply_defaults()
        for c in self.calls:
            if all(same(b.arguments.get(k), v) for k, v in c["args"].items()):
                out = c["out"]
                return out.clone() if isinstance(out, torch.Tensor) else tuple(out)
        return self.fn(*args, **kwargs)


class LinearMemo:
    """token_mean(x, mask, num_tokens) for stored (mask, count) pairs: sum(x * W), W being the
    reference's gradient for that pair, so the result is differentiable in x. Other calls go on."""

    def __init__(self, fn, entries):
        self.fn, self.sig, self.entries = fn, inspect.signature(fn), entries

    def __call__(self, *args, **kwargs):
        b = self.sig.bind(*args, **kwargs)
        b.apply_defaults()
        x, mask, n = b.arguments["x"], b.arguments["mask"], b.arguments["num_tokens"]
        count = torch.as_tensor(mask).sum() if n is None else n
        for e in self.entries:
            if same(mask, e["mask"]) and same(count, e["count"]):
                W = e["W"]
                return (x * W.to(x.dtype if x.is_floating_point() else W.dtype)).sum()
        return self.fn(*args, **kwargs)


class Spy:
    """Records every call (arguments by name) and returns sum(x * W) for a stored cotangent W."""

    def __init__(self, fn, W):
        self.sig, self.W, self.calls = inspect.signature(fn), W, []

    def __call__(self, *args, **kwargs):
        b = self.sig.bind(*args, **kwargs)
        b.apply_defaults()
        self.calls.append(dict(b.arguments))
        x = b.arguments["x"]
        return (x * self.W.to(x.dtype)).sum()
