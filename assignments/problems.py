"""
The graded units of the student release: which functions the student writes, grouped into problems
with points. make_student_copy.py stubs exactly these bodies, grade.py scores exactly these problems
(its checks: make_expected.py, teacher side); HANDOUT.md describes them. Nothing here runs; import it.

Equation numbers are those of arXiv 2602.06717 (F-GRPO, v2).
"""

# (problem id, points, functions stubbed as "module.function", what it is). A problem scores its
# points when every one of its checks passes, and 0 otherwise.
PROBLEMS = [
    ("group_advantages", 2, ["advantage.group_advantages"], "group-normalised advantage, Eq. 3"),
    ("success_rate", 1, ["advantage.success_rate"], "empirical success rate mu_hat, Eq. 11"),
    ("focal_weight", 1, ["advantage.focal_weight"], "focal weight g = (1 - mu_hat)^gamma, Eq. 12"),
    ("focal_advantages", 2, ["advantage.focal_advantages"], "F-GRPO advantage A^F = g * A, Eq. 13"),
    ("focal_properties", 1, [], "properties any weighting must keep (your Problems 1-4 end to end)"),
    ("token_mean", 1, ["advantage.token_mean"], "masked token mean with a global token count (App. B)"),
    ("aggregate", 2, ["advantage.aggregate"], "token-mean, GRPO's sequence mean, Dr. GRPO's constant normaliser"),
    ("clip_bounds", 1, ["advantage.clip_bounds"], "clip ranges of GRPO / DAPO / CISPO (App. L.2)"),
    ("policy_loss", 3, ["advantage.policy_loss"], "GRPO / DAPO clip loss (Eq. 14) and CISPO (Eqs. 15-16)"),
    ("kl_k3", 1, ["advantage.kl_k3"], "k3 estimate of KL to the reference (GRPO-KL, Sec. 5.6)"),
    ("tail_miss", 1, ["advantage.tail_miss_probability"], "tail-miss probability, Lemma 3.1"),
    ("pass_at_k", 2, ["advantage.pass_at_k", "advantage.pass_at_k_table"], "unbiased pass@k, Eq. 27"),
    ("logprobs", 2, ["advantage.entropy_from_logits", "fgrpo_utils.logprob.token_logp",
                                 "fgrpo_utils.logprob.head_logp"],
     "log-probs of the sampled tokens and the entropy, from logits and from the head (Eq. 14's pi_theta)"),
    ("maze_reward", 1, ["maze.maze_reward"], "the maze's strict reward (Sec. 5.2) and MaxRL's walk rule"),
    ("update", 3, ["train.update_minibatch"], "one mini-batch's gradient over micro-batches, global counts (App. B)"),
]

GRADED = [f for _, _, fns, _ in PROBLEMS for f in fns]                    # "module.function"


def file_of(function):
    """The file that defines a graded "module.function": "fgrpo_utils.logprob.head_logp" -> fgrpo_utils/logprob.py."""
    return function.rsplit(".", 1)[0].replace(".", "/") + ".py"


GRADED_FILES = sorted({file_of(f) for f in GRADED})                        # what grade.py takes from a hand-in

# Top-level definitions the student copy leaves out: another implementation of a graded function
# (the trainer's chunked head; writing one is Problem 13's stretch).
REMOVED = {"fgrpo_utils/logprob.py": ["_chunk_logits", "_ChunkedHead"]}

# Written by make_student_copy.py into the copy: the files it shipped, with a hash of each.
RELEASE = "release.json"

# Tracked files the student copy leaves out: a second implementation of a graded function, or what
# answers the checks:
WITHHELD = {
    "tests/test_advantage.py": "checks advantage.py against plain re-implementations of the graded functions",
    "tests/test_assignments.py": "builds wrong versions of the graded functions from the reference",
    "tests/test_attribution.py": "runs those wrong versions through the RL check",
    "tests/test_runs_tied.py": "trains with the graded functions (a fresh copy's are stubs)",
    "assignments/make_expected.py": "builds the hidden checks and answers them with the reference",
    "tests/test_logp_memory.py": "checks the chunked head (removed: REMOVED) against plain log-probs and entropy",
    "tests/test_simulate.py": "states E1's and E2's results (the claims a run meets, Lemma 3.1's argmax table)",
    "figures/fig2.png": "E1's plot", "figures/fig2_sensitivity.png": "E1's plot, other optimizer settings",
    "figures/fig3.png": "E2's plot", "figures/fig5.png": "E1's plot",
    "results/sim_rivals/focal.json": "E1's sweep (gamma 0 and 1 at Fig. 2's N and seeds) beside gamma 0.5",
    "results/sim_rivals/table.md": "E1's M_ret and Q_pos beside the rivals'", "figures/sim_rivals.png": "the same, plotted",
    "bench/grade_class.py": "grades a class of hand-ins built from the reference (its wrong versions quote solution lines)",
    # the maze study: GRPO and F-GRPO across gamma and N, and the rivals, which E3 and A1-A5 ask for (a folder: "/")
    **{f"results/{d}/": "the maze study E3 and A1-A5 ask for" for d in ("maze7", "maze7_long", "maze7_verify",
                                                                        "maze7_w2", "maze7_w3", "rivals7")},
    "results/maze7_blocks.md": "the maze study across warm starts (A1, A2)",
    **{f"figures/{f}.png": "the maze study, plotted" for f in ("maze_curves", "maze_long_curves", "maze7_curves",
                                                               "maze7_fig6", "rivals7_curves")},
    "tests/test_sandbox_attacks.py": "holds attacks on the grader",
}


def withheld(rel):
    """Does the student copy leave out the tracked file rel (named in WITHHELD, or under a folder there)?"""
    return rel in WITHHELD or any(rel.startswith(w) for w in WITHHELD if w.endswith("/"))


# Passages of the docs that report what a graded experiment asks for, as (file, first line's start,
# the start of the line after the passage, experiments). The student copy keeps their headings (the
# anchors other docs link to) and replaces every other line by one note; a table row keeps its first
# cell, the experiment (the paper's claims beside it are what E1 asks a student to test). E3's
# reference numbers stay: the handout gives them, to compare a class run with.
ANSWERS = [
    ("RESULTS.md", "## The categorical simulation", "## The single-solution maze", "E1 and E2"),
    ("README.md", "| [Categorical simulation]", "| [Maze, 300 steps]", "E1"),
    ("RESULTS.md", "### The rivals in the simulation", "## Memory at the paper's scale", "E1"),
    ("README.md", "| [Maze, 300 steps]", "| [Class run]", "A1-A5"),
    ("RESULTS.md", "## The single-solution maze", "### The class run", "E3 and A1-A5"),
    ("RESULTS.md", "### The rivals on the 7×7 maze", "### The rivals in the simulation", "A1"),
]
