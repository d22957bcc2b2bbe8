"""Qwen 3 (dense): the Llama block with RMSNorm on each head of q and k.

    h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h
    q, k = rmsnorm_per_head(q), rmsnorm_per_head(k) ; rope(q, k)
    x += Wo attention(q, K, V)
    h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)

Heads are `attention.key_length` wide, which need not be n_embd / n_head
(Qwen3-0.6B: 16 heads of 128 over 1024), so q is wider than x. NEOX RoPE,
no biases, no sliding window.
"""
from __future__ import annotations

from ..graph import ROPE_NEOX
from .llama import Llama


class Qwen3(Llama):
    name = "qwen3"
    rope_mode = ROPE_NEOX
    qk_norm = True

    def sliding_window(self) -> int:
        return 0


class Qwen3Moe(Qwen3):
    """Qwen 3 MoE (`qwen3moe`): Qwen 3's attention; every layer's FFN is
    `expert_count` experts of `expert_feed_forward_length`, of which the router
    picks `expert_used_count` per token, weighted by their renormalized softmax."""
    name = "qwen3moe"
    experts = "required"

    def expert_width(self, k: int) -> int:
        return int(self.mf.arch_require("expert_feed_forward_length"))


class Qwen3VL(Qwen3):
    """Qwen 3 VL's language model (`qwen3vl`), on text: interleaved M-RoPE, which for
    a text token (one position in every section) is NEOX RoPE; DeepStack adds visual
    features to image tokens only. The vision encoder is not run."""
    name = "qwen3vl"
