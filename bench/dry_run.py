"""
The headline run's update, measured before it runs: train.py's own update at the paper's shapes, on a CPU,
without allocating. PyTorch's fake tensors stand in for every tensor (shapes, dtypes and storages, no data)
and a fake process group of --nproc ranks for the others, so FSDP2 shards, all-gathers and reduce-scatters
as on 8 GPUs while this process plays rank 0 (the largest shard). Each phase's peak is read by torch's
MemTracker and set beside memory_plan.plan's phase for the same flags:

    python bench/dry_run.py --model ../shared/data/models/qwen2.5-7b --nproc 8             # all 28 layers
    python bench/dry_run.py --model ../shared/data/models/qwen2.5-7b --nproc 8 --layers 8  # 4 and 8, extrapolated
    python bench/dry_run.py --model ../shared/data/models/qwen2.5-7b --nproc 8 --max_response_len 4096

Any flag of `train.py --plan true` is taken (and checked) the same way. What runs is the trainer's: the
model built on the meta device from its config.json (as policy.load_model does; --layers' count of decoder
layers), policy.use_attention (the loop: --attention varlen is CUDA's), policy.checkpointing, policy.shard
(bf16 compute and fp32 master weights when the plan is CUDA's), policy.optimizer, then for the plan's largest micro-batch (memory_plan's shape,
cut by train.micro_batches into exactly one pass) train.old_log_probs (pi_old's forward), train.update_minibatch
(the forward through the chunked head, the loss, backward) and train.clip_and_step (clip and AdamW).
One iteration first creates AdamW's state and warms the fake dispatch (its first call of an op holds
extra memory); the second is measured, phase by phase:

    old_logp   pi_old's forward, no gradient          no plan row (below the update)
    update     forward and backward                   the plan's update phase
    step       clip_grad_norm_ and AdamW's step       the plan's step phase

The plan's rows for what the dry run does not build (the rollout engine, the weight-sync bucket, the CUDA
runtime, a KL reference) are modelled, not measured: the comparison sums the plan's other rows, and those
are printed as modelled, as are the rollout and sync phases. AdamW is the implementation PyTorch picks for
the plan's device: foreach for CUDA tensors, its per-parameter loop for CPU ones. Exit 1 naming the phase
where the plan and the measurement differ by more than --tolerance; 0 otherwise.

--layers K measures K // 2 and K decoder layers (each exact: fake tensors have no noise), sets each beside
the plan at its layer count, and extrapolates each phase linearly to the model's layer count, which decides
the exit status; both the measured and the extrapolated figures are printed. The peak's moment must be the
same at both counts for the line to hold: at the 7B's defaults 4 and 8 layers extrapolate to the 28-layer
measurement exactly, 2 and 4 do not (28.1 GiB against 22.9), so K >= 8; all 28 layers take ~1 min on 2 cores.
"""
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.testing._internal.distributed.fake_pg import FakeStore
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train  # noqa: E402
from fgrpo_utils import memory_plan, policy  # noqa: E402
from fgrpo_utils.cli import check, parse_config, refuse  # noqa: E402
from fgrpo_utils.distributed import batch_problems  # noqa: E402

GiB = 1 << 30
MEASURED = ("update", "step")          # the plan's phases the dry run measures, and the rows it builds:
ROWS = ("weights", "AdamW", "gradients", "unsharded units", "activations", "log-prob head")
# the others (the engine, the weight sync, the CUDA runtime, a reference model) are modelled, not measured


@dataclass
class Config(train.Config):
    plan: bool = True                 # (the flags are train.py --plan true's; --plan itself is ignored)
    layers: int = 0                   # 0: every decoder layer; K >= 8: K // 2 and K layers, extrapolated
    tolerance: float = 0.10           # exit 1 where |measured - plan| > tolerance x plan in a phase

    def __post_init__(self):
        super().__post_init__()
        check(self.layers == 0 or self.layers >= 8, f"--layers {self.layers}: 0 (all) or >= 8 (the line through 2 "
              "and 4 layers misses the 7B's 28-layer update by 23%: 28.1 GiB against 22.9)")
        check(0 < self.tolerance < 1, f"--tolerance {self.tolerance}: must be in (0, 1)")


