"""SentencePiece-style tokenizer ('llama' tokenizer model), as llama.cpp's
llm_tokenizer_spm, run by the `sentencepiece` library.

llama.cpp's SPM tokenizer is SentencePiece's BPE algorithm: start from single
characters, repeatedly merge the adjacent pair whose concatenation is the
highest-scoring token (leftmost on ties), and write characters that end up
in no token as their <0xXX> byte tokens. Before that, spaces become U+2581 and,
when tokenizer.ggml.add_space_prefix is set, a space is put in front of the
text and of every text fragment that follows a special token.

We build a SentencePiece BPE ModelProto in memory from the GGUF vocabulary
(tokens, scores) and let `sentencepiece` do the merging in C++. The proto is
written directly in protobuf wire format (the `protobuf` package is not
needed), with settings that make SentencePiece do exactly the merging above
and nothing else:

* no normalisation at all: empty charsmap, no dummy prefix, no whitespace
  removal, no whitespace escaping (we escape spaces and add the prefix
  ourselves, as llama.cpp does);
* every vocabulary token is a NORMAL piece, whatever its GGUF type: llama.cpp
  merges into any token text, control and user-defined ones included, while
  SentencePiece would never merge into CONTROL pieces and would match
  USER_DEFINED ones up front (we split those out before, as llama.cpp does);
* the <0xXX> tokens are BYTE pieces and byte_fallback is on;
* SentencePiece insists on an UNKNOWN piece, so one is appended after the
  vocabulary under a name no text produces; it is only emitted for a
  character with no token when the vocabulary lacks byte tokens.

Known differences from llama.cpp (none seen on Gemma 3's vocabulary):

* llama.cpp could also merge into a <0xXX> token's text (e.g. the literal
  text "<0x41>") if the vocabulary had the intermediate pieces ("<0x", "41>"
  ...); SentencePiece does not merge into BYTE pieces.
* A vocabulary without byte tokens: llama.cpp falls back to one-character
  tokens and fails if there are none; we emit the unknown token
  (tokenizer.ggml.unknown_token_id).
"""
from __future__ import annotations

import struct
from collections.abc import Mapping
from itertools import chain
from typing import Any

import numpy as np
import sentencepiece

from ..errors import ModelFileError
from .base import K_SCORES, Tokenizer

_UNK_NAME = "<pyllm:unknown-piece>"

# protobuf wire format: tag byte = field number << 3 | wire type
_NORMAL, _UNKNOWN, _BYTE = 1, 2, 6
_MODEL_BPE = 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_SMALL = [_varint(i) for i in range(128)]


def _len(n: int) -> bytes:
    return _SMALL[n] if n < 128 else _varint(n)


class _PieceHeaders(dict):
    """Piece length -> the bytes before the piece text in its message:
    ModelProto.pieces tag, message length, SentencePiece.piece tag, text length.
    The message is text + 11 or more bytes, so the header depends on the length only."""

    def __missing__(self, n: int) -> bytes:
        inner = 1 + len(_len(n)) + n + 5 + 2
        value = self[n] = b"\x0a" + _len(inner) + b"\x0a" + _len(n)
        return value


def build_model_proto(tokens: list[str], scores: np.ndarray, byte_ids: list[int]) -> tuple[bytes, int]:
    """A serialized sentencepiece BPE ModelProto for the vocabulary; returns it and
    the id of the extra UNKNOWN piece (== len(tokens)).

    byte_ids: the ids of the <0xXX> tokens (BYTE pieces; byte fallback is on
    when there are 256 of them), every other token is a NORMAL piece.
    """
    types = np.full(len(tokens), _NORMAL, dtype=np.uint8)
    types[byte_ids] = _BYTE
    # NormalizerSpec: name=1, add_dummy_prefix=3, remove_extra_whitespaces=4,
    # escape_whitespaces=5 all false; no precompiled_charsmap (=2): identity
    norm = b"\x0a\x08identity\x18\x00\x20\x00\x28\x00"
    return model_proto(tokens, scores, types, _MODEL_BPE, None, len(byte_ids) == 256, norm)


