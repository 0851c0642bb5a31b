"""Tests for maze.py: generator, split, tokenizer, reward, policy, SFT, checkpoint, evaluation.

    python -m pytest -q tests/test_maze.py          # CPU, well under a minute
"""
import json
import os
import random
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import maze
import rollout
from maze import (MOVES, Config, build_model, build_tokenizer, completion_text, evaluate_mazes, find,
                  heldout_mazes, is_heldout, make_maze, maze_reward, prompt_text, render, solve, train_mazes)
import launch

# A 7x7 example in MaxRL's format (App. K): a spanning tree whose shortest path is RIGHT x4, DOWN x4.
PAPER_GRID = ["#######",
              "#S....#",
              "###.#.#",
              "#...#.#",
              "#.###.#",
              "#...#G#",
              "#######"]
SHORTEST = ["RIGHT"] * 4 + ["DOWN"] * 4

# MaxRL's vocabulary table, written out independently of maze.VOCAB.
PAPER_IDS = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, "GRID_START": 4, "GRID_END": 5,
             "PATH_START": 6, "DONE": 7, "PATH": 8, "WALL": 9, "GOAL": 10, "START": 11, "NEWLINE": 12,
             "UP": 13, "DOWN": 14, "LEFT": 15, "RIGHT": 16, "\n": 17,
             **{f"RESERVED_{i}": 18 + i for i in range(14)}}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


# -----------------------------------------------------------------------------
# Generator

def count_simple_paths(grid):
    """Exhaustive DFS over open cells: the number of simple paths from S to G."""
    start, goal = maze.find(grid, "S"), maze.find(grid, "G")

    def dfs(pos, seen):
        if pos == goal:
            return 1
        total = 0
        for m in maze.MOVES:
            nxt = maze.step(grid, pos, m)
            if nxt is not None and nxt not in seen:
                total += dfs(nxt, seen | {nxt})
        return total
    return dfs(start, {start})


def is_spanning_tree(grid):
    """Rooms (odd, odd) all open, pillars (even, even) walls, and the open rooms + passages a tree."""
    n, k = len(grid), len(grid) // 2
    if any(grid[r][c] == "#" for r in range(1, n, 2) for c in range(1, n, 2)):
        return False
    if any(grid[r][c] != "#" for r in range(0, n, 2) for c in range(0, n, 2)):
        return False
    edges = [((r - 1, c), (r + 1, c)) for r in range(2, n - 1, 2) for c in range(1, n, 2)
             if grid[r][c] != "#"]                                  # vertical passages
    edges += [((r, c - 1), (r, c + 1)) for r in range(1, n, 2) for c in range(2, n - 1, 2)
              if grid[r][c] != "#"]                                 # horizontal passages
    if len(edges) != k * k - 1:                       # a tree on k^2 nodes has k^2 - 1 edges
        return False
    adj = {}
    for a, b in edges:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, []).append(a)
    seen, stack = {(1, 1)}, [(1, 1)]
    while stack:
        for nb in adj.get(stack.pop(), []):
            if nb not in seen:
                seen.add(nb)
                stack.append(nb)
    return len(seen) == k * k                          # connected + k^2 - 1 edges = acyclic


def test_count_simple_paths_sees_a_loop():
    """Control: the counter must find 2 paths around a loop, or the next test proves nothing."""
    assert count_simple_paths(["#######", "#S....#", "#.###.#", "#....G#", "#######"]) == 2
    assert count_simple_paths(PAPER_GRID) == 1


@pytest.mark.parametrize("size", [7, 9, 11])
def test_exactly_one_simple_path(size):
    for seed in range(40):
        grid = make_maze(size, seed)
        assert count_simple_paths(grid) == 1, (size, seed)
        assert sum(row.count("S") for row in grid) == 1 and sum(row.count("G") for row in grid) == 1


