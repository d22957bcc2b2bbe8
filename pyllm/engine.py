"""One request's life: prefill (chunked) -> decode loop, stop rules, metrics.

The engine owns a backend (which runs steps) and the KV block pool. A
request names a Sequence; its cached prefix is reused, the rest of the
prompt is prefilled in chunks of n_batch tokens, and tokens are then decoded
one step at a time until a stop rule fires. With a drafter (speculative
decoding, pyllm.speculative) a step also runs the tokens guessed to follow.
With parallel(n), up to n threads generate at once, each on its own
Sequence, their decode steps batched (pyllm.batching).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence as Seq

import numpy as np

from .batching import StepBatcher
from .errors import ContextFullError, InvalidArgumentError, ModelFileError
from .kv_cache import BlockPool, Sequence
from .sampling import Sampler
from .speculative import DraftLength, SpecParams


MAX_TOP_LOGPROBS = 20    # alternatives a token's log-probability may come with (OpenAI's limit)


@dataclass
class TokenLogprob:
    """A token's log-probability under the model (the raw logits, before sampling's
    penalties and temperature), with the `top` most likely tokens at that position."""
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def token_logprob(logits: np.ndarray, token: int, top: int = 0) -> TokenLogprob:
    """log softmax(logits)[token], and the `top` most likely (token, logprob), most likely first.
    (Where tokens tie at the cut, which of them make the `top` is argpartition's choice.)"""
    z = logits.astype(np.float64)
    z -= z.max()
    z -= np.log(np.exp(z).sum())
    best: list[tuple[int, float]] = []
    if top > 0:
        idx = np.argpartition(-z, top - 1)[:top] if top < len(z) else np.arange(len(z))
        idx = idx[np.lexsort((idx, -z[idx]))]   # most likely first; a tie by the lower id
        best = [(int(i), float(z[i])) for i in idx]
    return TokenLogprob(int(token), float(z[token]), best)


def check_top_logprobs(top: Optional[int]) -> Optional[int]:
    if top is None:
        return None
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidArgumentError(f"logprobs takes how many alternatives to list, 0 to {MAX_TOP_LOGPROBS}, "
                                   f"not {top!r}")
    return top


class Cancelled(Exception):
    """Generation.cancel() was called while the prompt was being computed."""


@dataclass
class Metrics:
    prompt_tokens: int = 0
    reused_tokens: int = 0       # prompt tokens whose K/V came from the cache
    generated_tokens: int = 0
    prefill_s: float = 0.0       # computing the prompt (time to first token, less sampling)
    decode_s: float = 0.0        # first token sampled -> last token
    decode_steps: int = 0        # forward steps after the prompt
    draft_tokens: int = 0        # speculative decoding: tokens guessed and run ahead
    accepted_tokens: int = 0     # ... and of those, the ones the sampler then drew
    ttft_s: float = 0.0          # request start -> first token sampled
    total_s: float = 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        computed = self.prompt_tokens - self.reused_tokens
        return computed / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens(self) -> int:
        """tokens drawn after the first: one a step, and the step's guesses kept"""
        return self.decode_steps + self.accepted_tokens

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def tpot_s(self) -> float:
        """time per output token after the first"""
        return self.decode_s / self.decode_tokens if self.decode_tokens else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "reused_tokens": self.reused_tokens,
                "generated_tokens": self.generated_tokens, "ttft_s": round(self.ttft_s, 6),
                "prefill_s": round(self.prefill_s, 6), "decode_s": round(self.decode_s, 6),
                "total_s": round(self.total_s, 6),
                "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
                "decode_tokens_per_s": round(self.decode_tokens_per_s, 2)} | (
                    {"draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens}
                    if self.draft_tokens else {})


@dataclass
class Totals:
    """What an engine has done since it was made (the server's /metrics)."""
    prompt_tokens: int = 0       # computed, not reused from the cache
    prompt_s: float = 0.0
    predicted_tokens: int = 0
    predicted_s: float = 0.0
    generations: int = 0
    steps: int = 0               # forward steps of the generations' sequences (several share a batched one)
    tokens_max: int = 0          # the most tokens one step held
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, m: "Metrics") -> None:
        with self.lock:
            self.prompt_tokens += m.prompt_tokens - m.reused_tokens
            self.prompt_s += m.prefill_s
            self.predicted_tokens += m.generated_tokens
            self.predicted_s += m.decode_s
            self.generations += 1


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str        # "stop" (end token or stop string), "length", "context", "interrupted"
    metrics: Metrics = field(default_factory=Metrics)
    tool_calls: list = field(default_factory=list)   # a chat with tools: the calls (pyllm.tools.ToolCall)
    logprobs: list[TokenLogprob] = field(default_factory=list)   # with logprobs=: one a generated token
    stop_string: str = ""     # the stop string that ended the reply, if one did


