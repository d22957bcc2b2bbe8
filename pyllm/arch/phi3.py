"""Phi-3 (mini, medium; the 4k and the 128k files): the Llama block with
fused tensors.

    h = rmsnorm(x) ; [q | k | v] = Wqkv h ; rope(q, k)
    x += Wo attention(q, K, V)
    h = rmsnorm(x) ; [g | u] = Wup h ; x += Wdown (silu(g) * u)

NEOX RoPE. `attn_qkv` holds q, k and v one after the other in its output
rows, `ffn_up` holds the gate rows then the up rows (2 n_ff of them); files
with separate q/k/v or gate/up tensors load too.

Long context (the 128k files, "LongRoPE"): two sets of per-pair frequency
divisors, short and long, chosen by the context the model runs with (base.LongRope),
and `rope.scaling.attn_factor`, which multiplies cos and sin (so q.k by its square),
folded into the softmax scale with either set.

Phi-3 files may set a sliding window; llama.cpp disables it for this family
(the converter does not say which layers would use it) and so do we.
"""
from __future__ import annotations

from ..graph import ROPE_NEOX
from .base import LongRope
from .llama import Llama


class Phi3(LongRope, Llama):
    name = "phi3"
    rope_mode = ROPE_NEOX
    fused_ffn = True

    def sliding_window(self) -> int:
        return 0
