"""
Small helpers every entry point shares: `--name value` flags from a dataclass, the data folder,
and atomic writes. Nothing here knows about the paper; it exists so that simulate.py, maze.py,
train.py and evaluate.py do not each carry their own copy.

    from common import parse_config
    cfg = parse_config(Config)       # Config is a @dataclass; its fields become --flags
"""
import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import types
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parent


def parse_config(cls, argv=None, doc=None):
    """Build `cls` (a dataclass) from `--name value` flags, one flag per field, names unchanged.

    bool fields take true/false; tuple fields take one or more values (`--gammas 0 1`); a field typed
    `float | None` takes a float, None being its "not given" default.
    A Config validates itself in __post_init__ by raising ValueError("--flag ..."); that message is
    printed as one line and the program exits with status 2, like any other bad flag.
    """
    hints = typing.get_type_hints(cls)
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(cls):
        typ, default = hints[f.name], f.default
        if default is dataclasses.MISSING:
            default = f.default_factory()
        if typing.get_origin(typ) in (typing.Union, types.UnionType):  # `float | None` -> float
            typ = next(a for a in typing.get_args(typ) if a is not type(None))
        kwargs = dict(default=default, help=f"default: {default}")
        if typing.get_origin(typ) is tuple:           # tuple[int, ...] -> nargs="+"
            kwargs.update(type=typing.get_args(typ)[0], nargs="+")
        elif typ is bool:
            kwargs.update(type=_parse_bool, metavar="{true,false}")
        else:
            kwargs.update(type=typ)
        p.add_argument(f"--{f.name}", **kwargs)
    args = vars(p.parse_args(argv))
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    try:
        return cls(**args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def _parse_bool(s):
    if s.lower() in ("1", "true", "yes"):
        return True
    if s.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def check(ok, message):
    """Raise ValueError(message) unless ok. Configs call it in __post_init__, naming the flag."""
    if not ok:
        raise ValueError(message)


def data_dir():
    """The reference data folder: $FGRPO_DATA, else ../shared/data beside the repo."""
    return Path(os.environ.get("FGRPO_DATA", REPO.parent / "shared" / "data"))


# -----------------------------------------------------------------------------
# Atomic writes: a reader (or a resumed run) sees the old file or the new one, never half of one.

def atomic_write_text(path, text):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.chmod(tmp, 0o644)                               # mkstemp makes it 0600; a results file is shared
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path, obj):
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def atomic_dir(path, write):
    """Call write(tmp_dir) and then move tmp_dir to `path` in one rename.

    An existing `path` is moved aside first and removed only after the new one is in place, so a
    kill at any moment leaves either the old or the new directory (plus a stray .old we clean up).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp."))
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.parent / f".{path.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
