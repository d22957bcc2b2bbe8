"""Grammars for constrained output, in llama.cpp's GBNF (`--grammar`,
`--grammar-file`, and JSON schemas through pyllm.json_schema).

A grammar is a set of rules `name ::= alternatives`, started from `root`:

    root   ::= answer "." | "no"
    answer ::= "yes" [, ] [a-z]+      # literals, character classes, references
    list   ::= item ("," item)*       # groups; * + ? {m} {m,} {m,n} repeat

Characters are Unicode code points; the text of a token is UTF-8, decoded as
it comes (a token may end inside a code point).

Matching works as llama.cpp's grammar sampler does: a state is the set of
*stacks* that could still match; a stack lists, innermost last, the element
each open rule waits for next, and its top is always a character class (or
the stack is empty: the root is complete). A code point advances every stack
whose top accepts it. References are expanded as soon as they reach the top;
a reference that ends its alternative is replaced rather than kept (a tail
call), so `x*` loops keep their stacks short and their states repeat.

States are interned to small ints, and so are the transitions between them
on a byte, so walking the vocabulary (pyllm.grammar.Vocabulary) mostly does
dict lookups.
"""
from __future__ import annotations

import bisect
import functools
import re

from .errors import GrammarError

CHAR, REF, END = range(3)
ANY = ((0, 0x10FFFF),)
MAX_REPEAT = 10_000     # {m,n} bounds above this are refused (the grammar would be huge)

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_RULE_START = re.compile(r"[A-Za-z0-9_-]+[ \t]*::=")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-",
            "/": "/", "^": "^"}


# --- parsing ------------------------------------------------------------------
# Parsed elements: ("c", ranges, negated) a code point in / not in the sorted
# (lo, hi) ranges; ("r", name) a reference. An alternative is a list of them.