@pytest.mark.parametrize("size", [7, 9, 17])
def test_perfect_maze(size):
    for seed in range(30):
        grid = make_maze(size, seed)
        assert len(grid) == size and all(len(row) == size for row in grid)
        assert set("".join(grid)) <= set("#.SG")
        assert grid[0] == "#" * size and grid[-1] == "#" * size
        assert all(row[0] == "#" and row[-1] == "#" for row in grid)
        assert is_spanning_tree(grid), (size, seed)


def test_spanning_tree_check_sees_a_cycle():
    """Control: knock out one closed wall between two rooms and the check must fail."""
    grid = [list(row) for row in make_maze(9, 0)]
    r, c = next((r, c) for r in range(2, 8, 2) for c in range(1, 9, 2) if grid[r][c] == "#")
    grid[r][c] = "."
    assert not is_spanning_tree(["".join(row) for row in grid])


def test_deterministic_per_seed():
    for seed in range(10):
        assert make_maze(11, seed) == make_maze(11, seed)
    assert len({tuple(make_maze(11, s)) for s in range(50)}) == 50
    assert heldout_mazes(9, 5) == heldout_mazes(9, 5)
    assert train_mazes(9, 5, random.Random(1)) == train_mazes(9, 5, random.Random(1))
    assert train_mazes(9, 5, random.Random(1)) != train_mazes(9, 5, random.Random(2))


def test_train_and_heldout_disjoint():
    """7x7 has ~1.4e4 distinct mazes, so 3,000 training draws would surely hit a held-out maze if
    only the seeds were split; the content split must prevent that."""
    held = {tuple(g) for g in heldout_mazes(7, 64)}
    assert len(held) > 32 and all(is_heldout(list(g)) for g in held)
    plain = {tuple(make_maze(7, s)) for s in range(3000)}          # control: a seed split alone
    assert plain & held, "fixture too weak: the seed-only control never collides"
    train = {tuple(g) for g in train_mazes(7, 3000, random.Random(0))}
    assert not train & held
    # the seed ranges too: held-out seeds count up from HELDOUT_SEED0, training seeds lie below it
    S0 = maze.HELDOUT_SEED0
    held_seeds = [s for s in range(S0, S0 + 400) if is_heldout(make_maze(7, s))]
    assert heldout_mazes(7, 8) == [make_maze(7, s) for s in held_seeds[:8]]

    class Spy(random.Random):
        calls = []

        def randrange(self, *args):
            self.calls.append(args)
            return super().randrange(*args)
    train_mazes(7, 50, Spy(0))
    assert len(Spy.calls) >= 50 and set(Spy.calls) == {(S0,)}


@pytest.mark.parametrize("size", [0, 3, 5, 8, 10, -9, 9.0, "9", True, None])
def test_bad_size_raises(size):
    with pytest.raises(ValueError, match="size"):
        make_maze(size, 0)


def test_bad_config_raises():
    for kw in [dict(size=8), dict(size=19), dict(size=5), dict(steps=0), dict(eval_samples=0),
               dict(eval_mazes=-1), dict(device="tpu")]:
        with pytest.raises(ValueError, match="--" + next(iter(kw))):
            Config(**kw)


# -----------------------------------------------------------------------------
# Solver, reward, render

def test_solve_matches_reward_and_paper_example():
    assert solve(PAPER_GRID) == SHORTEST
    for seed in range(50):
        grid = make_maze(9, seed)
        path = solve(grid)
        for rule in maze.RULES:
            assert maze_reward(grid, completion_text(path), rule) == 1.0
            assert maze_reward(grid, completion_text(path[:-1]), rule) == 0.0      # one short of the goal
        assert maze_reward(grid, completion_text(path)) == 1.0                   # strict is the default


R4D4 = "RIGHT RIGHT RIGHT RIGHT DOWN DOWN DOWN DOWN"                             # PAPER_GRID's shortest path


