"""The tests' `python SCRIPT ...`, started in a fraction of the time: forked from a process that imported torch
and transformers once (a zygote), instead of each launch importing them again (3-4 s of every train.py,
evaluate.py or grade.py a test starts, most of a small run).

    from launch import run, popen            # subprocess.run / subprocess.Popen for [sys.executable, ...]

A launch is a real process (its own pid, files, exit status, signals; kill -9 kills it), running the script
as `python SCRIPT` does: __main__, sys.argv, sys.path[0] the script's folder, its own cwd and environment,
stdin/stdout/stderr, exit code, uncaught tracebacks, atexit. What a fork cannot give falls back to
subprocess: other interpreter flags, or an environment that differs in a variable read at import
(threads, Hugging Face's offline and logging settings, PYTHON*). Only third-party libraries are imported
ahead: the program's own modules are imported by the launch, so run.json's code hashes are its own. Two
zygotes with different PYTHONHASHSEED take turns, so consecutive launches (a run, then its resume)
iterate sets of strings in different orders, as two processes do. Not for a child that measures its own
memory: a fork starts with the zygote's pages (its peak RSS read 33 MB above a fresh process's in
tests/test_logp_memory.py), so those stay plain subprocesses.
"""
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = ["torch", "torch.distributed.checkpoint", "torch.distributed.fsdp", "numpy", "safetensors.torch", "tqdm",
           "transformers", "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
           "transformers.models.qwen2.modeling_qwen2", "transformers.models.llama.modeling_llama", "math_verify"]
# Variables a library reads when it is imported: a launch that sets them otherwise than the zygote cannot fork
IMPORT_TIME = ("OMP_", "MKL_", "KMP_", "OPENBLAS", "TORCH", "CUDA", "HF_", "TRANSFORMERS", "TOKENIZERS", "PYTHON",
               "LD_")


def import_time_env(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k != "PYTHONUNBUFFERED"}


# -----------------------------------------------------------------------------
# The zygote (this file run as a script): import, then fork one launch per request

def serve(fd):
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)                  # waiters are reaped by the kernel
    control = socket.socket(fileno=fd)
    control.sendall(b"R")                                        # ready
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(control, 1 << 20, 5)
        except OSError:
            return
        if not msg:
            return                                               # the tests' process is gone
        if os.fork() == 0:
            control.close()
            waiter(json.loads(msg), fds)
        for f in fds:
            os.close(f)


def waiter(req, fds):
    """A fork of the zygote that forks the launch, reports its pid, waits for it and reports its status."""
    reply, std = socket.socket(fileno=fds[0]), fds[1:]
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        reply.close()
        child(req, std)
    for f in std:                                                  # the launch alone holds its stdout and stderr
        os.close(f)
    try:
        reply.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:
        pass
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    try:
        reply.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    except OSError:
        pass
    os._exit(0)


def child(req, std):
    import atexit
    import builtins
    import random
    import traceback
    import types
    for target, f in enumerate(std):
        os.dup2(f, target)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    unbuffered = req["unbuffered"] or bool(os.environ.get("PYTHONUNBUFFERED"))
    # the same stream objects (a library may hold them), now on the launch's descriptors, buffered as there
    sys.stdout.reconfigure(line_buffering=os.isatty(1), write_through=unbuffered)
    sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)
    random.seed()                                                 # as a fresh process: not the zygote's draws
    argv, code = req["argv"], 0
    main = types.ModuleType("__main__")                            # what `python SCRIPT` runs the script as
    main.__builtins__, sys.modules["__main__"] = builtins, main
    try:
        if argv[0] == "-c":
            sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:
            path = os.path.abspath(argv[0])                        # __main__.__file__ is absolute, argv[0] as typed
            sys.argv, sys.path[0], main.__file__ = list(argv), os.path.dirname(path), path
            exec(compile(Path(path).read_bytes(), path, "exec"), main.__dict__)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 (what the interpreter prints for an uncaught exception)
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()                                     # non-daemon threads, as at interpreter exit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


# -----------------------------------------------------------------------------
# The tests' side

