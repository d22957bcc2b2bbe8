"""Gemma 3 (text): pre- and post-norms, GELU, per-head q/k norms, and
interleaved local (sliding-window) and global attention layers.

    x = embed(tokens) * sqrt(n_embd)
    for each layer:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h
        q, k = rmsnorm_per_head(q), rmsnorm_per_head(k) ; rope(q, k)   # NEOX
        x += rmsnorm(Wo attention(q, K, V))
        h = rmsnorm(x) ; x += rmsnorm(Wdown (gelu_tanh(Wgate h) * Wup h))
    logits = Wout rmsnorm(x)              # Wout tied to the embedding

What decides what, as llama.cpp reads a gemma3 file:
- Gemma's norms compute x * (1 + w); the GGUF converter stored 1 + w, so
  the file's weights are used as they are.
- `gemma3.attention.sliding_window` (512 on the 270M) turns on the local
  layers. Which layers: `attention.sliding_window_pattern` (a period, or one
  flag per layer) else period 6: layer i is local unless i % 6 == 5, so
  every sixth layer, counting from 0, is global. No window key: every
  layer is global.
- Local layers use RoPE base `rope.freq_base_swa` (absent: 10000) and no
  frequency scaling; global layers use `rope.freq_base` (1e6) and the
  file's RoPE scaling (linear x8 on the 4B and larger).
- A local layer at position p attends over positions p - window + 1 .. p.
- Queries are scaled by 1/sqrt(head_dim) (256 on all sizes but the 27B,
  which uses 1/sqrt(n_embd / n_head)).
- `final_logit_softcapping`, where a file has it (the released models do
  not), caps the logits: c * tanh(logits / c). llama.cpp 0.3.36 does so with
  or without sliding windows; later llama.cpp caps only files without them.
"""
from __future__ import annotations

import math

from ..errors import ModelFileError
from ..graph import GLU_GELU_TANH, ROPE_NEOX
from .base import Rope, sliding_layers
from .blocks import PostNormDecoder

SWA_PERIOD = 6          # llama.cpp's default layer pattern for gemma3
SWA_ROPE_BASE = 10000.0
N_LAYER_27B = 62


class Gemma3(PostNormDecoder):
    name = "gemma3"
    rope_mode = ROPE_NEOX
    glu = GLU_GELU_TANH
    qk_norm = True
    n_layer_27b = N_LAYER_27B
    rope_scalings = ("none", "linear")   # layer_rope below builds its own Rope: no YaRN here

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_softcaps()
        self.read_ends()
        self.window, self.is_swa = self.sliding_layers()
        self.swa_rope_base = float(mf.arch_get("rope.freq_base_swa", SWA_ROPE_BASE))
        if self.swa_rope_base <= 0:
            raise ModelFileError(f"{mf.path}: rope.freq_base_swa = {self.swa_rope_base} is not positive")

        wide = hp.n_layer == self.n_layer_27b  # the 27B: n_embd / n_head, not head_dim
        self.query_scale = 1.0 / math.sqrt(hp.n_embd / hp.n_head if wide else hp.head_dim)
        self.layers = [self.post_norm_layer(i, self.attention_weights(i, qk_norm=self.qk_norm))
                       for i in range(hp.n_layer)]
        self.read_dense_out()

    def read_softcaps(self) -> None:
        self.final_softcap = float(self.mf.arch_get("final_logit_softcapping", 0.0) or 0.0)

    def sliding_layers(self) -> tuple[int, list[bool]]:
        """(window, which layers use it), from the window and pattern keys"""
        return sliding_layers(self.mf, self.hp.n_layer, SWA_PERIOD)

    # -- per-layer settings ----------------------------------------------------------
    def layer_rope(self, i: int) -> Rope:
        hp = self.hp
        if self.is_swa[i]:
            return Rope(self.rope_mode, hp.rope_dim, self.swa_rope_base, 1.0)
        return Rope(self.rope_mode, hp.rope_dim, hp.rope_base, hp.rope_freq_scale)

    @property
    def attn_scale(self) -> float:
        return self.hp.rope_attn_factor ** 2 * self.query_scale

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hp.n_embd)


class GemmaEmbedding(Gemma3):
    """EmbeddingGemma (`gemma-embedding`): Gemma 3's layers, every token attending both ways
    (a local layer over the window / 2 positions either side of its own), queries scaled by
    1/sqrt(head_dim) at every size; its embedding goes on through the dense projections
    (dense_2, dense_3) after the final norm. It embeds and does not generate."""
    name = "gemma-embedding"
    causal = False
    n_layer_27b = -1
