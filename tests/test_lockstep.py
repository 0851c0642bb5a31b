"""The lockstep-balanced update: every rank makes as many passes per mini-batch, each rank's rows cut into
token-balanced passes (train.micro_batches), balance/lockstep says what the lockstep costs, and the gradient
is the one-pass gradient. `python -m pytest -q tests/test_lockstep.py`

Several ranks run as processes of one gloo group (on_ranks); the pure packing runs without one, the
collective's max (train.all_max) replaced by the max over the ranks simulated.
"""
import importlib.util
import multiprocessing
import pickle
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import train
from fgrpo_utils import distributed, policy
from fgrpo_utils.metrics import step_metrics
from test_train_scale import ENV, FakeEngine, small_cfg, tiny_loader, tiny_qwen

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = [dict(padding_free=True, share_prompts=False), dict(padding_free=False, share_prompts=False),
           dict(padding_free=False, share_prompts=True)]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_lockstep", ROOT / "bench" / "lockstep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def on_ranks(world, fn, folder, *args):
    """fn(rank, world, *args) on `world` processes in one gloo group: [each rank's return]. They fork from
    multiprocessing's fork server, a fresh process with this module imported, not from pytest's: a fork of
    a process that has run other tests can inherit a lock some thread held, and hang."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, fn, folder, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = dict(queue.get(timeout=300) for _ in range(world))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    got = {r: pickle.loads(b) for r, b in got.items()}
    for r in range(world):
        if isinstance(got[r], Exception):
            raise got[r]
    return [got[r] for r in range(world)]


def rank_main(rank, world, fn, folder, args, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=world)
    try:
        out = fn(rank, world, *args)
    except BaseException as e:             # noqa: BLE001  (reported by the parent, with its rank)
        out = RuntimeError(f"rank {rank}: {e!r}")
    finally:
        dist.destroy_process_group()
    # bytes: torch's queue pickler would share tensors by file descriptor, which this process, gone by the
    # time the parent reads them, could not hand over
    queue.put((rank, pickle.dumps(out)))


def draw(rng, groups, N, dead=0.0, long=8192, mean=1000):
    """One rank's (prompts, completions, A): `groups` groups of N, log-normal completion lengths (sigma 1)."""
    prompts, completions, A = [], [], []
    for _ in range(groups):
        prompt = [5] * rng.randint(20, 300)
        live = rng.random() >= dead
        for _ in range(N):
            prompts.append(prompt)
            completions.append([7] * min(long, max(1, int(rng.lognormvariate(0, 1) * mean / 1.65))))
            A.append(rng.choice([-1.0, 0.5, 1.0]) if live else 0.0)
    return prompts, completions, torch.tensor(A)


def cut_on_ranks(cfg, ranks, cut, monkeypatch):
    """Each simulated rank's passes of its live rows by `cut` (train.micro_batches, or the bench's old greedy
    cut), its one collective (all_max) answered with the max over the ranks of what each passes it."""
    keeps = [train.live_rows(cfg, A) for _, _, A in ranks]
    monkeypatch.setattr(train, "all_max", lambda x: torch.tensor(float(x)))          # each rank's own count
    monkeypatch.setattr(distributed, "all_max", lambda x: torch.tensor(float(x)))
    K = max(len(cut(cfg, P, C, keep)) for (P, C, _), keep in zip(ranks, keeps))
    calls = []
    most = lambda x: (calls.append(float(x)), torch.tensor(float(K)))[1]               # noqa: E731
    monkeypatch.setattr(train, "all_max", most)
    monkeypatch.setattr(distributed, "all_max", most)
    out = [cut(cfg, P, C, keep) for (P, C, _), keep in zip(ranks, keeps)]
    assert len(calls) == len(ranks) and max(max(calls), 1) == K                # one collective a rank
    return out


def lockstep_of(cfg, ranks, passes):
    """sum_j max_r tokens(r, j) / sum_j mean_r tokens(r, j), computed here without a collective."""
    costs = [[train.pass_tokens(cfg, train.pass_rows(cfg, P, C, mb)) for mb in mbs]
             for (P, C, _), mbs in zip(ranks, passes)]
    return sum(map(max, zip(*costs))) / (sum(map(sum, costs)) / len(costs))


