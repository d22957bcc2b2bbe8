"""Tokenizers: token ids equal llama.cpp's, decoding, streaming, errors.

The expected ids in tests/data/tokenizer_cases.json come from llama.cpp
(benchmarks/compare_tokenizer.py --write); llama.cpp itself is never needed
here. Tests on real vocabularies skip when the model file is absent.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest

from pyllm.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from pyllm.model_file import ModelFile
from pyllm.tokenizer import (BPETokenizer, SPMTokenizer, TokenAttr, Tokenizer,
                             load_tokenizer)
from pyllm.tokenizer.base import _clean_spaces
from pyllm.tokenizer.pretokenize import PRE_TYPES, collapse, split_words, steps_for

import synth

ROOT = Path(__file__).resolve().parent.parent
CASES = json.loads((ROOT / "tests" / "data" / "tokenizer_cases.json").read_text(encoding="utf-8"))

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = "gemma-3-270m-q4_k_m.gguf"


# ---- model files: the model_path fixture (conftest.py) fetches them ----------

@pytest.fixture(scope="session")
def model_metadata(model_path):
    """model_metadata(file_name) -> the file's GGUF metadata (read once)."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            with ModelFile(model_path(name)) as mf:
                cache[name] = dict(mf.metadata)
        return cache[name]
    return get


@pytest.fixture(scope="session")
def tokenizer_for(model_metadata):
    """tokenizer_for(config) -> the Tokenizer for a configuration of the cases
    file: a model file, possibly with metadata overridden the way
    llama.cpp's kv_overrides did when the expected ids were made."""
    cache: dict[str, Tokenizer] = {}

    def get(config: str) -> Tokenizer:
        if config not in cache:
            cfg = CASES["configs"][config]
            md = dict(model_metadata(cfg["file"]))
            md.update(cfg["overrides"])
            if cfg.get("derive"):   # a vocabulary made from the file's (synth.gemma4_vocab)
                md = getattr(synth, cfg["derive"])(md)
            cache[config] = load_tokenizer(md)
        return cache[config]
    return get


@pytest.fixture
def smol(tokenizer_for) -> Tokenizer:
    return tokenizer_for("smollm2")


@pytest.fixture
def gemma(tokenizer_for) -> Tokenizer:
    return tokenizer_for("gemma3")


REAL = ["smollm2", "gemma3"]
ALL_CONFIGS = list(CASES["configs"])


