"""BERT sentence encoders (`bert`: all-MiniLM, bge, e5, GTE ...) and Nomic's
(`nomic-bert`: nomic-embed-text; `nomic-bert-moe`: v2-moe, with experts): every token attends over every other, LayerNorm
after each residual sum, and the output is the last layer's rows, pooled into
one embedding per text (Model.embed), not logits.

    x = layernorm(embed(tokens) + token_types[0] + embed_position(positions))   # positions: bert only
    for each layer:
        q, k, v = Wq x + bq, Wk x + bk, Wv x + bv    # or one fused Wqkv; nomic-bert: rope(q, k) NEOX
        x = layernorm(x + Wo attention(q, K, V) + bo)         # bidirectional, scale 1/sqrt(head_dim)
        x = layernorm(x + Wdown gelu(Wup x + bup) + bdown)    # nomic-bert: Wdown (silu(Wgate x) * Wup x)
    embeddings = x (every row; Model.embed pools them as {arch}.pooling_type says)

As llama.cpp runs them: every token's type is 0 ("sentence A"), GELU is the
tanh form, the biases llama.cpp takes as optional are optional here too.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from ..errors import ModelFileError, UnsupportedModelError
from ..graph import GLU_GELU_TANH, GLU_SILU, NORM_LAYER, ROPE_NEOX, Graph, View
from .base import Architecture, Layer, Rope
from .blocks import PreNormDecoder, attention, embed, ffn


class Bert(Architecture):
    name = "bert"
    norm = NORM_LAYER
    causal = False
    norm_after_residual = True
    gated = False
    glu = GLU_GELU_TANH
    learned_positions = True   # position_embd (bert); nomic-bert rotates q and k instead

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        n_types = int(mf.get("tokenizer.ggml.token_type_count", 1) or 1)
        self.tok_embd = self.weight("token_embd.weight", hp.n_embd, hp.n_vocab)
        if self.learned_positions:
            self.pos_embd = self.weight("position_embd.weight", hp.n_embd, hp.n_ctx_train)
        self.type_row = None   # token type 0's embedding, added to every token
        if mf.has_tensor("token_types.weight"):
            t = mf.tensor("token_types.weight")
            if len(t.shape) != 2 or t.shape[0] != hp.n_embd or t.shape[1] < 1:
                raise ModelFileError(f"{mf.path}: token_types.weight has shape {list(t.shape)}; "
                                     f"the file is corrupt")
            self.type_row = self.floats("token_types.weight", hp.n_embd, t.shape[1])[0]
        elif n_types > 1:
            raise ModelFileError(f"{mf.path}: {n_types} token types but no token_types.weight; the file is corrupt")
        self.embd_norm, self.embd_norm_b = self.norm_weights("token_embd_norm")
        self.out_norm = None   # the last layer's norm is the output
        self.layers = [self.encoder_layer(i) for i in range(hp.n_layer)]
        self.rank_head = self.read_rank_head()   # a cross-encoder's (bge-reranker): rank pooling scores with it

    def encoder_layer(self, i: int) -> Layer:
        """Layer i: attention then attn_output_norm, FFN then layer_output_norm (both LayerNorms
        of the residual sum)."""
        p = f"blk.{i}."
        (an, an_b), (fn, fn_b) = self.norm_weights(p + "attn_output_norm"), self.norm_weights(p + "layer_output_norm")
        return Layer(attn=self.attention_weights(i), attn_norm=an, attn_norm_b=an_b, ffn=self.ffn_weights(i),
                     ffn_norm=fn, ffn_norm_b=fn_b)

    def layer_rope(self, i: int) -> Rope:
        return super().layer_rope(i).off() if self.learned_positions else super().layer_rope(i)

    def build(self, g: Graph) -> None:
        hp = self.hp
        x = embed(g, self)
        if self.type_row is not None:
            g.add_row(self.type_row, x)
        g.layernorm(x, self.embd_norm, self.embd_norm_b, hp.eps, x)
        for i, L in enumerate(self.layers):
            g.layer = i
            attention(g, self, x, L.attn, i, out=x)
            g.layernorm(x, L.attn_norm, L.attn_norm_b, hp.eps, x)
            ffn(g, x, L.ffn, self.glu, out=x)
            g.layernorm(x, L.ffn_norm, L.ffn_norm_b, hp.eps, x)
        encoder_output(g, x)


class NomicBert(Bert):
    """Nomic's BERT (`nomic-bert`): RoPE (NEOX) for positions, a fused Wqkv, a SwiGLU FFN."""
    name = "nomic-bert"
    rope_mode = ROPE_NEOX
    gated = True
    glu = GLU_SILU
    learned_positions = False


class JinaBertV2(Bert):
    """Jina's BERT v2 (`jina-bert-v2`: jina-embeddings-v2 small/base, en/de/es/zh/code): BERT's
    layers with ALiBi's symmetric position biases (maximum 8, as llama.cpp) in place of
    learned positions, and a GEGLU FFN: one ffn_up of [gate | up] (2 n_ff rows), gelu(gate) * up,
    or separate ffn_gate and ffn_up. Its q/k LayerNorms and second attention norm (some
    variants) are refused."""
    name = "jina-bert-v2"
    gated = True
    fused_ffn = True
    learned_positions = False
    alibi = 8.0

    def __init__(self, mf, n_ctx=None):
        self.mf = mf
        self.refuse_tensor("blk.0.attn_q_norm.weight", "q/k LayerNorms")
        self.refuse_tensor("blk.0.attn_norm_2.weight", "a second attention norm")
        super().__init__(mf, n_ctx)

    def layer_rope(self, i: int) -> Rope:
        return super().layer_rope(i).off()


