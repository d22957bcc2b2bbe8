"""The sim device: a fake GPU that runs on the CPU, for tests of split execution
and placement on machines without one.

It runs its ops through the same C core as the host (sharing the host's
thread pool), but everything it runs on is its own: the weights it holds are
copied into its own arrays, and so are its activation buffers, quantized
buffers, KV pools and the staging area for streamed weights, all counted
against a memory budget (over budget: DeviceMemoryError, saying what did
not fit). Every byte that reaches it or leaves it is copied and counted on
its `Bus` (by direction and kind: activations, logits, control = the step's
tokens/positions/block table, weights = streamed weights); with
`delay=True` each transfer also takes as long as the bus's bandwidth and
latency say.

For the planner it is a device with a nominal memory bandwidth, arithmetic
rate and per-op launch cost (a small GPU by default), so that placement
behaves as it would with one; its real speed is the CPU's.

Environment (Model(device="sim") or PYLLM_DEVICE=sim):
    PYLLM_SIM_MEMORY   memory budget (default 2GiB)
    PYLLM_SIM_PCIE     bus bandwidth, both directions (default 16GB/s)
    PYLLM_SIM_LATENCY  per transfer (default 10us)
    PYLLM_SIM_DELAY    1: transfers take the modelled time
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from ..graph import Graph
from ..model_file import Tensor
from ..units import fmt_bytes, fmt_rate, parse_bytes, parse_rate, parse_time
from .base import ACTIVATIONS, CONTROL, D2H, H2D, WEIGHTS, Bus, Device, DeviceMemoryError, Range, Shape
from .cpu import CoreProgram, HostDevice, aligned_zeros

DEFAULT_MEMORY = 2 << 30


class SimDevice(Device):
    kind = "sim"
    media_rows = False            # as a GPU's: a step's media rows stay on the host

    def __init__(self, host: HostDevice, memory: int = DEFAULT_MEMORY, bus: Optional[Bus] = None,
                 mem_bw: float = 300e9, flops: float = 20e12, launch_s: float = 5e-6):
        self.host = host
        self.budget = int(memory)
        self.used = 0
        self.bus = bus if bus is not None else Bus()
        self.mem_bw, self.flops, self.launch_s = mem_bw, flops, launch_s
        self.name = f"sim ({fmt_bytes(self.budget)}, bus {fmt_rate(self.bus.h2d_bytes_per_s)})"

    @classmethod
    def from_env(cls, host: HostDevice, env: Optional[dict] = None) -> "SimDevice":
        env = os.environ if env is None else env
        rate = parse_rate(env.get("PYLLM_SIM_PCIE", "16GB/s"))
        bus = Bus(rate, rate, parse_time(env.get("PYLLM_SIM_LATENCY", "10us")),
                  delay=env.get("PYLLM_SIM_DELAY", "0") not in ("", "0"))
        return cls(host, parse_bytes(env.get("PYLLM_SIM_MEMORY", DEFAULT_MEMORY)), bus)

    def free_memory(self) -> int:
        return self.budget - self.used

    def planning_figures(self):
        from .placement import DeviceSpec, LinkSpec
        spec = DeviceSpec(self.name, self.mem_bw, self.flops, self.launch_s, memory=self.free_memory())
        link = LinkSpec(self.bus.h2d_bytes_per_s, self.bus.d2h_bytes_per_s, self.bus.latency_s)
        return spec, link, {"gpu": "sim device, configured", "link": "sim bus, configured"}

    def bind(self, graph: Graph, ranges: Sequence[Range], shape: Shape) -> "SimProgram":
        return SimProgram(self, graph, ranges, shape, ctx=self.host.ctx)


class SimProgram(CoreProgram):
    copy_weights = True

    def _reserve(self, mp) -> None:
        dev: SimDevice = self.device
        need = mp.bytes()
        total = sum(need.values())
        if total > dev.free_memory():
            parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in need.items() if v)
            raise DeviceMemoryError(f"sim device: out of memory: this part of the model needs {fmt_bytes(total)} "
                                    f"({parts}) but {fmt_bytes(dev.free_memory())} of "
                                    f"{fmt_bytes(dev.budget)} is free")
        dev.used += total
        self._reserved = total

    def _place_weight(self, t: Tensor) -> np.ndarray:
        a = aligned_zeros((t.nbytes,), np.uint8)
        a[:] = t.data.reshape(-1)
        return a

    def _place_vector(self, v: np.ndarray) -> np.ndarray:
        a = aligned_zeros(v.shape, np.float32)
        a[...] = v
        return a

    def _send(self, what: str, src: np.ndarray, dst: np.ndarray) -> None:
        if src is not dst:
            dst[:len(src)] = src
        self.device.bus.count(H2D, CONTROL, src.nbytes)

    def stream_weights(self, index: int) -> None:
        super().stream_weights(index)
        r = self.ranges[index]
        for i in range(r.lo, r.hi):
            if i in self.plan.streamed:
                self.device.bus.count(H2D, WEIGHTS, self.plan.streamed[i][0].nbytes)

    def read(self, name: str, row0: int, n_rows: int, kind: str = ACTIVATIONS) -> np.ndarray:
        out = self._rows(name)[row0:row0 + n_rows].copy()
        self.device.bus.count(D2H, kind, out.nbytes)
        return out

    def write(self, name: str, row0: int, data: np.ndarray, kind: str = ACTIVATIONS) -> None:
        dst = self._rows(name)[row0:row0 + len(data)]
        dst[...] = data
        self.device.bus.count(H2D, kind, dst.nbytes)

    def close(self) -> None:
        if getattr(self, "_reserved", 0):
            self.device.used -= self._reserved
            self._reserved = 0
