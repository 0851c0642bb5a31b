"""reward.py: extraction, math-verify equivalence, time bounds, the batch Scorer, data loading,
prompts per family, GPQA and IFEval.  `python -m pytest -q tests/test_reward.py`"""
import json
import signal
import sys
import threading
import time

import pytest

from fgrpo_utils import ood
import reward

# -----------------------------------------------------------------------------
# is_correct: equivalent forms, wrong answers, extraction policy


@pytest.mark.parametrize("completion, gold", [
    ("so the total is \\boxed{\\frac{3}{4}}", "0.75"),                 # fraction vs decimal
    ("\\boxed{0.75}", "\\frac{3}{4}"),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34"),                            # \dfrac
    ("\\boxed{50\\%}", "50"),                                          # percentage
    ("\\boxed{[1, 3)}", "[1,3)"),                                      # interval
    ("\\boxed{(-\\infty,0]}", "(-\\infty, 0]"),
    ("\\boxed{(3, -1)}", "(3,-1)"),                                    # tuple / point
    ("\\boxed{\\text{Monday}}", "\\text{Monday}"),                     # \text{}
    ("\\boxed{C}", "\\text{(C)}"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),
    ("\\boxed{10^\\circ}", "10"),
    ("\\boxed{3.83 \\times 10^{35}}", "3.83e35"),                      # Minerva's e-notation gold
    ("\\fbox{7}", "7"),                                                # \fbox
    ("\\boxed{\\frac{\\sqrt{3}}{2}} and nothing after", "\\frac{\\sqrt3}2"),   # nested braces
    ("The final answer is $\\frac{1}{2}$.", "1/2"),                    # fallback: "answer is"
    ("<think>maybe \\boxed{5}</think>\n\nSo \\boxed{6}", "6"),         # after </think>
])
def test_equivalent_forms_are_correct(completion, gold):
    assert reward.is_correct(completion, gold)


@pytest.mark.parametrize("completion, gold", [
    ("\\boxed{5}", "6"),                                               # wrong
    ("\\boxed{(1, 2)}", "(2,1)"),                                      # tuple order matters
    ("\\boxed{[1,3]}", "[1,3)"),                                       # interval ends matter
    ("the total is 3/4", "3/4"),                                       # no box, no "answer is"
    ("", "1"),
    ("\\boxed{}", "1"),
    ("\\boxed{6} but wait, \\boxed{5}", "6"),                          # only the last box counts
    ("\\boxed{6} and \\boxed{", "6"),                                  # a broken last box counts too
    ("<think>so \\boxed{6}", "6"),                                     # reasoning never closed
])
def test_wrong_or_missing_answers_are_incorrect(completion, gold):
    assert not reward.is_correct(completion, gold)


