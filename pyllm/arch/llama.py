"""Llama (and the files that share its layout: SmolLM2, Llama 2/3, Mistral).

    x = embed(tokens)
    for each layer:
        h = rmsnorm(x) ; q, k, v = Wq h, Wk h, Wv h ; rope(q, k)
        x += Wo attention(q, K, V)
        h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)
    logits = Wout rmsnorm(x)

RoPE rotates adjacent pairs (llama.cpp's "normal" mode: the GGUF converter
permuted Wq and Wk to match). Llama 3.1+ files carry `rope_freqs.weight`,
per-pair divisors of the RoPE frequencies, used as they are.

Mistral 7B files say `llama` too. When a file sets
`llama.attention.sliding_window`, every layer attends over that many tokens
(Mistral v0.1 was trained so). llama.cpp's llama loader does not read the
key and attends over the whole context: the two agree on sequences up to
the window and differ after it.

Optional tensors llama.cpp also accepts for this layout are honoured: a
fused attn_qkv, q/k/v/output biases, FFN biases.

Mixtral files say `llama` too, with `llama.expert_count` experts per layer:
the router (ffn_gate_inp) picks `expert_used_count` of them per token, and
their SiLU-gated FFNs (ffn_{gate,up,down}_exps) are summed with the softmax
of the chosen router logits as weights.
"""
from __future__ import annotations

from ..errors import ModelFileError
from ..graph import GLU_SILU, ROPE_NEOX, ROPE_NORM, Graph
from .base import Architecture, Layer
from .blocks import attention, ffn, output_head


