"""Placement: which part of the model runs where, and what that will cost.

The model is its op program (pyllm/graph.py), cut into units: the
embedding, each layer, the output head. A placement puts every unit on the
CPU or the GPU; for decode the GPU holds a suffix of the layers (the last
N, as llama.cpp offloads them), optionally the head, and the embedding when
everything else is there too. Each unit's weights and KV pools live where it
runs, so a step moves only the live activations at device boundaries (for
a decode split: the residual stream x up, the logits down) plus the step's
tokens, positions and block table.

The cost model is a roofline per op, on the device that runs it:

    op time = max(bytes it reads / memory bandwidth, FLOPs / arithmetic rate)
              + a fixed cost per op (a kernel launch; a barrier on the CPU)

with the bytes and FLOPs counted from the op's shapes (a matmul reads its
whole weight once per step and does 2 n_in n_out FLOPs per row; attention
reads the K/V it attends over; elementwise ops read and write their rows).
Every transfer costs the link's latency plus bytes / bandwidth in its
direction; the transfers are the schedule's (split.py), so the bytes the
plan predicts are the bytes split execution moves. A step's time is the sum:
nothing overlaps, as nothing overlaps in the executor today.

Decode: among the placements that fit the GPU's free memory (weights + KV
pools for the context + activation buffers + the streaming staging area,
sized by lowering.memory_plan exactly as the device allocates them), the
one with the least predicted time per token. The options are ordered by the
GPU memory they need and a later one is taken only when it is strictly
faster, so more memory or a faster link never gives a slower plan.

Prefill: for the layers whose weights stay on the CPU, a large batch can
instead run on the GPU with those weights streamed over the bus each step
(their KV-cache ops stay on the CPU with their pools). That pays when the
CPU's compute time for the batch exceeds the copy time of the weights plus
the extra activation traffic: streaming has a fixed cost per step (the
weights) and a small cost per token, computing on the CPU a large cost per
token, so there is a batch size from which streaming wins; the plan finds
it (stream_min_batch) and the split backend streams for steps at least
that large.

Hardware figures are measured where the hardware exists (CPU memory
bandwidth and matmul rate by a quick calibration, host<->device bandwidth
and latency by timed copies; cached in ~/.cache/pyllm/hardware.json), given
(pyllm plan --vram 4GiB --pcie 16GB/s ...), or assumed (the defaults below);
the plan says which.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..errors import BackendError, InvalidArgumentError
from ..graph import (OP_ATTENTION, OP_DELTA_NET, OP_EMBED, OP_KV_STORE, OP_MATMUL, OP_MATMUL_COLS, OP_MATMUL_ID,
                     OP_SSM_CONV, OP_SSM_SCAN, OP_WKV, OPF_LAST_ROWS, OPF_MEDIA_ONLY, OPF_OUT_ROWS, OPF_V_IN_K, Graph)
from ..units import fmt_bytes, fmt_rate
from .base import D2H, H2D, Range, Shape
from .lowering import memory_plan, step_needs
from .split import HOST, Schedule, make_schedule, op_units

GPU = "gpu"

# assumed when not measured or given
DEFAULT_GPU = dict(mem_bw=300e9, flops=20e12, launch_s=5e-6)
DEFAULT_LINK = dict(h2d=16e9, d2h=16e9, latency_s=10e-6)
CUDA_RESERVE = 256 << 20      # a CUDA context and the allocator's slack, kept free
STEP_S = 10e-6                # Python + FFI per segment a step runs


# -- hardware ---------------------------------------------------------------------------------

@dataclass
class DeviceSpec:
    name: str
    mem_bw: float             # bytes/s the device's kernels read weights at
    flops: float              # FLOP/s its matmul kernels reach on a large batch
    op_s: float               # fixed cost per op (launch, barrier)
    memory: Optional[int] = None   # bytes free for pyllm (None: not a constraint)
    reserve: int = 0          # of that, kept free


@dataclass
class LinkSpec:
    h2d: float                # bytes/s host -> device
    d2h: float                # bytes/s device -> host
    latency_s: float          # per transfer


@dataclass
class Hardware:
    cpu: DeviceSpec
    gpu: Optional[DeviceSpec] = None
    link: Optional[LinkSpec] = None
    source: dict = field(default_factory=dict)   # figure -> "measured" | "given" | "assumed" | "cached"

    def with_gpu(self, **kw) -> "Hardware":
        """A copy with some GPU/link figures changed (for what-if plans and tests)."""
        gpu = DeviceSpec(**{**asdict(self.gpu), **{k: v for k, v in kw.items() if k in DeviceSpec.__annotations__}})
        link = LinkSpec(**{**asdict(self.link), **{k: v for k, v in kw.items() if k in LinkSpec.__annotations__}})
        return Hardware(self.cpu, gpu, link, dict(self.source))


def default_cpu(n_threads: int) -> DeviceSpec:
    """Assumed figures for a CPU (per thread; a desktop core with AVX2)."""
    return DeviceSpec(f"cpu ({n_threads} threads)", mem_bw=min(8e9 * n_threads, 60e9),
                      flops=40e9 * n_threads, op_s=1.5e-6)


# -- the model's costs ------------------------------------------------------------------------------

def _rows(op, n: int, n_out: int) -> int:
    return n_out if op.flags & (OPF_LAST_ROWS | OPF_OUT_ROWS) else n


def op_cost(op, n: int, n_out: int, ctx: float) -> tuple[float, float]:
    """(bytes read and written, FLOPs) of one op for a step of n tokens whose
    rows attend over `ctx` positions on average."""
    rows = _rows(op, n, n_out)
    if op.kind in (OP_MATMUL, OP_MATMUL_COLS):
        act = rows * (op.n_in + op.n_out) * 4
        return op.weight.nbytes + act, 2.0 * op.n_in * op.n_out * rows
    if op.kind == OP_MATMUL_ID:   # the experts the step's tokens chose: k of n each, at most all
        used = min(1.0, rows * op.n_head / op.n_kv_head)
        act = rows * op.n_head * (op.n_in + op.n_out) * 4
        return op.weight.nbytes * used + act, 2.0 * op.n_in * op.n_out * rows * op.n_head
    if op.kind == OP_EMBED:
        return rows * (op.weight.row_bytes + op.n_in * 4), 0.0
    if op.kind == OP_ATTENTION:
        seen = min(ctx, op.window) if op.window > 0 else ctx
        hd_v = op.head_dim_v or op.head_dim
        pooled = op.n_kv_head * (op.head_dim + (0 if op.flags & OPF_V_IN_K else hd_v))   # f16 per position
        group = op.n_head // op.n_kv_head
        tiles = max(1.0, rows / (16 if group <= 16 else max(1, 256 // group)))   # K/V read once per tile
        return seen * pooled * 2 * tiles + rows * op.n_head * (op.head_dim + hd_v) * 4, \
            2.0 * op.n_head * (op.head_dim + hd_v) * seen * rows
    if op.kind == OP_KV_STORE:   # f32 in, f16 out
        stored = op.n_kv_head * (op.head_dim + (0 if op.flags & OPF_V_IN_K else op.head_dim_v or op.head_dim))
        return rows * stored * (4 + 2), 0.0
    if op.kind == OP_SSM_SCAN:   # the state read and written once per step; ~6 FLOPs per state value and token
        states = op.n_head * op.head_dim * op.n_in
        return states * 4 * 2 + rows * (op.x.width + op.y.width) * 4, 6.0 * states * rows
    if op.kind == OP_DELTA_NET:   # the state read and written once per step; 4 passes of 2 FLOPs per value and token
        states = op.n_head * op.head_dim * op.head_dim_v
        return states * 4 * 2 + rows * (op.x.width + op.y.width) * 4, 8.0 * states * rows
    if op.kind == OP_WKV:   # the state read and written once per step; 2 passes of 2 FLOPs per value and token
        states = op.n_head * op.head_dim * op.head_dim
        return states * 4 * 2 + rows * (op.x.width + op.y.width) * 4, 4.0 * states * rows
    if op.kind == OP_SSM_CONV:
        return rows * op.n_in * 4 * 2 + op.n_in * op.n_head * 4, 2.0 * op.n_in * op.n_head * rows
    width = sum(v.width for v in (op.x, op.x2, op.y) if v is not None) or op.n_in
    return rows * width * 4 * 2, 0.0


def op_time(op, spec: DeviceSpec, n: int, n_out: int, ctx: float) -> float:
    nbytes, fl = op_cost(op, n, n_out, ctx)
    return max(nbytes / spec.mem_bw, fl / spec.flops) + spec.op_s


def schedule_time(schedule: Schedule, hw: Hardware, n: int, n_out: int, ctx: float, n_table: int) -> float:
    """Predicted seconds of one step."""
    specs = {HOST: hw.cpu, GPU: hw.gpu}
    t = 0.0
    for seg in schedule.segments:
        spec = specs[seg.device]
        t += STEP_S + sum(op_time(op, spec, n, n_out, ctx) for op in schedule.graph.ops[seg.lo:seg.hi])
    if hw.link is not None:
        for (dev, direction, kind), nbytes in schedule.bus_bytes(n, n_out, n_table).items():
            bw = hw.link.h2d if direction == H2D else hw.link.d2h
            t += nbytes / bw
        t += hw.link.latency_s * transfer_count(schedule)
    return t


def transfer_count(schedule: Schedule) -> int:
    """Copies one step makes over the bus: activations, the step's arrays, streamed weights."""
    n = sum((tr.src != HOST) + (tr.dst != HOST) for tr in schedule.transfers())
    for dev in schedule.devices:
        if dev == HOST:
            continue
        ops = [op for s in schedule.segments if s.device == dev for op in schedule.graph.ops[s.lo:s.hi]]
        n += sum(step_needs(ops))
        n += sum(1 for s in schedule.segments if s.device == dev and s.streamed
                 for op in schedule.graph.ops[s.lo:s.hi] if op.kind == OP_MATMUL)
    return n


