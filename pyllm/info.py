"""What a model file is and what running it takes: the data behind `pyllm info`.

Everything here is read from the file's header and hyperparameters (no
weight is touched): the architecture and its shape, parameter count and
tensor types, context, RoPE and attention settings per layer, the
vocabulary, whether a chat template is present, and the memory a run at a
given context needs: the mmapped weights, the KV cache (f16 K and V for
every layer, in whole blocks) and the activation buffers of the op program.
"""
from __future__ import annotations

import os

from dataclasses import asdict, dataclass, field
from typing import Optional

from .backend.base import kv_row_bytes
from .arch import load_architecture
from .arch.base import Attn, ChannelMix, DeltaNet, Mla, Moe, ShortConv, Ssm, Ssm1
from .graph import GLU_GELU_TANH, GLU_RELU, GLU_RELU_SQR, GLU_SWIGLU_OAI, GLU_XIELU, MOE_SIGMOID, NORM_LAYER, ROPE_NEOX, Graph, act_row_bytes
from .model_file import ModelFile
from .chat_template import THINKING_SWITCH
from .units import fmt_layers

from .defaults import BLOCK_SIZE, DEFAULT_MAX_CTX, N_BATCH, N_OUT_MAX

VOCAB_TYPES = {"gpt2": "BPE (GPT-2 style)", "gemma4": "BPE over UTF-8 (Gemma 4)", "llama": "SentencePiece",
               "bert": "WordPiece",
               "t5": "SentencePiece Unigram (T5, XLM-RoBERTa)", "rwkv": "RWKV"}


@dataclass
class LayerGroup:
    """Layers that share their RoPE and attention settings."""
    layers: list[int]
    rope_dims: int            # 0: no RoPE in these layers
    rope_base: float
    rope_freq_scale: float
    rope_freq_factors: bool
    window: int
    attn_scale: float
    chunked: bool = False                    # the window is a chunk (Llama 4)
    temperature: Optional[tuple] = None      # (s, period, offset): q scaled by position


@dataclass
class ModelInfo:
    path: str
    name: str
    architecture: str
    file_type: str
    n_params: int
    tensor_types: dict[str, int]
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx_train: int
    n_ctx: int
    block: str                # how a layer is wired: norms, FFN, residual
    rope_mode: str
    rope_dims: int
    rope_scaling: str
    attn_scale: float
    attn_softcap: float
    final_softcap: float
    alibi: float              # ALiBi's maximum bias, 0 = none
    layer_groups: list[LayerGroup]
    vocab_type: str
    n_vocab: int
    chat_template: bool
    file_bytes: int
    weight_bytes: int
    kv_bytes: int
    activation_bytes: int
    state_bytes: int = 0      # recurrent layers' state (Mamba): a fixed size, whatever the context
    pooling: str = ""         # an encoder's: how its rows become one embedding ("none": one per token)
    dense_out: list = field(default_factory=list)   # widths through an embedding's dense projections
    thinking_switch: bool = False   # the chat template has enable_thinking (--think / --no-think)
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.state_bytes + self.activation_bytes

    def as_dict(self) -> dict:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d

    def _memory(self) -> str:
        return _memory_line(self)

    def _template(self) -> str:
        if not self.chat_template:
            return "none"
        return "present, with a thinking switch (--think / --no-think)" if self.thinking_switch else "present"

    def format(self) -> str:
        """The human-readable report `pyllm info` prints."""
        rows = [
            ("model", self.path),
            ("name", self.name or "-"),
            ("architecture", f"{self.architecture}: {self.n_layer} layers, {self.n_embd} wide, " + (
                "no attention, no FFN" if not self.n_head else
                f"{self.n_head} linear-attention heads of {self.head_dim}, FFN {self.n_ff}" if not self.attn_scale
                else f"{self.n_head} heads of {self.head_dim}, {self.n_head_kv} KV heads, FFN {self.n_ff}")),
            ("parameters", f"{self.n_params / 1e6:.1f} M ({self.n_params:,})"),
            ("tensor types", ", ".join(f"{k} {v}" for k, v in self.tensor_types.items())
             + (f" (file type {self.file_type})" if self.file_type else "")),
            ("block", self.block),
            ("context", f"{self.n_ctx_train} trained, {self.n_ctx} chosen (-c)"),
        ]
        if not self.n_head or not self.attn_scale:   # Mamba, RWKV: nothing below is about them
            rows += [("vocabulary", f"{self.vocab_type}, {self.n_vocab} tokens"),
                     ("chat template", self._template()),
                     ("memory", self._memory())]
            return "\n".join(f"{k:<14} {v}" for k, v in rows + [("note", n) for n in self.notes])
        rows.append(("RoPE", f"{self.rope_mode}, {self.rope_dims} of {self.head_dim} dims rotated, scaling "
                             f"{self.rope_scaling}"))
        for grp in self.layer_groups:
            which = ("all layers" if len(grp.layers) == self.n_layer else
                     f"layer{'s' if len(grp.layers) > 1 else ''} {fmt_layers(grp.layers)}")
            rope = f"base {_num(grp.rope_base)}" if grp.rope_dims else "no RoPE"
            if grp.rope_dims and grp.rope_dims != self.rope_dims:   # layers of their own head size (Gemma 4)
                rope += f", {grp.rope_dims} dims rotated"
            if grp.rope_freq_scale != 1.0:
                rope += f", position scale {grp.rope_freq_scale:g}"
            if grp.rope_freq_factors:
                rope += ", per-pair frequency factors"
            attn = (f"{'chunks' if grp.chunked else 'sliding window'} of {grp.window}" if grp.window
                    else "whole context")
            if grp.window and self.pooling:   # an encoder's window reaches both ways
                attn = f"the {grp.window // 2} positions either way"
            if grp.temperature is not None:   # Mistral 3, Llama 4
                s, period, offset = grp.temperature
                attn += f", q times 1 + {s:g} ln(1 + floor((p + {offset:g}) / {period}))"
            if grp.attn_scale != self.attn_scale:   # layers that scale q.k their own way (OLMo 3)
                attn += f", softmax scale {grp.attn_scale:.6g}"
            rows.append(("", f"{which}: {rope}; attention over {attn}"))
        attention = f"softmax scale {self.attn_scale:.6g}"
        if self.attn_softcap > 0:
            attention += f", scores soft-capped at {self.attn_softcap:g} (c * tanh(s / c))"
        if self.alibi > 0:
            attention += f", ALiBi position biases (maximum {self.alibi:g})"
        if self.final_softcap > 0:
            attention += f"; logits soft-capped at {self.final_softcap:g}"
        rows += [
            ("attention", attention),
            *([("embeddings", f"{self.n_embd} dims, {self.pooling} pooling of the rows (`pyllm embed`)"
                              + (f", through dense projections {' -> '.join(map(str, self.dense_out))}"
                                 if self.dense_out else "") + "; no text generation")] if self.pooling else []),
            ("vocabulary", f"{self.vocab_type}, {self.n_vocab} tokens"),
            ("chat template", self._template()),
            ("memory", self._memory()),
        ]
        rows += [("note", n) for n in self.notes]
        return "\n".join(f"{k:<14} {v}" for k, v in rows)


