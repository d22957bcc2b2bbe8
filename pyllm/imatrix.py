"""Importance matrices, as llama.cpp's llama-imatrix computes them: `pyllm imatrix`.

For every weight matrix of the layers (blk.*), the mean over a calibration text's
tokens of the square of each input column, x_i^2: how much each column of the
weight matters to the output. `pyllm quantize --imatrix` (and llama-quantize)
then spends the quantization error where the squares are small.

The text runs as llama-imatrix runs it: tokenized whole (with BOS where the model
adds one), cut into chunks of n_ctx tokens (the rest dropped), each chunk from an
empty context with its first token replaced by BOS where the model adds one. The
forward step carries an OP_SUMSQ before each layer matrix's product (Graph's
imatrix mode) that adds its input rows' squares into a float32 accumulator, row
after row as llama-imatrix does. An expert matrix (MoE) gets statistics per expert,
over the rows routed to it, and a count per expert (how many rows it saw).

The file is llama.cpp's imatrix GGUF: general.type "imatrix", per matrix
`NAME.in_sum2` (F32, the sums, [n_in, n_mat]) and `NAME.counts` (F32, the rows summed,
[1, n_mat]), n_mat 1, or the experts' count for an expert matrix, and imatrix.datasets,
imatrix.chunk_count, imatrix.chunk_size.
"""
from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .errors import InvalidArgumentError, ModelFileError, UnsupportedModelError

log = logging.getLogger("pyllm")

SUMS, COUNTS = ".in_sum2", ".counts"


