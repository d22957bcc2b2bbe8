"""The WordPiece ('bert') tokenizer: greedy longest match, whole-word [UNK],
normalisation switches, [CLS]/[SEP] framing, decoding.

Small vocabularies are built here; the real one is all-MiniLM-L6-v2 (fetched
by the minilm_path fixture). The ids hard-coded for it come from llama.cpp
(llama-cpp-python 0.3.36); tests/test_tokenizer.py checks the many more in
tests/data/tokenizer_cases.json.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest

from pyllm.errors import InvalidArgumentError
from pyllm.model_file import ModelFile
from pyllm.tokenizer import WPMTokenizer, load_tokenizer
from pyllm.tokenizer import wpm

ROOT = Path(__file__).resolve().parent.parent
CASES = json.loads((ROOT / "tests" / "data" / "tokenizer_cases.json").read_text(encoding="utf-8"))

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["▁un", "▁unaff", "aff", "able", "▁hello", "▁world", "▁,", "▁!", "▁$", "▁^", "▁中",
         "▁cafe", "▁café", "▁Café", "▁Cafe", "▁ab", "▁a", "bc", "ab", "▁x", "x", "xx", "▁€",
         "▁[", "▁]", "▁mask", "▁ᄒ", "▁i", "▁ℌ"]


def _metadata(**extra) -> dict:
    tokens = SPECIALS + WORDS
    md = {
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([3] * len(SPECIALS) + [1] * len(WORDS), dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 1,
        "tokenizer.ggml.seperator_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.mask_token_id": 4,
    }
    md.update(extra)
    return md


@pytest.fixture(scope="module")
def tiny() -> WPMTokenizer:
    return load_tokenizer(_metadata())


def _pieces(tok, text: str, **kw) -> list[str]:
    return [tok.token_text(i) for i in tok.encode(text, add_bos=False, add_eos=False, **kw)]


# ---- WordPiece on a hand-made vocabulary ----------------------------------------

def test_loads_as_wordpiece(tiny):
    assert isinstance(tiny, WPMTokenizer) and tiny.model == "bert"
    assert (tiny.bos_id, tiny.sep_id, tiny.unk_id) == (2, 3, 1)
    assert tiny.lowercase and tiny.strip_accents   # the defaults
    assert tiny.add_bos


def test_greedy_longest_match(tiny):
    assert _pieces(tiny, "unaffable") == ["▁unaff", "able"]    # not ▁un + aff + able
    assert _pieces(tiny, "un") == ["▁un"]
    assert _pieces(tiny, "xxxxx") == ["▁x", "xx", "xx"]
    # a word longer than any token is cut into many
    assert _pieces(tiny, "x" * 41) == ["▁x"] + ["xx"] * 20


def test_greedy_is_not_optimal_and_a_dead_end_is_one_unk(tiny):
    # '▁ab' is taken first; then 'c' has no token, so the whole word is [UNK]
    # although '▁a' + 'bc' would have covered it (llama.cpp discards the word)
    assert _pieces(tiny, "abc") == ["[UNK]"]
    assert _pieces(tiny, "abbc") == ["▁ab", "bc"]
    # a known start is not kept: the whole word goes
    assert _pieces(tiny, "helloq world") == ["[UNK]", "▁world"]
    assert _pieces(tiny, "q") == ["[UNK]"]


def test_punctuation_ascii_symbols_and_cjk_are_words_of_their_own(tiny):
    assert _pieces(tiny, "hello,world!") == ["▁hello", "▁,", "▁world", "▁!"]
    assert _pieces(tiny, "x$x^x") == ["▁x", "▁$", "▁x", "▁^", "▁x"]
    assert _pieces(tiny, "x中x") == ["▁x", "▁中", "▁x"]
    # a symbol above U+007F stays inside the word: 'x€x' is one word, unknown
    assert _pieces(tiny, "x€x") == ["[UNK]"]
    assert _pieces(tiny, "x €") == ["▁x", "▁€"]


def test_whitespace_and_dropped_code_points(tiny):
    # llama.cpp's whitespace: the Unicode White_Space list
    for ws in [" ", "\t", "\n", "\r\n", "\v", "\f", "\x85", "\xa0", "\u2009", "\u3000", "\u2028"]:
        assert _pieces(tiny, f"hello{ws}world") == ["▁hello", "▁world"], repr(ws)
    # NUL, U+FFFD, controls and format characters vanish without ending the word;
    # U+001C..U+001F are controls there (Python's str.isspace() says whitespace)
    for gone in ["\x00", "\ufffd", "\x01", "\x7f", "\x1c", "\x1f", "\u200b", "\ufeff", "\u00ad", "\ue000"]:
        assert _pieces(tiny, f"hel{gone}lo") == ["▁hello"], repr(gone)
    assert _pieces(tiny, "") == [] and _pieces(tiny, " \t\n ") == []


def test_lowercase_and_strip_accents_switches():
    text = "Café"
    default = load_tokenizer(_metadata())
    assert _pieces(default, text) == ["▁cafe"]
    keep_accents = load_tokenizer(_metadata(**{"tokenizer.ggml.normalizer.strip_accents": False}))
    assert keep_accents.lowercase and not keep_accents.strip_accents
    assert _pieces(keep_accents, text) == ["▁café"]
    cased = load_tokenizer(_metadata(**{"tokenizer.ggml.normalizer.lowercase": False}))
    assert not cased.lowercase and not cased.strip_accents    # strip_accents follows lowercase
    assert _pieces(cased, text) == ["▁Café"]
    assert _pieces(cased, "HELLO") == ["[UNK]"]
    cased_stripped = load_tokenizer(_metadata(**{"tokenizer.ggml.normalizer.lowercase": False,
                                                  "tokenizer.ggml.normalizer.strip_accents": True}))
    assert _pieces(cased_stripped, text) == ["▁Cafe"]
    # a combining accent is dropped only when stripping accents
    assert _pieces(default, "cafe\u0301") == ["▁cafe"]
    assert _pieces(keep_accents, "cafe\u0301") == ["[UNK]"]


def test_llama_cpp_normalisation_quirks(tiny):
    # 'NFD' keeps the first code point of the decomposition only: a Hangul
    # syllable becomes its leading consonant (Hugging Face keeps all the jamo)
    assert _pieces(tiny, "한") == ["▁ᄒ"]
    # simple lowercase mapping: 'İ' -> 'i' (str.lower() gives 'i' + U+0307)
    assert _pieces(tiny, "İ") == ["▁i"]
    # no compatibility decomposition (NFD, not NFKD)
    assert _pieces(tiny, "ℌ") == ["▁ℌ"]


def test_code_point_classes():
    c = wpm.code_point_class
    assert c(0x20) == c(0x85) == c(0x3000) == wpm._WHITESPACE
    assert c(0x1C) == c(0x200B) == c(0xE000) == wpm._CONTROL
    assert c(0x0301) == c(0x093F) == wpm._MARK          # Mn and Mc both
    assert c(ord(",")) == c(0x3001) == wpm._PUNCT
    assert c(ord("$")) == c(0x20AC) == wpm._SYMBOL
    assert c(0x0378) == wpm._OTHER                      # unassigned: kept
    # first assigned in Unicode 15.0 (llama.cpp's tables know it, Python 3.11 not)
    assert c(0x11F43) == wpm._PUNCT and c(0x13439) == wpm._CONTROL
    assert wpm.is_chinese_char(0x4E2D) and not wpm.is_chinese_char(0x3042)
    assert not wpm.is_chinese_char(0x2B820) and wpm.is_chinese_char(0x2B920)
    assert wpm.nfd_first(0xC5) == ord("A") and wpm.nfd_first(0xD55C) == 0x1112
    assert wpm.simple_lower(0x130) == ord("i") and wpm.simple_lower(ord("Σ")) == ord("σ")


def test_cls_and_sep_framing(tiny):
    hello = tiny.token_id("▁hello")
    # llama_tokenize(add_special=True): [CLS] ... [SEP]
    assert tiny.encode("hello") == [2, hello, 3]
    assert tiny.encode("") == [2, 3]
    # add_special=False
    assert tiny.encode("hello", add_bos=False, add_eos=False) == [hello]
    assert tiny.encode("hello", add_bos=True, add_eos=False) == [2, hello]
    assert tiny.encode("hello", add_bos=False, add_eos=True) == [hello, 3]
    # llama.cpp frames BERT input whatever the file's add_bos / add_eos flags say
    off = load_tokenizer(_metadata(**{"tokenizer.ggml.add_bos_token": False,
                                      "tokenizer.ggml.add_eos_token": False}))
    assert not off.add_bos
    assert off.encode("hello") == [2, hello, 3]


def test_special_tokens_in_text(tiny):
    text = "hello [MASK] world"
    assert tiny.encode(text, parse_special=True) == [2, tiny.token_id("▁hello"), 4,
                                                     tiny.token_id("▁world"), 3]
    # without parse_special the brackets are punctuation and 'mask' a word
    assert _pieces(tiny, text) == ["▁hello", "▁[", "▁mask", "▁]", "▁world"]
    assert _pieces(tiny, "[SEP][MASK]", parse_special=True) == ["[SEP]", "[MASK]"]


def test_default_special_ids_out_of_range_and_missing_unk():
    # BERT's default ids (101 [CLS], 102 [SEP], 100 [UNK]) do not exist in a
    # 5-token vocabulary: no framing then, and unknown words are left out
    md = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["▁a", "b", "▁c", "[X]", "▁!"]}
    tok = load_tokenizer(md)
    assert tok.bos_id is None and tok.sep_id is None and tok.unk_id is None
    with pytest.raises(InvalidArgumentError):
        tok.encode("a")
    assert tok.encode("ab zz c!", add_bos=False, add_eos=False) == [0, 1, 2, 4]


def test_decode(tiny):
    ids = tiny.encode("hello , world !")
    assert tiny.decode(ids) == "[CLS] hello, world![SEP]"
    # clean_spaces: ' ,' and ' !' lose their space; the leading space stays
    assert tiny.decode(ids[1:-1]) == " hello, world!"
    # skip_special drops [CLS] (add_bos) and renders [SEP] as nothing
    assert tiny.decode(ids, skip_special=True) == " hello, world!"
    assert tiny.token_to_piece(tiny.token_id("▁hello")) == b" hello"
    assert tiny.token_to_piece(tiny.token_id("able")) == b"able"
    assert tiny.token_to_piece(4) == b"[MASK]" and tiny.token_to_piece(4, special=False) == b""


# ---- the real vocabulary -------------------------------------------------------

@pytest.fixture(scope="module")
def minilm_metadata(minilm_path) -> dict:
    with ModelFile(minilm_path) as mf:
        return dict(mf.metadata)


@pytest.fixture(scope="module")
def minilm(minilm_metadata) -> WPMTokenizer:
    return load_tokenizer(minilm_metadata)


# (text, parse_special, llama_tokenize(add_special=True) from llama.cpp)
LLAMA_CPP_IDS = [
    ("Hello world", False, [101, 7592, 2088, 102]),
    ("Café naïve Ångström!", False, [101, 7668, 15743, 17076, 15687, 999, 102]),
    ("The [MASK] sat.", True, [101, 1996, 103, 2938, 1012, 102]),
    ("The [MASK] sat.", False, [101, 1996, 1031, 7308, 1033, 2938, 1012, 102]),
    ("你好 한국", False, [101, 100, 100, 1469, 29991, 102]),
    ("helloᚠworld ok", False, [101, 100, 7929, 102]),
    ("x" * 200, False, [101, 22038] + [20348] * 99 + [102]),
    ("$5^2~`a`", False, [101, 1002, 1019, 1034, 1016, 1066, 1036, 1037, 1036, 102]),
    ("", False, [101, 102]),
    ("tab\tnew\nline\x00nul\ufffd\u200bzw", False, [101, 21628, 2047, 17517, 5313, 2480, 2860, 102]),
]


@pytest.mark.model
@pytest.mark.parametrize("text,parse_special,ids", LLAMA_CPP_IDS)
def test_minilm_ids_from_llama_cpp(minilm, text, parse_special, ids):
    assert minilm.encode(text, parse_special=parse_special) == ids
    assert minilm.encode(text, add_bos=False, add_eos=False, parse_special=parse_special) == ids[1:-1]


@pytest.mark.model
def test_minilm_vocabulary(minilm):
    assert minilm.n_vocab == 30522
    assert (minilm.bos_id, minilm.sep_id, minilm.unk_id, minilm.pad_id) == (101, 102, 100, 0)
    assert minilm.lowercase and minilm.strip_accents
    assert minilm.token_text(7592) == "▁hello" and minilm.is_special(103)
    cfg = CASES["configs"]["minilm"]
    assert sorted(minilm.eog_ids) == cfg["eog"] == [0, 102]   # [PAD] (a FIM pad text) and [SEP]
    for special, key in ((True, "pieces_special_sha256"), (False, "pieces_sha256")):
        h = hashlib.sha256()
        for i in range(minilm.n_vocab):
            piece = minilm.token_to_piece(i, special=special)
            h.update((2 * len(piece)).to_bytes(4, "little"))
            h.update(piece)
        assert h.hexdigest() == cfg[key]


@pytest.mark.model
def test_minilm_decode_round_trip(minilm):
    # text already normalised (lowercase, no accents, words apart): decoding
    # gives it back with the leading space of the first piece
    for text in ["hello world", "the quick brown fox jumps over the lazy dog",
                 "tokenization of unaffable words", "1, 2, 3! what? yes.", "a $ 5 ^ 2 ~ b",
                 "中 文 and ᄒ", "don't stop"]:
        ids = minilm.encode(text, add_bos=False, add_eos=False)
        assert minilm.decode(ids) == " " + text, (text, ids)
        framed = minilm.encode(text)
        assert minilm.decode(framed) == "[CLS] " + text + "[SEP]"
        assert minilm.decode(framed, skip_special=True) == " " + text
        assert minilm.encode(minilm.decode(ids)) == framed
    # anything else comes back normalised
    assert minilm.decode(minilm.encode("Café, NAÏVE!", add_bos=False, add_eos=False)) == " cafe, naive!"
    assert minilm.decode(minilm.encode("[MASK] it", parse_special=True)) == "[CLS][MASK] it[SEP]"


@pytest.mark.model
def test_minilm_encode_speed(minilm_metadata):
    words = ("the quick brown fox jumps over the lazy dog while 12,345 tokenizers, "
             "unaffable and résumé-like, count: ").split()
    rng = np.random.default_rng(0)
    text = " ".join(rng.choice(words, 20000))[:100_000]
    fresh = load_tokenizer(minilm_metadata)   # nothing cached yet
    t0 = time.perf_counter()
    ids = fresh.encode(text)
    elapsed = time.perf_counter() - t0
    assert len(ids) > 15000
    # about 0.01 s here; generous because the test machine may be busy
    assert elapsed < 1.0, elapsed
