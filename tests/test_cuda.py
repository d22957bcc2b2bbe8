"""The CUDA backend against the C core.

Without a GPU (CI, most machines) every test here that runs kernels is
skipped with the reason; what can be checked without one still runs: the
ABI declarations parse and agree with the C core's, and the built library
(if `make cuda` ran) loads and reports no device instead of failing.

With a GPU: each kernel against the C core on the same inputs (quantized
activations byte for byte, embeddings bit for bit, matmuls to float
rounding, since the integer part of every block's dot product is the same),
whole synthetic models of every family (all on the GPU, and split with the
CPU, counting the bus), and greedy decoding of the real models."""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm.arch import load_architecture
from pyllm.backend import cuda
from pyllm.backend.base import CONTROL, D2H, H2D, Range, Shape, StepData
from pyllm.backend.cpu import CpuBackend, HostDevice
from pyllm.backend.placement import DeviceSpec, Hardware, LinkSpec, Planner
from pyllm.backend.split import SplitBackend
from pyllm.graph import ACT_F32, OP_ATTENTION, Graph, act_format
from pyllm.model_file import ModelFile, Tensor

GPU_OK, WHY = cuda.available()
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU: {WHY}")

ALL_TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.IQ4_NL,
             QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K]


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
    w = tensor(qtype, n_in, rows, seed=int(qtype))
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
        for i in range(n):   # what the library sends of the step
            k = ops[i].kind
            need |= (k == 1) | ((k in (5, 6, 7)) << 1) | ((k in (6, 7)) << 2)
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
    monkeypatch.setattr(cuda, "device_info", lambda index=0: {"name": "host-backed", "total_bytes": 1 << 30,
                                                                "cc": (0, 0)})
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


# -- kernels, one op at a time ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def devices():
    if not GPU_OK:
        pytest.skip(f"no usable GPU: {WHY}")
    host = HostDevice(2)
    gpu = cuda.CudaDevice(0)
    yield host, gpu
    gpu.close()
    host.close()


def tensor(qtype, n_in, n_out, seed=0, name="w"):
    arr, _ = synth.weight(qtype, n_in, n_out, np.random.default_rng(seed))
    data = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    return Tensor(name, int(qtype), (n_in, n_out), 0, data.nbytes, data)


def run_both(devices, g, inputs: dict, n: int, outputs, table=(0,), pos=None, tokens=None, shape=None):
    """Runs graph g on the host and on the GPU from the same inputs; returns
    ({name: host rows}, {name: gpu rows})."""
    shape = shape or Shape(max(n, 1), max(n, 1), max(len(table), 1), 16)
    step = StepData(np.asarray(tokens if tokens is not None else np.zeros(n), np.int32),
                    np.asarray(pos if pos is not None else np.zeros(n), np.int32), np.asarray(table, np.int32), n)
    out = []
    for dev in devices:
        prog = dev.bind(g, [Range(0, len(g.ops))], shape)
        for name, a in inputs.items():
            prog.write(name, 0, a)
        prog.run(0, step)
        out.append({name: np.array(prog.read(name, 0, n)) for name in outputs})
        prog.close()
    return out


@needs_gpu
@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_matches_the_core(devices, qtype, rows):
    n_in = 512 if qtype in (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K) else 576
    n_out = 200                               # not a multiple of any tile
    w = tensor(qtype, n_in, n_out)
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


@needs_gpu
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_embedding_is_bit_exact(devices, qtype):
    n = 256
    w = tensor(qtype, n, 300)
    g = Graph()
    g.embed(w, "x", scale=1.7)
    tokens = [0, 299, 17, 17, 150]
    cpu, gpu = run_both(devices, g, {}, len(tokens), ["x"], tokens=tokens)
    np.testing.assert_array_equal(gpu["x"], cpu["x"])


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


def close_enough(got, ref, float_weights):
    """Float weights: float rounding only. Quantized: the GPU's float sums can
    flip a rounding tie of an 8-bit activation, which random models amplify
    like any quantization error (tests/test_forward.py, SIMD vs scalar): the
    reference tolerance then, and the same top token where the margin is clear."""
    assert rel(got, ref) < (1e-3 if float_weights else 0.03), rel(got, ref)
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.05 * ref.std()
    assert (got.argmax(1)[clear] == ref.argmax(1)[clear]).all()


@needs_gpu
@pytest.mark.parametrize("family,qtype", [("llama", QT.Q4_0), ("llama", QT.Q4_K), ("mistral", QT.Q8_0),
                                          ("qwen2", QT.Q4_1), ("qwen3", QT.Q6_K), ("phi3", QT.Q5_K),
                                          ("gemma3", QT.F16)], ids=lambda x: getattr(x, "name", x))
def test_model_on_gpu_matches_the_core(devices, tmp_path, family, qtype):
    """300 positions over shuffled 16-position blocks: several attention tiles,
    the sliding windows of mistral and gemma3, GQA, q/k norms, biases, fused
    projections, both RoPE modes."""
    host, gpu = devices
    path = synth.WRITERS[family](tmp_path / "m.gguf", qtype)
    _, g = build(path)
    shape = Shape(64, 64, 24, 16)
    table = list(np.random.default_rng(0).permutation(24))[:20]
    tokens = [int(t) for t in np.random.default_rng(1).integers(2, 500, 304)]
    ref = steps(CpuBackend(g, 2, 64, 64, 24, 16, device=host), tokens, table)
    be, _ = all_on_gpu(g, host, gpu, shape)
    got = steps(be, tokens, table)
    be.close()
    close_enough(got, ref, qtype in (QT.F32, QT.F16, QT.BF16))


@needs_gpu
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


@needs_gpu
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


@needs_gpu
@pytest.mark.model
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_real_model_greedy_tokens(name):
    from pyllm import Model, registry
    path = registry.local_path(name)
    if not path.is_file():
        pytest.skip(f"{path} is not here (the GPU machine has no network: carry it, see benchmarks/gpu_pack.py)")
    prompt = "The three primary colors are"
    out = {}
    for ngl in (0, "all", 8):
        with Model(path, n_ctx=512, n_gpu_layers=ngl, device="cuda" if ngl else None) as m:
            out[ngl] = m.generate(prompt, max_tokens=24, temperature=0).tokens
    assert out["all"] == out[0]
    assert out[8] == out[0]
