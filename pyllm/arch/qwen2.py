"""Qwen 2 / Qwen 2.5: the Llama block with biases on q, k and v.

    h = rmsnorm(x) ; q, k, v = Wq h + bq, Wk h + bk, Wv h + bv ; rope(q, k)
    x += Wo attention(q, K, V)
    h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)

RoPE rotates the two halves of each head (NEOX mode: the converter keeps
Hugging Face's layout). The output matrix may be tied to the embedding
(0.5B, 1.5B). llama.cpp reads no sliding window for qwen2, nor do we.
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import ModelFileError
from ..graph import ROPE_NEOX
from .base import Rope
from .llama import Llama


class Qwen2(Llama):
    name = "qwen2"
    rope_mode = ROPE_NEOX
    qkv_bias = True

    def sliding_window(self) -> int:
        return 0


class Qwen2Moe(Qwen2):
    """Qwen 1.5 / Qwen 2 MoE (`qwen2moe`): Qwen 2's attention; every FFN is a
    mixture of experts (the chosen softmax weights used as they are) plus a
    shared expert weighted by sigmoid(w . h), w = ffn_gate_inp_shexp.

    As llama.cpp reads it: experts are expert_feed_forward_length wide (absent:
    n_ff / expert_used_count), the shared expert
    expert_shared_feed_forward_length (absent: n_ff)."""
    name = "qwen2moe"
    experts = "required"
    moe_norm = False

    def expert_width(self, k: int) -> int:
        return int(self.mf.arch_get("expert_feed_forward_length", 0)) or self.hp.n_ff // k

    def moe_weights(self, i: int):
        m = super().moe_weights(i)
        p = f"blk.{i}."
        if m.shared is None:
            raise ModelFileError(f"{self.mf.path}: qwen2moe layer {i} lacks its shared expert ({p}ffn_up_shexp.weight)")
        m.shared_gate = self.shared_expert_gate(i)
        return m


class Qwen2VL(Qwen2):
    """Qwen 2 VL / Qwen 2.5 VL's language model (`qwen2vl`): M-RoPE gives each section of a
    head's pairs its own position (time, height, width). A text token has the same one in
    all three, so its rotation is NEOX RoPE's; an image's rows take (start, start + row,
    start + column) (the engine's rope positions, Engine.mrope)."""
    name = "qwen2vl"

    def layer_rope(self, i: int) -> Rope:
        return replace(super().layer_rope(i), sections=self.rope_sections)

    @property
    def rope_sections(self) -> tuple:
        """The pairs of each head turned by the time, height and width positions (the file's
        rope.dimension_sections; a 4th section, unused by the language model, is ignored)."""
        got = self.mf.arch_get("rope.dimension_sections", None)
        try:
            sections = tuple(int(v) for v in got)[:3]
        except (TypeError, ValueError):
            sections = ()
        if len(sections) != 3 or min(sections) < 0 or sum(sections) > self.hp.rope_dim // 2:
            raise ModelFileError(f"{self.mf.path}: rope.dimension_sections is {got!r}, not three sections within "
                                 f"{self.hp.rope_dim // 2} pairs; the file is corrupt")
        return sections
