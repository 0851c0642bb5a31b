"""
train.py's run folder (--out_dir): what it may hold, its logs, DCP checkpoints and --resume, and the
Hugging Face exports. None of this is the method; it lives here so that train.py reads as the RL loop.
A function that takes the model, or says so, is collective: every rank calls it at the same point.
How train.py uses it, in order (the gloo group these wait in is distributed.IO_GROUP):

    ckpt, meta = check_run(cfg, out, problems)         # lock out_dir, refuse what cannot run, find --resume's
    start = resume_from(model, opt, ckpt, meta)        # load it, or the next older whole one
    log = start_logging(cfg, out, task, world, start)  # run.json; metrics.jsonl cut back to `start`
    log(metrics)                                       # every step: a metrics.jsonl row (and wandb)
    export(model, tokenizer, out, due_exports(cfg, ...), cfg, progress(cfg, ...))   # epoch_E, step_N, final
    save_checkpoint(model, opt, step, cfg, out)        # every --save_every steps and at the end
out_dir holds only TRAIN_OUTPUTS (what each is: DESIGN.md, "Checkpoints", "Exports", "An existing output folder").
"""
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import zlib
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_state_dict, set_state_dict)

from fgrpo_utils import distributed
from fgrpo_utils.cli import check, refuse
from fgrpo_utils.distributed import io_barrier
from fgrpo_utils.outputs import (MARKER, atomic_dir, atomic_write_json, atomic_write_text, code_hashes, fingerprint,
                                 is_ours, mark_out_dir, remove_temp, replace_dir)

# What out_dir may hold (outputs.check_out_dir refuses anything else); epoch_E, step_NNNNNN: globs (due_exports).
TRAIN_OUTPUTS = ("run.json", "metrics.jsonl", "ckpt", "final", "wandb", "epoch_[0-9]*", "step_[0-9]*", ".train.lock")
# Flags a resumed run may change; any other difference is refused (DESIGN.md, "When things go wrong").
RESUME_MAY_CHANGE = ("steps", "save_every", "eval_every", "eval_mazes", "eval_samples", "sample_every",
                     "wandb", "out_dir", "resume", "threads", "device", "engine", "micro_batch_size",
                     "micro_batch_tokens", "padding_free", "share_prompts", "grad_checkpointing", "export_every",
                     "keep_checkpoints", "kv_cache_gb", "gpu_memory_utilization", "plan", "nproc",
                     "gpu_memory_gb", "skip_dead_groups", "attention")

# -----------------------------------------------------------------------------
# Before any work: lock out_dir, refuse what cannot run, tidy what killed runs left
def check_run(cfg, out, problems=()):
    """Collective. Refuse, in one line, what only shows once the process group exists (the lock's answer first: it
    says the most); tidy what killed runs left. Returns (--resume's checkpoint folder or None, its meta.json)."""
    problems = (lock_out_dir(out) if dist.get_rank() == 0 else []) + list(problems)
    ckpt, meta, skipped = find_checkpoint(step_folders(out / "ckpt")) if cfg.resume else (None, None, [])
    if skipped and ckpt is None:                       # retraining would rewrite the log and the damaged folders
        problems.append(f"--resume: every checkpoint in {out / 'ckpt'} is damaged ({'; '.join(skipped)}); "
                        "nothing was changed: repair or move them away")
    problems += folder_problems(cfg, out, ckpt, meta)
    first = [problems[0] if problems else None]        # the lock is rank 0's: all ranks follow its answer
    dist.broadcast_object_list(first, src=0)
    if first[0]:
        dist.destroy_process_group()
        refuse(first[0])                               # as for a bad flag (cli.parse_config)
    if dist.get_rank() == 0:
        if skipped:
            print(f"warning: skipped damaged checkpoint(s) {', '.join(skipped)}; resuming from "
                  f"{ckpt.name if ckpt else 'step 0'}", file=sys.stderr, flush=True)
        elif cfg.resume and ckpt is None:
            print(f"warning: --resume true: no checkpoint in {out / 'ckpt'}; starting at step 0", file=sys.stderr,
                  flush=True)
        remove_killed_saves(out, out / "ckpt")
    io_barrier()
    return ckpt, meta

