"""Pieces of the forward step that families share, written once.

Each function appends the ops of one part of a transformer block to the
graph, reading the weights a family loaded with Architecture.attention_weights
/ ffn_weights and the per-layer settings from layer_rope / layer_window.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..graph import GLU_MUL, GLU_SIGMOID, GLU_SILU, MOE_NORM, MOE_SIGMOID, NORM_LAYER, Graph, View
from .base import Architecture, Attn, DeltaNet, Ffn, Layer, Moe, ShortConv, Ssm, Ssm1


def norm(g: Graph, arch: Architecture, x: View, w: np.ndarray, b: Optional[np.ndarray], out: str | View) -> View:
    """The family's norm of the rows of x: RMSNorm, or LayerNorm (with bias b); none (x
    itself) where the layer has no weight (ModernBERT's first layer)."""
    if w is None:
        return x
    if arch.norm == NORM_LAYER:
        return g.layernorm(x, w, b, arch.hp.eps, out)
    return g.rmsnorm(x, w, arch.hp.eps, out)


def project_qkv(g: Graph, h: View, a: Attn, arch: Architecture) -> tuple[View, View, View]:
    """q, k, v of the rows of h: three matmuls, or one fused matmul whose
    output columns are [q | k | v]."""
    hp = arch.hp
    if a.wqkv is not None:
        n_q, n_kv = a.heads(hp)
        q_dim, kv_dim = n_q * hp.head_dim, n_kv * hp.head_dim
        qkv = g.linear(h, a.wqkv, "qkv", bias=a.bqkv)
        return qkv.cols(0, q_dim), qkv.cols(q_dim, kv_dim), qkv.cols(q_dim + kv_dim, kv_dim)
    return (g.linear(h, a.wq, "q", bias=a.bq), g.linear(h, a.wk, "k", bias=a.bk),
            g.linear(h, a.wv, "v", bias=a.bv))


def short_conv(g: Graph, h: View, s: ShortConv, out: str | View, accumulate: bool = True) -> View:
    """out (+)= out_proj (c * conv(b * x)), [b | c | x] = in_proj h (LFM2)."""
    n = s.conv.shape[0]
    bcx = g.linear(h, s.in_proj, "bcx")
    b, c, x = bcx.cols(0, n), bcx.cols(n, n), bcx.cols(2 * n, n)
    conv = g.ssm_conv(g.glu(b, x, GLU_MUL, "bx"), s.conv, None, "conv")
    return g.linear(g.glu(c, conv, GLU_MUL, conv), s.out_proj, out, accumulate=accumulate)


def ssm_mixer(g: Graph, h: View, s: Ssm, eps: float, out: str | View, accumulate: bool = True) -> View:
    """out (+)= out_proj norm(scan(silu(conv(xBC))) * silu(z)), [z | xBC | dt] = in_proj h: Mamba 2."""
    d_inner = s.heads * s.head_dim
    channels = s.conv.shape[0]
    zxbcdt = g.linear(h, s.in_proj, "zxbcdt")
    z, xbc, dt = zxbcdt.cols(0, d_inner), zxbcdt.cols(d_inner, channels), zxbcdt.cols(d_inner + channels, s.heads)
    conv = g.act(g.ssm_conv(xbc, s.conv, s.conv_bias, "ssm_xbc"), GLU_SILU, "ssm_xbc")
    y = g.ssm_scan(conv, dt, s.a, s.d, s.dt_bias, s.heads, s.head_dim, s.groups, s.d_state, "ssm_y")
    y = g.glu(z, y, GLU_SILU, y)
    if s.norm is not None:
        g.rmsnorm(y, s.norm, eps, y, groups=s.groups)
    return g.linear(y, s.out_proj, out, accumulate=accumulate)


def mamba1_mixer(g: Graph, h: View, s: Ssm1, eps: float, out: str | View, accumulate: bool = True) -> View:
    """out (+)= out_proj (scan(x, dt, B, C) * silu(z)), [x | z] = in_proj h, x = silu(conv(x)),
    [dt | B | C] = x_proj x, dt = dt_proj dt: Mamba 1 (Ssm1), every channel a head of one value."""
    n, N, R = s.d_inner, s.d_state, s.dt_rank
    xz = g.linear(h, s.in_proj, "xz")
    xbc = g.buffer("ssm_xbc", n + 2 * N)         # [x | B | C], as the scan reads a row
    x = g.ssm_conv(xz.cols(0, n), s.conv, s.conv_bias, xbc.cols(0, n))
    g.act(x, GLU_SILU, x)
    dbc = g.linear(x, s.x_proj, "ssm_dbc")        # [dt | B | C]
    if s.norms is not None:   # each part RMS-normed (Jamba; Falcon Mamba: weights of ones)
        for (start, width), w in zip(((0, R), (R, N), (R + N, N)), s.norms):
            g.rmsnorm(dbc.cols(start, width), w, eps, dbc.cols(start, width))
    g.copy(dbc.cols(R, 2 * N), xbc.cols(n, 2 * N), 2 * N, 1, 0, 0)
    dt = g.linear(dbc.cols(0, R), s.dt_proj, "ssm_dt")
    y = g.ssm_scan(xbc, dt, s.a, s.d, s.dt_bias, n, 1, 1, N, "ssm_y")
    y = g.glu(xz.cols(n, n), y, GLU_SILU, y)
    return g.linear(y, s.out_proj, out, accumulate=accumulate)


def delta_net_mixer(g: Graph, h: View, d: DeltaNet, eps: float, out: str | View, accumulate: bool = True) -> View:
    """out (+)= out_proj (rmsnorm_per_head(delta(q, k, v)) * silu(Wz h)), [q | k | v] =
    silu(conv(Wqkv h)): the gated delta rule (Qwen3.5, Qwen3-Next: the fused projections'
    per-key-head parts gathered by COPY)."""
    Hk, r, dk, dv = d.kv_heads, d.heads // d.kv_heads, d.head_dim, d.head_dim_v
    if d.w_qkvz is None:
        qkv, z = g.linear(h, d.wqkv, "dn_qkv"), g.linear(h, d.wz, "dn_z")
    else:   # per key head [q | k | v (r heads) | z (r heads)]
        step = 2 * dk + 2 * r * dv
        qkvz = g.linear(h, d.w_qkvz, "dn_qkvz")
        qkv = g.buffer("dn_qkv", 2 * Hk * dk + d.heads * dv)
        for offset, col, n in ((0, 0, dk), (dk, Hk * dk, dk), (2 * dk, 2 * Hk * dk, r * dv)):
            g.copy(qkvz.cols(offset, qkvz.width - offset), qkv.cols(col, qkv.width - col), n, Hk, step, n)
        z = g.copy(qkvz.cols(2 * dk + r * dv, qkvz.width - 2 * dk - r * dv), g.buffer("dn_z", d.heads * dv),
                   r * dv, Hk, step, r * dv)
    qkv = g.act(g.ssm_conv(qkv, d.conv, None, "dn_conv"), GLU_SILU, "dn_conv")
    ab = g.buffer("dn_ab", 2 * d.heads)
    if d.w_ba is None:
        g.linear(h, d.w_alpha, ab.cols(0, d.heads))
        g.linear(h, d.w_beta, ab.cols(d.heads, d.heads))
    else:   # per key head [b (r) | a (r)]
        ba = g.linear(h, d.w_ba, "dn_ba")
        g.copy(ba.cols(r, ba.width - r), ab.cols(0, d.heads), r, Hk, 2 * r, r)
        g.copy(ba, ab.cols(d.heads, d.heads), r, Hk, 2 * r, r)
    y = g.delta_net(qkv, ab, d.a, d.dt_bias, d.heads, Hk, dk, dv, eps, "dn_y", grouped=d.grouped_kv)
    g.rmsnorm(y, d.norm, eps, y, groups=d.heads)
    g.glu(z, y, GLU_SILU, y)
    return g.linear(y, d.out_proj, out, accumulate=accumulate)


def gated_q(g: Graph, h: View, a: Attn, arch: Architecture) -> tuple[View, View]:
    """(q, gate) from one wq whose rows are [q_h | gate_h] per head (Qwen3.5), each gathered
    into rows of its own."""
    hp = arch.hp
    hd, n = hp.head_dim, hp.n_head
    qg = g.linear(h, a.wq, "qg", bias=a.bq)
    q = g.copy(qg, g.buffer("q", hp.q_dim), hd, n, 2 * hd, hd)
    return q, g.copy(qg.cols(hd, qg.width - hd), g.buffer("attn_gate", hp.q_dim), hd, n, 2 * hd, hd)


def attention(g: Graph, arch: Architecture, h: View, a: Attn | ShortConv | Ssm | Ssm1 | DeltaNet, layer: int,
              out: str | View, accumulate: bool = True) -> View:
    """out (+)= Wo attention(rope(norm(Wq h)), rope(norm(Wk h)), Wv h) for layer `layer`:
    q/k norms per head when the layer has them, the layer's RoPE and window (or the
    layer's short convolution or Mamba 2 mixer, where it has one in place of attention)."""
    if isinstance(a, ShortConv):
        return short_conv(g, h, a, out, accumulate)
    if isinstance(a, Ssm):
        return ssm_mixer(g, h, a, arch.hp.eps, out, accumulate)
    if isinstance(a, Ssm1):
        return mamba1_mixer(g, h, a, arch.hp.eps, out, accumulate)
    if isinstance(a, DeltaNet):
        return delta_net_mixer(g, h, a, arch.hp.eps, out, accumulate)
    hp = arch.hp
    n_q, n_kv = a.heads(hp)
    gate = None
    if a.q_gated:
        q, gate = gated_q(g, h, a, arch)
        k, v = g.linear(h, a.wk, "k", bias=a.bk), g.linear(h, a.wv, "v", bias=a.bv)
    else:
        q, k, v = project_qkv(g, h, a, arch)

    def qk_norms() -> None:   # per head, or over the whole of q and of k (OLMo 2)
        g.rmsnorm(q, a.q_norm, hp.eps, q, groups=q.width // len(a.q_norm))
        g.rmsnorm(k, a.k_norm, hp.eps, k, groups=k.width // len(a.k_norm))
    if a.q_norm is not None and not arch.qk_norm_after_rope:
        qk_norms()
    r = arch.layer_rope(layer)
    if r.n_rot:  # NoPE layers rotate nothing
        g.rope(q, k, n_q, n_kv, hp.head_dim, r.n_rot, r.mode, r.base, r.scale, r.factors, r.sections,
               r.interleaved)
    if a.q_norm is not None and arch.qk_norm_after_rope:   # Hunyuan
        qk_norms()
    temperature = arch.layer_attn_temperature(layer)
    if temperature is not None:   # (s, period, offset): q scaled by position (Mistral 3, Llama 4)
        g.pos_scale(q, *temperature)
    att = g.attention(q, k, v, n_q, n_kv, hp.head_dim, arch.layer_attn_scale(layer), "attn",
                      window=arch.layer_window(layer), softcap=arch.attn_softcap, sinks=a.sinks, alibi=arch.alibi,
                      chunked=arch.chunked_window, causal=arch.causal)
    if a.gate is not None:   # gated attention: each output element times sigmoid(Wgate h)
        gate = g.linear(h, a.gate, "attn_gate")
    if gate is not None:
        g.glu(gate, att, GLU_SIGMOID, att)
    return g.linear(att, a.wo, out, bias=a.bo, accumulate=accumulate)


def moe_ffn(g: Graph, h: View, m: Moe, kind: int, out: str | View, accumulate: bool = True,
            logits: Optional[View] = None) -> View:
    """out (+)= sum over the k experts e the router picks of w_e Wdown_e (act(Wgate_e h) * Wup_e h)
    (ungated: Wdown_e act(Wup_e h); with weight_input, one expert's Wdown_e (act(Wgate_e w_e h) * Wup_e w_e h)), plus the shared
    expert's FFN, times sigmoid(Wg h) where it is gated (biases where given). logits: the
    router's, made earlier from another input (router_on_input)."""
    if logits is None:
        logits = g.linear(h, m.router, "router", bias=m.b_router)
    route = g.moe_route(logits, m.k, m.gating | (MOE_NORM if m.norm else 0), "route", scale=m.scale,
                        select_bias=m.b_select, groups=m.groups, expert_scale=m.expert_scale)
    x = g.moe_sum(h, route, 1, "moe_in") if m.weight_input else h   # w_e h (Llama 4: k = 1)
    up = g.linear_id(x, m.up, route, m.k, "up_e", bias=m.b_up)
    if m.gate_up:   # each slot's rows [gate | up]: gathered into gates and ups of their own
        n = m.up.shape[1] // 2
        gate = g.copy(up, g.buffer("gate_e", m.k * n), n, m.k, 2 * n, n)
        act = g.glu(gate, g.copy(up.cols(n, up.width - n), g.buffer("up_e2", m.k * n), n, m.k, 2 * n, n), kind, gate)
    elif m.gate is None:   # ungated experts: act(Wup_e x)
        act = g.act(up, kind, up)
    else:
        gate = g.linear_id(x, m.gate, route, m.k, "gate_e", bias=m.b_gate)
        act = g.glu(gate, up, kind, gate)
    down = g.linear_id(act, m.down, route, m.k, "down_e", slot_input=True, bias=m.b_down)
    if m.weight_input:
        y = g.add(down, out) if accumulate else down
    else:
        y = g.moe_sum(down, route, m.k, out, accumulate=accumulate)
    if m.shared is not None:   # + (sigmoid(Wg h) *) the shared expert's FFN
        s = ffn(g, h, m.shared, kind, "shexp", accumulate=False, names="shared_")
        if m.shared_gate is None:
            return g.add(s, y)
        weight = g.moe_route(g.linear(h, m.shared_gate, "shexp_gate"), 1, MOE_SIGMOID, "shexp_route")
        g.moe_sum(s, weight, 1, y, accumulate=True)
    return y


def ffn(g: Graph, h: View, f: Ffn | Moe, kind: int, out: str | View, accumulate: bool = True,
        names: str = "", logits: Optional[View] = None) -> View:
    """out (+)= Wdown (act(Wgate h) * Wup h); a fused up matrix gives [gate | up];
    ungated: out (+)= Wdown act(Wup h); a mixture of experts: moe_ffn. names: a prefix
    for its buffers (a shared expert's are not as wide as the dense layers' FFN)."""
    if isinstance(f, Moe):
        return moe_ffn(g, h, f, kind, out, accumulate, logits)
    if not f.gated:
        up = g.linear(h, f.w_up, names + "up", bias=f.b_up)
        return g.linear(g.act(up, kind, up, params=f.act_params), f.w_down, out, bias=f.b_down, accumulate=accumulate)
    if f.w_gate is not None:
        gate = g.linear(h, f.w_gate, names + "gate", bias=f.b_gate)
        up = g.linear(h, f.w_up, names + "up", bias=f.b_up)
    else:
        gate_up = g.linear(h, f.w_up, names + "gate_up", bias=f.b_up)
        n = gate_up.width // 2
        gate, up = gate_up.cols(0, n), gate_up.cols(n, n)
    return g.linear(g.glu(gate, up, kind, names + "ffn"), f.w_down, out, bias=f.b_down, accumulate=accumulate)


def pre_norm_block(g: Graph, arch: Architecture, L: Layer, layer: int, x: View) -> None:
    """x += attn(norm(x)); x += ffn(norm(x)); parallel: h = norm(x), x += attn(h) + ffn(h),
    or with two norms x += attn(norm1(x)) + ffn(norm2(x))."""
    logits = None
    if isinstance(L.ffn, Moe) and L.ffn.router_on_input:   # routed by the layer's input (SmallThinker)
        logits = g.linear(x, L.ffn.router, "router", bias=L.ffn.b_router)
    h = norm(g, arch, x, L.attn_norm, L.attn_norm_b, "h")
    h_ffn = h
    if L.parallel and L.ffn_norm is not None:   # before the attention adds to x
        h_ffn = norm(g, arch, x, L.ffn_norm, L.ffn_norm_b, "h_ffn")
    attention(g, arch, h, L.attn, layer, out=x)
    if not L.parallel:
        h_ffn = norm(g, arch, x, L.ffn_norm, L.ffn_norm_b, "h")
    ffn(g, h_ffn, L.ffn, arch.glu, out=x, logits=logits)


def post_norm_block(g: Graph, arch: Architecture, L: Layer, layer: int, x: View) -> None:
    """x += rmsnorm(attn(h)), h = rmsnorm(x) or, without input norms (OLMo 2), x;
    then the same for the FFN (Gemma 2/3, OLMo 2, EXAONE 4)."""
    eps = arch.hp.eps
    h = x if L.attn_norm is None else g.rmsnorm(x, L.attn_norm, eps, "h")
    o = attention(g, arch, h, L.attn, layer, out="o", accumulate=False)
    g.add(g.rmsnorm(o, L.post_attn_norm, eps, o), x)
    h = x if L.ffn_norm is None else g.rmsnorm(x, L.ffn_norm, eps, "h")
    o = ffn(g, h, L.ffn, arch.glu, out="o", accumulate=False)
    g.add(g.rmsnorm(o, L.post_ffn_norm, eps, o), x)


def embed(g: Graph, arch: Architecture) -> View:
    """x = the tokens' embeddings (times the family's scale), plus the positions' where
    the family learned them (GPT-2), LayerNormed where the family says (BLOOM)."""
    x = g.embed(arch.tok_embd, "x", scale=arch.embed_scale)
    if arch.pos_embd is not None:
        g.embed(arch.pos_embd, x, by_pos=True)
    if arch.input_norm is not None:
        g.layernorm(x, *arch.input_norm, arch.hp.eps, x)
    return x


class PreNormDecoder(Architecture):
    """A family whose every layer is a pre_norm_block (Phi-2, StarCoder 2, StableLM, Command R)."""

    def build(self, g: Graph) -> None:
        x = embed(g, self)
        for i, L in g.layers(self.layers, x):
            pre_norm_block(g, self, L, i, x)
        output_head(g, self, x)


class PostNormDecoder(Architecture):
    """A family whose every layer is a post_norm_block (Gemma 2/3, OLMo 2, EXAONE 4, GLM-4)."""

    def post_norm_layer(self, i: int, attn: Attn, input_norms: bool = True, ffn: Optional[Ffn | Moe] = None) -> Layer:
        """Layer i: post_attention_norm and post_ffw_norm after the branches, and with
        input_norms attn_norm and ffn_norm before them (OLMo 2, EXAONE 4: none); its FFN
        `ffn`, else the dense one."""
        hp, p = self.hp, f"blk.{i}."

        def norm_of(name: str, present: bool = True) -> Optional[np.ndarray]:
            return self.vector(p + name + ".weight", hp.n_embd) if present else None
        return Layer(attn_norm=norm_of("attn_norm", input_norms), attn=attn,
                     post_attn_norm=norm_of("post_attention_norm"), ffn_norm=norm_of("ffn_norm", input_norms),
                     ffn=ffn or self.ffn_weights(i), post_ffn_norm=norm_of("post_ffw_norm"))

    def build(self, g: Graph) -> None:
        x = embed(g, self)
        for i, L in g.layers(self.layers, x):
            post_norm_block(g, self, L, i, x)
        output_head(g, self, x)


def output_head(g: Graph, arch: Architecture, x: View) -> View:
    """logits = Wout norm(x) (+ bias), on the rows whose logits are wanted (scaled
    and soft-capped where the family says); a graph built for embeddings ends at
    norm(x) (through the file's dense projections), the rows Model.embed pools."""
    g.layer = -1
    g.head()
    h = norm(g, arch, x, arch.out_norm, arch.out_norm_b, "out_norm")
    if g.embeddings or not arch.causal:   # an encoder's output is always its embedding rows
        for i, (w, b) in enumerate(arch.dense_out):   # sentence-transformers' projections (EmbeddingGemma)
            h = g.linear(h, w, f"dense_{i + 2}", bias=b)
        return h
    logits = g.linear(h, arch.output, "logits", bias=arch.out_bias)
    if arch.final_softcap > 0 or arch.logit_scale != 1.0:
        g.scale(logits, arch.logit_scale, softcap=arch.final_softcap)
    return logits