def test_two_boxes_last_counts():
    assert reward.extract_answer("first \\boxed{1}, then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert reward.is_correct("first \\boxed{1}, then \\boxed{2}", "2")


# -----------------------------------------------------------------------------
# No box: math-verify's answer phrases, one sentence at a time (DESIGN.md, "The reward")

NO_BOX_FIXED = [   # (completion, gold, correct): each was scored the other way before
    ("The final answer is $28$. I hope it is correct.", "28", True),            # Minerva's format
    ("So the answer is 5. Check: 2 + 4 = 6.", "6", False),                       # a check after it
    ("So the answer is 5. Check: 2 + 4 = 6.", "5", True),
    ("The answer is 27. Note that 28 was ruled out.", "28", False),              # a remark after it
    ("The answer is 27. Note that 28 was ruled out.", "27", True),
    ("The answer is 7. This took 3 steps.", "3", False),
    ("The answer is 7. This took 3 steps.", "7", True),
    ("The answer is 0.5. That is the probability.", "1/2", True),
    ("The answer is $5$, since $2 + 3 = 5$.", "5", True),                        # a reason in the sentence
    ("The answer is 5. Let me verify the answer.", "5", True),                   # "answer" but no answer after
    ("The answer is 3, and the answer is 4.", "4", True),                        # two phrases, one line: last
    ("The final answer is:\n\n$$\n\\frac{3}{4}\n$$", "3/4", True),               # a display after the phrase
    ("Therefore, the answer is\n\\[\nP = \\frac{3}{4}\n\\]", "3/4", True),        # ... is not a new sentence
    # a clause or a check after the answer, in the same sentence: the phrase binds what follows it
    ("The answer is 12, as 3 · 4 = 12 and 12 > 10.", "12", True),
    ("The answer is 12, as 3 · 4 = 12 and 12 > 10.", "10", False),
    ("The answer is 7 because 3 + 4 = 7 and 7 < 9.", "9", False),
    ("The answer is 7 because 3 + 4 = 7 and 7 < 9.", "7", True),
    ("The answer is 42 (since 6 × 7 = 42 > 40).", "40", False),
    ("The answer is 42 (since 6 × 7 = 42 > 40).", "42", True),
    ("So the answer is 3, which is less than 5.", "5", False),
    ("So the answer is 3, which is less than 5.", "3", True),
    ("The answer is $\\frac{1}{2}$, since 1/2 + 1/2 = 1.", "1/2", True),
    ("The answer is 1,000, as 10^3 = 1000.", "1000", True),                      # a thousands comma stays
    ("The answer is 3, and the answer is 4.", "3", False),                       # the last phrase's clause
]


@pytest.mark.parametrize("completion, gold, correct", NO_BOX_FIXED)
def test_no_box_answer_is_read_from_its_own_sentence(completion, gold, correct):
    """The old fallback took everything after "answer is" to the end of the LINE and parsed it as one
    box, so a trailing sentence ("I hope it is correct", "Check: 2 + 4 = 6") either broke the parse
    or supplied the answer. Now math-verify's own answer-phrase extraction reads the last sentence
    that has one; on the whole line it too would read 6 in the second case ("answer", then "= 6")."""
    assert reward.is_correct(completion, gold) == correct


@pytest.mark.parametrize("completion, gold, correct", [
    ("The answer is 3, and the answer is 4.", "3", False),
    ("The answer is 3. No wait, the answer is 4.", "4", True),                   # several sentences: last
    ("The answer is 3. No wait, the answer is 4.", "3", False),
    ("Answer: 4. Later I see that the answer is 7.", "7", True),                 # "Answer:" then "answer is"
    ("Answer: 4. Later I see that the answer is 7.", "4", False),
    ("Answer: 4\nLet me reconsider: the answer is 7.", "7", True),               # a new line is a new sentence
    ("**Answer:** $42$\n\n**Check:** $6 \\times 7 = 42$", "42", True),
    ("The answer is 12 apples.", "12", True),
])
def test_no_box_last_answer_phrase_wins(completion, gold, correct):
    """Guards (these already passed): with several answer phrases the last sentence's counts."""
    assert reward.is_correct(completion, gold) == correct


@pytest.mark.parametrize("completion, gold, correct", [
    ("The answer is x^2+1.", "x^2+1", True),
    ("The answer is \\sqrt{2}. That is all.", "\\sqrt{2}", True),
    ("The answer is \\frac{3}{4}", "0.75", True),
    ("So the answer is 3.83e35. Done.", "3.83e35", True),
    ("So the answer is 3.83e35. Done.", "3.83", False),
    ("The answer is \\sqrt{2}. Check: 1 + 1 = 2.", "2", False),
])
def test_no_box_bare_latex_answer_is_read_within_its_sentence(completion, gold, correct):
    """math-verify reads bare LaTeX and e-notation only in a box, so the phrase's rest, cut at the end of
    its own sentence, is read as one; the next sentence still cannot supply the answer."""
    assert reward.is_correct(completion, gold) == correct


@pytest.mark.parametrize("completion, gold, correct", [
    ("\\boxed{3} and then the answer is 4.", "3", True),                         # any box beats phrases
    ("\\boxed{3} and then the answer is 4.", "4", False),
    ("The answer is 4. Finally \\boxed{2} then \\boxed{3}.", "3", True),         # and the last box wins
    ("The answer is 4. Finally \\boxed{2} then \\boxed{3}.", "2", False),
    ("The answer is 4. Finally \\boxed{2} then \\boxed{3}.", "4", False),
    ("The answer is 4. Then \\boxed{}", "4", False),                             # even a broken one
])
def test_boxed_answer_still_wins_over_answer_phrases(completion, gold, correct):
    """Guards (these already passed): the phrase fallback applies only when there is no box at all."""
    assert reward.is_correct(completion, gold) == correct


@pytest.mark.parametrize("completion", [
    "I am not sure how to solve this problem.",
    "Let me think. 2 + 3 = 5. So 5.",                        # no "the last number" fallback
    "We need the answer. First, 2 + 3 = 5.",                 # the word, but no answer after it
])
def test_no_answer_at_all(completion):
    """Guards (these already passed): no box and no answer phrase is no answer, never a guess."""
    assert not reward.is_correct(completion, "5")
    assert reward.Scorer(workers=0).score([completion], ["5"]) == ([0.0], {"unparseable": 1, "timeouts": 0,
                                                                           "cache_hits": 0})


def test_scorer_reads_answer_phrases_like_is_correct():
    """train.py (score_batch) and evaluate.py (Scorer) score through verifier_input and judge, the
    same path as is_correct: the fixed cases must come out fixed there too, pool and cache included."""
    comps, golds, want = zip(*NO_BOX_FIXED)
    with reward.Scorer(workers=1) as s:
        assert s.score(list(comps), list(golds))[0] == [float(w) for w in want]


@pytest.mark.slow
@pytest.mark.parametrize("completion", [
    "\\boxed{9^{9^{9^9}}}",                                            # a huge power
    "\\boxed{" + "\\frac{1}{" * 60 + "2" + "}" * 60 + "}",             # deeply nested LaTeX
    "\\boxed{" + "{" * 300 + "1" + "}" * 300 + "}",                    # deeply nested braces
    "x" * 1_000_000 + "\\boxed{" + "y" * 1_000_000 + "}",              # a megabyte box
    "the answer is " + "9" * 1_000_000,                                # a megabyte fallback answer
    "The answer is $9^{9^{9^9}}$. " * 100,                             # 100 answer sentences: one is parsed
])
def test_pathological_inputs_bounded_time(completion):
    t0 = time.perf_counter()
    assert not reward.is_correct(completion, "5")
    assert time.perf_counter() - t0 < 2 * reward.TIMEOUT_S + 3


def test_megabyte_completion_with_short_answer_is_scored():
    assert reward.is_correct("x" * 1_000_000 + " so \\boxed{5}", "5")


def test_is_correct_refuses_other_threads():
    """SIGALRM timeouts need the main thread; silently scoring without them could hang a rank."""
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, reward.is_correct, "\\boxed{1}", "1")))
    t.start()
    t.join()
    assert errors and errors[0].match("main thread")