@dataclass
class Imatrix:
    # weight name -> float32 [n_in]: the sums of x_i^2, or [n_experts, n_in] for an expert matrix
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    # weight name -> the input rows summed (an int), or per expert (an int array)
    counts: dict[str, int | np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunks: int = 0
    chunk_size: int = 0
    architecture: str = ""   # the model family a loaded file names

    def mean_squares(self) -> dict[str, np.ndarray]:
        """weight name -> the mean of x_i^2 per column (per expert: [n_experts, n_in]), llama-quantize's
        importance; 1 for a matrix (an expert) that saw no input."""
        out = {}
        for name, s in self.sums.items():
            n = np.asarray(self.counts.get(name, 0), np.float32)
            if s.ndim == 2:
                n = n.reshape(-1, 1)
            out[name] = np.where(n > 0, s / np.maximum(n, 1), np.float32(1)).astype(np.float32)
        return out

    def add(self, other: "Imatrix") -> "Imatrix":
        """The statistics of both (llama-imatrix --in-file): sums and counts added matrix by
        matrix (expert by expert), chunks added, datasets listed; the chunk sizes must agree."""
        if self.chunk_size and other.chunk_size and self.chunk_size != other.chunk_size:
            raise InvalidArgumentError(f"importance matrices of chunks of {self.chunk_size} and "
                                       f"{other.chunk_size} tokens cannot be combined: make them with one -c")
        out = Imatrix({k: v.copy() for k, v in self.sums.items()}, dict(self.counts),
                      self.datasets + [d for d in other.datasets if d not in self.datasets],
                      self.chunks + other.chunks, self.chunk_size or other.chunk_size,
                      self.architecture or other.architecture)
        for name, s in other.sums.items():
            if name not in out.sums:
                out.sums[name], out.counts[name] = s.copy(), other.counts.get(name, 0)
                continue
            if out.sums[name].shape != s.shape:
                raise InvalidArgumentError(f"{name} has {out.sums[name].shape} statistics in one importance "
                                           f"matrix and {s.shape} in the other: they are of different models")
            out.sums[name] = out.sums[name] + s
            out.counts[name] = out.counts.get(name, 0) + other.counts.get(name, 0)
        return out

    def save(self, path: str | os.PathLike, architecture: str) -> None:
        import gguf
        w = gguf.GGUFWriter(str(path), architecture)
        w.add_type("imatrix")
        w.add_array("imatrix.datasets", list(self.datasets))
        w.add_uint32("imatrix.chunk_count", self.chunks)
        w.add_uint32("imatrix.chunk_size", self.chunk_size)
        for name in sorted(self.sums):
            s = self.sums[name].astype(np.float32)   # GGUF [n_in, n_mat], [1, n_mat]: numpy the other way
            w.add_tensor(name + SUMS, s.reshape(-1, s.shape[-1]))
            w.add_tensor(name + COUNTS, np.asarray(self.counts.get(name, 0), dtype=np.float32).reshape(-1, 1))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Imatrix":
        from .model_file import ModelFile
        if not Path(path).is_file():
            raise InvalidArgumentError(f"no importance matrix at {path}")
        try:
            mf = ModelFile(path)
        except ModelFileError:
            raise ModelFileError(f"{path} is not an imatrix GGUF file (llama-imatrix's older .dat format is not "
                                 f"read: convert it with `llama-imatrix --in-file {path} -o new.gguf`, or make "
                                 f"one with `pyllm imatrix`)") from None
        with mf:
            if mf.get("general.type") != "imatrix":
                raise ModelFileError(f"{path} is not an importance matrix (general.type {mf.get('general.type')!r})")
            out = cls(datasets=[str(d) for d in mf.get("imatrix.datasets", [])],
                      chunks=int(mf.get("imatrix.chunk_count", 0)), chunk_size=int(mf.get("imatrix.chunk_size", 0)),
                      architecture=str(mf.get("general.architecture", "")))
            for tname, t in mf.tensors.items():
                if not tname.endswith(SUMS):
                    continue
                name = tname[:-len(SUMS)]
                c = mf.tensors.get(name + COUNTS)
                if c is None or t.type != 0 or c.type != 0:
                    raise ModelFileError(f"{path}: {name} needs F32 {SUMS} and {COUNTS} tensors")
                n_mat = c.n_elements
                if t.n_elements % n_mat:
                    raise ModelFileError(f"{path}: {name} has {t.n_elements} sums for {n_mat} matrices")
                sums = t.data.view(np.float32).copy()
                counts = c.data.view(np.float32).astype(np.int64)
                out.sums[name] = sums if n_mat == 1 else sums.reshape(n_mat, -1)
                out.counts[name] = int(counts[0]) if n_mat == 1 else counts
        return out


def compute(model: str | os.PathLike, text: str, n_ctx: int = 512, n_threads: int = 2, n_batch: int = 512,
            max_chunks: Optional[int] = None, dataset: str = "",
            on_chunk: Optional[Callable[[int, int], None]] = None, first_chunk: int = 0,
            parse_special: bool = False, snapshot_every: int = 0,
            on_snapshot: Optional[Callable[["Imatrix"], None]] = None) -> Imatrix:
    """The importance matrix of `model` on `text` (see the module's doc); on_chunk(i, n) after each chunk.
    first_chunk: chunks of the text to skip (llama-imatrix's --chunk); parse_special: special-token
    text becomes its token (--parse-special); on_snapshot(the matrix so far) every snapshot_every
    chunks (its --output-frequency)."""
    from .model_file import ModelFile

    if n_ctx < 2:
        raise InvalidArgumentError(f"the chunk size (-c) must be at least 2 tokens, not {n_ctx}")
    if first_chunk < 0:
        raise InvalidArgumentError(f"the first chunk must be 0 or more, not {first_chunk}")
    datasets = [dataset] if dataset else []
    with ModelFile(model) as mf:
        def snapshot(sums: dict, reads: Counter, chunks: int) -> None:
            if on_snapshot is not None and snapshot_every > 0 and chunks % snapshot_every == 0:
                on_snapshot(_matrix(sums, reads, chunks, n_ctx, datasets))
        sums, reads, n_chunks = _collect(mf, Path(model).name, text, n_ctx, n_threads, n_batch, max_chunks, on_chunk,
                                         first_chunk, parse_special, snapshot)
    return _matrix(sums, reads, n_chunks, n_ctx, datasets)


def _matrix(sums: dict[str, np.ndarray], reads: Counter, chunks: int, n_ctx: int, datasets: list[str]) -> Imatrix:
    """The importance matrix of the accumulators after `chunks` chunks (copies: they go on)."""
    counts: dict[str, int | np.ndarray] = {name: n * chunks * n_ctx for name, n in reads.items()}
    out = {}
    for name, acc in sums.items():
        if acc.ndim == 2:   # experts: the count of rows each saw is the accumulator's last column
            out[name], counts[name] = acc[:, :-1].copy(), acc[:, -1].astype(np.int64)
        else:
            out[name] = acc.copy()
    return Imatrix(out, counts, list(datasets), chunks, n_ctx)


def _collect(mf, name: str, text: str, n_ctx: int, n_threads: int, n_batch: int, max_chunks: Optional[int],
             on_chunk, first_chunk: int, parse_special: bool, snapshot) -> tuple[dict, Counter, int]:
    """(sums, products per step of each matrix, chunks run) of the model in mf on text."""
    from .arch import load_architecture
    from .backend.cpu import CpuBackend
    from .defaults import BLOCK_SIZE
    from .graph import OP_SUMSQ, Graph
    from .tokenizer import load_tokenizer

    arch = load_architecture(mf, n_ctx=n_ctx)
    if not arch.causal:
        raise UnsupportedModelError(f"{name} is an embedding model: pyllm imatrix runs generating models")
    tok = load_tokenizer(mf.metadata)
    sums: dict[str, np.ndarray] = {}
    g = Graph(imatrix=sums)
    arch.build(g)
    if g.states:
        raise UnsupportedModelError(f"{arch.name} keeps a recurrent state: pyllm imatrix runs transformer models")
    if not sums:
        raise UnsupportedModelError(f"{name} has no layer matrices to collect")
    name_of = {id(acc): name for name, acc in sums.items()}
    reads = Counter(name_of[id(op.vector)] for op in g.ops
                    if op.kind == OP_SUMSQ and op.x2 is None)   # products of a matrix a step
    ids = tok.encode(text, add_bos=None, parse_special=parse_special)
    n_chunks = len(ids) // n_ctx - first_chunk
    if max_chunks is not None:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks < 1:
        need = f"{first_chunk + 1} chunks of {n_ctx} (one after the {first_chunk} skipped)" if first_chunk else \
            f"one chunk of {n_ctx}"
        raise InvalidArgumentError(f"the text has {len(ids)} tokens: at least {need} is needed (a longer text, "
                                   f"or a smaller -c)")
    n_batch = min(n_batch, n_ctx)
    n_blocks = (n_ctx + BLOCK_SIZE - 1) // BLOCK_SIZE
    backend = CpuBackend(g, n_threads, n_batch, 1, n_blocks, BLOCK_SIZE)
    table = list(range(n_blocks))
    try:
        for c in range(n_chunks):
            chunk = ids[(first_chunk + c) * n_ctx:(first_chunk + c + 1) * n_ctx]
            if tok.add_bos and tok.bos_id is not None:
                chunk[0] = tok.bos_id
            for start in range(0, n_ctx, n_batch):
                backend.forward(chunk[start:start + n_batch], start, table, 1)
            if on_chunk is not None:
                on_chunk(c, n_chunks)
            snapshot(sums, reads, c + 1)
    finally:
        backend.close()
    return sums, reads, n_chunks
