"""What a device must hold to run some ops of a graph, and how an op becomes
a C record (csrc/pyllm.h) pointing into that memory.

Every device (host, sim, CUDA) uses the same two pieces: `memory_plan` says
which buffers, quantized buffers, KV pools, weights and small vectors the
ops of some ranges touch, and how many bytes each takes; `fill_record`
writes one op record from the addresses a device gave them. The placement
planner sizes a device's memory with the same `memory_plan`, so what it
predicts is what the device allocates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..graph import OP_EMBED, OP_MATMUL, OP_POS_SCALE, OP_ROPE, OPF_BY_POS, OPF_V_IN_K, Graph, Op, View
from ..model_file import Tensor
from ..errors import InvalidArgumentError
from .base import KV_BLOCK, KV_TYPES, Range, Shape, kv_row_bytes

ALIGN = 256   # device allocations and staging offsets


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def op_vectors(op: Op) -> list[np.ndarray]:
    return [a for a in (op.vector, op.bias, op.freq_factors) if a is not None]


@dataclass
class MemoryPlan:
    buffers: dict[str, tuple[int, int]] = field(default_factory=dict)    # name -> (rows, floats per row)
    qbuffers: dict[str, tuple[int, int]] = field(default_factory=dict)   # name -> (rows, bytes per row)
    kv: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # layer -> (blocks, block size, bytes per
    #                                                                          position of K, of V (0: none))
    states: dict[str, int] = field(default_factory=dict)                 # recurrent state -> floats
    tensors: dict[str, Tensor] = field(default_factory=dict)             # resident weights, by tensor name
    vectors: dict[int, np.ndarray] = field(default_factory=dict)         # id -> float32 vector
    streamed: dict[int, tuple[Tensor, int]] = field(default_factory=dict)  # op index -> (weight, staging offset)
    staging: int = 0                                                     # bytes of the staging area

    def bytes(self) -> dict[str, int]:
        return {
            "weights": sum(t.nbytes for t in self.tensors.values()),
            "vectors": sum(v.size * 4 for v in self.vectors.values()),
            "kv": sum(b * s * (k + v) for b, s, k, v in self.kv.values()),
            "state": sum(self.states.values()) * 4,
            "buffers": sum(r * w * 4 for r, w in self.buffers.values()) +
                       sum(r * w for r, w in self.qbuffers.values()),
            "staging": self.staging,
        }

    @property
    def total(self) -> int:
        return sum(self.bytes().values())


def memory_plan(graph: Graph, ranges: Sequence[Range], shape: Shape) -> MemoryPlan:
    """What a device running `ranges` of `graph` holds."""
    mp = MemoryPlan()
    for r in ranges:
        offset = 0
        for i in range(r.lo, r.hi):
            op = graph.ops[i]
            for v in (op.x, op.x2, op.y):
                if v is not None and v.name not in mp.buffers:
                    b = graph.buffers[v.name]
                    mp.buffers[v.name] = (shape.n_batch if b.rows == "batch" else shape.n_out_max, b.width)
            if op.xq is not None:
                mp.qbuffers[op.xq.name] = (shape.n_batch, op.xq.row_bytes)
            if op.kv_layer >= 0:
                k_dim, v_dim = graph.kv_layers[op.kv_layer]
                mp.kv[op.kv_layer] = (shape.n_blocks, shape.block_size, kv_row_bytes(shape.k_type, k_dim),
                                      kv_row_bytes(shape.v_type, v_dim))
            if op.state is not None:
                mp.states[op.state] = graph.states[op.state]
            for a in op_vectors(op):
                mp.vectors[id(a)] = a
            if op.weight is not None:
                if r.streamed and op.kind == OP_MATMUL:
                    mp.streamed[i] = (op.weight, offset)
                    offset += _align(op.weight.nbytes)
                else:
                    mp.tensors[op.weight.name] = op.weight
        mp.staging = max(mp.staging, offset)
    # a weight resident for another range is not streamed
    for i, (t, _) in list(mp.streamed.items()):
        if t.name in mp.tensors:
            del mp.streamed[i]
    return mp


def check_kv_formats(graph: Graph, k_type: int, v_type: int) -> None:
    """InvalidArgumentError unless every attention layer's heads split into whole blocks of the
    KV cache's formats (q8_0: multiples of 32 dims)."""
    names = {t: n for n, t in KV_TYPES.items()}
    for op in graph.ops:
        if op.kv_layer < 0:
            continue
        values_type = k_type if op.flags & OPF_V_IN_K else v_type   # MLA reads its values from the keys
        for what, kv_type, dims in (("K", k_type, op.head_dim), ("V", values_type, op.head_dim_v or op.head_dim)):
            if dims % KV_BLOCK[kv_type]:
                raise InvalidArgumentError(f"a {names[kv_type]} {what} cache needs heads of a multiple of "
                                           f"{KV_BLOCK[kv_type]} dims; this model's have {dims}: use f16")


def kv_rotations(graph: Graph, k_type: int, v_type: int) -> tuple[int, int]:
    """(k_rot, v_rot): the Walsh-Hadamard pieces llama.cpp rotates keys (and queries) and values by
    before a quantized cache stores them, spreading a head's outlying dims over its piece (0: none).
    As llama.cpp decides, model-wide: keys when every attention layer's heads have the same size, a
    multiple of 64, in the largest power-of-2 piece (from 64) dividing it; values likewise, in
    pieces of 64. Not for values read from the keys (latent attention)."""
    ops = [op for op in graph.ops if op.kv_layer >= 0]
    if not ops or any(op.flags & OPF_V_IN_K for op in ops):
        return 0, 0
    k_dims, v_dims = {op.head_dim for op in ops}, {op.head_dim_v or op.head_dim for op in ops}
    k_rot = v_rot = 0
    if k_type != KV_TYPES["f16"] and len(k_dims) == 1 and next(iter(k_dims)) % 64 == 0:
        k_rot = 64
        while next(iter(k_dims)) % (2 * k_rot) == 0:
            k_rot *= 2
    if v_type != KV_TYPES["f16"] and len(v_dims) == 1 and next(iter(v_dims)) % 64 == 0:
        v_rot = 64
    return k_rot, v_rot


