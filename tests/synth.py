"""Tiny synthetic GGUF models for tests: random weights, real layouts.

Tensors are named and shaped as llama.cpp expects. Weights of the types
gguf.quants can quantize are quantized from random floats; the K-quants and
IQ4_NL are random blocks with sane scales (the reference dequantizes the
same bytes, so any valid block pattern is as good as a quantized one).
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Optional

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

# byte offsets of the fp16 scale fields in each block: (d fields, min fields)
SCALE_FIELDS = {
    QT.Q4_0: ([0], []), QT.Q5_0: ([0], []), QT.Q8_0: ([0], []), QT.IQ4_NL: ([0], []),
    QT.Q4_1: ([0], [2]), QT.Q5_1: ([0], [2]),
    QT.Q2_K: ([80], [82]), QT.Q3_K: ([108], []),
    QT.Q4_K: ([0], [2]), QT.Q5_K: ([0], [2]), QT.Q6_K: ([208], []),
}
QUANTIZABLE = {QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0}


# roughly the largest |quant value x sub-block scale| of each format, so that
# d = scale / unit gives weights of about `scale`
_UNIT = {QT.Q4_0: 8, QT.Q4_1: 8, QT.Q5_0: 16, QT.Q5_1: 16, QT.Q8_0: 64, QT.IQ4_NL: 64,
         QT.Q2_K: 20, QT.Q3_K: 64, QT.Q4_K: 470, QT.Q5_K: 980, QT.Q6_K: 2000}


def random_blocks(qtype: QT, n_rows: int, n_in: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """Random valid blocks, [n_rows, row_bytes] uint8, with weights of about `scale`."""
    block, size = GGML_QUANT_SIZES[qtype]
    nb = n_rows * n_in // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    dfields, mfields = SCALE_FIELDS[qtype]
    for off in dfields:
        d = rng.uniform(0.5, 1.5, nb) * scale / _UNIT[qtype]
        raw[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    for off in mfields:  # offsets (mins) centre the values
        m = rng.uniform(0.5, 1.5, nb) * scale / _UNIT[qtype] * 4
        raw[:, off:off + 2] = m.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(n_rows, -1)


def weight(qtype: QT, n_in: int, n_out: int, rng: np.random.Generator, scale: Optional[float] = None):
    """(array for GGUFWriter.add_tensor, raw_dtype) for a matrix of n_out rows of n_in."""
    scale = scale if scale is not None else 1.0 / np.sqrt(n_in)
    if qtype in QUANTIZABLE:
        f = (rng.standard_normal((n_out, n_in)) * scale).astype(np.float32)
        if qtype == QT.F32:
            return f, None
        if qtype == QT.F16:
            return f.astype(np.float16), None
        return gguf.quants.quantize(f, qtype), qtype
    return random_blocks(qtype, n_out, n_in, rng, scale), qtype


def copy_tokenizer(w: gguf.GGUFWriter, source_metadata: dict) -> int:
    """Copies a real file's tokenizer keys into w; returns the vocabulary size."""
    md = source_metadata
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in md:
        w.add_tokenizer_pre(md["tokenizer.ggml.pre"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.token_type" in md:
        w.add_token_types([int(t) for t in md["tokenizer.ggml.token_type"]])
    if "tokenizer.ggml.scores" in md:
        w.add_token_scores([float(s) for s in md["tokenizer.ggml.scores"]])
    if "tokenizer.ggml.merges" in md:
        w.add_token_merges(md["tokenizer.ggml.merges"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if f"tokenizer.ggml.{key}" in md:
            add(int(md[f"tokenizer.ggml.{key}"]))
    if "tokenizer.ggml.add_bos_token" in md:
        w.add_add_bos_token(bool(md["tokenizer.ggml.add_bos_token"]))
    return len(md["tokenizer.ggml.tokens"])


def small_vocab(w: gguf.GGUFWriter, n_vocab: int = 512) -> int:
    """A made-up byte-level BPE vocabulary (enough to load; tests feed ids)."""
    byte_chars = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + \
                 [chr(c) for c in range(174, 256)] + [chr(256 + i) for i in range(68)]
    tokens = byte_chars + [f"tok{i}" for i in range(n_vocab - len(byte_chars))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * n_vocab)
    w.add_token_merges([])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    return n_vocab


def write_llama(path: str | Path, qtype: QT = QT.Q8_0, *, n_embd: int = 256, n_layer: int = 2,
                n_head: int = 4, n_head_kv: int = 2, n_ff: int = 512, n_vocab: int = 512,
                embd_type: Optional[QT] = None, tied: bool = False, seed: int = 0,
                tokenizer_from: Optional[dict] = None, rope_freqs: bool = False,
                drop_tensor: Optional[str] = None, bad_shape: Optional[str] = None,
                arch: str = "llama", extra_kv: Optional[dict[str, str]] = None) -> str:
    """A tiny llama model with every matrix in `qtype`; extra_kv: more string
    metadata (e.g. tokenizer.chat_template)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    head_dim = n_embd // n_head
    w.add_block_count(n_layer)
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    if tokenizer_from is not None:
        n_vocab = copy_tokenizer(w, tokenizer_from)
    else:
        n_vocab = small_vocab(w, n_vocab)
    for key, value in (extra_kv or {}).items():
        w.add_string(key, value)

    def add(name, array_and_type):
        if name == drop_tensor:
            return
        arr, raw = array_and_type
        if name == bad_shape:  # one row short: the shape no longer matches the hyperparameters
            arr = arr[:-1]
        w.add_tensor(name, arr, raw_dtype=raw)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), None

    add("token_embd.weight", weight(embd_type or qtype, n_embd, n_vocab, rng, scale=1.0))
    add("output_norm.weight", norm(n_embd))
    if not tied:
        add("output.weight", weight(qtype, n_embd, n_vocab, rng))
    if rope_freqs:
        add("rope_freqs.weight", ((1.0 + rng.uniform(0, 4, head_dim // 2)).astype(np.float32), None))
    kv_dim = n_head_kv * head_dim
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", norm(n_embd))
        add(p + "attn_q.weight", weight(qtype, n_embd, n_embd, rng))
        add(p + "attn_k.weight", weight(qtype, n_embd, kv_dim, rng))
        add(p + "attn_v.weight", weight(qtype, n_embd, kv_dim, rng))
        add(p + "attn_output.weight", weight(qtype, n_embd, n_embd, rng))
        add(p + "ffn_norm.weight", norm(n_embd))
        add(p + "ffn_gate.weight", weight(qtype, n_embd, n_ff, rng))
        add(p + "ffn_up.weight", weight(qtype, n_embd, n_ff, rng))
        add(p + "ffn_down.weight", weight(qtype, n_ff, n_embd, rng))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def raw_gguf(path: str | Path, version: int = 3, kv: Optional[list] = None,
             tensors: Optional[list] = None, data: bytes = b"") -> str:
    """A GGUF written byte by byte, for files no writer would make.
    kv: [(key, "str"|"u32", value)]; tensors: [(name, shape, type, offset)]."""
    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    kv = kv or []
    tensors = tensors or []
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, kind, value in kv:
        out += s(key) + (struct.pack("<I", 8) + s(value) if kind == "str" else struct.pack("<II", 4, value))
    for name, shape, ttype, offset in tensors:
        out += s(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        out += struct.pack("<IQ", ttype, offset)
    out += b"\0" * (-len(out) % 32) + data
    Path(path).write_bytes(out)
    return str(path)
