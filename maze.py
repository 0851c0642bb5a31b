"""
Single-solution maze: Prim generator, 32-token vocabulary, strict and walk rewards, the SFT warm-start policy
(F-GRPO Sec. 5.2 / App. K). Library for train.py / evaluate.py, and an entry point.

    python maze.py                                   # CPU default: 9x9 mazes, 900 SFT steps, ~10 min
    python maze.py --size 17 --steps 1500            # paper scale (17x17, 1,500 steps; a GPU is advised)
    python maze.py --show_seed 3                     # print one maze and its shortest path, then exit
    python maze.py --steps 2 --eval_mazes 4          # smoke test, seconds

`python maze.py` trains a 3.9M-parameter Qwen2 from scratch on shortest paths, saves a Hugging Face checkpoint
(out/maze_sft), reloads it, and reports held-out pass@1 under both reward rules. Why: DESIGN.md, "The maze".
"""
import itertools
import json
import math
import os
import random
import re
import time
import zlib
from collections import Counter, deque
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from tqdm import tqdm
from transformers import (AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen2ForCausalLM)

import rollout
from advantage import pass_at_k_curve
from fgrpo_utils.cli import check, check_choices, check_device, check_min, check_positive, parse_config
from fgrpo_utils.outputs import atomic_dir, atomic_write_json, check_out_dir
from fgrpo_utils.task import Task

# -----------------------------------------------------------------------------
# Mazes: a (2k+1) x (2k+1) grid, border walls, "rooms" at odd coordinates (as MaxRL's public maze code)
MOVES = {"UP": (-1, 0), "DOWN": (1, 0), "LEFT": (0, -1), "RIGHT": (0, 1)}
HELDOUT_SEED0 = 1_000_000_000    # training seeds are [0, HELDOUT_SEED0); held-out seeds start here
HELDOUT_MOD = 8                  # a grid is held out iff crc32(grid) % HELDOUT_MOD == 0 (1/8 of mazes)
MIN_SIZE = 7                     # 5x5 has 4 rooms and only 48 distinct mazes: too few to split

