"""
Benchmark: what FSDP's lockstep costs the update at the paper's batch, from the trainer's own balancing and
micro-batching code, on --nproc real ranks of a gloo group on this machine (no GPU, no model).

    python bench/lockstep.py --nproc 8                 # the paper's setting: ~15-30 s on 2 cores
    python bench/lockstep.py --nproc 2 --prompts_per_step 16 --mini_batch_prompts 8 --draws 1   # a smoke run

FSDP's all-gathers and reduce-scatters make every forward and backward pass wait for the slowest rank, so
a mini-batch costs the sum over passes of the largest rank's pass, not the largest rank's total. Printed,
per length mix, as mean (min-max) over --draws seeded draws: balance/lockstep (train.lockstep, as
metrics.jsonl logs it: sum over the update's passes of the largest rank's pass tokens over the mean rank's),
the same with the old-log-prob passes added, balance/busiest after and before balance_ranks, and the passes
per mini-batch; then the same figures for the cut train.micro_batches made before (each rank longest first
on its own, idle passes up to the most any rank made). At 8 ranks, 5 draws (~15 s on 2 cores):

    early (mean 1,000): balance/lockstep 1.074 (1.053-1.095), old greedy cut 1.240 (1.194-1.321)
    late  (mean 2,500): balance/lockstep 1.046 (1.037-1.055), old greedy cut 1.296 (1.259-1.319)

with balance/busiest 1.049 / 1.045 (1.50 / 1.41 before balance_ranks) and 6.5 / 6.7 passes a mini-batch
(greedy: 7.4 / 9.9). Issue 45's own simulation of the greedy cut, update and old log-probs together: 1.27 / 1.31.

Each draw is one step of train.Config's defaults: --prompts_per_step 256 in mini-batches of 64, N = 8,
--micro_batch_size 8, --micro_batch_tokens 16384, padding-free. The prompts are DeepScaleR's
(data/train/deepscaler_partial.jsonl, $FGRPO_DATA or ../shared/data) through reward.format_prompt with
Qwen2.5's chat template, at most --max_prompt_len tokens; each rank takes train.prompt_indices' share. Each
completion's length is drawn on its own, log-normal with mean --means (one mix each: "early" 1,000 and
"late" 2,500 tokens) and --sigma 1.0, capped at --max_response_len 8,192 (the cap lowers the mean a little:
the realised one is printed). A group is live with probability --live (0.65), else its A are 0 for all N and
live_rows leaves it out. The --nproc processes are forked after the imports, join a gloo group on 127.0.0.1
and run distributed.balance_ranks, train.live_rows, train.micro_batches and train.lockstep as train.rl_step
does: every collective is real.
"""
import math
import multiprocessing
import os
import random
import socket
import statistics
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reward  # noqa: E402
import train  # noqa: E402
from fgrpo_utils import distributed  # noqa: E402
from fgrpo_utils.cli import check, check_min, data_dir, parse_config  # noqa: E402


@dataclass
class Config:
    nproc: int = 8                    # ranks, each a process in one gloo group on 127.0.0.1
    draws: int = 5                    # seeded steps per mix, averaged (min-max printed beside)
    means: tuple[int, ...] = (1000, 2500)   # mean completion tokens of each mix ("early", "late")
    sigma: float = 1.0                # of the log-normal completion length
    live: float = 0.65                # share of groups with signal; the rest have A = 0 for all N
    prompts_per_step: int = 256       # train.py's flags, at their defaults
    mini_batch_prompts: int = 64
    group_size: int = 8
    micro_batch_size: int = 8
    micro_batch_tokens: int = 16384
    padding_free: bool = True
    share_prompts: bool = False
    max_prompt_len: int = 1024
    max_response_len: int = 8192
    seed: int = 0

    def __post_init__(self):
        check_min(self, 1, "nproc", "draws", "prompts_per_step", "mini_batch_prompts", "group_size",
                  "micro_batch_size", "max_prompt_len", "max_response_len")
        check_min(self, 0, "micro_batch_tokens", "seed", "sigma")
        check(0 < self.live <= 1, f"--live {self.live}: must be in (0, 1]")
        check(all(m >= 1 for m in self.means), f"--means {self.means}: each must be >= 1")
        for name in ("prompts_per_step", "mini_batch_prompts"):
            check(getattr(self, name) % self.nproc == 0, f"--{name} must be divisible by --nproc {self.nproc}")
        check(self.prompts_per_step % self.mini_batch_prompts == 0,
              "--prompts_per_step must be a multiple of --mini_batch_prompts")


