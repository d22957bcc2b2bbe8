"""RWKV 6 (`rwkv6`: RWKV-6 "Finch" World 1.6B..14B), QRWKV 6 (`rwkv6qwen2`: Recursal's QRWKV6,
Qwen 2.5 converted to RWKV time mixing), RWKV 7 (`rwkv7`: RWKV-7 "Goose" World 0.1B..2.9B, G1) and
ARWKV 7 (`arwkv7`: Qwen 2.5 distilled into RWKV 7 time mixing): recurrent models whose layers carry
a fixed-size state from token to token instead of a KV cache.

    x = embed(tokens)                      ; RWKV 6: x = layernorm(x)
    for each layer:
        h = norm(x) ; x += time_mix(h, h_prev)      # TimeMix in base.py: WKV linear attention
        h = norm(x) ; x += channel_mix(h, h_prev)   # RWKV 6 (ChannelMix); QRWKV: a SwiGLU FFN
        RWKV 6: x /= 2 every rescale_every_n_layers layers
    logits = Wout norm(x)

h_prev is the previous token's h in the same place (the token shift: graph.token_shift, a state
of one row per shift); norm is a LayerNorm with biases (RWKV 6, 7) or an RMSNorm (QRWKV, ARWKV). The
time mix's WKV state is heads x head_size x head_size per layer (csrc/pyllm.h, OP_WKV). RWKV 7's
time mix (TimeMix7) also carries the first layer's values to every later layer (v_first), and its
channel mix has no receptance gate.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFileError, UnsupportedModelError
from ..graph import (GLU_MUL, GLU_RELU_SQR, GLU_SIGMOID, GLU_SILU, GLU_TANH, NORM_LAYER, NORM_RMS, WKV_6, WKV_7,
                     WKV_GLA, Graph, View)
from .base import Architecture, ChannelMix, HParams, Layer, TimeMix, TimeMix7
from .blocks import embed, ffn, norm, output_head

GROUP_NORM_EPS = 64e-5   # RWKV's per-head LayerNorm of the WKV output, as llama.cpp
L2_EPS = 1e-24           # RWKV 7's kk / |kk|: ggml's l2_norm floor of 1e-12 on |kk|, squared


def rwkv_hparams(mf, eps_key: str) -> HParams:
    """The hyperparameters of an RWKV file: heads = embedding_length / wkv.head_size (its head_count
    is 0, as the converter writes it), head_count_kv where it gives one (QRWKV's grouped k and v)."""
    tokens = mf.get("tokenizer.ggml.tokens")
    n_embd, head_size = int(mf.arch_require("embedding_length")), int(mf.arch_require("wkv.head_size"))
    if n_embd <= 0 or head_size <= 0 or n_embd % head_size:
        raise ModelFileError(f"{mf.path}: embedding_length {n_embd} is not a whole number of heads of "
                             f"wkv.head_size {head_size}; the file is corrupt")
    heads = n_embd // head_size
    kv_heads = int(mf.arch_get("attention.head_count_kv", 0) or 0) or heads
    if heads % kv_heads:
        raise ModelFileError(f"{mf.path}: {heads} heads cannot share {kv_heads} key/value heads")
    hp = HParams(n_vocab=len(tokens) if tokens is not None else int(mf.arch_require("vocab_size")),
                 n_embd=n_embd, n_layer=int(mf.arch_require("block_count")), n_head=heads, n_head_kv=kv_heads,
                 head_dim=head_size, n_ff=int(mf.arch_require("feed_forward_length")),
                 eps=float(mf.arch_require(eps_key)), n_ctx_train=int(mf.arch_get("context_length", 1 << 20)),
                 rope_base=10000.0, rope_dim=0, rope_freq_scale=1.0)
    for name in ("n_layer", "n_vocab", "n_ff"):
        if getattr(hp, name) <= 0:
            raise ModelFileError(f"{mf.path}: hyperparameter {name} = {getattr(hp, name)} is not positive")
    return hp


class Rwkv6(Architecture):
    name = "rwkv6"
    norm = NORM_LAYER
    rotary = False
    eps_key = "attention.layer_norm_epsilon"
    rescales = True   # x /= 2 every rescale_every_n_layers layers, where the file says (RWKV 6's files)
    channel_gate = True   # the channel mix's receptance gate (RWKV 6; not RWKV 7)

    def __init__(self, mf, n_ctx=None):
        self.mf, self.n_ctx = mf, n_ctx
        self.hp = self.read_hparams(mf)
        self.rope_freqs, self.window = None, 0
        self.rescale_every = int(mf.arch_get("rescale_every_n_layers", 0) or 0) if self.rescales else 0
        self.read_ends_and_input_norm()
        self.layers = [self.read_layer(i) for i in range(self.hp.n_layer)]

    def read_hparams(self, mf) -> HParams:
        shifts = int(mf.arch_get("token_shift_count", 2) or 2)
        if shifts != 2:
            raise UnsupportedModelError(f"{mf.path}: {self.name} with token_shift_count {shifts} (llama.cpp runs 2)")
        return rwkv_hparams(mf, self.eps_key)

    def read_ends_and_input_norm(self) -> None:
        self.read_ends(norm_bias=True)
        self.input_norm = self.norm_weights("token_embd_norm")

    def read_layer(self, i: int) -> Layer:
        """Layer i: LayerNorms before its time mix and its channel mix (with the receptance gate
        where the family has one)."""
        p, n, gate = f"blk.{i}.", self.hp.n_embd, self.channel_gate
        an, an_b = self.norm_weights(p + "attn_norm")
        fn, fn_b = self.norm_weights(p + "attn_norm_2")
        return Layer(attn_norm=an, attn_norm_b=an_b, attn=self.time_mix(i), ffn_norm=fn, ffn_norm_b=fn_b,
                     ffn=ChannelMix(lerp_k=self.vector(p + "channel_mix_lerp_k.weight", n),
                                    lerp_r=self.vector(p + "channel_mix_lerp_r.weight", n) if gate else None,
                                    key=self.weight(p + "channel_mix_key.weight", n, self.hp.n_ff),
                                    receptance=self.weight(p + "channel_mix_receptance.weight", n, n) if gate else None,
                                    value=self.weight(p + "channel_mix_value.weight", self.hp.n_ff, n)))

    def time_mix(self, i: int) -> TimeMix:
        """Layer i's time mix: the five lerps fused in one tensor or apart (older files)."""
        mf, hp, p = self.mf, self.hp, f"blk.{i}."
        n, heads, hs = hp.n_embd, hp.n_head, hp.head_dim
        kv = hp.n_head_kv * hs
        extra, decay_extra = (int(mf.arch_require(k)) for k in ("time_mix_extra_dim", "time_decay_extra_dim"))
        if mf.has_tensor(p + "time_mix_lerp_fused.weight"):
            lerps = self.floats(p + "time_mix_lerp_fused.weight", n, 1, 1, 5).reshape(5, n)
        else:
            lerps = np.stack([self.vector(p + f"time_mix_lerp_{c}.weight", n) for c in "wkvrg"])
        first = self.floats(p + "time_mix_first.weight", hs, heads).reshape(n) \
            if mf.has_tensor(p + "time_mix_first.weight") else None
        ln = self.norm_weights(p + "time_mix_ln") if mf.has_tensor(p + "time_mix_ln.weight") else None
        if (first is None) != (ln is None):
            raise UnsupportedModelError(f"{mf.path}: {self.name} layer {i} has "
                                        f"{'time_mix_ln without time_mix_first' if first is None else 'time_mix_first without time_mix_ln'}")
        return TimeMix(lerp_x=self.vector(p + "time_mix_lerp_x.weight", n), lerps=lerps,
                       w1=self.weight(p + "time_mix_w1.weight", n, 5 * extra),
                       w2=self.expert_weights(p + "time_mix_w2.weight", extra, n, 5),
                       decay=self.vector(p + "time_mix_decay.weight", n),
                       decay_w1=self.weight(p + "time_mix_decay_w1.weight", n, decay_extra),
                       decay_w2=self.weight(p + "time_mix_decay_w2.weight", decay_extra, n),
                       wr=self.weight(p + "time_mix_receptance.weight", n, n),
                       wk=self.weight(p + "time_mix_key.weight", n, kv), wv=self.weight(p + "time_mix_value.weight", n, kv),
                       wg=self.weight(p + "time_mix_gate.weight", n, n), wo=self.weight(p + "time_mix_output.weight", n, n),
                       first=first, ln=ln, heads=heads, head_size=hs, kv_heads=hp.n_head_kv,
                       biases=(self.optional_vector(p + "time_mix_receptance.bias", n),
                               self.optional_vector(p + "time_mix_key.bias", kv),
                               self.optional_vector(p + "time_mix_value.bias", kv)))

    @property
    def attn_scale(self) -> float:
        return 0.0   # no softmax attention

    def block_notes(self) -> str:
        T = self.layers[0].attn
        return (f"; RWKV time mix in place of attention, {T.heads} heads of {T.head_size} (a {T.head_size}x{T.head_size} state each"
                + (f", keys and values of {T.kv_heads} heads" if T.kv_heads != T.heads else "")
                + ("; gated linear attention" if T.first is None else "") + ")")

    def build(self, g: Graph) -> None:
        x = embed(g, self)
        for i, L in g.layers(self.layers, x):
            time_mix(g, norm(g, self, x, L.attn_norm, L.attn_norm_b, "h"), L.attn, out=x)
            self.layer_ffn(g, norm(g, self, x, L.ffn_norm, L.ffn_norm_b, "h"), L, x)
            if self.rescale_every and (i + 1) % self.rescale_every == 0:
                g.scale(x, 0.5)
        output_head(g, self, x)

    def layer_ffn(self, g: Graph, h: View, L: Layer, x: View) -> None:
        channel_mix(g, h, L.ffn, out=x)


class QwenStack:
    """What the RWKV time mixes grafted onto Qwen 2.5 (QRWKV 6, ARWKV 7) keep of Qwen's: RMSNorms,
    no embedding norm, one token shift (the time mix's), a SwiGLU FFN after each time mix."""
    norm = NORM_RMS
    eps_key = "attention.layer_norm_rms_epsilon"

    def read_hparams(self, mf) -> HParams:
        return rwkv_hparams(mf, self.eps_key)

    def read_ends_and_input_norm(self) -> None:
        self.refuse_tensor("output_norm.bias", "a bias of its RMS output norm")
        self.read_ends(tied=False)

    def read_layer(self, i: int) -> Layer:
        p = f"blk.{i}."
        return Layer(attn_norm=self.vector(p + "attn_norm.weight", self.hp.n_embd), attn=self.time_mix(i),
                     ffn_norm=self.vector(p + "ffn_norm.weight", self.hp.n_embd), ffn=self.ffn_weights(i))

    def layer_ffn(self, g: Graph, h: View, L: Layer, x: View) -> None:
        ffn(g, h, L.ffn, self.glu, out=x)


class Rwkv6Qwen2(QwenStack, Rwkv6):
    """QRWKV 6: a gated linear attention (no time_first, no output norm) in Qwen's stack."""
    name = "rwkv6qwen2"

    def read_layer(self, i: int) -> Layer:
        L = super().read_layer(i)
        if L.attn.first is not None:
            raise UnsupportedModelError(f"{self.mf.path}: rwkv6qwen2 with time_mix_first (llama.cpp reads no "
                                        f"time_mix_ln for it)")
        return L


class Rwkv7(Rwkv6):
    """RWKV 7: RWKV 6's layout (LayerNorms, the embeddings' too) with TimeMix7 and a channel mix
    without its receptance gate, no rescaling."""
    name = "rwkv7"
    rescales = False
    channel_gate = False

    def time_mix(self, i: int) -> TimeMix7:
        """Layer i's RWKV 7 time mix; the gate and the output norm where the file has them (ARWKV 7
        may have neither); layer 0's value-residual LoRA, which llama.cpp loads and never runs, not read."""
        mf, hp, p = self.mf, self.hp, f"blk.{i}."
        n = hp.n_embd
        ranks = {k: int(mf.arch_get(f"attention.{k}_lora_rank", 0) or 0)
                 for k in ("decay", "iclr", "value_residual_mix", "gate")}
        for k in ("decay", "iclr", "value_residual_mix"):
            if ranks[k] <= 0:
                raise ModelFileError(f"{mf.path}: {self.name}.attention.{k}_lora_rank is missing or not positive")
        gated = mf.has_tensor(p + "time_mix_g1.weight")
        if gated and ranks["gate"] <= 0:
            raise ModelFileError(f"{mf.path}: {self.name}.attention.gate_lora_rank is missing, the file has gates")
        lerps = self.floats(p + "time_mix_lerp_fused.weight", n, 1, 1, 6 if gated else 5).reshape(-1, n)
        v_rank = ranks["value_residual_mix"]
        ln = self.norm_weights(p + "time_mix_ln") if mf.has_tensor(p + "time_mix_ln.weight") else None
        return TimeMix7(lerps=lerps, w0=self.vector(p + "time_mix_w0.weight", n),
                        w1=self.weight(p + "time_mix_w1.weight", n, ranks["decay"]),
                        w2=self.weight(p + "time_mix_w2.weight", ranks["decay"], n),
                        a0=self.vector(p + "time_mix_a0.weight", n),
                        a1=self.weight(p + "time_mix_a1.weight", n, ranks["iclr"]),
                        a2=self.weight(p + "time_mix_a2.weight", ranks["iclr"], n),
                        v0=self.vector(p + "time_mix_v0.weight", n) if i else None,
                        v1=self.weight(p + "time_mix_v1.weight", n, v_rank) if i else None,
                        v2=self.weight(p + "time_mix_v2.weight", v_rank, n) if i else None,
                        g1=self.weight(p + "time_mix_g1.weight", n, ranks["gate"]) if gated else None,
                        g2=self.weight(p + "time_mix_g2.weight", ranks["gate"], n) if gated else None,
                        k_k=self.vector(p + "time_mix_k_k.weight", n), k_a=self.vector(p + "time_mix_k_a.weight", n),
                        r_k=self.floats(p + "time_mix_r_k.weight", n).reshape(n),
                        wr=self.weight(p + "time_mix_receptance.weight", n, n),
                        wk=self.weight(p + "time_mix_key.weight", n, n), wv=self.weight(p + "time_mix_value.weight", n, n),
                        wo=self.weight(p + "time_mix_output.weight", n, n), ln=ln, heads=hp.n_head,
                        head_size=hp.head_dim)

    def block_notes(self) -> str:
        T = self.layers[0].attn
        return (f"; RWKV 7 time mix in place of attention, {T.heads} heads of {T.head_size} (a {T.head_size}x"
                f"{T.head_size} state each){'' if T.g1 is not None else ', no output gate'}, the first layer's "
                f"values mixed into every later layer's")

    def build(self, g: Graph) -> None:
        x = embed(g, self)
        for i, L in g.layers(self.layers, x):
            time_mix7(g, norm(g, self, x, L.attn_norm, L.attn_norm_b, "h"), L.attn, out=x)
            self.layer_ffn(g, norm(g, self, x, L.ffn_norm, L.ffn_norm_b, "h"), L, x)
        output_head(g, self, x)


class Arwkv7(QwenStack, Rwkv7):
    """ARWKV 7: RWKV 7's time mix, the gate and its output norm optional, in Qwen's stack."""
    name = "arwkv7"


def time_mix7(g: Graph, h: View, T: TimeMix7, out: View) -> View:
    """out += RWKV 7's time mix of h (TimeMix7 in base.py): its six (or five) lerps in one buffer; r,
    k, v, the decay w, a = -kk and b = kk a into the WKV op's [r | k | v | w | a | b] row; v_first, layer
    0's values, kept in a buffer of its own for the later layers."""
    n, C, hs, H = h.width, T.heads * T.head_size, T.head_size, T.heads
    dx = g.token_shift(h, "tm_dx", "shift_tm")
    mixed = g.lerp(h, dx, T.lerps, "tm_mixed")
    xr, xw, xk, xv, xa = (mixed.cols(j * n, n) for j in range(5))
    row = g.buffer("wkv7_in", 6 * C)
    r, k, v, w, a_in, b_in = (row.cols(j * C, C) for j in range(6))
    g.linear(xr, T.wr, r)
    g.linear(g.act(g.linear(xw, T.w1, "tm_d"), GLU_TANH, "tm_d"), T.w2, w, bias=T.w0)
    g.linear(xk, T.wk, k)
    g.linear(xv, T.wv, v)
    v_first = g.buffer("v_first", C)
    if T.v0 is None:   # layer 0: its values are every later layer's v_first
        g.copy(v, v_first, C, 1, 0, 0)
    else:              # v += (v_first - v) sigmoid(v0 + V2 V1 xv)
        mix = g.linear(g.linear(xv, T.v1, "tm_v1"), T.v2, "tm_vmix", bias=T.v0)
        dv = g.add(v, g.copy(v_first, g.buffer("tm_dv", C), C, 1, 0, 0), -1.0)
        g.add(g.glu(mix, dv, GLU_SIGMOID, dv), v)
    a = g.act(g.linear(g.linear(xa, T.a1, "tm_a1"), T.a2, "tm_a", bias=T.a0), GLU_SIGMOID, "tm_a")
    # kk = k k_k, L2-normed per head: an RMSNorm per head weighted 1 / sqrt(head_size)
    kk = g.scale(g.copy(k, g.buffer("tm_kk", C), C, 1, 0, 0), 1.0, columns=T.k_k)
    g.rmsnorm(kk, np.full(hs, hs ** -0.5, np.float32), L2_EPS / hs, kk, groups=H)
    g.scale(g.copy(kk, a_in, C, 1, 0, 0), -1.0)
    g.glu(kk, a, GLU_MUL, b_in)
    ka = g.scale(g.copy(k, g.buffer("tm_ka", C), C, 1, 0, 0), 1.0, columns=T.k_a)   # k += a ka - ka
    g.add(ka, g.add(g.glu(a, ka, GLU_MUL, "tm_aka"), k), -1.0)
    y = g.wkv(row, WKV_7, H, hs, "tm_y", bonus=T.r_k, norm=T.ln, eps=GROUP_NORM_EPS)
    if T.g1 is not None:
        xg = mixed.cols(5 * n, n)
        gate = g.linear(g.act(g.linear(xg, T.g1, "tm_g1"), GLU_SIGMOID, "tm_g1"), T.g2, "tm_g")
        g.glu(gate, y, GLU_MUL, y)
    return g.linear(y, T.wo, out, accumulate=True)


def time_mix(g: Graph, h: View, T: TimeMix, out: View) -> View:
    """out += the time mix of h (TimeMix in base.py): the token shift, the five data-dependent
    lerps in one [xw | xk | xv | xr | xg] buffer, r, k, v and the decay w into the WKV op's
    [r | k | v | w] row, its output normed per head (RWKV 6) and gated."""
    n, C, hs = h.width, T.heads * T.head_size, T.head_size
    dx = g.token_shift(h, "tm_dx", "shift_tm")
    m = g.act(g.linear(g.lerp(h, dx, T.lerp_x[None], "tm_xx"), T.w1, "tm_m"), GLU_TANH, "tm_m")
    mixed = g.lerp(h, dx, T.lerps, g.linear_heads(m, T.w2, "tm_mixed"), accumulate=True)
    xw, xk, xv, xr, xg = (mixed.cols(j * n, n) for j in range(5))
    rkvw = g.buffer("wkv_in", 4 * C)
    br, bk, bv = T.biases
    g.linear(xr, T.wr, rkvw.cols(0, C), bias=br)
    for j, (x_j, w, b) in enumerate(((xk, T.wk, bk), (xv, T.wv, bv)), start=1):
        if T.kv_heads == T.heads:
            g.linear(x_j, w, rkvw.cols(j * C, C), bias=b)
        else:   # head h reads kv head h // (heads / kv_heads): each repeated over its group
            kv, rep = g.linear(x_j, w, "tm_kv", bias=b), T.heads // T.kv_heads
            for r in range(rep):
                g.copy(kv, rkvw.cols(j * C + r * hs, C - r * hs), hs, T.kv_heads, hs, rep * hs)
    d = g.act(g.linear(xw, T.decay_w1, "tm_d"), GLU_TANH, "tm_d")
    g.linear(d, T.decay_w2, rkvw.cols(3 * C, C), bias=T.decay)
    if T.first is not None:
        y = g.wkv(rkvw, WKV_6, T.heads, hs, "tm_y", bonus=T.first)
        g.layernorm(y, *T.ln, GROUP_NORM_EPS, y, groups=T.heads)
    else:
        y = g.wkv(rkvw, WKV_GLA, T.heads, hs, "tm_y", scale=hs ** -0.5)
    g.glu(g.linear(xg, T.wg, "tm_g"), y, GLU_SILU if T.first is not None else GLU_SIGMOID, y)
    return g.linear(y, T.wo, out, accumulate=True)


def channel_mix(g: Graph, h: View, F: ChannelMix, out: View) -> View:
    """out += sigmoid(Wr xr) * Wv relu(Wk xk)^2, [xk | xr] = h + dx [lerp_k | lerp_r]; without the
    receptance (RWKV 7) out += Wv relu(Wk xk)^2."""
    n = h.width
    dx = g.token_shift(h, "cm_dx", "shift_cm")
    if F.receptance is None:
        k = g.act(g.linear(g.lerp(h, dx, F.lerp_k[None], "cm_x"), F.key, "cm_k"), GLU_RELU_SQR, "cm_k")
        return g.linear(k, F.value, out, accumulate=True)
    x_kr = g.lerp(h, dx, np.stack([F.lerp_k, F.lerp_r]), "cm_x")
    k = g.act(g.linear(x_kr.cols(0, n), F.key, "cm_k"), GLU_RELU_SQR, "cm_k")
    v = g.linear(k, F.value, "cm_v")
    g.glu(g.linear(x_kr.cols(n, n), F.receptance, "cm_r"), v, GLU_SIGMOID, v)
    return g.add(v, out)
