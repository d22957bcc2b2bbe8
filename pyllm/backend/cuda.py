"""The CUDA device: csrc/cuda/ built into its own library (`make cuda` ->
build/libpyllm_cuda.so), loaded with cffi in ABI mode only when a GPU is
present (libcuda.so.1 loads, cuInit succeeds and a device is found). The
normal build and the tests never need it.

The library runs the same op records as the C core (csrc/pyllm.h), with
device pointers in them: `CudaProgram` allocates a device's share of a graph
on the GPU (weights uploaded once from the mapped file, activation buffers,
quantized buffers, KV pools, a staging area for streamed weights), fills the
records with lowering.fill_record, and runs a range of them per step with
one call. Copies in and out of buffers are counted on the device's Bus,
like the sim device's.

The same sources compiled by g++ against a CUDA emulator (`make cuda-emu` ->
build/libpyllm_cuda_emu.so, csrc/cuda/emu/) run the kernels on the CPU, for
tests: `CudaDevice(0, library=emulator_path())`. It never needs a driver,
and device selection never picks it by itself: only a program that names
it, or $PYLLM_CUDA_LIB pointing at it together with device=cuda and an
explicit number of GPU layers.
"""
from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..errors import BackendError, InvalidArgumentError
from ..graph import OP_NAMES, OP_SAVE_ROWS, OP_SUMSQ, Graph, View
from ..model_file import Tensor
from .base import (ACTIVATIONS, CONTROL, D2H, H2D, WEIGHTS, Bus, Device, DeviceMemoryError, Program, Range, Shape,
                   StepData)
from .lowering import fill_record, memory_plan, reads_rope_pos, step_needs, step_record

REPO = Path(__file__).resolve().parent.parent.parent
LIB_NAME = "libpyllm_cuda.so"
EMU_LIB_NAME = "libpyllm_cuda_emu.so"
EMU_ORDERS = {"forward": 0, "reverse": 1, "shuffle": 2}   # pyllm_cuda_emu.h


# -- is there a GPU? ---------------------------------------------------------------------------------

def library_path() -> Optional[Path]:
    """$PYLLM_CUDA_LIB, else build/libpyllm_cuda.so in the checkout, else beside the package."""
    env = os.environ.get("PYLLM_CUDA_LIB")
    candidates = [Path(env)] if env else [REPO / "build" / LIB_NAME, Path(__file__).resolve().parent.parent / LIB_NAME]
    return next((p for p in candidates if p.is_file()), None)


def driver_devices() -> tuple[int, str]:
    """(CUDA devices the driver sees, why none) without loading our library."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no NVIDIA driver (libcuda.so.1 cannot be loaded)"
    try:
        rc = cu.cuInit(0)
        if rc != 0:
            return 0, f"the NVIDIA driver did not start (cuInit error {rc})"
        n = ctypes.c_int(0)
        rc = cu.cuDeviceGetCount(ctypes.byref(n))
        if rc != 0:
            return 0, f"the NVIDIA driver cannot count devices (error {rc})"
        if n.value == 0:
            return 0, "no CUDA device found"
        return n.value, ""
    except AttributeError:
        return 0, "libcuda.so.1 is not a CUDA driver library"


def emulator_path() -> Optional[Path]:
    """build/libpyllm_cuda_emu.so (`make cuda-emu`), if built."""
    p = REPO / "build" / EMU_LIB_NAME
    return p if p.is_file() else None


_emulator_checked: dict = {}


def is_emulator(path: Optional[Path]) -> bool:
    """Is the library at `path` the CUDA emulator (it exports the emulator's controls)?"""
    if path is None:
        return False
    key = str(Path(path).resolve())
    if key not in _emulator_checked:
        try:
            _emulator_checked[key] = hasattr(ctypes.CDLL(key), "pyllm_cuda_emu_set_order")
        except OSError:
            _emulator_checked[key] = False
    return _emulator_checked[key]


def available() -> tuple[bool, str]:
    """(a CUDA GPU can be used, what was found). $PYLLM_CUDA_LIB naming the emulator counts,
    without a driver; select.py still never picks it unless device=cuda is asked for."""
    lib = library_path()
    if os.environ.get("PYLLM_CUDA_LIB") and is_emulator(lib):   # only the variable can name it
        return True, f"the CUDA emulator ({lib}, from $PYLLM_CUDA_LIB): no GPU, kernels run on the CPU"
    n, why = driver_devices()
    if n == 0:
        return False, why
    lib = library_path()
    if lib is None:
        return False, f"{n} CUDA device(s) found, but {LIB_NAME} is not built (run `make cuda`)"
    return True, f"{n} CUDA device(s); {lib}"


# -- the library -------------------------------------------------------------------------------------

def _declarations(path: Path) -> str:
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))


