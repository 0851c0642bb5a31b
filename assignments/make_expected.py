"""
The grading checks, and assignments/expected.json: the public ones with the reference's answers.

    python assignments/make_expected.py                  # rewrites expected.json (seed 0: the public checks)
    python assignments/make_expected.py --check true     # only compare with the committed file (exit 1 if stale)

Teacher side only: the student copy leaves this file out (problems.WITHHELD). grade.py calls
checks(seed) with a fresh seed for the hidden checks of each grading run and answers them with the
reference advantage.py in its own process (answer); seed 0 gives the public checks, whose answers
expected.json stores so that a student copy can grade itself. Every input is drawn from the seed
with the structure that catches a known mistake (the comment on each says which), so the hidden
checks catch what the public ones catch, on numbers the student has not seen.
"""
import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import harness  # noqa: E402
from problems import PROBLEMS  # noqa: E402

OUT = HERE / "expected.json"
F64 = torch.float64


def lengths_mask(lengths, T):
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(F64)          # (B, T)


def mixed_binary(g, G, N, levels=(1.0, 0.0)):
    """(G, N) rewards at two levels: row 0 all wrong, row 1 all correct, the rest mixed (0 < X < N)."""
    rows = [[levels[1]] * N, [levels[0]] * N]
    for _ in range(G - 2):
        X = int(torch.randint(1, N, (1,), generator=g))
        perm = torch.randperm(N, generator=g)
        rows.append([levels[0] if int(perm[j]) < X else levels[1] for j in range(N)])
    order = torch.randperm(G, generator=g).tolist()
    return torch.tensor([rows[i] for i in order], dtype=F64)


# Values whose float mean over N copies does not round back to them (float32 at N = 7, float64 at
# N = 6); a power of two or a sign flip keeps that, so the hidden checks draw from these.
UNROUND = {(torch.float32, 7): (0.1, 0.7, -1.3, 0.3), (torch.float64, 6): (0.1, 0.7, 1.1, 0.2)}


def unround_uniform(g, dtype, N, count):
    """Constant rows whose float mean does not round back to the value: (R - mean) is then 1e-9 ..
    1e-8, not 0, and / (std + eps) makes it 1e-3 .. 1e-1 unless the code writes exact zeros."""
    base = UNROUND[dtype, N]
    pick = torch.randperm(len(base), generator=g)[:count].tolist()
    scale = (2.0 ** torch.randint(-2, 3, (count,), generator=g)).tolist()
    return torch.tensor([[base[i] * s] * N for i, s in zip(pick, scale)], dtype=dtype)


def check(problem, call, args, kwargs=None, name="", **opts):
    for kind in harness.STAND_IN_KINDS:                # each check records its own tables (answer)
        if kind in opts:
            opts[kind] = {k: [] for k in opts[kind]}
    return {"problem": problem, "name": name, "call": call, "args": list(args), "kwargs": kwargs or {}, **opts}


def uniform_rows(R):
    return [i for i in range(R.shape[0]) if bool((R[i] == R[i, 0]).all())]


# -----------------------------------------------------------------------------
# One builder per problem: the checks of a seed. Each comment says which mistake an input catches.

def group_advantages(g):
    N = int(torch.randint(5, 9, (1,), generator=g))
    binary = mixed_binary(g, 6, N)                     # unbiased std: sqrt(N / (N - 1)) off with the biased one
    pm1 = mixed_binary(g, 5, N + 1, (1.0, -1.0))
    real = torch.randn(3, 4, generator=g, dtype=F64) * 2          # eps on the std: sqrt(var + eps) differs at 0.5
    f32 = torch.cat([unround_uniform(g, torch.float32, 7, 4), torch.tensor([[0.1, 0.7, 0.1, 0.1, 0.7, 0.1, 0.1]])])
    f64 = torch.cat([unround_uniform(g, F64, 6, 3), torch.randn(1, 6, generator=g, dtype=F64)])
    v = float(torch.rand((), generator=g))
    tiny = torch.tensor([[v] * 5 + [v + 1e-6], [v] * 6], dtype=F64)   # a real spread of 4e-7: not "uniform"
    ints = mixed_binary(g, 4, N).to(torch.int64)                     # integer rewards: mean() needs a float
    out = []
    for name, R in (("binary", binary), ("pm1", pm1), ("real", real), ("uniform_f32", f32),
                    ("uniform_f64", f64), ("tiny_spread", tiny), ("int", ints)):
        tol = 1e-5 if R.dtype == torch.float32 else 1e-7
        for kw in ({}, {"normalize_std": False}):
            out.append(check("group_advantages", "advantage.group_advantages", [R], kw, name,
                             zero_rows=uniform_rows(R), atol=tol, rtol=tol))
    out.append(check("group_advantages", "advantage.group_advantages", [real], {"eps": 0.5}, "real eps 0.5"))
    return out