@pytest.mark.parametrize("completion, walk, strict", [
    (f"{R4D4} DONE <eos>", 1.0, 1.0),
    (f"{R4D4} DONE", 0.0, 0.0),                                     # no <eos>: truncated, never ended
    (f"{R4D4} DONE DONE DONE RIGHT", 0.0, 0.0),                     # rambling to the length limit
    ("RIGHTRIGHTRIGHTRIGHTDOWNDOWNDOWNDOWNDONE<eos>", 1.0, 1.0),   # Qwen2Tokenizer decode
    (f"{R4D4}X DONE <eos>", 0.0, 0.0),                              # junk glued to a move
    (f"{R4D4} DONE UP junk <eos>", 1.0, 0.0),                       # after DONE: walk ignores it
    (f"{R4D4} DONE DONE <eos>", 1.0, 0.0),
    (f"{R4D4} DONE <eos> UP UP", 1.0, 1.0),                         # after <eos>: never sampled, ignored
    (f"{R4D4} <eos>", 0.0, 0.0),                                    # reaches G but no DONE
    (R4D4, 0.0, 0.0),
    (f"RIGHT RIGHT PATH RIGHT RIGHT DOWN DOWN DOWN DOWN DONE <eos>", 0.0, 0.0),   # non-move token
    (f"{R4D4} <eos> DONE", 0.0, 0.0),                               # <eos> before DONE
    (f"DOWN {R4D4} DONE <eos>", 0.0, 0.0),                          # wall bump at once
    ("RIGHT RIGHT RIGHT RIGHT RIGHT DOWN DOWN DOWN DOWN DONE <eos>", 0.0, 0.0),   # into the border wall
    (f"RIGHT LEFT {R4D4} DONE <eos>", 1.0, 0.0),                    # backtrack: a detour, walk only
    ("RIGHT RIGHT DOWN DOWN LEFT LEFT RIGHT RIGHT UP UP RIGHT RIGHT DOWN DOWN DOWN DOWN DONE <eos>", 1.0, 0.0),
    (f"{R4D4} UP UP DONE <eos>", 1.0, 0.0),                         # moves after the goal
    (f"{R4D4} LEFT DONE <eos>", 1.0, 0.0),                          # even into a wall
    ("RIGHT RIGHT DONE <eos>", 0.0, 0.0),                           # stops short
    ("DONE <eos>", 0.0, 0.0),
    ("", 0.0, 0.0),
    ("   \n ", 0.0, 0.0),
    ("FOO BAR DONE <eos>", 0.0, 0.0),                               # unknown words
    ("right right right right down down down down DONE <eos>", 0.0, 0.0),   # case matters
    (f"{R4D4} done <eos>", 0.0, 0.0),
    (SHORTEST + ["DONE", "<eos>"], 1.0, 1.0),                       # a list of token strings
    (SHORTEST + ["DONE"], 0.0, 0.0),
    (SHORTEST + ["DONE", 7], 0.0, 0.0),                             # a list with a non-string
    (None, 0.0, 0.0),
    (42, 0.0, 0.0),
    (b"RIGHT DONE <eos>", 0.0, 0.0),
    ([], 0.0, 0.0),
])
def test_reward_edge_cases(completion, walk, strict):
    assert maze_reward(PAPER_GRID, completion, "walk") == walk
    assert maze_reward(PAPER_GRID, completion, "strict") == strict
    assert maze_reward(PAPER_GRID, completion) == strict


def test_reward_rule_is_checked():
    with pytest.raises(ValueError, match="strict"):
        maze_reward(PAPER_GRID, f"{R4D4} DONE <eos>", "exact")


def test_reward_leaving_the_grid():
    """A grid with no border wall: a move off the edge must be 0, not wrap around (grid[-1])."""
    grid = ["S.#", "###", "G.#"]
    assert maze_reward(grid, "UP DONE <eos>", "walk") == 0.0          # grid[-1][0] is G: wrapping would score 1
    assert maze_reward(grid, "LEFT DONE <eos>", "walk") == 0.0
    assert maze_reward(["GS"], "RIGHT LEFT LEFT DONE <eos>", "walk") == 0.0
    assert maze_reward(["GS"], "LEFT DONE <eos>", "walk") == 1.0