def make_maze(size, seed):
    """A perfect maze by randomized Prim's algorithm: a list of `size` strings over # . S G. Every room (odd row
    and column) joins the tree through one random frontier edge, so exactly one simple path joins S and G."""
    check(isinstance(size, int) and not isinstance(size, bool) and size % 2 == 1 and size >= MIN_SIZE,
          f"size: expected an odd integer >= {MIN_SIZE}, got {size!r}")
    rng = random.Random(seed)
    k = size // 2                                     # rooms per side; room (i, j) is cell (2i+1, 2j+1)
    cells = [["#"] * size for _ in range(size)]
    first = (rng.randrange(k), rng.randrange(k))
    in_tree, frontier = {first}, []

    def grow(room):                                   # open a room and queue its edges to outside rooms
        i, j = room
        cells[2 * i + 1][2 * j + 1] = "."
        for di, dj in MOVES.values():
            nb = (i + di, j + dj)
            if 0 <= nb[0] < k and 0 <= nb[1] < k and nb not in in_tree:
                frontier.append((room, nb))

    grow(first)
    while frontier:
        x = rng.randrange(len(frontier))              # a uniformly random frontier edge
        frontier[x], frontier[-1] = frontier[-1], frontier[x]
        (i, j), nb = frontier.pop()
        if nb in in_tree:                             # both ends already joined: would close a cycle
            continue
        in_tree.add(nb)
        cells[i + nb[0] + 1][j + nb[1] + 1] = "."     # the wall cell between the two rooms
        grow(nb)
    s, g = rng.sample(range(k * k), 2)                # start != goal, uniform over rooms
    cells[2 * (s // k) + 1][2 * (s % k) + 1] = "S"
    cells[2 * (g // k) + 1][2 * (g % k) + 1] = "G"
    return ["".join(row) for row in cells]

def is_heldout(grid):
    """The held-out split (DESIGN.md, "The maze"): a stable hash, so it never depends on the seed."""
    return zlib.crc32("\n".join(grid).encode()) % HELDOUT_MOD == 0

def heldout_mazes(size, n):
    """The first n held-out mazes of this size (seeds HELDOUT_SEED0, +1, ... that hash held out)."""
    grids = (make_maze(size, seed) for seed in itertools.count(HELDOUT_SEED0))
    return list(itertools.islice(filter(is_heldout, grids), n))

def train_mazes(size, n, rng):
    """n fresh training mazes; `rng` (a random.Random) picks the seeds, so the caller controls them."""
    grids = (make_maze(size, rng.randrange(HELDOUT_SEED0)) for _ in itertools.count())
    return list(itertools.islice(itertools.filterfalse(is_heldout, grids), n))

def find(grid, ch):
    return next((r, row.index(ch)) for r, row in enumerate(grid) if ch in row)

def step(grid, pos, move):
    """One move of the walk; None when it leaves the grid or enters a wall."""
    r, c = pos[0] + MOVES[move][0], pos[1] + MOVES[move][1]
    return (r, c) if 0 <= r < len(grid) and 0 <= c < len(grid[r]) and grid[r][c] != "#" else None

def solve(grid):
    """The shortest (in a perfect maze: the only simple) path from S to G, by BFS, as moves."""
    start, goal = find(grid, "S"), find(grid, "G")
    came = {start: None}                               # cell -> (previous cell, move taken)
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        for move in MOVES:
            nxt = step(grid, pos, move)
            if nxt is not None and nxt not in came:
                came[nxt] = (pos, move)
                queue.append(nxt)
    moves, pos = [], goal
    while came[pos] is not None:
        pos, move = came[pos]
        moves.append(move)
    return moves[::-1]

RULES = ("strict", "walk")      # --maze_reward; strict is the default everywhere

def maze_reward(grid, completion, rule="strict"):
    """1.0 or 0.0 for a completion: decoded text, split into vocabulary words (WORD: "RIGHT DONE" and
    "RIGHTDONE" read the same), or a list of token strings; any other value (None, ids, bytes) scores 0.0.
    Raises ValueError("maze reward rule ...: expected one of ('strict', 'walk')") for an unknown rule, and
    nothing else. Both rules read the completion up to its first <eos> and give 0 when there is none: an
    answer cut by the length limit is wrong, so no policy gains by never ending (one F-GRPO run on the walk
    rule learned to repeat DONE and moves until truncated). Words after <eos> (never in a rollout) are ignored.
    strict (Sec. 5.2: "exactly one correct action sequence"): the words before <eos> are exactly the
        shortest path and DONE; nothing may follow DONE.
    walk (MaxRL's judge_maze): cut at the first DONE (none -> 0); every word before it must be a move;
        walk from S: off the grid or into a wall -> 0, reaching G -> 1 at once even if more moves follow;
        otherwise 0. Words between DONE and <eos> are ignored, as MaxRL ignores them. It accepts detours
        into a dead end and back, so the task is no longer single-solution."""
    if rule not in RULES:
        raise ValueError(f"maze reward rule {rule!r}: expected one of {RULES}")
    if isinstance(completion, str):
        tokens = WORD.findall(completion)
    elif isinstance(completion, (list, tuple)) and all(isinstance(t, str) for t in completion):
        tokens = list(completion)
    else:
        return 0.0                                    # None, bytes, ids...: not a completion we can read
    if "<eos>" not in tokens:                         # never ended: truncated
        return 0.0
    tokens = tokens[:tokens.index("<eos>")]
    if rule == "strict":
        return float(tokens == solve(grid) + ["DONE"])
    if "DONE" not in tokens or any(m not in MOVES for m in tokens[:tokens.index("DONE")]):
        return 0.0
    pos, goal = find(grid, "S"), find(grid, "G")
    for m in tokens[:tokens.index("DONE")]:
        pos = step(grid, pos, m)
        if pos is None or pos == goal:                # off the grid or into a wall: 0; G: 1 at once
            return float(pos == goal)
    return 0.0

def render(grid, path=None):
    """The maze for humans, cells space-separated; `path` (moves) marked * up to G, X where it bumps."""
    cells, pos = [list(row) for row in grid], find(grid, "S")
    for m in path or []:
        if m not in MOVES:
            break
        r, c = pos[0] + MOVES[m][0], pos[1] + MOVES[m][1]
        if step(grid, pos, m) is None:                # a wall or the edge ends the drawing
            if 0 <= r < len(grid) and 0 <= c < len(grid[r]):
                cells[r][c] = "X"
            break
        pos = (r, c)
        if grid[r][c] == "G":
            break
        if grid[r][c] == ".":
            cells[r][c] = "*"
    return "\n".join(" ".join(row) for row in cells)

# -----------------------------------------------------------------------------
# Vocabulary and formats (MaxRL's public code, whose setup the paper follows, App. K): 32 words, whitespace-split
VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>", "GRID_START", "GRID_END", "PATH_START", "DONE", "PATH",
         "WALL", "GOAL", "START", "NEWLINE", "UP", "DOWN", "LEFT", "RIGHT", "\n"]
VOCAB += [f"RESERVED_{i}" for i in range(14)]      # ids 18-31
PAD, BOS, EOS = 0, 1, 2
CELL_TOKEN = {"#": "WALL", ".": "PATH", "S": "START", "G": "GOAL"}
# Splits decoded text into vocabulary words (longest first), spaced or not (DESIGN.md, "Tokenizer note");
# any other character is a one-character word, which is never a move.
WORD = re.compile("|".join(re.escape(w) for w in sorted(VOCAB, key=len, reverse=True) if w.strip()) + r"|\S")

def build_tokenizer():
    """The vocabulary as a Hugging Face fast tokenizer; ids are positions in VOCAB, every word also an added
    token. Why WhitespaceSplit, no post-processor, and `\\n` (id 17): DESIGN.md, "Tokenizer note"."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(w, special=True) for w in VOCAB[:4]])
    tok.add_tokens([AddedToken(w, special=False, normalized=False) for w in VOCAB[4:] if w.strip()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")

def prompt_text(grid):
    """`<bos> GRID_START` + cells row-major, NEWLINE between rows + `GRID_END PATH_START`."""
    rows = " NEWLINE ".join(" ".join(CELL_TOKEN[c] for c in row) for row in grid)
    return f"<bos> GRID_START {rows} GRID_END PATH_START"

def completion_text(moves):
    return " ".join(list(moves) + ["DONE", "<eos>"])

def encode(tokenizer, texts):
    """Token ids of each text, exactly the words written (no special tokens added)."""
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"]

def prompt_len(size):
    return size * size + (size - 1) + 4               # cells + NEWLINEs + 4 markers; 309 at 17x17

def max_new_tokens_for(size):
    """Sampling budget: twice the longest simple path (2*(k^2-1) moves) + DONE <eos>, room for
    detours, capped so prompt + completion fit the 512 positions (203 at 17x17; MaxRL uses 180)."""
    k = size // 2
    return min(4 * (k * k - 1) + 2, 512 - prompt_len(size))

# -----------------------------------------------------------------------------
# Policy (App. K: about 3M parameters; the shape is MaxRL's): Qwen2, 4 layers, 3.9M parameters
def model_config():
    return Qwen2Config(vocab_size=len(VOCAB), hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, hidden_act="silu", rms_norm_eps=1e-6,
                       rope_theta=1e6, max_position_embeddings=512, tie_word_embeddings=True,
                       attention_dropout=0.0, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)

def build_model():
    """Random init (call torch.manual_seed first for a reproducible one)."""
    return Qwen2ForCausalLM(model_config())

def save_sft(model, tokenizer, out_dir, info):
    """config.json, model.safetensors, tokenizer, generation_config.json and sft.json, atomically.
    An existing out_dir is replaced only if it is one of ours (outputs.atomic_dir)."""
    def write(tmp):
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # tokenizer_class for transformers 4.x readers too (DESIGN.md, "Tokenizer note")
        path = Path(tmp) / "tokenizer_config.json"
        tok_cfg = {**json.loads(path.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}
        path.write_text(json.dumps(tok_cfg, indent=1))
        GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, do_sample=True,
                         temperature=1.0, top_p=1.0).save_pretrained(tmp)
        atomic_write_json(Path(tmp) / "sft.json", info)
    atomic_dir(out_dir, write)

# -----------------------------------------------------------------------------
# SFT on shortest paths, and the held-out evaluation
def sft_batch(tokenizer, grids):
    """input_ids and labels (B, T): prompt + shortest path + DONE <eos>, right-padded with <pad>.
    labels are -100 on the prompt and the padding: the loss covers tokens after PATH_START only."""
    prompts = encode(tokenizer, [prompt_text(g) for g in grids])
    targets = encode(tokenizer, [completion_text(solve(g)) for g in grids])
    T = max(len(p) + len(t) for p, t in zip(prompts, targets))
    ids = torch.tensor([p + t + [PAD] * (T - len(p) - len(t)) for p, t in zip(prompts, targets)])
    labels = torch.tensor([[-100] * len(p) + t + [-100] * (T - len(p) - len(t)) for p, t in zip(prompts, targets)])
    return ids, labels

def sft(model, tokenizer, cfg, device="cpu"):
    """cfg.steps AdamW steps on fresh training mazes; returns the per-step loss (App. K)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1.0 + math.cos(math.pi * s / cfg.steps)))
    rng = random.Random(cfg.seed)                      # training maze seeds: keyed by --seed only
    model.train()
    losses = []
    for _ in (bar := tqdm(range(cfg.steps), desc="sft", mininterval=2)):
        ids, labels = (x.to(device) for x in sft_batch(tokenizer, train_mazes(cfg.size, cfg.batch_size, rng)))
        # No attention mask: padding is on the right, so no real token attends to a pad; pads carry no loss.
        logits = model(input_ids=ids).logits                                 # (B, T, V)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                               ignore_index=-100)                            # mean over completion tokens
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.4f}", lr=f"{sched.get_last_lr()[0]:.2e}")
    return losses