def success_rate(g):
    N = int(torch.randint(4, 8, (1,), generator=g))
    rc, rw = float(torch.randint(1, 4, (1,), generator=g)), -float(torch.randint(1, 4, (1,), generator=g))
    cases = [([mixed_binary(g, 5, N)], {}),                                 # X / N, not X / (N - 1)
             ([mixed_binary(g, 4, N, (1.0, -1.0))], {"r_correct": 1.0, "r_wrong": -1.0}),
             ([mixed_binary(g, 4, N, (rc, rw))], {"r_correct": rc, "r_wrong": rw}),   # mapped by R_w and R_c
             ([torch.rand(2, N, generator=g, dtype=F64)], {}),              # partial credit inside the levels
             ([mixed_binary(g, 3, N).to(torch.int64)], {})]                 # integer rewards
    bad = [[[1.0 + float(torch.rand((), generator=g)), 0.0, 1.0]], [[-0.1, 1.0, 0.0]], [[math.nan, 1.0, 0.0]],
           [[math.inf, 0.0, 1.0]]]
    cases += [([torch.tensor(r, dtype=F64)], {}) for r in bad]               # ValueError: outside or not finite
    cases += [([torch.tensor([[-1.0, 1.0, 0.0]], dtype=F64)], {"r_correct": 1.0, "r_wrong": 0.0}),
              ([torch.tensor([[0.0, 1.0]], dtype=F64)], {"r_correct": 0.0, "r_wrong": 1.0})]   # R_c <= R_w
    return [check("success_rate", "advantage.success_rate", a, kw) for a, kw in cases]


def focal_weight(g):
    mu = torch.cat([torch.tensor([0.0, 1.0, 1.0 + 1e-7], dtype=F64), torch.rand(5, generator=g, dtype=F64)])
    gammas = (0.0, 0.5, 1.0, 2.0, round(0.1 + 3.9 * float(torch.rand((), generator=g)), 3))
    return [check("focal_weight", "advantage.focal_weight", [mu, gm]) for gm in gammas]


FOCAL_DEPS = {"memo": {"success_rate": [], "focal_weight": [], "group_advantages": []}}


def focal_advantages(g):
    N = int(torch.randint(5, 9, (1,), generator=g))
    gm = round(0.2 + 2.8 * float(torch.rand((), generator=g)), 3)
    cases = [([mixed_binary(g, 5, N), 0.5], {}),          # g after the z-score: scaling R by g first cancels
             ([mixed_binary(g, 5, N), 2.0], {"normalize_std": False}),
             ([mixed_binary(g, 4, N, (1.0, -1.0)), 1.0], {"r_correct": 1.0, "r_wrong": -1.0}),
             ([mixed_binary(g, 6, N), 0.0], {}), ([mixed_binary(g, 6, N), gm], {})]
    return [check("focal_advantages", "advantage.focal_advantages", a, kw, zero_rows=uniform_rows(a[0]), **FOCAL_DEPS)
            for a, kw in cases]


def focal_properties(g):
    """Properties of the whole chain (Problems 1-4, the student's own): judged without the reference."""
    N = int(torch.randint(6, 10, (1,), generator=g))
    batches = [((torch.arange(N)[None, :] < torch.arange(N + 1)[:, None]).to(F64), 1.0, 0.0),   # X = 0 .. N
               (mixed_binary(g, 4, N, (1.0, -1.0)), 1.0, -1.0),
               (unround_uniform(g, torch.float32, 7, 1).abs(), None, 0.0)]
    v = batches[2][0][0, 0]                   # R_c = v: the float32 mean of the constant row may pass R_c
    batches[2] = (torch.cat([batches[2][0], torch.tensor([[1, 0, 0, 1, 0, 0, 0]]) * v]), float(v), 0.0)
    out = []
    for R, rc, rw in batches:
        uniform = uniform_rows(R)
        for norm in (True, False):
            base = len(out)
            out.append(check("focal_properties", "advantage.group_advantages", [R], {"normalize_std": norm},
                             properties="base"))
            for gm in (0.0, 0.5, 1.0, 2.0):
                out.append(check("focal_properties", "advantage.focal_advantages", [R, gm, rc, rw],
                                 {"normalize_std": norm}, properties="focal", zero_rows=uniform,
                                 base=len(out) - base))          # how many checks back its base is
    return out


def token_mean(g):
    T = int(torch.randint(6, 9, (1,), generator=g))
    lengths = [T, 1] + torch.randint(2, T, (2,), generator=g).tolist()    # uneven: mean of row means differs
    x = torch.randn(4, T, generator=g, dtype=F64)
    mask = lengths_mask(lengths, T)
    n = int(mask.sum()) + int(torch.randint(5, 30, (1,), generator=g))  # a global count > this one's
    empty = torch.zeros(4, T, dtype=F64)
    cases = [{}, {"num_tokens": n}, {"num_tokens": torch.tensor(float(n))}]
    out = [check("token_mean", "advantage.token_mean", [x, mask], kw, grad=["x"]) for kw in cases]
    out += [check("token_mean", "advantage.token_mean", [x, mask.bool()], {}, "bool mask", grad=["x"])]
    out += [check("token_mean", "advantage.token_mean", [x, empty], kw, "no tokens", grad=["x"])
            for kw in ({}, {"num_tokens": 0})]
    out += [check("token_mean", "advantage.token_mean", [x[k:k + 2], mask[k:k + 2]], {"num_tokens": int(mask.sum())},
                  "a micro-batch with the global count", grad=["x"]) for k in (0, 2)]
    return out


TM = {"linear": {"token_mean": []}}