class Engine:
    def __init__(self, backend, tokenizer, n_ctx: int, n_batch: int, block_size: int, n_blocks: int,
                 recurrent: bool = False):
        self.backend = backend
        self.tokenizer = tokenizer
        self.n_ctx, self.n_batch = n_ctx, n_batch
        self.pool = BlockPool(n_blocks, block_size, recurrent)
        self.totals = Totals()
        self.new_drafter = None      # speculative decoding: makes a generation's guesser (pyllm.speculative)
        self.spec = SpecParams()
        self.batcher: Optional[StepBatcher] = None   # several threads' steps, batched (parallel)
        self.media = None                # pyllm.vision.MediaStore: the rows of a prompt's images (ids < 0)
        self.media_bidirectional = False  # an image's rows see each other (Gemma 3), so one step holds them (a sound's never)
        self.mrope = False               # images take M-RoPE positions (Qwen VL: mrope_positions)

    def new_sequence(self) -> Sequence:
        return Sequence(self.pool, self.n_ctx)

    def parallel(self) -> None:
        """Lets several threads run steps at once, each on its own sequence: their steps go
        through one StepBatcher (one at a time, decode steps batched where the backend can)."""
        if self.batcher is None:
            self.batcher = StepBatcher(self.backend)

    def _forward(self, tokens: Seq[int], seq: Sequence, n_out: int) -> np.ndarray:
        """One step: `tokens` after the ones seq holds; the logits of the last n_out."""
        self.totals.steps += 1
        self.totals.tokens_max = max(self.totals.tokens_max, len(tokens))
        start_pos, block_table = len(seq), seq.blocks
        media = {}
        if self.mrope and (min(tokens) < 0 or (seq.tokens and min(seq.tokens) < 0)):
            media["rope_pos"] = self.mrope_positions(list(seq.tokens) + list(tokens), len(seq))
        if tokens and tokens[0] < 0:   # an image's rows: the step takes them as given embeddings
            media |= {"media": self.media.rows(tokens),
                      "bidirectional": self.media_bidirectional and not self.media.is_sound(tokens[0])}
            tokens = [-1 - j for j in range(len(tokens))]
        if self.batcher is not None:
            return self.batcher.forward(tokens, start_pos, block_table, n_out, **media)
        return self.backend.forward(tokens, start_pos, block_table, n_out, **media)

    def mrope_positions(self, tokens: Seq[int], start: int) -> np.ndarray:
        """M-RoPE positions [3, len(tokens) - start] (time, height, width) of tokens[start:],
        as llama.cpp's mtmd gives them: a text token has its position p in all three; an image
        of cols x rows (its grid, MediaStore) starting at position p takes (p, p + row, p + col)
        for its rows, and the text after it goes on from p + max(cols, rows) (so positions fall
        behind the cache's index by the image's rows less that); a sound's rows (grid LINE) go on
        as text does."""
        toks = np.asarray(tokens, np.int64)
        out = np.empty((3, len(toks)), np.int64)
        at = np.flatnonzero(toks < 0)          # where image rows are, and which rows of the store
        store_rows = -1 - toks[at]
        cuts = np.flatnonzero((np.diff(at) != 1) | (np.diff(store_rows) != 1)) + 1
        done = shift = 0      # tokens placed; cache index - position, for the text after the images so far
        for a, b in zip([0, *cuts], [*cuts, len(at)]):    # runs of consecutive rows, of one image or more
            while a < b:
                i0 = int(at[a])
                first, n_rows, (cols, rows) = self.media.image_at(int(toks[i0]))
                j0 = int(store_rows[a]) - first            # the image's row this run starts at
                run = min(b - a, n_rows - j0)
                out[:, done:i0] = np.arange(done, i0) - shift
                p0, j = i0 - j0 - shift, j0 + np.arange(run)
                if cols == 0:     # a sound's rows (LINE): one position after another, as text
                    out[:, i0:i0 + run] = p0 + j
                else:
                    out[0, i0:i0 + run], out[1, i0:i0 + run], out[2, i0:i0 + run] = p0, p0 + j // cols, p0 + j % cols
                    if j0 + run == n_rows:
                        shift += n_rows - max(cols, rows)
                done, a = i0 + run, a + run
        out[:, done:] = np.arange(done, len(toks)) - shift
        return out[:, start:].astype(np.int32)

    def _chunks(self, tokens: Seq[int], size: int) -> Iterator[Seq[int]]:
        """tokens cut into steps of at most `size`; an image's rows never share a step with
        text or another image (and stay in one step where they must see each other)."""
        start = 0
        while start < len(tokens):
            end = start + 1
            if tokens[start] < 0:
                image = self.media.image_of(tokens[start])
                while end < len(tokens) and tokens[end] < 0 and self.media.image_of(tokens[end]) == image:
                    end += 1
                if self.media_bidirectional and not self.media.is_sound(tokens[start]) and end - start > size:
                    raise InvalidArgumentError(f"an image of {end - start} rows must be one step, and a step holds "
                                               f"{size} tokens: use a larger batch (-b {end - start})")
            else:
                while end < len(tokens) and tokens[end] >= 0:
                    end += 1
            for i in range(start, end, size):
                yield tokens[i:min(i + size, end)]
            start = end

    # -- running tokens through the model ---------------------------------------------
    def _run(self, seq: Sequence, tokens: Seq[int], n_out: int = 1,
             cancelled: Optional[Callable[[], bool]] = None) -> np.ndarray:
        """Appends `tokens` to seq, computing their K/V; returns the logits of
        the last n_out of them (a view valid until the next step). If
        cancelled() turns true, stops between chunks (raising Cancelled) with
        seq holding the chunks done so far."""
        if self.pool.recurrent and not seq.owns_state:
            # another sequence ran since this one's last step: the state is theirs, so this
            # one's tokens run again from position 0 first
            tokens = list(seq.tokens) + list(tokens)
            seq.truncate(0)
        seq.reserve(len(tokens))
        self.pool.state_owner = seq
        logits = None
        # with parallel generations, chunks leave room in a step for the others' decode rows
        batching = self.batcher is not None and self.batcher.batching
        size = max(1, self.n_batch - self.batcher.max_out) if batching else self.n_batch
        for chunk in self._chunks(tokens, size):
            if cancelled is not None and cancelled():
                raise Cancelled()
            try:
                logits = self._forward(chunk, seq, min(n_out, len(chunk)))
            except BaseException:
                self.pool.state_owner = None   # a step cut short may have moved the state on
                raise
            seq.commit(chunk)
        return logits

    def check_prompt(self, tokens: Seq[int]) -> None:
        """Refuses an empty prompt or one longer than the context."""
        if not tokens:
            raise InvalidArgumentError("the prompt is empty")
        if len(tokens) > self.n_ctx:
            raise ContextFullError(f"the prompt has {len(tokens)} tokens; the context holds {self.n_ctx} "
                                   f"(use a larger context with -c, or a shorter prompt)")

    def prefill(self, seq: Sequence, tokens: Seq[int],
                cancelled: Optional[Callable[[], bool]] = None) -> tuple[np.ndarray, int]:
        """Makes seq hold exactly `tokens`, reusing its cached prefix. Returns
        the logits after the last token (a copy) and how many were reused."""
        self.check_prompt(tokens)
        reused = seq.reuse_prefix(tokens)
        logits = self._run(seq, tokens[reused:], cancelled=cancelled)
        return logits[-1].copy(), reused

    def _fresh_logits(self, tokens: Seq[int], skip: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """(start, logits of tokens[start:start + n]) for the chunks of `tokens` run from a
        fresh context, from position `skip` on (the tokens before it run without logits);
        each view is valid until the next chunk."""
        if not tokens:
            raise InvalidArgumentError("no tokens")
        if len(tokens) > self.n_ctx:
            raise ContextFullError(f"{len(tokens)} tokens do not fit in the context of {self.n_ctx}")
        seq = self.new_sequence()
        self.pool.state_owner = seq   # a recurrent state starts again at position 0
        try:
            seq.reserve(len(tokens))
            for i in range(0, skip, self.n_batch):
                chunk = list(tokens[i:min(i + self.n_batch, skip)])
                self._forward(chunk, seq, 1)
                seq.commit(chunk)
            step = min(self.n_batch, self.backend.n_out_max)
            for i in range(skip, len(tokens), step):
                chunk = list(tokens[i:i + step])
                yield i, self._forward(chunk, seq, len(chunk))
                seq.commit(chunk)
        finally:
            seq.release()

    def logits(self, tokens: Seq[int]) -> np.ndarray:
        """Logits at every position of `tokens`, from a fresh context: [T, vocab]."""
        out = np.empty((len(tokens), self.backend.n_vocab), dtype=np.float32)
        for i, chunk in self._fresh_logits(tokens):
            out[i:i + len(chunk)] = chunk
        return out

    def prompt_logprobs(self, tokens: Seq[int], top: int = 0) -> list[Optional[TokenLogprob]]:
        """Each token's log-probability given those before it (None for the first), from a
        fresh context, without keeping the [T, vocab] logits."""
        out: list[Optional[TokenLogprob]] = [None]
        for i, chunk in self._fresh_logits(tokens):
            for j, row in enumerate(chunk):
                if i + j + 1 < len(tokens):
                    out.append(token_logprob(row, tokens[i + j + 1], top))
        return out

    # -- generation ------------------------------------------------------------------
    def generate(self, seq: Sequence, prompt: Seq[int], max_tokens: int, sampler: Sampler,
                 stop: Seq[str] = (), stop_ids: Optional[set[int]] = None, profile: bool = False,
                 constraint=None, logprobs: Optional[int] = None) -> "Generation":
        """constraint: which tokens may come (pyllm.grammar); the reply ends when it is done.
        logprobs: keep each generated token's log-probability and this many alternatives.
        The prompt is checked now, not when the generation starts."""
        self.check_prompt(prompt)
        return Generation(self, seq, list(prompt), max_tokens, sampler, list(stop),
                          self.tokenizer.eog_ids if stop_ids is None else stop_ids, profile, constraint,
                          check_top_logprobs(logprobs))


class Generation:
    """Iterating yields text pieces as they are decoded; afterwards (or after
    a break) `completion` holds the text, tokens, finish reason and metrics."""

    def __init__(self, engine: Engine, seq: Sequence, prompt: list[int], max_tokens: int,
                 sampler: Sampler, stop: list[str], stop_ids: set[int], profile: bool = False, constraint=None,
                 logprobs: Optional[int] = None):
        self.engine, self.seq, self.prompt = engine, seq, prompt
        self.max_tokens, self.sampler, self.stop, self.stop_ids = max_tokens, sampler, stop, stop_ids
        self.completion: Optional[Completion] = None
        self.cancelled = False
        self.profile = profile
        self.constraint = constraint
        self.logprobs = logprobs
        self.profiles: list = []  # with profile: where the prefill's and the decode's time went

    def cancel(self) -> None:
        """Asks the generation to stop at the next step (or prompt chunk);
        finish_reason becomes "interrupted". Safe to call from a signal handler."""
        self.cancelled = True

    def __iter__(self) -> Iterator[str]:
        eng, m = self.engine, Metrics(prompt_tokens=len(self.prompt))
        t0 = time.perf_counter()
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        emitted: list[str] = []
        pending = ""       # decoded text held back: it may be the start of a stop string
        decoder = eng.tokenizer.stream_decoder()
        history = [t for t in self.prompt if t >= 0]   # an image's rows (ids < 0) are no tokens to penalize
        finish, hit_stop_string = "interrupted", ""
        t_first = None
        sampling_s = 0.0
        # speculative decoding: the last step's guesses (the cache holds them past the
        # token that step ran), how many of them the sampler has drawn, and their logits
        drafter = eng.new_drafter() if eng.new_drafter is not None and min(self.prompt) >= 0 else None
        length = DraftLength(eng.spec) if drafter is not None else None
        draft: list[int] = []
        kept = 0
        rows = None
        if self.profile:
            eng.backend.profile(True)
        if eng.batcher is not None:
            eng.batcher.join()
        try:
            try:
                logits, m.reused_tokens = eng.prefill(self.seq, self.prompt, lambda: self.cancelled)
            except Cancelled:
                return
            m.prefill_s = time.perf_counter() - t0
            if self.profile:
                from .bench import read_profile
                self.profiles.append(read_profile(eng.backend, "prefill", 1, m.prefill_s))
                eng.backend.profile(True)  # counters from zero for the decode
            while not self.cancelled:
                if np.isnan(logits).any():  # ~1e-5 s: NaN would otherwise "sample" token 0 forever
                    raise ModelFileError(
                        f"the model computed NaN logits at position {len(self.seq)}: its weights hold NaN or "
                        f"overflow; the file is corrupt or badly quantized: download it again or try another")
                ts = time.perf_counter()
                tok = self.sampler(logits, history)
                if self.constraint is not None:
                    if not self.constraint.allows(tok):   # draw again among the tokens it allows
                        tok = self.sampler(np.where(self.constraint.mask(), logits, -np.inf), history)
                    self.constraint.advance(tok)
                sampling_s += time.perf_counter() - ts
                if t_first is None:
                    t_first = time.perf_counter()
                    m.ttft_s = t_first - t0
                if tok in self.stop_ids:
                    finish = "stop"
                    break
                tokens.append(tok)
                if self.logprobs is not None:
                    logprobs.append(token_logprob(logits, tok, self.logprobs))
                history.append(tok)
                m.generated_tokens = len(tokens)
                out, pending, hit_stop_string = split_stop(pending + decoder.push(tok), self.stop)
                if out:
                    emitted.append(out)
                    yield out
                if hit_stop_string or (self.constraint is not None and self.constraint.done):
                    finish = "stop"
                    break
                if len(tokens) >= self.max_tokens:
                    finish = "length"
                    break
                if len(self.prompt) + len(tokens) > eng.n_ctx:
                    finish = "context"
                    break
                if kept < len(draft) and tok == draft[kept]:   # guessed: its logits are computed
                    kept += 1
                    m.accepted_tokens += 1
                    logits = rows[kept]
                    continue
                if draft:   # forget the guesses after the first miss
                    length.update(len(draft), kept)
                    self.seq.truncate(len(self.seq) - (len(draft) - kept))
                    draft, kept = [], 0
                guess = self._draft(drafter, history, len(tokens), length.now) if drafter is not None else []
                try:
                    rows = eng._run(self.seq, [tok] + guess, n_out=1 + len(guess))
                except ContextFullError:   # the KV cache is full (its blocks held by other sequences)
                    finish = "context"
                    break
                draft = guess
                logits = rows[0]
                m.decode_steps += 1
                m.draft_tokens += len(guess)
            if not hit_stop_string:
                out, _, _ = split_stop(pending + decoder.flush(), self.stop, final=True)
                if out:
                    emitted.append(out)
                    yield out
        finally:
            if kept < len(draft):   # the cache keeps only tokens of the reply
                self.seq.truncate(len(self.seq) - (len(draft) - kept))
            if drafter is not None:
                drafter.close()
            if eng.batcher is not None:
                eng.batcher.leave()
            end = time.perf_counter()
            m.total_s = end - t0
            if t_first is not None:
                m.decode_s = end - t_first
            if self.profile and self.profiles:
                from .bench import read_profile
                self.profiles.append(read_profile(eng.backend, "decode", m.decode_steps, m.decode_s, sampling_s))
                eng.backend.profile(False)
            self.completion = Completion("".join(emitted), tokens, finish, m, logprobs=logprobs,
                                         stop_string=hit_stop_string)
            eng.totals.add(m)

    def _draft(self, drafter, history: list[int], n_generated: int, n_max: int) -> list[int]:
        """The drafter's guess at the tokens after `history`, as long as the step, the
        context and max_tokens leave room for (none if shorter than draft_min), cut before
        an end token: the reply stops there, so rows after it would be computed for nothing."""
        eng = self.engine
        room = min(self.max_tokens - n_generated - 1, eng.n_ctx - len(history),
                   eng.n_batch - 1, eng.backend.n_out_max - 1)
        n = min(room, n_max)
        guess = drafter.draft(history, n) if n > 0 else []
        end = next((i for i, t in enumerate(guess) if t in self.stop_ids), len(guess))
        guess = guess[:end]
        return guess if len(guess) >= max(1, eng.spec.draft_min) else []

    def run(self) -> Completion:
        for _ in self:
            pass
        return self.completion


def split_stop(text: str, stop: list[str], final: bool = False) -> tuple[str, str, str]:
    """Splits decoded text into (emit now, hold back, the stop string hit or ""). Text
    that could still become a stop string is held back, unless final."""
    hits = [(i, s) for i, s in ((text.find(s), s) for s in stop) if i >= 0]
    if hits:
        cut, hit = min(hits, key=lambda h: h[0])
        return text[:cut], "", hit
    if final or not stop:
        return text, "", ""
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return text[:len(text) - hold], text[len(text) - hold:], ""
