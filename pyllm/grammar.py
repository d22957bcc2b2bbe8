"""Constrained output: which tokens may come next so that the reply stays in
a grammar (pyllm.gbnf).

Three ways in, one mechanism:
- JSON mode (`format="json"`, ollama's `format: "json"`, OpenAI's
  `response_format: {"type": "json_object"}`): the reply is one JSON object
  (RFC 8259), the grammar JSON_OBJECT below;
- a JSON schema (`format={...schema...}`, `--json-schema`, OpenAI's
  `json_schema`), turned into a grammar by pyllm.json_schema;
- a GBNF grammar of one's own (`grammar=`, `--grammar`, `--grammar-file`).

The check runs on bytes, as llama.cpp's grammar sampler does: the sampler
draws as usual, and only when the token it drew cannot continue is the set
of tokens that can found and the draw made again among them. Finding that
set walks the vocabulary in sorted byte order, so tokens that share a prefix
share its steps and a prefix the grammar refuses skips every token that
starts with it; the set is cached per grammar state (structural states
repeat). End-of-generation tokens may come when the grammar is complete;
the reply also ends by itself when nothing more can follow (a JSON object's
closing brace).
"""
from __future__ import annotations

import codecs
import weakref
from dataclasses import dataclass
from typing import Iterable, Optional, Union

import numpy as np

from .errors import GrammarError, InvalidArgumentError
from .gbnf import Grammar
from .reasoning import ANSWER, CHANNEL, THINK_OPEN, THINKING, THOUGHT_OPEN, ReasoningSplitter

# One JSON object, optional whitespace before it (RFC 8259's grammar)
JSON_OBJECT = r'''
root    ::= ws object
value   ::= object | array | string | number | "true" | "false" | "null"
object  ::= "{" ws ( member ( "," ws member )* )? "}"
member  ::= string ws ":" ws value ws
array   ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string  ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number  ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws      ::= [ \t\n\r]*
'''

MAX_MASKS = 256     # masks kept per grammar and vocabulary
THINKING_OPENERS = (THINK_OPEN.encode(), THOUGHT_OPEN.encode(), CHANNEL.encode())


class Vocabulary:
    """A tokenizer's pieces sorted by bytes, for walking them as a trie."""

    def __init__(self, tokenizer):
        pieces = tokenizer.all_pieces()
        self.pieces = pieces
        self.n = len(pieces)
        # for AnswerConstraint: blank tokens, and tokens that open a reasoning model's thinking
        self.blank = np.fromiter((bool(p) and not p.strip() for p in pieces), dtype=bool, count=self.n)
        self.opener = np.fromiter((p.lstrip().startswith(THINKING_OPENERS) for p in pieces), dtype=bool,
                                  count=self.n)
        eog = frozenset(tokenizer.eog_ids)
        ids = sorted((t for t in range(self.n) if pieces[t] and t not in eog), key=pieces.__getitem__)
        self.order = ids
        self.sorted = [pieces[t] for t in ids]
        # how many leading bytes each piece shares with the one before it (at least 1 within a first byte)
        self.shared = [0] * len(ids)
        # [first byte, start, end) runs of the sorted pieces
        self.by_first: list[tuple[int, int, int]] = []
        prev = b""
        for k, p in enumerate(self.sorted):
            if not prev or p[0] != prev[0]:
                self.by_first.append((p[0], k, k + 1))
            else:
                self.by_first[-1] = (p[0], self.by_first[-1][1], k + 1)
                n = min(len(p), len(prev))
                j = 1
                while j < n and p[j] == prev[j]:
                    j += 1
                self.shared[k] = j
            prev = p

    @classmethod
    def of(cls, tokenizer) -> "Vocabulary":
        v = _VOCABS.get(tokenizer)
        if v is None:
            v = _VOCABS[tokenizer] = cls(tokenizer)
        return v

    def allowed(self, grammar: Grammar, sid: int) -> np.ndarray:
        """bool [n_vocab]: the tokens whose bytes continue the grammar from state sid
        (never an end-of-generation token: GrammarConstraint decides those)."""
        mask = np.zeros(self.n, dtype=bool)
        step, pieces, shared, order = grammar.step, self.sorted, self.shared, self.order
        for first, start, end in self.by_first:
            s1 = step(sid, first)
            if s1 < 0:
                continue
            states = [sid, s1]      # states[j]: after the first j bytes of the current piece
            dead = 1 << 30          # pieces sharing this many leading bytes with the last one die too
            for k in range(start, end):
                j = shared[k]
                if j >= dead:
                    continue
                dead = 1 << 30
                j = max(j, 1)
                del states[j + 1:]
                s = states[j]
                p = pieces[k]
                while j < len(p):
                    s = step(s, p[j])
                    j += 1
                    if s < 0:
                        dead = j
                        break
                    states.append(s)
                else:
                    mask[order[k]] = True
        return mask


