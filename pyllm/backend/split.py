"""Split execution: each part of the op program runs on the device the plan
puts it on, and only the buffers that are live across a device boundary
cross the bus.

A `Schedule` is the op program cut into segments (maximal runs of
consecutive ops on one device), each with the transfers that must happen
before it runs. The transfers come from a walk over the program that
tracks, for every buffer, which devices hold its current rows: a segment
needs a buffer when one of its ops reads it before any op of the segment
writes it (an upward-exposed read); if its device does not hold the
current rows, they are copied from a device that does. For a decode split
at a layer boundary that is exactly the residual stream `x`; the first op
of the output head reads only the last n_out rows, so only those cross.
At the end the logits come back to the host.

The same walk gives the bytes a step moves (`Schedule.bus_bytes`), which
the planner uses as its prediction and the tests compare with what the
devices' buses counted.

`SplitBackend` binds each device once (one Program per device, holding all
its ranges) and runs a step by walking the chosen schedule: the resident
schedule (every op where its weights live), or for a prefill batch of at
least `stream_min_batch` tokens, the streaming schedule (the layers whose
weights live on the host run on the GPU with their weights copied over the
bus, all but their KV-cache ops, which stay with the KV pools on the host).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence as Seq

import numpy as np

from ..errors import BackendError, UnsupportedModelError
from ..graph import OP_EMBED, OP_MATMUL, OPF_BY_POS, OPF_LAST_ROWS, Graph
from .base import (ACTIVATIONS, CONTROL, D2H, H2D, LOGITS, WEIGHTS, Backend, Device, Range, Shape, StepData,
                   step_media, step_rope_pos)
from .cpu import check_step_args
from .lowering import reads_rope_pos, step_needs

HOST = "cpu"
ALL, LAST = "all", "last"


# -- units: which part of the model each op belongs to -----------------------------------------

def op_units(graph: Graph) -> list:
    """Per op: "embed" (before the first layer), the layer number, or "head"
    (after the last layer)."""
    layers = [i for i, op in enumerate(graph.ops) if op.layer >= 0]
    if not layers:
        return ["embed"] * len(graph.ops)
    first, last = layers[0], layers[-1]
    units = []
    for i, op in enumerate(graph.ops):
        if op.layer >= 0:
            units.append(op.layer)
        elif i < first:
            units.append("embed")
        elif i > last:
            units.append("head")
        else:
            raise BackendError(f"op {i} has no layer but sits between layers")
    return units


def unit_names(graph: Graph) -> list:
    """Units in program order: "embed", 0, 1, ..., "head"."""
    seen = []
    for u in op_units(graph):
        if not seen or seen[-1] != u:
            if u in seen:
                raise BackendError(f"the ops of {u} are not consecutive")
            seen.append(u)
    return seen


# -- schedules ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Transfer:
    name: str
    src: str
    dst: str
    rows: str            # ALL: every row of the step; LAST: the last n_out rows
    row_bytes: int
    out_rows: bool       # an 'out' buffer (n_out rows) rather than a 'batch' buffer (n_tokens rows)
    kind: str = ACTIVATIONS

    def span(self, n_tokens: int, n_out: int) -> tuple[int, int]:
        """(first row, row count) to copy"""
        if self.out_rows:
            return 0, n_out
        if self.rows == LAST:
            return n_tokens - n_out, n_out
        return 0, n_tokens

    def nbytes(self, n_tokens: int, n_out: int) -> int:
        return self.span(n_tokens, n_out)[1] * self.row_bytes


@dataclass
class Segment:
    device: str
    lo: int
    hi: int
    streamed: bool = False
    transfers: list = field(default_factory=list)   # before the segment runs


@dataclass
class Schedule:
    graph: Graph
    segments: list
    final: list                 # transfers after the last segment (the logits, to the host)

    @property
    def devices(self) -> list[str]:
        return sorted({s.device for s in self.segments} | {HOST})

    def transfers(self) -> list[Transfer]:
        return [t for s in self.segments for t in s.transfers] + list(self.final)

    def bus_bytes(self, n_tokens: int, n_out: int, n_table: int, mrope: bool = False) -> dict:
        """Bytes one step moves on each device's bus: {(device, direction, kind): bytes} (mrope: a
        step with M-RoPE positions, which go where a ROPE op with sections runs)."""
        out: dict = {}

        def add(dev, direction, kind, n):
            if n:
                key = (dev, direction, kind)
                out[key] = out.get(key, 0) + n

        for t in self.transfers():
            n = t.nbytes(n_tokens, n_out)
            if t.src != HOST:
                add(t.src, D2H, t.kind, n)
            if t.dst != HOST:
                add(t.dst, H2D, t.kind, n)
        for dev in self.devices:
            if dev == HOST:
                continue
            segs = [s for s in self.segments if s.device == dev]
            ops = [op for s in segs for op in self.graph.ops[s.lo:s.hi]]
            tokens, pos, table = step_needs(ops)
            rope_pos = 3 if mrope and reads_rope_pos(ops) else 0
            add(dev, H2D, CONTROL, 4 * (n_tokens * (tokens + pos + rope_pos) + n_table * table))
            resident = {op.weight.name for s in segs if not s.streamed
                        for op in self.graph.ops[s.lo:s.hi] if op.weight is not None}
            add(dev, H2D, WEIGHTS, sum(op.weight.nbytes for s in segs if s.streamed
                                       for op in self.graph.ops[s.lo:s.hi]
                                       if op.kind == OP_MATMUL and op.weight.name not in resident))
        return out

    def describe(self) -> str:
        units = op_units(self.graph)
        parts = []
        for s in self.segments:
            a, b = units[s.lo], units[s.hi - 1]
            what = f"{a}" if a == b else f"{a}..{b}"
            parts.append(f"{what}:{s.device}{'(streamed)' if s.streamed else ''}")
        return " | ".join(parts)


def make_schedule(graph: Graph, op_device: Seq[str], streamed: Optional[Seq[bool]] = None) -> Schedule:
    """Cuts the program into same-device segments and works out the transfers."""
    n = len(graph.ops)
    streamed = list(streamed) if streamed is not None else [False] * n
    assert len(op_device) == n == len(streamed)
    segments: list[Segment] = []
    for i in range(n):
        if segments and segments[-1].device == op_device[i] and segments[-1].streamed == streamed[i]:
            segments[-1].hi = i + 1
        else:
            segments.append(Segment(op_device[i], i, i + 1, streamed[i]))

    # the KV pool of a layer lives with its KV_STORE; its ATTENTION must be there too (and a
    # recurrent state stays where its op runs: they never cross the bus)
    kv_home: dict[str, str] = {}
    for i, op in enumerate(graph.ops):
        for name in ([f"kv{op.kv_layer}"] if op.kv_layer >= 0 else []) + ([op.state] if op.state else []):
            home = kv_home.setdefault(name, op_device[i])
            if home != op_device[i]:
                raise BackendError(f"layer {op.layer}: its cache {name} would be split between {home} and "
                                   f"{op_device[i]}")
    kv_names = set(kv_home)

    def row_bytes(name: str) -> tuple[int, bool]:
        if name in graph.buffers:
            b = graph.buffers[name]
            return b.width * 4, b.rows == "out"
        return graph.qbuffers[name].row_bytes, False

    holder: dict[str, dict[str, str]] = {}      # buffer -> {device: ALL | LAST}
    for seg in segments:
        dev = seg.device
        needs: dict[str, str] = {}
        written: set = set()
        for op in graph.ops[seg.lo:seg.hi]:
            for name in sorted(op.reads):
                if name in kv_names or name in written:
                    continue
                need = LAST if op.flags & OPF_LAST_ROWS else ALL
                if needs.get(name) != ALL:
                    needs[name] = need
            written |= set(op.writes) - kv_names
        for name, need in needs.items():
            have = holder.get(name, {})
            if have.get(dev) == ALL or have.get(dev) == need:
                continue
            srcs = [d for d, v in have.items() if v == ALL or v == need]
            if not srcs:
                raise BackendError(f"buffer {name} is read before any op writes it")
            src = HOST if HOST in srcs else srcs[0]
            rb, out_rows = row_bytes(name)
            if src != HOST and dev != HOST:   # device to device: through the host
                seg.transfers.append(Transfer(name, src, HOST, need, rb, out_rows))
                have[HOST] = need
                seg.transfers.append(Transfer(name, HOST, dev, need, rb, out_rows))
            else:
                seg.transfers.append(Transfer(name, src, dev, need, rb, out_rows))
            have[dev] = need
            holder[name] = have
        for name in written:
            holder[name] = {dev: ALL}

    final = []
    out = graph.ops[-1].y.name
    have = holder.get(out, {})
    if HOST not in have:
        rb, out_rows = row_bytes(out)
        final.append(Transfer(out, next(iter(have)), HOST, ALL, rb, out_rows, LOGITS))
    return Schedule(graph, segments, final)


# -- the backend -------------------------------------------------------------------------------------

class SplitBackend(Backend):
    """Runs a graph over several devices, as schedules say.

    devices: {"cpu": the host, "gpu": a sim or CUDA device}; schedules:
    {"resident": ..., "stream": ...} (the second optional), used for steps of
    at least stream_min_batch tokens."""
    name = "split"

    def __init__(self, graph: Graph, devices: dict[str, Device], schedules: dict[str, Schedule], shape: Shape,
                 stream_min_batch: Optional[int] = None, own_devices: bool = False):
        self.graph, self.devices, self.schedules, self.shape = graph, devices, schedules, shape
        self.own_devices = own_devices
        self.plan = None
        self.n_batch, self.n_out_max = shape.n_batch, shape.n_out_max
        self.stream_min_batch = stream_min_batch if "stream" in schedules else None
        if not devices.get(HOST) or not devices[HOST].is_host:
            raise BackendError("a split backend needs the host as device 'cpu'")

        # one program per device, holding the ranges of every schedule
        ranges: dict[str, list[Range]] = {d: [] for d in devices}
        self._where: dict[tuple[str, int], int] = {}
        for sname, sched in schedules.items():
            for k, seg in enumerate(sched.segments):
                r = Range(seg.lo, seg.hi, seg.streamed)
                lst = ranges[seg.device]
                if r not in lst:
                    lst.append(r)
                self._where[(sname, k)] = lst.index(r)
        self.programs = {}
        try:
            for d, dev in devices.items():
                self.programs[d] = dev.bind(graph, ranges[d], shape)
        except Exception:
            self.close()
            raise
        out = graph.ops[-1].y
        self.n_vocab = out.width
        host = self.programs[HOST]
        self.logits = host.buffers[out.name] if host.has_buffer(out.name) else \
            np.zeros((shape.n_out_max, out.width), np.float32)
        self._serial = 0

    def schedule_for(self, n_tokens: int) -> str:
        if self.stream_min_batch is not None and n_tokens >= self.stream_min_batch:
            return "stream"
        return "resident"

    def forward(self, tokens: Seq[int], start_pos: int, block_table: Seq[int], n_out: int,
                media: Optional[np.ndarray] = None, bidirectional: bool = False,
                rope_pos: Optional[np.ndarray] = None) -> np.ndarray:
        n = len(tokens)
        check_step_args(n, n_out, len(block_table), self.shape.n_batch, self.shape.n_out_max, self.shape.n_blocks)
        media = step_media(media)
        self._serial += 1
        step = StepData(np.asarray(tokens, np.int32), np.arange(start_pos, start_pos + n, dtype=np.int32),
                        np.asarray(block_table, np.int32), n_out, self._serial, media, bool(bidirectional),
                        step_rope_pos(rope_pos, n))
        sname = self.schedule_for(n)
        sched = self.schedules[sname]
        if media is not None:
            self._check_media(sched)
        for k, seg in enumerate(sched.segments):
            for t in seg.transfers:
                self._transfer(t, step)
            self.programs[seg.device].run(self._where[(sname, k)], step)
        for t in sched.final:
            self._transfer(t, step)
        return self.logits[:n_out]

    def _check_media(self, sched: Schedule) -> None:
        """Refuses, before any op runs, a step whose media rows would reach a device's token
        embedding (Model keeps it on the host for a model with a projector; the core refuses too)."""
        for seg in sched.segments:
            dev = self.devices[seg.device]
            if not dev.media_rows and any(op.kind == OP_EMBED and not op.flags & OPF_BY_POS
                                          for op in self.graph.ops[seg.lo:seg.hi]):
                raise UnsupportedModelError(f"images need the token embeddings on the CPU; this placement puts them on "
                                            f"{dev.name}: use fewer GPU layers (-ngl)")

    def _transfer(self, t: Transfer, step: StepData) -> None:
        row0, rows = t.span(step.n_tokens, step.n_out)
        data = self.programs[t.src].read(t.name, row0, rows, t.kind)
        dst = self.programs[t.dst]
        if t.dst == HOST and not dst.has_buffer(t.name):
            self.logits[row0:row0 + rows] = data
        else:
            dst.write(t.name, row0, data, t.kind)

    # -- what it holds and moved ---------------------------------------------------------------
    def bus_bytes(self) -> dict:
        """What the devices' buses counted: {(device, direction, kind): bytes}."""
        out = {}
        for d, dev in self.devices.items():
            if dev.bus is not None:
                for (direction, kind), n in dev.bus.bytes.items():
                    out[(d, direction, kind)] = n
        return out

    def reset_bus(self) -> None:
        for dev in self.devices.values():
            if dev.bus is not None:
                dev.bus.reset()

    def memory(self) -> dict:
        return {d: dict(p.memory) for d, p in self.programs.items()}

    @property
    def kv_bytes(self) -> int:
        return sum(p.kv_bytes for p in self.programs.values())

    def profile(self, on: bool) -> None:
        host = self.devices[HOST]
        from .._native import lib
        lib.pyllm_profile_enable(host.ctx, int(on))
        lib.pyllm_profile_reset(host.ctx)
        self.reset_bus()

    def read_profile(self) -> dict:
        from .cpu import read_core_profile
        host = self.devices[HOST]
        prof = read_core_profile(host.ctx, host.n_threads)
        prof["bus_bytes"] = {f"{d}.{di}.{k}": v for (d, di, k), v in sorted(self.bus_bytes().items())}
        return prof

    def close(self) -> None:
        for p in getattr(self, "programs", {}).values():
            p.close()
        self.programs = {}
        if getattr(self, "own_devices", False):
            for d in ("gpu", HOST):     # the host last: devices may use its thread pool
                if d in self.devices:
                    self.devices[d].close()
            self.own_devices = False