def folder_problems(cfg, out, ckpt, meta):
    """What in out_dir stops this run, one line each, in the order check_run reports them (it says the first)."""
    problems, ckpt_root = [], out / "ckpt"
    exports = sorted(p for p in out.glob("*_*") if re.fullmatch(r"epoch_\d+|step_\d{6,}", p.name) and p.is_dir())
    for name in (*LOGS, MARKER):                  # a folder where our file goes: every write there would fail
        if (out / name).is_dir():
            problems.append(f"--out_dir {out}: {name} is a folder, where train.py keeps a file; move it away")
    for name in LOGS if not cfg.resume else ():   # a fresh run rewrites them: only if a run of ours wrote them
        if (out / name).exists() and not is_ours(out / name, "train.py"):
            problems.append(f"--out_dir {out}: holds {name}, which no train.py run wrote there (no {MARKER} "
                            "lists it); move it away or choose another --out_dir")
    for p in sorted(q for q in ckpt_root.glob("step_*") if re.fullmatch(r"step_\d+", q.name)):
        if p.is_symlink() or not p.is_dir():
            problems.append(f"--out_dir {out}: ckpt/{p.name} is {'a symlink' if p.is_symlink() else 'a file'}, not "
                            "a checkpoint of ours; move it away")
        elif foreign := foreign_files(p):            # a save of that step would replace it
            problems.append(f"--out_dir {out}: ckpt/{p.name} holds {foreign[0]!r}, which we did not write; "
                            "move it away")
    if not cfg.resume and (step_folders(ckpt_root) or (ckpt_root / "latest").exists() or exports):
        problems.append(f"--out_dir {out} holds checkpoints or exports of an earlier run: pass --resume true, "
                        "or choose another --out_dir")
    final = out / "final"                            # the export at the end replaces it: ours only
    if (final.exists() or final.is_symlink()) and not (final.is_dir() and is_ours(final)):
        what = "a symlink" if final.is_symlink() else "a folder" if final.is_dir() else "a file"
        problems.append(f"--out_dir {out}: 'final' is {what} that we did not write (outputs.is_ours), and the "
                        "run would end by replacing it; move it away or choose another --out_dir")
    changed = resume_conflicts(meta["config"], cfg) if meta else []
    changed += [f"--{k} {getattr(cfg, k)} (its files changed since)" for k, v in (meta or {}).get("inputs", {}).items()
                if v is not None and not changed and inputs(cfg).get(k) != v]   # same flag, other contents
    if changed:
        problems.append(conflict_message(ckpt, changed))
    for folder in exports if cfg.resume else []:     # kept, never written again: ours, and this experiment's
        try:
            check(is_ours(folder), "we did not write it")
            saved = json.loads((folder / "progress.json").read_text())["config"]
            for f in folder.glob("*.safetensors"):
                check_safetensors(f)
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"--out_dir {out}: {folder.name} is not a whole export of ours ({e}); move it away")
            continue
        changed = resume_conflicts(saved, cfg)
        if changed:
            problems.append(conflict_message(folder, changed))
    return problems

def remove_killed_saves(out, ckpt_root):
    """Delete what killed runs left, by our temp names only: .step_N.tmp/.old checkpoints, atomic-write temps."""
    for p in ckpt_root.glob(".step_*"):
        if re.fullmatch(r"\.step_\d+\.(tmp|old)", p.name):
            try:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            except OSError as e:                        # never loaded (not a step_N name): it only takes space
                print(f"warning: could not delete {p} ({e.strerror}); it stays", file=sys.stderr, flush=True)
    remove_temp(out, (), TRAIN_OUTPUTS)

LOGS = ("run.json", "metrics.jsonl")     # rewritten by a fresh run: the marker must list them
LOCK = ".train.lock"
_lock = None                  # the open lock file: held while this process lives