def evaluate_mazes(engine, tokenizer, grids, n, seed, max_new_tokens=None, temperature=1.0, top_p=1.0, top_k=0):
    """Sample n completions per maze through a rollout engine and count the correct ones.
    Returns {"strict": [c_i], "walk": [c_i], "truncated": [c_i], "first": [text]}: per maze, the samples correct
    under each rule (pass@1 = sum(c) / (n * len(grids))), those stopped for length, and the first one decoded.
    A maze's samples are seeded by (seed, the maze itself) alone (why: DESIGN.md, "The maze")."""
    res = {**{key: [0] * len(grids) for key in (*RULES, "truncated")}, "first": [None] * len(grids)}
    if not grids:
        return res
    prompts = encode(tokenizer, [prompt_text(g) for g in grids])
    seeds = [rollout.mix_seed(seed, zlib.crc32("\n".join(g).encode())) for g in grids]
    out = engine.generate(prompts, n, seeds, max_new_tokens=max_new_tokens or max_new_tokens_for(len(grids[0])),
                          stop_token_ids=[EOS], temperature=temperature, top_p=top_p, top_k=top_k)
    for i, ids, reason in zip(out.prompt_index, out.token_ids, out.finish_reason):
        tokens = tokenizer.convert_ids_to_tokens(ids)
        res["truncated"][i] += reason == "length"
        for rule in RULES:
            res[rule][i] += int(maze_reward(grids[i], tokens, rule))
        if res["first"][i] is None:
            res["first"][i] = " ".join(tokens)
    return res

