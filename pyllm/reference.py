"""The oracle: a slow, plain numpy float32 forward pass over dequantized weights.

No C, no quantized activations, no KV cache: the whole sequence at once, the
math as the papers and llama.cpp write it. Tests compare the C core against
it on every architecture and weight type. It shares only the hyperparameters
(including each layer's RoPE and window settings) and tensor lookup of
pyllm/arch, not the op program.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from .arch import ARCHITECTURES
from .arch.base import Architecture, ChannelMix, DeltaNet, Mla, Moe, ShortConv, Ssm, Ssm1, TimeMix, TimeMix7
from .arch.bert import Bert
from .arch.gemma3n import Gemma3n
from .arch.gemma4 import Gemma4
from .arch.rwkv import GROUP_NORM_EPS, Rwkv6
from .graph import (GLU_GELU_TANH, GLU_RELU, GLU_RELU_SQR, GLU_SWIGLU_OAI, MOE_SIGMOID, NORM_LAYER, ROPE_NEOX,
                    SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, alibi_slopes)
from .lora import TOKEN_EMBD
from .model_file import Tensor


def dequant(t: Tensor) -> np.ndarray:
    """A weight matrix as float32 [rows, n_in]."""
    if t.type == GGMLQuantizationType.Q8_0:
        # gguf's own math (f32(d) * f32(q)), without its per-block Python-level
        # overhead: Gemma 3's 262k x 640 embedding took 7 s through gguf
        blocks = t.data.reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        w = blocks[:, 2:].view(np.int8).astype(np.float32)
        w *= d
        return w.reshape(t.rows, t.shape[0])
    return dequantize(t.data, GGMLQuantizationType(t.type)).astype(np.float32).reshape(t.rows, t.shape[0])


def q8_round(x: np.ndarray, f16_scale: bool) -> np.ndarray:
    """x (its last axis a multiple of 32) through 8-bit blocks of 32 and back: d = amax / 127,
    q = nearest(x / d) (ties to even), then q * d, with d as stored: f16 in a q8_0 KV cache
    (f16_scale), float in the Q8 activations a q8_0 cache's scores take their queries in."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.rint(b * inv)
    if f16_scale:
        d = d.astype(np.float16).astype(np.float32)
    return (q * d).reshape(x.shape).astype(np.float32)


