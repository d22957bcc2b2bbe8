"""BailingMoE 2 (`bailingmoe2`: inclusionAI's Ling 2.0 / Ring 2.0, mini 16B-A1.4B, flash
100B-A6B): a pre-norm block with a fused q/k/v, per-head q/k norms and NEOX RoPE on part of
each head; DeepSeek's experts after the leading dense layers (sigmoid gates, exp_probs_b to
choose, renormalized, scaled, within the best expert groups) and shared experts of
expert_shared_feed_forward_length (else an expert's width). The last
`nextn_predict_layers` blocks (multi-token prediction) are not run.

    h = rmsnorm(x) ; [q | k | v] = Wqkv h ; q, k = rmsnorm_per_head(q, k) ; rope(q, k)
    x += Wo attention(q, K, V)
    h = rmsnorm(x) ; x += experts(h) + shared(h)     (a dense FFN in the leading layers)
"""
from __future__ import annotations

from ..graph import ROPE_NEOX
from .base import GATING_SIGMOID, Layer, SharedExpertsMoe
from .blocks import PreNormDecoder


class BailingMoe2(SharedExpertsMoe, PreNormDecoder):
    name = "bailingmoe2"
    rope_mode = ROPE_NEOX
    experts = "required"

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.drop_prediction_layers()
        self.read_ends(tied=False)
        self.layers = [Layer(attn_norm=self.vector(f"blk.{i}.attn_norm.weight", hp.n_embd),
                             attn=self.attention_weights(i, qk_norm=True),
                             ffn_norm=self.vector(f"blk.{i}.ffn_norm.weight", hp.n_embd),
                             ffn=self.experts_of(i) or self.ffn_weights(i))
                       for i in range(hp.n_layer)]

    def default_gating(self) -> int:
        return GATING_SIGMOID

    def shared_width(self) -> int:
        return int(self.mf.arch_get("expert_shared_feed_forward_length", 0) or 0) or self.expert_width(0)
