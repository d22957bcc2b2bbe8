"""gpt-oss (`gpt-oss`, OpenAI's open-weight MoE models, 20B and 120B).

    h = rmsnorm(x) ; q, k, v = Wq h + bq, Wk h + bk, Wv h + bv ; rope(q, k)
    x += Wo attention_with_sinks(q, K, V) + bo
    h = rmsnorm(x)                                   (the file's post_attention_norm)
    x += sum_e p_e (Wdown_e swiglu_oai(Wgate_e h + bg_e, Wup_e h + bu_e) + bd_e)

- Attention sinks: each head has a learned logit (`attn_sinks`) that joins its
  softmax as one more score with no value, so a head can attend to "nothing".
- Even layers attend over a sliding window (`attention.sliding_window`, 128),
  odd layers over the whole context (llama.cpp's swa pattern of 2).
- NEOX RoPE, YaRN-scaled in the released files (factor 32 over 4096 tokens).
- Experts: the router (with a bias) picks `expert_used_count` of
  `expert_count`, weighted by the softmax of the chosen logits (the same as
  the renormalized softmax over all); every expert matrix has a bias;
  swiglu_oai(g, u) = min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1).
  The released files store the experts in MXFP4.
"""
from __future__ import annotations

from ..graph import GLU_SWIGLU_OAI, ROPE_NEOX
from .base import Layer
from .blocks import PreNormDecoder

SWA_PERIOD = 2   # layers i with i % 2 == 0 use the window


class GptOss(PreNormDecoder):
    name = "gpt-oss"
    rope_mode = ROPE_NEOX
    glu = GLU_SWIGLU_OAI
    experts = "required"

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends()
        self.window = int(mf.arch_get("attention.sliding_window", 0) or 0)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            attn = self.attention_weights(i, biases=True)
            attn.sinks = self.vector(p + "attn_sinks.weight", hp.n_head)
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd), attn=attn,
                                     ffn_norm=self.vector(p + "post_attention_norm.weight", hp.n_embd),
                                     ffn=self.moe_weights(i)))

    def expert_width(self, k: int) -> int:
        return int(self.mf.arch_require("expert_feed_forward_length"))

    def layer_window(self, i: int) -> int:
        return self.window if i % SWA_PERIOD == 0 else 0
