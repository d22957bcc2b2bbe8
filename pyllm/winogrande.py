"""Winogrande, as llama-perplexity --winogrande scores it: which of two names
fills the blank of a sentence.

The file is the CSV llama.cpp reads (index, sentence with a "_", choice 1,
choice 2, answer 1 or 2; a sentence with commas in quotes; lines that do not
parse, such as a header, are skipped). For each choice the sentence is
tokenized with the blank filled (BOS as the vocabulary says), and scored as
the mean log-probability of the tokens after the choice, the last one left
out (when more than 3 tokens follow the part the two sentences share; else of
the tokens after that part). The higher score answers; a tie answers 2, as
llama.cpp. With --winogrande-tasks N the tasks are drawn as llama.cpp draws
them (its std::mt19937 seeded with 1), so the same N tasks are scored.

(Where the choices leave 3 tokens or fewer after the shared part, llama.cpp
reads the second choice's first token from the wrong logits, its own FIXME;
pyllm reads the right ones, so such rare tasks may score differently.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from .errors import InvalidArgumentError
from .perplexity import LogitsOf, nll_of_rows, scored_rows

MIN_TRAILING = 3    # llama.cpp's k_min_trailing_ctx: more tokens than this after the shared part skip the choice


@dataclass
class Task:
    first: str          # the sentence before the blank
    second: str         # after it
    choices: tuple[str, str]
    answer: int         # 1 or 2


def read_tasks(text: str) -> list[Task]:
    """The tasks of a Winogrande CSV, as llama.cpp parses it (module docstring)."""
    tasks = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        commas, quoted = [], False
        for i, ch in enumerate(line):
            if ch == '"':
                quoted = not quoted
            elif ch == "," and not quoted:
                commas.append(i)
                if len(commas) == 4:
                    break
        if len(commas) < 4:
            continue
        a, b, c, d = commas
        sentence = line[a + 2:b - 1] if line[a + 1:a + 2] == '"' else line[a + 1:b]
        answer = line[d + 1:].strip()
        blank = sentence.find("_")
        if blank < 0 or answer not in ("1", "2"):
            continue
        tasks.append(Task(sentence[:blank], sentence[blank + 1:], (line[b + 1:c], line[c + 1:d]), int(answer)))
    if not tasks:
        raise InvalidArgumentError("no Winogrande tasks in the file: its lines are index,sentence with a _,choice "
                                   "1,choice 2,answer (1 or 2), as llama.cpp's winogrande-debiased-eval.csv")
    return tasks


def mt19937(seed: int):
    """The 32-bit Mersenne Twister (C++'s std::mt19937), as a generator of its outputs."""
    n, m = 624, 397
    state = [seed & 0xFFFFFFFF]
    for i in range(1, n):
        state.append((1812433253 * (state[-1] ^ (state[-1] >> 30)) + i) & 0xFFFFFFFF)
    while True:
        for i in range(n):
            y = (state[i] & 0x80000000) | (state[(i + 1) % n] & 0x7FFFFFFF)
            state[i] = state[(i + m) % n] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        for y in state:
            y ^= y >> 11
            y ^= (y << 7) & 0x9D2C5680
            y ^= (y << 15) & 0xEFC60000
            yield y ^ (y >> 18)


def draw(items: Sequence, n: int) -> list:
    """n of items drawn without replacement as llama-perplexity draws Winogrande (and
    multiple-choice) tasks: j = int(scale * rng() * left) in float32, the drawn one
    replaced by the last."""
    rng, scale = mt19937(1), np.float32(1.0 / 4294967296.0)
    left, out = list(range(len(items))), []
    for _ in range(n):
        j = int(scale * np.float32(next(rng)) * np.float32(len(left)))
        j = min(j, len(left) - 1)     # a draw that rounds up to 1.0
        out.append(items[left[j]])
        left[j] = left[-1]
        left.pop()
    return out


def choice_scores(logits_of: LogitsOf, tokenize: Callable[[str], list[int]], task: Task) -> tuple[float, float]:
    """Each choice's mean log-probability over the tokens it is scored on (module docstring)."""
    seqs = [tokenize(task.first + c + task.second) for c in task.choices]
    shared = 0
    while shared < min(map(len, seqs)) and seqs[0][shared] == seqs[1][shared]:
        shared += 1
    skip_choice = all(len(s) - shared > MIN_TRAILING for s in seqs)
    scores = []
    for seq, choice in zip(seqs, task.choices):
        base = len(tokenize(task.first + choice)) if skip_choice else shared
        last = 1 if len(seq) - base > 1 else 0
        count = len(seq) - base - last
        if count < 1 or base < 1:
            scores.append(-math.inf)
            continue
        nll = np.concatenate([nll_of_rows(rows, targets) for rows, targets in scored_rows(logits_of, seq, base - 1)])
        scores.append(-float(nll[:count].mean()))
    return scores[0], scores[1]


@dataclass
class Winogrande:
    tasks: int = 0
    right: int = 0
    answers: list[int] = field(default_factory=list)   # the choice (1 or 2) given to each task

    @property
    def score(self) -> float:
        return self.right / self.tasks if self.tasks else 0.0

    @property
    def error(self) -> float:
        """The standard error of the score (llama.cpp's "+/-")."""
        p = self.score
        return math.sqrt(p * (1 - p) / (self.tasks - 1)) if self.tasks > 1 else 0.0

    def as_dict(self) -> dict:
        return {"tasks": self.tasks, "right": self.right, "score": self.score, "error": self.error,
                "answers": self.answers}


def winogrande(logits_of: LogitsOf, tokenize: Callable[[str], list[int]], tasks: Sequence[Task],
               n_tasks: Optional[int] = None,
               on_task: Optional[Callable[[int, Winogrande, tuple[float, float], Task], None]] = None) -> Winogrande:
    """The share of tasks answered right, over n_tasks drawn as llama.cpp draws them (all: None);
    on_task(i, so far, the two scores, the task) after each."""
    if n_tasks is not None and n_tasks < 1:
        raise InvalidArgumentError(f"the number of tasks must be at least 1, not {n_tasks}")
    if n_tasks is not None and n_tasks < len(tasks):
        tasks = draw(tasks, n_tasks)
    result = Winogrande()
    for i, task in enumerate(tasks):
        s1, s2 = choice_scores(logits_of, tokenize, task)
        answer = 1 if s1 > s2 else 2
        result.answers.append(answer)
        result.tasks += 1
        result.right += answer == task.answer
        if on_task is not None:
            on_task(i, result, (s1, s2), task)
    return result