def aggregate(g):
    T = int(torch.randint(7, 10, (1,), generator=g))
    lengths = torch.randint(1, T - 1, (4,), generator=g).tolist()     # longest row narrower than the width
    x = torch.randn(4, T, generator=g, dtype=F64)
    mask = lengths_mask(lengths, T)
    S, L = int(torch.randint(5, 9, (1,), generator=g)), T + int(torch.randint(1, 5, (1,), generator=g))
    whole = dict(num_tokens=int(mask.sum()), num_seqs=4, max_len=T)
    kw = [("token-mean", {}), ("token-mean", {"num_tokens": 3 * int(mask.sum())}),
          ("seq-mean-token-mean", {}), ("seq-mean-token-mean", {"num_seqs": S}),
          ("seq-mean-token-sum-norm", {}), ("seq-mean-token-sum-norm", {"num_seqs": S, "max_len": L}),
          ("seq-mean-token-sum-norm", {"num_seqs": torch.tensor(float(S)), "max_len": L})]
    out = [check("aggregate", "advantage.aggregate", [x, mask, m], k, m, grad=["x"], **TM) for m, k in kw]
    for m in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):   # micro-batches, global counts
        out += [check("aggregate", "advantage.aggregate", [x[k:k + 2], mask[k:k + 2], m], whole,
                      f"{m}, half {k // 2} with the whole's counts", grad=["x"], **TM) for k in (0, 2)]
    out.append(check("aggregate", "advantage.aggregate", [x, mask, "token-sum"], {}, "unknown mode", **TM))
    return out


def clip_bounds(g):
    a, b = (round(0.05 + 0.4 * float(torch.rand((), generator=g)), 3) for _ in range(2))
    args = [("grpo", None, None), ("dapo", None, None), ("cispo", None, None), ("dapo", a, None),
            ("grpo", None, b), ("dapo", 0.0, 0.0), ("cispo", a, 2.0 + b), ("ppo", None, None)]  # 0.0 is a width
    return [check("clip_bounds", "advantage.clip_bounds", list(x)) for x in args]


def policy_batch(g):
    """logp, old_logp, A, mask with tokens in every region of the clipped objective."""
    B, T = 4, 6
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 3
    old = logp + torch.randn(B, T, generator=g, dtype=F64) * 0.3
    A = torch.tensor([1.3, -0.7, 0.4, -1.1], dtype=F64) * (0.5 + torch.rand(4, generator=g, dtype=F64))
    old[1, 0] = logp[1, 0] - math.log(4.0)      # r = 4 > c = 3, A < 0: the dual clip caps it
    old[3, 1] = logp[3, 1] - 1.5                # r = 4.5, A < 0: dual clip again
    old[0, 2] = logp[0, 2] - 0.5                # r = 1.65 > 1 + eps_high, A > 0: clipped high
    old[2, 1] = logp[2, 1] + 0.5                # r = 0.61 < 1 - eps_low, A > 0: not clipped (max picks -r A)
    old[1, 2] = logp[1, 2] + 0.6                # r = 0.55 < 1 - eps_low, A < 0: clipped low
    old[0, 3] = logp[0, 3] - 0.25               # r = 1.28: inside DAPO's range, outside GRPO's
    mask = lengths_mask([6, 3, 4, 2], T)
    old[3, 4] = logp[3, 4] - 3.0                # padding with r = 20: ratio/max is over response tokens only
    return logp, old, A, mask


def policy_loss(g):
    logp, old, A, mask = policy_batch(g)
    W = torch.randn(logp.shape, generator=g, dtype=F64) * mask          # the spied aggregate's cotangent
    A_tok = torch.randn(logp.shape, generator=g, dtype=F64)
    far = old.clone()
    far[0, 0] = logp[0, 0] - 25.0           # log-ratio 25: clamped to 20 before exp
    far[1, 1] = logp[1, 1] + 30.0           # log-ratio -30: clamped to -20
    specs = [("grpo", old, A, {}), ("dapo", old, A, {}), ("cispo", old, A, {}),
             ("grpo", old, A, {"eps_low": 0.1, "eps_high": 0.3, "dual_clip": 2.0}),
             ("grpo", logp.clone(), A, {}),                                   # on-policy: r = 1
             ("dapo", old, A_tok, {}),                                        # per-token advantages
             ("cispo", far, A, {}), ("grpo", far, A, {}),
             ("grpo", far, A, {"num_tokens": 30, "loss_agg": "seq-mean-token-mean", "num_seqs": 6, "max_len": 8}),
             ("dapo", old, A, {"num_tokens": torch.tensor(20.0)})]
    deps = {"memo": {"clip_bounds": []}, "linear": {"token_mean": []}, "spy": {"aggregate": W}}
    out = [check("policy_loss", "advantage.policy_loss", [logp, o, a, mask, lt], kw, f"{lt} {kw}",
                 grad=["logp"], grad_of=[0], **deps) for lt, o, a, kw in specs]
    f32 = dict(atol=1e-5, rtol=1e-5)
    far32 = old.clone()
    far32[0, 0] = logp[0, 0] - 100.0        # log-ratio 100: exp overflows float32 unless clamped first
    far32[1, 1] = logp[1, 1] + 100.0
    out += [check("policy_loss", "advantage.policy_loss", [logp.float(), far32.float(), A.float(), mask.float(), lt],
                  {}, f"{lt}, float32, log-ratios of +-100", grad=["logp"], grad_of=[0], **deps, **f32)
            for lt in ("grpo", "cispo")]
    empty = torch.zeros_like(mask)                                          # no response tokens at all
    out += [check("policy_loss", "advantage.policy_loss", [logp, old, A, empty, lt], {}, f"{lt}, empty mask",
                  grad=["logp"], grad_of=[0], **deps) for lt in ("grpo", "cispo")]
    return out


