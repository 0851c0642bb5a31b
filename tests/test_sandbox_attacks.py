"""
Attacks on the edges of the grader's sandbox (issue 49). Each is code appended to a stub student
copy's advantage.py (the stubs left in, so an honest score is 0): frames of its own on the results
pipe, floods of output, terminal escape sequences, a fork bomb and other resource exhaustion, torch or
the harness patched at import, and a search for the reference or another hand-in. Each must score at
most 1 point in the --json report and in the last line, and the grader must end with its `total:`
line, its output short, with no control character from the hand-in and no other line that starts
like its last.

    python -m pytest -q tests/test_sandbox_attacks.py

Withheld from the student copy (assignments/problems.WITHHELD): it holds attacks on the grader.
"""
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import test_assignments
from test_assignments import FULL, ROOT, needs_sandbox, run

student = test_assignments.student          # the fixture: the stub student copy, made once for this file

sys.path.insert(0, str(ROOT / "assignments"))
import grade  # noqa: E402
import harness  # noqa: E402
from problems import GRADED_FILES  # noqa: E402

# The results pipe as the hand-in finds it: the write end of a pipe among its file descriptors (not
# stdout or stderr, which are the log), and frames written as harness.send writes them. _todo: the
# problems this child is to answer, in order (its checks file is in reach).
PIPE = """
import fcntl, io, os, stat, sys, torch
def _pipes():
    for fd in range(3, 1024):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                yield fd
        except OSError:
            pass
def _raw(data):
    for fd in _pipes():
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
def _frame(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    _raw(len(buf.getvalue()).to_bytes(8, "little") + buf.getvalue())
_todo = list(torch.load(".grade/checks.pt", weights_only=True))
"""

# What would show as the grader's last line, wrapped in escape sequences: erase the line and go back to
# its start (CSI), set the window title (OSC ... BEL), an 8-bit CSI, a right-to-left override.
FAKE_TOTAL = "\\x1b[2K\\x1b[1G\\x1b[Atotal: 24 / 24\\x1b]0;graded\\x07\\x9b2J\\u202e"


# a correct group_advantages that zeroes its input after use (the caller reads it again)
ZEROES_ITS_INPUT = """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = rewards.clone() if rewards.is_floating_point() else rewards.float()
    if R.ndim != 2:
        raise ValueError("rewards must be (num_groups, N)")
    adv = R - R.mean(dim=1, keepdim=True)
    if normalize_std and R.shape[1] > 1:
        adv = adv / (R.std(dim=1, keepdim=True) + eps)
    adv = adv.masked_fill((R == R[:, :1]).all(dim=1, keepdim=True), 0.0)
    rewards.zero_()
    return adv
"""