def make_task(cfg, tokenizer, model_type):
    """--task maze (train.py's TASKS): maze_task of --maze_size (0: the checkpoint's) and the other maze flags."""
    return maze_task(tokenizer, cfg.maze_size or checkpoint_size(cfg.model), cfg.seed, cfg.maze_reward,
                     cfg.eval_mazes, cfg.eval_samples)

def check_flags(cfg):
    """train.py's maze flag check, before any work: --maze_size 0 (from sft.json) or odd in [MIN_SIZE, 17]."""
    check(cfg.maze_size == 0 or (cfg.maze_size % 2 == 1 and MIN_SIZE <= cfg.maze_size <= 17),
          f"--maze_size {cfg.maze_size}: expected 0 or an odd number in [{MIN_SIZE}, 17]")
    check(cfg.maze_size or (Path(cfg.model) / "sft.json").is_file(), f"--model {cfg.model}: no sft.json (not a "
          "maze.py checkpoint), so no maze size; pass --maze_size")

def maze_task(tokenizer, size, seed, rule="strict", eval_mazes=256, eval_samples=4, **sampling):
    """The maze as a Task (fgrpo_utils.task): training maze i keyed by (seed, i) alone, reward `rule`, the first
    eval_mazes held-out mazes (none if 0) with eval_samples samples each, drawn with `sampling` (evaluate_mazes')."""
    def prompt(i):
        grid = train_mazes(size, 1, random.Random(rollout.mix_seed(seed, i)))[0]
        return encode(tokenizer, [prompt_text(grid)])[0], grid

    def score(grids, completions):
        return [maze_reward(g, tokenizer.convert_ids_to_tokens(c), rule) for g, c in zip(grids, completions)], {}

    def evaluate(engine, rank, world):         # the mazes split over ranks; a rank may get none
        grids = heldout_mazes(size, eval_mazes)[rank::world]
        res = evaluate_mazes(engine, tokenizer, grids, eval_samples, seed, **sampling)
        return {key: res[key] for key in (rule, *(r for r in RULES if r != rule), "truncated")}  # rule first

    return Task(prompt, score, stop_token_ids=[EOS], max_new_tokens=max_new_tokens_for(size),
                show=lambda ids: " ".join(tokenizer.convert_ids_to_tokens(ids)),
                evaluate=evaluate if eval_mazes else None, eval_samples=eval_samples)

