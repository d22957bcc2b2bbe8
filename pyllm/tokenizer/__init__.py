"""Tokenizers for GGUF vocabularies, matching llama.cpp token for token.

    from pyllm.model_file import ModelFile
    from pyllm.tokenizer import load_tokenizer

    tok = load_tokenizer(ModelFile(path).metadata)
    ids = tok.encode("Hello", parse_special=True)   # BOS per the file
    text = tok.decode(ids, skip_special=True)
    stream = tok.stream_decoder()
    for i in generated: print(stream.push(i), end="")
    print(stream.flush())

Implementations behind one interface (`Tokenizer`):
'gpt2' (byte-level BPE, `BPETokenizer`; 'gemma4' is its raw UTF-8 variant,
`Gemma4Tokenizer`), 'llama' (SentencePiece BPE, `SPMTokenizer`), 't5' (SentencePiece
Unigram, `UGMTokenizer`: T5, XLM-RoBERTa encoders), 'bert' (WordPiece, `WPMTokenizer`,
for BERT embedding models) and 'rwkv' (greedy longest match over escaped byte strings,
`RWKVTokenizer`: RWKV-6 / RWKV-7 World).
`tokenizer.ggml.model` chooses.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ModelFileError, UnsupportedModelError
from .base import StreamDecoder, TokenAttr, Tokenizer
from .bpe import BPETokenizer, Gemma4Tokenizer
from .rwkv import RWKVTokenizer
from .spm import SPMTokenizer
from .ugm import UGMTokenizer
from .wpm import WPMTokenizer

__all__ = ["Tokenizer", "BPETokenizer", "Gemma4Tokenizer", "SPMTokenizer", "UGMTokenizer", "WPMTokenizer",
           "RWKVTokenizer", "StreamDecoder",
           "TokenAttr", "load_tokenizer", "SUPPORTED_MODELS"]

_IMPLEMENTATIONS: dict[str, type[Tokenizer]] = {
    "gpt2": BPETokenizer,
    "llama": SPMTokenizer,
    "gemma4": Gemma4Tokenizer,
    "bert": WPMTokenizer,
    "t5": UGMTokenizer,
    "rwkv": RWKVTokenizer,
}
SUPPORTED_MODELS = tuple(_IMPLEMENTATIONS)


def load_tokenizer(metadata: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer described by a GGUF file's metadata (`ModelFile.metadata`).

    Raises UnsupportedModelError for a tokenizer model or BPE pre-tokenizer
    pyllm does not implement, ModelFileError for a missing or broken vocabulary.
    """
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        raise ModelFileError("the model has no tokenizer (tokenizer.ggml.model missing)")
    cls = _IMPLEMENTATIONS.get(model)
    if cls is None:
        raise UnsupportedModelError(
            f"tokenizer model {model!r} is not supported; supported: "
            + ", ".join(f"{m!r}" for m in SUPPORTED_MODELS))
    return cls(metadata)
