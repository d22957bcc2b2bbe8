"""The CUDA backend against the C core.

Every kernel test runs twice: on a real GPU ([gpu], skipped without one)
and on the CUDA emulator ([emu]: the same csrc/cuda/ sources compiled by
g++ and run on the CPU, csrc/cuda/emu/; built by `make cuda-emu`, skipped
with the reason where g++ is missing). The comparisons mean the same on
both: each kernel against the C core on the same inputs (quantized
activations byte for byte, embeddings and the KV cache bit for bit,
elementwise ops and attention to float rounding, matmuls to float rounding
since the integer part of every block's dot product is the same), whole
synthetic models of every family (all on the GPU, and split with the CPU,
counting the bus), and greedy decoding of the real models. On the emulator
each kernel test also runs under three thread orders (forward, reverse,
seeded shuffle), which must agree bit for bit: a kernel racing on shared
memory does not.

What the emulator cannot show, a GPU run still must: timing, memory
coherence beyond barriers (it runs a block's threads one at a time), the
GPU's own libm (expf, tanhf, pow, sin, cos within 2 ulps) and FMA
contraction (nvcc fuses a * b + c; g++ here does not) -- the tolerances
above leave room for those.

Without either, what can be checked still runs: the ABI declarations parse
and agree with the C core's, and the built library (if `make cuda` ran)
loads and reports no device instead of failing."""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

import synth
from pyllm.arch import load_architecture
from pyllm.arch.base import Moe
from pyllm.backend import cuda
from pyllm.backend.base import CONTROL, D2H, H2D, Range, Shape, StepData
from pyllm.backend.cpu import CpuBackend, HostDevice
from pyllm.backend.placement import DeviceSpec, Hardware, LinkSpec, Planner
from pyllm.backend.split import SplitBackend
from pyllm.errors import BackendError, InvalidArgumentError
from pyllm.graph import (ACT_F32, GLU_GELU_TANH, GLU_MUL, GLU_RELU, GLU_SIGMOID, GLU_RELU_SQR, GLU_SILU, GLU_SWIGLU_OAI,
                         GLU_TANH, GLU_XIELU, MOE_NORM, MOE_SIGMOID, MOE_SOFTMAX, OP_ATTENTION, OP_MATMUL_COLS, OP_SUMSQ,
                         ROPE_NEOX, ROPE_NORM, WKV_6, WKV_7, WKV_GLA, Graph, Op, act_format)
from pyllm.model_file import ModelFile, Tensor

GPU_OK, WHY = cuda.available()

ALL_TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.IQ4_NL, QT.MXFP4,
             QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.IQ3_S, QT.IQ3_XXS,
             QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ1_S, QT.IQ1_M]


# -- without a GPU ----------------------------------------------------------------------------------

def test_abi_declarations_agree_with_the_core():
    from cffi import FFI
    from pyllm._native import ffi as core_ffi
    ffi = FFI()
    ffi.cdef(cuda.cdef_text())
    for t in ("pyllm_op", "pyllm_step"):
        assert ffi.sizeof(t) == core_ffi.sizeof(t)
    for f in ("w", "x", "xq", "y", "n_in", "freq_factors", "k_cache", "v_cache"):
        assert ffi.offsetof("pyllm_op", f) == core_ffi.offsetof("pyllm_op", f)


def test_library_loads_without_a_gpu():
    if cuda.library_path() is None:
        pytest.skip("libpyllm_cuda.so is not built (make cuda)")
    if GPU_OK:
        pytest.skip("a GPU is present")
    ffi, lib = cuda.load()
    assert lib.pyllm_cuda_device_count() == 0
    assert lib.pyllm_cuda_new(0) == ffi.NULL
    assert "does not exist" in ffi.string(lib.pyllm_cuda_error()).decode()


