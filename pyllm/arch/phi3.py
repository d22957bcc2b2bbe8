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
short ones otherwise, and when the context is not known; the choice is made
once, so every key in the cache was rotated the same way. The attention
factor applies with either set (folded into the softmax scale).

The Phi-3 files may set a sliding window; llama.cpp disables it for this
family (it was a conversion artefact) and so do we.
"""
from __future__ import annotations

from ..graph import ROPE_NEOX
from .base import ROPE_SCALINGS
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
        short = self.optional_vector("rope_factors_short.weight", hp.rope_dim // 2)
        long = self.optional_vector("rope_factors_long.weight", hp.rope_dim // 2)
        self.rope_factors_short, self.rope_factors_long = short, long
        use_long = long is not None and n_ctx is not None and n_ctx > self.n_ctx_orig
        if self.rope_freqs is None:   # rope_freqs, when a file has it, wins (as in llama.cpp)
            self.rope_freqs = long if use_long else short

    def sliding_window(self) -> int:
        return 0
