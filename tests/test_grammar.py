"""Constrained output: GBNF grammars (pyllm/gbnf.py), the constraint over a
vocabulary (pyllm/grammar.py; JSON mode is one grammar), and replies of a
real model that stay in their grammar."""
import json
import random
import subprocess
import sys

import numpy as np
import pytest

from pyllm import GrammarError, InvalidArgumentError, Model
from pyllm.gbnf import Grammar
from pyllm.grammar import JSON_OBJECT, GrammarConstraint, Vocabulary, constraint_for

JSON = Grammar.parse(JSON_OBJECT)

OBJECTS = [b"{}", b' \n{"a": 1}', b'{"a": [1, 2.5e-3, -0, 0.5E+2, true, false, null, {"b": "x\\u00e9\\n\\"q\\""}], "c": {}}',
           '{"é": "日本 🙂"}'.encode(), b'{"a":{"b":{"c":[[],[{}]]}}}', b'{"\\\\": "\\/"}', b'{"n": -12.0e9}']
NOT_OBJECTS = [b"[]", b'"a"', b"1", b'{"a" 1}', b'{"a": 01}', b'{"a": tru}', b"{a: 1}", b'{"a": "\x01"}',
               b'{"a": 1,}', b'{"a": "\\x"}', b'{"a": 1.}', b"{} x", b'{"a": -}', b'{"a": "\xff"}', b'{"a": .5}',
               b'{"a": "\\u12g4"}', b'{"a": 1e}', b"{,}", b'{"a": [1 2]}', b'{"a": [1,]}', b'{"a": "\xc3"}x',
               b'{"a": "\xed\xa0\x80"}', b'{"a": "\xe0\x80\xaf"}', b'{"a": "\xf4\x90\x80\x80"}']


@pytest.mark.parametrize("text", OBJECTS)
def test_objects_are_accepted_to_the_end(text):
    end = JSON.feed(JSON.start, text)
    assert end >= 0 and JSON.finished(end)
    for i in range(len(text)):   # every prefix continues, none is finished before the end
        sid = JSON.feed(JSON.start, text[:i])
        assert sid >= 0 and (not JSON.finished(sid) or not text[i:].strip())


@pytest.mark.parametrize("text", NOT_OBJECTS)
def test_what_is_not_one_object_is_refused(text):
    sid = JSON.feed(JSON.start, text)
    assert sid < 0 or not JSON.accepting(sid)
    assert all(json.loads(t.decode()) is not None for t in OBJECTS)   # the accepted ones are JSON indeed


GRAMMAR = r'''
root   ::= answer "." | "no"        # a comment
answer ::= "yes" [, ] [a-z]+
'''


@pytest.mark.parametrize("grammar,good,bad", [
    (GRAMMAR, ["yes,abc.", "yes abc.", "no"], ["yes.", "yes,ABC.", "yes,abc", "noo", "", " no"]),
    (r'root ::= [^"\\]{2,4} "é" ( "x" | "yy" )* .', ["abéz", "abcdéxyyx€", "a\U0001F642é\n"],
     ["aéz", "abcdeéz", 'a"éz', "abéxyz", "abé"]),
    ("root ::= \"a\"{3} \"b\"{,2} \"c\"{1,} \"d\"?", ["aaac", "aaabbccd", "aaacccc"], ["aac", "aaabbbc", "aaab", "aaacdd"]),
    ('root ::= "[" (item ("," item)*)? "]"\nitem ::= [0-9]+ | root', ["[]", "[1,[2,[]],33]"], ["[1,]", "[", "[[]"]),
    ("root ::= (\n  \"a\" |\n  \"\\x62\\u00e9\\U0001F642\"\n)\n", ["a", "bé🙂"], ["b", "ab"]),
    ('root ::= [\\]\\[\\-a-c^]+', ["]-[", "ab^c"], ["d", ""]),
    # a repetition takes a whole string literal, as llama.cpp's: "ab"? is ("ab")?, not "a" "b"?
    ('root ::= "<|t|>"? "{" "ab"* "cd"{2} "ef"+', ["{cdcdef", "<|t|>{ababcdcdefef"],
     ["<|t{cdcdef", "{acdcdef", "{cdef", "{cdcd", "{cdcdf"]),
])
def test_grammars_accept_their_language(grammar, good, bad):
    g = Grammar.parse(grammar)
    assert [g.accepts(t) for t in good] == [True] * len(good)
    assert [g.accepts(t) for t in bad] == [False] * len(bad)


