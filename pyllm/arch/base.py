"""What every architecture shares: reading hyperparameters, checking tensors.

An architecture file subclasses `Architecture`, reads its hyperparameters in
`__init__` (through `HParams.read` and its own extras) and describes its
forward step in `build(graph)`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Optional

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from ..errors import ModelFileError, UnsupportedModelError
from ..graph import GLU_SILU, MOE_SIGMOID, MOE_SOFTMAX, NORM_LAYER, NORM_RMS, ROPE_NORM, SUPPORTED_WEIGHT_TYPES, Graph
from ..model_file import ModelFile, Tensor, type_name


# RoPE scaling types every family runs; a family adds its own (Phi-3: longrope)
ROPE_SCALINGS = ("none", "linear", "yarn")


def yarn_divisors(n_rot: int, base: float, freq_scale: float, orig_ctx: int, beta_fast: float,
                  beta_slow: float, ext_factor: float) -> np.ndarray:
    """YaRN's frequencies as per-pair divisors of base^(-2i/n_rot), as ggml's rope
    computes them: a pair that turns more than beta_fast times over the original
    context keeps its frequency, one that turns fewer than beta_slow times is
    interpolated (times freq_scale), with a linear ramp between the two."""
    def pair_turning(n_turns: float) -> float:   # the pair index that turns n_turns times in orig_ctx
        return n_rot * math.log(orig_ctx / (n_turns * 2 * math.pi)) / (2 * math.log(base))
    low = max(0.0, math.floor(pair_turning(beta_fast)))
    high = min(n_rot - 1.0, math.ceil(pair_turning(beta_slow)))
    keep = 1.0 - np.clip((np.arange(n_rot // 2) - low) / max(0.001, high - low), 0.0, 1.0)
    mix = keep * ext_factor
    return (1.0 / (freq_scale * (1.0 - mix) + mix)).astype(np.float32)


@dataclass
class HParams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    eps: float
    n_ctx_train: int
    rope_base: float
    rope_dim: int
    rope_freq_scale: float
    rope_scaling: str = "none"
    rope_attn_factor: float = 1.0   # multiplies cos and sin (so q.k by its square): rope.scaling.attn_factor,
                                    # times YaRN's 1 + 0.1 ln(factor)
    rope_yarn: Optional[np.ndarray] = None   # YaRN: per-pair divisors, which replace rope_freq_scale
    kv_heads: Optional[list] = None          # per layer, where the file gives a list (0: no attention, LFM2)
    heads: Optional[list] = None             # query heads per layer, where the file gives a list (OpenELM)
    ff_widths: Optional[list] = None         # per layer, where the file gives a list (0: no FFN, Nemotron-H)

    @classmethod
    def read(cls, mf: ModelFile, rope_scalings: tuple = ROPE_SCALINGS, layer_norm: bool = False,
             experts: bool = False, kv_per_layer: bool | str = False, own_head_dims: bool = False) -> "HParams":
        """layer_norm: the family normalizes with LayerNorm, whose epsilon is
        under attention.layer_norm_epsilon (RMSNorm's: layer_norm_rms_epsilon).
        experts: the family runs mixture-of-experts files (expert_count > 0).
        kv_per_layer: attention.head_count_kv may be a list, one count per layer,
        0 for a layer without attention (LFM2's convolution layers), and so may
        feed_forward_length (0: a layer without FFN; n_ff is then the widest); "mixed": the
        layers' counts may differ (Gemma 4's global layers; n_head_kv is then the largest).
        own_head_dims: the family reads its key and value head sizes itself (MLA: they
        differ, and the file's key_length is the latent's); head_dim is key_length here."""
        n_embd = int(mf.arch_require("embedding_length"))
        hc = mf.arch_require("attention.head_count")
        heads = [int(v) for v in hc] if isinstance(hc, (list, np.ndarray)) else None
        if heads is not None:   # query heads per layer (OpenELM): a "mixed" family only
            if kv_per_layer != "mixed":
                raise UnsupportedModelError(f"{mf.path}: {mf.architecture} with query heads per layer "
                                            f"({sorted(set(heads))}) is not supported")
            if len(heads) != int(mf.arch_require("block_count")) or min(heads, default=0) <= 0:
                raise ModelFileError(f"{mf.path}: head_count has {len(heads)} entries for "
                                     f"{mf.arch_require('block_count')} layers, or a layer without heads; "
                                     f"the file is corrupt")
        n_head = max(heads) if heads else int(hc)
        kv = mf.arch_get("attention.head_count_kv", hc)
        kv_heads = [int(v) for v in kv] if isinstance(kv, (list, np.ndarray)) else None
        if kv_heads is not None:
            n_layer = int(mf.arch_require("block_count"))
            used = set(kv_heads) - {0}
            if not kv_per_layer or (len(used) > 1 and kv_per_layer != "mixed"):
                raise UnsupportedModelError(f"{mf.path}: {mf.architecture} with key/value heads per layer "
                                            f"({sorted(set(kv_heads))}) is not supported")
            if len(kv_heads) != n_layer or not used or min(kv_heads) < 0:
                raise ModelFileError(f"{mf.path}: head_count_kv has {len(kv_heads)} entries for {n_layer} "
                                     f"layers, or no layer with attention; the file is corrupt")
        n_head_kv = max(kv_heads) if kv_heads else int(kv)
        ff = mf.arch_require("feed_forward_length")
        ff_widths = [int(v) for v in ff] if isinstance(ff, (list, np.ndarray)) else None
        if ff_widths is not None:
            n_layer = int(mf.arch_require("block_count"))
            if not kv_per_layer:
                raise UnsupportedModelError(f"{mf.path}: {mf.architecture} with FFN widths per layer is not supported")
            if len(ff_widths) != n_layer or min(ff_widths, default=-1) < 0:
                raise ModelFileError(f"{mf.path}: feed_forward_length has {len(ff_widths)} entries for {n_layer} "
                                     f"layers; the file is corrupt")
        for nq, nk in zip(heads or [], kv_heads or [n_head_kv] * len(heads or [])):
            if nk and nq % nk:
                raise ModelFileError(f"{mf.path}: {nq} attention heads cannot share {nk} key/value heads")
        if n_head <= 0 or n_head_kv <= 0 or (not heads and n_head % n_head_kv):
            raise ModelFileError(f"{mf.path}: {n_head} attention heads cannot share {n_head_kv} key/value heads")
        head_dim = int(mf.arch_get("attention.key_length", n_embd // n_head))
        v_dim = int(mf.arch_get("attention.value_length", head_dim))
        if v_dim != head_dim and not own_head_dims:
            raise UnsupportedModelError(f"{mf.path}: key heads of {head_dim} and value heads of {v_dim} "
                                        f"differ; pyllm runs equal key and value head sizes only")
        tokens = mf.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens) if tokens is not None else int(mf.arch_require("vocab_size"))
        # as llama.cpp: a missing scaling type means linear, with the factor under
        # rope.scaling.factor (or the older rope.scale_linear); no factor, no scaling
        scaling = str(mf.arch_get("rope.scaling.type", "linear"))
        factor = float(mf.arch_get("rope.scaling.factor", mf.arch_get("rope.scale_linear", 0.0)) or 0.0)
        freq_scale = 1.0
        if scaling not in rope_scalings and scaling != "linear":
            raise UnsupportedModelError(f"{mf.path}: RoPE scaling {scaling!r} is not supported for "
                                        f"{mf.architecture} (supported: {', '.join(rope_scalings)})")
        if scaling in ("linear", "yarn"):   # a factor of 1 (or none) scales nothing
            freq_scale = 1.0 / factor if factor > 0 else 1.0
            scaling = scaling if freq_scale != 1.0 else "none"
        attn_factor = float(mf.arch_get("rope.scaling.attn_factor", 1.0) or 1.0)
        hp = cls(
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_layer=int(mf.arch_require("block_count")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=max(ff_widths) if ff_widths else int(ff),
            eps=float(mf.arch_get("attention.layer_norm_epsilon" if layer_norm else
                                  "attention.layer_norm_rms_epsilon", 1e-5)),
            n_ctx_train=int(mf.arch_get("context_length", 2048)),
            rope_base=float(mf.arch_get("rope.freq_base", 10000.0)),
            rope_dim=int(mf.arch_get("rope.dimension_count", head_dim)),
            rope_freq_scale=freq_scale,
            rope_scaling=scaling,
            rope_attn_factor=attn_factor,
            kv_heads=kv_heads,
            heads=heads,
            ff_widths=ff_widths,
        )
        if scaling == "yarn":
            hp.read_yarn(mf)
        for name in ("n_embd", "n_layer", "n_ff", "head_dim", "n_vocab", "rope_dim", "rope_base"):
            if getattr(hp, name) <= 0:
                raise ModelFileError(f"{mf.path}: hyperparameter {name} = {getattr(hp, name)} is not positive")
        if hp.eps < 0:
            raise ModelFileError(f"{mf.path}: the norm epsilon {hp.eps} is negative; the file is corrupt")
        n_experts = int(mf.arch_get("expert_count", 0))
        if n_experts > 0 and not experts:
            raise UnsupportedModelError(f"{mf.path}: {mf.architecture} with experts ({mf.architecture}.expert_count "
                                        f"= {n_experts}) is not supported; pyllm runs {mf.architecture} files "
                                        f"without experts")
        if hp.n_layer > len(mf.tensors):  # every layer has tensors: a larger count is corrupt
            raise ModelFileError(f"{mf.path}: block_count {hp.n_layer} is more than the file's "
                                 f"{len(mf.tensors)} tensors; the file is corrupt")
        if (hp.head_dim > 512 and not own_head_dims) or hp.rope_dim > hp.head_dim or hp.rope_dim % 2:
            raise UnsupportedModelError(f"{mf.path}: head size {hp.head_dim} with {hp.rope_dim} rotated "
                                        f"dims is not supported (head size at most 512)")
        if hp.rope_attn_factor != 1.0 and hp.rope_dim != hp.head_dim and not own_head_dims:
            raise UnsupportedModelError(f"{mf.path}: a RoPE attention factor with partial rotation "
                                        f"({hp.rope_dim} of {hp.head_dim} dims) is not supported")
        return hp

    def read_yarn(self, mf: ModelFile) -> None:
        """YaRN as llama.cpp runs it: the per-pair frequencies of yarn_divisors,
        and cos and sin times m(1) / m(rope.scaling.yarn_log_multiplier) with
        m(a) = 1 + 0.1 a ln(factor), m(0) = 1 (HF's mscale / mscale_all_dim: with
        no multiplier, 1 + 0.1 ln(factor); with 1, nothing)."""
        orig_ctx = int(mf.arch_get("rope.scaling.original_context_length", 0) or self.n_ctx_train)
        ext_factor = float(mf.arch_get("rope.scaling.yarn_ext_factor", -1.0))
        ext_factor = 1.0 if ext_factor < 0 else ext_factor    # negative: not set
        beta_fast = float(mf.arch_get("rope.scaling.yarn_beta_fast", 32.0))
        beta_slow = float(mf.arch_get("rope.scaling.yarn_beta_slow", 1.0))
        if orig_ctx <= 0 or beta_fast <= 0 or beta_slow <= 0:
            raise ModelFileError(f"{mf.path}: YaRN needs a positive original context and betas "
                                 f"(got {orig_ctx}, {beta_fast}, {beta_slow}); the file is corrupt")
        self.rope_yarn = yarn_divisors(self.rope_dim, self.rope_base, self.rope_freq_scale, orig_ctx,
                                       beta_fast, beta_slow, ext_factor)
        if ext_factor != 0.0:
            log_mul = float(mf.arch_get("rope.scaling.yarn_log_multiplier", 0.0) or 0.0)

            def mscale(a: float) -> float:
                return 1.0 + 0.1 * a * math.log(1.0 / self.rope_freq_scale)
            self.rope_attn_factor *= mscale(1.0) / (mscale(log_mul) if log_mul else 1.0)

    def layer_ff(self, i: int) -> int:
        """Layer i's FFN width (0: the layer has none)."""
        return self.ff_widths[i] if self.ff_widths else self.n_ff

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim


@dataclass(frozen=True)
class Rope:
    """How one layer rotates q and k: theta_i = pos * scale * base^(-2i/n_rot) / factors[i].
    n_rot = 0: the layer does not rotate at all (NoPE layers: SmolLM3)."""
    mode: int
    n_rot: int
    base: float
    scale: float = 1.0
    factors: Optional[np.ndarray] = None
    sections: tuple = ()      # M-RoPE (Qwen VL): pairs turned by (time, height, width) positions
    interleaved: bool = False  # the sections' pairs interleaved (Qwen 3 VL), not one after another

    def off(self) -> "Rope":
        """The same layer without rotation (a NoPE layer)."""
        return Rope(self.mode, 0, self.base)


class MRope:
    """M-RoPE (a mixin of the Qwen VL families): each section of a head's pairs turns by its own
    position, time, height or width. A text token has the same one in all three, so its rotation
    is plain RoPE's; an image's rows take (start, start + row, start + column) (the engine's rope
    positions, Engine.mrope). The sections follow one another, or (interleaved, Qwen 3 VL) take
    pairs i % 3 == 0, 1, 2 in turn."""
    mrope_interleaved = False
    mrope_required = True    # else a file without sections reads text alone (M-RoPE off)

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        return replace(r, sections=self.rope_sections, interleaved=self.mrope_interleaved) if r.n_rot else r

    @cached_property
    def rope_sections(self) -> tuple:
        """The pairs of each head turned by the time, height and width positions (the file's
        rope.dimension_sections, read once; a 4th section, unused by the language model, is ignored)."""
        got = self.mf.arch_get("rope.dimension_sections", None)
        if got is None and not self.mrope_required:
            return ()
        try:
            sections = tuple(int(v) for v in got)[:3]
        except (TypeError, ValueError):
            sections = ()
        if len(sections) != 3 or min(sections) < 0 or sum(sections) > self.hp.rope_dim // 2:
            raise ModelFileError(f"{self.mf.path}: rope.dimension_sections is {got!r}, not three sections within "
                                 f"{self.hp.rope_dim // 2} pairs; the file is corrupt")
        return sections


def sliding_layers(mf: ModelFile, n_layer: int, period: int) -> tuple[int, list[bool]]:
    """(window, which layers use it) from attention.sliding_window and
    attention.sliding_window_pattern, as llama.cpp reads them: the pattern is a
    flag per layer, or a period n (default `period`) whose last layer of each n
    is global; no window (or 0): no layer is windowed."""
    window = int(mf.arch_get("attention.sliding_window", 0) or 0)
    pattern = mf.arch_get("attention.sliding_window_pattern", period)
    if window <= 0:
        return window, [False] * n_layer
    if isinstance(pattern, (list, np.ndarray)):
        if len(pattern) != n_layer:
            raise ModelFileError(f"{mf.path}: sliding_window_pattern has {len(pattern)} flags for "
                                 f"{n_layer} layers")
        return window, [bool(f) for f in pattern]
    n = int(pattern)
    return window, [n == 0 or i % n < n - 1 for i in range(n_layer)]


GATING_SOFTMAX, GATING_SIGMOID = 1, 2   # expert_gating_func in the file


class LongRope:
    """LongRoPE (a mixin: Phi-3's 128k files, MiniCPM 4): the file carries two sets of per-pair
    frequency divisors, `rope_factors_short` and `rope_factors_long`. As llama.cpp, rope_freqs
    win where the file has them; else the long factors when the context the model runs with
    (self.n_ctx) exceeds `rope.scaling.original_context_length` (the trained context when
    absent), the short ones otherwise or when the context is not known. The choice is made
    once per graph, so every key in the cache was rotated the same way."""
    rope_scalings = ROPE_SCALINGS + ("longrope",)
    mf: ModelFile
    hp: HParams

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.n_ctx_orig = int(mf.arch_get("rope.scaling.original_context_length", hp.n_ctx_train))
        self.rope_factors_short = self.optional_vector("rope_factors_short.weight", hp.rope_dim // 2)
        self.rope_factors_long = self.optional_vector("rope_factors_long.weight", hp.rope_dim // 2)

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        if self.rope_freqs is not None or not r.n_rot:
            return r
        long = self.n_ctx is not None and self.n_ctx > self.n_ctx_orig
        return replace(r, factors=self.rope_factors_long if long else self.rope_factors_short)


class SharedExpertsMoe:
    """Mixin: DeepSeek's mixture of experts, which GLM-4.5 shares: dense FFNs in the first
    `leading_dense_block_count` layers, experts after; each expert expert_feed_forward_length
    wide; expert_shared_count shared experts, run as one FFN that many widths wide; the
    gating (expert_gating_func: softmax or sigmoids, else default_gating()), renormalization
    (expert_weights_norm) and scale (expert_weights_scale) as the file says; exp_probs_b
    chooses where present."""
    mf: ModelFile
    hp: HParams

    def default_gating(self) -> int:
        return GATING_SOFTMAX

    def experts_of(self, i: int) -> Optional[Moe]:
        """Layer i's experts with the file's gating, or None in the leading dense layers."""
        m = self.moe_weights(i)
        if m is not None:
            mf = self.mf
            func = int(mf.arch_get("expert_gating_func", 0) or self.default_gating())
            if func not in (GATING_SOFTMAX, GATING_SIGMOID):
                raise UnsupportedModelError(f"{mf.path}: expert gating function {func} is not supported")
            m.gating = MOE_SIGMOID if func == GATING_SIGMOID else MOE_SOFTMAX
            m.norm = bool(mf.arch_get("expert_weights_norm", False))
            m.scale = float(mf.arch_get("expert_weights_scale", 1.0) or 1.0)
            m.groups = self.expert_groups(m)
        return m

    def expert_groups(self, m: Moe) -> tuple[int, int]:
        """(expert_group_count, expert_group_used_count) where the file limits the choice to
        groups, else (0, 0); checked against the experts."""
        mf = self.mf
        n = int(mf.arch_get("expert_group_count", 0) or 0)
        if n <= 1:
            return (0, 0)
        used = int(mf.arch_get("expert_group_used_count", 0) or 0)
        if n > 64 or m.n_experts % n or not 0 < used <= n or used * (m.n_experts // n) < m.k:
            raise ModelFileError(f"{mf.path}: {m.k} of {m.n_experts} experts from {used} of {n} expert groups "
                                 f"(at most 64 groups); the file is corrupt or not supported")
        return (n, used)

    def moe_layer(self, i: int) -> bool:
        return i >= int(self.mf.arch_get("leading_dense_block_count", 0) or 0)

    def expert_width(self, k: int) -> int:
        return int(self.mf.arch_require("expert_feed_forward_length"))

    def shared_width(self) -> int:
        """One shared expert's width: an expert's (BailingMoE 2 may give its own)."""
        return self.expert_width(0)

    def shared_expert(self, i: int) -> Optional[Ffn]:
        mf = self.mf
        n_shared = int(mf.arch_get("expert_shared_count", 0) or 0)
        if n_shared <= 0:
            return None
        return self.shared_ffn(i, n_shared * self.shared_width())


class LocalGlobalLayers:
    """Mixin: 3 of every 4 layers attend over `self.window` tokens with RoPE;
    every 4th (i % 4 == 3) over the whole context without RoPE (Command R7B,
    EXAONE 4 32B). No window: every layer global, with RoPE."""
    PERIOD = 4
    window: int

    def is_global(self, i: int) -> bool:
        return self.window > 0 and i % self.PERIOD == self.PERIOD - 1

    def layer_window(self, i: int) -> int:
        return 0 if self.is_global(i) else self.window

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        return r.off() if self.is_global(i) else r


@dataclass
class Attn:
    """One layer's attention weights. Either wq/wk/wv or one fused wqkv whose
    output rows are [q | k | v]; biases, q/k norms and the output bias are
    optional. A q/k norm weight of head_dim is shared by the heads (Qwen 3,
    Gemma 3); one as wide as q (k) normalizes all of q (k) at once (OLMo 2)."""
    wo: Tensor
    wq: Optional[Tensor] = None
    wk: Optional[Tensor] = None
    wv: Optional[Tensor] = None
    wqkv: Optional[Tensor] = None
    bq: Optional[np.ndarray] = None
    bk: Optional[np.ndarray] = None
    bv: Optional[np.ndarray] = None
    bqkv: Optional[np.ndarray] = None
    bo: Optional[np.ndarray] = None
    q_norm: Optional[np.ndarray] = None
    k_norm: Optional[np.ndarray] = None
    sinks: Optional[np.ndarray] = None    # one logit per head that joins its softmax with no value (gpt-oss)
    gate: Optional[Tensor] = None         # the output gate: Wo (attention * sigmoid(Wgate h)) (AFMoE)
    q_gated: bool = False                 # wq's rows are [q_h | gate_h] per head, the gate as above (Qwen3.5)
    n_head: int = 0                       # this layer's query and key/value heads where they differ by
    n_kv_head: int = 0                    #   layer (OpenELM); 0: the family's

    def heads(self, hp: "HParams") -> tuple[int, int]:
        """(query heads, key/value heads) of this layer."""
        return self.n_head or hp.n_head, self.n_kv_head or hp.n_head_kv


@dataclass
class ShortConv:
    """A layer's short convolution in place of attention (LFM2):
    [b | c | x] = in_proj h ; y = c * conv(b * x) ; out = out_proj y, where conv
    is causal and depthwise over positions: conv[:, j] weighs position p - L + 1 + j."""
    in_proj: Tensor
    conv: np.ndarray          # [n_embd, L] float32
    out_proj: Tensor


@dataclass
class Ssm1:
    """A layer's Mamba 1 mixer (Mamba, Falcon Mamba): [x | z] = in_proj h ; x = silu(conv(x) +
    conv_bias) ; [dt | B | C] = x_proj x (dt_rank, d_state, d_state; each RMS-normed where the
    layer has norms: Jamba, Falcon Mamba's of ones) ; dt = dt_proj dt ; y = scan(x, dt + dt_bias, A, B, C) + D x ;
    out = out_proj (y * silu(z)). Every channel is its own head of one value, with a decay
    per state: s = s exp(dt A) + dt x B ; y = s . C."""
    in_proj: Tensor                   # n_embd -> 2 d_inner
    conv: np.ndarray                  # [d_inner, d_conv] float32
    conv_bias: np.ndarray
    x_proj: Tensor                    # d_inner -> dt_rank + 2 d_state
    dt_proj: Tensor                   # dt_rank -> d_inner
    dt_bias: np.ndarray               # [d_inner]
    a: np.ndarray                     # [d_inner, d_state]: A, the (negative) decay rates
    d: np.ndarray                     # [d_inner]: D, the skip
    out_proj: Tensor
    dt_rank: int
    d_state: int
    norms: Optional[tuple] = None     # RMSNorm weights of dt, B and C (Jamba; ones: Falcon Mamba), or None

    @property
    def d_inner(self) -> int:
        return self.d.shape[0]


@dataclass
class Ssm:
    """A layer's Mamba 2 mixer in place of attention (Granite 4.0-H, Nemotron-H):
    [z | xBC | dt] = in_proj h ; xBC = silu(conv(xBC) + conv_bias), conv causal and
    depthwise over positions ; [x | B | C] = xBC ; y = scan(x, dt + dt_bias, A, B, C) + D x ;
    out = out_proj norm(y * silu(z)), the RMSNorm by groups (each its own weights).
    The scan carries a state per head: s = s exp(dt A) + dt x B ; y = s . C."""
    in_proj: Tensor
    conv: np.ndarray                  # [channels, d_conv] float32, channels = d_inner + 2 groups d_state
    conv_bias: Optional[np.ndarray]
    dt_bias: np.ndarray               # [heads]
    a: np.ndarray                     # [heads]: A, the (negative) decay rate
    d: np.ndarray                     # [heads]: D, the skip
    norm: Optional[np.ndarray]        # [d_inner]: groups of d_inner / groups
    out_proj: Tensor
    heads: int
    head_dim: int
    groups: int
    d_state: int


@dataclass
class DeltaNet:
    """A layer's linear attention by the gated delta rule (Qwen3.5) in place of attention:
    [q | k | v] = silu(conv(Wqkv h)), conv causal and depthwise over positions ;
    a, b = Walpha h, Wbeta h ; per value head (reading key head h % kv_heads) a state S of
    head_dim x head_dim_v: S = g S, S += k ((v - S^T k) beta)^T, o = S^T q, with q, k
    L2-normalized, g = exp(A softplus(a + dt_bias)), beta = sigmoid(b) ;
    out = out_proj (rmsnorm_per_head(o) * silu(Wz h)).
    Qwen3-Next: value head h reads key head h // (heads / kv_heads) (grouped_kv); a and b from
    one w_ba whose rows are [b (r) | a (r)] per key head, r = heads / kv_heads; older files
    have one w_qkvz (ssm_in) of rows [q | k | v (r heads) | z (r heads)] per key head."""
    wqkv: Optional[Tensor]
    wz: Optional[Tensor]
    w_alpha: Optional[Tensor]
    w_beta: Optional[Tensor]
    conv: np.ndarray                  # [channels, d_conv] float32
    dt_bias: np.ndarray               # [heads]
    a: np.ndarray                     # [heads]: A, the (negative) decay rate
    norm: np.ndarray                  # [head_dim_v], shared by the heads
    out_proj: Tensor
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int
    grouped_kv: bool = False
    w_ba: Optional[Tensor] = None
    w_qkvz: Optional[Tensor] = None


@dataclass
class TimeMix:
    """A layer's RWKV time mix in place of attention (RWKV 6, QRWKV 6), from h and its token
    shift dx = h_prev - h (h_prev: the previous token's h):
        m = tanh(W1 (h + dx lerp_x)) ; [xw | xk | xv | xr | xg] = h + dx (lerps + W2_j m_j)
        r, k, v, g = Wr xr, Wk xk, Wv xv, Wg xg ; w = decay + Wd2 tanh(Wd1 xw)
        y = wkv(r, k, v, w) ; out = Wo (norm_per_head(y) * act(g))
    with the WKV state per head (csrc/pyllm.h, OP_WKV): RWKV 6's with the bonus `first` of the
    current token, a silu gate and a LayerNorm per head; QRWKV's (first None) a gated linear
    attention, a sigmoid gate and no norm. Keys and values of kv_heads (< heads: shared, GQA)."""
    lerp_x: np.ndarray        # [n_embd]
    lerps: np.ndarray         # [5, n_embd]: w, k, v, r, g
    w1: Tensor                # n_embd -> 5 extra
    w2: Tensor                # 5 matrices extra -> n_embd (3-D)
    decay: np.ndarray         # [n_embd]
    decay_w1: Tensor          # n_embd -> decay extra
    decay_w2: Tensor          # decay extra -> n_embd
    wr: Tensor
    wk: Tensor
    wv: Tensor
    wg: Tensor
    wo: Tensor
    first: Optional[np.ndarray]               # [n_embd]: RWKV 6's u; None: QRWKV
    ln: Optional[tuple]                       # (weight, bias) of the per-head LayerNorm, or None
    heads: int
    head_size: int
    kv_heads: int
    biases: tuple = (None, None, None)        # of r, k, v (QRWKV), or None each


@dataclass
class TimeMix7:
    """A layer's RWKV 7 time mix in place of attention (RWKV 7, ARWKV 7), from h and its token
    shift dx = h_prev - h:
        [xr | xw | xk | xv | xa | xg] = h + dx lerps        (xg where the layer has a gate)
        r, k, v = Wr xr, Wk xk, Wv xv ; w = w0 + W2 tanh(W1 xw) ; a = sigmoid(a0 + A2 A1 xa)
        v += (v_first - v) sigmoid(v0 + V2 V1 xv)           (not in layer 0, whose v is v_first)
        kk = l2norm_per_head(k k_k) ; k = k + (a - 1) k k_a
        y = wkv7(r, k, v, w, -kk, kk a) ; y = norm_per_head(y) + (r . (r_k k)) v per head
        out = Wo (y * G2 sigmoid(G1 xg))                    (the gate where the layer has one)
    with the WKV 7 state per head (csrc/pyllm.h, OP_WKV)."""
    lerps: np.ndarray         # [5 or 6, n_embd]: r, w, k, v, a (, g)
    w0: np.ndarray
    w1: Tensor
    w2: Tensor
    a0: np.ndarray
    a1: Tensor
    a2: Tensor
    v0: Optional[np.ndarray]  # the value residual's; None in layer 0
    v1: Optional[Tensor]
    v2: Optional[Tensor]
    g1: Optional[Tensor]
    g2: Optional[Tensor]
    k_k: np.ndarray
    k_a: np.ndarray
    r_k: np.ndarray
    wr: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ln: Optional[tuple]       # (weight, bias) of the per-head LayerNorm, or None (ARWKV 7)
    heads: int
    head_size: int


@dataclass
class ChannelMix:
    """A layer's RWKV channel mix in place of the FFN, from h and its token shift dx:
    out = sigmoid(Wr (h + dx lerp_r)) * Wv relu(Wk (h + dx lerp_k))^2 (RWKV 6), without the
    receptance gate (RWKV 7: receptance and lerp_r None)."""
    lerp_k: np.ndarray
    lerp_r: Optional[np.ndarray]
    key: Tensor
    receptance: Optional[Tensor]
    value: Tensor


@dataclass
class Mla:
    """A layer's multi-head latent attention (DeepSeek 2/3). Per token, a latent c (kv_lora
    wide) and one rotated key part k_pe shared by every head: [c | k_pe] = wkv_a h, c
    normed. Head i's key is [Wk_i c | k_pe] and its value Wv_i c; q comes from wq h, or
    from wq_b norm(wq_a h). wk_b holds Wk_i transposed (GGUF shape (nope, kv_lora, heads)),
    so q_i's latent part Wk_i^T q_nope_i meets c itself: the cache keeps [c | k_pe] alone."""
    wkv_a: Tensor
    kv_a_norm: np.ndarray
    wk_b: Tensor
    wv_b: Tensor            # GGUF shape (kv_lora, v_dim, heads)
    wo: Tensor
    wq: Optional[Tensor] = None
    wq_a: Optional[Tensor] = None
    q_a_norm: Optional[np.ndarray] = None
    wq_b: Optional[Tensor] = None


@dataclass
class Ffn:
    """A gated feed-forward: down(act(gate h) * up h). With w_gate None, w_up
    is fused: its output rows are [gate | up] (2 n_ff of them). Not gated:
    down(act(up h)) (Phi-2, StarCoder 2)."""
    w_up: Tensor
    w_down: Tensor
    w_gate: Optional[Tensor] = None
    b_up: Optional[np.ndarray] = None
    b_gate: Optional[np.ndarray] = None
    b_down: Optional[np.ndarray] = None
    gated: bool = True
    act_params: Optional[np.ndarray] = None   # the activation's own: xIELU's [alpha_n, alpha_p, beta, eps] (Apertus)


@dataclass
class Moe:
    """A mixture-of-experts FFN: the router picks k of the experts for each
    token from gate(router h) (softmax over all, or sigmoid), each a gated
    FFN with 3-D weights (n_in, n_out, n_experts); their outputs are summed
    with the chosen gate values as weights (divided by their sum if `norm`)."""
    router: Tensor
    gate: Optional[Tensor]                # None: ungated experts, Wdown_e act(Wup_e h) (Nemotron-H)
    up: Tensor
    down: Tensor
    k: int
    gating: int = MOE_SOFTMAX
    norm: bool = True
    scale: float = 1.0
    shared: Optional[Ffn] = None          # an expert every token uses, added to the sum
    b_select: Optional[np.ndarray] = None               # added to the gate values to choose, not to weigh
    b_router: Optional[np.ndarray] = None               # biases (gpt-oss): the router's [n_experts],
    b_gate: Optional[np.ndarray] = None                 # and each expert's, [n_experts, n_out]
    b_up: Optional[np.ndarray] = None
    b_down: Optional[np.ndarray] = None
    shared_gate: Optional[Tensor] = None  # its weight sigmoid(shared_gate h) (Qwen2-MoE), else 1
    groups: tuple[int, int] = (0, 0)      # (groups, used): choose within the best groups (DeepSeek V3)
    weight_input: bool = False            # the (one) expert's weight scales its input, not its output (Llama 4)
    router_on_input: bool = False         # the router reads the layer's input, not the FFN's norm (SmallThinker)
    expert_scale: Optional[np.ndarray] = None   # [n_experts]: each expert's weight times its scale (Gemma 4)
    gate_up: bool = False                 # gate None, up fused: each expert's rows [gate | up] (Gemma 4)

    @property
    def n_experts(self) -> int:
        return self.up.shape[2]


@dataclass
class Layer:
    """One transformer block: x += attn(norm(x)); x += ffn(norm(x)), with
    optional norms on each branch's output before it joins the residual (Gemma).
    OLMo 2 has only those: its input norms are None. LayerNorm families give
    their norms' biases. Parallel: x += attn(h) + ffn(h), h = norm(x) (Phi-2); with
    an ffn_norm too, the FFN reads its own norm of the same x (GPT-NeoX, Falcon 40B)."""
    attn_norm: Optional[np.ndarray]
    attn: Optional[Attn | ShortConv | Mla | Ssm | DeltaNet]   # None: a layer of its FFN alone (Nemotron-H)
    ffn_norm: Optional[np.ndarray]
    ffn: Optional[Ffn | Moe]                        # None: a layer of its mixer alone
    post_attn_norm: Optional[np.ndarray] = None
    post_ffn_norm: Optional[np.ndarray] = None
    attn_norm_b: Optional[np.ndarray] = None
    ffn_norm_b: Optional[np.ndarray] = None
    parallel: bool = False
    ssm: Optional[Ssm] = None      # a Mamba 2 mixer beside the attention, on the same norm (Falcon-H1)


@dataclass
class RankHead:
    """A reranker's classification head, as llama.cpp's rank pooling runs it on one row (a
    cross-encoder's first, a decoder's last): scores = Wout tanh(W x + b) + bout (without
    cls.weight: Wout x + bout); softmax: the scores as probabilities (Qwen3-Reranker's yes, no)."""
    dense: Optional[tuple]          # (W [n, n], b or None)
    out: np.ndarray                 # [n_out, n]
    out_bias: Optional[np.ndarray]
    softmax: bool = False

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = x.astype(np.float32)
        if self.dense is not None:
            w, b = self.dense
            h = np.tanh(w @ h + (b if b is not None else 0.0))
        scores = self.out @ h + (self.out_bias if self.out_bias is not None else 0.0)
        if self.softmax:
            e = np.exp(scores - scores.max())
            scores = e / e.sum()
        return scores.astype(np.float32)


class Architecture:
    """One model family: its tensors and its forward step.

    Per-layer settings that families vary (RoPE, attention window) come from
    `layer_rope(i)` and `layer_window(i)`; the numpy reference reads the same
    hyperparameters, never the op program.
    """

    name = ""
    rope_mode = ROPE_NORM
    rope_scalings = ROPE_SCALINGS
    rotary = True        # False: no layer rotates q and k (positions by ALiBi, or none: Jamba)
    glu = GLU_SILU
    fused_ffn = False    # may ffn_up hold [gate | up] with no ffn_gate (Phi-3)?
    gated = True         # False: the FFN is down(act(up h)), no gate (Phi-2, StarCoder 2)
    # may the file be a mixture of experts: False, True (Mixtral: if expert_count says so) or
    # "required" (Qwen3-MoE); each family says for itself, subclasses do not inherit it
    experts: bool | str = False
    moe_norm = True      # MoE: divide the chosen experts' gate values by their sum
    kv_per_layer: bool | str = False  # head_count_kv may list a count per layer, 0 for a layer without
                                      # attention ("mixed": counts that differ, Gemma 4)
    own_head_dims = False  # the family reads its key and value head sizes itself (MLA)
    qk_norm_after_rope = False  # q/k norms on the rotated q and k (Hunyuan), not before RoPE
    chunked_window = False  # a layer's window is a chunk: position p sees p - p % window.. (Llama 4)
    causal = True        # False: every token attends over every other (BERT); the model embeds, never generates
    norm_after_residual = False   # the layer's norms take the residual sums, x = norm(x + f(x)) (BERT)
    attn_temperature: Optional[tuple] = None   # (s, period, offset): q *= 1 + s ln(1 + floor((p + offset) / period))
    attn_softcap = 0.0   # > 0: attention scores become c * tanh(s / c) (Gemma 2)
    alibi = 0.0          # > 0: ALiBi's maximum bias, positions by per-head linear biases (BLOOM, MPT)
    final_softcap = 0.0  # > 0: the logits likewise
    residual_scale = 1.0  # each branch's output joins the residual times this (Granite)
    logit_scale = 1.0     # the logits are multiplied by this, before any soft-cap (Granite)
    norm = NORM_RMS       # or NORM_LAYER: LayerNorm, with biases where the file has them
    out_norm_b: Optional[np.ndarray] = None   # LayerNorm bias of the output norm
    out_bias: Optional[np.ndarray] = None     # bias of the logits (Phi-2)
    pos_embd: Optional[Tensor] = None         # learned position embeddings (GPT-2): one row per position
    input_norm: Optional[tuple] = None        # (weight, bias) of a LayerNorm of the embeddings (BLOOM)
    dense_out: tuple = ()                     # (weight, bias) projections of an embedding after the final norm
    rank_head: Optional["RankHead"] = None    # a cross-encoder's classification head (rank pooling)
    deepstack = 0         # an image row's further slices added after the first layers (Qwen 3 VL: DeepStack)
    is_swa: Optional[list] = None   # per layer, whether it attends over self.window (None: every layer)
    loop_norms: tuple = ()   # layers after which x = the output norm of x (a looped stack between passes: Nanbeige)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls.experts = cls.__dict__.get("experts", False)

    def __init__(self, mf: ModelFile, n_ctx: Optional[int] = None):
        """n_ctx: the context the model will run with, for families whose math
        depends on it (Phi-3's long-context RoPE factors); None: not known."""
        self.mf = mf
        self.n_ctx = n_ctx
        self.hp = HParams.read(mf, self.rope_scalings, layer_norm=self.norm == NORM_LAYER,
                               experts=bool(self.experts), kv_per_layer=self.kv_per_layer,
                               own_head_dims=self.own_head_dims)
        self.adjust_hparams(self.hp)
        self.rope_freqs: Optional[np.ndarray] = None   # llama3-style per-pair divisors
        self.window = 0                                 # sliding window of every layer, 0 = none

    def adjust_hparams(self, hp: HParams) -> None:
        """Where a family's files write a hyperparameter other than what they mean (Qwen 1's FFN
        width), puts it right before any tensor is read against it."""

    # -- tensors, checked against the hyperparameters ------------------------------
    def weight(self, name: str, n_in: int, n_out: int) -> Tensor:
        """A matrix of n_out rows of n_in (GGUF shape (n_in, n_out)), of a type we run."""
        t = self.mf.tensor(name)
        if t.shape != (n_in, n_out):
            raise ModelFileError(f"{self.mf.path}: tensor {name} has shape {list(t.shape)}, the "
                                 f"hyperparameters say {[n_in, n_out]}; the file is corrupt")
        if t.type not in SUPPORTED_WEIGHT_TYPES:
            supported = ", ".join(sorted(type_name(x) for x in SUPPORTED_WEIGHT_TYPES))
            raise UnsupportedModelError(f"{self.mf.path}: tensor {name} has type {t.type_name}, which pyllm "
                                        f"does not run yet (supported: {supported})")
        return t

    def floats(self, name: str, *shape: int) -> np.ndarray:
        """An F32 or F16 tensor of GGUF shape `shape` as float32, in numpy's order
        (the reversed shape: one row per last GGUF dimension). Trailing dimensions of 1 may
        be left out in the file, as ggml writes them."""
        t = self.mf.tensor(name)

        def trimmed(s: tuple) -> tuple:
            while len(s) > 1 and s[-1] == 1:
                s = s[:-1]
            return tuple(s)
        if trimmed(tuple(t.shape)) != trimmed(shape):
            raise ModelFileError(f"{self.mf.path}: tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        if t.type not in (0, 1):
            raise UnsupportedModelError(f"{self.mf.path}: tensor {name} has type {t.type_name}; expected F32 or F16")
        a = t.data.view(np.float32) if t.type == 0 else t.data.view(np.float16).astype(np.float32)
        return a.reshape(shape[::-1])

    def vector(self, name: str, n: int) -> np.ndarray:
        """A 1-D float tensor (norm weight, bias) as float32."""
        return self.floats(name, n)

    def optional_vector(self, name: str, n: int) -> Optional[np.ndarray]:
        return self.vector(name, n) if self.mf.has_tensor(name) else None

    def expert_biases(self, name: str, n: int, n_experts: int) -> Optional[np.ndarray]:
        """One bias of n per expert as [n_experts, n], if the file has it."""
        return self.floats(name, n, n_experts) if self.mf.has_tensor(name) else None

    def norm_weights(self, name: str, bias: bool = True) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """(weight, bias) of norm `name` ("blk.0.attn_norm"); the bias required
        when `bias` (LayerNorm families), else absent."""
        n = self.hp.n_embd
        return self.vector(name + ".weight", n), (self.vector(name + ".bias", n) if bias else None)

    def drop_prediction_layers(self) -> None:
        """Leaves out the last `nextn_predict_layers` blocks: multi-token prediction heads for
        speculative decoding (GLM-4.5, BailingMoE 2), which llama.cpp loads but does not run."""
        mf, hp = self.mf, self.hp
        nextn = int(mf.arch_get("nextn_predict_layers", 0) or 0)
        if not 0 <= nextn < hp.n_layer:
            raise ModelFileError(f"{mf.path}: nextn_predict_layers {nextn} of {hp.n_layer} blocks; the file is corrupt")
        hp.n_layer -= nextn

    def refuse_tensor(self, name: str, what: str) -> None:
        """UnsupportedModelError if the file has tensor `name` (a variant, `what`, pyllm does not run)."""
        if self.mf.has_tensor(name):
            raise UnsupportedModelError(f"{self.mf.path}: {self.name} with {what} is not supported yet")

    def read_ends(self, norm_bias: bool = False, tied: bool = True, out_norm: str = "output_norm") -> None:
        """The token embedding, the output norm `out_norm` (with its bias in LayerNorm
        families) and the logits matrix (tied to the embedding when absent, if the
        family allows it)."""
        hp = self.hp
        self.tok_embd = self.weight("token_embd.weight", hp.n_embd, hp.n_vocab)
        self.out_norm, self.out_norm_b = self.norm_weights(out_norm, bias=norm_bias)
        self.output = self.output_weight() if tied else self.weight("output.weight", hp.n_embd, hp.n_vocab)

    def read_dense_out(self) -> None:
        """sentence-transformers' dense projections, where the file has them (dense_2, dense_3:
        EmbeddingGemma): an embedding goes through them after the final norm, as llama.cpp
        applies them after pooling (the same thing: pooling is linear)."""
        width, out = self.hp.n_embd, []
        for name in ("dense_2", "dense_3"):
            if not self.mf.has_tensor(name + ".weight"):
                continue
            t = self.mf.tensor(name + ".weight")
            if len(t.shape) != 2 or t.shape[0] != width:
                raise ModelFileError(f"{self.mf.path}: {name}.weight has shape {list(t.shape)}, expected [{width}, n]; "
                                     f"the file is corrupt")
            out.append((self.weight(name + ".weight", width, t.shape[1]), self.optional_vector(name + ".bias", t.shape[1])))
            width = t.shape[1]
        self.dense_out = tuple(out)

    def output_weight(self) -> Tensor:
        """The logits projection; tied to the token embedding when absent."""
        hp = self.hp
        name = "output.weight" if self.mf.has_tensor("output.weight") else "token_embd.weight"
        return self.weight(name, hp.n_embd, hp.n_vocab)

    def layer_heads(self, i: int) -> tuple[int, int]:
        """(query heads, key/value heads) of layer i: the file's lists where it gives them per layer."""
        hp = self.hp
        return (hp.heads[i] if hp.heads else hp.n_head), (hp.kv_heads[i] if hp.kv_heads else hp.n_head_kv)

    def attention_weights(self, i: int, qk_norm: bool | str = False, biases: bool = False) -> Attn:
        """Layer i's attention: separate or fused q/k/v, optional biases; q/k
        norms and q/k/v biases required when the family says so. Sized by the layer's
        own head counts where the file gives them per layer (OpenELM)."""
        hp, p = self.hp, f"blk.{i}."
        n_q, n_kv = self.layer_heads(i)
        q_dim, kv_dim = n_q * hp.head_dim, n_kv * hp.head_dim
        need_bias = self.vector if biases else self.optional_vector
        a = Attn(wo=self.weight(p + "attn_output.weight", q_dim, hp.n_embd),
                 bo=self.optional_vector(p + "attn_output.bias", hp.n_embd))
        if hp.heads:
            a.n_head, a.n_kv_head = n_q, n_kv
        if self.mf.has_tensor(p + "attn_qkv.weight"):
            a.wqkv = self.weight(p + "attn_qkv.weight", hp.n_embd, q_dim + 2 * kv_dim)
            a.bqkv = need_bias(p + "attn_qkv.bias", q_dim + 2 * kv_dim)
        else:
            a.wq = self.weight(p + "attn_q.weight", hp.n_embd, q_dim)
            a.wk = self.weight(p + "attn_k.weight", hp.n_embd, kv_dim)
            a.wv = self.weight(p + "attn_v.weight", hp.n_embd, kv_dim)
            a.bq = need_bias(p + "attn_q.bias", q_dim)
            a.bk = need_bias(p + "attn_k.bias", kv_dim)
            a.bv = need_bias(p + "attn_v.bias", kv_dim)
        if qk_norm:   # one weight per head dim, or "full": as wide as q and k
            full = qk_norm == "full"
            a.q_norm = self.vector(p + "attn_q_norm.weight", q_dim if full else hp.head_dim)
            a.k_norm = self.vector(p + "attn_k_norm.weight", kv_dim if full else hp.head_dim)
        return a

    def ffn_weights(self, i: int) -> Ffn:
        """Layer i's FFN: ffn_gate + ffn_up, or one ffn_up of 2 n_ff rows [gate | up];
        for an ungated family, ffn_up alone."""
        hp, p, n_ff = self.hp, f"blk.{i}.", self.hp.layer_ff(i)
        down = self.weight(p + "ffn_down.weight", n_ff, hp.n_embd)
        b_down = self.optional_vector(p + "ffn_down.bias", hp.n_embd)
        if not self.gated:
            return Ffn(w_up=self.weight(p + "ffn_up.weight", hp.n_embd, n_ff), w_down=down,
                       b_up=self.optional_vector(p + "ffn_up.bias", n_ff), b_down=b_down, gated=False)
        if not self.fused_ffn or self.mf.has_tensor(p + "ffn_gate.weight"):
            return Ffn(w_up=self.weight(p + "ffn_up.weight", hp.n_embd, n_ff), w_down=down,
                       w_gate=self.weight(p + "ffn_gate.weight", hp.n_embd, n_ff),
                       b_up=self.optional_vector(p + "ffn_up.bias", n_ff),
                       b_gate=self.optional_vector(p + "ffn_gate.bias", n_ff), b_down=b_down)
        return Ffn(w_up=self.weight(p + "ffn_up.weight", hp.n_embd, 2 * n_ff), w_down=down,
                   b_up=self.optional_vector(p + "ffn_up.bias", 2 * n_ff), b_down=b_down)

    def ssm_sizes(self) -> tuple[int, int, int, int, int]:
        """The ssm.* keys: (conv_kernel, inner_size, state_size, time_step_rank, group_count)."""
        return tuple(int(self.mf.arch_require("ssm." + k)) for k in (
            "conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count"))

    def ssm_weights(self, i: int) -> Ssm:
        """Layer i's Mamba 2 mixer, sized by the file's ssm.* keys (time_step_rank is the
        number of heads, as llama.cpp reads it)."""
        mf, hp, p = self.mf, self.hp, f"blk.{i}."
        d_conv, d_inner, d_state, heads, groups = self.ssm_sizes()
        if (min(d_conv, d_inner, d_state, heads, groups) <= 0 or d_inner % heads or heads % groups or d_conv > 64
                or d_inner % groups):
            raise ModelFileError(f"{mf.path}: Mamba 2 sizes (conv {d_conv}, inner {d_inner}, state {d_state}, "
                                 f"{heads} heads, {groups} groups) do not fit together; the file is corrupt")
        channels = d_inner + 2 * groups * d_state
        return Ssm(in_proj=self.weight(p + "ssm_in.weight", hp.n_embd, d_inner + channels + heads),
                   conv=self.floats(p + "ssm_conv1d.weight", d_conv, channels),
                   conv_bias=self.optional_vector(p + "ssm_conv1d.bias", channels),
                   dt_bias=self.vector(p + "ssm_dt.bias", heads),
                   a=self.floats(p + "ssm_a", 1, heads).reshape(heads),
                   d=self.floats(p + "ssm_d", 1, heads).reshape(heads),
                   norm=(self.floats(p + "ssm_norm.weight", d_inner // groups, groups).reshape(d_inner)
                         if mf.has_tensor(p + "ssm_norm.weight") else None),
                   out_proj=self.weight(p + "ssm_out.weight", d_inner, hp.n_embd),
                   heads=heads, head_dim=d_inner // heads, groups=groups, d_state=d_state)

    def mamba1_weights(self, i: int) -> Ssm1:
        """Layer i's Mamba 1 mixer, sized by the file's ssm.* keys (time_step_rank: dt's rank); dt, B
        and C normed by the layer's ssm_{dt,b,c}_norm (Jamba), or without weights where
        ssm.dt_b_c_rms says so (Falcon Mamba)."""
        mf, hp, p = self.mf, self.hp, f"blk.{i}."
        d_conv, d_inner, d_state, dt_rank = (int(mf.arch_require("ssm." + k)) for k in (
            "conv_kernel", "inner_size", "state_size", "time_step_rank"))
        if min(d_conv, d_inner, d_state, dt_rank) <= 0 or d_conv > 64:
            raise ModelFileError(f"{mf.path}: Mamba sizes (conv {d_conv}, inner {d_inner}, state {d_state}, "
                                 f"dt rank {dt_rank}) do not fit together; the file is corrupt")
        norms = None
        if mf.has_tensor(p + "ssm_dt_norm.weight"):
            norms = (self.vector(p + "ssm_dt_norm.weight", dt_rank), self.vector(p + "ssm_b_norm.weight", d_state),
                     self.vector(p + "ssm_c_norm.weight", d_state))
        elif mf.arch_get("ssm.dt_b_c_rms", False):
            norms = tuple(np.ones(n, np.float32) for n in (dt_rank, d_state, d_state))
        return Ssm1(in_proj=self.weight(p + "ssm_in.weight", hp.n_embd, 2 * d_inner),
                    conv=self.floats(p + "ssm_conv1d.weight", d_conv, d_inner),
                    conv_bias=self.vector(p + "ssm_conv1d.bias", d_inner),
                    x_proj=self.weight(p + "ssm_x.weight", d_inner, dt_rank + 2 * d_state),
                    dt_proj=self.weight(p + "ssm_dt.weight", dt_rank, d_inner),
                    dt_bias=self.vector(p + "ssm_dt.bias", d_inner),
                    a=self.floats(p + "ssm_a", d_state, d_inner), d=self.floats(p + "ssm_d", d_inner),
                    out_proj=self.weight(p + "ssm_out.weight", d_inner, hp.n_embd), dt_rank=dt_rank,
                    d_state=d_state, norms=norms)

    def expert_weights(self, name: str, n_in: int, n_out: int, n_experts: int) -> Tensor:
        """A 3-D expert tensor: n_experts matrices of n_out rows of n_in, of a type we run."""
        t = self.mf.tensor(name)
        if t.shape != (n_in, n_out, n_experts):
            raise ModelFileError(f"{self.mf.path}: tensor {name} has shape {list(t.shape)}, the "
                                 f"hyperparameters say {[n_in, n_out, n_experts]}; the file is corrupt")
        if t.type not in SUPPORTED_WEIGHT_TYPES:
            raise UnsupportedModelError(f"{self.mf.path}: tensor {name} has type {t.type_name}, which pyllm "
                                        f"does not run yet")
        return t

    def moe_weights(self, i: int) -> Optional[Moe]:
        """Layer i's experts, or None when the file says it has none (a dense model)."""
        hp, p, mf = self.hp, f"blk.{i}.", self.mf
        n_experts = int(mf.arch_get("expert_count", 0))
        if n_experts > 0 and not self.moe_layer(i):
            return None
        if n_experts <= 0:
            if self.experts == "required":
                raise ModelFileError(f"{mf.path}: {mf.architecture} needs experts, but "
                                     f"{mf.architecture}.expert_count is {n_experts}")
            return None
        k = int(mf.arch_require("expert_used_count"))
        if not 0 < k <= n_experts:
            raise ModelFileError(f"{mf.path}: {mf.architecture}.expert_used_count = {k} is not in 1..{n_experts}")
        n_ff = self.expert_width(k)
        gate, up, fused = self.gate_up_experts(i, n_ff, n_experts) if self.gated else (
            None, self.expert_weights(p + "ffn_up_exps.weight", hp.n_embd, n_ff, n_experts), False)
        return Moe(router=self.weight(p + "ffn_gate_inp.weight", hp.n_embd, n_experts),
                   gate=gate, up=up, gate_up=fused,
                   down=self.expert_weights(p + "ffn_down_exps.weight", n_ff, hp.n_embd, n_experts),
                   k=k, norm=self.moe_norm, shared=self.shared_expert(i),
                   b_router=self.optional_vector(p + "ffn_gate_inp.bias", n_experts),
                   b_select=self.optional_vector(p + "exp_probs_b.bias", n_experts),
                   b_gate=self.expert_biases(p + "ffn_gate_exps.bias", n_ff, n_experts),
                   b_up=self.expert_biases(p + "ffn_up_exps.bias", n_ff, n_experts),
                   b_down=self.expert_biases(p + "ffn_down_exps.bias", hp.n_embd, n_experts))

    def gate_up_experts(self, i: int, n_ff: int, n_experts: int) -> tuple[Optional[Tensor], Tensor, bool]:
        """Layer i's gated experts as (gate, up, fused): ffn_gate_exps and ffn_up_exps, or one
        ffn_gate_up_exps whose experts' rows are [gate | up] (gate None, fused True), which
        llama.cpp's converter writes where the checkpoint stores them so (Mistral 4, Gemma 4)."""
        p, n_embd = f"blk.{i}.", self.hp.n_embd
        if self.mf.has_tensor(p + "ffn_gate_up_exps.weight"):
            return None, self.expert_weights(p + "ffn_gate_up_exps.weight", n_embd, 2 * n_ff, n_experts), True
        return (self.expert_weights(p + "ffn_gate_exps.weight", n_embd, n_ff, n_experts),
                self.expert_weights(p + "ffn_up_exps.weight", n_embd, n_ff, n_experts), False)

    def moe_layer(self, i: int) -> bool:
        """Is layer i's FFN the experts (in a MoE file)? Every layer's, unless a family says otherwise."""
        return True

    def expert_width(self, k: int) -> int:
        """n_ff of each expert (Mixtral, OLMoE, Granite MoE: n_ff; families that read
        expert_feed_forward_length override this)."""
        return self.hp.n_ff

    def shared_expert(self, i: int) -> Optional[Ffn]:
        """Layer i's shared expert (ffn_{gate,up,down}_shexp, expert_shared_feed_forward_length
        wide, else n_ff), if the file has one."""
        if not self.mf.has_tensor(f"blk.{i}.ffn_up_shexp.weight"):
            return None
        return self.shared_ffn(i, int(self.mf.arch_get("expert_shared_feed_forward_length", 0)) or self.hp.n_ff)

    def shared_expert_gate(self, i: int) -> Tensor:
        """Layer i's ffn_gate_inp_shexp: the shared expert weighted by sigmoid(w . h) (Qwen2-MoE, Qwen3.5 MoE)."""
        p = f"blk.{i}."
        t = self.mf.tensor(p + "ffn_gate_inp_shexp.weight")
        if t.shape not in ((self.hp.n_embd,), (self.hp.n_embd, 1)) or t.type != 0:
            raise ModelFileError(f"{self.mf.path}: {p}ffn_gate_inp_shexp.weight should be {self.hp.n_embd} F32 "
                                 f"values, is {list(t.shape)} {t.type_name}")
        return t

    def shared_ffn(self, i: int, n: int) -> Ffn:
        """Layer i's shared expert ffn_{gate,up,down}_shexp, n wide."""
        hp, p = self.hp, f"blk.{i}."
        return Ffn(w_up=self.weight(p + "ffn_up_shexp.weight", hp.n_embd, n),
                   w_gate=self.weight(p + "ffn_gate_shexp.weight", hp.n_embd, n) if self.gated else None,
                   w_down=self.weight(p + "ffn_down_shexp.weight", n, hp.n_embd), gated=self.gated)

    # -- per-layer settings ----------------------------------------------------------
    def layer_rope(self, i: int) -> Rope:
        hp = self.hp
        if not self.rotary:
            return Rope(self.rope_mode, 0, hp.rope_base)
        if hp.rope_yarn is not None:
            factors = hp.rope_yarn if self.rope_freqs is None else hp.rope_yarn * self.rope_freqs
            return Rope(self.rope_mode, hp.rope_dim, hp.rope_base, 1.0, factors)
        return Rope(self.rope_mode, hp.rope_dim, hp.rope_base, hp.rope_freq_scale, self.rope_freqs)

    def layer_window(self, i: int) -> int:
        """Sliding attention window of layer i in tokens (0: the whole context): self.window in
        the layers self.is_swa flags (every layer where the family sets no flags)."""
        return self.window if self.is_swa is None or self.is_swa[i] else 0

    def file_attn_temperature(self) -> Optional[tuple]:
        """(s, L, 0) where the file sets attention.temperature_scale s (Llama 4's scaling that
        Mistral 3 and Mistral 4 / Large 3 use: q times 1 + s ln(1 + floor(p / L)) at position
        p), L being attention.temperature_length, else the original context; None if unset."""
        mf = self.mf
        s = float(mf.arch_get("attention.temperature_scale", 0.0) or 0.0)
        if not s:
            return None
        period = int(mf.arch_get("attention.temperature_length", 0) or
                     mf.arch_get("rope.scaling.original_context_length", 0) or 0)
        if period <= 0:
            raise ModelFileError(f"{mf.path}: attention.temperature_scale is set but neither "
                                 f"attention.temperature_length nor the original context length is")
        return (s, period, 0.0)

    def layer_attn_temperature(self, i: int) -> Optional[tuple]:
        """(s, period, offset) of layer i's attention temperature (the family's, unless its
        layers differ: Llama 4's NoPE layers alone), or None."""
        return self.attn_temperature

    def layer_attn_scale(self, i: int) -> float:
        """Softmax scale of layer i's q.k (the family's, unless its layers differ: OLMo 3)."""
        return self.attn_scale

    @property
    def attn_scale(self) -> float:
        """Softmax scale of q.k, with the RoPE attention factor (applied to both q
        and k by llama.cpp's rope) folded in."""
        return self.hp.rope_attn_factor ** 2 / math.sqrt(self.hp.head_dim)

    @property
    def embed_scale(self) -> float:
        return 1.0

    def pooling(self) -> Optional[str]:
        """How the file says its output rows become one embedding ({arch}.pooling_type, as
        llama.cpp numbers it): "mean", "cls" (the first row), "last", or None (not said:
        one embedding per token)."""
        kind = self.mf.arch_get("pooling_type", None)
        names = {0: None, 1: "mean", 2: "cls", 3: "last", 4: "rank"}
        if kind is None:
            return None
        if not isinstance(kind, (int, np.integer)) or int(kind) not in names:
            raise UnsupportedModelError(f"{self.mf.path}: pooling type {kind!r} is not supported "
                                        f"(pyllm pools by mean, cls or last, or ranks)")
        if names[int(kind)] == "rank" and self.rank_head is None:
            if not self.causal:
                raise ModelFileError(f"{self.mf.path}: the file ranks (pooling type 4) but has no classification "
                                     f"head (cls.output.weight); the file is corrupt")
            raise UnsupportedModelError(f"{self.mf.path}: a reranker of architecture {self.name} is not supported "
                                        f"(pyllm ranks with BERT-style cross-encoders: bge-reranker, ms-marco)")
        return names[int(kind)]

    def read_rank_head(self, softmax: bool = False) -> Optional["RankHead"]:
        """A reranker's classification head (cls, cls.output), where the file has one."""
        if not self.mf.has_tensor("cls.output.weight"):
            return None
        n = self.hp.n_embd
        dense = None
        if self.mf.has_tensor("cls.weight"):
            dense = (self.matrix("cls.weight", n, n), self.optional_vector("cls.bias", n))
        n_out = math.prod(self.mf.tensor("cls.output.weight").shape) // n   # [n, n_out]; [n] for one score
        return RankHead(dense, self.matrix("cls.output.weight", n, n_out), self.optional_vector("cls.output.bias", n_out),
                        softmax)

    def matrix(self, name: str, n_in: int, n_out: int) -> np.ndarray:
        """A small matrix of any type as float32 [n_out, n_in] (dequantized here: heads run in numpy)."""
        t = self.mf.tensor(name)
        if t.shape[0] != n_in or math.prod(t.shape) != n_in * n_out:
            raise ModelFileError(f"{self.mf.path}: tensor {name} has shape {list(t.shape)}, expected "
                                 f"{[n_in, n_out]}; the file is corrupt")
        return dequantize(t.data, GGMLQuantizationType(t.type)).astype(np.float32).reshape(n_out, n_in)

    def block_notes(self) -> str:
        """What `pyllm info`'s block line cannot read off the layers (Gemma 4's shapes), "; "-led."""
        return ""

    def build(self, g: Graph) -> None:  # pragma: no cover - every family overrides it
        raise NotImplementedError
