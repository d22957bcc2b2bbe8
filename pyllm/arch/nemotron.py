"""Nemotron (`nemotron`: Minitron, Nemotron-Mini) and Arcee (`arcee`: AFM-4.5B):
pre-norm decoders whose FFN is ungated, Wdown relu(Wup h)^2.

Nemotron:
    h = layernorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)       # NEOX, partial
    x += Wo attention(q, K, V) (+ bo)
    h = layernorm(x) ; x += Wdown relu(Wup h (+ bup))^2 (+ bdown)
    logits = Wout layernorm(x)
with biases on every norm (the converter folds Nemotron's "1 +" into the weights).

Arcee is the Llama block with that FFN: RMSNorm, adjacent-pair RoPE.

Nemotron-H (`nemotron_h`: Nemotron-H 8B, Nemotron Nano 9B/12B v2) is a hybrid whose
layers each have one branch, x += mixer(rmsnorm(x)), the mixer one of
    a Mamba 2 mixer       head_count_kv and feed_forward_length 0 for the layer
    attention             feed_forward_length 0 (GQA, no RoPE)
    an FFN                Wdown relu(Wup h)^2
as llama.cpp tells them apart. `nemotron_h_moe` (Nemotron 3 Nano 30B-A3B) has experts
in place of the FFN: ungated relu^2 experts chosen by the router's sigmoids (+ exp_probs_b
to choose), renormalized and scaled as the file says, plus an ungated shared expert.
"""
from __future__ import annotations

from ..errors import UnsupportedModelError
from ..graph import GLU_RELU_SQR, MOE_SIGMOID, NORM_LAYER, NORM_RMS, ROPE_NEOX, ROPE_NORM, Graph
from .base import Architecture, Layer, Rope
from .blocks import PreNormDecoder, attention, embed, ffn, output_head


class Nemotron(PreNormDecoder):
    name = "nemotron"
    rope_mode = ROPE_NEOX
    glu = GLU_RELU_SQR
    norm = NORM_LAYER
    gated = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        layer_norm = self.norm == NORM_LAYER
        self.read_ends(norm_bias=layer_norm)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            (an, an_b), (fn, fn_b) = (self.norm_weights(p + "attn_norm", bias=layer_norm),
                                      self.norm_weights(p + "ffn_norm", bias=layer_norm))
            self.layers.append(Layer(attn_norm=an, attn_norm_b=an_b, attn=self.attention_weights(i),
                                     ffn_norm=fn, ffn_norm_b=fn_b, ffn=self.ffn_weights(i)))


class Arcee(Nemotron):
    name = "arcee"
    rope_mode = ROPE_NORM
    norm = NORM_RMS


class NemotronH(Architecture):
    name = "nemotron_h"
    glu = GLU_RELU_SQR
    gated = False
    kv_per_layer = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends()
        kv_heads = hp.kv_heads or [hp.n_head_kv] * hp.n_layer
        self.layers = []
        for i in range(hp.n_layer):
            norm = self.vector(f"blk.{i}.attn_norm.weight", hp.n_embd)
            if hp.layer_ff(i):
                self.layers.append(Layer(attn_norm=None, attn=None, ffn_norm=norm, ffn=self.ffn_of(i)))
            else:
                mixer = self.attention_weights(i) if kv_heads[i] else self.ssm_weights(i)
                self.layers.append(Layer(attn_norm=norm, attn=mixer, ffn_norm=None, ffn=None))

    def ffn_of(self, i: int):
        return self.ffn_weights(i)

    def layer_rope(self, i: int) -> Rope:
        return super().layer_rope(i).off()

    def build(self, g: Graph) -> None:
        x = embed(g, self)
        for i, L in g.layers(self.layers, x):
            if L.attn is not None:
                attention(g, self, g.rmsnorm(x, L.attn_norm, self.hp.eps, "h"), L.attn, i, out=x)
            else:
                ffn(g, g.rmsnorm(x, L.ffn_norm, self.hp.eps, "h"), L.ffn, self.glu, out=x)
        output_head(g, self, x)


class NemotronHMoe(NemotronH):
    name = "nemotron_h_moe"
    experts = "required"

    def ffn_of(self, i: int):
        mf = self.mf
        self.refuse_tensor(f"blk.{i}.ffn_latent_down.weight", "experts in a latent space (Nemotron 3 Super)")
        m = self.moe_weights(i)
        m.gating = MOE_SIGMOID
        m.norm = bool(mf.arch_get("expert_weights_norm", False))
        m.scale = float(mf.arch_get("expert_weights_scale", 0.0) or 1.0)
        return m

    def expert_width(self, k: int) -> int:
        return int(self.mf.arch_get("expert_feed_forward_length", 0) or 0) or self.hp.n_ff // k

    def shared_expert(self, i: int):
        n = int(self.mf.arch_get("expert_shared_feed_forward_length", 0) or 0)
        if n <= 0:
            raise UnsupportedModelError(f"{self.mf.path}: nemotron_h_moe without a shared expert width "
                                        f"(expert_shared_feed_forward_length) is not supported")
        return self.shared_ffn(i, n)
