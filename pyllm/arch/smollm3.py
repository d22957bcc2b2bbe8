"""SmolLM3: the Llama block, with RoPE left out of every fourth layer (NoPE).

    for each layer i:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h
        rope(q, k) unless (i + 1) % 4 == 0
        x += Wo attention(q, K, V)
        h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)

The period is not in the file: llama.cpp fixes it at 4, as the released
models use (layers 3, 7, 11, ... attend by content alone). RoPE rotates
adjacent pairs (the converter permutes Wq and Wk as for Llama); no
sliding window.
"""
from __future__ import annotations

from .base import Rope
from .llama import Llama

NO_ROPE_PERIOD = 4


class SmolLM3(Llama):
    name = "smollm3"

    def sliding_window(self) -> int:
        return 0

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        return r.off() if (i + 1) % NO_ROPE_PERIOD == 0 else r
