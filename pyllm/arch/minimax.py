"""MiniMax-M2 (`minimax-m2`: 230B-A10B, and M2.1 / M2.5 in the same layout): a pre-norm
block with q/k norms over all of q and of k, partial RoPE, and experts in every layer.

    h = rmsnorm(x) ; q, k = rmsnorm(Wq h), rmsnorm(Wk h) ; v = Wv h      (norms as wide as q, k)
    rope(q, k)                                   (NEOX, rope.dimension_count of each head)
    x += Wo attention(q, K, V)
    h = rmsnorm(x) ; x += sum_e w_e Wdown_e (silu(Wgate_e h) * Wup_e h)
    logits = Wout rmsnorm(x)

The router's sigmoids (expert_gating_func, which the released files set) plus exp_probs_b
choose the experts; their sigmoids, renormalized (llama.cpp always renormalizes here) and
times expert_weights_scale where the file gives one, weigh them.
"""
from __future__ import annotations

from ..graph import ROPE_NEOX
from .base import GATING_SIGMOID, Architecture, Layer, Moe, SharedExpertsMoe
from .blocks import PreNormDecoder


class MinimaxM2(SharedExpertsMoe, PreNormDecoder):
    name = "minimax-m2"
    rope_mode = ROPE_NEOX
    experts = "required"

    def __init__(self, mf, n_ctx=None):
        Architecture.__init__(self, mf, n_ctx)
        hp = self.hp
        self.read_ends(tied=False)
        self.layers = []
        for i in range(hp.n_layer):
            ffn = self.experts_of(i) or self.ffn_weights(i)   # dense: leading_dense_block_count, if a file has it
            if isinstance(ffn, Moe):
                ffn.norm = True
            self.layers.append(Layer(attn_norm=self.vector(f"blk.{i}.attn_norm.weight", hp.n_embd),
                                     attn=self.attention_weights(i, qk_norm="full"),
                                     ffn_norm=self.vector(f"blk.{i}.ffn_norm.weight", hp.n_embd), ffn=ffn))

    def default_gating(self) -> int:
        return GATING_SIGMOID

    def expert_width(self, k: int) -> int:
        return self.hp.n_ff   # llama.cpp sizes the experts by feed_forward_length
