"""Every numeric flag of every script, given a bad value, is refused before any work: exit status 2
and one line that names the flag. Built by walking the Config dataclasses, so a flag added later is
tested too (give it an entry in LEGAL_NEGATIVE or BAD if -1, NaN and inf are not all bad for it).
Then the flags that name files: models without tokenizers, data that is not UTF-8, output folders.

    python -m pytest -q tests/test_flags.py           # CPU, seconds
"""
import dataclasses
import importlib.util
import math
import re
import sys
import types
import typing
from pathlib import Path

import pytest

from fgrpo_utils import run_folder
import evaluate
import maze
import simulate
import train
from fgrpo_utils.cli import choices_of, field_comments, parse_config
from fgrpo_utils.outputs import mark_out_dir

ROOT = Path(__file__).resolve().parents[1]


def load_bench(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module                    # inspect (--help's comments) finds the source there
    spec.loader.exec_module(module)                    # importing does nothing but define things
    return module


SCRIPTS = {"train": train, "evaluate": evaluate, "maze": maze, "simulate": simulate,
           **{f"bench/{n}": load_bench(n) for n in ("compare_runs", "reward_scoring", "rollout_speed",
                                                     "simulate_step", "gpu_check")}}
# Fields where -1 is a legal value, with the bad value to try instead.
BAD = {("maze", "show_seed"): -2,                      # -1 = off
       ("simulate", "r_wrong"): 5.0,                   # rewards may be negative, but R_c > R_w
       ("simulate", "anchor_logit"): None, ("simulate", "correct_logit"): None}     # any finite logit
# Values that look harmless but are not: each refused, and named.
EXTRA = [("train", "grad_clip", 0), ("train", "dual_clip", 1), ("train", "temperature", 0),
         ("train", "top_p", 0), ("train", "top_p", 1.5), ("train", "maze_size", 8), ("train", "lr", 0),
         ("train", "group_size", 1), ("train", "adam_beta2", 1), ("train", "eps_low", 1.5),
         ("train", "passk_k", 0), ("train", "passk_k", 9), ("train", "unlikely_beta", 1.5),
         ("evaluate", "temperature", 0), ("evaluate", "top_p", 0), ("evaluate", "prompts_per_call", 0),
         ("evaluate", "rare_frac", 0), ("evaluate", "n", 0), ("maze", "size", 8), ("maze", "lr", 0)]


def numeric_type(typ):
    """int or float for a numeric field (also `float | None` and `tuple[int, ...]`), else None."""
    if typing.get_origin(typ) in (typing.Union, types.UnionType, tuple):
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
    return typ if typ in (int, float) else None


def cases():
    for script, module in SCRIPTS.items():
        hints = typing.get_type_hints(module.Config)
        for f in dataclasses.fields(module.Config):
            typ = numeric_type(hints[f.name])
            if typ is None:
                continue
            first = BAD.get((script, f.name), -1)
            values = ([first] if first is not None else []) + ([math.nan, math.inf] if typ is float else [])
            for v in values:
                yield script, f.name, v
    yield from EXTRA


def safe_argv(script, tmp_path):
    """Flags that keep a script's file checks off the machine's own out/ and runs/ folders."""
    return {"train": ["--out_dir", str(tmp_path / "run")], "maze": ["--out_dir", str(tmp_path / "sft")],
            "evaluate": ["--out", str(tmp_path / "r.json")], "simulate": ["--out_dir", str(tmp_path / "sim")]
            }.get(script, [])


def refusal(module, argv, capsys):
    """parse_config as the script's __main__ calls it -> (exit status, stderr)."""
    with pytest.raises(SystemExit) as e:
        parse_config(module.Config, argv)
    return e.value.code, capsys.readouterr().err


# simulate.py is being changed elsewhere; what its Config still accepts is recorded here, not fixed.
SIMULATE_GAPS = {}        # (flag, value) -> reason, for a simulate.py flag not yet checked


def xfail_simulate(script, name, value):
    reason = SIMULATE_GAPS.get((name, value)) if script == "simulate" else None
    return [pytest.mark.xfail(reason=reason, strict=False)] if reason else []


@pytest.mark.parametrize("script,name,value", [pytest.param(*c, id=f"{c[0]}--{c[1]}={c[2]}",
                                                            marks=xfail_simulate(*c)) for c in cases()])
def test_bad_numeric_flag_is_refused_in_one_line(script, name, value, tmp_path, capsys):
    module = SCRIPTS[script]
    code, err = refusal(module, safe_argv(script, tmp_path) + [f"--{name}", str(value)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(rf"--{name}\b", err), err


@pytest.mark.parametrize("name", sorted(__import__("fgrpo_utils.preflight").preflight.UPPER))
def test_every_train_flag_past_its_upper_bound_is_refused_before_any_work(name, tmp_path, capsys):
    """A huge --seed, --threads, --group_size, --lr or --prompts_per_step failed after set-up (an overflow in
    the sampler, gloo out of resources, AdamW's overflow) or built lists until memory ran out: now each
    numeric flag past the bound its use implies is one line naming it, before any work."""
    from fgrpo_utils.preflight import UPPER
    high = UPPER[name][0]
    past = high + 1 if isinstance(high, int) else high * 2
    code, err = refusal(train, safe_argv("train", tmp_path) + [f"--{name}", str(past)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"--{name} " in err and "at most" in err, err


def test_the_table_walks_every_script():
    names = {(s, n) for s, n, _ in cases()}
    assert {("train", "warmup_steps"), ("evaluate", "max_problems"), ("maze", "show_seed"),
            ("simulate", "group_sizes"), ("bench/rollout_speed", "prompts")} <= names
    assert len(names) > 80


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_help_explains_every_flag_and_lists_fixed_values(script, capsys):
    """--help read "default: X" for every flag. Now each flag shows its field's comment in the Config
    (continuation lines included, group headings not), and a flag with a fixed set of values lists them."""
    module = SCRIPTS[script]
    with pytest.raises(SystemExit) as e:
        parse_config(module.Config, ["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())            # argparse wraps lines: compare words
    comments = field_comments(module.Config)
    for f in dataclasses.fields(module.Config):
        assert comments.get(f.name), f"{script} --{f.name} has no comment in its Config"
        assert " ".join(comments[f.name].split()) in text, (script, f.name)
    for name, values in choices_of(module.Config).items():
        assert f"--{name} {{{','.join(map(str, values))}}}" in text, (script, name)
    if script == "train":
        assert "focal exponent, Eq. 12; 0 = the base method (default: 0.0)" in text
        assert "(this id or \"deepscaler\", needs `datasets`); no other hub id" in text     # a continuation line
        assert "--loss_agg {token-mean,seq-mean-token-mean,seq-mean-token-sum-norm}" in text
        assert "--engine {auto,torch,vllm}" in text and "--maze_reward {strict,walk}" in text
        assert "algorithm (each paper row" not in text                                     # a heading, no flag's
    if script == "evaluate":
        assert "--mode {eval,select,compare,report,rare_select,rare_score}" in text


@pytest.mark.parametrize("argv,name", [
    (["--ds_grpo", "true", "--gamma", "1"], "--gamma"), (["--ds_grpo", "true", "--norm_std", "false"], "--norm_std"),
    (["--loss", "cispo", "--dual_clip", "2"], "--dual_clip"), (["--nproc", "4"], "--nproc"),
    (["--gpu_memory_gb", "40"], "--gpu_memory_gb"),
    (["--task", "maze", "--eval_mazes", "0", "--eval_every", "2"], "--eval_every"),
    (["--task", "maze", "--eval_mazes", "0", "--eval_samples", "8"], "--eval_samples"),
    (["--attention", "varlen", "--padding_free", "false"], "--attention"),
    (["--attention", "varlen", "--share_prompts", "true"], "--attention"),
    (["--weighting", "maxrl", "--gamma", "0.5"], "--gamma"), (["--weighting", "passk", "--norm_std", "false"], "--norm_std"),
    (["--passk_k", "2"], "--passk_k"), (["--weighting", "maxrl", "--wreinforce_lambda", "0.2"], "--wreinforce_lambda"),
    (["--ds_grpo", "true", "--weighting", "maxrl"], "--weighting"),
    (["--ds_grpo", "true", "--unlikely_beta", "0.25"], "--unlikely_beta")])
def test_a_flag_that_cannot_act_is_refused(argv, name, tmp_path, capsys):
    """--ds_grpo true --gamma 1 trained exactly as --gamma 0 while run.json said gamma 1. A flag that
    cannot act in the run it is given to is refused in one line; without the other flag it is accepted."""
    code, err = refusal(train, safe_argv("train", tmp_path) + argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"error: {name} "), err
    assert "leave it out" in err


def test_flags_that_act_are_accepted(tmp_path):
    """Each flag test_a_flag_that_cannot_act_is_refused refuses is fine where it acts."""
    for kw in [dict(ds_grpo=True), dict(gamma=1.0, norm_std=False), dict(dual_clip=2.0), dict(loss="cispo"),
               dict(attention="varlen"), dict(weighting="passk", passk_k=2),
               dict(weighting="wreinforce", wreinforce_lambda=0.2), dict(weighting="maxrl", unlikely_beta=0.25)]:
        train.Config(**kw, out_dir=str(tmp_path / "run"))


@pytest.mark.parametrize("script", ["train", "evaluate"])
def test_a_model_that_is_neither_a_folder_nor_a_hub_id_is_refused(script, tmp_path, capsys):
    """--model TINY (a typo of tiny) ended in an offline Hugging Face traceback."""
    code, err = refusal(SCRIPTS[script], safe_argv(script, tmp_path) + ["--model", "TINY"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--model TINY: no such folder" in err and "did you mean tiny?" in err


# -----------------------------------------------------------------------------
# Flags that name files and folders

def foreign_dir(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir()
    (d / "thesis.tex").write_text("not ours")
    return d


def model_without_tokenizer(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def not_utf8(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_bytes(b'{"problem": "1+1", "answer": "2"}\n{"problem": "1+2", "answer": "3"}\n{"problem": "\xff"}\n')
    return f


def foreign_json(tmp_path):
    f = tmp_path / "package.json"
    f.write_text('{"name": "someone else\'s"}')
    return f


FILE_CASES = {
    "train --model tiny without --tokenizer": (train, lambda t: ["--model", "tiny"], "--tokenizer"),
    "train --model: a folder without a tokenizer": (train, lambda t: ["--model", str(model_without_tokenizer(t))],
                                                    "--model .*no tokenizer"),
    "train --tokenizer: a missing folder": (train, lambda t: ["--model", "tiny", "--tokenizer", str(t / "nope")],
                                            "--tokenizer .*no such folder"),
    "train --task maze: a model with no maze size": (train, lambda t: ["--task", "maze", "--model",
                                                                       str(model_without_tokenizer(t)), "--tokenizer",
                                                                       "Qwen/Qwen2.5-7B"], "--maze_size"),
    "train --data: not UTF-8": (train, lambda t: ["--data", str(not_utf8(t)), "--model", "tiny", "--tokenizer",
                                                  "Qwen/Qwen2.5-7B"], r"train\.jsonl:3: not UTF-8"),
    "train --data: missing": (train, lambda t: ["--data", str(t / "nope.jsonl")], "--data .*no such file"),
    "train --out_dir: holds files not ours": (train, lambda t: ["--out_dir", str(foreign_dir(t))],
                                              "--out_dir .*thesis.tex"),
    "maze --out_dir: holds files not ours": (maze, lambda t: ["--out_dir", str(foreign_dir(t))],
                                             "--out_dir .*thesis.tex"),
    "maze --out_dir: a file": (maze, lambda t: ["--out_dir", str(not_utf8(t))], "--out_dir .*is a file"),
    "evaluate --model: a folder without a tokenizer": (evaluate, lambda t: ["--model", str(model_without_tokenizer(t)),
                                                                            "--out", str(t / "r.json")],
                                                       "--model .*no tokenizer"),
    "evaluate --out: a folder": (evaluate, lambda t: ["--out", str(foreign_dir(t))], "--out .*expected a .json"),
    "evaluate --out: a file not ours": (evaluate, lambda t: ["--out", str(foreign_json(t))], "--out .*did not write"),
    "evaluate --out: inside a file": (evaluate, lambda t: ["--out", str(not_utf8(t) / "r.json")], "--out .*is a file"),
    "evaluate --out: its table would overwrite a README": (evaluate, lambda t: ["--out", str(t / "README.md")],
                                                           "--out .*expected a .json"),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_bad_path_flag_is_refused_in_one_line(case, tmp_path, capsys):
    module, argv, pattern = FILE_CASES[case]
    code, err = refusal(module, argv(tmp_path), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and re.search(pattern, err), err


def test_outputs_of_ours_are_accepted(tmp_path):
    """The same checks let a script write where it wrote before."""
    ours = tmp_path / "ours"
    mark_out_dir(ours, ["config.json"])
    (ours / "config.json").write_text("{}")
    maze.Config(out_dir=str(ours))
    run = tmp_path / "run"
    (run / "ckpt").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    train.Config(out_dir=str(run))
    result = tmp_path / "r.json"
    result.write_text('{"config": {}}')                  # a config is not a mark: not ours
    with pytest.raises(ValueError, match="evaluate.py did not write it"):
        evaluate.Config(out=str(result))
    result.write_text('{"written_by": "fgrpo evaluate.py", "config": {}}')
    evaluate.Config(out=str(result))
    (tmp_path / "r.md").write_text("| Run | mine |\n")    # the table beside it is checked too
    with pytest.raises(ValueError, match="r.md: exists"):
        evaluate.Config(out=str(result))


@pytest.mark.parametrize("argv,package,pattern", [
    (["--data", "deepscaler"], "datasets", r"^error: --data deepscaler: .*requirements-gpu\.txt"),
    (["--engine", "vllm"], "vllm", r"^error: --engine vllm: .*requirements-gpu\.txt"),
    (["--wandb", "true"], "wandb", r"^error: --wandb true: .*pip install wandb")])
def test_a_missing_package_is_refused_before_any_work(argv, package, pattern, tmp_path, monkeypatch, capsys):
    """The headline command's default --data loads DeepScaleR through `datasets`, which no
    requirements file listed: a fresh GPU node stopped with a traceback after loading the model."""
    (tmp_path / "train.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    local = [] if package == "datasets" else ["--data", str(tmp_path / "train.jsonl"), "--prompts_per_step", "1",
                                              "--mini_batch_prompts", "1"]
    cfg = parse_config(train.Config, safe_argv("train", tmp_path) + local + argv)   # a Config builds without it
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find_spec(name, *a))
    with pytest.raises(SystemExit) as e:
        train.main(cfg)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and re.search(pattern, err), err
    assert not (tmp_path / "run").exists()
    monkeypatch.undo()
    if package != "wandb":                     # the fix the line names installs it
        assert re.search(rf"^{package}\b", (ROOT / "requirements-gpu.txt").read_text(), re.M)


def test_resume_compares_a_flag_added_since_with_what_the_run_did(tmp_path):
    """A checkpoint saved before --maze_reward existed trained on the walk rule: resuming it under
    the strict default would change the experiment silently, so it is refused; --maze_reward walk is not."""
    model = tmp_path / "sft"
    maze.save_sft(maze.build_model(), maze.build_tokenizer(), model, {"config": {"size": 7}})
    cfg = train.Config(task="maze", model=str(model), out_dir=str(tmp_path / "run"))
    saved = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "maze_reward"}
    assert run_folder.resume_conflicts(saved, cfg) == ["--maze_reward strict (was walk)"]
    assert run_folder.resume_conflicts(saved, dataclasses.replace(cfg, maze_reward="walk")) == []
    assert run_folder.resume_conflicts({**saved, "maze_reward": "strict"}, cfg) == []


@pytest.mark.parametrize("script", ["train", "evaluate", "maze", "bench/gpu_check"])
def test_cuda_on_a_cpu_only_torch_is_refused_in_one_line(script, tmp_path, monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = safe_argv(script, tmp_path) + ["--device", "cuda"]
    if script == "train":                          # checked with the packages, before the process group
        with pytest.raises(SystemExit) as e:
            train.main(parse_config(train.Config, argv))
        code, err = e.value.code, capsys.readouterr().err
    else:
        code, err = refusal(SCRIPTS[script], argv, capsys)
    assert code == 2 and err.startswith("error: --device cuda: this torch") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("case", ["cpu", "old torch"])
def test_varlen_attention_where_its_kernel_is_missing_is_refused_in_one_line(case, tmp_path, monkeypatch, capsys):
    """--attention varlen calls a CUDA-only kernel of torch >= 2.10: on the CPU, or on a GPU with a torch
    without torch.nn.attention.varlen, refused at start-up in one line (a Config still builds: --plan)."""
    import torch
    argv = safe_argv("train", tmp_path) + ["--attention", "varlen", "--device", "cpu" if case == "cpu" else "cuda"]
    if case == "old torch":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "torch.nn.attention.varlen" else find_spec(name, *a))
    with pytest.raises(SystemExit) as e:
        train.main(parse_config(train.Config, argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: --attention varlen: "), err
    assert ("needs CUDA" if case == "cpu" else "no torch.nn.attention.varlen") in err
    assert not (tmp_path / "run").exists()


def test_a_kv_budget_too_small_for_one_group_is_one_line(tmp_path):
    """--kv_cache_gb too small for one group: the engine's ValueError came at the first rollout, not naming the
    flag; now one line naming it, before any step (preflight.check_engine_fits)."""
    import subprocess
    r = subprocess.run([sys.executable, "train.py", "--task", "reverse", "--model", "tiny", "--device", "cpu",
                        "--prompts_per_step", "4", "--mini_batch_prompts", "4", "--group_size", "2", "--steps", "1",
                        "--kv_cache_gb", "1e-9", "--threads", "1", "--out_dir", str(tmp_path / "run")],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("error: --kv_cache_gb 1e-09: too small"), r.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
