"""
What is ours, and writing it whole. We never delete or overwrite what we did not write; one rule for
every script (which outputs it covers: DESIGN.md, "When things go wrong", An existing output folder):
- A single output file carries the mark of the script that wrote it inside (file_mark).
- A folder we write whole or write into carries a marker file, MARKER, listing the names we put in it. An
  entry is ours when the marker lists it, when the caller names it among its fixed outputs (`known`, globs
  too), or what our atomic write of one left (.NAME.tmp.*, .NAME.old).
A file may be replaced only when it is ours (is_ours); a folder may be written into, or replaced, only
when every entry in it is ours (check_out_dir). Writes are atomic (atomic_write_text, atomic_dir): a
reader, or a resumed run, sees the old file or the new one, never half of one.
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile
from fnmatch import fnmatchcase
from pathlib import Path

from fgrpo_utils.cli import REPO, check

class Damaged(ValueError):
    """A file a script reads back is cut or is not what it should be: "damaged: PATH (why)". Every
    entry point turns it into one line and exit status 2 (cli.refuse), never a traceback."""

def read_json(path, keys=()):
    """The JSON object in `path`, holding `keys`; Damaged when it is cut, not JSON or lacks one.
    A missing file raises FileNotFoundError, for the caller to say what it expected there."""
    try:
        obj = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise Damaged(f"damaged: {path} ({type(e).__name__}: {str(e)[:80]})") from None
    missing = [k for k in keys if not isinstance(obj, dict) or k not in obj]
    if not isinstance(obj, dict) or missing:
        raise Damaged(f"damaged: {path} (no {', '.join(missing) or 'JSON object'})")
    return obj

def file_sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()

def fingerprint(path, edge=16 << 20):
    """A file's, or a folder's files' (one level), names, sizes, first and last `edge` bytes, hashed: what they
    hold, cheaply. None for what is not on disk (a hub id, "tiny")."""
    p, h = Path(path), hashlib.sha256()
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p] if p.is_file() else []
    for f in files:
        with open(f, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(0)
            h.update(f"{f.name}:{size}:".encode() + fh.read(edge))
            fh.seek(max(edge, size - edge))
            h.update(fh.read())
    return h.hexdigest() if files else None

def code_hashes():
    """{repo path: sha256} of the program files this process imported (top-level scripts, fgrpo_utils/):
    what a run records of the code it ran (the course's grader ties a run to the hand-in's graded files)."""
    files = {Path(f).resolve() for m in list(sys.modules.values())
             if isinstance(f := getattr(m, "__file__", None), str) and os.path.isabs(f)}
    return {p.relative_to(REPO).as_posix(): file_sha256(p) for p in sorted(files)
            if p.parent in (REPO, REPO / "fgrpo_utils") and p.suffix == ".py" and p.is_file()}

MARKER = ".fgrpo.json"     # the file in a folder that lists what in it is ours
MARK = "fgrpo"

def written_by(script):
    """The mark a script puts inside the files it writes: "fgrpo evaluate.py"."""
    return f"{MARK} {script}"

TABLE_MARK = "<!-- written by "       # a table's first line: an HTML comment, invisible when rendered

def file_mark(path):
    """The mark in an output file ("fgrpo evaluate.py": JSON "written_by", .md first line, PNG "Software"), or None."""
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

def is_ours(path, script=None):
    """Whether an existing file or folder is ours to replace (the module docstring's rule; with `script`, only
    that script's mark counts). Symlinks are never ours: we make none."""
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
    """The entries of `folder` that are not ours (the module docstring's rule; `known`: the caller's names)."""
    ours = owned_entries(folder) | {MARKER}
    return sorted(e for e in os.listdir(folder) if e not in ours and not any(fnmatchcase(e, k) for k in known)
                  and not is_temp_of(e, ours, known))

def write_json_out(path, obj, script):
    atomic_write_json(path, {"written_by": written_by(script), **obj})

def write_table_out(path, text, script):
    atomic_write_text(path, f"{TABLE_MARK}{written_by(script)}; rerunning it replaces this file -->\n" + text)

def png_metadata(script):
    return {"Software": written_by(script)}

def check_out_file(path, flag, script):
    """ValueError naming `flag` unless `script` may write `path`: absent or its own (is_ours); writable."""
    p = Path(path)
    check(not p.exists() and not p.is_symlink() or is_ours(p, script),
          f"{flag} {p}: exists and {script} did not write it; choose another {flag} (we never write over "
          "what is not ours)")
    check_writable(p.parent, flag)

def owned_entries(folder):
    try:
        return set(json.loads((Path(folder) / MARKER).read_text())["entries"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()

def is_temp_of(entry, names, patterns=()):
    return any(entry.startswith(f".{n}.tmp.") or entry == f".{n}.old" for n in names) or \
        any(fnmatchcase(entry, f".{p}.tmp.*") or fnmatchcase(entry, f".{p}.old") for p in patterns)

def check_writable(path, flag):
    p = Path(path)
    check(str(path).strip() != "", f"{flag}: empty path")
    existing = next(q for q in (p, *p.parents) if q.exists())
    check(existing.is_dir(), f"{flag} {p}: {existing} is a file, not a folder")
    check(os.access(existing, os.W_OK | os.X_OK), f"{flag} {p}: {existing} is not writable")

def check_out_dir(path, flag="--out_dir", known=()):
    """ValueError naming `flag` unless `path` is an output folder we may write: absent, or a writable folder
    of only our entries (`known`: the caller's fixed names). Configs call it in __post_init__, before work."""
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise ValueError(f"{flag} {p}: a symlink to nothing ({os.readlink(p)}); remove it or give the folder "
                         "it should point at")
    check(not p.exists() or p.is_dir(), f"{flag} {p}: is a file, not a folder")
    foreign = foreign_entries(p, known) if p.is_dir() else []
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise ValueError(f"{flag} {p}: holds {foreign[0]!r}{more}, which we did not write; choose "
                         f"another folder (we never write over what is not ours)")
    check_writable(p, flag)

def mark_out_dir(path, entries):
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    atomic_write_json(p / MARKER, {"written_by": "fgrpo (see fgrpo_utils/outputs.py, MARKER)",
                                   "entries": sorted(owned_entries(p) | set(entries))})

def remove_temp(folder, names, patterns=()):
    folder = Path(folder)
    for entry in (os.listdir(folder) if folder.is_dir() else []):
        if is_temp_of(entry, names, patterns):
            p = folder / entry
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()

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
    """Call write(tmp_dir), mark what it wrote as ours, then rename tmp_dir to `path`. An existing `path` is
    replaced only if ours (check_out_dir): the caller checked up front; this is the last line of defence."""
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
    """Move folder `src` to `dst` by rename, a `dst` already there first moved aside to .NAME.old: a kill at any
    moment leaves the old folder or the new one at `dst` (or neither, both beside it under our temp names)."""
    src, dst = Path(src), Path(dst)
    old = dst.parent / f".{dst.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)
