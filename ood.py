"""
Out-of-domain benchmarks of PAPER §8 that are not math: GPQA Diamond (multiple choice, the boxed
letter is scored) and IFEval (prompt-level strict: every instruction of a prompt followed).
evaluate.py uses them; reward.py's answer extraction finds the boxed letter.

    python -m pytest -q tests/test_reward.py -k "gpqa or ifeval"

Choices (PAPER §10 row 13):
1) GPQA: questions are read from the password-protected zip in memory and never written decrypted;
   the four options are shuffled per question with a fixed seed; the user turn asks for the letter
   in \\boxed{} (our inference: the paper gives no GPQA prompt beyond the system prompt).
2) IFEval: the maintained checkers (google-research's, as packaged by lm-eval or if-verifiable) load
   nltk's punkt model at run time, which cannot be downloaded here. So the 25 instruction checkers of
   ifeval.jsonl are re-implemented here, following the original code; two use stand-ins for punkt:
   the original's regex sentence splitter, and a regex word tokenizer for capital-word counts.
   Language checks use langdetect (seeded), as the original does.
"""
import csv
import io
import json
import random
import re
import zipfile
from collections import Counter

from reward import answer_region, extract_answer


# -----------------------------------------------------------------------------
# GPQA Diamond: decrypted in memory only; the boxed letter is scored

GPQA_PASSWORD = b"deserted-untie-orchid"       # the official README's convention, not a secret
GPQA_SUFFIX = "\n\nPut the letter (A, B, C or D) of the correct option within \\boxed{}."


