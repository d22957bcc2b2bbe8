"""Quantizing a GGUF model, as llama-quantize does: `pyllm quantize IN OUT TYPE`.

The file's metadata is copied as it is (byte for byte), with general.file_type
set to the new type; each tensor is either copied as it is or, if it is a
weight matrix, quantized from its float values (F32, F16, BF16; a quantized
tensor only with allow_requantize, from its dequantized values).

Which tensors are quantized, and to what, follows llama.cpp's rules for the
types offered here:
- matrices whose name ends in "weight" (not the norms, the MoE router
  ffn_gate_inp, position and token-type embeddings, convolution kernels of
  state-space layers, RWKV's time-mix vectors) are quantized; vectors stay;
- the output matrix (the token embeddings where the output is tied to them)
  becomes Q6_K, or Q8_0 for a Q8_0 file, rows not a multiple of 256, or Falcon;
- the mixes give more bits where the error costs most: Q6_K for the value
  projections and FFN down-projections of the first and last eighth of the
  layers and every third one between (Q4_K_M, Q5_K_M), a fused QKV gets Q5_K
  (Q4_K_M) or Q6_K (Q5_K_M); Q4_K_S gives the first 4 value projections and
  the first eighth of the down-projections Q5_K; Q2_K gives the value
  projections Q3_K (Q4_K with 4+ query heads per KV head), the attention
  outputs and down-projections Q3_K; Q3_K_M the first 2 value projections
  Q5_K and the rest Q4_K, the attention outputs and down-projections Q4_K
  (Q5_K for the first sixteenth of the latter); Q3_K_L all three Q5_K;
  Q3_K_S nothing; IQ4_NL and IQ4_XS give the value projections Q5_K (with 4+
  query heads per KV head) and, without an importance matrix, the first eighth
  of the down-projections Q5_K; models of 8 experts get Q8_0 value and key projections;
- a row length the type's block does not divide falls back as llama.cpp
  does (Q2_K, Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
  IQ4_XS -> IQ4_NL; then F16).

The legacy formats (Q4_0 ... Q8_0, BF16) are quantized by the gguf package's
reference quantizers (the same bytes as llama.cpp's); the K formats by
pyllm.kquants, IQ4_NL and IQ4_XS by pyllm.iquants (llama.cpp's bytes too).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from .errors import InvalidArgumentError, ModelFileError
from .model_file import KV_I32, KV_STRING, KV_U32, ModelFile, kv_entry, write_gguf

# name -> (the type most matrices get, llama.cpp's general.file_type)
FTYPES: dict[str, tuple[T, int]] = {
    "F16": (T.F16, 1), "BF16": (T.BF16, 32), "Q8_0": (T.Q8_0, 7),
    "Q4_0": (T.Q4_0, 2), "Q4_1": (T.Q4_1, 3), "Q5_0": (T.Q5_0, 8), "Q5_1": (T.Q5_1, 9),
    "Q4_K_S": (T.Q4_K, 14), "Q4_K_M": (T.Q4_K, 15), "Q5_K_S": (T.Q5_K, 16), "Q5_K_M": (T.Q5_K, 17),
    "Q6_K": (T.Q6_K, 18),
    "Q2_K": (T.Q2_K, 10), "Q3_K_S": (T.Q3_K, 11), "Q3_K_M": (T.Q3_K, 12), "Q3_K_L": (T.Q3_K, 13),
    "IQ4_NL": (T.IQ4_NL, 25), "IQ4_XS": (T.IQ4_XS, 30),
}
FLOAT_SOURCES = (T.F32, T.F16, T.BF16)
FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.IQ4_XS: T.IQ4_NL}
QUANTIZATION_VERSION = 2    # general.quantization_version of files with quantized tensors

_KEEP = re.compile(r"_norm\.weight$|ffn_gate_inp\.weight$|^pos(ition)?_embd\.|^token_types\.|ssm_conv1d|"
                   r"shortconv\.conv\.weight$|time_mix_(first|w0|w1|w2|v0|v1|v2|a0|a1|a2|g1|g2|decay_w1|decay_w2|"
                   r"lerp_fused)\.weight$|attn_rel_b\.weight$")
_LAYER = re.compile(r"^blk\.(\d+)\.")


def is_quantizable(name: str, shape: tuple[int, ...]) -> bool:
    """Whether llama.cpp would quantize this tensor: a matrix of weights, not one of those it keeps."""
    return len(shape) >= 2 and name.endswith("weight") and not _KEEP.search(name)


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's layers that get more bits in the _M mixes: the first and last eighth, every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@dataclass
class Plan:
    """Each tensor's type in the new file."""
    types: dict[str, T]
    importance: list[str] = field(default_factory=list)   # the tensors an importance matrix weighed
    source_bytes: int = 0                                  # the model quantized (all its shards)

    def histogram(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.types.values():
            out[t.name] = out.get(t.name, 0) + 1
        return out


TENSOR_TYPES = {t.name: t for t in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K,
                                     T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS)}


