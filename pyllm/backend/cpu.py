"""The CPU backend: binds a Graph to memory and runs it in the C core.

Activation buffers are allocated once for the largest batch; the op records
(csrc/pyllm.h) are filled once with pointers into them, into the mmapped
weights and into the KV pools. A step then fills the token/position arrays
and the block table and makes one FFI call.

The pieces are the host's `Device` and `Program` (base.py): `HostDevice`
owns the C core's thread pool; `CoreProgram` binds some op ranges of a graph
to host memory and runs a range as one pyllm_run call over a slice of the
op records (cffi pointer arithmetic). `CpuBackend` is one CoreProgram over
the whole graph; a split backend (split.py) uses the host's program for the
ranges placed on the CPU, and the sim device (sim.py) is a CoreProgram
whose memory is its own and whose copies cross a simulated bus.
"""
from __future__ import annotations

import mmap
from typing import Optional, Sequence as Seq

import numpy as np

from .._native import ffi, lib
from ..errors import BackendError, InvalidArgumentError
from ..graph import OP_ATTENTION, OP_EMBED, OP_MATMUL, OP_MATMUL_ID, OPF_NON_CAUSAL, OPF_ROWS4, Graph, View
from ..model_file import Tensor
from ..units import fmt_bytes
from .base import (ACTIVATIONS, Backend, Device, DeviceMemoryError, Program, Range, Shape, StepData, step_media,
                   step_rope_pos)
from .lowering import fill_record, kv_rotations, memory_plan, reads_rope_pos, step_needs, step_record

ALIGN = 64


def aligned_zeros(shape, dtype) -> np.ndarray:
    """Zeroed array whose data starts on a 64-byte boundary (whole cache lines).
    Large zeroed arrays come from calloc/mmap: pages cost RSS only once touched."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    try:
        raw = np.zeros(n * dtype.itemsize + ALIGN, dtype=np.uint8)
    except MemoryError:
        raise DeviceMemoryError(f"out of memory allocating {fmt_bytes(n * dtype.itemsize)}; "
                                "use a smaller context (-c / n_ctx)") from None
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + n * dtype.itemsize].view(dtype).reshape(shape)


def available_memory() -> Optional[int]:
    """Bytes new allocations can still get on this machine (MemAvailable plus
    free swap, from /proc/meminfo), or None where the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            kib = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f if ":" in line)}
        return (kib["MemAvailable"] + kib.get("SwapFree", 0)) * 1024
    except (OSError, KeyError, ValueError):
        return None


def kernel_level() -> str:
    """The SIMD kernels the C core runs on this CPU: "avx512+vnni", "avx2+avxvnni", "avx2", "neon",
    "scalar" (PYLLM_MAX_ISA caps it)."""
    return ffi.string(lib.pyllm_level_name(lib.pyllm_get_level())).decode()


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


