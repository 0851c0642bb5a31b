"""
Evaluation as in the paper: unbiased pass@k (Eq. 27) on six math and three out-of-domain benchmarks
(Table 1), the paired m-out-of-n subsampling test between two runs (App. Q), and Delta NLL_rare (App. M.2).

    python evaluate.py --model tiny --benchmarks math500 gpqa --n 4 --max_problems 2 --max_new_tokens 16 \\
        --out runs/eval/tiny.json                                                             # CPU smoke test
    python evaluate.py --model Qwen/Qwen2.5-7B --device cuda --out runs/eval/qwen25_base.json     # n = 1024, all
    python evaluate.py --models 'out/grpo/epoch_*' --device cuda --out runs/eval/grpo   # each epoch, then the best
    python evaluate.py --models 'out/fgrpo/epoch_*' --baseline runs/eval/grpo/selection.json --device cuda \\
        --out runs/eval/fgrpo                          # F-GRPO's best within the baseline's compute (App. L.4)
    python evaluate.py --mode select --inputs runs/eval/grpo/epoch_*.json --out runs/eval/grpo_best.json
    python evaluate.py --mode compare --inputs runs/eval/grpo.json runs/eval/fgrpo.json --out runs/eval/cmp.json
    python evaluate.py --mode report --inputs runs/eval/grpo.json runs/eval/fgrpo.json --out runs/eval/table1
    python evaluate.py --model out/maze_rl/final --benchmarks maze --n 64 --out runs/eval/maze.json   # Table 4
    python evaluate.py --mode rare_select --model Qwen/Qwen2.5-7B --device cuda --out runs/eval/rare_set.json
    python evaluate.py --mode rare_score --model out/fgrpo/epoch_5 --rare runs/eval/rare_set.json \\
        --out runs/eval/rare_fgrpo.json

Modes: eval, select, compare (B minus A), report, rare_select / rare_score (Delta NLL_rare). What each writes,
and the choices the paper leaves open (averages, seeds, gold fixes, the test): DESIGN.md, "Evaluation".
"""
import glob
import json
import math
import sys
import os
import random
import re
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

import maze
import reward
from advantage import pass_at_k_curve, subsample_test
from fgrpo_utils import ood
from fgrpo_utils.cli import (check, check_choices, check_device, check_min, check_positive, check_pretrained,
                             check_utf8, data_dir, parse_config, refuse)
from fgrpo_utils.outputs import (Damaged, check_out_file, png_metadata, read_json, remove_temp, write_json_out,
                                 write_table_out)

SCRIPT = "evaluate.py"           # the mark in every file it writes (outputs.is_ours)

# name -> (file under data_dir()/eval, task). Table 1 orders them as MATH then OOD.
BENCHMARKS = {"aime24": ("aime24.jsonl", "math"), "aime25": ("aime25.jsonl", "math"), "amc23": ("amc23.jsonl", "math"),
              "math500": ("math500.jsonl", "math"), "minerva": ("minerva_math.jsonl", "math"),
              "olympiadbench": ("olympiadbench.jsonl", "math"), "ifeval": ("ifeval.jsonl", "ifeval"),
              "synlogic": (None, "synlogic"), "gpqa": ("gpqa/dataset.zip", "gpqa"),
              "maze": (None, "maze")}      # held-out mazes (Sec. 5.2, App. K); --model must be a maze checkpoint
MATH = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")
OOD = ("ifeval", "synlogic", "gpqa")
AVERAGES = (("math avg", MATH), ("ood avg", OOD))    # what the significance test averages (Table 1's Avg.)
LABELS = {"aime24": "AIME24", "aime25": "AIME25", "amc23": "AMC23", "math500": "MATH500", "minerva": "Minerva",
          "olympiadbench": "Olympiad", "ifeval": "IFEval", "synlogic": "SynLogic", "gpqa": "GPQA-D", "maze": "Maze"}
SYNLOGIC_MSG = ("synlogic: skipped. Its eval split (SynLogic-Val) exists only on the Hugging Face hub and "
                "is not in the data folder; the OOD average covers IFEval and GPQA only.")
# (benchmark, row index) -> gold that math-verify parses as intended (DESIGN.md, "Evaluation": gold fixes)
GOLD_FIXES = {("minerva", 5): "\\arcsin(10/13)", ("minerva", 38): "-1/3", ("minerva", 49): "-3/2",
              ("olympiadbench", 34): "n^{2}-n-1", ("olympiadbench", 96): "(0,4]"}