# -----------------------------------------------------------------------------
# Scorer: process pool, cache, backstop

def _hang_on_marker(keys):
    """A worker that hangs where SIGALRM cannot help (signal blocked), for the answer 'HANG', and answers
    the rest at once (a string match, not math-verify), so that no key but that one nears the backstop
    however loaded the machine."""
    if any(a == "\\boxed{HANG}" for _, a in keys):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(120)
    return [(a == f"\\boxed{{{g}}}", "ok") for g, a in keys]


@pytest.mark.slow
def test_scorer_matches_is_correct_and_caches():
    comps = ["\\boxed{5}", "\\boxed{6}", "no idea", "\\boxed{\\frac{10}{2}}", "\\boxed{9^{9^{9^9}}}"] * 20
    golds = ["5"] * len(comps)
    with reward.Scorer(workers=2) as s:
        r1, st1 = s.score(comps, golds)
        r2, st2 = s.score(comps, golds)
    assert r1 == r2 == [float(reward.is_correct(c, g)) for c, g in zip(comps[:5], golds[:5])] * 20
    assert st1["unparseable"] == 20 and st1["timeouts"] == 20
    assert st2["cache_hits"] == 80                           # all but the 20 with no answer
    assert reward.score_batch(comps[:5], golds[:5])[0] == r1[:5]


