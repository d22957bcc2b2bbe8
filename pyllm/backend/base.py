"""The backend interface: what the engine calls, and what a device provides.

Two levels:

- `Backend` is what the engine holds: one forward step at a time over the
  model's whole op program (`forward(tokens, start_pos, block_table, n_out)`
  -> logits). `CpuBackend` (cpu.py) runs everything in the C core;
  `SplitBackend` (split.py) runs each part of the program where a placement
  plan (placement.py) puts it.

- `Device` is one place that holds memory and runs ops: the host (cpu.py),
  the sim fake device (sim.py), an NVIDIA GPU (cuda.py). `Device.bind(graph,
  ranges, shape)` gives a `Program`: the device's share of one graph (the
  weights, activation buffers and KV pools its ops need, on the device) and
  the op ranges it runs. A split backend runs the ranges of all devices in
  op order and copies the live buffers between them (`Program.read` /
  `Program.write`, counted on the device's `Bus`).

A new kind of device (Metal, say) is a library beside csrc/cuda/ that runs
the op records of csrc/pyllm.h on its hardware, plus one Python file here
with a `Device` and a `Program` subclass; placement and split execution do
not change.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..errors import BackendError, InvalidArgumentError


class Backend(ABC):
    """Runs the forward step of one model (the engine's view)."""
    name: str = "?"
    n_batch: int          # most tokens one step takes
    n_out_max: int        # most logits rows one step returns
    n_vocab: int
    batches_sequences: bool = False   # has forward_batch: one step over rows of several sequences

    @abstractmethod
    def forward(self, tokens: Sequence[int], start_pos: int, block_table: Sequence[int], n_out: int,
                media: Optional[np.ndarray] = None, bidirectional: bool = False,
                rope_pos: Optional[np.ndarray] = None) -> np.ndarray:
        """Runs one step over `tokens` at positions start_pos.. and returns the
        logits of the last n_out of them: [n_out, vocab], valid until the next step.
        A token id -1 - j takes row j of `media` (float32 [rows, n_embd]: an image's
        embeddings) as its input embedding, as it is (no embedding scale); bidirectional:
        every row of the step sees every other (up to the step's last position, causal
        attention off for this step: Gemma 3's image rows), and what is cached before;
        rope_pos: int32 [3, rows], each row's M-RoPE (time, height, width) positions for
        the ROPE ops with sections (Qwen VL's), in place of its position."""

    def profile(self, on: bool) -> None:
        """Starts (or stops) collecting where time goes; resets what was collected."""

    def read_profile(self) -> dict:
        return {}

    @property
    def kv_bytes(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# KV cache formats: their ggml type ids (the C core's T_F16, T_Q8_0), by the names llama.cpp's -ctk/-ctv take
KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}
KV_BLOCK = {1: 1, 8: 32, 2: 32}          # values per block of each format
KV_BLOCK_BYTES = {1: 2, 8: 34, 2: 18}    # bytes per block


def kv_row_bytes(kv_type: int, n: int) -> int:
    """Bytes of n values of a KV pool row in format kv_type (n a multiple of its block)."""
    return n // KV_BLOCK[kv_type] * KV_BLOCK_BYTES[kv_type]


@dataclass(frozen=True)
class Shape:
    """The sizes a program is bound for, and its KV cache's formats."""
    n_batch: int       # rows of 'batch' buffers (tokens per step, at most)
    n_out_max: int     # rows of 'out' buffers (the logits head)
    n_blocks: int      # KV blocks per layer pool
    block_size: int    # positions per KV block
    k_type: int = 1    # KV_TYPES: the key pools' format
    v_type: int = 1    # and the value pools'


@dataclass(frozen=True)
class Range:
    """Consecutive ops [lo, hi) of the graph that one device runs. Streamed:
    the weights of its ops are not resident on the device but copied to it
    (into a staging area) every time the range runs."""
    lo: int
    hi: int
    streamed: bool = False


@dataclass
class StepData:
    """One step's inputs, on the host."""
    tokens: np.ndarray     # int32 [n_tokens]
    pos: np.ndarray        # int32 [n_tokens]
    table: np.ndarray      # int32 [n_table]
    n_out: int
    serial: int = 0        # which step this is: a device sends the step's arrays once per step
    media: Optional[np.ndarray] = None   # float32 [n, width], C-contiguous: the rows token ids -1 - j name
    bidirectional: bool = False          # every row sees up to the step's last position
    rope_pos: Optional[np.ndarray] = None  # int32 [3, n_tokens], C-contiguous: M-RoPE positions (step_rope_pos)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def step_media(media) -> Optional[np.ndarray]:
    """A step's media rows as the core reads them: float32 [rows, width], C-contiguous
    (None, or no rows: none)."""
    if media is None:
        return None
    a = np.ascontiguousarray(media, dtype=np.float32)
    if a.ndim != 2 or a.shape[1] < 1:
        raise InvalidArgumentError(f"media rows are a [rows, width] array, not one of shape {a.shape}")
    return a if len(a) else None


def step_rope_pos(rope_pos, n: int) -> Optional[np.ndarray]:
    """A step's M-RoPE positions as the core reads them: int32 [3, n] (time, height, width of
    each row), C-contiguous (None: none)."""
    if rope_pos is None:
        return None
    a = np.ascontiguousarray(rope_pos, dtype=np.int32)
    if a.shape != (3, n):
        raise InvalidArgumentError(f"M-RoPE positions are [3, {n}] for a step of {n} rows, not {list(a.shape)}")
    return a


class DeviceMemoryError(BackendError):
    """A device cannot hold what it was asked to (over its memory budget)."""


# kinds of bytes that cross a bus
ACTIVATIONS, LOGITS, CONTROL, WEIGHTS = "activations", "logits", "control", "weights"
H2D, D2H = "h2d", "d2h"


@dataclass
class Bus:
    """The link between the host and a device: counts every byte that
    crosses it, by direction and kind, and can make each transfer take as
    long as a bandwidth/latency model says (the sim device does, for tests
    of timing; real devices just count)."""
    h2d_bytes_per_s: float = 16e9
    d2h_bytes_per_s: float = 16e9
    latency_s: float = 10e-6
    delay: bool = False
    bytes: dict = field(default_factory=dict)       # (direction, kind) -> bytes
    transfers: dict = field(default_factory=dict)   # (direction, kind) -> count
    busy_s: float = 0.0                               # modelled time of all transfers

    def count(self, direction: str, kind: str, nbytes: int) -> None:
        key = (direction, kind)
        self.bytes[key] = self.bytes.get(key, 0) + int(nbytes)
        self.transfers[key] = self.transfers.get(key, 0) + 1
        bw = self.h2d_bytes_per_s if direction == H2D else self.d2h_bytes_per_s
        dt = self.latency_s + nbytes / bw
        self.busy_s += dt
        if self.delay:
            end = time.perf_counter() + dt
            while time.perf_counter() < end:   # sleep() is too coarse for microseconds
                pass

    def total(self, direction: Optional[str] = None, kind: Optional[str] = None) -> int:
        return sum(v for (d, k), v in self.bytes.items()
                   if (direction is None or d == direction) and (kind is None or k == kind))

    def reset(self) -> None:
        self.bytes.clear()
        self.transfers.clear()
        self.busy_s = 0.0

    def snapshot(self) -> dict:
        return {f"{d}.{k}": v for (d, k), v in sorted(self.bytes.items())}


class Device(ABC):
    """One place that holds memory and runs ops."""
    kind: str = "?"           # "cpu", "sim", "cuda", ...
    name: str = "?"
    is_host: bool = False     # its memory is the host's: no bus between it and the host
    bus: Optional[Bus] = None
    media_rows: bool = False  # its token embedding takes a step's media rows (else they stay on the host)

    def free_memory(self) -> Optional[int]:
        """Bytes this device can still hold; None for the host (not a constraint)."""
        return None

    def planning_figures(self):
        """(placement.DeviceSpec, placement.LinkSpec, {figure: source}) for the planner."""
        raise NotImplementedError(f"{self.kind} devices have no planning figures")

    @abstractmethod
    def bind(self, graph, ranges: Sequence[Range], shape: Shape) -> "Program":
        """The device's share of `graph`: allocates what the ops of `ranges`
        need (weights, buffers, KV pools, a staging area for streamed ranges)
        and prepares them to run."""

    def close(self) -> None:
        pass


class Program(ABC):
    """A device's share of one graph, bound to the device's memory."""
    device: Device
    ranges: list[Range]
    memory: dict              # bytes held, by kind: weights, vectors, kv, buffers, staging

    @abstractmethod
    def run(self, index: int, step: StepData) -> None:
        """Runs ranges[index] for one step."""

    @abstractmethod
    def read(self, name: str, row0: int, n_rows: int, kind: str = ACTIVATIONS) -> np.ndarray:
        """Rows [row0, row0 + n_rows) of buffer `name`, on the host (a copy
        over the bus, or a view for the host itself)."""

    @abstractmethod
    def write(self, name: str, row0: int, data: np.ndarray, kind: str = ACTIVATIONS) -> None:
        """Sets rows [row0, row0 + len(data)) of buffer `name` from host data."""

    def has_buffer(self, name: str) -> bool:
        return False

    @property
    def memory_bytes(self) -> int:
        return sum(self.memory.values())

    @property
    def kv_bytes(self) -> int:
        return self.memory.get("kv", 0)

    def close(self) -> None:
        pass
