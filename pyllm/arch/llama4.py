"""Llama 4 (`llama4`: Scout 17B-16E, Maverick 17B-128E), as llama.cpp runs it.

    x = embed(tokens)
    for each layer i:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h
        3 of every 4 layers: rope(q, k) ; q, k = rmsnorm_per_head(q, k) (no weight; not Maverick)
                             attention within the position's chunk of 8192 tokens
        every 4th layer:     no RoPE; q *= 1 + 0.1 ln(1 + floor((p + 1) / 8192)); the whole context
        x += Wo attention(q, K, V)
        h = rmsnorm(x) ; x += expert_e(w_e h) + shared(h)      (every interleave_moe_layer_step-th
                                                                layer; a dense FFN elsewhere)
    logits = Wout rmsnorm(x)

The router's sigmoid picks one expert (expert_used_count 1) and its weight scales the
expert's input rather than its output. llama.cpp fixes the chunk (8192), the NoPE period
(4) and the temperature (0.1 per 8192 positions, offset 1) in code; so does pyllm.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedModelError
from ..graph import MOE_SIGMOID, ROPE_NORM
from .base import Layer, Rope
from .blocks import PreNormDecoder

CHUNK = 8192          # attention chunk of the chunked layers
NOPE_PERIOD = 4       # layers i with (i + 1) % 4 == 0 use no RoPE
TEMPERATURE = (0.1, 8192, 1.0)   # (s, period, offset) of the NoPE layers' q scale


class Llama4(PreNormDecoder):
    name = "llama4"
    rope_mode = ROPE_NORM
    experts = "required"
    qk_norm_after_rope = True
    chunked_window = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        window = mf.arch_get("attention.sliding_window")
        if window is not None and int(window) == 0:
            raise UnsupportedModelError(f"{mf.path}: llama4 without chunked attention is not supported")
        pattern = mf.arch_get("attention.sliding_window_pattern", 4)
        if not isinstance(pattern, (int, np.integer)) or int(pattern) < 1:
            raise UnsupportedModelError(f"{mf.path}: llama4 with a sliding_window_pattern of {pattern!r} "
                                        f"is not supported")
        self.period = int(pattern)
        self.window = CHUNK
        self.read_ends()
        self.rope_freqs = self.optional_vector("rope_freqs.weight", hp.rope_dim // 2)
        n_experts = int(mf.arch_require("expert_count"))
        k = int(mf.arch_require("expert_used_count"))
        if k != 1:
            raise UnsupportedModelError(f"{mf.path}: llama4 with {k} experts per token is not supported "
                                        f"(its weight scales the expert's input: one expert)")
        self.moe_step = int(mf.arch_require("interleave_moe_layer_step"))
        kq_norm = n_experts != 128       # as llama.cpp: Scout's (16 experts) yes, Maverick's no
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            attn = self.attention_weights(i)
            if kq_norm and self.uses_rope(i):
                attn.q_norm = attn.k_norm = np.ones(hp.head_dim, np.float32)
            ffn = self.moe_weights(i) if self.moe_layer(i) else self.ffn_weights(i)
            if self.moe_layer(i):
                ffn.gating, ffn.norm, ffn.weight_input = MOE_SIGMOID, False, True   # llama.cpp reads no scale
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd), attn=attn,
                                     ffn_norm=self.vector(p + "ffn_norm.weight", hp.n_embd), ffn=ffn))

    def uses_rope(self, i: int) -> bool:
        return (i + 1) % NOPE_PERIOD != 0

    def moe_layer(self, i: int) -> bool:
        return self.moe_step > 0 and (i + 1) % self.moe_step == 0

    def expert_width(self, k: int) -> int:
        return int(self.mf.arch_require("expert_feed_forward_length"))

    def shared_expert(self, i: int):
        """The shared expert, as wide as a routed one."""
        return self.shared_ffn(i, self.expert_width(1))

    def layer_window(self, i: int) -> int:
        """The chunk of the chunked layers (i % period < period - 1), 0 for the others."""
        return self.window if i % self.period < self.period - 1 else 0

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        return r if self.uses_rope(i) else r.off()

    def layer_attn_temperature(self, i: int):
        return None if self.uses_rope(i) else TEMPERATURE

    @property
    def attn_scale(self) -> float:
        s = float(self.mf.arch_get("attention.scale", 0.0) or 0.0)
        return s or super().attn_scale
