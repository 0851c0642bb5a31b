"""Worker for tests/test_train.py: mini-batch updates of a tiny Qwen2 under FSDP2, any world size.

    torchrun --nproc_per_node 2 tests/ws_worker.py OUT.pt CASES.json

CASES.json is a list of cases, each a dict of options; one launch runs them all in one process
group (a launch costs more than all its updates) and OUT.pt holds a list of results in that order.
The options set train.Config fields (micro_batch_size, micro_batch_tokens, loss, loss_agg,
share_prompts, skip_dead_groups, ...) and three of the fixture's: dead=G,G (groups whose advantages
are set to 0, as X in {0, N} would make them), layout=shared, balance=true (distributed.balance_ranks
first, as train.rl_step does) and load=rank0 (policy.build's way:
every rank builds the model on the meta device, rank 0 alone builds it whole, and each rank receives
its shard by broadcast, policy.shard_from_rank0). For each case every rank builds the same model and
the same 16 sequences (4 groups x N = 4, completion lengths 2..30, mixed rewards in every group),
keeps its share of whole groups, runs train.update_minibatch, then one AdamW step; rank 0 keeps the
loss, the metrics, the full gradient and the parameters after the step.
"""
import dataclasses
import gc
import json
import os
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train  # noqa: E402
from fgrpo_utils import distributed, policy  # noqa: E402
from advantage import focal_advantages  # noqa: E402
from fgrpo_utils.logprob import completion_logp  # noqa: E402


def fixture():
    g = torch.Generator().manual_seed(0)
    R = torch.tensor([[1., 0, 0, 1], [0, 1, 1, 1], [1, 0, 0, 0], [0, 1, 0, 1]])     # (4 groups, N=4)
    assert R.std(1).min() > 0                       # every group mixed: the loss is not vacuous
    adv = focal_advantages(R, gamma=0.5)[0].flatten().tolist()
    prompts = [torch.randint(3, 60, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(4)]                   # one prompt per group, of uneven lengths
    seqs = []
    for i in range(16):
        prompt = prompts[i // 4]
        n = int(torch.randint(2, 31, (1,), generator=g))
        completion = torch.randint(3, 60, (n,), generator=g).tolist()
        # an old policy a little off the current one, so ratios != 1 and clipping acts
        seqs.append({"prompt": prompt, "completion": completion, "adv": adv[i],
                     "old_logp": -torch.rand(n, generator=g) * 4 - 1.5})
    return seqs


def run(opts, rank, world, device, unused):
    """One case: its results (whole on every rank)."""
    dead = [int(g) for g in opts.pop("dead", "").split(",") if g]
    load = opts.pop("load", "every")
    balance = opts.pop("balance", "false") == "true"
    if opts.pop("layout", "plain") == "shared":
        opts["share_prompts"] = "true"
    fields = {f.name: f.type for f in dataclasses.fields(train.Config)}
    kw = {k: (v == "true") if fields[k] is bool else fields[k](v) for k, v in opts.items()}
    # update_minibatch reads only the loss and batch settings: the tokenizer named here is never loaded
    cfg = train.Config(**{"model": "tiny", "tokenizer": "Qwen/Qwen2.5-7B", "device": "cpu", "group_size": 4,
                          "prompts_per_step": 4, "mini_batch_prompts": 4, "micro_batch_size": 16,
                          "micro_batch_tokens": 0, "max_response_len": 40,
                          "out_dir": unused, **kw})

    def tiny():
        torch.manual_seed(0)
        return Qwen2ForCausalLM(Qwen2Config(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)).double()
    if load == "rank0":
        with torch.device("meta"):
            skeleton = tiny()
        model = policy.shard_from_rank0(skeleton, tiny() if rank == 0 else None, device)
    else:
        model = policy.shard(tiny(), device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seqs = fixture()
    for i in range(len(seqs)):
        if i // 4 in dead:
            seqs[i]["adv"] = 0.0
    per_rank = len(seqs) // world                   # whole groups: 16 / world is a multiple of N = 4
    mine = seqs[rank * per_rank:(rank + 1) * per_rank]
    prompts, completions = [q["prompt"] for q in mine], [q["completion"] for q in mine]
    A = torch.tensor([q["adv"] for q in mine])
    want = completion_logp(model, prompts, completions, 0)          # in input order
    old = [q["old_logp"].double() for q in mine]
    busiest, back = None, lambda rows: rows
    if balance:                                 # train.rl_step's way: whole live groups moved between ranks
        (mbs, back, busiest) = distributed.balance_ranks(cfg, [(prompts, completions, A, old)],  # old moves as
                                                         [train.live_rows(cfg, A)], rank, world)  # --tis_cap's do
        own, (prompts, completions, A, old) = old, mbs[0]
        assert all(torch.equal(o, m) for o, m in zip(back(old), own))      # each carried with its group
    batches = train.micro_batches(cfg, prompts, completions, train.live_rows(cfg, A))
    tokens = sum(len(completions[i]) + (len(prompts[i]) if i % 4 == 0 or not cfg.share_prompts else 0)
                 for mb in batches for i in mb)                     # forwarded, a shared prompt once
    live, forwarded = [None] * world, [None] * world                    # live (non-empty) passes per rank
    torch.distributed.all_gather_object(live, sum(1 for mb in batches if mb))
    torch.distributed.all_gather_object(forwarded, tokens)
    stats, logp = train.update_minibatch(model, None, prompts, completions, A, old, cfg=cfg,
                                         pad_id=0, device=device, world=world)
    logp = back(logp)
    # the logp returned must be each input sequence's own, whatever order the micro-batches took
    logp_gap = max([(a - b).abs().max().item() for a, b in zip(logp, want) if a is not None], default=0.0)
    skipped = sum(a is None for a in logp)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    train.clip_and_step(model, opt, cfg, 1e-2)
    params = {n: p.full_tensor().detach() for n, p in model.named_parameters()}
    return {"stats": stats, "grads": grads, "params": params, "logp_gap": logp_gap, "passes": len(batches),
            "live": live, "skipped": skipped, "forwarded": forwarded, "busiest": busiest}


def main(out, cases):
    rank, world, device = distributed.init_dist("cpu")
    results = []
    for opts in json.loads(Path(cases).read_text()):
        results.append(run(opts, rank, world, device, str(Path(out).parent / "unused")))
        gc.collect()                # see the end of train.main: free each case's device mesh first
    if rank == 0:
        torch.save(results, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(*sys.argv[1:])
