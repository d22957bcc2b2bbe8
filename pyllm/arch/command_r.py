"""Cohere's Command R and Command R7B (`command-r`, `cohere2`): one LayerNorm
(no bias) feeding attention and the FFN side by side, scaled logits.

    x = embed(tokens)
    for each layer:
        h = layernorm(x)                              # weight only
        q, k, v = Wq h, Wk h, Wv h ; rope(q, k)       # adjacent pairs
        x += Wo attention(q, K, V) + Wdown (silu(Wgate h) * Wup h)
    logits = logit_scale * Wout layernorm(x)         # Wout tied to the embedding

As llama.cpp reads these files:
- `logit_scale` multiplies the logits (required); the LayerNorm epsilon is
  `attention.layer_norm_epsilon`.
- cohere2 (R7B): layer i attends over a sliding window of
  `attention.sliding_window` tokens (required) unless i % 4 == 3; those
  global layers have no RoPE at all.
- Command R+'s per-head q/k LayerNorms (a weight for every head) are refused.
"""
from __future__ import annotations

from ..errors import ModelFileError
from ..graph import GLU_SILU, NORM_LAYER, ROPE_NORM
from .base import Layer, LocalGlobalLayers
from .blocks import PreNormDecoder


class CommandR(PreNormDecoder):
    name = "command-r"
    rope_mode = ROPE_NORM
    glu = GLU_SILU
    norm = NORM_LAYER

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.refuse_tensor("blk.0.attn_q_norm.weight", "per-head q/k norms (Command R+)")
        self.logit_scale = float(mf.arch_require("logit_scale"))
        self.read_ends()
        self.rope_freqs = self.optional_vector("rope_freqs.weight", hp.rope_dim // 2)
        self.layers = [Layer(attn_norm=self.norm_weights(f"blk.{i}.attn_norm", bias=False)[0],
                             attn=self.attention_weights(i), ffn_norm=None, ffn=self.ffn_weights(i), parallel=True)
                       for i in range(hp.n_layer)]


class Cohere2(LocalGlobalLayers, CommandR):
    name = "cohere2"

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.window = int(mf.arch_require("attention.sliding_window"))
        if self.window <= 0:
            raise ModelFileError(f"{mf.path}: cohere2.attention.sliding_window = {self.window} is not positive")