class Addresses:
    """Where a device put what an op touches (integer addresses)."""

    def weight(self, index: int, t: Tensor) -> int: ...
    def vector(self, a: np.ndarray) -> int: ...
    def view(self, v: View) -> tuple[int, int]: ...     # (address of the first row, stride in floats)
    def qbuffer(self, name: str) -> int: ...
    def kv(self, layer: int) -> tuple[int, int]: ...    # (K pool, V pool: the K pool's when it has none)
    def state(self, name: str) -> int: ...              # a recurrent state (float32)


def fill_record(ffi, rec, index: int, op: Op, addr: Addresses, shape: Shape, kv_rot: tuple[int, int] = (0, 0)) -> None:
    """Fills C record `rec` (a pyllm_op of `ffi`) for graph op `index` of a program bound for `shape`
    (kv_rot: kv_rotations of its graph)."""
    def p(ctype: str, a: Optional[int]):
        return ffi.cast(ctype, a or 0)

    rec.kind, rec.flags, rec.type, rec.layer = op.kind, op.flags, op.type, op.layer
    if op.weight is not None:
        rec.w = p("void *", addr.weight(index, op.weight))
    elif op.vector is not None:
        rec.w = p("void *", addr.vector(op.vector))
    else:
        rec.w = ffi.NULL
    rec.bias = p("float *", None if op.bias is None else addr.vector(op.bias))
    for field_, stride_field, v in (("x", "x_stride", op.x), ("x2", "x2_stride", op.x2), ("y", "y_stride", op.y)):
        if v is None:
            setattr(rec, field_, ffi.NULL)
            setattr(rec, stride_field, 0)
        else:
            a, stride = addr.view(v)
            setattr(rec, field_, p("float *", a))
            setattr(rec, stride_field, stride)
    rec.xq = p("void *", None if op.xq is None else addr.qbuffer(op.xq.name))
    rec.n_in, rec.n_out = op.n_in, op.n_out
    rec.n_head, rec.n_kv_head, rec.head_dim, rec.head_dim_v = op.n_head, op.n_kv_head, op.head_dim, op.head_dim_v
    rec.n_rot, rec.rope_mode, rec.window = op.n_rot, op.rope_mode, op.window
    rec.eps, rec.scale, rec.softcap, rec.alibi = op.eps, op.scale, op.softcap, op.alibi
    rec.freq_base, rec.freq_scale = op.freq_base, op.freq_scale
    rec.freq_factors = p("float *", None if op.freq_factors is None else addr.vector(op.freq_factors))
    rec.rope_sections = (list(op.rope_sections) + [0, 0, 0])[:3]
    rec.media_col = op.media_col
    if op.kv_layer >= 0:
        k, v = addr.kv(op.kv_layer)
        rec.k_cache, rec.v_cache = p("void *", k), p("void *", v)
    else:
        rec.k_cache = rec.v_cache = ffi.NULL
    rec.k_type, rec.v_type = shape.k_type, shape.v_type
    rec.k_rot, rec.v_rot = kv_rot if op.kv_layer >= 0 else (0, 0)
    rec.state = p("float *", None if op.state is None else addr.state(op.state))


def step_record(ffi, shape: Shape):
    """(tokens, pos, table, step): the host arrays a step fills and the
    pyllm_step record that points at them for good (keep the arrays alive
    as long as the record)."""
    tokens = np.zeros(shape.n_batch, np.int32)
    pos = np.zeros(shape.n_batch, np.int32)
    table = np.zeros(shape.n_blocks, np.int32)
    step = ffi.new("pyllm_step *")
    step.tokens = ffi.cast("int32_t *", tokens.ctypes.data)
    step.pos = ffi.cast("int32_t *", pos.ctypes.data)
    step.block_table = ffi.cast("int32_t *", table.ctypes.data)
    step.block_size = shape.block_size
    step.pool_blocks = shape.n_blocks
    return tokens, pos, table, step


def reads_rope_pos(ops: Sequence[Op]) -> bool:
    """Whether these ops read a step's M-RoPE positions (a ROPE op with sections)."""
    return any(op.kind == OP_ROPE and any(op.rope_sections) for op in ops)


def step_needs(ops: Sequence[Op]) -> tuple[bool, bool, bool]:
    """Which of the step's arrays (tokens, positions, block table) these ops
    read: what a device must be sent before it runs them."""
    kinds = {op.kind for op in ops}
    kv = any(op.kv_layer >= 0 for op in ops)   # KV_STORE, ATTENTION: positions through the table
    recurrent = any(op.state is not None for op in ops)   # SSM ops: position 0 resets the state
    embeds = [op for op in ops if op.kind == OP_EMBED]
    by_pos = any(op.flags & OPF_BY_POS for op in embeds)   # learned position embeddings
    return (any(not op.flags & OPF_BY_POS for op in embeds),
            kv or by_pos or recurrent or bool(kinds & {OP_ROPE, OP_POS_SCALE}), kv)