def tensor_type(name: str, what: str) -> T:
    """A single tensor type by name (--output-tensor-type, --token-embedding-type)."""
    t = TENSOR_TYPES.get(str(name).upper())
    if t is None:
        raise InvalidArgumentError(f"{what} must be one of {', '.join(TENSOR_TYPES)}, not {name!r}")
    return t


def tensor_types(specs: Sequence[str]) -> list[tuple[re.Pattern, T]]:
    """llama-quantize's --tensor-type PATTERN=TYPE: a regular expression searched in each
    tensor's name, and the type it gets."""
    out = []
    for spec in specs:
        pattern, eq, name = spec.rpartition("=")
        if not eq or not pattern:
            raise InvalidArgumentError(f"--tensor-type takes PATTERN=TYPE (e.g. attn_v=q8_0 or "
                                       f"'blk\\.[0-3]\\.ffn_down=q6_k'), not {spec!r}")
        try:
            out.append((re.compile(pattern), tensor_type(name, "--tensor-type's type")))
        except re.error as e:
            raise InvalidArgumentError(f"--tensor-type {spec}: {pattern!r} is not a regular expression ({e})") \
                from None
    return out


def plan(model: ModelFile, ftype: str, allow_requantize: bool = False, pure: bool = False,
         output_type: Optional[T] = None, embedding_type: Optional[T] = None, has_imatrix: bool = False,
         overrides: Sequence[tuple[re.Pattern, T]] = (), leave_output: bool = False) -> Plan:
    """The type of every tensor of `model` quantized to `ftype` (one of FTYPES); output_type and
    embedding_type override the output matrix's (the token embeddings' when tied) and the token
    embeddings' types, as llama-quantize's --output-tensor-type and --token-embedding-type.
    overrides: (pattern, type) pairs (--tensor-type) over the mix's choice, the last matching
    one winning, as llama-quantize's (not with pure, nor for an F16/BF16 target); leave_output
    keeps output.weight as it is (--leave-output-tensor)."""
    if ftype not in FTYPES:
        raise InvalidArgumentError(f"unknown type {ftype!r}; pyllm quantizes to {', '.join(FTYPES)}")
    default, _ = FTYPES[ftype]
    tied = "output.weight" not in model.tensors
    # llama.cpp counts the value projections in layer order (files often list blk.10 before blk.2)
    mix = _mix_of(model, ftype, default, tied, has_imatrix)
    types: dict[str, T] = {}
    for name, t in model.tensors.items():
        source = T(t.type)
        if not is_quantizable(name, t.shape):
            types[name] = source
            continue
        if source not in FLOAT_SOURCES and not allow_requantize:
            raise InvalidArgumentError(f"{name} is already {source.name}: quantizing it again loses more; give "
                                       f"an F32/F16/BF16 file, or allow requantizing (--allow-requantize)")
        if leave_output and name == "output.weight":
            types[name] = source
            continue
        new = default
        if not pure and default not in (T.F16, T.BF16):
            new = _mixed_type(name, t.shape[0], mix)
            new = next((qtype for pattern, qtype in reversed(overrides) if pattern.search(name)), new)
        is_output = name == "output.weight" or (tied and name == "token_embd.weight")
        if output_type is not None and is_output:
            new = output_type
        elif embedding_type is not None and name == "token_embd.weight":
            new = embedding_type
        types[name] = _fit(new, t.shape[0])
    return Plan(types)


