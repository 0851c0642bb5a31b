"""evaluate.py: pass@k curves, the subsampling test, and CPU end-to-end runs on a tiny
random Qwen2 with the real Qwen2.5 tokenizer.  `python -m pytest -q tests/test_evaluate.py`"""
import json
import math
from pathlib import Path

import numpy as np
import pytest

import advantage
from fgrpo_utils import outputs
import evaluate
import reward
import rollout

# -----------------------------------------------------------------------------
# pass@k


def test_curve_and_averages():
    curve = advantage.pass_at_k_curve(6, [0, 3, 6])
    assert list(curve) == [1, 2, 4, 6]
    assert curve[1] == pytest.approx(0.5) and curve[6] == pytest.approx(2 / 3)
    bm = {"math500": {"pass@k": {1: 0.2, 2: 0.4}}, "aime24": {"pass@k": {1: 0.4, 2: 0.6}}, "gpqa": {"pass@k": {1: 0.1, 2: 0.3}}}
    av = evaluate.averages(bm)
    assert av["math"]["pass@k"] == pytest.approx({1: 0.3, 2: 0.5}) and av["ood"]["benchmarks"] == ["gpqa"]


# -----------------------------------------------------------------------------
# Paired m-out-of-n subsampling test

def test_subsample_identical_inputs_not_significant():
    rng = np.random.default_rng(0)
    c = rng.binomial(64, rng.uniform(0, 1, 50))
    res = advantage.subsample_test({"math500": (64, c)}, {"math500": (64, c.copy())}, m=16, iters=2000,
                                   groups=evaluate.AVERAGES)
    assert not any(v["significant"] for per_k in res.values() for v in per_k.values())
    assert abs(res["math500"][1]["diff"]) < 0.01 and set(res) == {"math500", "math avg"}


def test_subsample_planted_difference_found():
    rng = np.random.default_rng(1)
    p = rng.uniform(0, 0.3, 100)
    ca, cb = rng.binomial(64, p), rng.binomial(64, np.minimum(1, p + 0.15))   # B is better
    res = advantage.subsample_test({"aime24": (64, ca), "gpqa": (64, ca)}, {"aime24": (64, cb), "gpqa": (64, ca)},
                                   m=16, iters=2000, groups=evaluate.AVERAGES)
    assert res["aime24"][1]["significant"] and res["aime24"][1]["diff"] > 0.1
    assert res["aime24"][1]["lo"] < res["aime24"][1]["diff"] < res["aime24"][1]["hi"]
    assert not res["gpqa"][1]["significant"] and res["math avg"][16]["significant"]


# -----------------------------------------------------------------------------
# End to end on CPU: tiny random Qwen2 + real Qwen2.5 tokenizer

class PlantedEngine(rollout.TorchEngine):
    """The real engine, except that sample 0 of every prompt is replaced by the boxed gold answer,
    so the counts and pass@k of the run are known in advance (a random model scores 0)."""

    golds = {}

    def generate(self, prompts, n, seeds, **kw):
        out = super().generate(prompts, n, seeds, **kw)
        for i, p in enumerate(out.prompt_index):
            if i % n == 0 and tuple(prompts[p]) in self.golds:
                out.token_ids[i] = self.golds[tuple(prompts[p])]
        return out


def plant(monkeypatch, benchmarks):
    tok = reward.load_tokenizer(str(evaluate.data_dir() / "tokenizers" / "qwen2.5"))
    for name in benchmarks:
        rows, task = evaluate.load_benchmark(name, 2)
        for r in rows:
            ids = tok(reward.format_prompt(tok, r["problem"], "qwen2.5", task), add_special_tokens=False)["input_ids"]
            PlantedEngine.golds[tuple(ids)] = tok(f"So \\boxed{{{r['answer']}}}<|im_end|>", add_special_tokens=False)["input_ids"]
    monkeypatch.setattr(rollout, "make_engine", lambda kind, path, *, pad_token_id, model, **kw:
                        PlantedEngine(model, pad_token_id))