_VOCABS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # tokenizer -> Vocabulary
_MASKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()      # grammar -> {vocabulary: {state: mask}}


class GrammarConstraint:
    """One reply's constraint: which tokens may come next, and when it is done.
    The tokens that end a reply (`end_ids`: end-of-generation, end of turn)
    may come exactly when the grammar is complete."""

    def __init__(self, grammar: Grammar, tokenizer, end_ids: Optional[Iterable[int]] = None):
        self.grammar = grammar
        self.vocab = Vocabulary.of(tokenizer)
        self.end = frozenset(tokenizer.eog_ids if end_ids is None else end_ids)
        self.end_list = np.fromiter(sorted(self.end), dtype=np.int64, count=len(self.end))
        self.state = grammar.start
        self.masks = _MASKS.setdefault(grammar, weakref.WeakKeyDictionary()).setdefault(self.vocab, {})

    @property
    def done(self) -> bool:
        """Complete, and nothing can follow: the reply ends here."""
        return self.grammar.finished(self.state)

    def allows(self, token: int) -> bool:
        if token in self.end:
            return self.grammar.accepting(self.state)
        piece = self.vocab.pieces[token]
        return bool(piece) and self.grammar.feed(self.state, piece) >= 0

    def mask(self) -> np.ndarray:
        """bool [n_vocab]: the tokens that can come next (walked once per state and vocabulary)."""
        m = self.masks.get(self.state)
        if m is None:
            m = self.vocab.allowed(self.grammar, self.state)
            if len(self.masks) >= MAX_MASKS:
                self.masks.clear()
            self.masks[self.state] = m
        m = m.copy()
        m[self.end_list] = self.grammar.accepting(self.state)
        if not m.any():
            raise GrammarError("no token of this vocabulary can continue the constrained reply")
        return m

    def advance(self, token: int) -> None:
        if token in self.end:
            if not self.grammar.accepting(self.state):
                raise GrammarError(f"token {token} ends the reply before the grammar is complete")
            return
        self.advance_bytes(self.vocab.pieces[token], f"token {token}")

    def advance_bytes(self, data: bytes, what: str = "the text") -> None:
        sid = self.grammar.feed(self.state, data)
        if sid < 0:
            raise GrammarError(f"{what} does not continue the constrained reply")
        self.state = sid


@dataclass(frozen=True)
class Trigger:
    """Where a lazy grammar takes hold: at the first of `words` to appear in the text;
    with at_start, only where the text begins with one of them (after blanks)."""
    words: tuple[str, ...]
    at_start: bool = False


class TriggeredConstraint:
    """A lazy grammar (as llama.cpp's for tool calls under tool_choice auto): the text
    is free until a trigger word appears in it, and from that word on (the grammar
    starts with it) the grammar holds it. If what follows the word in the same token
    does not fit the grammar, or (at_start) the text began otherwise, it stays free."""

    def __init__(self, inner: GrammarConstraint, trigger: Trigger):
        self.inner = inner
        self.words = [w.encode() for w in trigger.words if w]
        self.at_start = trigger.at_start
        self.vocab, self.end = inner.vocab, inner.end
        self.active = False
        self.tail = b""      # the end of the free text: where a trigger may be starting
        self.keep = max((len(w) for w in self.words), default=1) - 1

    @property
    def done(self) -> bool:
        return self.active and self.inner.done

    def allows(self, token: int) -> bool:
        return self.inner.allows(token) if self.active else True

    def mask(self) -> np.ndarray:
        return self.inner.mask() if self.active else np.ones(self.vocab.n, dtype=bool)

    def advance(self, token: int) -> None:
        if self.active:
            self.inner.advance(token)
        elif token not in self.end:
            self.advance_bytes(self.vocab.pieces[token])

    def advance_bytes(self, data: bytes, what: str = "the text") -> None:
        if self.active:
            self.inner.advance_bytes(data, what)
            return
        if not self.words:
            return
        text = self.tail + data
        if self.at_start:
            text = text.lstrip()
            if not any(w.startswith(text[:len(w)]) for w in self.words):
                self.words = []       # the reply began otherwise: it stays free
                return
        found = [i for i in (text.find(w) for w in self.words) if i >= 0]
        if not found:   # at_start: all of it is the start of a word so far
            self.tail = text if self.at_start else text[-self.keep:] if self.keep else b""
            return
        sid = self.inner.grammar.feed(self.inner.state, text[min(found):])
        if sid >= 0:
            self.inner.state, self.active = sid, True
        else:
            self.words = []   # not the grammar's way: the rest stays free