ATTACKS = {
    # every problem's results, forged: the public answers shipped in expected.json for the public checks
    # (the hidden ones get copies), then the child exits before the harness sends its own
    "forged_public_answers": PIPE + """
import json
def _dec(v):
    if isinstance(v, dict) and set(v) == {"tensor", "dtype"}:
        return torch.tensor(v["tensor"], dtype=getattr(torch, v["dtype"]))
    if isinstance(v, dict):
        return {k: _dec(x) for k, x in v.items()}
    return [_dec(x) for x in v] if isinstance(v, list) else v
_answers = _dec(json.load(open("assignments/expected.json"))["results"])
_checks = torch.load(".grade/checks.pt", weights_only=True)
_frame("imported")
for _pid in _todo:
    _pub = [dict(r, mutated=False) for r in _answers.get(_pid, [])] or [{"steps": []}]
    _frame({"problem": _pid, "results": [_pub[min(i, len(_pub) - 1)] for i in range(len(_checks[_pid]))]})
os._exit(0)
""",
    # a frame that is not "imported" first: a tensor (the grader once asked it for a truth value)
    "malformed_first_frame": PIPE + "_frame(torch.arange(3))\nos._exit(0)\n",
    # one malformed frame in place of a problem's results per child, a new one in each fresh child: a
    # tensor, a str, huge lengths, garbage, a truncated frame, a pickle weights_only refuses, a zip bomb,
    # another problem's results, the same problem's twice (test_frames_read_back_are_plain_data: more)
    "malformed_frames": PIPE + """
import pickle, zipfile
class _Refused:                                               # what weights_only must refuse: it would print
    def __reduce__(self):
        return print, ("PWNED by a pickle",)
def _zip(pkl, **kw):                                          # torch.save's zip, its pickle swapped
    z, out = zipfile.ZipFile(io.BytesIO(_plain.getvalue())), io.BytesIO()
    with zipfile.ZipFile(out, "w") as w:
        for n in z.namelist():
            w.writestr(n, pkl if n.endswith("data.pkl") else z.read(n), **kw)
    return len(out.getvalue()).to_bytes(8, "little") + out.getvalue()
_plain = io.BytesIO()
torch.save({"problem": _todo[0], "results": []}, _plain)
_VARIANTS = [
    lambda: _frame(torch.arange(3)),
    lambda: _frame("FAKE_TOTAL"),
    lambda: _raw((2 ** 63).to_bytes(8, "little") + b"x" * 100),
    lambda: _raw((16).to_bytes(8, "little") + os.urandom(16)),
    lambda: _raw((1000).to_bytes(8, "little") + b"x" * 10),  # then the child exits
    lambda: _raw(_zip(pickle.dumps(_Refused(), protocol=2))),
    lambda: _raw(_zip(pickle.dumps("x" * (200 << 20), protocol=2), compress_type=zipfile.ZIP_DEFLATED)),
    lambda: _frame({"problem": _todo[-1], "results": []}),
    lambda: (_frame({"problem": _todo[0], "results": []}), _frame({"problem": _todo[0], "results": []})),
]
from assignments.problems import PROBLEMS
_i = len(PROBLEMS) + 1 - len(_todo)
if _i < len(_VARIANTS):
    _frame("imported")
    _VARIANTS[_i]()
    os._exit(0)
""".replace("FAKE_TOTAL", FAKE_TOTAL),
    # well-formed frames of plain data (test_frames_read_back_are_plain_data: the rest is refused as a
    # whole), whose results are not what judge() reads: the wrong types, kinds and keys everywhere, a
    # number too big for a float, NaN, a call log of the wrong shape, a fake total in an error; the RL
    # run's steps and traceback frames of the wrong types
    "malformed_results": PIPE + """
_out = {"kind": "float", "v": 0.5}
_E = [None, 7, "FAKE_TOTAL", [1], {"error": ["FAKE_TOTAL"]}, {"error": "FAKE_TOTAL" * 10 ** 5},
      {"out": {"kind": "float", "v": 0.5}, "mutated": "no"}, {"out": {"kind": "int", "v": 2 ** 64}, "mutated": False},
      {"out": {"kind": "float", "v": float("nan")}, "mutated": False}, {"out": {"kind": "str", "v": "FAKE_TOTAL"}},
      {"out": {"kind": "tensor", "v": torch.zeros(6, 8, dtype=torch.int64)}, "mutated": False},
      {"out": {"kind": "tuple", "v": [{"kind": "tensor", "v": torch.zeros(6, 8)}, {"kind": "str", "v": "g"}]},
       "mutated": False},
      {"out": {"kind": "dict", "v": {"a": {"kind": "other", "v": None}}}, "mutated": False},
      {"out": _out, "mutated": False, "saved_peak": "big", "grads": [], "param_grads": {"w": 1}},
      {"out": _out, "mutated": False, "spied": [1]}, {"out": _out, "mutated": False, "spied": {"aggregate": [[1]]}},
      {"out": _out, "mutated": False, "spied": {"aggregate": [{"x": [1], "mask": 1}]}},
      {"out": _out, "mutated": False, "frozen": [1], "out_graph": "all"},
      {"out": _out, "mutated": False, "other_ranks": [1, {"out": 5}, {"error": [2]}]}]
_checks = torch.load(".grade/checks.pt", weights_only=True)
_frame("imported")
_rl = [{"steps": [[1], {"task": 3}], "frames": [[1], {}, 7], "error": ["FAKE_TOTAL"]}]
for _k, _pid in enumerate(_todo):
    _frame({"problem": _pid, "results": _rl if _pid == "rl_steps" else
            [_E[(_j + _k) % len(_E)] for _j in range(len(_checks[_pid]))]})
os._exit(0)
""".replace("FAKE_TOTAL", FAKE_TOTAL),
    # about 70 MB of output, on stdout and stderr, in long lines and short ones, then the stubs as usual
    "flood_output": f"""
import os
for _ in range(16):
    os.write(1, b"x" * (2 << 20) + b"\\n")
    os.write(2, ("{FAKE_TOTAL}\\n" * 50000).encode())
""",
    # errors of the graded functions: escape sequences and a fake total (CSI, OSC, backspaces, Unicode line
    # breaks), 32 MiB on one line, a million lines
    "huge_and_escaped_errors": f"""
def group_advantages(*args, **kwargs):
    raise RuntimeError("{FAKE_TOTAL}")
def success_rate(*args, **kwargs):
    raise ValueError("\\x08" * 80 + "total: 24 / 24")
def focal_weight(*args, **kwargs):
    raise RuntimeError("\\x85total: 24 / 24\\u2028total: 24 / 24")
def token_mean(*args, **kwargs):
    raise RuntimeError("B" * (32 << 20))
def aggregate(*args, **kwargs):
    raise RuntimeError("line\\n" * 10 ** 6)
def clip_bounds(*args, **kwargs):
    raise RuntimeError(("\\x1b[2K" * (4 << 20)) + "total: 24 / 24")
""",
    # the same in the child's last words, which the grader shows: escapes printed at import, then a
    # BaseException the harness does not catch, its message 32 MiB of lines, the last of them escapes
    "escapes_in_last_words": f"""
import sys
print("{FAKE_TOTAL}", flush=True)
sys.stdout.write("\\x1b[2J\\x1b[Hall checks passed\\ntotal: 24 / 24\\r\\x1b[31m\\n")
sys.stdout.flush()
raise KeyboardInterrupt("A\\n" * (16 << 20) + "{FAKE_TOTAL}")
""",
    # processes until the OS refuses one, every one of them forking on; the first reports how many it sees
    "fork_bomb": """
import os, time
_me = os.getpid()
while True:
    try:
        os.fork()
    except OSError:
        break
if os.getpid() == _me:
    print("sandbox processes:", sum(p.isdigit() for p in os.listdir("/proc")), flush=True)
    os._exit(1)
time.sleep(600)
""",
    # memory until refused, kept: the import then fails with MemoryError
    "memory": "_keep = []\nwhile True:\n    _keep.append(bytearray(64 << 20))\n",
    # every writable place the sandbox has, filled until refused; then the stubs as usual
    "fill_disks": """
import os
_filled = {}
for _d in ("/tmp", "/dev/shm", "/dev", "/", os.getcwd(), os.path.join(os.getcwd(), ".grade"), "/home", "/var/tmp",
           "/run"):
    _filled[_d] = 0
    try:
        with open(os.path.join(_d, "fill"), "wb") as _f:
            while True:
                _f.write(b"\\0" * (16 << 20))
                _filled[_d] += 16
    except OSError:
        pass
print("MiB written:", _filled, flush=True)
""",
    # file descriptors until EMFILE, all kept open, at the last call before the multi-rank checks start
    "file_descriptors": """
_fds = []
def maze_reward(*args, **kwargs):
    try:
        while True:
            _fds.append(open("/dev/null"))
    except OSError:
        raise NotImplementedError(f"{len(_fds)} files open")
""",
    # a grader's failure (the OS refused the checks' processes: no total, nothing charged), claimed: by an
    # exception of that name, by the harness's multi-rank runner patched, by a child dying of EAGAIN
    "forged_grader_failure": """
import sys
class GraderFailure(Exception):
    pass
def success_rate(*args, **kwargs):
    raise GraderFailure("rank 1 ended with no result")
sys.modules["__main__"].run_ranks = lambda *a: ({"error": "GraderFailure: rank 1 ended with no result"}, {})
""",
    "forged_eagain_at_import": """
import os
print("OSError: [Errno 11] Resource temporarily unavailable", flush=True)
os._exit(1)
""",
    # torch's comparisons and saver, the harness's comparison, runner, RL run and sender, and builtins,
    # patched at import so that the child's own checks pass and what it sends looks like a pass
    "patch_torch_and_harness": """
import builtins, sys, torch
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.isclose = lambda a, b, *r, **k: torch.ones_like(torch.as_tensor(a) + torch.as_tensor(b), dtype=torch.bool)
_h = sys.modules["__main__"]
_h.same = lambda a, b: True
_run_check = _h.run_check
def _fake_check(modules, check, record=False):
    r, t = _run_check(modules, check, record)
    return {"out": _h.enc(check["args"][0] if check.get("args") else 0.0), "mutated": False}, t
_h.run_check = _fake_check
_h.rl_run = lambda modules, seed: {"steps": [{"task": "reverse", **{k: 0.0 for k in _h.RL_METRICS}}] * 4}
_send, _save = _h.send, torch.save
_h.send = lambda out, obj: _send(out, {**obj, "results": [dict(r, mutated=False) for r in obj["results"]]}
                                 if isinstance(obj, dict) else obj)
torch.save = lambda obj, f, *a, **k: _save(obj, f, *a, **k)
import math
math.isclose = lambda *a, **k: True
builtins.Exception = BaseException
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    return rewards - rewards.mean(1, keepdim=True)
""",
    # a correct group_advantages that zeroes its input after use, with torch's comparisons replaced so that
    # a check made in this process would see the input unchanged
    "mutation_behind_patched_equal": """
import torch
torch.equal = lambda *a, **k: True
torch.isclose = lambda a, b, *r, **k: torch.ones(torch.broadcast_shapes(torch.as_tensor(a).shape,
                                                                        torch.as_tensor(b).shape), dtype=torch.bool)
torch.allclose = lambda *a, **k: True
""" + ZEROES_ITS_INPUT,
    # the same, with torch.save (what the harness sends its frames with) replaced so that each input the call
    # zeroed goes out as it was (harness.SAVE: the saver bound before the graded import)
    "mutation_behind_a_patched_saver": """
import torch
_kept, _save = [], torch.save
def _as_it_was(frame):
    for r in frame.get("results", []) if isinstance(frame, dict) else []:
        for e in r.get("inputs_after", []) if isinstance(r, dict) else []:
            t = e.get("v") if isinstance(e, dict) else None
            match = [k for k in _kept if torch.is_tensor(t) and k.shape == t.shape and not t.any()]
            if match:
                e["v"] = match[0]
                _kept.remove(match[0])
    return frame
torch.save = lambda obj, f, *a, **k: _save(_as_it_was(obj), f, *a, **k)
""" + ZEROES_ITS_INPUT + """
_zeroing = group_advantages
def group_advantages(rewards, *a, **k):
    _kept.append(rewards.clone())
    return _zeroing(rewards, *a, **k)
""",
    # a graded function that knows it is graded (called from the harness, on a check's inputs) and answers
    # the public checks from expected.json there, and something else in training: the hidden checks hold
    "detects_the_grader": """
import inspect, json, torch
_pub = json.load(open("assignments/expected.json"))
def _val(v):
    return torch.tensor(v["tensor"], dtype=getattr(torch, v["dtype"])) if isinstance(v, dict) and "tensor" in v else v
def _graded_here(pid, args):
    if not any(f.filename.endswith("harness.py") for f in inspect.stack()):
        return None                                  # training: something else
    for c, r in zip(_pub["checks"][pid], _pub["results"][pid]):
        mine = [_val(a) for a in c["args"]]
        if len(mine) == len(args) and all(torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape
                                          and torch.equal(a.double(), b.double()) for a, b in zip(args, mine)):
            return _val(r["out"]["v"]) if "out" in r else None
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    out = _graded_here("group_advantages", [rewards])
    return out if out is not None else rewards * 0
def success_rate(rewards, r_correct=1.0, r_wrong=0.0):
    out = _graded_here("success_rate", [rewards])
    return out if out is not None else rewards.mean(1)
""",
}

