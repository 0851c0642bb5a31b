"""
Grade a student's folder: the implementation problems (assignments/problems.py) by running the
student's graded functions in a child process and comparing what they return with the reference's
answers here, and, given --runs, the machine-checkable part of the experiment problems of
assignments/HANDOUT.md from the files the runs wrote.

    python assignments/grade.py                          # this repository (the reference: full points)
    python assignments/grade.py SUBMISSION               # a student's folder, whole or just its graded files
    python assignments/grade.py SUBMISSION --runs SUBMISSION --json grades/alice.json

How: only the graded files (problems.GRADED_FILES) are taken from SUBMISSION, into a throwaway folder
that holds the student release (make_student_copy.py, from this repository's HEAD; in a student copy, the
files it shipped with). A child process runs there in a sandbox (bubblewrap: its own PID namespace, no
network, the Python and the system read-only, no other file of this machine in sight), imports them and
runs each check's call (assignments/harness.py); it sends back what the calls returned through a pipe and
decides nothing. This process compares those results with the reference's, and prints its last line only
once every process of the sandbox is gone, so nothing the child does at import, at exit or to its files
changes a score. What the update holds is read from outside: the kernel's count of peak memory for a
child that runs that check alone, beside one that only builds its inputs and, in the teacher's
repository, one that runs the reference's update (peak_rss). Each problem has a known number of checks: a
missing result counts as failed, and a problem scores its points only when every check passes. In the
teacher's repository the checks are the public ones (expected.json, shipped to students) plus hidden ones
drawn from --seed (a new one each run unless given) and answered by the reference in this process; a
student copy has the public ones only. Without bubblewrap the teacher's grading is refused (--no_sandbox
true accepts the risk); a student copy grades its own code unsandboxed, with a note.

Limits: --import_timeout for importing the graded files, --timeout per problem (the child is then
restarted for the rest), --budget for all of a hand-in's checks (a hand-in that hangs everywhere
costs at most that), --memory_gb of data segment (RLIMIT_DATA, which a CUDA build of torch imports
under; an address-space cap would not let it), PROCS processes and threads in the sandbox, FILES open
files a process, 256 MiB of results and 64 KiB of output read back; what is printed of the hand-in's
errors and output is cut short, its control characters escaped.
Ends with `total: X / Y` whatever the submission does; only where the OS refuses the checks' processes
with the release's own stubs in place too (a loaded machine) it prints `could not run` instead, charges
nothing and exits 3.
"""
import argparse
import functools
import io
import json
import math
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
import harness  # noqa: E402
from fgrpo_utils.cli import check, refuse  # noqa: E402
from fgrpo_utils.outputs import check_out_file, file_sha256, write_json_out  # noqa: E402
from problems import GRADED, GRADED_FILES, PROBLEMS, RELEASE, file_of  # noqa: E402


# -----------------------------------------------------------------------------
# The checks and the reference's answers

def teacher_side():
    """make_expected.py and the reference are here (the teacher's repository), or None (a student copy)."""
    if not (HERE / "make_expected.py").is_file():
        return None
    import make_expected
    return make_expected


def public_checks():
    from_json = teacher_side().from_json if teacher_side() else json_tensors
    data = from_json(json.loads((HERE / "expected.json").read_text()))
    return data["checks"], data["results"]