def test_scorer_in_process():
    rewards, stats = reward.Scorer(workers=0).score(["\\boxed{2}", "x"], ["2", "2"])
    assert rewards == [1.0, 0.0] and stats["unparseable"] == 1


@pytest.mark.slow
def test_scorer_backstop_rebuilds_pool_after_hang():
    comps = [f"\\boxed{{{i}}}" for i in range(6)] + ["\\boxed{HANG}"]
    with reward.Scorer(workers=2, chunk_size=4, backstop_s=3.0, fn=_hang_on_marker) as s:
        t0 = time.perf_counter()
        rewards, stats = s.score(comps, ["3"] * len(comps))
        assert time.perf_counter() - t0 < 100                # the hang costs 3 s x (4 + 2), not its 120 s
        assert rewards == [0, 0, 0, 1, 0, 0, 0] and stats["timeouts"] == 1
        assert s.score(["\\boxed{7}"], ["7"]) == ([1.0], {"unparseable": 0, "timeouts": 0, "cache_hits": 0})


# -----------------------------------------------------------------------------
# Data: jsonl errors name file and line; the paper's filter

def test_load_jsonl_errors_name_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": \n')
    with pytest.raises(ValueError, match=f"{p}:2: bad JSON"):
        reward.load_jsonl(p)
    p.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": 4}\n{"problem": "x"}\n')
    with pytest.raises(ValueError, match=f"{p}:3: missing or empty field 'answer'"):
        reward.load_jsonl(p)
    p.write_text('{"problem": "1+1", "answer": 2}\n')
    assert reward.load_jsonl(p)[0]["answer"] == "2"
    for bad, kind in (('0.5', "float"), ('[1, 2]', "list"), ('true', "bool"), ('{"a": 1}', "dict")):
        p.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "x", "answer": %s}\n' % bad)
        with pytest.raises(ValueError, match=f"{p}:2: field 'answer' is a {kind} .*write it as a string"):
            reward.load_jsonl(p)


@pytest.fixture(scope="module")
def qwen25(data):
    return reward.load_tokenizer(str(data / "tokenizers" / "qwen2.5"))


def test_filter_math_train(qwen25):
    rows = [{"problem": "What is 1+1?", "answer": "2"}, {"problem": "What is  1+1? ", "answer": "2"},   # agree: 1 kept
            {"problem": "What is 2+2?", "answer": "4"}, {"problem": "What is 2+2?", "answer": "5"},     # disagree: 0 kept
            {"problem": "Name it.", "answer": "245 yd."},                                               # string-only gold
            {"problem": "long " * 2000, "answer": "3"}, {"problem": "What is 3+3?", "answer": "6"}]
    kept, report = reward.filter_math_train(rows, qwen25, "qwen2.5", max_prompt_tokens=1024)
    assert [r["answer"] for r in kept] == ["2", "6"]
    assert reward.tokenizer_family(qwen25) == "qwen2.5"
    assert report == {"rows": 7, "duplicate_copies_removed": 1, "conflicting_problems_dropped": 1,
                      "conflicting_rows_dropped": 2, "unparseable_gold_dropped": 1, "too_long_dropped": 1, "kept": 2}


def test_load_training_problems(tmp_path, qwen25):
    """train.py's entry point: filtered rows as prompt token ids and gold strings."""
    p = tmp_path / "train.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in [{"problem": "1+1?", "answer": "2"}, {"problem": "1+1?", "answer": "2"},
                                                         {"problem": "Run.", "answer": "245 yd."}]))
    problems = reward.load_training_problems(str(p), qwen25)
    assert [x["gold"] for x in problems] == ["2"]
    assert qwen25.decode(problems[0]["prompt_ids"]) == reward.format_prompt(qwen25, "1+1?", "qwen2.5")


