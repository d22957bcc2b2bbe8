"""AFMoE (`afmoe`: Arcee's Trinity Nano 6B-A1B and Mini 26B-A3B), as llama.cpp runs it.

    x = sqrt(n_embd) embed(tokens)                              (muP)
    for each layer i:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h ; q, k = rmsnorm_per_head(q, k)
        3 of every 4 layers: rope(q, k) (NEOX), attention over the file's sliding window
        every 4th ((i + 1) % 4 == 0): no RoPE, the whole context
        x += rmsnorm(Wo (attention(q, K, V) * sigmoid(Wgate h)))      (gated attention)
        h = rmsnorm(x) ; x += rmsnorm(experts(h) + shared(h))   (a dense FFN in the leading layers)
    logits = Wout rmsnorm(x)

The experts are DeepSeek's (sigmoid gates by default, exp_probs_b to choose, renormalized
and scaled as the file says, expert_shared_count shared experts).
"""
from __future__ import annotations

import math

from ..graph import ROPE_NEOX
from .base import GATING_SIGMOID, Rope, SharedExpertsMoe
from .blocks import PostNormDecoder

GLOBAL_PERIOD = 4   # layers (i + 1) % 4 == 0 attend globally, without RoPE


class Afmoe(SharedExpertsMoe, PostNormDecoder):
    name = "afmoe"
    rope_mode = ROPE_NEOX
    experts = "required"

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.window = int(mf.arch_get("attention.sliding_window", 0) or 0)
        self.read_ends()
        self.layers = []
        for i in range(self.hp.n_layer):
            attn = self.attention_weights(i, qk_norm=True)
            attn.gate = self.weight(f"blk.{i}.attn_gate.weight", self.hp.n_embd, self.hp.q_dim)
            self.layers.append(self.post_norm_layer(i, attn, ffn=self.experts_of(i)))

    def default_gating(self) -> int:
        return GATING_SIGMOID

    def is_global(self, i: int) -> bool:
        return (i + 1) % GLOBAL_PERIOD == 0

    def layer_window(self, i: int) -> int:
        return 0 if self.is_global(i) else self.window

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        return r.off() if self.is_global(i) else r

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hp.n_embd)
