"""GGUF model files: typed metadata and zero-copy tensor views over mmap.

The header is parsed here, with every length, count and offset checked
against the file before anything reads it. Format constants (type ids, block
sizes) come from the `gguf` package. We parse the header ourselves instead of
using gguf.GGUFReader because the reader builds numpy objects per array
element: on Gemma 3's 262k-token vocabulary it took 24 s and 750 MB; this
parser takes a fraction of a second and touches only the header pages.

Tensor data is never copied: `ModelFile.tensor(name).data` is a read-only
numpy uint8 view into the mapping, which the C core reads in place.

A model split into shards (llama.cpp's gguf-split: NAME-00001-of-00003.gguf and
its siblings, the first holding the metadata, each holding some tensors, all
carrying split.no / split.count) opens from its first shard: the others are
mapped beside it and their tensors join its table, so nothing above this file
knows the model was split.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import InvalidArgumentError, ModelFileError, ModelNotFoundError, UnsupportedModelError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

# GGUF metadata value types -> (struct format, size); 8 = string, 9 = array
_SCALAR = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4),
           5: ("<i", 4), 6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8),
           12: ("<d", 8)}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_count(v) -> bool:
    return _is_int(v) and 0 <= v < 2**31


def _is_number(v) -> bool:
    return (_is_int(v) or isinstance(v, (float, np.floating))) and math.isfinite(v)


def _is_flag(v) -> bool:
    return isinstance(v, (bool, np.bool_)) or (_is_int(v) and v in (0, 1))


def _is_array_of(kinds: str):
    return lambda v: isinstance(v, np.ndarray) and v.dtype.kind in kinds


# What pyllm expects under each key it reads: (test, what it is called). A
# value of another kind means a corrupt file (llama.cpp refuses those too);
# checking it at the boundary keeps the readers' int() and float() safe.
_INT = (_is_int, "an integer")
_COUNT = (_is_count, "an integer from 0 to 2^31-1")
_NUMBER = (_is_number, "a finite number")
_TEXT = (lambda v: isinstance(v, str), "a string")
_FLAG = (_is_flag, "a boolean")
# the parser's arrays hold one element type: the first element says what all are
_TEXTS = (lambda v: isinstance(v, list) and (not v or isinstance(v[0], str)), "an array of strings")
_NUMBERS = (_is_array_of("iuf"), "an array of numbers")
_INTS = (_is_array_of("iu"), "an array of integers")
_COUNT_OR_FLAGS = (lambda v: _is_count(v) or _is_array_of("biu")(v), "an integer or an array of flags")
_COUNT_OR_COUNTS = (lambda v: _is_count(v) or _is_array_of("iu")(v), "an integer or an array of integers")

METADATA_KINDS = {
    "general.architecture": _TEXT, "general.name": _TEXT, "general.alignment": _COUNT,
    "general.file_type": _COUNT, "tokenizer.ggml.model": _TEXT, "tokenizer.ggml.pre": _TEXT,
    "tokenizer.ggml.tokens": _TEXTS, "tokenizer.ggml.merges": _TEXTS, "tokenizer.ggml.scores": _NUMBERS,
    "tokenizer.ggml.token_type": _INTS, "tokenizer.ggml.add_bos_token": _FLAG,
    "tokenizer.ggml.add_eos_token": _FLAG, "tokenizer.ggml.add_space_prefix": _FLAG,
    "tokenizer.chat_template": _TEXT,
    "split.no": _COUNT, "split.count": _COUNT, "split.tensors.count": _COUNT,
}
# "{architecture}.KEY", checked when read (a family pyllm does not run may use a key differently)
ARCH_KINDS = {
    **dict.fromkeys(("block_count", "context_length", "embedding_length",
                     "vocab_size", "attention.key_length",
                     "attention.value_length", "attention.sliding_window", "rope.dimension_count",
                     "rope.scaling.original_context_length", "expert_count", "expert_used_count",
                     "expert_feed_forward_length", "expert_shared_feed_forward_length",
                     "leading_dense_block_count", "interleave_moe_layer_step", "ssm.conv_kernel",
                     "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank", "ssm.group_count"), _COUNT),
    **dict.fromkeys(("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.freq_base", "rope.freq_base_swa",
                     "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor",
                     "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
                     "rope.scaling.yarn_log_multiplier",
                     "final_logit_softcapping", "attn_logit_softcapping", "logit_scale", "residual_scale",
                     "embedding_scale", "attention.scale"), _NUMBER),
    "rope.scaling.type": _TEXT,
    "rope.scaling.finetuned": _FLAG,
    "use_parallel_residual": _FLAG,
    "attention.temperature_scale": _NUMBER,
    "attention.temperature_length": _COUNT,
    "attention.sliding_window_pattern": _COUNT_OR_FLAGS,
    "attention.rope_pattern": _COUNT_OR_FLAGS,
    "attention.head_count": _COUNT_OR_COUNTS,      # a list: OpenELM's, one per layer
    "attention.head_count_kv": _COUNT_OR_COUNTS,
    "feed_forward_length": _COUNT_OR_COUNTS,
    "shortconv.l_cache": _COUNT,
}


def printable(name: str, limit: int = 80) -> str:
    """A name from the file as it can be shown in a message: control
    characters escaped, long names cut."""
    shown = name if name.isprintable() else name.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _describe(v) -> str:
    if isinstance(v, str):
        return f"the string {printable(v, 40)!r}"
    if isinstance(v, list):
        return f"an array of {len(v)} items"
    if isinstance(v, np.ndarray):
        return f"an array of {len(v)} {v.dtype}"
    return repr(v.item() if isinstance(v, np.generic) else v)


def type_name(type_id: int) -> str:
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"


@dataclass(frozen=True)
class Tensor:
    name: str
    type: int                 # ggml type id
    shape: tuple[int, ...]    # GGUF order: shape[0] is the row length
    offset: int               # absolute offset of the data in its file (its shard's, for a split model)
    nbytes: int
    data: np.ndarray          # uint8 view into the mapping

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def rows(self) -> int:
        return self.n_elements // self.shape[0]

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.rows


class _Cursor:
    """Reads little-endian values from the header, checking every bound."""

    def __init__(self, buf, size: int, path: str):
        self.buf, self.size, self.pos, self.path = buf, size, 0, path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelFileError(
                f"{self.path}: file is truncated or corrupt (reading {what} at byte {self.pos} "
                f"needs {n} bytes, file has {self.size}); download it again")

    def scalar(self, vtype: int, what: str):
        fmt, n = _SCALAR[vtype]
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str) -> str:
        n = self.u64(what + " length")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR:
            return self.scalar(vtype, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype = self.u32(what + " element type")
            count = self.u64(what + " element count")
            if etype in _NUMPY:
                size = _SCALAR[etype][1]
                self.need(count * size, what)
                arr = np.frombuffer(self.buf, dtype=np.dtype(_NUMPY[etype]).newbyteorder("<"),
                                    count=count, offset=self.pos).copy()
                self.pos += count * size
                return arr
            if etype == _STRING:
                self.need(count * 8, what)  # every string has at least its length
                return [self.string(what) for _ in range(count)]
            if etype == _ARRAY:
                return [self.value(_ARRAY, what) for _ in range(count)]
            raise ModelFileError(f"{self.path}: corrupt metadata: {what} has unknown element type {etype}")
        raise ModelFileError(f"{self.path}: corrupt metadata: {what} has unknown value type {vtype}")


def shard_path(first: str, index: int, count: int) -> str:
    """The path of shard `index` (from 0) of `count`, named as llama.cpp names them
    (PREFIX-00002-of-00003.gguf), from the first shard's path."""
    suffix = f"-{1:05d}-of-{count:05d}.gguf"
    if not first.endswith(suffix):
        raise ModelFileError(f"{first} is the first of {count} shards of a split model but is not named "
                             f"PREFIX{suffix}, so its siblings cannot be found: rename the shards as "
                             f"llama.cpp's gguf-split names them")
    return f"{first[:-len(suffix)]}-{index + 1:05d}-of-{count:05d}.gguf"


