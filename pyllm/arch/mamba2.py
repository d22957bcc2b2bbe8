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
from .base import Architecture, HParams, Layer
from .blocks import attention, embed, output_head
from .llama import Llama


class Mamba2(Architecture):
    name = "mamba2"

    def __init__(self, mf, n_ctx=None):
        self.mf, self.n_ctx = mf, n_ctx
        self.hp = attention_free_hparams(mf)
        self.rope_freqs, self.window = None, 0
        self.read_ends()
        self.layers = [Layer(attn_norm=self.vector(f"blk.{i}.attn_norm.weight", self.hp.n_embd),
                             attn=self.mixer_weights(i), ffn_norm=None, ffn=None) for i in range(self.hp.n_layer)]

    def mixer_weights(self, i: int):
        """Layer i's mixer, the family's kind."""
        return self.ssm_weights(i)

    @property
    def attn_scale(self) -> float:
        return 0.0   # no attention

    def build(self, g: Graph) -> None:
        x = embed(g, self)
        for i, L in g.layers(self.layers, x):
            attention(g, self, g.rmsnorm(x, L.attn_norm, self.hp.eps, "h"), L.attn, i, out=x)
        output_head(g, self, x)


class Mamba(Mamba2):
    """Mamba 1: Falcon Mamba's files set ssm.dt_b_c_rms (dt, B and C RMS-normed without weights)."""
    name = "mamba"

    def mixer_weights(self, i: int):
        return self.mamba1_weights(i)


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


class Jamba(Llama):
    """Jamba (`jamba`: AI21's Jamba, Jamba 1.5/1.6/1.7 Mini and Large): layers whose head_count_kv
    is 0 mix tokens by a Mamba 1 mixer (dt, B and C RMS-normed by their own weights), the others
    by attention without any position encoding (GQA); every layer then its FFN, dense SwiGLU or,
    where the layer has a router, experts (the softmax over all, the chosen ones' values not
    renormalized, times expert_weights_scale, as llama.cpp).

        h = rmsnorm(x) ; x += mamba1(h) or attention(h)
        h = rmsnorm(x) ; x += ffn(h) or experts(h)
    """
    name = "jamba"
    rotary = False
    kv_per_layer = True
    experts = True
    moe_norm = False

    def __init__(self, mf, n_ctx=None):
        Architecture.__init__(self, mf, n_ctx)
        hp = self.hp
        self.read_ends()
        kv_heads = hp.kv_heads or [hp.n_head_kv] * hp.n_layer
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            mixer = self.attention_weights(i) if kv_heads[i] else self.mamba1_weights(i)
            self.layers.append(Layer(attn_norm=self.vector(p + "attn_norm.weight", hp.n_embd), attn=mixer,
                                     ffn_norm=self.vector(p + "ffn_norm.weight", hp.n_embd), ffn=self.layer_ffn(i)))

    def layer_ffn(self, i: int):
        m = self.moe_weights(i)
        if m is None:
            return self.ffn_weights(i)
        m.scale = float(self.mf.arch_get("expert_weights_scale", 0.0) or 1.0)
        return m

    def moe_layer(self, i: int) -> bool:
        return self.mf.has_tensor(f"blk.{i}.ffn_gate_inp.weight")

    def sliding_window(self) -> int:
        return 0