def _memory_line(info: "ModelInfo") -> str:
    mib = 1 << 20
    return (f"{info.total_bytes / mib:.1f} MiB at {info.n_ctx} tokens: weights {info.weight_bytes / mib:.1f} MiB "
            f"(mmapped from the file), KV cache {info.kv_bytes / mib:.1f} MiB, "
            + (f"recurrent state {info.state_bytes / mib:.1f} MiB, " if info.state_bytes else "")
            + f"activations {info.activation_bytes / mib:.1f} MiB")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def describe_block(arch) -> str:
    """One line on how arch's layers are wired, e.g. "LayerNorm before attention
    and FFN, side by side (one norm); FFN gelu_tanh(up), not gated"."""
    L = arch.layers[0]
    norm = "LayerNorm" if arch.norm == NORM_LAYER else "RMSNorm"
    if arch.norm_after_residual:   # BERT: the norms take the residual sums
        where = f"{norm} of the residual after attention and after the FFN"
    elif L.attn_norm is None:
        where = f"{norm} after attention and FFN (no input norms)"
    elif L.parallel:
        where = f"{norm} before attention and FFN, side by side ({'two norms' if L.ffn_norm is not None else 'one norm'})"
    else:
        where = f"{norm} before attention and FFN" + (", and after each" if L.post_attn_norm is not None else "")
    act = {GLU_GELU_TANH: "gelu_tanh", GLU_SWIGLU_OAI: "swiglu_oai", GLU_RELU_SQR: "relu^2",
           GLU_RELU: "relu", GLU_XIELU: "xielu"}.get(arch.glu, "silu")
    moe_layers = [i for i, x in enumerate(arch.layers) if isinstance(x.ffn, Moe)]
    if moe_layers:
        m = arch.layers[moe_layers[0]].ffn
        ffn = (f"FFN: {m.k} of {m.n_experts} experts per token, each {act}(gate) * up, weighted by their "
               f"{'renormalized ' if m.norm else ''}router {'sigmoids' if m.gating == MOE_SIGMOID else 'softmax'}")
        if m.weight_input:
            ffn += " (the weight scaling the expert's input)"
        if m.router_on_input:
            ffn += ", routed by the layer's input"
        if len(moe_layers) < len(arch.layers):   # dense leading or interleaved layers (DeepSeek, ERNIE)
            ffn += f" in layers {fmt_layers(moe_layers)}, dense elsewhere"
    else:
        F = next((x.ffn for x in arch.layers if x.ffn is not None), None)
        if F is None:
            ffn = "no FFN"
        elif isinstance(F, ChannelMix):   # RWKV
            ffn = f"RWKV channel mix, {'Wv' if F.receptance is None else 'sigmoid(Wr x_r) * Wv'} relu(Wk x_k)^2"
        else:
            ffn = f"FFN {act}(gate) * up" if F.gated else f"FFN {act}(up), not gated"
    alone = [i for i, x in enumerate(arch.layers) if x.attn is None]
    if alone:   # Nemotron-H
        ffn += " (one branch per layer: the FFN in layers " + fmt_layers(
            [i for i, x in enumerate(arch.layers) if x.attn is None]) + ")"
    qk = ""
    attn = next((x.attn for x in arch.layers if isinstance(x.attn, Attn)), None)
    if attn is not None and attn.q_norm is not None:
        qk = "; q/k RMSNorm " + ("per head" if len(attn.q_norm) <= arch.hp.head_dim else "over all heads")
    if isinstance(L.attn, Mla):   # DeepSeek 2/3
        qk = (f"; latent attention (MLA): a {arch.kv_lora}-dim latent and {arch.hp.rope_dim} rotated dims "
              f"cached per position, heads of {arch.hp.head_dim} key and {arch.v_dim} value dims")
    convs = [i for i, x in enumerate(arch.layers) if isinstance(x.attn, ShortConv)]
    if convs:   # LFM2
        qk += (f"; layers {fmt_layers(convs)}: a short convolution of {arch.layers[convs[0]].attn.conv.shape[1]} "
               f"taps in place of attention")
    ssms = [i for i, x in enumerate(arch.layers) if isinstance(x.attn, Ssm) or x.ssm is not None]
    if ssms:   # Granite 4.0-H, Nemotron-H, Mamba 2; Falcon-H1 beside the attention
        first = arch.layers[ssms[0]]
        m, side = (first.ssm, "beside") if first.ssm is not None else (first.attn, "in place of")
        qk += (f"; layers {fmt_layers(ssms)}: a Mamba 2 mixer {side} attention ({m.heads} heads of {m.head_dim}, "
               f"a state of {m.d_state} per channel, {m.groups} group{'s' if m.groups > 1 else ''}, a convolution "
               f"of {m.conv.shape[1]} taps)")
    mambas = [i for i, x in enumerate(arch.layers) if isinstance(x.attn, Ssm1)]
    if mambas:   # Mamba 1, Falcon Mamba
        m = arch.layers[mambas[0]].attn
        qk += (f"; layers {fmt_layers(mambas)}: a Mamba 1 mixer in place of attention ({m.d_inner} channels, a "
               f"state of {m.d_state} each, dt of rank {m.dt_rank}{', dt/B/C RMS-normed' if m.norms is not None else ''}, a "
               f"convolution of {m.conv.shape[1]} taps)")
    deltas = [i for i, x in enumerate(arch.layers) if isinstance(x.attn, DeltaNet)]
    if deltas:   # Qwen3.5
        d = arch.layers[deltas[0]].attn
        qk += (f"; layers {fmt_layers(deltas)}: linear attention by the gated delta rule in place of attention "
               f"({d.heads} value heads over {d.kv_heads} key heads of {d.head_dim}), the others' attention "
               f"gated by sigmoid")
    both_ways = "" if arch.causal else "; attention both ways (an encoder)"
    return f"{where}{both_ways}; {ffn}{qk}{arch.block_notes()}"


