"""Nemotron (`nemotron`: Minitron, Nemotron-Mini) and Arcee (`arcee`: AFM-4.5B):
pre-norm decoders whose FFN is ungated, Wdown relu(Wup h)^2.

Nemotron:
    h = layernorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)       # NEOX, partial
    x += Wo attention(q, K, V) (+ bo)
    h = layernorm(x) ; x += Wdown relu(Wup h (+ bup))^2 (+ bdown)
    logits = Wout layernorm(x)
with biases on every norm (the converter folds Nemotron's "1 +" into the weights).

Arcee is the Llama block with that FFN: RMSNorm, adjacent-pair RoPE.
"""
from __future__ import annotations

from ..graph import GLU_RELU_SQR, NORM_LAYER, NORM_RMS, ROPE_NEOX, ROPE_NORM
from .base import Layer
from .blocks import PreNormDecoder


class Nemotron(PreNormDecoder):
    name = "nemotron"
    rope_mode = ROPE_NEOX
    glu = GLU_RELU_SQR
    norm = NORM_LAYER
    gated = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        layer_norm = self.norm == NORM_LAYER
        self.read_ends(norm_bias=layer_norm)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            (an, an_b), (fn, fn_b) = (self.norm_weights(p + "attn_norm", bias=layer_norm),
                                      self.norm_weights(p + "ffn_norm", bias=layer_norm))
            self.layers.append(Layer(attn_norm=an, attn_norm_b=an_b, attn=self.attention_weights(i),
                                     ffn_norm=fn, ffn_norm_b=fn_b, ffn=self.ffn_weights(i)))


class Arcee(Nemotron):
    name = "arcee"
    rope_mode = ROPE_NORM
    norm = NORM_RMS