# The reference, and another hand-in with the reference's graded files, looked for wherever the sandbox
# can look: its whole file system, /proc's processes (their cwd, root, environment, command line), the
# parents of its folder, the environment, and the other hand-in's path on the host (OTHER, as if the
# teacher's layout were known). What is found is executed in place of the stubs.
SEARCH = """
import os, glob
def _try(path):
    try:
        text = open(path).read()
    except (OSError, UnicodeDecodeError, ValueError):
        return
    if "def group_advantages" in text and "your code here" not in text:
        exec(text, globals())
        print("found the reference at", path, flush=True)
_places = ["OTHER", "/", "/tmp", os.path.dirname(os.getcwd()), "/work", "/root", "/home"] + list(os.environ.values())
_places += glob.glob("/proc/*/cwd") + glob.glob("/proc/*/root")
for _e in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
    try:
        _places += open(_e, "rb").read().decode(errors="ignore").replace("=", "\\0").split("\\0")
    except OSError:
        pass
for _p in _places:
    if not _p.startswith("/"):
        continue
    for _root, _dirs, _files in os.walk(_p):
        _dirs[:] = [d for d in _dirs if not (_root == "/" and d in ("proc", "sys", "dev"))]
        for _f in _files:
            if _f == "advantage.py":
                _try(os.path.join(_root, _f))
"""

