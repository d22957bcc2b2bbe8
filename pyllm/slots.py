"""Conversations that run at once on one model: a server's `--parallel N`.

A slot is one conversation's place in the model: its sequence in the KV
cache and the text and tokens of its last chat, so that its next turn
reuses them (llama-server's slots). A thread takes a free slot for the
length of a request; while it holds it, the Model's generate, stream and
chat on that thread run on the slot (Model.parallel). Requests beyond N wait
for a slot. Free slots keep their cache for the next request, the one
released last going first (one client's next turn finds its own); when the
KV cache runs out, the least recently used free slot gives its blocks back
(its full blocks stay cached, reusable by their hash).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

from .errors import InvalidArgumentError
from .kv_cache import Sequence


@dataclass
class Slot:
    seq: Sequence
    chat_cache: list = field(default_factory=list)   # (text, tokens) of the last chat (Model._chat_prompt)
    released_at: float = 0.0

    def forget(self) -> None:
        """Lets the conversation go: its blocks back to the pool, its last chat forgotten."""
        self.seq.release()
        self.chat_cache = []


class Slots:
    def __init__(self, engine, n: int):
        self.slots = [Slot(engine.new_sequence()) for _ in range(n)]
        self._free = list(self.slots)      # the last released at the end
        self._cv = threading.Condition()
        self._local = threading.local()
        self.waiting = 0   # threads waiting for a free slot
        engine.pool.reclaim = self.reclaim

    def __len__(self) -> int:
        return len(self.slots)

    def states(self) -> list[tuple[Slot, bool]]:
        """Each slot and whether a request holds it."""
        with self._cv:
            return [(slot, slot not in self._free) for slot in self.slots]

    @property
    def current(self) -> Optional[Slot]:
        """The slot this thread holds, if any."""
        return getattr(self._local, "slot", None)

    @contextmanager
    def take(self, slot_id: Optional[int] = None) -> Iterator[Slot]:
        """Holds a free slot (waiting for one) for this thread until the block ends: the one
        freed last, or slot `slot_id` (llama-server's id_slot)."""
        if slot_id is not None and not 0 <= slot_id < len(self.slots):
            raise InvalidArgumentError(f"no slot {slot_id}: there are slots 0..{len(self.slots) - 1}")
        want = None if slot_id is None else self.slots[slot_id]
        with self._cv:
            self.waiting += 1
            try:
                while not self._free if want is None else want not in self._free:
                    self._cv.wait()
            finally:
                self.waiting -= 1
            if want is None:
                slot = self._free.pop()
            else:
                self._free.remove(want)
                slot = want
        self._local.slot = slot
        try:
            yield slot
        finally:
            self._local.slot = None
            with self._cv:
                slot.released_at = time.monotonic()
                self._free.append(slot)
                self._cv.notify_all()   # a thread may be waiting for this very slot

    def index(self, slot: Slot) -> int:
        return self.slots.index(slot)

    def reclaim(self) -> bool:
        """The KV cache is full: the least recently used free slot that holds blocks lets
        them go. False when no free slot holds any. (Called by the pool, under its lock.)"""
        with self._cv:
            holding = [s for s in self._free if s.seq.blocks]
            if not holding:
                return False
            min(holding, key=lambda s: s.released_at).forget()
            return True
