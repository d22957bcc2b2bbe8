"""JSON Schema's `pattern`: a regular expression turned into GBNF over the JSON text
of the string it matches (pyllm.json_schema uses it for `{"type": "string",
"pattern": ...}`).

The expression is matched against the string's characters, but the grammar
sees its JSON encoding, so each character becomes its JSON form: `"` is `\\"`,
`\\` is `\\\\`, a control character its escape. Only that one canonical form is
allowed (JSON would also take `\\u0041` for `A`): a narrowing, as elsewhere in
the converter.

JSON Schema patterns are not anchored: `a+` is valid for any string holding an
`a`. Without `^` (or `$`), any characters may come before (or after) the match.

JSON Schema's patterns are ECMAScript's: `\\d` and `\\w` are ASCII, `$` is the very
end. The supported syntax is the common core: literals and escapes (`\\d \\w \\s
\\D \\W \\S`, `\\n \\t \\r \\f \\v`, `\\uXXXX`, escaped punctuation), classes with
ranges and negation, `.`, groups (capturing, `(?:`, named), alternation, and the
quantifiers `* + ? {m} {m,} {m,n}` (lazy ones are taken as greedy: the language
is the same). Back-references, look-around, flags and anchors in the middle are
refused with GrammarError.
"""
from __future__ import annotations

import json

from .errors import GrammarError
from .gbnf import merge_ranges

MAX_CODE_POINT = 0x10FFFF
_CLASS_ESCAPES = {
    "d": [(0x30, 0x39)],
    "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    # ECMAScript's white space and line terminators
    "s": [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
          (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)],
}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_LINE_TERMINATORS = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]   # what ECMAScript's `.` does not match


def pattern_to_gbnf(pattern: str, char_rule: str, path: str) -> str:
    """A GBNF expression for the JSON text (quotes included) of the strings that
    `pattern` matches somewhere; `char_rule` names a rule for any one JSON-encoded
    character (for what may surround an unanchored match)."""
    if not isinstance(pattern, str):
        raise GrammarError(f"pattern at {path} must be a string, not {pattern!r}")
    return f'"\\"" {_Parser(pattern, path).parse(char_rule)} "\\""'


