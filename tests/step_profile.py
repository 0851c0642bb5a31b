"""The program's functions one RL step runs: `train.py FLAGS` under sys.setprofile, from the first call of
train.rl_step to the second (the step's rollouts, update, sync, metrics, log line, sample, export check).
Prints JSON: [[file, qualname], ...], the functions on the stack when the step began (main, train_loop)
first. tests/test_budgets.py runs it for the README's walk.

    python tests/step_profile.py --task maze --model tiny --device cpu --steps 2     # seconds
"""
import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from fgrpo_utils.cli import parse_config  # noqa: E402

PROGRAM = {str(p.relative_to(ROOT)) for p in [*ROOT.glob("*.py"), *ROOT.glob("fgrpo_utils/*.py")]}


def main():
    seen, calls = {}, [0]

    def note(code):
        path = Path(code.co_filename)
        name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else ""
        if name in PROGRAM and not code.co_name.startswith("<"):       # no lambdas or comprehensions
            seen.setdefault((name, code.co_qualname), None)

    def hook(frame, event, arg):
        if event != "call":
            return
        if frame.f_code is train.rl_step.__code__:
            calls[0] += 1
            if calls[0] == 1:                   # the step begins inside these
                stack, f = [], frame.f_back
                while f is not None:
                    stack.append(f.f_code)
                    f = f.f_back
                for code in reversed(stack):
                    note(code)
        if calls[0] == 1:
            note(frame.f_code)

    sys.argv = ["train.py", *sys.argv[1:]]
    cfg = parse_config(train.Config, doc=train.__doc__)
    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        train.main(cfg)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert calls[0] >= 2, "the run made fewer than two steps"
    print(json.dumps(list(seen)))


if __name__ == "__main__":
    main()
