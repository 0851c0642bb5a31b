"""
Small helpers every entry point shares: `--name value` flags from a dataclass and their checks,
the data folder, output folders we may write, atomic writes, and the Task contract. Nothing here
knows about the paper; it exists so that simulate.py, maze.py, train.py and evaluate.py do not each carry their own copy.

    from common import parse_config
    cfg = parse_config(Config)       # Config is a @dataclass; its fields become --flags
"""
import argparse
import ast
import dataclasses
import inspect
import io
import json
import math
import os
import shutil
import sys
import tempfile
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent


def parse_config(cls, argv=None, doc=None):
    """Build `cls` (a dataclass) from `--name value` flags, one flag per field, names unchanged.

    bool fields take true/false; tuple fields take one or more values (`--gammas 0 1`); a field typed
    `float | None` takes a float, None being its "not given" default.
    A Config validates itself in __post_init__ by raising ValueError("--flag ..."); that message is
    printed as one line and the program exits with status 2, like any other bad flag.
    --help shows each field's comment in the Config's source (field_comments) and, for a flag with a
    fixed set of values, those values: the Config's choices(), which check_choices also refuses by.

    Why not transformers.HfArgumentParser (TRL's convention)? Tried on simulate.Config (transformers
    5.19): it passes `--group_sizes 2 8` to a tuple[int, ...] field as strings (it converts list
    fields, not tuples), and a Config's ValueError escapes as a traceback instead of exit status 2.
    Working around both would take more lines than this parser.
    """
    hints, comments, choices = typing.get_type_hints(cls), field_comments(cls), choices_of(cls)
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = refuse                                 # "--steps abc", "--stpes 2": one line too, not usage + line
    for f in dataclasses.fields(cls):
        typ, default = hints[f.name], f.default
        if default is dataclasses.MISSING:
            default = f.default_factory()
        if typing.get_origin(typ) in (typing.Union, types.UnionType):  # `float | None` -> float
            typ = next(a for a in typing.get_args(typ) if a is not type(None))
        kwargs = dict(default=default, help=f"{comments.get(f.name, '')} (default: {default})".strip().replace("%", "%%"))
        if typing.get_origin(typ) is tuple:           # tuple[int, ...] -> nargs="+"
            kwargs.update(type=typing.get_args(typ)[0], nargs="+")
        elif typ is bool:
            kwargs.update(type=_parse_bool, metavar="{true,false}")
        else:
            kwargs.update(type=typ)
        if f.name in choices:                         # --loss {grpo,dapo,cispo}
            kwargs.update(metavar="{" + ",".join(map(str, choices[f.name])) + "}")
        p.add_argument(f"--{f.name}", **kwargs)
    args = vars(p.parse_args(argv))
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    try:
        return cls(**args)
    except ValueError as e:
        refuse(e)


def field_comments(cls):
    """{field: its comment in cls's source}: the comment after the field, and the comment-only lines
    indented past the field names that follow it (one at their indentation heads a group of fields)."""
    source = textwrap.dedent(inspect.getsource(cls))
    notes = {}                                        # row -> (column, text) of each comment
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            notes[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip(), tok.line.strip().startswith("#"))
    comments = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        row = next((r for r in range(node.lineno, node.end_lineno + 1) if r in notes), None)
        if row is None:
            continue
        text = notes[row][1]
        while row + 1 in notes and notes[row + 1][2] and notes[row + 1][0] > node.col_offset:
            row += 1
            text += " " + notes[row][1]
        comments[node.target.id] = text
    return comments


def choices_of(cls):
    """{field: its allowed values} from cls.choices(), for the flags with a fixed set of values."""
    return cls.choices() if hasattr(cls, "choices") else {}


def check_choices(cfg):
    """Raise ValueError naming the flag unless each field of cfg.choices() holds one of its values
    (every element, for a tuple field). Configs call it in __post_init__; --help lists the same values."""
    for name, values in choices_of(cfg).items():
        value = getattr(cfg, name)
        for v in value if isinstance(value, tuple) else (value,):
            check(v in values, f"--{name} {v!r}: expected one of {', '.join(map(str, values))}")