def test_deepscaler_partial_loads(data):
    rows = reward.load_jsonl(data / "train" / "deepscaler_partial.jsonl")
    assert len(rows) == 10110


# -----------------------------------------------------------------------------
# Prompts per family (Table 9)

def test_qwen_prompts_and_stops(data, qwen25):
    text = reward.format_prompt(qwen25, "What is 1+1?", "qwen2.5")
    assert text == (f"<|im_start|>system\n{reward.MATH_SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is 1+1?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert "You are a helpful assistant." in reward.format_prompt(qwen25, "Write.", "qwen2.5", "ifeval")
    assert reward.stop_token_ids(qwen25, "qwen2.5") == reward.stop_token_ids(qwen25) == [151645, 151643]
    q3 = reward.load_tokenizer(str(data / "tokenizers" / "qwen3"))
    math = reward.format_prompt(q3, "What is 1+1?", "qwen3")
    assert reward.MATH_SYSTEM in math and math.endswith("<|im_start|>assistant\n")          # thinking on
    ife = reward.format_prompt(q3, "Write.", "qwen3", "ifeval")
    assert "system" not in ife and ife.endswith("<think>\n\n</think>\n\n")                   # thinking off


def test_llama3_tokenizer_builds_offline(data):
    tok = reward.load_tokenizer(str(data / "tokenizers" / "llama3"))
    assert len(tok) == 128256 and tok("Hello, world!", add_special_tokens=False)["input_ids"] == [9906, 11, 1917, 0]
    text = reward.format_prompt(tok, "What is 1+1?", "llama3")
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                           "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" + reward.MATH_SYSTEM)
    assert text.endswith("What is 1+1?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert reward.stop_token_ids(tok, "llama3") == reward.stop_token_ids(tok) == [128009, 128001, 128008]
    assert "Today Date: 26 Jul 2024\n\n<|eot_id|>" in reward.format_prompt(tok, "Write.", "llama3", "ifeval")


def test_model_family():
    assert [reward.model_family(x) for x in ("Qwen/Qwen2.5-7B", "qwen2", "Qwen/Qwen3-4B-Base", "qwen3",
                                             "meta-llama/Llama-3.2-3B-Instruct", "llama")] == \
        ["qwen2.5", "qwen2.5", "qwen3", "qwen3", "llama3", "llama3"]
    with pytest.raises(ValueError):
        reward.model_family("gpt2")


# -----------------------------------------------------------------------------
# GPQA and IFEval

def test_gpqa_in_memory(data, tmp_path, monkeypatch):
    zip_path = data / "eval" / "gpqa" / "dataset.zip"
    if not zip_path.exists():
        pytest.skip(f"{zip_path} not found")
    monkeypatch.chdir(tmp_path)
    try:
        rows = ood.load_gpqa(zip_path)
    except RuntimeError as e:                   # e.g. a zip method this Python cannot decrypt
        pytest.skip(f"cannot open the GPQA zip here: {e}")
    assert len(rows) == 198 and list(tmp_path.iterdir()) == []       # nothing written
    assert rows == ood.load_gpqa(zip_path)                        # fixed shuffle
    letters = [r["answer"] for r in rows]
    assert set(letters) == set("ABCD") and max(letters.count(x) for x in "ABCD") < 80
    assert all("\nA) " in r["problem"] and "\nD) " in r["problem"] for r in rows)


@pytest.mark.parametrize("completion, letter", [
    ("\\boxed{C}", "C"), ("\\boxed{(b)}", "B"), ("\\boxed{\\text{D}}", "D"), ("\\boxed{A) 4.2 eV}", "A"),
    ("The answer is (C).", "C"), ("\\boxed{Cat}", None), ("no answer", None)])
def test_gpqa_letter(completion, letter):
    assert reward.gpqa_letter(completion) == letter


IFEVAL_CASES = [   # (instruction id, kwargs, a response that follows, one that does not)
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"}, "THE CAT is BIG", "The cat is BIG"),
    ("change_case:english_capital", {}, "THIS IS A SHORT ENGLISH SENTENCE ABOUT THE WEATHER TODAY.", "This is a short English sentence."),
    ("change_case:english_lowercase", {}, "this is a short english sentence about the weather today.", "This is a short English sentence."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "say hi. Hi!", "Hi! Say hi."),
    ("combination:two_responses", {}, "Yes.\n******\nNo.", "Yes.\n******\nYes."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at [address].", "Dear [name]."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello.\nP.S. bye", "Hello. PS bye"),
    ("detectable_format:constrained_response", {}, "My answer is yes.", "Yes."),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', "{a: 1}"),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2}, "Section 1\nA\nSection 2\nB", "Section 1\nA"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two", "* one\n* two\n* three"),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*a* and **b**", "*a* only"),
    ("detectable_format:title", {}, "<<My Title>>\ntext", "My Title\ntext"),
    ("keywords:existence", {"keywords": ["cat", "dog"]}, "A Cat and a dog.", "A cat."),
    ("keywords:forbidden_words", {"forbidden_words": ["cat"]}, "A catalog.", "A cat."),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"}, "cat cat", "cat"),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "less than"}, "zoo", "zizz"),
    ("language:response_language", {"language": "fr"}, "Bonjour, je suis un assistant et je parle français aujourd'hui.", "Hello, I am an assistant and I speak English today."),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "First part.\n\nThen, the second.", "First part.\n\nAnd the second."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "One.\n***\nTwo.", "One.\n***\n\n***\nTwo."),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "One. Two.", "One. Two. Three."),
    ("length_constraints:number_words", {"num_words": 3, "relation": "at least"}, "one two three", "one two"),
    ("punctuation:no_comma", {}, "no commas here", "a, b"),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?", "Any other questions? Done."),
    ("startend:quotation", {}, '"quoted"', 'not "quoted"'),
]


