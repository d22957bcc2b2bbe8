"""BLOOM (`bloom`: BLOOM, BLOOMZ), MPT (`mpt`: MPT-7B/30B, Replit Code) and JAIS: LayerNorm decoders
with an ungated GELU FFN whose positions are ALiBi's linear biases, not rotations.

    x = embed(tokens)                   ; BLOOM: x = layernorm(x)
    for each layer:
        h = layernorm(x) ; [q | k | v] = Wqkv h (+ b)
        x += Wo attention(q, K, V) (+ bo)      # head h's score of position j from p: s - m_h |p - j|
        h = layernorm(x) ; x += Wdown gelu(Wup h (+ bup)) (+ bdown)
    logits = Wout layernorm(x)          # Wout tied to the embedding when absent

The slopes m_h are ALiBi's (graph.alibi_slopes) for a maximum bias of 8: BLOOM's always, as
llama.cpp; MPT's `attention.max_alibi_bias` (0: none, learned positions then, where the file
has position_embd). MPT's clip_qkv (attention.clamp_kqv), q/k LayerNorms and activation
scales are refused: no released file that llama.cpp converts uses them.
"""
from __future__ import annotations

from ..errors import UnsupportedModelError
from ..graph import GLU_GELU_TANH, GLU_SILU, NORM_LAYER
from .base import Layer
from .blocks import PreNormDecoder
from .starcoder2 import StarCoder2

ALIBI_MAX_BIAS = 8.0


class Bloom(StarCoder2):
    name = "bloom"
    qkv_biases = True
    alibi = ALIBI_MAX_BIAS
    rotary = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.input_norm = self.norm_weights("token_embd_norm")


class Mpt(PreNormDecoder):
    name = "mpt"
    glu = GLU_GELU_TANH
    norm = NORM_LAYER
    gated = False
    rotary = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        if float(mf.arch_get("attention.clamp_kqv", 0.0) or 0.0) > 0:
            raise UnsupportedModelError(f"{mf.path}: mpt with clip_qkv (mpt.attention.clamp_kqv) is not supported")
        self.refuse_tensor("blk.0.attn_q_norm.weight", "q/k LayerNorms (qk_ln)")
        self.refuse_tensor("blk.0.ffn_act.scales", "activation scales")
        self.alibi = float(mf.arch_get("attention.max_alibi_bias", 0.0) or 0.0)
        self.read_ends(norm_bias=mf.has_tensor("output_norm.bias"))
        if mf.has_tensor("position_embd.weight"):
            self.pos_embd = self.weight("position_embd.weight", hp.n_embd, hp.n_ctx_train)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            an, an_b = self.norm_weights(p + "attn_norm", bias=mf.has_tensor(p + "attn_norm.bias"))
            fn, fn_b = self.norm_weights(p + "ffn_norm", bias=mf.has_tensor(p + "ffn_norm.bias"))
            self.layers.append(Layer(attn_norm=an, attn_norm_b=an_b, attn=self.attention_weights(i),
                                     ffn_norm=fn, ffn_norm_b=fn_b, ffn=self.ffn_weights(i)))


class Jais(StarCoder2):
    """JAIS (`jais`: Core42's Arabic-English 13B/30B): BLOOM's biased LayerNorm layers with a
    SiLU-gated FFN (biases on all three matrices), ALiBi with the file's max_alibi_bias and a
    softmax scale of 1 / head_dim (muP's, not 1 / sqrt(head_dim)); the output untied."""
    name = "jais"
    glu = GLU_SILU
    gated = True
    qkv_biases = True
    tied_output = False
    rotary = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.alibi = float(mf.arch_get("attention.max_alibi_bias", 0.0) or 0.0)

    @property
    def attn_scale(self) -> float:
        return 1.0 / self.hp.head_dim
