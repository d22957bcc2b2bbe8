"""SmallThinker (`smallthinker`: 4B-A0.6B, 21B-A3B, made to run on laptops and phones), as
llama.cpp runs it: a pre-norm block whose experts are chosen by a router reading the layer's
input, before attention, so that their weights can be fetched while attention runs.

    r = Wr x                                   (the router, on the layer's input)
    h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)      (NEOX; not in the full layers)
    x += Wo attention(q, K, V)                 (3 of every 4 layers over a window of 4096)
    h = rmsnorm(x) ; x += sum_e w_e Wdown_e (relu(Wgate_e h) * Wup_e h)
    logits = Wout rmsnorm(x)

With a sliding window in the file, layer i is full when i % period == 0
(attention.sliding_window_pattern, 4) and without RoPE when i % 4 == 0; llama.cpp fixes
the window at 4096, as pyllm does.
The chosen experts' gate values (softmax or sigmoids: expert_gating_func) are renormalized.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedModelError
from ..graph import GLU_RELU, MOE_SIGMOID, MOE_SOFTMAX, ROPE_NEOX
from .base import GATING_SIGMOID, GATING_SOFTMAX, Layer, Rope
from .blocks import PreNormDecoder

WINDOW = 4096       # the windowed layers' window
NOPE_PERIOD = 4     # with a window, layers i % 4 == 0 use no RoPE


class SmallThinker(PreNormDecoder):
    name = "smallthinker"
    rope_mode = ROPE_NEOX
    glu = GLU_RELU
    experts = "required"

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.windowed = int(mf.arch_get("attention.sliding_window", 0) or 0) > 0
        pattern = mf.arch_get("attention.sliding_window_pattern", 4)
        if not isinstance(pattern, (int, np.integer)) or int(pattern) < 1:
            raise UnsupportedModelError(f"{mf.path}: smallthinker with a sliding_window_pattern of {pattern!r} "
                                        f"is not supported")
        self.period = int(pattern)
        self.window = WINDOW if self.windowed else 0
        self.read_ends()
        func = int(mf.arch_require("expert_gating_func"))   # llama.cpp aborts without it
        if func not in (GATING_SOFTMAX, GATING_SIGMOID):
            raise UnsupportedModelError(f"{mf.path}: expert gating function {func} is not supported")
        gating = MOE_SIGMOID if func == GATING_SIGMOID else MOE_SOFTMAX
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            m = self.moe_weights(i)
            m.gating, m.norm, m.router_on_input = gating, True, True   # no expert_weights_scale, as llama.cpp
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd),
                                     attn=self.attention_weights(i),
                                     ffn_norm=self.vector(p + "ffn_norm.weight", hp.n_embd), ffn=m))

    def is_full(self, i: int) -> bool:
        """A layer over the whole context, without RoPE (only where the file has a window)."""
        return self.windowed and i % self.period == 0

    def expert_width(self, k: int) -> int:
        return int(self.mf.arch_get("expert_feed_forward_length", 0) or 0) or self.hp.n_ff

    def layer_window(self, i: int) -> int:
        return 0 if self.is_full(i) else self.window

    def layer_rope(self, i: int) -> Rope:
        """NoPE in layers i % 4 == 0 where the file has a window, unless the model has exactly 4
        layers (llama.cpp's rule: a period equal to the layer count means RoPE everywhere)."""
        r = super().layer_rope(i)
        nope = self.windowed and NOPE_PERIOD != self.hp.n_layer and i % NOPE_PERIOD == 0
        return r.off() if nope else r