def test_render():
    out = render(PAPER_GRID, SHORTEST).splitlines()
    assert len(out) == 7 and out[1] == "# S * * * * #" and out[5] == "# . . . # G #"
    assert sum(line.count("*") for line in out) == len(SHORTEST) - 1
    assert "X" in render(PAPER_GRID, ["DOWN"]).splitlines()[2]          # the wall it bumped into
    assert render(PAPER_GRID) == "\n".join(" ".join(row) for row in PAPER_GRID)


# -----------------------------------------------------------------------------
# Tokenizer and formats

def test_vocabulary_ids(tok):
    assert len(tok) == 32 and maze.VOCAB == list(PAPER_IDS)
    assert tok.convert_tokens_to_ids(list(PAPER_IDS)) == list(PAPER_IDS.values())
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok("FOO RIGHT", add_special_tokens=False)["input_ids"] == [3, 16]


def test_prompt_and_completion_round_trip(tok):
    for size in [7, 9, 17]:
        grid = make_maze(size, 3)
        text = prompt_text(grid)
        ids = tok(text)["input_ids"]                     # default call: must add nothing
        assert ids == [PAPER_IDS[w] for w in text.split()]
        assert len(ids) == maze.prompt_len(size) and ids[:2] == [1, 4] and ids[-2:] == [5, 6]
        assert ids.count(12) == size - 1                 # NEWLINE only between rows
        assert tok.decode(ids) == text
        cells = [i for i in ids if i in (8, 9, 10, 11)]
        assert cells == [{"#": 9, ".": 8, "S": 11, "G": 10}[c] for c in "".join(grid)]
        comp = completion_text(solve(grid))
        cids = tok(comp)["input_ids"]
        assert cids[-2:] == [7, 2] and cids == [PAPER_IDS[w] for w in comp.split()]
        assert maze_reward(grid, tok.decode(cids)) == 1.0
        assert maze_reward(grid, tok.convert_ids_to_tokens(cids), "strict") == 1.0
    assert prompt_text(PAPER_GRID).startswith("<bos> GRID_START WALL WALL WALL WALL WALL WALL WALL NEWLINE "
                                              "WALL START PATH PATH PATH PATH WALL NEWLINE")


def test_budget_fits_positions():
    for size in range(7, 19, 2):
        k = size // 2
        budget = maze.max_new_tokens_for(size)
        assert budget >= 2 * (k * k - 1) + 2            # the longest simple path + DONE <eos>
        assert maze.prompt_len(size) + budget <= 512


# -----------------------------------------------------------------------------
# Policy, SFT, checkpoint, evaluation

def test_model_config():
    cfg = maze.model_config()
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (4, 256, 1024)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (4, 2, 32)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 0)
    theta = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
    assert theta["rope_theta"] == 1e6 and cfg.max_position_embeddings == 512
    model = build_model()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()   # tied
    assert sum(p.numel() for p in model.parameters()) == 3_944_704                        # ~3.9M


def test_sft_batch_masks_the_prompt(tok):
    grids = [make_maze(9, s) for s in range(4)]
    ids, labels = maze.sft_batch(tok, grids)
    P = maze.prompt_len(9)
    assert (labels[:, :P] == -100).all() and (ids[:, P - 1] == 6).all()      # PATH_START unlabelled
    for b, g in enumerate(grids):
        target = labels[b][labels[b] != -100].tolist()
        assert target == tok(completion_text(solve(g)))["input_ids"] and target[-2:] == [7, 2]
        assert ids[b, P:P + len(target)].tolist() == target and (ids[b, P + len(target):] == 0).all()


def test_sft_loss_falls(tok, tmp_path):
    torch.manual_seed(0)
    model = build_model()
    losses = maze.sft(model, tok, Config(size=7, steps=20, batch_size=8, seed=0, out_dir=str(tmp_path / "unused")))
    assert len(losses) == 20 and losses[0] > 2.5                   # starts near ln 32 = 3.47
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:3]) / 3


