"""
The student release (assignments/): the copy has stubs and scores 0, the reference scores full
points, and each plausible wrong version of a graded function loses the points of its problem, and
only those (its neighbours are graded on stored reference answers, assignments/tests/conftest.py).

    python -m pytest -q tests/test_assignments.py          # ~1 min on 2 cores

This file is withheld from the student copy (assignments/problems.WITHHELD): the wrong versions
below are one edit away from the solutions.
"""
import json
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "assignments"))
import grade  # noqa: E402
import make_student_copy  # noqa: E402
from problems import PROBLEMS, WITHHELD  # noqa: E402

POINTS = {pid: points for pid, points, _, _ in PROBLEMS}
ENV = {"OMP_NUM_THREADS": "1"}


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env={**__import__("os").environ, **ENV})


def grade_copy(d, tmp):
    """grade.py's JSON report for copy d."""
    out = Path(tmp) / f"{Path(d).name}.json"
    r = run(ROOT / "assignments" / "grade.py", d, "--json", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("total: ")
    return json.loads(out.read_text())


def lost(report):
    return {pid for pid, p in report["problems"].items() if p["points"] < p["max"]}


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    d = tmp_path_factory.mktemp("release") / "student"
    r = run(ROOT / "assignments" / "make_student_copy.py", d)
    assert r.returncode == 0, r.stderr                 # its own checks: parses, imports, no solution line
    return d


# -----------------------------------------------------------------------------
# Wrong versions: (function, source of a wrong def, the problems it must lose). Each is the mistake
# the named test of assignments/tests/ is there to catch.

WRONG = {
    "biased_std": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards).double()
    adv = R - R.mean(1, keepdim=True)
    if normalize_std:
        adv = adv / (R.std(1, keepdim=True, correction=0) + eps)
    return adv.masked_fill((R == R[:, :1]).all(1, keepdim=True), 0.0)
""", {"group_advantages"}),
    "eps_inside_sqrt": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards).double()
    adv = R - R.mean(1, keepdim=True)
    if normalize_std:
        adv = adv / (R.var(1, keepdim=True) + eps).sqrt()
    return adv.masked_fill((R == R[:, :1]).all(1, keepdim=True), 0.0)
""", {"group_advantages"}),
    "uniform_not_zeroed": ("group_advantages", """
def group_advantages(rewards, normalize_std=True, eps=1e-6):
    R = torch.as_tensor(rewards)
    adv = R - R.mean(1, keepdim=True)
    return adv / (R.std(1, keepdim=True) + eps) if normalize_std else adv
""", {"group_advantages", "focal_properties"}),
    "x_over_n_minus_1": ("success_rate", """
def success_rate(rewards, r_correct=1.0, r_wrong=0.0):
    R = torch.as_tensor(rewards)
    if not torch.isfinite(R).all() or ((R < r_wrong) | (R > r_correct)).any():
        raise ValueError("rewards outside the levels")
    return (R - r_wrong).sum(1) / (r_correct - r_wrong) / (R.shape[1] - 1)
""", {"success_rate"}),
    "gamma_on_mu": ("focal_weight", """
def focal_weight(mu_hat, gamma):
    return mu_hat.clamp(min=0.0) ** gamma
""", {"focal_weight"}),
    "no_clamp": ("focal_weight", """
def focal_weight(mu_hat, gamma):
    return (1 - mu_hat) ** gamma
""", {"focal_weight", "focal_properties"}),
    "inverse_sqrt_weighting": ("focal_weight", """
def focal_weight(mu_hat, gamma):
    return mu_hat ** (-gamma / 2)
""", {"focal_weight", "focal_properties"}),
    "weight_before_zscore": ("focal_advantages", """
def focal_advantages(rewards, gamma, r_correct=1.0, r_wrong=0.0, normalize_std=True):
    g = focal_weight(success_rate(rewards, r_correct, r_wrong), gamma)
    return group_advantages(g[:, None] * rewards, normalize_std), g
""", {"focal_advantages"}),
    "token_mean_of_sequence_means": ("token_mean", """
def token_mean(x, mask, num_tokens=None):
    return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
""", {"token_mean"}),
    "token_mean_constant": ("token_mean", """
def token_mean(x, mask, num_tokens=None):
    return (x * mask).sum() / mask.numel()
""", {"token_mean"}),
    "token_mean_local_count": ("token_mean", """
def token_mean(x, mask, num_tokens=None):
    return (x * mask).sum() / mask.sum().clamp(min=1)
""", {"token_mean"}),
    "aggregate_sequence_mean_for_token_mean": ("aggregate", """
def aggregate(x, mask, loss_agg="token-mean", num_tokens=None, num_seqs=None, max_len=None):
    mask = mask.to(x.dtype)
    S = mask.shape[0] if num_seqs is None else num_seqs
    if loss_agg == "seq-mean-token-sum-norm":
        return (x * mask).sum() / (S * (mask.shape[-1] if max_len is None else max_len))
    return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / S
""", {"aggregate"}),
    "aggregate_dr_grpo_counts_tokens": ("aggregate", """
def aggregate(x, mask, loss_agg="token-mean", num_tokens=None, num_seqs=None, max_len=None):
    mask = mask.to(x.dtype)
    S = mask.shape[0] if num_seqs is None else num_seqs
    if loss_agg == "seq-mean-token-mean":
        return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / S
    return token_mean(x, mask, num_tokens)
""", {"aggregate"}),
    "clip_bounds_swapped": ("clip_bounds", """
def clip_bounds(loss_type, eps_low=None, eps_high=None):
    d_low, d_high = CLIP_EPS[loss_type]
    return 1.0 - (d_high if eps_high is None else eps_high), 1.0 + (d_low if eps_low is None else eps_low)
""", {"clip_bounds"}),
    "clip_bounds_truthiness": ("clip_bounds", """
def clip_bounds(loss_type, eps_low=None, eps_high=None):
    d_low, d_high = CLIP_EPS[loss_type]
    return 1.0 - (eps_low or d_low), 1.0 + (eps_high or d_high)
""", {"clip_bounds"}),
}

