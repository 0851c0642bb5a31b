"""
The task contract: what train.py needs from a task (toy_task.py is the template to copy).
"""
from dataclasses import dataclass
from typing import Callable

@dataclass
class Task:
    """What a task gives the trainer; train.py's --task NAME builds one through its row in TASKS (TaskEntry).

    prompt(i) -> (prompt_ids, answer): training prompt i, a global index (step * prompts_per_step + ...),
        the same on every rank and world size; `answer` is whatever score needs.
    score(answers, completions) -> (rewards, stats): a reward per completion (a list of token ids) and a
        {name: count} summed over ranks, logged as reward/NAME ({} for none). A reward is 1.0 correct, 0.0
        not, or partial credit in [0, 1] (advantage.success_rate refuses others): then mu_hat of Eq. 11 is
        the group's mean reward, and groups/all_correct, all_wrong count groups all at 1.0 or all at 0.0.
    evaluate(engine, rank, world) -> {name: [c_i]}: optional (None: no held-out set). For each problem of
        this rank's share of the held-out set, how many of its eval_samples samples are correct under each
        reward rule (the training rule first), or count another event (the maze: truncated). train.py logs
        pass@k of each over all ranks as eval/NAME/pass@k; evaluate.py keeps the counts for its tests."""
    prompt: Callable
    score: Callable
    stop_token_ids: list              # a rollout ends at the first of these (included in the completion)
    max_new_tokens: int               # the response budget; a rollout that reaches it is "length"-truncated
    show: Callable                    # completion ids -> text for the sample log line
    num_prompts: int | None = None    # the dataset size (None: generated, unbounded); saved in run.json
    evaluate: Callable | None = None
    eval_samples: int = 0             # samples per held-out problem in evaluate

@dataclass(frozen=True)
class TaskEntry:
    """A row of train.py's TASKS: how --task NAME builds its Task and checks its flags."""
    make: Callable                      # (cfg, tokenizer, model_type) -> Task; model_type picks math's chat template
    tokenizer: Callable | None = None   # () -> the task's own tokenizer, for --model tiny without --tokenizer
    model: Callable | None = None       # () -> a random policy for that tokenizer (None: policy.tiny_qwen's)
    flags: tuple = ()                   # the task flags it reads; the others must keep their defaults
    check: Callable | None = None       # (cfg) -> None: its flags and inputs, ValueError('--flag ...') if wrong
    packages: Callable | None = None    # (cfg) -> [(package, needed, flag, fix)] beyond requirements.txt
    partial: bool = False               # rewards anywhere in [0, 1], not only 0 and 1 (--weighting refuses some)