def kl_k3(g):
    logp = -torch.rand(3, 5, generator=g, dtype=F64) * 3
    ref = logp + torch.randn(3, 5, generator=g, dtype=F64)
    ref[0, 0] = logp[0, 0] - 15.0          # d = -15: k3 = 14, capped at 10
    ref[1, 1] = logp[1, 1] + 2.5           # d = 2.5: the direction of d matters most here
    ref[2, 2] = logp[2, 2] + 25.0          # d = 25: clamped to 20, then k3 to 10
    return [check("kl_k3", "advantage.kl_k3", [logp, ref], grad=["logp"])]


def tail_miss(g):
    mu = (0.15 + 0.8 * torch.rand(4, generator=g, dtype=F64))[:, None, None]
    rho = torch.tensor([0.01, 0.05, 0.1, 0.2], dtype=F64)[None, :, None]
    n = torch.tensor([1, 2, 5, 8, 15, 64, 512])[None, None, :]
    nd = lambda t: {"ndarray": t}                                               # noqa: E731
    out = [check("tail_miss", "advantage.tail_miss_probability", [nd(mu), nd(rho * mu), nd(n)], name="grid")]
    out += [check("tail_miss", "advantage.tail_miss_probability", [0.64, 6.3e-5, N]) for N in (1, 8, 1024, 32768)]
    for m in mu.flatten().tolist()[:2]:
        out += [check("tail_miss", "advantage.tail_miss_argmax", [m, r * m]) for r in (0.01, 0.2)]
    return out


def pass_at_k(g):
    args = [(10, 0, 5), (10, 10, 5), (4, 1, 4), (1, 0, 1), (1, 1, 1), (1024, 1, 256), (4096, 5, 2048),
            (5000, 1, 4999)]       # (4, 1, 4): unbiased 1.0, biased 0.68; (4096, 5, 2048): binomials ~1e1231
    for _ in range(6):
        n = int(torch.randint(2, 5000, (1,), generator=g))
        args.append((n, int(torch.randint(0, n + 1, (1,), generator=g)), int(torch.randint(1, n + 1, (1,), generator=g))))
    out = [check("pass_at_k", "advantage.pass_at_k", list(a), atol=1e-9, rtol=0) for a in args]
    out += [check("pass_at_k", "advantage.pass_at_k", list(a), name="refused") for a in ((4, 1, 5), (4, 5, 2))]
    k = int(torch.randint(1, 2049, (1,), generator=g))
    tables = [(16, 1), (16, 16), (1024, 256), (2048, k), (4096, 2048), (int(torch.randint(2, 300, (1,), generator=g)), 1)]
    out += [check("pass_at_k", "advantage.pass_at_k_table", list(a), atol=1e-9, rtol=0) for a in tables]
    return out


def logprobs(g):
    S, T, V = 3, 5, 11
    logits = torch.randn(S, T, V, generator=g, dtype=F64) * 3
    logits[0, :2] *= 120                   # a spread of ~1000: log(softmax(z)) is -inf and p log p NaN there
    targets = torch.randint(0, V, (S, T), generator=g)
    targets[0, 0] = int(logits[0, 0].argmin())                 # the least likely token: logp ~ -1000
    lengths = [T, int(torch.randint(1, T, (1,), generator=g)), 0]     # padding, and a row with no tokens
    batch = {"targets": targets, "completion_mask": lengths_mask(lengths, T).bool()}
    exact, f32 = dict(atol=1e-9, rtol=1e-9), dict(atol=1e-5, rtol=1e-5)     # float32: any stable order passes
    out = [check("logprobs", "fgrpo_utils.logprob.token_logp", [logits, batch], name="float64", grad=["logits"], **exact),
           check("logprobs", "fgrpo_utils.logprob.token_logp", [logits.float(), batch], name="float32", grad=["logits"],
                 exact_dtype=True, **f32),
           check("logprobs", "advantage.entropy_from_logits", [logits], name="float64", grad=["logits"], **exact),
           check("logprobs", "advantage.entropy_from_logits", [logits[1].float()], name="float32", grad=["logits"],
                 exact_dtype=True, **f32),                        # float32 in, float32 out: not float64
           check("logprobs", "advantage.entropy_from_logits", [logits[2, 0].bfloat16()], name="bfloat16 -> float32",
                 exact_dtype=True, **f32)]
    N, d = 7, 4
    h = torch.randn(N, d, generator=g, dtype=F64)
    h[0] *= 30                                                 # a large spread on one token
    W, b = torch.randn(V, d, generator=g, dtype=F64), torch.randn(V, generator=g, dtype=F64)
    t = torch.randint(0, V, (N,), generator=g)
    T_ = 0.5 + float(torch.rand((), generator=g))              # the sampling temperature, != 1
    for bias, grads in ((b, ["h", "weight", "bias"]), (None, ["h", "weight"])):
        for i in (0, 1):                                       # d logp and d H (every input's gradient)
            out.append(check("logprobs", "fgrpo_utils.logprob.head_logp", [h, W, bias, t, T_, True], {},
                             f"head, T {T_:.3f}, bias {bias is not None}, grad of {('logp', 'H')[i]}",
                             grad=grads, grad_of=[i], **exact))
    out.append(check("logprobs", "fgrpo_utils.logprob.head_logp", [h.float(), W.float(), None, t], {}, "T = 1, no entropy",
                     grad=["h"], grad_of=[0], exact_dtype=True, **f32))
    # bf16 hidden states and head (FSDP's mixed precision): float32 log-probs and entropy, not bf16 ones
    out.append(check("logprobs", "fgrpo_utils.logprob.head_logp", [h.bfloat16(), W.bfloat16(), None, t, T_, True], {},
                     "bfloat16 in, float32 out", exact_dtype=True, atol=0.15, rtol=0.05))
    return out