def _encode(tok: Tokenizer, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """llama_tokenize(add_special, parse_special) in our API."""
    return tok.encode(text, add_bos=None if add_special else False,
                      add_eos=None if add_special else False, parse_special=parse_special)


# ---- ids equal llama.cpp's ------------------------------------------------

@pytest.mark.model
@pytest.mark.parametrize("config", ALL_CONFIGS)
def test_ids_match_llama_cpp(config, tokenizer_for):
    tok = tokenizer_for(config)
    cases = CASES["configs"][config]["cases"]
    assert cases
    wrong = []
    for text, add_special, parse_special, ids in cases:
        ours = _encode(tok, text, add_special, parse_special)
        if ours != ids:
            wrong.append(f"{text!r} add_special={add_special} parse_special={parse_special}:"
                         f"\n  ours      {ours}\n  llama.cpp {ids}")
    assert not wrong, f"{len(wrong)}/{len(cases)} differ from llama.cpp " \
                      f"({CASES['source']}):\n" + "\n".join(wrong[:10])


@pytest.mark.model
@pytest.mark.parametrize("config", ALL_CONFIGS)
def test_vocab_facts_match_llama_cpp(config, tokenizer_for):
    tok = tokenizer_for(config)
    cfg = CASES["configs"][config]
    assert tok.n_vocab == cfg["n_vocab"]
    assert tok.bos_id == cfg["bos"]
    assert tok.eos_id == cfg["eos"]
    assert tok.add_bos == cfg["add_bos"]
    assert sorted(tok.eog_ids) == cfg["eog"]
    attrs = [int(tok.token_attr(i)) for i in range(tok.n_vocab)]
    assert hashlib.sha256(json.dumps(attrs).encode()).hexdigest() == cfg["attrs_sha256"]


def _pieces_digest(tok: Tokenizer, special: bool) -> str:
    h = hashlib.sha256()
    for i in range(tok.n_vocab):
        piece = tok.token_to_piece(i, special=special)
        h.update((2 * len(piece)).to_bytes(4, "little"))  # the script hashes hex lengths
        h.update(piece)
    return h.hexdigest()


@pytest.mark.model
@pytest.mark.parametrize("config", REAL + ["smollm2+pre=gemma4", "gemma3+model=gemma4"])
def test_every_token_piece_matches_llama_cpp(config, tokenizer_for):
    tok = tokenizer_for(config)
    cfg = CASES["configs"][config]
    assert _pieces_digest(tok, True) == cfg["pieces_special_sha256"]
    assert _pieces_digest(tok, False) == cfg["pieces_sha256"]


@pytest.mark.model
@pytest.mark.parametrize("config", [c for c in ALL_CONFIGS if CASES["configs"][c]["detokenize"]])
def test_detokenize_matches_llama_cpp(config, tokenizer_for):
    tok = tokenizer_for(config)
    wrong = []
    for ids, remove_special, unparse_special, text_hex in CASES["configs"][config]["detokenize"]:
        ours = tok.detokenize(ids, remove_special=remove_special, unparse_special=unparse_special)
        if ours != bytes.fromhex(text_hex):
            wrong.append(f"{ids} remove_special={remove_special} unparse_special={unparse_special}: "
                         f"ours {ours!r} llama.cpp {bytes.fromhex(text_hex)!r}")
    assert not wrong, "\n".join(wrong[:10])


def test_cases_cover_the_brief():
    """The hard-coded strings include the tricky ones the tokenizers must get right,
    for both real models, with and without BOS and parse_special."""
    for config in REAL:
        cases = CASES["configs"][config]["cases"]
        assert {(a, p) for _, a, p, _ in cases} == {(False, False), (False, True),
                                                    (True, False), (True, True)}
    texts = {c[0] for c in CASES["configs"]["gemma3"]["cases"]}
    assert texts == {c[0] for c in CASES["configs"]["smollm2"]["cases"]}
    for must in ["", " Hello world", "double  spaces  here", "trailing spaces   ", "1234567890",
                 "3.14159", "café naïve Ŧ", "你好，世界", "日本語のテキスト", "👋🏽 🤖 🧑‍💻",
                 "a\n\nb\tc\r\n", "<|im_start|>user\nhi<|im_end|>",
                 "<start_of_turn>user\nhi<end_of_turn>"]:
        assert must in texts


# ---- spot checks that read without the data file ---------------------------

@pytest.mark.model
def test_smollm2_special_tokens(smol):
    assert smol.model == "gpt2" and smol.pre_name == "smollm"
    assert smol.n_vocab == 49152
    assert not smol.add_bos
    assert smol.token_text(1) == "<|im_start|>" and smol.token_text(2) == "<|im_end|>"
    assert smol.encode("<|im_start|>user\nhi<|im_end|>", parse_special=True) == [1, 4093, 198, 6004, 2]
    plain = smol.encode("<|im_start|>user\nhi<|im_end|>")
    assert 1 not in plain and 2 not in plain
    assert {0, 2} <= smol.eog_ids  # <|endoftext|>, <|im_end|>
    assert smol.is_special(2) and not smol.is_special(4093)
    assert smol.encode("hi", add_bos=True)[0] == smol.bos_id == 1


@pytest.mark.model
def test_gemma_special_tokens(gemma):
    assert gemma.model == "llama"
    assert gemma.n_vocab == 262144
    assert gemma.add_bos and gemma.bos_id == 2 and gemma.eos_id == 1
    assert gemma.encode("<start_of_turn>user\nhi<end_of_turn>", parse_special=True) == \
        [2, 105, 2364, 107, 2202, 106]
    assert gemma.encode("hi", add_bos=False) == [2202]
    assert {1, 106} <= gemma.eog_ids  # <eos>, <end_of_turn>
    # user-defined tokens are split out even without parse_special ("  " is one)
    assert gemma.encode("a  b", add_bos=False) == [236746, 138, 236763]


# ---- round trips ------------------------------------------------------------

def _curated(config: str) -> list[str]:
    return list(dict.fromkeys(c[0] for c in CASES["configs"][config]["cases"]))


@pytest.mark.model
@pytest.mark.parametrize("config", REAL)
@pytest.mark.parametrize("parse_special", [False, True])
def test_decode_encode_round_trip(config, parse_special, tokenizer_for):
    tok = tokenizer_for(config)
    for text in _curated(config):
        ids = tok.encode(text, add_bos=False, parse_special=parse_special)
        assert tok.decode(ids) == text, (text, ids)
        # with the BOS the file asks for, skip_special drops it again
        with_bos = tok.encode(text, parse_special=parse_special)
        if not parse_special:
            assert tok.decode(with_bos, skip_special=True) == text


@pytest.mark.model
def test_round_trip_exception_space_prefix(tokenizer_for):
    """llama.cpp's add_space_prefix (llama-2 style SPM): decode removes the space
    it put before the text, but not the one put after a special token."""
    tok = tokenizer_for("gemma3+space_prefix")
    assert tok.decode(tok.encode("hi there", add_bos=False)) == "hi there"
    ids = tok.encode("<start_of_turn>user", add_bos=False, parse_special=True)
    assert tok.decode(ids) == "<start_of_turn> user"


@pytest.mark.model
def test_round_trip_exception_clean_spaces(tokenizer_for):
    """'gpt-2'-style pre-tokenizers clean up spaces before punctuation on decode."""
    tok = tokenizer_for("smollm2+pre=gpt-2")
    ids = tok.encode("Hello , world . I 'm here")
    assert tok.decode(ids) == "Hello, world. I'm here"


# ---- streaming --------------------------------------------------------------

STREAM_TEXTS = ["café naïve Ŧ", "你好，世界", "日本語のテキスト", "👋🏽 🤖 🧑‍💻 done",
                "mixed English, 中文, русский, emoji 😀🎉", "\ue000 private \ufeff"]


@pytest.mark.model
@pytest.mark.parametrize("config", REAL)
def test_stream_decoder_never_splits_characters(config, tokenizer_for):
    tok = tokenizer_for(config)
    held = 0
    for text in STREAM_TEXTS:
        ids = tok.encode(text, add_bos=False)
        dec = tok.stream_decoder()
        pushes = [dec.push(i) for i in ids]
        tail = dec.flush()
        assert all("\ufffd" not in p for p in pushes), pushes
        assert "".join(pushes) + tail == tok.decode(ids) == text
        held += pushes.count("")
    if config == "smollm2":
        assert held > 0  # byte-level BPE splits emoji/CJK across tokens: bytes were held


@pytest.mark.model
def test_stream_decoder_skip_special(gemma):
    ids = gemma.encode("<start_of_turn>model\nHello 👋🏽<end_of_turn>", parse_special=True)
    dec = gemma.stream_decoder(skip_special=True)
    out = "".join(dec.push(i) for i in ids) + dec.flush()
    assert out == gemma.decode(ids, skip_special=True) == "model\nHello 👋🏽"
    dec = gemma.stream_decoder()
    out = "".join(dec.push(i) for i in ids) + dec.flush()
    assert out == gemma.decode(ids) == "<bos><start_of_turn>model\nHello 👋🏽<end_of_turn>"


@pytest.mark.model
def test_stream_decoder_flushes_broken_utf8(smol):
    # the first byte of a 4-byte character, then the stream ends
    first = smol.encode("👋", add_bos=False)[0]
    dec = smol.stream_decoder()
    assert dec.push(first) == ""
    assert dec.flush() == "\ufffd"
    assert dec.push(smol.encode("a", add_bos=False)[0]) == "a"  # reset after flush


# ---- pieces -------------------------------------------------------------------

@pytest.mark.model
def test_invalid_utf8_becomes_one_replacement_character_per_byte():
    """Bytes that are not UTF-8 reach a str as surrogate escapes (argv, stdin);
    like llama.cpp's decoder, each such byte becomes U+FFFD. Other lone
    surrogates too; valid text passes untouched."""
    from pyllm.tokenizer.base import unicode_text
    esc = lambda b: b.decode("utf-8", "surrogateescape")  # noqa: E731
    assert unicode_text(esc(b"caf\xe9 au lait")) == "caf\ufffd au lait"
    assert unicode_text(esc(b"\xe2\x82A")) == "\ufffd\ufffdA"      # a cut 3-byte sequence: two bytes
    assert unicode_text(esc(b"\xf0\x9f\x99")) == "\ufffd" * 3
    assert unicode_text("a\ud800b\udfffc") == "a\ufffdb\ufffdc"
    assert unicode_text("naïve 🙂 \ufffd") == "naïve 🙂 \ufffd"


@pytest.mark.model
def test_invalid_utf8_ids_match_llama_cpp(smol):
    """llama.cpp 0.3.36's ids for these bytes (llama_cpp.Llama.tokenize(bytes),
    SmolLM2): the same U+FFFD per invalid byte. (Gemma's SentencePiece path in
    llama.cpp instead passes such bytes to byte-fallback tokens; pyllm gives it
    U+FFFD too.)"""
    cases = {b"Hello \xff\xfe world": [19556, 216, 24211, 24211, 905],
             b"caf\xe9 au lait": [83, 1939, 24211, 26261, 2618, 269],
             b"\xe2\x82A": [24211, 24211, 49], b"abc\xc3": [25276, 24211],
             b"\xf0\x9f\x99": [24211, 24211, 24211], b"x\x80\x80y": [104, 24211, 24211, 105]}
    for raw, ids in cases.items():
        assert smol.encode(raw.decode("utf-8", "surrogateescape"), add_bos=False) == ids, raw


def test_token_to_piece(smol, gemma):
    nl = gemma.token_id("<0x0A>")
    assert gemma.token_to_piece(nl) == b"\n"
    assert gemma.token_to_piece(gemma.token_id("▁the")) == b" the"
    assert gemma.token_to_piece(106) == b"<end_of_turn>"
    assert gemma.token_to_piece(106, special=False) == b""
    assert gemma.token_to_piece(138, special=False) == b"  "  # user-defined: always text
    assert smol.token_to_piece(smol.token_id("Ġhello")) == b" hello"
    assert smol.token_to_piece(2, special=False) == b""
    with pytest.raises(InvalidArgumentError):
        smol.token_to_piece(smol.n_vocab)
    with pytest.raises(InvalidArgumentError):
        smol.decode([-1])


# ---- speed --------------------------------------------------------------------

@pytest.mark.model
def test_load_and_encode_speed(model_metadata):
    md = model_metadata(GEMMA)
    t0 = time.perf_counter()
    tok = load_tokenizer(md)
    load_s = time.perf_counter() - t0
    text = ("The quick brown fox, 你好世界 and café 123456 😀. def f(x): return x\n" * 200)[:10000]
    t0 = time.perf_counter()
    tok.encode(text, parse_special=True)
    gemma_s = time.perf_counter() - t0
    smol = load_tokenizer(model_metadata(SMOL))
    t0 = time.perf_counter()
    smol.encode(text, parse_special=True)
    smol_s = time.perf_counter() - t0
    # targets: load well under 2 s, 10k characters well under 1 s; generous
    # bounds here because the test machine may be busy
    assert load_s < 4.0, load_s
    assert gemma_s < 1.0 and smol_s < 1.0, (gemma_s, smol_s)


# ---- without model files: small synthetic vocabularies ------------------------

def _bpe_metadata(**extra) -> dict:
    """A byte-level BPE vocabulary: all 256 byte characters plus a few merges."""
    from pyllm.tokenizer.bpe import BYTE_TO_UNICODE
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + BYTE_TO_UNICODE
    merges = ["Ġ t", "h e", "Ġt he", "l l", "he ll", "hell o"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    md = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([3, 3, 3] + [1] * (len(tokens) - 3), dtype=np.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
    }
    md.update(extra)
    return md


def test_unsupported_tokenizer_model():
    with pytest.raises(UnsupportedModelError) as e:
        load_tokenizer({"tokenizer.ggml.model": "plamo2", "tokenizer.ggml.tokens": ["a"]})
    assert all(f"'{m}'" in str(e.value) for m in ("plamo2", "gpt2", "llama", "bert", "t5", "rwkv"))
    with pytest.raises(ModelFileError):
        load_tokenizer({"tokenizer.ggml.tokens": ["a"]})


def test_unknown_pre_tokenizer_is_refused_like_llama_cpp():
    with pytest.raises(UnsupportedModelError, match="'gpt2'"):
        load_tokenizer(_bpe_metadata(**{"tokenizer.ggml.pre": "gpt2"}))  # llama.cpp: 'gpt-2'
    with pytest.raises(UnsupportedModelError, match="kimi-k2"):
        load_tokenizer(_bpe_metadata(**{"tokenizer.ggml.pre": "kimi-k2"}))


def test_missing_pre_tokenizer_falls_back_to_default(caplog):
    md = _bpe_metadata()
    del md["tokenizer.ggml.pre"]
    tok = load_tokenizer(md)
    assert tok.pre is PRE_TYPES["default"]
    assert "pre-tokenizer" in caplog.text


def test_synthetic_bpe():
    tok = load_tokenizer(_bpe_metadata())
    assert isinstance(tok, BPETokenizer)
    hello, the = tok.token_id("hello"), tok.token_id("Ġthe")
    assert tok.encode("hello the") == [hello, the]
    assert tok.encode("<|im_start|>hello<|im_end|>", parse_special=True) == [1, hello, 2]
    assert 1 not in tok.encode("<|im_start|>hello")
    assert tok.decode(tok.encode("héllo wörld 👋")) == "héllo wörld 👋"
    assert tok.eog_ids == {0, 2}  # <|endoftext|> by its text, <|im_end|> as EOS
    assert tok.encode("") == [] and tok.encode("", add_bos=True) == [1]
    with pytest.raises(InvalidArgumentError):
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_special_token_strip_attributes():
    """Phi-3: special tokens eat the whitespace after them (llama.cpp RSTRIP)."""
    tok = load_tokenizer(_bpe_metadata(**{"general.name": "Phi-3 mini"}))
    assert tok.token_attr(2) & TokenAttr.RSTRIP
    hello = tok.token_id("hello")
    assert tok.encode("<|im_end|>  \n hello", parse_special=True) == [2, hello]


def test_synthetic_spm():
    tokens = ["<unk>", "<s>", "</s>", "<start_of_turn>"] + [f"<0x{b:02X}>" for b in range(256)] + \
        ["▁", "a", "b", "ab", "▁ab", "ba", "aba"]
    scores = np.zeros(len(tokens), dtype=np.float32)
    for i, t in enumerate(tokens):
        scores[i] = {"ab": -1.0, "▁ab": -2.0, "ba": -3.0, "aba": -0.5}.get(t, -10.0)
    types = np.array([2, 3, 3, 3] + [6] * 256 + [1] * 7, dtype=np.int32)
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
          "tokenizer.ggml.add_space_prefix": True}
    tok = load_tokenizer(md)
    assert isinstance(tok, SPMTokenizer)
    ab, sab, a, b = (tok.token_id(t) for t in ("ab", "▁ab", "a", "b"))
    # "▁ab": ab (score -1) merges first, then ▁+ab (-2)
    assert tok.encode("ab") == [1, sab]
    assert tok.encode("ab", add_bos=False) == [sab]
    # "bab" -> ▁ b a b: ab (leftmost best) ... then nothing joins ▁ b
    assert tok.encode("bab", add_bos=False) == [tok.token_id("▁"), b, ab]
    # a character with no token falls back to its UTF-8 bytes
    assert tok.encode("é", add_bos=False) == [tok.token_id("▁"), tok.token_id("<0xC3>"),
                                              tok.token_id("<0xA9>")]
    # llama_detokenize strips the prefix space only from the first token: with
    # the BOS kept that is the BOS, so the space stays
    assert tok.decode(tok.encode("ab é")) == "<s> ab é"
    assert tok.decode(tok.encode("ab é", add_bos=False)) == "ab é"
    # and llama.cpp keeps it when it drops the BOS too (remove_special)
    assert tok.decode(tok.encode("ab é"), skip_special=True) == " ab é"
    # after a special token the space prefix is added again, as llama.cpp does
    assert tok.encode("<start_of_turn>ab", add_bos=False, parse_special=True) == [3, sab]


def test_synthetic_spm_without_byte_tokens():
    """Without <0xXX> tokens a character with no token becomes the unknown token
    (llama.cpp would fail on it)."""
    tokens = ["<unk>", "<s>", "</s>", "▁", "a"]
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.scores": np.zeros(5, dtype=np.float32),
          "tokenizer.ggml.token_type": np.array([2, 3, 3, 1, 1], dtype=np.int32),
          "tokenizer.ggml.add_space_prefix": False}
    tok = load_tokenizer(md)
    assert tok.unk_id == 0
    assert tok.encode("aé a", add_bos=False) == [4, 0, 3, 4]