@pytest.mark.parametrize("grammar,message", [
    ("", "empty"), ("x ::= \"a\"", "no rule 'root'"), ("root ::= foo", "'foo', which is not defined"),
    ('root ::= "a', "unterminated string"), ("root ::= [b-a]", "backwards"), ('root ::= ("a"', "expected '\\)'"),
    ('root ::= "a"{3,1}', "backwards"), ('root ::= "a"\nroot ::= "b"', "defined twice"),
    ('root ::= expr\nexpr ::= expr "+" "1" | "1"', "left-recursive"),
    ('root ::= a\na ::= b? a "x" | "y"\nb ::= "z"', "left-recursive"),    # behind a nullable prefix
    ('root ::= "\\q"', "unknown escape"), ('root ::= * "a"', "nothing to repeat"), ('root ::= "a" )', "unmatched"),
    ('root ::= "a"{99999}', "repetition bound"), ('root ::= "\\x4"', "hex digits"),
])
def test_bad_grammars_are_refused(grammar, message):
    with pytest.raises(GrammarError, match=message):
        Grammar.parse(grammar)


class Vocab:
    """A stand-in tokenizer: these pieces, token 0 the end of generation."""

    def __init__(self, pieces):
        self.pieces, self.eog_ids = pieces, frozenset([0])

    def all_pieces(self):
        return self.pieces


def test_constraint_over_a_vocabulary():
    v = Vocab([b"", b"{", b"}", b'"a"', b":", b"1", b" ", b"x", b'{"', b"}}", b'a":', b"[1]"])
    c = constraint_for(v, "json")
    assert [t for t in range(12) if c.allows(t)] == [1, 6, 8]          # '{', ' ', '{"' (never the EOG)
    assert c.mask().tolist() == [t in (1, 6, 8) for t in range(12)]
    for t in (8, 10, 5):   # {" a": 1
        c.advance(t)
    # '}', more digits or ' '; not '}}' (one level open) nor '"a"' (a comma first)
    assert not c.done and [t for t in range(12) if c.allows(t)] == [2, 5, 6]
    c.advance(2)
    assert c.done and [t for t in range(12) if c.allows(t)] == [0]   # only the end
    c.advance(0)
    with pytest.raises(GrammarError, match="does not continue"):
        c.advance(7)
    stuck = GrammarConstraint(Grammar.parse('root ::= "q"'), v)
    with pytest.raises(GrammarError, match="no token"):
        stuck.mask()


def test_end_tokens_come_when_the_grammar_is_complete():
    v = Vocab([b"<eos>", b"a", b"b", b"<end_of_turn>", b"ab"])
    c = GrammarConstraint(Grammar.parse('root ::= "a" "b"?'), v, end_ids={0, 3})   # a chat's end of turn too
    assert c.mask().tolist() == [False, True, False, False, True]
    c.advance(1)
    assert not c.done and c.mask().tolist() == [True, False, True, True, False]
    c.advance(2)
    assert c.done and c.mask().tolist() == [True, False, False, True, False]


def brute_force_mask(g, sid, pieces):
    return np.array([bool(p) and g.feed(sid, p) >= 0 for p in pieces])


@pytest.mark.parametrize("seed", range(6))
def test_vocabulary_walk_equals_feeding_every_token(seed):
    """The sorted-trie walk (shared prefixes, dead prefixes skipped) finds exactly the tokens that
    feeding each token's bytes would, on random byte strings with shared prefixes and split UTF-8."""
    rng = random.Random(seed)
    alphabet = [b"{", b"}", b'"', b"a", b"b", b"1", b" ", b":", b",", "é".encode(), "日".encode(), b"\\", b"u", b"0"]
    pieces = [b""]
    for _ in range(400):
        p = b"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5)))
        cut = rng.randint(1, len(p))
        pieces.append(p[:cut] if rng.random() < 0.3 else p)   # some end inside a code point
    pieces += [pieces[5] + b"x", pieces[5]]                  # a duplicate and an extension
    v = Vocab(pieces)
    vocab = Vocabulary(v)
    for grammar in (JSON, Grammar.parse(r'root ::= ("a" | "é"+ | [0-9]{1,3} | "日" "b"?)* "}"')):
        sids = {grammar.start}
        for text in (b"", b'{"a', b'{"a": "\xc3', b'{"a": 1', b"aa\xc3\xa9", b"12", "日".encode(), b'{"a":[{"\\\\u0'):
            sid = grammar.feed(grammar.start, text)
            if sid >= 0:
                sids.add(sid)
        for sid in sids:
            assert (vocab.allowed(grammar, sid) == brute_force_mask(grammar, sid, pieces)).all()