def model_proto(tokens: list[str], scores: np.ndarray, types: np.ndarray, model_type: int, unk_id: int | None,
                byte_fallback: bool, normalizer: bytes) -> tuple[bytes, int]:
    """A serialized sentencepiece ModelProto: the pieces (text, score, sentencepiece type each),
    a TrainerSpec of model_type, and the NormalizerSpec message `normalizer`. unk_id: the
    UNKNOWN piece; None: one is appended after the vocabulary, under a name no text produces.
    Returns the proto and the unknown piece's id."""
    n = len(tokens)
    raws = [t.encode("utf-8") for t in tokens]
    headers = _PieceHeaders()
    heads = [headers[len(r)] for r in raws]
    # after the text: score=2 (float) and type=3 (enum) fields, 7 bytes per piece
    tails = np.empty((n, 7), dtype=np.uint8)
    tails[:, 0] = 0x15
    tails[:, 1:5] = np.ascontiguousarray(scores[:n], dtype="<f4").view(np.uint8).reshape(n, 4)
    tails[:, 5] = 0x18
    tails[:, 6] = types[:n]
    tail_bytes = tails.tobytes()
    parts = [b"".join(chain.from_iterable(zip(heads, raws, (tail_bytes[i:i + 7]
                                                              for i in range(0, 7 * n, 7)))))]
    add = parts.append
    if unk_id is None:
        unk = _UNK_NAME
        while unk in tokens:
            unk += "_"
        raw = unk.encode("utf-8")
        body = b"\x0a" + _len(len(raw)) + raw + b"\x15" + struct.pack("<f", 0.0) + b"\x18\x02"
        add(b"\x0a" + _len(len(body)) + body)
        unk_id, n = n, n + 1
    # TrainerSpec: model_type=3, vocab_size=4, byte_fallback=35, unk_id=40,
    # bos_id=41, eos_id=42 (-1: none; ours are handled outside sentencepiece)
    trainer = (b"\x18" + _varint(model_type) + b"\x20" + _varint(n)
               + b"\x98\x02" + (b"\x01" if byte_fallback else b"\x00")
               + b"\xc0\x02" + _varint(unk_id)
               + b"\xc8\x02" + _varint((1 << 64) - 1) + b"\xd0\x02" + _varint((1 << 64) - 1))
    add(b"\x12" + _len(len(trainer)) + trainer)
    add(b"\x1a" + _len(len(normalizer)) + normalizer)
    return b"".join(parts), unk_id


class SPMTokenizer(Tokenizer):
    model = "llama"
    _default_ids = {"bos": 1, "eos": 2, "unk": 0}
    _default_add_bos = True
    _clean_spaces = False

    def __init__(self, md: Mapping[str, Any]):
        prefix = md.get("tokenizer.ggml.add_space_prefix")
        self._add_space_prefix = True if prefix is None else bool(prefix)
        self._init_vocab(md)
        self.pre_name = "default"

        scores = md.get(K_SCORES)
        if scores is None:
            scores = np.zeros(self.n_vocab, dtype=np.float32)
        scores = np.asarray(scores, dtype=np.float32)
        if len(scores) < self.n_vocab:
            raise ModelFileError(f"{K_SCORES} has {len(scores)} entries for {self.n_vocab} tokens")
        scores = scores[:self.n_vocab]

        byte_ids = [self._token_to_id[f"<0x{b:02X}>"] for b in range(256)
                    if f"<0x{b:02X}>" in self._token_to_id]
        if len(byte_ids) != 256:  # no byte fallback without all of them
            byte_ids = []
        proto, self._sp_unk = build_model_proto(self._texts, scores, byte_ids)
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
        except (RuntimeError, OSError) as e:  # pragma: no cover - malformed vocabularies
            raise ModelFileError(f"cannot build a SentencePiece model from the vocabulary: {e}") from e
        self._sp_encode = self._sp.EncodeAsIds

    def _encode_fragment(self, text: str, out: list[int], prev_special: bool) -> None:
        if self._add_space_prefix and prev_special:
            text = " " + text
        ids = self._sp_encode(text.replace(" ", "\u2581"))
        if self._sp_unk in ids:
            unk = self.unk_id
            ids = [t for t in ids if t != self._sp_unk] if unk is None else \
                [unk if t == self._sp_unk else t for t in ids]
        out.extend(ids)

    def _normal_piece(self, tid: int) -> bytes:
        return self._texts[tid].replace("\u2581", " ").encode("utf-8")
