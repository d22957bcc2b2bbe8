"""DRY ("Don't Repeat Yourself"): a penalty on tokens that would continue a
repetition, exactly as llama.cpp's DRY sampler (src/llama-sampler.cpp,
llama_sampler_init_dry and its apply; itself ported from koboldcpp).

Why: the classic repetition penalty punishes every token seen recently, so it
also punishes the words a text legitimately needs again ("the", a name, code
keywords). DRY punishes only the token that would make a sequence already seen
in the recent history longer, and the longer that sequence already is, the
harder: a model stuck in a loop is pushed out of it, ordinary reuse of words is
left alone.

How: suppose the last tokens are `... a b c` and `a b c` also occurs earlier,
followed there by `d`. Emitting `d` now would repeat `a b c d`, so the logit of
`d` is lowered by

    multiplier * base ** (match_length - allowed_length)      (match_length = 3)

when match_length >= allowed_length. A token that could continue several
earlier matches takes the longest. The repeat at the end is only counted back
to the most recent sequence breaker (by default a newline, ':', '"' or '*'), so
a repeated structure (a list's "\\n- ", a dialogue's "Name:") is not punished, and a
breaker token itself is never penalised.

Parameters (llama.cpp's names and defaults):
    dry_multiplier       0.0    strength; 0 turns DRY off
    dry_base             1.75   growth of the penalty per extra matched token;
                                below 1 turns DRY off
    dry_allowed_length   2      matches shorter than this go unpunished
    dry_penalty_last_n   64     how many of the most recent tokens are searched
                                for repetitions; 0 turns DRY off. -1 = the
                                context size (see DryParams)
    dry_sequence_breakers  ["\\n", ":", "\\"", "*"]

The history DRY sees is every token accepted by the sampler since it was last
reset: llama.cpp's server (server-context.cpp, init_sampler) and its
completion tool both accept the prompt tokens (BOS included; the server skips
image placeholders) before the first draw, then each generated token. So history = prompt + generated.

In llama.cpp's default chain DRY comes right after the repetition penalties:
logit bias -> penalties -> DRY -> top-n-sigma -> top-k -> typical-p -> top-p
-> min-p -> XTC -> temperature -> draw; nothing has cut the candidates yet
there, so DRY sees the whole vocabulary.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np

DEFAULT_SEQUENCE_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")

# llama.cpp's limits when turning breaker strings into tokens
MAX_BREAKER_BYTES = 40      # a longer breaker is cut to its first 40 bytes
MAX_TAIL_TOKENS = 20        # a breaker's tail (see DryBreakers) keeps at most 20 tokens

# llama.cpp clamps the exponent so that base ** exponent stays a finite float:
# ln(FLT_MAX), as the float constant it uses
_FLOAT_MAX_LOG = np.float32(88.7228391)


class _Tokenizer(Protocol):
    def all_pieces(self) -> list[bytes]: ...
    def encode(self, text: str, add_bos: Optional[bool] = None, parse_special: bool = False,
               add_eos: Optional[bool] = None) -> list[int]: ...


@dataclass(frozen=True)
class DryParams:
    """DRY's settings (llama.cpp's defaults; multiplier 0 = off).

    penalty_last_n: the window, in most recent tokens. 0 is off; -1 is the
    context size, given to apply_dry as n_ctx (or the whole history when none
    is given). Note: this -1 is older llama.cpp's convention, which passed the
    model's training context length; current llama.cpp (the one vendored by
    llama-cpp-python 0.3.36) no longer has it: llama_sampler_init_dry turns any
    negative value into 0, so DRY is off, and its CLI and server reject
    negative values. Values below -1 are off here, as in llama.cpp.
    """
    multiplier: float = 0.0
    base: float = 1.75
    allowed_length: int = 2
    penalty_last_n: int = 64

    @property
    def enabled(self) -> bool:
        """llama.cpp's test: a multiplier, base >= 1, and a window."""
        return bool(np.float32(self.multiplier) != 0 and not np.float32(self.base) < 1
                    and self.penalty_last_n != 0 and self.penalty_last_n >= -1)

    def window(self, n_ctx: Optional[int] = None) -> Optional[int]:
        """How many of the last tokens DRY searches; None = all of them."""
        if self.penalty_last_n == -1:
            return n_ctx
        return max(self.penalty_last_n, 0)