def test_end_to_end_tiny(data, tmp_path, monkeypatch):
    plant(monkeypatch, ["math500", "aime24"])
    out = tmp_path / "a.json"
    cfg = evaluate.Config(model="tiny", benchmarks=("math500", "aime24", "synlogic"), n=4, max_problems=2,
                          max_new_tokens=8, workers=1, out=str(out))
    evaluate.main(cfg)
    res = json.loads(out.read_text())
    for name in ("math500", "aime24"):
        b = res["benchmarks"][name]
        assert b["n"] == 4 and len(b["ids"]) == 2 and b["c"] == [1, 1]      # only the planted sample
        assert b["pass@k"]["1"] == pytest.approx(0.25) and b["pass@k"]["4"] == pytest.approx(1.0)
        assert 0 <= b["trunc_frac"] <= 1
    assert "skipped" in res["benchmarks"]["synlogic"]
    assert res["averages"]["math"]["benchmarks"] == ["aime24", "math500"]
    assert "| a | 25.0/100.0 |" in out.with_suffix(".md").read_text()

    # The same config again samples the same completions (seeds come from the data).
    evaluate.main(evaluate.Config(**{**cfg.__dict__, "out": str(tmp_path / "b.json")}))
    assert json.loads((tmp_path / "b.json").read_text())["benchmarks"] == res["benchmarks"]

    cmp = evaluate.main(evaluate.Config(mode="compare", inputs=(str(out), str(tmp_path / "b.json")), m=2, iters=200,
                                        out=str(tmp_path / "cmp.json")))
    assert not cmp["math avg"][1]["significant"]
    evaluate.main(evaluate.Config(mode="report", inputs=(str(out), str(tmp_path / "b.json")), out=str(tmp_path / "rep")))
    assert (tmp_path / "rep.png").stat().st_size > 1000 and "| b |" in (tmp_path / "rep.md").read_text()


def test_delta_nll_rare_tiny(data, tmp_path, monkeypatch):
    """The rare set comes from correct base samples; scoring the base model itself gives exactly 0."""
    rows = reward.load_jsonl(data / "eval" / "math500.jsonl")[:3]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"problem": r["problem"], "answer": r["answer"]}) + "\n" for r in rows))
    tok = reward.load_tokenizer(str(data / "tokenizers" / "qwen2.5"))
    for r in rows:
        ids = tok(reward.format_prompt(tok, r["problem"], "qwen2.5"), add_special_tokens=False)["input_ids"]
        PlantedEngine.golds[tuple(ids)] = tok(f"\\boxed{{{r['answer']}}}", add_special_tokens=False)["input_ids"]
    monkeypatch.setattr(rollout, "make_engine", lambda kind, path, *, pad_token_id, model, **kw:
                        PlantedEngine(model, pad_token_id))
    select = dict(max_new_tokens=4, workers=0, rare_prompts=3, rare_samples=2, rare_frac=0.5)
    evaluate.main(evaluate.Config(mode="rare_select", model="tiny", data=str(train), out=str(tmp_path / "rare.json"),
                                  **select))
    rare = json.loads((tmp_path / "rare.json").read_text())
    assert rare["correct"] == 3 and len(rare["selected"]) == 2
    assert rare["selected"][0]["nll_base"] >= rare["selected"][1]["nll_base"] > 0
    delta = evaluate.main(evaluate.Config(mode="rare_score", model="tiny", rare=str(tmp_path / "rare.json"),
                                          out=str(tmp_path / "score.json")))
    assert delta == pytest.approx(0.0, abs=1e-5)