# -----------------------------------------------------------------------------
# (a) the same pass count everywhere, within the caps, each kept sequence once

@pytest.mark.parametrize("layout", LAYOUTS, ids=["flat", "padded", "shared"])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_every_rank_makes_as_many_passes_within_the_caps(layout, world, monkeypatch):
    rng = random.Random(world)
    for trial in range(12):
        N = rng.choice([2, 4, 8])
        cfg = small_cfg(group_size=N, micro_batch_size=rng.choice([1, 3, 8, 16, 64]),
                        micro_batch_tokens=rng.choice([0, 1, 500, 4000, 16384]), **layout)
        ranks = [draw(rng, rng.randint(0, 5), N, dead=rng.choice([0.0, 0.35, 1.0]), mean=rng.choice([30, 1000]))
                 for _ in range(world)]
        if world > 1 and trial % 3 == 0:                          # a rank with nothing live
            P, C, A = ranks[0]
            ranks[0] = (P, C, torch.zeros_like(A))
        passes = cut_on_ranks(cfg, ranks, train.micro_batches, monkeypatch)
        assert len({len(p) for p in passes}) == 1 and len(passes[0]) >= 1, [len(p) for p in passes]
        for (P, C, A), mbs in zip(ranks, passes):
            keep = train.live_rows(cfg, A)
            assert sorted(i for mb in mbs for i in mb) == keep                  # each kept sequence once
            costs = [train.pass_tokens(cfg, train.pass_rows(cfg, P, C, mb)) for mb in mbs]
            assert costs == sorted(costs, reverse=True)                         # costliest first
            for mb, cost in zip(mbs, costs):
                rows = train.pass_rows(cfg, P, C, mb)
                if cfg.share_prompts:                                           # whole groups
                    assert all(r[0] == list(range(r[0][0], r[0][0] + N)) for r in rows)
                if len(rows) > 1:                                               # a row over a cap goes alone
                    assert len(mb) <= cfg.micro_batch_size, (mb, cfg)
                    assert not cfg.micro_batch_tokens or cost <= cfg.micro_batch_tokens, (cost, cfg)
            if not keep:
                assert all(mb == [] for mb in mbs)                              # idle passes only
    # deterministic: the same input, the same passes
    cfg = small_cfg(group_size=4, micro_batch_size=3, micro_batch_tokens=2000, **layout)
    P, C, A = draw(random.Random(0), 5, 4)
    monkeypatch.setattr(train, "all_max", lambda x: torch.tensor(float(x)))
    assert train.micro_batches(cfg, P, C) == train.micro_batches(cfg, list(P), list(C))


def test_passes_are_balanced_by_the_tokens_the_layout_forwards(monkeypatch):
    """Padding-free, a pass costs its tokens: one long and many short sequences, 4 passes, come out even.
    Padded, the passes stay runs of like lengths (mixing them would pad), within the same pass count."""
    prompts = [[5] * 10] * 16
    completions = [[7] * n for n in [900, 600, 500, 400, 300, 200, 200, 100, 100, 100, 90, 80, 70, 60, 50, 40]]
    monkeypatch.setattr(train, "all_max", lambda x: torch.tensor(4.0))
    flat = small_cfg(group_size=4, micro_batch_size=8, micro_batch_tokens=0, padding_free=True)
    costs = [train.pass_tokens(flat, train.pass_rows(flat, prompts, completions, mb))
             for mb in train.micro_batches(flat, prompts, completions)]
    assert len(costs) == 4 and max(costs) <= 1.01 * sum(costs) / 4, costs                # 990, 990, 990, 980
    padded = small_cfg(group_size=4, micro_batch_size=8, micro_batch_tokens=0, padding_free=False)
    mbs = train.micro_batches(padded, prompts, completions)
    assert len(mbs) == 4 and all(mb == list(range(mb[0], mb[-1] + 1)) for mb in mbs), mbs   # runs


