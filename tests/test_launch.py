"""tests/launch.py: a launch forked from the zygote behaves as `python SCRIPT` would, in what the tests read.
`python -m pytest -q tests/test_launch.py`"""
import os
import signal
import subprocess
import sys
import time

import pytest

import launch
from test_train import ENV, ROOT

PY = sys.executable
SHOW = """
import json, os, random, sys, __main__
print(json.dumps(dict(argv=sys.argv, path0=sys.path[0], cwd=os.getcwd(), mine=os.environ.get("MINE"),
                      main_file=getattr(__main__, "__file__", None), hash=hash("fgrpo"), draw=random.random(),
                      torch="torch" in sys.modules, train="train" in sys.modules)))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_launch_is_the_script_as_python_runs_it(tmp_path):
    """argv, sys.path[0], cwd, environment, __main__.__file__ (absolute), exit code, stdout and stderr, as
    `python script.py` gives them; torch is there already, the program's own modules are not."""
    import json
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    got = []
    for code in (0, 3):
        r = launch.run([PY, "show.py", str(code), "x"], cwd=tmp_path, env={**ENV, "MINE": "yes"},
                       capture_output=True, text=True, timeout=120)
        assert r.returncode == code and r.stderr == "to stderr\n", r.stderr
        got.append(json.loads(r.stdout))
    a, b = got
    assert a["argv"] == ["show.py", "0", "x"] and a["path0"] == str(tmp_path) and a["cwd"] == str(tmp_path)
    assert a["mine"] == "yes" and a["main_file"] == str(script) and a["torch"] and not a["train"]
    assert a["hash"] != b["hash"] and a["draw"] != b["draw"]         # two processes: their own hash seed and draws
    real = subprocess.run([PY, "show.py", "0", "x"], cwd=tmp_path, env={**ENV, "MINE": "yes"}, capture_output=True,
                          text=True, timeout=120)
    want = json.loads(real.stdout)
    assert {k: want[k] for k in ("argv", "path0", "cwd", "mine", "main_file")} == \
        {k: a[k] for k in ("argv", "path0", "cwd", "mine", "main_file")}


def test_code_tracebacks_kill_and_fallback(tmp_path):
    """-c CODE; an uncaught exception prints its traceback and exits 1; SIGKILL ends a launch with -9 as
    Popen reports it; a timeout raises as subprocess.run's; an interpreter flag it cannot fork (-m) runs as
    a plain subprocess."""
    r = launch.run([PY, "-c", "import sys; print(sys.argv[1:]); raise ValueError('boom')", "a"], env=ENV,
                   capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == "['a']\n" and r.stderr.splitlines()[-1] == "ValueError: boom"
    assert r.stderr.startswith("Traceback (most recent call last):")
    p = launch.popen([PY, "-c", "import time; print('up', flush=True); time.sleep(60)"], env=ENV,
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout.readline() == "up\n" and p.poll() is None
    start = time.monotonic()
    p.send_signal(signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL and time.monotonic() - start < 30
    assert isinstance(launch.popen([PY, "-m", "json.tool", "--help"], env=ENV, stdout=subprocess.DEVNULL),
                      subprocess.Popen)
    with pytest.raises(subprocess.TimeoutExpired):
        launch.run([PY, "-c", "import time; time.sleep(60)"], env=ENV, capture_output=True, text=True, timeout=1)


@pytest.mark.slow                          # a second pair of zygotes: seconds
def test_an_environment_read_at_import_gets_its_own_zygote():
    """A thread count or Hugging Face setting other than the zygote's is read when a library is imported, so
    such a launch goes to a zygote started with it."""
    env = {**ENV, "OMP_NUM_THREADS": "2"}
    r = launch.run([PY, "-c", "import torch; print(torch.get_num_threads())"], cwd=ROOT, env=env, capture_output=True,
                   text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr
    assert launch.import_time_env(env) != launch.import_time_env(ENV)
    assert launch.import_time_env({**ENV, "PATH": "/nowhere", "PYTHONUNBUFFERED": "0"}) == launch.import_time_env(ENV)


def test_a_dead_zygote_is_started_again_and_a_huge_environment_falls_back():
    """Once one of the two zygotes died, every second launch raised BrokenPipeError for the rest of the test
    run; an environment past a socket's message size raised OSError. Now the zygote is started again, and
    such an environment launches as a plain subprocess."""
    env = {**os.environ, "FGRPO_LAUNCH_TEST": "1"}
    for z in launch.zygote_for(env), launch.zygote_for(env):
        launch.run([sys.executable, "-c", "pass"], env=env, check=True)          # both started
        z.proc.kill()
        z.proc.wait()
    for _ in range(4):                                                            # each zygote's turn, twice
        r = launch.run([sys.executable, "-c", "print('ok')"], env=env, capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == "ok\n", r
    big = {**env, **{f"FGRPO_BIG{i}": "x" * 40_000 for i in range(4)}}        # 160 KB; exec takes 128 KiB a variable
    r = launch.run([sys.executable, "-c", "import os; print(sum(len(v) for k, v in os.environ.items() "
                    "if k.startswith('FGRPO_BIG')))"], env=big, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "160000", r
