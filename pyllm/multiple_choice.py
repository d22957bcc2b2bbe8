"""Multiple-choice scoring (ARC, MMLU, TruthfulQA...), as llama-perplexity
--multiple-choice computes it.

The file is llama.cpp's binary one: uint32 n_task, n_task uint32 byte offsets
of the tasks, then each task: the question (uint32 length, bytes), the answers
with one right (uint32 n, n strings, n int32 labels, 1 for right) and a second
set (read, not used, as in llama.cpp). Each answer is scored as HellaSwag's
endings are (pyllm.hellaswag): question + " " + answer tokenized (BOS as the
vocabulary says), the mean log-probability of the tokens after the part all
answers share; the task is right when the likeliest answer is labelled right.
With --multiple-choice-tasks N the tasks are drawn as llama.cpp draws them
(pyllm.winogrande.draw).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from .errors import InvalidArgumentError
from .hellaswag import ending_scores
from .perplexity import LogitsOf
from .winogrande import draw

MAX_ANSWERS = 100   # llama.cpp's limit on a task's answers


@dataclass
class Task:
    question: str
    answers: list[str]
    labels: list[int]


class _Reader:
    """Reads the file's fields, every length checked against what is left."""

    def __init__(self, data: bytes, at: int, what: str):
        self.data, self.at, self.what = data, at, what

    def bad(self, why: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{self.what}: {why}: not a llama.cpp multiple-choice file, or a damaged one")

    def u32(self) -> int:
        if self.at + 4 > len(self.data):
            raise self.bad(f"it ends at byte {len(self.data)}, inside a number")
        (v,) = struct.unpack_from("<I", self.data, self.at)
        self.at += 4
        return v

    def text(self) -> str:
        n = self.u32()
        if self.at + n > len(self.data):
            raise self.bad(f"a text of {n} bytes runs past its end")
        raw = self.data[self.at:self.at + n]
        self.at += n
        return raw.decode("utf-8", "replace")

    def answers(self) -> tuple[list[str], list[int]]:
        n = self.u32()
        if n > MAX_ANSWERS:
            raise self.bad(f"{n} answers (at most {MAX_ANSWERS})")
        answers = [self.text() for _ in range(n)]
        if self.at + 4 * n > len(self.data):
            raise self.bad("the answers' labels run past its end")
        labels = list(struct.unpack_from(f"<{n}i", self.data, self.at))
        self.at += 4 * n
        return answers, labels


def read_tasks(data: bytes, n_tasks: Optional[int] = None) -> list[Task]:
    """The tasks of the file (n_tasks of them drawn as llama.cpp draws them; all: None)."""
    head = _Reader(data, 0, "the multiple-choice file")
    n = head.u32()
    if n == 0 or 4 + 4 * n > len(data):
        raise head.bad(f"{n} tasks do not fit its {len(data)} bytes")
    offsets = [head.u32() for _ in range(n)]
    chosen = range(n) if n_tasks is None or n_tasks >= n else draw(range(n), n_tasks)
    tasks = []
    for i in chosen:
        r = _Reader(data, offsets[i], f"multiple-choice task {i + 1}")
        question = r.text()
        answers, labels = r.answers()
        r.answers()                                   # the second set: read past, as llama.cpp does
        if not question or not answers or any(not a for a in answers):
            raise r.bad("an empty question or answer")
        if labels.count(1) < 1:
            raise r.bad("no answer labelled right")
        tasks.append(Task(question, answers, labels))
    return tasks


@dataclass
class MultipleChoice:
    tasks: int = 0
    right: int = 0
    answers_seen: int = 0
    picks: list[int] = field(default_factory=list)

    @property
    def score(self) -> float:
        return self.right / self.tasks if self.tasks else 0.0

    def error(self, p: float) -> float:
        return math.sqrt(p * (1 - p) / (self.tasks - 1)) if self.tasks > 1 else 0.0

    @property
    def chance(self) -> float:
        """The score of picking an answer at random (llama.cpp's "Random chance")."""
        return self.tasks / self.answers_seen if self.answers_seen else 0.0

    def as_dict(self) -> dict:
        return {"tasks": self.tasks, "right": self.right, "score": self.score, "error": self.error(self.score),
                "random_chance": self.chance, "picks": self.picks}


def multiple_choice(logits_of: LogitsOf, tokenize: Callable[[str], list[int]], tasks: Sequence[Task],
                    on_task: Optional[Callable[[int, MultipleChoice], None]] = None) -> MultipleChoice:
    """The share of tasks whose likeliest answer is a right one; on_task(i, so far) after each."""
    result = MultipleChoice()
    for i, task in enumerate(tasks):
        scores = ending_scores(logits_of, [tokenize(task.question + " " + a) for a in task.answers])
        pick = int(np.argmax(scores))
        result.picks.append(pick)
        result.tasks += 1
        result.answers_seen += len(task.answers)
        result.right += task.labels[pick] == 1
        if on_task is not None:
            on_task(i, result)
    return result


def write_tasks(tasks: Sequence[Task]) -> bytes:
    """The file of `tasks` (the second set of answers empty): for tests and making small sets."""
    def text(s: str) -> bytes:
        raw = s.encode()
        return struct.pack("<I", len(raw)) + raw
    bodies = [text(t.question) + struct.pack("<I", len(t.answers)) + b"".join(map(text, t.answers)) +
              struct.pack(f"<{len(t.labels)}i", *t.labels) + struct.pack("<I", 0) for t in tasks]
    at, offsets = 4 + 4 * len(tasks), []
    for b in bodies:
        offsets.append(at)
        at += len(b)
    return struct.pack(f"<I{len(tasks)}I", len(tasks), *offsets) + b"".join(bodies)