def cdef_text(emulator: bool = False) -> str:
    """The ABI as cffi reads it: csrc/pyllm.h (op records) + csrc/cuda/pyllm_cuda.h
    (+ csrc/cuda/emu/pyllm_cuda_emu.h, the emulator's controls)."""
    csrc = REPO / "csrc"
    if not (csrc / "cuda" / "pyllm_cuda.h").is_file():
        raise BackendError(f"the CUDA backend's headers are not at {csrc} (run pyllm from its checkout)")
    text = _declarations(csrc / "pyllm.h") + "\n" + _declarations(csrc / "cuda" / "pyllm_cuda.h")
    if emulator:
        text += "\n" + _declarations(csrc / "cuda" / "emu" / "pyllm_cuda_emu.h")
    return text


_loaded: dict = {}


def load(path: Optional[Path] = None):
    """(ffi, lib) of libpyllm_cuda.so, or of the library at `path` (the emulator's, say),
    each loaded once (cffi ABI mode)."""
    path = path or library_path()
    if path is None:
        raise BackendError(f"{LIB_NAME} is not built (run `make cuda` where nvcc exists)")
    key = str(Path(path).resolve())
    if key not in _loaded:
        from cffi import FFI
        ffi = FFI()
        ffi.cdef(cdef_text(emulator=is_emulator(path)))
        try:
            lib = ffi.dlopen(key)
        except OSError as e:
            raise BackendError(f"cannot load {path}: {e}") from None
        _loaded[key] = (ffi, lib)
    return _loaded[key]


def _error(lib, ffi) -> str:
    return ffi.string(lib.pyllm_cuda_error()).decode(errors="replace")


def device_info(index: int = 0, library: Optional[Path] = None) -> dict:
    ffi, lib = load(library)
    name = ffi.new("char[]", 256)
    ints = [ffi.new("int *") for _ in range(6)]
    total = ffi.new("size_t *")
    if lib.pyllm_cuda_device_info(index, name, 256, ints[0], ints[1], ints[2], total, ints[3], ints[4], ints[5]):
        raise BackendError(f"CUDA device {index}: {_error(lib, ffi)}")
    return {"name": ffi.string(name).decode(), "cc": (ints[0][0], ints[1][0]), "sm_count": ints[2][0],
            "total_bytes": total[0], "clock_khz": ints[3][0], "mem_clock_khz": ints[4][0], "mem_bus_bits": ints[5][0]}


# -- the device ----------------------------------------------------------------------------------------

