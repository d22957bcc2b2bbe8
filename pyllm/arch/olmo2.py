"""OLMo 2: norms on each branch's output instead of its input, and RMSNorm
over the whole of q and of k.

    x = embed(tokens)
    for each layer:
        q, k, v = Wq x, Wk x, Wv x
        q, k = rmsnorm(q), rmsnorm(k)          # over all heads at once
        rope(q, k)                             # NEOX
        x += rmsnorm(Wo attention(q, K, V))
        x += rmsnorm(Wdown (silu(Wgate x) * Wup x))
    logits = Wout rmsnorm(x)

The attention and FFN read the residual stream x itself: there is no input
norm. Files with `olmo2.attention.sliding_window` (OLMo 3's local layers)
are refused.
"""
from __future__ import annotations

from ..errors import UnsupportedModelError
from ..graph import GLU_SILU, ROPE_NEOX
from .base import Layer
from .blocks import PostNormDecoder, PreNormDecoder


class Olmo2(PostNormDecoder):
    name = "olmo2"
    rope_mode = ROPE_NEOX
    glu = GLU_SILU

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        window = int(mf.arch_get("attention.sliding_window", 0) or 0)
        if window > 0:
            raise UnsupportedModelError(f"{mf.path}: olmo2 with sliding-window layers (OLMo 3, window "
                                        f"{window}) is not supported yet")
        self.read_ends()
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            attn = self.attention_weights(i, qk_norm="full")
            self.layers.append(Layer(
                attn_norm=None, attn=attn,
                post_attn_norm=self.vector(p + "post_attention_norm.weight", hp.n_embd),
                ffn_norm=None, ffn=self.ffn_weights(i),
                post_ffn_norm=self.vector(p + "post_ffw_norm.weight", hp.n_embd),
            ))


class Olmoe(PreNormDecoder):
    """OLMoE (`olmoe`): a pre-norm Llama-style block with OLMo 2's q/k RMSNorm
    over all heads, NEOX RoPE, and a mixture of experts for every FFN whose
    chosen softmax weights are used as they are (not renormalized).

        h = rmsnorm(x) ; q, k = rmsnorm(Wq h), rmsnorm(Wk h) ; rope(q, k)
        x += Wo attention(q, K, V)
        x += sum_e p_e Wdown_e (silu(Wgate_e h') * Wup_e h'),  h' = rmsnorm(x)
    """
    name = "olmoe"
    rope_mode = ROPE_NEOX
    glu = GLU_SILU
    experts = "required"
    moe_norm = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends()
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            attn = self.attention_weights(i, qk_norm="full")
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd), attn=attn,
                                     ffn_norm=self.vector(p + "ffn_norm.weight", hp.n_embd),
                                     ffn=self.moe_weights(i)))
