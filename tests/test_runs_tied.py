"""
grade.py --runs gives experiment points only to runs it can tie to the code handed in and to a model: a class run's
first two steps are replayed in the sandbox with the graded files from the run's own --model (harness.replay), its
final/ must not be that --model, and its last evaluation, like an evaluate.py maze result, is redone from the model it
names (grade.tied_to_model).

    python -m pytest -q tests/test_runs_tied.py

Withheld from the student copy (it trains with the graded functions, which a fresh copy has as stubs).
"""
import json
import shutil
import subprocess
import sys

import pytest
import torch

from test_assignments import GRADED_FILES, ROOT, edited, grade, launch
from test_train import ENV

STEPS = 3
FLAGS = ["--task", "maze", "--model", "out/sft", "--device", "cpu", "--threads", "1", "--lr", "1e-4", "--steps",
         str(STEPS), "--prompts_per_step", "4", "--mini_batch_prompts", "4", "--group_size", "4", "--eval_mazes", "8",
         "--eval_samples", "8", "--skip_dead_groups", "false", "--entropy_coef", "0.01", "--out_dir", "out/run"]
# a random policy solves no maze: the entropy bonus (GRPO-H) gives its update a direction to go


@pytest.fixture(scope="module")
def hand_in(tmp_path_factory):
    return student(tmp_path_factory.mktemp("tied") / "alice")


def student(root, edit=None):
    """A folder as a student's: the graded files handed in, a maze policy at out/sft (random: a run's numbers are
    then its entropy and log-probs, which tie it as well as rewards would), and a train.py run from it in out/run."""
    import maze
    if edit is None:
        for rel in GRADED_FILES:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, root / rel)
        program = ROOT / "train.py"
    else:                                       # the whole release, train.py edited, run as the student runs it
        root.mkdir(parents=True)
        tar = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=tar, check=True)
        (root / "train.py").write_text(edited("student", "train.py", [edit]))
        program = root / "train.py"
    torch.manual_seed(0)
    maze.save_sft(maze.build_model(), maze.build_tokenizer(), root / "out" / "sft", {"config": {"size": 7}})
    r = launch.run([sys.executable, str(program), *FLAGS], cwd=root, env=ENV, capture_output=True,
                   text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return root


def check(root):
    return grade.check_run(root, "out/run", STEPS, last=grade.PASSK[:1], tie=True)


def edit_rows(run, edit):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    edit(rows)
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in rows))


def test_a_run_is_tied_to_its_code_and_model_and_a_scripts_log_is_not(hand_in, tmp_path):
    """Before, a 60-line script's run.json and metrics.jsonl (required flags, the hand-in's hashes, finite rows)
    earned a run's points. A real run keeps them; a log with a first step its code and model do not give, a last
    evaluation its exported model does not give, or no model to replay from loses them, each with its reason."""
    assert check(hand_in) == []
    root = tmp_path / "bob"
    shutil.copytree(hand_in, root)
    run = root / "out" / "run"
    whole = (run / "metrics.jsonl").read_text()
    edit_rows(run, lambda rows: rows[0].update(entropy=rows[0]["entropy"] * 1.01))
    assert any("that log is not a run of this code" in w for w in check(root)), check(root)
    (run / "metrics.jsonl").write_text(whole)
    edit_rows(run, lambda rows: rows[-1].update({grade.PASSK[0]: 0.5}))        # the random policy solves none
    assert any("pass@1 0.500, but out/run/final gives 0.000" in w for w in check(root)), check(root)
    (run / "metrics.jsonl").write_text(whole)
    shutil.rmtree(run / "final")
    assert any("no model at out/run/final" in w for w in check(root)), check(root)
    shutil.copytree(root / "out" / "sft", run / "final")                    # the warm start as the run's result
    assert any("final/ holds the weights of its --model out/sft" in w for w in check(root)), check(root)
    shutil.rmtree(run / "final")
    shutil.rmtree(root / "out" / "sft")
    assert any("is no model folder" in w for w in check(root)), check(root)
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "config": {**info["config"], "model": str(hand_in / "out/sft")}}))
    assert any("is no model folder" in w for w in check(root)), check(root)   # outside the folder graded


def test_a_maze_evaluation_is_tied_to_the_model_it_names(hand_in, tmp_path):
    """evaluate.py's maze result (E3's warm start, A5) names its --model: its pass@1 must be what that model gives
    on the same mazes; one that names no model, or claims what the model does not give, is refused."""
    def write(c, **config):
        path = hand_in / "out" / "eval.json"
        path.write_text(json.dumps({"config": config, "pending": [], "benchmarks": {"maze": {
            "n": 8, "rule": "strict", "c": c, "pass@k": {"1": sum(c) / (8 * len(c))}}}}))
        return grade.check_eval(hand_in, "out/eval.json", "maze", 8, 16)
    assert write([0] * 16, model="out/sft") == []
    assert "gives 0.000" in write([4] * 16, model="out/sft")[0]
    assert "names no --model" in write([0] * 16)[0]
    assert "integer" in write([0.5] * 16, model="out/sft")[0]


def test_a_run_whose_update_went_another_way_outside_the_grader_is_refused(tmp_path):
    """Code that turns its gradient the wrong way unless the grader runs it (here: unless the program is
    harness.py) trains the student's own runs the wrong way. Its first step logs exactly what the grader's replay
    logs: every metric of a step is measured before that step's update (the gradient's norm does not change with
    its sign). Before, only that step was replayed and the run kept its points; the second step shows the way."""
    root = student(tmp_path / "dave", ("        (loss * world).backward()",
                                       '        (loss * world * (1 if "harness" in sys.argv[0] else -1)).backward()'))
    problems = check(root)
    assert any("step 2, replayed" in w and "as it runs here" in w for w in problems), problems
