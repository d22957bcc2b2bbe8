"""Constrained output: JSON mode (ollama's `format: "json"`, OpenAI's
`response_format: {"type": "json_object"}`, `pyllm run --format json`).

The reply must be one JSON object: optional whitespace, then `{ ... }` as RFC 8259
writes it (strings of valid UTF-8 with their escapes, numbers, true / false /
null, nested objects and arrays). Generation stops when the object closes.

The check runs on bytes, token by token, as llama.cpp's grammar sampler does:
the sampler draws as usual, and only when the token it drew cannot continue the
JSON are the tokens that can found (the whole vocabulary, checked from the
automaton's state; cached per state, as structural states repeat) and the draw
made again among them.

A state is a small tuple, (mode, stack, aux): the stack holds one flag per open
container (True: an object), aux what a mode needs (the bytes a literal still
needs, UTF-8 continuation bytes a string still needs, hex digits of a \\u escape
still to come, the part of a number).
"""
from __future__ import annotations

import weakref
from typing import Optional

import numpy as np

from .errors import InvalidArgumentError

FORMATS = ("json",)

# modes
(VALUE, OBJ_FIRST, OBJ_KEY, COLON, AFTER, ARR_FIRST, STRING, KEY_STRING, ESCAPE, UNICODE, NUMBER, LITERAL,
 DONE) = range(13)
WS = frozenset(b" \t\n\r")
ESCAPES = frozenset(b'"\\/bfnrt')
HEX = frozenset(b"0123456789abcdefABCDEF")
DIGITS = frozenset(b"0123456789")
# number parts: after '-', after a leading 0, in the integer, after '.', in the fraction, after 'e',
# after the exponent's sign, in the exponent; a number can end in the starred ones (0, INT, FRAC, EXP)
N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP = range(8)
N_ENDS = frozenset((N_ZERO, N_INT, N_FRAC, N_EXP))

START = (VALUE, (), 0)


def step(state: tuple, b: int) -> Optional[tuple]:
    """The state after byte b, or None if b cannot come next."""
    mode, stack, aux = state
    if mode == STRING or mode == KEY_STRING:
        if aux:   # inside a UTF-8 sequence: a continuation byte
            return (mode, stack, aux - 1) if 0x80 <= b <= 0xBF else None
        if b == 0x22:   # the closing quote
            return (COLON, stack, 0) if mode == KEY_STRING else _closed(stack)
        if b == 0x5C:
            return (ESCAPE, stack, 1 if mode == KEY_STRING else 0)
        if b < 0x20:   # control characters only escaped
            return None
        if b < 0x80:
            return state
        if 0xC2 <= b <= 0xDF:
            return (mode, stack, 1)
        if 0xE0 <= b <= 0xEF:
            return (mode, stack, 2)
        if 0xF0 <= b <= 0xF4:
            return (mode, stack, 3)
        return None
    if mode == ESCAPE:   # aux: 1 inside a key
        string = KEY_STRING if aux else STRING
        if b == 0x75:   # \uXXXX
            return (UNICODE, stack, 4 + (4 if aux else 0))
        return (string, stack, 0) if b in ESCAPES else None
    if mode == UNICODE:   # aux: hex digits still to come (+ 4 inside a key)
        if b not in HEX:
            return None
        left, key = (aux - 4, True) if aux > 4 else (aux, False)
        if left > 1:
            return (UNICODE, stack, aux - 1)
        return (KEY_STRING if key else STRING, stack, 0)
    if mode == LITERAL:   # aux: the bytes still to come
        if b != aux[0]:
            return None
        return (LITERAL, stack, aux[1:]) if len(aux) > 1 else _closed(stack)
    if mode == NUMBER:
        nxt = _number(aux, b)
        if nxt is not None:
            return (NUMBER, stack, nxt)
        if aux not in N_ENDS:
            return None
        return step(_closed(stack), b)   # the number ended: b belongs to what follows
    if mode == DONE:   # nothing after the object
        return None
    if b in WS:
        return state
    if mode == VALUE or mode == ARR_FIRST:
        if not stack and b != 0x7B:   # the reply is one object
            return None
        if b == 0x7B:
            return (OBJ_FIRST, stack + (True,), 0)
        if b == 0x5B:
            return (ARR_FIRST, stack + (False,), 0)
        if mode == ARR_FIRST and b == 0x5D:
            return _closed(stack[:-1])
        if b == 0x22:
            return (STRING, stack, 0)
        if b == 0x2D:
            return (NUMBER, stack, N_MINUS)
        if b in DIGITS:
            return (NUMBER, stack, N_ZERO if b == 0x30 else N_INT)
        for word in (b"true", b"false", b"null"):
            if b == word[0]:
                return (LITERAL, stack, word[1:])
        return None
    if mode == OBJ_FIRST or mode == OBJ_KEY:
        if b == 0x22:
            return (KEY_STRING, stack, 0)
        if mode == OBJ_FIRST and b == 0x7D:
            return _closed(stack[:-1])
        return None
    if mode == COLON:
        return (VALUE, stack, 0) if b == 0x3A else None
    if mode == AFTER:
        if b == 0x2C:
            return (OBJ_KEY, stack, 0) if stack[-1] else (VALUE, stack, 0)
        if b == (0x7D if stack[-1] else 0x5D):
            return _closed(stack[:-1])
        return None
    return None


