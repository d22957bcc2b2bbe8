"""Apertus (`apertus`: the Swiss AI 8B and 70B): Llama 3's block with per-head q/k norms and an
ungated FFN whose activation, xIELU, has its own parameters in every layer.

    h = rmsnorm(x) ; q, k = rmsnorm_per_head(Wq h), rmsnorm_per_head(Wk h) ; v = Wv h
    rope(q, k)                                      # NEOX, with rope_freqs as Llama 3.1
    x += Wo attention(q, K, V)
    h = rmsnorm(x) ; x += Wdown xielu_i(Wup h)
    xielu(u) = a_p u^2 + beta u  (u > 0),  (expm1(min(u, eps)) - u) a_n + beta u  (u <= 0)
    a_p = softplus(alpha_p),  a_n = beta + softplus(alpha_n)

As llama.cpp reads the file: alpha_n, alpha_p, beta and eps are the keys xielu.alpha_n ...
xielu.eps (without the architecture's prefix), one value per layer or one for all, the
checkpoint's raw parameters (ggml_xielu applies the softplus); output.weight is required.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFileError
from ..graph import GLU_XIELU, ROPE_NEOX
from .base import Layer
from .blocks import PreNormDecoder

XIELU_KEYS = ("xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps")


class Apertus(PreNormDecoder):
    name = "apertus"
    rope_mode = ROPE_NEOX
    glu = GLU_XIELU
    gated = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends(tied=False)
        self.rope_freqs = self.optional_vector("rope_freqs.weight", hp.rope_dim // 2)
        alpha_n, alpha_p, beta, eps = (self.per_layer(key) for key in XIELU_KEYS)
        params = np.stack([beta + softplus(alpha_n), softplus(alpha_p), beta, eps], axis=1)   # [n_layer, 4]
        self.layers = []
        for i in range(hp.n_layer):
            ffn = self.ffn_weights(i)
            ffn.act_params = np.ascontiguousarray(params[i])
            self.layers.append(Layer(attn_norm=self.vector(f"blk.{i}.attn_norm.weight", hp.n_embd),
                                     attn=self.attention_weights(i, qk_norm=True),
                                     ffn_norm=self.vector(f"blk.{i}.ffn_norm.weight", hp.n_embd), ffn=ffn))

    def per_layer(self, key: str) -> np.ndarray:
        """A xIELU parameter for every layer: the key's list, or its one value repeated."""
        mf, n = self.mf, self.hp.n_layer
        value = mf.get(key)
        if value is None:
            raise ModelFileError(f"{mf.path}: apertus needs the key {key}; the file is incomplete")
        values = np.asarray(value, np.float32).reshape(-1)
        if values.size == 1:
            values = np.repeat(values, n)
        if values.size != n or not np.isfinite(values).all():
            raise ModelFileError(f"{mf.path}: {key} has {values.size} values for {n} layers, or one not finite")
        return values


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x) in float32, as ggml_xielu folds it into the parameters."""
    return np.log1p(np.exp(x.astype(np.float32))).astype(np.float32)