class DryBreakers:
    """Sequence breakers as token sequences, what llama.cpp precomputes from
    the breaker strings (its "processed breakers", koboldcpp's "restart
    sequences").

    A breaker is a head token followed by a tail of tokens (most often
    empty). `tails[head]` holds every tail that completes a breaker after
    `head`. Tokens with an empty tail are single-token breakers: they are
    never penalised. Build one with `from_strings` (the usual way) or
    `from_token_sequences`; build it once per tokenizer and breaker list, it
    scans the vocabulary.
    """

    def __init__(self, tails: Mapping[int, Iterable[Sequence[int]]]):
        self.tails: dict[int, tuple[tuple[int, ...], ...]] = {}
        for head, ts in tails.items():
            unique = {tuple(int(t) for t in tail) for tail in ts}
            if unique:  # longest first: the breaker search takes the longest that matches
                self.tails[int(head)] = tuple(sorted(unique, key=len, reverse=True))
        #: the single-token breakers, sorted
        self.single = np.array(sorted(h for h, ts in self.tails.items() if () in ts), dtype=np.int64)
        # is_head's table: an entry per id up to the largest head, then one
        # False entry where every other id is looked up
        top = max(self.tails, default=-1) + 1
        self._is_head = np.zeros(top + 1, dtype=bool)
        self._is_head[list(self.tails)] = True

    @classmethod
    def from_token_sequences(cls, sequences: Iterable[Sequence[int]]) -> DryBreakers:
        """Breakers given directly as token sequences (llama.cpp's
        llama_sampler_init_dry_testing): the first token is the head, the rest
        its tail. Empty sequences are skipped."""
        tails: dict[int, list[Sequence[int]]] = {}
        for seq in sequences:
            if len(seq):
                tails.setdefault(int(seq[0]), []).append(seq[1:])
        return cls(tails)

    @classmethod
    def from_strings(cls, tokenizer: _Tokenizer,
                     breakers: Iterable[str] = DEFAULT_SEQUENCE_BREAKERS) -> DryBreakers:
        """The breakers for these strings in this vocabulary, as llama.cpp's
        get_overlapping_token_sequences finds them.

        For each breaker and each token, with `word` the token's text (one
        token detokenized, special tokens rendered):
          - `word` contains the breaker: the token alone is a breaker;
          - `word` ends with the breaker's first k bytes (for any k, any
            position of its first byte): the token is a head whose tail is the
            tokenization of the rest of the breaker, cut to 20 tokens.
        Breakers are compared as UTF-8 bytes, cut at a NUL (they are C strings
        there) and to 40 bytes; empty ones are skipped.
        """
        pieces = tokenizer.all_pieces()
        detokenize = getattr(tokenizer, "detokenize", None)
        tails: dict[int, list[tuple[int, ...]]] = {}
        for text in breakers:
            brk = text.encode("utf-8").split(b"\0", 1)[0][:MAX_BREAKER_BYTES]
            if not brk:
                continue
            first = brk[:1]
            tail_ids: dict[int, tuple[int, ...]] = {}  # bytes matched -> tail tokens
            for tid, piece in enumerate(pieces):
                # a word only ever loses bytes from its piece, so without the
                # first byte in the piece there is nothing to find
                if first not in piece:
                    continue
                word = _word(tid, piece, detokenize)
                if brk in word:
                    tails.setdefault(tid, []).append(())
                    continue
                pos = word.find(first)
                while pos >= 0:
                    matched = len(word) - pos       # < len(brk): brk is not in word
                    if brk.startswith(word[pos:]):
                        if matched not in tail_ids:
                            tail_ids[matched] = tuple(_encode_bytes(tokenizer, brk[matched:])[:MAX_TAIL_TOKENS])
                        tails.setdefault(tid, []).append(tail_ids[matched])
                    pos = word.find(first, pos + 1)
        return cls(tails)

    def is_head(self, tokens: np.ndarray) -> np.ndarray:
        """Which of `tokens` start a breaker."""
        top = len(self._is_head) - 1
        inside = (tokens >= 0) & (tokens < top)
        return self._is_head[np.where(inside, tokens, top)]

    def __repr__(self) -> str:
        return f"<DryBreakers heads={len(self.tails)} single={len(self.single)}>"


def _word(tid: int, piece: bytes, detokenize) -> bytes:
    """llama.cpp's text of one token, detokenize({tid}, special=true): the
    piece, less a leading space with a SentencePiece space prefix, after the
    clean-up of spaces for vocabularies that ask for it."""
    if detokenize is None or b" " not in piece:  # both only ever remove spaces
        return piece
    return detokenize([tid], remove_special=False, unparse_special=True)


def _encode_bytes(tokenizer: _Tokenizer, data: bytes) -> list[int]:
    """Tokenize raw bytes as llama.cpp does. A breaker's rest can start or end
    inside a UTF-8 character; llama.cpp reads each invalid byte as U+FFFD."""
    text = "".join("\ufffd" if "\udc80" <= ch <= "\udcff" else ch
                   for ch in data.decode("utf-8", errors="surrogateescape"))
    return tokenizer.encode(text, add_bos=False, add_eos=False, parse_special=False)


