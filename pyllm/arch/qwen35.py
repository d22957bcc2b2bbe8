"""Qwen3.5 (`qwen35`: Qwen3.5 0.8B..27B): three of every four layers mix tokens by linear
attention (the gated delta rule, DeltaNet in base.py), the fourth by gated full attention.

    h = rmsnorm(x)
    linear layers:  x += out_proj (rmsnorm_per_head(delta(q, k, v)) * silu(Wz h))
    full layers:    [q_h | g_h] = Wq h ; q, k = rmsnorm_per_head(q), rmsnorm_per_head(Wk h) ; rope(q, k)
                    x += Wo (attention(q, K, V) * sigmoid(g))                  # NEOX, partial
    h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)   # the norm stored as post_attention_norm
    logits = Wout rmsnorm(x)

As llama.cpp reads the file: a layer is linear unless `attention.recurrent_layers` says
otherwise, or, without it, (i + 1) % full_attention_interval (default 4) is 0; the
ssm.* keys size the linear layers (state_size: both head sizes, group_count: key
heads, time_step_rank: value heads); M-RoPE's sections (interleaved) give a text token NEOX RoPE;
the multi-token prediction blocks after the last layer are left out.

Qwen3.5 MoE (`qwen35moe`) has experts for every FFN: the router's softmax over the chosen
ones, renormalized (times expert_weights_scale where set), plus a shared expert weighted
by sigmoid(w . h) where the file has one. Qwen3-Next (`qwen3next`) is Qwen3.5 MoE with its
linear attention's heads and fused projections laid out per key head (Qwen3Next below).
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFileError
from ..graph import GLU_SILU, ROPE_NEOX
from .base import Attn, DeltaNet, Layer, MRope
from .blocks import PreNormDecoder


class Qwen35(MRope, PreNormDecoder):
    """Images (Qwen3.5's projector, Qwen 3 VL's without DeepStack) take interleaved M-RoPE
    positions, where the file has rope.dimension_sections (Qwen3-Next's have none)."""
    name = "qwen35"
    mrope_interleaved = True
    mrope_required = False
    rope_mode = ROPE_NEOX
    glu = GLU_SILU
    kv_per_layer = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.drop_prediction_layers()
        hp = self.hp
        self.read_ends()
        linear = self.linear_layers()
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd),
                                     attn=self.delta_net_weights(i) if linear[i] else self.gated_attention(i),
                                     ffn_norm=self.vector(p + "post_attention_norm.weight", hp.n_embd),
                                     ffn=self.ffn_of(i)))

    def ffn_of(self, i: int):
        return self.ffn_weights(i)

    def linear_layers(self) -> list[bool]:
        mf, n = self.mf, self.hp.n_layer
        flags = mf.arch_get("attention.recurrent_layers")
        if flags is not None:
            if len(flags) < n:
                raise ModelFileError(f"{mf.path}: attention.recurrent_layers has {len(flags)} flags for {n} layers")
            return [bool(f) for f in list(flags)[:n]]
        interval = int(mf.arch_get("full_attention_interval", 4) or 4)
        if interval < 1:
            raise ModelFileError(f"{mf.path}: full_attention_interval {interval} is not positive")
        return [(i + 1) % interval != 0 for i in range(n)]

    def gated_attention(self, i: int) -> Attn:
        hp, p = self.hp, f"blk.{i}."
        return Attn(wo=self.weight(p + "attn_output.weight", hp.q_dim, hp.n_embd),
                    wq=self.weight(p + "attn_q.weight", hp.n_embd, 2 * hp.q_dim),
                    wk=self.weight(p + "attn_k.weight", hp.n_embd, hp.kv_dim),
                    wv=self.weight(p + "attn_v.weight", hp.n_embd, hp.kv_dim),
                    q_norm=self.vector(p + "attn_q_norm.weight", hp.head_dim),
                    k_norm=self.vector(p + "attn_k_norm.weight", hp.head_dim), q_gated=True)

    def delta_net_weights(self, i: int) -> DeltaNet:
        d = self.delta_net_sizes(i)
        p, hp = f"blk.{i}.", self.hp
        d.wqkv = self.weight(p + "attn_qkv.weight", hp.n_embd, d.conv.shape[0])
        d.wz = self.weight(p + "attn_gate.weight", hp.n_embd, d.heads * d.head_dim_v)
        d.w_alpha = self.weight(p + "ssm_alpha.weight", hp.n_embd, d.heads)
        d.w_beta = self.weight(p + "ssm_beta.weight", hp.n_embd, d.heads)
        return d

    def delta_net_sizes(self, i: int) -> DeltaNet:
        """Layer i's linear attention sized by the ssm.* keys, without its input projections."""
        mf, hp, p = self.mf, self.hp, f"blk.{i}."
        d_conv, d_inner, d_head, heads, kv_heads = self.ssm_sizes()   # state_size: both head sizes
        if (min(d_conv, d_inner, d_head, heads, kv_heads) <= 0 or d_conv > 64 or heads % kv_heads
                or d_inner != heads * d_head):
            raise ModelFileError(f"{mf.path}: linear attention sizes (conv {d_conv}, inner {d_inner}, heads of "
                                 f"{d_head}, {heads} value and {kv_heads} key heads) do not fit together; the file "
                                 f"is corrupt")
        channels = 2 * kv_heads * d_head + d_inner
        return DeltaNet(wqkv=None, wz=None, w_alpha=None, w_beta=None,
                        conv=self.floats(p + "ssm_conv1d.weight", d_conv, channels),
                        dt_bias=self.vector(p + "ssm_dt.bias", heads),
                        a=np.ascontiguousarray(self.vector(p + "ssm_a", heads)),
                        norm=self.vector(p + "ssm_norm.weight", d_head),
                        out_proj=self.weight(p + "ssm_out.weight", d_inner, hp.n_embd),
                        heads=heads, kv_heads=kv_heads, head_dim=d_head, head_dim_v=d_head)


class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    experts = "required"

    def ffn_of(self, i: int):
        m = self.moe_weights(i)
        m.scale = float(self.mf.arch_get("expert_weights_scale", 0.0) or 1.0)
        if m.shared is not None:
            m.shared_gate = self.shared_expert_gate(i)
        return m

    def expert_width(self, k: int) -> int:
        return int(self.mf.arch_get("expert_feed_forward_length", 0) or 0) or self.hp.n_ff // k


class Qwen3Next(Qwen35Moe):
    """Qwen3-Next (`qwen3next`: 80B-A3B): Qwen3.5 MoE's layers, but value head h of the linear
    attention reads key head h // (heads / kv_heads), and its a and b come from one ssm_ba
    ([b | a] per key head); older files have one ssm_in ([q | k | v | z] per key head) in place of
    attn_qkv and attn_gate."""
    name = "qwen3next"
    experts = "required"

    def delta_net_weights(self, i: int) -> DeltaNet:
        d = self.delta_net_sizes(i)
        mf, hp, p = self.mf, self.hp, f"blk.{i}."
        d.grouped_kv = True
        inner = d.heads * d.head_dim_v
        if mf.has_tensor(p + "ssm_in.weight"):
            d.w_qkvz = self.weight(p + "ssm_in.weight", hp.n_embd, d.conv.shape[0] + inner)
        else:
            d.wqkv = self.weight(p + "attn_qkv.weight", hp.n_embd, d.conv.shape[0])
            d.wz = self.weight(p + "attn_gate.weight", hp.n_embd, inner)
        d.w_ba = self.weight(p + "ssm_ba.weight", hp.n_embd, 2 * d.heads)
        return d
