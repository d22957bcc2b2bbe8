"""ERNIE 4.5 (dense, `ernie4_5`): the Llama block as it is (RMSNorm, SiLU-gated
FFN, RoPE on adjacent pairs, optional q/k/v biases); llama.cpp reads no
sliding window for it."""
from __future__ import annotations

from .llama import Llama


class Ernie4_5(Llama):
    name = "ernie4_5"

    def sliding_window(self) -> int:
        return 0
