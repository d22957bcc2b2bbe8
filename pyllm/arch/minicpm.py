"""MiniCPM (`minicpm`: MiniCPM 1B/2B, MiniCPM 4 0.5B/8B): Granite's block and multipliers,
as llama.cpp runs it.

    x = embed(tokens) * scale_emb
    for each layer:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)
        x += (scale_depth / sqrt(n_layer)) * Wo attention(q, K, V)
        h = rmsnorm(x) ; x += (scale_depth / sqrt(n_layer)) * Wdown (silu(Wgate h) * Wup h)
    logits = Wout rmsnorm(x) / (n_embd / dim_model_base)

The converter writes the three multipliers as embedding_scale, residual_scale and
logit_scale (the divisor). Files from before it did lack them; llama.cpp then takes
12, 1.4 / sqrt(n_layer) (the released configs' scale_emb and scale_depth) and a divisor
of 256 / n_embd, the inverse of the configs' n_embd / dim_model_base; pyllm takes the
configs' n_embd / 256, so on such a file its logits are llama.cpp's times (256 / n_embd)^2.
RoPE is always on and rotates adjacent pairs; the softmax scale is 1/sqrt(head_dim).
MiniCPM 4's long-context files carry LongRoPE factors (base.LongRope).

MiniCPM 3 (`minicpm3`: MiniCPM3-4B): the same multipliers, fixed in llama.cpp's graph (its
files carry none: 12, 1.4 / sqrt(n_layer), logits times 256 / n_embd), around DeepSeek 2's
latent attention (q through q_a and q_b, NEOX RoPE on each head's last rope dims) and dense
FFNs, with LongRoPE. llama.cpp caches each head's keys and values; pyllm runs the latent form
of deepseek2.py, caching the latent and k_pe alone (288 values a position and layer in
place of 6400 on the 4B).
"""
from __future__ import annotations

import math

from ..errors import ModelFileError
from ..graph import ROPE_NEOX, Graph
from .base import Layer, LongRope
from .deepseek2 import Deepseek2, latent_attention
from .granite import Granite

DIM_MODEL_BASE = 256      # the released configs' dim_model_base


class MiniCPM(LongRope, Granite):
    name = "minicpm"
    experts = True        # MiniCPM-MoE-8x2B: Granite's softmax experts, renormalized

    def read_granite_scales(self, mf, logit_scale_required: bool = False) -> None:
        """The three multipliers, the released configs' where the file has none; RoPE always on."""
        n_layer, n_embd = self.hp.n_layer, self.hp.n_embd
        embedding = float(mf.arch_get("embedding_scale", 12.0))
        residual = float(mf.arch_get("residual_scale", 1.4 / math.sqrt(n_layer)))
        divisor = float(mf.arch_get("logit_scale", n_embd / DIM_MODEL_BASE))
        if not all(math.isfinite(v) for v in (embedding, residual, divisor)) or divisor <= 0:
            raise ModelFileError(f"{mf.path}: minicpm's multipliers (embedding {embedding}, residual {residual}, "
                                 f"logit divisor {divisor}) are not usable; the file is corrupt")
        self.embedding_scale = embedding or 1.0   # 0: none, as llama.cpp
        self.residual_scale = residual or 1.0
        self.logit_scale = 1.0 / divisor
        self.attention_scale = 0.0
        self.use_rope = True


class MiniCPM3(LongRope, Deepseek2):
    name = "minicpm3"
    rope_mode = ROPE_NEOX
    experts = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.embedding_scale = 12.0
        self.residual_scale = 1.4 / math.sqrt(self.hp.n_layer)
        self.logit_scale = DIM_MODEL_BASE / self.hp.n_embd

    @property
    def embed_scale(self) -> float:
        return self.embedding_scale

    def attend(self, g: Graph, h, L: Layer, i: int):
        return latent_attention(g, self, h, L.attn, i, out="o", accumulate=False)

    build = Granite.build   # Granite's step: each branch scaled before it joins x