def checkpoint_size(path):
    """The maze size a checkpoint directory was trained on (its sft.json, which train.py copies)."""
    return json.loads((Path(path) / "sft.json").read_text())["config"]["size"]

# -----------------------------------------------------------------------------
# Entry point
@dataclass
class Config:
    size: int = 9                 # grid side, odd, 7..17; 17 = the paper's mazes
    steps: int = 900              # SFT steps; 1,500 at paper scale
    batch_size: int = 32          # mazes per step (App. K)
    lr: float = 5e-4              # peak lr of the cosine schedule
    out_dir: str = "out/maze_sft"   # absent, or a checkpoint of ours, which is replaced; anything else is refused
    eval_mazes: int = 256         # held-out mazes (the paper's count); 0 skips the evaluation
    eval_samples: int = 4         # samples per held-out maze at temperature 1.0
    maze_reward: str = "strict"   # the rule the any-correct and mixed fractions use; pass@1 is printed for both
    seed: int = 0                 # model init, training maze draws and evaluation samples
    device: str = "auto"          # auto | cpu | cuda | cuda:N
    threads: int = 0              # torch CPU threads; 0 = all cores
    show_seed: int = -1           # >= 0: print maze `show_seed` with its shortest path and exit

    @staticmethod
    def choices():
        return {"maze_reward": RULES}

    def __post_init__(self):
        check(self.size % 2 == 1 and MIN_SIZE <= self.size <= 17,
              f"--size: expected an odd number in [{MIN_SIZE}, 17] (17 fills 512 positions), got {self.size}")
        check_min(self, 1, "steps", "batch_size", "eval_samples")
        check_min(self, 0, "eval_mazes", "threads", "seed")
        check_min(self, -1, "show_seed")
        check_positive(self, "lr")
        check_choices(self)
        check(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
              f"--device: expected auto, cpu or cuda[:N], got {self.device!r}")
        check_device(self.device)
        if self.show_seed < 0:                        # --show_seed only prints
            check_out_dir(self.out_dir)

