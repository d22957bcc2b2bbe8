"""The paged KV cache: which blocks a sequence uses, and reusing prefixes.

Memory for K and V belongs to the backend (one pool of `n_blocks` blocks of
`block_size` positions per layer); this module only hands out block ids.

A sequence is a list of block ids; position p lives in block p // B at slot
p % B. Full blocks are keyed by a hash of every token up to their end, so a
later sequence starting with the same tokens (the next chat turn, a second
request with the same system prompt) takes the blocks instead of computing
them again. Blocks are reference counted; a full block nobody uses stays
cached until the pool needs it (least recently released goes first). A full,
hashed block is never written again: a sequence that diverges inside one
gives it up and recomputes from the block's start.

A recurrent model (Mamba's layers) also carries a state from position to
position, one per model: it holds exactly the tokens one sequence ran, its
owner. Such a sequence keeps its cached prefix only when that is the whole of
what it ran and it still owns the state; otherwise it starts again from
position 0 (no prefix is taken from other sequences either).

Several threads may hold sequences of one pool (a server's parallel
requests): the pool's lock makes each sequence operation atomic, and a pool
that runs out asks its `reclaim` hook (idle conversations) to give blocks back.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Callable, Optional, Sequence as Seq

import numpy as np

from .errors import ContextFullError


def _chain_hash(parent: bytes, tokens: Seq[int]) -> bytes:
    return hashlib.blake2b(parent + np.asarray(tokens, dtype=np.int32).tobytes(), digest_size=16).digest()


class BlockPool:
    def __init__(self, n_blocks: int, block_size: int, recurrent: bool = False):
        self.n_blocks, self.block_size = n_blocks, block_size
        self.recurrent = recurrent
        self.state_owner: Optional["Sequence"] = None   # recurrent: the sequence the state holds
        self.refs = [0] * n_blocks
        self.hash_of: list[Optional[bytes]] = [None] * n_blocks
        self.by_hash: dict[bytes, int] = {}
        self.free: list[int] = list(range(n_blocks - 1, -1, -1))  # never used: pop from the end
        self.cached: OrderedDict[int, None] = OrderedDict()         # refs == 0 but hashed
        self.lock = threading.RLock()     # sequences of several threads
        self.reclaim: Optional[Callable[[], bool]] = None   # frees an idle sequence's blocks; False: none left

    def allocate(self) -> int:
        while not (self.free or self.cached) and self.reclaim is not None and self.reclaim():
            pass
        if self.free:
            b = self.free.pop()
        elif self.cached:
            b, _ = self.cached.popitem(last=False)    # evict the least recently released
            del self.by_hash[self.hash_of[b]]
            self.hash_of[b] = None
        else:
            raise ContextFullError("the KV cache is full; use a larger context (-c) or a shorter prompt")
        self.refs[b] = 1
        return b

    def take(self, b: int) -> None:
        if self.refs[b] == 0:
            self.cached.pop(b, None)
        self.refs[b] += 1

    def release(self, b: int) -> None:
        self.refs[b] -= 1
        if self.refs[b] == 0:
            if self.hash_of[b] is not None:
                self.cached[b] = None
            else:
                self.free.append(b)

    def register(self, b: int, h: bytes) -> None:
        """Marks full block b as holding the prefix with hash h."""
        if h in self.by_hash or self.hash_of[b] is not None:
            return
        self.hash_of[b] = h
        self.by_hash[h] = b

    def unregister(self, b: int) -> None:
        """Block b is about to be rewritten: it no longer holds its prefix."""
        h = self.hash_of[b]
        if h is not None:
            del self.by_hash[h]
            self.hash_of[b] = None

    def forget_cached(self) -> None:
        """Drops every cached prefix nobody holds (benchmarks: each run computes its prompts)."""
        with self.lock:
            for b in self.cached:
                self.unregister(b)
                self.free.append(b)
            self.cached.clear()

    def lookup(self, h: bytes) -> Optional[int]:
        return self.by_hash.get(h)

    @property
    def n_used(self) -> int:
        return sum(1 for r in self.refs if r > 0)


class Sequence:
    """The tokens whose K/V a sequence holds, and the blocks holding them."""

    def __init__(self, pool: BlockPool, n_ctx: int):
        self.pool, self.n_ctx = pool, n_ctx
        self.tokens: list[int] = []       # tokens whose K/V is in the cache, in order
        self.blocks: list[int] = []
        self._hashes: list[bytes] = []    # chain hash of each full block

    def __len__(self) -> int:
        return len(self.tokens)

    def reuse_prefix(self, tokens: Seq[int]) -> int:
        """Keeps (or takes from the pool's cache) the longest cached prefix of
        `tokens`; returns its length: the positions that need no compute.
        At least one token is always left to compute, so a step has logits."""
        with self.pool.lock:
            B = self.pool.block_size
            keep = 0
            limit = min(len(self.tokens), len(tokens) - 1)
            while keep < limit and self.tokens[keep] == tokens[keep]:
                keep += 1
            if self.pool.recurrent:   # the state holds all of self.tokens, or is another sequence's
                self.truncate(keep if keep == len(self.tokens) and self.owns_state else 0)
                return len(self.tokens)
            self.truncate(keep)
            # extend with full blocks other sequences left in the cache
            while len(self.tokens) % B == 0 and len(self.tokens) + B <= len(tokens) - 1:
                start = len(self.tokens)
                parent = self._hashes[-1] if self._hashes else b""
                h = _chain_hash(parent, tokens[start:start + B])
                b = self.pool.lookup(h)
                if b is None:
                    break
                self.pool.take(b)
                self.blocks.append(b)
                self._hashes.append(h)
                self.tokens.extend(tokens[start:start + B])
            return len(self.tokens)

    def truncate(self, n: int) -> None:
        """Forgets positions n and after. A hashed block another sequence shares is
        never rewritten, so if n falls inside one, that whole block goes too; one
        this sequence holds alone forgets its hash and keeps its first positions."""
        with self.pool.lock:
            B = self.pool.block_size
            n = max(0, min(n, len(self.tokens)))
            if self.pool.recurrent and n < len(self.tokens):
                n = 0   # a state cannot be rewound: from the start
            if n % B and n // B < len(self._hashes):
                b = self.blocks[n // B]
                if self.pool.refs[b] == 1:
                    self.pool.unregister(b)
                else:
                    n = n // B * B
            keep_blocks = (n + B - 1) // B
            for b in self.blocks[keep_blocks:]:
                self.pool.release(b)
            del self.blocks[keep_blocks:]
            del self._hashes[n // B:]
            del self.tokens[n:]

    @property
    def owns_state(self) -> bool:
        """Recurrent: the model's state holds this sequence's tokens."""
        return self.pool.state_owner is self

    def reserve(self, n_new: int) -> None:
        """Makes room for n_new more positions (allocating blocks)."""
        with self.pool.lock:
            total = len(self.tokens) + n_new
            if total > self.n_ctx:
                raise ContextFullError(f"{total} tokens do not fit in the context of {self.n_ctx}; "
                                       f"use a larger context (-c) or a shorter prompt")
            B = self.pool.block_size
            while len(self.blocks) * B < total:
                self.blocks.append(self.pool.allocate())

    def commit(self, tokens: Seq[int]) -> None:
        """Records that the K/V of `tokens` (following the current ones) is now
        in the cache, and registers the blocks they complete."""
        with self.pool.lock:
            B = self.pool.block_size
            self.tokens.extend(int(t) for t in tokens)
            while (len(self._hashes) + 1) * B <= len(self.tokens):
                i = len(self._hashes)
                parent = self._hashes[-1] if self._hashes else b""
                h = _chain_hash(parent, self.tokens[i * B:(i + 1) * B])
                self._hashes.append(h)
                self.pool.register(self.blocks[i], h)

    def release(self) -> None:
        self.truncate(0)
