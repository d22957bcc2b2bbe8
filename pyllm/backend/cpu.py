"""The CPU backend: binds a Graph to memory and runs it in the C core.

Activation buffers are allocated once for the largest batch; the op records
(csrc/pyllm.h) are filled once with pointers into them, into the mmapped
weights and into the KV pools. A step then fills the token/position arrays
and the block table and makes one FFI call.
"""
from __future__ import annotations

from typing import Optional, Sequence as Seq

import numpy as np

from .._native import ffi, lib
from ..errors import BackendError, InvalidArgumentError
from ..graph import Graph, Op, View

ALIGN = 64


def aligned_zeros(shape, dtype) -> np.ndarray:
    """Zeroed array whose data starts on a 64-byte boundary (whole cache lines).
    Large zeroed arrays come from calloc/mmap: pages cost RSS only once touched."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    raw = np.zeros(n * dtype.itemsize + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + n * dtype.itemsize].view(dtype).reshape(shape)


def physical_cores() -> int:
    """Cores, not hyperthreads: the default thread count (as llama.cpp)."""
    import os
    try:
        seen = set()
        with open("/proc/cpuinfo") as f:
            phys = core = None
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip():
                    if core is not None:
                        seen.add((phys, core))
                    phys = core = None
        if seen:
            return max(1, min(len(seen), len(os.sched_getaffinity(0))))
    except (OSError, AttributeError):
        pass
    return max(1, (os.cpu_count() or 2) // 2)


class CpuBackend:
    name = "cpu"

    def __init__(self, graph: Graph, n_threads: int, n_batch: int, n_out_max: int,
                 n_blocks: int, block_size: int):
        self.graph = graph
        self.n_batch, self.n_out_max = n_batch, n_out_max
        self.n_blocks, self.block_size = n_blocks, block_size
        self._keep: list = []  # everything the op records point into

        self.buffers = {name: aligned_zeros((n_batch if b.rows == "batch" else n_out_max, b.width), np.float32)
                        for name, b in graph.buffers.items()}
        self.qbuffers = {name: aligned_zeros((n_batch, q.row_bytes), np.uint8)
                         for name, q in graph.qbuffers.items()}
        self.k_cache: dict[int, np.ndarray] = {}
        self.v_cache: dict[int, np.ndarray] = {}
        for layer, (n_kv_head, head_dim) in graph.kv_layers.items():
            shape = (n_blocks, block_size, n_kv_head * head_dim)
            self.k_cache[layer] = aligned_zeros(shape, np.float16)
            self.v_cache[layer] = aligned_zeros(shape, np.float16)

        self.ops = ffi.new("pyllm_op[]", len(graph.ops))
        for i, op in enumerate(graph.ops):
            self._lower(op, self.ops[i])
        bad = lib.pyllm_program_check(self.ops, len(graph.ops))
        if bad:
            raise BackendError(f"the model's op program is invalid: {ffi.string(lib.pyllm_error()).decode()}")

        self.ctx = lib.pyllm_ctx_new(n_threads)
        if self.ctx == ffi.NULL:
            raise BackendError(f"could not start the C core: {ffi.string(lib.pyllm_error()).decode()}")
        self.n_threads = n_threads

        # the step record points at these arrays for good; a step fills them
        self.tokens = np.zeros(n_batch, np.int32)
        self.pos = np.zeros(n_batch, np.int32)
        self.table = np.zeros(n_blocks, np.int32)
        self.step = ffi.new("pyllm_step *")
        self.step.tokens = ffi.cast("int32_t *", self.tokens.ctypes.data)
        self.step.pos = ffi.cast("int32_t *", self.pos.ctypes.data)
        self.step.block_table = ffi.cast("int32_t *", self.table.ctypes.data)
        self.step.block_size = block_size
        self.step.pool_blocks = n_blocks
        self.logits = self.buffers[graph.ops[-1].y.name]
        self.n_vocab = self.logits.shape[1]

    # -- lowering ----------------------------------------------------------------
    def _ptr(self, arr: Optional[np.ndarray], ctype: str):
        if arr is None:
            return ffi.NULL
        self._keep.append(arr)
        return ffi.cast(ctype, ffi.from_buffer(arr))

    def _view(self, v: Optional[View]):
        """(float pointer to the first row of the view, row stride in floats)"""
        if v is None:
            return ffi.NULL, 0
        buf = self.buffers[v.name]
        return ffi.cast("float *", buf.ctypes.data) + v.offset, buf.shape[1]

    def _lower(self, op: Op, rec) -> None:
        rec.kind, rec.flags, rec.type, rec.layer = op.kind, op.flags, op.type, op.layer
        if op.weight is not None:
            rec.w = self._ptr(op.weight.data, "void *")
        elif op.vector is not None:
            rec.w = self._ptr(np.ascontiguousarray(op.vector, dtype=np.float32), "void *")
        rec.bias = self._ptr(None if op.bias is None else np.ascontiguousarray(op.bias, np.float32), "float *")
        rec.x, rec.x_stride = self._view(op.x)
        rec.x2, rec.x2_stride = self._view(op.x2)
        rec.y, rec.y_stride = self._view(op.y)
        if op.xq is not None:
            rec.xq = ffi.cast("void *", self.qbuffers[op.xq.name].ctypes.data)
        rec.n_in, rec.n_out = op.n_in, op.n_out
        rec.n_head, rec.n_kv_head, rec.head_dim = op.n_head, op.n_kv_head, op.head_dim
        rec.n_rot, rec.rope_mode, rec.window = op.n_rot, op.rope_mode, op.window
        rec.eps, rec.scale, rec.softcap = op.eps, op.scale, op.softcap
        rec.freq_base, rec.freq_scale = op.freq_base, op.freq_scale
        rec.freq_factors = self._ptr(None if op.freq_factors is None
                                     else np.ascontiguousarray(op.freq_factors, np.float32), "float *")
        if op.kv_layer >= 0:
            rec.k_cache = ffi.cast("uint16_t *", self.k_cache[op.kv_layer].ctypes.data)
            rec.v_cache = ffi.cast("uint16_t *", self.v_cache[op.kv_layer].ctypes.data)

    # -- running -----------------------------------------------------------------
    def forward(self, tokens: Seq[int], start_pos: int, block_table: Seq[int], n_out: int) -> np.ndarray:
        """Runs one step over `tokens` at positions start_pos.. and returns the
        logits of the last n_out of them: a [n_out, vocab] view, valid until
        the next step."""
        n = len(tokens)
        if not 1 <= n <= self.n_batch:
            raise InvalidArgumentError(f"a step takes 1..{self.n_batch} tokens, not {n}")
        if not 1 <= n_out <= min(n, self.n_out_max):
            raise InvalidArgumentError(f"n_out must be in 1..{min(n, self.n_out_max)}, not {n_out}")
        if len(block_table) > self.n_blocks:
            raise InvalidArgumentError("block table longer than the pool")
        self.tokens[:n] = tokens
        self.pos[:n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.table[:len(block_table)] = block_table
        st = self.step
        st.n_tokens, st.n_out, st.n_table = n, n_out, len(block_table)
        if lib.pyllm_run(self.ctx, self.ops, len(self.graph.ops), st) != 0:
            raise InvalidArgumentError(ffi.string(lib.pyllm_error()).decode())
        return self.logits[:n_out]

    # -- profile -----------------------------------------------------------------
    def profile(self, on: bool) -> None:
        lib.pyllm_profile_enable(self.ctx, int(on))
        lib.pyllm_profile_reset(self.ctx)

    def read_profile(self) -> dict:
        op_ns = ffi.new("double[]", 16)
        busy = ffi.new("double[]", self.n_threads)
        by_type = ffi.new("double[]", 32)
        wall = ffi.new("double *")
        lib.pyllm_profile_read(self.ctx, op_ns, busy, by_type, wall)
        return {"op_ns": list(op_ns)[:lib.OP_KIND_COUNT], "thread_busy_ns": list(busy),
                "matmul_type_ns": list(by_type), "wall_ns": wall[0]}

    @property
    def kv_bytes(self) -> int:
        return sum(a.nbytes for a in self.k_cache.values()) + sum(a.nbytes for a in self.v_cache.values())

    def close(self) -> None:
        if getattr(self, "ctx", None) is not None and self.ctx != ffi.NULL:
            lib.pyllm_ctx_free(self.ctx)
            self.ctx = None

    def __del__(self):
        self.close()
