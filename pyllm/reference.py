"""The oracle: a slow, plain numpy float32 forward pass over dequantized weights.

No C, no quantized activations, no KV cache: the whole sequence at once, the
math as the papers and llama.cpp write it. Tests compare the C core against
it on every architecture and weight type. It shares only the hyperparameters
and tensor lookup of pyllm/arch, not the op program.
"""
from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from .arch.base import Architecture
from .model_file import Tensor


def dequant(t: Tensor) -> np.ndarray:
    """A weight matrix as float32 [rows, n_in]."""
    return dequantize(t.data, GGMLQuantizationType(t.type)).astype(np.float32).reshape(t.rows, t.shape[0])


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    return (x / np.sqrt(ms + eps)).astype(np.float32) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool,
         freq_scale: float = 1.0, factors: np.ndarray | None = None) -> np.ndarray:
    """Rotates the first n_rot dims of each head. x: [T, heads, head_dim].
    neox pairs dim i with i + n_rot/2; otherwise adjacent dims (2i, 2i+1)."""
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    if factors is not None:
        inv_freq = inv_freq / factors
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
              softcap: float = 0.0) -> np.ndarray:
    """Causal attention. q: [T, H, d], k/v: [T, Hkv, d] -> [T, H*d]."""
    T, H, d = q.shape
    group = H // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q.astype(np.float64), k.astype(np.float64)) * scale
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = j <= i
    if window > 0:
        allowed &= j > i - window
    scores = np.where(allowed[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v.astype(np.float64)).reshape(T, H * d).astype(np.float32)


class Reference:
    """Dequantizes an architecture's weights once, then runs whole sequences."""

    def __init__(self, arch: Architecture):
        self.arch = arch
        self._cache: dict[str, np.ndarray] = {}

    def w(self, t: Tensor) -> np.ndarray:
        if t.name not in self._cache:
            self._cache[t.name] = dequant(t)
        return self._cache[t.name]

    def forward(self, tokens) -> np.ndarray:
        """Logits [T, vocab] for every position of `tokens`, from an empty context."""
        name = self.arch.name
        if name == "llama":
            return self._llama(np.asarray(tokens, dtype=np.int64))
        raise NotImplementedError(f"no reference forward for {name}")

    def _llama(self, tokens: np.ndarray) -> np.ndarray:
        a, hp = self.arch, self.arch.hp
        T, H, Hkv, d = len(tokens), hp.n_head, hp.n_head_kv, hp.head_dim
        pos = np.arange(T)
        x = self.w(a.tok_embd)[tokens]
        for L in a.layers:
            h = rmsnorm(x, L.attn_norm, hp.eps)
            q = (h @ self.w(L.wq).T).reshape(T, H, d)
            k = (h @ self.w(L.wk).T).reshape(T, Hkv, d)
            v = (h @ self.w(L.wv).T).reshape(T, Hkv, d)
            q = rope(q, pos, hp.rope_dim, hp.rope_base, False, hp.rope_freq_scale, a.rope_freqs)
            k = rope(k, pos, hp.rope_dim, hp.rope_base, False, hp.rope_freq_scale, a.rope_freqs)
            x = x + attention(q, k, v, a.attn_scale, a.window) @ self.w(L.wo).T
            h = rmsnorm(x, L.ffn_norm, hp.eps)
            x = x + (silu(h @ self.w(L.w_gate).T) * (h @ self.w(L.w_up).T)) @ self.w(L.w_down).T
        return rmsnorm(x, a.out_norm, hp.eps) @ self.w(a.output).T
