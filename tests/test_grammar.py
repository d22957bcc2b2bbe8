"""JSON mode (pyllm/grammar.py): the byte automaton, the constraint over a vocabulary, and
replies of a real model that come out as one JSON object."""
import json
import subprocess
import sys

import pytest

from pyllm import InvalidArgumentError, Model
from pyllm.grammar import DONE, START, JsonConstraint, feed

OBJECTS = [b"{}", b' \n{"a": 1}', b'{"a": [1, 2.5e-3, -0, 0.5E+2, true, false, null, {"b": "x\\u00e9\\n\\"q\\""}], "c": {}}',
           '{"é": "日本 🙂"}'.encode(), b'{"a":{"b":{"c":[[],[{}]]}}}', b'{"\\\\": "\\/"}', b'{"n": -12.0e9}']
NOT_OBJECTS = [b"[]", b'"a"', b"1", b'{"a" 1}', b'{"a": 01}', b'{"a": tru}', b"{a: 1}", b'{"a": "\x01"}',
               b'{"a": 1,}', b'{"a": "\\x"}', b'{"a": 1.}', b"{} x", b'{"a": -}', b'{"a": "\xff"}', b'{"a": .5}',
               b'{"a": "\\u12g4"}', b'{"a": 1e}', b"{,}", b'{"a": [1 2]}', b'{"a": [1,]}', b'{"a": "\xc3"}x']


@pytest.mark.parametrize("text", OBJECTS)
def test_objects_are_accepted_to_the_end(text):
    assert feed(START, text)[0] == DONE
    for i in range(len(text)):   # every prefix continues, none is done before the end
        state = feed(START, text[:i])
        assert state is not None and (state[0] != DONE or not text[i:].strip())


@pytest.mark.parametrize("text", NOT_OBJECTS)
def test_what_is_not_one_object_is_refused(text):
    state = feed(START, text)
    assert state is None or state[0] != DONE
    assert all(json.loads(t.decode()) is not None for t in OBJECTS)   # the accepted ones are JSON indeed


class Vocab:
    """A stand-in tokenizer: these pieces, token 0 the end of generation."""

    def __init__(self, pieces):
        self.pieces, self.eog_ids = pieces, frozenset([0])

    def all_pieces(self):
        return self.pieces


def test_constraint_over_a_vocabulary():
    v = Vocab([b"", b"{", b"}", b'"a"', b":", b"1", b" ", b"x", b'{"', b"}}", b'a":', b"[1]"])
    c = JsonConstraint(v)
    assert [t for t in range(12) if c.allows(t)] == [1, 6, 8]          # '{', ' ', '{"' (never the EOG)
    assert c.mask().tolist() == [t in (1, 6, 8) for t in range(12)]
    for t in (8, 10, 5):   # {" a": 1
        c.advance(t)
    # '}', more digits or ' '; not '}}' (one level open) nor '"a"' (a comma first)
    assert not c.done and [t for t in range(12) if c.allows(t)] == [2, 5, 6]
    c.advance(2)
    assert c.done and not any(c.allows(t) for t in range(12))
    with pytest.raises(InvalidArgumentError, match="no token"):
        c.mask()
    with pytest.raises(InvalidArgumentError, match="does not continue"):
        c.advance(7)


@pytest.fixture(scope="module")
def smol(smollm2_path):
    with Model(smollm2_path, n_threads=2) as m:
        yield m


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.8, 1), (1.5, 2), (2.0, 3)])
def test_replies_are_one_json_object(smol, temperature, seed):
    """Greedy and sampled replies (hot ones draw tokens the automaton refuses: the draw is made
    again among those it allows) parse as one JSON object, and end where it closes."""
    c = smol.chat([{"role": "user", "content": "Describe a cat as JSON with its name, age and colours."}],
                  temperature=temperature, seed=seed, max_tokens=120, format="json")
    state = feed(START, c.text.encode())
    assert state is not None
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.text), dict) and state[0] == DONE
    else:   # out of tokens: what came is a prefix of an object
        assert c.finish_reason == "length" and state[0] != DONE
    raw = smol.generate("My favourite fruits are", temperature=temperature, seed=seed, max_tokens=80, format="json")
    assert feed(START, raw.text.encode()) is not None
    with pytest.raises(InvalidArgumentError, match="format must be one of json"):
        smol.generate("x", format="yaml")


def test_cli_format_json(smollm2_path):
    r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", "run", "-m", smollm2_path, "--chat", "--temp", "0",
                        "-n", "120", "--format", "json", "-p", "Give a JSON object with a name and an age."],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads(r.stdout), dict)
