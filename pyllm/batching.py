"""Several requests on one model at once: their steps, batched.

A server with `--parallel N` runs up to N generations at the same time, each
on its own thread and its own KV-cache sequence. Their forward steps meet
here. One step runs at a time; the decode steps of the generations that are
waiting together (one token each, or a speculative step's few) run as one
step over the rows of all of them (Backend.forward_batch), so each weight is
read once for every sequence: on a memory-bound machine N replies cost about
what one does. A step whose rows are not all wanted (a prompt chunk: only its
last row's logits) joins a batch as its first rows, so that the replies under
way go on while a new prompt is read (llama-server's continuous batching); one
such chunk a step (the engine cuts prompts into chunks that leave room for the
others' rows).

There is no scheduler thread: the thread whose step is due runs the batch it
belongs to (or the oldest one) and hands every other thread its rows. A batch
starts when every generation in progress has its step queued, or MAX_WAIT_S
after the later of its oldest step's queueing and the end of the last step
(the generations that step served sample their next token meanwhile; without
that grace they would fall behind and the steps would split into two groups
taking turns). A generation busy elsewhere, e.g. writing to a slow client,
holds the others up no longer than that.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence as Seq

import numpy as np

MAX_WAIT_S = 0.005   # how long a queued step waits for the other generations' steps


@dataclass
class _Step:
    tokens: list[int]
    start: int
    table: list[int]
    n_out: int
    media: Optional[np.ndarray] = None    # an image's rows (Backend.forward)
    bidirectional: bool = False
    rope_pos: Optional[np.ndarray] = None  # M-RoPE positions (Backend.forward)
    queued_at: float = field(default_factory=time.perf_counter)
    logits: Optional[np.ndarray] = None
    error: Optional[BaseException] = None
    done: bool = False

    @property
    def alone(self) -> bool:
        """A step of media rows, bidirectional or with M-RoPE positions: it runs by itself,
        never beside others."""
        return self.media is not None or self.bidirectional or self.rope_pos is not None

    @property
    def batchable(self) -> bool:
        """Every row's logits are wanted: its rows can join other sequences' in one step."""
        return self.n_out == len(self.tokens) and not self.alone


class StepBatcher:
    """Runs the steps that several threads ask for on one backend: one at a
    time, with the steps of generations that are waiting together batched."""

    def __init__(self, backend, max_wait_s: float = MAX_WAIT_S):
        self.backend = backend
        self.max_rows = backend.n_batch         # rows one step holds
        self.max_out = backend.n_out_max        # rows of logits it returns
        self.max_wait_s = max_wait_s
        self.batching = getattr(backend, "batches_sequences", False)   # else: one step after another
        self._cv = threading.Condition()
        self._queue: list[_Step] = []
        self._running = False
        self._free_since = 0.0            # when the last step ended
        self._members = 0                 # generations in progress (they will ask for steps again)
        self.batches = 0                  # steps run, and how many sequences' steps they held
        self.batched_steps = 0
        self.chunks_along = 0             # prompt chunks that rode along with decode steps

    def join(self) -> None:
        """A generation starts: until it leaves, batches wait (briefly) for its next step."""
        with self._cv:
            self._members += 1

    def leave(self) -> None:
        with self._cv:
            self._members -= 1
            self._cv.notify_all()     # a batch waiting for this one's step can start

    def forward(self, tokens: Seq[int], start_pos: int, block_table: Seq[int], n_out: int,
                media: Optional[np.ndarray] = None, bidirectional: bool = False,
                rope_pos: Optional[np.ndarray] = None) -> np.ndarray:
        """As Backend.forward, from any thread; returns a copy of the logits rows. A step
        with media rows, bidirectional or with M-RoPE positions runs alone."""
        step = _Step(list(tokens), start_pos, list(block_table), n_out, media, bool(bidirectional), rope_pos)
        with self._cv:
            self._queue.append(step)
            self._cv.notify_all()
        while True:
            with self._cv:
                while not step.done and (self._running or not self._due()):
                    self._cv.wait(self._wait_time())
                if step.done:
                    break
                batch = self._take()
                self._running = True
            try:
                self._run(batch)
            finally:
                with self._cv:
                    self._running = False
                    self._free_since = time.perf_counter()
                    self._cv.notify_all()
        if step.error is not None:
            raise step.error
        return step.logits

    # -- under the lock ------------------------------------------------------------------------
    def _due(self) -> bool:
        if not self._queue or not self.batching:
            return bool(self._queue)
        return len(self._queue) >= self._members or time.perf_counter() >= self._deadline()

    def _deadline(self) -> float:
        return max(self._queue[0].queued_at, self._free_since) + self.max_wait_s

    def _wait_time(self) -> Optional[float]:
        if self._running or not self._queue:
            return None      # woken when the step running ends, or a step is queued
        return max(0.0, self._deadline() - time.perf_counter())

    def _take(self) -> list[_Step]:
        """The oldest queued step, with whatever fits beside it: every batchable step, and
        one prompt chunk (it goes first: the logits rows a step returns are its last)."""
        first = self._queue.pop(0)
        if not self.batching or first.alone:
            return [first]
        chunk = None if first.batchable else first
        batch = [] if chunk else [first]
        rows = len(first.tokens)
        outs = first.n_out
        for s in list(self._queue):
            if s.alone:
                continue
            if s.batchable:
                fits = outs + s.n_out <= self.max_out
            else:
                fits = chunk is None
            if fits and rows + len(s.tokens) <= self.max_rows:
                if s.batchable:
                    batch.append(s)
                else:
                    chunk = s
                rows, outs = rows + len(s.tokens), outs + s.n_out
                self._queue.remove(s)
        return ([chunk] if chunk else []) + batch

    # -- outside the lock ----------------------------------------------------------------------
    def _run(self, batch: list[_Step]) -> None:
        try:
            if len(batch) == 1:
                s = batch[0]
                media = {"media": s.media, "bidirectional": s.bidirectional, "rope_pos": s.rope_pos} \
                    if s.alone else {}
                s.logits = self.backend.forward(s.tokens, s.start, s.table, s.n_out, **media).copy()
            else:   # the logits rows: each step's last n_out rows (a prompt chunk's only where it is first)
                rows = self.backend.forward_batch([(s.tokens, s.start, s.table) for s in batch],
                                                  sum(s.n_out for s in batch))
                row = 0
                for s in batch:
                    s.logits = rows[row:row + s.n_out].copy()
                    row += s.n_out
        except BaseException as e:   # each waiting thread raises it
            for s in batch:
                s.error = e
        self.batches += 1
        self.batched_steps += len(batch)
        self.chunks_along += len(batch) > 1 and not batch[0].batchable
        for s in batch:
            s.done = True
