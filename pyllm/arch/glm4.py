"""GLM-4 (`glm4`: GLM-4-0414 9B/32B, GLM-Z1): norms before and after each
branch, a fused q/k/v with bias, a fused [gate | up] FFN.

    h = rmsnorm(x) ; [q | k | v] = Wqkv h + b ; rope(q, k)     # adjacent pairs, partial
    x += rmsnorm(Wo attention(q, K, V))
    h = rmsnorm(x) ; [g | u] = Wup h ; x += rmsnorm(Wdown (silu(g) * u))
    logits = Wout rmsnorm(x)

RoPE rotates `rope.dimension_count` dims of each head (half of them in the
released files) as llama.cpp's NORM mode: adjacent pairs. Files with
separate q/k/v tensors (and biases) load too.
"""
from __future__ import annotations

from ..graph import GLU_SILU, ROPE_NORM
from .blocks import PostNormDecoder


class Glm4(PostNormDecoder):
    name = "glm4"
    rope_mode = ROPE_NORM
    glu = GLU_SILU
    fused_ffn = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.read_ends()
        self.layers = [self.post_norm_layer(i, self.attention_weights(i)) for i in range(self.hp.n_layer)]
