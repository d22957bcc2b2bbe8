"""Qwen 2 / Qwen 2.5: the Llama block with biases on q, k and v.

    h = rmsnorm(x) ; q, k, v = Wq h + bq, Wk h + bk, Wv h + bv ; rope(q, k)
    x += Wo attention(q, K, V)
    h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)

RoPE rotates the two halves of each head (NEOX mode: the converter keeps
Hugging Face's layout). The output matrix may be tied to the embedding
(0.5B, 1.5B). llama.cpp reads no sliding window for qwen2, nor do we.
"""
from __future__ import annotations

from ..errors import ModelFileError
from ..graph import ROPE_NEOX
from .base import MRope
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


class Qwen2VL(MRope, Qwen2):
    """Qwen 2 VL / Qwen 2.5 VL's language model (`qwen2vl`): Qwen 2 with M-RoPE (MRope), its
    sections one after another."""
    name = "qwen2vl"