@pytest.fixture(scope="module")
def smol(smollm2_path):
    with Model(smollm2_path, n_threads=2) as m:
        yield m


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.8, 1), (1.5, 2), (2.0, 3)])
def test_replies_are_one_json_object(smol, temperature, seed):
    """Greedy and sampled replies (hot ones draw tokens the grammar refuses: the draw is made
    again among those it allows) parse as one JSON object, and end where it closes."""
    c = smol.chat([{"role": "user", "content": "Describe a cat as JSON with its name, age and colours."}],
                  temperature=temperature, seed=seed, max_tokens=120, format="json")
    sid = JSON.feed(JSON.start, c.text.encode())
    assert sid >= 0
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.text), dict) and JSON.finished(sid)
    else:   # out of tokens: what came is a prefix of an object
        assert c.finish_reason == "length" and not JSON.accepting(sid)
    raw = smol.generate("My favourite fruits are", temperature=temperature, seed=seed, max_tokens=80, format="json")
    assert JSON.feed(JSON.start, raw.text.encode()) >= 0
    with pytest.raises(InvalidArgumentError, match="format must be"):
        smol.generate("x", format="yaml")


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (1.5, 1)])
def test_replies_follow_a_gbnf_grammar(smol, temperature, seed):
    grammar = r'''
root  ::= "Colours: " color (", " color){1,2} "."
color ::= "red" | "green" | "blue" | "yellow"
'''
    c = smol.chat([{"role": "user", "content": "Name some colours."}], grammar=grammar,
                  temperature=temperature, seed=seed, max_tokens=40)
    assert c.finish_reason == "stop" and Grammar.parse(grammar).accepts(c.text), c.text
    g = smol.generate("Is the sky blue?", grammar='root ::= " " ("yes" | "no")', temperature=temperature, seed=seed)
    assert g.text in (" yes", " no") and g.finish_reason == "stop"
    with pytest.raises(InvalidArgumentError, match="not both"):
        smol.generate("x", format="json", grammar=grammar)
    with pytest.raises(GrammarError, match="left-recursive"):
        smol.generate("x", grammar='root ::= root "a" | "a"')


def test_cli_format_json(smollm2_path):
    r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", "run", "-m", smollm2_path, "--chat", "--temp", "0",
                        "-n", "120", "--format", "json", "-p", "Give a JSON object with a name and an age."],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads(r.stdout), dict)


