"""
The graded units of the student release: which functions of advantage.py the student writes, grouped
into problems with points. make_student_copy.py stubs exactly these bodies, grade.py scores exactly
these problems; HANDOUT.md describes them. Nothing here runs; import it.

Equation numbers are those of arXiv 2602.06717 (F-GRPO, v2).
"""

# (problem id, points, functions stubbed in advantage.py, what it is). The id is also the name of
# the grading test file: assignments/tests/test_<id>.py. A problem scores its points when every
# test in its file passes, and 0 otherwise.
PROBLEMS = [
    ("group_advantages", 2, ["group_advantages"], "group-normalised advantage, Eq. 3"),
    ("success_rate", 1, ["success_rate"], "empirical success rate mu_hat, Eq. 11"),
    ("focal_weight", 1, ["focal_weight"], "focal weight g = (1 - mu_hat)^gamma, Eq. 12"),
    ("focal_advantages", 2, ["focal_advantages"], "F-GRPO advantage A^F = g * A, Eq. 13"),
    ("focal_properties", 1, [], "properties any weighting must keep (uses Problems 1-4 end to end)"),
    ("token_mean", 1, ["token_mean"], "masked token mean with a global token count (App. B)"),
    ("aggregate", 2, ["aggregate"], "token-mean, GRPO's sequence mean, Dr. GRPO's constant normaliser"),
    ("clip_bounds", 1, ["clip_bounds"], "clip ranges of GRPO / DAPO / CISPO (App. L.2)"),
    ("policy_loss", 3, ["policy_loss"], "GRPO / DAPO clip loss (Eq. 14) and CISPO (Eqs. 15-16)"),
    ("kl_k3", 1, ["kl_k3"], "k3 estimate of KL to the reference (GRPO-KL, Sec. 5.6)"),
    ("tail_miss", 1, ["tail_miss_probability"], "tail-miss probability, Lemma 3.1"),
    ("pass_at_k", 2, ["pass_at_k", "pass_at_k_table"], "unbiased pass@k, Eq. 27"),
]

GRADED = [f for _, _, fns, _ in PROBLEMS for f in fns]   # every stubbed function, in file order or not

# Tracked files the student copy leaves out, because they hold a second implementation of a graded
# function (a plain-loop reference, or the wrong versions the grader must catch):
WITHHELD = {
    "tests/test_advantage.py": "checks advantage.py against plain re-implementations of the graded functions",
    "tests/test_assignments.py": "builds wrong versions of the graded functions from the reference",
}
