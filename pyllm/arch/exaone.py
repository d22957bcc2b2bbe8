"""LG EXAONE 3 (`exaone`) and EXAONE 4 (`exaone4`).

EXAONE 3 is the Llama block with NEOX RoPE (and Llama 3's optional
rope_freqs). EXAONE 4 moves the norms to the branch outputs, as OLMo 2,
with RMSNorm on each head of q and k:

    for each layer:
        q, k, v = Wq x, Wk x, Wv x ; q, k = rmsnorm_per_head(q), rmsnorm_per_head(k)
        rope(q, k)                                   # NEOX; not on global layers, see below
        x += rmsnorm(Wo attention(q, K, V))
        x += rmsnorm(Wdown (silu(Wgate x) * Wup x))
    logits = Wout rmsnorm(x)

As llama.cpp reads an exaone4 file: only the 64-layer model (32B) has
sliding-window layers, 3 of every 4 (i % 4 < 3), of
`attention.sliding_window` tokens (absent: 4096); its other layers attend
over the whole context without RoPE. The smaller models use RoPE and the
whole context in every layer.
"""
from __future__ import annotations

from ..errors import ModelFileError
from ..graph import ROPE_NEOX
from .base import Architecture, LocalGlobalLayers, Rope, sliding_layers
from .blocks import PostNormDecoder
from .llama import Llama
from .qwen3 import Dots1

SWA_WINDOW, N_LAYER_SWA = 4096, 64
SWA_PERIOD = 4   # EXAONE MoE: layers 0-2 of every 4 local, unless the file's pattern says otherwise


class Exaone(Llama):
    name = "exaone"
    rope_mode = ROPE_NEOX

    def sliding_window(self) -> int:
        return 0


class Exaone4(LocalGlobalLayers, PostNormDecoder):
    name = "exaone4"
    rope_mode = ROPE_NEOX

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends()
        self.rope_freqs = self.optional_vector("rope_freqs.weight", hp.rope_dim // 2)
        self.window = int(mf.arch_get("attention.sliding_window", SWA_WINDOW)) if hp.n_layer == N_LAYER_SWA else 0
        self.layers = [self.post_norm_layer(i, self.attention_weights(i, qk_norm=True), input_norms=False)
                       for i in range(hp.n_layer)]


class ExaoneMoe(Dots1):
    """EXAONE MoE (`exaone-moe`: K-EXAONE 236B-A23B): pre-norm layers with per-head q/k norms,
    DeepSeek's experts after the leading dense layers (the file's gating, exp_probs_b to choose)
    and a shared expert expert_shared_feed_forward_length wide; the layers that
    attention.sliding_window_pattern marks (default 3 of every 4) attend over
    attention.sliding_window tokens with NEOX RoPE, the others over the whole context without
    RoPE. The last nextn_predict_layers blocks (multi-token prediction) are not run. As in
    llama.cpp's graph, every rotated layer turns by rope.freq_base (freq_base_swa is not read)."""
    name = "exaone-moe"
    experts = "required"

    def __init__(self, mf, n_ctx=None):
        Architecture.__init__(self, mf, n_ctx)
        hp = self.hp
        self.drop_prediction_layers()
        mf.arch_require("attention.sliding_window")
        self.window, self.is_swa = sliding_layers(mf, hp.n_layer, SWA_PERIOD)
        if self.window <= 0:
            raise ModelFileError(f"{mf.path}: exaone-moe.attention.sliding_window is {self.window}; "
                                 f"the file is corrupt")
        self.read_ends()
        self.rope_freqs = self.optional_vector("rope_freqs.weight", hp.rope_dim // 2)
        self.layers = self.moe_layers()

    def shared_expert(self, i: int):
        n = int(self.mf.arch_get("expert_shared_feed_forward_length", 0) or 0) or self.expert_width(0)
        return self.shared_ffn(i, n)

    def layer_rope(self, i: int) -> Rope:
        r = super().layer_rope(i)
        return r if self.is_swa[i] else r.off()