class ModelFile:
    """An open GGUF file: `metadata` (key -> value), `tensors` (name -> Tensor).
    `shards` lists the files it was read from (one, unless the model is split);
    `file_size` is their bytes together."""

    def __init__(self, path: str | os.PathLike, _shard: tuple[int, int] | None = None,
                 overrides: dict[str, Any] | None = None, use_mmap: bool = True):
        """overrides: metadata key -> value (int, float, bool or str) to use instead of the
        file's (llama.cpp's --override-kv); checked as the file's own values are. A key
        "{arch}.KEY" names the file's family's KEY ("{arch}.rope.freq_base"). use_mmap False:
        the file is read into memory instead of mapped (llama.cpp's --no-mmap)."""
        self.path = str(path)
        self.use_mmap = use_mmap
        self._parts: list[ModelFile] = []
        self.overrides = dict(overrides or {})
        if not os.path.isfile(self.path):
            raise ModelNotFoundError(f"no model file at {self.path}; give a path to a .gguf file "
                                     f"or a registry name (see `pyllm list`)")
        self.file_size = os.path.getsize(self.path)
        if self.file_size < 24:
            raise ModelFileError(f"{self.path}: not a GGUF file (only {self.file_size} bytes)")
        with open(self.path, "rb") as f:
            if use_mmap:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            else:   # its own memory: nothing is paged in from the file later
                self._mmap = bytearray(self.file_size)
                if f.readinto(self._mmap) != self.file_size:
                    raise ModelFileError(f"{self.path}: the file changed size while it was read")
        try:
            self._parse()
            self._override()
            self._check_split(_shard)
            if _shard is None:
                self._open_shards()
        except BaseException:
            self.close()
            raise

    def _override(self) -> None:
        family = str(self.metadata.get("general.architecture", ""))
        self.overrides = {key.replace("{arch}", family, 1) if key.startswith("{arch}.") else key: value
                          for key, value in self.overrides.items()}
        for key, value in self.overrides.items():
            if not isinstance(value, (bool, int, float, str)):
                raise InvalidArgumentError(f"override {key}: a number, a boolean or a string, not {value!r}")
            self.metadata[key] = value
            self.metadata_spans.pop(key, None)
            if key in METADATA_KINDS:
                self._check_kind(key, METADATA_KINDS[key])

    # -- split models ----------------------------------------------------------
    def _check_split(self, shard: tuple[int, int] | None) -> None:
        index, count = int(self.get("split.no", 0)), int(self.get("split.count", 1))
        if shard is not None and (index, count) != shard:
            raise ModelFileError(f"{self.path} should be shard {shard[0] + 1} of {shard[1]} but says it is "
                                 f"shard {index + 1} of {count}; the shards come from different splits")
        if shard is None and count > 1 and index != 0:
            raise InvalidArgumentError(
                f"{self.path} is shard {index + 1} of {count} of a split model: give the first shard "
                f"(...-00001-of-{count:05d}.gguf); the others are found beside it")

    def _open_shards(self) -> None:
        count = int(self.get("split.count", 1))
        for index in range(1, count):
            path = shard_path(self.path, index, count)
            if not os.path.isfile(path):
                raise ModelNotFoundError(f"{self.path} is the first of {count} shards and shard {index + 1}, "
                                         f"{path}, is missing: put all {count} files in one folder")
            part = ModelFile(path, _shard=(index, count), use_mmap=self.use_mmap)
            self._parts.append(part)
            for name, t in part.tensors.items():
                if name in self.tensors:
                    raise ModelFileError(f"{path}: tensor {printable(name)} is in two shards; "
                                         f"the split is corrupt")
                self.tensors[name] = t
            self.file_size += part.file_size
        expected = self.get("split.tensors.count")
        if expected is not None and count > 1 and expected != len(self.tensors):
            raise ModelFileError(f"{self.path}: the split model should hold {expected} tensors but its "
                                 f"{count} shards hold {len(self.tensors)}; a shard is from another split")

    @property
    def shards(self) -> list[str]:
        return [self.path] + [p.path for p in self._parts]

    def lock(self) -> bool:
        """Locks the file's bytes (all shards) in RAM, so they are never paged out (mlock,
        llama.cpp's --mlock); False, with the reason logged, where the system refuses (the
        limit `ulimit -l` sets, or no mlock on this platform)."""
        import ctypes
        import ctypes.util
        import logging
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            mlock = libc.mlock
        except (OSError, AttributeError):
            logging.getLogger("pyllm").warning("--mlock: this platform has no mlock; the model stays unlocked")
            return False
        mlock.argtypes, mlock.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int
        for f in [self, *self._parts]:
            view = np.frombuffer(f._mmap, dtype=np.uint8)
            if mlock(view.ctypes.data, view.nbytes) != 0:
                reason = os.strerror(ctypes.get_errno())
                logging.getLogger("pyllm").warning(
                    "--mlock: could not lock %s (%.0f MB) in memory: %s; raise the limit (ulimit -l) or run "
                    "without --mlock", f.path, view.nbytes / 1e6, reason)
                return False
        return True

    # -- parsing -------------------------------------------------------------
    def _parse(self) -> None:
        c = _Cursor(self._mmap, self.file_size, self.path)
        if bytes(self._mmap[:4]) != GGUF_MAGIC:
            raise ModelFileError(f"{self.path}: not a GGUF file (bad magic bytes); "
                                 f"pyllm reads GGUF models, as llama.cpp does")
        c.pos = 4
        self.version = c.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            raise UnsupportedModelError(
                f"{self.path}: GGUF version {self.version} is not supported "
                f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))}); convert it with a current llama.cpp")
        n_tensors = c.u64("tensor count")
        n_kv = c.u64("metadata count")
        # each entry takes at least 12 bytes; larger counts cannot fit in the file
        if n_tensors * 12 > self.file_size or n_kv * 12 > self.file_size:
            raise ModelFileError(f"{self.path}: corrupt header (claims {n_tensors} tensors and "
                                 f"{n_kv} metadata entries)")

        self.metadata: dict[str, Any] = {}
        self.metadata_spans: dict[str, tuple[int, int]] = {}   # key -> its entry's bytes (to copy it as it is)
        for i in range(n_kv):
            start = c.pos
            key = c.string(f"metadata key #{i}")
            label = printable(key)
            vtype = c.u32(f"type of {label}")
            self.metadata[key] = c.value(vtype, label)
            self.metadata_spans[key] = (start, c.pos)
        for key in self.metadata:
            kind = METADATA_KINDS.get(key)
            if kind is None and key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
                kind = _INT  # bos, eos, pad, fim_...: the tokenizer range-checks them
            if kind is not None:
                self._check_kind(key, kind)

        infos = []
        for i in range(n_tensors):
            name = c.string(f"tensor name #{i}")
            label = printable(name)
            n_dims = c.u32(f"dimensions of {label}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelFileError(f"{self.path}: corrupt tensor info: {label} has {n_dims} dimensions")
            shape = tuple(c.u64(f"shape of {label}") for _ in range(n_dims))
            ttype = c.u32(f"type of {label}")
            offset = c.u64(f"offset of {label}")
            infos.append((name, shape, ttype, offset))

        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise ModelFileError(f"{self.path}: corrupt header: alignment {alignment} is not a power of two")
        self.data_offset = (c.pos + alignment - 1) // alignment * alignment

        self.tensors: dict[str, Tensor] = {}
        for name, shape, ttype, offset in infos:
            self.tensors[name] = self._tensor(name, shape, ttype, offset, alignment)

    def _check_kind(self, key: str, kind) -> Any:
        value = self.metadata[key]
        test, what = kind
        if not test(value) and key in self.overrides:
            raise InvalidArgumentError(f"override {key}={value!r}: it should be {what}")
        if not test(value):
            raise ModelFileError(f"{self.path}: metadata {printable(key)} should be {what} but is "
                                 f"{_describe(value)}; the file is corrupt or was made by a broken converter")
        return value

    def _tensor(self, name, shape, ttype, offset, alignment) -> Tensor:
        label = printable(name)
        try:
            qtype = GGMLQuantizationType(ttype)
        except ValueError:
            raise ModelFileError(f"{self.path}: corrupt tensor info: {label} has unknown type id {ttype}") from None
        if qtype not in GGML_QUANT_SIZES:
            raise UnsupportedModelError(f"{self.path}: tensor {label} has type {qtype.name}, which has no "
                                        f"known block size")
        block, type_size = GGML_QUANT_SIZES[qtype]
        if any(d <= 0 or d > 1 << 40 for d in shape):
            raise ModelFileError(f"{self.path}: corrupt tensor info: {label} has shape {shape}")
        if shape[0] % block:
            raise ModelFileError(f"{self.path}: corrupt tensor info: {label} rows of {shape[0]} elements "
                                 f"are not whole {qtype.name} blocks of {block}")
        n = math.prod(shape)  # exact: a uint64 product of corrupt dims could wrap
        nbytes = n // block * type_size
        if offset % alignment:
            raise ModelFileError(f"{self.path}: corrupt tensor info: {label} offset {offset} is not aligned")
        start = self.data_offset + offset
        if start + nbytes > self.file_size:
            raise ModelFileError(
                f"{self.path}: tensor {label} lies outside the file (bytes {start}..{start + nbytes}, "
                f"file has {self.file_size}); the file is truncated or corrupt: download it again")
        data = np.frombuffer(self._mmap, dtype=np.uint8, count=nbytes, offset=start)
        data.flags.writeable = False
        return Tensor(name, ttype, tuple(int(d) for d in shape), start, nbytes, data)

    # -- typed access ----------------------------------------------------------
    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelFileError(f"{self.path}: required metadata key {key!r} is missing; "
                                 f"the file is incomplete or was made for another program")
        return self.metadata[key]

    def arch_get(self, key: str, default: Any = None) -> Any:
        """The family's `key` ("llama.block_count" for "block_count"), of the
        kind ARCH_KINDS names, or `default` when the file has none."""
        full = f"{self.architecture}.{key}"
        if full not in self.metadata:
            return default
        return self._check_kind(full, ARCH_KINDS[key]) if key in ARCH_KINDS else self.metadata[full]

    def arch_require(self, key: str) -> Any:
        self.require(f"{self.architecture}.{key}")
        return self.arch_get(key)

    def tensor(self, name: str) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: required tensor {name!r} is missing; the file is "
                                 f"incomplete or not a {self.architecture} model")
        return t

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors

    def metadata_entry(self, key: str) -> bytes:
        """The key's whole entry (key, value type, value) as the file holds it (an override's
        as GGUF writes such a value: bool, int32 or int64, float32, string)."""
        if key in self.overrides:
            v = self.overrides[key]
            vtype = (7 if isinstance(v, bool) else KV_STRING if isinstance(v, str) else 6 if isinstance(v, float)
                     else KV_I32 if -2**31 <= v < 2**31 else 11)
            return kv_entry(key, vtype, v)
        start, end = self.metadata_spans[key]
        return bytes(self._mmap[start:end])

    def type_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for t in self.tensors.values():
            hist[t.type_name] = hist.get(t.type_name, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: -kv[1]))

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def close(self) -> None:
        # views into the mapping may outlive us (numpy keeps the buffer alive);
        # closing fails while they exist, and then the mapping is freed with them
        self.tensors = {}
        for part in getattr(self, "_parts", ()):
            part.close()
        try:
            self._mmap.close()
        except (BufferError, AttributeError):
            pass

    def __enter__(self) -> "ModelFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ModelFile({self.path!r}, {self.architecture}, {len(self.tensors)} tensors)"