# Seconds the grader may take at most on an attack (each grades 16 small problems on a busy 2-core
# machine, some in a fresh child each); flags that keep the slow ones short, and memory small.
SECONDS = 240
FLAGS = {"fork_bomb": ("--import_timeout", "30"), "memory": ("--memory_gb", "2"),
         "fill_disks": ("--timeout", "10")}       # a full /tmp: the multi-rank checks wait for ranks that never start
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")   # what a terminal acts on


def grade_attack(student, d, code, *flags):
    """Grade a stub copy in folder d with `code` appended to its advantage.py: (--json report, stdout,
    stderr, exit status, seconds)."""
    shutil.copytree(student, d)
    p = d / "advantage.py"
    p.write_text(p.read_text() + "\n" + code)
    out, start = d.parent / f"{d.name}.json", time.monotonic()
    r = run(ROOT / "assignments" / "grade.py", d, "--json", out, "--seed", "5", *flags)
    report = json.loads(out.read_text()) if out.exists() else None
    return report, r.stdout, r.stderr, r.returncode, time.monotonic() - start


@pytest.fixture(scope="module")
def graded(student, tmp_path_factory, request):
    """{attack: grade_attack's tuple} for the attacks the session runs, two at a time."""
    names = [i.callspec.params["name"] for i in request.session.items
             if i.module.__name__ == __name__ and "name" in getattr(getattr(i, "callspec", None), "params", {})]
    tmp = tmp_path_factory.mktemp("attacks")
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(names, pool.map(lambda n: grade_attack(student, tmp / n, ATTACKS[n], *FLAGS.get(n, ())),
                                        names)))


