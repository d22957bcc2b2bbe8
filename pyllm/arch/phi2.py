"""Phi-2: LayerNorm, one norm feeding the attention and an ungated GELU FFN
side by side, biases everywhere, RoPE on part of each head.

    x = embed(tokens)
    for each layer:
        h = layernorm(x)                                   # with bias
        q, k, v = Wq h + bq, Wk h + bk, Wv h + bv
        rope(q, k) on the first rope.dimension_count dims  # NEOX; 32 of 80 on Phi-2
        x += (Wo attention(q, K, V) + bo) + (Wdown gelu_tanh(Wup h + bup) + bdown)
    logits = Wout layernorm(x) + bout

As llama.cpp reads a phi2 file: `phi2.attention.layer_norm_epsilon`; q/k/v
as one fused attn_qkv (older converters) or three matrices; an untied
output with its own bias.
"""
from __future__ import annotations

from ..graph import GLU_GELU_TANH, NORM_LAYER, ROPE_NEOX
from .base import Layer
from .blocks import PreNormDecoder


class Phi2(PreNormDecoder):
    name = "phi2"
    rope_mode = ROPE_NEOX
    glu = GLU_GELU_TANH
    norm = NORM_LAYER
    gated = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends(norm_bias=True, tied=False)
        self.out_bias = self.vector("output.bias", hp.n_vocab)
        self.layers = []
        for i in range(hp.n_layer):
            w, b = self.norm_weights(f"blk.{i}.attn_norm")
            self.layers.append(Layer(attn_norm=w, attn_norm_b=b, attn=self.attention_weights(i, biases=True),
                                     ffn_norm=None, ffn=self.ffn_weights(i), parallel=True))