class _Parser:
    def __init__(self, text: str):
        self.text, self.i = text, 0
        self.rules: dict[str, list[list[tuple]]] = {}
        self.current = ""       # the rule being parsed
        self.generated = 0

    def fail(self, what: str) -> GrammarError:
        line = self.text.count("\n", 0, self.i) + 1
        col = self.i - (self.text.rfind("\n", 0, self.i) + 1) + 1
        return GrammarError(f"grammar: {what} at line {line}, column {col}")

    def skip(self) -> None:
        """Skip whitespace (newlines included) and # comments."""
        t = self.text
        while self.i < len(t):
            if t[self.i] in " \t\r\n":
                self.i += 1
            elif t[self.i] == "#":
                end = t.find("\n", self.i)
                self.i = len(t) if end < 0 else end + 1
            else:
                break

    def parse(self) -> dict[str, list[list[tuple]]]:
        self.skip()
        if self.i >= len(self.text):
            raise GrammarError("grammar: it is empty; give at least a `root ::= ...` rule")
        while self.i < len(self.text):
            m = _NAME.match(self.text, self.i)
            if not m:
                raise self.fail("expected a rule name")
            name = m.group()
            self.i = m.end()
            self.skip()
            if not self.text.startswith("::=", self.i):
                raise self.fail(f"expected '::=' after {name!r}")
            self.i += 3
            if name in self.rules:
                raise self.fail(f"rule {name!r} is defined twice")
            self.current = name
            self.rules[name] = []   # keeps the rule order: root's own rules first
            self.rules[name] = self.alternatives(nested=False)
            self.skip()
        return self.rules

    def alternatives(self, nested: bool) -> list[list[tuple]]:
        alts = [self.sequence(nested)]
        while self.i < len(self.text) and self.text[self.i] == "|":
            self.i += 1
            alts.append(self.sequence(nested))
        return alts

    def sequence(self, nested: bool) -> list[tuple]:
        """Elements up to '|', ')' (when nested), the next rule or the end."""
        seq: list[tuple] = []
        last = 0   # where the last operand starts: a literal is several elements, and *+?{} take it whole
        while True:
            self.skip()
            if self.i >= len(self.text):
                return seq
            c = self.text[self.i]
            if c == "|" or (c == ")" and nested):
                return seq
            if c == ")":
                raise self.fail("unmatched ')'")
            if not nested and _RULE_START.match(self.text, self.i):
                return seq
            if c not in "*+?{":
                last = len(seq)
            if c == '"':
                start = len(seq)
                self.i += 1
                while not self.closes('"', "string literal"):
                    cp = self.char()
                    seq.append(("c", ((cp, cp),), False))
                if len(seq) == start:   # "": nothing to match; still a valid operand of * or ?
                    seq.append(("r", self.new_rule([[]])))
            elif c == "[":
                seq.append(self.char_class())
            elif c == ".":
                self.i += 1
                seq.append(("c", ANY, False))
            elif c == "(":
                self.i += 1
                alts = self.alternatives(nested=True)
                if self.i >= len(self.text) or self.text[self.i] != ")":
                    raise self.fail("expected ')'")
                self.i += 1
                seq.append(("r", self.new_rule(alts)))
            elif c in "*+?{":
                if not seq:
                    raise self.fail(f"'{c}' has nothing to repeat")
                operand = seq[last:]
                seq[last:] = self.repeat(operand[0] if len(operand) == 1 else ("r", self.new_rule([operand])))
            else:
                m = _NAME.match(self.text, self.i)
                if not m:
                    raise self.fail(f"unexpected {c!r}")
                self.i = m.end()
                seq.append(("r", m.group()))

    def closes(self, close: str, what: str) -> bool:
        """Whether `close` comes next (then consumed); the end of the text is an error."""
        if self.i >= len(self.text):
            raise self.fail(f"unterminated {what}")
        if self.text[self.i] == close:
            self.i += 1
            return True
        return False

    def char(self) -> int:
        """One code point of a literal or class, escapes decoded."""
        t = self.text
        c = t[self.i]
        if c != "\\":
            self.i += 1
            return ord(c)
        if self.i + 1 >= len(t):
            raise self.fail("a '\\' ends the grammar")
        e = t[self.i + 1]
        if e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = t[self.i + 2:self.i + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"'\\{e}' needs {n} hex digits")
            self.i += 2 + n
            cp = int(digits, 16)
            if cp > 0x10FFFF:
                raise self.fail(f"code point {cp:#x} is beyond Unicode")
            return cp
        if e not in _ESCAPES:
            raise self.fail(f"unknown escape '\\{e}'")
        self.i += 2
        return ord(_ESCAPES[e])

    def char_class(self) -> tuple:
        self.i += 1   # '['
        negated = self.text.startswith("^", self.i)
        self.i += negated
        ranges = []
        while not self.closes("]", "character class"):
            lo = self.char()
            hi = lo
            if self.text.startswith("-", self.i) and not self.text.startswith("-]", self.i):
                self.i += 1
                if self.i >= len(self.text):
                    raise self.fail("unterminated character class")
                hi = self.char()
                if hi < lo:
                    raise self.fail(f"range {chr(lo)!r}-{chr(hi)!r} is backwards")
            ranges.append((lo, hi))
        return ("c", merge_ranges(ranges), negated)

    def repeat(self, item: tuple) -> list[tuple]:
        """The elements that replace `item` followed by a repetition operator."""
        c = self.text[self.i]
        self.i += 1
        if c == "*":
            return [("r", self.star(item))]
        if c == "+":
            return [item, ("r", self.star(item))]
        if c == "?":
            return [("r", self.new_rule([[item], []]))]
        m = re.compile(r"\s*(\d*)\s*(,?)\s*(\d*)\s*\}").match(self.text, self.i)
        if not m or (not m.group(1) and not m.group(2)):
            raise self.fail("expected {m}, {m,}, {,n} or {m,n}")
        self.i = m.end()
        lo = int(m.group(1) or 0)
        hi = None if m.group(2) and not m.group(3) else int(m.group(3) or lo) if m.group(2) else lo
        if hi is not None and hi < lo:
            raise self.fail(f"repetition {{{lo},{hi}}} is backwards")
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.fail(f"repetition bound above {MAX_REPEAT}")
        out = [item] * lo
        if hi is None:
            out.append(("r", self.star(item)))
        elif hi > lo:   # up to hi - lo more: (item (item (...)?)?)?
            rest = self.new_rule([[item], []])
            for _ in range(hi - lo - 1):
                rest = self.new_rule([[item, ("r", rest)], []])
            out.append(("r", rest))
        return out

    def star(self, item: tuple) -> str:
        name = self.new_rule([])
        self.rules[name] = [[item, ("r", name)], []]
        return name

    def new_rule(self, alts: list[list[tuple]]) -> str:
        """A rule for a group or repetition, named after the rule it is in
        ('~' keeps it apart from every name a grammar can write)."""
        self.generated += 1
        name = f"{self.current}~{self.generated}"
        self.rules[name] = alts
        return name


