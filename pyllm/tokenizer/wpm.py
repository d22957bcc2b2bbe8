"""WordPiece tokenizer ('bert' tokenizer model), as llama.cpp's llm_tokenizer_wpm.

GGUF BERT vocabularies write word-initial pieces with U+2581 in front
('▁hello') and continuation pieces bare ('ing'; Hugging Face's '##ing').

Encoding a text fragment:

1. Normalise and split into words, code point by code point
   (llm_tokenizer_wpm_session::preprocess): with strip_accents, replace each
   code point by the first code point of its NFD decomposition and drop
   accent marks; whitespace ends a word; NUL, U+FFFD and control/format/
   private-use code points vanish without ending a word; with lowercase, take
   the simple lowercase mapping; punctuation, ASCII symbols and CJK
   ideographs become words of their own.
2. Put U+2581 in front of each word and cut it greedily, left to right, into
   the longest vocabulary tokens; a word with a position no token matches
   becomes a single unknown token ([UNK]) as a whole.

tokenizer.ggml.normalizer.lowercase (default true) and
tokenizer.ggml.normalizer.strip_accents (default: lowercase's value) choose
the normalisation. Code point classes follow llama.cpp's tables (Unicode 15.1;
see unicode-data.cpp): benchmarks/compare_tokenizer.py --unicode checks every
code point through llama.cpp itself.
"""
from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from ..errors import InvalidArgumentError
from . import unicode
from .base import Tokenizer

WORD_CACHE_SIZE = 1 << 16

# llama.cpp's code point classes that matter here (symbols only matter
# below U+007F; unassigned code points stay in words like letters do)
_WHITESPACE, _CONTROL, _MARK, _PUNCT, _SYMBOL, _OTHER = range(6)
_CLASS = {unicode.WHITESPACE: _WHITESPACE, unicode.CONTROL: _CONTROL, unicode.MARK: _MARK,
          unicode.PUNCTUATION: _PUNCT, unicode.SYMBOL: _SYMBOL}


def code_point_class(cp: int) -> int:
    """The class llama.cpp gives the code point: _WHITESPACE, _CONTROL, _MARK,
    _PUNCT, _SYMBOL or _OTHER (letters, digits, unassigned)."""
    return _CLASS.get(unicode.code_point_class(cp), _OTHER)