def lock_out_dir(out):
    """Lock out_dir/.train.lock for this run's lifetime (rank 0; why: DESIGN.md, "When things go wrong", Two runs
    on one --out_dir). Returns [problem] or []. Not `filelock`: its 3.x releases (what many torch installs bring)
    open with O_TRUNC, erasing the holder's "pid N" line at every refused attempt, and follow a symlink put in the
    lock's place."""
    global _lock
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return [f"--out_dir {out}: {LOCK} is {'a symlink' if path.is_symlink() else 'not a file'}, not our lock "
                "file; move it away"]
    if path.is_file():                # ours holds one "pid N on HOST" line, or nothing (killed before it wrote)
        with open(path, "rb") as f:
            head = f.read(512)
        if not re.fullmatch(rb"(pid \d+ on [^\n]*\n?)?", head):
            return [f"--out_dir {out}: {LOCK} is a file that no train.py run wrote (it holds no 'pid N on HOST' "
                    "line); move it away"]
    try:               # O_NOFOLLOW: a symlink put there since the check is refused, never written through
        f = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), "r+")
    except OSError as e:
        return [f"--out_dir {out}: cannot open {LOCK} ({e.strerror}); move it away"]
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        return [f"--out_dir {out} is in use by another train.py run ({holder}); wait for it to end or choose "
                "another --out_dir"]
    try:                                          # opened at 0: truncate there, then the pid line
        f.truncate(0)
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
    except OSError as e:                          # a full disk: the pid line, the first byte we write
        f.close()
        return [f"--out_dir {out}: cannot write {LOCK} ({disk_trouble(path, e) or e.strerror})"]
    _lock = f
    return []

# -----------------------------------------------------------------------------
# Logs: run.json once, then one metrics.jsonl line per step
def start_logging(cfg, out, task, world, start):
    """Rank 0 writes run.json, drops metrics logged after the checkpoint, and gets the logger."""
    if dist.get_rank() != 0:
        return None
    if start:
        print(f"resumed from step {start}", flush=True)
    with writing(out / "run.json"):
        mark_out_dir(out, LOGS)           # so a later fresh run knows these two are ours (check_run)
        atomic_write_json(out / "run.json", {"config": asdict(cfg), "git": git_sha(), "code": code_hashes(),
                                             "world": world, "torch": torch.__version__, "argv": sys.argv,
                                             "num_prompts": task.num_prompts})
        keep_metrics_until(out / "metrics.jsonl", start)
    return make_logger(cfg, out)

def keep_metrics_until(path, step):
    """On resume, drop logged steps after the checkpoint: they are about to be redone."""
    if not path.exists():
        return
    keep, lines = [], path.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):        # the last line: cut short by a kill; one before: damage
            if i < len(lines):
                print(f"warning: {path}: line {i} is no log row; dropped", file=sys.stderr, flush=True)
    atomic_write_text(path, "".join(l + "\n" for l in keep))

def make_logger(cfg, out):
    run = None
    if cfg.wandb:
        import wandb
        run = wandb.init(project="fgrpo", config=asdict(cfg), dir=str(out))

    def log(m):
        with writing(out / "metrics.jsonl"), open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(m) + "\n")
        if run is not None:
            run.log(m, step=m["step"])
    return log

class DiskTrouble(Exception):
    """A write under out_dir failed for the disk's sake (full, read-only): one line naming the path."""

@contextlib.contextmanager
def writing(path):
    """Around writes under `path`: an OSError, or what torch's writer and DCP make of one (DESIGN.md, "When things
    go wrong", A full disk), becomes DiskTrouble saying where and why; an error not the disk's passes unchanged."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError, CheckpointException) as e:   # safetensors': no OSError
        why = disk_trouble(path, e)
        if why is None:
            raise
        raise DiskTrouble(f"{why}; fix that, then rerun with --resume true (the checkpoints before are "
                          "whole)") from None

def causes(e):
    """The error, its causes, and DCP's per-rank failures."""
    seen, todo = [], [e]
    while todo:
        x = todo.pop()
        if isinstance(x, tuple):           # DCP's (exception, traceback) of a rank
            todo += list(x)
        if not isinstance(x, BaseException) or any(x is y for y in seen):
            continue
        seen.append(x)
        todo += [x.__cause__, x.__context__, *(x.failures.values() if isinstance(x, CheckpointException) else ())]
    return seen

def disk_trouble(path, e):
    """The line for error `e` while writing under `path`, or None when the disk is not to blame."""
    err = next((x for x in causes(e) if isinstance(x, OSError) and x.strerror), None)
    if err is not None:
        return f"{err.filename or path}: {err.strerror}"
    where = next(p for p in (Path(path), *Path(path).parents) if p.exists())
    free = shutil.disk_usage(where).free
    if free < 64 << 20:
        return f"{path}: no space left on the device ({free >> 10} KiB free there)"
    if not os.access(where, os.W_OK):
        return f"{path}: not writable"
    return None

