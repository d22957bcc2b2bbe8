"""HellaSwag, as llama-perplexity --hellaswag scores it: which of four endings
the model finds likeliest after a context.

The file is llama.cpp's (hellaswag_val_full.txt from its CI datasets): six
lines per task, the context ("activity label: context"), the index of the
right ending (0..3), then the four endings. Each ending is scored as

    tokens = tokenize(context + " " + ending)   (BOS as the vocabulary says)
    score  = mean over the tokens after the part all four share of log p(token | those before)

run from an empty context; the task is right when the right ending scores
highest (the first of equal scores, as llama.cpp). acc_norm is the share of
right tasks so far, with its 95% Wilson score interval, printed after each
task as llama.cpp prints it. llama.cpp draws its tasks at random (400 by
default, its --hellaswag-tasks) where pyllm takes the file's first ones: the
scores compare over the whole file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from .errors import InvalidArgumentError
from .perplexity import LogitsOf, nll_of_rows, scored_rows

Z95 = 1.95996398454   # the normal quantile of a two-sided 95% interval


@dataclass
class Task:
    context: str
    gold: int
    endings: list[str]


def read_tasks(text: str) -> list[Task]:
    """The tasks of a llama.cpp HellaSwag file (six lines each)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or len(lines) % 6:
        raise InvalidArgumentError(f"a HellaSwag file has six lines per task (context, the right ending's index, "
                                   f"four endings), not {len(lines)} lines: is this hellaswag_val_full.txt?")
    tasks = []
    for i in range(0, len(lines), 6):
        gold = lines[i + 1].strip()
        if gold not in ("0", "1", "2", "3"):
            raise InvalidArgumentError(f"HellaSwag task {i // 6 + 1} (line {i + 2}): the right ending's index is "
                                       f"0..3, not {gold!r}")
        tasks.append(Task(lines[i], int(gold), lines[i + 2:i + 6]))
    return tasks


def ending_scores(logits_of: LogitsOf, endings: Sequence[Sequence[int]]) -> list[float]:
    """Each token list's mean log-probability over the tokens after the prefix all share."""
    shared = 0
    while all(len(e) > shared for e in endings) and len({e[shared] for e in endings}) == 1:
        shared += 1
    if shared == 0:
        raise InvalidArgumentError("the endings share no first token: HellaSwag scores them after a context")
    scores = []
    for tokens in endings:
        if len(tokens) == shared:      # an ending that adds no token scores nothing
            scores.append(-math.inf)
            continue
        nll = np.concatenate([nll_of_rows(rows, targets)
                              for rows, targets in scored_rows(logits_of, list(tokens), shared - 1)])
        scores.append(-float(nll.mean()))
    return scores


def wilson(right: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of right / n."""
    p, z = right / n, Z95 * Z95 / n
    spread = z * math.sqrt(n * (4.0 * p * (1 - p) + z)) / (2 * Z95)
    return (p + z / 2 - spread) / (1 + z), (p + z / 2 + spread) / (1 + z)


@dataclass
class HellaSwag:
    tasks: int = 0
    right: int = 0
    picks: list[int] = field(default_factory=list)   # the ending chosen for each task

    @property
    def acc_norm(self) -> float:
        return self.right / self.tasks if self.tasks else 0.0

    def as_dict(self) -> dict:
        lo, hi = wilson(self.right, self.tasks) if self.tasks else (0.0, 0.0)
        return {"tasks": self.tasks, "right": self.right, "acc_norm": self.acc_norm, "interval_95": [lo, hi],
                "picks": self.picks}


def hellaswag(logits_of: LogitsOf, tokenize: Callable[[str], list[int]], tasks: Sequence[Task],
              max_tasks: Optional[int] = None,
              on_task: Optional[Callable[[int, HellaSwag], None]] = None) -> HellaSwag:
    """acc_norm over the first max_tasks tasks (all: None); on_task(i, so far) after each."""
    if max_tasks is not None and max_tasks < 1:
        raise InvalidArgumentError(f"the number of tasks must be at least 1, not {max_tasks}")
    result = HellaSwag()
    for i, task in enumerate(tasks[:max_tasks]):
        scores = ending_scores(logits_of, [tokenize(task.context + " " + e) for e in task.endings])
        pick = int(np.argmax(scores))
        result.picks.append(pick)
        result.tasks += 1
        result.right += pick == task.gold
        if on_task is not None:
            on_task(i, result)
    return result