def _hosttest():
    from cffi import FFI
    path = cuda.REPO / "build" / "libpyllm_cuda_hosttest.so"
    if not path.is_file():
        pytest.skip("build/libpyllm_cuda_hosttest.so is not built (make cuda, where nvcc exists)")
    ffi = FFI()
    ffi.cdef("int pq_host_unpack16(int type, const uint8_t *row, int g, int32_t *q16, float *a, float *b);"
             "float pq_host_dequant(int type, const uint8_t *row, int64_t k);")
    return ffi, ffi.dlopen(str(path))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_kernel_weight_readings_on_the_host(qtype):
    """quant.cuh compiled for the host: every element the embedding kernel
    dequantizes equals the C core's (and gguf's) bit for bit, and every group
    the matmul kernels unpack gives w = a q + b."""
    import gguf
    from pyllm._native import ffi as core_ffi, lib as core
    ffi, lib = _hosttest()
    n_in, rows = 512, 3
    w = tensor(qtype, n_in, rows, seed=int(qtype), e_range=(100, 140))   # MXFP4: every exponent of real files
    raw = w.data.reshape(rows, -1)
    ref = gguf.quants.dequantize(raw, qtype).reshape(rows, n_in).astype(np.float32)
    for r in range(rows):
        row = ffi.from_buffer(raw[r])
        got = np.array([lib.pq_host_dequant(int(qtype), row, k) for k in range(n_in)], np.float32)
        core_out = np.zeros(n_in, np.float32)
        assert core.pyllm_kernel_dequant(0, int(qtype), core_ffi.from_buffer(raw[r]),
                                         core_ffi.cast("float *", core_ffi.from_buffer(core_out)), n_in) == 0
        np.testing.assert_array_equal(got, core_out)
        np.testing.assert_array_equal(got, ref[r])
        if act_format(int(qtype)) == ACT_F32:
            assert lib.pq_host_unpack16(int(qtype), row, 0, ffi.new("int32_t[16]"), ffi.new("float *"),
                                        ffi.new("float *")) == -1
            continue
        q16, a, b = ffi.new("int32_t[16]"), ffi.new("float *"), ffi.new("float *")
        for g in range(n_in // 16):
            assert lib.pq_host_unpack16(int(qtype), row, g, q16, a, b) == 0
            q = np.array(list(q16), np.float64)
            assert np.abs(q).max() <= 127
            approx = a[0] * q + b[0]
            np.testing.assert_allclose(approx, ref[r, 16 * g:16 * g + 16], rtol=1e-5,
                                       atol=1e-6 * np.abs(ref[r]).max())


class HostBackedCudaLib:
    """libpyllm_cuda.so's ABI served from host memory, for testing the Python
    side of the CUDA backend (cuda.py) without a GPU: allocations are host
    arrays (their addresses stand in for device pointers), copies are
    memmoves, and a program runs in the C core on the same records."""

    def __init__(self, ffi, host):
        import ctypes
        from pyllm._native import ffi as core_ffi, lib as core_lib
        self.ffi, self.core_ffi, self.core, self.host, self.ctypes = ffi, core_ffi, core_lib, host, ctypes
        self.mem, self.h2d, self.d2h, self.sent = {}, 0, 0, 0
        self.err = ffi.new("char[]", 512)

    def _addr(self, cdata):
        return int(self.ffi.cast("uintptr_t", cdata))

    def pyllm_cuda_new(self, i): return self.ffi.cast("pyllm_cuda *", 1)
    def pyllm_cuda_free(self, ctx): pass
    def pyllm_cuda_error(self): return self.err
    def pyllm_cuda_sync(self, ctx): return 0

    def pyllm_cuda_mem_info(self, ctx, free, total):
        free[0], total[0] = 1 << 30, 1 << 30
        return 0

    def pyllm_cuda_alloc(self, ctx, n):
        from pyllm.backend.cpu import aligned_zeros
        a = aligned_zeros((max(int(n), 1),), np.uint8)
        self.mem[a.ctypes.data] = a
        return a.ctypes.data

    def pyllm_cuda_release(self, ctx, p):
        del self.mem[int(p)]
        return 0

    def pyllm_cuda_memset0(self, ctx, p, n):
        self.ctypes.memset(int(p), 0, int(n))
        return 0

    def pyllm_cuda_upload(self, ctx, dst, src, n):
        self.ctypes.memmove(int(dst), self._addr(src), int(n))
        self.h2d += int(n)
        return 0

    def pyllm_cuda_download(self, ctx, dst, src, n):
        self.ctypes.memmove(self._addr(dst), int(src), int(n))
        self.d2h += int(n)
        return 0

    def pyllm_cuda_bus_bytes(self, ctx, a, b):
        a[0], b[0] = self.h2d, self.d2h

    def pyllm_cuda_check(self, recs, n):
        return self.core.pyllm_program_check(self.core_ffi.cast("pyllm_op *", self._addr(recs)), n)

    def pyllm_cuda_run(self, ctx, recs, n, st, new_step):
        ops = self.core_ffi.cast("pyllm_op *", self._addr(recs))
        if new_step:
            self.sent = 0
        need = 0
        for i in range(n):   # what the library sends of the step (pyllm_cuda_run)
            k, by_pos = ops[i].kind, bool(ops[i].flags & 32)   # OPF_BY_POS: an EMBED of the positions
            # tokens: EMBED; positions: ROPE, KV_STORE, ATTENTION, POS_SCALE, SSM_CONV, SSM_SCAN,
            # DELTA_NET (position 0 resets the state), EMBED by position; table: KV_STORE, ATTENTION
            need |= ((k == 1 and not by_pos) | ((k in (5, 6, 7, 15, 17, 18, 19) or (k == 1 and by_pos)) << 1)
                     | ((k in (6, 7)) << 2))
        for bit, nbytes in ((1, 4 * st.n_tokens), (2, 4 * st.n_tokens), (4, 4 * st.n_table)):
            if need & bit and not self.sent & bit:
                self.h2d += nbytes
                self.sent |= bit
        return self.core.pyllm_run(self.host.ctx, ops, n, self.core_ffi.cast("pyllm_step *", self._addr(st)))


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CudaDevice over HostBackedCudaLib."""
    from cffi import FFI
    ffi = FFI()
    ffi.cdef(cuda.cdef_text())
    host = HostDevice(2)
    fake = HostBackedCudaLib(ffi, host)
    monkeypatch.setattr(cuda, "load", lambda path=None: (ffi, fake))
    monkeypatch.setattr(cuda, "device_info", lambda index=0, library=None: {"name": "host-backed",
                                                                              "total_bytes": 1 << 30, "cc": (0, 0)})
    gpu = cuda.CudaDevice(0)
    yield host, gpu, fake
    gpu.close()
    host.close()


@pytest.mark.parametrize("stream", [False, True], ids=["resident", "streaming"])
def test_cuda_device_glue_on_host_memory(fake_gpu, tmp_path, stream):
    """cuda.py's allocation, lowering to device addresses, step sending,
    streaming and copies, checked by running its records in the C core:
    the same logits as the CPU alone, and the bytes the library copied are
    the bytes the Bus counted and the plan predicted."""
    host, gpu, fake = fake_gpu
    arch, g = build(synth.write_llama(tmp_path / "m.gguf", QT.Q4_K, n_layer=4))
    shape = Shape(64, 64, 8, 16)
    tokens = [int(t) for t in np.random.default_rng(2).integers(2, 500, 44)]
    ref = steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host), tokens, [5, 2, 7], n_prefill=40)
    cpu_spec = DeviceSpec("cpu", 100e9, 0.5e12 if stream else 10e12, 1e-6)
    hw = Hardware(cpu_spec, DeviceSpec("gpu", 300e9, 20e12, 1e-6), LinkSpec(16e9, 16e9, 0.0 if stream else 1e-5))
    plan = Planner(g, hw, shape).plan(1)
    assert plan.stream == stream
    be = SplitBackend(g, {"cpu": host, "gpu": gpu}, plan.schedules(g), shape, plan.stream_min_batch)
    got = steps(be, tokens, [5, 2, 7], n_prefill=40)
    np.testing.assert_array_equal(got, ref)
    assert be.memory()["gpu"] == plan.gpu_memory
    for n in (40, 1):
        gpu.bus.reset()
        h0, d0 = fake.h2d, fake.d2h
        be.forward(tokens[:n], 0, [5, 2, 7], 1)
        sched = plan.schedules(g)[be.schedule_for(n)]
        assert dict(gpu.bus.bytes) == {(d, k): v for (dev, d, k), v in sched.bus_bytes(n, 1, 3).items()}
        assert (fake.h2d - h0, fake.d2h - d0) == (gpu.bus.total(H2D), gpu.bus.total(D2H))
    be.close()
    assert len(fake.mem) == 0     # every allocation released


# -- the CUDA emulator -------------------------------------------------------------------------------

_emulator: dict = {}


def emulator_library():
    """build/libpyllm_cuda_emu.so, brought up to date once per session by `make cuda-emu`
    (incremental: the tests always run the kernels as they are in csrc/cuda/); skips saying
    why when it cannot be built (no g++, no make). $PYLLM_CUDA_EMU_LIB names another build
    of it instead (make cuda-emu-asan's, say)."""
    if not _emulator and os.environ.get("PYLLM_CUDA_EMU_LIB"):
        _emulator.update(path=Path(os.environ["PYLLM_CUDA_EMU_LIB"]), why="")
    if not _emulator:
        make = shutil.which("make")
        if make is None:
            why = "make not found: cannot build the CUDA emulator (make cuda-emu)"
        else:
            r = subprocess.run([make, "--no-print-directory", "-s", "cuda-emu"], cwd=cuda.REPO,
                               capture_output=True, text=True)
            if r.returncode != 0:
                _emulator["error"] = f"make cuda-emu failed:\n{r.stdout}{r.stderr}"
            why = r.stdout.strip() or "make cuda-emu built no library"
        _emulator["path"] = cuda.emulator_path() if make else None
        _emulator["why"] = why
    if "error" in _emulator:
        pytest.fail(_emulator["error"])
    if _emulator["path"] is None:
        pytest.skip(_emulator["why"])
    return _emulator["path"]


# The emulator runs a block's threads one at a time, each to its next barrier, in one of
# these orders; a kernel that races on shared memory gives different bits under two of them.
EMU_ORDERS = [("forward", 0), ("reverse", 0), ("shuffle", 1)]


# -- kernels, one op at a time ----------------------------------------------------------------------

@pytest.fixture(scope="module", params=["gpu", "emu"])
def devices(request):
    """(host, CUDA device): the real GPU, or the CUDA emulator running the same kernels on the CPU."""
    if request.param == "gpu":
        if not GPU_OK:
            pytest.skip(f"no usable GPU: {WHY}")
        gpu = cuda.CudaDevice(0)
    else:
        gpu = cuda.CudaDevice(0, library=emulator_library())
    host = HostDevice(2)
    yield host, gpu
    gpu.close()
    host.close()


def tensor(qtype, n_in, n_out, seed=0, name="w", e_range=None):
    """A weight matrix of random values. e_range = (lo, hi): MXFP4 block
    exponents at random in lo..hi (gguf's quantizer gives these weights only
    a few, around 120) and every 8th block's 0 or 1 (the subnormal scales)."""
    arr, _ = synth.weight(qtype, n_in, n_out, np.random.default_rng(seed))
    data = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    if qtype == QT.MXFP4 and e_range:
        blocks = data.reshape(-1, 17)
        e = np.random.default_rng(seed + 1).integers(e_range[0], e_range[1] + 1, len(blocks))
        e[3::8] = np.arange(len(e[3::8])) % 2
        blocks[:, 0] = e
    return Tensor(name, int(qtype), (n_in, n_out), 0, data.nbytes, data)


def read_kv(prog, layer):
    """(K pool, V pool) of a layer as f16 bits, from a host or a CUDA program; V None where
    the layer has no value pool (OPF_V_IN_K: the values are read from the keys)."""
    blocks, bs, dk, dv = prog.plan.kv[layer]   # bytes per position: f16 pools hold dk // 2 halves
    if not isinstance(prog, cuda.CudaProgram):
        return prog.k_cache[layer].view(np.uint16).copy(), prog.v_cache[layer].view(np.uint16).copy() if dv else None
    out = []
    for ptr, d in zip(prog.kv(layer), (dk, dv)):
        if not d:
            out.append(None)
            continue
        a = np.empty((blocks, bs, d // 2), np.uint16)
        assert prog.lib.pyllm_cuda_download(prog.ctx, prog.ffi.from_buffer(a), ptr, a.nbytes) == 0
        out.append(a)
    return tuple(out)


def on_host_and_gpu(devices, run):
    """(run(host), run(gpu)) for run(device) -> {name: array}; the emulator runs it once per
    thread order of EMU_ORDERS, and the orders must agree bit for bit."""
    host, gpu = devices
    if not getattr(gpu, "emulated", False):
        return run(host), run(gpu)
    results = []
    for order, seed in EMU_ORDERS:
        gpu.set_order(order, seed)
        results.append(run(gpu))
    gpu.set_order("forward")
    for (order, _), r in zip(EMU_ORDERS[1:], results[1:]):
        for name in results[0]:
            np.testing.assert_array_equal(r[name], results[0][name],
                                          err_msg=f"{name}: thread order {order} changes the result (a race)")
    return run(host), results[0]


def run_both(devices, g, inputs: dict, n: int, outputs, table=(0,), pos=None, tokens=None, shape=None,
             n_out=None, kv=()):
    """Runs graph g on the host and on the GPU from the same inputs; returns
    ({name: host rows}, {name: gpu rows}): n rows of each output (n_out of the
    output head's), and the K, V pools of the layers in kv as "k<layer>",
    "v<layer>" (no "v<layer>" for a layer without a V pool). The emulator runs the program once per thread order of
    EMU_ORDERS, and the orders must agree bit for bit."""
    n_out = n_out or n
    shape = shape or Shape(max(n, 1), max(n_out, 1), max(len(table), 1), 16)
    step = StepData(np.asarray(tokens if tokens is not None else np.zeros(n), np.int32),
                    np.asarray(pos if pos is not None else np.zeros(n), np.int32), np.asarray(table, np.int32), n_out)

    def run(dev):
        prog = dev.bind(g, [Range(0, len(g.ops))], shape)
        for name, a in inputs.items():
            prog.write(name, 0, a)
        prog.run(0, step)
        out = {}
        for name in outputs:
            b = g.buffers.get(name)
            out[name] = np.array(prog.read(name, 0, n_out if b is not None and b.rows == "out" else n))
        for layer in kv:
            k, v = read_kv(prog, layer)
            out[f"k{layer}"] = k
            if v is not None:
                out[f"v{layer}"] = v
        prog.close()
        return out

    return on_host_and_gpu(devices, run)


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_matches_the_core(devices, qtype, rows):
    # 17 blocks of 32: groups of 16 past the last run of 4 (mmv) and tile of 8 (mmq), and rows
    # that start 2 bytes past a 4-byte boundary (the 2-byte aligned loads)
    n_in = 512 if GGML_QUANT_SIZES[qtype][0] == 256 else 544
    n_out = 203                               # not a multiple of any tile (4 rows, 64 rows)
    w = tensor(qtype, n_in, n_out, e_range=(118, 124))   # MXFP4: a range in which every block counts
    bias = np.random.default_rng(5).standard_normal(n_out).astype(np.float32)
    g = Graph()
    x = g.buffer("x", n_in)
    g.linear(x, w, "y", bias=bias, accumulate=True)
    rng = np.random.default_rng(rows)
    xs = rng.standard_normal((rows, n_in)).astype(np.float32)
    y0 = rng.standard_normal((rows, n_out)).astype(np.float32)
    names = ["y"] + list(g.qbuffers)
    cpu, gpu = run_both(devices, g, {"x": xs, "y": y0}, rows, names)
    for q in g.qbuffers:                      # the activations quantized byte for byte
        np.testing.assert_array_equal(gpu[q], cpu[q])
    err = np.abs(gpu["y"] - cpu["y"]).max() / np.abs(cpu["y"] - y0).max()
    assert err < 2e-5, err


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_embedding_is_bit_exact(devices, qtype):
    n = 256
    w = tensor(qtype, n, 300, e_range=(100, 140))
    g = Graph()
    g.embed(w, "x", scale=1.7)
    tokens = [0, 299, 17, 17, 150]
    cpu, gpu = run_both(devices, g, {}, len(tokens), ["x"], tokens=tokens)
    np.testing.assert_array_equal(gpu["x"], cpu["x"])


def close_to_float_rounding(got, ref, rel_tol=1e-6):
    """Equal up to float rounding: a few ulps of the largest value. The GPU adds
    in other orders, fuses a * b + c into one FMA (nvcc's default) and has its
    own expf, tanhf, pow, sin and cos (within 2 ulps); the emulator shares
    libm with the C core and never fuses, so it is mostly bit-exact here."""
    assert got.shape == ref.shape
    err = np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err <= rel_tol, err


def op_case(case: str, rng):
    """(graph, inputs, outputs, positions, exact) for one op (or the output head's first op)."""
    g, n = Graph(), 12
    x = g.buffer("x", 256)
    inputs = {"x": (rng.standard_normal((n, 256)) * 3).astype(np.float32)}
    pos = rng.integers(0, 5000, n)
    w = rng.uniform(0.5, 1.5, 256).astype(np.float32)
    second = {}
    for name in ("up", "y", "k"):         # second inputs: batch rows, made before the head
        second[name] = g.buffer(name, 128 if name == "k" else 256)
        inputs[name] = rng.standard_normal((n, second[name].width)).astype(np.float32)
    if "mix" in case:                     # AltUp's coefficients: 16 per row (a 4x4 matrix)
        second["c"] = g.buffer("c", 16)
        inputs["c"] = rng.standard_normal((n, 16)).astype(np.float32)
    head = case.startswith("head-")
    if head:                              # the head's first op reads the last n_out rows
        g.head()
        case = case[5:]
    if case == "rmsnorm":
        g.rmsnorm(x, w, 1e-6, "out")
    elif case == "rmsnorm-groups":        # q/k norms: one per head
        g.rmsnorm(x, w[:64], 1e-5, "out", groups=4)
    elif case == "rmsnorm-group-weights":   # Mamba 2's norm: each group its own slice of w (OPF_GROUP_WEIGHTS)
        g.rmsnorm(x, w, 1e-5, "out", groups=4)
    elif case in ("layernorm", "layernorm-nobias"):   # rows far from zero mean
        inputs["x"] += (rng.uniform(-50, 50, (n, 1))).astype(np.float32)
        g.layernorm(x, w, rng.standard_normal(256).astype(np.float32) if case == "layernorm" else None, 1e-5, "out")
    elif case in ("act-gelu", "act-relu-sqr"):   # an ungated FFN's activation: a GLU op without up
        g.act(x, GLU_GELU_TANH if case == "act-gelu" else GLU_RELU_SQR, "out")
    elif case == "act-xielu":   # Apertus's activation, its [a_n, a_p, beta, eps] (eps far from 0: the clamp shows)
        g.act(x, GLU_XIELU, "out", params=np.array([1.3, 0.9, 0.5, -0.25], np.float32))
    elif case in ("rope-norm", "rope-neox"):
        k = second["k"]
        if case == "rope-norm":
            g.rope(x, k, 4, 2, 64, 64, ROPE_NORM, 10000.0)
        else:   # partial rotation, linear scaling and per-pair factors (llama3, phi3 long rope)
            factors = rng.uniform(1.0, 8.0, 16).astype(np.float32)
            g.rope(x, k, 4, 2, 64, 32, ROPE_NEOX, 500000.0, freq_scale=0.25, freq_factors=factors)
        return g, inputs, ["x", "k"], pos, False
    elif case in ("glu-silu", "glu-gelu"):
        g.glu(x, second["up"], GLU_SILU if case == "glu-silu" else GLU_GELU_TANH, "out")
    elif case == "pos-scale":             # Mistral 3's attention temperature, positions up to 5120
        g.pos_scale(x, 0.1, 16)
        return g, inputs, ["x"], pos, False
    elif case == "glu-mul":               # LFM2's gates
        g.glu(x, second["up"], GLU_MUL, "out")
    elif case == "glu-relu":              # SmallThinker's experts
        g.glu(x, second["up"], GLU_RELU, "out")
    elif case == "glu-sigmoid":           # gated attention (AFMoE)
        g.glu(x, second["up"], GLU_SIGMOID, "out")
    elif case == "glu-swiglu-oai":        # gates and ups past the clamp at +-7
        inputs["x"] *= 6
        inputs["up"] *= 6
        g.glu(x, second["up"], GLU_SWIGLU_OAI, "out")
    elif case == "add":
        g.add(x, second["y"])
        return g, inputs, ["y"], pos, True
    elif case == "scale":
        g.scale(x, 0.37)
        return g, inputs, ["x"], pos, True
    elif case in ("copy-gather", "copy-broadcast"):
        # MLA's concatenations: 4 groups of 40 columns from every 60th of x (from column 8)
        # into every 48th of out (from column 6), the 8 between left alone; or the same 32
        # columns (a shared rotated key) into every group of 96
        gather = case == "copy-gather"
        out = g.buffer("out", 200 if gather else 4 * 96)
        if gather:
            g.copy(x.cols(8, 248), out.cols(6, 190), 40, 4, 60, 48)
        else:
            g.copy(x.cols(200, 32), out.cols(64, 320), 32, 4, 0, 96)
        if not head:                      # out's other columns: what was there before
            inputs["out"] = rng.standard_normal((n, out.width)).astype(np.float32)
        return g, inputs, ["out"], pos, True
    elif case in ("mix", "mix-accumulate"):   # Gemma 3n's AltUp: 4 streams of 64 by a 4x4 matrix per
        c = second["c"]                         # row, or 1 stream into 4 (its correction), added to out
        if case == "mix":
            g.mix(x, c, 64, "out")
        else:
            inputs["out"] = rng.standard_normal((n, 256)).astype(np.float32)
            g.mix(x.cols(0, 64), c.cols(0, 4), 64, g.buffer("out", 256), accumulate=True)
    elif case == "match-norm":                 # 3 groups of 64 scaled to the norm of y's first 64
        g.match_norm(x.cols(0, 192), second["y"].cols(0, 64))
        return g, inputs, ["x"], pos, False
    elif case == "sparsify":                   # rows far from zero mean: the mean is part of the cut
        inputs["x"] += (rng.uniform(-20, 20, (n, 1))).astype(np.float32)
        g.sparsify(x, 1.6448533535003662, "out")
    elif case == "act-tanh":
        g.act(x, GLU_TANH, "out")
    elif case == "sub":                        # add with a factor: a difference
        g.add(x, second["y"], -1.0)
        return g, inputs, ["y"], pos, True
    elif case == "scale-columns":              # a factor per column (AltUp's correct_scale)
        g.scale(x, 0.5, columns=w)
        return g, inputs, ["x"], pos, True
    elif case == "add-row":                    # one row added to every row (BERT's token-type embedding)
        g.add_row(w, x)
        return g, inputs, ["x"], pos, True
    elif case in ("linear-q4_k", "linear-f16"):
        wt = tensor(QT.Q4_K if case == "linear-q4_k" else QT.F16, 256, 40)
        g.linear(x, wt, "out")
    elif case in ("matmul-cols", "matmul-cols-accumulate"):   # LoRA's B: rank 8 to 300 columns
        b = (rng.standard_normal((8, 300)) * 0.1).astype(np.float32)
        bt = Tensor("b", 0, (300, 8), 0, b.nbytes, b.reshape(-1).view(np.uint8))
        if case.endswith("accumulate"):
            second["acc"] = g.buffer("acc", 300)
            inputs["acc"] = rng.standard_normal((n, 300)).astype(np.float32)
            g.matmul_cols(x.cols(5, 8), bt, second["acc"], accumulate=True)
            return g, inputs, ["acc"], pos, False
        g.matmul_cols(x.cols(5, 8), bt, "out")
    else:
        raise ValueError(case)
    return g, inputs, ["out"], pos, False


OP_CASES = ["rmsnorm", "rmsnorm-groups", "rmsnorm-group-weights", "layernorm", "layernorm-nobias", "rope-norm",
            "rope-neox", "glu-silu", "glu-gelu", "glu-swiglu-oai", "glu-mul", "glu-relu", "glu-sigmoid", "pos-scale", "act-gelu", "act-relu-sqr", "act-xielu", "add", "scale", "head-rmsnorm", "head-layernorm", "head-glu-gelu", "head-add",
            "head-linear-q4_k", "head-linear-f16", "copy-gather", "copy-broadcast", "head-copy-gather",
            "head-rmsnorm-group-weights", "mix", "mix-accumulate", "head-mix", "match-norm", "sparsify",
            "head-sparsify", "act-tanh", "sub", "scale-columns", "add-row", "head-add-row", "matmul-cols",
            "matmul-cols-accumulate", "head-matmul-cols"]


@pytest.mark.parametrize("case", OP_CASES)
def test_op_matches_the_core(devices, case):
    """Each elementwise and normalization kernel on the same inputs as the C
    core; head-*: the op as the output head's first, reading the last 3 of 12
    rows (a generation step's prefill)."""
    g, inputs, outputs, pos, exact = op_case(case, np.random.default_rng(len(case)))
    used = {v.name for op in g.ops for v in (op.x, op.x2, op.y) if v is not None}
    inputs = {name: a for name, a in inputs.items() if name in used}
    n_out = 3 if case.startswith("head-") else None
    cpu, gpu = run_both(devices, g, inputs, 12, outputs, pos=pos, n_out=n_out, table=range(320),
                        shape=Shape(12, n_out or 12, 320, 16))   # positions up to 5120 for RoPE
    for name in outputs:
        if exact:
            np.testing.assert_array_equal(gpu[name], cpu[name])
        else:
            close_to_float_rounding(gpu[name], cpu[name], 2e-5 if "linear" in case else 1e-6)
        if "glu" in case or "act" in case:   # element by element too: gates down to -10 give results near 1e-30
            # (an H200 measured 1.0e-5 for xIELU and 7.6e-6 for GELU: CUDA's expf and erff are
            # within 2 ulp, glibc's within 1, and a difference of nearly equal terms widens that)
            np.testing.assert_allclose(gpu[name], cpu[name], rtol=2e-5, atol=1e-30)


def run_steps_both(devices, g, inputs: dict, steps, output: str):
    """run_both over several steps of one program: step (a, b, p) runs rows [a, b) of each
    input at positions p.., the program (and its recurrent state) kept from step to step.
    Returns ({output: stacked rows, state name: final state}, the same from the GPU); the
    emulator under every thread order of EMU_ORDERS, which must agree bit for bit."""
    n = max(b - a for a, b, _ in steps)
    shape = Shape(n, n, 8, 16)
    table = np.arange(8, dtype=np.int32)

    def run(dev):
        prog = dev.bind(g, [Range(0, len(g.ops))], shape)
        rows = []
        try:
            for a, b, p in steps:
                for name, x in inputs.items():
                    prog.write(name, 0, x[a:b])
                prog.run(0, StepData(np.zeros(b - a, np.int32), np.arange(p, p + b - a, dtype=np.int32), table, b - a))
                rows.append(np.array(prog.read(output, 0, b - a)))
            out = {output: np.concatenate(rows)}
            for name, floats in g.states.items():
                if isinstance(prog, cuda.CudaProgram):
                    st = np.empty(floats, np.float32)
                    assert prog.lib.pyllm_cuda_download(prog.ctx, prog.ffi.from_buffer(st), prog.state(name),
                                                        st.nbytes) == 0
                else:
                    st = prog.states[name].copy()
                out[name] = st
        finally:
            prog.close()
        return out

    return on_host_and_gpu(devices, run)


# steps of one sequence (5 rows, two of 1: shorter than a 7-tap convolution's state, then 12), then
# a new sequence from position 0 whose first step must not see the old state
SSM_STEPS = [(0, 5, 0), (5, 6, 5), (6, 7, 6), (7, 19, 7), (19, 25, 0), (25, 27, 6)]
SSM_CASES = {   # (heads, head_dim, groups, d_state)
    "scan-mamba2": (4, 5, 1, 19),          # one decay per head, an odd d_state
    "scan-mamba2-groups": (6, 3, 3, 16),   # B and C shared by pairs of heads
    "scan-mamba1": (7, 1, 1, 9),           # a decay per head and state
    "scan-no-bias": (2, 8, 2, 33),         # no dt bias; d_state past one warp's 32 lanes
    "scan-wide": (3, 2, 1, 200),           # d_state past the 128 a lane keeps in registers
    "scan-wide-mamba1": (2, 3, 2, 161),
}


@pytest.mark.parametrize("case", ["conv-bias", "conv-7-taps", "conv-2-taps"] + list(SSM_CASES))
def test_ssm_op_matches_the_core(devices, case):
    """The state-space ops (csrc/ssm.c) against the C core over the steps of SSM_STEPS: the outputs
    of every step, and the state they leave (the convolution's last K - 1 inputs, the scan's
    [heads][head_dim][d_state]), so what one step carries to the next in device memory is what the
    core carries; a step at position 0 starting from zeros. Inputs are views inside wider rows (as
    the columns of a Mamba layer's fused projection). dt reaches past softplus's threshold of 20."""
    rng = np.random.default_rng(len(case))
    T = SSM_STEPS[-1][1]
    g = Graph()
    if case.startswith("conv"):
        n, taps, bias = {"conv-bias": (77, 4, True), "conv-7-taps": (5, 7, False), "conv-2-taps": (64, 2, True)}[case]
        w = rng.standard_normal((n, taps)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32) if bias else None
        g.ssm_conv(g.buffer("in", n + 11).cols(8, n), w, b, "out")
        inputs = {"in": rng.standard_normal((T, n + 11)).astype(np.float32)}
        output, tol = "out", 1e-6
    else:
        H, P, G, N = SSM_CASES[case]
        width = H * P + 2 * G * N
        src = g.buffer("in", width + H + 3)   # [x | B | C | 3 others | dt]
        a = -np.exp(rng.uniform(0, 2, H * (N if "mamba1" in case else 1))).astype(np.float32)
        d = rng.standard_normal(H).astype(np.float32)
        dt_bias = None if case == "scan-no-bias" else rng.uniform(-1, 1, H).astype(np.float32)
        g.ssm_scan(src.cols(0, width), src.cols(width + 3, H), a, d, dt_bias, H, P, G, N, "y")
        x = rng.standard_normal((T, width + H + 3)).astype(np.float32)
        x[:, width + 3:] = rng.uniform(-3, 2, (T, H))
        x[3, width + 3] = 25.0            # softplus(v) = v above 20
        inputs, output, tol = {"in": x}, "y", 1e-5
    cpu, gpu = run_steps_both(devices, g, inputs, SSM_STEPS, output)
    assert set(cpu) == {output} | set(g.states)
    for name in cpu:
        close_to_float_rounding(gpu[name], cpu[name], tol)


DELTA_CASES = {   # (value heads, key heads, head_dim, head_dim_v)
    "delta-heads": (3, 3, 16, 24),         # a key head per value head, dk != dv
    "delta-grouped": (4, 2, 32, 48),       # value heads 0, 2 and 1, 3 share a key head; dv past one warp
    "delta-in-groups": (6, 2, 32, 16),     # value heads 0-2 and 3-5 share a key head (Qwen3-Next)
    "delta-odd": (3, 1, 19, 13),           # odd sizes: fewer columns than a warp's lanes
    "delta-128": (2, 1, 128, 128),         # Qwen3.5's head sizes: all of a column in registers
    "delta-wide-keys": (2, 2, 150, 70),    # head_dim past the 128 a lane keeps in registers
}


@pytest.mark.parametrize("case", list(DELTA_CASES))
def test_delta_net_op_matches_the_core(devices, case):
    """The gated delta rule (csrc/ssm.c op_delta_net) against the C core over the steps of
    SSM_STEPS: the outputs of every step and the [heads][head_dim][head_dim_v] state they leave, a
    step at position 0 starting from zeros. q, k, v and the gates are views inside wider rows; one
    gate input reaches past softplus's threshold of 20, and one row's q of key head 0 is zero (its
    norm below eps)."""
    rng = np.random.default_rng(len(case))
    H, Hk, dk, dv = DELTA_CASES[case]
    T = SSM_STEPS[-1][1]
    width = 2 * Hk * dk + H * dv
    g = Graph()
    qkv, gates = g.buffer("in", width + 5), g.buffer("gates", 2 * H + 3)
    a = -np.exp(rng.uniform(-2, 0.5, H)).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, H).astype(np.float32)
    g.delta_net(qkv.cols(3, width), gates.cols(1, 2 * H), a, dt_bias, H, Hk, dk, dv, 1e-6, "y",
                grouped=case == "delta-in-groups")
    x = rng.standard_normal((T, width + 5)).astype(np.float32)
    x[2, 3:3 + dk] = 0.0                  # q of key head 0: zero
    ab = rng.uniform(-3, 3, (T, 2 * H + 3)).astype(np.float32)
    ab[3, 1] = 25.0                       # head 0's gate: softplus(v) = v above 20
    ab[8, 1 + H - 1] = 21.0               # the last head's too, in another step
    cpu, gpu = run_steps_both(devices, g, {"in": x, "gates": ab}, SSM_STEPS, "y")
    assert set(cpu) == {"y"} | set(g.states)
    for name in cpu:
        close_to_float_rounding(gpu[name], cpu[name], 1e-5)


WKV_CASES = {   # (kind, heads, head_size)
    "wkv6": (WKV_6, 4, 64),               # RWKV 6's head size
    "wkv6-odd": (WKV_6, 3, 19),           # fewer rows than a warp's lanes
    "gla": (WKV_GLA, 2, 40),              # QRWKV's gated linear attention
    "wkv7": (WKV_7, 3, 64),               # with its per-head norm and bonus (RWKV 7)
    "wkv7-odd": (WKV_7, 2, 33),
    "wkv7-bare": (WKV_7, 2, 16),          # neither
}


@pytest.mark.parametrize("case", list(WKV_CASES))
def test_wkv_op_matches_the_core(devices, case):
    """RWKV's WKV (csrc/ssm.c op_wkv) against the C core over the steps of SSM_STEPS: the outputs
    of every step and the [heads][head_size][head_size] states they leave, from views inside wider
    rows; then OP_LERP (plain and accumulating) and the per-head LayerNorm with biases per group."""
    rng = np.random.default_rng(len(case))
    kind, H, D = WKV_CASES[case]
    T, C = SSM_STEPS[-1][1], H * D
    parts = 6 if kind == WKV_7 else 4
    x = rng.standard_normal((T, parts * C + 5)).astype(np.float32)
    x[:, 3 + 3 * C:3 + 4 * C] = rng.uniform(-5.0, 1.5, (T, C))   # decays from 0.01 to 0.99
    if kind == WKV_7:   # a = -kk, b = kk * gate, kk of unit length per head: a bounded state
        kk = rng.standard_normal((T, H, D))
        kk /= np.linalg.norm(kk, axis=2, keepdims=True)
        x[:, 3 + 4 * C:3 + 5 * C] = -kk.reshape(T, C)
        x[:, 3 + 5 * C:3 + 6 * C] = (kk * rng.uniform(0, 1, (T, H, D))).reshape(T, C)
    g = Graph()
    full = kind == WKV_6 or (kind == WKV_7 and case != "wkv7-bare")
    y = g.wkv(g.buffer("in", parts * C + 5).cols(3, parts * C), kind, H, D, "y",
              bonus=rng.standard_normal(C).astype(np.float32) if full else None,
              scale=D ** -0.5 if kind == WKV_GLA else 1.0,
              norm=(rng.uniform(0.5, 1.5, C).astype(np.float32), rng.standard_normal(C).astype(np.float32))
              if full and kind == WKV_7 else None, eps=64e-5)
    g.layernorm(y, rng.uniform(0.5, 1.5, C).astype(np.float32), rng.standard_normal(C).astype(np.float32), 64e-5,
                "y_norm", groups=H)
    mixes = rng.uniform(0, 1, (3, C)).astype(np.float32)
    g.lerp(y, g.buffer("in", parts * C + 5).cols(3 + C, C), mixes, "mixed")
    g.lerp(y, g.buffer("in", parts * C + 5).cols(3, C), mixes, "mixed", accumulate=True)
    cpu, gpu = run_steps_both(devices, g, {"in": x}, SSM_STEPS, "mixed")
    assert set(cpu) == {"mixed"} | set(g.states)
    for name in cpu:
        close_to_float_rounding(gpu[name], cpu[name], 1e-5)
    cpu, gpu = run_steps_both(devices, g, {"in": x}, SSM_STEPS, "y_norm")
    close_to_float_rounding(gpu["y_norm"], cpu["y_norm"], 1e-5)


def test_the_gpu_refuses_a_delta_net_key_head_past_its_shared_memory(devices):
    """A token's normalized q and k of one key head live in the kernel's 48 KB of shared memory:
    a longer head_dim (which the core runs) is refused when the program is bound, not at launch."""
    host, gpu = devices
    g = Graph()
    dk = 6145   # DELTA_MAX_HEAD_DIM + 1
    g.delta_net(g.buffer("x", 2 * dk + 1), g.buffer("ab", 2), -np.ones(1, np.float32), np.zeros(1, np.float32),
                1, 1, dk, 1, 1e-6, "out")
    host.bind(g, [Range(0, 1)], Shape(4, 4, 4, 16)).close()
    with pytest.raises(BackendError, match="delta_net: 1 value heads of 1 over 1 key heads of 6145"):
        gpu.bind(g, [Range(0, 1)], Shape(4, 4, 4, 16))


def test_the_gpu_refuses_a_quantized_kv_cache(devices):
    """The GPU's attention reads f16 pools: a q8_0 KV cache (which the core runs) is refused when the
    program is bound, saying what to do; a graph without attention binds whatever the cache types."""
    host, gpu = devices
    g = Graph()
    g.layer = 0
    g.attention(g.buffer("q", 2 * 64), g.buffer("k", 64), g.buffer("v", 64), 2, 1, 64, 0.1, "y")
    host.bind(g, [Range(0, len(g.ops))], Shape(4, 4, 4, 16, 8, 8)).close()
    with pytest.raises(BackendError, match="the GPU keeps f16 KV caches only"):
        gpu.bind(g, [Range(0, len(g.ops))], Shape(4, 4, 4, 16, 8, 1))
    plain = Graph()
    plain.act(plain.buffer("x", 8), GLU_TANH, "y")
    gpu.bind(plain, [Range(0, 1)], Shape(4, 4, 4, 16, 8, 8)).close()


def test_the_gpu_refuses_the_cpu_only_ops(devices):
    """An importance matrix's sums (OP_SUMSQ) and the hidden states cvector-generator keeps
    (OP_SAVE_ROWS) write host arrays, which the CUDA kernels do not: binding them says to keep
    those layers on the CPU; the host runs them."""
    host, gpu = devices
    for build in (lambda g: g._emit(Op(OP_SUMSQ, x=g.buffer("x", 4), vector=np.zeros(4, np.float32), n_in=4),
                                    {"x"}, {"acc"}),
                  lambda g: g.save_rows(g.buffer("x", 4), np.zeros((4, 4), np.float32))):
        g = Graph()
        build(g)
        host.bind(g, [Range(0, len(g.ops))], Shape(4, 4, 4, 16)).close()
        with pytest.raises(BackendError, match="-ngl 0"):
            gpu.bind(g, [Range(0, len(g.ops))], Shape(4, 4, 4, 16))


def recurrent_graph(kind: str) -> Graph:
    g = Graph()
    if kind == "ssm_conv":
        g.ssm_conv(g.buffer("x", 16), np.ones((16, 4), np.float32), None, "out")
    else:
        g.delta_net(g.buffer("x", 2 * 8 + 2 * 4), g.buffer("ab", 4), -np.ones(2, np.float32), np.zeros(2, np.float32),
                    2, 1, 8, 4, 1e-6, "out")
    return g


@pytest.mark.parametrize("kind", ["ssm_conv", "delta_net"])
def test_a_recurrent_step_needs_consecutive_positions_on_the_gpu(devices, kind):
    """pyllm_cuda_run refuses a step of a recurrent op (an SSM op, the gated delta rule) whose
    positions are not consecutive, as the core does."""
    host, gpu = devices
    g = recurrent_graph(kind)
    prog = gpu.bind(g, [Range(0, 1)], Shape(4, 4, 4, 16))
    try:
        with pytest.raises(BackendError, match="consecutive positions"):
            prog.run(0, StepData(np.zeros(3, np.int32), np.array([4, 5, 7], np.int32), np.arange(4, dtype=np.int32), 1))
    finally:
        prog.close()


@pytest.mark.parametrize("case", ["route-softmax-norm", "route-sigmoid", "route-select-bias", "route-groups",
                                  "route-expert-scale", "matmul-id-q4_k", "matmul-id-q8_0-slots",
                                  "matmul-id-f16", "matmul-id-q8_0-bias", "matmul-id-mxfp4-slots",
                                  "moe-sum", "matmul-heads-q8_0", "matmul-heads-f16"])
def test_moe_op_matches_the_core(devices, case):
    """The mixture-of-experts ops: the route (same experts, weights to float
    rounding), each (token, slot) through its expert (shared input, or one
    slice per slot), the weighted sum; 12 tokens, 6 of 8 experts used by
    several of them, one route id out of range (its slot left alone); a bias
    per expert (gpt-oss); a scale per expert (Gemma 4). matmul-heads: MATMUL_ID with no route, a matrix per
    head on its slice of the input (MLA's up-projections), the heads inside a
    wider buffer."""
    from test_moe import experts_tensor
    rng = np.random.default_rng(len(case))
    n, k, n_exp = 12, 3, 8
    g = Graph()
    ids = np.stack([rng.permutation(n_exp)[:k] for _ in range(n)]).astype(np.float32)
    ids[5, 1] = 99.0
    route = np.concatenate([ids, rng.uniform(0, 1, (n, k)).astype(np.float32)], axis=1)
    if case.startswith("route"):
        gating = MOE_SIGMOID if case == "route-sigmoid" else MOE_SOFTMAX | MOE_NORM
        bias = rng.uniform(0, 0.3, 40).astype(np.float32) if case in ("route-select-bias", "route-groups") else None
        groups = (8, 3) if case == "route-groups" else (0, 0)   # 40 experts in 8 groups, 3 kept (DeepSeek V3)
        scales = rng.uniform(0.25, 4.0, 40).astype(np.float32) if case == "route-expert-scale" else None   # Gemma 4
        g.moe_route(g.buffer("logits", 40), k, gating, "route", scale=1.5, select_bias=bias, groups=groups,
                    expert_scale=scales)
        inputs, outputs = {"logits": (rng.standard_normal((n, 40)) * 3).astype(np.float32)}, ["route"]
    elif case == "moe-sum":
        g.moe_sum(g.buffer("e", k * 256), g.buffer("route", 2 * k), k, "y", accumulate=True)
        inputs = {"e": rng.standard_normal((n, k * 256)).astype(np.float32), "route": route,
                  "y": rng.standard_normal((n, 256)).astype(np.float32)}
        outputs = ["y"]
    elif case.startswith("matmul-heads"):
        heads, n_in = 4, 128
        w = experts_tensor({"q8_0": QT.Q8_0, "f16": QT.F16}[case.split("-")[2]], n_in, 64, heads)
        g.linear_heads(g.buffer("x", 64 + heads * n_in).cols(64, heads * n_in), w, "out")
        inputs = {"x": rng.standard_normal((n, 64 + heads * n_in)).astype(np.float32),
                  "out": np.full((n, heads * 64), 7.0, np.float32)}
        outputs = ["out"] + list(g.qbuffers)
    else:
        qtype = {"q4_k": QT.Q4_K, "q8_0": QT.Q8_0, "f16": QT.F16, "mxfp4": QT.MXFP4}[case.split("-")[2]]
        slots = case.endswith("slots")
        w = experts_tensor(qtype, 256, 64, n_exp)
        bias = rng.standard_normal((n_exp, 64)).astype(np.float32) if case.endswith("bias") else None
        g.linear_id(g.buffer("x", 256 * (k if slots else 1)), w, g.buffer("route", 2 * k), k, "out", slot_input=slots,
                    bias=bias)
        inputs = {"x": rng.standard_normal((n, 256 * (k if slots else 1))).astype(np.float32), "route": route,
                  "out": np.full((n, k * 64), 7.0, np.float32)}
        outputs = ["out"]
    cpu, gpu = run_both(devices, g, inputs, n, outputs)
    for name in outputs:
        if name in g.qbuffers:            # the heads' activations quantized byte for byte
            np.testing.assert_array_equal(gpu[name], cpu[name])
        elif case.startswith("route"):
            np.testing.assert_array_equal(gpu[name][:, :k], cpu[name][:, :k])
            np.testing.assert_allclose(gpu[name][:, k:], cpu[name][:, k:], rtol=1e-5)
        else:
            close_to_float_rounding(gpu[name], cpu[name], 2e-5)
    if case.startswith("matmul-id"):
        assert (gpu["out"][5, 64:128] == 7.0).all()


@pytest.mark.parametrize("n_head,n_kv_head,hd,window,softcap,sinks,hd_v,v_in_k,chunked", [
    (4, 2, 64, 0, 0.0, False, 0, False, False),       # grouped-query heads
    (4, 2, 48, 0, 0.0, False, 0, False, None),        # bidirectional (BERT): every row sees every position
    (4, 1, 64, 40, 0.0, False, 0, False, None),       # bidirectional, a window of 20 either way (EmbeddingGemma)
    (2, 1, 256, 37, 5.0, False, 0, False, False),     # one KV head (Gemma), a sliding window, soft-capped scores
    (3, 3, 80, 0, 0.0, False, 0, False, False),       # a head size that is no multiple of 32
    (8, 2, 64, 16, 0.0, True, 0, False, False),       # a sink logit per head (gpt-oss), windowed
    (4, 4, 192, 0, 0.0, False, 128, False, False),    # keys of 192, values of 128 (MLA without the latent trick)
    (2, 1, 576, 21, 0.0, False, 0, False, False),     # the largest head: 5 value dims per thread
    (16, 1, 576, 0, 0.0, False, 512, True, False),    # MLA: one 576-dim key row per position, values its first 512
    (4, 2, 80, 0, 0.0, False, 48, True, False),       # values in the keys of 2 KV heads, sizes no multiple of 32
    (4, 2, 64, 16, 0.0, False, 0, False, True),  # Llama 4's chunks: position p sees p - p % 16 ..
], ids=["gqa", "bidirectional", "bidirectional-window", "window-softcap-hd256", "hd80", "sinks-window", "k192-v128", "hd576", "mla-v-in-k",
        "v-in-k-gqa-hd80", "chunked"])
def test_kv_store_and_attention_match_the_core(devices, n_head, n_kv_head, hd, window, softcap, sinks, hd_v,
                                               v_in_k, chunked):
    """160 positions (two attention tiles) through a shuffled block table: the
    KV cache bit for bit (f16 rounding is exact on both; a layer whose values
    are its keys' first dims has no V pool), every row's attention to float
    rounding. chunked None: a bidirectional attention."""
    rng = np.random.default_rng(hd + hd_v)
    n, bs = 160, 16
    g = Graph()
    g.layer = 0
    q, k = g.buffer("q", n_head * hd), g.buffer("k", n_kv_head * hd)
    v = None if v_in_k else g.buffer("v", n_kv_head * (hd_v or hd))
    sink = (rng.standard_normal(n_head) * 3).astype(np.float32) if sinks else None
    g.attention(q, k, v, n_head, n_kv_head, hd, 1.0 / np.sqrt(hd), "y", window=window, softcap=softcap, sinks=sink,
                head_dim_v=hd_v, chunked=bool(chunked), causal=chunked is not None)
    assert g.buffers["y"].width == n_head * (hd_v or hd)
    inputs = {name: (rng.standard_normal((n, b.width)) * 2).astype(np.float32) for name, b in g.buffers.items()
              if name != "y"}
    table = list(rng.permutation(12))[:n // bs]
    cpu, gpu = run_both(devices, g, inputs, n, ["y"], table=table, pos=np.arange(n), kv=[0],
                        shape=Shape(n, n, 12, bs))
    np.testing.assert_array_equal(gpu["k0"], cpu["k0"])
    if v_in_k:
        assert "v0" not in cpu and "v0" not in gpu
    else:
        np.testing.assert_array_equal(gpu["v0"], cpu["v0"])
    close_to_float_rounding(gpu["y"], cpu["y"], 5e-6)   # the scalar core adds in another order: 2.9e-6


# -- the emulator itself ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def emu():
    """(ffi, lib) of the CUDA emulator's library"""
    return cuda.load(emulator_library())


def selftest(emu, which: int, n_out: int = 1024):
    """(cudaError_t, message, out) of one of the emulator's test kernels (csrc/cuda/emu/selftest.cu)"""
    ffi, lib = emu
    out = np.zeros(n_out, np.float32)
    msg = ffi.new("char[]", 8192)
    rc = lib.pyllm_cuda_emu_selftest(which, ffi.cast("float *", ffi.from_buffer(out)), n_out, msg, 8192)
    return rc, ffi.string(msg).decode(), out


@pytest.mark.parametrize("order", [o for o, _ in EMU_ORDERS])
def test_emulator_runs_barriers_and_shuffles(emu, order):
    ffi, lib = emu
    lib.pyllm_cuda_emu_set_order(cuda.EMU_ORDERS[order], 3)
    try:
        rc, msg, out = selftest(emu, lib.PYLLM_CUDA_EMU_TEST_GOOD)
        assert rc == 0, msg
        t = np.arange(256)
        assert out[0] == t.sum()
        np.testing.assert_array_equal(out[1:257], t & ~31)                         # __shfl_sync from lane 0
        np.testing.assert_array_equal(out[257:513], np.where(t % 32 < 31, t + 1, t))   # __shfl_down_sync by 1
        rc, msg, out = selftest(emu, lib.PYLLM_CUDA_EMU_TEST_INDICES)
        assert rc == 0, msg
        x, y, z = np.meshgrid(np.arange(4), np.arange(2), np.arange(2), indexing="ij")
        within = (x + 10 * y + 100 * z).transpose(2, 1, 0).reshape(-1)            # thread id = x + 4 (y + 2 z)
        bx, by = np.meshgrid(np.arange(2), np.arange(3), indexing="xy")
        blocks = (1000 * bx + 10000 * by).reshape(-1)                            # block id = x + 2 y
        np.testing.assert_array_equal(out[:96], (blocks[:, None] + within[None, :]).reshape(-1))
    finally:
        lib.pyllm_cuda_emu_set_order(0, 0)


def test_emulator_thread_order_exposes_a_race(emu):
    """A thread reading what its neighbour writes, with no barrier between:
    forward order reads the old value, reverse order the new one."""
    ffi, lib = emu
    got = {}
    for order in ("forward", "reverse"):
        lib.pyllm_cuda_emu_set_order(cuda.EMU_ORDERS[order], 0)
        rc, msg, out = selftest(emu, lib.PYLLM_CUDA_EMU_TEST_RACE)
        assert rc == 0, msg
        got[order] = out[:256]
    lib.pyllm_cuda_emu_set_order(0, 0)
    np.testing.assert_array_equal(got["reverse"][:255], np.arange(2, 257))
    np.testing.assert_array_equal(got["forward"][:255], 0)


@pytest.mark.parametrize("case,words", [
    ("DIVERGENT_BARRIER", ["divergent __syncthreads", "selftest.cu"]),
    ("EXIT_BEFORE_BARRIER", ["thread (5,0,0) exited", "wait at __syncthreads"]),
    ("EXITED_LANE", ["thread (3,0,0) exited while lane", "__shfl_xor_sync (common.cuh"]),
    ("DEADLOCK", ["deadlock", "thread 0: __syncwarp", "threads 1-63: __syncthreads"]),
    ("PARTIAL_WARP", ["names lanes the block does not have"]),
    ("BAD_CONFIG", ["invalid configuration argument", "1024 threads"]),
])
def test_emulator_reports_broken_rules(emu, case, words):
    """Kernels that break CUDA's rules end with an error naming the kernel,
    the threads and the source lines; nothing hangs, and the next launch runs."""
    ffi, lib = emu
    rc, msg, _ = selftest(emu, getattr(lib, f"PYLLM_CUDA_EMU_TEST_{case}"))
    assert rc == (9 if case == "BAD_CONFIG" else 719), msg   # cudaErrorInvalidConfiguration, LaunchFailure
    for w in words:
        assert w in msg, msg
    assert selftest(emu, lib.PYLLM_CUDA_EMU_TEST_GOOD)[0] == 0


def test_emulator_replays_a_captured_graph_and_refuses_copies_in_capture(emu):
    """Launches on a capturing stream are recorded, not run (d[1] still 0 after the capture),
    and run when the graph is launched; a memset on a capturing stream is refused
    (cudaErrorStreamCaptureUnsupported, 900), as CUDA refuses it."""
    ffi, lib = emu
    rc, msg, out = selftest(emu, lib.PYLLM_CUDA_EMU_TEST_GRAPH)
    assert rc == 0, msg
    assert out[-1] == 0
    x, y, z = np.meshgrid(np.arange(4), np.arange(2), np.arange(2), indexing="ij")
    within = (x + 10 * y + 100 * z).transpose(2, 1, 0).reshape(-1)
    bx, by = np.meshgrid(np.arange(2), np.arange(3), indexing="xy")
    np.testing.assert_array_equal(out[:96], ((1000 * bx + 10000 * by).reshape(-1)[:, None] + within).reshape(-1))
    rc, msg, _ = selftest(emu, lib.PYLLM_CUDA_EMU_TEST_COPY_IN_CAPTURE)
    assert rc == 900 and "capturing" in msg, (rc, msg)
    assert selftest(emu, lib.PYLLM_CUDA_EMU_TEST_GOOD)[0] == 0


def test_emulator_poisons_dynamic_shared_memory(emu):
    """Dynamic shared memory is garbage (NaN) in every block until written, as
    on the GPU, not the zeros a buggy kernel could get away with."""
    ffi, lib = emu
    rc, msg, out = selftest(emu, lib.PYLLM_CUDA_EMU_TEST_SHARED_POISON)
    assert rc == 0, msg
    assert np.isnan(out[:128]).all()


def test_emulator_fp16_conversions_are_exact(emu):
    """__half2float for every half; __float2half_rn (round to nearest even,
    subnormals, overflow) as numpy for every non-NaN float tried, NaN to the
    canonical 0x7fff as the GPU's cvt.rn.f16.f32 gives."""
    ffi, lib = emu
    h = np.arange(1 << 16, dtype=np.uint16)
    f = np.empty(1 << 16, np.float32)
    lib.pyllm_cuda_emu_f16_to_f32(ffi.cast("uint16_t *", ffi.from_buffer(h)), ffi.cast("float *", ffi.from_buffer(f)),
                                  len(h))
    np.testing.assert_array_equal(f.view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))
    rng = np.random.default_rng(0)
    halves = h.view(np.float16).astype(np.float32)
    finite = np.arange(0x7c00, dtype=np.uint16).view(np.float16).astype(np.float64)   # 0 .. 65504
    mids = (finite[:-1] + finite[1:]) / 2                                 # exact ties between neighbours
    mids = np.concatenate([mids, -mids])
    x = np.concatenate([rng.integers(0, 1 << 32, 200000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        halves, mids.astype(np.float32), np.nextafter(mids.astype(np.float32), np.float32(0)),
                        np.float32([65504, 65519.99, 65520, 1e-8, 2.0 ** -25, 2.0 ** -24, np.inf, -np.inf])])
    x = x[~np.isnan(x)]
    out = np.empty(len(x), np.uint16)
    lib.pyllm_cuda_emu_f32_to_f16(ffi.cast("float *", ffi.from_buffer(x)), ffi.cast("uint16_t *", ffi.from_buffer(out)),
                                  len(x))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, x.astype(np.float16).view(np.uint16))
    nan = np.float32([np.nan, -np.nan]).copy()
    nan_out = np.empty(2, np.uint16)
    lib.pyllm_cuda_emu_f32_to_f16(ffi.cast("float *", ffi.from_buffer(nan)),
                                  ffi.cast("uint16_t *", ffi.from_buffer(nan_out)), 2)
    assert list(nan_out) == [0x7fff, 0x7fff]


def test_emulator_device_and_memory():
    """What the emulator says it is, its memory accounting, and copies outside
    an allocation refused (a caller's bug, which a GPU might not report)."""
    gpu = cuda.CudaDevice(0, library=emulator_library())
    try:
        assert gpu.emulated and gpu.info["name"] == "pyllm CUDA emulator" and gpu.info["cc"] == (9, 0)
        free0 = gpu.free_memory()
        p = int(gpu.lib.pyllm_cuda_alloc(gpu.ctx, 1000))
        assert p and gpu.free_memory() == free0 - 1024
        a = np.arange(1000, dtype=np.uint8)
        assert gpu.lib.pyllm_cuda_upload(gpu.ctx, p, gpu.ffi.from_buffer(a), 1000) == 0
        assert gpu.lib.pyllm_cuda_upload(gpu.ctx, p + 1, gpu.ffi.from_buffer(a), 1000) == -1
        assert "invalid argument" in cuda._error(gpu.lib, gpu.ffi)
        assert gpu.lib.pyllm_cuda_release(gpu.ctx, p) == 0
        assert gpu.lib.pyllm_cuda_release(gpu.ctx, p) == -1                       # twice
        assert gpu.free_memory() == free0
        with pytest.raises(InvalidArgumentError):
            gpu.set_order("sideways")
    finally:
        gpu.close()


def test_a_failed_call_does_not_fail_the_next_run(devices):
    """A call that fails (freeing a pointer twice, too big an allocation)
    reports its own error; CUDA also keeps it as the "last error", which must
    not come back as a launch failure of the next program's first kernel."""
    host, gpu = devices
    p = int(gpu.lib.pyllm_cuda_alloc(gpu.ctx, 64))
    assert gpu.lib.pyllm_cuda_release(gpu.ctx, p) == 0
    assert gpu.lib.pyllm_cuda_release(gpu.ctx, p) == -1
    assert gpu.lib.pyllm_cuda_alloc(gpu.ctx, gpu.free_memory() + (1 << 30)) == 0
    assert "out of GPU memory" in cuda._error(gpu.lib, gpu.ffi)
    g = Graph()
    x = g.buffer("x", 64)
    g.scale(x, 2.0)
    a = np.ones((1, 64), np.float32)
    cpu, out = run_both(devices, g, {"x": a}, 1, ["x"])
    np.testing.assert_array_equal(out["x"], 2 * a)


def test_copy_probes(devices):
    """The copy-rate and latency probes placement calibrates with: every kind
    runs and gives a rate (pinned and pageable host memory, device to device)."""
    host, gpu = devices
    for kind in range(5):
        assert gpu.lib.pyllm_cuda_copy_rate(gpu.ctx, kind, 1 << 20, 2) > 0, kind
    assert 0 < gpu.lib.pyllm_cuda_copy_latency(gpu.ctx, 3) < 1


def test_device_selection_never_picks_the_emulator(monkeypatch, tmp_path):
    """$PYLLM_CUDA_LIB naming the emulator: device=auto and n_gpu_layers=auto
    stay on the CPU; device=cuda with a number of layers uses it (no driver needed)."""
    from pyllm.backend.select import gpu_device, make_backend
    monkeypatch.setenv("PYLLM_CUDA_LIB", str(emulator_library()))
    assert cuda.available()[0]
    host = HostDevice(1)
    dev, why = gpu_device("auto", host)
    assert dev is None and "never picks it" in why
    host.close()
    _, g = build(synth.write_llama(tmp_path / "m.gguf", QT.Q8_0))
    hw = Hardware(DeviceSpec("cpu", 50e9, 1e12, 1e-6), DeviceSpec("gpu", 1e12, 1e14, 1e-6), LinkSpec(16e9, 16e9, 1e-5))
    shape = Shape(8, 8, 4, 16)
    be, plan = make_backend(g, 1, shape, "auto", "cuda", hardware=hw)
    assert isinstance(be, CpuBackend) and plan is None
    be.close()
    be, plan = make_backend(g, 1, shape, "all", "cuda", hardware=hw)
    assert isinstance(be, SplitBackend) and plan.uses_gpu
    assert any(getattr(d, "emulated", False) for d in be.devices.values())
    tokens = [5, 9, 14]
    got = be.forward(tokens, 0, [0], 3).copy()
    be.close()
    ref = CpuBackend(g, 1, 8, 8, 4, 16)
    close_enough(got, ref.forward(tokens, 0, [0], 3), False)
    ref.close()


# -- whole models -----------------------------------------------------------------------------------------

def build(path):
    arch = load_architecture(ModelFile(path))
    g = Graph()
    arch.build(g)
    return arch, g


def all_on_gpu(g, host, gpu, shape, ngl="all"):
    hw = Hardware(DeviceSpec("cpu", 50e9, 1e12, 1e-6), DeviceSpec("gpu", 1e12, 1e14, 1e-6, memory=None),
                  LinkSpec(16e9, 16e9, 1e-5))
    plan = Planner(g, hw, shape).plan(ngl)
    return SplitBackend(g, {"cpu": host, "gpu": gpu}, plan.schedules(g), shape, plan.stream_min_batch), plan


def steps(be, tokens, table, chunk=64, n_prefill=None):
    """Chunked prefill of n_prefill tokens (logits of every row), then decode one at a time."""
    n_prefill = n_prefill or len(tokens) - 4
    out = []
    for i in range(0, n_prefill, chunk):
        c = tokens[i:min(i + chunk, n_prefill)]
        out.append(be.forward(c, i, table, min(len(c), be.n_out_max)).copy())
    for i in range(n_prefill, len(tokens)):
        out.append(be.forward([tokens[i]], i, table, 1).copy())
    return np.concatenate(out)


def rel(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)) / b.std())


def close_enough(got, ref, float_weights, moe=False):
    """Float weights: float rounding only. Quantized: the GPU's float sums can
    flip a rounding tie of an 8-bit activation, which random models amplify
    like any quantization error (tests/test_forward.py, SIMD vs scalar): the
    reference tolerance then, and the same top token where the margin is clear.
    A mixture of experts: such a flip can change a router's choice where two
    experts nearly tie, and that position's output jumps (tests/test_families.py):
    98% of the clear positions agree (Llama 4 at Q8_0 on AVX2: one of 304 flips)."""
    assert rel(got, ref) < (1e-3 if float_weights else 0.04), rel(got, ref)   # Llama 4 Q8_0 on AVX2: 0.036
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.05 * ref.std()
    same = got.argmax(1)[clear] == ref.argmax(1)[clear]
    assert same.mean() >= 0.98 if moe and not float_weights else same.all(), np.flatnonzero(~same)


@pytest.mark.parametrize("family,qtype", [("llama", QT.Q4_0), ("llama", QT.Q4_K), ("mistral", QT.Q8_0),
                                          ("qwen2", QT.Q4_1), ("qwen3", QT.Q6_K), ("phi3", QT.Q5_K),
                                          ("gemma2", QT.Q8_0), ("gemma3", QT.F16), ("granite", QT.Q4_K),
                                          ("smollm3", QT.Q8_0), ("olmo2", QT.F16), ("phi2", QT.Q8_0),
                                          ("starcoder2", QT.Q4_K), ("stablelm", QT.F16), ("cohere2", QT.Q8_0),
                                          ("mixtral", QT.Q4_K), ("qwen2moe", QT.Q8_0), ("gpt-oss", QT.Q8_0),
                                          ("nemotron", QT.Q4_K), ("gptneox", QT.Q8_0),
                                          ("lfm2", QT.Q8_0), ("mistral3", QT.Q4_K),
                                          ("ernie4_5-moe", QT.Q8_0), ("gpt2", QT.Q8_0), ("deepseek2", QT.Q8_0), ("glm4moe", QT.Q4_K),
                                          ("lfm2moe", QT.Q8_0), ("bailingmoe2", QT.F16),
                                          ("hunyuan-dense", QT.Q4_K), ("llama4", QT.Q8_0), ("smallthinker", QT.Q4_K),
                                          ("dots1", QT.Q8_0), ("afmoe", QT.Q8_0), ("hunyuan-moe", QT.Q4_K), ("seed_oss", QT.Q8_0),
                                          ("granitehybrid", QT.Q8_0), ("granitehybrid", QT.F16), ("nemotron_h", QT.Q8_0),
                                          ("qwen35", QT.Q8_0), ("gemma4", QT.Q8_0), ("minimax-m2", QT.Q4_K),
                                          ("gemma3n", QT.Q8_0), ("minicpm", QT.Q8_0), ("deepseek", QT.Q4_K),
                                          ("orion", QT.Q8_0), ("minicpm3", QT.Q8_0), ("chatglm", QT.Q4_K),
                                          ("bloom", QT.Q8_0), ("mpt", QT.Q4_K), ("jais", QT.Q8_0), ("mamba", QT.Q8_0), ("jamba", QT.Q4_K), ("olmo", QT.Q8_0),
                                          ("bailingmoe", QT.Q8_0), ("openelm", QT.Q8_0), ("rwkv6", QT.F16),
                                          ("rwkv6qwen2", QT.Q4_K), ("rwkv7", QT.F16), ("arwkv7", QT.Q8_0),
                                          ("qwen", QT.Q8_0), ("codeshell", QT.Q4_K), ("jais2", QT.Q8_0),
                                          ("maincoder", QT.Q4_K), ("nanbeige", QT.Q8_0),
                                          ("plm", QT.Q8_0), ("mistral4", QT.Q4_K),
                                          ("exaone-moe", QT.Q8_0), ("granite_swa", QT.Q8_0),
                                          ("mellum", QT.Q4_K)],
                         ids=lambda x: getattr(x, "name", x))
def test_model_on_gpu_matches_the_core(devices, tmp_path, family, qtype):
    """300 positions over shuffled 16-position blocks: several attention tiles,
    the sliding windows of mistral and gemma2/3, Gemma 2's soft-caps (scores
    and logits), GQA, q/k norms per head and over all of q and k (OLMo 2),
    biases, fused projections, both RoPE modes and layers without RoPE
    (SmolLM3), Granite's residual and logit scales, LayerNorm, the parallel
    block and the ungated GELU FFN (Phi-2, StarCoder 2, StableLM), mixtures
    of experts with and without a gated shared expert, gpt-oss's sinks,
    biased experts and swiglu_oai, Nemotron's relu^2, GPT-NeoX's two norms
    side by side, LFM2's short convolutions over the KV pools, DeepSeek 2's
    latent attention (values read from the keys, a matrix per head, copies),
    Mamba 2 layers beside attention (Granite 4.0-H, Nemotron-H): the
    convolution and the selective scan with their states carried in device
    memory across the prefill's chunks and every decode step; Nemotron-H's
    two groups of B and C and its norm with a weight per group; Qwen3.5's linear attention (the
    gated delta rule, 4 value heads over 2 key heads, its state carried in device memory like
    Mamba's) beside gated full attention; Gemma 4's heads of two sizes, values normed without
    weights, shared KV layers attending over earlier layers' caches and per-layer inputs; Gemma 3n's
    AltUp streams (mixed by a matrix per token, rescaled to a norm) and sparse FFN gates; RWKV 6's
    token shifts (two-tap convolutions), data-dependent lerps, WKV states and per-head LayerNorms,
    QRWKV's gated linear attention over shared key/value heads, RWKV 7's WKV with its norm and bonus and
    the first layer's values carried to the later layers."""
    host, gpu = devices
    path = synth.WRITERS[family](tmp_path / "m.gguf", qtype)
    arch, g = build(path)
    shape = Shape(64, 64, 24, 16)
    table = list(np.random.default_rng(0).permutation(24))[:20]
    tokens = [int(t) for t in np.random.default_rng(1).integers(2, 500, 304)]
    ref = steps(CpuBackend(g, 2, 64, 64, 24, 16, device=host), tokens, table)
    be, _ = all_on_gpu(g, host, gpu, shape)
    got = steps(be, tokens, table)
    be.close()
    close_enough(got, ref, qtype in (QT.F32, QT.F16, QT.BF16), moe=any(isinstance(L.ffn, Moe) for L in arch.layers))


def test_lora_on_gpu_matches_the_core(devices, tmp_path):
    """A LoRA adapter on every layer and the token embedding with all of them on the GPU: A x as
    a matmul, B's products (OP_MATMUL_COLS) added into the layer's output, as on the CPU."""
    from pyllm.lora import graph_pairs, open_adapters
    host, gpu = devices
    path = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0, n_layer=3)
    lora = synth.write_lora(tmp_path / "a.gguf", path, targets=None, rank=8, size=0.5)
    mf = ModelFile(path)
    arch = load_architecture(mf)
    g = Graph(**graph_pairs(open_adapters([(lora, 0.75)], mf)))
    arch.build(g)
    assert any(op.kind == OP_MATMUL_COLS for op in g.ops)
    shape = Shape(64, 64, 8, 16)
    tokens = [int(t) for t in np.random.default_rng(2).integers(2, 500, 90)]
    ref = steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host), tokens, [3, 0, 6, 1, 5, 2])
    be, _ = all_on_gpu(g, host, gpu, shape)
    got = steps(be, tokens, [3, 0, 6, 1, 5, 2])
    be.close()
    close_enough(got, ref, False)