class NomicBertMoe(NomicBert):
    """Nomic's BERT with experts (`nomic-bert-moe`: nomic-embed-text-v2-moe): nomic-bert's
    attention, BERT's ungated GELU FFN with biases, and in every layer i with
    i % moe_every_n_layers == 1 a mixture of ungated GELU experts in its place, as llama.cpp
    runs it: the router's softmax over all experts, the chosen ones' values not renormalized."""
    name = "nomic-bert-moe"
    gated = False
    glu = GLU_GELU_TANH
    experts = True
    moe_norm = False

    def encoder_layer(self, i: int) -> Layer:
        layer = super().encoder_layer(i)
        m = self.moe_weights(i)
        if m is not None:
            m.scale = float(self.mf.arch_get("expert_weights_scale", 0.0) or 1.0)
            layer.ffn = m
        return layer

    def ffn_weights(self, i: int):
        return None if self.moe_layer(i) else super().ffn_weights(i)

    def moe_layer(self, i: int) -> bool:
        every = int(self.mf.arch_get("moe_every_n_layers", 0) or 0)
        return every > 0 and i % every == 1


class ModernBert(PreNormDecoder):
    """ModernBERT (`modern-bert`: ModernBERT, gte-modernbert, nomic-modernbert-embed, Granite
    Embedding R2): a pre-norm encoder, every token attending both ways.

        x = layernorm(embed(tokens))
        for each layer:
            x += Wo attention(rope(q), rope(k), v), [q | k | v] = Wqkv layernorm(x)   # layer 0: no norm
            x += Wdown (act(g) * u), [g | u] = Wup layernorm(x)
        embeddings = layernorm(x)

    LayerNorms without biases, no biases anywhere, NEOX RoPE; every layer i with
    i % sliding_window_pattern != 0 (default 3) attends over the window / 2 positions either
    side of its own with RoPE base rope.freq_base_swa, the others over the whole text.
    act: GELU (GEGLU), or SiLU where hidden_activation says so (Granite Embedding R2).
    Mean pooling where the file does not say."""
    name = "modern-bert"
    rope_mode = ROPE_NEOX
    norm = NORM_LAYER
    causal = False
    fused_ffn = True
    ACTIVATIONS = {"gelu": GLU_GELU_TANH, "geglu": GLU_GELU_TANH, "silu": GLU_SILU, "swish": GLU_SILU,
                   "swiglu": GLU_SILU}

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        act = str(mf.arch_get("hidden_activation", "gelu"))
        if act not in self.ACTIVATIONS:
            raise UnsupportedModelError(f"{mf.path}: modern-bert with hidden_activation {act!r} is not supported "
                                        f"(supported: {', '.join(self.ACTIVATIONS)})")
        self.glu = self.ACTIVATIONS[act]
        self.refuse_tensor("cls.norm.weight", "a classification head")
        self.tok_embd = self.weight("token_embd.weight", hp.n_embd, hp.n_vocab)
        self.input_norm = (self.vector("token_embd_norm.weight", hp.n_embd), None)
        self.out_norm = self.vector("output_norm.weight", hp.n_embd)
        self.window = int(mf.arch_get("attention.sliding_window", 0) or 0)
        pattern = mf.arch_get("attention.sliding_window_pattern", 3)
        if isinstance(pattern, (list, np.ndarray)):
            if len(pattern) != hp.n_layer:
                raise ModelFileError(f"{mf.path}: sliding_window_pattern has {len(pattern)} flags for "
                                     f"{hp.n_layer} layers")
            self.is_swa = [bool(f) and self.window > 0 for f in pattern]
        else:   # llama.cpp's for this family: the first layer of every n global
            n = int(pattern)
            self.is_swa = [self.window > 0 and (n == 0 or i % n != 0) for i in range(hp.n_layer)]
        self.swa_rope_base = float(mf.arch_get("rope.freq_base_swa", hp.rope_base))
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            attn_norm = self.vector(p + "attn_norm.weight", hp.n_embd) if i or mf.has_tensor(p + "attn_norm.weight") else None
            self.layers.append(Layer(attn_norm=attn_norm, attn=self.attention_weights(i),
                                     ffn_norm=self.vector(p + "ffn_norm.weight", hp.n_embd), ffn=self.ffn_weights(i)))

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        return replace(r, base=self.swa_rope_base) if self.is_swa[i] else r

    def pooling(self) -> Optional[str]:
        return super().pooling() if self.mf.arch_get("pooling_type", None) is not None else "mean"


def encoder_output(g: Graph, x: View) -> View:
    """The output head of an encoder: its rows as they are (a copy the engine reads)."""
    g.layer = -1
    g.head()
    return g.copy(x, g.buffer("embd", x.width), x.width, 1, 0, 0)