def json_tensors(v):
    """expected.json's {"tensor": list, "dtype"} back to tensors (make_expected.from_json's twin, for
    a student copy, which has no make_expected.py)."""
    if isinstance(v, dict) and set(v) == {"tensor", "dtype"}:
        return torch.tensor(v["tensor"], dtype=getattr(torch, v["dtype"]))
    if isinstance(v, dict):
        return {k: json_tensors(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_tensors(x) for x in v]
    return v


def all_checks(seed):
    """{problem: [check]} and {problem: [reference result]}: public, then hidden when we can. The RL
    run (harness.RL) is one: the hidden seed's where there is one, else the public's."""
    checks, results = public_checks()
    me = teacher_side()
    if me is not None and seed is not None:
        hidden = me.checks(seed)
        try:
            answers = me.answer(hidden, harness.graded_modules())
        except RuntimeError as e:
            if not str(e).startswith(harness.GRADER_FAILURE):
                raise
            raise GraderFailure(str(e)) from None
        for pid in checks:      # a peak against the baseline measures sizes, not values: the public one is enough
            keep = [i for i, c in enumerate(hidden[pid]) if not c.get("peak") or me.teacher_only(c)]
            mine = ([], []) if pid == harness.RL else (checks[pid], results[pid])
            checks[pid] = mine[0] + [hidden[pid][i] for i in keep]
            results[pid] = mine[1] + [answers[pid][i] for i in keep]
    return checks, results


# -----------------------------------------------------------------------------
# Comparing a result with the reference's, here and nowhere else

def fmt(x):
    return f"{x:.8g}" if isinstance(x, float) else repr(x)


def compare(want, got, what, atol, rtol, zero_rows=(), loose=False, exact_dtype=False):
    """None if the encoded value `got` matches `want`, else a one-line reason. exact_dtype: a tensor
    must have the reference's dtype itself (float32 out of bf16 logits, not bf16 or float64)."""
    if not isinstance(got, dict) or "kind" not in got:
        return f"{what}: malformed result"
    kw, kg, w, g = want["kind"], got["kind"], want["v"], got["v"]
    if kg in ("tensor", "ndarray") and isinstance(g, torch.Tensor) and g.ndim == 0 and kw in ("float", "int"):
        g, kg = g.item(), "float"                     # a 0-d array where a number is due
    number = kg in ("float", "int") and not isinstance(g, bool)
    if kw == "tensor" and loose and w.ndim == 0 and number:
        g, kg = torch.tensor(float(g), dtype=torch.float64), "tensor"
    if kw in ("tensor", "ndarray"):
        if kg != kw or not isinstance(g, torch.Tensor):
            return f"{what}: returned a {kg}, expected a {'torch tensor' if kw == 'tensor' else 'numpy array'}"
        if tuple(g.shape) != tuple(w.shape):
            return f"{what}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        if w.is_floating_point() and not (g.is_floating_point() or g.dtype == torch.bool):
            return f"{what}: dtype {g.dtype}, expected a floating tensor"
        if exact_dtype and g.dtype != w.dtype:
            return f"{what}: dtype {g.dtype}, expected {w.dtype}"
        g64, w64 = g.detach().to(torch.float64), w.to(torch.float64)
        ok = torch.isclose(g64, w64, rtol=rtol, atol=atol)
        for r in zero_rows:
            ok[r] &= g64[r] == 0
        if not ok.all():
            i = tuple(int(j) for j in (~ok).nonzero()[0]) if g.ndim else ()
            exact = " (must be exactly 0: a group with no signal)" if i and i[0] in zero_rows else ""
            return (f"{what}: {int((~ok).sum())} of {ok.numel()} values differ; at {i}: got "
                    f"{g64[i].item():.8g}, expected {w64[i].item():.8g}{exact}")
        return None
    if kw in ("float", "int"):
        if not number:
            return f"{what}: returned a {kg}, expected a number"
        if not (math.isfinite(g) and math.isclose(g, w, rel_tol=rtol, abs_tol=atol)):
            return f"{what}: got {fmt(g)}, expected {fmt(w)}"
        return None
    if kw in ("tuple", "list"):
        if kg not in ("tuple", "list") or len(g) != len(w):
            return f"{what}: returned a {kg}{f' of {len(g)}' if kg in ('tuple', 'list') else ''}, " \
                   f"expected a {kw} of {len(w)}"
        return next((m for i, (a, b) in enumerate(zip(w, g))
                     if (m := compare(a, b, f"{what}[{i}]", atol, rtol, zero_rows if i == 0 else (), loose,
                                      exact_dtype))), None)
    if kw == "dict":
        if kg != "dict" or set(g) != set(w):
            return f"{what}: keys {sorted(g) if kg == 'dict' else kg}, expected {sorted(w)}"
        return next((m for k in w if (m := compare(w[k], g[k], f"{what}[{k!r}]", atol, rtol, (), True))), None)
    return None if (kg == kw and g == w) else f"{what}: got {fmt(g)}, expected {fmt(w)}"


def judge(c, want, got, results, i):
    """None if the student's result `got` of check c passes, else why not. results: the student's
    results of the same problem, i: c's index there (a property check compares with another)."""
    what = c["name"] or c["call"].rsplit(".", 1)[1]
    atol, rtol = c.get("atol", 1e-7), c.get("rtol", 1e-6)
    if not isinstance(got, dict):
        return f"{what}: no result"
    if c.get("peak"):
        return peak_verdict(c, got, what)
    if "error" in want:
        name = want["error"].split(":")[0]
        return None if str(got.get("error", "")).startswith(name) else \
            f"{what}: expected {name}, got {got.get('error') or 'a return value'}"
    if "error" in got:
        return f"{what}: {got['error']}"
    if not unchanged(c, got):
        return f"{what}: changed an input in place (the caller uses it again)"
    if c.get("properties"):
        return properties(c, got, results[i - c["base"]] if c.get("base") else None, what)
    if c.get("spy"):                                  # what reached the stand-in, then the loss
        m = compare_spied(c, want.get("spied", {}), got.get("spied"), what, atol, rtol)
        if m:
            return m
    m = compare(want["out"], got.get("out"), what, atol, rtol, c.get("zero_rows", ()), exact_dtype=c.get("exact_dtype"))
    if not m and "saved_peak" in want and not (isinstance(got.get("saved_peak"), int)
                                               and got["saved_peak"] <= 1.5 * want["saved_peak"]):
        m = (f"{what}: autograd held {got.get('saved_peak', 0) / 2**10:.0f} KiB at once, the reference "
             f"{want['saved_peak'] / 2**10:.0f} KiB: backward each micro-batch as it is done, and take log-probs "
             "and entropy from policy_logp's head, not from the whole (tokens, V) logits")
    if not m and "grads" in want:
        m = compare(want["grads"], got.get("grads"), f"{what}: gradient", atol, rtol)
    if not m and "param_grads" in want:
        m = compare(want["param_grads"], got.get("param_grads"), f"{what}: the model's accumulated .grad", atol, rtol)
    if not m and "frozen" in want and got.get("frozen") != want["frozen"]:
        f = got.get("frozen") if isinstance(got.get("frozen"), dict) else {}
        m = f"{what}: the reference model " + ("no report" if not f else ", ".join(
            {"graph": "built a graph (run its forward without gradients)", "grad": "got a .grad",
             "moved": "changed its weights"}[k] for k in ("graph", "grad", "moved") if f.get(k) != want["frozen"][k]))
    if not m and "out_graph" in want and got.get("out_graph") != want["out_graph"]:
        m = f"{what}: {got.get('out_graph')} returned tensors keep their autograd graph, the reference's " \
            f"{want['out_graph']} (pi_old's log-probs: detach them)"
    return m or on_every_rank(c, want, got, what, atol, rtol)


def on_every_rank(c, want, got, what, atol, rtol):
    """The check's outputs c["same_on_ranks"] (index paths) and the model's .grad: every rank's the
    reference's rank 0's (global metrics, one update on all ranks)."""
    others = got.get("other_ranks")
    if "same_on_ranks" not in c:
        return None
    if not isinstance(others, list) or len(others) != c["ranks"] - 1:
        return f"{what}: no result from the other ranks"
    for r, o in enumerate(others, 1):
        if not isinstance(o, dict) or "error" in o:
            return f"{what}: rank {r}: {o.get('error') if isinstance(o, dict) else 'no result'}"
        for path in c["same_on_ranks"]:
            w, g = want["out"], o.get("out")
            for i in path:
                w = w["v"][i]
                g = g["v"][i] if isinstance(g, dict) and isinstance(g.get("v"), (list, tuple)) and i < len(g["v"]) \
                    else None
            m = compare(w, g, f"{what}: rank {r}'s output {path}", atol, rtol)
            if m:
                return m
        m = compare(want["param_grads"], o.get("param_grads"), f"{what}: rank {r}'s accumulated .grad", atol, rtol)
        if m:
            return m
    return None


def unchanged(c, got):
    """Did the call leave its inputs as they were? The child's copies of them after the call against the
    check's own, here: no function of the hand-in's process decides it (torch.equal can be replaced there)."""
    before = list(harness.input_tensors([harness.rank_args(c, 0) if c.get("ranks") else c.get("args", []),
                                         c.get("kwargs", {})]))
    after = got.get("inputs_after")
    if not isinstance(after, list) or len(after) != len(before):
        return False
    for a, b in zip(after, before):
        a = a.get("v") if isinstance(a, dict) and a.get("kind") == "tensor" else None
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or \
                not bool(torch.isclose(a.double(), b.double(), rtol=0, atol=0, equal_nan=True).all()):
            return False
    return True


def compare_spied(c, want, got, what, atol, rtol):
    """policy_loss's one call of aggregate: per-token losses on the response tokens, and its settings."""
    for name, w_calls in want.items():
        g_calls = got.get(name) if isinstance(got, dict) else None
        if not isinstance(g_calls, list) or len(g_calls) != len(w_calls):
            return f"{what}: called {name} {len(g_calls) if isinstance(g_calls, list) else '?'} times, expected " \
                   f"{len(w_calls)} (one {name}(per_tok, mask, loss_agg, num_tokens, num_seqs, max_len))"
        for wc, gc in zip(w_calls, g_calls):
            if not isinstance(gc, dict) or set(gc) != set(wc):
                return f"{what}: malformed {name} call"
            mask = wc["mask"]["v"].bool()
            x = gc["x"]["v"] if gc["x"].get("kind") == "tensor" else None
            try:
                x = x.detach().to(torch.float64).expand(mask.shape)[mask]
            except (AttributeError, RuntimeError):
                return f"{what}: the per-token losses passed to {name} are not a tensor of the mask's shape"
            m = compare({"kind": "tensor", "v": wc["x"]["v"].to(torch.float64).expand(mask.shape)[mask]},
                        {"kind": "tensor", "v": x}, f"{what}: per-token losses on response tokens", atol, rtol)
            if m:
                return m
            for k in wc:
                if k != "x" and compare(wc[k], gc[k], k, 1e-12, 1e-12, (), True):
                    return f"{what}: {name} got {k}={gc[k].get('v')!r}, expected {wc[k]['v']!r}"
    return None


def properties(c, got, base, what):
    """Problem 5: what any focal weighting keeps, judged on the student's own chain of Problems 1-4."""
    if c["properties"] == "base":
        if compare({"kind": "tensor", "v": c["args"][0].to(torch.float64)}, got.get("out"), what, math.inf, 0):
            return f"{what}: group_advantages returned no (G, N) tensor"
        return ordered(c["args"][0], got["out"]["v"], what)
    out = got.get("out", {})
    if out.get("kind") not in ("tuple", "list") or len(out["v"]) != 2 or \
            any(x.get("kind") != "tensor" for x in out["v"] if isinstance(x, dict)):
        return f"{what}: focal_advantages must return a tuple (advantages, g) of tensors"
    A, g = (x["v"] for x in out["v"])
    R, gamma = c["args"][0], c["args"][1]
    if A.shape != R.shape or g.shape != (R.shape[0],):
        return f"{what}: shapes {tuple(A.shape)} and {tuple(g.shape)}, expected {tuple(R.shape)} and ({R.shape[0]},)"
    if not (torch.isfinite(A).all() and torch.isfinite(g).all()):
        return f"gamma {gamma}: non-finite advantages or weights (train.py stops on them)"
    if not (A[c["zero_rows"]] == 0).all():
        return f"gamma {gamma}: uniform groups got non-zero advantages"
    if not (g >= 0).all():
        return f"gamma {gamma}: a negative weight flips the sign of its group's update"
    base = base.get("out", {}) if isinstance(base, dict) else {}
    if gamma == 0:
        if not (torch.equal(g.double(), torch.ones_like(g, dtype=torch.float64)) and base.get("kind") == "tensor"
                and torch.equal(A, base["v"])):
            return "gamma 0 must give g = 1 and group_advantages' output bit for bit"
    if base.get("kind") == "tensor" and base["v"].shape == A.shape and not torch.allclose(
            A.double(), g.double()[:, None] * base["v"].double(), rtol=1e-5, atol=1e-7):
        return f"gamma {gamma}: the advantages are not g times group_advantages' (Eq. 13)"
    mu = R.double().mean(1)
    mixed = [i for i in range(R.shape[0]) if i not in c["zero_rows"]]
    for i in mixed:                  # a group the policy solves more often weighs no more (Eq. 12)
        for j in mixed:
            if mu[i] < mu[j] - 1e-9 and gamma > 0 and not g[i] > g[j]:
                return f"gamma {gamma}: a group with success rate {mu[j]:.3f} weighs as much as one with {mu[i]:.3f}"
    return ordered(R, A, f"gamma {gamma}")


def ordered(R, A, what):
    """In a group with signal, a higher reward gets a higher advantage and the advantages sum to zero."""
    for i in range(R.shape[0]):
        r, a = R[i].double(), A[i].double()
        if (r == r[0]).all():
            continue
        hi, lo = int(r.argmax()), int(r.argmin())
        if not (a[hi] > a[lo] and abs(float(a.sum())) <= 1e-5 * max(1.0, float(a.abs().sum()))):
            return f"{what}: group {i}'s advantages do not rank its rewards around zero (got {a.tolist()})"
    return None


# -----------------------------------------------------------------------------
# The child: a throwaway folder with the release and the student's graded files, a bare environment

def release_into(dst):
    """The student release into dst: make_student_copy's, from HEAD, in the teacher's repository; in
    a student copy, the files its RELEASE list names (as they are now: only graded files change)."""
    if teacher_side():
        import make_student_copy
        make_student_copy.write_copy(dst)
        return
    for rel in json.loads((HERE / RELEASE).read_text())["files"]:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_file():
            shutil.copyfile(ROOT / rel, dst / rel)


def take_graded(src, dst):
    """Copy the graded files of src into dst: regular files only, in no linked folder (a link, a tar keeps
    it, could reach the reference or another hand-in).
    Returns {file: why it was not taken} for those left as the release's stubs."""
    left = {}
    for rel in GRADED_FILES:
        p = src / rel
        if any((src / part).is_symlink() for part in Path(rel).parents if part != Path(".")) or p.is_symlink() \
                or (p.exists() and not p.is_file()):
            left[rel] = "not a regular file (a link, or in a linked folder)"
        elif not p.exists():
            left[rel] = "missing"
        else:
            shutil.copyfile(p, dst / rel)
    return left


# Each hand-in's checks run in a sandbox (bubblewrap, `bwrap`: Flatpak's): a PID namespace of its own (no
# /proc of the grader; everything it starts dies with it), no network, the Python installation and the
# system read-only, and of the files only the release with the hand-in's graded files, read-only. It
# writes nowhere on the host (a 256 MiB tmpfs is its /tmp; / and /dev, tmpfs with no cap, are read-only);
# its processes, open files and memory are capped; its results come back through a pipe, its output
# through another, both read with a cap, and what is shown of them has its control characters escaped.
SANDBOX_TMP = 256 << 20            # bytes of the sandbox's /tmp (a tmpfs: it counts as memory)
SANDBOX_SHM = 16 << 20             # bytes of its /dev/shm: multiprocessing's semaphores (the multi-rank checks)
PROCS = 256 + 4 * (os.cpu_count() or 1)   # processes and threads it may hold at once (the multi-rank
                                   # checks: about 20, more where torch's thread pools grow with the
                                   # cores): a fork bomb stops there (CONFINE)
FILES = 1024                       # open files per process (the usual default: the harness needs far fewer)
SANDBOX_UID = 3 << 30              # + the grader's pid: the user a root grader's sandbox runs as, its own
                                   # (RLIMIT_NPROC counts a user's tasks, and binds no root process)
# Where the sandbox shows the release, and its working directory: a folder like a student's own clone, its user
# drawn per grading (code that behaves one way in the grader's folder, /grade before, finds no fixed one)
SANDBOX_HOME = "/home/" + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7))
RESULT_CAP = 256 << 20             # bytes of results read back in all
RECORDS = 50_000                   # zip records of a frame (a reference's frame has ~1,000; parsing is slow)
LOG_CAP = 64 << 10                 # bytes of the child's output kept (the last ones)
SHOWN = 500                        # characters shown of a message that quotes the child (its error, its output)