def test_clean_spaces_replays_llama_cpp():
    assert _clean_spaces(b"Hello , world . Yes ! No ?") == b"Hello, world. Yes! No?"
    assert _clean_spaces(b"I 'm you 're we 've it 's") == b"I'm you're we've it's"
    assert _clean_spaces(b"don 't we 'll") == b"don 't we 'll"   # kept, as in llama.cpp
    assert _clean_spaces(b"a ' b") == b"a'b"
    assert _clean_spaces(b"a ' ' b") == b"a'' b"  # the in-place quirk of the C loop
    assert _clean_spaces(b"") == b""


def test_pre_tokenizer_splits():
    words = split_words("Hello world's 12345 café  \n\n x", steps_for("llama3"))
    assert words == ["Hello", " world", "'s", " ", "123", "45", " café", "  \n\n", " x"]
    words = split_words("Hello world 12345", steps_for("starcoder"))
    assert words == ["Hello", " world", " ", "1", "2", "3", "4", "5"]


def test_unicode_classes_are_llama_cpp_unicode_15_1():
    """llama.cpp classifies code points by Unicode 15.1: later additions are
    unassigned for it (checked in full by compare_tokenizer.py --unicode)."""
    assert collapse("aé1٣.،+€\u0301 \u00a0\u3000") == "a\xd21\xd1.\xd3+\xd5\xd4 \x0b\x0b"
    assert collapse("\u31ef\U0002ebf0\u0cf3") == "\xd5\xd2\xd4"   # added in 15.1 / 15.0
    assert collapse("\u1c89\U00010d4a\U0001fae9") == "\xd0\xd0\xd0"  # added in 16.0
    assert collapse("\U000323b0\u0378\u200b\x85") == "\xd0\xd0\xd0\x0b"  # 17.0, unassigned, Cf, NEL


