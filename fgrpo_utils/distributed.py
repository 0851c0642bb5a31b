"""
The process group and what crosses it: torchrun's ranks (one process gets a group of one, so one CPU
process and 8 GPUs run the same lines), what --device auto means, sums and maxima over ranks, the gloo
group that slow I/O waits in, and the update's balance over ranks: each rank's rows cut into as many
passes of about equal tokens (token_bins), whole groups moved between ranks (balance_ranks).
"""
import os
import socket
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from fgrpo_utils.cli import refuse

def init_dist(device):
    """(rank, world, device) of this process, its process group started (nccl on CUDA, gloo on the CPU)."""
    if "RANK" not in os.environ:                       # plain `python train.py`: a group of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "auto":
        device = auto_device()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = f"cuda:{os.environ['LOCAL_RANK']}"
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    start_io_group()       # the gloo group with a long timeout that checkpoints and exports wait in
    return dist.get_rank(), dist.get_world_size(), torch.device(device)

# While rank 0 writes an export or deletes old checkpoints (tens of GB for a 7B), the other ranks wait in
# a gloo group of their own with a long timeout, never in the default group's (NCCL: 10 min). DCP saves
# and loads over it too: every rank writes its shards, and the slowest disk sets the pace.
IO_TIMEOUT = timedelta(hours=2)
IO_GROUP = None                  # start_io_group's; read it as distributed.IO_GROUP, never import the name

def start_io_group():
    """Create the gloo group for I/O waits; every rank calls it once, right after init_process_group."""
    global IO_GROUP
    IO_GROUP = dist.new_group(backend="gloo", timeout=IO_TIMEOUT)

def io_barrier():
    dist.barrier(group=IO_GROUP)

def print0(*args):
    if dist.get_rank() == 0:
        print(*args, flush=True)

def all_sum(x):
    """Sum a float or tensor over ranks (as float64 on the CPU, so gloo and nccl both work); x is left as it was."""
    t = torch.as_tensor(x, dtype=torch.float64).to(_comm_device(), copy=True)   # as_tensor alone may alias x
    dist.all_reduce(t)
    return t.cpu()

def all_max(x):
    t = torch.as_tensor(x, dtype=torch.float64).to(_comm_device(), copy=True)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu()

def _comm_device():
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"

def auto_device():
    """--device auto: CUDA when this torch sees a GPU, else the CPU, for one process only. Under torchrun a
    node without usable CUDA (a CPU build of torch, a driver older than its CUDA build needs) would become
    an N-rank CPU run holding N copies of the model in host RAM: exit 2 in one line, before any work."""
    if torch.cuda.is_available():
        return "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        try:
            driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
        except (OSError, IndexError):
            driver = "no NVIDIA driver found"
        refuse(f"--device auto: WORLD_SIZE {world} but no usable CUDA (torch {torch.__version__}, CUDA build "
               f"{torch.version.cuda or 'none'}, torch.cuda.is_available() False, driver: {driver}); "
               "pass --device cpu to force a CPU run")
    return "cpu"

def device_type(cfg):
    """"cuda" or "cpu": what --device auto means on this machine."""
    return cfg.device if cfg.device != "auto" else auto_device()

def batch_problems(cfg, world):
    """The global batch is fixed by config; the world size only changes each rank's share, which must
    be whole. check_run refuses the first of these, in one line."""
    return [f"--{name} {getattr(cfg, name)} must be divisible by the world size {world}"
            for name in ("prompts_per_step", "mini_batch_prompts") if getattr(cfg, name) % world]

# -----------------------------------------------------------------------------
# Rank balancing: each update waits for its busiest rank