def sandbox():
    """(the bwrap command, None) where bubblewrap makes the child's sandbox here (child_argv, with a
    harness that does nothing: this Python runs in it, as its user), else (None, why not)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bubblewrap is not installed (apt-get install bubblewrap; dnf install bubblewrap)"
    with tempfile.TemporaryDirectory(prefix="fgrpo_sandbox_") as tmp:
        (Path(tmp) / "assignments").mkdir()
        (Path(tmp) / "assignments" / "harness.py").write_text("")
        for p in (Path(tmp), Path(tmp) / "assignments"):
            p.chmod(0o755)
        argv, env, cwd = child_argv(Path(tmp), 0, bwrap)
        try:
            r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"bwrap does not run ({e})"
    err = r.stderr.decode(errors="replace").strip().splitlines()
    return (bwrap, None) if r.returncode == 0 else (None, f"bwrap cannot make a sandbox here: {err[-1] if err else r.returncode}")


def python_dirs():
    """The folders this Python needs, read-only in the sandbox at their own paths: a virtual
    environment's and the installation it was made from. The rest of a repository that holds the
    environment (CI's .venv-ci is inside the teacher's) stays out."""
    dirs = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.realpath(sys.executable))}
    dirs = {os.path.realpath(d) for d in dirs} | {d for d in dirs}
    return sorted(d for d in dirs if not any(d != o and d.startswith(o + os.sep) for o in dirs))


# Run in the sandbox before the harness, so before any graded code. Its first process (bwrap --as-pid-1) forks
# the harness and waits: what it waits for counts in the kernel's peak-memory figure that reaches the grader
# (grade.peak_rss; bwrap's own init would keep it), it reaps what the sandbox orphans, and it ends with bwrap
# (--die-with-parent: a setuid process would not get that signal from bwrap), so everything in the sandbox does.
# The harness's cap on processes and threads (RLIMIT_NPROC: a fork bomb stops there): the kernel counts them
# per user and binds no root process, root in a user namespace included, so a root grader's sandbox has no
# user namespace and runs the harness as a user of its own (uid >= 0: that drops every capability too); else
# the sandbox's own user namespace has the count to itself (without one, it would count all the grader's
# processes: no cap then).
CONFINE = """
import os, resource, runpy, sys
_, procs, uid, *sys.argv = sys.argv
harness = os.fork()
while harness:
    pid, status = os.wait()
    if pid == harness:
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
if int(uid) >= 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (int(procs), int(procs)))
    os.setgroups([])
    os.setgid(int(uid))
    os.setuid(int(uid))
elif open("/proc/self/uid_map").read().split() != ["0", "0", "4294967295"]:
    resource.setrlimit(resource.RLIMIT_NPROC, (int(procs), int(procs)))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def child_argv(folder, fd, bwrap, hide=(), name="fgrpo", extra_env=None):
    """The command that runs the harness on the release in `folder`, results to file descriptor fd, shown in the
    sandbox as SANDBOX_HOME/name. hide: host folders the sandbox must not show (the teacher's repository, the
    folder that holds the hand-ins)."""
    harness_argv = [sys.executable, "-I", "assignments/harness.py", ".grade/checks.pt", str(fd)]
    env = {"HOME": "/tmp", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin", **(extra_env or {})}
    if bwrap is None:
        return harness_argv, {**env, "HOME": str(folder)}, str(folder)
    # the machine's root (not a container's): no user namespace, and a user of its own (CONFINE)
    root = os.geteuid() == 0 and Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]
    unshare = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"] \
        if root else ["--unshare-all", "--cap-drop", "ALL"]
    uid = SANDBOX_UID + os.getpid() if root else -1
    harness_argv = [sys.executable, "-I", "-c", CONFINE, str(PROCS), str(uid), *harness_argv[2:]]
    argv = [bwrap, *unshare, "--as-pid-1", "--die-with-parent", "--new-session", "--clearenv",
            "--ro-bind", "/usr", "/usr"]
    system = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/sys"]
    for d in system:
        argv += ["--ro-bind-try", d, d]
    # /tmp first: a Python under /tmp (CI's) binds over it
    argv += ["--perms", "1777", "--size", str(SANDBOX_TMP), "--tmpfs", "/tmp"]
    inside = lambda p, dirs: any(p == d or p.startswith(d + "/") for d in dirs)     # noqa: E731
    # The folders bwrap makes to bind the Python in, 0755 rather than its 0700: a root grader's sandbox runs
    # as another user, who must pass them (those in /usr and the other system binds are the machine's own)
    for a in sorted({str(a) for d in python_dirs() for a in Path(d).parents} - {"/", "/tmp"}):
        if not inside(a, ["/usr", *system]):
            argv += ["--perms", "0755", "--dir", a]
    for d in python_dirs():
        argv += ["--ro-bind", d, d]
    # What these binds would show of `hide` (the teacher's clone under /usr/src/app or inside the Python
    # environment, hand-ins beside it there) is an empty folder; a Python folder inside one is bound again
    masks = sorted({os.path.realpath(h) for h in hide if inside(os.path.realpath(h), ["/usr", *system, *python_dirs()])
                    and os.path.isdir(h)})
    for h in masks:
        argv += ["--tmpfs", h]
    for d in python_dirs():
        if inside(d, masks):
            argv += ["--ro-bind", d, d]
    at = f"{SANDBOX_HOME}/{name}"
    argv += ["--perms", "0755", "--dir", "/home", "--perms", "0755", "--dir", SANDBOX_HOME,
             "--ro-bind", str(folder), at, "--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(SANDBOX_SHM), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev", "--remount-ro", "/",    # tmpfs with no cap: a hand-in could fill the RAM
             "--chdir", at]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    return argv + harness_argv, {}, str(folder)


def limits(memory_gb):
    def apply():
        cap = memory_gb << 30                          # the data segment, which a CUDA torch imports under
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
        resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, FILES))
    return apply


# What the child sends, as harness.enc encodes a value: its kind, and the type its "v" must have
KINDS = {"tensor": torch.Tensor, "ndarray": torch.Tensor, "float": float, "int": int, "bool": bool, "str": str,
         "other": (str, type(None)), "tuple": list, "list": list, "dict": dict}
DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64}          # what judge() computes with (no complex)