def test_config_errors():
    with pytest.raises(ValueError, match="--inputs"):
        evaluate.Config(mode="compare", inputs=("a.json",))
    with pytest.raises(ValueError, match="--benchmarks"):
        evaluate.Config(benchmarks=("mmlu",))
    with pytest.raises(ValueError, match="--rare_samples: acts only with --mode rare_select, not rare_score"):
        evaluate.Config(mode="rare_score", model="tiny", rare="r.json", rare_samples=4)
    with pytest.raises(ValueError, match="--n: acts only with --mode eval, not compare"):
        evaluate.Config(mode="compare", inputs=("a.json", "b.json"), n=64)
    assert math.isclose(evaluate.Config().temperature, 1.0) and evaluate.Config().n == 1024


# -----------------------------------------------------------------------------
# What goes wrong: bad data, a failure halfway, flags the maze benchmark used to ignore

def test_finished_benchmarks_survive_a_later_failure(data, tmp_path, monkeypatch):
    """Results used to be written once, at the very end: a crash in the last benchmark lost all."""
    plant(monkeypatch, ["math500"])

    def crash(completion):
        raise RuntimeError("the GPQA scorer broke")
    monkeypatch.setattr(evaluate.reward, "gpqa_letter", crash)
    out = tmp_path / "a.json"
    (tmp_path / ".a.json.tmp.k2x9").write_text("{")                    # what a killed run left
    with pytest.raises(RuntimeError, match="GPQA"):
        evaluate.main(evaluate.Config(model="tiny", benchmarks=("math500", "gpqa"), n=4, max_problems=2,
                                      max_new_tokens=8, workers=1, out=str(out)))
    res = json.loads(out.read_text())
    assert res["benchmarks"]["math500"]["c"] == [1, 1] and res["pending"] == ["gpqa"]
    assert res["averages"]["math"]["benchmarks"] == ["math500"] and "| a | 25.0/100.0 |" in out.with_suffix(".md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.md"]


@pytest.mark.parametrize("content,message", [(b"", "math500.jsonl: no problems"),
                                             (b'{"problem": "1+1", "answer": "2"}\n{"problem": "\xff"}\n',
                                              "math500.jsonl:2: not UTF-8"),
                                             (None, "No such file")])
def test_bad_benchmark_file_is_refused_before_any_model_loads(content, message, tmp_path, monkeypatch, capsys):
    """An empty file used to be sampled (nothing) and then divide by zero; a non-UTF-8 byte gave a
    byte offset with no file or line."""
    (tmp_path / "eval").mkdir()
    if content is not None:
        (tmp_path / "eval" / "math500.jsonl").write_bytes(content)
    monkeypatch.setenv("FGRPO_DATA", str(tmp_path))

    def no_model(*a, **kw):
        raise AssertionError("a model was loaded before the data was checked")
    monkeypatch.setattr(evaluate, "load_model", no_model)
    with pytest.raises(SystemExit) as e:
        evaluate.main(evaluate.Config(model="tiny", benchmarks=("math500",), n=2, out=str(tmp_path / "r.json")))
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "--benchmarks math500" in err, err
    assert message in err and not (tmp_path / "r.json").exists()


class RecordingEngine:
    """Answers every maze with DONE <eos> and remembers how it was asked to sample."""

    def __init__(self):
        self.kw = None

    def generate(self, prompts, n, seeds, **kw):
        self.kw = kw
        return rollout.Rollouts([i for i in range(len(prompts)) for _ in range(n)], [[7, 2]] * (len(prompts) * n),
                                [[0.0, 0.0]] * (len(prompts) * n), ["stop"] * (len(prompts) * n))


def test_maze_benchmark_honours_the_sampling_flags(tmp_path):
    """--top_p, --top_k and --max_new_tokens were recorded in the result but not passed to the engine."""
    import maze
    model_dir = tmp_path / "maze_model"
    maze.save_sft(maze.build_model(), maze.build_tokenizer(), model_dir, {"config": {"size": 7}})
    cfg = evaluate.Config(model=str(model_dir), benchmarks=("maze",), n=2, max_problems=3, temperature=0.7,
                          top_p=0.9, top_k=5, max_new_tokens=11, out=str(tmp_path / "r.json"))
    engine = RecordingEngine()
    res = evaluate.evaluate_maze(cfg, engine, maze.build_tokenizer())
    assert res["c"] == [0, 0, 0] and engine.kw["max_new_tokens"] == 11
    assert (engine.kw["temperature"], engine.kw["top_p"], engine.kw["top_k"]) == (0.7, 0.9, 5)


