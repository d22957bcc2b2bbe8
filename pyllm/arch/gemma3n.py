"""Gemma 3n (text: E2B, E4B): Gemma 4's attention and per-layer inputs (they began here) over
a residual carried as S = 4 streams (AltUp), with a low-rank branch beside the attention
(LAuReL) and a sparse FFN gate in the first layers.

    x_0 = embed(tokens) * sqrt(n_embd) ; x_j = match(Wproj_j x_0, x_0), j = 1..S-1
    ple = (rmsnorm_per_layer(Wple x_0 / sqrt(n_embd)) + embed_ple(tokens) * sqrt(n_pl)) / sqrt(2)
    for each layer i:
        r(v) = tanh(Wrouter rmsnorm(v) / n_embd)                     # S router values
        p_j = x_j + sum_k (Wpredict r(x_0))[j S + k] x_k             # predict every stream
        h = rmsnorm(p_0)
        l = h + rmsnorm(Wlaurel_r Wlaurel_l h)
        a = (p_0 + rmsnorm(Wo attention(h)) + l) / sqrt(2)           # Gemma 4's attention, scale 1
        g = Wgate rmsnorm(a) ; g = max(g - (mean g + z std g), 0) in sparse layers
        o = a + rmsnorm(Wdown (gelu_tanh(g) * Wup rmsnorm(a)))
        c_j = p_j + (1 + (Wcorrect r(o))[j]) (o - p_0)               # correct every stream
        x_0 = c_0 ; x_j = c_j + rmsnorm(Wproj (gelu_tanh(Wgate_pl (c_0 * s_i)) * ple_i)), j >= 1
    x = (x_0 + sum_j match(Wunembd_j x_j, x_0)) / S
    logits = cap * tanh(Wout rmsnorm(x) / cap)

match(y, x) rescales y to x's Euclidean norm, per token.

What decides what, as llama.cpp reads a gemma3n file:
- Layer i attends over a window of `attention.sliding_window` tokens unless it is global:
  `attention.sliding_window_pattern` (a flag per layer, or a period; default 5: every fifth
  layer, counting from 0, is global). Local layers use RoPE base `rope.freq_base_swa`
  (absent: the global base), global ones `rope.freq_base`. RoPE rotates NEOX halves.
- The last layers keep no cache: from layer 20 on (llama.cpp fixes 20; pyllm reads
  block_count - `attention.shared_kv_layers`, which is 20 on both released sizes), a local
  layer reads layer 18's keys and values, a global one layer 19's.
- z is the normal quantile of `activation_sparsity_scale` per layer (0.95 in layers 0-9 of
  the released files, z = 1.6449; llama.cpp fixes those); std divides by n - 1.
- S = `altup.num_inputs` (4), with the active stream `altup.active_idx` 0 (llama.cpp's
  only); the LAuReL rank and the per-layer input width come from the tensors.
- The final soft-cap is `final_logit_softcapping` (absent: 30); the norms' weights are
  used as stored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional

import numpy as np

from ..errors import ModelFileError, UnsupportedModelError
from ..graph import GLU_GELU_TANH, GLU_TANH, Graph, View
from ..model_file import Tensor
from ..units import fmt_layers
from .base import Architecture, Layer, Rope, sliding_layers
from .blocks import output_head
from .gemma4 import Gemma4, Geometry

SWA_PERIOD = 5
OWN_KV_LAYERS = 20             # llama.cpp's n_layer_kv_from_start, when the file does not say
SPARSE_LAYERS, SPARSITY = 10, 0.95   # llama.cpp's fixed activation sparsity
FINAL_SOFTCAP = 30.0


@dataclass
class AltUpLayer:
    """A layer's AltUp and LAuReL weights: the router (its norm divided by n_embd already),
    the prediction and correction coefficients, the correction's scale before the per-layer
    input, and the low-rank branch."""
    router: Tensor              # n_embd -> S
    router_norm: np.ndarray
    predict: Tensor             # S -> S * S
    correct: Tensor             # S -> S
    correct_scale: np.ndarray
    laurel_l: Tensor            # n_embd -> rank
    laurel_r: Tensor            # rank -> n_embd
    laurel_norm: np.ndarray


class Gemma3n(Gemma4):
    """Gemma 4's attention() and per_layer_inputs() are used as they are; the layers, the
    streams and the forward step are this family's own."""
    name = "gemma3n"
    experts = False

    def __init__(self, mf, n_ctx=None):
        Architecture.__init__(self, mf, n_ctx)   # not Gemma 4's: its layer shapes come from other keys
        hp = self.hp
        self.read_ends()
        self.final_softcap = float(mf.arch_get("final_logit_softcapping", FINAL_SOFTCAP) or 0.0)
        self.window, self.is_swa = sliding_layers(mf, hp.n_layer, SWA_PERIOD)
        self.swa_rope_base = float(mf.arch_get("rope.freq_base_swa", hp.rope_base))
        if self.swa_rope_base <= 0:
            raise ModelFileError(f"{mf.path}: rope.freq_base_swa = {self.swa_rope_base} is not positive")
        if int(mf.arch_get("altup.active_idx", 0)) != 0:
            raise UnsupportedModelError(f"{mf.path}: gemma3n with AltUp's active stream other than 0 is not "
                                        f"supported (llama.cpp fixes it at 0)")
        self.n_streams = S = int(mf.arch_get("altup.num_inputs", 4))
        if not 2 <= S <= 16:
            raise ModelFileError(f"{mf.path}: altup.num_inputs = {S}; the file is corrupt")

        self.read_geometry(int(mf.arch_get("attention.shared_kv_layers", max(0, hp.n_layer - OWN_KV_LAYERS)) or 0))
        self.sparsity = self.read_sparsity()

        ple_embd = mf.tensor("per_layer_token_embd.weight")
        self.n_per_layer = n_pl = ple_embd.shape[0] // hp.n_layer
        if n_pl <= 0 or n_pl * hp.n_layer != ple_embd.shape[0]:
            raise ModelFileError(f"{mf.path}: per_layer_token_embd rows of {ple_embd.shape[0]} are not "
                                 f"{hp.n_layer} layers' inputs; the file is corrupt")
        self.ple_embd = self.weight("per_layer_token_embd.weight", n_pl * hp.n_layer, hp.n_vocab)
        self.ple_proj = self.weight("per_layer_model_proj.weight", hp.n_embd, n_pl * hp.n_layer)
        self.ple_proj_norm = self.vector("per_layer_proj_norm.weight", n_pl)
        self.altup_proj = self.expert_weights("altup_proj.weight", hp.n_embd, hp.n_embd, S - 1)
        self.altup_unembd = self.expert_weights("altup_unembd_proj.weight", hp.n_embd, hp.n_embd, S - 1)
        self.laurel_rank = mf.tensor("blk.0.laurel_l.weight").shape[-1]

        self.layers = [self.layer(i) for i in range(hp.n_layer)]
        self.altup = [self.altup_weights(i) for i in range(hp.n_layer)]
        self.per_layer_input = [self.per_layer_weights(i) for i in range(hp.n_layer)]
        self.expert_branches = [None] * hp.n_layer
        self.out_scale = [1.0] * hp.n_layer
        # the prediction adds each stream to its own mix (p_j = x_j + ...), the correction
        # multiplies by 1 + its coefficients: both as biases of the coefficient matmuls
        self.predict_bias = np.eye(S, dtype=np.float32).reshape(-1)
        self.correct_bias = np.ones(S, np.float32)

    # -- tensors -----------------------------------------------------------------------
    def layer_geometry(self, i: int) -> Geometry:
        hp = self.hp
        source = i if i < self.n_own_kv else self.n_own_kv - (2 if self.is_swa[i] else 1)
        return Geometry(hp.head_dim, hp.kv_heads[i] if hp.kv_heads else hp.n_head_kv, source)

    def layer(self, i: int) -> Layer:
        if self.geometry[i].kv_layer == i and not self.mf.has_tensor(f"blk.{i}.attn_v.weight"):
            raise ModelFileError(f"{self.mf.path}: tensor blk.{i}.attn_v.weight is missing; the file is corrupt "
                                 f"or truncated")
        return super().layer(i)

    def altup_weights(self, i: int) -> AltUpLayer:
        hp, p, S, rank = self.hp, f"blk.{i}.", self.n_streams, self.laurel_rank
        return AltUpLayer(router=self.weight(p + "altup_router.weight", hp.n_embd, S),
                          router_norm=self.vector(p + "altup_router_norm.weight", hp.n_embd) / np.float32(hp.n_embd),
                          predict=self.weight(p + "altup_predict_coef.weight", S, S * S),
                          correct=self.weight(p + "altup_correct_coef.weight", S, S),
                          correct_scale=self.vector(p + "altup_correct_scale.weight", hp.n_embd),
                          laurel_l=self.weight(p + "laurel_l.weight", hp.n_embd, rank),
                          laurel_r=self.weight(p + "laurel_r.weight", rank, hp.n_embd),
                          laurel_norm=self.vector(p + "laurel_post_norm.weight", hp.n_embd))

    def read_sparsity(self) -> list[Optional[float]]:
        """Each layer's z (the FFN gate keeps what is above mean + z std), or None: dense."""
        hp = self.hp
        shares = self.mf.arch_get("activation_sparsity_scale")
        if shares is None:
            shares = [SPARSITY if i < SPARSE_LAYERS else 0.0 for i in range(hp.n_layer)]
        shares = [float(p) for p in np.atleast_1d(shares)]
        if len(shares) != hp.n_layer or not all(0.0 <= p < 1.0 for p in shares):
            raise ModelFileError(f"{self.mf.path}: activation_sparsity_scale {shares} is not a share in [0, 1) "
                                 f"per layer; the file is corrupt")
        return [NormalDist().inv_cdf(p) if p > 0 else None for p in shares]

    # -- per-layer settings ----------------------------------------------------------
    def layer_rope(self, i: int) -> Rope:
        hp = self.hp
        return Rope(self.rope_mode, hp.rope_dim, self.swa_rope_base if self.is_swa[i] else hp.rope_base,
                    hp.rope_freq_scale)

    def block_notes(self) -> str:
        notes = f"; the residual as {self.n_streams} AltUp streams; LAuReL rank {self.laurel_rank}"
        notes += self.shared_kv_note()
        sparse = [i for i, z in enumerate(self.sparsity) if z is not None]
        if sparse:
            notes += f"; layers {fmt_layers(sparse)}: FFN gate above mean + {self.sparsity[sparse[0]]:.3f} std"
        return notes + f"; per-layer inputs of {self.n_per_layer}"

    # -- the forward step --------------------------------------------------------------
    def build(self, g: Graph) -> None:
        eps, n, S = self.hp.eps, self.hp.n_embd, self.n_streams
        xs = g.buffer("streams_a", S * n)
        x0, rest = xs.cols(0, n), xs.cols(n, (S - 1) * n)
        g.embed(self.tok_embd, x0, scale=self.embed_scale)
        ple = self.per_layer_inputs(g, x0)
        g.linear_heads(x0, self.altup_proj, rest, shared_input=True)
        g.match_norm(rest, x0)
        spare = g.buffer("streams_b", S * n)
        for i, L in enumerate(self.layers):
            g.layer = i
            A, P = self.altup[i], self.per_layer_input[i]
            pred = g.mix(xs, self.coefficients(g, xs.cols(0, n), A, A.predict, self.predict_bias), n, spare)
            p0 = pred.cols(0, n)
            h = g.rmsnorm(p0, L.attn_norm, eps, "h")
            lr = g.linear(g.linear(h, A.laurel_l, "laurel_l"), A.laurel_r, "laurel")
            g.add(h, g.rmsnorm(lr, A.laurel_norm, eps, lr))
            a = self.attention(g, h, i)
            g.rmsnorm(a, L.post_attn_norm, eps, a)
            g.add(p0, a)
            g.scale(g.add(lr, a), 1.0 / math.sqrt(2.0))
            o = self.ffn(g, a, L, i)
            g.add(a, g.rmsnorm(o, L.post_ffn_norm, eps, o))
            coefs = self.coefficients(g, o, A, A.correct, self.correct_bias)
            g.mix(g.add(p0, o, -1.0), coefs, n, pred, accumulate=True)   # o - p_0: the innovation
            first = g.scale(g.copy(p0, g.buffer("first", n), n, 1, 0, 0), 1.0, columns=A.correct_scale)
            t = g.glu(g.linear(first, P.gate, "pl_gate"), ple.cols(i * self.n_per_layer, self.n_per_layer),
                      GLU_GELU_TANH, "pl_gate")
            u = g.linear(t, P.proj, "pl_out")
            g.rmsnorm(u, P.post_norm, eps, u)
            for j in range(1, S):
                g.add(u, pred.cols(j * n, n))
            xs, spare = pred, xs
        x0, rest = xs.cols(0, n), xs.cols(n, (S - 1) * n)
        merged = g.match_norm(g.linear_heads(rest, self.altup_unembd, "unembd"), x0)
        for j in range(S - 1):
            g.add(merged.cols(j * n, n), x0)
        output_head(g, self, g.scale(x0, 1.0 / S))

    def coefficients(self, g: Graph, v: View, A: AltUpLayer, w: Tensor, bias: np.ndarray) -> View:
        """w tanh(Wrouter rmsnorm(v) / n_embd) + bias: the prediction's S x S matrix or the
        correction's S factors for each token"""
        r = g.linear(g.rmsnorm(v, A.router_norm, self.hp.eps, "router_in"), A.router, "router")
        return g.linear(g.act(r, GLU_TANH, r), w, f"coefs{w.shape[1]}", bias=bias)

    def ffn(self, g: Graph, a: View, L: Layer, i: int) -> View:
        """Wdown (gelu_tanh(sparse(Wgate h)) * Wup h), h = rmsnorm(a)"""
        F, names = L.ffn, f"ff{self.hp.layer_ff(i)}_"
        h = g.rmsnorm(a, L.ffn_norm, self.hp.eps, "h")
        gate, up = g.linear(h, F.w_gate, names + "gate"), g.linear(h, F.w_up, names + "up")
        if self.sparsity[i] is not None:
            g.sparsify(gate, self.sparsity[i], gate)
        return g.linear(g.glu(gate, up, GLU_GELU_TANH, names + "ffn"), F.w_down, "ffn_out")
