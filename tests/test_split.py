"""Split execution between the CPU and the sim device: the same logits as the
CPU alone (the same kernels run on both sides, so bit for bit), and the bytes
the sim's bus counted equal what the plan predicted and what the graph says
is live at the boundary."""
import logging

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm import BackendError, Model
from pyllm.arch import load_architecture
from pyllm.backend.base import CONTROL, D2H, H2D, LOGITS, WEIGHTS, ACTIVATIONS, DeviceMemoryError, Range, Shape
from pyllm.backend.cpu import CpuBackend, HostDevice
from pyllm.backend.placement import DeviceSpec, Hardware, LinkSpec, Planner
from pyllm.backend.sim import SimDevice
from pyllm.backend.split import SplitBackend, op_units
from pyllm.graph import Graph
from pyllm.model_file import ModelFile

SHAPE = Shape(64, 64, 8, 16)
TABLE = [3, 0, 6, 1]


def build(path):
    arch = load_architecture(ModelFile(path))
    g = Graph()
    arch.build(g)
    return arch, g


def hardware(memory=None, stream=False):
    """A GPU much faster than the CPU. stream=False: streaming never pays (the
    CPU reads memory faster than the bus and computes a 64-token batch faster
    than the bus brings the weights); stream=True: a CPU slow at arithmetic,
    so that streaming pays from a batch of a few tens of tokens."""
    if stream:
        return Hardware(DeviceSpec("cpu", 100e9, 0.5e12, 1e-6), DeviceSpec("gpu", 300e9, 20e12, 1e-6, memory=memory),
                        LinkSpec(16e9, 16e9, 0.0))
    return Hardware(DeviceSpec("cpu", 100e9, 10e12, 1e-6), DeviceSpec("gpu", 300e9, 20e12, 5e-6, memory=memory),
                    LinkSpec(16e9, 16e9, 10e-6))


def split_for(g, plan, host, bus_delay=False):
    sim = SimDevice(host, memory=1 << 30)
    sim.bus.delay = bus_delay
    return SplitBackend(g, {"cpu": host, "gpu": sim}, plan.schedules(g), SHAPE, plan.stream_min_batch), sim


def run_steps(be, tokens, n_prefill):
    """Prefill n_prefill tokens (all logits), then decode the rest one at a time."""
    out = [be.forward(tokens[:n_prefill], 0, TABLE, min(n_prefill, be.n_out_max)).copy()]
    for i in range(n_prefill, len(tokens)):
        out.append(be.forward([tokens[i]], i, TABLE, 1).copy())
    return np.concatenate(out)


@pytest.mark.parametrize("family,qtype", [("llama", QT.Q4_K), ("gemma3", QT.Q8_0), ("qwen2", QT.Q4_1),
                                          ("lfm2", QT.Q8_0), ("gpt2", QT.Q8_0), ("granitehybrid", QT.Q8_0),
                                          ("qwen35", QT.Q8_0), ("bert", QT.Q8_0)],
                         ids=lambda x: getattr(x, "name", x))
@pytest.mark.parametrize("ngl", [0, 1, 3, "all"], ids=lambda n: f"ngl{n}")
def test_split_equals_cpu(tmp_path, family, qtype, ngl):
    path = synth.WRITERS[family](tmp_path / "m.gguf", qtype, n_layer=6 if family == "gemma3" else 4)
    arch, g = build(path)
    host = HostDevice(2)
    tokens = [int(t) for t in np.random.default_rng(3).integers(2, 500, 44)]
    ref = run_steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host), tokens, 40)

    plan = Planner(g, hardware(), SHAPE).plan(ngl)
    assert plan.n_gpu_layers == (arch.hp.n_layer if ngl == "all" else ngl)
    be, sim = split_for(g, plan, host)
    got = run_steps(be, tokens, 40)
    np.testing.assert_array_equal(got, ref)

    # one more decode step: counted bytes == the plan's prediction == what is live
    sim.bus.reset()
    be.forward([7], 44, TABLE, 1)
    counted = {k: v for k, v in sim.bus.bytes.items()}
    predicted = {(d, k): v for (dev, d, k), v in plan.schedules(g)["resident"].bus_bytes(1, 1, len(TABLE)).items()}
    assert counted == predicted
    E, V = arch.hp.n_embd, g.ops[-1].y.width     # V: the logits' width (an encoder's rows: n_embd)
    expect = {}
    if plan.uses_gpu:
        # positions, the block table where the GPU holds a KV cache (a GPU of Mamba layers alone does
        # not: Granite 4.0-H at ngl 1), the tokens where it embeds
        gpu_kv = any(g.ops[i].kv_layer >= 0 for seg in plan.schedules(g)["resident"].segments
                     if seg.device != "cpu" for i in range(seg.lo, seg.hi))
        expect[(H2D, CONTROL)] = 4 * (1 + (len(TABLE) if gpu_kv else 0)) + (4 if plan.embed_on_gpu else 0)
        if not plan.embed_on_gpu:
            expect[(H2D, ACTIVATIONS)] = 4 * E          # x, once, into the first GPU layer
        if plan.head_on_gpu:
            expect[(D2H, LOGITS)] = 4 * V               # the logits back
        else:
            expect[(D2H, ACTIVATIONS)] = 4 * E          # x back for the head
    assert counted == expect
    be.close()
    host.close()


