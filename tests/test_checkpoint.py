"""run_folder.py in-process, no trainer: the lock on out_dir and which step folders are ours.

    python -m pytest -q tests/test_checkpoint.py      # CPU, seconds
"""
import json
import os
import zlib
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp

from fgrpo_utils import run_folder
from fgrpo_utils.run_folder import LOCK, folder_problems, lock_out_dir, superseded_checkpoints


def take_lock(out):
    """lock_out_dir's answer; a lock it took is let go at once (flock is per open file)."""
    problems = lock_out_dir(out)
    if run_folder._lock is not None:
        run_folder._lock.close()
        run_folder._lock = None
    return problems


@pytest.mark.parametrize("case", ["symlink to a user's file", "a folder", "a user's file"])
def test_the_lock_never_writes_over_what_is_not_ours(tmp_path, case):
    """.train.lock as a symlink: the user's file it named was truncated and written over ("a+" follows
    links); as a folder: an IsADirectoryError traceback; a user's own .train.lock: written over. Each is
    now one line naming the file, and the file is as it was."""
    out, theirs = tmp_path / "run", tmp_path / "notes.txt"
    out.mkdir()
    theirs.write_text("my notes\n")
    lock = out / LOCK
    if case == "symlink to a user's file":
        lock.symlink_to(theirs)
    elif case == "a folder":
        lock.mkdir()
    else:
        lock.write_text("my notes\n")
    problems = take_lock(out)
    assert len(problems) == 1 and LOCK in problems[0] and "move it away" in problems[0], problems
    assert theirs.read_text() == "my notes\n"
    assert lock.is_dir() if case == "a folder" else lock.read_text() == "my notes\n"


@pytest.mark.parametrize("before", [None, "", "pid 123 on otherhost\n"])
def test_the_lock_takes_its_own_file(tmp_path, before):
    """Absent, empty (a run killed before it wrote) or a killed run's line: ours, and rewritten."""
    out = tmp_path / "run"
    out.mkdir()
    if before is not None:
        (out / LOCK).write_text(before)
    assert take_lock(out) == []
    assert (out / LOCK).read_text() == f"pid {os.getpid()} on {os.uname().nodename}\n"


def save_step(root, step, damage=False):
    """A real (tiny) DCP checkpoint with meta.json as save_checkpoint writes it; `damage` flips bytes
    inside the shard afterwards, its size unchanged: only the CRC tells."""
    path = root / f"step_{step:06d}"
    dcp.save({"model": {"w": torch.arange(256.0) + step}}, checkpoint_id=str(path), no_dist=True)
    crcs = {f.name: zlib.crc32(f.read_bytes()) for f in path.iterdir()}
    (path / "meta.json").write_text(json.dumps({"step": step, "config": {}, "crc32": crcs,
                                                "rng": torch.get_rng_state().tolist()}))
    if damage:
        shard = next(path.glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    return path


def test_retention_keeps_a_checkpoint_resume_would_load(tmp_path):
    """With the newest checkpoint damaged inside (its meta.json whole, a CRC off) and --keep_checkpoints 1,
    retention counted it as the one to keep and deleted every good one: the next resume had nothing to
    load. It now counts only what resume would load (CRCs included) and deletes only folders of ours."""
    run_folder.LOADABLE.clear()
    root = tmp_path / "ckpt"
    good = [save_step(root, s) for s in (1, 2, 3)]
    damaged = save_step(root, 4, damage=True)
    (good[0] / "notes.txt").write_text("not ours")
    assert superseded_checkpoints(root, 1) == [good[1]]              # step 3 kept; step 1 holds a user's file
    assert run_folder.LOADABLE == {str(damaged): False, str(good[2]): True}
    assert superseded_checkpoints(root, 2) == []
    run_folder.LOADABLE.clear()


def test_a_step_folder_holding_a_users_file_is_refused_before_a_save_replaces_it(tmp_path):
    """A save of step N replaced ckpt/step_N whole, a user's file inside included (a folder skipped
    as damaged, or one we never wrote). --resume now refuses such a folder up front, in one line."""
    out = tmp_path / "run"
    step = save_step(out / "ckpt", 2)
    assert folder_problems(SimpleNamespace(resume=True), out, None, None) == []
    (step / "notes.txt").write_text("not ours")
    problems = folder_problems(SimpleNamespace(resume=True), out, None, None)
    assert len(problems) == 1 and "ckpt/step_000002 holds 'notes.txt'" in problems[0], problems


def test_only_the_disks_errors_become_disk_trouble(tmp_path, monkeypatch):
    """run_folder.writing: an OSError (or DCP's gathered one) names its file and why; torch's writer at a
    full disk says only "unexpected pos", so the free space decides; any other error passes unchanged."""
    import errno
    from torch.distributed.checkpoint.api import CheckpointException
    target = tmp_path / "ckpt" / ".step_000002.tmp"
    with pytest.raises(run_folder.DiskTrouble, match=r"metrics\.jsonl: Read-only file system; fix that"):
        with run_folder.writing(target):
            raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "metrics.jsonl"))
    gathered = CheckpointException("save", {1: (OSError(errno.ENOSPC, "No space left on device", "x.distcp"), None)})
    with pytest.raises(run_folder.DiskTrouble, match=r"^x\.distcp: No space left on device"):
        with run_folder.writing(target):
            raise gathered
    cut = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    with pytest.raises(RuntimeError, match="unexpected pos"):           # room on the disk: not its fault
        with run_folder.writing(target):
            raise cut
    monkeypatch.setattr(run_folder.shutil, "disk_usage", lambda p: SimpleNamespace(free=4096))
    with pytest.raises(run_folder.DiskTrouble, match=rf"^{target}: no space left on the device \(4 KiB free"):
        with run_folder.writing(target):
            raise cut
    with pytest.raises(ValueError, match="a bug"):
        with run_folder.writing(target):
            raise ValueError("a bug")