def trainer_config(cfg):
    """train.Config's defaults with this benchmark's batch flags (the functions used read only these)."""
    base = {f.name: f.default for f in fields(train.Config)}
    return SimpleNamespace(**{**base, **{f.name: getattr(cfg, f.name) for f in fields(Config)
                                         if f.name in base}})


def draw_steps(cfg):
    """[(mix mean, prompts, lengths, live)] per mix and draw: the whole step's prompts (token ids), the
    (P, N) completion lengths and each group's liveness, the same for any --nproc."""
    tok = reward.load_tokenizer(str(data_dir() / "tokenizers" / "qwen2.5"))
    rows = reward.load_jsonl(data_dir() / "train" / "deepscaler_partial.jsonl")
    steps = []
    for d in range(cfg.draws):
        rng = random.Random(f"{cfg.seed}-{d}")
        prompts = []
        for r in rng.sample(rows, len(rows)):
            ids = tok(reward.format_prompt(tok, r["problem"], "qwen2.5"), add_special_tokens=False)["input_ids"]
            if len(ids) <= cfg.max_prompt_len:                 # reward.filter_math_train's length check
                prompts.append(ids)
            if len(prompts) == cfg.prompts_per_step:
                break
        for mean in cfg.means:
            mu = math.log(mean) - cfg.sigma ** 2 / 2           # a log-normal's mean is exp(mu + sigma^2 / 2)
            lengths = [[min(cfg.max_response_len, max(1, round(rng.lognormvariate(mu, cfg.sigma))))
                        for _ in range(cfg.group_size)] for _ in prompts]
            steps.append((mean, prompts, lengths, [rng.random() < cfg.live for _ in prompts]))
    return steps


def greedy_micro_batches(cfg, prompts, completions, keep=None):
    """The cut train.micro_batches made before: each rank on its own, longest first, a pass closed when the
    next row would break a cap; then idle passes ([]) up to the most any rank made."""
    out = [[]]
    for row in train.pass_rows(cfg, prompts, completions, range(len(completions)) if keep is None else sorted(keep)):
        grown = out[-1] + [row]
        if out[-1] and (sum(len(r[0]) for r in grown) > cfg.micro_batch_size or cfg.micro_batch_tokens
                        and train.pass_tokens(cfg, grown) > cfg.micro_batch_tokens):
            out.append([row])
        else:
            out[-1] = grown
    K = int(distributed.all_max(len(out)))
    return [[i for r in b for i in r[0]] for b in out] + [[]] * (K - len(out))


def lockstep_of(cfg, passes, world):
    """train.lockstep's ratio for any passes [(prompts, completions, pass)]: the same K on every rank."""
    costs = torch.tensor([float(train.pass_tokens(cfg, train.pass_rows(cfg, P, C, mb))) for P, C, mb in passes],
                         dtype=torch.float64)
    return float(world * distributed.all_max(costs).sum() / distributed.all_sum(costs).sum().clamp(min=1))