# ---- SentencePiece Unigram ('t5': T5, XLM-RoBERTa encoders) -------------------------------

UNIGRAM_TEXTS = ["Hello world", "  \ufb01nance   \uff34\uff4f\uff4b\uff59\uff4f  ", "caf\u00e9 na\u00efve \u6771\u4eac",
                 "\u2460\u2461\u2462 x\u00b2 \u216b", "\U0001F600\U0001F600 unknown\u03a9\u03a9 chars", "a\tb\nc",
                 "ca\u0301fe\u0301", "stra\u00dfe  \u00fcber", " ", "tokenizer model", "\uff76\uff80\uff76\uff85"]


def unigram_cases(seed: int, n: int = 400) -> list[str]:
    rng = np.random.default_rng(seed)
    alphabet = list("abcdefghiklmnorstuvwz \t\n") + ["\ufb01", "\uff34", "\u6771", "\u4eac", "\U0001F600", "\u2460",
                                                      "\u00b2", "\u00e9", "\u0301", "\u03a9", "  ", "\uff76"]
    return UNIGRAM_TEXTS + ["".join(rng.choice(alphabet, size=rng.integers(1, 40))) for _ in range(n)]


@pytest.mark.parametrize("normalization, prefix, merge", [("nmt_nfkc", True, True), ("nmt_nfkc_cf", False, False),
                                                           ("identity", True, False)])