class DetourEngine:
    """Answers every maze with one step along its shortest path and back, then the path: right under
    the walk rule, wrong under the strict one."""

    def __init__(self, tok, grids):
        self.tok, self.grids = tok, grids

    def generate(self, prompts, n, seeds, **kw):
        import maze
        back = {"UP": "DOWN", "DOWN": "UP", "LEFT": "RIGHT", "RIGHT": "LEFT"}
        answers = [self.tok.convert_tokens_to_ids([p[0], back[p[0]], *p, "DONE", "<eos>"])
                   for p in map(maze.solve, self.grids)]
        return rollout.Rollouts([i for i in range(len(answers)) for _ in range(n)],
                                [a for a in answers for _ in range(n)], [[0.0] * len(a) for a in answers for _ in range(n)],
                                ["stop"] * (len(answers) * n))


def test_maze_benchmark_reward_rule(tmp_path):
    """--maze_reward picks the rule of c and pass@k (strict by default); both rules are saved."""
    import maze
    model_dir = tmp_path / "maze_model"
    maze.save_sft(maze.build_model(), maze.build_tokenizer(), model_dir, {"config": {"size": 9}})
    tok, grids = maze.build_tokenizer(), maze.heldout_mazes(9, 4)
    assert evaluate.Config().maze_reward == "strict"
    for rule in ("strict", "walk"):
        cfg = evaluate.Config(model=str(model_dir), benchmarks=("maze",), n=2, max_problems=4, maze_reward=rule,
                              out=str(tmp_path / "r.json"))
        res = evaluate.evaluate_maze(cfg, DetourEngine(tok, grids), tok)
        assert res["c_strict"] == [0] * 4 and res["c_walk"] == [2] * 4
        assert res["rule"] == rule and res["c"] == res[f"c_{rule}"] and res["trunc_frac"] == 0.0
        assert res["pass@k"][1] == (1.0 if rule == "walk" else 0.0)


# -----------------------------------------------------------------------------
# Checkpoint selection (App. L.4) on planted result files

def plant_result(path, model, counts, step=None, pending=()):
    """A result file as eval writes it, n = 4, from {benchmark: per-problem correct counts};
    step None = no progress.json (a base model). Rollouts are step * 256 * 8, as train.py records."""
    bm = {b: {"n": 4, "task": "math", "ids": list(range(len(c))), "c": c, "pass@k": evaluate.pass_at_k_curve(4, c)}
          for b, c in counts.items()}
    checkpoint = None if step is None else {"step": step, "rollouts": step * 256 * 8}
    outputs.atomic_write_json(path, {"config": {"model": model}, "checkpoint": checkpoint, "benchmarks": bm,
                                      "pending": list(pending), "averages": evaluate.averages(bm)})
    return str(path)


def planted_run(folder, per_epoch):
    """{epoch: (math500 counts over 4 problems, aime24 counts over 2)} -> result paths, 1 epoch = 100 steps."""
    folder.mkdir(parents=True)
    return [plant_result(folder / f"epoch_{e}.json", f"out/{folder.name}/epoch_{e}",
                         {"math500": m, **({"aime24": a} if a is not None else {})}, step=100 * e,
                         pending=() if a is not None else ("aime24",))
            for e, (m, a) in per_epoch.items()]


