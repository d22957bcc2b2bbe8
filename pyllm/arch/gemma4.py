"""Gemma 4 (text: E2B, E4B, 31B; 26B-A4B with experts): Gemma 3's block with layers of
two shapes, per-layer token inputs, KV caches shared by the last layers, and a scalar per layer.

    x = embed(tokens) * sqrt(n_embd)
    ple = (rmsnorm_per_layer(Wple x / sqrt(n_embd)) + embed_ple(tokens) * sqrt(n_pl)) / sqrt(2)
    for each layer i:
        h = rmsnorm(x) ; q = rmsnorm_per_head(Wq h) ; rope(q)            # NEOX
        own cache:  k = Wk h ; v = rmsnorm_per_head(Wv h, no weight)     # Wv absent: v from k
                    k = rmsnorm_per_head(k) ; rope(k) ; store k, v
        x += rmsnorm(Wo attention(q, K, V))      # scale 1: the q/k norms carry it
        h = rmsnorm(x) ; x += rmsnorm(Wdown (gelu_tanh(Wgate h) * Wup h))
        x += rmsnorm(Wproj (gelu_tanh(Wgate_pl x) * ple_i))                # with per-layer inputs
        x *= out_scale_i
    logits = cap * tanh(Wout rmsnorm(x) / cap)           # Wout tied to the embedding

With experts (26B-A4B) the FFN step is two branches on the same x, each with its norms:
        x += rmsnorm(rmsnorm_1(ffn(rmsnorm(x))) + rmsnorm_2(experts(rmsnorm_pre2(x))))
the router reading rmsnorm(x) * ffn_gate_inp.scale / sqrt(n_embd); the k best of a softmax,
renormalized, each expert's weight times its ffn_down_exps.scale; experts' gate and up
fused (ffn_gate_up_exps, rows [gate | up]) or not.

What decides what, as llama.cpp reads a gemma4 file:
- `attention.sliding_window_pattern` (one flag per layer) marks the local layers, which
  attend over `attention.sliding_window` tokens with heads of `attention.key_length_swa`,
  `rope.dimension_count_swa` rotated dims and RoPE base `rope.freq_base_swa`. The global
  layers have heads of `attention.key_length` and the file's RoPE base and scaling; their
  "proportional" partial rotation is `rope_freqs.weight`, 1 for the rotated pairs and
  1e30 (no rotation) for the rest. `attention.head_count_kv` may give each layer its count.
- The last `attention.shared_kv_layers` layers compute no keys or values: with
  n = block_count - shared_kv_layers, a local one reads layer n - 2's cache, a global one
  layer n - 1's (llama.cpp's rule, which assumes those two are local and global).
- `embedding_length_per_layer_input` > 0 (E2B, E4B) adds the per-layer inputs
  (per_layer_token_embd, per_layer_model_proj, per_layer_proj_norm; per layer inp_gate,
  proj, post_norm). `feed_forward_length` may be a list (wider FFNs in the shared layers).
- `layer_output_scale.weight`, where present, scales the whole residual after the layer.
- The norms' weights are used as stored (Gemma 4 has no 1 + w).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional
import numpy as np

from ..errors import ModelFileError, UnsupportedModelError
from ..graph import GLU_GELU_TANH, MOE_SOFTMAX, ROPE_NEOX, Graph, View
from ..model_file import Tensor
from ..units import fmt_layers
from .base import Attn, Layer, Moe, Rope, sliding_layers
from .blocks import PostNormDecoder, embed, ffn, output_head


@dataclass(frozen=True)
class Geometry:
    """One layer's attention shape: heads of head_dim, n_kv_head key/value heads, and the
    layer whose cache it attends over (itself, or an earlier one: a shared KV layer)."""
    head_dim: int
    n_kv_head: int
    kv_layer: int


@dataclass
class ExpertBranch:
    """The experts beside a layer's dense FFN (26B-A4B), each branch with its own norms:
    o = post_1(ffn(ffn_norm(x))) + post_2(experts(pre_2(x))), the router reading
    rmsnorm(x) * router_norm, router_norm = ffn_gate_inp.scale / sqrt(n_embd)."""
    moe: Moe
    pre_norm: np.ndarray          # pre_ffw_norm_2
    post_norm: np.ndarray         # post_ffw_norm_2
    dense_post_norm: np.ndarray   # post_ffw_norm_1
    router_norm: np.ndarray


@dataclass
class PerLayerInput:
    """A layer's use of its per-layer input: x += rmsnorm(proj (gelu_tanh(gate x) * ple_i))."""
    gate: Tensor
    proj: Tensor
    post_norm: np.ndarray


