"""The task registry (train.TASKS) and the toy task, the template a new task copies.

    python -m pytest -q tests/test_tasks.py        # ~20 s; not marked slow
"""
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import toy_task
import train
from fgrpo_utils.cli import parse_config
import launch

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}


def refusal(argv, capsys):
    """parse_config(train.Config) as `python train.py` calls it -> (exit status, stderr)."""
    with pytest.raises(SystemExit) as e:
        parse_config(train.Config, argv)
    return e.value.code, capsys.readouterr().err


def test_the_toy_task_trains_two_steps_with_no_tokenizer_folder(tmp_path):
    """The recipe's last step: `--task reverse --model tiny` builds the task's own tokenizer and a random
    policy of its 15 tokens, and trains. Partial rewards make a random policy's groups differ, so the
    advantages are not all 0 (a fixture where they were would test nothing)."""
    out = tmp_path / "run"
    r = launch.run([sys.executable, "train.py", "--task", "reverse", "--model", "tiny", "--device", "cpu",
                    "--threads", "1", "--steps", "2", "--prompts_per_step", "8", "--mini_batch_prompts", "8",
                    "--group_size", "4", "--warmup_steps", "0", "--lr", "1e-3", "--sample_every", "0",
                    "--out_dir", str(out)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(math.isfinite(v) for m in steps for v in m.values()), steps
    assert any(m["adv/abs_mean_pre"] > 0 for m in steps) and all(0 < m["reward/mean"] < 1 for m in steps)
    assert "reward/exact" in steps[0] and (out / "final" / "tokenizer.json").is_file()


def test_the_toy_reward_is_the_fraction_in_place():
    tok = toy_task.build_tokenizer()
    task = toy_task.make_task(SimpleNamespace(seed=0), tok, "qwen2")          # it reads cfg.seed only
    ids, answer = task.prompt(7)
    assert ids == task.prompt(7)[0] and tok.convert_ids_to_tokens(ids)[0] == "<bos>" and len(ids) == 5
    digits = ids[1:4]
    assert answer == digits[::-1] + [tok.eos_token_id]                      # the digits reversed, then <eos>
    rewards, counts = task.score([answer] * 3, [answer, answer[:2] + [tok.eos_token_id], []])
    assert rewards == [1.0, 0.5, 0.0] and counts == {"exact": 1}


def test_an_unknown_task_lists_the_registry(tmp_path, capsys):
    code, err = refusal(["--task", "sudoku", "--out_dir", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert all(name in err for name in train.TASKS), err


def test_the_flag_check_and_the_dispatch_read_the_same_table(tmp_path, monkeypatch):
    """One row added to TASKS is enough: --task accepts it, --model tiny takes its tokenizer (no
    --tokenizer), and its make builds the task."""
    made = []
    entry = train.TaskEntry(lambda cfg, tok, model_type: made.append((cfg.task, tok, model_type)) or "a task",
                            tokenizer=toy_task.build_tokenizer)
    monkeypatch.setitem(train.TASKS, "echo", entry)
    cfg = parse_config(train.Config, ["--task", "echo", "--model", "tiny", "--out_dir", str(tmp_path / "run")])
    tok = train.load_tokenizer(cfg)
    assert len(tok) == len(toy_task.VOCAB)
    assert train.TASKS[cfg.task].make(cfg, tok, "qwen2") == "a task" and made == [("echo", tok, "qwen2")]


@pytest.mark.parametrize("argv,flag", [
    (["--task", "reverse", "--max_response_len", "16"], "--max_response_len"),
    (["--task", "reverse", "--eval_every", "5"], "--eval_every"),
    (["--task", "maze", "--maze_size", "7", "--model", "tiny", "--data", "x.jsonl"], "--data"),
    (["--task", "math", "--maze_size", "7"], "--maze_size"),
])
def test_a_flag_the_task_ignores_is_refused(argv, flag, tmp_path, capsys):
    """--max_response_len on the toy task, whose budget is its own, used to be dropped without a word."""
    code, err = refusal(argv + ["--out_dir", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {flag} ") and "ignores it" in err, err


def test_math_on_a_tiny_model_still_needs_a_tokenizer(tmp_path, capsys):
    code, err = refusal(["--task", "math", "--model", "tiny", "--out_dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "--tokenizer" in err and "--task math brings no tokenizer" in err, err
    # the maze brings its own: a random paper-sized policy from --model tiny, given a maze size
    parse_config(train.Config, ["--task", "maze", "--model", "tiny", "--maze_size", "7", "--out_dir", str(tmp_path / "r")])