def check_grader_output(report, stdout, stderr, rc, seconds):
    """At most 1 point, in the report and in the last line; a total line last and nowhere else; no
    traceback; output short and free of control characters."""
    assert rc == 0 and report is not None, f"rc {rc}, no total: {stdout[-2000:]}\n{stderr[-3000:]}"
    lines = stdout.splitlines()
    assert lines[-1] == f"total: {report['total'][0]:g} / {FULL}" and report["total"][0] <= 1, lines[-1]
    assert [x for x in lines if "total:" in x[:20]] == [lines[-1]], [x for x in lines if "total:" in x[:20]]
    assert "Traceback" not in stderr and len(stdout) + len(stderr) < 200_000, (len(stdout), stderr[-2000:])
    bad = [x for x in stdout.splitlines() + stderr.splitlines() if CONTROL.search(x)]
    assert not bad, bad[:3]
    assert "PWNED" not in stdout + stderr and seconds < SECONDS, seconds


@needs_sandbox
@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_scores_at_most_one_point(graded, name):
    check_grader_output(*graded[name])
    if name == "fork_bomb":                  # stopped at the grader's cap, not at the machine's
        seen = re.search(r"sandbox processes: (\d+)", json.dumps(graded[name][0]))
        assert seen and int(seen[1]) <= grade.PROCS + 2, graded[name][0]["problems"]["group_advantages"]


@needs_sandbox
def test_another_hand_in_beside_is_out_of_reach(student, tmp_path):
    """A second hand-in with the reference's graded files, unpacked beside the attacked one in the same
    folder (its path given to the attack), and the teacher's tree: none of it is in the sandbox."""
    other = tmp_path / "hand_ins" / "bob"
    shutil.copytree(student, other)
    for f in GRADED_FILES:
        (other / f).write_bytes(subprocess.run(["git", "show", f"HEAD:{f}"], cwd=ROOT, capture_output=True,
                                               check=True).stdout)
    result = grade_attack(student, tmp_path / "hand_ins" / "alice", SEARCH.replace("OTHER", str(other)))
    check_grader_output(*result)
    assert "found the reference" not in result[1] + json.dumps(result[0])


