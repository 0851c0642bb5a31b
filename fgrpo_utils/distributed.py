"""
The process group and what crosses it: torchrun's ranks (one process gets a group of one, so one CPU
process and 8 GPUs run the same lines), what --device auto means, sums and maxima over ranks, the gloo
group that slow I/O waits in, and rank balancing.
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
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
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

def balance_ranks(cfg, prompts, completions, A, live, num_minibatches, rank, world, carry=None):
    """Collective. Move whole live groups between ranks, mini-batch by mini-batch, so that every rank forwards
    about as many tokens: skip_dead's skipped groups and unlike completion lengths leave some far busier.
    A moved group takes its prompt, completions and advantages along; the skipped stay, so the global counts
    the loss divides by, and the gradient with them, are unchanged (up to the order of the sum). live: the
    sequences the update forwards (train.live_rows); carry: a per-sequence list that moves with its group (the
    engine's log-probs), or None. Returns (mbs, back, busiest): mbs, this rank's mini-batches, each (prompts,
    completions, A, origin, carried), origin[i] the (rank, index there) sequence i came from, carried[i] its carry
    (None without); back(rows) sends per-sequence results in mbs' order (log-probs, None for a skipped one) back
    to their ranks, in each one's own order; busiest, (before, after) of the busiest rank's tokens over the mean
    rank's, summed over mini-batches."""
    N, per_mb = cfg.group_size, len(completions) // num_minibatches
    keep = set(live)
    carry = carry if carry is not None else [None] * len(completions)
    share = cfg.share_prompts

    def cost(s):
        if s not in keep:
            return 0
        return sum(len(c) for c in completions[s:s + N]) + sum(len(p) for p in prompts[s:s + N][:1 if share else N])
    def gather(obj):                                  # every rank's obj; no collective in a group of one
        out = [obj] * world
        if world > 1:
            dist.all_gather_object(out, obj)
        return out

    def exchange(outgoing):                           # outgoing[q] goes to rank q only; returns what each rank sent here
        if world == 1:
            return outgoing
        arrived = []
        for src in range(world):
            part = [None]
            dist.scatter_object_list(part, outgoing if src == rank else None, src=src)
            arrived.append(part[0])
        return arrived
    starts = [list(range(k * per_mb, (k + 1) * per_mb, N)) for k in range(num_minibatches)]
    everyone = gather([[cost(s) for s in mb] for mb in starts])
    dests = [assign_groups([everyone[r][k] for r in range(world)], world) for k in range(num_minibatches)]
    outgoing = [[] for _ in range(world)]
    for k, mb in enumerate(starts):
        for j, s in enumerate(mb):
            if dests[k][rank][j] != rank:
                outgoing[dests[k][rank][j]].append((k, s, prompts[s:s + N], completions[s:s + N],
                                                        A[s:s + N].clone(), carry[s:s + N]))  # a view: all A
    arrived = exchange(outgoing)
    got = {(r, k, s): group for r in range(world) for k, s, *group in arrived[r]}
    mbs = []
    for k in range(num_minibatches):
        groups = [(r, s) for r in range(world) for j, s in enumerate(starts[k]) if dests[k][r][j] == rank]
        P, C, adv, origin, E = [], [], [], [], []
        for r, s in groups:
            p, c, a, e = ((prompts[s:s + N], completions[s:s + N], A[s:s + N], carry[s:s + N]) if r == rank
                          else got[(r, k, s)])
            P += p
            C += c
            E += e
            adv.append(a)
            origin += [(r, s + i) for i in range(N)]
        mbs.append((P, C, torch.cat(adv), origin, E))

    def back(rows):
        out, away = [None] * len(completions), [[] for _ in range(world)]
        for (r, i), row in zip((o for mb in mbs for o in mb[3]), rows):
            if r == rank:
                out[i] = row
            else:
                away[r].append((i, row))
        for i, row in (x for part in exchange(away) for x in part):
            out[i] = row
        return out

    def slowest(load_of):
        loads = [[sum(load_of(r, k)) for r in range(world)] for k in range(num_minibatches)]
        return sum(map(max, loads)) / max(sum(map(sum, loads)) / world, 1)
    before = slowest(lambda r, k: everyone[r][k])
    after = slowest(lambda r, k: [c for q in range(world) for c, d in zip(everyone[q][k], dests[k][q]) if d == r])
    return mbs, back, (before, after)