# The modes each flag acts in: set to another value than its default in any other mode, it is refused.
MODE_FLAGS = {("eval",): ("models", "n", "benchmarks", "max_problems", "maze_reward"),
              ("eval", "rare_select"): ("temperature", "top_p", "top_k", "max_new_tokens", "prompts_per_call",
                                        "engine", "workers"),
              ("eval", "rare_select", "rare_score"): ("model", "family", "device"),
              ("compare",): ("m", "iters"), ("compare", "report", "select"): ("inputs",),
              ("rare_select",): ("data", "rare_prompts", "rare_samples", "rare_frac"), ("rare_score",): ("rare",)}

@dataclass
class Config:
    mode: str = "eval"             # eval | select | compare | report | rare_select | rare_score
    model: str = "Qwen/Qwen2.5-7B" # HF id or local dir; "tiny" = random 2-layer Qwen2 + the real Qwen2.5 tokenizer
    models: tuple[str, ...] = ()   # eval: checkpoints (dirs or quoted globs), then the best; --out is a folder
    baseline: str = ""             # --models, select: the baseline's selection.json; compute cap: its best (App. L.4)
    family: str = "auto"           # qwen2.5 | qwen3 | llama3 (prompts, stop tokens, length); auto = from the model
    benchmarks: tuple[str, ...] = MATH + OOD   # eval: the held-out sets to sample (reward.BENCHMARKS)
    n: int = 1024                  # samples per problem (the paper's n, Tables 12-14)
    temperature: float = 1.0       # > 0: pass@k needs samples (no greedy), and the engines divide logits by T
    top_p: float = 1.0             # in (0, 1]
    top_k: int = 0                 # 0 = off
    max_new_tokens: int = 0        # 0 = the family's length: 8192 (Qwen2.5, Llama) or 4096 (Qwen3)
    max_problems: int = 0          # 0 = all; else the first max_problems of each benchmark
    prompts_per_call: int = 8      # prompts per engine.generate call (each gives n completions)
    engine: str = "torch"          # torch | vllm (rollout.make_engine)
    maze_reward: str = "strict"    # maze: the rule of c and pass@k, "strict" (Sec. 5.2) | "walk"; both are saved
    device: str = "cpu"            # cpu | cuda | cuda:N
    seed: int = 0                  # sampling seeds are keyed by (seed, problem, sample)
    workers: int = 2               # math-verify worker processes
    inputs: tuple[str, ...] = ()   # compare (A then B) / report / select: result files; a selection.json = its best
    m: int = 256                   # compare: subsample size (App. Q)
    iters: int = 50_000            # compare: subsampling iterations
    data: str = ""                 # rare_select: training jsonl; "" = data_dir()/train/deepscaler_partial.jsonl
    rare: str = ""                 # rare_score: the file rare_select wrote
    rare_prompts: int = 256        # rare_select: training prompts sampled for the rare set
    rare_samples: int = 800        # rare_select: samples per prompt
    rare_frac: float = 0.01        # top 1% by base NLL among correct rollouts, in (0, 1]
    out: str = "runs/eval/result.json"   # .json (report: a stem; --models: a folder); replaces only our own files

    def __post_init__(self):
        check_choices(self)
        check(len(self.benchmarks) == len(set(self.benchmarks)), "--benchmarks: a benchmark is named twice")
        check_min(self, 1, "n", "prompts_per_call", "m", "iters", "rare_prompts", "rare_samples")
        check_min(self, 0, "top_k", "max_new_tokens", "max_problems", "seed", "workers")
        check_positive(self, "temperature")
        check(0 < self.top_p <= 1, f"--top_p {self.top_p}: must be in (0, 1]")
        check(0 < self.rare_frac <= 1, f"--rare_frac {self.rare_frac}: must be in (0, 1]")
        check(self.device == "cpu" or self.device.startswith("cuda"),
              f"--device {self.device!r}: expected cpu or cuda[:N]")
        check_device(self.device)
        check(self.mode != "compare" or len(self.inputs) == 2, "--inputs: compare needs exactly two result files")
        check(self.mode not in ("report", "select") or len(self.inputs) >= 1,
              f"--inputs: {self.mode} needs at least one result file")
        for modes, names in MODE_FLAGS.items():
            for name in names:
                check(self.mode in modes or getattr(self, name) == Config.__dataclass_fields__[name].default,
                      f"--{name}: acts only with --mode {' or '.join(modes)}, not {self.mode}; leave it out")
        check(not self.baseline or self.mode == "select" or self.models,
              "--baseline: only with --models or --mode select")
        self.models = expand_models(self.models)
        check(self.mode != "rare_score" or self.rare, "--rare: rare_score needs the rare_select output")
        self.check_files()

    @staticmethod
    def choices():
        return {"mode": ("eval", "select", "compare", "report", "rare_select", "rare_score"),
                "benchmarks": tuple(BENCHMARKS), "family": ("auto", *reward.FAMILIES), "engine": ("torch", "vllm"),
                "maze_reward": maze.RULES}

    def check_files(self):
        """What the mode reads exists, and what it writes may be written, before any model loads."""
        flag = "--models" if self.models else "--model"
        if self.mode in ("eval", "rare_select", "rare_score"):
            for m in self.models or (self.model,):
                if m != "tiny":
                    check_pretrained(m, flag)
                if self.mode == "eval" and "maze" in self.benchmarks:
                    check((Path(m) / "sft.json").is_file(), f"{flag} {m}: no sft.json, not a maze checkpoint")
        loaded = []                                    # the results, read once for the checks below
        for f in self.inputs:
            check(Path(f).is_file(), f"--inputs {f}: no such file")
            if self.mode != "select" or not is_selection_file(f):
                try:
                    loaded.append(load_result(f))
                except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError) as e:
                    why = e if isinstance(e, Damaged) else f"damaged: {f} (not a result of evaluate.py)"
                    raise ValueError(f"--inputs: {why}") from None
        if self.mode == "compare":
            ra, rb = loaded
            differ = score_differences([ra, rb])
            check(not differ, "--inputs: A and B were scored under different settings (" + ", ".join(
                f"{k} {ra['config'].get(k)} vs {rb['config'].get(k)}" for k in differ) + "); compare like with like")
        if self.baseline:
            check(Path(self.baseline).is_file(), f"--baseline {self.baseline}: no such file")
            cap = baseline_rollouts(self.baseline)     # a bad one stops here, not after the evaluations
            if self.models:                            # what the cap rules out is known now: never sample it
                within = [m for m in self.models if (training_progress(m) or {}).get("rollouts", math.inf) <= cap]
                check(within, f"--models: no checkpoint has at most {cap} rollouts (--baseline {self.baseline}'s "
                      "best) in its progress.json, so none could be selected")
                over = [m for m in self.models if m not in within]
                if over:
                    print(f"--baseline: leaving out {len(over)} checkpoint(s) over {cap} rollouts or of unknown "
                          f"compute: {', '.join(over)}", file=sys.stderr)
                self.models = tuple(within)
        check(self.mode != "rare_score" or Path(self.rare).is_file(), f"--rare {self.rare}: no such file")
        if self.mode == "rare_select" and self.data:
            check(Path(self.data).is_file(), f"--data {self.data}: no such file")
            check_utf8(self.data)
        if self.models:
            check(not self.out.endswith(".json"), f"--out {self.out}: with --models, a folder (one result per "
                  "checkpoint, and selection.json)")
        else:
            check(self.mode == "report" or self.out.endswith(".json"), f"--out {self.out}: expected a .json name")
        # a selection may be rewritten over the glob that found it (it is no candidate); a result may not
        inputs = {Path(f).resolve() for f in self.inputs if not (self.mode == "select" and is_selection_file(f))}
        for f in outputs(self):
            check(f.resolve() not in inputs, f"--out {self.out}: {f} is one of --inputs; write it elsewhere")
            check_out_file(f, "--out", SCRIPT)

