"""Gemma 2: Gemma 3's block (pre- and post-norms, GELU, tied output) without
q/k norms, with tanh soft-capping of attention scores and of the logits.

    x = embed(tokens) * sqrt(n_embd)
    for each layer:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)       # NEOX
        s = cap_a * tanh(scale * q.k / cap_a)                         # cap_a = 50
        x += rmsnorm(Wo softmax(s) V)
        h = rmsnorm(x) ; x += rmsnorm(Wdown (gelu_tanh(Wgate h) * Wup h))
    logits = cap_f * tanh(Wout rmsnorm(x) / cap_f)                    # cap_f = 30

What decides what, as llama.cpp reads a gemma2 file:
- `gemma2.attn_logit_softcapping` and `gemma2.final_logit_softcapping`
  (absent: 50 and 30) are the caps.
- Even layers (0, 2, ...) attend over a sliding window of
  `gemma2.attention.sliding_window` tokens (absent: 4096); odd layers over
  the whole context.
- Every layer uses the file's RoPE (`rope.freq_base`, 10000 on the released
  models); a `rope.freq_base_swa` key, if present, gives the local layers'.
- Queries are scaled by 1/sqrt(head_dim) (256), except on the 27B (46
  layers): 1/sqrt(n_embd / n_head).
"""
from __future__ import annotations

from .base import Architecture, Rope
from .gemma3 import Gemma3

WINDOW = 4096             # llama.cpp's default when the file names none
ATTN_SOFTCAP = 50.0
FINAL_SOFTCAP = 30.0
N_LAYER_27B = 46


class Gemma2(Gemma3):
    name = "gemma2"
    qk_norm = False
    n_layer_27b = N_LAYER_27B

    def read_softcaps(self) -> None:
        self.attn_softcap = float(self.mf.arch_get("attn_logit_softcapping", ATTN_SOFTCAP))
        self.final_softcap = float(self.mf.arch_get("final_logit_softcapping", FINAL_SOFTCAP))

    def sliding_layers(self) -> tuple[int, list[bool]]:
        window = int(self.mf.arch_get("attention.sliding_window", WINDOW))
        return window, [window > 0 and i % 2 == 0 for i in range(self.hp.n_layer)]

    def layer_rope(self, i: int) -> Rope:
        rope = Architecture.layer_rope(self, i)
        if self.is_swa[i] and self.mf.arch_get("rope.freq_base_swa") is not None:
            return Rope(rope.mode, rope.n_rot, self.swa_rope_base, rope.scale)
        return rope