def test_a_rank_its_rows_do_not_fit_in_the_common_count_pads_with_idle_passes(monkeypatch):
    """Should token_bins fail to fit a rank's rows into the K passes the busiest rank needs (it fitted them
    into fewer), the rank makes its own fewest passes and idles through the rest."""
    cfg = small_cfg(group_size=4, micro_batch_size=2, micro_batch_tokens=0)
    P, C, _ = draw(random.Random(1), 2, 4)
    real = train.token_bins
    monkeypatch.setattr(train, "token_bins", lambda cfg, rows, k: None if k == 7 else real(cfg, rows, k))
    monkeypatch.setattr(train, "all_max", lambda x: torch.tensor(7.0))
    mbs = train.micro_batches(cfg, P, C)
    assert len(mbs) == 7 and all(mbs[:4]) and mbs[4:] == [[], [], []] and sorted(sum(mbs, [])) == list(range(8))


# -----------------------------------------------------------------------------
# (b) the lockstep ratio where the old greedy cut is bad

def test_lockstep_is_small_where_greedy_cutting_is_not(monkeypatch):
    """Eight ranks of a paper-like mini-batch (64 groups of 8, 35% dead, lengths log-normal around 1,000
    tokens), whole groups first spread over the ranks as balance_ranks does (assign_groups): the sum over
    passes of the largest rank's pass is within 10% of the mean rank's, and within 5% of the busiest rank's
    total, while the old greedy cut (longest first on each rank, idle passes up to the most) waits 20% longer."""
    cfg = small_cfg(group_size=8, micro_batch_size=8, micro_batch_tokens=16384, padding_free=True)
    greedy = load_bench().greedy_micro_batches
    for seed in range(4):
        rng = random.Random(seed)
        groups = [draw(rng, 1, 8, dead=0.35) for _ in range(64)]
        cost = [sum(len(p) + len(c) for p, c in zip(P, C)) if A.any() else 0 for P, C, A in groups]
        dest = distributed.assign_groups([cost[r * 8:(r + 1) * 8] for r in range(8)], 8)
        ranks = []
        for r in range(8):
            mine = [groups[q * 8 + j] for q in range(8) for j in range(8) if dest[q][j] == r]
            ranks.append(([p for g in mine for p in g[0]], [c for g in mine for c in g[1]],
                          torch.cat([g[2] for g in mine])))
        new = lockstep_of(cfg, ranks, cut_on_ranks(cfg, ranks, train.micro_batches, monkeypatch))
        old = lockstep_of(cfg, ranks, cut_on_ranks(cfg, ranks, greedy, monkeypatch))
        totals = [sum(len(P[i]) + len(C[i]) for i in train.live_rows(cfg, A)) for P, C, A in ranks]
        busiest = max(totals) / (sum(totals) / len(totals))
        assert busiest <= new <= min(1.10, busiest + 0.05) and old >= 1.2, (seed, new, old, busiest)


# -----------------------------------------------------------------------------
# (c) the same gradient as one pass holding the whole mini-batch, at world sizes 1 and 2