def plain(x, budget, depth=0, encoded=False):
    """Is x what harness.send writes? Dicts with str keys, lists, str, bool, None, floats, 64-bit ints, and
    tensors only as encoded values {"kind": "tensor" | "ndarray", "v"}: dense, on the CPU, real, and no
    more elements than their storage holds (an expanded one grows to gigabytes here); every {"kind", "v"}
    of a known kind and type. The graded code can write frames of its own, so anything else is its failure,
    never a crash here. budget: [nodes left to visit] (a frame can hold one list many times over)."""
    budget[0] -= 1
    if budget[0] < 0 or depth > 32:
        return False
    if encoded or (isinstance(x, dict) and "kind" in x):
        if not (isinstance(x, dict) and set(x) == {"kind", "v"} and x["kind"] in KINDS
                and isinstance(x["v"], KINDS[x["kind"]])):
            return False
        kind, v = x["kind"], x["v"]
        if kind in ("tensor", "ndarray"):
            return v.layout == torch.strided and v.device.type == "cpu" and v.dtype in DTYPES and \
                v.numel() * v.element_size() <= v.untyped_storage().nbytes()
        if kind == "dict":
            return all(isinstance(k, str) and plain(e, budget, depth + 1, True) for k, e in v.items())
        return all(plain(e, budget, depth + 1, True) for e in v) if kind in ("tuple", "list") else \
            plain(v, budget, depth + 1)
    if isinstance(x, dict):
        return all(isinstance(k, str) and plain(v, budget, depth + 1) for k, v in x.items())
    if isinstance(x, list):
        return all(plain(v, budget, depth + 1) for v in x)
    return x is None or isinstance(x, (str, float)) or (isinstance(x, int) and abs(x) <= 1 << 64)   # a float holds it


def shown(text):
    """A message that quotes the child, safe to print: SHOWN characters at most, and every character a
    terminal acts on (ESC, CR, newlines, BEL, bidi overrides) escaped, so that it stays on its own line
    and cannot move the cursor, rewrite what is on screen or pose as the total line."""
    text = str(text)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:SHOWN]) + "..." * (len(text) > SHOWN)


def hidden(args):
    """What the sandbox hides: the teacher's repository and the folder that holds the hand-in (others beside it)."""
    return [ROOT] + ([Path(args.dir).resolve().parent] if getattr(args, "dir", None) else [])


def folder_name(args):
    """The name the sandbox gives the release's folder: the hand-in's own (the repository's for the reference)."""
    return Path(getattr(args, "dir", None) or ROOT).resolve().name or "fgrpo"     # "" only for /


class Child:
    """One run of the harness: results frames read from a pipe, its output drained into a bounded buffer."""

    def __init__(self, folder, args, bwrap, extra_env=None):
        r, w = os.pipe()
        argv, env, cwd = child_argv(folder, w, bwrap, hidden(args), folder_name(args), extra_env)
        self.log = bytearray()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, pass_fds=(w,), start_new_session=True,
                                     preexec_fn=limits(args.memory_gb))
        os.close(w)
        self.results, self.read = os.fdopen(r, "rb", buffering=0), 0
        self.drainer = threading.Thread(target=self.drain, daemon=True)
        self.drainer.start()

    def drain(self):
        for chunk in iter(lambda: self.proc.stdout.read(1 << 16), b""):
            self.log = (self.log + chunk)[-LOG_CAP:]

    def frame(self, seconds):
        """The next frame the harness sent, as plain data (plain()), or "timeout" / "exited" / "too large" /
        "unreadable" / "malformed". The graded code can write frames of its own to the pipe."""
        header = self.read_exactly(8, seconds)
        if not isinstance(header, bytes):
            return header
        size = int.from_bytes(header, "little")
        if size > RESULT_CAP - self.read:
            return "too large"
        body = self.read_exactly(size, seconds)
        if not isinstance(body, bytes):
            return body
        if body.count(b"PK\x01\x02") > RECORDS:           # an upper bound on its records: it starts each
            return "unreadable"
        try:
            records = zipfile.ZipFile(io.BytesIO(body)).infolist()
            if any(r.compress_type != zipfile.ZIP_STORED for r in records) or sum(r.file_size for r in records) > size:
                return "unreadable"             # torch.save stores each record: a compressed one could unpack to GBs
            obj = torch.load(io.BytesIO(body), weights_only=True)
        except Exception:  # noqa: BLE001: whatever the child sent
            return "unreadable"
        return obj if plain(obj, [1 << 20]) else "malformed"

    def read_exactly(self, n, seconds):
        end, out = time.monotonic() + seconds, bytearray()          # appended to in place: linear in n
        while len(out) < n:
            left = end - time.monotonic()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([self.results], [], [], left)
            if ready:
                chunk = self.results.read(n - len(out))
                if not chunk:
                    return "exited"
                out += chunk
                self.read += len(chunk)
        return bytes(out)

    def tail(self):
        text = bytes(self.log).decode(errors="replace").strip().splitlines()
        return text[-1][:200] if text else f"exit status {self.proc.poll()}"

    def stop(self, ending=False):
        """Kill the child and everything it started (the sandbox's PID namespace ends with it), then wait.
        ending: it is done, so give it a few seconds to end by itself (its last words, its memory's count)."""
        end = time.monotonic() + (10 if ending else 0.01)
        while not self.reaped(os.WNOHANG) and time.monotonic() < end:
            time.sleep(0.02)
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.reaped(0)
        self.drainer.join(10)                          # the output left in the pipe, for tail()
        self.results.close()

    def reaped(self, flags):
        """Has the child ended (wait4, not Popen.wait: self.usage, the kernel's count of what it and every
        process it waited for used, comes with it: ru_maxrss, the most resident memory one held, KiB)?"""
        if self.proc.returncode is None:
            pid, status, usage = os.wait4(self.proc.pid, flags)
            if pid:
                self.proc.returncode, self.usage = os.waitstatus_to_exitcode(status), usage
        return self.proc.returncode is not None


def run_child(folder, checks, todo, args, bwrap, usage=None):
    """Run the checks of the problems in `todo` in sandboxed children, within --budget seconds in all.
    Returns ({problem: [result]}, {problem: why it has no results}). usage: a list, to which the last
    child's resource usage (Child.reaped) is appended once it has ended by itself or been stopped (its
    memory counted as EXACT_MEMORY says)."""
    results, why, todo, slow, child = {}, {}, list(todo), set(), None
    deadline = time.monotonic() + args.budget
    while todo:
        torch.save({pid: checks[pid] for pid in todo}, folder / ".grade" / "checks.pt")
        os.chmod(folder / ".grade" / "checks.pt", 0o644)           # a root grader's sandbox: another user
        child = Child(folder, args, bwrap, None if usage is None else EXACT_MEMORY)
        got = child.frame(min(args.import_timeout, max(0.0, deadline - time.monotonic())))
        if got != "imported":
            child.stop(got == "exited")
            reason = ("no time left of --budget" if time.monotonic() >= deadline else
                      f"importing the graded files took over {args.import_timeout} s" if got == "timeout"
                      else f"the child process ended while importing the graded files: {child.tail()}"
                      if got == "exited" else "its first frame was not 'imported'")
            why.update({pid: reason for pid in todo})
            break
        while todo:
            pid = todo[0]
            got = child.frame(min(args.timeout * (1 + (pid in slow)), max(0.0, deadline - time.monotonic())))
            if isinstance(got, dict) and got.get("problem") == pid and isinstance(got.get("results"), list):
                results[pid] = got["results"]
                todo.pop(0)
                continue
            child.stop(got == "exited")
            if got == "timeout" and pid not in slow and time.monotonic() < deadline:
                slow.add(pid)                               # a loaded machine: once more, twice the time
                break
            why[pid] = ("no time left of --budget" if time.monotonic() >= deadline else
                        f"timed out after {args.timeout} s, then {2 * args.timeout} s" if got == "timeout" else
                        f"the child process ended: {child.tail()}" if got == "exited" else
                        f"results {got}" if got in ("too large", "unreadable", "malformed") else
                        "a frame that is not its results")
            todo.pop(0)
            break                                           # a fresh child for the rest
        child.stop(ending=usage is not None and not todo)
    if usage is not None and child is not None:
        usage.append(child.usage)
    return results, why


# A measured child's malloc maps every block over 128 KiB on its own and returns it when freed, so its peak
# resident memory is what was live at once (glibc's moving threshold kept freed blocks: correct updates read
# 280-500 MiB over the baseline, 50 with this); elsewhere it would cost the checks ~7 % of their time.
EXACT_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 17)}


def peak_rss(folder, pid, c, args, bwrap):
    """Check c of problem pid alone in a fresh sandboxed child, waited for to its end: the most resident memory
    one of its processes held, in bytes, as the kernel counts it (the sandbox's wait4 ru_maxrss takes the max
    over every process it waited for). No code in the child can lower it. None if it gave no result."""
    usage = []
    got, _ = run_child(folder, {pid: [c]}, [pid], args, bwrap, usage)
    return usage[0].ru_maxrss << 10 if pid in got and usage else None


class GraderFailure(RuntimeError):
    """A check the grader could not run (the OS refused it a process or a thread, retries spent, and the
    release's own stubs too): not the hand-in's doing, so no problem is charged and no total is printed
    (main: "could not run", exit 3)."""