def wall_bump(grid, path):
    """(k, move): after the first k moves of the shortest path, a move into a wall (some position on
    the path has one: a grid's border walls it in)."""
    import maze
    pos = maze.find(grid, "S")
    for k in range(len(path) + 1):
        move = next((m for m in maze.MOVES if maze.step(grid, pos, m) is None), None)
        if move is not None:
            return k, move
        pos = maze.step(grid, pos, path[k])
    raise AssertionError("no wall along the path")


def maze_reward(g):
    import maze
    out = []
    for size in (7, 9):
        grid = maze.make_maze(size, int(torch.randint(0, 10**6, (1,), generator=g)))
        path = maze.solve(grid)
        back = {"UP": "DOWN", "DOWN": "UP", "LEFT": "RIGHT", "RIGHT": "LEFT"}
        k, wall = wall_bump(grid, path)
        goal = maze.find(grid, "G")
        goal_wall = next((m for m in maze.MOVES if maze.step(grid, goal, m) is None), None)
        j = int(torch.randint(0, len(path), (1,), generator=g))
        cases = [" ".join(path + ["DONE", "<eos>"]),                  # right
                 path + ["DONE", "<eos>"],                            # right, as token strings
                 "".join(path) + "DONE<eos>",                         # no spaces: the same words
                 " ".join(path + ["DONE", "<eos>", "UP", "UP"]),      # after <eos>: not in a rollout
                 " ".join(path + ["DONE"]),                           # no <eos>: cut by the length limit
                 " ".join(path + ["DONE", "DONE", path[0]]),          # rambling to the length limit
                 " ".join(path + ["<eos>"]),                          # no DONE
                 " ".join(path + ["<eos>", "DONE"]),                  # <eos> before DONE
                 " ".join(path + ["DONE", path[-1], "<eos>"]),        # a move after DONE
                 " ".join(path + ["DONE", "DONE", "<eos>"]),          # DONE twice
                 " ".join(path + [back[path[-1]], "DONE", "<eos>"]),  # walk: 1 at G, whatever follows
                 " ".join(path + ["DONE", "FOO", "<eos>"]),           # an unknown word after DONE
                 " ".join(path[:j] + ["PATH"] + path[j:] + ["DONE", "<eos>"]),   # a word between the moves
                 " ".join(path[:j] + ["FOO"] + path[j:] + ["DONE", "<eos>"]),    # garbage between the moves
                 " ".join(path[:-1] + [path[-1] + "X", "DONE", "<eos>"]),      # junk glued to a move
                 " ".join(path + ["FOO", "DONE", "<eos>"]),           # a non-move word after the goal
                 " ".join([path[0], back[path[0]]] + path + ["DONE", "<eos>"]),  # a detour: walk 1, strict 0
                 " ".join(path[:-1] + ["DONE", "<eos>"]),             # one move short
                 " ".join(path[:k] + [wall] + path[k:] + ["DONE", "<eos>"]),     # into a wall on the way
                 " ".join(path).lower() + " DONE <eos>",              # not the vocabulary's words
                 " ".join(path) + " done <eos>",
                 "", "   \n ", "<eos>", "DONE <eos>", None, 42, [], [1, 2, 3], path + ["DONE", 7]]
        if goal_wall is not None:                                     # walk: a bump at the goal still scores
            cases.append(" ".join(path + [goal_wall, "DONE", "<eos>"]))
        out += [check("maze_reward", "maze.maze_reward", [grid, c, rule], name=f"{size}x{size} {rule} case {i}")
                for rule in ("strict", "walk") for i, c in enumerate(cases)]
        out.append(check("maze_reward", "maze.maze_reward", [grid, cases[0]], name="the default rule"))
    out.append(check("maze_reward", "maze.maze_reward", [grid, cases[0], "lenient"], name="unknown rule"))
    return out