def test_selection_takes_the_baseline_best_then_the_focal_best_within_its_compute(tmp_path):
    """GRPO: epoch 2 is best if problems were pooled (12+0 of 24), epoch 3 by the mean of the two
    benchmarks' pass@1 (0.25 and 0.75), which is the paper's average; epoch 4 ties epoch 3 with more
    compute, and epoch 5 would win but lacks AIME24 (its run crashed), so it is left out, not averaged
    over MATH500 alone. F-GRPO's epoch 4 is its best, but it used more compute than GRPO's epoch 3:
    the rule takes its epoch 2."""
    grpo = planted_run(tmp_path / "grpo", {1: ([1] * 4, [1, 1]), 2: ([3] * 4, [0, 0]), 3: ([1] * 4, [3, 3]),
                                           4: ([2] * 4, [2, 2]), 5: ([4] * 4, None)})
    base = plant_result(tmp_path / "grpo" / "base.json", "Qwen/Qwen2.5-7B", {"math500": [0] * 4, "aime24": [0, 0]})
    sel = evaluate.main(evaluate.Config(mode="select", inputs=(base, *grpo), out=str(tmp_path / "grpo" / "selection.json")))
    assert sel["best"]["model"] == "out/grpo/epoch_3" and sel["best"]["math_pass@1"] == pytest.approx(0.5)
    assert sel["best"]["rollouts"] == 300 * 256 * 8 and sel["n"] == {"math500": 4, "aime24": 4}
    assert [e["result"] for e in sel["excluded"]] == ["epoch_5.json"] and "aime24" in sel["excluded"][0]["reason"]
    assert {c["result"] for c in sel["candidates"]} == {"base.json", *(f"epoch_{e}.json" for e in range(1, 5))}

    fgrpo = planted_run(tmp_path / "fgrpo", {1: ([1] * 4, [0, 0]), 2: ([3] * 4, [1, 1]), 3: ([2] * 4, [1, 1]),
                                             4: ([4] * 4, [4, 4])})
    free = evaluate.main(evaluate.Config(mode="select", inputs=tuple(fgrpo), out=str(tmp_path / "free.json")))
    assert free["best"]["model"] == "out/fgrpo/epoch_4"                      # without the rule
    again = evaluate.main(evaluate.Config(mode="select", inputs=(*fgrpo, str(tmp_path / "free.json")),
                                          out=str(tmp_path / "free.json")))     # a glob over a folder with its selection
    assert len(again["candidates"]) == 4
    with pytest.raises(SystemExit) as e:                         # a result as --out: refused, not overwritten
        evaluate.parse_config(evaluate.Config, ["--mode", "select", "--inputs", *fgrpo, "--out", fgrpo[0]])
    assert e.value.code == 2 and json.loads(open(fgrpo[0]).read())["config"]
    sel = evaluate.main(evaluate.Config(mode="select", inputs=(*fgrpo, base), baseline=str(tmp_path / "grpo" / "selection.json"),
                                        out=str(tmp_path / "fgrpo" / "selection.json")))
    assert sel["best"]["model"] == "out/fgrpo/epoch_2" and sel["max_rollouts"] == 300 * 256 * 8
    reasons = {e["result"]: e["reason"] for e in sel["excluded"]}
    assert "over the baseline's" in reasons["epoch_4.json"] and "compute unknown" in reasons["../grpo/base.json"]

    # compare and report read a selection.json as its best result
    got = evaluate.load_result(tmp_path / "fgrpo" / "selection.json")
    assert got["config"]["model"] == "out/fgrpo/epoch_2"
    evaluate.main(evaluate.Config(mode="report", inputs=(str(tmp_path / "grpo" / "selection.json"),
                                                         str(tmp_path / "fgrpo" / "selection.json")), out=str(tmp_path / "rep")))
    md = (tmp_path / "rep.md").read_text()
    assert "| grpo/epoch_3 | 50.0/" in md and "| fgrpo/epoch_2 | 50.0/" in md
    text = (tmp_path / "fgrpo" / "selection.md").read_text()
    assert text.splitlines()[1].startswith("| Run |") and "out/fgrpo/epoch_2" in text and "left out: epoch_4.json" in text