def _parse_bool(s):
    if s.lower() in ("1", "true", "yes"):
        return True
    if s.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def refuse(message):
    """The answer to a bad flag or input found before any work: one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check(ok, message):
    """Raise ValueError(message) unless ok. Configs call it in __post_init__, naming the flag."""
    if not ok:
        raise ValueError(message)


def check_min(cfg, low, *names):
    """low <= --name < inf for each named field of cfg. NaN fails, as it fails every comparison."""
    for name in names:
        value = getattr(cfg, name)
        check(low <= value < math.inf, f"--{name} {value}: must be >= {low}")


def check_positive(cfg, *names):
    """0 < --name < inf for each named field of cfg (rates, clips, temperatures)."""
    for name in names:
        value = getattr(cfg, name)
        check(0 < value < math.inf, f"--{name} {value}: must be > 0 and finite")


def check_device(device, flag="--device"):
    """A CUDA device asked for must be one this torch can see: a CPU-only build would otherwise fail
    with a traceback deep in the first .to(device)."""
    import torch
    check(not str(device).startswith("cuda") or torch.cuda.is_available(),
          f"{flag} {device}: this torch ({torch.__version__}) sees no CUDA device; use --device cpu")


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
    """A local folder given as a model (config.json) or tokenizer (TOKENIZER_FILES) must hold one.

    A name that is not a local path is a hub id (ORG/NAME), left to from_pretrained; a bare NAME only
    when the local Hugging Face cache holds it ("TINY" ended in an offline hub traceback). Without this
    check a folder with no tokenizer loads as a 1-token tokenizer and fails much later with an unrelated
    message. "out/maze_sft" counts as local when ./out exists, since a hub id has the same shape.
    """
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


# -----------------------------------------------------------------------------
# The task contract: what train.py needs from a task (toy_task.make_task, maze.make_task, reward.make_task)

@dataclass
class Task:
    """What a task provides to the trainer: train.py's --task NAME builds one through its row in
    train.TASKS. toy_task.py is the template; a new task is:
    1) a copy of toy_task.py (my_task.py) whose make_task(cfg, tokenizer, model_type) returns a Task
       and whose build_tokenizer() returns its own small tokenizer, if it has one;
    2) one row in train.py's TASKS, beside its import:
           "my_task": TaskEntry(my_task.make_task, tokenizer=my_task.build_tokenizer),
       Then `python train.py --task my_task --model tiny --device cpu --steps 2` runs it: with the
       task's own tokenizer, --model tiny needs no --tokenizer (a random policy of that vocabulary).

    prompt(i) -> (prompt_ids, answer): training prompt i, a global index (step * prompts_per_step + ...);
        the same i gives the same prompt on every rank and world size. `answer` is whatever score needs.
    score(answers, completions) -> (rewards, stats): one reward per completion (a list of token ids),
        and a {name: count} of extra counts summed over ranks and logged as reward/NAME ({} for none).
        A reward is any float in [r_wrong, r_correct] = [0, 1] (advantage.success_rate refuses others):
        1.0 correct / 0.0 not, or partial credit in between. With partial rewards mu_hat of Eq. 11 is
        the group's mean reward rescaled, (mean R - r_wrong) / (r_correct - r_wrong), not a fraction
        of correct rollouts, and groups/all_correct, all_wrong count only groups all at 1.0 or all at 0.0.
    evaluate(engine, rank, world) -> {name: [c_i]}: optional (None: no held-out set). For each problem
        of this rank's share of the held-out set, how many of its eval_samples samples are correct
        under each reward rule (the training rule first), or count some other event (the maze also
        counts truncated samples). train.py logs pass@k of each over all ranks as eval/NAME/pass@k
        (every --eval_every steps and at the end); evaluate.py keeps the counts for its tables and
        its significance test.

    The task flags of train.py (--data, --max_prompt_len, --max_response_len: math; --maze_size,
    --maze_reward, --eval_every, --eval_mazes, --eval_samples: maze) are read only by the tasks whose
    TASKS row lists them; any other task refuses them when they are set (exit 2, one line). A task
    sets its own response budget (max_new_tokens) and prompt length.
    """
    prompt: Callable
    score: Callable
    stop_token_ids: list              # a rollout ends at the first of these (included in the completion)
    max_new_tokens: int               # the response budget; a rollout that reaches it is "length"-truncated
    show: Callable                    # completion ids -> text for the sample log line
    num_prompts: int | None = None    # the dataset size (None: generated, unbounded); saved in run.json
    evaluate: Callable | None = None
    eval_samples: int = 0             # samples per held-out problem in evaluate


def data_dir():
    """The reference data folder: $FGRPO_DATA, else ../shared/data beside the repo."""
    return Path(os.environ.get("FGRPO_DATA", REPO.parent / "shared" / "data"))


# -----------------------------------------------------------------------------
# What is ours: we never delete or overwrite what we did not write. One rule, for every script:
#
# - A single output file (evaluate.py's --out results, tables and plots; bench scripts' reports)
#   carries the mark of the script that wrote it inside: a JSON object's "written_by", a table's
#   first line, a PNG's "Software" text (written_by, file_mark).
# - A folder we write whole (a maze checkpoint, train.py's exports) or write into (train.py's and
#   simulate.py's --out_dir) carries a marker file, MARKER, that lists the names we put in it. An
#   entry of a folder is ours when the marker lists it, when the caller names it as one of its fixed
#   outputs (`known`: train.py's run.json, ckpt, ...; a known name may be a glob pattern, as
#   train.py's per-epoch exports "epoch_[0-9]*" are), or when it is the leftover of one of our atomic
#   writes of such a name (.NAME.tmp.*, .NAME.old).
def file_sha256(path):
    import hashlib
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def code_hashes():
    """{file: sha256} of this repository's top-level modules imported in this process: what a run
    records of the code it ran (the course's grader ties a run to the hand-in's graded files)."""
    here = Path(__file__).resolve().parent
    files = {Path(f).resolve() for m in list(sys.modules.values())
             if isinstance(f := getattr(m, "__file__", None), str) and os.path.isabs(f)}
    return {p.name: file_sha256(p) for p in sorted(files) if p.parent == here and p.suffix == ".py" and p.is_file()}


# A file may be replaced only when it is ours (is_ours); a folder may be written into, or replaced,
# only when every entry in it is ours (check_out_dir). The scripts ask nothing else.

MARKER = ".fgrpo.json"
MARK = "fgrpo"


def written_by(script):
    """The mark a script puts inside the files it writes: "fgrpo evaluate.py"."""
    return f"{MARK} {script}"


TABLE_MARK = "<!-- written by "       # the first line of a table we write begins so (table_mark)


def table_mark(script):
    """The first line of a markdown table we write: an HTML comment, invisible when rendered."""
    return f"{TABLE_MARK}{written_by(script)}; rerunning it replaces this file -->\n"


def file_mark(path):
    """The mark inside an output file ("fgrpo evaluate.py"), or None: a JSON object's "written_by",
    a markdown table's first line, a PNG's "Software" text."""
    p = Path(path)
    try:
        if p.suffix == ".json":
            obj = json.loads(p.read_text())
            return obj.get("written_by") if isinstance(obj, dict) else None
        if p.suffix == ".md":
            with open(p) as f:
                first = f.readline()
            return first[len(TABLE_MARK):].split(";")[0] if first.startswith(TABLE_MARK) else None
        if p.suffix == ".png":
            from PIL import Image                       # matplotlib's own dependency
            with Image.open(p) as im:
                return im.info.get("Software")
    except Exception:                # unreadable, not UTF-8, not a PNG ...: not ours, whatever the error
        return None
    return None


def is_ours(path, script=None):
    """Whether an existing file or folder is ours to replace. A file: the marker of its folder lists
    it, or it carries our mark inside (file_mark), `script`'s own when given. A folder: it holds our
    marker and nothing that is not ours (foreign_entries). Symlinks are never ours: we make none."""
    p = Path(path)
    if p.is_symlink():
        return False
    if p.is_dir():
        return (p / MARKER).is_file() and not foreign_entries(p)
    if not p.is_file():
        return False
    if p.name in owned_entries(p.parent):
        return True
    mark = file_mark(p)
    return isinstance(mark, str) and (mark == written_by(script) if script else mark.startswith(MARK + " "))


def foreign_entries(folder, known=()):
    """The entries of `folder` that are not ours: not listed by its marker, not one of the caller's
    `known` output names, not the leftover of an atomic write of either."""
    ours = owned_entries(folder) | {MARKER}
    return sorted(e for e in os.listdir(folder) if e not in ours and not is_known(e, known)
                  and not is_temp_of(e, ours, known))


def write_json_out(path, obj, script):
    """Write a JSON output file atomically, with `script`'s mark first."""
    atomic_write_json(path, {"written_by": written_by(script), **obj})


