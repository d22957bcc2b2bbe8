"""DeepSeek 2 and 3 (`deepseek2`: DeepSeek-V2/V2.5/V3/R1, DeepSeek-Coder-V2, Moonlight,
Kimi K2 and the GGUFs llama.cpp converts to this layout): multi-head latent attention
(MLA) and a mixture of experts after `leading_dense_block_count` dense layers.

    x = embed(tokens)
    for each layer:
        h = rmsnorm(x)
        q = Wq h   (or Wq_b rmsnorm(Wq_a h))              n_head heads of [q_nope | q_pe]
        [c | k_pe] = Wkv_a h ; c = rmsnorm(c)             a latent c and one k_pe per token
        rope(q_pe, k_pe)
        head i: k_i = [Wk_i c | k_pe], v_i = Wv_i c
        x += Wo [attention_i(q_i, K_i, V_i)]_i
        h = rmsnorm(x) ; x += ffn(h) or experts(h) + shared experts(h)
    logits = Wout rmsnorm(x)

Run as llama.cpp runs it (its "absorbed" MLA), which caches [c | k_pe] alone (576
f16 per position per layer, not 2 n_head heads): q_i . k_i = (Wk_i^T q_nope_i) . c
+ q_pe_i . k_pe, so q_i becomes [Wk_i^T q_nope_i | q_pe_i] against keys [c | k_pe],
one KV head for all query heads, whose values are the keys' first kv_lora dims, c;
Wv_i is applied to head i's output instead of to every cached c.

Files converted before llama.cpp split the up-projection carry one attn_kv_b whose
rows are, per head, [Wk_i ; Wv_i]; they are split here when the model is opened
(Wk_i^T as F16, Wv_i's rows as stored), so both layouts run the same program.

The router's gate values are a softmax (V2) or sigmoids (V3, with exp_probs_b to choose
by), renormalized over the chosen experts where expert_weights_norm says, times
expert_weights_scale, chosen within the expert_group_used_count best of
expert_group_count groups where the file sets them (V3, Kimi K2); the shared experts
(expert_shared_count of them) are one FFN of that many expert widths. YaRN, where the file sets it, scales the softmax by m^2 and
leaves RoPE's cos and sin alone: m = 1 + yarn_log_multiplier ln(factor), the converter
having written 0.1 mscale_all_dim as the multiplier (HF's yarn_get_mscale).
"""
from __future__ import annotations

import math

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from ..errors import ModelFileError, UnsupportedModelError
from ..graph import GLU_RELU_SQR, ROPE_NORM, Graph, View
from ..model_file import Tensor
from .base import GATING_SIGMOID, GATING_SOFTMAX, Architecture, Layer, Mla, SharedExpertsMoe
from .blocks import embed, ffn, output_head

MAX_KEY_DIMS = 576                      # csrc/core.h MAX_HEAD_DIM