def refusals(got, why):
    """{problem: what the OS refused it}: a GraderFailure result (harness.run_ranks) or a child that died
    of EAGAIN (the machine's doing, or the hand-in's: it can write those, or exhaust what its sandbox allows)."""
    refused = {pid: r["error"] for pid, rs in got.items() if isinstance(rs, list) for r in rs
               if isinstance(r, dict) and str(r.get("error", "")).startswith(harness.GRADER_FAILURE)}
    return refused | {pid: w for pid, w in why.items() if "Resource temporarily unavailable" in w}


def release_folder(tmp, name, src=None):
    """tmp/name: the release, with src's graded files in place of its stubs when given, readable by the
    sandbox (child_argv). Returns (the folder, {file: why src's was not taken})."""
    folder = Path(tmp) / name
    release_into(folder)
    left = take_graded(src, folder) if src else {}
    (folder / ".grade").mkdir()
    for p in [folder, *folder.rglob("*")]:         # a root grader's sandbox runs as another user, who reads them
        p.chmod(p.stat().st_mode | (0o555 if p.is_dir() else 0o444))
    return folder, left


def judged(c, want, got, results, i):
    """judge(), with a result it cannot read (the graded code can write its own frames) failing the check."""
    try:
        return judge(c, want, got, results, i)
    except Exception as e:  # noqa: BLE001: plain() lets through only plain data, but judge reads more each term
        return f"malformed result ({type(e).__name__})"


def grade_problems(src, args, bwrap):
    """[(problem id, points earned, points, description, checks passed, checks, [messages])]."""
    checks, want = all_checks(args.seed)
    together = {pid: [c for c in cs if not c.get("peak")] for pid, cs in checks.items()}   # peaks: one child each
    with tempfile.TemporaryDirectory(prefix="fgrpo_grade_") as tmp:
        folder, left = release_folder(tmp, "release", src)
        stubs = functools.cache(lambda: release_folder(tmp, "stubs")[0])
        reference = functools.cache(lambda: release_folder(tmp, "reference", ROOT)[0])
        got, why = run_child(folder, together, [*(pid for pid, *_ in PROBLEMS), harness.RL], args, bwrap)
        refused = refusals(got, why)
        if refused:                     # the OS's doing only if the same checks fail on the release's stubs
            if refusals(*run_child(stubs(), together, list(refused), args, bwrap)):
                raise GraderFailure(next(iter(refused.values())))
            for pid, w in refused.items():
                got.pop(pid, None)
                why[pid] = f"{w} (the release's stubs ran these checks: this hand-in made them fail)"
        stuck = [pid for pid, rs in got.items() if isinstance(rs, list) and any(map(harness.unfinished, rs))]
        if stuck:                       # a rank out of time: a loaded machine, or the hand-in; once more, twice the time
            again = {pid: [harness.more_time(c) for c in together[pid]] for pid in stuck}
            got.update(run_child(folder, again, stuck, args, bwrap)[0])
        with_peaks(checks, want, got, lambda pid, c: (
            peak_rss(folder, pid, c, args, bwrap), peak_rss(reference(), pid, c, args, bwrap)
            if c["peak"]["against"] == "reference" else peak_rss(stubs(), pid, {**c, "baseline": True}, args, bwrap)))
    rows, passing = [], []
    for pid, points, functions, about in PROBLEMS:
        mine = got.get(pid) if isinstance(got.get(pid), list) else []
        verdicts = [judged(c, want[pid][i], mine[i], mine, i) if i < len(mine) else why.get(pid, "no result")
                    for i, c in enumerate(checks[pid])]
        messages = [shown(m) for m in verdicts if m]
        files = {file_of(f) for f in functions}
        messages += [f"{f}: {left[f]} in {src}, so the release's stub was graded" for f in sorted(files & set(left))]
        passed = verdicts.count(None)
        rows.append([pid, points if passed == len(verdicts) else 0, points, about, passed, len(verdicts), messages])
        passing += [pid] if passed == len(verdicts) else []
    rl = got.get(harness.RL)
    charged, why_rl = rl_charges(want[harness.RL][0], rl[0] if isinstance(rl, list) and rl else
                                 {"error": why.get(harness.RL, "no result")}, passing,
                                 lambda swap: rerun_rl(src, args, bwrap, checks[harness.RL][0], swap))
    for row in rows:
        if row[0] in charged:
            row[1], row[6] = 0, row[6] + [shown(why_rl)]
    return [tuple(r) for r in rows]


def with_peaks(checks, want, got, measure):
    """Put each peak check's result in its place in got (a problem's results came without them): {"peak", "other"}
    from measure(pid, c): peak_rss of the hand-in's child, and of the child c["peak"]["against"] names (so no code
    of the hand-in's can raise it): "baseline", one that imports the release's stubs and builds the same inputs but
    calls nothing; "reference", one that runs the reference's update on them. Made here, never sent by a child. Not
    measured where the problem's other checks raised where the reference's did not (it fails on those; a stub
    raises at once, under any allowance)."""
    for pid, cs in checks.items():
        rest = got.get(pid)
        if not isinstance(rest, list) or not any(c.get("peak") for c in cs):
            continue
        wants = [w for c, w in zip(cs, want[pid]) if not c.get("peak")]
        ran = all(isinstance(r, dict) and ("error" in r) <= ("error" in w) for r, w in zip(rest, wants))
        rest, out = iter(rest), []
        for c in cs:
            peaks = (measure(pid, c) if ran else (None, None)) if c.get("peak") else None
            if peaks and peaks[0] is not None and peaks[1] is None:
                raise GraderFailure(f"{pid}: the {c['peak']['against']}'s child gave no result on {c['name']!r}")
            out.append(dict(zip(("peak", "other"), peaks)) if peaks else next(rest, None))
        got[pid] = out


def peak_verdict(c, got, what):
    """None if the hand-in's child held at most c["peak"]["allowance"] bytes more at its peak than the other child."""
    peak, other = got.get("peak"), got.get("other")
    if not isinstance(peak, int) or not isinstance(other, int):
        return f"{what}: not measured (its child gave no result, or the problem's other checks raised)"
    if peak - other <= c["peak"]["allowance"]:
        return None
    held = f"{what}: the process held {(peak - other) / 2**20:.0f} MiB more at its peak than one that "
    limit = f" (the kernel's count), at most {c['peak']['allowance'] / 2**20:.0f} MiB"
    if c["peak"]["against"] == "reference":
        return (held + "ran the reference's update on the same inputs" + limit + ": backward each micro-batch as it "
                "is done, and run the reference model's forward without gradients")
    return (held + "only built the same inputs" + limit + " (one micro-batch's (tokens, V) logits): backward each "
            "micro-batch as it is done, and take log-probs and entropy from policy_logp, never from the whole logits")


def rl_charges(want, got, passing, rerun=None):
    """(problems charged, why) for the RL run: those judge_rl names, of the problems that passed their own checks.
    rerun(functions) runs it again with the reference's `functions` in place of the hand-in's (teacher side; a
    student copy has no reference). Where a problem the failing step runs failed its own checks, that mistake may
    be what the run shows (one logged metric wrong, or the loss: with two mini-batches every later metric of the
    step moves), so the run is judged again with the failed problems set right, and only what still differs is
    charged (in a copy: nothing). Where several problems that passed are charged, the reference's version of each
    in turn finds the one at fault: a mistake costs its own problem only."""
    charged, why, ran = judge_rl(want, got)
    failed = [pid for pid in ran if pid not in passing]
    fixed = [f for pid, _, fns, _ in PROBLEMS if pid in failed or (pid in CHAIN and "focal_properties" in failed)
             for f in fns]        # Problem 5 runs the chain: which of its functions is wrong, it cannot tell
    charged = [p for p in charged if p in passing]
    if failed and charged:                                 # else nothing to spare: no second run
        again = rerun(fixed) if rerun else None
        charged = [p for p in judge_rl(want, again)[0] if p in passing] if again is not None else []
        why = (f"the RL run differs from the reference's even with the reference's {', '.join(failed)} in place of "
               f"yours (what it gave then is not shown: it ran the reference's code); it involves {', '.join(charged)}")
    for pid, _, fns, _ in PROBLEMS if len(charged) > 1 and rerun else ():
        again = rerun(fixed + fns) if pid in charged and fns else None
        if again is not None and not judge_rl(want, again)[0]:
            charged, why = [pid], f"{why}; with the reference's {pid} in place of yours, the run trains as the reference's"
            break
    return charged, why if charged else None


def rerun_rl(src, args, bwrap, check, swap):
    """The RL check again in the sandbox, the reference's `swap` ("module.function") in place of the hand-in's
    (harness.swap_in): None in a student copy, which has no reference."""
    if teacher_side() is None:
        return None
    sources = {f.rsplit(".", 1)[0]: (ROOT / file_of(f)).read_text() for f in swap}
    with tempfile.TemporaryDirectory(prefix="fgrpo_grade_") as tmp:
        folder, _ = release_folder(tmp, "release", src)
        got, _ = run_child(folder, {harness.RL: [{**check, "reference": sources, "swap": swap, "graded": GRADED}]}, [harness.RL],
                           args, bwrap)
    rl = got.get(harness.RL)
    return rl[0] if isinstance(rl, list) and rl else {"error": "no result"}