def apply_dry(logits: np.ndarray, history: Sequence[int], params: DryParams,
              breakers: Optional[DryBreakers] = None, n_ctx: Optional[int] = None) -> np.ndarray:
    """The logits with DRY's penalties subtracted, as a new float32 array; the
    input itself when DRY is off or penalises nothing.

    history: the token ids accepted so far, most recent last (prompt and
    generated, see the module docstring). breakers: from DryBreakers (None:
    no breakers). n_ctx: the context size, for penalty_last_n = -1.
    """
    if not params.enabled:
        return logits
    last_n = params.window(n_ctx)
    if last_n is not None:
        history = history[max(len(history) - last_n, 0):]
    window = np.asarray(history, dtype=np.int64)
    n = len(window)
    allowed = int(params.allowed_length)
    if n <= allowed:
        return logits

    # 1. The repeat at the end may not reach back past the most recent
    #    sequence breaker: at most `limit` tokens.
    limit = n if breakers is None else _repeat_limit(window, breakers)
    if limit < allowed:
        return logits

    # 2. match[j]: how many tokens ending at position j equal the tokens
    #    ending the window, at most `limit`.
    match = np.minimum(_suffix_matches(window), limit)

    # 3. The token after each such match would lengthen it: each token gets
    #    the longest match it would continue. (The window's last position is
    #    the suffix itself and is followed by nothing.)
    hit = np.flatnonzero(match[:-1] >= allowed)
    if not len(hit):
        return logits
    tokens, where = np.unique(window[hit + 1], return_inverse=True)
    longest = np.zeros(len(tokens), dtype=np.int64)
    np.maximum.at(longest, where, match[hit])
    keep = (tokens >= 0) & (tokens < len(logits))
    if breakers is not None:
        keep &= ~np.isin(tokens, breakers.single)
    tokens, longest = tokens[keep], longest[keep]
    if not len(tokens):
        return logits

    # 4. penalty = multiplier * base ** (length - allowed_length), with the
    #    exponent capped so that the power stays a finite float. As in
    #    llama.cpp: float settings, the power and product in double, rounded
    #    to float, subtracted in float.
    multiplier, base = float(np.float32(params.multiplier)), float(np.float32(params.base))
    max_exponent = int(_FLOAT_MAX_LOG / np.float32(math.log(base))) if base > 1.000001 else 0
    exponents = longest - allowed
    if max_exponent > 0:
        exponents = np.minimum(exponents, max_exponent)
    penalty = np.array([multiplier * math.pow(base, e) for e in exponents.tolist()])
    out = np.array(logits, dtype=np.float32)
    with np.errstate(over="ignore"):  # a huge multiplier: the penalty is inf, as in C
        out[tokens] -= penalty.astype(np.float32)
    return out


def _repeat_limit(window: np.ndarray, breakers: DryBreakers) -> int:
    """How many tokens of the window follow the most recent breaker (all of
    them when there is none).

    As llama.cpp: heads are tried from the most recent back, the first head
    that completes a breaker decides, with its longest tail. (So a breaker
    that ends later but starts earlier than another can be missed; llama.cpp
    accepts that as rare.) A tail must fit inside the window.
    """
    n = len(window)
    heads = np.flatnonzero(breakers.is_head(window))
    if not len(heads):
        return n
    tokens = window.tolist()
    for pos in heads[::-1].tolist():
        after = n - 1 - pos  # tokens after the head
        for tail in breakers.tails[tokens[pos]]:  # longest first
            if len(tail) <= after and tuple(tokens[pos + 1:pos + 1 + len(tail)]) == tail:
                return after - len(tail)
    return n


def _suffix_matches(window: np.ndarray) -> np.ndarray:
    """m[j] = the length of the longest common suffix of window[:j+1] and
    window, for j < n-1; m[n-1] = 0.

    That is the Z-function of the reversed window (z[k] = the longest common
    prefix of r and r[k:], r = window reversed; m[j] = z[n-1-j]), computed in
    linear time with the Z-box. Only a k with r[k] == r[0] can have z[k] > 0,
    so only those are visited: the usual case costs the number of times the
    last token occurs, the worst (one token over and over) O(n).
    """
    n = len(window)
    m = np.zeros(n, dtype=np.int64)
    if n < 2:
        return m
    r = window[::-1].tolist()
    z: dict[int, int] = {}
    lo = hi = 0  # the Z-box: r[lo:hi] == r[0:hi-lo], with hi the furthest reached
    for k in np.flatnonzero(window[::-1][1:] == r[0]).tolist():
        k += 1
        length = min(hi - k, z.get(k - lo, 0)) if k < hi else 0
        while k + length < n and r[length] == r[k + length]:
            length += 1
        z[k] = length
        if k + length > hi:
            lo, hi = k, k + length
    for k, length in z.items():
        m[n - 1 - k] = length
    return m