def write_table_out(path, text, script):
    """Write a markdown output file atomically, with `script`'s mark as its first line."""
    atomic_write_text(path, table_mark(script) + text)


def png_metadata(script):
    """savefig(..., metadata=png_metadata(script)) puts `script`'s mark in the PNG."""
    return {"Software": written_by(script)}


def check_out_file(path, flag, script):
    """Raise ValueError naming `flag` unless `path` may be written by `script`: absent, or a file that
    `script` wrote (is_ours); its folder writable."""
    p = Path(path)
    check(not p.exists() and not p.is_symlink() or is_ours(p, script),
          f"{flag} {p}: exists and {script} did not write it; choose another {flag} (we never write over "
          "what is not ours)")
    check_writable(p.parent, flag)


def owned_entries(folder):
    """The names the marker of `folder` lists (none without a readable marker)."""
    try:
        return set(json.loads((Path(folder) / MARKER).read_text())["entries"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def is_temp_of(entry, names, patterns=()):
    """Whether `entry` is what a killed atomic write of one of `names` (exact) or of a name matching
    one of `patterns` (fnmatch globs) left: .NAME.tmp.* or .NAME.old."""
    return any(entry.startswith(f".{n}.tmp.") or entry == f".{n}.old" for n in names) or \
        any(fnmatchcase(entry, f".{p}.tmp.*") or fnmatchcase(entry, f".{p}.old") for p in patterns)


def is_known(entry, known):
    """Whether `entry` is one of a script's fixed output names; `known` may hold glob patterns."""
    return any(fnmatchcase(entry, k) for k in known)


def check_writable(path, flag):
    """`path` can be created: its nearest existing ancestor is a folder we may write in."""
    p = Path(path)
    check(str(path).strip() != "", f"{flag}: empty path")
    existing = next(q for q in (p, *p.parents) if q.exists())
    check(existing.is_dir(), f"{flag} {p}: {existing} is a file, not a folder")
    check(os.access(existing, os.W_OK | os.X_OK), f"{flag} {p}: {existing} is not writable")


def check_out_dir(path, flag="--out_dir", known=()):
    """Raise ValueError naming `flag` unless `path` is an output folder we may write: absent, or a
    folder whose every entry is ours (see MARKER; `known`: the names the caller always writes there);
    not a file; and writable. Configs call it in __post_init__, so the answer comes before any work."""
    p = Path(path)
    check(not p.exists() or p.is_dir(), f"{flag} {p}: is a file, not a folder")
    if p.is_dir():
        foreign = foreign_entries(p, known)
        if foreign:
            more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
            raise ValueError(f"{flag} {p}: holds {foreign[0]!r}{more}, which we did not write; choose "
                             f"another folder (we never write over what is not ours)")
    check_writable(p, flag)


def mark_out_dir(path, entries):
    """Create folder `path` and record `entries` (names in it) as ours, beside those recorded before."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    atomic_write_json(p / MARKER, {"written_by": "fgrpo (see common.MARKER)",
                                   "entries": sorted(owned_entries(p) | set(entries))})


def remove_temp(folder, names, patterns=()):
    """Delete what killed atomic writes of `names` (or of names matching the glob `patterns`) left in
    `folder` (.NAME.tmp.*, .NAME.old): only those."""
    folder = Path(folder)
    for entry in (os.listdir(folder) if folder.is_dir() else []):
        if is_temp_of(entry, names, patterns):
            p = folder / entry
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


# -----------------------------------------------------------------------------
# Atomic writes: a reader (or a resumed run) sees the old file or the new one, never half of one.

def atomic_write_text(path, text):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp.")
    os.chmod(tmp, 0o644)                               # mkstemp makes it 0600; a results file is shared
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path, obj):
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def atomic_dir(path, write):
    """Call write(tmp_dir), mark what it wrote as ours, then move tmp_dir to `path` in one rename.

    An existing `path` is replaced only if it is ours (check_out_dir): the caller checked that up
    front; this is the last line of defence, before anything is removed.
    """
    path = Path(path)
    if path.is_symlink():                                # write where it points, keep the link
        path = path.resolve()
    check_out_dir(path, "output folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_temp(path.parent, [path.name])                # what an earlier killed write left
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp."))
    os.chmod(tmp, 0o755)                                 # mkdtemp makes it 0700; a checkpoint is shared
    try:
        write(tmp)
        mark_out_dir(tmp, os.listdir(tmp))
        for f in Path(tmp).rglob("*"):                   # save_pretrained writes model.safetensors 0600
            os.chmod(f, 0o755 if f.is_dir() else 0o644)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, path)


def replace_dir(src, dst):
    """Move folder `src` to `dst` by rename. A `dst` already there is moved aside to .NAME.old first
    and removed only once the new one is in place, so a kill at any moment leaves the old folder or
    the new one at `dst` (or neither, with both beside it under our temp names)."""
    src, dst = Path(src), Path(dst)
    old = dst.parent / f".{dst.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)