# What each metric of an RL step involves, in the order a step computes them (harness.RL_METRICS); a
# later step involves all of TRAINING, since every update changed the weights it samples from.
CHAIN = ["group_advantages", "success_rate", "focal_weight", "focal_advantages"]
TRAINING = CHAIN + ["token_mean", "aggregate", "clip_bounds", "policy_loss", "kl_k3", "logprobs", "update"]
INVOLVED = {"reward/mean": [], "adv/abs_mean_pre": ["group_advantages"],
            "focal/g_mean": ["success_rate", "focal_weight", "focal_advantages"], "adv/abs_mean_post": CHAIN,
            "logp/diff_abs_mean": ["logprobs", "update"], "entropy": ["logprobs", "update"],
            **{k: ["token_mean", "aggregate", "clip_bounds", "policy_loss", "kl_k3", "logprobs", "update"]
               for k in ("loss/pg", "ratio/max", "grad_norm")}}
RAN = ["focal_properties", *TRAINING]          # what a step runs; the maze's also maze_reward


def ran_by(task):
    return RAN + (["maze_reward"] if task == "maze" else [])


def judge_rl(want, got):
    """(problems charged, why, the problems the failing step ran) for the RL run (harness.rl_run): the first
    metric of the first step that differs from the reference's (within what another CPU changes), or a crash,
    costs the problems it involves; ([], None, []) when every step matches."""
    if not isinstance(got, dict) or not isinstance(got.get("steps"), list):
        return TRAINING, "the RL run (harness.rl_run) gave no result", ran_by("maze")
    for i, w in enumerate(want["steps"]):
        g = got["steps"][i] if i < len(got["steps"]) and isinstance(got["steps"][i], dict) else None
        first = i == 0 or want["steps"][i - 1]["task"] != w["task"]
        ran = ran_by(w["task"])
        if g is None:
            frames = [f for f in got["frames"] if isinstance(f, str)] if isinstance(got.get("frames"), list) else []
            names = {f.rsplit(".", 1)[1]: pid for pid, _, fns, _ in PROBLEMS for f in fns}
            charged = sorted({names[f] for f in frames if f in names}) or ["update"]
            return charged, (f"the RL run ({w['task']} task, step {i + 1}) crashed: {got.get('error', 'no result')} "
                             f"(in {', '.join(charged)})"), ran
        for k in harness.RL_METRICS:
            a, b = g.get(k), w[k]
            if not harness.rl_same(a, want["steps"], i, k):
                charged = (["maze_reward"] if w["task"] == "maze" else ["update"]) if k == "reward/mean" and first \
                    else INVOLVED[k] if first else TRAINING
                return charged, (f"the RL run ({w['task']} task, step {i + 1}): {k} is {a}, the reference's {b:.6g}; "
                                 f"it involves {', '.join(charged)}: full marks means the step trains as the reference's"), ran
    return [], None, []


# -----------------------------------------------------------------------------
# Experiment problems: what the files written by train.py, evaluate.py and simulate.py can show.
# Each check returns a list of what is wrong (empty: passed).

def read_json(path):
    try:
        return json.loads(Path(path).read_text()), None
    except (OSError, ValueError) as e:
        return None, f"{path}: {'missing' if isinstance(e, FileNotFoundError) else f'unreadable ({e})'}"


def finite_numbers(obj):
    """Every number inside obj is finite (json reads NaN and Infinity as floats)."""
    if isinstance(obj, dict):
        return all(finite_numbers(v) for v in obj.values())
    if isinstance(obj, list):
        return all(finite_numbers(v) for v in obj)
    return not isinstance(obj, float) or math.isfinite(obj)


def differs(got, want):
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    return got != want


def ran_the_hand_in(root, info, what):
    """The graded files a run imported (its "code": {file: sha256}, outputs.code_hashes) are those in
    root, the hand-in, byte for byte: the run's numbers are then those of the code being graded."""
    code = info.get("code") if isinstance(info, dict) else None
    ran = [f for f in GRADED_FILES if isinstance(code, dict) and f in code]
    if not ran:
        return [f"{what}: records no hash of the graded files it ran (rerun it with this release)"]
    return [f"{what}: ran another {f} than the one handed in" for f in ran
            if not (Path(root) / f).is_file() or file_sha256(Path(root) / f) != code[f]]


def check_run(root, run, steps, world=None, last=(), tie=False, **config):
    """train.py's out_dir: run.json's config has these values, it ran the hand-in's graded files,
    metrics.jsonl has every step 1..steps, every logged number finite, and the last line holds the
    keys in `last`. tie (the CPU tier's maze runs): its first steps replayed and its last evaluation
    redone from its exported model agree with its log (replayed, tied_to_model)."""
    d = Path(root) / run
    info, err = read_json(d / "run.json")
    if err:
        return [err]
    wrong = [f"{run}: --{k} {info['config'].get(k)!r}, required {v!r}" for k, v in
             {"steps": steps, **config}.items() if differs(info["config"].get(k), v)]
    wrong += ran_the_hand_in(root, info, run)
    if world is not None and info.get("world") != world:
        wrong.append(f"{run}: world size {info.get('world')}, required {world}")
    try:
        lines = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        return wrong + [f"{run}/metrics.jsonl: {e}"]
    done = {m.get("step") for m in lines}
    if done != set(range(1, steps + 1)):
        wrong.append(f"{run}: metrics.jsonl has {len(done)} of the {steps} steps (last {max(done, default=0)})")
    if not all(finite_numbers(m) for m in lines):
        wrong.append(f"{run}: metrics.jsonl holds NaN or inf")
    missing = [k for k in last if lines and k not in lines[-1]]
    if missing:
        wrong.append(f"{run}: the last step logged no {', '.join(missing)}")
    elif tie and not wrong:
        cfg = info["config"]
        first = [next(m for m in lines if m.get("step") == s) for s in range(1, min(REPLAY_STEPS, steps) + 1)]
        wrong += replayed(root, run, cfg, first) or trained(root, run, cfg.get("model")) or tied_to_model(
            root, run, f"{run}/final", cfg.get("maze_size"), cfg.get("eval_mazes"), cfg.get("eval_samples"),
            lines[-1][PASSK[0]])
    return wrong


SANDBOX = {}       # main's args and bwrap, for the replays of --runs (a test's grading: the defaults below)


def model_folder(root, model):
    """The folder a run or an evaluation names as its model, resolved: None unless it is inside root, the folder
    graded, and holds a model.safetensors."""
    if not isinstance(model, str) or not model:
        return None
    d = (Path(root) / model).resolve()
    return d if d.is_relative_to(Path(root).resolve()) and (d / "model.safetensors").is_file() else None


REPLAY_STEPS = 2   # a run's steps replayed: step 1's metrics are measured before its update, step 2's after it


def replayed(root, run, cfg, first):
    """[] when the run's first steps (its metrics.jsonl rows `first`), replayed in the sandbox with the graded files
    in root (those the run ran: ran_the_hand_in) from the run's own --model (harness.replay), log what those rows
    say, within what another CPU changes (harness.RL_TOL's bound for later steps); else why. A script's numbers tie
    to no code and no model; a run whose update went another way than it goes in the grader (code that turns its
    gradient where it is not graded) differs at step 2."""
    args = SANDBOX.get("args") or argparse.Namespace(budget=300, timeout=60, import_timeout=120, memory_gb=8)
    bwrap = SANDBOX["bwrap"] if "bwrap" in SANDBOX else sandbox()[0]
    model = model_folder(root, cfg.get("model"))
    if model is None:
        return [f"{run}: its --model {cfg.get('model')!r} is no model folder in {root}: no step can be replayed"]
    files = [f for f in model.iterdir() if f.is_file() and not f.is_symlink()]
    if sum(f.stat().st_size for f in files) > 1 << 30:
        return [f"{run}: its --model {cfg.get('model')!r} holds over 1 GiB: not the CPU tier's maze model"]
    pid = f"replay {run}"
    with tempfile.TemporaryDirectory(prefix="fgrpo_replay_") as tmp:
        folder, left = release_folder(tmp, "release", Path(root))
        if left:
            return [f"{run}: {', '.join(sorted(left))} in {root} cannot be graded ({next(iter(left.values()))})"]
        (folder / ".grade" / "model").mkdir()
        for f in files:
            shutil.copyfile(f, folder / ".grade" / "model" / f.name)
        for p in [folder / ".grade", *(folder / ".grade").rglob("*")]:
            p.chmod(p.stat().st_mode | (0o777 if p.is_dir() else 0o444))
        got, why = run_child(folder, {pid: [{"call": "train.rl_step", "replay": cfg, "model": ".grade/model",
                                             "steps": len(first)}]}, [pid], args, bwrap)
    got = got.get(pid, [None])[0]
    rows = got.get("rows") if isinstance(got, dict) else None
    if not (isinstance(rows, list) and len(rows) == len(first) and all(isinstance(r, dict) for r in rows)):
        return [f"{run}: its first steps could not be replayed with the graded files in {root}: "
                + shown(str(got.get("error") if isinstance(got, dict) else why.get(pid, "no result")))]
    rel, tol = harness.RL_TOL[1]
    for step, (mine, logged) in enumerate(zip(rows, first), 1):
        off = [k for k in harness.RL_METRICS if isinstance(logged.get(k), (int, float)) and not
               (isinstance(mine.get(k), float) and math.isclose(mine[k], logged[k], rel_tol=rel, abs_tol=tol))]
        if off:
            return [f"{run}: step {step}, replayed with the graded files in {root} from its --model, logs {off[0]} = "
                    f"{mine.get(off[0])}, its metrics.jsonl {logged[off[0]]}: that log is not a run of this code"
                    + (" as it runs here" if step > 1 else "")]
    return []


