"""GPT-NeoX (`gptneox`: Pythia, GPT-NeoX-20B, RedPajama-INCITE) and Falcon
(`falcon`: 7B, 40B): LayerNorm decoders with an ungated GELU FFN whose
attention and FFN read the same x side by side.

GPT-NeoX:
    [q | k | v] = Wqkv layernorm1(x) + b ; rope(q, k)             # NEOX, partial
    x += Wo attention(q, K, V) + bo  +  Wdown gelu(Wup layernorm2(x) + bup) + bdown
(with `gptneox.use_parallel_residual` false the FFN reads layernorm2 of x after
the attention instead, as a pre-norm block).

Falcon: no biases but the norms', multi-query attention, full NEOX RoPE:
    h = layernorm(x)
    x += Wo attention(Wqkv h') + Wdown gelu(Wup h)
where h' is h (7B) or a second norm of x, `attn_norm_2` (40B).
Both: the output norm has a bias; Falcon ties the logits to the embedding
when `output.weight` is absent.
"""
from __future__ import annotations

from ..graph import GLU_GELU_TANH, NORM_LAYER, ROPE_NEOX
from .base import Layer
from .blocks import PreNormDecoder
from .starcoder2 import StarCoder2


class GptNeoX(StarCoder2):
    """StarCoder 2's weights with q/k/v biases required, the output untied and,
    by default, the parallel block with two norms."""
    name = "gptneox"
    qkv_biases = True
    tied_output = False

    def parallel_residual(self) -> bool:
        return bool(self.mf.arch_get("use_parallel_residual", True))


class Falcon(PreNormDecoder):
    name = "falcon"
    rope_mode = ROPE_NEOX
    glu = GLU_GELU_TANH
    norm = NORM_LAYER
    gated = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends(norm_bias=True)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            norm1 = self.norm_weights(p + "attn_norm")
            if mf.has_tensor(p + "attn_norm_2.weight"):   # 40B: the attention reads its own norm, the FFN norm1
                (an, an_b), (fn, fn_b) = self.norm_weights(p + "attn_norm_2"), norm1
            else:                                         # 7B: one norm for both
                (an, an_b), (fn, fn_b) = norm1, (None, None)
            self.layers.append(Layer(attn_norm=an, attn_norm_b=an_b, attn=self.attention_weights(i),
                                     ffn_norm=fn, ffn_norm_b=fn_b, ffn=self.ffn_weights(i), parallel=True))
