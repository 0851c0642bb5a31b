"""
What each weighting does to one group: the advantage of a correct and of a wrong sample at c correct of N,
for GRPO (Eq. 3), F-GRPO (Eqs. 11-13, gamma 0.5 and 1) and the rivals in advantage.py (MaxRL, pass@k
training, W-REINFORCE, the unlikeliness reward), each from its own function. A table on stdout, and a
figure of A(correct) against mu_hat = c / N with the ratio to GRPO's (the per-prompt weight w(mu_hat)).

    python bench/weights.py                                  # N = 8, k = 4: seconds
    python bench/weights.py --group_size 16 --figure figures/weights_n16.png

The unlikeliness reward depends on which samples are rare: it is shown twice, its correct samples the
least likely of the group (rare correct answers: the case it is for) and the most likely.
"""
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advantage import group_advantages, unlikely_rewards, weighted_advantages  # noqa: E402
from fgrpo_utils.cli import check, parse_config  # noqa: E402
from fgrpo_utils.outputs import check_out_file  # noqa: E402


@dataclass
class Config:
    group_size: int = 8               # N
    passk_k: int = 4                  # pass@k training's k
    wreinforce_lambda: float = 0.1    # W-REINFORCE's weight of a correct sample
    unlikely_beta: float = 0.25       # the unlikeliness reward's beta
    figure: str = "figures/weights_n8.png"   # "" = no figure

    def __post_init__(self):
        check(2 <= self.group_size <= 1024, f"--group_size {self.group_size}: must be in [2, 1024]")
        check(1 <= self.passk_k <= self.group_size, f"--passk_k {self.passk_k}: must be in [1, --group_size]")
        check(0 <= self.wreinforce_lambda <= 1e6, f"--wreinforce_lambda {self.wreinforce_lambda}: must be in [0, 1e6]")
        check(0 <= self.unlikely_beta <= 1, f"--unlikely_beta {self.unlikely_beta}: must be in [0, 1]")
        if self.figure:
            check_out_file(Path(self.figure), "--figure", "bench/weights.py")


def methods(cfg):
    """{name: rewards (P, N) -> advantages (P, N)}; the rows of R put the c correct samples first."""
    N, k, lam, beta = cfg.group_size, cfg.passk_k, cfg.wreinforce_lambda, cfg.unlikely_beta
    rare = -torch.arange(N, 0, -1, dtype=torch.float64)      # sample 0 the least likely (its mean log-prob lowest)
    return {"GRPO": lambda R: group_advantages(R),
            "F-GRPO γ=0.5": lambda R: weighted_advantages(R, "focal", gamma=0.5)[0],
            "F-GRPO γ=1": lambda R: weighted_advantages(R, "focal", gamma=1.0)[0],
            "MaxRL": lambda R: weighted_advantages(R, "maxrl")[0],
            f"pass@{k}": lambda R: weighted_advantages(R, "passk", k=k)[0],
            f"W-REINFORCE λ={lam:g}": lambda R: weighted_advantages(R, "wreinforce", lam=lam)[0],
            f"unlikeliness β={beta:g}, correct rare": lambda R: group_advantages(
                unlikely_rewards(R, rare.expand_as(R), beta)),
            f"unlikeliness β={beta:g}, correct likely": lambda R: group_advantages(
                unlikely_rewards(R, -rare.expand_as(R), beta))}


def table(cfg):
    """{method: [(A of a correct sample, A of a wrong one) for c = 1 .. N - 1]}: the first correct one (the
    rarest, for unlikeliness) and the last wrong one."""
    N = cfg.group_size
    R = torch.tensor([[1.0] * c + [0.0] * (N - c) for c in range(1, N)], dtype=torch.float64)   # (N - 1, N)
    return {name: [(float(a[i, 0]), float(a[i, -1])) for i in range(N - 1)] for name, f in methods(cfg).items()
            for a in [f(R)]}


def main(cfg):
    N, rows = cfg.group_size, table(cfg)
    grpo = rows["GRPO"]
    print(f"A(correct) / A(wrong) at c correct of N = {N}; w = A(correct) / GRPO's")
    print("| method | " + " | ".join(f"c={c}" for c in range(1, N)) + " |")
    print("|---|" + "---|" * (N - 1))
    for name, vals in rows.items():
        print(f"| {name} | " + " | ".join(f"{a:+.2f} / {b:+.2f} (w {a / g[0]:.2f})" for (a, b), g in zip(vals, grpo))
              + " |")
    if cfg.figure:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        mu = [c / N for c in range(1, N)]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for name, vals in rows.items():
            style = "--" if name.startswith("unlikeliness") else "-"
            left.plot(mu, [a for a, _ in vals], style, marker="o", label=name)
            right.plot(mu, [a / g[0] for (a, _), g in zip(vals, grpo)], style, marker="o", label=name)
        left.set(xlabel="μ̂ = c / N", ylabel="advantage of a correct sample", title=f"N = {N}")
        right.set(xlabel="μ̂ = c / N", ylabel="w(μ̂) = A(correct) / GRPO's", yscale="log",
                  title="the per-prompt weight against GRPO")
        left.axhline(0, color="grey", lw=0.5)
        right.legend(fontsize=7)
        fig.tight_layout()
        Path(cfg.figure).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(cfg.figure, dpi=110)
        print(f"wrote {cfg.figure}")


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