def _layer_of(name: str) -> int:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


@dataclass
class Mix:
    """What llama.cpp's per-tensor rules look at besides the tensor itself."""
    ftype: str
    default: T
    tied: bool
    n_layer: int
    attn_v: list[str]      # the value projections in layer order
    n_gqa: int             # query heads per KV head (layer 0's)
    n_expert: int
    falcon: bool
    has_imatrix: bool = False


def _mix_of(model: ModelFile, ftype: str, default: T, tied: bool, has_imatrix: bool = False) -> Mix:
    def first(key: str, fallback: int) -> int:
        v = model.arch_get(key, fallback)
        return int(v[0] if isinstance(v, (list, tuple)) and v else v or fallback)
    n_head = first("attention.head_count", 1)
    n_kv = first("attention.head_count_kv", n_head)
    attn_v = sorted((n for n in model.tensors if n.endswith("attn_v.weight")), key=_layer_of)
    return Mix(ftype, default, tied, int(model.arch_get("block_count", 0) or 0), attn_v,
               n_head // n_kv if n_kv else 1, first("expert_count", 0), model.architecture == "falcon", has_imatrix)


def _mixed_type(name: str, row: int, mix: Mix) -> T:
    """llama.cpp's llama_tensor_get_type for the types offered here."""
    ftype, default = mix.ftype, mix.default
    if name == "output.weight" or (mix.tied and name == "token_embd.weight"):
        return T.Q8_0 if default == T.Q8_0 or row % 256 or mix.falcon else T.Q6_K
    layer = max(0, _layer_of(name))
    if name.endswith("attn_v.weight"):
        i = mix.attn_v.index(name)
        new = default
        if ftype == "Q2_K":
            new = T.Q4_K if mix.n_gqa >= 4 else T.Q3_K
        elif ftype == "Q3_K_M":
            new = T.Q5_K if i < 2 else T.Q4_K
        elif ftype == "Q3_K_L":
            new = T.Q5_K
        elif ftype in ("Q4_K_M", "Q5_K_M") and _more_bits(i, len(mix.attn_v)):
            new = T.Q6_K
        elif ftype == "Q4_K_S" and i < 4:
            new = T.Q5_K
        elif ftype in ("IQ4_NL", "IQ4_XS") and mix.n_gqa >= 4:
            new = T.Q5_K
        return T.Q8_0 if mix.n_expert == 8 else new
    if name.endswith("attn_k.weight"):
        return T.Q8_0 if mix.n_expert == 8 else default
    if re.search(r"ffn_down(_exps)?\.weight$", name):
        n = mix.n_layer
        if ftype == "Q2_K":
            return T.Q3_K
        if ftype == "Q3_K_M":
            return T.Q5_K if layer < n // 16 else T.Q4_K if not mix.falcon or _more_bits(layer, n) else T.Q3_K
        if ftype == "Q3_K_L":
            return T.Q4_K if mix.falcon else T.Q5_K
        if ftype == "Q4_K_M":
            if mix.falcon:
                return T.Q6_K if layer < n // 16 else T.Q5_K if _more_bits(layer, n) else T.Q4_K
            return T.Q6_K if _more_bits(layer, n) else default
        if ftype in ("IQ4_NL", "IQ4_XS") and layer < n // 8 and not mix.has_imatrix:
            return T.Q5_K
        if ftype == "Q5_K_M" and _more_bits(layer, n):
            return T.Q6_K
        if ftype == "Q4_K_S" and not mix.falcon and layer < n // 8:
            return T.Q5_K
        if ftype in ("Q4_0", "Q5_0") and mix.has_imatrix and layer < n // 8:   # against their first layers' outliers
            return T.Q4_1 if ftype == "Q4_0" else T.Q5_1
    elif name.endswith("attn_output.weight"):
        if mix.falcon:
            return T.Q4_K if ftype == "Q3_K_L" else default
        if mix.n_expert == 8:
            return T.Q5_K if ftype in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS") else default
        return {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K}.get(ftype, default)
    elif name.endswith("attn_qkv.weight"):
        return {"Q3_K_M": T.Q4_K, "Q3_K_L": T.Q4_K, "Q4_K_M": T.Q5_K, "Q5_K_M": T.Q6_K}.get(ftype, default)
    return default


def _fit(new: T, row: int) -> T:
    """The type itself if its blocks divide the row, else llama.cpp's fallback (then F16)."""
    if row % GGML_QUANT_SIZES[new][0] == 0:
        return new
    new = FALLBACK.get(new, new)
    return new if row % GGML_QUANT_SIZES[new][0] == 0 else T.F16


# -- converting one tensor ------------------------------------------------------------------

def float_rows(t, rows: slice) -> np.ndarray:
    """Rows of tensor `t` as float32 [rows, row length]."""
    source, row = T(t.type), t.shape[0]
    raw = t.data.reshape(t.rows, t.row_bytes)[rows]
    if source == T.F32:
        return raw.view(np.float32).reshape(-1, row)
    if source == T.F16:
        return raw.view(np.float16).astype(np.float32).reshape(-1, row)
    if source == T.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(-1, row)
    from gguf.quants import dequantize
    return dequantize(np.ascontiguousarray(raw), source).reshape(-1, row).astype(np.float32)


def quantizer(new: T, importance: Optional[np.ndarray] = None) -> Callable[[np.ndarray], np.ndarray]:
    """rows of float32 -> their bytes in type `new`; importance: the columns' (the weighted quantizers
    of the K and legacy types take it, others ignore it, as llama.cpp's Q8_0 does)."""
    if importance is not None and new in LEGACY_WEIGHTED:
        from .kquants import quantize_legacy_weighted
        return lambda x: quantize_legacy_weighted(x, importance, LEGACY_WEIGHTED[new])
    if new == T.F32:
        return lambda x: x.astype(np.float32).view(np.uint8)
    if new == T.F16:
        return lambda x: x.astype(np.float16).view(np.uint8)
    if new in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
        from . import kquants
        k_quantize = {T.Q2_K: kquants.quantize_q2_k, T.Q3_K: kquants.quantize_q3_k, T.Q4_K: kquants.quantize_q4_k,
                      T.Q5_K: kquants.quantize_q5_k, T.Q6_K: kquants.quantize_q6_k}[new]
        return k_quantize if importance is None else lambda x: k_quantize(x, importance)
    if new in I_TYPES:
        from . import iquants
        i_quantize = iquants.quantize_iq4_nl if new == T.IQ4_NL else iquants.quantize_iq4_xs
        return lambda x: i_quantize(x, importance)
    from gguf.quants import quantize
    return lambda x: quantize(x, new)


def tensor_bytes(shape: tuple[int, ...], qtype: T) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


CHUNK_ELEMENTS = 1 << 24   # floats converted at a time: bounds memory on large tensors


K_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)
I_TYPES = (T.IQ4_NL, T.IQ4_XS)
LEGACY_WEIGHTED = {T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q5_0: "q5_0", T.Q5_1: "q5_1"}
WEIGHTED_TYPES = (*K_TYPES, *I_TYPES, *LEGACY_WEIGHTED)   # the types whose quantizers take an importance matrix (not Q8_0)