@contextlib.contextmanager
def ctrl_c_waits():
    """Ctrl-C takes effect when the block ends: torch's zip writer turns a KeyboardInterrupt raised mid-write into
    'RuntimeError: unexpected pos', a traceback and exit 1, and a save cut short is no checkpoint."""
    got = []
    old = signal.signal(signal.SIGINT, lambda *_: got.append(1))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if got:
        raise KeyboardInterrupt

# -----------------------------------------------------------------------------
# Checkpoints: DCP, one folder ckpt/step_NNNNNN per save, no "latest" pointer (DESIGN.md, "When things go wrong")
@ctrl_c_waits()
def save_checkpoint(model, opt, step, cfg, out_dir):
    """Collective: save model, optimizer and RNG as ckpt/step_NNNNNN; drop what --keep_checkpoints drops."""
    ckpt_root = Path(out_dir) / "ckpt"
    final, tmp = ckpt_root / f"step_{step:06d}", ckpt_root / f".step_{step:06d}.tmp"
    msd, osd = get_state_dict(model, opt)
    if dist.get_rank() == 0 and tmp.exists():            # left by a run killed mid-save
        shutil.rmtree(tmp)
    io_barrier()
    with writing(tmp):
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp), process_group=distributed.IO_GROUP)
    io_barrier()
    crcs = shard_crcs(tmp)
    if dist.get_rank() == 0:
        with writing(tmp):
            atomic_write_json(tmp / "meta.json", {"step": step, "config": asdict(cfg), "inputs": inputs(cfg),
                                                  "rng": torch.get_rng_state().tolist(), "crc32": crcs})
        # A damaged step_N is replaced; one holding someone else's file is not (check_run refused it up front).
        foreign = foreign_files(final) if final.is_dir() else []
        check(not foreign, f"{final}: holds {foreign[:1]}, which we did not write; not replaced")
        with writing(final):
            replace_dir(tmp, final)
        LOADABLE[str(final)] = True       # its CRCs were just read from the files on disk
        for old in superseded_checkpoints(ckpt_root, cfg.keep_checkpoints):
            gone = old.with_name(f".{old.name}.old")   # renamed first: a kill mid-delete leaves only a
            try:                                       # name remove_killed_saves deletes, never a cut step_N
                old.rename(gone)
                shutil.rmtree(gone)
            except OSError as e:                       # retention saves space; the run goes on without it
                print(f"warning: could not delete the old checkpoint {old.name} ({e.strerror}); it stays",
                      file=sys.stderr, flush=True)
            LOADABLE.pop(str(old), None)
    io_barrier()

# What DCP and save_checkpoint write in a step folder; a folder holding anything else is not deleted.
CHECKPOINT_FILES = re.compile(r"meta\.json|\.metadata|__\d+_\d+\.distcp")

def crc32(path, chunk=1 << 24):
    if not path.is_file():
        return None                     # a missing file: check_crcs says so
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc

def shard_crcs(folder, names=None):
    """{file: CRC-32} of DCP's files in `folder` (or `names`), collective, each rank reading its share.
    DCP stores no checksum and bytes changed inside a tensor load without an error: meta.json keeps these."""
    if names is None:
        names = sorted(f.name for f in folder.iterdir() if f.name != "meta.json" and CHECKPOINT_FILES.fullmatch(f.name))
    mine = {n: crc32(folder / n) for n in names[dist.get_rank()::dist.get_world_size()]}
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine, group=distributed.IO_GROUP)
    return {n: c for part in parts for n, c in part.items()}

def check_crcs(folder, meta, collective=True):
    """ValueError naming the first DCP file not as saved (none saved: passes); collective unless told not."""
    saved = meta.get("crc32")
    if saved is None:
        return
    now = shard_crcs(folder, sorted(saved)) if collective else {n: crc32(folder / n) for n in saved}
    for name in sorted(saved):
        check(now[name] == saved[name],
              f"{name}: {'missing' if now[name] is None else 'bytes differ from those saved'}")

# {step folder: whether resume would load it}, for the folders this process saved, loaded or checked:
# retention asks at every save, and reading a 7B's checkpoint again each time would cost minutes.
LOADABLE = {}

def loadable(path):
    """Whether resume would load this step folder: checkpoint_meta, then every CRC (this rank reads all)."""
    if str(path) not in LOADABLE:
        try:
            check_crcs(path, checkpoint_meta(path), collective=False)
            LOADABLE[str(path)] = True
        except ValueError:
            LOADABLE[str(path)] = False
    return LOADABLE[str(path)]