def test_cli_json_schema_and_grammar_file(smollm2_path, tmp_path):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 30}},
              "required": ["name", "age"]}
    base = [sys.executable, "-m", "pyllm.cli.main", "run", "-m", smollm2_path, "--chat", "--temp", "0", "-n", "60",
            "-p", "Describe a cat."]
    r = subprocess.run(base + ["-j", json.dumps(schema)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cat = json.loads(r.stdout)
    assert list(cat) == ["name", "age"] and len(cat["name"]) <= 12 and 0 <= cat["age"] <= 30
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    r2 = subprocess.run(base + ["--json-schema-file", str(tmp_path / "schema.json")], capture_output=True,
                        text=True, timeout=120)
    assert r2.returncode == 0 and r2.stdout == r.stdout
    (tmp_path / "g.gbnf").write_text('root ::= "A " animal "."\nanimal ::= "cat" | "dog"\n')
    r = subprocess.run(base + ["--grammar-file", str(tmp_path / "g.gbnf")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() in ("A cat.", "A dog.")
    for extra, message in ((["-j", "{not json"], "not JSON"), (["-j", '{"type": "string", "pattern": "(?=x)"}'], "look-around"),
                           (["--grammar", "root ::= root"], "left-recursive"), (["--format", "yaml"], "json or a"),
                           (["--format", "json", "--grammar", 'root ::= "a"'], "not both")):
        r = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


THINKING_VOCAB = [b"<eos>", b"<think>", b"</think>", b"hmm", b" ", b"\n\n", b"{", b"}", b'"a"', b":", b"1", b"x",
                  b"<|channel|>", b"final", b"<|message|>", b"analysis", b"<|end|>", b"<|start|>", b"assistant",
                  b"</think>\n{"]


def answer_constraint(start_thinking=False):
    from pyllm.grammar import AnswerConstraint
    return AnswerConstraint(constraint_for(Vocab(THINKING_VOCAB), "json"), start_thinking)


def allowed(c):
    mask = c.mask()
    assert mask.tolist() == [c.allows(t) for t in range(len(THINKING_VOCAB))]   # the two ways agree
    return {THINKING_VOCAB[t].decode() for t in range(len(THINKING_VOCAB)) if mask[t]}


def feed(c, *pieces):
    for p in pieces:
        c.advance(THINKING_VOCAB.index(p))


def test_the_answer_is_held_and_the_thinking_is_free():
    c = answer_constraint()   # a reply that opens no thinking: the grammar from its first token
    assert allowed(c) == {"{", " ", "\n\n", "<think>", "<|channel|>"}
    feed(c, b"{")
    assert allowed(c) == {"}", '"a"', " ", "\n\n"} and not c.done
    c = answer_constraint()   # thinking, then blanks, then the answer
    feed(c, b"<think>", b"hmm", b"}", b"x")
    assert len(allowed(c)) == len(THINKING_VOCAB)
    feed(c, b"</think>")
    assert allowed(c) == {"{", " ", "\n\n"}
    feed(c, b"\n\n", b" ", b"{", b'"a"', b":", b"1")
    assert not c.done and "x" not in allowed(c)
    feed(c, b"}")
    assert c.done and allowed(c) == {"<eos>"}
    c = answer_constraint(start_thinking=True)   # the prompt opened the thinking
    assert len(allowed(c)) == len(THINKING_VOCAB)
    feed(c, b"hmm", b"</think>\n{")   # the answer starts inside the token that closes the thinking
    assert allowed(c) == {"}", '"a"', " ", "\n\n"}
    c = answer_constraint()   # harmony: analysis is free, the final channel is the answer
    feed(c, b"<|channel|>", b"analysis", b"<|message|>", b"hmm", b"x", b"<|end|>", b"<|start|>", b"assistant",
         b"<|channel|>", b"final")
    assert len(allowed(c)) == len(THINKING_VOCAB)
    feed(c, b"<|message|>")
    assert allowed(c) == {"{", " ", "\n\n"}
    feed(c, b"{", b"}")
    assert c.done


def test_a_lazy_grammar_holds_from_its_trigger_on():
    from pyllm.grammar import Trigger, TriggeredConstraint
    v = Vocab([b"<eos>", b"Let me ", b"check", b"<tool", b"_call>", b"{", b"}", b"x", b" <tool_call>{", b"<tool_call>x"])
    grammar = Grammar.parse('root ::= "<tool_call>" "{" "}"')

    def lazy():
        return TriggeredConstraint(GrammarConstraint(grammar, v), Trigger(("<tool_call>",)))

    c = lazy()
    assert c.mask().all() and all(c.allows(t) for t in range(len(v.pieces)))   # free text, the end included
    for t in (1, 2, 3):
        c.advance(t)
    assert not c.active
    c.advance(4)   # the trigger, split across two tokens: the grammar from it on
    assert c.active and c.mask().tolist() == [t == 5 for t in range(10)]
    c.advance(5)
    c.advance(6)
    assert c.done
    c = lazy()
    c.advance(8)   # the trigger and what follows it in one token
    assert c.active and [t for t in range(10) if c.allows(t)] == [6]
    c = lazy()
    c.advance(9)   # what follows the trigger is not the grammar's: the text stays free
    assert not c.active and c.mask().all()
    c.advance(3)
    c.advance(4)
    assert not c.active


def test_a_lazy_grammar_at_the_start_of_the_reply():
    """Llama 3's calls: the grammar holds a reply that begins with '{"' or <|python_tag|> (after
    blanks), and never one that began as prose, even if '{"' comes later."""
    from pyllm.grammar import Trigger, TriggeredConstraint
    v = Vocab([b"<eos>", b" ", b"{", b'"', b"a", b"}", b"<|python_tag|>", b"Sure: ", b'{"'])
    grammar = Grammar.parse('root ::= "<|python_tag|>"? "{" [\x22] "a" [\x22] "}"')

    def lazy():
        return TriggeredConstraint(GrammarConstraint(grammar, v), Trigger(('{"', "<|python_tag|>"), at_start=True))

    def feed(c, *pieces):
        for p in pieces:
            c.advance(v.pieces.index(p))

    def allowed(c):
        return {v.pieces[t].decode() for t in range(len(v.pieces)) if c.mask()[t]}

    c = lazy()
    feed(c, b" ", b"{")          # blanks, then the start of a trigger word: still free
    assert not c.active and c.mask().all()
    feed(c, b'"')
    assert c.active and allowed(c) == {"a"}
    c = lazy()
    feed(c, b"<|python_tag|>")
    assert c.active and allowed(c) == {"{", '{"'}
    c = lazy()
    feed(c, b"Sure: ", b'{"')    # prose first: the reply stays free
    assert not c.active and c.mask().all()
    c = lazy()
    feed(c, b"{", b"a")          # '{' then not '"': not a call
    feed(c, b'{"')
    assert not c.active
