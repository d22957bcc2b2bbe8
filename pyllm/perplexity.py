"""Perplexity of a text, measured as llama.cpp's llama-perplexity measures it, so
that the numbers compare (a quantization's quality is judged by them).

The text's tokens are cut into chunks of n_ctx tokens (a last partial chunk is
dropped). Each chunk runs from an empty context, its first token replaced by
BOS when the vocabulary adds one, and only its second half is scored, so that
every scored token has at least n_ctx/2 tokens of context: with first = n_ctx//2,
the logits at positions first .. n_ctx-2 predict the tokens after them,

    nll_i = -log softmax(logits_i)[token_{i+1}]        (n_ctx - first - 1 per chunk)

    PPL = exp(mean nll),   error = PPL * sqrt(var(nll) / (count - 1))

(the error is llama.cpp's "+/-": the standard error of the mean nll, carried
through the exponential).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from .errors import InvalidArgumentError

# (start, logits of tokens[start:start + n]) for tokens run from an empty context, from position
# `skip` on (Engine._fresh_logits)
LogitsOf = Callable[[Sequence[int], int], Iterator[tuple[int, np.ndarray]]]


@dataclass
class Perplexity:
    ppl: float                 # exp(mean negative log-likelihood)
    error: float               # its standard error (llama.cpp's "+/-"); 0 when it cannot be estimated
    tokens_scored: int
    chunks: int
    n_ctx: int
    running: list[float] = field(default_factory=list)   # the estimate after each chunk (llama.cpp's [1]..,[2]..)

    def as_dict(self) -> dict:
        return {"ppl": self.ppl, "error": self.error, "tokens_scored": self.tokens_scored, "chunks": self.chunks,
                "n_ctx": self.n_ctx, "running": self.running}


def nll_of_rows(rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(row)[target] for each row: float32 exponentials summed in
    float64, as llama.cpp does."""
    top = rows.max(axis=1)
    picked = rows[np.arange(len(rows)), targets].astype(np.float64)
    shifted = rows - top[:, None]
    sums = np.exp(shifted, out=shifted).sum(axis=1, dtype=np.float64)
    return np.log(sums) - (picked - top)


def chunk_nll(logits_of: LogitsOf, chunk: Sequence[int], first: int) -> np.ndarray:
    """The nll of chunk[first + 1:], each from the logits one position before it."""
    targets = np.asarray(chunk, dtype=np.int64)
    parts = []
    for start, rows in logits_of(chunk, first):
        lo, hi = max(start, first), min(start + len(rows), len(chunk) - 1)   # positions that predict a scored token
        if lo < hi:
            parts.append(nll_of_rows(rows[lo - start:hi - start], targets[lo + 1:hi + 1]))
    return np.concatenate(parts) if parts else np.zeros(0)


def perplexity(logits_of: LogitsOf, tokens: Sequence[int], n_ctx: int, bos_id: Optional[int] = None,
               max_chunks: Optional[int] = None,
               on_chunk: Optional[Callable[[int, int, float], None]] = None) -> Perplexity:
    """The perplexity of `tokens` over chunks of n_ctx (see the module docstring).
    bos_id: the token that starts each chunk (None: the chunk's own first token).
    on_chunk(i, n_chunks, running ppl) is called after each chunk."""
    if n_ctx < 4:
        raise InvalidArgumentError(f"a chunk needs at least 4 tokens, not {n_ctx}")
    n_chunks = len(tokens) // n_ctx
    if max_chunks is not None:
        if max_chunks < 1:
            raise InvalidArgumentError(f"max_chunks must be at least 1 (or None for all), not {max_chunks}")
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks < 1:
        raise InvalidArgumentError(f"the text has {len(tokens)} tokens, fewer than one chunk of {n_ctx}: give a "
                                   f"longer text or a smaller context (-c)")
    first = n_ctx // 2
    nll_sum = nll2_sum = 0.0
    count = 0
    running = []
    for i in range(n_chunks):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        nll = chunk_nll(logits_of, chunk, first)
        nll_sum += float(nll.sum())
        nll2_sum += float((nll * nll).sum())
        count += len(nll)
        running.append(math.exp(nll_sum / count))
        if on_chunk is not None:
            on_chunk(i, n_chunks, running[-1])
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    error = math.sqrt(var / (count - 1)) * math.exp(mean) if var > 0 and count > 1 else 0.0
    return Perplexity(math.exp(mean), error, count, n_chunks, n_ctx, running)
