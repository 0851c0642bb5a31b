"""
Flags and the checks that refuse a bad flag or input: `--name value` flags from a dataclass, one line
and exit status 2 for anything wrong, and the reference data folder. Every script parses its Config so:

    from fgrpo_utils.cli import parse_config
    cfg = parse_config(Config)       # Config is a @dataclass; its fields become --flags
"""
import argparse
import dataclasses
import inspect
import math
import os
import re
import sys
import textwrap
import types
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

def parse_config(cls, argv=None, doc=None):
    """Build `cls` (a dataclass) from `--name value` flags, one per field, names unchanged: bool fields take
    true/false, tuple fields one or more values (`--gammas 0 1`), a `float | None` field a float. A Config's
    ValueError("--flag ...") from __post_init__ is one line, exit status 2, like any bad flag. --help shows
    each field's source comment (field_comments) and a fixed set's values (the Config's choices()).
    Not a library: transformers.HfArgumentParser passes `--group_sizes 2 8` to a tuple field as strings and
    lets a ValueError escape as a traceback; tyro prints a multi-line box, booleans as --flag/--no-flag."""
    hints, comments, choices = typing.get_type_hints(cls), field_comments(cls), choices_of(cls)
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = refuse                                 # "--steps abc", "--stpes 2": one line too, not usage + line
    for f in dataclasses.fields(cls):
        typ, default = hints[f.name], f.default_factory() if f.default is dataclasses.MISSING else f.default
        if typing.get_origin(typ) in (typing.Union, types.UnionType):  # `float | None` -> float
            typ = next(a for a in typing.get_args(typ) if a is not type(None))
        kwargs = dict(default=default, type=typ,
                      help=f"{comments.get(f.name, '')} (default: {default})".strip().replace("%", "%%"))
        if typing.get_origin(typ) is tuple:           # tuple[int, ...] -> nargs="+"
            kwargs.update(type=typing.get_args(typ)[0], nargs="+")
        elif typ is bool:
            kwargs.update(type=_parse_bool, metavar="{true,false}")
        if f.name in choices:                         # --loss {grpo,dapo,cispo}
            kwargs.update(metavar="{" + ",".join(map(str, choices[f.name])) + "}")
        p.add_argument(f"--{f.name}", **kwargs)
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(p.parse_args(argv)).items()}
    try:
        return cls(**args)
    except ValueError as e:
        refuse(e)

def field_comments(cls):
    """{field: its comment in the source of cls and its dataclass bases}: the comment on the field's line, and
    the comment-only lines below it indented past the field names (a comment at their indentation heads a group)."""
    comments = {}
    for k in filter(dataclasses.is_dataclass, reversed(cls.__mro__)):
        name, col = None, 0
        for line in textwrap.dedent(inspect.getsource(k)).splitlines()[1:]:
            if re.match(r"\s*(def |@)", line):                 # the fields end where the methods begin
                break
            field, note = re.match(r"( *)(\w+) *:[^#]*#(.*)", line), re.match(r"( *)#(.*)", line)
            if field:
                col, name = len(field.group(1)), field.group(2)
                comments[name] = field.group(3).strip()
            elif note and name and len(note.group(1)) > col:
                comments[name] += " " + note.group(2).strip()
            else:
                name = None
    return comments

def choices_of(cls):
    return cls.choices() if hasattr(cls, "choices") else {}

def check_choices(cfg):
    for name, values in choices_of(cfg).items():
        value = getattr(cfg, name)
        for v in value if isinstance(value, tuple) else (value,):
            check(v in values, f"--{name} {v!r}: expected one of {', '.join(map(str, values))}")

def _parse_bool(s):
    if s.lower() not in ("1", "true", "yes", "0", "false", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")
    return s.lower() in ("1", "true", "yes")

def refuse(message):
    """The answer to a bad flag or input found before any work: one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)

def check(ok, message):
    if not ok:
        raise ValueError(message)

def check_min(cfg, low, *names):
    """low <= --name < inf for each named field of cfg. NaN fails, as it fails every comparison."""
    for name in names:
        check(low <= getattr(cfg, name) < math.inf, f"--{name} {getattr(cfg, name)}: must be >= {low}")

def check_positive(cfg, *names):
    for name in names:
        check(0 < getattr(cfg, name) < math.inf, f"--{name} {getattr(cfg, name)}: must be > 0 and finite")

def check_device(device):
    """A CUDA device asked for must be visible: a CPU-only torch would fail deep in the first .to(device)."""
    import torch
    check(not str(device).startswith("cuda") or torch.cuda.is_available(),
          f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; use --device cpu")

def check_utf8(path):
    """Raise ValueError('file:line: ...') at the first line of a text file that is not UTF-8.
    Python's own error names a byte offset in a read buffer, which no one can find in the file."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 (byte {line[e.start]:#04x} at column "
                                 f"{e.start + 1})") from None

# Files a local model or tokenizer folder holds; any one is enough for AutoTokenizer (or reward.load_tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

def check_pretrained(name, flag, model=True, tokenizer=True):
    """A local folder given as a model (config.json) or tokenizer (TOKENIZER_FILES) must hold one: a folder
    with no tokenizer loads as a 1-token tokenizer and fails much later. Else a hub id (ORG/NAME), or a bare
    NAME the Hugging Face cache holds ("TINY" ended in an offline hub traceback). "out/maze_sft" is local
    when ./out exists, since a hub id has the same shape."""
    p = Path(name).expanduser()
    local = p.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1 \
        or ("/" in name and Path(name.split("/")[0]).is_dir())
    if not local:
        from huggingface_hub.constants import HF_HUB_CACHE
        check("/" in name or (Path(HF_HUB_CACHE) / f"models--{name}").is_dir(),
              f"{flag} {name}: no such folder, nor a Hugging Face id (ORG/NAME)"
              + ("; did you mean tiny?" if name.lower() == "tiny" else ""))
        return
    check(p.is_dir(), f"{flag} {name}: no such folder")
    if model:
        check((p / "config.json").is_file(), f"{flag} {name}: not a model folder (no config.json)")
    if tokenizer:
        check(any((p / f).is_file() for f in TOKENIZER_FILES),
              f"{flag} {name}: no tokenizer in the folder (none of {', '.join(TOKENIZER_FILES)})")

def data_dir():
    return Path(os.environ.get("FGRPO_DATA", REPO.parent / "shared" / "data"))
