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

import math

from ..graph import ROPE_NEOX
from ..errors import ModelFileError
from .base import Architecture, Layer, MRope, Rope, SharedExpertsMoe, sliding_layers
from .llama import Llama

SWA_PERIOD = 4   # Mellum: layers 0-2 of every 4 windowed, unless the file's pattern says otherwise


class Qwen3(Llama):
    name = "qwen3"
    rope_mode = ROPE_NEOX
    qk_norm = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        if self.name == "qwen3" and mf.arch_get("pooling_type", None) == 4:
            # Qwen3-Reranker: its vocabulary's "yes" and "no" rows as the head, a softmax over the two
            # (llama.cpp does this for qwen3 alone)
            self.rank_head = self.read_rank_head(softmax=True)

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


class Mellum(Qwen3Moe):
    """Mellum (`mellum`: JetBrains' Mellum 2 12B-A2.5B): Qwen 3 MoE with, where
    attention.sliding_window is set, windowed layers: those sliding_window_pattern flags (default
    3 of every 4) attend over the window with RoPE unscaled (no YaRN, no factors, as llama.cpp
    turns them), the others over the whole context with the file's RoPE scaling."""
    name = "mellum"
    experts = "required"

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.window, self.is_swa = sliding_layers(mf, self.hp.n_layer, SWA_PERIOD)

    def layer_rope(self, i: int) -> Rope:
        if self.is_swa[i]:
            return Rope(self.rope_mode, self.hp.rope_dim, self.hp.rope_base)
        return super().layer_rope(i)

    def layer_attn_scale(self, i: int) -> float:
        """1/sqrt(head_dim) in windowed layers: their RoPE has no attention factor to fold in."""
        return 1.0 / math.sqrt(self.hp.head_dim) if self.is_swa[i] else self.attn_scale


class DeepStack:
    """Qwen 3 VL's DeepStack (a mixin): an image row is [n_embd | n_deepstack_layers slices of
    n_embd] wide; the first slice is the layer input, slice k + 1 is added to the residual
    after layer k < n_deepstack_layers (text rows add nothing); M-RoPE interleaved (MRope)."""
    mrope_interleaved = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        n = mf.arch_get("n_deepstack_layers", 0) or 0
        if not isinstance(n, int) or not 0 <= n < self.hp.n_layer:
            raise ModelFileError(f"{mf.path}: n_deepstack_layers is {n!r}, not a count below the "
                                 f"{self.hp.n_layer} layers; the file is corrupt")
        self.deepstack = n
        _ = self.rope_sections   # read and checked now, not at the first image


class Qwen3VL(DeepStack, MRope, Qwen3):
    """Qwen 3 VL's language model (`qwen3vl`): Qwen 3 with interleaved M-RoPE and DeepStack."""
    name = "qwen3vl"


class Qwen3VLMoe(DeepStack, MRope, Qwen3Moe):
    """Qwen 3 VL MoE's language model (`qwen3vlmoe`: Qwen3-VL-30B-A3B, 235B-A22B): Qwen3-MoE with
    interleaved M-RoPE and DeepStack."""
    name = "qwen3vlmoe"
    experts = "required"


class Dots1(SharedExpertsMoe, Qwen3):
    """dots.llm1 (`dots1`: rednote's 142B-A14B): Qwen 3's attention (per-head q/k norms,
    NEOX RoPE) and DeepSeek's experts after the leading dense layers (the file's gating,
    exp_probs_b to choose, renormalized and scaled as it says, shared experts)."""
    name = "dots1"
    experts = "required"

    def __init__(self, mf, n_ctx=None):
        Architecture.__init__(self, mf, n_ctx)
        self.read_ends()
        self.layers = self.moe_layers()

    def moe_layers(self) -> list[Layer]:
        """Pre-norm layers with per-head q/k norms, the experts' FFN (dense in the leading layers)."""
        hp = self.hp
        return [Layer(attn_norm=self.vector(f"blk.{i}.attn_norm.weight", hp.n_embd),
                      attn=self.attention_weights(i, qk_norm=True),
                      ffn_norm=self.vector(f"blk.{i}.ffn_norm.weight", hp.n_embd),
                      ffn=self.experts_of(i) or self.ffn_weights(i))
                for i in range(hp.n_layer)]