# -- the plan ----------------------------------------------------------------------------------------

@dataclass
class Plan:
    """Where each unit runs and what the planner predicts. Units: "embed",
    layer numbers, "head"; devices: "cpu", "gpu"."""
    n_layer: int
    units: dict                       # unit -> "cpu" | "gpu"
    reason: str                       # how it was chosen
    hardware: Optional[Hardware] = None
    gpu_memory: dict = field(default_factory=dict)     # bytes by kind the GPU holds
    gpu_budget: Optional[int] = None                   # bytes the GPU has for pyllm (free - reserve)
    decode_s: float = 0.0             # predicted per token
    cpu_decode_s: float = 0.0         # all on the CPU, for comparison
    prefill_tokens: int = 512
    prefill_s: float = 0.0            # predicted for prefill_tokens from an empty context
    prefill_resident_s: float = 0.0   # the same without streaming
    cpu_prefill_s: float = 0.0
    stream: bool = False              # stream CPU layers' weights for large batches
    stream_min_batch: Optional[int] = None
    stream_note: str = ""
    decode_bus: dict = field(default_factory=dict)    # per decode token: (direction, kind) -> bytes
    prefill_bus: dict = field(default_factory=dict)   # per prefill_tokens: (direction, kind) -> bytes
    decode_ctx: int = 256
    n_batch: int = 512
    op_devices: list = field(default_factory=list, repr=False)      # resident schedule, per op
    stream_devices: list = field(default_factory=list, repr=False)  # streaming schedule, per op
    stream_flags: list = field(default_factory=list, repr=False)

    @property
    def n_gpu_layers(self) -> int:
        return sum(1 for u, d in self.units.items() if isinstance(u, int) and d == GPU)

    @property
    def head_on_gpu(self) -> bool:
        return self.units.get("head") == GPU

    @property
    def embed_on_gpu(self) -> bool:
        return self.units.get("embed") == GPU

    @property
    def uses_gpu(self) -> bool:
        return any(d == GPU for d in self.units.values())

    @property
    def decode_tokens_per_s(self) -> float:
        return 1.0 / self.decode_s if self.decode_s else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def gpu_memory_total(self) -> int:
        return sum(self.gpu_memory.values())

    def schedules(self, graph: Graph) -> dict[str, Schedule]:
        out = {"resident": make_schedule(graph, self.op_devices)}
        if self.stream:
            out["stream"] = make_schedule(graph, self.stream_devices, self.stream_flags)
        return out

    def layer_ranges(self) -> str:
        """'embed cpu | layers 0-14 cpu | layers 15-29 gpu | head gpu'"""
        parts, run = [], []

        def flush():
            if run:
                a, b, d = run[0][0], run[-1][0], run[0][1]
                parts.append(f"layer {a} {d}" if a == b else f"layers {a}-{b} {d}")
                run.clear()

        for u, d in self.units.items():
            if isinstance(u, int):
                if run and run[-1][1] != d:
                    flush()
                run.append((u, d))
            else:
                flush()
                parts.append(f"{u} {d}")
        flush()
        return " | ".join(parts)

    def as_dict(self) -> dict:
        return {"n_layer": self.n_layer, "n_gpu_layers": self.n_gpu_layers, "head_on_gpu": self.head_on_gpu,
                "embed_on_gpu": self.embed_on_gpu, "placement": self.layer_ranges(), "reason": self.reason,
                "gpu_memory": self.gpu_memory, "gpu_budget": self.gpu_budget,
                "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
                "cpu_decode_tokens_per_s": round(1 / self.cpu_decode_s, 2) if self.cpu_decode_s else None,
                "prefill_tokens": self.prefill_tokens,
                "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
                "cpu_prefill_tokens_per_s": round(self.prefill_tokens / self.cpu_prefill_s, 2)
                if self.cpu_prefill_s else None,
                "stream": self.stream, "stream_min_batch": self.stream_min_batch, "stream_note": self.stream_note,
                "decode_bus_bytes_per_token": {f"{d}.{k}": v for (d, k), v in sorted(self.decode_bus.items())},
                "prefill_bus_bytes": {f"{d}.{k}": v for (d, k), v in sorted(self.prefill_bus.items())},
                "hardware": None if self.hardware is None else {
                    "cpu": asdict(self.hardware.cpu),
                    "gpu": asdict(self.hardware.gpu) if self.hardware.gpu else None,
                    "link": asdict(self.hardware.link) if self.hardware.link else None,
                    "source": self.hardware.source}}