def test_selection_refuses_results_of_another_evaluation_setting(tmp_path):
    a = plant_result(tmp_path / "a.json", "a", {"math500": [1, 2]}, step=1)
    b = plant_result(tmp_path / "b.json", "b", {"math500": [1, 2, 3]}, step=2)       # other problems
    with pytest.raises(ValueError, match="other problems or another n"):
        evaluate.select_checkpoint({a: evaluate.load_result(a), b: evaluate.load_result(b)})
    gpqa = tmp_path / "c.json"
    outputs.atomic_write_json(gpqa, {"config": {"model": "c"}, "benchmarks": {"gpqa": {"n": 4, "ids": [0], "c": [1],
                                                                                       "pass@k": {"1": 0.25}}}})
    with pytest.raises(ValueError, match="no math benchmark"):
        evaluate.select_checkpoint({str(gpqa): evaluate.load_result(gpqa)})
    with pytest.raises(ValueError, match="--baseline .*not a selection"):       # before any evaluation
        evaluate.Config(mode="select", inputs=(a,), baseline=a, out=str(tmp_path / "s.json"))


def test_models_expands_globs_in_natural_order_and_refuses_clashes(tmp_path):
    for name in ("epoch_1", "epoch_2", "epoch_10", "final"):
        (tmp_path / "run" / name).mkdir(parents=True)
        (tmp_path / "run" / name / "config.json").write_text("{}")
        (tmp_path / "run" / name / "tokenizer.json").write_text("{}")
    cfg = evaluate.Config(models=(str(tmp_path / "run" / "epoch_*"), str(tmp_path / "run" / "final")),
                          out=str(tmp_path / "ev"))
    assert [evaluate.checkpoint_name(m) for m in cfg.models] == ["epoch_1", "epoch_2", "epoch_10", "final"]
    assert evaluate.outputs(cfg)[-2:] == [tmp_path / "ev" / "selection.json", tmp_path / "ev" / "selection.md"]
    (tmp_path / "other" / "final").mkdir(parents=True)
    for models, out, message in [((str(tmp_path / "run" / "step_*"),), "ev", "matches no folder"),
                                 ((str(tmp_path / "run" / "final"), str(tmp_path / "other" / "final")), "ev", "'final'"),
                                 ((str(tmp_path / "run" / "final"),), "ev.json", "a folder")]:
        with pytest.raises(ValueError, match=message):
            evaluate.Config(models=models, out=str(tmp_path / out))
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "final.json").write_text("my notes")              # not ours: never overwritten
    with pytest.raises(ValueError, match="did not write"):
        evaluate.Config(models=(str(tmp_path / "run" / "final"),), out=str(tmp_path / "ev"))