def superseded_checkpoints(ckpt_root, keep):
    """Step folders older than the `keep` newest loadable ones, holding only our files (DESIGN.md, "Checkpoints")."""
    whole, old = 0, []
    for path in step_folders(ckpt_root):
        if whole >= keep:
            if not foreign_files(path):
                old.append(path)
        elif loadable(path):
            whole += 1
    return old

def foreign_files(step_dir):
    """Entries of a step folder not written by DCP or save_checkpoint: one holding any is never replaced."""
    return sorted(f.name for f in Path(step_dir).iterdir()
                  if not (CHECKPOINT_FILES.fullmatch(f.name) and f.is_file() and not f.is_symlink()))

def step_folders(ckpt_root):
    found = [p for p in Path(ckpt_root).glob("step_*") if re.fullmatch(r"step_\d+", p.name) and p.is_dir()
             and not p.is_symlink()]
    return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)

def checkpoint_meta(path):
    """meta.json of a checkpoint folder, or ValueError saying what is damaged: meta.json must parse and name
    this step; every byte range in DCP's .metadata must lie in its file (a truncated shard fails unread)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        step, config = meta["step"], meta["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"meta.json: {type(e).__name__}") from None
    check(step == int(path.name[5:]) and isinstance(config, dict), "meta.json: not this step's")
    rng = meta.get("rng")
    check(isinstance(rng, list) and len(rng) == torch.get_rng_state().numel()
          and all(isinstance(b, int) and 0 <= b < 256 for b in rng), "meta.json: no whole RNG state")
    crcs = meta.get("crc32", {})
    check(isinstance(crcs, dict) and all(isinstance(n, str) and CHECKPOINT_FILES.fullmatch(n) and isinstance(c, int)
                                         for n, c in crcs.items()), "meta.json: bad crc32")
    try:
        storage = dcp.FileSystemReader(str(path)).read_metadata().storage_data
    except Exception as e:            # a cut pickle raises EOFError, UnpicklingError, ... by where it was cut
        raise ValueError(f".metadata: {type(e).__name__}") from None
    for info in storage.values():
        shard = path / info.relative_path
        check(shard.is_file() and shard.stat().st_size >= info.offset + info.length,
              f"{info.relative_path}: shorter than .metadata says")
    return meta

def find_checkpoint(folders):
    """(first whole folder of `folders`, newest first, or None; its meta or None; ["step_N (damage)" skipped])."""
    skipped = []
    for path in folders:
        try:
            return path, checkpoint_meta(path), skipped
        except ValueError as e:
            skipped.append(f"{path.name} ({e})")
    return None, None, skipped

def resume_from(model, opt, ckpt, meta):
    """Restore model, optimizer and RNG from check_run's checkpoint, or else the next older whole one (DESIGN.md,
    "A damaged checkpoint"; a partial load is harmless: the next overwrites every tensor). Returns the step."""
    while True:
        err = None
        try:
            check_crcs(ckpt, meta)
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=str(ckpt), process_group=distributed.IO_GROUP)
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            torch.set_rng_state(torch.tensor(meta["rng"], dtype=torch.uint8))
            LOADABLE[str(ckpt)] = True
        except (Exception, CheckpointException) as e:    # many kinds; DCP's own is a BaseException
            err = f"{type(e).__name__}: {str(e)[:120]}"
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, err, group=distributed.IO_GROUP)
        errors = [e for e in errors if e]
        if not errors:
            return meta["step"]
        older = [p for p in step_folders(ckpt.parent) if int(p.name[5:]) < int(ckpt.name[5:])]
        failed, (ckpt, meta, _) = ckpt, find_checkpoint(older)
        if dist.get_rank() == 0:
            print(f"warning: {failed.name} could not be loaded ({errors[0]}); "
                  + (f"resuming from {ckpt.name}" if ckpt else "no older checkpoint"), file=sys.stderr, flush=True)
        if ckpt is None:
            dist.destroy_process_group()
            refuse(f"--resume: no checkpoint in {failed.parent} could be loaded; move the damaged ones away")

def check_safetensors(path):
    """ValueError unless a .safetensors file is as long as its header says (a cut one fails, no tensor read)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        raise ValueError(f"{path.name}: unreadable header") from None
    size = path.stat().st_size
    check(size == 8 + n + end, f"{path.name}: {size} bytes, its header says {8 + n + end}")