@pytest.mark.parametrize("ngl", [1, 2, "all"], ids=lambda n: f"ngl{n}")
def test_split_mrope_image_rows_equal_cpu(tmp_path, ngl):
    """Qwen 3 VL (interleaved M-RoPE, DeepStack after layer 0): an image step (media rows at M-RoPE
    positions) and text after it, split between the CPU and the sim device: the logits of the CPU
    alone; the positions cross the bus once per step, 12 bytes a row, as the plan predicts."""
    path = synth.write_qwen3vl(tmp_path / "m.gguf", QT.Q8_0, n_layer=3, keys={"num_deepstack_layers": 1})
    arch, g = build(path)
    host = HostDevice(2)
    n = arch.hp.n_embd
    media = np.random.default_rng(5).standard_normal((12, 2 * n)).astype(np.float32) * 0.05
    img = [-1 - j for j in range(12)]
    rope_img = np.stack([np.full(12, 4), 4 + np.arange(12) // 4, 4 + np.arange(12) % 4]).astype(np.int32)
    rope_text = np.tile(np.arange(8, 12, dtype=np.int32), (3, 1))

    def run(be):
        out = [be.forward([5, 6, 7, 8], 0, TABLE, 4).copy(),
               be.forward(img, 4, TABLE, 12, media=media, rope_pos=rope_img).copy(),
               be.forward([9, 10, 11, 12], 16, TABLE, 4, rope_pos=rope_text).copy()]
        return np.concatenate(out)
    ref = run(CpuBackend(g, 2, 64, 64, 8, 16, device=host))
    plan = Planner(g, hardware(), SHAPE, embed_on_host=True).plan(ngl)   # as Model places a model with a projector
    if ngl == "all":   # all but layer 0, whose DeepStack slice is an image row's, as the embedding
        assert plan.n_gpu_layers == 2 and plan.head_on_gpu and not plan.embed_on_gpu
        assert Planner(g, hardware(), SHAPE, embed_on_host=True).plan().n_gpu_layers <= 2
    be, sim = split_for(g, plan, host)
    np.testing.assert_array_equal(run(be), ref)
    sim.bus.reset()
    be.forward([13, 14], 20, TABLE, 1, rope_pos=np.tile(np.arange(12, 14, dtype=np.int32), (3, 1)))
    predicted = {(d, k): v for (dev, d, k), v in plan.schedules(g)["resident"].bus_bytes(2, 1, len(TABLE), mrope=True).items()}
    assert dict(sim.bus.bytes) == predicted
    assert predicted[(H2D, CONTROL)] == 4 * 2 + 12 * 2 + 4 * len(TABLE)
    be.close()
    host.close()


@pytest.mark.parametrize("ngl", [1, 2, 3, 5, "all"], ids=lambda n: f"ngl{n}")
def test_split_gemma4_shared_kv(tmp_path, ngl):
    """Gemma 4's shared KV layers on the GPU while the layers whose caches they read stay on the
    CPU: their attention runs beside those caches (q and the output cross the bus), the logits
    equal the CPU's and the counted bytes the plan's."""
    path = synth.write_gemma4(tmp_path / "m.gguf", QT.Q8_0)
    arch, g = build(path)
    host = HostDevice(2)
    tokens = [int(t) for t in np.random.default_rng(3).integers(2, 500, 44)]
    ref = run_steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host), tokens, 40)
    plan = Planner(g, hardware(), SHAPE).plan(ngl)
    kv_ops = [i for i, op in enumerate(g.ops) if op.kv_layer >= 0]
    shared = [i for i in kv_ops if g.ops[i].kv_layer != g.ops[i].layer]
    assert shared and all(plan.op_devices[i] == plan.op_devices[next(j for j in kv_ops if g.ops[j].layer ==
                                                                   g.ops[i].kv_layer)] for i in shared)
    be, sim = split_for(g, plan, host)
    np.testing.assert_array_equal(run_steps(be, tokens, 40), ref)
    sim.bus.reset()
    be.forward([7], 44, TABLE, 1)
    predicted = {(d, k): v for (dev, d, k), v in plan.schedules(g)["resident"].bus_bytes(1, 1, len(TABLE)).items()}
    assert dict(sim.bus.bytes) == predicted
    be.close()
    host.close()