# policy_loss: the reference with one line changed, so each version has exactly one mistake.
POLICY_EDITS = {
    "log_ratio_as_ratio": ("ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))", "ratio = logp - old_logp"),
    "cispo_without_stop_gradient": ("w = ratio.clamp(lo, hi).detach()", "w = ratio.clamp(lo, hi)"),
    "no_dual_clip": ("per_tok = torch.where(A < 0, torch.minimum(per_tok, -A * dual_clip), per_tok)", "pass"),
}

MORE_WRONG = {
    "kl_reversed": ("kl_k3", """
def kl_k3(logp, ref_logp):
    d = (logp - ref_logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)
""", {"kl_k3"}),
    "tail_miss_one_term_short": ("tail_miss_probability", """
def tail_miss_probability(mu_pos, tau, n):
    mu, tau, n = (np.asarray(x, dtype=np.float64) for x in (mu_pos, tau, n))
    return (1 - tau) ** n - (mu - tau) ** n
""", {"tail_miss"}),
    "pass_at_k_biased": ("pass_at_k", """
def pass_at_k(n, c, k):
    return 1.0 - (1.0 - c / n) ** k
""", {"pass_at_k"}),
    "pass_at_k_float_binomials": ("pass_at_k", """
def pass_at_k(n, c, k):
    comb = lambda a, b: math.prod((a - i) / (i + 1) for i in range(b)) if b <= a else 0.0
    return 1.0 - comb(n - c, k) / comb(n, k)
""", {"pass_at_k"}),
}


def reference_text():
    """advantage.py as committed: the student copy is built from HEAD too."""
    return subprocess.run(["git", "show", "HEAD:advantage.py"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def wrong_versions():
    text = reference_text()
    out = {name: make_student_copy.replace_function(text, fn, src)
           for name, (fn, src, _) in {**WRONG, **MORE_WRONG}.items()}
    for name, (old, new) in POLICY_EDITS.items():
        assert text.count(old) == 1, f"{name}: the reference's policy_loss no longer has the line {old!r}"
        out[name] = text.replace(old, new)
    return out


EXPECTED_LOSS = {**{n: v[2] for n, v in {**WRONG, **MORE_WRONG}.items()}, **{n: {"policy_loss"} for n in POLICY_EDITS}}


@pytest.fixture(scope="module")
def graded_wrong(student, tmp_path_factory):
    """Each wrong version planted in a fresh student copy whose other graded bodies are the reference's,
    graded two at a time. {name: report}."""
    tmp = tmp_path_factory.mktemp("wrong")

    def one(item):
        name, text = item
        d = tmp / name
        shutil.copytree(student, d)
        (d / "advantage.py").write_text(text)
        return name, grade_copy(d, tmp)
    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, wrong_versions().items()))


# -----------------------------------------------------------------------------

def test_student_copy_scores_zero_with_every_graded_test_failing(student, tmp_path):
    report = grade_copy(student, tmp_path)
    assert report["total"] == [0, sum(POINTS.values())]
    for pid, p in report["problems"].items():
        assert p["passed"] == 0 and p["tests"] > 0, f"{pid}: {p['passed']} of {p['tests']} tests pass on the stubs"


def test_reference_scores_full_points(tmp_path):
    report = grade_copy(ROOT, tmp_path)
    assert report["total"] == [sum(POINTS.values())] * 2, {k: v["failed"] for k, v in report["problems"].items()}


@pytest.mark.parametrize("name", sorted(EXPECTED_LOSS))
def test_each_wrong_version_loses_its_problem_only(graded_wrong, name):
    report = graded_wrong[name]
    assert lost(report) == EXPECTED_LOSS[name], f"{name}: lost {sorted(lost(report))}"
    assert report["total"][0] == sum(POINTS.values()) - sum(POINTS[p] for p in EXPECTED_LOSS[name])