def one_step(cfg, step, rank, world):
    """This rank's figures for one drawn step (every rank calls it: collective)."""
    mean, all_prompts, all_lengths, all_live = step
    N, idx = cfg.group_size, train.prompt_indices(cfg, 0, rank, world)
    prompts = [all_prompts[i] for i in idx for _ in range(N)]
    completions = [[0] * n for i in idx for n in all_lengths[i]]
    A = torch.tensor([float(all_live[i]) for i in idx for _ in range(N)])       # != 0: live
    K = cfg.prompts_per_step // cfg.mini_batch_prompts
    S = len(completions) // K                          # train.rl_step's mini-batches, then its balancing
    mbs = [(prompts[k * S:(k + 1) * S], completions[k * S:(k + 1) * S], A[k * S:(k + 1) * S], [None] * S)
           for k in range(K)]
    mbs, _, (before, after) = distributed.balance_ranks(cfg, mbs, [train.live_rows(cfg, mb[2]) for mb in mbs],
                                                        rank, world)
    out = {"mean": mean, "busiest_before": before, "busiest": after, "lockstep": train.lockstep(cfg, mbs, world)}
    old_P, old_C = [p for mb in mbs[1:] for p in mb[0]], [c for mb in mbs[1:] for c in mb[1]]
    old_keep = train.live_rows(cfg, torch.cat([mb[2] for mb in mbs[1:]])) if K > 1 else []
    for name, cut in (("new", train.micro_batches), ("old", greedy_micro_batches)):
        update = [(P, C, mb) for P, C, adv, _ in mbs for mb in cut(cfg, P, C, train.live_rows(cfg, adv))]
        old = [(old_P, old_C, mb) for mb in cut(cfg, old_P, old_C, old_keep)] if K > 1 else []
        out[name] = {"lockstep": lockstep_of(cfg, update, world), "with_old": lockstep_of(cfg, update + old, world),
                     "passes": len(update) / K}
    assert abs(out["new"]["lockstep"] - out["lockstep"]) < 1e-9          # the bench's ratio is the trainer's
    return out


def worker(rank, cfg, port, steps, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cfg.nproc)
    try:
        tcfg = trainer_config(cfg)
        results = [one_step(tcfg, step, rank, cfg.nproc) for step in steps]
        if rank == 0:
            queue.put(results)
    finally:
        dist.destroy_process_group()


def spread(values, fmt="{:.3f}"):
    return f"{fmt.format(statistics.mean(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main(cfg):
    os.environ["TOKENIZERS_PARALLELISM"] = "false"     # the ranks are forked after tokenizing
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # loopback only
    steps = draw_steps(cfg)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, cfg, port, steps, queue)) for r in range(cfg.nproc)]
    for p in procs:
        p.start()
    results = queue.get()                               # before join: a full pipe would block rank 0
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        sys.exit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
    print(f"{cfg.nproc} ranks, {cfg.prompts_per_step} prompts a step in mini-batches of {cfg.mini_batch_prompts}, "
          f"N = {cfg.group_size}, <= {cfg.micro_batch_size} sequences and <= {cfg.micro_batch_tokens} tokens a pass, "
          f"{'padding-free' if cfg.padding_free else 'padded'}; {cfg.draws} draws, mean (min-max)")
    for mean in cfg.means:
        rs = [r for r in results if r["mean"] == mean]
        lens = [n for step in steps if step[0] == mean for group in step[2] for n in group]
        print(f"responses log-normal, mean {mean} (sigma {cfg.sigma}, capped at {cfg.max_response_len}: realised "
              f"{statistics.mean(lens):.0f}), {cfg.live:.0%} of groups live:")
        print(f"  balance/lockstep {spread([r['lockstep'] for r in rs])}, with old log-probs "
              f"{spread([r['new']['with_old'] for r in rs])}; balance/busiest {spread([r['busiest'] for r in rs])}, "
              f"before balancing {spread([r['busiest_before'] for r in rs])}; passes per mini-batch "
              f"{spread([r['new']['passes'] for r in rs], '{:.2f}')}")
        print(f"  old greedy cut:  lockstep {spread([r['old']['lockstep'] for r in rs])}, with old log-probs "
              f"{spread([r['old']['with_old'] for r in rs])}; passes per mini-batch "
              f"{spread([r['old']['passes'] for r in rs], '{:.2f}')}")
    return results


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