def test_attention_softcap(devices, tmp_path):
    host, gpu = devices
    _, g = build(synth.write_llama(tmp_path / "m.gguf", QT.Q8_0))
    for op in g.ops:
        if op.kind == OP_ATTENTION:
            op.softcap = 2.0
    shape = Shape(64, 64, 8, 16)
    tokens = list(range(3, 43))
    ref = steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host), tokens, [4, 1, 7])
    be, _ = all_on_gpu(g, host, gpu, shape)
    got = steps(be, tokens, [4, 1, 7])
    be.close()
    close_enough(got, ref, False)


def test_streamed_prefill_matches_the_core(devices, tmp_path):
    """A slow CPU and a fast link: prefill streams the CPU-resident layers'
    weights through the GPU's staging area (decode stays split)."""
    host, gpu = devices
    _, g = build(synth.write_llama(tmp_path / "m.gguf", QT.Q4_K, n_layer=4))
    shape = Shape(64, 64, 8, 16)
    tokens = [int(t) for t in np.random.default_rng(2).integers(2, 500, 44)]
    ref = steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host), tokens, [5, 2, 7], n_prefill=40)
    hw = Hardware(DeviceSpec("cpu", 100e9, 0.5e12, 1e-6), DeviceSpec("gpu", 300e9, 20e12, 1e-6),
                  LinkSpec(16e9, 16e9, 0.0))
    plan = Planner(g, hw, shape).plan(1)
    assert plan.stream
    be = SplitBackend(g, {"cpu": host, "gpu": gpu}, plan.schedules(g), shape, plan.stream_min_batch)
    got = steps(be, tokens, [5, 2, 7], n_prefill=40)
    be.close()
    close_enough(got, ref, False)