def qwen2(g, V, hidden=8, positions=64, seed=None, layers=1):
    """A random Qwen2 as plain data (harness.dec builds it, float64); with a seed, its weights are drawn
    there (a model too large to store in expected.json)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = dict(vocab_size=V, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=positions,
                  tie_word_embeddings=False)
    if seed is not None:
        return {"qwen2": {"config": config, "seed": seed}}
    model = Qwen2ForCausalLM(Qwen2Config(**config)).double()
    state = {k: torch.randn(v.shape, generator=g, dtype=F64) * 0.5 for k, v in model.state_dict().items()}
    return {"qwen2": {"config": config, "state": state}}


def update(g):
    import train
    V, N = 13, 3
    model = qwen2(g, V)
    ints = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))            # noqa: E731
    prompts, completions = [], []
    for _ in range(4):                                        # 4 groups of N, prompts and lengths differ
        p = torch.randint(1, V, (ints(2, 6),), generator=g).tolist()
        prompts += [p] * N
        completions += [torch.randint(1, V, (ints(1, 7),), generator=g).tolist() for _ in range(N)]
    A = torch.randn(4 * N, generator=g, dtype=F64)
    A[N:2 * N] = 0.0                                          # a group without signal: skipped, still counted
    old = [-torch.rand(len(c), generator=g, dtype=F64) * 2 for c in completions]
    base = dict(group_size=N, share_prompts=False, padding_free=True, micro_batch_size=4, micro_batch_tokens=0, skip_dead_groups=True,
                kl_coef=0.0, entropy_coef=0.0, loss="grpo", eps_low=None, eps_high=None, dual_clip=3.0,
                temperature=1.0, loss_agg="token-mean", max_response_len=8)
    assert set(base) <= {f.name for f in dataclasses.fields(train.Config)}
    dead = torch.zeros_like(A)                                # every group without signal: one empty pass
    ref = qwen2(g, V)                                         # GRPO-KL's frozen reference
    T = round(0.6 + 0.3 * float(torch.rand((), generator=g)), 3)
    L = ints(9, 14)               # Dr. GRPO's constant, given as max_len: not the config's max_response_len (8)
    drgrpo = {"loss_agg": "seq-mean-token-sum-norm"}
    # (name, config, pi_old's log-probs or None, A, max_len); each comment: the mistake the check catches
    specs = [("on-policy, 3 micro-batches", {}, None, A, None),   # a micro-batch's own count: wrong weights
             ("off-policy dapo, T 0.7", {"loss": "dapo", "temperature": 0.7}, old, A, None),   # the ratio uses old_logp
             ("seq-mean-token-mean, no skipping", {"loss_agg": "seq-mean-token-mean", "skip_dead_groups": False},
              None, A, None),
             ("cispo + entropy bonus", {"loss": "cispo", "entropy_coef": 0.05}, None, A, None),  # every token forwarded
             ("entropy bonus, seq-mean-token-mean", {"entropy_coef": 0.05, "loss_agg": "seq-mean-token-mean"},
              old, A, None),                                   # the bonus aggregates as the loss does
             ("entropy bonus, Dr. GRPO", {"entropy_coef": 0.1, **drgrpo}, None, A, L),
             (f"KL to a reference, T {T}", {"kl_coef": 0.2, "temperature": T}, old, A, None),   # sign, order, T, grad
             # the KL term aggregates as the loss does; its metric over completion tokens only (padded rows)
             ("KL, seq-mean-token-mean, padded rows", {"kl_coef": 0.2, "loss_agg": "seq-mean-token-mean",
                                                       "padding_free": False}, None, A, None),
             ("KL, Dr. GRPO", {"kl_coef": 0.3, **drgrpo}, old, A, L),
             ("Dr. GRPO, one micro-batch", {**drgrpo, "micro_batch_size": 64}, old, A, L),  # L from max_len
             ("every group without signal", {}, None, dead, None)]   # the metrics the trainer reads, still
    deps = {"affine": {"policy_loss": [], "aggregate": [], "token_mean": []},
            "jacobian": {"fgrpo_utils.logprob.head_logp": [], "kl_k3": []}, "dist": True, "param_grads": "model",
            "detached_out": True, "frozen": "ref_model"}    # pi_old's log-probs returned without a graph

    def call(name, kw, o, a, max_len, world=1, models=(model, ref), **opts):
        kwargs = {"cfg": {"namespace": {**base, **kw}}, "pad_id": 0, "device": "cpu", "world": world,
                  **({"max_len": max_len} if max_len else {})}
        return check("update", "train.update_minibatch", [models[0], models[1] if kw.get("kl_coef") else None,
                                                          prompts, completions, a, o],
                     kwargs, name, atol=1e-9, rtol=1e-9, **deps, **opts)

    out = [call(*spec) for spec in specs]
    out[0]["saved_bytes"] = True        # what autograd holds at once: one micro-batch's graph, not all three
    # At a vocabulary of 256 the (tokens, V) logits outweigh the rest of the graph: the head's log-probs and
    # entropy must come from policy_logp's chunked head, never from the whole logits (App. B's memory)
    out.append(call("vocabulary 256, entropy bonus: no whole logits", {"entropy_coef": 0.05}, None, A, None,
                    models=(qwen2(g, 256), None), saved_bytes=True))
    out += [peak(g, base), graph_peak(g, base)]
    # Two real ranks, FSDP2: rank 1 holds the group without signal, so it has half rank 0's live rows; one
    # row a pass, every rank makes rank 0's count, so rank 1 runs empty passes (weight 0) to pair with rank
    # 0's; the loss divides by counts summed over both ranks (x world undoes FSDP's mean), the metrics are
    # global. Under each loss aggregation, with the KL and the entropy bonus (their counts global too).
    two = dict(ranks=2, per_sequence=[2, 3, 4, 5], same_on_ranks=[[0]],
               shares=[list(range(0, N)) + list(range(2 * N, 3 * N)), list(range(3 * N, 4 * N)) + list(range(N, 2 * N))])
    out.append(call("2 ranks, one with an empty pass", {"micro_batch_size": 1}, old, A, None, world=2, **two))
    for agg, max_len in (("token-mean", None), ("seq-mean-token-mean", None), ("seq-mean-token-sum-norm", L)):
        out.append(call(f"2 ranks, KL and entropy bonus, {agg}", {"loss_agg": agg, "kl_coef": 0.2, "entropy_coef": 0.05,
                                                                 "micro_batch_size": 2}, old, A, max_len, world=2, **two))
    # One rank's groups all without signal while the other trains: it must still make the passes and
    # collectives the other waits in (an early return hangs rank 0), and both end with the same metrics and .grad
    A2 = A.clone()
    A2[3 * N:] = 0.0
    out.append(call("2 ranks, one with no signal at all", {}, old, A2, None, world=2,
                    **{**two, "shares": [list(range(0, N)) + list(range(2 * N, 3 * N)),
                                         list(range(N, 2 * N)) + list(range(3 * N, 4 * N))]}))
    return out


def peak(g, base, V=16384, hidden=16, layers=1, mb=16, against="baseline", allowance=None, **kw):
    """The update's memory as the kernel counts it, which no code in the process can change: the check runs alone in
    a child of its own, and grade.py compares that child's peak resident memory with another child's (grade.peak_rss):
    against="baseline", one that imports the release's stubs and builds the same inputs but calls nothing; against=
    "reference", one that runs the reference's update on them (the teacher's grader only: a student copy has no
    reference to run). Only the peak is judged (values: the other checks), with the grader's chunked head
    (harness.chunked_head) in place of the hand-in's head_logp: Problem 13 may hold its logits (a plain head keeps full
    marks there). Two micro-batches of mb sequences, 16 prompt and 64 completion tokens each, KL and entropy bonus on.

    The defaults, against the baseline: at V = 16384 one micro-batch's (tokens, V) float64 logits are 128 MiB, the
    allowance; the reference's update adds 50 MiB (gradients, the head's 4 MiB chunks, the autograd engine's start),
    one that holds the whole logits of a micro-batch 800 MiB."""
    S, Tp, Tc = 2 * mb, 16, 64
    prompts = [torch.randint(1, V, (Tp,), generator=g).tolist() for _ in range(S // 4) for _ in range(4)]
    completions = [torch.randint(1, V, (Tc,), generator=g).tolist() for _ in range(S)]
    seeds = torch.randint(0, 2**31, (2,), generator=g).tolist()
    policy, ref = (qwen2(g, V, hidden=hidden, positions=128, seed=s, layers=layers) for s in seeds)
    cfg = {**base, "group_size": 4, "micro_batch_size": mb, "max_response_len": Tc, "entropy_coef": 0.05,
           "kl_coef": 0.1, **kw}
    name = "peak memory, the kernel's count: " + ("no whole logits" if against == "baseline" else
                                                  "one micro-batch's graph at a time, none for the reference")
    return check("update", "train.update_minibatch",
                 [policy, ref, prompts, completions, torch.randn(S, generator=g, dtype=F64), None],
                 {"cfg": {"namespace": cfg}, "pad_id": 0, "device": "cpu", "world": 1}, name, chunk_bytes=4 << 20,
                 dist=True, chunked_head="fgrpo_utils.logprob.head_logp",
                 peak={"against": against, "allowance": allowance or mb * Tc * V * 8})


def graph_peak(g, base):
    """The graph's memory, against the reference's own child, which the harness's own counts in the hand-in's process
    (SavedBytes, Frozen) also see but cannot defend. At 12 layers of width 64, rows padded (a packed micro-batch's
    (tokens, tokens) mask would outweigh the layers), the reference's update holds 280 MiB over a baseline; one that
    keeps two micro-batches' graphs (one backward at the end) or a graph of the reference model (its forward with
    gradients, even detached after) 240-250 MiB more; the six correct alternatives within 1 MiB of the reference.
    The allowance, 64 MiB, leaves room for a hand-in's own imports."""
    return peak(g, base, V=256, hidden=64, layers=12, mb=32, against="reference", allowance=64 << 20,
                padding_free=False)


