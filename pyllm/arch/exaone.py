"""LG EXAONE 3 (`exaone`) and EXAONE 4 (`exaone4`).

EXAONE 3 is the Llama block with NEOX RoPE (and Llama 3's optional
rope_freqs). EXAONE 4 moves the norms to the branch outputs, as OLMo 2,
with RMSNorm on each head of q and k:

    for each layer:
        q, k, v = Wq x, Wk x, Wv x ; q, k = rmsnorm_per_head(q), rmsnorm_per_head(k)
        rope(q, k)                                   # NEOX; not on global layers, see below
        x += rmsnorm(Wo attention(q, K, V))
        x += rmsnorm(Wdown (silu(Wgate x) * Wup x))
    logits = Wout rmsnorm(x)

As llama.cpp reads an exaone4 file: only the 64-layer model (32B) has
sliding-window layers, 3 of every 4 (i % 4 < 3), of
`attention.sliding_window` tokens (absent: 4096); its other layers attend
over the whole context without RoPE. The smaller models use RoPE and the
whole context in every layer.
"""
from __future__ import annotations

from ..graph import ROPE_NEOX
from .base import LocalGlobalLayers
from .blocks import PostNormDecoder
from .llama import Llama

SWA_WINDOW, N_LAYER_SWA = 4096, 64


class Exaone(Llama):
    name = "exaone"
    rope_mode = ROPE_NEOX

    def sliding_window(self) -> int:
        return 0


class Exaone4(LocalGlobalLayers, PostNormDecoder):
    name = "exaone4"
    rope_mode = ROPE_NEOX

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends()
        self.rope_freqs = self.optional_vector("rope_freqs.weight", hp.rope_dim // 2)
        self.window = int(mf.arch_get("attention.sliding_window", SWA_WINDOW)) if hp.n_layer == N_LAYER_SWA else 0
        self.layers = [self.post_norm_layer(i, self.attention_weights(i, qk_norm=True), input_norms=False)
                       for i in range(hp.n_layer)]