def outputs(cfg):
    out = Path(cfg.out)
    if cfg.models:
        return [out / f"{name}{ext}" for name in [*map(checkpoint_name, cfg.models), "selection"]
                for ext in (".json", ".md")]
    return {"eval": [out, out.with_suffix(".md")], "select": [out, out.with_suffix(".md")],
            "report": [out.with_suffix(".md"), out.with_suffix(".png")]}.get(cfg.mode, [out])

def checkpoint_name(model):
    return Path(model.rstrip("/")).name

def expand_models(models):
    """--models with each glob replaced by the folders it matches, in natural order (epoch_2 < epoch_10)."""
    natural = lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p)]
    found = []
    for m in models:
        matches = sorted((p for p in glob.glob(m) if Path(p).is_dir()), key=natural) if glob.has_magic(m) else [m]
        check(matches, f"--models {m}: matches no folder")
        found += matches
    found = list(dict.fromkeys(found))                   # a checkpoint named twice is evaluated once
    names = [checkpoint_name(m) for m in found]
    clash = sorted({n for n in names if names.count(n) > 1 or n == "selection"}) + [None]
    check(clash[0] is None, f"--models: the result name {clash[0]!r} would be written twice (or is the "
          "selection's); evaluate one run's checkpoints per --out folder")
    return tuple(found)

# -----------------------------------------------------------------------------
# Averages over benchmarks (pass@k itself, Eq. 27, is in advantage.py)
def averages(benchmarks):
    """Unweighted means over the benchmarks present (Table 1's "Avg."), per k shared by all of them."""
    out = {}
    for group, names in (("math", MATH), ("ood", OOD)):
        curves = {b: benchmarks[b]["pass@k"] for b in names if "pass@k" in benchmarks.get(b, {})}
        if curves:
            ks = set.intersection(*map(set, curves.values()))
            out[group] = {"benchmarks": list(curves),
                          "pass@k": {k: float(np.mean([c[k] for c in curves.values()])) for k in sorted(ks, key=int)}}
    return out