class Llama(Architecture):
    name = "llama"
    rope_mode = ROPE_NORM
    glu = GLU_SILU
    qk_norm = False      # per-head q/k RMSNorm weights required (Qwen 3)
    qkv_bias = False     # q/k/v biases required (Qwen 2)
    experts = True       # Mixtral
    ffn_norm_name = "ffn_norm"   # the FFN's input norm (Seed-OSS: post_attention_norm)

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        hp = self.hp
        self.read_ends()
        self.rope_freqs = self.optional_vector("rope_freqs.weight", hp.rope_dim // 2)
        self.window = self.sliding_window()
        self.layers = [Layer(attn_norm=self.vector(f"blk.{i}.attn_norm.weight", hp.n_embd),
                             attn=self.attention_weights(i, qk_norm=self.qk_norm, biases=self.qkv_bias),
                             ffn_norm=self.vector(f"blk.{i}.{self.ffn_norm_name}.weight", hp.n_embd),
                             ffn=self.layer_ffn(i))
                       for i in range(hp.n_layer)]

    def layer_ffn(self, i: int):
        """Layer i's FFN: its experts where the file has them, else the dense one."""
        return self.moe_weights(i) or self.ffn_weights(i)

    def sliding_window(self) -> int:
        return int(self.mf.arch_get("attention.sliding_window", 0) or 0)

    def build(self, g: Graph) -> None:
        hp = self.hp
        x = g.embed(self.tok_embd, "x", scale=self.embed_scale)
        for i, L in g.layers(self.layers, x, deepstack=(self.tok_embd, self.deepstack)):
            if i - 1 in self.loop_norms:   # between passes of a looped stack, after the control vector (Nanbeige)
                g.rmsnorm(x, self.out_norm, hp.eps, x)
            attention(g, self, g.rmsnorm(x, L.attn_norm, hp.eps, "h"), L.attn, i, out=x)
            ffn(g, g.rmsnorm(x, L.ffn_norm, hp.eps, "h"), L.ffn, self.glu, out=x)
        output_head(g, self, x)


class Mistral3(Llama):
    """Mistral 3 (`mistral3`: Ministral 3 3B/8B/14B, Mistral Small 3.x text): the
    Llama block (YaRN in the released files) and, where `attention.temperature_scale`
    s is set, q scaled by 1 + s ln(1 + floor(p / L)) at position p, L the original
    context (`attention.temperature_length`, else `rope.scaling.original_context_length`)."""
    name = "mistral3"

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.attn_temperature = self.file_attn_temperature()


class SeedOss(Llama):
    """Seed-OSS (`seed_oss`: ByteDance's Seed-OSS-36B): the Llama block with NEOX RoPE, q/k/v
    biases where the file has them, the FFN's norm stored as post_attention_norm, and the
    softmax scale of attention.scale where set."""
    name = "seed_oss"
    rope_mode = ROPE_NEOX
    experts = False
    ffn_norm_name = "post_attention_norm"

    def sliding_window(self) -> int:
        return 0

    @property
    def attn_scale(self) -> float:
        return float(self.mf.arch_get("attention.scale", 0.0) or 0.0) or super().attn_scale


class InternLM2(Llama):
    """InternLM 2 and 2.5 (`internlm2`): the Llama block (the converter splits its fused wqkv
    into attn_q/k/v and permutes q and k for adjacent-pair RoPE); no window, no experts."""
    name = "internlm2"
    experts = False

    def sliding_window(self) -> int:
        return 0


class Xverse(InternLM2):
    """XVERSE (`xverse`: 7B/13B/65B): the Llama block, as InternLM 2's."""
    name = "xverse"
    experts = False


class Refact(InternLM2):
    """Refact (`refact`: Refact-1.6B): the Llama block with ALiBi's linear position biases (maximum
    bias 8, as llama.cpp) in place of RoPE."""
    name = "refact"
    experts = False
    alibi = 8.0
    rotary = False


class Baichuan(InternLM2):
    """Baichuan and Baichuan 2 (`baichuan`): the Llama block; the 7B (32 layers) with RoPE, the 13B
    (40) with ALiBi (maximum bias 8), as llama.cpp tells them apart. llama.cpp runs any other
    depth with neither (no positions at all); pyllm gives it ALiBi, as the 13B."""
    name = "baichuan"
    experts = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.alibi = 0.0 if self.hp.n_layer == 32 else 8.0
        self.rotary = not self.alibi


class LlamaEmbed(Llama):
    """Llama embedding models (`llama-embed`: llama-embed-nemotron-8b): the Llama block without the
    logits, every token attending both ways where the file says attention.causal = false (the
    converter's, from is_causal); its rows pooled as the file's pooling_type says."""
    name = "llama-embed"
    experts = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        self.causal = bool(mf.arch_get("attention.causal", True))

    def sliding_window(self) -> int:
        return 0


class OpenELM(Llama):
    """OpenELM (`openelm`: Apple's OpenELM 270M-3B): the Llama block whose query and key/value head
    counts and FFN width differ from layer to layer (head_count, head_count_kv and
    feed_forward_length are lists), one fused attn_qkv of [q | k | v] per layer, RMSNorms of q and
    k per head, NEOX RoPE; the output tied to the embedding."""
    name = "openelm"
    rope_mode = ROPE_NEOX
    qk_norm = True
    kv_per_layer = "mixed"
    experts = False

    def sliding_window(self) -> int:
        return 0

    def block_notes(self) -> str:
        hp = self.hp
        return (f"; per layer {min(hp.heads)}-{max(hp.heads)} query heads, {min(hp.kv_heads)}-{max(hp.kv_heads)} "
                f"KV heads, FFN {min(hp.ff_widths)}-{max(hp.ff_widths)}" if hp.heads and hp.kv_heads and hp.ff_widths
                else "")

    def build(self, g: Graph) -> None:
        g.grow_buffers = True   # q, k, v and the FFN's rows differ in width from layer to layer
        super().build(g)


class Qwen(Llama):
    """Qwen 1 (`qwen`: Qwen-1.8B/7B/14B/72B and their chat models): the Llama block with one fused
    attn_qkv and its bias, NEOX RoPE; the file's feed_forward_length is Qwen's intermediate_size,
    the gate's and the up matrix's rows together, so each FFN matrix is half as wide (as llama.cpp
    reads it)."""
    name = "qwen"
    rope_mode = ROPE_NEOX
    qkv_bias = True
    experts = False

    def adjust_hparams(self, hp) -> None:
        if hp.n_ff % 2:
            raise ModelFileError(f"{self.mf.path}: qwen's feed_forward_length {hp.n_ff} is odd; it holds two "
                                 f"matrices' widths")
        hp.n_ff //= 2

    def sliding_window(self) -> int:
        return 0


class Nanbeige(Llama):
    """Nanbeige (`nanbeige`: Nanbeige 4.x 3B): the Llama block, its stack run `num_loops` times (a
    looped transformer: each pass the same weights, its own KV cache), x replaced by the output
    norm of x between passes unless `skip_loop_final_norm`. (llama.cpp's loader reads no
    attention.scale for it, nor does pyllm: the softmax scale is 1 / sqrt(head_dim).)"""
    name = "nanbeige"
    experts = False

    def __init__(self, mf, n_ctx=None):
        super().__init__(mf, n_ctx)
        loops = int(mf.arch_get("num_loops", 1) or 1)
        if not 1 <= loops <= 64:
            raise ModelFileError(f"{mf.path}: nanbeige.num_loops {loops} outside 1..64; the file is corrupt")
        passes = len(self.layers)
        self.layers = self.layers * loops
        self.hp.n_layer = len(self.layers)
        if not mf.arch_get("skip_loop_final_norm", False):
            self.loop_norms = tuple(passes * j - 1 for j in range(1, loops))

    def sliding_window(self) -> int:
        return 0