def is_chinese_char(cp: int) -> bool:
    """CJK ideographs, as llama.cpp's (and Hugging Face's) _is_chinese_char,
    including their 0x2B920 start of the fifth range (Unicode says 0x2B820)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


# nfd_first and simple_lower use the installed Python's unicodedata. Code
# points assigned in 15.0 or 15.1 that it may not know have neither case nor
# decomposition, so they come back unchanged either way.
def nfd_first(cp: int) -> int:
    """The first code point of the NFD decomposition: llama.cpp's 'NFD' keeps
    only that one (é -> e, 한 -> ᄒ, the leading jamo)."""
    if not unicode.is_assigned(cp):  # in llama.cpp's Unicode 15.1
        return cp
    return ord(unicodedata.normalize("NFD", chr(cp))[0])


def simple_lower(cp: int) -> int:
    """The simple (one code point) lowercase mapping, as unicode_tolower."""
    if not unicode.is_assigned(cp):  # in llama.cpp's Unicode 15.1
        return cp
    low = chr(cp).lower()
    # str.lower() is the full mapping; only U+0130 (İ) lowers to two code
    # points, 'i' and a combining dot, and its simple mapping is the 'i'
    return ord(low[0])


class _WordTable(dict):
    """str.translate table for one normalisation setting: code point -> the
    text it becomes, in which words are then separated by single spaces
    (a space is whitespace, None drops the code point, a code point that is
    a word of its own comes with a space on each side)."""

    def __init__(self, lowercase: bool, strip_accents: bool):
        super().__init__()
        self.lowercase = lowercase
        self.strip_accents = strip_accents

    def __missing__(self, cp: int) -> str | None:
        if self.strip_accents:
            cp = nfd_first(cp)
        kind = code_point_class(cp)
        value: str | None
        if kind == _WHITESPACE:
            value = " "
        elif cp == 0 or cp == 0xFFFD or kind == _CONTROL or (self.strip_accents and kind == _MARK):
            value = None
        else:
            value = chr(simple_lower(cp) if self.lowercase else cp)
            # the class is the one of the code point before lowercasing
            if kind == _PUNCT or (kind == _SYMBOL and cp < 0x7F) or is_chinese_char(cp):
                value = f" {value} "
        self[cp] = value
        return value


class WPMTokenizer(Tokenizer):
    model = "bert"
    _default_ids = {"bos": 101, "eos": None, "unk": 100, "sep": 102, "pad": 0, "mask": 103}
    _default_add_bos = True
    _clean_spaces = True

    def __init__(self, md: Mapping[str, Any]):
        # llama.cpp reads add_space_prefix for every model type; for WPM it
        # only makes detokenize drop a leading space
        prefix = md.get("tokenizer.ggml.add_space_prefix")
        self._add_space_prefix = False if prefix is None else bool(prefix)
        self._init_vocab(md)
        self.pre_name = "default"
        self.sep_id: int | None = self._ids["sep"]

        lowercase = md.get("tokenizer.ggml.normalizer.lowercase")
        self.lowercase: bool = True if lowercase is None else bool(lowercase)
        strip = md.get("tokenizer.ggml.normalizer.strip_accents")
        self.strip_accents: bool = self.lowercase if strip is None else bool(strip)
        self._table = _WordTable(self.lowercase, self.strip_accents)

        # no token is longer than this many characters: the longest slice worth looking up
        self._max_chars = max(len(t) for t in self._texts)
        self._word_ids = lru_cache(maxsize=WORD_CACHE_SIZE)(self._word_ids_uncached)

    # ---- encoding ----------------------------------------------------------

    def words(self, text: str) -> list[str]:
        """The normalised words of a text fragment, before WordPiece."""
        return [w for w in text.translate(self._table).split(" ") if w]

    def _encode_fragment(self, text: str, out: list[int], prev_special: bool) -> None:
        word_ids = self._word_ids
        for word in self.words(text):
            out.extend(word_ids(word))

    def _word_ids_uncached(self, word: str) -> tuple[int, ...]:
        """Ids for one word: greedy longest match from the left, or the
        unknown token alone if some position matches no token."""
        word = "\u2581" + word
        vocab = self._token_to_id
        n = len(word)
        longest = self._max_chars
        ids: list[int] = []
        i = 0
        while i < n:
            for j in range(min(n, i + longest), i, -1):
                tid = vocab.get(word[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                # llama.cpp writes the unknown id even when there is none (-1);
                # without one the word is left out
                return () if self.unk_id is None else (self.unk_id,)
        return tuple(ids)

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = False,
               add_eos: bool | None = None) -> list[int]:
        """Token ids for `text`, as llama_tokenize.

        llama_tokenize(add_special=True) is add_bos=None, add_eos=None here:
        for BERT vocabularies that always means [CLS] first and [SEP] last
        (tokenizer.ggml.seperator_token_id), whatever the file's add_bos /
        add_eos flags say, as in llama.cpp. add_special=False is add_bos=False,
        add_eos=False. add_eos=True ends the ids with [SEP].
        parse_special: recognise control tokens written in the text (e.g.
        '[MASK]') as single ids.
        """
        ids = super().encode(text, add_bos=True if add_bos is None else add_bos,
                             parse_special=parse_special, add_eos=False)
        if add_eos is None or add_eos:
            if self.sep_id is None:
                raise InvalidArgumentError("this model has no separator token ([SEP])")
            ids.append(self.sep_id)
        return ids

    # ---- decoding ----------------------------------------------------------

    def _normal_piece(self, tid: int) -> bytes:
        return self._texts[tid].replace("\u2581", " ").encode("utf-8")
