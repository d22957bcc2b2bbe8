"""Mamba 2 (`mamba2`: state-spaces' mamba2-130m..2.7b, Codestral Mamba 7B) and Mamba 1
(`mamba`: state-spaces' mamba-130m..2.8b, Falcon Mamba 7B): a stack of Mamba mixers and
nothing else, no attention and no FFN.

    x = embed(tokens)
    for each layer:  x += mamba2(rmsnorm(x))     # Ssm in base.py: conv, selective scan, gated norm
                  (or x += mamba1(rmsnorm(x))    # Ssm1: conv, x_proj, dt_proj, scan with A per state)
    logits = Wout rmsnorm(x)

The file has no attention keys (its head_count and feed_forward_length are 0, as the
converter writes them); the ssm.* keys size the mixers.
"""
from __future__ import annotations

from ..errors import ModelFileError
from ..graph import Graph
from .base import Architecture, HParams, Layer, Ssm1
from .blocks import attention, embed, output_head


class Mamba2(Architecture):
    name = "mamba2"

    def __init__(self, mf, n_ctx=None):
        self.mf, self.n_ctx = mf, n_ctx
        self.hp = attention_free_hparams(mf)
        self.rope_freqs, self.window = None, 0
        self.read_ends()
        self.layers = [Layer(attn_norm=self.vector(f"blk.{i}.attn_norm.weight", self.hp.n_embd),
                             attn=self.ssm_weights(i), ffn_norm=None, ffn=None) for i in range(self.hp.n_layer)]

    @property
    def attn_scale(self) -> float:
        return 0.0   # no attention

    def build(self, g: Graph) -> None:
        x = embed(g, self)
        for i, L in g.layers(self.layers, x):
            attention(g, self, g.rmsnorm(x, L.attn_norm, self.hp.eps, "h"), L.attn, i, out=x)
        output_head(g, self, x)


class Mamba(Mamba2):
    """Mamba 1: Falcon Mamba's files set ssm.dt_b_c_rms (dt, B and C RMS-normed without weights);
    Jamba's per-layer dt/B/C norm weights are refused (Jamba is not supported)."""
    name = "mamba"

    def __init__(self, mf, n_ctx=None):
        self.mf, self.n_ctx = mf, n_ctx
        self.hp = attention_free_hparams(mf)
        self.rope_freqs, self.window = None, 0
        self.refuse_tensor("blk.0.ssm_dt_norm.weight", "dt, B and C norm weights")
        self.read_ends()
        self.layers = [Layer(attn_norm=self.vector(f"blk.{i}.attn_norm.weight", self.hp.n_embd),
                             attn=self.mamba1_weights(i), ffn_norm=None, ffn=None) for i in range(self.hp.n_layer)]

    def mamba1_weights(self, i: int) -> Ssm1:
        """Layer i's Mamba 1 mixer, sized by the file's ssm.* keys (time_step_rank: dt's rank)."""
        mf, hp, p = self.mf, self.hp, f"blk.{i}."
        d_conv, d_inner, d_state, dt_rank = (int(mf.arch_require("ssm." + k)) for k in (
            "conv_kernel", "inner_size", "state_size", "time_step_rank"))
        if min(d_conv, d_inner, d_state, dt_rank) <= 0 or d_conv > 64:
            raise ModelFileError(f"{mf.path}: Mamba sizes (conv {d_conv}, inner {d_inner}, state {d_state}, "
                                 f"dt rank {dt_rank}) do not fit together; the file is corrupt")
        return Ssm1(in_proj=self.weight(p + "ssm_in.weight", hp.n_embd, 2 * d_inner),
                    conv=self.floats(p + "ssm_conv1d.weight", d_conv, d_inner),
                    conv_bias=self.vector(p + "ssm_conv1d.bias", d_inner),
                    x_proj=self.weight(p + "ssm_x.weight", d_inner, dt_rank + 2 * d_state),
                    dt_proj=self.weight(p + "ssm_dt.weight", dt_rank, d_inner),
                    dt_bias=self.vector(p + "ssm_dt.bias", d_inner),
                    a=self.floats(p + "ssm_a", d_state, d_inner), d=self.floats(p + "ssm_d", d_inner),
                    out_proj=self.weight(p + "ssm_out.weight", d_inner, hp.n_embd), dt_rank=dt_rank,
                    d_state=d_state, bc_norm=bool(mf.arch_get("ssm.dt_b_c_rms", False)))


def attention_free_hparams(mf) -> HParams:
    """The hyperparameters of a family without attention or FFN: their sizes 0."""
    tokens = mf.get("tokenizer.ggml.tokens")
    hp = HParams(n_vocab=len(tokens) if tokens is not None else int(mf.arch_require("vocab_size")),
                 n_embd=int(mf.arch_require("embedding_length")), n_layer=int(mf.arch_require("block_count")),
                 n_head=0, n_head_kv=0, head_dim=0, n_ff=0,
                 eps=float(mf.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
                 n_ctx_train=int(mf.arch_get("context_length", 1 << 20)), rope_base=10000.0, rope_dim=0,
                 rope_freq_scale=1.0)
    for name in ("n_embd", "n_layer", "n_vocab"):
        if getattr(hp, name) <= 0:
            raise ModelFileError(f"{mf.path}: hyperparameter {name} = {getattr(hp, name)} is not positive")
    if hp.n_layer > len(mf.tensors):
        raise ModelFileError(f"{mf.path}: block_count {hp.n_layer} is more than the file's {len(mf.tensors)} "
                             f"tensors; the file is corrupt")
    return hp
