"""Phi-3 (mini, medium; the 4k and the 128k files): the Llama block with
fused tensors.

    h = rmsnorm(x) ; [q | k | v] = Wqkv h ; rope(q, k)
    x += Wo attention(q, K, V)
    h = rmsnorm(x) ; [g | u] = Wup h ; x += Wdown (silu(g) * u)

NEOX RoPE. `attn_qkv` holds q, k and v one after the other in its output
rows, `ffn_up` holds the gate rows then the up rows (2 n_ff of them); files
with separate q/k/v or gate/up tensors load too.

Long context (the 128k files, "LongRoPE"): the file carries two sets of
per-pair frequency divisors, `rope_factors_short` and `rope_factors_long`,
and `rope.scaling.attn_factor`, which multiplies cos and sin (so q.k by its
square). As llama.cpp does, the long factors are used when the context the
model runs with exceeds `rope.scaling.original_context_length` (4096), the
short ones otherwise, and when the context is not known (set `n_ctx`, or
pass it to load_architecture, before building the graph); the choice is
made once per graph, so every key in the cache was rotated the same way.
The attention factor applies with either set (folded into the softmax
scale).

Phi-3 files may set a sliding window; llama.cpp disables it for this family
(the converter does not say which layers would use it) and so do we.
"""
from __future__ import annotations

from dataclasses import replace

from ..graph import ROPE_NEOX
from .base import ROPE_SCALINGS, Rope
from .llama import Llama


class Phi3(Llama):
    name = "phi3"
    rope_mode = ROPE_NEOX
    rope_scalings = ROPE_SCALINGS + ("longrope",)
    fused_ffn = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.n_ctx_orig = int(mf.arch_get("rope.scaling.original_context_length", hp.n_ctx_train))
        self.rope_factors_short = self.optional_vector("rope_factors_short.weight", hp.rope_dim // 2)
        self.rope_factors_long = self.optional_vector("rope_factors_long.weight", hp.rope_dim // 2)

    def layer_rope(self, i: int) -> Rope:
        """With the context known when the graph is built (self.n_ctx):
        rope_freqs if the file has them (as llama.cpp), else the long factors
        past the original context, else the short ones."""
        factors = self.rope_freqs
        if factors is None:
            long = self.n_ctx is not None and self.n_ctx > self.n_ctx_orig
            factors = self.rope_factors_long if long else self.rope_factors_short
        return replace(super().layer_rope(i), factors=factors)

    def sliding_window(self) -> int:
        return 0