class FakeScalars(FakeTensorMode):
    """Fake tensors whose Python numbers read 1 (float, int, bool): the trainer turns a few tensors into
    numbers (the global token counts, the gradient norm, `if mask.any()`); none of them changes a shape."""

    def dispatch(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            t = args[0]
            return True if t.dtype == torch.bool else 1.0 if t.is_floating_point() else 1
        return super().dispatch(func, types, args, kwargs)


def with_layers(config, layers):
    """A copy of a transformers config with `layers` decoder layers (per-layer lists cut to match)."""
    config = config.__class__.from_dict(config.to_dict())
    text = config.get_text_config()
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:layers]
    return config


def largest_micro_batch(cfg, p):
    """Token ids (prompts, completions) of the plan's largest micro-batch, shaped as memory_plan assumes:
    its rows x row_len tokens, its completion tokens, each sequence with >= 1 prompt token."""
    mb = p.micro_batch
    rows, T, per_row = mb["rows"], mb["row_len"], mb["per_row"]
    Lr = mb["response_len"]
    if cfg.share_prompts:                        # a row is a group: one prompt, per_row completions
        c = min(Lr, (T - 1) // per_row)
        lens = [(T - per_row * c, c)] * per_row * rows
    else:                                        # padded: a row a sequence; padding-free: per_row in one row
        lens = []
        for i in range(rows * per_row):
            n = T // per_row + (i < T % per_row)
            lens.append((n - min(Lr, n - 1), min(Lr, n - 1)))
    prompts = [[1 + i % 7] * lp for i, (lp, _) in enumerate(lens)]
    return prompts, [[2] * lc for _, lc in lens]


def measure(cfg, config, p):
    """{phase: peak GiB on rank 0} of the trainer's update of p's largest micro-batch, and the tracker's
    breakdown of each peak. Everything is fake: no tensor holds data."""
    mode = FakeScalars(allow_non_fake_inputs=True)
    mixed = p.device == "cuda"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = policy.shard(policy.checkpointing(policy.use_attention(model), cfg, p.device), torch.device("cpu"),
                         mixed=mixed)
    with mode:
        model.to_empty(device="cpu")
        opt = policy.optimizer(model, cfg)
    for group in opt.param_groups:
        group["foreach"] = mixed                  # what AdamW picks for CUDA tensors
    prompts, completions = largest_micro_batch(cfg, p)
    run = dataclasses.replace(cfg, skip_dead_groups=False)      # every sequence given is forwarded
    passes = train.micro_batches(run, prompts, completions)
    check(len(passes) == 1, f"the plan's largest micro-batch is {len(passes)} passes of train.micro_batches")
    A = torch.linspace(-1, 1, len(completions))
    device = torch.device("cpu")
    phases = {
        "old_logp": lambda: (model.eval(), train.old_log_probs(model, prompts, completions, run, 0, device)),
        "update": lambda: (model.train(), train.update_minibatch(
            model, None, prompts, completions, A, None, cfg=run, pad_id=0, device=device,
            world=cfg.nproc, max_len=p.micro_batch["response_len"])),
        "step": lambda: train.clip_and_step(model, opt, run, cfg.lr),
    }
    peaks, parts = {}, {}
    for measured in (False, True):               # a warm-up iteration, then the measured one
        for name, fn in phases.items():
            tracker = MemTracker()
            tracker.track_external(model, opt)
            with mode, tracker:
                fn()
            if measured:
                snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
                peaks[name] = snap["Total"] / GiB
                parts[name] = {k.name.lower(): v / GiB for k, v in snap.items() if k != "Total" and v}
    return peaks, parts


def planned(cfg, config, entry):
    """memory_plan.plan for `config`, its phases summed over the rows the dry run builds (ROWS), and the
    names and GiB in the update phase of the rows it does not build."""
    p = memory_plan.plan(cfg, cfg.nproc, cfg.gpu_memory_gb, config=config, lengths=memory_plan.plan_lengths(cfg, entry))
    built = {ph: sum(getattr(r, ph) for r in p.rows if r.name.startswith(ROWS)) for ph in memory_plan.PHASES}
    return p, built, {r.name: r.update for r in p.rows if not r.name.startswith(ROWS)}


def main(cfg):
    problems = batch_problems(cfg, cfg.nproc)
    if problems:
        refuse(problems[0].replace("the world size", "--nproc"))
    entry = train.TASKS[cfg.task]
    try:
        full = memory_plan.load_config(cfg.model)
    except ValueError as e:
        refuse(e)
    L = full.get_text_config().num_hidden_layers
    counts = [L] if not cfg.layers else sorted({max(1, cfg.layers // 2), min(cfg.layers, L)})
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cfg.nproc)
    t0, rows = time.perf_counter(), {}
    for n in counts:
        config = with_layers(full, n)
        p, base, modelled = planned(cfg, config, entry)
        peaks, parts = measure(cfg, config, p)
        rows[n] = (p, base, peaks, parts, modelled)
        print(f"{n} layers measured in {time.perf_counter() - t0:.0f} s", flush=True)
    if L in rows:                                  # all layers were measured: their plan is the model's
        p_full, base_full, *_, modelled = rows[L]
    else:
        p_full, base_full, modelled = planned(cfg, full, entry)
    mb = p_full.micro_batch
    print(f"dry run: {cfg.model} | rank 0 of {cfg.nproc} (fake process group) | {p_full.device} plan, "
          f"{'bf16 compute' if p_full.device == 'cuda' else 'fp32'} | micro-batch {mb['rows']} x {mb['row_len']} "
          f"tokens ({mb['per_row']} sequence(s) a row, {mb['completion_tokens']} completion tokens) | "
          f"checkpointing {'on' if mb['checkpointing'] else 'off'}")
    print(f"{'phase (GiB per rank)':24s} {'layers':>6s} {'measured':>9s} {'plan':>9s} {'ratio':>7s}  peak's parts (measured)")
    for n, (p, base, peaks, parts, _) in rows.items():
        for ph in ("old_logp",) + MEASURED:
            plan_v = f"{base[ph]:9.2f}" if ph in base else f"{'-':>9s}"
            ratio = f"{peaks[ph] / base[ph]:7.3f}" if ph in base else f"{'':7s}"
            print(f"{ph:24s} {n:6d} {peaks[ph]:9.2f} {plan_v} {ratio}  "
                  + ", ".join(f"{k} {v:.2f}" for k, v in parts[ph].items()))
    final = {ph: rows[L][2][ph] for ph in MEASURED} if L in rows else extrapolate(rows, L)
    if L not in rows:
        print(f"extrapolated to {L} layers from {' and '.join(map(str, rows))}: "
              + ", ".join(f"{ph} {v:.2f} GiB (plan {base_full[ph]:.2f})" for ph, v in final.items()))
    print("the plan's other rows are modelled, not measured (update phase): "
          + ", ".join(f"{name} {v:.2f} GiB" for name, v in modelled.items())
          + f"; so are its rollout ({p_full.phases['rollout']:.2f} GiB) and sync ({p_full.phases['sync']:.2f} GiB) phases")
    # every figure set beside the plan: each measured layer count, and the model's own (measured or extrapolated)
    pairs = [(f"{ph} at {n} layers", r[2][ph], r[1][ph]) for n, r in rows.items() for ph in MEASURED]
    pairs += [(f"{ph} at {L} layers", final[ph], base_full[ph]) for ph in MEASURED if L not in rows]
    off = [(name, m, p) for name, m, p in pairs if abs(m - p) > cfg.tolerance * p]
    print(f"wall clock {time.perf_counter() - t0:.0f} s")
    dist.destroy_process_group()
    if off:
        print(f"error: the plan's {off[0][0].split()[0]} phase differs from the measurement by more than "
              f"{cfg.tolerance:.0%}: " + "; ".join(f"{name} measured {m:.2f} GiB, plan {p:.2f}" for name, m, p in off),
              file=sys.stderr)
        sys.exit(1)
    print(f"the plan's {' and '.join(MEASURED)} phases agree with the measurement within {cfg.tolerance:.0%}")


def extrapolate(rows, L):
    """Each measured phase as a + b x layers through the two measured layer counts, at L layers."""
    (n0, r0), (n1, r1) = sorted(rows.items())
    return {ph: r0[2][ph] + (r1[2][ph] - r0[2][ph]) / (n1 - n0) * (L - n0) for ph in MEASURED}


if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