def model_info(path: str, n_ctx: Optional[int] = None, n_batch: int = N_BATCH,
               block_size: int = BLOCK_SIZE, n_out_max: int = N_OUT_MAX, k_type: int = 1, v_type: int = 1,
               overrides: Optional[dict] = None) -> ModelInfo:
    """Reads `path` and works out what running it with a context of n_ctx
    tokens (default: the training context, at most 4096) and a KV cache in
    formats k_type, v_type (f16: 1, q8_0: 8) needs."""
    mf = ModelFile(path, overrides=overrides)
    hp_ctx = int(mf.arch_get("context_length", 2048))
    if n_ctx is None:
        n_ctx = min(DEFAULT_MAX_CTX, hp_ctx)
    arch = load_architecture(mf, n_ctx=n_ctx)
    hp = arch.hp
    g = Graph()
    arch.build(g)

    # memory, as CpuBackend allocates it for this context
    n_blocks = -(-n_ctx // block_size)
    kv = sum(n_blocks * block_size * (kv_row_bytes(k_type, dk) + kv_row_bytes(v_type, dv))
             for dk, dv in g.kv_layers.values())
    rows_batch = min(n_batch, n_ctx)
    act = sum((rows_batch if b.rows == "batch" else n_out_max) * b.width * 4 for b in g.buffers.values())
    act += sum(rows_batch * act_row_bytes(q.act, q.n) for q in g.qbuffers.values())

    groups: list[LayerGroup] = []
    for i in range(hp.n_layer):
        r = arch.layer_rope(i)
        window = arch.layer_window(i)
        key = (r.n_rot, r.base, r.scale, r.factors is not None, window, arch.layer_attn_scale(i),
               arch.chunked_window and window > 0, arch.layer_attn_temperature(i))
        for grp in groups:
            if (grp.rope_dims, grp.rope_base, grp.rope_freq_scale, grp.rope_freq_factors, grp.window,
                    grp.attn_scale, grp.chunked, grp.temperature) == key:
                grp.layers.append(i)
                break
        else:
            groups.append(LayerGroup([i], *key))

    ft = mf.get("general.file_type")
    try:
        from gguf.constants import LlamaFileType
        file_type = LlamaFileType(int(ft)).name.removeprefix("MOSTLY_") if ft is not None else ""
    except ValueError:
        file_type = f"type {ft}"
    vocab_model = str(mf.get("tokenizer.ggml.model", ""))
    notes = []
    if mf.overrides:
        notes.append("metadata overridden: " + ", ".join(f"{k}={v!r}" for k, v in mf.overrides.items()))
    if len(mf.shards) > 1:
        notes.append(f"split into {len(mf.shards)} shards, {os.path.basename(mf.shards[0])} to "
                     f"{os.path.basename(mf.shards[-1])} (llama.cpp's gguf-split; `pyllm split --merge` joins them)")
    if arch.name == "llama" and arch.window:
        notes.append("llama.cpp ignores llama.attention.sliding_window; pyllm applies it")
    if g.states:
        notes.append("recurrent layers: a prompt reuses the cache only when it extends all of the previous one "
                     "(the next chat turn); otherwise it is computed again from the start")
    if arch.residual_scale != 1.0 or arch.logit_scale != 1.0:
        notes.append(f"embeddings x {arch.embed_scale:g}, each block's output x {arch.residual_scale:g} "
                     f"into the residual, logits x {arch.logit_scale:g}")
    sections = getattr(arch, "rope_sections", ())
    if sections:
        notes.append(f"M-RoPE: an image row's time, height and width positions turn {', '.join(map(str, sections))} "
                     f"pairs of each head{', interleaved' if arch.mrope_interleaved else ''} (text: plain RoPE)")
    if arch.deepstack:
        notes.append(f"DeepStack: an image row carries {arch.deepstack} more slices of {hp.n_embd}, added to the "
                     f"residual after layers 0..{arch.deepstack - 1}")
    return ModelInfo(
        path=str(path), name=str(mf.get("general.name", "")), architecture=arch.name, file_type=file_type,
        n_params=mf.n_params, tensor_types=mf.type_histogram(),
        n_layer=hp.n_layer, n_embd=hp.n_embd, n_head=hp.n_head, n_head_kv=hp.n_head_kv, head_dim=hp.head_dim,
        n_ff=hp.n_ff, n_ctx_train=hp.n_ctx_train, n_ctx=n_ctx,
        block=describe_block(arch),
        rope_mode="NEOX (halves)" if arch.rope_mode == ROPE_NEOX else "normal (adjacent pairs)",
        rope_dims=hp.rope_dim, rope_scaling=(f"yarn, factor {1 / hp.rope_freq_scale:g}" if hp.rope_yarn is not None
                                                   else hp.rope_scaling), attn_scale=arch.attn_scale,
        attn_softcap=arch.attn_softcap, final_softcap=arch.final_softcap, alibi=arch.alibi, layer_groups=groups,
        vocab_type=VOCAB_TYPES.get(vocab_model, vocab_model or "none"), n_vocab=hp.n_vocab,
        chat_template=bool(mf.get("tokenizer.chat_template")),
        thinking_switch=THINKING_SWITCH in str(mf.get("tokenizer.chat_template") or ""),
        file_bytes=mf.file_size, weight_bytes=mf.weight_bytes, kv_bytes=kv, activation_bytes=act,
        state_bytes=4 * sum(g.states.values()), notes=notes,
        pooling="" if arch.causal else arch.pooling() or "none",
        dense_out=[hp.n_embd] + [w.shape[1] for w, _ in arch.dense_out] if arch.dense_out else [])