def merge_ranges(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, non-overlapping (lo, hi) code point ranges covering the same code points."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


# --- the grammar ----------------------------------------------------------------

class Grammar:
    """A parsed grammar and its matching tables; see the module docstring.

    Positions: every alternative of every rule is laid out as its elements
    followed by an END; a position is an index into that layout (kind, char
    ranges or referenced rule). A stack is a tuple of positions."""

    def __init__(self, rules: dict[str, list[list[tuple]]], root: str = "root"):
        if root not in rules:
            raise GrammarError(f"grammar: no rule {root!r} (the start rule)")
        ids = {name: i for i, name in enumerate(rules)}
        self.kind: list[int] = []
        self.ranges: list[tuple] = []
        self.negated: list[bool] = []
        self.ref: list[int] = []
        self.alt_first: list[list[int]] = []
        for name, alts in rules.items():
            firsts = []
            for alt in alts:
                firsts.append(len(self.kind))
                for el in alt:
                    if el[0] == "c":
                        self._add(CHAR, el[1], el[2], -1)
                    else:
                        if el[1] not in ids:
                            raise GrammarError(f"grammar: rule {name!r} refers to {el[1]!r}, which is not defined")
                        self._add(REF, (), False, ids[el[1]])
                self._add(END, (), False, -1)
            self.alt_first.append(firsts)
        self.names = list(rules)
        _check_left_recursion(self)
        self._expanded: dict[tuple, tuple] = {}
        # id -> (stacks, UTF-8 bytes still to come, the code point's bits so far, its least value)
        self.states: list[tuple] = []
        self._state_ids: dict[tuple, int] = {}
        self._next: dict[int, int] = {}         # id * 256 + byte -> id, or -1: the byte cannot come
        self.start = self._intern((self._start_stacks(ids[root]), 0, 0, 0))

    def _add(self, kind: int, ranges: tuple, negated: bool, ref: int) -> None:
        self.kind.append(kind)
        self.ranges.append(ranges)
        self.negated.append(negated)
        self.ref.append(ref)

    def _start_stacks(self, root: int) -> frozenset:
        stacks: list[tuple] = []
        for first in self.alt_first[root]:
            stacks.extend(self._expand((first,) if self.kind[first] != END else ()))
        return frozenset(stacks)

    @classmethod
    def parse(cls, text: str, root: str = "root") -> "Grammar":
        """Parse GBNF text (cached: a server sees the same grammar again and again)."""
        return _parse_cached(text, root)

    # -- matching code points ---------------------------------------------------
    def _expand(self, stack: tuple) -> tuple:
        """The stacks `stack` stands for once references at its top are expanded:
        each has a character class on top, or is empty (the root is complete)."""
        done = self._expanded.get(stack)
        if done is not None:
            return done
        if not stack or self.kind[stack[-1]] == CHAR:
            out: tuple = (stack,)
        else:   # a reference: continue after it, inside each alternative of its rule
            top = stack[-1]
            cont = top + 1
            base = stack[:-1] + ((cont,) if self.kind[cont] != END else ())
            found: dict[tuple, None] = {}
            for first in self.alt_first[self.ref[top]]:
                for s in self._expand(base + (first,) if self.kind[first] != END else base):
                    found[s] = None
            out = tuple(found)
        if len(self._expanded) > 1 << 16:
            self._expanded.clear()
        self._expanded[stack] = out
        return out

    def _matches(self, pos: int, lo: int, hi: int) -> bool:
        """Whether the class at `pos` takes some code point in lo..hi."""
        ranges = self.ranges[pos]
        if not self.negated[pos]:   # the last range starting at or below hi reaches lo
            i = bisect.bisect_right(ranges, (hi, 0x110000)) - 1
            return i >= 0 and ranges[i][1] >= lo
        # negated: some code point of lo..hi lies outside every range
        for r_lo, r_hi in ranges:
            if r_hi < lo:
                continue
            if r_lo > lo:
                return True
            lo = r_hi + 1
            if lo > hi:
                return False
        return lo <= hi

    def _advance(self, stacks: frozenset, cp: int) -> frozenset:
        out: dict[tuple, None] = {}
        for s in stacks:
            if s and self._matches(s[-1], cp, cp):
                nxt = s[-1] + 1
                for t in self._expand(s[:-1] + (nxt,) if self.kind[nxt] != END else s[:-1]):
                    out[t] = None
        return frozenset(out)

    # -- matching bytes ----------------------------------------------------------
    def _intern(self, state: tuple) -> int:
        sid = self._state_ids.get(state)
        if sid is None:
            sid = self._state_ids[state] = len(self.states)
            self.states.append(state)
        return sid

    def step(self, sid: int, b: int) -> int:
        """The state after byte b, or -1 if b cannot come next."""
        key = sid * 256 + b
        nxt = self._next.get(key)
        if nxt is None:
            nxt = self._next[key] = self._step(sid, b)
        return nxt

    def _step(self, sid: int, b: int) -> int:
        stacks, need, bits, floor = self.states[sid]
        if need == 0:
            if b < 0x80:
                return self._after_code_point(stacks, b)
            if 0xC2 <= b <= 0xDF:
                need, bits, floor = 1, b & 0x1F, 0x80
            elif 0xE0 <= b <= 0xEF:
                need, bits, floor = 2, b & 0x0F, 0x800
            elif 0xF0 <= b <= 0xF4:
                need, bits, floor = 3, b & 0x07, 0x10000
            else:
                return -1
        else:
            if not 0x80 <= b <= 0xBF:
                return -1
            need, bits = need - 1, (bits << 6) | (b & 0x3F)
            if need == 0:   # overlong forms, surrogates and beyond U+10FFFF are not UTF-8
                if bits < floor or 0xD800 <= bits <= 0xDFFF or bits > 0x10FFFF:
                    return -1
                return self._after_code_point(stacks, bits)
        # inside a code point: go on only if some stack takes one that starts so
        lo = max(bits << (6 * need), floor)
        hi = min((bits << (6 * need)) | ((1 << (6 * need)) - 1), 0x10FFFF)
        if lo > hi or not any(s and self._matches(s[-1], lo, hi) for s in stacks):
            return -1
        return self._intern((stacks, need, bits, floor))

    def _after_code_point(self, stacks: frozenset, cp: int) -> int:
        nxt = self._advance(stacks, cp)
        return self._intern((nxt, 0, 0, 0)) if nxt else -1

    def feed(self, sid: int, data: bytes) -> int:
        """The state after `data`, or -1."""
        for b in data:
            sid = self.step(sid, b)
            if sid < 0:
                return -1
        return sid

    def accepting(self, sid: int) -> bool:
        """The text so far is a complete sentence of the grammar."""
        stacks, need, _, _ = self.states[sid]
        return need == 0 and () in stacks

    def finished(self, sid: int) -> bool:
        """Complete, and nothing more can follow."""
        stacks, need, _, _ = self.states[sid]
        return need == 0 and stacks == frozenset(((),))

    def accepts(self, text: str) -> bool:
        """Whether the whole of `text` is a sentence of the grammar."""
        sid = self.feed(self.start, text.encode("utf-8"))
        return sid >= 0 and self.accepting(sid)


@functools.lru_cache(maxsize=32)
def _parse_cached(text: str, root: str) -> Grammar:
    if not isinstance(text, str):
        raise GrammarError("grammar: expected GBNF text")
    return Grammar(_Parser(text).parse(), root)


def _check_left_recursion(g: Grammar) -> None:
    """Refuse rules that can reach themselves without consuming a character
    (`expr ::= expr "+" term`): matching them would never end."""
    n = len(g.alt_first)
    nullable = [False] * n
    changed = True
    while changed:
        changed = False
        for r in range(n):
            if nullable[r]:
                continue
            for first in g.alt_first[r]:
                p = first
                while g.kind[p] == REF and nullable[g.ref[p]]:
                    p += 1
                if g.kind[p] == END:
                    nullable[r] = changed = True
                    break
    # rule -> rules that can start it (behind nullable prefixes)
    left: list[set[int]] = [set() for _ in range(n)]
    for r in range(n):
        for first in g.alt_first[r]:
            p = first
            while g.kind[p] == REF:
                left[r].add(g.ref[p])
                if not nullable[g.ref[p]]:
                    break
                p += 1
    WHITE, GREY, BLACK = 0, 1, 2
    color = [WHITE] * n
    for start in range(n):
        if color[start] != WHITE:
            continue
        color[start] = GREY
        path = [(start, iter(left[start]))]
        while path:
            r, it = path[-1]
            nxt = next(it, None)
            if nxt is None:
                color[r] = BLACK
                path.pop()
            elif color[nxt] == GREY:
                raise GrammarError(f"grammar: rule {g.names[nxt]!r} is left-recursive "
                                   f"(it can reach itself before matching a character); rewrite it with * or +")
            elif color[nxt] == WHITE:
                color[nxt] = GREY
                path.append((nxt, iter(left[nxt])))