def load_gpqa(zip_path, seed=0):
    """198 rows {problem, answer: letter, id}, options shuffled per question with a fixed seed.

    The questions never touch disk or logs (the authors ask that they not appear in plain text).
    """
    with zipfile.ZipFile(zip_path) as z:
        text = z.read("dataset/gpqa_diamond.csv", pwd=GPQA_PASSWORD).decode("utf-8")
    rows = []
    for r in csv.DictReader(io.StringIO(text)):
        options = [r["Correct Answer"]] + [r[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        perm = list(range(4))
        random.Random(f"gpqa:{seed}:{r['Record ID']}").shuffle(perm)     # str seeds are stable
        body = "\n".join(f"{'ABCD'[slot]}) {options[j].strip()}" for slot, j in enumerate(perm))
        rows.append({"problem": r["Question"].strip() + "\n\n" + body + GPQA_SUFFIX,
                     "answer": "ABCD"[perm.index(0)], "id": r["Record ID"]})
    return rows


def gpqa_letter(completion):
    """'A'-'D' from the final answer: \\boxed{C}, \\boxed{(C)}, \\boxed{\\text{C}}, \\boxed{C) 4.2 eV}."""
    ans = extract_answer(completion)
    if ans is None:
        return None
    m = re.fullmatch(r"(?:\\text(?:bf)?\{|\\mathrm\{|\{|\(|\s)*([A-Da-d])(?:\W.*)?", ans, re.S)
    return m.group(1).upper() if m else None


# -----------------------------------------------------------------------------
# IFEval: prompt-level strict (every instruction followed), checkers after google-research (choice 6)

def _cmp(count, relation, threshold):
    return count < threshold if relation == "less than" else count >= threshold


def split_into_sentences(text):
    """The original IFEval regex splitter (instructions_util.split_into_sentences)."""
    alpha, pre, suf = "([A-Za-z])", "(Mr|St|Mrs|Ms|Dr)[.]", "(Inc|Ltd|Jr|Sr|Co)"
    starters = (r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s|However\s|That\s"
                r"|This\s|Wherever)")
    t = (" " + text + "  ").replace("\n", " ")
    t = re.sub(pre, "\\1<prd>", t)
    t = re.sub("[.](com|net|org|io|gov|edu|me)", "<prd>\\1", t)
    t = re.sub("([0-9])[.]([0-9])", "\\1<prd>\\2", t)
    t = re.sub(r"\.{2,}", lambda m: "<prd>" * len(m.group(0)) + "<stop>", t)
    t = t.replace("Ph.D.", "Ph<prd>D<prd>")
    t = re.sub(r"\s" + alpha + "[.] ", " \\1<prd> ", t)
    t = re.sub("([A-Z][.][A-Z][.](?:[A-Z][.])?) " + starters, "\\1<stop> \\2", t)
    t = re.sub(alpha + "[.]" + alpha + "[.]" + alpha + "[.]", "\\1<prd>\\2<prd>\\3<prd>", t)
    t = re.sub(alpha + "[.]" + alpha + "[.]", "\\1<prd>\\2<prd>", t)
    t = re.sub(" " + suf + "[.] " + starters, " \\1<stop> \\2", t)
    t = re.sub(" " + suf + "[.]", " \\1<prd>", t)
    t = re.sub(" " + alpha + "[.]", " \\1<prd>", t)
    t = t.replace(".\u201d", "\u201d.").replace('."', '".').replace('!"', '"!').replace('?"', '"?')
    t = t.replace(".", ".<stop>").replace("?", "?<stop>").replace("!", "!<stop>").replace("<prd>", ".")
    sentences = [s.strip() for s in t.split("<stop>")]
    return sentences[:-1] if sentences and not sentences[-1] else sentences


def _lang(text):
    import langdetect                               # pure Python, ships its language profiles
    langdetect.DetectorFactory.seed = 0             # langdetect is random unless seeded
    try:
        return langdetect.detect(text)
    except langdetect.LangDetectException:
        return None                                 # the original counts an undetectable text as passing


def _case_en(t, case):
    lang = _lang(t)
    return True if lang is None else case(t) and lang == "en"


def _paragraphs(t, num_paragraphs):
    parts = re.split(r"\s?\*\*\*\s?", t)
    if any(not p.strip() for p in parts[1:-1]):
        return False
    return sum(bool(p.strip()) for p in parts) == num_paragraphs


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
    if any(not p.strip() for p in parts[1:-1]):
        return False
    valid = [p for p in parts if p.strip()]
    return len(valid) == 2 and valid[0].strip() != valid[1].strip()


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
        sum(w.isupper() for w in re.findall(r"\w+(?:[-']\w+)*|[^\w\s]", t)), capital_relation, capital_frequency),
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
    "detectable_format:title": lambda t: any(
        x.lstrip("<").rstrip(">").strip() for x in re.findall(r"<<[^\n]+>>", t)),
    "keywords:existence": lambda t, keywords: all(re.search(k, t, re.I) for k in keywords),
    "keywords:forbidden_words": lambda t, forbidden_words: not any(
        re.search(r"\b" + w + r"\b", t, re.I) for w in forbidden_words),
    "keywords:frequency": lambda t, keyword, frequency, relation: _cmp(
        len(re.findall(keyword.strip(), t, re.I)), relation, frequency),
    "keywords:letter_frequency": lambda t, letter, let_frequency, let_relation: _cmp(
        Counter(t.lower())[letter.strip().lower()], let_relation, let_frequency),
    "language:response_language": lambda t, language: _lang(t) in (language, None),
    "length_constraints:nth_paragraph_first_word": _nth_paragraph,
    "length_constraints:number_paragraphs": _paragraphs,
    "length_constraints:number_sentences": lambda t, num_sentences, relation: _cmp(
        len(split_into_sentences(t)), relation, num_sentences),
    "length_constraints:number_words": lambda t, num_words, relation: _cmp(
        len(re.findall(r"\w+", t)), relation, num_words),
    "punctuation:no_comma": lambda t: "," not in t,
    "startend:end_checker": lambda t, end_phrase: t.strip().strip('"').lower().endswith(
        end_phrase.strip().lower()),
    "startend:quotation": lambda t: len(t.strip()) > 1 and t.strip()[0] == '"' and t.strip()[-1] == '"',
}


def ifeval_follows(completion, row):
    """Per-instruction strict results for one IFEval row (instruction_id_list + kwargs)."""
    text = answer_region(completion)
    out = []
    for iid, kwargs in zip(row["instruction_id_list"], row["kwargs"]):
        if iid not in IFEVAL_CHECKS:
            raise KeyError(f"IFEval instruction {iid!r} has no checker")
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        out.append(bool(text.strip()) and bool(IFEVAL_CHECKS[iid](text, **kwargs)))
    return out


def ifeval_correct(completion, row):
    """Prompt-level strict: correct only when every instruction is followed."""
    return all(ifeval_follows(completion, row))