# -----------------------------------------------------------------------------
# What the grader makes of frames and messages, in this process

def read_frame(data):
    """What grade.Child.frame makes of bytes written to the results pipe (then closed)."""
    r, w = os.pipe()
    child = grade.Child.__new__(grade.Child)          # its reading half alone: no process
    child.results, child.read = os.fdopen(r, "rb", buffering=0), 0

    def write():
        try:
            os.write(w, data)
        except BrokenPipeError:                        # a frame refused by its header: the rest is not read
            pass
        os.close(w)
    writer = threading.Thread(target=write)
    writer.start()
    try:
        return child.frame(10)
    finally:
        child.results.close()
        writer.join()


def framed(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return len(buf.getvalue()).to_bytes(8, "little") + buf.getvalue()


def zipped(pkl, **kw):
    """A torch.save zip with its pickle replaced by pkl, framed."""
    buf, out = io.BytesIO(), io.BytesIO()
    torch.save({"problem": "p", "results": []}, buf)
    z = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(out, "w") as w:
        for n in z.namelist():
            w.writestr(n, pkl if n.endswith("data.pkl") else z.read(n), **kw)
    return len(out.getvalue()).to_bytes(8, "little") + out.getvalue()


class Refused:
    def __reduce__(self):
        return print, ("PWNED by a pickle",)


def test_frames_read_back_are_plain_data(capsys):
    """A hand-in can write frames of its own: what harness.send writes comes back as it was; anything else
    is a reason, never an exception here, never gigabytes (an expanded tensor, a zip bomb), never code run."""
    honest = {"problem": "p", "results": [
        {"out": harness.enc((torch.randn(3, 4).t(), np.arange(3), {"a": 1.5, "b": [True, None, "s"]})),
         "mutated": False, "saved_peak": 10, "spied": {"aggregate": [{"x": harness.enc(torch.ones(2))}]}},
        {"error": "ValueError: no"}, {"steps": [{"task": "maze", "loss/pg": 0.5}], "frames": ["f"]}]}
    got = read_frame(framed(honest))
    first = honest["results"][0]["out"]["v"][0]["v"]                 # a transposed tensor: strides kept
    assert isinstance(got, dict) and torch.equal(got["results"][0]["out"]["v"][0]["v"], first)
    assert got["results"][1:] == honest["results"][1:]
    loop = [1]
    loop.append(loop)
    deep = []
    for _ in range(100):
        deep = [deep]
    shared = [list(range(1000))] * 2000                # 2,000 references, two million values to walk
    x = torch.zeros(1, dtype=torch.float64).expand(1 << 28)     # 8 bytes saved, 2 GiB as float64
    malformed = [torch.arange(3), {"out": {"kind": "tensor", "v": x}}, {"out": {"kind": "float", "v": "0.5"}},
                 {"out": {"kind": "float"}}, {"out": {"kind": "int", "v": 10 ** 400}},
                 {"out": {"kind": "tuple", "v": [1]}},
                 {"out": {"kind": "tensor", "v": torch.zeros(2, dtype=torch.complex64)}},
                 {"out": {"kind": "tensor", "v": torch.eye(2).to_sparse()}}, {"mutated": torch.zeros(2)},
                 {1: "int key"}, {"s": {1, 2}}, loop, deep, shared]
    for obj in malformed:
        assert read_frame(framed({"problem": "p", "results": [obj]})) in ("malformed", "unreadable"), obj
    assert read_frame((2 ** 63).to_bytes(8, "little") + b"x" * 100) == "too large"
    assert read_frame((16).to_bytes(8, "little") + os.urandom(16)) == "unreadable"
    assert read_frame((1000).to_bytes(8, "little") + b"x" * 10) == "exited"
    assert read_frame(zipped(pickle.dumps(Refused(), protocol=2))) == "unreadable"
    start = time.monotonic()                           # 200 MiB of pickle deflated to 200 KiB: not unpacked
    assert read_frame(zipped(pickle.dumps("x" * (200 << 20), protocol=2), compress_type=zipfile.ZIP_DEFLATED)) \
        == "unreadable" and time.monotonic() - start < 5
    assert "PWNED" not in capsys.readouterr().out


def test_what_is_shown_of_the_child_is_one_short_line():
    fake = "\x1b[2K\rtotal: 24 / 24\x1b]0;t\x07\x9b2J\u202e\u2028\x85\nx\udc80"
    assert grade.shown(fake) == repr(fake)[1:-1] and len(grade.shown("A" * 10 ** 6)) == grade.SHOWN + len("...")
    assert grade.shown("μ_hat ≤ 1, 'ok'") == "μ_hat ≤ 1, 'ok'"


# -----------------------------------------------------------------------------
# Where the teacher keeps things (issue 50): nothing of theirs shows through a link or a layout

def test_a_graded_file_in_a_linked_folder_is_not_taken(tmp_path):
    """A hand-in whose fgrpo_utils/ is a link (a tar archive keeps one) to the teacher's clone: the file is
    reached through the link, so it is left out (the release's stub is graded), as a linked file is."""
    src = tmp_path / "hand_in"
    src.mkdir()
    for f in GRADED_FILES:
        if "/" not in f:
            (src / f).write_text("# mine\n")
    (src / "fgrpo_utils").symlink_to(ROOT / "fgrpo_utils")
    dst = tmp_path / "release"
    for f in GRADED_FILES:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
    left = grade.take_graded(src, dst)
    assert set(left) == {f for f in GRADED_FILES if "/" in f} and "linked folder" in left["fgrpo_utils/logprob.py"]
    assert not (dst / "fgrpo_utils" / "logprob.py").exists()


def writable(d):
    return os.path.isdir(d) and os.access(d, os.W_OK)


@needs_sandbox
@pytest.mark.parametrize("base", ["/usr/src", sys.prefix])
def test_the_teachers_clone_under_a_bound_folder_is_out_of_reach(student, tmp_path, base):
    """The teacher's clone where the sandbox binds the system or the Python (a container's /usr/src/app,
    inside the virtual environment): graded by that clone, a hand-in that walks every readable folder for the
    reference's advantage.py finds nothing."""
    if not writable(base):
        pytest.skip(f"{base} is not writable here")
    clone = Path(base) / f"fgrpo-teacher-{os.getpid()}"
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        d = tmp_path / "alice"
        shutil.copytree(student, d)
        (d / "advantage.py").write_text((d / "advantage.py").read_text() + SEARCH.replace("OTHER", str(clone)))
        out, start = tmp_path / "alice.json", time.monotonic()
        r = run(clone / "assignments" / "grade.py", d, "--json", out, "--seed", "5")
        result = (json.loads(out.read_text()) if out.exists() else None, r.stdout, r.stderr, r.returncode,
                  time.monotonic() - start)
    finally:
        shutil.rmtree(clone, ignore_errors=True)
    check_grader_output(*result)
    assert "found the reference" not in result[1] + json.dumps(result[0])


def descendants(pid):
    """The processes below pid, read from /proc (each task's children)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out + [d for c in out for d in descendants(c)]


@needs_sandbox
def test_a_stopped_child_leaves_no_process_behind(tmp_path):
    """The sandbox's first process waits for the harness (so that the kernel's count of its peak memory reaches the
    grader, grade.peak_rss) and dies with bwrap. Run as that first process itself, the harness (a user of its own in
    a root grader's sandbox) got no parent-death signal from bwrap: a hand-in that hung at import outlived the
    grader's kill."""
    d = test_assignments.hand_in(tmp_path / "hand-in", "advantage.py",
                                 test_assignments.head_text("advantage.py") + "\nwhile True:\n    pass\n")
    folder, _ = grade.release_folder(tmp_path, "release", d)
    torch.save({"group_advantages": grade.public_checks()[0]["group_advantages"][:1]}, folder / ".grade" / "checks.pt")
    os.chmod(folder / ".grade" / "checks.pt", 0o644)
    child = grade.Child(folder, SimpleNamespace(memory_gb=8, dir=str(d)), test_assignments.SANDBOX)
    inside, end = [], time.monotonic() + 60
    while not inside and time.monotonic() < end:
        time.sleep(0.2)
        inside = descendants(child.proc.pid)
    assert inside, "the sandbox started no process"
    assert child.frame(3) == "timeout"                        # hanging at import
    child.stop()
    time.sleep(1)

    def running(p):                                           # a zombie waits for the machine's init to reap it
        try:
            return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    assert not [p for p in inside if running(p)], "a sandboxed process outlived its child's stop"