# -- writing -------------------------------------------------------------------
# A GGUF file is written as: header, metadata entries, tensor infos, padding to
# the alignment, then each tensor's bytes padded to the alignment. Metadata is
# passed as whole entries (ModelFile.metadata_entry copies them as they are).

def kv_entry(key: str, vtype: int, value: int | str) -> bytes:
    """One metadata entry of an integer type (a _SCALAR id) or a string (8)."""
    k = key.encode()
    head = struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype)
    if vtype == _STRING:
        v = value.encode()
        return head + struct.pack("<Q", len(v)) + v
    return head + struct.pack(_SCALAR[vtype][0], value)


KV_U16, KV_U32, KV_I32, KV_STRING = 2, 4, 5, _STRING


def write_gguf(path: str | os.PathLike, kv: list[bytes], tensors: list[tuple[str, tuple[int, ...], int, int]],
               write_data, alignment: int = DEFAULT_ALIGNMENT) -> None:
    """Writes a GGUF file at `path` (to a temporary name, then moved into place): the metadata
    entries `kv`, and `tensors` as (name, shape, type, bytes), whose data write_data(file, i)
    writes for the i-th; a tensor that comes out another size than it said is an error."""
    path = os.fspath(path)
    infos, offset = [], 0
    for name, shape, ttype, nbytes in tensors:
        n = name.encode()
        infos.append(struct.pack("<Q", len(n)) + n + struct.pack("<I", len(shape)) +
                     b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<IQ", int(ttype), offset))
        offset += (nbytes + alignment - 1) // alignment * alignment
    tmp = path + ".part"
    try:
        with open(tmp, "wb") as f:
            f.write(GGUF_MAGIC + struct.pack("<IQQ", 3, len(infos), len(kv)))
            f.write(b"".join(kv) + b"".join(infos))
            f.write(b"\0" * (-f.tell() % alignment))
            for i, (name, _, _, nbytes) in enumerate(tensors):
                start = f.tell()
                write_data(f, i)
                if f.tell() - start != nbytes:
                    raise AssertionError(f"{name}: wrote {f.tell() - start} bytes, planned {nbytes}")
                f.write(b"\0" * (-f.tell() % alignment))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def parse_override(spec: str) -> tuple[str, Any]:
    """'KEY=TYPE:VALUE' (llama.cpp's --override-kv; TYPE int, float, bool or str) -> (KEY, value)."""
    key, eq, rest = spec.partition("=")
    kind, colon, text = rest.partition(":")
    example = "such as llama.context_length=int:8192 or tokenizer.ggml.add_bos_token=bool:false"
    if not eq or not colon or not key.strip():
        raise InvalidArgumentError(f"--override-kv takes KEY=TYPE:VALUE ({example}), not {spec!r}")
    try:
        if kind == "int":
            return key.strip(), int(text)
        if kind == "float":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return key.strip(), value
        if kind == "bool":
            if text.lower() not in ("true", "false"):
                raise ValueError
            return key.strip(), text.lower() == "true"
        if kind == "str":
            return key.strip(), text
    except ValueError:
        raise InvalidArgumentError(f"--override-kv {spec!r}: {text!r} is not {'an' if kind == 'int' else 'a'} "
                                   f"{kind}") from None
    raise InvalidArgumentError(f"--override-kv {spec!r}: the type is int, float, bool or str, not {kind!r}")
