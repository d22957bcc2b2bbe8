"""JSON Schema's pattern as grammar (pyllm/json_pattern.py): the JSON strings a pattern's grammar
accepts are exactly those whose text Python's `re.search` finds the pattern in, on random strings
over an alphabet with JSON's escaped characters; and what it refuses, it refuses by name."""
import json
import random
import re

import pytest

from pyllm.errors import GrammarError
from pyllm.gbnf import Grammar
from pyllm.json_schema import schema_to_gbnf

ALPHABET = ['a', 'b', 'c', 'z', 'A', 'Z', '0', '5', '9', '-', '_', '.', ' ', '"', '\\', '\n', '\t', 'é', '日',
            '🙂', '/', '[', ']', '(', '$']

PATTERNS = [
    r"^[0-9]{3}-[0-9]{4}$", r"^\d+(\.\d{1,2})?$", r"^[A-Za-z_][A-Za-z0-9_]*$", r"ab", r"^a|b$", r"^(ab|c)*$",
    r"^[^a-z]+$", r"^.{2,4}$", r"^\w+\s\w+$", r"^[\"\\]+$", r'^"', r"\\$", r"^\S*$", r"^[é-日]+$", r"^(?:a|b)+c?$",
    r"^(?P<x>[abc]{2})z$", r"^a{2,}$", r"^a+?b*?$", r"^[-a]+$", r"^[a-]$", r"^\$\.\(\)$", r"^[\t\n ]+$",
    r"^\u00e9\x41$", r"^[]a]+$", r"^[^\n]*$", r"^\D\W$", r"z", r"^$", r"^(a|)b$", r"^[.]$",
]


def ecma(pattern: str) -> str:
    """The pattern for Python's re with ECMAScript's `$` (the very end; Python's `$` also
    matches before a final newline): each unescaped `$` becomes `\\Z`."""
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        out.append("\\Z" if pattern[i] == "$" else pattern[i])
        i += 1
    return "".join(out)


def strings(rng: random.Random, pattern: str) -> list[str]:
    """Random strings, and strings built from pieces of the pattern (so some match)."""
    out = ["", "a", "ab", "abc", "123-4567", "12.5", "x_1", "a b", '"\\', "é日é", "aa", "aab", "zz", "$.()", "]a"]
    pieces = [p for p in re.split(r"[\\^$*+?{}()|\[\]]", pattern) if p] or ["a"]
    for _ in range(150):
        n = rng.randint(0, 6)
        out.append("".join(rng.choice(ALPHABET if rng.random() < 0.6 else pieces) for _ in range(n)))
    return out


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_grammar_accepts_what_re_search_finds(pattern):
    g = Grammar.parse(schema_to_gbnf({"type": "string", "pattern": pattern}))
    rng = random.Random(pattern)
    for s in strings(rng, pattern):
        want = re.search(ecma(pattern), s, re.ASCII) is not None   # ECMAScript's \\d \\w: ASCII
        assert g.accepts(json.dumps(s, ensure_ascii=False)) == want, (pattern, s)


def test_only_the_canonical_json_form_is_taken():
    g = Grammar.parse(schema_to_gbnf({"type": "string", "pattern": "^A$"}))
    assert g.accepts('"A"') and not g.accepts('"\\u0041"')   # JSON would take both: a narrowing
    g = Grammar.parse(schema_to_gbnf({"type": "object", "properties": {"zip": {"type": "string",
                                                                               "pattern": "^[0-9]{5}$"}}}))
    assert g.accepts('{"zip": "75001"}') and not g.accepts('{"zip": "7500"}') and not g.accepts('{"zip": "7500a"}')


@pytest.mark.parametrize("pattern,message", [
    (r"(a)\1", "the escape"), (r"(?=a)", "look-around"), (r"(?i)a", "inline flag"), (r"a^b", "the anchor"),
    (r"*a", "nothing to repeat"), (r"(ab", "does not close"), (r"[ab", "does not close"), (r"a{3,1}", "backwards"),
    (r"[z-a]", "backwards"), ("\\", "trailing backslash"), (r"\p{L}", "the escape"),
    (r"[a-\d]", "ends in a class escape"), (r"a)", "unmatched"),
])
def test_unsupported_patterns_are_refused(pattern, message):
    with pytest.raises(GrammarError, match=message):
        schema_to_gbnf({"type": "string", "pattern": pattern})


def test_pattern_does_not_mix_with_lengths():
    with pytest.raises(GrammarError, match="pattern with minLength"):
        schema_to_gbnf({"type": "string", "pattern": "^a+$", "maxLength": 3})


def test_a_model_reply_matches_its_patterns(smollm2_path):
    from pyllm import Model
    schema = {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                               "city": {"type": "string", "pattern": "^[A-Z][a-z]+( [A-Z][a-z]+)?$"}},
              "required": ["zip", "city"]}
    with Model(smollm2_path, n_threads=2) as m:
        for temperature, seed in ((0.0, 0), (1.2, 1)):
            c = m.chat([{"role": "user", "content": "Give the zip code and city of the Louvre as JSON."}],
                       format=schema, temperature=temperature, seed=seed, max_tokens=60)
            assert c.finish_reason == "stop", c.text
            reply = json.loads(c.text)
            assert re.fullmatch(r"[0-9]{5}", reply["zip"]) and re.fullmatch(r"[A-Z][a-z]+( [A-Z][a-z]+)?", reply["city"])
