"""The RWKV World tokenizer ('rwkv'): escaped byte-string tokens, greedy longest match over the
text's bytes, the unknown token for a byte no token starts with, decoding to raw bytes.

The vocabularies are made here, shaped like RWKV World's (token 0 '<s>', single bytes written
as Python prints them in a bytes literal). The ids below are worked out by hand from the
algorithm; benchmarks/compare_rwkv_tokenizer.py checks the same kind of vocabularies against
llama.cpp itself (never needed here).
"""
from __future__ import annotations

import random
import time

import pytest

from pyllm.tokenizer import SUPPORTED_MODELS, RWKVTokenizer, load_tokenizer
from pyllm.tokenizer.rwkv import unescape

# (escaped text as in the GGUF, token type); the comment gives the bytes it stands for
HAND = [
    ("<s>", 3),                 # 0   control: BOS and EOS, as the converter names it
    ("a", 1),                   # 1
    ("ab", 1),                  # 2
    ("abc", 1),                 # 3
    ("b", 1),                   # 4
    ("bc", 1),                  # 5
    ("c", 1),                   # 6
    ("cde", 1),                 # 7
    ("d", 1),                   # 8
    ("e", 1),                   # 9
    ("\\n", 1),                 # 10  b"\n"
    ("\\n\\n", 1),              # 11  b"\n\n"
    ("\\xe4\\xbd\\xa0", 1),     # 12  "你"
    ("\\xe4\\xbd", 1),          # 13  its first two bytes
    ("\\xe5\\xa5\\xbd", 1),     # 14  "好"
    ("\\xf0\\x9f", 1),          # 15  "😀" is F0 9F 98 80: its first half
    ("\\x98\\x80", 1),          # 16  and its second half
    ("\\x00", 1),               # 17  NUL
    ("\\t", 1),                 # 18
    ("\\r", 1),                 # 19
    (" ", 1),                   # 20
    ("\\\\", 1),                # 21  a backslash
    ("\\'", 1),                 # 22  a quote
    ("\\x41", 1),               # 23  "A"
    ("A", 1),                   # 24  "A" too: the later id is the one the text gives
    ("\\x4A", 1),               # 25  "Q": llama.cpp reads hex digits as lower case, 'A' as 17
    ("xyz", 1),                 # 26
    ("<|user|>", 4),            # 27  user-defined
    ("<|endoftext|>", 3),       # 28  control (found as EOT by its text)
    ("<|endoftext|>\\n", 1),    # 29  a normal token that begins with the control token's text
    ("<unk>", 2),               # 30  unknown (used only where the file names it)
    ("[PAD31]", 5),             # 31  unused
    ("\\xe", 1),                # 32  an escape cut short: no bytes
    ("q\\", 1),                 # 33  a trailing backslash gives nothing: "q"
]
SPARSE = frozenset({0x01, 0xA1, ord("x"), ord("y")})   # bytes without a token of their own


