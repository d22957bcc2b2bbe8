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

KL divergence (llama-perplexity's --kl-divergence-base / --kl-divergence): a
first run saves, for every scored token, the base model's log-probabilities of
the whole vocabulary; a second run, of a quantized (or otherwise changed) model
on the same tokens, measures per token

    KLD = sum_v p_base(v) (log p_base(v) - log p(v))   (terms with log p_base > -16)
    dp  = p(token) - p_base(token)
    same top: argmax p == argmax p_base

The file is llama.cpp's, so either tool reads the other's: "_logits_", int32
n_ctx, n_vocab, n_chunk, the int32 tokens of every chunk, then per scored token
nv = 2 ceil(n_vocab / 2) + 4 uint16: float32 scale and min_log_prob, then each
logit as round((logit - low) / scale), low = max(min logit, max logit - 16),
so log p = scale q + min_log_prob (the logits below low read as min_log_prob:
a true token that unlikely reads as likelier than it was, so the base's PPL
from the file can come out a little low, in llama.cpp's files alike).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional, Sequence

import numpy as np

from .errors import InvalidArgumentError, ModelFileError

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


def scored_rows(logits_of: LogitsOf, chunk: Sequence[int], first: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(logits, the tokens they predict) for chunk[first + 1:], in pieces, each row
    from the position one before its token."""
    targets = np.asarray(chunk, dtype=np.int64)
    for start, rows in logits_of(chunk, first):
        lo, hi = max(start, first), min(start + len(rows), len(chunk) - 1)   # positions that predict a scored token
        if lo < hi:
            yield rows[lo - start:hi - start], targets[lo + 1:hi + 1]


def chunk_nll(logits_of: LogitsOf, chunk: Sequence[int], first: int,
              save: Optional["LogProbsWriter"] = None) -> np.ndarray:
    """The nll of chunk[first + 1:], each from the logits one position before it;
    with save, their log-probabilities are written to a KL divergence base file."""
    parts = []
    for rows, targets in scored_rows(logits_of, chunk, first):
        parts.append(nll_of_rows(rows, targets))
        if save is not None:
            save.add(rows)
    return np.concatenate(parts) if parts else np.zeros(0)


def chunks_of(tokens: Sequence[int], n_ctx: int, max_chunks: Optional[int]) -> int:
    """How many whole chunks of n_ctx tokens are scored (checks the arguments)."""
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
    return n_chunks


def chunk_at(tokens: Sequence[int], i: int, n_ctx: int, bos_id: Optional[int]) -> list[int]:
    """Chunk i as it runs: its first token replaced by BOS when there is one."""
    chunk = [int(t) for t in tokens[i * n_ctx:(i + 1) * n_ctx]]
    if bos_id is not None:
        chunk[0] = bos_id
    return chunk


def perplexity(logits_of: LogitsOf, tokens: Sequence[int], n_ctx: int, bos_id: Optional[int] = None,
               max_chunks: Optional[int] = None,
               on_chunk: Optional[Callable[[int, int, float], None]] = None,
               save: Optional["LogProbsWriter"] = None) -> Perplexity:
    """The perplexity of `tokens` over chunks of n_ctx (see the module docstring).
    bos_id: the token that starts each chunk (None: the chunk's own first token).
    on_chunk(i, n_chunks, running ppl) is called after each chunk. save: a KL
    divergence base file, started here with the chunks' tokens."""
    n_chunks = chunks_of(tokens, n_ctx, max_chunks)
    if save is not None:
        save.start(tokens[:n_chunks * n_ctx], n_ctx)
    first = n_ctx // 2
    nll_sum = nll2_sum = 0.0
    count = 0
    running = []
    for i in range(n_chunks):
        nll = chunk_nll(logits_of, chunk_at(tokens, i, n_ctx, bos_id), first, save)
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


# -- KL divergence against a base model's saved log-probabilities --------------------------------

MAGIC = b"_logits_"
KLD_ROWS = 32           # rows compared at a time
LOG_PROB_FLOOR = 16.0   # logits more than this below the top are stored as the floor (llama.cpp's range)


def record_width(n_vocab: int) -> int:
    """uint16 per scored token in a base file: 2 float32 (4 uint16), then n_vocab values padded to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


def log_softmax_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max logit, log sum exp(logits - max)) of each row, float32 (the sum in float64):
    log p = logit - max - the second."""
    top = rows.max(axis=1)
    shifted = rows - top[:, None]
    sums = np.exp(shifted, out=shifted).sum(axis=1, dtype=np.float64)
    return top, np.log(sums).astype(np.float32)


def encode_log_probs(rows: np.ndarray) -> np.ndarray:
    """uint16 [n, record_width] records of the log-probabilities of float32 logits [n, n_vocab]."""
    n, n_vocab = rows.shape
    top, lse = log_softmax_rows(rows)
    low = np.maximum(rows.min(axis=1), top - np.float32(LOG_PROB_FLOOR))
    scale = (top - low) / np.float32(65535)
    out = np.zeros((n, record_width(n_vocab)), dtype=np.uint16)
    out[:, :4] = np.stack([scale, low - top - lse], axis=1).astype(np.float32).view(np.uint16)
    inv = np.divide(1, scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.minimum(np.rint((rows - low[:, None]) * inv[:, None]), 65535)
    out[:, 4:4 + n_vocab] = np.where(rows > low[:, None], q, 0)
    return out


def decode_log_probs(records: np.ndarray, n_vocab: int) -> np.ndarray:
    """float32 [n, n_vocab] log-probabilities of base-file records."""
    header = np.ascontiguousarray(records[:, :4]).view(np.float32)          # [n, 2]: scale, min_log_prob
    return header[:, :1] * records[:, 4:4 + n_vocab].astype(np.float32) + header[:, 1:2]


class LogProbsWriter:
    """Writes a KL divergence base file as a perplexity run scores its tokens: to
    PATH.part, renamed to PATH when the run finishes (an interrupted run leaves no
    file that looks whole)."""

    def __init__(self, path: str | Path, n_vocab: int):
        self.path, self.n_vocab = Path(path), n_vocab
        self.partial = self.path.with_name(self.path.name + ".part")
        self.out: Optional[BinaryIO] = None

    def start(self, tokens: Sequence[int], n_ctx: int) -> None:
        try:
            self.out = open(self.partial, "wb")
        except OSError as e:
            raise InvalidArgumentError(f"cannot write the KL divergence base file {self.path}: {e.strerror}") from None
        n_chunks = len(tokens) // n_ctx
        self.out.write(MAGIC + np.array([n_ctx, self.n_vocab, n_chunks], dtype="<i4").tobytes())
        self.out.write(np.asarray(tokens, dtype="<i4").tobytes())

    def add(self, rows: np.ndarray) -> None:
        if rows.shape[1] != self.n_vocab:
            raise InvalidArgumentError(f"logits of {rows.shape[1]} tokens for a base file of {self.n_vocab}")
        self.out.write(encode_log_probs(rows).astype("<u2", copy=False).tobytes())

    def close(self, complete: bool) -> None:
        """Closes the file: renamed into place when complete, else removed."""
        if self.out is None:
            return
        self.out.close()
        self.out = None
        if complete:
            self.partial.replace(self.path)
        else:
            self.partial.unlink(missing_ok=True)


class BaseLogProbs:
    """A KL divergence base file (llama-perplexity's --kl-divergence-base), mapped:
    every size is checked against the file's length before anything is read."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(20)
        except OSError as e:
            raise InvalidArgumentError(f"cannot read the KL divergence base file {path}: {e.strerror}") from None
        if len(head) < 20 or head[:8] != MAGIC:
            raise ModelFileError(f"{path} is not a log-probabilities file (made by pyllm perplexity or "
                                 f"llama-perplexity with --kl-divergence-base FILE and a text)")
        self.n_ctx, self.n_vocab, self.n_chunks = (int(v) for v in np.frombuffer(head[8:], dtype="<i4"))
        if self.n_ctx < 4 or self.n_vocab < 1 or self.n_chunks < 1:
            raise ModelFileError(f"{path}: a base file of {self.n_chunks} chunks of {self.n_ctx} tokens and a "
                                 f"vocabulary of {self.n_vocab} is corrupt")
        self.first = self.n_ctx // 2
        self.scored = self.n_ctx - 1 - self.first              # records per chunk
        self.width = record_width(self.n_vocab)
        n_tokens = self.n_ctx * self.n_chunks
        want = 20 + 4 * n_tokens + 2 * self.width * self.scored * self.n_chunks
        if size != want:
            raise ModelFileError(f"{path} has {size} bytes where {self.n_chunks} chunks of {self.n_ctx} tokens "
                                 f"(vocabulary {self.n_vocab}) take {want}: truncated, or written by an interrupted "
                                 f"run; make it again")
        self.tokens = np.memmap(self.path, dtype="<i4", mode="r", offset=20, shape=(n_tokens,))
        self.records = np.memmap(self.path, dtype="<u2", mode="r", offset=20 + 4 * n_tokens,
                                 shape=(self.n_chunks, self.scored, self.width))


def kld_of_rows(rows: np.ndarray, base: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
    """Per scored token: nll and the base's nll of the target, the KL divergence
    from the base's distribution, p - p_base of the target, and whether both put
    the same token on top."""
    n_vocab = rows.shape[1]
    base_lp = decode_log_probs(base, n_vocab)
    top, lse = log_softmax_rows(rows)
    lp = rows - (top + lse)[:, None]
    at = np.arange(len(rows))
    nll, nll_base = -lp[at, targets].astype(np.float64), -base_lp[at, targets].astype(np.float64)
    kept = base_lp > -LOG_PROB_FLOOR
    terms = np.where(kept, np.exp(base_lp) * (base_lp - lp), 0)
    return {"nll": nll, "nll_base": nll_base, "kld": terms.sum(axis=1, dtype=np.float64),
            "p_diff": np.exp(-nll) - np.exp(-nll_base),
            "same_top": rows.argmax(axis=1) == base_lp.argmax(axis=1)}


def mean_and_error(values: np.ndarray) -> tuple[float, float]:
    """The mean and its standard error (0 for 10 values or fewer, as llama.cpp)."""
    mean = float(values.mean())
    var = float((values * values).mean()) - mean * mean
    return mean, math.sqrt(var / (len(values) - 1)) if var > 0 and len(values) > 10 else 0.0


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's percentile: linear between the two nearest of the sorted values."""
    p = fraction * (len(sorted_values) - 1)
    i = int(p)
    return float((1 - (p - i)) * sorted_values[i] + (p - i) * sorted_values[min(i + 1, len(sorted_values) - 1)])


KLD_PERCENTILES = (("Maximum", 1.0), ("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.9),
                   ("Median", 0.5), ("10.0%", 0.1), (" 5.0%", 0.05), (" 1.0%", 0.01), (" 0.1%", 0.001),
                   ("Minimum", 0.0))
DP_PERCENTILES = KLD_PERCENTILES[:5] + (("75.0%", 0.75),) + KLD_PERCENTILES[5:6] + (("25.0%", 0.25),) + \
    KLD_PERCENTILES[6:]


@dataclass
class KlDivergence:
    """Per-token values of a KL divergence run, and llama-perplexity's statistics of them."""
    n_ctx: int
    chunks: int = 0
    values: dict[str, list[np.ndarray]] = field(default_factory=lambda: {
        k: [] for k in ("nll", "nll_base", "kld", "p_diff", "same_top")})

    def add(self, part: dict[str, np.ndarray]) -> None:
        for k, v in part.items():
            self.values[k].append(v)

    def of(self, key: str) -> np.ndarray:
        return np.concatenate(self.values[key]).astype(np.float64)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.values["nll"])

    def statistics(self) -> dict:
        """llama-perplexity's: PPL of both and their ratio (with the errors carried
        through the correlation of the two), KLD and dp mean and percentiles, RMS dp,
        the share of tokens with the same top choice."""
        nll, nll_base, kld, dp, same = (self.of(k) for k in ("nll", "nll_base", "kld", "p_diff", "same_top"))
        n = len(nll)
        (m, s), (mb, sb) = mean_and_error(nll), mean_and_error(nll_base)
        cov = (float((nll * nll_base).mean()) - m * mb) / (n - 1) if n >= 10 else 0.0
        ln_ratio, ln_ratio_err = m - mb, math.sqrt(max(s * s + sb * sb - 2 * cov, 0.0))
        ppl, ppl_base = math.exp(m), math.exp(mb)
        mse, mse_err = mean_and_error(dp * dp)
        rms = math.sqrt(mse)
        top = float(same.mean())
        out = {"tokens": n, "chunks": self.chunks, "n_ctx": self.n_ctx,
               "ppl": [ppl, ppl * s], "ppl_base": [ppl_base, ppl_base * sb],
               "cor_ln_ppl": cov / (s * sb) if s > 0 and sb > 0 else 0.0,
               "ln_ppl_ratio": [ln_ratio, ln_ratio_err],
               "ppl_ratio": [math.exp(ln_ratio), math.exp(ln_ratio) * ln_ratio_err],
               "ppl_diff": [ppl - ppl_base, math.sqrt(max((ppl * s) ** 2 + (ppl_base * sb) ** 2
                                                            - 2 * ppl * ppl_base * cov, 0.0))],
               "kld": list(mean_and_error(kld)), "p_diff": list(mean_and_error(dp)),
               "rms_p_diff": [rms, 0.5 / rms * mse_err if rms > 0 else 0.0],
               "same_top": [top, math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else 0.0]}
        kld.sort()
        dp.sort()
        out["kld_percentiles"] = {name: percentile(kld, f) for name, f in KLD_PERCENTILES}
        out["p_diff_percentiles"] = {name: percentile(dp, f) for name, f in DP_PERCENTILES}
        return out


def kl_divergence(logits_of: LogitsOf, base: BaseLogProbs, bos_id: Optional[int] = None,
                  max_chunks: Optional[int] = None,
                  on_chunk: Optional[Callable[[int, int, KlDivergence], None]] = None) -> KlDivergence:
    """The KL divergence of a model's distributions from those saved in `base`, over
    the base's chunks (each run as perplexity runs it). on_chunk(i, n_chunks, so far)."""
    n_chunks = base.n_chunks if max_chunks is None else min(base.n_chunks, chunks_of(
        base.tokens, base.n_ctx, max_chunks))
    result = KlDivergence(base.n_ctx)
    for i in range(n_chunks):
        records, done = base.records[i], 0
        for rows, targets in scored_rows(logits_of, chunk_at(base.tokens, i, base.n_ctx, bos_id), base.first):
            if rows.shape[1] != base.n_vocab:
                raise InvalidArgumentError(f"{base.path} holds a vocabulary of {base.n_vocab} tokens, this model "
                                           f"{rows.shape[1]}: compare models of one vocabulary")
            for j in range(0, len(rows), KLD_ROWS):        # a few rows at a time: a vocabulary can be 256k
                part = rows[j:j + KLD_ROWS]
                result.add(kld_of_rows(part, records[done:done + len(part)], targets[j:j + KLD_ROWS]))
                done += len(part)
        result.chunks += 1
        if on_chunk is not None:
            on_chunk(i, n_chunks, result)
    return result