class Gemma4(PostNormDecoder):
    name = "gemma4"
    rope_mode = ROPE_NEOX
    glu = GLU_GELU_TANH
    kv_per_layer = "mixed"
    rope_scalings = ("none", "linear")
    experts = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends()
        self.final_softcap = float(mf.arch_get("final_logit_softcapping", 0.0) or 0.0)
        if not isinstance(mf.arch_get("attention.sliding_window_pattern"), (list, np.ndarray)):
            raise ModelFileError(f"{mf.path}: gemma4 needs attention.sliding_window_pattern, one flag per layer")
        self.window, self.is_swa = sliding_layers(mf, hp.n_layer, 0)
        self.swa_head_dim = int(mf.arch_require("attention.key_length_swa"))
        for key, full in (("value_length", hp.head_dim), ("value_length_swa", self.swa_head_dim)):
            if int(mf.arch_get("attention." + key, full)) != full:
                raise UnsupportedModelError(f"{mf.path}: gemma4 with value heads unlike its key heads ({key})")
        self.swa_rope_dim = int(mf.arch_get("rope.dimension_count_swa", self.swa_head_dim))
        self.swa_rope_base = float(mf.arch_get("rope.freq_base_swa", hp.rope_base))
        if not (0 < self.swa_head_dim <= 512 and 0 < self.swa_rope_dim <= self.swa_head_dim
                and self.swa_rope_dim % 2 == 0 and self.swa_rope_base > 0):
            raise ModelFileError(f"{mf.path}: local heads of {self.swa_head_dim} with {self.swa_rope_dim} rotated "
                                 f"dims and RoPE base {self.swa_rope_base}; the file is corrupt")
        self.rope_freqs = (self.vector("rope_freqs.weight", hp.rope_dim // 2)
                           if not all(self.is_swa) else None)

        self.read_geometry(int(mf.arch_get("attention.shared_kv_layers", 0) or 0))

        self.n_per_layer = n_pl = int(mf.arch_get("embedding_length_per_layer_input", 0) or 0)
        self.ple_embd = self.ple_proj = self.ple_proj_norm = None
        if n_pl > 0:
            self.ple_embd = self.weight("per_layer_token_embd.weight", n_pl * hp.n_layer, hp.n_vocab)
            self.ple_proj = self.weight("per_layer_model_proj.weight", hp.n_embd, n_pl * hp.n_layer)
            self.ple_proj_norm = self.vector("per_layer_proj_norm.weight", n_pl)
        self.layers = [self.layer(i) for i in range(hp.n_layer)]
        self.expert_branches = [self.expert_branch(i) for i in range(hp.n_layer)]
        self.per_layer_input = [self.per_layer_weights(i) if n_pl else None for i in range(hp.n_layer)]
        self.out_scale = [self.layer_scale(i) for i in range(hp.n_layer)]

    # -- tensors -----------------------------------------------------------------------
    def read_geometry(self, n_shared: int) -> None:
        """Every layer's Geometry, the last n_shared reading the caches of layers n - 2 (local)
        and n - 1 (global), n = block_count - n_shared; checked against the heads."""
        hp, mf = self.hp, self.mf
        self.n_own_kv = n_own = hp.n_layer - n_shared
        if not 0 <= n_shared < hp.n_layer or (n_shared and (n_own < 2 or not self.is_swa[n_own - 2]
                                                            or self.is_swa[n_own - 1])):
            raise ModelFileError(f"{mf.path}: {n_shared} shared KV layers of {hp.n_layer}: the two layers before "
                                 f"them must be a local and a global one")
        self.geometry = [self.layer_geometry(i) for i in range(hp.n_layer)]
        for i, geo in enumerate(self.geometry):
            if geo.n_kv_head <= 0 or hp.n_head % geo.n_kv_head:
                raise ModelFileError(f"{mf.path}: layer {i}: {hp.n_head} heads cannot share {geo.n_kv_head} "
                                     f"key/value heads")
            src = self.geometry[geo.kv_layer]
            if (src.head_dim, src.n_kv_head) != (geo.head_dim, geo.n_kv_head):   # it reads src's cache rows
                raise ModelFileError(f"{mf.path}: layer {i} shares layer {geo.kv_layer}'s cache but has "
                                     f"{geo.n_kv_head} key/value heads of {geo.head_dim}, not "
                                     f"{src.n_kv_head} of {src.head_dim}; the file is corrupt")

    def layer_geometry(self, i: int) -> Geometry:
        hp = self.hp
        kv_heads = hp.kv_heads[i] if hp.kv_heads else hp.n_head_kv
        source = i if i < self.n_own_kv else self.n_own_kv - (2 if self.is_swa[i] else 1)
        return Geometry(self.swa_head_dim if self.is_swa[i] else hp.head_dim, kv_heads, source)

    def layer(self, i: int) -> Layer:
        hp, p, geo = self.hp, f"blk.{i}.", self.geometry[i]
        q_dim, kv_dim, own = hp.n_head * geo.head_dim, geo.n_kv_head * geo.head_dim, geo.kv_layer == i
        attn = Attn(wo=self.weight(p + "attn_output.weight", q_dim, hp.n_embd),
                    wq=self.weight(p + "attn_q.weight", hp.n_embd, q_dim),
                    q_norm=self.vector(p + "attn_q_norm.weight", geo.head_dim))
        if own:   # without attn_v, the values come from Wk h (before the key norm)
            attn.wk = self.weight(p + "attn_k.weight", hp.n_embd, kv_dim)
            attn.wv = self.weight(p + "attn_v.weight", hp.n_embd, kv_dim) if self.mf.has_tensor(
                p + "attn_v.weight") else None
            attn.k_norm = self.vector(p + "attn_k_norm.weight", geo.head_dim)
        return self.post_norm_layer(i, attn)

    def expert_branch(self, i: int) -> Optional[ExpertBranch]:
        """Layer i's experts (where the file has ffn_gate_inp), fused [gate | up] or not."""
        mf, hp, p = self.mf, self.hp, f"blk.{i}."
        if not mf.has_tensor(p + "ffn_gate_inp.weight"):
            return None
        n_exp, k = int(mf.arch_get("expert_count", 0) or 0), int(mf.arch_get("expert_used_count", 0) or 0)
        n_ff = int(mf.arch_require("expert_feed_forward_length"))
        if not 0 < k <= n_exp or n_ff <= 0:
            raise ModelFileError(f"{mf.path}: {k} of {n_exp} experts of {n_ff}; the file is corrupt")
        gate, up, fused = self.gate_up_experts(i, n_ff, n_exp)
        moe = Moe(router=self.weight(p + "ffn_gate_inp.weight", hp.n_embd, n_exp), gate=gate, up=up,
                  down=self.expert_weights(p + "ffn_down_exps.weight", n_ff, hp.n_embd, n_exp),
                  k=k, gating=MOE_SOFTMAX, norm=True, gate_up=fused,
                  expert_scale=self.optional_vector(p + "ffn_down_exps.scale", n_exp))

        def norm_of(name: str) -> np.ndarray:
            return self.vector(p + name + ".weight", hp.n_embd)
        return ExpertBranch(moe, norm_of("pre_ffw_norm_2"), norm_of("post_ffw_norm_2"), norm_of("post_ffw_norm_1"),
                            self.vector(p + "ffn_gate_inp.scale", hp.n_embd) / np.float32(math.sqrt(hp.n_embd)))

    def per_layer_weights(self, i: int) -> PerLayerInput:
        hp, p, n_pl = self.hp, f"blk.{i}.", self.n_per_layer
        return PerLayerInput(gate=self.weight(p + "inp_gate.weight", hp.n_embd, n_pl),
                             proj=self.weight(p + "proj.weight", n_pl, hp.n_embd),
                             post_norm=self.vector(p + "post_norm.weight", hp.n_embd))

    def layer_scale(self, i: int) -> float:
        name = f"blk.{i}.layer_output_scale.weight"
        return float(self.vector(name, 1)[0]) if self.mf.has_tensor(name) else 1.0

    # -- per-layer settings ----------------------------------------------------------
    def layer_rope(self, i: int) -> Rope:
        hp = self.hp
        if self.is_swa[i]:
            return Rope(self.rope_mode, self.swa_rope_dim, self.swa_rope_base, 1.0)
        return Rope(self.rope_mode, hp.rope_dim, hp.rope_base, hp.rope_freq_scale, self.rope_freqs)

    @property
    def attn_scale(self) -> float:
        return self.hp.rope_attn_factor ** 2

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hp.n_embd)

    def block_notes(self) -> str:
        shapes: dict[tuple, list[int]] = {}
        for i, geo in enumerate(self.geometry):
            shapes.setdefault((geo.head_dim, geo.n_kv_head), []).append(i)
        notes = "; " + ", ".join(f"layers {fmt_layers(ls)}: heads of {hd} ({kvh} KV)" for (hd, kvh), ls in shapes.items())
        notes += self.shared_kv_note()
        if self.n_per_layer:
            notes += f"; per-layer inputs of {self.n_per_layer}"
        moe = [i for i, br in enumerate(self.expert_branches) if br is not None]
        if moe:
            m = self.expert_branches[moe[0]].moe
            notes += (f"; layers {fmt_layers(moe)}: {m.k} of {m.n_experts} experts beside the dense FFN, each "
                      f"gelu_tanh(gate) * up, weighted by their renormalized router softmax times a scale per expert")
        if any(s != 1.0 for s in self.out_scale):
            notes += "; each layer's output scaled"
        return notes

    def shared_kv_note(self) -> str:
        shared = [i for i, geo in enumerate(self.geometry) if geo.kv_layer != i]
        if not shared:
            return ""
        return (f"; layers {fmt_layers(shared)} attend over the keys and values of layers "
                f"{self.n_own_kv - 2} (local) and {self.n_own_kv - 1} (global)")

    # -- the forward step --------------------------------------------------------------
    def build(self, g: Graph) -> None:
        hp, eps = self.hp, self.hp.eps
        x = embed(g, self)
        ple = self.per_layer_inputs(g, x) if self.n_per_layer else None
        for i, L in g.layers(self.layers, x):
            o = self.attention(g, g.rmsnorm(x, L.attn_norm, eps, "h"), i)
            g.add(g.rmsnorm(o, L.post_attn_norm, eps, o), x)
            o = ffn(g, g.rmsnorm(x, L.ffn_norm, eps, "h"), L.ffn, self.glu, "o", accumulate=False,
                    names=f"ff{hp.layer_ff(i)}_")   # the shared KV layers' FFNs may be wider
            br = self.expert_branches[i]
            if br is not None:   # + the experts' branch
                g.rmsnorm(o, br.dense_post_norm, eps, o)
                logits = g.linear(g.rmsnorm(x, br.router_norm, eps, "h_router"), br.moe.router, "router")
                e = ffn(g, g.rmsnorm(x, br.pre_norm, eps, "h"), br.moe, self.glu, "o_moe", accumulate=False,
                        logits=logits)
                g.add(g.rmsnorm(e, br.post_norm, eps, e), o)
            g.add(g.rmsnorm(o, L.post_ffn_norm, eps, o), x)
            pl = self.per_layer_input[i]
            if pl is not None:
                n = self.n_per_layer
                t = g.glu(g.linear(x, pl.gate, "pl_gate"), ple.cols(i * n, n), GLU_GELU_TANH, "pl_gate")
                o = g.linear(t, pl.proj, "o")
                g.add(g.rmsnorm(o, pl.post_norm, eps, o), x)
            if self.out_scale[i] != 1.0:
                g.scale(x, self.out_scale[i])
        output_head(g, self, x)

    def per_layer_inputs(self, g: Graph, x: View) -> View:
        """Every layer's input of n_pl per token, side by side: (rmsnorm_per_layer(Wple x /
        sqrt(n_embd)) + embed_ple(tokens) * sqrt(n_pl)) / sqrt(2)."""
        hp, n = self.hp, self.n_per_layer
        ple = g.linear(x, self.ple_proj, "ple")
        g.scale(ple, 1.0 / math.sqrt(hp.n_embd))
        g.rmsnorm(ple, self.ple_proj_norm, hp.eps, ple, groups=hp.n_layer)
        g.add(g.embed(self.ple_embd, "ple_tok", scale=math.sqrt(n), media="pad"), ple)
        return g.scale(ple, 1.0 / math.sqrt(2.0))

    def attention(self, g: Graph, h: View, i: int) -> View:
        """Wo attention(q, K, V) of layer i, in buffers named by the layer's shape (the local and
        global layers' heads differ)."""
        hp, eps, geo, a = self.hp, self.hp.eps, self.geometry[i], self.layers[i].attn
        hd, kvh, tag = geo.head_dim, geo.n_kv_head, f"{geo.head_dim}x{geo.n_kv_head}"
        q = g.linear(h, a.wq, "q" + tag)
        g.rmsnorm(q, a.q_norm, eps, q, groups=hp.n_head)
        r = self.layer_rope(i)
        k = v = None
        if geo.kv_layer == i:
            k = g.linear(h, a.wk, "k" + tag)
            v = g.rmsnorm(k if a.wv is None else g.linear(h, a.wv, "v" + tag), np.ones(hd, np.float32), eps,
                          "v" + tag, groups=kvh)
            g.rmsnorm(k, a.k_norm, eps, k, groups=kvh)
        g.rope(q, k, hp.n_head, kvh, hd, r.n_rot, r.mode, r.base, r.scale, r.factors)
        att = g.attention(q, k, v, hp.n_head, kvh, hd, self.layer_attn_scale(i), "att" + tag,
                          window=self.layer_window(i), kv_from=-1 if geo.kv_layer == i else geo.kv_layer)
        return g.linear(att, a.wo, "o")