def trained(root, run, model):
    """[] unless the run's exported final/ holds the very weights of the --model it started from (a run whose
    steps were replayed, then its warm start copied as its result): else why."""
    final, start = model_folder(root, f"{run}/final"), model_folder(root, model)
    if final and start and file_sha256(final / "model.safetensors") == file_sha256(start / "model.safetensors"):
        return [f"{run}: final/ holds the weights of its --model {model}: no step trained it"]
    return []


TIE_SAMPLES, TIE_Z, TIE_SEED = 16, 5.0, 99991      # fresh samples per maze; standard errors allowed; their seed


def tied_to_model(root, what, model, size, mazes, samples, claimed, **sampling):
    """[] when `claimed`, a strict pass@1 over the first `mazes` held-out mazes of `size` (0: the model's
    sft.json) x `samples` samples, is what root/model gives there with TIE_SAMPLES fresh samples a maze: a
    result no run of that model wrote (a script's numbers) is refused. Both are binomial on the same mazes,
    so the bound is the within-maze spread, at most p(1 - p) a sample: TIE_Z standard errors of the gap.
    The model is loaded as data only: the maze architecture of maze.build_model, weights from safetensors;
    `sampling`: evaluate.py's temperature, top_p, top_k (a run's evaluation samples at temperature 1)."""
    import maze
    import rollout
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.disable_progress_bar()
    if not (type(mazes) is int and 0 < mazes <= 1024 and type(samples) is int and samples > 0
            and isinstance(claimed, (int, float)) and 0 <= claimed <= 1):
        return [f"{what}: {mazes!r} mazes x {samples!r} samples, pass@1 {claimed!r}: no evaluation to tie"]
    d = model_folder(root, model)
    if d is None:
        return [f"{what}: no model at {model} (model.safetensors) to tie its evaluation to"]
    try:
        size = size or maze.checkpoint_size(d)
        net = AutoModelForCausalLM.from_pretrained(d, config=maze.build_model().config, use_safetensors=True).eval()
        grids = maze.heldout_mazes(size, mazes)
        with torch.no_grad():
            c = maze.evaluate_mazes(rollout.TorchEngine(net, pad_token_id=maze.PAD), maze.build_tokenizer(), grids,
                                    TIE_SAMPLES, TIE_SEED, **sampling)["strict"]
    except Exception as e:  # noqa: BLE001: the files and flags are the student's; the code is ours
        return [f"{what}: {model} is not a maze model, or its flags no evaluation, this release runs "
                f"({type(e).__name__})"]
    got = sum(c) / (TIE_SAMPLES * len(grids))
    p = min(max((got + claimed) / 2, 0.02), 0.98)
    se = math.sqrt(p * (1 - p) / len(grids) * (1 / TIE_SAMPLES + 1 / samples))
    if abs(got - claimed) > TIE_Z * se:
        return [f"{what}: pass@1 {claimed:.3f}, but {model} gives {got:.3f} on the same {len(grids)} mazes "
                f"({TIE_SAMPLES} fresh samples each: {abs(got - claimed) / se:.1f} standard errors apart)"]
    return []


def check_eval(root, path, benchmark, n, problems=None):
    """evaluate.py's result JSON: the benchmark finished with n samples per problem, pass@k finite."""
    r, err = read_json(Path(root) / path)
    if err:
        return [err]
    b = r.get("benchmarks", {}).get(benchmark)
    if not isinstance(b, dict) or "pass@k" not in b or benchmark in r.get("pending", []):
        return [f"{path}: no finished result for {benchmark}"]
    wrong = [] if b.get("n") == n else [f"{path}: {benchmark} has n = {b.get('n')}, required {n}"]
    if problems is not None and len(b.get("c", [])) != problems:
        wrong.append(f"{path}: {benchmark} has {len(b.get('c', []))} problems, required {problems}")
    if not finite_numbers(b["pass@k"]):
        wrong.append(f"{path}: {benchmark} pass@k holds NaN or inf")
    cfg, c = r.get("config"), b.get("c")
    if benchmark == "maze" and not wrong:       # tied to the model it names, as a run's last evaluation is
        if not (isinstance(cfg, dict) and isinstance(cfg.get("model"), str)):
            return [f"{path}: names no --model to tie its numbers to"]
        if b.get("rule") != "strict" or not (isinstance(c, list) and c and all(type(x) is int for x in c)):
            return [f"{path}: its maze counts c are not the strict rule's, one integer a maze"]
        wrong += tied_to_model(root, path, cfg["model"], 0, len(c), n, sum(c) / (n * len(c)),
                               **{k: cfg[k] for k in ("temperature", "top_p", "top_k") if k in cfg})
    return wrong


def check_file(root, path, keys=()):
    """A file exists (a JSON one holding `keys`)."""
    p = Path(root) / path
    if not p.is_file():
        return [f"{path}: missing"]
    if keys:
        r, err = read_json(p)
        if err or not all(k in r for k in keys):
            return [err or f"{path}: lacks {', '.join(k for k in keys if k not in r)}"]
    return []


def check_simulation(root, path, steps, gammas, group_sizes, seeds):
    """simulate.py's results.json: the required sweep, every (N, gamma, seed) run, finite finals."""
    r, err = read_json(Path(root) / path / "results.json")
    if err:
        return [err]
    cfg = r.get("config", {})
    want = {"steps": steps, "gammas": list(gammas), "group_sizes": list(group_sizes), "seeds": seeds}
    wrong = [f"{path}: --{k} {cfg.get(k)}, required {v}" for k, v in want.items() if cfg.get(k) != v]
    wrong += ran_the_hand_in(root, r, path)
    runs = r.get("runs", [])
    if len(runs) != len(gammas) * len(group_sizes) * seeds:
        wrong.append(f"{path}: {len(runs)} runs, required {len(gammas) * len(group_sizes) * seeds}")
    if not all(finite_numbers([x.get("Q_pos_final"), x.get("M_ret_final")]) and "M_ret_final" in x for x in runs):
        wrong.append(f"{path}: a run has no finite final Q_pos / M_ret")
    return wrong + check_file(root, f"{path}/fig2.png")


def check_lemma(root, path):
    """The student's Lemma 3.1 table {"mu,rho": [N*, peak]} against this repository's tail_miss_argmax
    (the reference's in the teacher's repository)."""
    r, err = read_json(Path(root) / path)
    if err:
        return [err]
    import advantage
    wrong = []
    for mu in (0.8, 0.5, 0.3, 0.2):
        for rho in (0.01, 0.05, 0.1, 0.2):
            key, (n, peak) = f"{mu},{rho}", advantage.tail_miss_argmax(mu, rho * mu)
            got = r.get(key) if isinstance(r, dict) else None
            if not (isinstance(got, list) and len(got) == 2 and got[0] == n
                    and isinstance(got[1], (int, float)) and abs(got[1] - peak) < 1e-3):
                wrong.append(f"{path}: {key} is {got}, not N* = {n} with {peak:.3f}")
    return wrong[:3]


CLASS = dict(task="maze", lr=1e-4, prompts_per_step=32, mini_batch_prompts=32, group_size=8,
             eval_mazes=128, eval_samples=64)                        # README's 15-minute version
PASSK = ("eval/strict/pass@1", "eval/strict/pass@64")                # logged at the last step
TABLE1 = dict(task="math", loss="grpo", group_size=8, prompts_per_step=256, mini_batch_prompts=64, lr=1e-6)
G = ("0", "0.5")                   # gamma as the handout's shell loops spell it in folder names


def each(check, items):
    """One check over several (args, kwargs): passes when all pass."""
    return lambda root: sum((check(root, *a, **k) for a, k in items), [])