def test_checkpoint_reloads_identically(tok, tmp_path):
    torch.manual_seed(0)
    model = build_model().eval()
    out = tmp_path / "ckpt"
    maze.save_sft(model, tok, out, {"note": "test"})
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "sft.json"]:
        assert (out / name).is_file(), name
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 0)
    model2 = AutoModelForCausalLM.from_pretrained(out).eval()
    tok2 = AutoTokenizer.from_pretrained(out)
    text = prompt_text(make_maze(9, 0)) + " RIGHT DOWN"
    ids = torch.tensor([tok2(text)["input_ids"]])
    assert ids[0].tolist() == tok(text)["input_ids"]                   # transformers 5: Qwen2Tokenizer
    assert (tok2.pad_token_id, tok2.bos_token_id, tok2.eos_token_id) == (0, 1, 2)
    comp = tok2(completion_text(SHORTEST))["input_ids"]
    assert maze_reward(PAPER_GRID, tok2.decode(comp)) == 1.0                 # whatever its spacing
    assert maze_reward(PAPER_GRID, tok2.convert_ids_to_tokens(comp), "strict") == 1.0
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model2(ids).logits)
    maze.save_sft(model, tok, out, {"note": "again"})             # our own checkpoint: replaced
    assert json.loads((out / "sft.json").read_text()) == {"note": "again"}