def pass_rows(cfg, prompts, completions, seqs):
    """The rows `seqs` make in pack's layout, longest first, as (sequences, prompt columns, completion columns):
    a sequence each or, with --share_prompts, a group (its prompt once, then its N completions)."""
    rows = [([i], len(prompts[i]), len(completions[i])) for i in seqs]
    if cfg.share_prompts:
        groups = {}
        for i in seqs:
            groups.setdefault(i // cfg.group_size, []).append(i)
        rows = [(g, 0, len(prompts[g[0]]) + sum(len(completions[i]) for i in g)) for g in groups.values()]
    return sorted(rows, key=lambda r: -r[1] - r[2])

def pass_tokens(cfg, rows):
    """The tokens a pass of `rows` forwards: their sum (--padding_free), else rows x the longest row."""
    if not rows or (cfg.padding_free and not cfg.share_prompts):
        return sum(p + c for _, p, c in rows)
    return len(rows) * (max(r[1] for r in rows) + max(r[2] for r in rows))

def token_bins(cfg, rows, K):
    """`rows` (pass_rows') cut into K passes of about equal pass_tokens, costliest first, or None if they need
    more. A pass holds <= --micro_batch_size sequences and <= --micro_batch_tokens tokens, or one row alone.
    Padding-free: each row, longest first, into the cheapest pass it fits (LPT). Padded, or where that fails:
    runs of the sorted rows, each within the lowest cost that needs <= K runs, as mixing lengths adds
    padding (the maze's 32 groups of 8 in passes of 64: 9% padding sorted, 23% in input order)."""
    size, cap = cfg.micro_batch_size, cfg.micro_batch_tokens
    by_cost = lambda b: -pass_tokens(cfg, b)                                         # noqa: E731
    if cfg.padding_free and not cfg.share_prompts:
        bins, load = [[] for _ in range(K)], [0] * K
        for row in rows:
            t = row[1] + row[2]
            to = [j for j in range(K) if not bins[j] or len(bins[j]) < size and not (cap and load[j] + t > cap)]
            if not to:
                break
            j = min(to, key=load.__getitem__)
            bins[j].append(row)
            load[j] += t
        else:
            return sorted(bins, key=by_cost)

    def runs(T):              # the sorted rows in runs of <= size sequences and <= min(T, cap) tokens each
        out = []
        for row in rows:      # the row joins the last run if it still fits, else starts a new one
            b = out[-1] + [row] if out else []
            grow = b and sum(len(r[0]) for r in b) <= size and pass_tokens(cfg, b) <= min(T, cap or T)
            out[-1:] = [b] if grow else out[-1:] + [[row]]
        return out
    cut = runs(least(lambda T: len(runs(T)) <= K, 0, pass_tokens(cfg, rows)))
    return None if len(cut) > K else sorted(cut + [[] for _ in range(K - len(cut))], key=by_cost)

def least(ok, lo, hi):
    """The least x in [lo, hi] with ok(x), for ok false then true (binary search; hi if none)."""
    while lo < hi:
        lo, hi = (lo, (lo + hi) // 2) if ok((lo + hi) // 2) else ((lo + hi) // 2 + 1, hi)
    return hi

def assign_groups(costs, world):
    """costs[r]: the tokens each of rank r's groups forwards (0: skipped). Returns dest[r][j], the rank group
    j of rank r goes to: every rank keeps its groups, largest first, while its load stays within the mean;
    the rest go, largest first, to the least-loaded rank (LPT: the busiest ends within one group of the
    mean). Nothing moves unless that lowers the busiest load and idles no rank. Deterministic: ranks agree."""
    mean = sum(map(sum, costs)) / world
    dest, load, pool = [[r] * len(c) for r, c in enumerate(costs)], [0] * world, []
    for r, cs in enumerate(costs):
        for j in sorted(range(len(cs)), key=lambda j: -cs[j]):
            if load[r] + cs[j] <= mean:
                load[r] += cs[j]
            else:
                pool.append((-cs[j], r, j))
    for c, r, j in sorted(pool):
        dest[r][j] = min(range(world), key=lambda q: (load[q], q))
        load[dest[r][j]] -= c
    if max(load) >= max(map(sum, costs)) or len(set(sum(dest, []))) < world:
        return [[r] * len(c) for r, c in enumerate(costs)]
    return dest

def balance_ranks(cfg, mbs, live, rank, world):
    """Collective, for world > 1. Move whole live groups (with their prompts, completions, A and engine log-probs)
    between ranks, mini-batch by mini-batch, so that every rank forwards about as many tokens; the skipped stay,
    so the counts the loss divides by, and the gradient, are unchanged (up to the order of the sum). mbs: this
    rank's mini-batches, each (prompts, completions, A, engine log-probs), N consecutive sequences a group;
    live[k]: the sequences of mbs[k] the update forwards. Returns (mbs after the moves, back, busiest): back(rows)
    sends per-sequence results in mbs' order back to their ranks, each in its own order; busiest, (before,
    after) of the busiest rank's tokens over the mean rank's, summed over mini-batches."""
    N, share = cfg.group_size, cfg.share_prompts
    keep = [set(x) for x in live]
    offset = [sum(len(mb[1]) for mb in mbs[:k]) for k in range(len(mbs))]     # where mbs[k] starts in this rank's

    def cost(k, s):                                   # the tokens group s of mbs[k] forwards; 0 if it is skipped
        P, C = mbs[k][0][s:s + N], mbs[k][1][s:s + N]
        return (sum(map(len, C)) + sum(map(len, P[:1] if share else P))) * (s in keep[k])

    def group(k, s):
        return tuple(x[s:s + N] for x in mbs[k])     # A's slice is a view into the whole A

    def exchange(outgoing):                # outgoing[q] is for rank q; returns what each rank sent here
        everything = [None] * world        # all the moved groups, a small share of the step: to every rank
        dist.all_gather_object(everything, outgoing)
        return [sent[rank] for sent in everything]
    starts = [list(range(0, len(mb[1]), N)) for mb in mbs]
    everyone = [None] * world
    dist.all_gather_object(everyone, [[cost(k, s) for s in ss] for k, ss in enumerate(starts)])
    dests = [assign_groups([everyone[r][k] for r in range(world)], world) for k in range(len(mbs))]
    outgoing = [[] for _ in range(world)]
    for k, ss in enumerate(starts):
        for j, s in enumerate(ss):
            if dests[k][rank][j] != rank:
                P, C, A, E = group(k, s)
                outgoing[dests[k][rank][j]].append((k, s, P, C, A.clone(), E))
    arrived = exchange(outgoing)
    got = {(r, k, s): g for r in range(world) for k, s, *g in arrived[r]}
    out, origin = [], []
    for k, ss in enumerate(starts):
        groups = [(r, s) for r in range(world) for j, s in enumerate(ss) if dests[k][r][j] == rank]
        parts = [group(k, s) if r == rank else got[(r, k, s)] for r, s in groups]
        P, C, A, E = ([x for p in parts for x in p[j]] for j in range(4))
        out.append((P, C, torch.stack(A), E))
        origin += [(r, offset[k] + s + i) for r, s in groups for i in range(N)]

    def back(rows):
        mine, away = [None] * sum(len(mb[1]) for mb in mbs), [[] for _ in range(world)]     # this rank's own
        for (r, i), row in zip(origin, rows):
            if r == rank:
                mine[i] = row
            else:
                away[r].append((i, row))
        for i, row in (x for part in exchange(away) for x in part):
            mine[i] = row
        return mine

    def slowest(load_of):
        loads = [[sum(load_of(r, k)) for r in range(world)] for k in range(len(mbs))]
        return sum(map(max, loads)) / max(sum(map(sum, loads)) / world, 1)
    before = slowest(lambda r, k: everyone[r][k])
    after = slowest(lambda r, k: [c for q in range(world) for c, d in zip(everyone[q][k], dests[k][q]) if d == r])
    return out, back, (before, after)
