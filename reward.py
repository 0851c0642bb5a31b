"""
Verifiable rewards and the data behind them: math answers checked by math-verify (is_correct; Scorer runs it in a
process pool behind a cache), the DeepScaleR loader with the paper's filter; chat prompts per model family (Sec. 5.3,
App. L, Table 9); GPQA's boxed letter (gpqa_letter). IFEval's checkers live in fgrpo_utils/ood.py. Where the paper is
silent, the choices are DESIGN.md's: "The reward" and "Training data (DeepScaleR) and prompts".

    python -c "import reward; print(reward.is_correct('so \\\\boxed{\\\\dfrac34}', '0.75'))"   # True
    python -m pytest -q tests/test_reward.py
    python bench/reward_scoring.py                      # Scorer (pool + cache) vs naive math-verify
"""
import atexit
import base64
import contextlib
import functools
import json
import multiprocessing as mp
import random
import re
import threading
from collections import defaultdict
from pathlib import Path

from fgrpo_utils.cli import check
from fgrpo_utils.task import Task

TIMEOUT_S = 5                # math-verify's SIGALRM limit (its default), per parse and per comparison
MAX_ANSWER_CHARS = 1000      # a longer boxed answer is unparseable without trying (no gold is this long)
ANSWER_TAIL_CHARS = 2000     # with no box, only the region's last 2,000 characters may hold the answer
MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
HELPFUL_SYSTEM = "You are a helpful assistant."
LLAMA_DATE = "26 Jul 2024"
# Stop tokens and max response length (App. L) per family. Base-model configs name
# <|endoftext|> as eos while chat templates end turns with <|im_end|>, so both stop Qwen.
FAMILIES = {"qwen2.5": dict(stop=("<|im_end|>", "<|endoftext|>"), max_new_tokens=8192),
            "qwen3": dict(stop=("<|im_end|>", "<|endoftext|>"), max_new_tokens=4096),
            "llama3": dict(stop=("<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"), max_new_tokens=8192)}

# -----------------------------------------------------------------------------
# Answer extraction and equivalence (DESIGN.md, "The reward")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_ANCHOR = re.compile(r"(?i)answer\s*(?:is|:)\s*:?\s*")
_ANSWER_IS = re.compile(_ANSWER_ANCHOR.pattern + r"([^\n]+)")
# A sentence ends at white space after . ! or ? when a capital (or markdown ** or #) follows, or at a
# line break before a capitalised word. Not inside "3.5", and not before "$$", "\\]" or "P = ..." on
# the lines of a display, so "the answer is\n\\[\nP = \\frac34\n\\]" stays one sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*#])|\n\s*(?=[A-Z][a-z]|\*\*|#)")
# Where the answer phrase's own clause ends: at ", " / "; " before a word (not "(1, 2)" or "1, 000"), before
# a connective that starts a justification or a check ("7 because ...", "x = 3 since ..."), or at an opening
# parenthesis or a dash: "The answer is 12, as 3 * 4 = 12 and 12 > 10." answers 12, not 10.
_CLAUSE_END = re.compile(r"[,;]\s+(?=[A-Za-z]{2,})|\s+(?=(?:as|since|because|which|where|so|for|when|given|"
                         r"and|but|while|if|thus|hence|i\.e\.|e\.g\.)\b)|\s+\(|\s+-{1,2}\s+", re.I)
_E_NOTATION = re.compile(r"^\s*(-?\d+(?:\.\d*)?)\s*[eE]\s*([+-]?\d+)\s*$")

def answer_region(completion):
    """Text after the last </think>; '' when a <think> is never closed (truncated reasoning)."""
    if "</think>" in completion:
        return completion.rsplit("</think>", 1)[1]
    return "" if "<think>" in completion else completion