def main(cfg):
    torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
    if cfg.show_seed >= 0:
        grid = make_maze(cfg.size, cfg.show_seed)
        path = solve(grid)
        print(render(grid, path) + f"\n\nshortest path ({len(path)} moves): {completion_text(path)}")
        print(f"held out: {is_heldout(grid)}; prompt: {prompt_len(cfg.size)} tokens")
        return
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    torch.manual_seed(cfg.seed)
    tokenizer, model = build_tokenizer(), build_model().to(device)
    print(f"config: {asdict(cfg)} | device {device} | {sum(p.numel() for p in model.parameters()):,} params")

    heldout = heldout_mazes(cfg.size, cfg.eval_mazes)
    lengths = dict(sorted(Counter(len(solve(g)) for g in heldout or heldout_mazes(cfg.size, 256)).items()))
    mean_len = sum(k * v for k, v in lengths.items()) / sum(lengths.values())
    print(f"held-out shortest-path lengths (moves: count), mean {mean_len:.1f}: {lengths}")

    t0 = time.time()
    losses = sft(model, tokenizer, cfg, device)
    info = dict(config=asdict(cfg), device=device, sft_seconds=round(time.time() - t0, 1),
                final_loss=sum(losses[-20:]) / len(losses[-20:]), losses=[round(x, 4) for x in losses],
                path_lengths=lengths, mean_path_length=mean_len,
                versions=dict(torch=torch.__version__, transformers=transformers.__version__))
    print(f"sft: {cfg.steps} steps in {info['sft_seconds']}s, loss (last 20) {info['final_loss']:.4f}")
    save_sft(model, tokenizer, cfg.out_dir, info)
    if not heldout:
        return

    # Evaluate the checkpoint as saved: what train.py will start RL from.
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(cfg.out_dir).to(device).eval()
    engine = rollout.TorchEngine(model, pad_token_id=PAD)
    res = evaluate_mazes(engine, tokenizer, heldout, cfg.eval_samples, cfg.seed)
    c, n = res[cfg.maze_reward], cfg.eval_samples
    info["eval"] = dict(mazes=len(heldout), samples=n, temperature=1.0, rule=cfg.maze_reward,
                        **{f"pass1_{rule}": sum(res[rule]) / (n * len(heldout)) for rule in RULES},
                        **{f"pass@{n}_{rule}": pass_at_k_curve(n, res[rule])[n] for rule in RULES},
                        solved_any=sum(x > 0 for x in c) / len(heldout),
                        mixed=sum(0 < x < n for x in c) / len(heldout),
                        seconds=round(time.time() - t0, 1), strict=res["strict"], walk=res["walk"])
    atomic_write_json(Path(cfg.out_dir) / "sft.json", info)
    e = info["eval"]
    print(f"maze 0 sample: {res['first'][0]}\n{render(heldout[0], res['first'][0].split())}")
    print(f"held-out ({len(heldout)} mazes x {n} samples, T=1.0): pass@1 strict {e['pass1_strict']:.3f} "
          f"walk {e['pass1_walk']:.3f} | pass@{n} strict {e[f'pass@{n}_strict']:.3f} walk {e[f'pass@{n}_walk']:.3f} "
          f"| {cfg.maze_reward}: any-correct {e['solved_any']:.3f}, mixed {e['mixed']:.3f} | eval {e['seconds']}s")

if __name__ == "__main__":
    main(parse_config(Config, doc=__doc__))
