"""The placement planner: memory limits, monotonic behaviour, the streaming
decision, and `pyllm plan`."""
import json
import math

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm import BackendError
from pyllm.arch import load_architecture
from pyllm.backend import placement as P
from pyllm.backend.base import Shape
from pyllm.backend.cpu import HostDevice
from pyllm.backend.placement import DeviceSpec, Hardware, LinkSpec, Planner
from pyllm.backend.sim import SimDevice
from pyllm.backend.split import SplitBackend, op_units
from pyllm.graph import OP_ATTENTION, OP_KV_STORE, OP_MATMUL, Graph
from pyllm.model_file import ModelFile

SHAPE = Shape(64, 32, 16, 16)
MiB = 1 << 20


def graph_of(path):
    arch = load_architecture(ModelFile(path))
    g = Graph()
    arch.build(g)
    return arch, g


@pytest.fixture(scope="module")
def model8(tmp_path_factory):
    """8 layers of a small llama with a larger vocabulary, untied output"""
    path = synth.write_llama(tmp_path_factory.mktemp("m") / "m.gguf", QT.Q4_0, n_layer=8, n_embd=256, n_ff=768,
                             n_vocab=2048)
    return graph_of(path)


def hw(vram=None, pcie=16e9, cpu_bw=20e9, cpu_flops=200e9, latency=10e-6):
    """A GPU that beats the CPU at every layer of these small models (a launch
    costs less than the CPU's barrier and read of a layer)."""
    return Hardware(DeviceSpec("cpu", cpu_bw, cpu_flops, 2e-6),
                    DeviceSpec("gpu", 400e9, 20e12, 1e-6, memory=vram),
                    LinkSpec(pcie, pcie, latency))


def test_no_gpu_and_zero_layers(model8):
    _, g = model8
    for p in (Planner(g, Hardware(DeviceSpec("cpu", 40e9, 200e9, 2e-6)), SHAPE).plan("auto"),
              Planner(g, hw(), SHAPE).plan(0)):
        assert not p.uses_gpu and p.n_gpu_layers == 0 and p.gpu_memory == {}
        assert p.decode_s == p.cpu_decode_s > 0 and not p.decode_bus


def test_explicit_layer_counts(model8):
    _, g = model8
    pl = Planner(g, hw(), SHAPE)
    for n in range(9):
        p = pl.plan(n)
        assert p.n_gpu_layers == n
        gpu_layers = [u for u, d in p.units.items() if isinstance(u, int) and d == "gpu"]
        assert gpu_layers == list(range(8 - n, 8))       # the last n, as llama.cpp
        assert p.head_on_gpu == (n == 8)
    assert pl.plan(99).n_gpu_layers == 8
    p = pl.plan("all")
    assert p.n_gpu_layers == 8 and p.head_on_gpu and p.embed_on_gpu
    with pytest.raises(Exception, match="n_gpu_layers must be"):
        pl.plan("many")


