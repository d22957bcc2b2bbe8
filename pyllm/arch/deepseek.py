"""DeepSeek (`deepseek`: DeepSeek-MoE 16B and the first DeepSeek models with experts): the
Llama block, whose FFN after `leading_dense_block_count` dense layers is a mixture of
experts plus shared experts.

    h = rmsnorm(x) ; x += Wo attention(rope(Wq h), rope(Wk h), Wv h)
    h = rmsnorm(x) ; x += ffn(h)                                  (the leading layers)
                     x += sum_e softmax(Wr h)_e expert_e(h) * s + shared(h)   (the others)

As llama.cpp runs it: the router's softmax over all experts, the chosen ones' values not
renormalized, times expert_weights_scale s; the expert_shared_count shared experts as one
FFN that many experts wide. RoPE rotates adjacent pairs (the converter permuted q and k).
"""
from __future__ import annotations

from ..graph import MOE_SOFTMAX
from .base import SharedExpertsMoe
from .llama import Llama


class Deepseek(SharedExpertsMoe, Llama):
    name = "deepseek"
    experts = True
    norm_from_file = False   # llama.cpp reads expert_weights_norm for bailingmoe, not for deepseek

    def layer_ffn(self, i: int):
        m = self.experts_of(i)
        if m is None:
            return self.ffn_weights(i)
        m.gating = MOE_SOFTMAX   # llama.cpp reads no gating key for these families
        m.norm = m.norm and self.norm_from_file
        return m

    def sliding_window(self) -> int:
        return 0


class BailingMoe(Deepseek):
    """Bailing MoE (`bailingmoe`: Ling-lite, Ling-plus, Ling-Coder-lite; Ling 2.0 is bailingmoe2):
    DeepSeek-MoE's layout, every layer's FFN the experts (after any leading dense layers) plus
    shared experts, the chosen experts' softmax values renormalized where expert_weights_norm
    says (the converter's norm_topk_prob), times expert_weights_scale."""
    name = "bailingmoe"
    experts = True
    norm_from_file = True
