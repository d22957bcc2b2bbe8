"""Hunyuan dense (`hunyuan-dense`: Tencent's Hunyuan 0.5B/1.8B/4B/7B): the Llama block with
NEOX RoPE and per-head RMSNorms of q and k taken after the rotation, not before it.

    h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)
    q, k = rmsnorm_per_head(q), rmsnorm_per_head(k)
    x += Wo attention(q, K, V) (+ bo)
    h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)

The released models' NTK-alpha RoPE scaling is folded into rope.freq_base by the
converter, so the file's base is used as it is.
"""
from __future__ import annotations

from ..graph import ROPE_NEOX, ROPE_NORM
from .llama import Llama


class HunyuanDense(Llama):
    name = "hunyuan-dense"
    rope_mode = ROPE_NEOX
    qk_norm = True
    qk_norm_after_rope = True
    experts = False

    def sliding_window(self) -> int:
        return 0


class HunyuanMoe(HunyuanDense):
    """Hunyuan MoE (`hunyuan-moe`: Hunyuan-A13B): the dense model's attention; every layer's FFN
    is `expert_count` experts as wide as feed_forward_length (softmax, renormalized; llama.cpp
    reads no expert_weights_scale for it, nor does pyllm) plus a shared expert
    (expert_shared_feed_forward_length)."""
    name = "hunyuan-moe"
    experts = "required"


class Maincoder(HunyuanDense):
    """Maincoder (`maincoder`: Maincode's Maincoder-1B): Hunyuan's block (q/k RMSNorms per head after
    the rotation) with adjacent-pair RoPE."""
    name = "maincoder"
    rope_mode = ROPE_NORM
