"""StableLM (2): Llama's gated SiLU FFN with LayerNorm, RoPE on part of each
head, and a parallel block where a layer has no FFN norm.

    x = embed(tokens)
    for each layer:
        h = layernorm(x) ; q, k, v = Wq h (+ bq), ... ; rope(q, k) on the first
        rope.dimension_count dims            # NEOX; 16 of 64 on StableLM 2 1.6B
        x += Wo attention(q, K, V)
        h = layernorm(x) ; x += Wdown (silu(Wgate h) * Wup h)
        (no ffn_norm: the FFN reads the attention's h, x += attn(h) + ffn(h))
    logits = Wout layernorm(x)

As llama.cpp reads a stablelm file: `stablelm.attention.layer_norm_epsilon`,
norm biases required, q/k/v biases as the file has them. The 12B's per-head
q/k LayerNorms (a weight for every head) are refused.
"""
from __future__ import annotations

from ..graph import GLU_SILU, NORM_LAYER, ROPE_NEOX
from .base import Layer
from .blocks import PreNormDecoder


class StableLM(PreNormDecoder):
    name = "stablelm"
    rope_mode = ROPE_NEOX
    glu = GLU_SILU
    norm = NORM_LAYER

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.refuse_tensor("blk.0.attn_q_norm.weight", "per-head q/k norms (StableLM 2 12B)")
        self.read_ends(norm_bias=True, tied=False)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            an, an_b = self.norm_weights(p + "attn_norm")
            parallel = not mf.has_tensor(p + "ffn_norm.weight")
            fn, fn_b = (None, None) if parallel else self.norm_weights(p + "ffn_norm")
            self.layers.append(Layer(attn_norm=an, attn_norm_b=an_b, attn=self.attention_weights(i),
                                     ffn_norm=fn, ffn_norm_b=fn_b, ffn=self.ffn_weights(i), parallel=parallel))


class Orion(StableLM):
    """Orion (`orion`: OrionStar's Orion-14B): StableLM's layout with RoPE over all of each
    head; LayerNorm with biases, NEOX RoPE, no q/k/v biases in the released files."""
    name = "orion"