@pytest.mark.parametrize("ngl", [1, 4, 6, "all"], ids=lambda n: f"ngl{n}")
def test_split_gemma3n_streams(tmp_path, ngl):
    """Gemma 3n split between the CPU and the sim device: the residual crosses as its 4 AltUp
    streams and the per-layer inputs with it; the logits equal the CPU's, the counted bytes the
    plan's, and a decode step moves the streams (4 n_embd floats) across each boundary."""
    path = synth.write_gemma3n(tmp_path / "m.gguf", QT.Q8_0, n_layer=7, shared_kv=2)
    arch, g = build(path)
    host = HostDevice(2)
    tokens = [int(t) for t in np.random.default_rng(3).integers(2, 500, 44)]
    ref = run_steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host), tokens, 40)
    plan = Planner(g, hardware(), SHAPE).plan(ngl)
    be, sim = split_for(g, plan, host)
    np.testing.assert_array_equal(run_steps(be, tokens, 40), ref)
    sim.bus.reset()
    be.forward([7], 44, TABLE, 1)
    predicted = {(d, k): v for (dev, d, k), v in plan.schedules(g)["resident"].bus_bytes(1, 1, len(TABLE)).items()}
    assert dict(sim.bus.bytes) == predicted
    if ngl != "all":   # the layers' streams go up to the GPU's first layer
        assert sim.bus.bytes[(H2D, ACTIVATIONS)] >= 4 * arch.n_streams * arch.hp.n_embd
    be.close()
    host.close()


def test_split_prefill_moves_only_the_last_rows_to_the_head(tmp_path):
    """The head's first op reads the last n_out rows of x: with the head on
    the CPU and the layers on the GPU, a 40-token prefill wanting one row of
    logits moves 40 rows of x up but only 1 row down."""
    _, g = build(synth.write_llama(tmp_path / "m.gguf", QT.Q8_0, n_layer=3))
    host = HostDevice(2)
    plan = Planner(g, hardware(), SHAPE).plan(2)        # layers 1-2; the head stays on the CPU
    assert not plan.head_on_gpu and not plan.embed_on_gpu
    be, sim = split_for(g, plan, host)
    be.forward(list(range(5, 45)), 0, TABLE, 1)
    assert sim.bus.bytes[(H2D, ACTIVATIONS)] == 40 * 256 * 4
    assert sim.bus.bytes[(D2H, ACTIVATIONS)] == 1 * 256 * 4
    be.close()
    host.close()


def test_streaming_schedule_equals_cpu_and_counts_weights(tmp_path):
    arch, g = build(synth.write_llama(tmp_path / "m.gguf", QT.Q4_0, n_layer=4))
    host = HostDevice(2)
    tokens = [int(t) for t in np.random.default_rng(4).integers(2, 500, 48)]
    ref = run_steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host), tokens, 40)
    plan = Planner(g, hardware(stream=True), SHAPE).plan(1)
    assert plan.stream and 1 < plan.stream_min_batch <= 40, plan.stream_min_batch
    be, sim = split_for(g, plan, host)
    assert be.schedule_for(40) == "stream" and be.schedule_for(1) == "resident"
    got = run_steps(be, tokens, 40)
    np.testing.assert_array_equal(got, ref)

    sim.bus.reset()
    be.forward(tokens[:40], 0, TABLE, 1)
    counted = dict(sim.bus.bytes)
    predicted = {(d, k): v for (dev, d, k), v in plan.schedules(g)["stream"].bus_bytes(40, 1, len(TABLE)).items()}
    assert counted == predicted
    # the three CPU layers' matmul weights crossed once each
    cpu_layers = [u for u, d in plan.units.items() if isinstance(u, int) and d == "cpu"]
    assert cpu_layers == [0, 1, 2]
    w = sum(op.weight.nbytes for op, u in zip(g.ops, op_units(g)) if u in cpu_layers and op.kind == 4)
    assert counted[(H2D, WEIGHTS)] == w
    # q, k, v come down to the CPU's KV cache and attention, its output goes back
    # up; x goes up once and its last row comes down to the head on the CPU
    hp = arch.hp
    assert counted[(D2H, ACTIVATIONS)] == 40 * 3 * (hp.q_dim + 2 * hp.kv_dim) * 4 + 1 * hp.n_embd * 4
    assert counted[(H2D, ACTIVATIONS)] == 40 * 3 * hp.q_dim * 4 + 40 * hp.n_embd * 4
    be.close()
    host.close()