def teacher_only(c):
    """A check only the teacher's grader can run (peak against the reference): left out of expected.json."""
    return c.get("peak", {}).get("against") == "reference"


BUILDERS = {"group_advantages": group_advantages, "success_rate": success_rate, "focal_weight": focal_weight,
            "focal_advantages": focal_advantages, "focal_properties": focal_properties, "token_mean": token_mean,
            "aggregate": aggregate, "clip_bounds": clip_bounds, "policy_loss": policy_loss, "kl_k3": kl_k3,
            "tail_miss": tail_miss, "pass_at_k": pass_at_k, "logprobs": logprobs, "maze_reward": maze_reward,
            "update": update}


def checks(seed):
    """{problem: [check]} of a seed, each problem's inputs drawn on their own (a stand-in's recorded
    answers for one problem are never the answers to another's check)."""
    assert set(BUILDERS) == {pid for pid, *_ in PROBLEMS}, "a problem without checks, or checks without a problem"
    out = {pid: BUILDERS[pid](torch.Generator().manual_seed(seed * 1000 + i)) for i, (pid, *_) in enumerate(PROBLEMS)}
    out[harness.RL] = [{"problem": harness.RL, "name": "RL steps", "call": "train.rl_step", "seed": seed}]
    return out


def answer(all_checks, modules):
    """Run the reference on every check, in this process: fill in each stand-in's table from the
    reference's own calls and return {problem: [result]}."""
    results = {}
    for pid, cs in all_checks.items():
        results[pid] = []
        for c in cs:
            torch.manual_seed(0)
            if pid == harness.RL:
                results[pid].append(harness.rl_run(modules, c["seed"]))
                continue
            if c.get("peak"):                       # measured when graded (grade.peak_rss), not answered here
                results[pid].append({})
                continue
            r, tables = harness.run_check(modules, c, record=True)
            if harness.unfinished(r):               # the reference's own ranks out of time: a loaded machine
                r, tables = harness.run_check(modules, harness.more_time(c), record=True)
            if harness.unfinished(r) or str(r.get("error", "")).startswith(harness.GRADER_FAILURE):
                raise RuntimeError(f"{harness.GRADER_FAILURE}: the reference's own check {pid}, {c['name']!r} did not "
                                   f"run ({r['error'][:200]}): never judged against that")
            r.pop("inputs_after", None)             # grade.py compares those with the check's own inputs
            for kind, t in tables.items():
                for name, calls in t.items():
                    c[kind][name] = calls
            assert "error" not in r or "properties" not in c, f"{pid}: the reference fails {c['name']}: {r['error']}"
            results[pid].append(r)
    return results