def test_copy_holds_tracked_files_only_with_stubs_and_agents_md(student):
    agents = (student / "AGENTS.md").read_text()
    assert all(f"- `{name}` (Problem" in agents for name in make_student_copy.GRADED)
    for rel in WITHHELD:
        assert not (student / rel).exists(), rel
    assert not any((student / p).exists() for p in (".git", "out", "runs", ".venv"))
    copied = {str(p.relative_to(student)) for p in student.rglob("*") if p.is_file()}
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    assert copied - tracked == {"AGENTS.md"}
    assert "assignments/grade.py" in copied and "assignments/expected.json" in copied
    # the leak check make_student_copy ran has something to look for
    assert len(make_student_copy.solution_lines(reference_text())) > 20


def test_copy_imports_and_fails_only_when_a_stub_is_called(student):
    r = run("-c", "import train, simulate, evaluate, maze, advantage\n"
                  "try:\n    advantage.group_advantages([[1.0, 0.0]])\nexcept NotImplementedError as e:\n"
                  "    print('stub:', e)", cwd=student)
    assert r.returncode == 0, r.stderr
    assert "stub: group_advantages: your code here" in r.stdout


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_make_student_copy_refuses_a_non_empty_dir(tmp_path, kind):
    d = tmp_path / "taken"
    if kind == "file":
        d.write_text("mine")
    else:
        d.mkdir()
        (d / "notes.txt").write_text("mine")
    r = run(ROOT / "assignments" / "make_student_copy.py", d)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert (d.read_text() if kind == "file" else (d / "notes.txt").read_text()) == "mine"
    assert kind == "file" or sorted(p.name for p in d.iterdir()) == ["notes.txt"]


def test_expected_fixture_matches_the_reference():
    r = run(ROOT / "assignments" / "make_expected.py", "--check", "true")
    assert r.returncode == 0, r.stdout + r.stderr


def test_handout_commands_use_flags_that_exist():
    """Every `python X.py --flag` / `torchrun ... X.py --flag` in HANDOUT.md names a Config field of X
    (or, for the argparse tools in assignments/, an option the tool defines)."""
    text = (ROOT / "assignments" / "HANDOUT.md").read_text().replace("\\\n", " ")
    cmds = re.findall(r"(?:python3?|torchrun[^`\n]*?)\s+((?:bench/|assignments/)?\w+\.py)([^`\n|;]*)", text)
    cmds += [("train.py", flags) for flags in re.findall(r'^CLASS="([^"]*)"', text, re.M)]    # the ablations' prefix
    assert len(cmds) > 15
    for script, rest in cmds:
        flags = [t[2:].split("=")[0] for t in shlex.split(rest.split("#")[0].replace("$", "X")) if t.startswith("--")]
        source = (ROOT / script).read_text()
        fields = set(re.findall(r"^    (\w+): [\w\[\], .|]+ = ", source.split("class Config", 1)[1], re.M)) \
            if "class Config" in source else set(re.findall(r'"--(\w+)"', source))
        for flag in flags:
            assert flag in fields, f"HANDOUT.md: {script} has no flag --{flag}"


def test_experiment_checks_on_synthetic_runs(tmp_path):
    """grade.py --runs: a class run (E3) with the required flags, steps and evaluation earns its
    points; a NaN, a missing step or another --gamma loses them."""
    def write_run(d, gamma, seed, steps=80, nan=False):
        d.mkdir(parents=True)
        cfg = dict(grade.CLASS, gamma=gamma, seed=seed, steps=steps)
        (d / "run.json").write_text(json.dumps({"config": cfg, "world": 1}))
        lines = [{"step": s, "reward/mean": 0.5, "loss/pg": float("nan") if nan and s == 7 else 0.1,
                  **({k: 0.3 for k in grade.PASSK} if s == steps else {})} for s in range(1, steps + 1)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    cls = tmp_path / "out" / "class"
    for g in ("0", "0.5"):
        for s in (0, 1):
            write_run(cls / f"g{g}_s{s}", float(g), s)
    (cls / "sft_eval.json").write_text(json.dumps(
        {"config": {}, "pending": [], "benchmarks": {"maze": {"n": 64, "c": [3] * 128, "pass@k": {"1": 0.05}}}}))
    rows = {r[0]: r for r in grade.grade_experiments(tmp_path)}
    assert rows["E3"][2:4] == (3.0, 3.0), rows["E3"][4]
    assert all(r[2] == 0 for k, r in rows.items() if k != "E3")
    shutil.rmtree(cls / "g0.5_s1")
    write_run(cls / "g0.5_s1", 0.5, 1, nan=True)
    assert any("NaN" in w for w in grade.check_run(tmp_path, "out/class/g0.5_s1", 80, **grade.CLASS))
    assert grade.check_run(tmp_path, "out/class/g0_s0", 100, **grade.CLASS)            # 80 of 100 steps
    assert grade.check_run(tmp_path, "out/class/g0_s0", 80, **dict(grade.CLASS, gamma=0.5))
    assert grade.check_eval(tmp_path, "out/class/sft_eval.json", "maze", 1024)