def test_sim_memory_budget(tmp_path):
    _, g = build(synth.write_llama(tmp_path / "m.gguf", QT.F16))
    host = HostDevice(1)
    sim = SimDevice(host, memory=200_000)
    with pytest.raises(DeviceMemoryError, match=r"sim device: out of memory: .*needs .*weights .* free"):
        sim.bind(g, [Range(0, len(g.ops))], SHAPE)
    assert sim.used == 0
    plan = Planner(g, hardware(), SHAPE).plan(1)
    big = SimDevice(host, memory=64 << 20)
    prog = big.bind(g, plan.schedules(g)["resident"] and
                    [Range(s.lo, s.hi) for s in plan.schedules(g)["resident"].segments if s.device == "gpu"], SHAPE)
    # what the device holds is what the planner sized, and it is counted against the budget
    assert prog.memory == plan.gpu_memory
    assert big.used == sum(plan.gpu_memory.values())
    assert prog.memory["weights"] == sum(t.nbytes for t in prog.weights.values())
    prog.close()
    assert big.used == 0
    host.close()


def test_bus_delay_takes_the_modelled_time(tmp_path):
    _, g = build(synth.write_llama(tmp_path / "m.gguf", QT.Q8_0))
    host = HostDevice(1)
    plan = Planner(g, hardware(), SHAPE).plan(1)
    be, sim = split_for(g, plan, host, bus_delay=True)
    sim.bus.h2d_bytes_per_s = sim.bus.d2h_bytes_per_s = 1e6       # 1 MB/s
    sim.bus.latency_s = 1e-3
    import time
    t0 = time.perf_counter()
    be.forward([5], 0, TABLE, 1)
    dt = time.perf_counter() - t0
    assert dt >= sim.bus.busy_s > 3e-3     # x up, logits down, 2 control arrays: 4 latencies at least
    be.close()
    host.close()


# -- Model(n_gpu_layers=..., device=...) ---------------------------------------------------------------

def test_model_without_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("PYLLM_DEVICE", raising=False)
    path = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0)
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    log = logging.getLogger("pyllm")     # the CLI may have stopped it propagating: listen on it directly
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        with Model(path, n_ctx=64, n_threads=1) as m:
            assert type(m.backend).__name__ == "CpuBackend" and m.plan is None
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert any("no GPU" in r.getMessage() and "running on the CPU" in r.getMessage() for r in records)
    with pytest.raises(BackendError, match="n_gpu_layers=2 asks for a GPU"):
        Model(path, n_ctx=64, n_threads=1, n_gpu_layers=2)
    with pytest.raises(BackendError, match="n_gpu_layers=all asks for a GPU"):
        Model(path, n_ctx=64, n_threads=1, n_gpu_layers="all")
    with pytest.raises(BackendError, match="device=cuda"):
        Model(path, n_ctx=64, n_threads=1, device="cuda")
    with Model(path, n_ctx=64, n_threads=1, n_gpu_layers=0) as m:
        assert type(m.backend).__name__ == "CpuBackend"


def test_model_on_sim(tmp_path, monkeypatch):
    path = synth.write_llama(tmp_path / "m.gguf", QT.Q4_K, n_layer=3)
    ids = list(range(3, 30))
    with Model(path, n_ctx=128, n_threads=2, n_gpu_layers=0) as m:
        ref = m.logits(ids)
        ref_text = m.generate(ids, max_tokens=6, temperature=0).tokens
    for ngl in (1, "all"):
        with Model(path, n_ctx=128, n_threads=2, n_gpu_layers=ngl, device="sim") as m:
            assert type(m.backend).__name__ == "SplitBackend"
            assert m.plan.n_gpu_layers == (1 if ngl == 1 else 3)
            np.testing.assert_array_equal(m.logits(ids), ref)
            assert m.generate(ids, max_tokens=6, temperature=0).tokens == ref_text
    monkeypatch.setenv("PYLLM_DEVICE", "sim")
    monkeypatch.setenv("PYLLM_SIM_MEMORY", "1MiB")
    with pytest.raises(BackendError, match="3 layers and the output head need .* but .* is free"):
        Model(path, n_ctx=128, n_threads=1, n_gpu_layers="all")


