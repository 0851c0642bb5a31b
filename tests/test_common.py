"""fgrpo_utils/cli.py and outputs.py: output folders we may write, atomic folder writes, one-line flag errors, input checks.

    python -m pytest -q tests/test_common.py          # CPU, seconds
"""
import json
import re
from dataclasses import dataclass

import pytest

from fgrpo_utils import cli, outputs
from fgrpo_utils.cli import check_pretrained, check_utf8, parse_config
from fgrpo_utils.outputs import MARKER, atomic_dir, check_out_dir, mark_out_dir


def write_two_files(d):
    (d / "a.txt").write_text("new a")
    (d / "b.txt").write_text("new b")


def test_check_out_dir_accepts_only_what_is_ours(tmp_path):
    check_out_dir(tmp_path / "absent")                                  # created later
    check_out_dir(tmp_path)                                             # empty
    mine = tmp_path / "mine"
    mark_out_dir(mine, ["a.txt"])
    (mine / "a.txt").write_text("x")
    (mine / ".a.txt.tmp.k3j2").write_text("left by a kill")           # our temp name: ours too
    check_out_dir(mine)
    known = tmp_path / "known"                                          # a script's fixed outputs
    (known / "ckpt").mkdir(parents=True)
    check_out_dir(known, known=("ckpt", "run.json"))
    (known / "epoch_3").mkdir()                                         # known by a pattern (train.py's exports)
    (known / ".epoch_4.tmp.x1y2").mkdir()                               # and a killed write of one
    check_out_dir(known, known=("ckpt", "epoch_[0-9]*"))
    with pytest.raises(ValueError, match=r"holds '.epoch_4.tmp.x1y2' and 1 more"):
        check_out_dir(known, known=("ckpt",))
    (known / "epochs.txt").write_text("notes")                         # near the pattern, but not ours
    with pytest.raises(ValueError, match="epochs.txt"):
        check_out_dir(known, known=("ckpt", "epoch_[0-9]*"))


@pytest.mark.parametrize("case", ["foreign file", "foreign beside ours", "is a file", "file in the way"])
def test_check_out_dir_refuses_in_one_message_naming_the_flag(tmp_path, case):
    path = tmp_path / "out"
    if case == "foreign file":
        path.mkdir()
        (path / "thesis.tex").write_text("years of work")
    elif case == "foreign beside ours":
        mark_out_dir(path, ["a.txt"])
        (path / "notes.txt").write_text("mine, not the program's")
    elif case == "is a file":
        path.write_text("a file")
    else:
        (tmp_path / "f").write_text("a file")
        path = tmp_path / "f" / "out"
    with pytest.raises(ValueError, match="^--out_dir ") as e:
        check_out_dir(path)
    assert "\n" not in str(e.value)


