"""SentencePiece's Unigram tokenizer ('t5' tokenizer model: T5, and the XLM-RoBERTa encoders
such as bge-m3 and multilingual-e5), as llama.cpp's llm_tokenizer_ugm, run by `sentencepiece`.

Unigram writes the text as the sequence of vocabulary pieces whose scores (log-probabilities)
sum highest (Viterbi over every segmentation); a character no piece covers is the unknown
token, scored the lowest score less 10, and a run of them is one unknown token. Before that,
the text is normalized as the model's SentencePiece normalizer did when it was trained: its
precompiled character map (tokenizer.ggml.precompiled_charsmap: NFKC-style replacements as a
trie), spaces written as U+2581, a space put in front (tokenizer.ggml.add_space_prefix) and,
with tokenizer.ggml.remove_extra_whitespaces, spaces trimmed and runs of them merged.

We hand sentencepiece a Unigram ModelProto with the GGUF vocabulary (each token's type as its
piece type) and that normalizer, and let it do both in C++, one text fragment at a time
(special tokens split out before, as llama.cpp does; each fragment gets the space in front, as
llama.cpp's UGM normalizer gives it).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import sentencepiece

from ..errors import ModelFileError
from .base import K_SCORES, K_TYPES, Tokenizer
from .spm import _BYTE, _NORMAL, _UNKNOWN, _len, model_proto

_CONTROL = 3
_MODEL_UNIGRAM = 1
K_CHARSMAP = "tokenizer.ggml.precompiled_charsmap"


def normalizer_spec(charsmap: bytes, add_dummy_prefix: bool, remove_extra_whitespaces: bool) -> bytes:
    """A NormalizerSpec message: precompiled_charsmap=2 (none: no replacements),
    add_dummy_prefix=3, remove_extra_whitespaces=4, escape_whitespaces=5 (always)."""
    spec = b"\x12" + _len(len(charsmap)) + charsmap if charsmap else b"\x0a\x08identity"
    return spec + b"\x18" + bytes((add_dummy_prefix,)) + b"\x20" + bytes((remove_extra_whitespaces,)) + b"\x28\x01"


class UGMTokenizer(Tokenizer):
    model = "t5"
    _default_ids = {"eos": 1, "unk": 2, "pad": 0}   # T5's, as llama.cpp sets them
    _default_add_bos = False

    def __init__(self, md: Mapping[str, Any]):
        prefix = md.get("tokenizer.ggml.add_space_prefix")
        self._add_space_prefix = True if prefix is None else bool(prefix)
        self._init_vocab(md)
        self.pre_name = "default"
        n = self.n_vocab
        scores = md.get(K_SCORES)
        scores = np.zeros(n, dtype=np.float32) if scores is None else np.asarray(scores, dtype=np.float32)
        if len(scores) < n:
            raise ModelFileError(f"{K_SCORES} has {len(scores)} entries for {n} tokens")
        gguf_types = md.get(K_TYPES)
        types = np.full(n, _NORMAL, dtype=np.uint8) if gguf_types is None else \
            np.asarray(gguf_types, dtype=np.int64)[:n].astype(np.uint8)
        types[(types < _NORMAL) | (types > _BYTE)] = _NORMAL   # undefined: an ordinary piece
        # sentencepiece wants one unknown piece: the file's unknown token (else one of its own)
        types[types == _UNKNOWN] = _CONTROL
        unk = self.unk_id
        if unk is not None:
            types[unk] = _UNKNOWN
        byte_fallback = int(np.count_nonzero(types == _BYTE)) == 256
        charsmap = md.get(K_CHARSMAP)
        charsmap = b"" if charsmap is None else np.asarray(charsmap, dtype=np.uint8).tobytes()
        merge = bool(md.get("tokenizer.ggml.remove_extra_whitespaces", False))
        def processor(prefix: bool) -> sentencepiece.SentencePieceProcessor:
            proto, self._sp_unk = model_proto(self._texts, scores[:n], types, _MODEL_UNIGRAM, unk, byte_fallback,
                                              normalizer_spec(charsmap, prefix, merge))
            try:
                return sentencepiece.SentencePieceProcessor(model_proto=proto)
            except (RuntimeError, OSError) as e:   # a character map sentencepiece cannot read
                raise ModelFileError(f"cannot build a SentencePiece Unigram model from the vocabulary: {e}") from e
        self._sp = processor(self._add_space_prefix)
        self._sp_encode = self._sp.EncodeAsIds
        # llama.cpp puts the space in front of a fragment's first non-space character, so a
        # fragment of spaces only gets none (where they are kept: without remove_extra_whitespaces)
        self._sp_bare = processor(False) if self._add_space_prefix and not merge else None

    def _encode_fragment(self, text: str, out: list[int], prev_special: bool) -> None:
        bare = self._sp_bare
        if bare is not None and not bare.Normalize(text).strip("\u2581"):
            ids = bare.EncodeAsIds(text)
        else:
            ids = self._sp_encode(text)
        if self._sp_unk >= self.n_vocab and self._sp_unk in ids:   # our own unknown piece: no such token
            ids = [t for t in ids if t != self._sp_unk]
        out.extend(ids)

    def _normal_piece(self, tid: int) -> bytes:
        return self._texts[tid].replace("\u2581", " ").encode("utf-8")