class _Parser:
    """Recursive descent over the pattern, writing GBNF as it goes."""

    def __init__(self, text: str, path: str):
        self.text, self.i, self.path = text, 0, path

    def fail(self, what: str) -> GrammarError:
        return GrammarError(f"pattern {self.text!r} at {self.path}: {what} (at offset {self.i}) is not supported")

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def parse(self, char_rule: str) -> str:
        """The top-level branches, each anchored where it says (`^a|b$`: a at the start or b at
        the end), any characters (`char_rule`) before or after it where it does not."""
        branches = [self.branch(char_rule)]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.branch(char_rule))
        if self.i < len(self.text):
            raise self.fail(f"an unmatched {self.peek()!r}")
        return branches[0] if len(branches) == 1 else "( " + " | ".join(branches) + " )"

    def branch(self, char_rule: str) -> str:
        free_start = not self.text.startswith("^", self.i)
        self.i += not free_start
        body = self.sequence()
        free_end = not self._at_end_anchor()
        self.i += not free_end
        parts = [f"{char_rule}*" if free_start else "", body, f"{char_rule}*" if free_end else ""]
        return " ".join(p for p in parts if p) or '""'

    def _at_end_anchor(self) -> bool:
        return self.peek() == "$" and self.text[self.i + 1:self.i + 2] in ("", "|")

    def alternation(self) -> str:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence())
        if len(branches) == 1:
            return branches[0]
        return "( " + " | ".join(b or '""' for b in branches) + " )"

    def sequence(self) -> str:
        items = []
        while self.peek() not in ("", "|", ")") and not self._at_end_anchor():
            items.append(self.quantified(self.atom()))
        return " ".join(items)

    def quantified(self, atom: str) -> str:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            op = c
        elif c == "{" and self._counted():
            op = self._count()
        else:
            return atom
        if self.peek() in ("?", "+"):   # lazy or possessive: the same strings
            self.i += 1
        return f"( {atom} ){op}"

    def _counted(self) -> bool:
        j = self.text.find("}", self.i)
        inner = self.text[self.i + 1:j] if j > 0 else ""
        lo, _, hi = inner.partition(",")
        return bool(inner) and lo.strip().isdigit() and (hi.strip().isdigit() or not hi.strip())

    def _count(self) -> str:
        j = self.text.index("}", self.i)
        lo, comma, hi = self.text[self.i + 1:j].partition(",")
        self.i = j + 1
        lo_n = int(lo)
        hi_n = int(hi) if hi.strip() else None
        if hi_n is not None and hi_n < lo_n:
            raise self.fail(f"the count {{{lo},{hi}}} is backwards")
        if not comma:
            return f"{{{lo_n}}}"
        return f"{{{lo_n},}}" if hi_n is None else f"{{{lo_n},{hi_n}}}"

    def atom(self) -> str:
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.text.startswith("?:", self.i):
                self.i += 2
            elif self.text.startswith("?P<", self.i) or (self.text.startswith("?<", self.i)
                                                        and self.text[self.i + 2:self.i + 3] not in ("=", "!")):
                self.i = self.text.index(">", self.i) + 1   # a named group: its name does not matter here
            elif self.peek() == "?":
                raise self.fail("look-around or an inline flag")
            inner = self.alternation()
            if self.peek() != ")":
                raise self.fail("a group that does not close")
            self.i += 1
            return f"( {inner or chr(34) * 2} )"
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            return _encoded(_LINE_TERMINATORS, negated=True)
        if c == "\\":
            ranges, negated = self.escape()
            return _encoded(ranges, negated)
        if c in "*+?{":
            raise self.fail(f"{c!r} with nothing to repeat")
        if c in "^$":
            raise self.fail(f"the anchor {c!r} inside the pattern")
        self.i += 1
        return _encoded([(ord(c), ord(c))], False)

    def escape(self) -> tuple[list[tuple[int, int]], bool]:
        """The code points a backslash escape stands for, and whether negated."""
        self.i += 1
        e = self.peek()
        if not e:
            raise self.fail("a trailing backslash")
        self.i += 1
        if e.lower() in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[e.lower()], e.isupper()
        if e in _CHAR_ESCAPES:
            return [(ord(_CHAR_ESCAPES[e]),) * 2], False
        if e in "ux":
            n = 4 if e == "u" else 2
            digits = self.text[self.i:self.i + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"'\\{e}' without {n} hex digits")
            self.i += n
            return [(int(digits, 16),) * 2], False
        if e.isalnum():
            raise self.fail(f"the escape '\\{e}'")   # back-references, \b, \p{...}, ...
        return [(ord(e), ord(e))], False

    def char_class(self) -> str:
        self.i += 1
        negated = self.peek() == "^"
        self.i += negated
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if not c:
                raise self.fail("a character class that does not close")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "\\":
                escaped, neg = self.escape()
                if neg:
                    raise self.fail("a negated class escape inside a class")
                ranges += escaped
                continue
            self.i += 1
            lo = ord(c)
            if self.peek() == "-" and self.text[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                h = self.peek()
                if h == "\\":
                    (hi_range,), neg = self.escape()
                    if neg or hi_range[0] != hi_range[1]:
                        raise self.fail("a range that ends in a class escape")
                    hi = hi_range[0]
                else:
                    self.i += 1
                    hi = ord(h)
                if hi < lo:
                    raise self.fail("a backwards range")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        return _encoded(ranges, negated)


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, start = [], 0
    for lo, hi in merge_ranges(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return out


def _encoded(ranges: list[tuple[int, int]], negated: bool) -> str:
    """GBNF for one character of the set, as JSON writes it: the characters JSON
    writes as they are in one class, then the escaped ones (quote, backslash,
    controls) one literal each."""
    chars = merge_ranges(_complement(ranges) if negated else ranges)
    plain, escaped = [], []
    for lo, hi in chars:
        for special in (0x22, 0x5C):   # '"' and '\' are escaped in JSON
            if lo <= special <= hi:
                escaped.append(special)
        for cp in range(lo, min(hi, 0x1F) + 1):   # controls too; a negated set (`.`, [^...]) takes
            if not negated or chr(cp) in "\t\n\r\f\b":   # only those with short escapes: a narrowing
                escaped.append(cp)
        plain.append((max(lo, 0x20), hi))
    plain = merge_ranges([r for lo, hi in plain if lo <= hi for r in _without_quote_and_backslash(lo, hi)])
    alternatives = []
    if plain:
        if len(plain) == 1 and plain[0][0] == plain[0][1]:
            alternatives.append(_gbnf_literal(chr(plain[0][0])))
        else:
            alternatives.append("[" + "".join(_class_range(lo, hi) for lo, hi in plain) + "]")
    alternatives += [_gbnf_literal(json.dumps(chr(cp))[1:-1]) for cp in sorted(set(escaped))]
    if not alternatives:
        return "[^\\x00-\\U0010FFFF]"   # an empty set: nothing matches
    return alternatives[0] if len(alternatives) == 1 else "( " + " | ".join(alternatives) + " )"


def _without_quote_and_backslash(lo: int, hi: int) -> list[tuple[int, int]]:
    """lo..hi less '"' and '\\' (which JSON writes escaped)."""
    return [(max(a, lo), min(b, hi)) for a, b in _complement([(0x22, 0x22), (0x5C, 0x5C)])
            if max(a, lo) <= min(b, hi)]


def _gbnf_literal(text: str) -> str:
    return '"' + "".join(_gbnf_char(ch) for ch in text) + '"'


def _gbnf_char(ch: str) -> str:
    if ch in '"\\':
        return "\\" + ch
    if ord(ch) < 0x20 or ch == "\x7f":
        return f"\\x{ord(ch):02X}"
    return ch


def _class_range(lo: int, hi: int) -> str:
    one = _class_char(lo)
    return one if lo == hi else f"{one}-{_class_char(hi)}"


def _class_char(cp: int) -> str:
    if cp > 0xFFFF:
        return f"\\U{cp:08X}"
    if cp > 0x7E or chr(cp) in "\\]^-[\"":
        return f"\\u{cp:04X}"
    return chr(cp)