def write_tensor(f, t, new: T, importance: Optional[np.ndarray] = None) -> None:
    """Writes tensor `t` as type `new` (its bytes as they are if the type does not change);
    importance: its columns' (a K type's quantizer weighs the error by them), or for an expert
    tensor [n_experts, n_in], each expert's for its own rows (as llama-quantize slices it)."""
    if new == T(t.type):
        f.write(memoryview(t.data))
        return
    # row groups of one importance vector: the whole matrix, or each expert's n_out rows
    group = t.rows if importance is None or importance.ndim == 1 else t.rows // importance.shape[0]
    step = max(1, min(group, CHUNK_ELEMENTS // t.shape[0]))
    for g0 in range(0, t.rows, group):
        convert = quantizer(new, None if importance is None else importance.reshape(-1, t.shape[0])[g0 // group])
        for start in range(g0, g0 + group, step):
            x = float_rows(t, slice(start, min(start + step, g0 + group)))
            if not np.isfinite(x).all():
                raise ModelFileError(f"{t.name} holds NaN or infinite values; the file is corrupt")
            f.write(np.ascontiguousarray(convert(x)).tobytes())


# -- the file ----------------------------------------------------------------------------------

def importances(model: ModelFile, p: Plan, imatrix_path: str | os.PathLike, ftype: str) -> tuple[dict, list[bytes]]:
    """name -> column importances for the tensors `p` quantizes to a type that weighs by them, from an imatrix
    file (llama-imatrix's or pyllm imatrix's), and the metadata llama-quantize records of it."""
    from .imatrix import Imatrix
    im = Imatrix.load(imatrix_path)
    means = im.mean_squares()
    out = {}
    for name, new in p.types.items():
        if new not in WEIGHTED_TYPES or new == T(model.tensors[name].type) or name not in means:
            continue
        shape = model.tensors[name].shape
        want = (shape[0],) if len(shape) < 3 else (shape[2], shape[0])   # an expert tensor: a row per expert
        if means[name].shape != want:
            raise ModelFileError(f"{imatrix_path}: {name} has importances of shape {means[name].shape}, the "
                                 f"model's matrix needs {want}: the importance matrix is for another model")
        out[name] = means[name]
    meta = [kv_entry("quantize.imatrix.file", KV_STRING, str(imatrix_path)),
            kv_entry("quantize.imatrix.entries_count", KV_I32, len(means))]
    if im.datasets:
        meta.append(kv_entry("quantize.imatrix.dataset", KV_STRING, im.datasets[0]))
    if im.chunks > 0:
        meta.append(kv_entry("quantize.imatrix.chunks_count", KV_I32, im.chunks))
    return out, meta


def quantize_file(src: str | os.PathLike, dst: str | os.PathLike, ftype: str, allow_requantize: bool = False,
                  pure: bool = False, progress: Optional[Callable[[str, T, int, int], None]] = None,
                  output_type: Optional[T] = None, embedding_type: Optional[T] = None,
                  imatrix: Optional[str | os.PathLike] = None, overrides: Optional[dict] = None,
                  tensor_overrides: Sequence[tuple[re.Pattern, T]] = (), leave_output: bool = False) -> Plan:
    """Writes `src` quantized to `ftype` at `dst` (written to a temporary name, then moved into place).
    progress(name, type, done tensors, all tensors) is called after each tensor. imatrix: an
    importance matrix file; the quantizers (Q8_0's aside) then weigh each column's error by it
    (the matrices it has no entry for are quantized without, as llama-quantize does). overrides:
    metadata key -> value written instead of the source's (llama-quantize's --override-kv).
    tensor_overrides, leave_output: as plan()'s overrides and leave_output."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise InvalidArgumentError("the output would overwrite the input: give another output path")
    model = ModelFile(src, overrides=overrides)
    try:
        p = plan(model, ftype, allow_requantize, pure, output_type, embedding_type, has_imatrix=imatrix is not None,
                 overrides=tensor_overrides, leave_output=leave_output)
        alignment = int(model.get("general.alignment", 32))
        weights, imatrix_meta = importances(model, p, imatrix, ftype) if imatrix is not None else ({}, [])
        replaced = ("general.file_type", "general.quantization_version")
        kv = [model.metadata_entry(k) for k in model.metadata if k not in replaced
              and not k.startswith("quantize.imatrix.") and not k.startswith("split.")]  # one file out
        kv.append(kv_entry("general.file_type", KV_U32, FTYPES[ftype][1]))
        kv += imatrix_meta
        if any(t not in (T.F32, T.F16, T.BF16) for t in p.types.values()):
            kv.append(kv_entry("general.quantization_version", KV_U32, QUANTIZATION_VERSION))
        tensors = list(model.tensors.values())

        def write_data(f, i: int) -> None:
            t = tensors[i]
            write_tensor(f, t, p.types[t.name], weights.get(t.name))
            if progress is not None:
                progress(t.name, p.types[t.name], i + 1, len(tensors))

        write_gguf(dst, kv, [(t.name, t.shape, p.types[t.name], tensor_bytes(t.shape, p.types[t.name]))
                             for t in tensors], write_data, alignment)
        p.importance = sorted(weights)
        p.source_bytes = model.file_size
        return p
    finally:
        model.close()