def last_box(text):
    """Content of the last \\boxed{} or \\fbox{} in text (nested braces fine), None when there is no
    box, '' when the last one is empty, unclosed or over MAX_ANSWER_CHARS (a broken last box)."""
    starts = [m.end() for m in _BOX.finditer(text)]
    if not starts:
        return None
    i, depth = starts[-1], 1
    # Walk to the matching brace, but no further than MAX_ANSWER_CHARS: a megabyte "box" stops here.
    for j in range(i, min(len(text), i + MAX_ANSWER_CHARS + 1)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return ""

def verifier_input(completion):
    """What math-verify reads as the final answer, or None: '\\boxed{X}' for the last box X, else the
    answer region's last ANSWER_TAIL_CHARS characters (_parse reads them). No math-verify here (pure
    string work), so the Scorer can call it in any thread and cache on its result."""
    text = answer_region(completion)
    box = last_box(text)
    if box is None:
        tail = text[-ANSWER_TAIL_CHARS:]
        return tail if "answer" in tail.lower() else None   # every answer phrase has the word
    return _as_box(box) if box else None

def extract_answer(completion):
    """The final answer's own text, or None: the last box's content; with no box, what follows the
    last "answer is" / "Answer:" on its line. gpqa_letter reads it; math is judged on verifier_input."""
    text = answer_region(completion)
    box = last_box(text)
    return phrase_answer(text[-ANSWER_TAIL_CHARS:]) if box is None else box or None

def gpqa_letter(completion):
    """'A'-'D' from the final answer: \\boxed{C}, \\boxed{(C)}, \\boxed{\\text{C}}, \\boxed{C) 4.2 eV}."""
    ans = extract_answer(completion)
    m = ans is not None and re.fullmatch(r"(?:\\text(?:bf)?\{|\\mathrm\{|\{|\(|\s)*([A-Da-d])(?:\W.*)?", ans, re.S)
    return m.group(1).upper() if m else None

def phrase_answer(text):
    """What follows the last "answer is" / "Answer:" in text, up to the line's end, without markdown
    bold, dollars or a final full stop; None if there is no such phrase."""
    hits = _ANSWER_IS.findall(text) or [""]
    return hits[-1].strip().strip("*").strip().strip("$").strip().rstrip(".").strip("$").strip() or None

def answer_clause(sentence):
    """The sentence up to the end of its last answer phrase's own clause (_CLAUSE_END): what follows is a
    justification or a check, whose numbers math-verify's anchored patterns would read as the answer."""
    hits = list(_ANSWER_ANCHOR.finditer(sentence))
    cut = hits and _CLAUSE_END.search(sentence, hits[-1].end())    # the last phrase: "3, and the answer is 4" -> 4
    return sentence[:cut.start()] if cut else sentence

def _as_box(ans):
    """ans as a box for math-verify, e-notation rewritten: 3.83e35 -> 3.83\\times10^{35}."""
    m = _E_NOTATION.match(ans)
    return "\\boxed{" + (f"{m.group(1)}\\times10^{{{m.group(2)}}}" if m else ans) + "}"

def _parse(text):
    """math-verify's parse of verifier_input's text, or of a gold as a box -> (parses, status). A box is read whole,
    by every extractor; other text by sentence from the end, answer-phrase extractors only (DESIGN.md, Fallback)."""
    # Off the main thread math-verify's alarm fails and would read as "unparseable", a silent 0: refuse.
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("reward.is_correct needs the main thread (math-verify times out with SIGALRM); "
                           "use reward.Scorer, which scores in worker processes")
    if text.startswith("\\boxed{"):                 # answer sentences never hold a box: no confusion
        return _mv_parse(text, anchored=False)
    for sentence in reversed(_SENTENCE_END.split(text)):
        if "answer" in sentence.lower():            # the others cannot match: skip them cheaply
            sentence = answer_clause(sentence)
            out, status = _mv_parse(sentence, anchored=True)
            ans = phrase_answer(sentence)
            if ans and (status == "unparseable" or _E_NOTATION.match(ans)):
                # bare LaTeX or e-notation: read the phrase's rest as a box (DESIGN.md, "The reward", Fallback)
                out, status = _mv_parse(_as_box(ans), anchored=False)
            if status != "unparseable":
                return out, status
    return [], "unparseable"

def _mv_parse(text, anchored):
    """One math-verify parse -> (parses, status); anchored: answer-phrase extractors only."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    from math_verify.errors import TimeoutException
    cfg = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=not anchored),
           ExprExtractionConfig(try_extract_without_anchor=not anchored)]
    try:
        out = parse(text, cfg, parsing_timeout=TIMEOUT_S, raise_on_error=True)
    except TimeoutException:                          # a BaseException: `except Exception` misses it
        return [], "timeout"
    except Exception:
        return [], "unparseable"
    return out, ("ok" if out else "unparseable")

@functools.lru_cache(maxsize=100_000)
def parse_gold(gold):
    """Parsed gold answer, cached: a 1,024-sample evaluation parses each gold once, not 1,024 times."""
    return _parse(_as_box(str(gold)))[0]

def judge(gold, text):
    """(correct, status) for verifier_input's text; status is 'ok', 'unparseable' or 'timeout'."""
    from math_verify import verify
    from math_verify.errors import TimeoutException
    pred, status = ([], "unparseable") if text is None else _parse(text)
    if status != "ok":
        return False, status
    gold_parsed = parse_gold(gold)
    try:
        return bool(verify(gold_parsed, pred, timeout_seconds=TIMEOUT_S, raise_on_error=True)), "ok"
    except TimeoutException:
        return False, "timeout"
    except Exception:
        # raise_on_error=True stops at the first failing (gold, pred) pair; a rare sympy error then
        # gets the lenient pass, which scores each pair on its own and treats errors as "not equal".
        return bool(verify(gold_parsed, pred, timeout_seconds=TIMEOUT_S)), "ok"

def is_correct(completion, gold):
    """True iff math-verify finds the completion's final answer equal to `gold` (reward 1.0 / 0.0), for
    training and evaluation. Main thread only (SIGALRM): elsewhere use Scorer, same logic in workers. Without a box:
    DESIGN.md, "The reward", Fallback (tests/test_reward.py has the cases).
    >>> is_correct("... so the total is \\\\boxed{\\\\frac{3}{4}}", "0.75")
    True
    """
    return judge(gold, verifier_input(completion))[0]

# -----------------------------------------------------------------------------
# Batch scoring: a process pool plus a (gold, answer) cache
def _judge_many(keys):
    return [judge(g, a) for g, a in keys]

class Scorer(contextlib.AbstractContextManager):
    """Math rewards for many completions: score(completions, golds) -> (rewards, stats); the cache, the
    backstop and the stats are DESIGN.md's "Batch scoring". workers=0 scores in this process (main thread
    only). Workers start with forkserver (spawn where unavailable): forking CUDA is unsafe. backstop_s:
    outer wait per key of a chunk (plus one); fn: what a worker runs on a chunk (tests swap in a hang)."""

    def __init__(self, workers=2, chunk_size=16, backstop_s=3 * TIMEOUT_S + 1, cache_size=2_000_000, fn=None):
        self.workers, self.chunk_size, self.backstop_s = workers, chunk_size, backstop_s
        self.cache_size, self.fn = cache_size, fn or _judge_many
        self.cache, self.pool = {}, None

    def _start(self):
        if self.pool is None and self.workers > 0:
            method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
            ctx = mp.get_context(method)
            if method == "forkserver":
                ctx.set_forkserver_preload(["reward", "math_verify"])   # import sympy once, fork from it
            self.pool = ctx.Pool(self.workers)
            # Warm each worker (math-verify's first call builds its parsers): no backstop takes start-up for a hang.
            self.pool.map(_judge_many, [[("1", "\\boxed{1}")]] * self.workers, chunksize=1)

    def close(self):
        if self.pool is not None:
            self.pool.terminate()                       # also ends a worker stuck in C code
            self.pool.join()
            self.pool = None

    def __exit__(self, *exc):
        self.close()

    def score(self, completions, golds):
        if len(completions) != len(golds):
            raise ValueError(f"{len(completions)} completions but {len(golds)} golds")
        keys = [(str(g), verifier_input(c)) for c, g in zip(completions, golds)]
        if len(self.cache) + len(keys) > self.cache_size:
            self.cache.clear()                          # a crude bound on memory
        hits = sum(k in self.cache for k in keys)
        todo = sorted({k for k in keys if k[1] is not None and k not in self.cache})
        self.cache.update(self._run(todo))
        results = [self.cache.get(k, (False, "unparseable")) for k in keys]
        stats = {"unparseable": sum(s == "unparseable" for _, s in results),
                 "timeouts": sum(s == "timeout" for _, s in results), "cache_hits": hits}
        return [float(ok) for ok, _ in results], stats

    def _run(self, keys):
        if self.workers == 0:
            return dict(zip(keys, self.fn(keys)))
        out, queue = {}, [keys[i:i + self.chunk_size] for i in range(0, len(keys), self.chunk_size)]
        while queue:
            self._start()
            pending, queue = [(ch, self.pool.apply_async(self.fn, (ch,))) for ch in queue], []
            for idx, (chunk, res) in enumerate(pending):
                # Backstop: per key a gold parse, a parse and a comparison, each bounded by SIGALRM; only C
                # code outlasts them. The clock starts as we wait, with earlier chunks collected: this one runs.
                with contextlib.suppress(Exception):    # mp.TimeoutError, or a worker that crashed
                    out.update(zip(chunk, res.get(timeout=self.backstop_s * (len(chunk) + 1))))
                    continue
                # A worker hangs: keep what finished, kill the pool, retry the rest, the hung chunk key by key
                for ch, r in pending[idx + 1:]:
                    if r.ready() and r.successful():
                        out.update(zip(ch, r.get()))
                    else:
                        queue.append(ch)
                if len(chunk) == 1:
                    out[chunk[0]] = (False, "timeout")
                else:
                    queue += [[k] for k in chunk]
                self.close()
                break
        return out

_SCORER = None

def score_batch(completions, golds, workers=2):
    """Scorer.score -> (rewards, stats) via one Scorer per process: train.py's steps share its pool and cache."""
    global _SCORER
    if _SCORER is None:
        _SCORER = Scorer(workers=workers)
        atexit.register(_SCORER.close)
    return _SCORER.score(completions, golds)

# -----------------------------------------------------------------------------
# Data: jsonl with file:line errors, DeepScaleR and the paper's filter
DEEPSCALER_HUB = "agentica-org/DeepScaleR-Preview-Dataset"
HUB_DATA = ("deepscaler", DEEPSCALER_HUB)              # --data values that name DeepScaleR on the hub

def load_jsonl(path, required=("problem", "answer")):
    """Rows of a jsonl file. A line that is not UTF-8 or not JSON, or a missing/empty required field,
    raises ValueError('file:line: ...'); 'problem' and 'answer' are strings (an int becomes one)."""
    rows = []
    with open(path, "rb") as f:                         # decoded per line, so an error can name its line
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                row = json.loads(raw.decode("utf-8-sig" if lineno == 1 else "utf-8"))   # a BOM is no error
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: bad JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in required:
                value, text_field = row.get(key), key in ("problem", "answer")
                if text_field and isinstance(value, int) and not isinstance(value, bool):
                    value = row[key] = str(value)
                if value is None or (text_field and isinstance(value, str) and not value.strip()):
                    raise ValueError(f"{where}: missing or empty field {key!r}")
                if text_field and not isinstance(value, str):   # 0.5 or [1, 2]: a float would lose digits
                    raise ValueError(f"{where}: field {key!r} is a {type(value).__name__} ({json.dumps(value)[:40]}); "
                                     "write it as a string (an integer is accepted too)")
            rows.append(row)
    return rows

# `datasets` is needed only for the hub path, so it is not in requirements.txt (DESIGN.md, "Training data").
DATASETS_MISSING = ("loading DeepScaleR from the hub needs the `datasets` package: pip install -r "
                    "requirements-gpu.txt (or pip install datasets); or pass a local jsonl")

def load_train_rows(source):
    """DeepScaleR rows from a local jsonl or, only when asked by name, from the hub via `datasets`."""
    if source not in HUB_DATA:
        return load_jsonl(source)
    try:
        import datasets
    except ImportError:
        raise SystemExit(f"error: {source}: {DATASETS_MISSING}") from None
    rows = []
    for i, r in enumerate(datasets.load_dataset(DEEPSCALER_HUB, split="train")):
        if not (r.get("problem") and r.get("answer") is not None):
            raise ValueError(f"{DEEPSCALER_HUB} row {i}: missing problem or answer")
        rows.append({"problem": r["problem"], "answer": str(r["answer"])})
    return rows

def load_training_problems(source, tokenizer, max_prompt_tokens=1024, family=None):
    """train.py's entry: rows from `source`, the paper's filter, then {prompt_ids, gold, problem}."""
    family = family or tokenizer_family(tokenizer)
    kept, _ = filter_math_train(load_train_rows(source), tokenizer, family, max_prompt_tokens)
    texts = [format_prompt(tokenizer, r["problem"], family) for r in kept]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return [{"prompt_ids": i, "gold": r["answer"], "problem": r["problem"]} for i, r in zip(ids, kept)]

def make_task(cfg, tokenizer, model_type):
    """--task math (train.py's TASKS) as a Task (fgrpo_utils.task): the filtered problems of --data, at least
    --prompts_per_step, in a fresh permutation per epoch keyed by --seed, the math-verify reward, no held-out set."""
    from rollout import mix_seed                   # not at the top: scorer workers need no torch
    family = model_family(model_type)
    problems = load_training_problems(cfg.data, tokenizer, cfg.max_prompt_len, family=family)
    check(len(problems) >= cfg.prompts_per_step, f"--data {cfg.data}: {len(problems)} problems "
          "survive the filter, fewer than --prompts_per_step")
    order = []                                     # order[epoch]: that epoch's permutation

    def prompt(i):
        epoch, j = divmod(i, len(problems))
        while len(order) <= epoch:
            perm = list(range(len(problems)))
            random.Random(mix_seed(cfg.seed, len(order))).shuffle(perm)
            order.append(perm)
        p = problems[order[epoch][j]]
        return p["prompt_ids"], p["gold"]

    def score(golds, completions):
        return score_batch(tokenizer.batch_decode(completions, skip_special_tokens=True), golds)

    return Task(prompt, score, stop_token_ids=stop_token_ids(tokenizer, family),
                max_new_tokens=cfg.max_response_len, show=tokenizer.decode, num_prompts=len(problems))

def check_flags(cfg):
    """train.py's check of --data, before any work: a local file that exists, parses (file:line of the
    first bad row) and holds at least --prompts_per_step problems; a hub id needs no file."""
    if cfg.data in HUB_DATA:
        return
    check(Path(cfg.data).is_file(), f"--data {cfg.data}: no such file")
    rows = load_jsonl(cfg.data)
    check(len(rows) >= cfg.prompts_per_step, f"--data {cfg.data}: {len(rows)} problems, fewer than "
          f"--prompts_per_step {cfg.prompts_per_step}")

def needed_packages(cfg):
    """Beyond requirements.txt, as (package, needed, flag, fix): `datasets`, for DeepScaleR from the hub."""
    return [("datasets", cfg.data in HUB_DATA, f"--data {cfg.data}", DATASETS_MISSING)]

def filter_math_train(rows, tokenizer, family, max_prompt_tokens=1024, log=print):
    """The paper's filter (Sec. 5.3; DESIGN.md, "Training data") -> (kept rows, report of counts). Paper:
    39,202 kept of DeepScaleR's 40,315; our 10,110-row partial set keeps 10,090 for Qwen."""
    groups = defaultdict(list)
    for r in rows:
        groups[" ".join(r["problem"].split())].append(r)
    agree = [c for c in groups.values() if len({" ".join(x["answer"].split()) for x in c}) == 1]
    unique = [c[0] for c in agree]
    # math-verify's parse lists the raw string too: a gold with nothing else has no mathematical parse
    parseable = [r for r in unique if any(not isinstance(x, str) for x in parse_gold(r["answer"]))]
    texts = [format_prompt(tokenizer, r["problem"], family) for r in parseable]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    kept = [r for r, n in zip(parseable, lengths) if n <= max_prompt_tokens]
    report = {"rows": len(rows), "duplicate_copies_removed": sum(len(c) - 1 for c in agree),
              "conflicting_problems_dropped": len(groups) - len(agree),
              "conflicting_rows_dropped": len(rows) - sum(len(c) for c in agree),
              "unparseable_gold_dropped": len(unique) - len(parseable),
              "too_long_dropped": len(parseable) - len(kept), "kept": len(kept)}
    log("math train filter: " + ", ".join(f"{k} {v}" for k, v in report.items()))
    return kept, report

# -----------------------------------------------------------------------------
# Prompts and tokenizers per model family (Table 9)
# The Llama 3.2 Instruct template (no tools): the date header is always there, the system text follows.
LLAMA32_TEMPLATE = (
    "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]"
    "['content']|trim %}{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}"
    "{%- endif %}{%- if date_string is not defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\n"
    "Today Date: ' + date_string + '\\n\\n' + system_message + '<|eot_id|>' }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content']|trim"
    " + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")

def model_family(name):
    """'qwen2.5' | 'qwen3' | 'llama3' from a model id, path or config.model_type ('qwen2', 'llama')."""
    s = str(name).lower()
    for key, family in (("qwen3", "qwen3"), ("llama", "llama3"), ("qwen", "qwen2.5")):    # qwen3 before qwen
        if key in s:
            return family
    raise ValueError(f"unknown model family for {name!r}: expected a Qwen2.5, Qwen3 or Llama-3 model")

def format_prompt(tokenizer, problem, family, task="math"):
    """The prompt text through the model's chat template, with Table 9's system prompt and thinking switch per
    task (math | gpqa | ifeval | synlogic). Encode it with add_special_tokens=False."""
    if task in ("math", "gpqa"):
        system, thinking = MATH_SYSTEM, True
    elif family == "qwen2.5":
        system, thinking = HELPFUL_SYSTEM, False
    else:                                   # Qwen3: no system prompt; Llama: the date lines only
        system, thinking = None, task == "synlogic"
    messages = [{"role": "system", "content": system}] if system else []
    return tokenizer.apply_chat_template(messages + [{"role": "user", "content": problem}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=thinking, date_string=LLAMA_DATE)

def tokenizer_family(tokenizer):
    """The family from the tokenizer's name, else from its vocabulary (a local folder of any name)."""
    try:
        return model_family(tokenizer.name_or_path)
    except ValueError:
        return "llama3" if "<|eot_id|>" in tokenizer.get_vocab() else "qwen2.5"

def stop_token_ids(tokenizer, family=None):
    """Ids of the family's stop tokens (FAMILIES), in order; family=None infers it from the tokenizer."""
    vocab = tokenizer.get_vocab()
    return [vocab[t] for t in FAMILIES[family or tokenizer_family(tokenizer)]["stop"] if t in vocab]

def load_tokenizer(name):
    """AutoTokenizer, plus two offline cases: a folder holding only Llama-3's tokenizer.model
    (tiktoken format, built here without tiktoken), and the Llama 3.2 template when one is missing."""
    from transformers import AutoTokenizer
    p = Path(name)
    if p.is_dir() and (p / "tokenizer.model").exists() and not (p / "tokenizer_config.json").exists():
        return _llama3_tokenizer(p / "tokenizer.model")
    tok = AutoTokenizer.from_pretrained(name)
    if tok.chat_template is None and "llama" in str(name).lower():
        tok.chat_template = LLAMA32_TEMPLATE
    return tok

def pad_id(tok):
    """The id that pads batches: the tokenizer's pad token, else its eos (base models often lack one)."""
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

def _llama3_tokenizer(path):
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(file):        # the format is "base64(token bytes) rank" per line
            with open(file) as f:
                return {base64.b64decode(t): int(r) for t, r in (line.split() for line in f if line.strip())}

    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
               "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
               "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    special += [f"<|reserved_special_token_{i}|>" for i in range(3, 248)]      # ids up to 128255
    backend = Converter(str(path), extra_special_tokens=special).converted()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   chat_template=LLAMA32_TEMPLATE)