class CudaDevice(Device):
    kind = "cuda"

    def __init__(self, index: int = 0, library: Optional[Path] = None):
        """Device `index` of libpyllm_cuda.so, or of the library at `library` (the emulator's)."""
        library = library or library_path()
        self.ffi, self.lib = load(library)
        self.emulated = is_emulator(library)
        self.index = index
        self.info = device_info(index, library)
        self.ctx = self.lib.pyllm_cuda_new(index)
        if self.ctx == self.ffi.NULL:
            raise BackendError(f"cannot start CUDA device {index}: {_error(self.lib, self.ffi)}")
        self.name = f"cuda:{index} {self.info['name']}"
        self.bus = Bus()
        if os.environ.get("PYLLM_CUDA_GRAPHS", "1") == "0":   # to time or debug launches one by one
            self.set_graphs(False)

    def set_graphs(self, on: bool) -> None:
        """Small steps replay their launches as CUDA graphs (the default), or launch one by one."""
        if self.lib.pyllm_cuda_set_graphs(self.ctx, int(on)):
            raise BackendError(_error(self.lib, self.ffi))

    def graph_counts(self) -> tuple[int, int]:
        """(graphs captured, graph replays) so far"""
        a, b = self.ffi.new("uint64_t *"), self.ffi.new("uint64_t *")
        self.lib.pyllm_cuda_graph_counts(self.ctx, a, b)
        return int(a[0]), int(b[0])

    def set_order(self, order: str, seed: int = 0) -> None:
        """The emulator's thread order between barriers: forward, reverse or shuffle (seeded)."""
        if not self.emulated:
            raise InvalidArgumentError("only the CUDA emulator has a thread order")
        if order not in EMU_ORDERS:
            raise InvalidArgumentError(f"order must be one of {', '.join(EMU_ORDERS)}, not {order!r}")
        self.lib.pyllm_cuda_emu_set_order(EMU_ORDERS[order], seed)

    def free_memory(self) -> int:
        free, total = self.ffi.new("size_t *"), self.ffi.new("size_t *")
        if self.lib.pyllm_cuda_mem_info(self.ctx, free, total):
            raise BackendError(_error(self.lib, self.ffi))
        return int(free[0])

    def lib_bus_bytes(self) -> tuple[int, int]:
        """(host->device, device->host) bytes the library copied so far: a cross-check of the Bus"""
        a, b = self.ffi.new("uint64_t *"), self.ffi.new("uint64_t *")
        self.lib.pyllm_cuda_bus_bytes(self.ctx, a, b)
        return int(a[0]), int(b[0])

    def measure(self) -> dict:
        """Copy rates (pageable host memory, as pyllm copies numpy arrays), latency, device memory
        rate, and of these kernels (timed programs): the matmul rate, the launch cost, the rate a
        decode matmul reads weights at (decode_bw: an H200's reached a third of its copy rate)
        and the time of a small decode matmul (op_s: latency, not bytes, bounds it)."""
        from .placement import calibration_graph, time_program, weight_bytes
        from ..graph import Graph
        lib, ctx = self.lib, self.ctx
        mb64 = 64 << 20
        figs = {"h2d": lib.pyllm_cuda_copy_rate(ctx, 2, mb64, 5), "d2h": lib.pyllm_cuda_copy_rate(ctx, 3, mb64, 5),
                "h2d_pinned": lib.pyllm_cuda_copy_rate(ctx, 0, mb64, 5),
                "d2h_pinned": lib.pyllm_cuda_copy_rate(ctx, 1, mb64, 5),
                "mem_bw": lib.pyllm_cuda_copy_rate(ctx, 4, 256 << 20, 5),
                "latency_s": lib.pyllm_cuda_copy_latency(ctx, 20)}
        n = 512
        t = time_program(self, calibration_graph(4096, 4096), n)
        figs["flops"] = 2.0 * 4096 * 4096 * n / t
        g = Graph()
        x = g.buffer("x", 64)
        for _ in range(200):
            g.scale(x, 1.0)
        figs["launch_s"] = time_program(self, g, 1, reps=5) / 200
        try:
            big = calibration_graph(4096, 14336, 4, "Q4_K")   # 132 MB: more than any GPU's L2 cache
            figs["decode_bw"] = weight_bytes(big) / time_program(self, big, 1, reps=5)
            small = calibration_graph(576, 1536, 100)   # a small model's FFN matrix, its input quantized once
            figs["op_s"] = time_program(self, small, 1, reps=5) / len(small.ops)
        except BackendError:   # no room for the probes (180 MB): the H200's ratios to the figures above
            figs["decode_bw"], figs["op_s"] = figs["mem_bw"] / 3, 2 * figs["launch_s"]
        return figs

    def planning_figures(self):
        from .placement import CUDA_RESERVE, DeviceSpec, LinkSpec, cached
        if self.emulated:   # its speed says nothing about a GPU's: a modest GPU's nominal figures
            spec = DeviceSpec(self.name, 300e9, 10e12, 5e-6, memory=self.free_memory(), reserve=0)
            link = LinkSpec(16e9, 16e9, 1e-5)
            self.bus.h2d_bytes_per_s, self.bus.d2h_bytes_per_s, self.bus.latency_s = link.h2d, link.d2h, link.latency_s
            return spec, link, {"gpu": "nominal (the CUDA emulator)", "link": "nominal (the CUDA emulator)"}
        key = f"cuda:{self.info['name']}:{self.info['total_bytes']}:{self.info['cc']}:decode"   # figures of 2026-12
        figs, how = cached(key, self.measure)
        self.bus.h2d_bytes_per_s, self.bus.d2h_bytes_per_s, self.bus.latency_s = \
            figs["h2d"], figs["d2h"], figs["latency_s"]
        free = self.free_memory()
        spec = DeviceSpec(self.name, figs["decode_bw"], figs["flops"], figs["op_s"], memory=free,
                          reserve=min(CUDA_RESERVE, free // 20))
        link = LinkSpec(figs["h2d"], figs["d2h"], figs["latency_s"])
        return spec, link, {"gpu": f"{how} (memory free: measured now)", "link": how}

    f16_kv_only = True   # its attention kernels read f16 KV pools (CudaProgram refuses others)
    media_rows = False   # a step's media rows stay on the host: the token embedding must too

    def bind(self, graph: Graph, ranges: Sequence[Range], shape: Shape) -> "CudaProgram":
        return CudaProgram(self, graph, ranges, shape)

    def close(self) -> None:
        if getattr(self, "ctx", None) is not None and self.ctx != self.ffi.NULL:
            self.lib.pyllm_cuda_free(self.ctx)
            self.ctx = None

    def __del__(self):
        self.close()


CPU_ONLY_OPS = (OP_SUMSQ, OP_SAVE_ROWS)   # they write host arrays


class CudaProgram(Program):
    """A device's share of a graph in GPU memory; ranges run by pyllm_cuda_run."""

    def __init__(self, device: CudaDevice, graph: Graph, ranges: Sequence[Range], shape: Shape):
        self.device, self.graph, self.ranges, self.shape = device, graph, list(ranges), shape
        ffi, lib, ctx = device.ffi, device.lib, device.ctx
        self.ffi, self.lib, self.ctx = ffi, lib, ctx
        if (shape.k_type, shape.v_type) != (1, 1) and any(graph.ops[i].kv_layer >= 0 for r in self.ranges
                                                          for i in range(r.lo, r.hi)):
            raise BackendError("the GPU keeps f16 KV caches only: use the f16 cache types, or no GPU layers (-ngl 0)")
        cpu_only = {OP_NAMES[graph.ops[i].kind] for r in self.ranges for i in range(r.lo, r.hi)
                    if graph.ops[i].kind in CPU_ONLY_OPS}
        if cpu_only:   # an importance matrix's sums, hidden states kept: host arrays the GPU does not write
            raise BackendError(f"the GPU has no {', '.join(sorted(cpu_only))} kernel (importance matrices and "
                               f"control vector generation run on the CPU): use no GPU layers (-ngl 0)")
        mp = self.plan = memory_plan(graph, self.ranges, shape)
        self.memory = mp.bytes()
        self._allocs: list[int] = []
        total = sum(self.memory.values())
        free = device.free_memory()
        if total > free:
            parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in self.memory.items() if v)
            raise DeviceMemoryError(f"{device.name}: this part of the model needs {total / 2**20:.1f} MiB ({parts}) "
                                    f"but {free / 2**20:.1f} MiB is free")
        try:
            self.buffers = {name: (self._alloc(rows * width * 4, zero=True), width * 4, width)
                            for name, (rows, width) in mp.buffers.items()}
            self.qbuffers = {name: (self._alloc(rows * nb, zero=True), nb, nb) for name, (rows, nb) in mp.qbuffers.items()}
            self.kv_pools = {}
            for layer, (b, s, k_bytes, v_bytes) in mp.kv.items():
                k = self._alloc(b * s * k_bytes, zero=True)
                self.kv_pools[layer] = (k, self._alloc(b * s * v_bytes, zero=True) if v_bytes else k)
            self.states = {name: self._alloc(floats * 4, zero=True) for name, floats in mp.states.items()}
            self.weights = {}
            for name, t in mp.tensors.items():
                self.weights[name] = self._alloc(t.nbytes)
                self._upload(self.weights[name], t.data)
            self.vectors = {}
            for key, a in mp.vectors.items():
                a32 = np.ascontiguousarray(a, dtype=np.float32)
                self.vectors[key] = self._alloc(a32.nbytes)
                self._upload(self.vectors[key], a32)
            self.staging = self._alloc(max(mp.staging, 1))
            self.recs = ffi.new("pyllm_op[]", len(graph.ops))
            for r in self.ranges:
                for i in range(r.lo, r.hi):
                    fill_record(ffi, self.recs[i], i, graph.ops[i], self, shape)
                if lib.pyllm_cuda_check(self.recs + r.lo, r.hi - r.lo):
                    raise BackendError(f"the CUDA backend cannot run this program: {_error(lib, ffi)}")
        except BaseException:
            self.close()
            raise
        self.needs = [step_needs(graph.ops[r.lo:r.hi]) for r in self.ranges]
        self.mrope = [reads_rope_pos(graph.ops[r.lo:r.hi]) for r in self.ranges]
        self.tokens, self.pos, self.table, self.step = step_record(ffi, shape)
        self._sent: tuple[int, set] = (-1, set())

    # -- memory ----------------------------------------------------------------------------------
    def _alloc(self, nbytes: int, zero: bool = False) -> int:
        p = int(self.lib.pyllm_cuda_alloc(self.ctx, nbytes))
        if p == 0:
            raise DeviceMemoryError(f"{self.device.name}: {_error(self.lib, self.ffi)}")
        self._allocs.append(p)
        if zero and self.lib.pyllm_cuda_memset0(self.ctx, p, nbytes):
            raise BackendError(_error(self.lib, self.ffi))
        return p

    def _upload(self, dst: int, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        if self.lib.pyllm_cuda_upload(self.ctx, dst, self.ffi.from_buffer(a), a.nbytes):
            raise BackendError(_error(self.lib, self.ffi))

    # -- addresses for fill_record ------------------------------------------------------------------
    def weight(self, index: int, t: Tensor) -> int:
        if index in self.plan.streamed:
            return self.staging + self.plan.streamed[index][1]
        return self.weights[t.name]

    def vector(self, a: np.ndarray) -> int:
        return self.vectors[id(a)]

    def view(self, v: View) -> tuple[int, int]:
        ptr, _, width = self.buffers[v.name]
        return ptr + 4 * v.offset, width

    def qbuffer(self, name: str) -> int:
        return self.qbuffers[name][0]

    def kv(self, layer: int) -> tuple[int, int]:
        return self.kv_pools[layer]

    def state(self, name: str) -> int:
        return self.states[name]

    # -- running ------------------------------------------------------------------------------------
    def run(self, index: int, step: StepData) -> None:
        r = self.ranges[index]
        new_step = self._sent[0] != step.serial or step.serial == 0
        if new_step:
            self._sent = (step.serial, set())
        sent = self._sent[1]
        n = step.n_tokens
        self.tokens[:n], self.pos[:n] = step.tokens, step.pos
        self.table[:len(step.table)] = step.table
        rope = step.rope_pos if self.mrope[index] else None
        for what, need, nbytes in zip(("tokens", "pos", "table", "rope_pos"), (*self.needs[index], rope is not None),
                                      (4 * n, 4 * n, 4 * len(step.table), 12 * n)):
            if need and what not in sent:   # what the library sends (pyllm_cuda_run)
                self.device.bus.count(H2D, CONTROL, nbytes)
                sent.add(what)
        if r.streamed:
            for i in range(r.lo, r.hi):
                if i in self.plan.streamed:
                    t, off = self.plan.streamed[i]
                    self._upload(self.staging + off, t.data)
                    self.device.bus.count(H2D, WEIGHTS, t.nbytes)
        st = self.step
        st.n_tokens, st.n_out, st.n_table = n, step.n_out, len(step.table)
        st.bidirectional = int(step.bidirectional)
        st.rope_pos = self.ffi.NULL if rope is None else self.ffi.from_buffer("int32_t[]", rope)
        try:
            if self.lib.pyllm_cuda_run(self.ctx, self.recs + r.lo, r.hi - r.lo, st, int(new_step)) != 0:
                raise BackendError(_error(self.lib, self.ffi))
        finally:
            st.rope_pos = self.ffi.NULL

    def sync(self) -> None:
        self.lib.pyllm_cuda_sync(self.ctx)

    def _where(self, name: str):
        if name in self.buffers:
            return self.buffers[name], np.float32
        return self.qbuffers[name], np.uint8

    def has_buffer(self, name: str) -> bool:
        return name in self.buffers or name in self.qbuffers

    def read(self, name: str, row0: int, n_rows: int, kind: str = ACTIVATIONS) -> np.ndarray:
        (ptr, row_bytes, width), dtype = self._where(name)
        out = np.empty((n_rows, width), dtype)
        if self.lib.pyllm_cuda_download(self.ctx, self.ffi.from_buffer(out), ptr + row0 * row_bytes, out.nbytes):
            raise BackendError(_error(self.lib, self.ffi))
        self.device.bus.count(D2H, kind, out.nbytes)
        return out

    def write(self, name: str, row0: int, data: np.ndarray, kind: str = ACTIVATIONS) -> None:
        (ptr, row_bytes, width), dtype = self._where(name)
        a = np.ascontiguousarray(data, dtype=dtype)
        assert a.shape[1:] == (width,)
        self._upload(ptr + row0 * row_bytes, a)
        self.device.bus.count(H2D, kind, a.nbytes)

    def close(self) -> None:
        for p in getattr(self, "_allocs", []):
            self.lib.pyllm_cuda_release(self.ctx, p)
        self._allocs = []
