"""ERNIE 4.5 (dense, `ernie4_5`): the Llama block as it is (RMSNorm, SiLU-gated
FFN, RoPE on adjacent pairs, optional q/k/v biases); llama.cpp reads no
sliding window for it."""
from __future__ import annotations

from ..graph import ROPE_NEOX
from .base import MRope
from .llama import Llama


class Ernie4_5(Llama):
    name = "ernie4_5"

    def sliding_window(self) -> int:
        return 0


class PaddleOCR(MRope, Ernie4_5):
    """PaddleOCR-VL's language model (`paddleocr`, ERNIE 4.5 0.3B): ERNIE 4.5's block with
    M-RoPE (Qwen 2 VL's: its sections one after another, the halves of each head turned), so an
    image's rows take their row and column as positions."""
    name = "paddleocr"
    rope_mode = ROPE_NEOX


class Ernie4_5Moe(Ernie4_5):
    """ERNIE 4.5 MoE (`ernie4_5-moe`: 21B-A3B, 300B-A47B): the dense model's block
    with experts in every `interleave_moe_layer_step`-th layer after the first
    `leading_dense_block_count` (dense FFNs elsewhere): the router's softmax
    weighs the chosen experts (renormalized), but `exp_probs_b` is added to it
    to choose them; a shared expert (expert_shared_feed_forward_length wide)
    joins every token's sum."""
    name = "ernie4_5-moe"
    experts = "required"

    def moe_layer(self, i: int) -> bool:
        mf = self.mf
        lead = int(mf.arch_get("leading_dense_block_count", 0) or 0)
        step = int(mf.arch_get("interleave_moe_layer_step", 1) or 1)
        return i >= lead and (i + 1) % step == 0

    def expert_width(self, k: int) -> int:
        return int(self.mf.arch_require("expert_feed_forward_length"))


