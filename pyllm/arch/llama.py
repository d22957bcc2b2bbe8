"""Llama (and the files that share its layout: SmolLM2, Llama 2/3, Mistral).

    x = embed(tokens)
    for each layer:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)
        x += Wo attention(q, K, V)
        h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)
    logits = Wout rmsnorm(x)

RoPE rotates adjacent pairs (llama.cpp's "normal" mode: the GGUF converter
permuted Wq and Wk to match).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..graph import GLU_SILU, ROPE_NORM, Graph
from ..model_file import Tensor
from .base import Architecture


@dataclass
class LlamaLayer:
    attn_norm: np.ndarray
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ffn_norm: np.ndarray
    w_gate: Tensor
    w_up: Tensor
    w_down: Tensor


class Llama(Architecture):
    name = "llama"
    rope_mode = ROPE_NORM

    def __init__(self, mf):
        super().__init__(mf)
        hp = self.hp
        q_dim, kv_dim = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        self.tok_embd = self.weight("token_embd.weight", hp.n_embd, hp.n_vocab)
        self.out_norm = self.vector("output_norm.weight", hp.n_embd)
        self.output = self.output_weight()
        self.rope_freqs: Optional[np.ndarray] = self.optional_vector("rope_freqs.weight", hp.rope_dim // 2)
        self.window = int(mf.arch_get("attention.sliding_window", 0) or 0)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            self.layers.append(LlamaLayer(
                attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd),
                wq=self.weight(p + "attn_q.weight", hp.n_embd, q_dim),
                wk=self.weight(p + "attn_k.weight", hp.n_embd, kv_dim),
                wv=self.weight(p + "attn_v.weight", hp.n_embd, kv_dim),
                wo=self.weight(p + "attn_output.weight", q_dim, hp.n_embd),
                ffn_norm=self.vector(p + "ffn_norm.weight", hp.n_embd),
                w_gate=self.weight(p + "ffn_gate.weight", hp.n_embd, hp.n_ff),
                w_up=self.weight(p + "ffn_up.weight", hp.n_embd, hp.n_ff),
                w_down=self.weight(p + "ffn_down.weight", hp.n_ff, hp.n_embd),
            ))

    def build(self, g: Graph) -> None:
        hp = self.hp
        x = g.embed(self.tok_embd, "x")
        for i, L in enumerate(self.layers):
            g.layer = i
            h = g.rmsnorm(x, L.attn_norm, hp.eps, "h")
            q, k, v = g.linear(h, L.wq, "q"), g.linear(h, L.wk, "k"), g.linear(h, L.wv, "v")
            g.rope(q, k, hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dim, self.rope_mode,
                   hp.rope_base, hp.rope_freq_scale, self.rope_freqs)
            a = g.attention(q, k, v, hp.n_head, hp.n_head_kv, hp.head_dim, self.attn_scale, "attn",
                            window=self.window)
            g.linear(a, L.wo, x, accumulate=True)
            h = g.rmsnorm(x, L.ffn_norm, hp.eps, "h")
            ffn = g.glu(g.linear(h, L.w_gate, "gate"), g.linear(h, L.w_up, "up"), GLU_SILU, "ffn")
            g.linear(ffn, L.w_down, x, accumulate=True)
        g.layer = -1
        g.head()
        g.linear(g.rmsnorm(x, self.out_norm, hp.eps, "out_norm"), self.output, "logits")