def test_atomic_dir_never_replaces_a_folder_that_is_not_ours(tmp_path):
    """The old atomic_dir moved any existing folder aside and deleted it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match="did not write"):
        atomic_dir(out, write_two_files)
    assert (out / "thesis.tex").read_text() == "years of work" and sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]              # no temp folder left behind
    file_out = tmp_path / "file"
    file_out.write_text("a file")
    with pytest.raises(ValueError, match="is a file"):
        atomic_dir(file_out, write_two_files)
    assert file_out.read_text() == "a file"


def test_atomic_dir_replaces_its_own_output_and_clears_leftovers(tmp_path):
    out = tmp_path / "out"
    atomic_dir(out, lambda d: (d / "a.txt").write_text("old"))
    assert json.loads((out / MARKER).read_text())["entries"] == ["a.txt"]
    (tmp_path / ".out.tmp.abc123").mkdir()                              # a write killed halfway
    (tmp_path / ".out.old").mkdir()                                     # a replacement killed halfway
    (tmp_path / ".out.notes").write_text("not one of our temp names")
    atomic_dir(out, write_two_files)
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "a.txt", "b.txt"]
    assert (out / "a.txt").read_text() == "new a"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.notes", "out"]
    (out / "mine.txt").write_text("added by hand")                      # now the folder is not all ours
    with pytest.raises(ValueError, match="mine.txt"):
        atomic_dir(out, write_two_files)
    assert (out / "mine.txt").exists()


def test_check_utf8_names_file_and_line(tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_bytes(b'{"problem": "1+1", "answer": "2"}\n{"problem": "caf\xe9", "answer": "x"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{f}:2: not UTF-8 (byte 0xe9 at column 17)")):
        check_utf8(f)
    f.write_text('{"problem": "café"}\n')
    check_utf8(f)


def test_check_pretrained(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="no config.json"):
        check_pretrained(str(model), "--model")
    (model / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="^--model .*no tokenizer"):    # used to load a 1-token tokenizer
        check_pretrained(str(model), "--model")
    check_pretrained(str(model), "--model", tokenizer=False)
    (model / "tokenizer.json").write_text("{}")
    check_pretrained(str(model), "--model")
    with pytest.raises(ValueError, match="no such folder"):
        check_pretrained(str(tmp_path / "missing"), "--model")
    check_pretrained("Qwen/Qwen2.5-7B", "--model")                      # a hub id: from_pretrained's business


@dataclass
class Small:
    steps: int = 1

    def __post_init__(self):
        cli.check_min(self, 1, "steps")


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--steps", "abc"], ["--stpes", "2"]])
def test_parse_config_errors_are_one_line_and_exit_2(argv, capsys):
    """A bad value, a value of the wrong type and an unknown flag: argparse used to print its usage
    first, two lines."""
    with pytest.raises(SystemExit) as e:
        parse_config(Small, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and argv[0] in err, err


def test_atomic_dir_leaves_shareable_files(tmp_path):
    """save_pretrained writes model.safetensors 0600; a folder made to be shared gets 0644 files."""
    import os
    from fgrpo_utils.outputs import atomic_dir

    def write(tmp):
        (tmp / "sub").mkdir()
        for f in (tmp / "model.safetensors", tmp / "sub" / "x"):
            f.write_text("w")
            os.chmod(f, 0o600)
    atomic_dir(tmp_path / "out", write)
    for f in (tmp_path / "out" / "model.safetensors", tmp_path / "out" / "sub" / "x"):
        assert f.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755


def test_atomic_dir_writes_through_a_symlink_and_keeps_it(tmp_path):
    import os
    from fgrpo_utils.outputs import atomic_dir
    target = tmp_path / "target"
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=False)
    atomic_dir(link, lambda tmp: (tmp / "a.txt").write_text("x"))
    assert link.is_symlink() and (target / "a.txt").read_text() == "x"
    atomic_dir(link, lambda tmp: (tmp / "b.txt").write_text("y"))        # replaced again, through the link
    assert link.is_symlink() and sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) == ["b.txt"]
    assert os.path.realpath(link) == str(target)


def test_one_rule_decides_what_is_ours(tmp_path):
    """outputs.is_ours answers for every script: a file carries its script's mark (JSON, table, PNG) or
    is listed by its folder's marker; a folder holds our marker and nothing else of anyone's; a
    symlink, a bare "config" object, or another script's mark where one script asks, is not ours."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    outputs.write_json_out(tmp_path / "r.json", {"config": {}}, "evaluate.py")
    outputs.write_table_out(tmp_path / "r.md", "| Run |\n", "evaluate.py")
    fig = plt.figure()
    fig.savefig(tmp_path / "r.png", metadata=outputs.png_metadata("evaluate.py"))
    fig.savefig(tmp_path / "plain.png")
    plt.close(fig)
    for name in ("r.json", "r.md", "r.png"):
        assert outputs.is_ours(tmp_path / name, "evaluate.py") and outputs.is_ours(tmp_path / name)
        assert not outputs.is_ours(tmp_path / name, "bench/gpu_check.py")
    (tmp_path / "cfg.json").write_text('{"config": {}}')
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "fake.png").write_text("not a png")
    (tmp_path / "link.json").symlink_to(tmp_path / "r.json")
    for name in ("plain.png", "cfg.json", "list.json", "fake.png", "link.json", "absent.json"):
        assert not outputs.is_ours(tmp_path / name), name
    folder = tmp_path / "export"
    mark_out_dir(folder, ["model.safetensors"])
    (folder / "model.safetensors").write_text("x")
    assert outputs.is_ours(folder) and outputs.is_ours(folder / "model.safetensors")
    (folder / "notes.txt").write_text("mine")
    assert not outputs.is_ours(folder) and not outputs.is_ours(folder / "notes.txt")
    (tmp_path / "bare").mkdir()
    assert not outputs.is_ours(tmp_path / "bare")                          # no marker: someone's folder
    with pytest.raises(ValueError, match="^--out .*cfg.json: exists and evaluate.py did not write it"):
        outputs.check_out_file(tmp_path / "cfg.json", "--out", "evaluate.py")
    outputs.check_out_file(tmp_path / "r.json", "--out", "evaluate.py")