def test_main_never_deletes_a_folder_it_did_not_write(tmp_path):
    """`python maze.py --out_dir DIR` used to empty an existing DIR and exit 0. (A file given as
    --out_dir, which became a folder, is in tests/test_flags.py.)"""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("years of work")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    r = launch.run([sys.executable, "maze.py", "--size", "7", "--steps", "1", "--batch_size", "2",
                    "--eval_mazes", "0", "--threads", "1", "--out_dir", str(theirs)],
                   cwd=Path(maze.__file__).parent, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--out_dir" in r.stderr, r.stderr
    assert [p.name for p in theirs.iterdir()] == ["thesis.tex"]


OPPOSITE = {"UP": "DOWN", "DOWN": "UP", "LEFT": "RIGHT", "RIGHT": "LEFT"}


class ScriptedEngine:
    """Stands in for rollout.TorchEngine with known answers: sample j of maze i is correct iff
    j < i % (n + 1), and every other correct one is a detour (walk rule yes, strict no)."""

    def __init__(self, grids, tok):
        self.grids, self.tok, self.calls = grids, tok, []

    def generate(self, prompts, n, seeds, *, max_new_tokens, stop_token_ids, **kw):
        self.calls.append((prompts, n, seeds, max_new_tokens, stop_token_ids, kw))
        out = rollout.Rollouts([], [], [], [])
        for i, g in enumerate(self.grids):
            path = solve(g)
            for j in range(n):
                if j < i % (n + 1):
                    moves = path if j % 2 == 0 else [path[0], OPPOSITE[path[0]]] + path
                else:
                    moves = path[:-1]                   # one short of the goal
                ids = self.tok(completion_text(moves))["input_ids"]
                out.prompt_index.append(i)
                out.token_ids.append(ids)
                out.engine_logp.append([0.0] * len(ids))
                out.finish_reason.append("stop")
        return out


def test_evaluate_mazes_counts(tok):
    grids = heldout_mazes(9, 10)
    eng = ScriptedEngine(grids, tok)
    res = evaluate_mazes(eng, tok, grids, n=4, seed=7)
    assert res["walk"] == [i % 5 for i in range(10)]
    assert res["strict"] == [(i % 5 + 1) // 2 for i in range(10)]
    assert res["truncated"] == [0] * 10
    prompts, n, seeds, budget, stop, kw = eng.calls[0]
    assert prompts == [tok(prompt_text(g))["input_ids"] for g in grids] and n == 4
    assert stop == [2] and budget == maze.max_new_tokens_for(9) and kw["temperature"] == 1.0
    assert len(set(seeds)) == 10
    eng3 = ScriptedEngine(grids[2::-1], tok)              # a maze's seed ignores its batch and place
    evaluate_mazes(eng3, tok, grids[2::-1], n=4, seed=7)
    assert eng3.calls[0][2] == seeds[2::-1]
    evaluate_mazes(eng3, tok, grids[2::-1], n=4, seed=8)
    assert not set(eng3.calls[1][2]) & set(seeds)


class RamblingEngine:
    """Every sample is the shortest path and DONE, then DONE again until the length limit: what the
    walk rule let one F-GRPO run learn (README). Unended, it must score 0 under every rule."""

    def __init__(self, grids, tok):
        self.grids, self.tok = grids, tok

    def generate(self, prompts, n, seeds, *, max_new_tokens, stop_token_ids, **kw):
        out = rollout.Rollouts([], [], [], [])
        for i, g in enumerate(self.grids):
            words = (solve(g) + ["DONE"] * max_new_tokens)[:max_new_tokens]
            for _ in range(n):
                out.prompt_index.append(i)
                out.token_ids.append(self.tok.convert_tokens_to_ids(words))
                out.engine_logp.append([0.0] * len(words))
                out.finish_reason.append("length")
        return out


def test_never_ending_cannot_pay(tok):
    """Truncated answers score 0 under both rules, in training (task.score) and evaluation."""
    grids = heldout_mazes(9, 3)
    res = evaluate_mazes(RamblingEngine(grids, tok), tok, grids, n=2, seed=0)
    assert res["strict"] == res["walk"] == [0, 0, 0] and res["truncated"] == [2, 2, 2]
    for rule in maze.RULES:
        task = maze.maze_task(tok, 9, seed=0, rule=rule, eval_mazes=3, eval_samples=2)
        ids = tok.convert_tokens_to_ids(solve(grids[0]) + ["DONE"])
        assert task.score([grids[0]] * 2, [ids, ids + [maze.EOS]])[0] == [0.0, 1.0]
        counts = task.evaluate(RamblingEngine(grids, tok), 0, 1)
        assert list(counts) == [rule, *(r for r in maze.RULES if r != rule), "truncated"]
        assert counts["truncated"] == [2, 2, 2] and counts[rule] == [0, 0, 0]


def test_detour_scores_only_under_walk(tok):
    """The single-solution premise: a detour into a dead end and back reaches G, and only the walk
    rule pays for it (train.py trains on --maze_reward strict by default)."""
    tried = 0
    for seed in range(20):
        grid = make_maze(9, seed)
        path = solve(grid)
        pos, detour = find(grid, "S"), None
        for j, m in enumerate(path):                  # the first cell on the path with a side branch
            for side in MOVES:
                nxt = maze.step(grid, pos, side)
                if side != m and nxt is not None and (j == 0 or side != OPPOSITE[path[j - 1]]):
                    detour = path[:j] + [side, OPPOSITE[side]] + path[j:]
                    break
            if detour:
                break
            pos = maze.step(grid, pos, m)
        if detour is None:
            continue
        ids = tok.convert_tokens_to_ids(detour + ["DONE", "<eos>"])
        scores = {rule: maze.maze_task(tok, 9, 0, rule, eval_mazes=0).score([grid], [ids])[0][0]
                  for rule in maze.RULES}
        assert scores == {"strict": 0.0, "walk": 1.0}, (seed, detour)
        tried += 1
    assert tried >= 10                                # most 9x9 paths pass a side branch


def test_evaluate_mazes_with_no_mazes(tok):
    """train.py splits the held-out mazes over ranks: with fewer mazes than ranks a rank has none."""
    res = evaluate_mazes(ScriptedEngine([], tok), tok, [], n=4, seed=0)
    assert res == {"strict": [], "walk": [], "truncated": [], "first": []}


def test_main_end_to_end(tmp_path):
    """`python maze.py --steps 2` in-process, with the real rollout.TorchEngine."""
    out = tmp_path / "sft"
    maze.main(Config(size=7, steps=2, batch_size=4, eval_mazes=4, eval_samples=2, out_dir=str(out)))
    info = json.loads((out / "sft.json").read_text())
    assert len(info["losses"]) == 2 and info["eval"]["mazes"] == 4
    assert 0.0 <= info["eval"]["pass1_strict"] <= info["eval"]["pass1_walk"] <= 1.0
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == 32