class Zygote:
    def __init__(self, env, hash_seed):
        self.env, self.hash_seed, self.lock = env, hash_seed, threading.Lock()
        self.start()

    def start(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)     # a request is one message
        self.proc = subprocess.Popen([sys.executable, __file__, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                     env={**self.env, "PYTHONHASHSEED": str(self.hash_seed)}, cwd=ROOT,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        theirs.close()
        self.control, self.ready = mine, False

    def send(self, req, fds):
        """Hand the request to the zygote; one that died (killed with a test's process group, out of memory)
        is started again once, instead of every later launch on it raising BrokenPipeError."""
        with self.lock:
            for attempt in (0, 1):
                try:
                    if not self.ready:
                        self.ready = self.control.recv(1) == b"R"
                        if not self.ready:
                            raise ConnectionError("the zygote did not start")
                    socket.send_fds(self.control, [json.dumps(req).encode()], fds)
                    return
                except OSError:
                    if attempt:
                        raise
                    self.proc.kill()
                    self.control.close()
                    self.start()


_zygotes, _turn, _start = {}, itertools.count(), threading.Lock()


def zygote_for(env):
    key = json.dumps(import_time_env(env), sort_keys=True)
    with _start:
        if key not in _zygotes:
            _zygotes[key] = [Zygote(env, seed) for seed in (101 + os.getpid() % 1000, 2203 + os.getpid() % 1000)]
        pair = _zygotes[key]
    return pair[next(_turn) % 2]


def forkable(cmd):
    """argv after the interpreter if cmd is `python [-u] SCRIPT.py ...` or `python -c CODE ...`, else None."""
    cmd = [str(c) for c in cmd]
    if len(cmd) < 2 or cmd[0] != sys.executable:
        return None
    rest, unbuffered = cmd[1:], False
    if rest[0] == "-u":
        rest, unbuffered = rest[1:], True
    if rest and (rest[0] == "-c" and len(rest) >= 2 or rest[0].endswith(".py") and not rest[0].startswith("-")):
        return rest, unbuffered
    return None


class Launched:
    """What the tests use of subprocess.Popen: pid, poll, wait, send_signal, kill, communicate, returncode,
    stdout and stderr (file objects for subprocess.PIPE)."""

    def __init__(self, cmd, cwd=None, env=None, stdout=None, stderr=None, text=False):
        env = dict(os.environ if env is None else env)
        argv, unbuffered = forkable(cmd)
        self.args, self.returncode, self.stdin = cmd, None, None
        null = os.open(os.devnull, os.O_RDWR)
        fds, close, pipes = [null], [null], {}                            # stdin: nothing to read
        for i, how in ((1, stdout), (2, stderr)):
            if how == subprocess.PIPE:
                r, w = os.pipe()
                fds.append(w)
                close.append(w)
                pipes[i] = os.fdopen(r, "r" if text else "rb")
            elif how == subprocess.DEVNULL:
                fds.append(null)
            elif how == subprocess.STDOUT and i == 2:
                fds.append(fds[1])
            else:
                fds.append(how.fileno() if hasattr(how, "fileno") else i)      # a file, or ours
        self.stdout, self.stderr = pipes.get(1), pipes.get(2)
        mine, theirs = socket.socketpair()
        zygote_for(env).send({"argv": argv, "cwd": str(cwd or os.getcwd()), "env": env, "unbuffered": unbuffered},
                             [theirs.fileno(), *fds])
        theirs.close()
        for f in close:
            os.close(f)
        self._reply, self._buf = mine, b""
        started = self._message(None)
        if "pid" not in started:
            raise RuntimeError(f"the zygote did not start {cmd}")
        self.pid = started["pid"]

    def _message(self, timeout):
        """The waiter's next line ({"pid"} then {"status"}), or None if none came within timeout seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._reply], [], [], left)[0]:
                return None
            data = self._reply.recv(4096)
            if not data:                                # the waiter is gone without a word: killed with its child
                return {"status": -signal.SIGKILL}
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def poll(self):
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            msg = self._message(timeout)
            if msg is None:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = msg["status"]
            self._reply.close()
        return self.returncode

    def send_signal(self, sig):
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def communicate(self, timeout=None):
        out = {}
        readers = [threading.Thread(target=lambda n=n, f=f: out.__setitem__(n, f.read()), daemon=True)
                   for n, f in (("stdout", self.stdout), ("stderr", self.stderr)) if f is not None]
        for t in readers:
            t.start()
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        finally:
            for t in readers:
                t.join()
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        return out.get("stdout"), out.get("stderr")


MAX_REQUEST = 1 << 17      # bytes of one request (its environment): past a socket's message size, a plain subprocess


def popen(cmd, cwd=None, env=None, stdin=None, stdout=None, stderr=None, text=False):
    """subprocess.Popen(cmd, ...), forked from a zygote where it can be."""
    if (forkable(cmd) is None or stdin not in (None, subprocess.DEVNULL)
            or len(json.dumps(dict(os.environ if env is None else env))) > MAX_REQUEST):
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr, text=text)
    return Launched(cmd, cwd, env, stdout, stderr, text)


def run(cmd, cwd=None, env=None, capture_output=False, text=False, timeout=None, stdout=None, stderr=None,
        check=False):
    """subprocess.run(cmd, ...), forked from a zygote where it can be."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    p = popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if check:
        r.check_returncode()
    return r


if __name__ == "__main__":
    serve(int(sys.argv[1]))
