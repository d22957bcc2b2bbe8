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
norm.

OLMo 3 (the same arch name, with `attention.sliding_window`): 3 of every 4
layers (or `attention.sliding_window_pattern`) attend over the window with
plain RoPE (base `rope.freq_base_swa`, else the file's); the others over the
whole context with the file's RoPE scaling (YaRN in the released files) and
its attention factor, as llama.cpp runs them.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedModelError
from ..graph import GLU_SILU, NORM_LAYER, ROPE_NEOX
from .base import Layer, Rope, sliding_layers
from .blocks import PostNormDecoder, PreNormDecoder

SWA_PERIOD = 4   # OLMo 3: layers 0-2 of every 4 local


class Olmo2(PostNormDecoder):
    name = "olmo2"
    rope_mode = ROPE_NEOX
    glu = GLU_SILU

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.window, self.is_swa = sliding_layers(mf, hp.n_layer, SWA_PERIOD)
        self.swa_rope_base = float(mf.arch_get("rope.freq_base_swa", hp.rope_base))
        self.read_ends()
        self.layers = [self.post_norm_layer(i, self.attention_weights(i, qk_norm="full"), input_norms=False)
                       for i in range(hp.n_layer)]

    def layer_rope(self, i: int) -> Rope:
        if self.is_swa[i]:   # unscaled
            return Rope(self.rope_mode, self.hp.rope_dim, self.swa_rope_base)
        return super().layer_rope(i)

    def layer_attn_scale(self, i: int) -> float:
        return 1.0 / math.sqrt(self.hp.head_dim) if self.is_swa[i] else self.attn_scale


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


class Olmo(PreNormDecoder):
    """OLMo 1 (`olmo`: OLMo-1B/7B): the Llama block with LayerNorms that have neither weight nor
    bias (none in the file; weights of ones here), the output's too; RoPE on adjacent pairs.
    clip_qkv (attention.clamp_kqv) is refused."""
    name = "olmo"
    norm = NORM_LAYER

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        if float(mf.arch_get("attention.clamp_kqv", 0.0) or 0.0) > 0:
            raise UnsupportedModelError(f"{mf.path}: olmo with clip_qkv (olmo.attention.clamp_kqv) is not supported")
        ones = np.ones(hp.n_embd, np.float32)
        self.tok_embd = self.weight("token_embd.weight", hp.n_embd, hp.n_vocab)
        self.out_norm = ones
        self.output = self.output_weight()
        self.layers = [Layer(attn_norm=ones, attn=self.attention_weights(i), ffn_norm=ones, ffn=self.ffn_weights(i))
                       for i in range(hp.n_layer)]
