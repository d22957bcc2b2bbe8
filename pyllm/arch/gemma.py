"""Gemma (1.0 / 1.1, CodeGemma: `gemma`): the Llama block with Gemma's choices.

    x = embed(tokens) * sqrt(n_embd)
    for each layer:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)       # NEOX
        x += Wo softmax(q.k / sqrt(head_dim)) V
        h = rmsnorm(x) ; x += Wdown (gelu_tanh(Wgate h) * Wup h)
    logits = Wembed rmsnorm(x)

What decides what, as llama.cpp reads a gemma file:
- Gemma's norms compute x * (1 + w); the converter stored 1 + w.
- The logits always come from the token embedding (an output.weight, if a
  file has one, is not read). head_dim (256 on the 7B) need not be
  n_embd / n_head. No sliding window, no soft-caps, no experts.
"""
from __future__ import annotations

import math

from ..graph import GLU_GELU_TANH, ROPE_NEOX
from ..model_file import Tensor
from .llama import Llama


class Gemma(Llama):
    name = "gemma"
    rope_mode = ROPE_NEOX
    glu = GLU_GELU_TANH

    def sliding_window(self) -> int:
        return 0

    def output_weight(self) -> Tensor:
        return self.weight("token_embd.weight", self.hp.n_embd, self.hp.n_vocab)

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hp.n_embd)