class AnswerConstraint:
    """A grammar that holds a reasoning model's answer and leaves its thinking free.

    The reply may open with thinking (a token that starts `<think>`, Gemma 4's
    thought channel or a harmony channel; pyllm.reasoning) or the prompt may
    have opened it (start_thinking); the grammar then starts where the answer
    does, after the blanks that follow the thinking. A reply whose first token
    opens no thinking is held to the grammar from that token, as without this."""

    def __init__(self, inner: "GrammarConstraint | TriggeredConstraint", start_thinking: bool = False):
        self.inner = inner
        self.splitter = ReasoningSplitter(start_thinking)
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.phase = THINKING if start_thinking else "start"   # "start": the first token decides
        self.started = False          # the grammar has taken some of the answer
        self.blank, self.opener = inner.vocab.blank, inner.vocab.opener

    @property
    def done(self) -> bool:
        return self.phase == ANSWER and self.started and self.inner.done

    def _after_thinking(self) -> bool:
        """The answer follows thinking, and the grammar has taken none of it: blanks may come first."""
        return self.phase == ANSWER and not self.started

    def allows(self, token: int) -> bool:
        if self.phase == THINKING or (self.phase == "start" and self.opener[token]):
            return True
        if self._after_thinking() and self.blank[token]:
            return True
        return self.inner.allows(token)

    def mask(self) -> np.ndarray:
        if self.phase == THINKING:
            return np.ones(self.inner.vocab.n, dtype=bool)
        m = self.inner.mask()
        if self.phase == "start":
            return m | self.opener
        return m | self.blank if self._after_thinking() else m

    def advance(self, token: int) -> None:
        piece = self.inner.vocab.pieces[token]
        parts = self.splitter.feed(self.decoder.decode(piece))
        if self.phase == "start" and not self.opener[token]:
            self.phase = ANSWER   # no thinking: the grammar has the reply from here
            self.started = True
            self.inner.advance(token)
        elif self.phase == ANSWER:
            if not (self._after_thinking() and self.blank[token]):
                self.started = True
                self.inner.advance(token)
        elif self.splitter.phase == ANSWER:   # the thinking closed within this token: the answer follows
            self.phase = ANSWER
            rest = "".join(t for kind, t in parts if kind == ANSWER).lstrip()
            if rest:
                self.inner.advance_bytes(rest.encode())
                self.started = True
        else:
            self.phase = THINKING


Format = Union[str, dict, bool, None]


def constraint_for(tokenizer, format: Format = None, grammar: Optional[str] = None,
                   end_ids: Optional[Iterable[int]] = None,
                   trigger: Optional[Trigger] = None) -> "GrammarConstraint | TriggeredConstraint | None":
    """The constraint for an output `format` ("json" or a JSON schema) or a GBNF
    `grammar`; None when neither is given. With a trigger, the grammar applies
    from where it appears (TriggeredConstraint)."""
    if format is not None and grammar is not None:
        raise InvalidArgumentError("give a format or a grammar, not both")
    if grammar is not None:
        if not isinstance(grammar, str):
            raise InvalidArgumentError("grammar must be GBNF text")
        text = grammar
    elif format is None:
        return None
    elif format == "json":
        text = JSON_OBJECT
    elif isinstance(format, (dict, bool)):
        from .json_schema import schema_to_gbnf
        text = schema_to_gbnf(format)
    else:
        raise InvalidArgumentError(f'format must be "json" or a JSON schema (a dict), not {format!r}')
    constraint = GrammarConstraint(Grammar.parse(text), tokenizer, end_ids)
    return TriggeredConstraint(constraint, trigger) if trigger else constraint