@pytest.mark.model
@pytest.mark.parametrize("stream", [False, True], ids=["resident", "streaming"])
def test_smollm2_split_on_sim(smollm2_path, stream):
    """The real model, half its layers on the sim device: the same logits as the
    CPU alone; per decode token only x crosses, up and back down to the head;
    a streamed prefill moves what the plan predicts, the weights of the CPU's
    15 layers included."""
    arch, g = build(smollm2_path)
    host = HostDevice(2)
    shape = Shape(64, 32, 8, 32)
    ids = [1] + list(range(1500, 1519))            # 20 tokens
    table = [2, 5]
    cpu = CpuBackend(g, 2, 64, 32, 8, 32, device=host)
    ref = np.concatenate([cpu.forward(ids[:18], 0, table, 18).copy(), cpu.forward(ids[18:19], 18, table, 1).copy(),
                          cpu.forward(ids[19:], 19, table, 1).copy()])
    plan = Planner(g, hardware(stream=stream), shape).plan(15)
    assert plan.layer_ranges() == "embed cpu | layers 0-14 cpu | layers 15-29 gpu | head cpu"
    assert plan.stream == stream and (not stream or plan.stream_min_batch <= 18)
    sim = SimDevice(host, memory=1 << 30)
    be = SplitBackend(g, {"cpu": host, "gpu": sim}, plan.schedules(g), shape, plan.stream_min_batch)
    got = np.concatenate([be.forward(ids[:18], 0, table, 18).copy(), be.forward(ids[18:19], 18, table, 1).copy()])
    sim.bus.reset()
    got = np.concatenate([got, be.forward(ids[19:], 19, table, 1).copy()])
    np.testing.assert_array_equal(got, ref)
    counted = dict(sim.bus.bytes)
    sched = plan.schedules(g)[be.schedule_for(1)]
    assert counted == {(d, k): v for (dev, d, k), v in sched.bus_bytes(1, 1, len(table)).items()}
    if not stream:
        assert counted == {(H2D, ACTIVATIONS): 576 * 4, (D2H, ACTIVATIONS): 576 * 4, (H2D, CONTROL): 4 + 4 * 2}
        assert plan.decode_bus == {(H2D, ACTIVATIONS): 576 * 4, (D2H, ACTIVATIONS): 576 * 4,
                                   (H2D, CONTROL): 4 + 4 * -(-(plan.decode_ctx + 1) // 32)}
    else:
        sim.bus.reset()
        be.forward(ids[:18], 0, table, 1)
        w = sum(op.weight.nbytes for op, u in zip(g.ops, op_units(g)) if isinstance(u, int) and u < 15
                and op.kind == 4)
        assert sim.bus.bytes[(H2D, WEIGHTS)] == w
        assert dict(sim.bus.bytes) == {(d, k): v for (dev, d, k), v in
                                        plan.schedules(g)["stream"].bus_bytes(18, 1, len(table)).items()}
    be.close()
    cpu.close()
    host.close()


def test_split_with_a_q8_0_kv_cache_equals_cpu(tmp_path):
    """A q8_0 KV cache split between the CPU and the sim device: the same logits as the CPU alone,
    bit for bit; the plan's KV bytes are q8_0's (34 bytes per 32 values against f16's 64)."""
    path = synth.WRITERS["llama"](tmp_path / "m.gguf", QT.Q4_K, n_layer=4)
    _, g = build(path)
    host = HostDevice(2)
    shape = Shape(64, 64, 8, 16, 8, 8)
    tokens = [int(t) for t in np.random.default_rng(3).integers(2, 500, 44)]
    ref = run_steps(CpuBackend(g, 2, 64, 64, 8, 16, device=host, k_type=8, v_type=8), tokens, 40)
    plan = Planner(g, hardware(), shape).plan(2)
    sim = SimDevice(host, memory=1 << 30)
    be = SplitBackend(g, {"cpu": host, "gpu": sim}, plan.schedules(g), shape, plan.stream_min_batch)
    np.testing.assert_array_equal(run_steps(be, tokens, 40), ref)
    f16_plan = Planner(g, hardware(), SHAPE).plan(2)
    assert plan.gpu_memory["kv"] * 64 == f16_plan.gpu_memory["kv"] * 34
