"""IBM Granite (3.x dense): the Llama block with four scalar multipliers.

    x = embed(tokens) * embedding_scale
    for each layer:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)
        x += residual_scale * Wo softmax(attention_scale * q.k) V
        h = rmsnorm(x) ; x += residual_scale * Wdown (silu(Wgate h) * Wup h)
    logits = Wout rmsnorm(x) / logit_scale

What decides what, as llama.cpp reads a granite file:
- `granite.logit_scale` is required; `embedding_scale`, `residual_scale`
  and `attention.scale` are optional, and absent or 0 each means "none"
  (the softmax scale is then 1/sqrt(head_dim)).
- `granite.rope.scaling.finetuned` = false turns RoPE off in every layer
  (absent: on). RoPE rotates adjacent pairs, as Llama's.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFileError, UnsupportedModelError
from ..graph import Graph
from .base import Architecture, Ffn, Layer, Rope, sliding_layers
from .blocks import attention, ffn, output_head
from .llama import Llama


class Granite(Llama):
    name = "granite"

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.read_granite_scales(mf)

    def read_granite_scales(self, mf, logit_scale_required: bool = True) -> None:
        """The four multipliers (absent or 0: none) and the RoPE switch."""
        divisor = float(mf.arch_require("logit_scale") if logit_scale_required else mf.arch_get("logit_scale", 0.0) or 1.0)
        if divisor <= 0:
            raise ModelFileError(f"{mf.path}: granite.logit_scale = {divisor} is not positive; the file is corrupt")
        self.logit_scale = 1.0 / divisor
        self.residual_scale = float(mf.arch_get("residual_scale", 0.0)) or 1.0
        self.embedding_scale = float(mf.arch_get("embedding_scale", 0.0)) or 1.0
        self.attention_scale = float(mf.arch_get("attention.scale", 0.0))
        self.use_rope = bool(mf.arch_get("rope.scaling.finetuned", True))

    def sliding_window(self) -> int:
        return 0

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        return r if self.use_rope else r.off()

    @property
    def attn_scale(self) -> float:
        return self.hp.rope_attn_factor ** 2 * self.attention_scale if self.attention_scale else super().attn_scale

    @property
    def embed_scale(self) -> float:
        return self.embedding_scale

    def attend(self, g: Graph, h, L: Layer, i: int):
        """Layer i's attention of the rows of h, into a fresh buffer (scaled before it joins x)."""
        return attention(g, self, h, L.attn, i, out="o", accumulate=False)

    def build(self, g: Graph) -> None:
        hp = self.hp
        x = g.embed(self.tok_embd, "x", scale=self.embed_scale)
        for i, L in g.layers(self.layers, x):
            o = self.attend(g, g.rmsnorm(x, L.attn_norm, hp.eps, "h"), L, i)
            g.add(g.scale(o, self.residual_scale), x)
            o = ffn(g, g.rmsnorm(x, L.ffn_norm, hp.eps, "h"), L.ffn, self.glu, out="o", accumulate=False)
            g.add(g.scale(o, self.residual_scale), x)
        output_head(g, self, x)


class GraniteMoe(Granite):
    """Granite 3.x MoE (`granitemoe`): Granite's multipliers, and every FFN a
    mixture of experts (the router's softmax over the chosen ones, renormalized),
    plus an ungated shared expert where the file has one."""
    name = "granitemoe"
    experts = "required"


class GraniteSwa(Granite):
    """Granite with interleaved sliding-window attention (`granite_swa`, dense or with experts):
    Granite's multipliers, and
    - attention sinks in every layer (a logit per head that joins its softmax, as gpt-oss's);
    - the layers attention.sliding_window_pattern flags attend over attention.sliding_window
      tokens, the others over the whole context;
    - RoPE in the layers attention.rope_pattern flags (absent: every layer);
    - the FFN dense (biases where the file has them), or experts (the router's softmax over the
      chosen ones, renormalized; gate and up split or fused) plus, where
      expert_shared_feed_forward_length is set, a shared expert whose gate and up are one
      ffn_up_shexp of rows [gate | up].
    Granite 4 Vision's deepstack (projector streams added in later layers) is refused."""
    name = "granite_swa"
    experts = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        mf.arch_require("attention.sliding_window_pattern")
        self.window, self.is_swa = sliding_layers(mf, hp.n_layer, 0)
        self.rope_layers = self.layer_flags("attention.rope_pattern")
        mapping = mf.arch_get("deepstack_mapping", None)
        if mapping is not None and max((int(v) for v in mapping), default=-1) >= 0:
            raise UnsupportedModelError(f"{mf.path}: granite_swa with deepstack inputs (Granite 4 Vision) "
                                        f"is not supported yet")
        for i, L in enumerate(self.layers):
            L.attn.sinks = self.vector(f"blk.{i}.attn_sinks.weight", hp.n_head)

    def layer_flags(self, key: str) -> list[bool]:
        """The file's array of one flag per layer under `key` (absent: every layer True)."""
        n, flags = self.hp.n_layer, self.mf.arch_get(key, None)
        if flags is None:
            return [True] * n
        if not isinstance(flags, (list, np.ndarray)) or len(flags) != n:
            raise ModelFileError(f"{self.mf.path}: {self.mf.architecture}.{key} is not one flag for each "
                                 f"of the {n} layers; the file is corrupt")
        return [bool(f) for f in flags]

    def shared_expert(self, i: int):
        n, p = int(self.mf.arch_get("expert_shared_feed_forward_length", 0) or 0), f"blk.{i}."
        if n <= 0:
            return None
        return Ffn(w_up=self.weight(p + "ffn_up_shexp.weight", self.hp.n_embd, 2 * n),
                   w_down=self.weight(p + "ffn_down_shexp.weight", n, self.hp.n_embd))

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        return r if self.rope_layers[i] else r.off()


class GraniteHybrid(Granite):
    """Granite 4.0-H (`granitehybrid`): Granite's multipliers over a stack whose layers mix
    tokens by a Mamba 2 mixer (head_count_kv 0) or by attention (GQA; usually without RoPE:
    rope.scaling.finetuned false), every layer then its FFN: dense SwiGLU, or experts (the
    router's softmax over the chosen ones, renormalized) plus a shared expert where the
    file has one (expert_shared_feed_forward_length wide).

        h = rmsnorm(x) ; x += residual_scale * (mamba2(h) or attention(h))
        h = rmsnorm(x) ; x += residual_scale * ffn(h)
    """
    name = "granitehybrid"
    kv_per_layer = True
    experts = True

    def __init__(self, mf, n_ctx=None):
        Architecture.__init__(self, mf, n_ctx)
        hp = self.hp
        self.read_granite_scales(mf, logit_scale_required=False)
        self.read_ends()
        self.rope_freqs = self.optional_vector("rope_freqs.weight", hp.rope_dim // 2)
        kv_heads = hp.kv_heads or [hp.n_head_kv] * hp.n_layer
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            mixer = self.attention_weights(i) if kv_heads[i] else self.ssm_weights(i)
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd), attn=mixer,
                                     ffn_norm=self.vector(p + "ffn_norm.weight", hp.n_embd),
                                     ffn=self.moe_weights(i) or self.ffn_weights(i)))