def test_split_with_the_gpu_counts_the_bus(devices, tmp_path):
    host, gpu = devices
    arch, g = build(synth.write_llama(tmp_path / "m.gguf", QT.Q4_K, n_layer=4))
    shape = Shape(64, 64, 8, 16)
    tokens = list(range(3, 43))
    ref = steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host), tokens, [0, 1, 2])
    be, plan = all_on_gpu(g, host, gpu, shape, ngl=2)
    got = steps(be, tokens, [0, 1, 2])
    close_enough(got, ref, False)
    gpu.bus.reset()
    lib0 = gpu.lib_bus_bytes()
    be.forward([9], 40, [0, 1, 2], 1)
    lib1 = gpu.lib_bus_bytes()
    counted = dict(gpu.bus.bytes)
    predicted = {(d, k): v for (dev, d, k), v in plan.schedules(g)["resident"].bus_bytes(1, 1, 3).items()}
    assert counted == predicted
    assert (lib1[0] - lib0[0], lib1[1] - lib0[1]) == (gpu.bus.total(H2D), gpu.bus.total(D2H))
    assert counted[(H2D, CONTROL)] == 4 + 4 * 3
    be.close()


@pytest.mark.parametrize("family", ["qwen2vl", "qwen3vl"])
def test_mrope_on_the_gpu_matches_the_core(devices, tmp_path, family):
    """M-RoPE positions (an image's rows at (p, p + row, p + column)) through the GPU's RoPE: Qwen 2
    VL's sections one after another, Qwen 3 VL's interleaved (with DeepStack's ops, which a text
    row leaves alone); the same logits as the CPU alone, the positions sent once per step (12
    bytes a row, as the plan predicts), and other positions give other logits."""
    host, gpu = devices
    path = synth.WRITERS[family](tmp_path / "m.gguf", QT.F32, n_layer=3,
                                 **({"keys": {"num_deepstack_layers": 1}} if family == "qwen3vl" else {}))
    _, g = build(path)
    shape = Shape(64, 64, 8, 16)
    tokens = [int(t) for t in np.random.default_rng(4).integers(2, 500, 30)]
    grid = np.arange(30)
    rope_pos = np.stack([np.full(30, 3), 3 + grid // 6, 3 + grid % 6]).astype(np.int32)
    ref = CpuBackend(g, 2, 64, 64, 8, 16, device=host).forward(tokens, 0, [0, 1, 2], 30, rope_pos=rope_pos).copy()
    be, plan = all_on_gpu(g, host, gpu, shape, ngl=2)
    gpu.bus.reset()
    got = be.forward(tokens, 0, [0, 1, 2], 30, rope_pos=rope_pos).copy()
    close_enough(got, ref, True)
    predicted = {(d, k): v for (dev, d, k), v in plan.schedules(g)["resident"].bus_bytes(30, 30, 3, mrope=True).items()}
    assert dict(gpu.bus.bytes) == predicted and predicted[(H2D, CONTROL)] == 4 * 30 + 12 * 30 + 4 * 3
    plain = be.forward(tokens, 0, [0, 1, 2], 30).copy()     # every row at its index: other logits
    assert rel(plain, ref) > 1e-2
    be.close()


def clear_steps(ref: np.ndarray) -> np.ndarray:
    """The rows whose top token is not a near-tie: top-1 ahead of top-2 by
    more than 5% of the row's spread (the tolerance of close_enough)."""
    top2 = np.sort(ref, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0] > 0.05 * ref.std(axis=1)


@pytest.mark.model
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
@pytest.mark.parametrize("device", ["gpu", "emu"])
def test_real_model_top_tokens_match_the_cpu(name, device, monkeypatch):
    """The real models with all layers on the GPU, and 8 of them (split with
    the CPU), fed the CPU's 24 greedy tokens: at every step where the CPU's
    choice is clear, the same top token, and logits within the quantized
    tolerance. (Free-running greedy text would compare near-ties too: on
    Gemma 3 the CPU's third token leads the next by 1.7% of the spread, and
    the GPU's activation rounding flips it; benchmarks/gpu_check.py reports
    that comparison.) One prefill per configuration: about 35 s for both
    models under the emulator."""
    from pyllm import Model, registry
    if device == "gpu" and not GPU_OK:
        pytest.skip(f"no usable GPU: {WHY}")
    if device == "emu":
        monkeypatch.setenv("PYLLM_CUDA_LIB", str(emulator_library()))   # device="cuda" then means it
    path = registry.local_path(name)
    if not path.is_file():
        pytest.skip(f"{path} is not here (the GPU machine has no network: carry it, see benchmarks/gpu_pack.py)")
    with Model(path, n_ctx=512, device="cpu") as m:   # not the default: with a GPU that is the GPU
        ids = m.tokenize("The three primary colors are")
        toks = m.generate(ids, max_tokens=24, temperature=0).tokens
        ref = m.logits(ids + toks[:-1])[len(ids) - 1:]
    clear = clear_steps(ref)
    assert clear.sum() >= 18, clear           # the check has teeth: most steps are clear
    np.testing.assert_array_equal(ref.argmax(1)[clear], np.array(toks)[clear])
    for ngl in ("all", 8):
        with Model(path, n_ctx=512, n_gpu_layers=ngl, device="cuda") as m:
            got = m.logits(ids + toks[:-1])[len(ids) - 1:]
        assert rel(got, ref) < 0.08, (ngl, rel(got, ref))
        np.testing.assert_array_equal(got.argmax(1)[clear], np.array(toks)[clear], err_msg=f"ngl={ngl}")


@pytest.mark.parametrize("device", ["gpu", "emu"])
def test_decode_steps_replay_cuda_graphs(tmp_path, device, monkeypatch):
    """A decode step's launches are captured as a CUDA graph the second time they come and
    replayed from then on; a prefill larger than 16 rows launches one by one. The logits are
    the same as with every kernel launched by itself (bit for bit: the same kernels, in the same
    order), split with the CPU and all on the GPU."""
    from pyllm import Model
    if device == "gpu" and not GPU_OK:
        pytest.skip(f"no usable GPU: {WHY}")
    if device == "emu":
        monkeypatch.setenv("PYLLM_CUDA_LIB", str(emulator_library()))
    path = synth.write_llama(tmp_path / "m.gguf", QT.Q4_0)
    prompt = list(range(10, 30))

    def decode(graphs: bool, ngl):
        monkeypatch.setenv("PYLLM_CUDA_GRAPHS", "1" if graphs else "0")
        with Model(path, n_ctx=128, n_gpu_layers=ngl, device="cuda") as m:
            be, gpu = m.backend, m.backend.devices["gpu"]
            seq = m.engine.new_sequence()
            seq.reserve(len(prompt) + 6)
            rows = [be.forward(prompt, 0, seq.blocks, 1).copy()]
            after_prefill = gpu.graph_counts()
            for i in range(6):
                rows.append(be.forward([40 + i], len(prompt) + i, seq.blocks, 1).copy())
            counts = gpu.graph_counts()
            seq.release()
        return np.concatenate(rows), after_prefill, counts

    for ngl in ("all", 1):
        plain, _, none = decode(False, ngl)
        graphed, after_prefill, (captured, replayed) = decode(True, ngl)
        assert none == (0, 0) and after_prefill == (0, 0)
        # step 1 is seen, step 2 captured, steps 3..6 replay; a program of a few ranges captures each
        assert captured >= 1 and replayed == 4 * captured, (ngl, captured, replayed)
        np.testing.assert_array_equal(graphed, plain, err_msg=f"ngl={ngl}")


def test_a_changed_record_captures_its_graph_again(devices):
    """A graph holds the records it was captured with: after one of them changes (a scale
    here), the step is not replayed from the stale graph but seen and captured again."""
    from pyllm.graph import Graph
    _, gpu = devices
    g = Graph()
    g.scale(g.buffer("x", 64), 2.0)
    prog = gpu.bind(g, [Range(0, len(g.ops))], Shape(1, 1, 1, 1))
    step = StepData(np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32), 1)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    c0 = gpu.graph_counts()
    try:
        for i, s in enumerate((2.0, 2.0, 2.0, 3.0, 3.0, 3.0)):   # seen, captured, replayed; the same again
            if i == 3:
                prog.recs[0].scale = 3.0
            prog.write("x", 0, x)
            prog.run(0, step)
            np.testing.assert_array_equal(prog.read("x", 0, 1), x * np.float32(s))
        c1 = gpu.graph_counts()
        assert (c1[0] - c0[0], c1[1] - c0[1]) == (2, 2)
    finally:
        prog.close()


def test_a_gpu_is_planned_from_its_decode_matmul(fake_gpu, monkeypatch):
    """The planner's GPU reads weights at the rate a decode matmul reached and pays the time of a
    small one per op (CudaDevice.measure's decode_bw and op_s), not the copy rate and an empty
    op's launch: on an H200 those over-predicted decode 2.7x."""
    from pyllm.backend import placement
    _, gpu, _ = fake_gpu
    figs = {"h2d": 12e9, "d2h": 15e9, "latency_s": 6e-6, "mem_bw": 4.1e12, "flops": 13e12, "launch_s": 1.2e-6,
            "decode_bw": 1.3e12, "op_s": 2.3e-6}
    monkeypatch.setattr(placement, "cached", lambda key, measure: (figs, "cached"))
    spec, link, _ = gpu.planning_figures()
    assert (spec.mem_bw, spec.flops, spec.op_s) == (1.3e12, 13e12, 2.3e-6)
    assert (link.h2d, link.d2h, link.latency_s) == (12e9, 15e9, 6e-6)


def test_gpu_figures_fall_back_where_the_decode_probes_do_not_fit(monkeypatch):
    """CudaDevice.measure's decode probes need ~180 MB of GPU memory; where they cannot be
    placed, the decode rate and per-op cost come from the copy rate and the launch cost (a
    third of one, twice the other: the H200's ratios) instead of failing the planning."""
    from pyllm.backend import placement
    real_graph, real_time = placement.calibration_graph, placement.time_program
    monkeypatch.setattr(placement, "calibration_graph", lambda n_in=2048, n_out=2048, n_mat=1, qtype="Q4_0":
                        real_graph(min(n_in, 256), min(n_out, 64), min(n_mat, 2), qtype))

    def time_program(device, graph, n_tokens, reps=3):
        if any(op.weight is not None and op.weight.type == int(QT.Q4_K) for op in graph.ops):
            raise BackendError("cannot allocate 132 MB on cuda:0")
        return real_time(device, graph, n_tokens, reps)
    monkeypatch.setattr(placement, "time_program", time_program)
    gpu = cuda.CudaDevice(0, library=emulator_library())
    try:
        figs = gpu.measure()
    finally:
        gpu.close()
    assert figs["mem_bw"] > 0 and figs["launch_s"] > 0
    assert (figs["decode_bw"], figs["op_s"]) == (figs["mem_bw"] / 3, 2 * figs["launch_s"])