def inputs(cfg):
    """{flag: outputs.fingerprint} of --model, --tokenizer, --data, read once (DESIGN.md, "Resume with other flags")."""
    key = tuple(getattr(cfg, k) for k in INPUTS)
    if key not in FINGERPRINTS:
        FINGERPRINTS[key] = {k: fingerprint(getattr(cfg, k)) if getattr(cfg, k) else None for k in INPUTS}
    return FINGERPRINTS[key]

INPUTS, FINGERPRINTS = ("model", "tokenizer", "data"), {}

def conflict_message(folder, changed):
    return (f"--resume: {folder} was trained with other settings: {', '.join(changed)}; resume with the old "
            f"values or use another --out_dir (a resume may change only --{', --'.join(RESUME_MAY_CHANGE)})")

# What a run saved before a flag existed did, where that differs from the flag's default.
BEFORE_FLAG = {"maze_reward": "walk"}

def resume_conflicts(saved, cfg):
    """The flags not in RESUME_MAY_CHANGE that differ from `saved` (or BEFORE_FLAG), as "--name now (was before)"."""
    now, saved = asdict(cfg), {**BEFORE_FLAG, **saved}
    return [f"--{k} {now[k]} (was {v})" for k, v in saved.items()
            if k in now and k not in RESUME_MAY_CHANGE and now[k] != v]

# -----------------------------------------------------------------------------
# Exports: Hugging Face model folders for evaluate.py and checkpoint selection (App. L.4; DESIGN.md, "Exports")
def due_exports(cfg, done, num_prompts, out):
    """The exports due once `done` steps are finished (when epoch_E falls: DESIGN.md, "Exports"). Those already in
    out_dir are left out: they are this run's (a fresh run refuses exports; a resumed one redoes steps whose exports
    a killed try may have written, same settings: check_run). Rank 0 decides for everyone, since every rank must
    join export's gather or none."""
    names = []
    P = cfg.prompts_per_step
    if num_prompts and done * P // num_prompts > (done - 1) * P // num_prompts:
        names.append(f"epoch_{done * P // num_prompts}")       # at most one a step: num_prompts >= P
    if cfg.export_every and done % cfg.export_every == 0:
        names.append(f"step_{done:06d}")
    if names:
        decided = [[n for n in names if not (out / n).exists()]]
        dist.broadcast_object_list(decided, src=0)
        names = decided[0]
    return names

def progress(cfg, done, num_prompts):
    """progress.json of an export; checkpoint selection compares compute as rollouts (select_checkpoint)."""
    prompts = done * cfg.prompts_per_step
    return {"step": done, "prompts": prompts, "rollouts": prompts * cfg.group_size,
            "epochs": prompts / num_prompts if num_prompts else None, "num_prompts": num_prompts,
            "config": asdict(cfg), "git": git_sha()}

def export(model, tokenizer, out_dir, names, cfg, info):
    """Write out_dir/NAME for each of `names`: model.safetensors, config, tokenizer, progress.json (`info`). Every rank
    joins one gather (FSDP2 needs them all); rank 0 writes each folder atomically (outputs.atomic_dir)."""
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        def write(tmp):
            atomic_write_json(Path(tmp) / "progress.json", info)    # first: a source's own is not copied over it
            # A copy: save_pretrained empties the dict it is given, and a second folder then got no
            # weights at all (transformers 5.19), so each write also checks that they are there.
            model.save_pretrained(tmp, state_dict=dict(sd))
            check(any(Path(tmp).glob("*.safetensors")), "export: save_pretrained wrote no weights")
            if Path(cfg.model).is_dir():    # keep the source's tokenizer files (and a maze's sft.json) as is
                for f in Path(cfg.model).iterdir():     # not its hidden files: our marker, temp leftovers
                    if (f.is_file() and not f.name.startswith(".") and not (Path(tmp) / f.name).exists()
                            and f.suffix not in (".safetensors", ".bin")):
                        shutil.copy(f, tmp)
            else:
                tokenizer.save_pretrained(tmp)
        for name in names:
            with writing(Path(out_dir) / name):
                atomic_dir(Path(out_dir) / name, write)
    io_barrier()

def git_sha():
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"