def release_mapped(a: np.ndarray) -> None:
    """Drops the whole pages of `a` from this process when `a` views a read-only file mapping
    (ModelFile's mmap): they are read from the file cache again if touched. A copy in memory
    (--no-mmap) and locked pages (--mlock) are left alone."""
    m = a.base
    while isinstance(m, (np.ndarray, memoryview)):
        m = m.base if isinstance(m, np.ndarray) else m.obj
    if not isinstance(m, mmap.mmap) or m.closed:
        return
    start = a.ctypes.data - np.frombuffer(m, np.uint8, count=0).ctypes.data
    lo = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (start + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        try:
            m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except OSError:   # locked pages (--mlock) cannot be dropped: they stay, as asked
            pass


def _reads_whole_rows4(op, rows: int) -> bool:
    """op reads its weight of `rows` rows in a way ROWS4 serves: the whole matrix (MATMUL,
    EMBED), or experts of a multiple of 4 rows, each expert its own groups (MATMUL_ID)"""
    if op.kind == OP_MATMUL_ID:
        return op.n_out % 4 == 0 and op.n_out * op.n_kv_head == rows
    return op.kind in (OP_MATMUL, OP_EMBED) and op.n_out == rows


def rows4_tensors(graph: Graph, ranges: Seq[Range], streamed) -> set[str]:
    """The weights to repack in the ROWS4 layout (csrc/quants.h: each group of 4 rows one stream,
    which a decode step reads up to twice as fast): those that only whole-matrix MATMUL and EMBED
    ops, or MATMUL_ID ops over experts of a multiple of 4 rows (each expert its own groups), of
    the ranges read, not streamed, with at least 4 rows of a length the core takes. Only the
    file's tensors: one made in memory (offset -1: a LoRA's s A) may be rewritten in place
    (set_lora_scale), which a copy would not see."""
    uses: dict[str, list] = {}
    for r in ranges:
        for i in range(r.lo, r.hi):
            op = graph.ops[i]
            if op.weight is not None:
                uses.setdefault(op.weight.name, []).append((i, op))
    out = set()
    for name, ops in uses.items():
        t = ops[0][1].weight
        n_in = t.shape[0]
        rows = t.n_elements // n_in
        if t.offset >= 0 and rows >= 4 and lib.pyllm_rows4_supported(t.type, n_in) and all(
                _reads_whole_rows4(op, rows) and op.n_in == n_in and i not in streamed for i, op in ops):
            out.add(name)
    return out


class HostDevice(Device):
    """The host: its memory, and the C core's thread pool."""
    kind = "cpu"
    is_host = True
    media_rows = True

    def __init__(self, n_threads: int, repack: bool = True):
        self.repack = repack   # weights in the ROWS4 layout where it pays (CoreProgram)
        self.ctx = lib.pyllm_ctx_new(n_threads)
        if self.ctx == ffi.NULL:
            raise BackendError(f"could not start the C core: {ffi.string(lib.pyllm_error()).decode()}")
        self.n_threads = n_threads
        self.name = f"cpu ({n_threads} threads)"

    def bind(self, graph: Graph, ranges: Seq[Range], shape: Shape) -> "CoreProgram":
        return CoreProgram(self, graph, ranges, shape)

    def close(self) -> None:
        if getattr(self, "ctx", None) is not None and self.ctx != ffi.NULL:
            lib.pyllm_ctx_free(self.ctx)
            self.ctx = None

    def __del__(self):
        self.close()


class CoreProgram(Program):
    """Op ranges of a graph bound to host memory, run by the C core.

    Weights are the mapped file (copy_weights = False) or copies the
    program owns (the sim device). Buffers, KV pools and the staging area of
    streamed ranges are allocated here, only for what the ranges' ops touch.
    One record array spans the whole graph (ops outside the ranges stay
    zero); a range runs as pyllm_run over its slice of it."""
    copy_weights = False

    def __init__(self, device: Device, graph: Graph, ranges: Seq[Range], shape: Shape, ctx=None):
        self.device, self.graph, self.ranges, self.shape = device, graph, list(ranges), shape
        self.ctx = ctx if ctx is not None else device.ctx
        mp = self.plan = memory_plan(graph, self.ranges, shape)
        self.memory = mp.bytes()
        self._reserve(mp)
        self.buffers = {name: aligned_zeros((rows, width), np.float32) for name, (rows, width) in mp.buffers.items()}
        self.qbuffers = {name: aligned_zeros((rows, nb), np.uint8) for name, (rows, nb) in mp.qbuffers.items()}
        self.k_cache: dict[int, np.ndarray] = {}
        self.v_cache: dict[int, np.ndarray] = {}
        for layer, (blocks, bs, k_bytes, v_bytes) in mp.kv.items():
            self.k_cache[layer] = aligned_zeros((blocks, bs, k_bytes), np.uint8)
            self.v_cache[layer] = aligned_zeros((blocks, bs, v_bytes), np.uint8)
        self.states = {name: aligned_zeros((floats,), np.float32) for name, floats in mp.states.items()}
        self.rows4 = rows4_tensors(graph, self.ranges, mp.streamed) if getattr(device, "repack", False) else set()
        self.weights = {name: self._place_weight(t) for name, t in mp.tensors.items()}
        self._repack([mp.tensors[name] for name in sorted(self.rows4)])
        if self.rows4:   # the copies, beside the mapped file's weights
            self.memory["repacked"] = sum(mp.tensors[name].nbytes for name in self.rows4)
        self.vectors = {key: self._place_vector(a) for key, a in mp.vectors.items()}
        self.staging = aligned_zeros((max(mp.staging, 1),), np.uint8)

        self.recs = ffi.new("pyllm_op[]", len(graph.ops))
        kv_rot = kv_rotations(graph, shape.k_type, shape.v_type)
        for r in self.ranges:
            for i in range(r.lo, r.hi):
                fill_record(ffi, self.recs[i], i, graph.ops[i], self, shape, kv_rot)
                if graph.ops[i].weight is not None and graph.ops[i].weight.name in self.rows4:
                    self.recs[i].flags |= OPF_ROWS4
            if lib.pyllm_program_check(self.recs + r.lo, r.hi - r.lo):
                raise BackendError(f"the model's op program is invalid: {ffi.string(lib.pyllm_error()).decode()}")
        self.needs = [step_needs(graph.ops[r.lo:r.hi]) for r in self.ranges]
        self.mrope = [reads_rope_pos(graph.ops[r.lo:r.hi]) for r in self.ranges]

        # the step record points at these arrays for good; a step fills them
        self.tokens, self.pos, self.table, self.step = step_record(ffi, shape)
        self._sent: tuple[int, set] = (-1, set())

    # -- memory (the sim device overrides these) ---------------------------------------------
    def _reserve(self, mp) -> None:
        """Checks that what the host allocates (the KV pools and buffers; the
        weights stay in the mapped file) fits the memory the machine has left,
        so that a context too long for it fails here, with a remedy, rather
        than in the allocator or, pages being touched lazily, in the OOM killer."""
        need = mp.bytes()
        total = need["kv"] + need["state"] + need["buffers"] + need["staging"]
        free = available_memory()
        if free is None or total <= free:
            return
        if not mp.kv:
            raise DeviceMemoryError(f"the activation buffers need {fmt_bytes(total)} but this machine has "
                                    f"{fmt_bytes(free)} of memory available; use a smaller batch (n_batch)")
        block = self.shape.block_size
        positions = self.shape.n_blocks * block
        per_position = need["kv"] // positions
        fits = max(0, (free - need["buffers"] - need["staging"] - need["state"]) // per_position) // block * block
        raise DeviceMemoryError(f"a context of {positions} tokens needs {fmt_bytes(need['kv'])} for its KV cache "
                                f"({fmt_bytes(per_position)} per token) but this machine has {fmt_bytes(free)} of "
                                f"memory available; use a smaller context (-c / n_ctx {fits} or less)")

    def _place_weight(self, t: Tensor) -> np.ndarray:
        return aligned_zeros((t.nbytes,), np.uint8) if t.name in self.rows4 else t.data   # _repack fills it

    def _repack(self, tensors: list[Tensor]) -> None:
        """Writes these weights in the ROWS4 layout, on the device's threads (the C core lets go of
        the GIL), and drops the file's pages they came from out of this process (their copy is
        what runs; the pages stay in the system's file cache)."""
        def one(t: Tensor) -> None:
            n_in = t.shape[0]
            if lib.pyllm_repack_rows4(t.type, ffi.from_buffer(t.data), ffi.from_buffer(self.weights[t.name]),
                                      t.n_elements // n_in, n_in) != 0:
                raise BackendError(f"could not repack {t.name} ({t.type_name})")
            release_mapped(t.data)
        if len(tensors) > 1 and self.device.n_threads > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(self.device.n_threads) as pool:
                list(pool.map(one, tensors))
        else:
            for t in tensors:
                one(t)

    def _place_vector(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.float32)

    # -- addresses for fill_record -------------------------------------------------------------
    def weight(self, index: int, t: Tensor) -> int:
        if index in self.plan.streamed:
            return self.staging.ctypes.data + self.plan.streamed[index][1]
        return self.weights[t.name].ctypes.data

    def vector(self, a: np.ndarray) -> int:
        return self.vectors[id(a)].ctypes.data

    def view(self, v: View) -> tuple[int, int]:
        buf = self.buffers[v.name]
        return buf.ctypes.data + 4 * v.offset, buf.shape[1]

    def qbuffer(self, name: str) -> int:
        return self.qbuffers[name].ctypes.data

    def kv(self, layer: int) -> tuple[int, int]:
        k, v = self.k_cache[layer], self.v_cache[layer]
        return k.ctypes.data, (v if v.size else k).ctypes.data

    def state(self, name: str) -> int:
        return self.states[name].ctypes.data

    # -- running -----------------------------------------------------------------------------------
    def _send(self, what: str, src: np.ndarray, dst: np.ndarray) -> None:
        """Puts one of the step's arrays where the ops read it (a device counts it)."""
        if src is not dst:
            dst[:len(src)] = src

    def load_step(self, index: int, step: StepData) -> None:
        """Sends what ranges[index] reads of the step and has not been sent this step."""
        if self._sent[0] != step.serial or step.serial == 0:
            self._sent = (step.serial, set())
        sent = self._sent[1]
        for what, need, src, dst in zip(("tokens", "pos", "table"), self.needs[index],
                                        (step.tokens, step.pos, step.table), (self.tokens, self.pos, self.table)):
            if what in sent:
                continue
            if need:
                self._send(what, src, dst)
                sent.add(what)
            elif what not in sent:
                dst[:len(src)] = 0  # not read by these ops; valid values for the core's step check
        rope = step.rope_pos if self.mrope[index] else None
        if rope is not None and "rope_pos" not in sent:
            self._send("rope_pos", rope, rope)
            sent.add("rope_pos")
        st = self.step
        st.n_tokens, st.n_out, st.n_table = step.n_tokens, step.n_out, len(step.table)
        st.rope_pos = ffi.NULL if rope is None else ffi.from_buffer("int32_t[]", rope)
        # a range that reads no positions has no attention: zeros stand in for them (not consecutive)
        set_step_media(st, step.media, step.bidirectional and "pos" in sent)

    def stream_weights(self, index: int) -> None:
        """Copies the weights of a streamed range into the staging area."""
        r = self.ranges[index]
        for i in range(r.lo, r.hi):
            if i in self.plan.streamed:
                t, off = self.plan.streamed[i]
                self.staging[off:off + t.nbytes] = t.data.reshape(-1)

    def run(self, index: int, step: StepData) -> None:
        r = self.ranges[index]
        self.load_step(index, step)
        if r.streamed:
            self.stream_weights(index)
        try:
            if lib.pyllm_run(self.ctx, self.recs + r.lo, r.hi - r.lo, self.step) != 0:
                raise InvalidArgumentError(ffi.string(lib.pyllm_error()).decode())
        finally:
            set_step_media(self.step, None, False)   # the record outlives this step's rows
            self.step.rope_pos = ffi.NULL

    def _rows(self, name: str) -> np.ndarray:
        return self.buffers[name] if name in self.buffers else self.qbuffers[name]

    def has_buffer(self, name: str) -> bool:
        return name in self.buffers or name in self.qbuffers

    def read(self, name: str, row0: int, n_rows: int, kind: str = ACTIVATIONS) -> np.ndarray:
        return self._rows(name)[row0:row0 + n_rows]

    def write(self, name: str, row0: int, data: np.ndarray, kind: str = ACTIVATIONS) -> None:
        self._rows(name)[row0:row0 + len(data)] = data


def set_step_media(st, media: Optional[np.ndarray], bidirectional: bool) -> None:
    """Points a (reused) step record at this step's media rows, or at none, and sets its
    attention's direction. `media` (step_media's) must stay alive while the step runs."""
    if media is None:
        st.media, st.n_media, st.media_width = ffi.NULL, 0, 0
    else:
        st.media = ffi.cast("const float *", media.ctypes.data)
        st.n_media, st.media_width = media.shape
    st.bidirectional = int(bool(bidirectional))


def check_step_args(n: int, n_out: int, n_table: int, n_batch: int, n_out_max: int, n_blocks: int) -> None:
    if not 1 <= n <= n_batch:
        raise InvalidArgumentError(f"a step takes 1..{n_batch} tokens, not {n}")
    if not 1 <= n_out <= min(n, n_out_max):
        raise InvalidArgumentError(f"n_out must be in 1..{min(n, n_out_max)}, not {n_out}")
    if n_table > n_blocks:
        raise InvalidArgumentError("block table longer than the pool")


class CpuBackend(Backend):
    """The whole program on the host, in the C core."""
    name = "cpu"

    def __init__(self, graph: Graph, n_threads: int, n_batch: int, n_out_max: int,
                 n_blocks: int, block_size: int, device: Optional[HostDevice] = None, k_type: int = 1,
                 v_type: int = 1):
        self.graph = graph
        self.n_batch, self.n_out_max = n_batch, n_out_max
        self.n_blocks, self.block_size = n_blocks, block_size
        self._own_device = device is None
        self.device = device if device is not None else HostDevice(n_threads)
        self.program = self.device.bind(graph, [Range(0, len(graph.ops))], Shape(n_batch, n_out_max, n_blocks,
                                                                                   block_size, k_type, v_type))
        p = self.program
        # what tools and tests look at
        self.buffers, self.qbuffers, self.k_cache, self.v_cache = p.buffers, p.qbuffers, p.k_cache, p.v_cache
        self.ops, self.step = p.recs, p.step
        self.tokens, self.pos, self.table = p.tokens, p.pos, p.table
        self.ctx, self.n_threads = self.device.ctx, self.device.n_threads
        self.logits = self.buffers[graph.ops[-1].y.name]
        self.n_vocab = self.logits.shape[1]
        # a step may hold rows of several sequences (forward_batch) unless a layer's state is one
        # sequence's or every row sees every other (an encoder)
        self.batches_sequences = not any(op.state is not None or op.flags & OPF_NON_CAUSAL and op.kind == OP_ATTENTION
                                         for op in graph.ops)

    # -- running -----------------------------------------------------------------
    def forward(self, tokens: Seq[int], start_pos: int, block_table: Seq[int], n_out: int,
                media: Optional[np.ndarray] = None, bidirectional: bool = False,
                rope_pos: Optional[np.ndarray] = None) -> np.ndarray:
        """Runs one step over `tokens` at positions start_pos.. and returns the
        logits of the last n_out of them: a [n_out, vocab] view, valid until
        the next step. Token ids -1 - j: row j of `media` as their embedding;
        bidirectional: causal attention off for this step; rope_pos: M-RoPE
        positions (Backend.forward)."""
        n = len(tokens)
        check_step_args(n, n_out, len(block_table), self.n_batch, self.n_out_max, self.n_blocks)
        media = step_media(media)
        self.tokens[:n] = tokens
        self.pos[:n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.table[:len(block_table)] = block_table
        st = self.step
        st.n_tokens, st.n_out, st.n_table = n, n_out, len(block_table)
        set_step_media(st, media, bidirectional)
        rope = step_rope_pos(rope_pos, n)
        st.rope_pos = ffi.NULL if rope is None else ffi.from_buffer("int32_t[]", rope)
        try:
            if lib.pyllm_run(self.ctx, self.ops, len(self.graph.ops), st) != 0:
                raise InvalidArgumentError(ffi.string(lib.pyllm_error()).decode())
        finally:
            set_step_media(st, None, False)   # the record outlives this step's rows
            st.rope_pos = ffi.NULL
        return self.logits[:n_out]

    def forward_batch(self, steps: Seq[tuple[Seq[int], int, Seq[int]]], n_out: Optional[int] = None) -> np.ndarray:
        """Runs several sequences' steps as one: each (tokens, start_pos,
        block_table) appends tokens at positions start_pos.. of its own
        sequence. Returns the logits of the last n_out rows (None: every row),
        the sequences' rows in order: a [n_out, vocab] view, valid until the
        next step. An attention model's decode steps (and speculative ones)
        batched this way read each weight once for all sequences; a prompt
        chunk put first rides along, its last row's logits among the n_out."""
        n = sum(len(tokens) for tokens, _, _ in steps)
        n_table = sum(len(table) for _, _, table in steps)
        n_out = n if n_out is None else n_out
        check_step_args(n, n_out, 1, self.n_batch, self.n_out_max, self.n_blocks)
        tokens, pos = np.empty(n, np.int32), np.empty(n, np.int32)
        row_table, table = np.empty(n, np.int32), np.empty(max(n_table, 1), np.int32)
        row = first = 0
        for toks, start, blocks in steps:
            k = len(toks)
            tokens[row:row + k] = toks
            pos[row:row + k] = np.arange(start, start + k, dtype=np.int32)
            row_table[row:row + k] = first
            table[first:first + len(blocks)] = blocks
            row, first = row + k, first + len(blocks)
        st = ffi.new("pyllm_step *", {
            "n_tokens": n, "n_out": n_out, "tokens": ffi.from_buffer("int32_t[]", tokens),
            "pos": ffi.from_buffer("int32_t[]", pos), "block_table": ffi.from_buffer("int32_t[]", table),
            "n_table": n_table, "block_size": self.step.block_size, "pool_blocks": self.step.pool_blocks,
            "row_table": ffi.from_buffer("int32_t[]", row_table)})
        if lib.pyllm_run(self.ctx, self.ops, len(self.graph.ops), st) != 0:
            raise InvalidArgumentError(ffi.string(lib.pyllm_error()).decode())
        return self.logits[:n_out]

    # -- profile -----------------------------------------------------------------
    def profile(self, on: bool) -> None:
        lib.pyllm_profile_enable(self.ctx, int(on))
        lib.pyllm_profile_reset(self.ctx)

    def read_profile(self) -> dict:
        return read_core_profile(self.ctx, self.n_threads)

    @property
    def kv_bytes(self) -> int:
        return sum(a.nbytes for a in self.k_cache.values()) + sum(a.nbytes for a in self.v_cache.values())

    def close(self) -> None:
        if self._own_device and getattr(self, "device", None) is not None:
            self.device.close()
        self.ctx = None

    def __del__(self):
        self.close()


def read_core_profile(ctx, n_threads: int) -> dict:
    op_ns = ffi.new("double[]", lib.OP_KIND_COUNT)
    busy = ffi.new("double[]", n_threads)
    by_type = ffi.new("double[]", lib.PROFILE_TYPE_COUNT)
    wall = ffi.new("double *")
    lib.pyllm_profile_read(ctx, op_ns, busy, by_type, wall)
    return {"op_ns": list(op_ns)[:lib.OP_KIND_COUNT], "thread_busy_ns": list(busy),
            "matmul_type_ns": list(by_type), "wall_ns": wall[0]}
