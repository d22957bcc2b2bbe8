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
from .base import Layer
from .blocks import PostNormDecoder


class Glm4(PostNormDecoder):
    name = "glm4"
    rope_mode = ROPE_NORM
    glu = GLU_SILU
    fused_ffn = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends()
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            self.layers.append(Layer(
                attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd), attn=self.attention_weights(i),
                post_attn_norm=self.vector(p + "post_attention_norm.weight", hp.n_embd),
                ffn_norm=self.vector(p + "ffn_norm.weight", hp.n_embd), ffn=self.ffn_weights(i),
                post_ffn_norm=self.vector(p + "post_ffw_norm.weight", hp.n_embd)))
