"""StarCoder 2: a pre-norm decoder with LayerNorm, biases and an ungated
GELU FFN.

    x = embed(tokens)
    for each layer:
        h = layernorm(x) ; q, k, v = Wq h + bq, Wk h + bk, Wv h + bv ; rope(q, k)   # NEOX
        x += Wo attention(q, K, V) + bo
        h = layernorm(x) ; x += Wdown gelu_tanh(Wup h + bup) + bdown
    logits = Wout layernorm(x)            # Wout tied to the embedding when absent

As llama.cpp reads a starcoder2 file: `starcoder2.attention.layer_norm_epsilon`,
norm biases and the output and FFN biases required, q/k/v biases as the file has them.
"""
from __future__ import annotations

from ..graph import GLU_GELU_TANH, GLU_RELU_SQR, NORM_LAYER, ROPE_NEOX
from .base import Layer
from .blocks import PreNormDecoder


class StarCoder2(PreNormDecoder):
    name = "starcoder2"
    rope_mode = ROPE_NEOX
    glu = GLU_GELU_TANH
    norm = NORM_LAYER
    gated = False
    qkv_biases = False     # required (GPT-NeoX), else as the file has them
    tied_output = True     # the logits may reuse the embedding

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.read_ends(norm_bias=True, tied=self.tied_output)
        parallel = self.parallel_residual()
        self.layers = [self.biased_layer(i, parallel) for i in range(self.hp.n_layer)]

    def parallel_residual(self) -> bool:
        return False

    def biased_layer(self, i: int, parallel: bool) -> Layer:
        """Layer i with LayerNorms (weight and bias) before attention and FFN and
        biases on the attention output and both FFN matrices."""
        hp, p = self.hp, f"blk.{i}."
        attn, ffn = self.attention_weights(i, biases=self.qkv_biases), self.ffn_weights(i)
        attn.bo = self.vector(p + "attn_output.bias", hp.n_embd)
        ffn.b_up, ffn.b_down = self.vector(p + "ffn_up.bias", hp.n_ff), self.vector(p + "ffn_down.bias", hp.n_embd)
        (an, an_b), (fn, fn_b) = self.norm_weights(p + "attn_norm"), self.norm_weights(p + "ffn_norm")
        return Layer(attn_norm=an, attn_norm_b=an_b, attn=attn, ffn_norm=fn, ffn_norm_b=fn_b, ffn=ffn,
                     parallel=parallel)


class CodeShell(StarCoder2):
    """CodeShell (`codeshell`: WisdomShell's CodeShell-7B): StarCoder 2's block (LayerNorms with
    biases, NEOX RoPE, an ungated GELU FFN with biases) with a fused attn_qkv and its bias,
    grouped key/value heads."""
    name = "codeshell"


class Jais2(StarCoder2):
    """JAIS 2 (`jais2`: Inception's Jais-2): StarCoder 2's block (LayerNorms with biases, NEOX RoPE,
    biases on the output and both FFN matrices) with an ungated squared-ReLU FFN."""
    name = "jais2"
    glu = GLU_RELU_SQR