class Deepseek2(SharedExpertsMoe, Architecture):
    name = "deepseek2"
    rope_mode = ROPE_NORM
    experts = True
    own_head_dims = True

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.kv_lora = int(mf.arch_require("attention.kv_lora_rank"))
        self.q_lora = int(mf.arch_get("attention.q_lora_rank", 0) or 0)
        key_mla = int(mf.arch_get("attention.key_length_mla", 0) or 0)
        value_mla = int(mf.arch_get("attention.value_length_mla", 0) or 0)
        # files with the split up-projection give the latent's sizes as key/value_length
        # and the heads' as *_mla; older files give the heads' as key/value_length
        self.split = bool(key_mla and value_mla)
        qk_dim = key_mla if self.split else hp.head_dim
        self.v_dim = value_mla if self.split else int(mf.arch_get("attention.value_length", hp.n_embd // hp.n_head))
        self.nope = qk_dim - hp.rope_dim
        if self.kv_lora <= 0 or self.nope <= 0 or self.v_dim <= 0 or self.q_lora < 0:
            raise ModelFileError(f"{mf.path}: latent attention with a latent of {self.kv_lora}, {self.nope} "
                                 f"unrotated of {qk_dim} key dims and values of {self.v_dim}: the file is corrupt")
        if self.kv_lora + hp.rope_dim > MAX_KEY_DIMS:
            raise UnsupportedModelError(f"{mf.path}: a latent of {self.kv_lora} with {hp.rope_dim} rotated dims "
                                        f"is more than the {MAX_KEY_DIMS} key dims pyllm's attention takes")
        self.attn_temperature = self.file_attn_temperature()   # Mistral Large 3, Mistral 4
        hp.head_dim = qk_dim   # the softmax's 1/sqrt(d) is over the heads' keys, nope + rope
        self.read_ends()
        self.layers = [Layer(attn_norm=self.vector(f"blk.{i}.attn_norm.weight", hp.n_embd), attn=self.mla_weights(i),
                             ffn_norm=self.vector(f"blk.{i}.ffn_norm.weight", hp.n_embd),
                             ffn=self.experts_of(i) or self.ffn_weights(i))
                       for i in range(hp.n_layer)]

    # -- weights -------------------------------------------------------------------------------------
    def mla_weights(self, i: int) -> Mla:
        hp, p = self.hp, f"blk.{i}."
        H, qk = hp.n_head, self.nope + hp.rope_dim
        a = Mla(wkv_a=self.weight(p + "attn_kv_a_mqa.weight", hp.n_embd, self.kv_lora + hp.rope_dim),
                kv_a_norm=self.vector(p + "attn_kv_a_norm.weight", self.kv_lora),
                wk_b=None, wv_b=None, wo=self.weight(p + "attn_output.weight", H * self.v_dim, hp.n_embd))
        if self.q_lora:
            a.wq_a = self.weight(p + "attn_q_a.weight", hp.n_embd, self.q_lora)
            a.q_a_norm = self.vector(p + "attn_q_a_norm.weight", self.q_lora)
            a.wq_b = self.weight(p + "attn_q_b.weight", self.q_lora, H * qk)
        else:
            a.wq = self.weight(p + "attn_q.weight", hp.n_embd, H * qk)
        if self.split:
            a.wk_b = self.expert_weights(p + "attn_k_b.weight", self.nope, self.kv_lora, H)
            a.wv_b = self.expert_weights(p + "attn_v_b.weight", self.kv_lora, self.v_dim, H)
        else:
            a.wk_b, a.wv_b = self.split_kv_b(self.weight(p + "attn_kv_b.weight", self.kv_lora,
                                                         H * (self.nope + self.v_dim)))
        return a

    def split_kv_b(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """(wk_b, wv_b) of an unsplit attn_kv_b, whose rows are per head [Wk_i (nope rows) ;
        Wv_i (v_dim rows)] of kv_lora inputs: Wk_i^T dequantized to F16 (a transpose cannot
        stay quantized), Wv_i's rows copied as they are stored."""
        H, nope, v, lat = self.hp.n_head, self.nope, self.v_dim, self.kv_lora
        rows = t.data.reshape(H, nope + v, t.row_bytes)
        wv = np.ascontiguousarray(rows[:, nope:]).reshape(-1)
        k_rows = np.ascontiguousarray(rows[:, :nope]).reshape(-1)
        wk = dequantize(k_rows, GGMLQuantizationType(t.type)).reshape(H, nope, lat)
        wk = np.ascontiguousarray(wk.transpose(0, 2, 1), dtype=np.float16).view(np.uint8).reshape(-1)
        name = t.name.replace("attn_kv_b", "attn_{}_b")
        return (Tensor(name.format("k"), int(GGMLQuantizationType.F16), (nope, lat, H), 0, wk.nbytes, wk),
                Tensor(name.format("v"), t.type, (lat, v, H), 0, wv.nbytes, wv))

    def default_gating(self) -> int:
        """Softmax (DeepSeek V2/V2.5 files do not say), but sigmoids for GLM-4.7-Flash,
        recognized as llama.cpp recognizes it (47 or 48 layers, 154880 tokens)."""
        hp = self.hp
        return GATING_SIGMOID if hp.n_layer in (47, 48) and hp.n_vocab == 154880 else GATING_SOFTMAX

    # -- settings ------------------------------------------------------------------------------------
    @property
    def attn_scale(self) -> float:
        """1/sqrt(nope + rope), times YaRN's m^2 where the file sets YaRN (RoPE's own attention
        factor stays 1: HF's mscale / mscale_all_dim, equal in the released configs)."""
        hp, scale = self.hp, 1.0
        if hp.rope_yarn is not None:
            log_mul = float(self.mf.arch_get("rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
            scale = (1.0 + log_mul * math.log(1.0 / hp.rope_freq_scale)) ** 2
        return scale / math.sqrt(hp.head_dim)

    def build(self, g: Graph) -> None:
        hp = self.hp
        x = embed(g, self)
        for i, L in g.layers(self.layers, x):
            latent_attention(g, self, g.rmsnorm(x, L.attn_norm, hp.eps, "h"), L.attn, i, out=x)
            ffn(g, g.rmsnorm(x, L.ffn_norm, hp.eps, "h"), L.ffn, self.glu, out=x)
        output_head(g, self, x)


def latent_attention(g: Graph, arch: Deepseek2, h: View, a: Mla, layer: int, out: str | View,
                     accumulate: bool = True) -> View:
    """out += Wo [Wv_i attention_i]_i, the absorbed form of the module docstring's MLA:
    queries [Wk_i^T q_nope_i | q_pe_i] against the cached [c | k_pe], values c."""
    hp = arch.hp
    H, nope, n_rot, lat = hp.n_head, arch.nope, hp.rope_dim, arch.kv_lora
    qk, mk = nope + n_rot, lat + n_rot          # a head's key dims, as trained and as cached
    if a.wq is not None:
        q = g.linear(h, a.wq, "q")
    else:
        q_a = g.linear(h, a.wq_a, "q_a")
        q = g.linear(g.rmsnorm(q_a, a.q_a_norm, hp.eps, q_a), a.wq_b, "q")
    kv = g.linear(h, a.wkv_a, "kv")             # [c | k_pe]
    c, k_pe = kv.cols(0, lat), kv.cols(lat, n_rot)
    g.rmsnorm(c, a.kv_a_norm, hp.eps, c)
    r = arch.layer_rope(layer)
    q_pe = q.cols(nope, q.width - nope)         # head i's q_pe at nope + i qk
    g.rope(q_pe, None, H, 1, qk, n_rot, r.mode, r.base, r.scale, r.factors)
    g.rope(None, k_pe, H, 1, n_rot, n_rot, r.mode, r.base, r.scale, r.factors)
    q_nope = g.copy(q, g.buffer("q_nope", H * nope), nope, H, qk, nope)
    q_lat = g.linear_heads(q_nope, a.wk_b, "q_lat")
    q_mla = g.buffer("q_mla", H * mk)
    g.copy(q_lat, q_mla, lat, H, lat, mk)
    g.copy(q_pe, q_mla.cols(lat, q_mla.width - lat), n_rot, H, qk, mk)
    temperature = arch.layer_attn_temperature(layer)
    if temperature is not None:
        g.pos_scale(q_mla, *temperature)
    o_lat = g.attention(q_mla, kv, None, H, 1, mk, arch.layer_attn_scale(layer), "o_lat",
                        window=arch.layer_window(layer), head_dim_v=lat)
    return g.linear(g.linear_heads(o_lat, a.wv_b, "o_heads"), a.wo, out, accumulate=accumulate)


class Plm(Deepseek2):
    """PLM (`plm`: PLM-Team's PLM-1.8B): DeepSeek 2's latent attention (q from attn_q, one attn_kv_b)
    and an ungated squared-ReLU FFN in every layer, no experts; the logits through the token
    embedding, as llama.cpp reads it (it loads no output.weight for plm)."""
    name = "plm"
    experts = False
    gated = False
    glu = GLU_RELU_SQR

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.output = self.tok_embd


class Mistral4(Deepseek2):
    """Mistral 4 (`mistral4`: Mistral Small 4): DeepSeek 2's latent attention and experts, the
    experts' gate and up stored as one ffn_gate_up_exps, and (where set) Llama 4's attention
    temperature; llama.cpp runs it with DeepSeek 2's graph."""
    name = "mistral4"
    experts = True
