"""LFM2 (`lfm2`: Liquid's LFM2 350M..2.6B): a pre-norm decoder whose layers
mix tokens either by attention or by a short causal convolution.

    h = rmsnorm(x)
    attention layers:    q, k = rmsnorm_per_head(Wq h), rmsnorm_per_head(Wk h) ; rope(q, k)    # NEOX
                         x += Wo attention(q, K, Wv h)
    convolution layers:  [b | c | u] = Win h ; x += Wout (c * conv(b * u))
    h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)
    logits = Wout rmsnorm(x)      # the norm is stored as token_embd_norm; Wout tied to the embedding

`attention.head_count_kv` is a list, 0 for a convolution layer. conv is
depthwise over positions with `shortconv.l_cache` taps (3): channel c at
position p sums w[c, j] (b * u)[p - 2 + j]. The last two inputs are kept as a
recurrent state (OP_SSM_CONV, f32, as llama.cpp keeps them): a few KB per layer
where a copy per position would grow with the context, and the model then
follows the recurrent prefix rule (pyllm/kv_cache.py).
"""
from __future__ import annotations

from ..errors import ModelFileError, UnsupportedModelError
from ..graph import GLU_SILU, ROPE_NEOX
from .base import GATING_SIGMOID, Layer, SharedExpertsMoe, ShortConv
from .blocks import PreNormDecoder


class Lfm2(PreNormDecoder):
    name = "lfm2"
    rope_mode = ROPE_NEOX
    glu = GLU_SILU
    kv_per_layer = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        if mf.arch_get("attention.sliding_window"):
            raise UnsupportedModelError(f"{mf.path}: lfm2 with sliding-window layers is not supported yet")
        self.read_ends(out_norm="token_embd_norm")
        taps = int(mf.arch_require("shortconv.l_cache"))
        if not 1 < taps <= 64:
            raise ModelFileError(f"{mf.path}: lfm2.shortconv.l_cache = {taps} is not in 2..64")
        kv_heads = hp.kv_heads or [hp.n_head_kv] * hp.n_layer
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            if kv_heads[i]:
                mixer = self.attention_weights(i, qk_norm=True)
            else:
                mixer = ShortConv(in_proj=self.weight(p + "shortconv.in_proj.weight", hp.n_embd, 3 * hp.n_embd),
                                  conv=self.floats(p + "shortconv.conv.weight", taps, hp.n_embd),
                                  out_proj=self.weight(p + "shortconv.out_proj.weight", hp.n_embd, hp.n_embd))
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd), attn=mixer,
                                     ffn_norm=self.vector(p + "ffn_norm.weight", hp.n_embd), ffn=self.ffn_of(i)))

    def ffn_of(self, i: int):
        return self.ffn_weights(i)


class Lfm2Moe(SharedExpertsMoe, Lfm2):
    """LFM2 MoE (`lfm2moe`: LFM2-8B-A1B): LFM2's layers with experts in place of the FFN
    after `leading_dense_block_count` dense ones: the router's sigmoids (+ exp_probs_b to
    choose) weigh the chosen experts, always renormalized, as llama.cpp runs it; no
    shared expert."""
    name = "lfm2moe"
    experts = "required"

    def default_gating(self) -> int:
        return GATING_SIGMOID

    def ffn_of(self, i: int):
        m = self.experts_of(i)
        if m is None:
            return self.ffn_weights(i)
        m.norm, m.scale = True, 1.0   # llama.cpp's lfm2moe ignores expert_weights_norm/scale
        return m
