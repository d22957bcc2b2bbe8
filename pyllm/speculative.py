"""Speculative decoding: guess the next tokens cheaply, check them in one step.

A decode step runs the token just sampled together with a draft of the tokens
likely to follow it; a step of k tokens costs far less than k steps. The
sampler then draws each next token from the model's own logits at its
position, as plain decoding would, and a draft token is kept only while it is
the token drawn; at the first miss the rest of the draft is dropped from the
cache. The text is therefore exactly plain decoding's (a step's rows are bit
for bit the decode rows, and the sampler draws once per token), only faster
when the guesses are good, and at worst a little slower.

Drafters (llama.cpp's --spec-type names):
- "ngram-simple": the last earlier place in the prompt and reply where the
  last n tokens appeared; the draft is what followed them. No second model;
  pays off where the reply repeats its context: editing code, quoting,
  summarizing, a reasoning model restating its thinking.
- "draft": a small model with the same vocabulary decodes the draft greedily
  (Model(draft_model=...) loads it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

import numpy as np

from .errors import InvalidArgumentError

SPEC_TYPES = ("none", "ngram-simple", "draft")


@dataclass(frozen=True)
class SpecParams:
    """How far to guess. draft_max: tokens per draft at most (llama.cpp's
    --spec-draft-n-max); draft_min: shorter drafts are not run (--spec-draft-n-min);
    ngram_size: how many of the last tokens must match (--spec-ngram-size-n; llama.cpp's 12
    waits longer after each divergence: 6 did better on the tasks of
    benchmarks/compare_speculative.py, and 4 or less guessed wrong too often on free text);
    p_min: a draft model stops guessing where its top token is less likely."""
    draft_max: int = 16
    draft_min: int = 0
    ngram_size: int = 6
    p_min: float = 0.75

    def validate(self) -> "SpecParams":
        if not 1 <= self.draft_max <= 31:
            raise InvalidArgumentError(f"the draft length (--spec-draft-n-max) must be in 1..31, "
                                       f"not {self.draft_max}")
        if not 0 <= self.draft_min <= self.draft_max:
            raise InvalidArgumentError(f"--spec-draft-n-min must be in 0..{self.draft_max} (the draft's "
                                       f"longest), not {self.draft_min}")
        if not 1 <= self.ngram_size <= 1024:
            raise InvalidArgumentError(f"the n-gram size (--spec-ngram-size-n) must be in 1..1024, "
                                       f"not {self.ngram_size}")
        if not 0.0 <= self.p_min < 1.0:
            raise InvalidArgumentError(f"--spec-draft-p-min must be in [0, 1), not {self.p_min}")
        return self


class NgramDrafter:
    """ngram-simple: drafts what followed the last earlier occurrence of the
    history's last n tokens. The n-grams seen so far are kept in a dict (n-gram ->
    where the token after its latest occurrence sits), extended as the history
    grows; a history that is not an extension of the last one starts it again."""

    def __init__(self, params: SpecParams):
        self.n = params.ngram_size
        self.history: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}

    def _follow(self, history: Seq[int]) -> None:
        h = self.history
        if len(history) < len(h) or history[:len(h)] != h:
            h.clear()
            self.after.clear()
        start = len(h)
        h.extend(history[start:])
        n = self.n
        # every n-gram that ends before the last position, and the position after it
        for end in range(max(n, start), len(h)):
            self.after[tuple(h[end - n:end])] = end

    def close(self) -> None:
        pass

    def draft(self, history: Seq[int], n_max: int) -> list[int]:
        """Up to n_max tokens expected to follow `history` (possibly none)."""
        self._follow(history)
        h = self.history
        if len(h) <= self.n:
            return []
        at = self.after.get(tuple(h[len(h) - self.n:]))
        if at is None:
            return []
        return h[at:min(at + n_max, len(h))]


class DraftModelDrafter:
    """draft: a small model with the target's vocabulary decodes the draft
    greedily from the same history (its own cache keeps the common prefix),
    stopping early where its top token's probability falls below p_min."""

    def __init__(self, engine, params: SpecParams, n_vocab: int):
        self.engine, self.p_min = engine, params.p_min
        self.n_vocab = n_vocab          # the target's: a draft token past it cannot be right
        self.seq = engine.new_sequence()

    def close(self) -> None:
        """Gives the draft's cache back (its full blocks stay cached for the next draft's prefix)."""
        self.seq.release()

    def draft(self, history: Seq[int], n_max: int) -> list[int]:
        eng = self.engine
        if len(history) + n_max > eng.n_ctx:
            return []
        logits, _ = eng.prefill(self.seq, history)
        out: list[int] = []
        while True:
            tok = int(np.argmax(logits))
            if tok >= self.n_vocab or (self.p_min > 0 and _top_probability(logits, tok) < self.p_min):
                break
            out.append(tok)
            if len(out) >= n_max:
                break
            logits = eng._run(self.seq, [tok])[-1]
        return out


def _top_probability(logits: np.ndarray, top: int) -> float:
    z = logits - logits[top]
    return float(1.0 / np.exp(z, dtype=np.float64).sum())


class DraftLength:
    """How long the next draft may be: the longest after a draft taken whole,
    shrinking to twice what was kept (at least 2) after a miss, since a miss
    costs the step's extra rows for nothing."""

    def __init__(self, params: SpecParams):
        self.max = self.now = params.draft_max

    def update(self, drafted: int, kept: int) -> None:
        self.now = self.max if kept == drafted else max(2, min(self.max, 2 * kept))


def check_same_vocabulary(target, draft, draft_name: str) -> None:
    """A draft model must spell tokens as the target does (llama.cpp allows up to 128 more or
    fewer tokens at the end, as added special tokens differ between a family's sizes)."""
    n = min(target.n_vocab, draft.n_vocab)
    if abs(target.n_vocab - draft.n_vocab) > 128 or target._texts[:n] != draft._texts[:n]:
        raise InvalidArgumentError(f"the draft model {draft_name} has another vocabulary ({draft.n_vocab} tokens, "
                                   f"the model {target.n_vocab}): use a smaller model of the same family")


def make_drafter(spec_type: str, params: SpecParams, draft_engine=None, n_vocab: int = 0):
    """The drafter for `spec_type`, "ngram-simple" or "draft" (with the draft model's engine)."""
    if spec_type == "ngram-simple":
        return NgramDrafter(params)
    return DraftModelDrafter(draft_engine, params, n_vocab)
