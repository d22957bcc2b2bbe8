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

from ..graph import GLU_SILU, ROPE_NEOX, ROPE_NORM
from .base import GATING_SIGMOID, Layer, SharedExpertsMoe
from .blocks import PostNormDecoder, PreNormDecoder
from .llama import Llama


class ChatGLM(Llama):
    """ChatGLM (`chatglm`: GLM-4-9B-chat and GLM-4-9B-0414's predecessors, ChatGLM3, GLM-Edge):
    the pre-norm Llama block with GLM-4's fused q/k/v (and bias) and fused [gate | up] FFN,
    RoPE as adjacent pairs over `rope.dimension_count` (half) of each head; no post norms."""
    name = "chatglm"
    rope_mode = ROPE_NORM
    fused_ffn = True

    def sliding_window(self) -> int:
        return 0


class Glm4(PostNormDecoder):
    name = "glm4"
    rope_mode = ROPE_NORM
    glu = GLU_SILU
    fused_ffn = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.read_ends()
        self.layers = [self.post_norm_layer(i, self.attention_weights(i)) for i in range(self.hp.n_layer)]


class Glm4Moe(SharedExpertsMoe, PreNormDecoder):
    """GLM-4.5 / 4.6 (`glm4moe`: GLM-4.5-Air 106B-A12B, GLM-4.5 355B-A32B): a pre-norm block
    (the FFN's norm is the file's post_attention_norm) with q/k/v biases, per-head q/k norms
    where the file has them (355B), NEOX RoPE on half of each head, and DeepSeek's experts
    after the leading dense layers: sigmoid gates (the default), exp_probs_b to choose,
    renormalized, shared experts. The last `nextn_predict_layers` blocks are the multi-token
    prediction head (speculative decoding); they are not run, as in llama.cpp."""
    name = "glm4moe"
    rope_mode = ROPE_NEOX
    experts = "required"

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.drop_prediction_layers()
        self.read_ends()
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            attn = self.attention_weights(i, qk_norm=mf.has_tensor(p + "attn_q_norm.weight"))
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd), attn=attn,
                                     ffn_norm=self.vector(p + "post_attention_norm.weight", hp.n_embd),
                                     ffn=self.experts_of(i) or self.ffn_weights(i)))

    def default_gating(self) -> int:
        return GATING_SIGMOID