def _metadata(missing=frozenset(), **extra) -> dict:
    tokens = [t for t, _ in HAND]
    types = [k for _, k in HAND]
    have = {unescape(t) for t in tokens}
    for b in range(256):   # every other single byte, escaped as convert_hf_to_gguf.py writes it
        if bytes([b]) not in have and b not in missing:
            tokens.append(repr(bytes([b]))[2:-1])
            types.append(1)
    md = {"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    md.update(extra)
    return md


@pytest.fixture(scope="module")
def full() -> RWKVTokenizer:
    return load_tokenizer(_metadata(**{"tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0}))


@pytest.fixture(scope="module")
def sparse_unk() -> RWKVTokenizer:
    return load_tokenizer(_metadata(SPARSE, **{"tokenizer.ggml.unknown_token_id": 30}))


@pytest.fixture(scope="module")
def sparse() -> RWKVTokenizer:
    return load_tokenizer(_metadata(SPARSE))


def _ids(tok, text: str, **kw) -> list[int]:
    return tok.encode(text, add_bos=False, add_eos=False, **kw)


# ---- loading ---------------------------------------------------------------------

def test_loads_as_rwkv_with_llama_cpp_defaults(full, sparse):
    assert "rwkv" in SUPPORTED_MODELS
    assert isinstance(full, RWKVTokenizer) and full.model == "rwkv"
    # the hand tokens already stand for 15 single bytes (a b c d e \n NUL \t \r space \\ ' A Q q)
    assert full.n_vocab == 34 + 256 - 15
    # llama.cpp names no BOS, EOS or unknown token for 'rwkv' and adds neither
    assert (sparse.bos_id, sparse.eos_id, sparse.unk_id) == (None, None, None)
    assert not sparse.add_bos and not sparse.add_eos
    assert (full.bos_id, full.eos_id) == (0, 0)
    assert full.encode("a") == [1]                      # the file's add_bos_token is absent: no BOS
    assert full.encode("a", add_bos=True) == [0, 1]
    assert full.eot_id == 28 and 28 in full.eog_ids and 0 in full.eog_ids


def test_unescape_as_llama_cpp():
    assert unescape("\\n\\t\\r") == b"\n\t\r"
    assert unescape("\\x00\\xff\\x4a") == b"\x00\xffJ"
    assert unescape("\\x4A") == b"Q"            # 4 * 16 + ('A' - '0') = 81
    assert unescape("\\\\") == b"\\" and unescape("\\'") == b"'" and unescape('\\"') == b'"'
    assert unescape("\\q") == b"q"               # any other escaped character is itself
    assert unescape("\\xe") == b"" and unescape("a\\") == b"a"   # cut short: nothing
    assert unescape("é中") == "é中".encode()      # plain characters: their UTF-8 bytes
    # every byte the way the converter escapes it comes back
    assert all(unescape(repr(bytes([b]))[2:-1]) == bytes([b]) for b in range(256))


# ---- greedy longest match -------------------------------------------------------------

def test_greedy_longest_match(full):
    # at 0: 'a', 'ab', 'abc' are tokens and 'abcb' begins none, so 'abc'; at 3: 'b', then 'bc'
    assert _ids(full, "abcbc") == [3, 5]
    # greedy, not fewest tokens: 'abc' is taken first, leaving 'd' 'e', though 'ab' + 'cde' is two
    assert _ids(full, "abcde") == [3, 8, 9]
    # the text ends on the way to 'abc': the longest token seen, 'ab'
    assert _ids(full, "ab") == [2]
    # 'aa' begins no token, so 'a'; then 'ab'
    assert _ids(full, "aab") == [1, 2]
    assert _ids(full, "\n\n\n") == [11, 10]          # '\n\n' first, the last '\n' alone


def test_bytes_and_escapes(full):
    assert _ids(full, "你好") == [12, 14]             # E4 BD A0 | E5 A5 BD, whole characters
    assert _ids(full, "😀") == [15, 16]               # a character in two tokens
    assert _ids(full, "\x00\t\r") == [17, 18, 19]
    assert _ids(full, "\\'") == [21, 22]              # backslash and quote as written
    assert _ids(full, "A") == [24]                    # two tokens are 'A': the later one
    assert _ids(full, "Q") == [25]                    # '\x4A' is 'Q' to llama.cpp, and shadows the byte 'Q'
    assert _ids(full, "J") == [full.token_id("J")] != [25]
    assert _ids(full, "q") == [33]
    # a character whose first two bytes are a token but not all three: those two, then the byte
    assert _ids(full, "\u4f61") == [13, full.token_id("\\xa1")]


# ---- special tokens -------------------------------------------------------------------

def test_special_tokens(full):
    # user-defined tokens are split out always
    assert _ids(full, "a<|user|>b") == [1, 27, 4]
    assert _ids(full, "a<|user|>b", parse_special=True) == [1, 27, 4]
    # control tokens only with parse_special; without, the text goes through the match,
    # where the longer normal token wins
    assert _ids(full, "<|endoftext|>\n", parse_special=True) == [28, 10]
    assert _ids(full, "<|endoftext|>\n") == [29]
    # every token is matched, control and unused ones too (as in llama.cpp's trie)
    assert _ids(full, "<s>") == [0]
    assert _ids(full, "[PAD31]") == [31]
    assert _ids(full, "<s>a<|endoftext|>", parse_special=True) == [0, 1, 28]


# ---- bytes no token starts with -------------------------------------------------------

def test_unknown_bytes_with_an_unknown_token(sparse_unk):
    assert sparse_unk.unk_id == 30
    assert _ids(sparse_unk, "\x01") == [30]
    assert _ids(sparse_unk, "a\x01b") == [1, 30, 4]
    assert _ids(sparse_unk, "\u4f61") == [13, 30]     # E4 BD, then A1 has no token
    assert _ids(sparse_unk, "xyz") == [26]
    # 'x' only begins 'xyz' and 'y' begins nothing: one unknown token per byte
    # (llama.cpp never finishes on the first case; see pyllm/tokenizer/rwkv.py)
    assert _ids(sparse_unk, "xy") == [30, 30]
    assert _ids(sparse_unk, "xyzy") == [26, 30]


def test_unknown_bytes_without_an_unknown_token(sparse):
    # llama.cpp writes the invalid id -1 there; pyllm writes nothing
    assert _ids(sparse, "a\x01b") == [1, 4]
    assert _ids(sparse, "\u4f61") == [13]
    assert _ids(sparse, "xy") == []
    assert _ids(sparse, "xyzy") == [26]


# ---- decoding -------------------------------------------------------------------------

def test_pieces_are_the_unescaped_bytes(full):
    assert full.token_to_piece(25) == b"Q"
    assert full.token_to_piece(23) == b"A"
    assert full.token_to_piece(21) == b"\\"
    assert full.token_to_piece(10) == b"\n"
    assert full.token_to_piece(15) == b"\xf0\x9f"
    assert full.token_to_piece(32) == b""
    assert full.token_to_piece(33) == b"q"
    assert full.token_to_piece(31) == b"[PAD31]"      # unused tokens render too
    assert full.token_to_piece(0) == b"<s>" and full.token_to_piece(0, special=False) == b""
    assert full.token_to_piece(27, special=False) == b"<|user|>"
    assert full.decode([0, 1, 28]) == "<s>a<|endoftext|>"
    assert full.decode([0, 1, 28], skip_special=True) == "a"
    assert full.decode([13, full.token_id("\\xa0")]) == "你"
    assert full.decode([13]) == "\ufffd"              # half a character


def test_stream_decoder_holds_a_split_character(full):
    stream = full.stream_decoder()
    assert [stream.push(t) for t in (1, 15, 16, 13)] == ["a", "", "😀", ""]
    assert stream.push(full.token_id("\\xa0")) == "你"
    assert stream.push(13) == ""
    assert stream.flush() == "\ufffd"                 # never finished


ROUND_TRIP = ["Hello, world! It's \"quoted\" and back\\slashed.", "def f(x):\n\treturn x\r\n\n\n",
              "你好，世界！中文 日本語 한국어", "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 flag 🇯🇵",
              "\x00\x01\x02\x1b[31mred\x1b[0m\x7f\x0b\x0c", "café naïve Ωμέγα Привет مرحبا", "",
              "abcbcabcde aab <s> [PAD31] <|endoftext|>\n\\x4A Q A"]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(full, text):
    ids = _ids(full, text)
    assert full.decode(ids) == text
    stream = full.stream_decoder()
    assert "".join(stream.push(t) for t in ids) + stream.flush() == text


def test_round_trip_random(full):
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(chr(rng.choice([rng.randrange(0, 128), rng.randrange(0x80, 0xD800),
                                       rng.randrange(0xE000, 0x110000)])) for _ in range(rng.randint(1, 20)))
        assert full.decode(_ids(full, text)) == text
        assert full.decode(_ids(full, text, parse_special=True)) == text


def test_speed(full):
    text = ("".join(ROUND_TRIP) * 40)[:10_000]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        ids = _ids(full, text)
        best = min(best, time.perf_counter() - t0)
    assert full.decode(ids) == text
    assert best < 0.1, f"10 kB took {best:.3f} s"