# -----------------------------------------------------------------------------
# expected.json: checks and results as JSON (tensors as {"tensor": list, "dtype"}, exact for float64)

def to_json(v):
    if isinstance(v, torch.Tensor):
        return {"tensor": v.tolist(), "dtype": str(v.dtype).removeprefix("torch.")}
    if isinstance(v, dict):
        return {k: to_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_json(x) for x in v]
    return v


def from_json(v):
    if isinstance(v, dict) and set(v) == {"tensor", "dtype"}:
        return torch.tensor(v["tensor"], dtype=getattr(torch, v["dtype"]))
    if isinstance(v, dict):
        return {k: from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json(x) for x in v]
    return v


def agree(a, b):
    """Is parsed fixture a the fixture b, up to the last bits another CPU changes (harness.same on each
    float and tensor)? Structure, keys, lengths, dtypes, integers and strings must be equal."""
    if isinstance(b, dict) and set(b) == {"tensor", "dtype"}:
        return isinstance(a, dict) and set(a) == set(b) and a["dtype"] == b["dtype"] \
            and harness.same(from_json(a), from_json(b))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(agree(a[k], b[k]) for k in b)
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(map(agree, a, b))
    if isinstance(b, float):
        return type(a) is float and harness.same(a, b)
    return type(a) is type(b) and a == b


def fixture_agrees(a, b):
    """Is parsed expected.json a the fixture b? agree on all but the RL run, whose metrics (float32 through
    a few updates) need only agree within harness.RL_TOL, as grade.judge_rl judges a hand-in's run."""
    def rest(f):
        return {**f, "results": {k: v for k, v in f["results"].items() if k != harness.RL}}
    try:
        runs = [(x["steps"], y["steps"])
                for x, y in zip(a["results"][harness.RL], b["results"][harness.RL], strict=True)]
        return agree(rest(a), rest(b)) and all(rl_steps_agree(got, want) for got, want in runs)
    except (KeyError, TypeError, AttributeError, ValueError):         # ValueError: runs of unequal counts
        return False


def rl_steps_agree(got, want):
    """Each step of one RL run: the same task, and every metric within harness.rl_same of want's."""
    return isinstance(got, list) and len(got) == len(want) and all(
        isinstance(s, dict) and s.get("task") == w["task"] and all(harness.rl_same(s.get(k), want, i, k)
                                                                   for k in harness.RL_METRICS)
        for i, (s, w) in enumerate(zip(got, want)))


def public_text(modules):
    cs = {pid: [c for c in cs if not teacher_only(c)] for pid, cs in checks(0).items()}
    results = answer(cs, modules)
    return json.dumps(to_json({"about": "the public checks (seed 0) with the reference's results; written by "
                                        "make_expected.py, do not edit", "checks": cs, "results": results}),
                      separators=(",", ":")) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", default="false", choices=["true", "false"],
                   help="compare with the committed expected.json instead of writing it")
    check_only = p.parse_args().check == "true"
    modules = harness.graded_modules()
    stubbed = [m.__file__ for m in modules.values() if "your code here (Problem" in Path(m.__file__).read_text()]
    if stubbed:
        print(f"error: {stubbed[0]} is a student copy (stubbed); run this in the reference repo", file=sys.stderr)
        sys.exit(2)
    text = public_text(modules)
    if check_only:
        same = OUT.exists() and fixture_agrees(json.loads(OUT.read_text()), json.loads(text))
        print(f"{OUT}: {'up to date' if same else 'STALE: rerun python assignments/make_expected.py'}")
        sys.exit(0 if same else 1)
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