def q4_0_round(x: np.ndarray) -> np.ndarray:
    """x (its last axis a multiple of 32) through a q4_0 KV cache and back, as llama.cpp's
    reference quantizer writes it: per block of 32, m the value of largest magnitude (the first),
    d = m / -8, q = min(15, trunc(x / d + 8.5)), read back as (q - 8) * d with d stored as f16."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    first = np.argmax(np.abs(b), axis=-1)[..., None]
    d = np.take_along_axis(b, first, axis=-1) / np.float32(-8)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, np.trunc(b * inv + np.float32(8.5)))
    return ((q - 8) * d.astype(np.float16).astype(np.float32)).reshape(x.shape).astype(np.float32)


KV_ROUND = {"f16": lambda x: x.astype(np.float16).astype(np.float32),   # what a KV cache of each format
            "q8_0": lambda x: q8_round(x, f16_scale=True), "q4_0": q4_0_round}   # holds of a value


def hadamard_rotate(x: np.ndarray, piece: int) -> np.ndarray:
    """x's last axis in pieces of `piece` (a power of 2), each times the orthonormal Walsh-Hadamard
    matrix (Sylvester's order, entries +-1/sqrt(piece)): symmetric, its own inverse."""
    h = np.ones((1, 1))
    while len(h) < piece:
        h = np.block([[h, h], [h, -h]])
    parts = x.astype(np.float64).reshape(*x.shape[:-1], -1, piece)
    return (parts @ (h / np.sqrt(piece))).reshape(x.shape).astype(np.float32)


def kv_as_attended(x: np.ndarray, fmt: str, rot: int = 0) -> np.ndarray:
    """Keys or values as attention over a KV cache of format fmt sees them: rounded as the cache
    holds them; rotated by the Walsh-Hadamard pieces of `rot` first (llama.cpp's rotation of a
    quantized cache) and back after, which leaves the attention itself unchanged."""
    if not rot:
        return KV_ROUND[fmt](x)
    return hadamard_rotate(KV_ROUND[fmt](hadamard_rotate(x, rot)), rot)


def queries_as_attended(q: np.ndarray, k_fmt: str, rot: int = 0) -> np.ndarray:
    """Queries as the scores against keys of format k_fmt take them: as they are against f16 keys;
    through Q8 activation blocks (in the keys' rotation) against quantized ones."""
    if k_fmt == "f16":
        return q
    if not rot:
        return q8_round(q, f16_scale=False)
    return hadamard_rotate(q8_round(hadamard_rotate(q, rot), f16_scale=False), rot)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    return (x / np.sqrt(ms + eps)).astype(np.float32) * w


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    c = x64 - x64.mean(axis=-1, keepdims=True)
    y = (c / np.sqrt(np.mean(c ** 2, axis=-1, keepdims=True) + eps)).astype(np.float32) * w
    return y if b is None else y + b


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def xielu(x: np.ndarray, alpha_n: float, alpha_p: float, beta: float, eps: float) -> np.ndarray:
    """Apertus's activation: alpha_p x^2 + beta x above 0, (expm1(min(x, eps)) - x) alpha_n + beta x below."""
    return np.where(x > 0, alpha_p * x * x + beta * x,
                    (np.expm1(np.minimum(x, eps)) - x) * alpha_n + beta * x).astype(np.float32)


def swiglu_oai(g: np.ndarray, u: np.ndarray, alpha: float = SWIGLU_OAI_ALPHA,
               limit: float = SWIGLU_OAI_LIMIT) -> np.ndarray:
    """gpt-oss's gate: min(g, limit) sigmoid(alpha min(g, limit)) (clamp(u, -limit, limit) + 1)."""
    g = np.minimum(g, limit)
    return g / (1.0 + np.exp(-alpha * g)) * (np.clip(u, -limit, limit) + 1.0)


def glu(kind: int):
    """The gated activation act(g) * u of GLU kind `kind`, as a function of (g, u)."""
    if kind == GLU_SWIGLU_OAI:
        return swiglu_oai
    if kind == GLU_RELU_SQR:
        return lambda g, u: np.maximum(g, 0) ** 2 * u
    if kind == GLU_RELU:
        return lambda g, u: np.maximum(g, 0) * u
    act = gelu_tanh if kind == GLU_GELU_TANH else silu
    return lambda g, u: act(g) * u


def previous_rows(x: np.ndarray) -> np.ndarray:
    """x's rows moved down one, zeros first: each position's view of the one before (RWKV's token shift)."""
    return np.concatenate([np.zeros_like(x[:1]), x[:-1]])


def causal_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Causal depthwise convolution over positions: y[t, c] = sum_j w[c, j] x[t - L + 1 + j, c],
    L = w.shape[1] taps, zeros before position 0. x: [T, channels]."""
    taps = w.shape[1]
    padded = np.concatenate([np.zeros((taps - 1, x.shape[1]), np.float32), x])
    return sum(w[:, j] * padded[j:j + len(x)] for j in range(taps))


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool,
         freq_scale: float = 1.0, factors: np.ndarray | None = None, sections: tuple = (),
         interleaved: bool = False) -> np.ndarray:
    """Rotates the first n_rot dims of each head. x: [T, heads, head_dim].
    neox pairs dim i with i + n_rot/2; otherwise adjacent dims (2i, 2i+1). M-RoPE
    (sections, pos [3, T]): pair i turns by the time position if i < s0, the height's
    if i < s0 + s1, the width's if i < s0 + s1 + s2, else the time's; interleaved
    (Qwen 3 VL): the height's if i % 3 == 1 and i < 3 s1, the width's if i % 3 == 2
    and i < 3 s2, else the time's."""
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    if factors is not None:
        inv_freq = inv_freq / factors
    if pos.ndim == 2:     # M-RoPE: each pair's own position
        which = np.zeros(half, np.int64)
        s0, s1, s2 = sections
        if interleaved:
            i = np.arange(half)
            which[(i % 3 == 1) & (i < 3 * s1)], which[(i % 3 == 2) & (i < 3 * s2)] = 1, 2
        else:
            which[s0:s0 + s1], which[s0 + s1:s0 + s1 + s2] = 1, 2
        theta = (pos[which].T.astype(np.float64) * freq_scale) * inv_freq[None, :]
    else:
        theta = (pos.astype(np.float64) * freq_scale)[:, None] * inv_freq[None, :]   # [T, half]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half], out[..., half:n_rot] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
    return out.astype(np.float32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int = 0,
              softcap: float = 0.0, sinks: np.ndarray | None = None, chunked: bool = False,
              causal: bool = True, spans: Sequence[tuple[int, int]] = (), alibi: np.ndarray | None = None) -> np.ndarray:
    """Causal attention (causal False: every position sees every other, an encoder's, or with a
    window those within window // 2 either way). q: [T, H, d], k: [T, Hkv, d], v: [T, Hkv, dv] -> [T, H*dv]. sinks:
    one logit per head, one more score of each softmax whose value is zero. window: over the
    last `window` positions, or with chunked over those of the position's chunk of `window`.
    spans: (start, end) row ranges that see each other (an image's rows, Gemma 3): a row
    in one sees up to end - 1, back as far as the causal rule (window) says. alibi: ALiBi's
    slope of each head; head h's score of position j from position i gains -slope_h |i - j|."""
    T, H, d = q.shape
    group = H // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q.astype(np.float64), k.astype(np.float64)) * scale
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    if alibi is not None:
        scores = scores - alibi.astype(np.float64)[:, None, None] * np.abs(i - j)[None]
    last = np.arange(T)               # the last position each row sees
    for start, end in spans:
        last[start:end] = end - 1
    allowed = j <= last[:, None] if causal else np.ones((T, T), bool)
    if window > 0 and not causal:   # a bidirectional window: half of it either way (EmbeddingGemma)
        allowed &= np.abs(i - j) <= window // 2
    elif window > 0:
        allowed &= j >= i - i % window if chunked else j > i - window
    scores = np.where(allowed[None], scores, -np.inf)
    sink = np.full((H, T, 1), -np.inf) if sinks is None else np.broadcast_to(
        sinks.astype(np.float64)[:, None, None], (H, T, 1))
    m = np.maximum(scores.max(axis=-1, keepdims=True), sink)
    p = np.exp(scores - m)
    p /= p.sum(axis=-1, keepdims=True) + np.exp(sink - m)
    return np.einsum("hts,shd->thd", p, v.astype(np.float64)).reshape(T, -1).astype(np.float32)


class Reference:
    """Dequantizes an architecture's weights once, then runs whole sequences."""

    def __init__(self, arch: Architecture, kv_f16: bool = False, kv_quant: Optional[str] = None,
                 lora: Sequence = (), control: Optional[dict] = None):
        """kv_f16: round k and v to f16 before attending, as both engines' KV caches
        store them (at F32 that rounding is the engines' main difference from here).
        kv_quant "q8_0" or "q4_0": round them through that format instead (a quantized
        KV cache, with its Walsh-Hadamard rotation where the engines rotate), and the
        queries through the Q8 activation blocks the scores then take.
        control: layer -> the control vector added to x after that layer."""
        self.arch = arch
        self.control = control or {}
        self.layer_outputs: dict[int, np.ndarray] = {}   # layer -> the residual stream after it (the last forward)
        self._media: Optional[np.ndarray] = None          # the forward's media rows and bidirectional spans
        self._spans: list[tuple[int, int]] = []
        self._rope_pos: Optional[np.ndarray] = None    # M-RoPE positions of the forward in progress
        self.kv_f16 = kv_f16
        self.kv_quant = kv_quant
        self.kv_rot = (0, 0)
        if kv_quant:
            from .backend.base import KV_TYPES
            from .backend.lowering import kv_rotations
            from .graph import Graph
            g = Graph()
            arch.build(g)
            self.kv_rot = kv_rotations(g, KV_TYPES[kv_quant], KV_TYPES[kv_quant])
        self._cache: dict[str, np.ndarray] = {}
        # LoRA adapters merged into the weights (W + s B A), the way llama.cpp's export-lora
        # bakes them in; the token embedding's pair is stored the other way round (A: a row
        # of r per token), so its rows get s A B^T, and a tied output head keeps plain E
        self._embed_delta: Optional[np.ndarray] = None
        for adapter in lora:
            for p in adapter.pairs:
                s = np.float32(adapter.effective_scale(p))
                if p.target == TOKEN_EMBD:
                    d = s * (dequant(p.a) @ dequant(p.b).T)
                    self._embed_delta = d if self._embed_delta is None else self._embed_delta + d
                else:
                    self._cache[p.target] = self.w(arch.mf.tensor(p.target)) + s * (dequant(p.b) @ dequant(p.a))

    def w(self, t: Tensor) -> np.ndarray:
        if t.name not in self._cache:
            self._cache[t.name] = dequant(t)
        return self._cache[t.name]

    def _token_rows(self, tokens: np.ndarray) -> np.ndarray:
        """The token embedding's rows of `tokens` (with a LoRA adapter's delta)."""
        rows = self.w(self.arch.tok_embd)[tokens]
        return rows if self._embed_delta is None else rows + self._embed_delta[tokens]

    def _input_rows(self, tokens: np.ndarray) -> np.ndarray:
        """x = embed(tokens) * embed_scale, where a media row's id -1 - j takes media[j] as it is
        (no scale, no LoRA delta: the rows replace the embedding)."""
        text = tokens >= 0
        x = self._token_rows(np.where(text, tokens, 0)) * np.float32(self.arch.embed_scale)
        if not text.all():
            x[~text] = self._media[-1 - tokens[~text], :x.shape[1]]
        return x

    def forward(self, tokens, embeddings: bool = False, media: Optional[np.ndarray] = None,
                bidirectional: Sequence[tuple[int, int]] = (), rope_pos: Optional[np.ndarray] = None) -> np.ndarray:
        """Logits [T, vocab] for every position of `tokens`, from an empty context (every
        registered family is a variant of _decoder, or an encoder); with embeddings, or for an
        encoder, the rows an embedding is pooled from [T, n_embd]: the final norm's output.
        A token id -1 - j takes media[j] ([rows, n_embd]: an image's embeddings) as its input
        embedding, as it is; bidirectional: (start, end) row spans whose rows see each other
        (attention not causal within them: Gemma 3's image rows); rope_pos: [3, T] M-RoPE
        (time, height, width) positions for an architecture with rope sections."""
        if type(self.arch) is not ARCHITECTURES.get(self.arch.name):
            raise NotImplementedError(f"no reference forward for {self.arch.name}")
        tokens = np.asarray(tokens, dtype=np.int64)
        a, T = self.arch, len(tokens)
        media = None if media is None else np.asarray(media, np.float32)
        body = self._gemma3n if isinstance(a, Gemma3n) else self._gemma4 if isinstance(a, Gemma4) \
            else self._encoder if isinstance(a, Bert) else self._rwkv if isinstance(a, Rwkv6) else self._decoder
        if (tokens < 0).any():
            if body == self._encoder:
                raise ValueError(f"media rows through {a.name}: the reference takes them in decoders only")
            width = a.hp.n_embd * (1 + a.deepstack)
            if media is None or media.ndim != 2 or media.shape[1] != width:
                raise ValueError(f"media rows must be [rows, {width}]")
            if -1 - tokens.min() >= len(media):
                raise ValueError(f"token id {tokens.min()} names media row {-1 - tokens.min()}; there are "
                                 f"{len(media)}")
        for start, end in bidirectional:
            if not 0 <= start < end <= T:
                raise ValueError(f"bidirectional span ({start}, {end}) outside the {T} rows")
        if bidirectional and body == self._encoder:
            raise ValueError("an encoder's attention is bidirectional already")
        self._media = media
        self._spans = [(int(s), int(e)) for s, e in bidirectional]
        self._rope_pos = None if rope_pos is None else np.asarray(rope_pos).reshape(3, T)
        try:
            return self._head(body(tokens), embeddings)
        finally:
            self._media, self._spans, self._rope_pos = None, [], None

    def _head(self, x: np.ndarray, embeddings: bool) -> np.ndarray:
        """logit_scale * (Wout norm(x) + b?), soft-capped where the family says; for embeddings
        (and an encoder) norm(x) through the file's dense projections; x itself for BERT (its last
        layer ends in a norm)."""
        a = self.arch
        if a.out_norm is None:
            return x
        h = self._norm(x, a.out_norm, a.out_norm_b)
        if embeddings or not a.causal:
            for w, b in a.dense_out:
                h = self._linear(h, w, b)
            return h
        logits = self._linear(h, a.output, a.out_bias) * np.float32(a.logit_scale)
        if a.final_softcap > 0:
            logits = a.final_softcap * np.tanh(logits / a.final_softcap)
        return logits

    def _encoder(self, tokens: np.ndarray) -> np.ndarray:
        """BERT (pyllm/arch/bert.py): x = layernorm(embed + token type 0 + positions), then per
        layer x = layernorm(x + attn(x)), x = layernorm(x + ffn(x)), attention bidirectional."""
        a, hp = self.arch, self.arch.hp
        x = self._token_rows(tokens)
        if a.pos_embd is not None:
            x = x + self.w(a.pos_embd)[np.arange(len(tokens))]
        if a.type_row is not None:
            x = x + a.type_row
        x = layernorm(x, a.embd_norm, a.embd_norm_b, hp.eps)
        act = glu(a.glu)
        for i, L in enumerate(a.layers):
            x = layernorm(x + self._attention(x, L.attn, i), L.attn_norm, L.attn_norm_b, hp.eps)
            x = layernorm(x + self._ffn(x, L.ffn, act), L.ffn_norm, L.ffn_norm_b, hp.eps)
        return x

    def _norm(self, x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None = None) -> np.ndarray:
        """The family's input norm (RMSNorm, or LayerNorm with bias b); none if w is None."""
        if w is None:
            return x
        if self.arch.norm == NORM_LAYER:
            return layernorm(x, w, b, self.arch.hp.eps)
        return rmsnorm(x, w, self.arch.hp.eps)

    def _ffn(self, h: np.ndarray, F, act, router_x: np.ndarray | None = None) -> np.ndarray:
        """Wdown act(Wgate h, Wup h), Wdown act(Wup h, 1) ungated, or the experts' sum (routed by
        router_x where the family routes by the layer's input)."""
        if isinstance(F, Moe):
            return self._moe(h, F, act, h if router_x is None else router_x)
        if not F.gated and F.act_params is not None:   # xIELU (Apertus)
            z = xielu(self._linear(h, F.w_up, F.b_up), *F.act_params)
        elif not F.gated:
            z = act(self._linear(h, F.w_up, F.b_up), np.float32(1.0))
        else:
            if F.w_gate is not None:
                gate, up = self._linear(h, F.w_gate, F.b_gate), self._linear(h, F.w_up, F.b_up)
            else:   # fused [gate | up]
                gate, up = np.split(self._linear(h, F.w_up, F.b_up), 2, axis=1)
            z = act(gate, up)
        return self._linear(z, F.w_down, F.b_down)

    def _expert_inputs(self, m: Moe, e: int, x: np.ndarray, z: np.ndarray) -> None:
        """Called with each (token, expert) pair's input rows: x to the up/gate matrices, z to the
        down matrix (a hook for tests that record them; nothing here)."""

    def _experts(self, t: Tensor) -> np.ndarray:
        """A 3-D expert tensor as float32 [n_experts, n_out, n_in]."""
        return self.w(t).reshape(t.shape[2], t.shape[1], t.shape[0])

    def _moe(self, h: np.ndarray, m: Moe, act, router_x: np.ndarray) -> np.ndarray:
        """sum over the k experts with the largest gate values (of router_x) of (weight) * expert FFN(h)."""
        logits = self._linear(router_x, m.router, m.b_router)
        if m.gating == MOE_SIGMOID:
            p = sigmoid(logits.astype(np.float64))
        else:
            e = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
            p = e / e.sum(axis=1, keepdims=True)
        # gating is monotonic: the k best logits, unless a selection bias joins the gate values
        if m.b_select is None and not m.groups[0]:
            key = logits
        else:   # groups are scored by gate values too
            key = (p + (0.0 if m.b_select is None else m.b_select)).astype(np.float32)
        if m.groups[0]:   # only the groups whose two best keys sum highest (DeepSeek V3)
            n, used = m.groups
            per_group = key.reshape(len(key), n, -1)
            score = np.sort(per_group, axis=2)[:, :, -2:].sum(axis=2)
            keep = np.argsort(-score, axis=1, kind="stable")[:, :used]
            masked = np.full_like(per_group, -np.inf)
            np.put_along_axis(masked, keep[:, :, None], np.take_along_axis(per_group, keep[:, :, None], axis=1), axis=1)
            key = masked.reshape(len(key), -1)
        top = np.argsort(-key, axis=1, kind="stable")[:, :m.k]
        weights = np.take_along_axis(p, top, axis=1)
        if m.norm:
            weights = weights / weights.sum(axis=1, keepdims=True)
        weights = (weights * m.scale).astype(np.float32)
        if m.expert_scale is not None:   # Gemma 4: each expert's weight times its scale
            weights = weights * m.expert_scale[top]
        gate = None if m.gate is None else self._experts(m.gate)   # None: ungated, act(up x)
        up, down = self._experts(m.up), self._experts(m.down)

        def bias(b, e):
            return 0.0 if b is None else b[e]
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            for j, e in enumerate(top[t]):
                x = h[t] * weights[t, j] if m.weight_input else h[t]   # Llama 4 weighs the input
                u = up[e] @ x + bias(m.b_up, e)
                if m.gate_up:   # rows [gate | up]
                    z = act(*np.split(u, 2))
                else:
                    z = act(u, np.float32(1.0)) if gate is None else act(gate[e] @ x + bias(m.b_gate, e), u)
                self._expert_inputs(m, int(e), x, z)
                out[t] += (1.0 if m.weight_input else weights[t, j]) * (down[e] @ z + bias(m.b_down, e))
        if m.shared is not None:
            s = self._ffn(h, m.shared, act)
            if m.shared_gate is not None:
                s = s / (1.0 + np.exp(-(h @ self.w(m.shared_gate).T)))
            out = out + s
        return out

    def _attention(self, h: np.ndarray, A, i: int) -> np.ndarray:
        """Wo attention(rope(norm?(Wq h + bq)), rope(norm?(Wk h + bk)), Wv h + bv) + bo for layer i."""
        a, hp = self.arch, self.arch.hp
        (H, Hkv), T, d = A.heads(hp), h.shape[0], hp.head_dim
        pos = np.arange(T)
        gate = None
        if A.wqkv is not None:
            qkv = self._linear(h, A.wqkv, A.bqkv)
            q, k, v = np.split(qkv, [H * d, (H + Hkv) * d], axis=1)
        elif A.q_gated:   # wq's rows [q_h | gate_h] per head (Qwen3.5)
            qg = self._linear(h, A.wq, A.bq).reshape(T, H, 2 * d)
            q, gate = qg[:, :, :d].reshape(T, -1), qg[:, :, d:].reshape(T, -1)
            k, v = self._linear(h, A.wk, A.bk), self._linear(h, A.wv, A.bv)
        else:
            q, k, v = self._linear(h, A.wq, A.bq), self._linear(h, A.wk, A.bk), self._linear(h, A.wv, A.bv)
        def qk_norms(q, k):   # over each head, or over all of q and of k (OLMo 2)
            return (rmsnorm(q.reshape(T, -1, len(A.q_norm)), A.q_norm, hp.eps),
                    rmsnorm(k.reshape(T, -1, len(A.k_norm)), A.k_norm, hp.eps))
        if A.q_norm is not None and not a.qk_norm_after_rope:
            q, k = qk_norms(q, k)
        q, k, v = q.reshape(T, H, d), k.reshape(T, Hkv, d), v.reshape(T, Hkv, d)
        r = a.layer_rope(i)
        if r.sections and self._rope_pos is not None:
            pos = self._rope_pos
        q = rope(q, pos, r.n_rot, r.base, r.mode == ROPE_NEOX, r.scale, r.factors, r.sections, r.interleaved)
        k = rope(k, pos, r.n_rot, r.base, r.mode == ROPE_NEOX, r.scale, r.factors, r.sections, r.interleaved)
        if A.q_norm is not None and a.qk_norm_after_rope:   # Hunyuan: norms of the rotated q and k
            q, k = qk_norms(q, k)
            q, k = q.reshape(T, H, d), k.reshape(T, Hkv, d)
        temperature = a.layer_attn_temperature(i)
        if temperature is not None:
            q = q * self._temperature(pos, temperature)
        q, k, v = self._cached(q, k, v)
        att = attention(q, k, v, a.layer_attn_scale(i), a.layer_window(i), a.attn_softcap, A.sinks, a.chunked_window,
                        a.causal, self._spans, alibi_slopes(a.alibi, H) if a.alibi > 0 else None)
        if A.gate is not None:   # gated attention (AFMoE)
            gate = self._linear(h, A.gate, None)
        if gate is not None:
            att = att / (1.0 + np.exp(-gate))
        return self._linear(att, A.wo, A.bo)

    @staticmethod
    def _temperature(pos: np.ndarray, temperature: tuple) -> np.ndarray:
        """Each position's factor on q, [T, 1, 1]: 1 + s ln(1 + floor((p + offset) / period))."""
        s, period, offset = temperature
        return (np.log(np.floor((pos + offset) / period) + 1.0) * s + 1.0).astype(np.float32)[:, None, None]

    def _cached(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, k, v as attention sees them: k and v as the KV cache holds them (kv_f16, kv_quant),
        q as the scores over a quantized cache take it."""
        if self.kv_quant:
            k_rot, v_rot = self.kv_rot
            return (queries_as_attended(q, self.kv_quant, k_rot), kv_as_attended(k, self.kv_quant, k_rot),
                    kv_as_attended(v, self.kv_quant, v_rot))
        if self.kv_f16:
            return q, k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
        return q, k, v

    def _latent_attention(self, h: np.ndarray, A: Mla, i: int) -> np.ndarray:
        """Multi-head latent attention as DeepSeek-V2 writes it, with every head's key and
        value decompressed: [c | k_pe] = Wkv_a h, c normed; k_i = [Wk_i c | rope(k_pe)],
        v_i = Wv_i c, q_i = [q_nope_i | rope(q_pe_i)]; Wo [attention_i]_i."""
        a, hp = self.arch, self.arch.hp
        T, H, nope, n_rot, lat = h.shape[0], hp.n_head, a.nope, hp.rope_dim, a.kv_lora
        pos = np.arange(T)
        if A.wq is not None:
            q = self._linear(h, A.wq, None)
        else:
            q = self._linear(rmsnorm(self._linear(h, A.wq_a, None), A.q_a_norm, hp.eps), A.wq_b, None)
        q = q.reshape(T, H, nope + n_rot)
        kv = self._linear(h, A.wkv_a, None)
        c, k_pe = rmsnorm(kv[:, :lat], A.kv_a_norm, hp.eps), kv[:, None, lat:]
        r = a.layer_rope(i)
        q_pe = rope(q[:, :, nope:], pos, n_rot, r.base, r.mode == ROPE_NEOX, r.scale, r.factors)
        k_pe = rope(k_pe, pos, n_rot, r.base, r.mode == ROPE_NEOX, r.scale, r.factors)
        if self.kv_quant:
            raise NotImplementedError("no reference for latent attention over a quantized KV cache")
        if self.kv_f16:   # the engines cache c and k_pe in f16
            c, k_pe = c.astype(np.float16).astype(np.float32), k_pe.astype(np.float16).astype(np.float32)
        wk = self._experts(A.wk_b).transpose(0, 2, 1)    # [H, nope, lat]: Wk_i
        wv = self._experts(A.wv_b)                       # [H, v_dim, lat]: Wv_i
        k = np.concatenate([np.einsum("hnl,tl->thn", wk, c), np.broadcast_to(k_pe, (T, H, n_rot))], axis=2)
        v = np.einsum("hvl,tl->thv", wv, c)
        q = np.concatenate([q[:, :, :nope], q_pe], axis=2)
        temperature = a.layer_attn_temperature(i)
        if temperature is not None:
            q = q * self._temperature(pos, temperature)
        att = attention(q, k, v, a.layer_attn_scale(i), a.layer_window(i), spans=self._spans)
        return self._linear(att, A.wo, None)

    def _short_conv(self, h: np.ndarray, s: ShortConv) -> np.ndarray:
        """out_proj (c * conv(b * x)), [b | c | x] = in_proj h; conv causal over positions."""
        b, c, x = np.split(self._linear(h, s.in_proj, None), 3, axis=1)
        return self._linear(c * causal_conv(b * x, s.conv), s.out_proj, None)

    def _ssm(self, h: np.ndarray, s: Ssm) -> np.ndarray:
        """Mamba 2: out_proj norm(y * silu(z)), [z | xBC | dt] = in_proj h, xBC = silu(conv(xBC) + b),
        y_t = C_t . s_t + D x_t with s_t = exp(dt_t A) s_{t-1} + dt_t x_t B_t^T per head, dt_t =
        softplus(dt + dt_bias); the norm is an RMSNorm of each of the groups."""
        T, H, P, G, N = h.shape[0], s.heads, s.head_dim, s.groups, s.d_state
        d_inner, channels = H * P, s.conv.shape[0]
        zxbcdt = self._linear(h, s.in_proj, None)
        z, xbc, dt = np.split(zxbcdt, [d_inner, d_inner + channels], axis=1)
        xbc = silu(causal_conv(xbc, s.conv) + (0.0 if s.conv_bias is None else s.conv_bias))
        x, B, C = np.split(xbc, [d_inner, d_inner + G * N], axis=1)
        x, B, C = x.reshape(T, H, P), B.reshape(T, G, N), C.reshape(T, G, N)
        dt = dt.astype(np.float64) + s.dt_bias
        dt = np.where(dt > 20.0, dt, np.log1p(np.exp(np.minimum(dt, 20.0))))   # softplus, [T, H]
        group = np.arange(H) // (H // G)
        state = np.zeros((H, P, N))
        y = np.empty((T, H, P))
        for t in range(T):
            decay = np.exp(dt[t] * s.a)                                    # [H]
            state = state * decay[:, None, None] + (dt[t][:, None] * x[t])[:, :, None] * B[t][group][:, None, :]
            y[t] = np.einsum("hpn,hn->hp", state, C[t][group]) + s.d[:, None] * x[t]
        y = (y.reshape(T, d_inner) * silu(z)).astype(np.float32)
        if s.norm is not None:
            y = (rmsnorm(y.reshape(T, G, -1), s.norm.reshape(G, -1), self.arch.hp.eps)).reshape(T, d_inner)
        return self._linear(y, s.out_proj, None)

    def _ssm1(self, h: np.ndarray, s: Ssm1) -> np.ndarray:
        """Mamba 1: out_proj (y * silu(z)), [x | z] = in_proj h, x = silu(conv(x) + b), [dt | B | C] =
        x_proj x (each RMS-normed where the layer has norms), y_t = C_t . s_t + D x_t with s_t = exp(dt_t A) s_{t-1}
        + dt_t x_t B_t per channel, dt_t = softplus(dt_proj dt + dt_bias)."""
        n, N, R = s.d_inner, s.d_state, s.dt_rank
        x, z = np.split(self._linear(h, s.in_proj, None), [n], axis=1)
        x = silu(causal_conv(x, s.conv) + s.conv_bias)
        dt, B, C = np.split(self._linear(x, s.x_proj, None), [R, R + N], axis=1)
        if s.norms is not None:
            dt, B, C = (rmsnorm(v, w, self.arch.hp.eps) for v, w in zip((dt, B, C), s.norms))
        dt = self._linear(dt, s.dt_proj, None).astype(np.float64) + s.dt_bias
        dt = np.where(dt > 20.0, dt, np.log1p(np.exp(np.minimum(dt, 20.0))))   # softplus, [T, n]
        state = np.zeros((n, N))
        y = np.empty((h.shape[0], n))
        for t in range(h.shape[0]):
            state = state * np.exp(dt[t][:, None] * s.a) + (dt[t] * x[t])[:, None] * B[t][None, :]
            y[t] = state @ C[t] + s.d * x[t]
        return self._linear((y * silu(z)).astype(np.float32), s.out_proj, None)

    def _delta_net(self, h: np.ndarray, d: DeltaNet) -> np.ndarray:
        """The gated delta rule as Qwen3.5 writes it, token by token, in float64: [q | k | v] =
        silu(conv(Wqkv h)); per value head (key head h % kv_heads, or h // r grouped, r = heads /
        kv_heads) q, k / max(|.|, eps), q also / sqrt(dk); S = g S + k (beta (v - S^T k))^T,
        o = S^T q; then rmsnorm_per_head(o) * silu(Wz h). Qwen3-Next's fused projections are split
        per key head: ssm_in [q | k | v_r | z_r], ssm_ba [b_r | a_r]."""
        T, H, Hk, dk, dv, eps = h.shape[0], d.heads, d.kv_heads, d.head_dim, d.head_dim_v, self.arch.hp.eps
        r = H // Hk
        if d.w_qkvz is None:
            qkv, z = self._linear(h, d.wqkv, None), self._linear(h, d.wz, None)
        else:
            q, k, v, z = np.split(self._linear(h, d.w_qkvz, None).reshape(T, Hk, -1), [dk, 2 * dk, 2 * dk + r * dv],
                                  axis=2)
            qkv = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=1)
            z = z.reshape(T, -1)
        qkv = silu(causal_conv(qkv, d.conv)).astype(np.float64)
        q, k, v = np.split(qkv, [Hk * dk, 2 * Hk * dk], axis=1)

        def l2(x):   # [T, Hk, dk] -> per head x / max(|x|, eps)
            return x / np.maximum(np.sqrt((x ** 2).sum(-1, keepdims=True)), eps)
        key_head = np.arange(H) // r if d.grouped_kv else np.arange(H) % Hk
        q, k = l2(q.reshape(T, Hk, dk))[:, key_head] / np.sqrt(dk), l2(k.reshape(T, Hk, dk))[:, key_head]
        v = v.reshape(T, H, dv)
        if d.w_ba is None:
            a, b = self._linear(h, d.w_alpha, None), self._linear(h, d.w_beta, None)
        else:
            b, a = (x.reshape(T, H) for x in np.split(self._linear(h, d.w_ba, None).reshape(T, Hk, 2 * r), 2, axis=2))
        a = a.astype(np.float64) + d.dt_bias
        g = np.exp(d.a * np.where(a > 20.0, a, np.log1p(np.exp(np.minimum(a, 20.0)))))       # [T, H]
        beta = sigmoid(b.astype(np.float64))   # [T, H]
        S = np.zeros((H, dk, dv))
        o = np.empty((T, H, dv))
        for t in range(T):
            S = S * g[t][:, None, None]
            err = (v[t] - np.einsum("hij,hi->hj", S, k[t])) * beta[t][:, None]
            S = S + k[t][:, :, None] * err[:, None, :]
            o[t] = np.einsum("hij,hi->hj", S, q[t])
        y = rmsnorm(o.astype(np.float32), d.norm, self.arch.hp.eps).reshape(T, H * dv)
        return self._linear(y * silu(z), d.out_proj, None)

    def _rwkv(self, tokens: np.ndarray) -> np.ndarray:
        """RWKV 6 and 7, QRWKV 6 and ARWKV 7 (pyllm/arch/rwkv.py): per layer x += time_mix(norm(x)),
        x += channel_mix(norm(x)) (QRWKV, ARWKV: a SwiGLU FFN), x /= 2 every rescale_every layers
        (RWKV 6); each mix reads its input's previous row (zeros before the first)."""
        a, hp = self.arch, self.arch.hp
        x = self._input_rows(tokens)
        if a.input_norm is not None:
            x = layernorm(x, *a.input_norm, hp.eps)
        self._v_first = None
        for i, L in enumerate(a.layers):
            h = self._norm(x, L.attn_norm, L.attn_norm_b)
            x = x + (self._time_mix7(h, L.attn) if isinstance(L.attn, TimeMix7) else self._time_mix(h, L.attn))
            h = self._norm(x, L.ffn_norm, L.ffn_norm_b)
            x = x + (self._channel_mix(h, L.ffn) if isinstance(L.ffn, ChannelMix) else self._ffn(h, L.ffn, glu(a.glu)))
            if a.rescale_every and (i + 1) % a.rescale_every == 0:
                x = x / np.float32(2.0)
            if i in self.control:
                x = x + self.control[i]
            self.layer_outputs[i] = x
        return x

    def _time_mix(self, h: np.ndarray, T: TimeMix) -> np.ndarray:
        """RWKV 6's time mix as llama.cpp's build_rwkv6_time_mix writes it, the WKV recurrence
        token by token in float64: per head S = diag(w) S + k v^T after y = r^T (S + diag(u) k v^T)
        (RWKV 6), or y = r^T S / sqrt(head_size) after it, k scaled by 1 - w (QRWKV)."""
        n_tok, n = h.shape
        H, D = T.heads, T.head_size
        dx = previous_rows(h) - h
        m = np.tanh(self._linear(h + dx * T.lerp_x, T.w1, None)).reshape(n_tok, 5, -1)
        mixed = np.einsum("jnk,tjk->tjn", self._experts(T.w2), m) + T.lerps   # [T, 5, n]
        xw, xk, xv, xr, xg = (h + dx * mixed[:, j] for j in range(5))
        br, bk, bv = T.biases
        r, k, v = self._linear(xr, T.wr, br), self._linear(xk, T.wk, bk), self._linear(xv, T.wv, bv)
        rep = T.heads // T.kv_heads
        k, v = (np.repeat(z.reshape(n_tok, T.kv_heads, D), rep, axis=1) for z in (k, v))
        r = r.reshape(n_tok, H, D).astype(np.float64)
        k, v = k.astype(np.float64), v.astype(np.float64)
        w = self._linear(np.tanh(self._linear(xw, T.decay_w1, None)), T.decay_w2, None) + T.decay
        w = np.exp(-np.exp(w.astype(np.float64))).reshape(n_tok, H, D)
        S = np.zeros((H, D, D))   # [head][key][value]
        y = np.empty((n_tok, H, D))
        for t in range(n_tok):
            kv = k[t][:, :, None] * v[t][:, None, :]
            if T.first is None:
                kv = kv * (1.0 - w[t])[:, :, None]
                S = S * w[t][:, :, None] + kv
                y[t] = np.einsum("hi,hij->hj", r[t], S) / np.sqrt(D)
            else:
                y[t] = np.einsum("hi,hij->hj", r[t], S + T.first.reshape(H, D)[:, :, None] * kv)
                S = S * w[t][:, :, None] + kv
        y = y.astype(np.float32)
        if T.ln is not None:
            y = layernorm(y, np.ones(D, np.float32), None, GROUP_NORM_EPS).reshape(n_tok, n) * T.ln[0] + T.ln[1]
            g = silu(self._linear(xg, T.wg, None))
        else:
            g = sigmoid(self._linear(xg, T.wg, None))
        return self._linear(y.reshape(n_tok, n) * g, T.wo, None)

    def _time_mix7(self, h: np.ndarray, T: TimeMix7) -> np.ndarray:
        """RWKV 7's time mix as llama.cpp's build_rwkv7_time_mix writes it, the WKV 7 recurrence
        token by token in float64 (S: value rows, key columns): S = S diag(w) + (S a) b^T + v k^T,
        y = S r, a = -kk, b = kk sigmoid(..); then per head LayerNorm and the bonus (r . (r_k k)) v.
        Layer 0's values are kept (self._v_first) for the later layers' value residual."""
        n_tok, n = h.shape
        H, D = T.heads, T.head_size
        dx = previous_rows(h) - h
        mixed = h[:, None, :] + dx[:, None, :] * T.lerps   # [T, 5 or 6, n]
        xr, xw, xk, xv, xa = (mixed[:, j] for j in range(5))
        r, k, v = self._linear(xr, T.wr, None), self._linear(xk, T.wk, None), self._linear(xv, T.wv, None)
        w = self._linear(np.tanh(self._linear(xw, T.w1, None)), T.w2, None) + T.w0
        w = np.exp(-0.606531 * sigmoid(w.astype(np.float64)))   # the decay
        if T.v0 is None:
            self._v_first = v
        else:
            mix = self._linear(self._linear(xv, T.v1, None), T.v2, None) + T.v0
            v = v + (self._v_first - v) * sigmoid(mix)
        a = sigmoid(self._linear(self._linear(xa, T.a1, None), T.a2, None) + T.a0)
        kk = (k * T.k_k).reshape(n_tok, H, D).astype(np.float64)
        kk = (kk / np.maximum(np.sqrt((kk ** 2).sum(2, keepdims=True)), 1e-12)).reshape(n_tok, n)
        k = k + (a * (k * T.k_a) - k * T.k_a)
        r64, k64, v64 = (z.astype(np.float64).reshape(n_tok, H, D) for z in (r, k, v))
        wd, a_in, b_in = (z.reshape(n_tok, H, D) for z in (w, -kk, kk * a))
        S = np.zeros((H, D, D))
        y = np.empty((n_tok, H, D))
        for t in range(n_tok):
            sa = np.einsum("hij,hj->hi", S, a_in[t])
            S = S * wd[t][:, None, :] + sa[:, :, None] * b_in[t][:, None, :] + v64[t][:, :, None] * k64[t][:, None, :]
            y[t] = np.einsum("hij,hj->hi", S, r64[t])
        if T.ln is not None:
            y = layernorm(y.astype(np.float32), np.ones(D, np.float32), None, GROUP_NORM_EPS).reshape(n_tok, n) \
                * T.ln[0] + T.ln[1]
        y = y.reshape(n_tok, n) + ((r64 * k64 * T.r_k.reshape(H, D)).sum(2, keepdims=True) * v64).reshape(n_tok, n)
        y = y.astype(np.float32)
        if T.g1 is not None:
            g = sigmoid(self._linear(mixed[:, 5], T.g1, None))
            y = y * self._linear(g, T.g2, None)
        return self._linear(y, T.wo, None)

    def _channel_mix(self, h: np.ndarray, F: ChannelMix) -> np.ndarray:
        """sigmoid(Wr xr) * Wv relu(Wk xk)^2 with xk, xr = h + (h_prev - h) lerp_k, lerp_r; RWKV 7's
        without the receptance gate."""
        dx = previous_rows(h) - h
        k = np.maximum(self._linear(h + dx * F.lerp_k, F.key, None), 0.0) ** 2
        if F.receptance is None:
            return self._linear(k, F.value, None)
        r = sigmoid(self._linear(h + dx * F.lerp_r, F.receptance, None))
        return r * self._linear(k, F.value, None)

    def _linear(self, x: np.ndarray, w: Tensor, b: np.ndarray | None) -> np.ndarray:
        y = x @ self.w(w).T
        return y if b is None else y + b

    def _decoder(self, tokens: np.ndarray) -> np.ndarray:
        """The decoder every family here is a variant of:
            x = embed(tokens) * embed_scale
            per layer: h = norm?(x) ; x += s * post_norm?(Wo attn(rope?(qk_norm?(Wq h + bq)), ...))
                       h = norm?(x) ; x += s * post_norm?(Wdown (act(Wgate h) * Wup h))
            logits = logit_scale * (Wout norm(x) + b?)
        (norm: RMSNorm, or LayerNorm with biases; s: the residual scale) with scores
        and logits soft-capped (c * tanh(s / c)) where the family says; '?' marks
        what only some families have. A parallel block (Phi-2) adds the attention
        and the FFN of one h; an ungated FFN is Wdown act(Wup h).
        Fused q/k/v and gate/up matrices are split by rows here."""
        a, hp = self.arch, self.arch.hp
        act = glu(a.glu)
        x = self._input_rows(tokens)
        if a.pos_embd is not None:   # learned positions (GPT-2)
            x = x + self.w(a.pos_embd)[np.arange(len(tokens))]
        if a.input_norm is not None:   # a LayerNorm of the embeddings (BLOOM)
            x = layernorm(x, *a.input_norm, hp.eps)
        for i, L in enumerate(a.layers):
            if i - 1 in a.loop_norms:   # between passes of a looped stack (Nanbeige)
                x = rmsnorm(x, a.out_norm, hp.eps)
            F = L.ffn
            router_x = x if isinstance(F, Moe) and F.router_on_input else None   # SmallThinker
            h = self._norm(x, L.attn_norm, L.attn_norm_b)
            if L.attn is None:   # a layer of its FFN alone (Nemotron-H)
                o = None
            elif isinstance(L.attn, ShortConv):
                o = self._short_conv(h, L.attn)
            elif isinstance(L.attn, Ssm):
                o = self._ssm(h, L.attn)
            elif isinstance(L.attn, Ssm1):
                o = self._ssm1(h, L.attn)
            elif isinstance(L.attn, DeltaNet):
                o = self._delta_net(h, L.attn)
            elif isinstance(L.attn, Mla):
                o = self._latent_attention(h, L.attn, i)
            else:
                o = self._attention(h, L.attn, i)
            if L.ssm is not None:   # a Mamba 2 mixer beside the attention (Falcon-H1)
                o = o + self._ssm(h, L.ssm)
            if o is not None and L.post_attn_norm is not None:
                o = rmsnorm(o, L.post_attn_norm, hp.eps)
            if not L.parallel:   # parallel: the FFN reads the attention's h, or its own norm of x
                if o is not None:
                    x = x + o * np.float32(a.residual_scale)
                h = self._norm(x, L.ffn_norm, L.ffn_norm_b)
            elif L.ffn_norm is not None:
                h = self._norm(x, L.ffn_norm, L.ffn_norm_b)
            if F is not None:   # else a layer of its mixer alone
                f = self._ffn(h, F, act, router_x)
                if L.post_ffn_norm is not None:
                    f = rmsnorm(f, L.post_ffn_norm, hp.eps)
                if L.parallel:
                    f = f + o
                x = x + f * np.float32(a.residual_scale)
            if i in self.control:   # a control vector steers the residual after the layer
                x = x + self.control[i]
            if i < a.deepstack and (tokens < 0).any():   # DeepStack: an image row's slice i + 1
                n, ds = hp.n_embd, np.zeros_like(x)
                ds[tokens < 0] = self._media[-1 - tokens[tokens < 0], (i + 1) * n:(i + 2) * n]
                x = x + ds
            self.layer_outputs[i] = x
        return x

    def _gemma4(self, tokens: np.ndarray) -> np.ndarray:
        """Gemma 4 (pyllm/arch/gemma4.py): per-layer head shapes, values normed without weights,
        the last layers attending over earlier layers' keys and values, per-layer inputs and
        scales:
            ple = (rmsnorm_per_layer(Wple x / sqrt(n_embd)) + embed_ple(tokens) sqrt(n_pl)) / sqrt(2)
            per layer: q = rope(qnorm(Wq h)), k = rope(knorm(Wk h)), v = rmsnorm(Wv h or Wk h)
                       x += post(Wo attn) ; x += post(ffn) ; x += post(Wproj (gelu(Wg x) * ple_i)) ; x *= s_i"""
        a, hp = self.arch, self.arch.hp
        eps = hp.eps
        act = glu(a.glu)
        x = self._input_rows(tokens)
        if a.n_per_layer:
            ple = self._per_layer_inputs(x, tokens)
        caches: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for i, L in enumerate(a.layers):
            h = rmsnorm(x, L.attn_norm, eps)
            x = x + rmsnorm(self._shared_kv_attention(h, i, caches), L.post_attn_norm, eps)
            f = self._ffn(rmsnorm(x, L.ffn_norm, eps), L.ffn, act)
            br = a.expert_branches[i]
            if br is not None:   # + the experts, routed by rmsnorm(x) * router_norm
                f = rmsnorm(f, br.dense_post_norm, eps) + rmsnorm(
                    self._moe(rmsnorm(x, br.pre_norm, eps), br.moe, act, rmsnorm(x, br.router_norm, eps)),
                    br.post_norm, eps)
            x = x + rmsnorm(f, L.post_ffn_norm, eps)
            pl = a.per_layer_input[i]
            if pl is not None:
                t = gelu_tanh(self._linear(x, pl.gate, None)) * ple[:, i]
                x = x + rmsnorm(self._linear(t, pl.proj, None), pl.post_norm, eps)
            x = x * np.float32(a.out_scale[i])
            if i in self.control:
                x = x + self.control[i]
            self.layer_outputs[i] = x
        return x

    def _per_layer_inputs(self, x: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Gemma 4's and 3n's per-layer inputs [T, n_layer, n_pl]:
            (rmsnorm_per_layer(Wple x / sqrt(n_embd)) + embed_ple(tokens) sqrt(n_pl)) / sqrt(2)
        (a media row's token: 0, the padding token, as llama.cpp takes it)"""
        a, hp, T, n = self.arch, self.arch.hp, len(tokens), self.arch.n_per_layer
        proj = (x @ self.w(a.ple_proj).T) * np.float32(1.0 / np.sqrt(hp.n_embd))
        proj = rmsnorm(proj.reshape(T, hp.n_layer, n), a.ple_proj_norm, hp.eps)
        tok = self.w(a.ple_embd)[np.maximum(tokens, 0)].reshape(T, hp.n_layer, n) * np.float32(np.sqrt(n))
        return (proj + tok) * np.float32(1.0 / np.sqrt(2.0))

    def _shared_kv_attention(self, h: np.ndarray, i: int, caches: dict) -> np.ndarray:
        """Gemma 4's and 3n's attention of layer i: q = rope(qnorm(Wq h)); with its own cache
        k = rope(knorm(Wk h)), v = rmsnorm(Wv h or Wk h) (kept in caches[i]), else the keys and
        values of the layer it shares; Wo attention(q, K, V)."""
        a, hp, T = self.arch, self.arch.hp, len(h)
        geo, A, r, pos = a.geometry[i], a.layers[i].attn, a.layer_rope(i), np.arange(len(h))
        H, Hkv, d = hp.n_head, geo.n_kv_head, geo.head_dim
        q = rmsnorm(self._linear(h, A.wq, None).reshape(T, H, d), A.q_norm, hp.eps)
        q = rope(q, pos, r.n_rot, r.base, True, r.scale, r.factors)
        if geo.kv_layer == i:
            k = self._linear(h, A.wk, None).reshape(T, Hkv, d)
            v = rmsnorm(k if A.wv is None else self._linear(h, A.wv, None).reshape(T, Hkv, d),
                        np.ones(d, np.float32), hp.eps)
            k = rope(rmsnorm(k, A.k_norm, hp.eps), pos, r.n_rot, r.base, True, r.scale, r.factors)
            _, k, v = self._cached(q, k, v)
            caches[i] = (k, v)
        k, v = caches[geo.kv_layer]
        if self.kv_quant:
            q = queries_as_attended(q, self.kv_quant, self.kv_rot[0])
        return self._linear(attention(q, k, v, a.layer_attn_scale(i), a.layer_window(i), spans=self._spans), A.wo,
                            None)

    def _gemma3n(self, tokens: np.ndarray) -> np.ndarray:
        """Gemma 3n (pyllm/arch/gemma3n.py): the residual as S streams x[:, j] (AltUp), each layer
        predicting them from stream 0's router values, running stream 0 through LAuReL, the
        attention (Gemma 4's) and a sparse-gated FFN, and correcting them by its output:
            r(v) = tanh(Wrouter rmsnorm(v) / n_embd)
            p_j = x_j + sum_k (Wpredict r(x_0))[j S + k] x_k ; h = rmsnorm(p_0)
            a = (p_0 + post(attn(h)) + h + rmsnorm(Wr Wl h)) / sqrt(2) ; o = a + post(ffn(a))
            c_j = p_j + (1 + Wcorrect r(o))_j (o - p_0)
            x_0 = c_0 ; x_j = c_j + rmsnorm(Wproj (gelu(Wgate (c_0 * s)) * ple_i)), j >= 1
        streams 1.. start as Wproj_j x_0 and end as Wunembd_j x_j, each rescaled to |x_0|; the
        output reads their mean."""
        a, hp = self.arch, self.arch.hp
        T, eps, S, n = len(tokens), hp.eps, a.n_streams, hp.n_embd

        def matched(y, x):   # y [T, m, n] rescaled to |x| [T, n] per token
            return y * (np.linalg.norm(x, axis=-1)[:, None, None] / np.linalg.norm(y, axis=-1, keepdims=True))

        def router(v, A):
            return np.tanh(self._linear(rmsnorm(v, A.router_norm, eps), A.router, None))

        x0 = self._token_rows(tokens) * np.float32(a.embed_scale)
        ple = self._per_layer_inputs(x0, tokens)
        proj = self.w(a.altup_proj).reshape(S - 1, n, n)
        x = np.concatenate([x0[:, None], matched(np.einsum("jon,tn->tjo", proj, x0), x0)], axis=1)
        caches: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for i, L in enumerate(a.layers):
            A, P = a.altup[i], a.per_layer_input[i]
            coef = self._linear(router(x[:, 0], A), A.predict, None).reshape(T, S, S)
            p = x + np.einsum("tjk,tkn->tjn", coef, x)
            h = rmsnorm(p[:, 0], L.attn_norm, eps)
            laurel = h + rmsnorm(self._linear(self._linear(h, A.laurel_l, None), A.laurel_r, None), A.laurel_norm, eps)
            att = p[:, 0] + rmsnorm(self._shared_kv_attention(h, i, caches), L.post_attn_norm, eps)
            act_in = (att + laurel) * np.float32(1.0 / np.sqrt(2.0))
            hf = rmsnorm(act_in, L.ffn_norm, eps)
            gate = self._linear(hf, L.ffn.w_gate, None)
            z = a.sparsity[i]
            if z is not None:   # keep what is above the mean + z std of a normal fit, shifted down
                cut = gate.mean(1, keepdims=True) + np.float32(z) * gate.std(1, ddof=1, keepdims=True)
                gate = np.maximum(gate - cut, 0)
            f = self._linear(gelu_tanh(gate) * self._linear(hf, L.ffn.w_up, None), L.ffn.w_down, None)
            o = act_in + rmsnorm(f, L.post_ffn_norm, eps)
            c = 1 + self._linear(router(o, A), A.correct, None)
            x = p + c[:, :, None] * (o - p[:, 0])[:, None]
            t = gelu_tanh(self._linear(x[:, 0] * A.correct_scale, P.gate, None)) * ple[:, i]
            x[:, 1:] += rmsnorm(self._linear(t, P.proj, None), P.post_norm, eps)[:, None]
        unembd = self.w(a.altup_unembd).reshape(S - 1, n, n)
        rest = matched(np.einsum("jon,tjn->tjo", unembd, x[:, 1:]), x[:, 0])
        return (x[:, 0] + rest.sum(1)) / np.float32(S)