# -----------------------------------------------------------------------------
# Sampling and scoring
def load_benchmark(name, max_problems=0):
    """(rows, task): 'problem' and 'answer' (IFEval: ids, kwargs); a bad file raises OSError/ValueError naming it."""
    file, task = BENCHMARKS[name]
    path = data_dir() / "eval" / file
    if task == "gpqa":
        rows = ood.load_gpqa(path)
    else:
        fields = ("problem", "instruction_id_list", "kwargs") if task == "ifeval" else ("problem", "answer")
        check_utf8(path)
        rows = reward.load_jsonl(path, fields)
        for line, row in enumerate(rows, 1) if task == "ifeval" else ():
            try:
                ood.check_ifeval_row(row)
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{line}: {e}") from None
    check(len(rows) > 0, f"{path}: no problems in it")
    for i, r in enumerate(rows):
        r.setdefault("id", i)
        if (name, i) in GOLD_FIXES:
            r["answer"] = GOLD_FIXES[(name, i)]
    return (rows[:max_problems] if max_problems else rows), task

def model_dtype(cfg):
    import torch
    return torch.bfloat16 if cfg.device.startswith("cuda") else torch.float32

def load_model(cfg, weights=True):
    """(model, tokenizer, family); weights=False: model None (vLLM loads its own; a copy would waste memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config
    if cfg.model == "tiny":
        tok = reward.load_tokenizer(str(data_dir() / "tokenizers" / "qwen2.5"))
        torch.manual_seed(cfg.seed)
        config = Qwen2Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
        model = AutoModelForCausalLM.from_config(config)
    else:
        tok = reward.load_tokenizer(cfg.model)
        config = AutoConfig.from_pretrained(cfg.model)
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=model_dtype(cfg)) if weights else None
    family = reward.model_family(config.model_type) if cfg.family == "auto" else cfg.family
    return (model.to(cfg.device).eval() if model is not None else None), tok, family

def open_engine(cfg, model, tok):
    import rollout
    return rollout.make_engine(cfg.engine, cfg.model, pad_token_id=reward.pad_id(tok), device=cfg.device,
                               dtype=model_dtype(cfg), model=model)

def sample(cfg, engine, tok, family, texts, seeds, n):
    """n completions per prompt, prompts_per_call prompts a call: yields (first index, Rollouts, texts)."""
    from tqdm import tqdm
    max_new = cfg.max_new_tokens or reward.FAMILIES[family]["max_new_tokens"]
    stop = reward.stop_token_ids(tok, family)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    for s in tqdm(range(0, len(ids), cfg.prompts_per_call), desc="sampling", leave=False):
        out = engine.generate(ids[s:s + cfg.prompts_per_call], n, seeds[s:s + cfg.prompts_per_call],
                              max_new_tokens=max_new, stop_token_ids=stop, temperature=cfg.temperature,
                              top_p=cfg.top_p, top_k=cfg.top_k)
        yield s, out, tok.batch_decode(out.token_ids, skip_special_tokens=True)

def score(task, completions, rows, scorer):
    if task == "math":
        return scorer.score(completions, [r["answer"] for r in rows])
    if task == "gpqa":
        return [float(reward.gpqa_letter(c) == r["answer"]) for c, r in zip(completions, rows)], {}
    return [float(ood.ifeval_correct(reward.answer_region(c), r)) for c, r in zip(completions, rows)], {}

def load_benchmarks(cfg):
    """{name: (rows, task)} asked for, read before any model loads: a bad file stops the run in one line."""
    loaded = {}
    for name in [b for b in cfg.benchmarks if b not in ("maze", "synlogic")]:
        try:
            loaded[name] = load_benchmark(name, cfg.max_problems)
        except (OSError, ValueError) as e:
            refuse(f"--benchmarks {name}: {e}")
    return loaded

def evaluate_benchmark(cfg, name, rows, task, engine, tok, family, scorer):
    texts = [reward.format_prompt(tok, r["problem"], family, task) for r in rows]
    seeds = [zlib.crc32(f"{cfg.seed}:{name}:{i}".encode()) for i in range(len(rows))]
    c, truncated, stats = np.zeros(len(rows), dtype=np.int64), 0, {}
    for s, out, completions in sample(cfg, engine, tok, family, texts, seeds, cfg.n):
        idx = [s + p for p in out.prompt_index]
        rewards, st = score(task, completions, [rows[i] for i in idx], scorer)
        np.add.at(c, idx, np.asarray(rewards, dtype=np.int64))
        truncated += sum(f == "length" for f in out.finish_reason)
        for key, v in st.items():
            stats[key] = stats.get(key, 0) + v
    return {"n": cfg.n, "task": task, "ids": [r["id"] for r in rows], "c": c.tolist(),
            "pass@k": pass_at_k_curve(cfg.n, c), "trunc_frac": truncated / (cfg.n * len(rows)), **stats}

def evaluate_maze(cfg, engine, tok):
    """Held-out mazes (Sec. 5.2, App. K): c and pass@k count the --maze_reward rule, c_RULE, pass@k_RULE every rule."""
    task = maze.maze_task(tok, maze.checkpoint_size(cfg.model), cfg.seed, cfg.maze_reward, cfg.max_problems or 256,
                          cfg.n, max_new_tokens=cfg.max_new_tokens or None, temperature=cfg.temperature,
                          top_p=cfg.top_p, top_k=cfg.top_k)
    counts = task.evaluate(engine, 0, 1)                       # {rule: [c_i]}, cfg.maze_reward first
    c, truncated = counts[cfg.maze_reward], counts.pop("truncated")
    out = {"n": cfg.n, "task": "maze", "rule": cfg.maze_reward, "ids": list(range(len(c))), "c": c,
           "pass@k": pass_at_k_curve(cfg.n, c), "trunc_frac": sum(truncated) / (cfg.n * len(c))}
    for rule, c in counts.items():
        out.update({f"c_{rule}": c, f"pass@k_{rule}": pass_at_k_curve(cfg.n, c)})
    return out

def run_eval(cfg, data=None, engine=None):
    """Evaluate cfg.model on `data` (None: load_benchmarks); a given `engine` (run_eval_many's) stays open."""
    data = data if data is not None else load_benchmarks(cfg)
    own = engine is None
    model, tok, family = load_model(cfg, weights=own and cfg.engine == "torch")
    engine = open_engine(cfg, model, tok) if own else engine
    result = {"config": asdict(cfg), "family": family, "checkpoint": training_progress(cfg.model),
              "benchmarks": {}, "pending": list(cfg.benchmarks)}
    with reward.Scorer(workers=cfg.workers) as scorer:
        for name in cfg.benchmarks:
            if name == "synlogic":
                print(SYNLOGIC_MSG)
                result["benchmarks"][name] = {"skipped": SYNLOGIC_MSG}
            else:
                b = result["benchmarks"][name] = (
                    evaluate_maze(cfg, engine, tok) if name == "maze"
                    else evaluate_benchmark(cfg, name, *data[name], engine, tok, family, scorer))
                print(f"{name}: " + " ".join(f"pass@{k} {v:.3f}" for k, v in b["pass@k"].items())
                      + f" | trunc {b['trunc_frac']:.3f}")
            result["pending"].remove(name)
            result["averages"] = averages(result["benchmarks"])
            write_json_out(cfg.out, result, SCRIPT)               # a failure in a later benchmark loses nothing done
            write_table_out(Path(cfg.out).with_suffix(".md"), table([result], [Path(cfg.out).stem]), SCRIPT)
    if own:
        engine.close()
    print(f"wrote {cfg.out}")
    return result

def run_eval_many(cfg):
    """--models: evaluate each checkpoint into --out/NAME.json (benchmarks read once), then write_selection."""
    folder = Path(cfg.out)
    runs = [replace(cfg, model=m, models=(), baseline="", out=str(folder / f"{checkpoint_name(m)}.json"))
            for m in cfg.models]
    import rollout
    data = load_benchmarks(runs[0])
    done, engine = [], None
    for i, run in enumerate(runs, 1):
        print(f"checkpoint {i}/{len(runs)}: {run.model} -> {run.out}")
        try:
            # One engine for all: vLLM allows one sleep-mode allocator per process, and loading a
            # checkpoint's weights into a running engine is faster than starting another.
            if engine is None:
                model, tok, _ = load_model(run, weights=run.engine == "torch")
                engine = open_engine(run, model, tok)
            else:
                rollout.load_checkpoint_weights(engine, run.model)
            run_eval(run, data, engine)
            done.append(run.out)
        except Exception as e:            # a damaged model.safetensors (SafetensorError), ...: not fatal
            print(f"checkpoint {run.model}: cannot be evaluated ({type(e).__name__}: {str(e)[:200]}); "
                  "skipped", file=sys.stderr)
    if engine is not None:
        engine.close()
    if not set(cfg.benchmarks) & set(MATH):
        print("no math benchmark asked for: no selection (App. L.4 selects by math pass@1)")
        return None
    check(done, "--models: no checkpoint could be evaluated")
    return write_selection(cfg, done, folder / "selection.json")

def training_progress(model):
    """The progress.json that train.py puts in its exports (step, epochs, rollouts, config), or None."""
    try:
        return json.loads((Path(model) / "progress.json").read_text())
    except (OSError, ValueError):
        return None

# -----------------------------------------------------------------------------
# Table 1 cells, pass@k curves
def load_result(path):
    """A result file as eval wrote it; for a selection.json, the result of its best checkpoint."""
    r = read_json(path)
    if is_selection(r):
        return load_result(Path(path).parent / r["best"]["result"])
    if not (isinstance(r.get("config"), dict) and isinstance(r.get("benchmarks"), dict)):
        raise Damaged(f"damaged: {path} (not a result of evaluate.py: no config and benchmarks)")
    for b in list(r["benchmarks"].values()) + list(r.get("averages", {}).values()):
        if "pass@k" in b:       # JSON object keys are strings; k is an int again here
            b["pass@k"] = {int(k): v for k, v in b["pass@k"].items()}
    return r

def table(results, labels):
    """Markdown like the paper's Table 1: pass@1 / pass@K in %, K = 256 or the largest k when n < 256."""
    def cell(b):
        if not b or "pass@k" not in b:
            return "-"
        ks = [k for k in b["pass@k"] if k <= 256]
        return f"{100 * b['pass@k'][1]:.1f}/{100 * b['pass@k'][max(ks)]:.1f}"
    extra = [b for b in BENCHMARKS if b not in MATH + OOD and any(b in r["benchmarks"] for r in results)]
    head = ["Run", "Math avg", *(LABELS[b] for b in MATH), "OOD avg", *(LABELS[b] for b in OOD),
            *(LABELS[b] for b in extra)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, label in zip(results, labels):
        bm, av = r["benchmarks"], r.get("averages", {})
        row = [label, cell(av.get("math")), *(cell(bm.get(b)) for b in MATH),
               cell(av.get("ood")), *(cell(bm.get(b)) for b in OOD), *(cell(bm.get(b)) for b in extra)]
        lines.append("| " + " | ".join(row) + " |")
    ns = sorted({b["n"] for r in results for b in r["benchmarks"].values() if "n" in b})
    return "\n".join(lines) + f"\n\nCells: pass@1/pass@K in %, K = min(256, largest k <= n); n = {ns}.\n"

def plot(results, labels, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("math avg", lambda r: r.get("averages", {}).get("math")),
              ("OOD avg", lambda r: r.get("averages", {}).get("ood"))]
    panels += [(LABELS[b], lambda r, b=b: r["benchmarks"].get(b)) for b in BENCHMARKS]
    panels = [(t, get) for t, get in panels if any("pass@k" in (get(r) or {}) for r in results)]
    cols = max(1, min(4, len(panels)))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, (title, get) in zip(axes.flat, panels):
        for r, label in zip(results, labels):
            b = get(r)
            if b and "pass@k" in b:
                ax.plot(list(b["pass@k"]), [100 * v for v in b["pass@k"].values()], marker=".", label=label)
        ax.set(title=title, xscale="log", xlabel="k", ylabel="pass@k (%)")
        ax.set_xscale("log", base=2)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata=png_metadata(SCRIPT))
    plt.close(fig)

def is_selection(r):
    return "best" in r and "candidates" in r

def is_selection_file(path):
    try:
        return is_selection(json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError):
        return False

def result_label(path):
    """A run's name in tables: the file's stem; a selection.json's is run/best (grpo/epoch_7)."""
    r = json.loads(Path(path).read_text())
    return f"{Path(path).parent.name}/{Path(r['best']['result']).stem}" if is_selection(r) else Path(path).stem

# Settings besides the problems and n that change a score: results that differ in one do not compare.
SCORE_SETTINGS = ("maze_reward", "temperature", "top_p", "top_k", "max_new_tokens", "family")

def score_differences(results):
    return [k for k in SCORE_SETTINGS if len({json.dumps(r["config"].get(k)) for r in results}) > 1]

def run_report(cfg):
    results, labels = [load_result(p) for p in cfg.inputs], [result_label(p) for p in cfg.inputs]
    differ = score_differences(results)             # mixed settings: each row names its own
    labels = [label + "".join(f" ({k} {r['config'].get(k)})" for k in differ) for label, r in zip(labels, results)]
    md = table(results, labels)
    write_table_out(Path(cfg.out).with_suffix(".md"), md, SCRIPT)
    plot(results, labels, Path(cfg.out).with_suffix(".png"))
    print(md)

# -----------------------------------------------------------------------------
# Checkpoint selection (App. L.4), as we read it (compute, ties, no validation split): DESIGN.md, "Evaluation"
def select_checkpoint(results, max_rollouts=None):
    """results: {result path: result} -> {"math_benchmarks", "n", "best", "candidates", "excluded"}:
    candidates {"result", "model", "math_pass@1", "step", "rollouts"}, best the top math pass@1 of
    those with rollouts <= max_rollouts (when given), excluded [{"result", "reason"}]."""
    names = [b for b in MATH if any("pass@k" in r["benchmarks"].get(b, {}) for r in results.values())]
    check(names, "--inputs: no math benchmark in the results, nothing to select by")
    candidates, excluded, reference = [], [], None
    for path, r in results.items():
        progress = r.get("checkpoint") or {}
        missing = [b for b in names if "pass@k" not in r["benchmarks"].get(b, {})]
        if missing:
            excluded.append({"result": path, "reason": f"no result for {', '.join(missing)}"})
            continue
        rollouts = progress.get("rollouts")
        if max_rollouts is not None and (rollouts is None or rollouts > max_rollouts):
            excluded.append({"result": path, "reason": "no progress.json, compute unknown" if rollouts is None
                             else f"{rollouts} rollouts, over the baseline's {max_rollouts}"})
            continue
        setting = {b: (r["benchmarks"][b]["n"], r["benchmarks"][b]["ids"]) for b in names}
        reference = reference or (path, setting)
        check(setting == reference[1], f"--inputs: {path} and {reference[0]} were evaluated on other problems "
              "or another n; select among results of one evaluation setting")
        candidates.append({"result": path, "model": r["config"]["model"],
                           "math_pass@1": float(np.mean([r["benchmarks"][b]["pass@k"][1] for b in names])),
                           "step": progress.get("step"), "rollouts": rollouts})
    check(candidates, "--inputs: no result qualifies: " + "; ".join(f"{e['result']}: {e['reason']}" for e in excluded))
    best = min(candidates, key=lambda c: (-c["math_pass@1"], math.inf if c["rollouts"] is None else c["rollouts"],
                                          c["result"]))
    n = {b: reference[1][b][0] for b in names}
    return {"math_benchmarks": names, "n": n, "best": best, "candidates": candidates, "excluded": excluded}

def baseline_rollouts(path):
    """Step 3's cap: the rollouts of the baseline's best; ValueError when not a selection or of unknown compute."""
    try:
        rollouts = json.loads(Path(path).read_text())["best"]["rollouts"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"--baseline {path}: not a selection.json (evaluate.py --models or --mode select "
                         "writes one)") from None
    check(rollouts is not None, f"--baseline {path}: its best checkpoint has no progress.json, so no compute "
          "to match")
    return rollouts

def write_selection(cfg, paths, out):
    """Select among `paths` under the --baseline cap; write `out` (.json, paths relative to it) and its .md."""
    out = Path(out)
    # A selection among the inputs (runs/eval/grpo/*.json picks up selection.json) is no candidate.
    results = {str(p): load_result(p) for p in paths if not is_selection_file(p)}
    try:
        cap = baseline_rollouts(cfg.baseline) if cfg.baseline else None
        sel = select_checkpoint(results, cap)
    except ValueError as e:
        refuse(e)
    rows = [(results[c["result"]], Path(c["result"]).stem) for c in sel["candidates"]]
    for entry in [*sel["candidates"], *sel["excluded"]]:       # sel["best"] is one of the candidates
        entry["result"] = os.path.relpath(entry["result"], out.parent)
    summary = {"config": asdict(cfg), "rule": "App. L.4: best by mean math pass@1; with a baseline, only "
               "checkpoints with no more rollouts than its best (evaluate.select_checkpoint)",
               "baseline": cfg.baseline or None, "max_rollouts": cap, **sel}
    write_json_out(out, summary, SCRIPT)
    best = sel["best"]
    lines = [f"best by math pass@1 (mean over {', '.join(sel['math_benchmarks'])}; n = {sel['n']}): {best['model']} "
             f"({100 * best['math_pass@1']:.1f}%, step {best['step']}, {best['rollouts']} rollouts; {best['result']})"]
    if cap is not None:
        lines.append(f"candidates: no more than {cap} rollouts, the best of the baseline {cfg.baseline}")
    lines += [f"left out: {e['result']}: {e['reason']}" for e in sel["excluded"]]
    md = table(*zip(*rows)) + "\n" + "\n".join(lines) + "\n"
    write_table_out(out.with_suffix(".md"), md, SCRIPT)
    print("\n".join(lines) + f"\nwrote {out}")
    return summary

def run_compare(cfg):
    ra, rb = (load_result(p) for p in cfg.inputs)           # alike: Config.check_files
    a, b = {}, {}
    for name, ba in ra["benchmarks"].items():
        bb = rb["benchmarks"].get(name, {})
        if "c" not in ba or "c" not in bb:
            continue
        check(ba["ids"] == bb["ids"] and ba["n"] == bb["n"], f"--inputs: {name} has different problems or n")
        check(cfg.m <= ba["n"], f"--m {cfg.m}: larger than n = {ba['n']} of {name}")
        a[name], b[name] = (ba["n"], np.asarray(ba["c"])), (bb["n"], np.asarray(bb["c"]))
    res = subsample_test(a, b, cfg.m, cfg.iters, cfg.seed, groups=AVERAGES)
    for name, per_k in res.items():
        cells = [f"k={k}: {100 * v['diff']:+.1f} [{100 * v['lo']:+.1f}, {100 * v['hi']:+.1f}]"
                 + ("*" if v["significant"] else "") for k, v in per_k.items() if k in (1, cfg.m)]
        print(f"{name:14s} " + " | ".join(cells) + "   (B - A in points, 95% interval, * significant)")
    write_json_out(cfg.out, {"config": asdict(cfg), "a": cfg.inputs[0], "b": cfg.inputs[1], "m": cfg.m,
                             "iters": cfg.iters, "tests": res}, SCRIPT)
    return res

# -----------------------------------------------------------------------------
# Delta NLL_rare (App. M.2), and what the paper leaves open in it: DESIGN.md, "Evaluation"
def nll(model, tok, prompts, completions):
    """Length-normalised NLL (mean per-token -log p) of each completion under model, at T = 1."""
    from fgrpo_utils.logprob import completion_logp
    logp = completion_logp(model, prompts, completions, reward.pad_id(tok), temperature=1.0, batch_size=8)
    return [float(-lp.mean()) for lp in logp]

def run_rare_select(cfg):
    """The rare-correct set (paper: 1,263): the top rare_frac by NLL of the base model's correct rollouts."""
    model, tok, family = load_model(cfg)
    rows = reward.load_train_rows(cfg.data or str(data_dir() / "train" / "deepscaler_partial.jsonl"))
    rows = random.Random(cfg.seed).sample(rows, min(cfg.rare_prompts, len(rows)))
    texts = [reward.format_prompt(tok, r["problem"], family) for r in rows]
    seeds = [zlib.crc32(f"{cfg.seed}:rare:{i}".encode()) for i in range(len(rows))]
    engine = open_engine(cfg, model, tok)
    prompts, completions = [], []
    with reward.Scorer(workers=cfg.workers) as scorer:
        for s, out, decoded in sample(cfg, engine, tok, family, texts, seeds, cfg.rare_samples):
            rewards, _ = scorer.score(decoded, [rows[s + p]["answer"] for p in out.prompt_index])
            for p, ids, r in zip(out.prompt_index, out.token_ids, rewards):
                if r == 1.0:
                    prompts.append(tok(texts[s + p], add_special_tokens=False)["input_ids"])
                    completions.append(ids)
    engine.close()
    base = nll(model, tok, prompts, completions) if completions else []
    top = max(1, math.ceil(cfg.rare_frac * len(base))) if base else 0
    keep = sorted(range(len(base)), key=lambda i: -base[i])[:top]          # highest NLL = rarest
    write_json_out(cfg.out, {"config": asdict(cfg), "correct": len(base), "selected": [
        {"prompt_ids": prompts[i], "completion_ids": completions[i], "nll_base": base[i]} for i in keep]}, SCRIPT)
    print(f"rare-correct set: {len(keep)} of {len(base)} correct rollouts -> {cfg.out}")

def run_rare_score(cfg):
    """Delta NLL_rare = mean over the rare set of (NLL_trained - NLL_base); lower = less forgetting."""
    rare = json.loads(Path(cfg.rare).read_text())["selected"]
    check(len(rare) > 0, f"--rare {cfg.rare}: the rare-correct set is empty")
    model, tok, _ = load_model(cfg)
    trained = nll(model, tok, [r["prompt_ids"] for r in rare], [r["completion_ids"] for r in rare])
    delta = float(np.mean([t - r["nll_base"] for t, r in zip(trained, rare)]))
    write_json_out(cfg.out, {"config": asdict(cfg), "model": cfg.model, "rare": cfg.rare, "count": len(rare),
                             "delta_nll_rare": delta}, SCRIPT)
    print(f"Delta NLL_rare = {delta:.4f} over {len(rare)} trajectories")
    return delta

def main(cfg):
    for f in outputs(cfg):
        remove_temp(f.parent, [f.name])                              # what a killed run of ours left
    if cfg.models:
        return run_eval_many(cfg)
    return {"eval": run_eval, "select": lambda c: write_selection(c, c.inputs, c.out), "compare": run_compare,
            "report": run_report, "rare_select": run_rare_select, "rare_score": run_rare_score}[cfg.mode](cfg)

if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