# (id, title, [(points, check(root) -> what is wrong)]); the ids and points are those of HANDOUT.md.
EXPERIMENTS = [
    ("E1", "categorical simulation (Sec. 5.1)",
     [(2, lambda root: check_simulation(root, "out/simulate", 1000, (0.0, 1.0), [2 ** k for k in range(1, 18)], 4))]),
    ("E2", "Lemma 3.1 table", [(1, lambda root: check_lemma(root, "out/lemma.json"))]),
    ("E3", "7x7 maze, GRPO vs F-GRPO (class run)",
     [(1, lambda root: check_eval(root, "out/class/sft_eval.json", "maze", 64, 128)),
      (2, each(check_run, [((f"out/class/g{g}_s{s}", 80), dict(CLASS, gamma=float(g), seed=s, last=PASSK, tie=True))
                           for g in G for s in (0, 1)]))]),
    ("A1", "ablation: gamma sweep",
     [(1, each(check_run, [((f"out/ablate/gamma{g}", 80), dict(CLASS, gamma=float(g), seed=0, last=PASSK, tie=True))
                           for g in ("0.25", "1", "2")]))]),
    ("A2", "ablation: group size N",
     [(1, each(check_run, [((f"out/ablate/N{n}_g{g}", 80), dict(CLASS, group_size=n, gamma=float(g), seed=0,
                                                                last=PASSK, tie=True)) for n in (4, 16) for g in G]))]),
    ("A3", "ablation: no std normalisation",
     [(1, each(check_run, [((f"out/ablate/nostd_g{g}", 80), dict(CLASS, gamma=float(g), seed=0, norm_std=False,
                                                                 last=PASSK, tie=True)) for g in G]))]),
    ("A4", "ablation: loss aggregation",
     [(1, each(check_run, [((f"out/ablate/agg_{a}", 80), dict(CLASS, gamma=0.0, seed=0, loss_agg=a, last=PASSK, tie=True))
                           for a in ("seq-mean-token-mean", "seq-mean-token-sum-norm")]))]),
    ("A5", "ablation: pass@k at large k",
     [(1, each(check_eval, [((f"out/passk/{m}.json", "maze", 1024, 32), {}) for m in ("sft", "grpo", "fgrpo")]))]),
    ("G1", "one GPU: 17x17 maze",
     [(1, lambda root: check_file(root, "out/maze17/sft/sft.json")),
      (1, each(check_run, [((f"out/maze17/g{g}", 1000), dict(task="maze", group_size=8, prompts_per_step=256,
                                                             gamma=float(g), last=PASSK)) for g in G])),
      (1, lambda root: each(check_eval, [((f"out/maze17/g{g}.json", "maze", 256, 256), {}) for g in G])(root)
       + check_file(root, "out/maze17/cmp.json", ("tests",)))]),
    ("G2", "one GPU: a small LLM",
     [(1, each(check_run, [((f"out/llm/g{g}", 150), dict(task="math", group_size=8, prompts_per_step=64,
                                                         mini_batch_prompts=16, gamma=float(g))) for g in G])),
      (1, lambda root: each(check_eval, [((f"out/llm/g{g}.json", "math500", 64), {}) for g in G])(root)
       + check_file(root, "out/llm/cmp.json", ("tests",)))]),
    ("T1", "8xH100 node: one Table 1 row",
     [(2, each(check_run, [(("out/grpo", 1530), dict(TABLE1, world=8, gamma=0.0)),
                           (("out/fgrpo", 1530), dict(TABLE1, world=8, gamma=0.5))])),
      (1, lambda root: each(check_file, [((f"runs/eval/{a}/selection.json", ("best", "n")), {})
                                         for a in ("grpo", "fgrpo")])(root)
       + check_file(root, "runs/eval/cmp_grpo.json", ("tests",)) + check_file(root, "runs/eval/table1_grpo.md"))]),
]


def counted_experiments(exp):
    """HANDOUT.md's required part: E1-E3 and the two best ablations ("pick two"); and the rest (GPU
    and node tiers), which the total leaves out. exp: grade_experiments' rows."""
    ablations = sorted((r for r in exp if r[0].startswith("A")), key=lambda r: -r[2])[:2]
    counted = [r for r in exp if r[0].startswith("E") or any(r is a for a in ablations)]
    return counted, [r for r in exp if r[0][0] in "GT"]


# Experiments whose file holds what a graded function computes: they count only when that problem
# passes in the same grading run (the submission's own code then computes the file's numbers).
NEEDS = {"E2": "tail_miss"}


def grade_experiments(root, passed=None):
    """[(id, title, points earned, points, [what is wrong])]. passed: the problems that scored."""
    rows = []
    for eid, title, checks in EXPERIMENTS:
        earned, total, wrong = 0.0, 0.0, []
        if eid in NEEDS and passed is not None and NEEDS[eid] not in passed:
            why = [f"Problem {NEEDS[eid]!r} does not pass here, so the file is not your code's output"]
            checks = [(points, lambda root: why) for points, _ in checks]
        for points, judge_files in checks:
            w = judge_files(root)
            earned, total, wrong = earned + (0 if w else points), total + points, wrong + w
        rows.append((eid, title, earned, total, wrong))
    return rows


# -----------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", default=str(ROOT), help="the folder to grade (default: this repository)")
    p.add_argument("--runs", default="", help="folder the handout's commands ran in: also grade the experiments")
    p.add_argument("--json", default="", help="also write the scores to this new file (or one grade.py wrote)")
    p.add_argument("--seed", type=int, default=None, help="seed of the hidden checks (default: a new one)")
    p.add_argument("--timeout", type=float, default=60, help="seconds per problem")
    p.add_argument("--import_timeout", type=float, default=120, help="seconds to import the graded files (torch too)")
    p.add_argument("--budget", type=float, default=300, help="seconds for all of a hand-in's checks together")
    p.add_argument("--memory_gb", type=int, default=8, help="data segment cap of the child (RLIMIT_DATA)")
    p.add_argument("--no_sandbox", default="false", choices=["true", "false"],
                   help="grade without bubblewrap, accepting the risk: the graded code then runs as you, and can "
                        "read the reference and other students' grades, outlive the grader and write to its output")
    args = p.parse_args()
    src = Path(args.dir).resolve()
    try:
        check(src.is_dir(), f"{args.dir}: not a folder; pass a student's folder (whole, or its graded files)")
        check(args.timeout > 0 and args.import_timeout > 0 and args.budget > 0,
              "--timeout, --import_timeout and --budget must be > 0")
        check(args.memory_gb >= 1, "--memory_gb must be >= 1")
        check(not args.runs or Path(args.runs).is_dir(), f"--runs {args.runs}: not a folder")
        if args.json:
            check_out_file(args.json, "--json", "grade.py")
    except ValueError as e:
        refuse(str(e))
    if args.seed is None and teacher_side():
        args.seed = secrets.randbelow(1 << 31)

    bwrap, why = sandbox() if args.no_sandbox == "false" else (None, "--no_sandbox true")
    SANDBOX.update(args=args, bwrap=bwrap)
    if bwrap is None and args.no_sandbox == "false":
        if teacher_side():      # the reference and other students' grades are here: never without a sandbox
            refuse(f"no sandbox for the graded code: {why}; install it, or pass --no_sandbox true to accept the "
                   "risk (the code then runs as you, with the reference and your files in reach)")
        print(f"note: no sandbox ({why}): grading your own code unsandboxed")
    try:
        rows = grade_problems(src, args, bwrap)
    except GraderFailure as e:
        print(f"could not run: {shown(e)}; nothing was graded (the grader's failure, not the hand-in's): "
              "rerun when the machine is less loaded", file=sys.stderr)
        sys.exit(3)
    hidden = f", hidden checks of seed {args.seed}" if teacher_side() else ", public checks only"
    print(f"implementation problems ({src}{hidden}):")
    for i, (pid, earned, points, about, passed, n, messages) in enumerate(rows, 1):
        print(f"  {i:2d}. {pid:17s} {earned:g} / {points}   {passed}/{n} checks   {about}")
        for m in list(dict.fromkeys(messages))[:3]:       # one line per distinct reason (stubs: one line)
            print(f"        FAIL {m}")
    earned, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    report = {"seed": args.seed, "problems": {r[0]: {"points": r[1], "max": r[2], "checks": r[5], "passed": r[4],
                                                     "failed": r[6]} for r in rows},
              "implementation": [earned, total], "sandbox": bwrap is not None}
    if args.runs:
        print(f"experiment problems, machine-checked part ({args.runs}; plots and sentences are graded by hand):")
        exp = grade_experiments(Path(args.runs), {r[0] for r in rows if r[1] == r[2]})
        for eid, title, e, t, wrong in exp:
            print(f"  {eid:3s} {title:40s} {e:g} / {t:g}")
            for w in wrong[:4]:
                print(f"        {shown(w)}")             # the runs' files are the student's too
        counted, extra = counted_experiments(exp)
        e_sum, t_sum = sum(r[2] for r in counted), sum(r[3] for r in counted)
        x_sum, xt_sum = sum(r[2] for r in extra), sum(r[3] for r in extra)
        print(f"experiments, required: {e_sum:g} / {t_sum:g} (E1-E3 and the best two of A1-A5: "
              f"{', '.join(r[0] for r in counted if r[0].startswith('A'))}); "
              f"the GPU and node tiers: {x_sum:g} / {xt_sum:g}, outside the total (extra credit, or in place of "
              f"ablations, as the course decides); the rest of each problem is graded by hand")
        report["experiments"] = {r[0]: {"points": r[2], "max": r[3], "wrong": r[4], "counted": r in counted}
                                 for r in exp}
        earned, total = earned + e_sum, total + t_sum
    report["total"] = [earned, total]
    if args.json:
        write_json_out(args.json, report, "grade.py")
    print(f"total: {earned:g} / {total:g}")


if __name__ == "__main__":
    main()