def parse_n_gpu_layers(value: Any) -> Any:
    """None/'auto' -> 'auto'; 'all' -> 'all'; a number -> int >= 0."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return "auto"
    if isinstance(value, str) and value.strip().lower() in ("all", "max"):
        return "all"
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"n_gpu_layers must be auto, all or a number of layers, not {value!r}") from None
    if n < 0:
        raise InvalidArgumentError(f"n_gpu_layers must be at least 0, not {n}")
    return n


def _bus_by_kind(bus: dict) -> dict:
    out: dict = {}
    for (_, direction, kind), n in bus.items():
        out[(direction, kind)] = out.get((direction, kind), 0) + n
    return out


class Planner:
    """Plans for one graph on one piece of hardware.

    objective: (prefill tokens, decode tokens) of the request whose time the
    automatic placement minimises: by default pp512 + tg128, so that a plan
    which leaves no room to stream a long prompt's weights is not taken for a
    slightly faster decode; (0, 1) plans for decode alone."""

    def __init__(self, graph: Graph, hw: Hardware, shape: Shape, decode_ctx: int = 256, prefill_tokens: int = 512,
                 objective: tuple[int, int] = (512, 128), embed_on_host: bool = False):
        """embed_on_host: the token embedding stays on the host (a prompt's image rows are
        the host's; a GPU's embedding cannot take them), and so do the first layers where
        they read image rows too (Qwen 3 VL's DeepStack)."""
        self.graph, self.hw, self.shape = graph, hw, shape
        self.embed_on_host = embed_on_host
        self.units = op_units(graph)
        self.layers = sorted({u for u in self.units if isinstance(u, int)})
        media_layers = [self.layers.index(u) + 1 for u, op in zip(self.units, graph.ops)
                        if op.kind == OP_EMBED and op.flags & OPF_MEDIA_ONLY and isinstance(u, int)]
        self.max_gpu_layers = len(self.layers) - (max(media_layers) if embed_on_host and media_layers else 0)
        self.decode_ctx = max(1, min(decode_ctx, shape.n_blocks * shape.block_size - 1))
        self.prefill_tokens = max(1, min(prefill_tokens, shape.n_blocks * shape.block_size))
        self.objective = objective
        embed_w = {op.weight.name for op in graph.ops if op.kind == OP_EMBED}
        self.tied = any(self.units[i] == "head" and op.weight is not None and op.weight.name in embed_w
                        for i, op in enumerate(graph.ops))
        self._op_t: dict = {}

    # -- costs ---------------------------------------------------------------------------------------
    def step_time(self, s: Schedule, n: int, ctx: float, n_table: int) -> float:
        """schedule_time, with op times cached across the options a plan weighs"""
        specs = {HOST: self.hw.cpu, GPU: self.hw.gpu}
        t = 0.0
        for seg in s.segments:
            t += STEP_S
            for i in range(seg.lo, seg.hi):
                key = (i, seg.device, n, ctx)
                v = self._op_t.get(key)
                if v is None:
                    v = self._op_t[key] = op_time(self.graph.ops[i], specs[seg.device], n, 1, ctx)
                t += v
        if self.hw.link is not None:
            for (dev, direction, kind), nbytes in s.bus_bytes(n, 1, n_table).items():
                t += nbytes / (self.hw.link.h2d if direction == H2D else self.hw.link.d2h)
            t += self.hw.link.latency_s * transfer_count(s)
        return t

    def n_table(self, ctx: int) -> int:
        return max(1, -(-ctx // self.shape.block_size))

    def decode_time(self, s: Schedule) -> float:
        return self.step_time(s, 1, self.decode_ctx, self.n_table(self.decode_ctx + 1))

    def chunk_time(self, s: Schedule, n: int, start: int) -> float:
        return self.step_time(s, n, start + (n + 1) / 2, self.n_table(start + n))

    def prefill(self, scheds: dict, stream_min: Optional[int], tokens: Optional[int] = None) -> tuple[float, dict]:
        """(seconds, bus bytes by (direction, kind)) to prefill `tokens` from an empty context"""
        t, bus, start = 0.0, {}, 0
        N, B = tokens or self.prefill_tokens, self.shape.n_batch
        while start < N:
            n = min(B, N - start)
            s = scheds["stream"] if stream_min is not None and n >= stream_min else scheds["resident"]
            t += self.chunk_time(s, n, start)
            for k, v in _bus_by_kind(s.bus_bytes(n, 1, self.n_table(start + n))).items():
                bus[k] = bus.get(k, 0) + v
            start += n
        return t, bus

    def stream_threshold(self, resident: Schedule, stream: Schedule) -> Optional[int]:
        """The smallest batch from which the streaming schedule is faster
        (None: not even at n_batch). Streaming costs more per step (the
        weights) and less per token, so the gain grows with the batch."""
        def gain(n):
            return self.chunk_time(resident, n, 0) - self.chunk_time(stream, n, 0)

        hi = self.shape.n_batch
        if gain(hi) <= 0:
            return None
        lo = 1
        if gain(lo) > 0:
            return lo
        while hi - lo > 1:   # gain(lo) <= 0 < gain(hi)
            mid = (lo + hi) // 2
            if gain(mid) > 0:
                hi = mid
            else:
                lo = mid
        return hi

    # -- placements ----------------------------------------------------------------------------------
    def unit_map(self, gpu_layers: int, head: bool, embed: bool) -> dict:
        n = len(self.layers)
        m = {"embed": GPU if embed else HOST}
        for i, layer in enumerate(self.layers):
            m[layer] = GPU if i >= n - gpu_layers else HOST
        if "head" in self.units:
            m["head"] = GPU if head else HOST
        return m

    def op_devices(self, units: dict) -> list[str]:
        """Each op runs where its layer is, except an attention over another layer's cache
        (Gemma 4's shared KV layers): it runs where that cache is, its q and output crossing."""
        devs = [units[u] for u in self.units]
        home = {op.kv_layer: devs[i] for i, op in enumerate(self.graph.ops) if op.kind == OP_KV_STORE}
        for i, op in enumerate(self.graph.ops):
            if op.kind == OP_ATTENTION and op.kv_layer in home:
                devs[i] = home[op.kv_layer]
        return devs

    def stream_devices(self, units: dict) -> tuple[list[str], list[bool]]:
        """The streaming schedule: the ops of CPU-resident layers run on the
        GPU, streamed, except their KV-cache ops."""
        devs, flags = [], []
        for u, op, dev in zip(self.units, self.graph.ops, self.op_devices(units)):
            if isinstance(u, int) and units[u] == HOST and op.kv_layer < 0 and op.state is None:
                devs.append(GPU)
                flags.append(True)
            else:
                devs.append(dev)
                flags.append(False)
        return devs, flags

    def gpu_memory(self, schedules: list[Schedule]) -> dict:
        ranges = []
        for s in schedules:
            for seg in s.segments:
                r = Range(seg.lo, seg.hi, seg.streamed)
                if seg.device == GPU and r not in ranges:
                    ranges.append(r)
        return memory_plan(self.graph, ranges, self.shape).bytes() if ranges else {}

    def options(self) -> list[tuple[int, bool, bool]]:
        """(GPU layers, head on the GPU, embedding on the GPU)"""
        n = len(self.layers)
        head = "head" in self.units
        out = [(k, h, False) for k in range(self.max_gpu_layers + 1) for h in ((False, True) if head else (False,))]
        if head and not self.embed_on_host:
            out.append((n, True, True))
        return out

    @property
    def budget(self) -> Optional[int]:
        g = self.hw.gpu
        return None if g is None or g.memory is None else g.memory - g.reserve

    def evaluate(self, units: dict, reason: str, allow_stream: bool = True) -> Plan:
        """The plan for one placement: memory, streaming, predicted speeds and bytes."""
        g = self.graph
        op_devs = self.op_devices(units)
        resident = make_schedule(g, op_devs)
        p = Plan(n_layer=len(self.layers), units=units, reason=reason, hardware=self.hw,
                 prefill_tokens=self.prefill_tokens, decode_ctx=self.decode_ctx, n_batch=self.shape.n_batch,
                 op_devices=op_devs, gpu_budget=self.budget)
        scheds = {"resident": resident}
        p.gpu_memory = self.gpu_memory([resident])
        p.decode_s = self.decode_time(resident)
        p.prefill_resident_s, p.prefill_bus = self.prefill(scheds, None)
        p.prefill_s = p.prefill_resident_s
        if p.uses_gpu:
            p.decode_bus = _bus_by_kind(resident.bus_bytes(1, 1, self.n_table(self.decode_ctx + 1)))
        if not p.uses_gpu:
            return p
        if not any(isinstance(u, int) and d == HOST for u, d in units.items()):
            p.stream_note = "every layer is resident on the GPU"
            return p
        if not allow_stream:
            return p
        devs, flags = self.stream_devices(units)
        stream = make_schedule(g, devs, flags)
        stream_min = self.stream_threshold(resident, stream)
        if stream_min is None:
            p.stream_note = f"streaming the CPU layers' weights does not pay up to a batch of {self.shape.n_batch}"
            return p
        mem = self.gpu_memory([resident, stream])
        if self.budget is not None and sum(mem.values()) > self.budget:
            p.stream_note = (f"streaming would pay from a batch of {stream_min}, but its staging area "
                             f"({fmt_bytes(mem['staging'])}) does not fit")
            return p
        p.stream, p.stream_min_batch, p.gpu_memory = True, stream_min, mem
        p.stream_devices, p.stream_flags = devs, flags
        scheds["stream"] = stream
        p.prefill_s, p.prefill_bus = self.prefill(scheds, stream_min)
        if stream_min <= 1:   # then decode steps stream too
            p.decode_s = self.decode_time(stream)
            p.decode_bus = _bus_by_kind(stream.bus_bytes(1, 1, self.n_table(self.decode_ctx + 1)))
            p.stream_note = "every step streams the CPU layers' weights (the bus beats the CPU even for one token)"
        else:
            p.stream_note = f"prefill steps of {stream_min}+ tokens stream the CPU layers' weights"
        return p

    def request_time(self, p: Plan) -> float:
        n_pre, n_dec = self.objective
        t = n_dec * p.decode_s
        if n_pre:
            t += p.prefill_s * n_pre / p.prefill_tokens
        return t

    def plan(self, n_gpu_layers: Any = "auto") -> Plan:
        ngl = parse_n_gpu_layers(n_gpu_layers)
        n = len(self.layers)
        cpu_units = self.unit_map(0, False, False)
        if self.hw.gpu is None or ngl == 0:
            p = self.evaluate(cpu_units, "no GPU" if self.hw.gpu is None else "n_gpu_layers=0")
        elif ngl != "auto":
            k = min(n if ngl == "all" else ngl, self.max_gpu_layers)
            head = ngl == "all" or ngl >= n    # DeepStack's first layers may stay on the host, the head need not
            embed = head and (self.tied or ngl == "all") and not self.embed_on_host
            p = self.evaluate(self.unit_map(k, head, embed), f"n_gpu_layers={ngl}")
            budget = self.budget
            if budget is not None and p.gpu_memory_total > budget:
                if p.stream:   # without the staging area it may still fit
                    p = self.evaluate(p.units, p.reason, allow_stream=False)
                if p.gpu_memory_total > budget:
                    raise BackendError(
                        f"{k} layers{' and the output head' if head else ''} need {fmt_bytes(p.gpu_memory_total)} "
                        f"on the GPU ({', '.join(f'{a} {fmt_bytes(b)}' for a, b in p.gpu_memory.items() if b)}) "
                        f"but {fmt_bytes(max(budget, 0))} is free; use fewer layers (-ngl) or a smaller context (-c)")
        else:
            p = self._auto()
        cpu = p if not p.uses_gpu else self.evaluate(cpu_units, "cpu")
        p.cpu_decode_s, p.cpu_prefill_s = cpu.decode_s, cpu.prefill_s
        return p

    def _auto(self) -> Plan:
        """The placement whose request is quickest among those that fit; options
        in order of the GPU memory they hold (resident part), a later one taken
        only when strictly quicker."""
        cands = []
        for k, head, embed in self.options():
            units = self.unit_map(k, head, embed)
            mem = sum(self.gpu_memory([make_schedule(self.graph, self.op_devices(units))]).values())
            cands.append((mem, k, head, embed, units))
        cands.sort(key=lambda c: c[:4])
        best, best_t = None, None
        for mem, k, head, embed, units in cands:
            if self.budget is not None and mem > self.budget:
                continue
            p = self.evaluate(units, "auto")
            if self.budget is not None and p.gpu_memory_total > self.budget:
                continue
            t = self.request_time(p)
            if best_t is None or t < best_t * (1 - 1e-9):
                best, best_t = p, t
        return best if best is not None else self.evaluate(self.unit_map(0, False, False), "auto")


def plan(graph: Graph, hw: Hardware, shape: Shape, n_gpu_layers: Any = "auto", decode_ctx: int = 256,
         prefill_tokens: int = 512, objective: tuple[int, int] = (512, 128)) -> Plan:
    return Planner(graph, hw, shape, decode_ctx, prefill_tokens, objective).plan(n_gpu_layers)


# -- measuring the hardware (cached) -------------------------------------------------------------------

def cache_path() -> Path:
    base = os.environ.get("PYLLM_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"),
                                                         "pyllm")
    return Path(base) / "hardware.json"


def _cache_load() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _cache_store(key: str, value: dict) -> None:
    data = _cache_load()
    data[key] = value
    try:
        p = cache_path()
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, p)
    except OSError:
        pass


def cached(key: str, measure, refresh: bool = False) -> tuple[dict, str]:
    """(figures, "cached" | "measured")"""
    if not refresh and os.environ.get("PYLLM_NO_HW_CACHE") is None:
        hit = _cache_load().get(key)
        if hit is not None:
            return hit, "cached"
    value = measure()
    if os.environ.get("PYLLM_NO_HW_CACHE") is None:
        _cache_store(key, value)
    return value, "measured"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def calibration_graph(n_in: int = 2048, n_out: int = 2048, n_mat: int = 1, qtype: str = "Q4_0") -> Graph:
    """n_mat matmuls of n_out rows of n_in on one input (different weights: more of them than a
    cache holds measure its memory), random blocks of qtype (Q4_0, Q4_K ...) whose scales are
    0.01 (F16: random values)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from ..model_file import Tensor
    qt = GGMLQuantizationType[qtype]
    elems, size = GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.buffer("x", n_in)
    for i in range(n_mat):
        if qt == GGMLQuantizationType.F16:
            blocks = (rng.standard_normal(n_in * n_out) * 0.01).astype(np.float16).view(np.uint8)
        else:
            blocks = rng.integers(0, 256, size=(n_in * n_out // elems, size), dtype=np.uint8)
            blocks[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)   # d (and Q4_1's m, K's dmin)
        g.linear(x, Tensor(f"calibration{i}", int(qt), (n_in, n_out), 0, blocks.nbytes, blocks.reshape(-1)),
                 f"y{i}")
    return g


def weight_bytes(g: Graph) -> int:
    return sum(op.weight.nbytes for op in g.ops if op.weight is not None)


def time_program(device, graph: Graph, n_tokens: int, reps: int = 3) -> float:
    """Best seconds of one step of `graph` (no KV) with n_tokens rows on `device`."""
    from .base import StepData
    prog = device.bind(graph, [Range(0, len(graph.ops))], Shape(n_tokens, 1, 1, 1))
    try:
        step = StepData(np.zeros(n_tokens, np.int32), np.zeros(n_tokens, np.int32), np.zeros(1, np.int32), 1)
        x = np.random.default_rng(1).standard_normal((n_tokens, graph.buffers["x"].width)).astype(np.float32)
        prog.write("x", 0, x)
        prog.run(0, step)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            prog.run(0, step)
            if hasattr(prog, "sync"):
                prog.sync()
            best = min(best, time.perf_counter() - t0)
        return best
    finally:
        prog.close()


def measure_cpu(host) -> dict:
    """Memory bandwidth (the C core streaming 256 MiB) and the rate of a Q4_0
    matmul over a 128-token batch, on the host's thread pool."""
    from .._native import ffi, lib
    from .cpu import aligned_zeros
    buf = aligned_zeros((64 << 20,), np.float32)
    buf[:] = 1.0
    lib.pyllm_membw(host.ctx, ffi.from_buffer(buf), buf.nbytes, 1)
    bw = max(lib.pyllm_membw(host.ctx, ffi.from_buffer(buf), buf.nbytes, 1) for _ in range(3)) * 1e9
    del buf
    g = calibration_graph()
    n = 128
    t = time_program(host, g, n)
    flops = 2.0 * 2048 * 2048 * n / t
    g = Graph()                       # the fixed cost of an op: 200 tiny dependent ones
    x = g.buffer("x", 64)
    for _ in range(200):
        g.scale(x, 1.0)
    op_s = time_program(host, g, 1, reps=5) / 200
    return {"mem_bw": bw, "flops": flops, "op_s": op_s}


def cpu_spec(host, measure: bool = True) -> tuple[DeviceSpec, str]:
    if not measure:
        return default_cpu(host.n_threads), "assumed"
    key = f"cpu:{_cpu_model()}:{host.n_threads}"
    figs, how = cached(key, lambda: measure_cpu(host))
    return DeviceSpec(host.name, figs["mem_bw"], figs["flops"], figs["op_s"]), how


def detect(host, gpu_device=None, measure_cpu_figures: bool = True) -> Hardware:
    """The hardware as it is: the host (measured, cached) and the GPU device
    if any (its own figures: measured for CUDA, configured for sim)."""
    cpu, how = cpu_spec(host, measure_cpu_figures)
    hw = Hardware(cpu, source={"cpu": how})
    if gpu_device is not None:
        spec, link, src = gpu_device.planning_figures()
        hw.gpu, hw.link = spec, link
        hw.source.update(src)
    return hw


def describe(plan: Plan, model_name: str = "") -> str:
    """The plan as `pyllm plan` prints it."""
    hw = plan.hardware
    src = hw.source if hw else {}
    lines = []
    if hw is not None:
        c = hw.cpu
        lines.append(f"cpu:  {c.name}: memory {fmt_rate(c.mem_bw)}, matmul {c.flops / 1e9:.0f} GFLOP/s, "
                     f"{c.op_s * 1e6:.1f} us/op  [{src.get('cpu', 'assumed')}]")
        if hw.gpu is not None:
            g = hw.gpu
            mem = "unlimited" if g.memory is None else f"{fmt_bytes(g.memory)} free ({fmt_bytes(g.reserve)} kept)"
            lines.append(f"gpu:  {g.name}: {mem}, memory {fmt_rate(g.mem_bw)}, matmul {g.flops / 1e12:.1f} TFLOP/s, "
                         f"{g.op_s * 1e6:.1f} us/launch  [{src.get('gpu', 'assumed')}]")
            lk = hw.link
            lines.append(f"link: {fmt_rate(lk.h2d)} to the GPU, {fmt_rate(lk.d2h)} back, "
                         f"{lk.latency_s * 1e6:.1f} us per copy  [{src.get('link', 'assumed')}]")
        else:
            lines.append("gpu:  none")
    lines.append(f"plan ({plan.reason}): {plan.layer_ranges()}")
    lines.append(f"  {plan.n_gpu_layers} of {plan.n_layer} layers on the GPU"
                 + (", output head too" if plan.head_on_gpu else ""))
    if plan.uses_gpu:
        mem = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in plan.gpu_memory.items() if v)
        budget = "" if plan.gpu_budget is None else f" of {fmt_bytes(plan.gpu_budget)}"
        lines.append(f"  GPU memory: {fmt_bytes(plan.gpu_memory_total)}{budget} ({mem})")
    cpu_tg = 1 / plan.cpu_decode_s if plan.cpu_decode_s else 0
    lines.append(f"  decode:  {plan.decode_tokens_per_s:8.1f} tokens/s predicted at context {plan.decode_ctx} "
                 f"(CPU alone {cpu_tg:.1f})")
    cpu_pp = plan.prefill_tokens / plan.cpu_prefill_s if plan.cpu_prefill_s else 0
    lines.append(f"  prefill: {plan.prefill_tokens_per_s:8.1f} tokens/s predicted for pp{plan.prefill_tokens} "
                 f"(CPU alone {cpu_pp:.1f}"
                 + (f", without streaming {plan.prefill_tokens / plan.prefill_resident_s:.1f}" if plan.stream else "")
                 + ")")
    if plan.stream_note:
        lines.append(f"  streaming: {plan.stream_note}")
    def bus(b: dict) -> str:
        parts = []
        for direction, word in ((H2D, "up"), (D2H, "down")):
            kinds = [(k, v) for (d, k), v in sorted(b.items()) if d == direction]
            if kinds:
                parts.append(f"{word}: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in kinds))
        return "; ".join(parts)

    if plan.decode_bus:
        lines.append(f"  bus per decode token: {fmt_bytes(sum(plan.decode_bus.values()))} ({bus(plan.decode_bus)})")
    if plan.prefill_bus:
        lines.append(f"  bus per pp{plan.prefill_tokens}: {fmt_bytes(sum(plan.prefill_bus.values()))} "
                     f"({bus(plan.prefill_bus)})")
    return "\n".join(lines)