def test_compare_refuses_unlike_results_and_report_labels_them(tmp_path, capsys):
    """The same model scored under the strict and the walk maze rule compared as '+4.7 points,
    significant': results differing in a setting that changes the score do not compare; a report
    that mixes them names each row's setting; a file that is not a result is refused in one line."""
    a = plant_result(tmp_path / "a.json", "m", {"math500": [1, 2, 3, 4]})
    b = plant_result(tmp_path / "b.json", "m", {"math500": [2, 2, 3, 4]})
    walk = json.loads(open(b).read())
    walk["config"]["maze_reward"] = "walk"
    (tmp_path / "walk.json").write_text(json.dumps(walk))
    (tmp_path / "junk.json").write_text('{"hello": 1}')
    evaluate.Config(mode="compare", inputs=(a, b), m=2, out=str(tmp_path / "ab.json"))       # alike: fine
    for inputs, pattern in [((a, str(tmp_path / "walk.json")), "maze_reward None vs walk"),
                            ((a, str(tmp_path / "junk.json")), "not a result of evaluate.py")]:
        with pytest.raises(SystemExit) as e:
            evaluate.parse_config(evaluate.Config, ["--mode", "compare", "--inputs", *inputs, "--m", "2",
                                                    "--out", str(tmp_path / "cmp.json")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and pattern in err and len(err.strip().splitlines()) == 1, err
    evaluate.main(evaluate.Config(mode="report", inputs=(a, str(tmp_path / "walk.json")), out=str(tmp_path / "rep")))
    md = (tmp_path / "rep.md").read_text()
    assert "(maze_reward walk)" in md and "(maze_reward None)" in md


def test_models_over_the_baselines_compute_are_left_out_before_any_sampling(tmp_path):
    """--models with --baseline: progress.json shows each checkpoint's rollouts up front, so those over
    the cap are never evaluated, and a run where none qualifies stops at once (it used to sample all)."""
    for name, rollouts in (("epoch_1", 100), ("epoch_2", 200), ("epoch_3", 300)):
        d = tmp_path / "run" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "tokenizer.json").write_text("{}")
        (d / "progress.json").write_text(json.dumps({"step": rollouts, "rollouts": rollouts}))
    base = tmp_path / "selection.json"
    base.write_text(json.dumps({"best": {"rollouts": 200}, "candidates": []}))
    models = (str(tmp_path / "run" / "epoch_*"),)
    cfg = evaluate.Config(models=models, baseline=str(base), benchmarks=("math500",), out=str(tmp_path / "ev"))
    assert [Path(m).name for m in cfg.models] == ["epoch_1", "epoch_2"]
    base.write_text(json.dumps({"best": {"rollouts": 50}, "candidates": []}))
    with pytest.raises(ValueError, match="no checkpoint has at most 50 rollouts"):
        evaluate.Config(models=models, baseline=str(base), benchmarks=("math500",), out=str(tmp_path / "ev"))


@pytest.mark.slow                              # two maze evaluations, seconds
def test_models_skips_a_damaged_checkpoint_and_evaluates_the_rest(tmp_path):
    import maze
    for name in ("epoch_1", "epoch_2"):
        maze.save_sft(maze.build_model(), maze.build_tokenizer(), tmp_path / "run" / name, {"config": {"size": 7}})
    cut = tmp_path / "run" / "epoch_1" / "model.safetensors"
    cut.write_bytes(cut.read_bytes()[:1000])
    evaluate.main(evaluate.Config(models=(str(tmp_path / "run" / "epoch_*"),), benchmarks=("maze",), n=2,
                                  max_problems=2, out=str(tmp_path / "ev")))
    assert (tmp_path / "ev" / "epoch_2.json").is_file() and not (tmp_path / "ev" / "epoch_1.json").exists()


@pytest.mark.slow                              # three maze evaluations, seconds
def test_models_reuses_one_engine_and_scores_as_separate_runs(tmp_path):
    import maze
    import torch
    for seed, name in ((0, "epoch_1"), (1, "epoch_2")):
        torch.manual_seed(seed)
        model = maze.build_model()
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(4.0)                # spread the logits: distinct answers
        maze.save_sft(model, maze.build_tokenizer(), tmp_path / "run" / name, {"config": {"size": 7}})
    common = dict(benchmarks=("maze",), n=4, max_problems=6)
    alone = evaluate.main(evaluate.Config(model=str(tmp_path / "run" / "epoch_2"), out=str(tmp_path / "e2.json"), **common))
    evaluate.main(evaluate.Config(models=(str(tmp_path / "run" / "epoch_*"),), out=str(tmp_path / "ev"), **common))
    both = json.loads((tmp_path / "ev" / "epoch_2.json").read_text())
    assert both["benchmarks"]["maze"]["c_walk"] == alone["benchmarks"]["maze"]["c_walk"]
    first = json.loads((tmp_path / "ev" / "epoch_1.json").read_text())
    assert first["benchmarks"]["maze"] != both["benchmarks"]["maze"]     # it did change the weights