def _closed(stack: tuple) -> tuple:
    """The state after a value ends: after it inside its container, or the whole object done."""
    return (AFTER, stack, 0) if stack else (DONE, stack, 0)


def _number(part: int, b: int) -> Optional[int]:
    """The number's next part after byte b, or None if b does not continue it."""
    digit = b in DIGITS
    if part == N_MINUS:
        return (N_ZERO if b == 0x30 else N_INT) if digit else None
    if part in (N_ZERO, N_INT, N_FRAC):
        if digit and part != N_ZERO:
            return part
        if b == 0x2E and part != N_FRAC:
            return N_DOT
        return N_E if b in (0x65, 0x45) else None
    if part == N_DOT:
        return N_FRAC if digit else None
    if part == N_E:
        return N_ESIGN if b in (0x2B, 0x2D) else N_EXP if digit else None
    if part in (N_ESIGN, N_EXP):
        return N_EXP if digit else None
    return None


def feed(state: Optional[tuple], data: bytes) -> Optional[tuple]:
    """The state after `data`, or None if some byte of it cannot come there."""
    for b in data:
        if state is None:
            return None
        state = step(state, b)
    return state


class JsonConstraint:
    """One reply's JSON-mode constraint: which tokens may come next, and when it is done.
    End-of-generation tokens are never allowed: the reply ends when the object closes."""

    def __init__(self, tokenizer):
        self.pieces = tokenizer.all_pieces()
        self.eog = tokenizer.eog_ids
        self.state: Optional[tuple] = START
        self.masks = _MASKS.setdefault(tokenizer, {})

    @property
    def done(self) -> bool:
        return self.state is not None and self.state[0] == DONE

    def allows(self, token: int) -> bool:
        piece = self.pieces[token]
        return token not in self.eog and bool(piece) and feed(self.state, piece) is not None

    def mask(self) -> np.ndarray:
        """bool [n_vocab]: the tokens that can come next (computed once per state and vocabulary)."""
        m = self.masks.get(self.state)
        if m is None:
            state, eog = self.state, self.eog
            m = np.fromiter((bool(p) and t not in eog and feed(state, p) is not None
                             for t, p in enumerate(self.pieces)), dtype=bool, count=len(self.pieces))
            if not m.any():
                raise InvalidArgumentError("no token of this vocabulary can continue the JSON reply")
            if len(self.masks) >= MAX_MASKS:   # deep or unusual states: start the cache again
                self.masks.clear()
            self.masks[self.state] = m
        return m

    def advance(self, token: int) -> None:
        self.state = feed(self.state, self.pieces[token])
        if self.state is None:
            raise InvalidArgumentError(f"token {token} does not continue the JSON reply")


MAX_MASKS = 256
_MASKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # tokenizer -> {state: mask}


def constraint_for(fmt: Optional[str], tokenizer) -> Optional[JsonConstraint]:
    """The constraint of output format `fmt` (None: no constraint)."""
    if fmt is None:
        return None
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return JsonConstraint(tokenizer)
