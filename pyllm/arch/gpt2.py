"""GPT-2 (`gpt2`) and StarCoder (`starcoder`: StarCoderBase, SantaCoder's
successors, tiny_starcoder): LayerNorm decoders with learned absolute
position embeddings and no RoPE.

    x = embed(tokens) + embed_position(positions)
    for each layer:
        h = layernorm(x) ; [q | k | v] = Wqkv h + b
        x += Wo attention(q, K, V) + bo
        h = layernorm(x) ; x += Wdown gelu(Wup h + bup) + bdown
    logits = Wout layernorm(x)        # Wout tied to the embedding when absent

StarCoder is the same with one key/value head (multi-query). The position
table (`position_embd`, one row per position up to context_length) bounds
the context: a longer one is refused.
"""
from __future__ import annotations

from .base import Rope
from .starcoder2 import StarCoder2


class Gpt2(StarCoder2):
    """StarCoder 2's biased LayerNorm layers, with position embeddings for RoPE."""
    name = "gpt2"
    qkv_biases = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.pos_embd = self.weight("position_embd.weight", self.hp.n_embd, self.hp.n_ctx_train)

    def layer_rope(self, i: int) -> Rope:
        return super().layer_rope(i).off()   # positions come from pos_embd


class StarCoder(Gpt2):
    name = "starcoder"