@pytest.mark.parametrize("iid, kwargs, good, bad", IFEVAL_CASES, ids=[c[0] for c in IFEVAL_CASES])
def test_ifeval_checkers(iid, kwargs, good, bad):
    pytest.importorskip("langdetect")
    row = {"instruction_id_list": [iid], "kwargs": [kwargs]}
    assert ood.ifeval_correct(good, row)
    assert not ood.ifeval_correct(bad, row)


def test_ifeval_every_instruction_has_a_checker(data):
    ids = {i for line in open(data / "eval" / "ifeval.jsonl") for i in json.loads(line)["instruction_id_list"]}
    assert len(ids) == 25 and ids <= set(ood.IFEVAL_CHECKS)
    assert {c[0] for c in IFEVAL_CASES} == set(ood.IFEVAL_CHECKS)


def test_ifeval_prompt_level_is_all_instructions():
    row = {"instruction_id_list": ["punctuation:no_comma", "keywords:existence"], "kwargs": [{}, {"keywords": ["cat"]}]}
    assert ood.ifeval_correct("a cat", row) and not ood.ifeval_correct("a dog", row)
    assert not ood.ifeval_correct("   ", {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]})


def test_load_jsonl_names_the_line_of_a_non_utf8_byte(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"problem": "1+1", "answer": "2"}\n{"problem": "caf\xe9", "answer": "3"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not UTF-8 \(byte 0xe9"):
        reward.load_jsonl(path)


def test_hub_data_without_datasets_names_the_fix(monkeypatch):
    """`datasets` is only in requirements-gpu.txt; without it the hub path says how to get it."""
    monkeypatch.setitem(sys.modules, "datasets", None)              # `import datasets` raises ImportError
    for source in ("deepscaler", reward.DEEPSCALER_HUB):
        with pytest.raises(SystemExit, match="requirements-gpu.txt"):
            reward.load_train_rows(source)