def update_grads(rank, world, cases):
    """For each (layout, dead groups, caps): update_minibatch's whole gradient (float64), its metrics and this
    rank's pass count, on this rank's share of 4 groups of 4 (off-policy DAPO: ratios != 1, clipping acts)."""
    out = []
    for layout, dead, caps in cases:
        cfg = small_cfg(loss="dapo", **layout, **caps)
        model = policy.shard(tiny_qwen(2, vocab=97, hidden=32).double(), torch.device("cpu"))
        rng = random.Random(0)
        prompts, completions = [], []
        for g in range(4):
            prompt = [rng.randrange(3, 90) for _ in range(rng.randint(3, 9))]
            for _ in range(4):
                prompts.append(prompt)
                completions.append([rng.randrange(3, 90) for _ in range(rng.randint(2, 30))])
        A = torch.tensor([rng.choice([-1.0, -0.3, 0.4, 1.2]) for _ in range(16)], dtype=torch.float64)
        for g in dead:
            A[4 * g:4 * g + 4] = 0.0
        old = [-torch.rand(len(c), generator=torch.Generator().manual_seed(i), dtype=torch.float64) - 0.5
               for i, c in enumerate(completions)]
        mine = slice(rank * 16 // world, (rank + 1) * 16 // world)
        P, C, adv = prompts[mine], completions[mine], A[mine]
        stats, _ = train.update_minibatch(model, None, P, C, adv, old[mine], cfg=cfg, pad_id=0,
                                          device=torch.device("cpu"), world=world)
        passes = len(train.micro_batches(cfg, P, C, train.live_rows(cfg, adv)))
        out.append(({n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}, stats, passes))
    return out


def test_balanced_passes_give_the_one_pass_gradient(tmp_path):
    """update_minibatch's accumulated gradient over the balanced passes (3 sequences and 40 tokens a pass
    at most) equals that of one pass holding the whole mini-batch, within 1e-10 in float64, at world sizes
    1 and 2, in every layout, with all groups live, two dead, and rank 1 of 2 holding no live group."""
    one, small = dict(micro_batch_size=10 ** 6, micro_batch_tokens=0), dict(micro_batch_size=3, micro_batch_tokens=40)
    cases = [(layout, dead, caps) for layout in LAYOUTS for dead in [(), (1, 3), (2, 3)] for caps in (one, small)]
    got = {}
    for world in (1, 2):
        (tmp_path / str(world)).mkdir()
        got[world] = on_ranks(world, update_grads, tmp_path / str(world), cases)[0]
    ref = {(str(layout), dead): r for (layout, dead, caps), r in zip(cases, got[1]) if caps is one}
    for world in (1, 2):
        for (layout, dead, caps), (grads, stats, passes) in zip(cases, got[world]):
            want, want_stats, want_passes = ref[str(layout), dead]
            assert want_passes == 1 and max(g.abs().max() for g in want.values()) > 1e-4
            if caps is small and (world == 1 or not layout["share_prompts"]):     # (else a group a rank)
                assert passes >= 2, (world, layout, dead)
            for n, g in want.items():
                assert torch.allclose(grads[n], g, atol=1e-10, rtol=0), (world, layout, dead, caps, n)
            assert stats["loss/pg"] == pytest.approx(want_stats["loss/pg"], abs=1e-10)


# -----------------------------------------------------------------------------
# (d) bench/lockstep.py, small, and (e) the metric in a 2-rank rl_step's row

@pytest.mark.slow                                   # the Qwen2.5 tokenizer and DeepScaleR prompts: 10-20 s
def test_the_bench_prints_the_lockstep(data):
    """bench/lockstep.py on 2 real ranks, one small step: both mixes' figures, the old cut's beside them."""
    r = subprocess.run([sys.executable, "bench/lockstep.py", "--nproc", "2", "--prompts_per_step", "16",
                        "--mini_batch_prompts", "8", "--draws", "1"], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("balance/lockstep ") == 2 and r.stdout.count("old greedy cut") == 2, r.stdout
    assert "passes per mini-batch" in r.stdout, r.stdout


def step_row(rank, world):
    """One train.rl_step of a tiny policy (2 mini-batches of 2 groups of 4, fixed completions) on this rank:
    its metrics.jsonl row (step_metrics)."""
    cfg = small_cfg(prompts_per_step=4, mini_batch_prompts=2, micro_batch_size=2)
    model, _, _, opt = train.build_models(cfg, None, 0, torch.device("cpu"), load=tiny_loader(2))
    task = SimpleNamespace(prompt=lambda i: ([4, 5, 6, 4 + i % 3] * (1 + i % 2), None), max_new_tokens=8,
                           stop_token_ids=[1], score=lambda answers, comps: ([float(len(c) % 2) for c in comps], {}))
    r = train.rl_step(cfg, 0, task, model, None, FakeEngine(), opt, pad=0, device=torch.device("cpu"),
                      rank=rank, world=world)
    return step_metrics(r)


def test_a_two_rank_step_logs_the_lockstep(tmp_path):
    """At world size 2 a step's row holds balance/lockstep beside balance/busiest, the same on both ranks,
    and padding-free never below it (each rank's passes add up to its total)."""
    rows = on_ranks(2, step_row, tmp_path)
    for key in ("balance/lockstep", "balance/busiest", "balance/busiest_before"):
        assert rows[0][key] == rows[1][key] >= 1, (key, rows)
    assert rows[0]["balance/lockstep"] >= rows[0]["balance/busiest"] - 1e-9    # never below the busiest rank
