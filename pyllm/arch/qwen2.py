"""Qwen 2 / Qwen 2.5: the Llama block with biases on q, k and v.

    h = rmsnorm(x) ; q, k, v = Wq h + bq, Wk h + bk, Wv h + bv ; rope(q, k)
    x += Wo attention(q, K, V)
    h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)

RoPE rotates the two halves of each head (NEOX mode: the converter keeps
Hugging Face's layout). The output matrix may be tied to the embedding
(0.5B, 1.5B). llama.cpp reads no sliding window for qwen2, nor do we.
"""
from __future__ import annotations

from ..graph import ROPE_NEOX
from .llama import Llama


class Qwen2(Llama):
    name = "qwen2"
    experts = False   # Mixtral-style experts are read for llama files only
    rope_mode = ROPE_NEOX
    qkv_bias = True

    def sliding_window(self) -> int:
        return 0