def test_vram_limits_are_kept_and_match_what_the_device_allocates(model8):
    _, g = model8
    host = HostDevice(1)
    full = Planner(g, hw(), SHAPE).plan("all").gpu_memory_total
    seen = set()
    for budget in np.linspace(0, full * 1.1, 9):
        p = Planner(g, hw(vram=int(budget)), SHAPE).plan("auto")
        assert p.gpu_memory_total <= budget
        seen.add(p.n_gpu_layers)
        if p.uses_gpu:
            # a sim device of exactly this budget holds it, and holds what the plan said
            sim = SimDevice(host, memory=int(budget))
            be = SplitBackend(g, {"cpu": host, "gpu": sim}, p.schedules(g), SHAPE, p.stream_min_batch)
            assert be.memory()["gpu"] == p.gpu_memory
            assert sim.used == p.gpu_memory_total
            be.forward([1, 2, 3], 0, [0], 1)
            be.close()
            assert sim.used == 0
    assert min(seen) == 0 and max(seen) == 8 and len(seen) >= 4
    # an explicit count that does not fit is an error that says what it needs
    small = Planner(g, hw(vram=full // 3), SHAPE)
    with pytest.raises(BackendError, match=r"8 layers and the output head need .* on the GPU .* but .* is free"):
        small.plan("all")
    host.close()


@pytest.mark.parametrize("objective", [(512, 128), (0, 1)], ids=["request", "decode"])
def test_monotonic_in_vram(model8, objective):
    _, g = model8
    full = Planner(g, hw(), SHAPE).plan("all").gpu_memory_total
    prev = None
    for budget in np.linspace(0, full * 1.2, 25):
        pl = Planner(g, hw(vram=int(budget)), SHAPE, objective=objective)
        p = pl.plan()
        t = pl.request_time(p)
        if prev is not None:
            assert t <= prev[0] * (1 + 1e-12)
            assert p.n_gpu_layers >= prev[1]
            if objective == (0, 1):
                assert p.decode_tokens_per_s >= prev[2] * (1 - 1e-12)
        prev = (t, p.n_gpu_layers, p.decode_tokens_per_s)
    assert prev[1] == 8


@pytest.mark.parametrize("vram_frac", [0.4, 2.0])
def test_monotonic_in_bandwidth(model8, vram_frac):
    _, g = model8
    full = Planner(g, hw(), SHAPE).plan("all").gpu_memory_total
    prev = None
    for gbs in (0.5, 1, 2, 4, 8, 16, 32, 64, 128):
        pl = Planner(g, hw(vram=int(full * vram_frac), pcie=gbs * 1e9), SHAPE)
        p = pl.plan()
        t = pl.request_time(p)
        if prev is not None:
            assert t <= prev[0] * (1 + 1e-12)
            assert p.prefill_tokens_per_s >= prev[1] * (1 - 1e-12)
        prev = (t, p.prefill_tokens_per_s)


def test_streaming_decision_flips_where_the_arithmetic_says(model8, monkeypatch):
    """With every fixed cost zero, an infinitely fast GPU and a CPU whose
    memory is free but whose arithmetic is not, prefilling n tokens through
    the CPU layers costs n F / cpu_flops on the CPU, and streaming them costs
    (W + n A) / pcie: W their matmul weights, A the activations a token moves
    (q, k, v down to the CPU's KV cache and attention, its output back up).
    Streaming pays from the first n above N* = (W / pcie) / (F / cpu_flops - A / pcie)."""
    arch, g = model8
    monkeypatch.setattr(P, "STEP_S", 0.0)
    hp = arch.hp
    units = op_units(g)
    cpu_layers = range(6)           # -ngl 2: layers 6, 7 on the GPU
    ops = [op for op, u in zip(g.ops, units) if u in cpu_layers and op.kind not in (OP_KV_STORE, OP_ATTENTION)]
    W = sum(op.weight.nbytes for op in ops if op.kind == OP_MATMUL)
    F = sum(2 * op.n_in * op.n_out for op in ops if op.kind == OP_MATMUL)
    A = len(cpu_layers) * ((hp.q_dim + 2 * hp.kv_dim) + hp.q_dim) * 4
    shape = Shape(512, 32, 64, 16)
    seen = []
    for cpu_flops, pcie in ((50e9, 16e9), (1e12, 16e9), (2e12, 8e9), (3e12, 8e9), (20e12, 4e9)):
        h = Hardware(DeviceSpec("cpu", 1e18, cpu_flops, 0.0), DeviceSpec("gpu", 1e18, 1e18, 0.0),
                     LinkSpec(pcie, pcie, 0.0))
        p = Planner(g, h, shape).plan(2)
        n_star = (W / pcie) / (F / cpu_flops - A / pcie)
        expect = math.floor(n_star) + 1 if n_star > 0 else 10 ** 9
        seen.append(p.stream_min_batch)
        if expect > shape.n_batch:
            assert not p.stream and p.stream_min_batch is None
        else:
            assert p.stream and p.stream_min_batch == expect, (cpu_flops, pcie, n_star, p.stream_min_batch)
    assert seen[0] == 1 and 10 < seen[1] < seen[2] < seen[3] <= 512 and seen[4] is None, seen
    # a CPU that computes faster than the bus can bring weights never streams
    h = Hardware(DeviceSpec("cpu", 1e18, 1e15, 0.0), DeviceSpec("gpu", 1e18, 1e18, 0.0), LinkSpec(16e9, 16e9, 0.0))
    p = Planner(g, h, shape).plan(2)
    assert not p.stream and "does not pay" in p.stream_note


def test_streaming_threshold_falls_as_the_bus_gets_faster(model8):
    _, g = model8
    prev = None
    for gbs in (2, 4, 8, 16, 32, 64):
        p = Planner(g, hw(pcie=gbs * 1e9, cpu_bw=200e9, cpu_flops=50e9), Shape(512, 32, 64, 16)).plan(2)
        n = p.stream_min_batch if p.stream else 10 ** 9
        if prev is not None:
            assert n <= prev
        prev = n
    assert prev < 10 ** 9


@pytest.mark.model
def test_smollm2_plan_for_a_4gib_gpu(smollm2_path):
    _, g = graph_of(smollm2_path)
    shape = Shape(512, 32, 128, 32)
    p = Planner(g, hw(vram=4 << 30), shape).plan()
    assert p.n_gpu_layers == 30 and p.head_on_gpu and p.embed_on_gpu      # the model fits whole
    assert p.gpu_memory["kv"] == 30 * 2 * 128 * 32 * 192 * 2                # 30 layers, 4096 positions, f16 K and V
    assert p.decode_bus == {("d2h", "logits"): 49152 * 4, ("h2d", "control"): 4 + 4 + 4 * 9}
    p2 = Planner(g, hw(vram=60 * MiB), shape).plan()
    assert 0 < p2.n_gpu_layers < 30 and p2.gpu_memory_total <= 60 * MiB
    text = P.describe(p2)
    assert "plan (auto)" in text and "tokens/s predicted" in text


def _cli():
    try:
        from pyllm.cli.main import app
    except ImportError:   # not installed: the checkout's cli package
        from cli.main import app
    from typer.testing import CliRunner
    return CliRunner(), app


def test_cli_plan(model8, tmp_path):
    path = synth.write_llama(tmp_path / "m.gguf", QT.Q4_0, n_layer=8, n_embd=256, n_ff=768, n_vocab=2048)
    runner, app = _cli()
    args = ["plan", "-m", path, "--cpu-bw", "20GB/s", "--cpu-flops", "200G", "-c", "256", "--launch", "1us"]
    r = runner.invoke(app, args + ["--vram", "4GiB", "--pcie", "16GB/s", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["n_gpu_layers"] == 8 and d["head_on_gpu"] and d["n_ctx"] == 256
    assert d["hardware"]["gpu"]["memory"] == 4 << 30 and d["hardware"]["link"]["h2d"] == 16e9
    assert d["decode_tokens_per_s"] > d["cpu_decode_tokens_per_s"] > 0
    r = runner.invoke(app, args + ["--vram", "4GiB", "--pcie", "16GB/s", "-ngl", "3"])
    assert r.exit_code == 0, r.output
    assert "plan (n_gpu_layers=3): embed cpu | layers 0-4 cpu | layers 5-7 gpu | head cpu" in r.stdout
    assert "link: 16.0 GB/s to the GPU" in r.stdout
    r = runner.invoke(app, args + ["--vram", "1MiB", "-ngl", "all"])
    assert r.exit_code == 2 and "is free" in r.output


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K", "F16"])
def test_calibration_graph_is_n_matmuls_of_its_type(qtype):
    """The programs the GPU's figures are timed with (CudaDevice.measure): n matrices of one
    type on one input, whose bytes weight_bytes counts; they run (here on the host)."""
    from pyllm.backend.cpu import HostDevice
    from pyllm.graph import OP_MATMUL
    g = P.calibration_graph(512, 40, 3, qtype)
    mats = [op for op in g.ops if op.kind == OP_MATMUL]
    assert len(mats) == 3 and {op.weight.type for op in mats} == {int(QT[qtype])}
    per_row = {"Q4_0": 512 // 32 * 18, "Q4_K": 512 // 256 * 144, "F16": 512 * 2}[qtype]
    assert P.weight_bytes(g) == 3 * 40 * per_row
    host = HostDevice(1)
    try:
        assert 0 < P.time_program(host, g, 1) < 10
    finally:
        host.close()
