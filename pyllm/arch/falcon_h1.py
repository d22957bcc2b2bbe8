"""Falcon-H1 (`falcon-h1`: TII's Falcon-H1 0.5B..34B): every layer runs attention and a
Mamba 2 mixer side by side on the same norm of x, then a SwiGLU FFN.

    h = rmsnorm(x) ; x += Wo attention(rope(Wq h), rope(Wk h), Wv h) + mamba2(h)    # NEOX RoPE
    h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)
    logits = Wout rmsnorm(x)

The model's muP multipliers are folded into its weights by the converter, as llama.cpp
reads the files: nothing to scale here. The FFN norm is stored as `blk.N.ffn_norm`,
without ".weight".
"""
from __future__ import annotations

from ..graph import GLU_SILU, ROPE_NEOX, Graph
from .base import Architecture, Layer
from .blocks import attention, embed, ffn, output_head, ssm_mixer


class FalconH1(Architecture):
    name = "falcon-h1"
    rope_mode = ROPE_NEOX
    glu = GLU_SILU

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends()
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            ffn_norm = p + "ffn_norm.weight" if mf.has_tensor(p + "ffn_norm.weight") else p + "ffn_norm"
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd),
                                     attn=self.attention_weights(i), ssm=self.ssm_weights(i),
                                     ffn_norm=self.vector(ffn_norm, hp.n_embd), ffn=self.ffn_weights(i)))

    def build(self, g: Graph) -> None:
        eps = self.hp.eps
        x = embed(g, self)
        for i, L in g.layers(self.layers, x):
            h = g.rmsnorm(x, L.attn_norm, eps, "h")
            attention(g, self, h, L.attn, i, out=x)
            ssm_mixer(g, h, L.ssm, eps, out=x)
            ffn(g, g.rmsnorm(x, L.ffn_norm, eps, "h"), L.ffn, self.glu, out=x)
        output_head(g, self, x)