def test_unigram_matches_sentencepiece(normalization, prefix, merge):
    """A Unigram vocabulary from GGUF metadata (pieces, scores, types, the precompiled character
    map, the whitespace switches) tokenizes as the SentencePiece model it came from: NFKC
    folding, U+2581 for spaces, a space in front or not, runs of spaces merged or not, characters
    it has no piece for as one unknown token per run."""
    import sentencepiece
    from pyllm.tokenizer import UGMTokenizer, load_tokenizer
    md, proto = synth.unigram_vocab(normalization=normalization, add_dummy_prefix=prefix,
                                    remove_extra_whitespaces=merge)
    sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
    tok = load_tokenizer(md)
    assert isinstance(tok, UGMTokenizer) and tok.model == "t5"
    # where llama.cpp departs from SentencePiece: a text of spaces only gets no space in front
    blank = prefix and not merge
    differ = [t for t in unigram_cases(seed=len(normalization)) if tok.encode(t, add_bos=False, add_eos=False)
              != (sp.encode(t) if not (blank and not t.strip()) else sp.encode(t)[1:])]
    assert differ == []
    assert sp.encode("\ufb01nance") != sp.encode("finance") or normalization != "identity"
    # as llama.cpp tokenizes an XLM-RoBERTa input: <s> text </s>; <sep> (user-defined) split out
    ids = tok.encode("hello<sep>world")
    assert ids == [0] + sp.encode("hello") + [tok.token_id("<sep>")] + sp.encode("world") + [2]
    assert tok.decode(sp.encode("hello world"), skip_special=True) == sp.decode(sp.encode("hello world"))


def test_unigram_vocabulary_in_a_model_file(tmp_path):
    """An encoder file with a Unigram vocabulary (as bge-m3's): read from the file, each text
    tokenized as SentencePiece with <s> and </s>, embedded as the reference embeds those ids."""
    import sentencepiece
    from pyllm import Model
    from pyllm.reference import Reference
    md, proto = synth.unigram_vocab()
    sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
    path = synth.write_bert(tmp_path / "xlmr.gguf", synth.QT.F32, tokenizer_from=md, pooling=2)
    with Model(path, n_threads=1) as m:
        text = "caf\u00e9 \ufb01nance  \u6771\u4eac hello"
        ids = m.embedding_tokens(text)
        assert ids == [0] + sp.encode(text) + [2]
        ref = Reference(m.arch).forward(ids)
        got = m.embed(text, normalize=False)
        np.testing.assert_allclose(got, ref[0], rtol=1e-3, atol=1e-3 * np.abs(ref[0]).max())
