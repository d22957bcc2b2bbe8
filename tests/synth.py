"""Tiny synthetic GGUF models for tests: random weights, real layouts.

Tensors are named and shaped as llama.cpp expects. Weights of the types
gguf.quants can quantize (MXFP4 included) are quantized from random floats;
the K-quants and i-quants are random blocks with sane scales (the reference
dequantizes the same bytes, so any valid block pattern is as good as a
quantized one).
"""
from __future__ import annotations

import functools
import json
import math
import struct
from pathlib import Path
from typing import Optional

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

# byte offsets of the fp16 scale fields in each block: (d fields, min fields)
SCALE_FIELDS = {
    QT.Q4_0: ([0], []), QT.Q5_0: ([0], []), QT.Q8_0: ([0], []), QT.IQ4_NL: ([0], []),
    QT.Q4_1: ([0], [2]), QT.Q5_1: ([0], [2]),
    QT.Q2_K: ([80], [82]), QT.Q3_K: ([108], []),
    QT.Q4_K: ([0], [2]), QT.Q5_K: ([0], [2]), QT.Q6_K: ([208], []), QT.IQ4_XS: ([0], []),
    QT.IQ3_S: ([0], []), QT.IQ3_XXS: ([0], []), QT.IQ2_XXS: ([0], []), QT.IQ2_XS: ([0], []), QT.IQ2_S: ([0], []),
    QT.IQ1_S: ([0], []), QT.IQ1_M: ([], []),   # IQ1_M's d: set_iq1_m_d
}
QUANTIZABLE = {QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.MXFP4}


# roughly the largest |quant value x sub-block scale| of each format, so that
# d = scale / unit gives weights of about `scale`
_UNIT = {QT.Q4_0: 8, QT.Q4_1: 8, QT.Q5_0: 16, QT.Q5_1: 16, QT.Q8_0: 64, QT.IQ4_NL: 64,
         QT.Q2_K: 20, QT.Q3_K: 64, QT.Q4_K: 470, QT.Q5_K: 980, QT.Q6_K: 2000, QT.IQ4_XS: 2500,
         QT.IQ3_S: 300, QT.IQ3_XXS: 300,
         QT.IQ2_XXS: 160, QT.IQ2_XS: 160, QT.IQ2_S: 160, QT.IQ1_S: 20, QT.IQ1_M: 20}


def set_iq1_m_d(raw: np.ndarray, d: np.ndarray) -> None:
    """Writes the fp16 d of each IQ1_M block (a row of raw) into the top nibbles of its four
    little-endian scale words (bytes 48..55), word 0 holding d's lowest nibble."""
    bits = d.astype(np.float16).view(np.uint16).astype(np.uint16)
    for i in range(4):
        hi = raw[:, 49 + 2 * i]
        raw[:, 49 + 2 * i] = (hi & 0x0f) | (((bits >> 4 * i) & 0x0f) << 4).astype(np.uint8)


def random_blocks(qtype: QT, n_rows: int, n_in: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """Random valid blocks, [n_rows, row_bytes] uint8, with weights of about `scale`."""
    block, size = GGML_QUANT_SIZES[qtype]
    nb = n_rows * n_in // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    dfields, mfields = SCALE_FIELDS[qtype]
    for off in dfields:
        d = rng.uniform(0.5, 1.5, nb) * scale / _UNIT[qtype]
        raw[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    for off in mfields:  # offsets (mins) centre the values
        m = rng.uniform(0.5, 1.5, nb) * scale / _UNIT[qtype] * 4
        raw[:, off:off + 2] = m.astype(np.float16).view(np.uint8).reshape(nb, 2)
    if qtype == QT.IQ4_XS:   # sub-block scales of one sign and magnitudes 16..31, as quantizers make them
        ls = 32 + np.where(rng.random((nb, 1)) < 0.5, -1, 1) * rng.integers(16, 32, (nb, 8))
        raw[:, 2:4] = (np.sum((ls >> 4) << (2 * np.arange(8)), axis=1)).astype("<u2").view(np.uint8).reshape(nb, 2)
        raw[:, 4:8] = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)
    if qtype == QT.IQ3_S:    # sub-block scale nibbles 8..15 (1 + 2 s = 17..31), as quantizers make them
        s = rng.integers(8, 16, (nb, 8))
        raw[:, 106:110] = (s[:, 0::2] | (s[:, 1::2] << 4)).astype(np.uint8)
    if qtype == QT.IQ3_XXS:  # the same, in the top nibble of each sub-block's word
        raw[:, 69:98:4] = (raw[:, 69:98:4] & 0x0f) | (rng.integers(8, 16, (nb, 8)) << 4).astype(np.uint8)
    if qtype == QT.IQ2_XXS:
        raw[:, 9:66:8] = (raw[:, 9:66:8] & 0x0f) | (rng.integers(8, 16, (nb, 8)) << 4).astype(np.uint8)
    if qtype in (QT.IQ2_XS, QT.IQ2_S):   # 16 nibbles, one per 16 values
        s = rng.integers(8, 16, (nb, 16))
        off = 66 if qtype == QT.IQ2_XS else 74
        raw[:, off:off + 8] = (s[:, 0::2] | (s[:, 1::2] << 4)).astype(np.uint8)
    if qtype == QT.IQ1_S:    # s 4..7 (2 s + 1 = 9..15) in bits 12-14 of each qh word
        raw[:, 35:50:2] = (raw[:, 35:50:2] & 0x8f) | (rng.integers(4, 8, (nb, 8)) << 4).astype(np.uint8)
    if qtype == QT.IQ1_M:    # the same per 16 values, and d
        w = raw[:, 48:56].copy().view("<u2").astype(np.uint32)
        s = rng.integers(4, 8, (nb, 4, 4))
        w = (w & 0xf000) | np.sum(s << (3 * np.arange(4)), axis=2)
        raw[:, 48:56] = w.astype("<u2").view(np.uint8)
        set_iq1_m_d(raw, rng.uniform(0.5, 1.5, nb) * scale / _UNIT[qtype])
    return raw.reshape(n_rows, -1)


def weight(qtype: QT, n_in: int, n_out: int, rng: np.random.Generator, scale: Optional[float] = None):
    """(array for GGUFWriter.add_tensor, raw_dtype) for a matrix of n_out rows of n_in."""
    scale = scale if scale is not None else 1.0 / np.sqrt(n_in)
    if qtype in QUANTIZABLE:
        f = (rng.standard_normal((n_out, n_in)) * scale).astype(np.float32)
        if qtype == QT.F32:
            return f, None
        if qtype == QT.F16:
            return f.astype(np.float16), None
        return gguf.quants.quantize(f, qtype), qtype
    return random_blocks(qtype, n_out, n_in, rng, scale), qtype


def copy_tokenizer(w: gguf.GGUFWriter, source_metadata: dict) -> int:
    """Copies a real file's tokenizer keys into w; returns the vocabulary size."""
    md = source_metadata
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in md:
        w.add_tokenizer_pre(md["tokenizer.ggml.pre"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.token_type" in md:
        w.add_token_types([int(t) for t in md["tokenizer.ggml.token_type"]])
    if "tokenizer.ggml.scores" in md:
        w.add_token_scores([float(s) for s in md["tokenizer.ggml.scores"]])
    if "tokenizer.ggml.merges" in md:
        w.add_token_merges(md["tokenizer.ggml.merges"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if f"tokenizer.ggml.{key}" in md:
            add(int(md[f"tokenizer.ggml.{key}"]))
    if "tokenizer.ggml.add_bos_token" in md:
        w.add_add_bos_token(bool(md["tokenizer.ggml.add_bos_token"]))
    for key in ("unknown_token_id", "seperator_token_id", "padding_token_id"):
        if f"tokenizer.ggml.{key}" in md:
            w.add_uint32(f"tokenizer.ggml.{key}", int(md[f"tokenizer.ggml.{key}"]))
    for key in ("add_eos_token", "add_sep_token", "add_space_prefix", "remove_extra_whitespaces"):
        if f"tokenizer.ggml.{key}" in md:
            w.add_bool(f"tokenizer.ggml.{key}", bool(md[f"tokenizer.ggml.{key}"]))
    if "tokenizer.ggml.precompiled_charsmap" in md:
        w.add_array("tokenizer.ggml.precompiled_charsmap", bytes(np.asarray(md["tokenizer.ggml.precompiled_charsmap"],
                                                                           np.uint8)))
    return len(md["tokenizer.ggml.tokens"])


UNIGRAM_WORDS = ("hello", "world", "\ufb01nance", "\uff34\uff4f\uff4b\uff59\uff4f", "caf\u00e9", "na\u00efve",
                 "\u6771\u4eac", "\u00fcber", "stra\u00dfe", "\u2460", "x\u00b2", "\u216b", "\uff76\uff80\uff76\uff85",
                 "token", "izer", "model", "the", "a", "of")


def unigram_vocab(vocab_size: int = 80, normalization: str = "nmt_nfkc", add_dummy_prefix: bool = True,
                  remove_extra_whitespaces: bool = True, seed: int = 0) -> tuple[dict, bytes]:
    """A SentencePiece Unigram vocabulary trained here on made-up text (compatibility characters
    that NFKC folds, accents, CJK, digits in circles), as llama.cpp's converter writes an
    XLM-RoBERTa one ('t5' tokenizer model, <s> <pad> </s> <unk> first, BOS and EOS added);
    returns the GGUF tokenizer metadata and sentencepiece's own serialized model, the reference."""
    import io
    import random

    import sentencepiece

    rng = random.Random(seed)
    lines = [" ".join(rng.choice(UNIGRAM_WORDS) + rng.choice(("", "s", "ing", "ed")) for _ in range(8))
             for _ in range(3000)]
    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size, model_type="unigram",
        normalization_rule_name=normalization, add_dummy_prefix=add_dummy_prefix,
        remove_extra_whitespaces=remove_extra_whitespaces, character_coverage=0.98, bos_id=0, pad_id=1, eos_id=2,
        unk_id=3, user_defined_symbols=["<sep>"], num_threads=1, minloglevel=2)
    proto = buf.getvalue()
    pieces, charsmap = [], b""
    for field, value in _proto_fields(proto):
        if field == 1:   # ModelProto.pieces: piece=1, score=2, type=3
            p = dict(_proto_fields(value))
            pieces.append((p[1].decode(), struct.unpack("<f", p[2])[0] if 2 in p else 0.0, p.get(3, 1)))
        elif field == 3:   # NormalizerSpec.precompiled_charsmap=2
            charsmap = dict(_proto_fields(value)).get(2, b"")
    md = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": [p[0] for p in pieces],
          "tokenizer.ggml.scores": np.array([p[1] for p in pieces], np.float32),
          "tokenizer.ggml.token_type": np.array([p[2] for p in pieces], np.int32),
          "tokenizer.ggml.precompiled_charsmap": np.frombuffer(charsmap, np.uint8),
          "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.padding_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
          "tokenizer.ggml.seperator_token_id": 2, "tokenizer.ggml.unknown_token_id": 3,
          "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True,
          "tokenizer.ggml.add_space_prefix": add_dummy_prefix,
          "tokenizer.ggml.remove_extra_whitespaces": remove_extra_whitespaces}
    return md, proto


def _proto_fields(data: bytes) -> list[tuple[int, object]]:
    """(field number, value) of a protobuf message's fields: varints as ints, length-delimited and
    fixed ones as bytes (enough to read a sentencepiece model)."""
    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            b = data[i]
            value, shift, i = value | (b & 0x7F) << shift, shift + 7, i + 1
            if not b & 0x80:
                return value, i
    out, i = [], 0
    while i < len(data):
        key, i = varint(i)
        wire = key & 7
        if wire == 0:
            value, i = varint(i)
        elif wire == 2:
            n, i = varint(i)
            value, i = data[i:i + n], i + n
        else:   # 1: 8 bytes, 5: 4 bytes
            n = 8 if wire == 1 else 4
            value, i = data[i:i + n], i + n
        out.append((key >> 3, value))
    return out


# SmolVLM's image tokens (user-defined) and "\n\n" (one token, as mtmd looks it up)
IDEFICS3_TOKENS = ["<fake_token_around_image>", "<global-img>"] + \
    [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]


# LFM2-VL's: an image's begin and end, its thumbnail, its tiles' places (up to 10 x 10)
LFM2_TOKENS = ["<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"] + \
    [f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11)]


# Pixtral's (Mistral Small 3.x's): [IMG] and [IMG_BREAK] (their rows come from the projector), [IMG_END]
PIXTRAL_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
# Qwen 2 / 2.5 VL's
QWEN_VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
CHATML_TOKENS = ["<|im_start|>", "<|im_end|>"]     # LightOnOCR's image markers
PADDLEOCR_TOKENS = ["<|IMAGE_START|>", "<|IMAGE_END|>"]
GEMMA4_TOKENS = ["<|image>", "<image|>", "<|audio>", "<audio|>"]
INTERNVL_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>"]
# a sound's markers: Qwen2-Audio's, Voxtral's, Audio Flamingo's and Qwen3-ASR's
AUDIO_TOKENS = ["<|audio_bos|>", "<|audio_eos|>", "[BEGIN_AUDIO]", "<sound>", "<|audio_start|>", "<|audio_end|>",
                "<|audio>", "<audio|>"]


def small_vocab(w: gguf.GGUFWriter, n_vocab: int = 512, image_tokens: bool | str = False) -> int:
    """A made-up byte-level BPE vocabulary (enough to load; tests feed ids). image_tokens:
    the last ids are SmolVLM's image tokens, with "\n\n" merged into one ("lfm2": LFM2-VL's;
    "pixtral": Pixtral's; "qwen": Qwen 2 / 2.5 VL's; "gemma4": Gemma 4's; "internvl": InternVL's;
    "audio": Qwen2-Audio's and Voxtral's sound markers; "chatml": <|im_start|> and <|im_end|>; "paddleocr": PaddleOCR-VL's)."""
    byte_chars = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + \
                 [chr(c) for c in range(174, 256)] + [chr(256 + i) for i in range(68)]
    words = ["to", "tok"] + (["\u010a\u010a"] if image_tokens else [])
    special = {"lfm2": LFM2_TOKENS, "pixtral": PIXTRAL_TOKENS, "qwen": QWEN_VL_TOKENS,
               "gemma4": GEMMA4_TOKENS, "internvl": INTERNVL_TOKENS, "chatml": CHATML_TOKENS,
               "paddleocr": PADDLEOCR_TOKENS,
               "audio": AUDIO_TOKENS}.get(image_tokens, IDEFICS3_TOKENS) \
        if image_tokens else []
    tokens = byte_chars + words + [f"tok{i}" for i in range(n_vocab - len(byte_chars) - len(words) - len(special))]
    tokens += special
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (n_vocab - len(special)) + [4] * len(special))
    w.add_token_merges(["t o", "to k"] + (["\u010a \u010a"] if image_tokens else []))
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    return n_vocab


def write_model(path: str | Path, arch: str = "llama", qtype: QT = QT.Q8_0, *, n_embd: int = 256,
                n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 512, n_vocab: int = 512,
                head_dim: Optional[int] = None, embd_type: Optional[QT] = None, tied: bool = False,
                seed: int = 0, tokenizer_from: Optional[dict] = None, rope_base: float = 10000.0,
                rope_freqs: bool = False, qkv_bias: bool = False, qk_norm: bool = False,
                fused_qkv: bool = False, fused_up: bool = False, post_norms: bool = False, pre_norms: bool = True,
                rope_factors: bool = False, layer_norm: bool = False, norm_bias: Optional[bool] = None,
                ffn_norm: bool | str = True, sinks: bool = False, expert_biases: bool = False,
                extra_norms: tuple = (), conv_layers: tuple = (), conv_taps: int = 3,
                dense_layers: tuple = (), select_bias: bool = False, pos_embd: bool = False,
                gated: bool = True, biases: bool = False, out_bias: bool = False,
                rope_dim: Optional[int] = None, experts: int = 0, experts_used: int = 2,
                n_ff_exp: Optional[int] = None, shared_expert: int = 0, shared_gate: bool = False,
                mla: Optional[dict] = None, keys: Optional[dict] = None, extra_tensors: Optional[dict] = None,
                context_length: int = 512, ssm_layers: tuple = (), ssm: Optional[dict] = None,
                mlp_layers: tuple = (), no_attention: bool = False, parallel_ssm: bool = False,
                image_tokens: bool | str = False, bare_ffn_norm: bool = False, delta_layers: tuple = (), delta: Optional[dict] = None,
                q_gated: bool = False, array_keys: Optional[dict] = None, float_arrays: Optional[dict] = None,
                int_arrays: Optional[dict] = None, fused_experts: bool = False, fused_shared: bool = False,
                drop_tensor: Optional[str] = None, bad_shape: Optional[str] = None) -> str:
    """A tiny decoder of family `arch`, every matrix in `qtype`, tensors named
    as llama.cpp expects:
      qkv_bias    attn_{q,k,v}.bias (Qwen 2)
      qk_norm     attn_{q,k}_norm.weight, one weight per head dim (Qwen 3, Gemma 3);
                  "full": as wide as q and k (OLMo 2)
      fused_qkv   one attn_qkv.weight [q | k | v]; fused_up: ffn_up of [gate | up] (Phi-3)
      post_norms  post_attention_norm and post_ffw_norm (Gemma 3); pre_norms=False:
                  no attn_norm / ffn_norm (OLMo 2)
      rope_freqs  rope_freqs.weight (Llama 3); rope_factors: rope_factors_{short,long} (Phi-3 128k)
      layer_norm  LayerNorm epsilon key and .bias of every norm (Phi-2, StarCoder 2, StableLM);
                  norm_bias=False: no biases (Command R)
      ffn_norm    False: no ffn_norm (Phi-2's parallel block); a name: that tensor instead
                  (gpt-oss: "post_attention_norm"); gated: False: no ffn_gate
      sinks       attn_sinks.weight, one logit per head (gpt-oss)
      extra_norms more norms per layer by name ("attn_norm_2": Falcon 40B)
      conv_layers layers with a short convolution (shortconv.{in_proj,conv,out_proj}) in place of
                  attention, head_count_kv then a list with 0 for them, the output norm named
                  token_embd_norm and the output tied (LFM2)
      biases      attn_output, ffn_up and ffn_down biases (and ffn_gate's); out_bias: output.bias
      rope_dim    rotated dims per head (default: all)
      experts     > 0: every FFN is that many experts (ffn_gate_inp, ffn_*_exps), experts_used
                  chosen per token, each n_ff_exp wide (written as expert_feed_forward_length, which
                  only Qwen3-MoE reads; default n_ff); shared_expert: also a shared expert that
                  wide (ffn_*_shexp), with shared_gate its ffn_gate_inp_shexp vector (Qwen2-MoE);
                  expert_biases: ffn_gate_inp.bias and ffn_{gate,up,down}_exps.bias (gpt-oss);
                  select_bias: exp_probs_b.bias; dense_layers: layers with a dense FFN instead (ERNIE);
                  fused_experts: one ffn_gate_up_exps, each expert's rows [gate | up] (Mistral 4);
                  fused_shared: the shared expert's gate and up as one ffn_up_shexp [gate | up] (Granite SWA)
      mla         latent attention in place of q/k/v (DeepSeek 2): {"kv_lora", "nope", "rope", "v",
                  "q_lora" (0: attn_q), "split" (attn_k_b + attn_v_b, else one attn_kv_b)}
      ssm_layers  layers with a Mamba 2 mixer (ssm_{in,conv1d,dt,a,d,norm,out}) in place of attention,
                  head_count_kv then a list with 0 for them; ssm: its sizes {"d_inner" (2 n_embd),
                  "d_state" (16), "heads" (8), "groups" (1), "d_conv" (4)}, written as the ssm.* keys
      parallel_ssm  the ssm_layers have attention too, beside the Mamba 2 mixer (Falcon-H1);
                  bare_ffn_norm: the FFN norm named blk.N.ffn_norm, without ".weight" (Falcon-H1)
      no_attention  no attention keys or FFN at all: head_count 0 (Mamba 2, every layer in ssm_layers)
      delta_layers  layers with linear attention by the gated delta rule (attn_qkv, attn_gate, ssm_{conv1d,
                  dt,a,alpha,beta,norm,out}: Qwen3.5); delta: its sizes {"heads" (4 value heads), "kv_heads"
                  (2), "head_dim" (64, keys and values), "d_conv" (4)}, written as the ssm.* keys, and
                  Qwen3-Next's fused projections {"fused_ba": ssm_ba, "ssm_in": ssm_in for attn_qkv + attn_gate}
      q_gated     attn_q twice as wide: [q_h | gate_h] per head (Qwen3.5's full attention)
      mlp_layers  one branch per layer (Nemotron-H): these layers an FFN alone (attn_norm its norm),
                  the others a mixer alone; feed_forward_length a list, 0 for the mixers
      extra_tensors more float32 tensors by name (present in the file, not used)
      float_arrays  keys written as they are named, each an array of float32 (Apertus's xielu.*)
      int_arrays  keys written as they are named, each an array of int32 (tokenizer.ggml.suppress_tokens)
      keys        extra metadata: {"sliding_window": 8, ...} -> writer.add_<name>(value);
                  a dotted name ("rope.scaling.x"), or one the writer has no method for, is written as the
                  key {arch}.<name> (bool, uint32, float32 or string)
    head_dim defaults to n_embd / n_head; otherwise it is written as key_length."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    hd = 0 if no_attention else head_dim or n_embd // n_head
    q_dim, kv_dim = n_head * hd, n_head_kv * hd
    w.add_block_count(n_layer)
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length([n_ff if i in mlp_layers else 0 for i in range(n_layer)] if mlp_layers else n_ff)
    w.add_head_count(n_head)
    mixers = set(conv_layers) | (set() if parallel_ssm else set(ssm_layers)) | set(mlp_layers)
    if not no_attention:
        w.add_head_count_kv([0 if i in mixers else n_head_kv for i in range(n_layer)] if mixers else n_head_kv)
    if ssm_layers:
        ssm = {"d_inner": 2 * n_embd, "d_state": 16, "heads": 8, "groups": 1, "d_conv": 4, **(ssm or {})}
        w.add_ssm_conv_kernel(ssm["d_conv"])
        w.add_ssm_inner_size(ssm["d_inner"])
        w.add_ssm_state_size(ssm["d_state"])
        w.add_ssm_time_step_rank(ssm["heads"])
        w.add_ssm_group_count(ssm["groups"])
    if delta_layers:
        delta = {"heads": 4, "kv_heads": 2, "head_dim": 64, "d_conv": 4, **(delta or {})}
        w.add_ssm_conv_kernel(delta["d_conv"])
        w.add_ssm_inner_size(delta["heads"] * delta["head_dim"])
        w.add_ssm_state_size(delta["head_dim"])
        w.add_ssm_time_step_rank(delta["heads"])
        w.add_ssm_group_count(delta["kv_heads"])
    if conv_layers:
        w.add_uint32(f"{arch}.shortconv.l_cache", conv_taps)
        tied = True
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(experts_used)
        if n_ff_exp:
            w.add_expert_feed_forward_length(n_ff_exp)
        if shared_expert:
            w.add_expert_shared_feed_forward_length(shared_expert)
    if layer_norm:
        w.add_layer_norm_eps(1e-5)
    else:
        w.add_layer_norm_rms_eps(1e-5 if arch != "gemma3" else 1e-6)
    if not no_attention:
        w.add_rope_freq_base(rope_base)
    if not mla and not no_attention:
        w.add_rope_dimension_count(rope_dim or hd)
    if mla:   # the latent's sizes as key/value_length in split files (llama.cpp's MQA view)
        qk = mla["nope"] + mla["rope"]
        w.add_kv_lora_rank(mla["kv_lora"])
        w.add_q_lora_rank(mla.get("q_lora", 0))
        w.add_rope_dimension_count(mla["rope"])
        if mla.get("split", True):
            w.add_key_length(mla["kv_lora"] + mla["rope"])
            w.add_value_length(mla["kv_lora"])
            w.add_key_length_mla(qk)
            w.add_value_length_mla(mla["v"])
        else:
            w.add_key_length(qk)
            if mla.get("value_length", True):   # MiniCPM 3's converter writes none: n_embd / n_head
                w.add_value_length(mla["v"])
        q_dim = n_head * mla["v"]   # attn_output's input
    elif head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    for name, value in (array_keys or {}).items():   # "{arch}.name": an array of numbers
        w.add_array(f"{arch}.{name}", [int(x) for x in value])
    for name, value in (float_arrays or {}).items():   # a key as named, an array of float32
        w.add_key_value(name, [float(x) for x in value], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT32)
    for name, value in (int_arrays or {}).items():
        w.add_key_value(name, [int(x) for x in value], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    for name, value in (keys or {}).items():
        if isinstance(value, list) and not hasattr(w, f"add_{name}"):   # "{arch}.name": an array (of flags)
            w.add_array(f"{arch}.{name}", value)
        elif "." in name or not hasattr(w, f"add_{name}"):   # no writer method: "{arch}.name", an int, float or string
            add_key = w.add_string if isinstance(value, str) else w.add_bool if isinstance(value, bool) else \
                w.add_uint32 if isinstance(value, int) else w.add_float32
            add_key(f"{arch}.{name}", value)
        else:
            getattr(w, f"add_{name}")(value)
    if tokenizer_from is not None:
        n_vocab = copy_tokenizer(w, tokenizer_from)
    else:
        n_vocab = small_vocab(w, n_vocab, image_tokens=image_tokens)

    def add(name, array_and_type):
        if name == drop_tensor:
            return
        arr, raw = array_and_type
        if name == bad_shape:  # one row short: the shape no longer matches the hyperparameters
            arr = arr[:-1]
        w.add_tensor(name, arr, raw_dtype=raw)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), None

    def bias(n):
        return (0.1 * rng.standard_normal(n)).astype(np.float32), None

    def norms(name, n):   # a norm's weight, and its bias in LayerNorm families
        add(name + ".weight", norm(n))
        if layer_norm if norm_bias is None else norm_bias:
            add(name + ".bias", bias(n))

    add("token_embd.weight", weight(embd_type or qtype, n_embd, n_vocab, rng, scale=1.0))
    if pos_embd:   # learned positions, one row per position of the context (512)
        add("position_embd.weight", ((rng.standard_normal((512, n_embd)) * 0.5).astype(np.float32), None))
    norms("token_embd_norm" if conv_layers else "output_norm", n_embd)
    if not tied:
        add("output.weight", weight(qtype, n_embd, n_vocab, rng))
    if out_bias:
        add("output.bias", bias(n_vocab))
    if rope_freqs:
        add("rope_freqs.weight", ((1.0 + rng.uniform(0, 4, hd // 2)).astype(np.float32), None))
    if rope_factors:   # one per rotated pair
        pairs = (mla["rope"] if mla else rope_dim or hd) // 2
        add("rope_factors_short.weight", ((1.0 + rng.uniform(0, 0.5, pairs)).astype(np.float32), None))
        add("rope_factors_long.weight", ((1.0 + rng.uniform(0, 8, pairs)).astype(np.float32), None))
    for i in range(n_layer):
        p = f"blk.{i}."
        if pre_norms:
            norms(p + "attn_norm", n_embd)
        for name in extra_norms:
            norms(p + name, n_embd)
        if i in ssm_layers:
            d_inner, heads, groups, d_state = ssm["d_inner"], ssm["heads"], ssm["groups"], ssm["d_state"]
            channels = d_inner + 2 * groups * d_state
            add(p + "ssm_in.weight", weight(qtype, n_embd, d_inner + channels + heads, rng))
            add(p + "ssm_conv1d.weight", ((rng.standard_normal((channels, ssm["d_conv"])) / 2).astype(np.float32), None))
            add(p + "ssm_conv1d.bias", bias(channels))
            # softplus(dt + bias) around 0.1..1 and A in [-8, -1], as Mamba initializes them
            add(p + "ssm_dt.bias", (rng.uniform(-2.0, 0.5, heads).astype(np.float32), None))
            add(p + "ssm_a", ((-np.exp(rng.uniform(0, np.log(8), (heads, 1)))).astype(np.float32), None))
            add(p + "ssm_d", ((1.0 + 0.1 * rng.standard_normal((heads, 1))).astype(np.float32), None))
            add(p + "ssm_norm.weight", ((1.0 + 0.1 * rng.standard_normal((groups, d_inner // groups))).astype(np.float32),
                                        None))
            add(p + "ssm_out.weight", weight(qtype, d_inner, n_embd, rng))
        if i in delta_layers:
            H, Hk, hdd = delta["heads"], delta["kv_heads"], delta["head_dim"]
            channels = 2 * Hk * hdd + H * hdd
            if delta.get("ssm_in"):   # Qwen3-Next's older files: [q | k | v | z] per key head
                add(p + "ssm_in.weight", weight(qtype, n_embd, channels + H * hdd, rng))
            else:
                add(p + "attn_qkv.weight", weight(qtype, n_embd, channels, rng))
                add(p + "attn_gate.weight", weight(qtype, n_embd, H * hdd, rng))
            add(p + "ssm_conv1d.weight", ((rng.standard_normal((channels, delta["d_conv"])) / 2).astype(np.float32), None))
            add(p + "ssm_dt.bias", (rng.uniform(-2.0, 0.5, H).astype(np.float32), None))
            add(p + "ssm_a", ((-np.exp(rng.uniform(0, np.log(8), H))).astype(np.float32), None))
            if delta.get("fused_ba"):   # Qwen3-Next: [b | a] per key head
                add(p + "ssm_ba.weight", weight(qtype, n_embd, 2 * H, rng))
            else:
                add(p + "ssm_alpha.weight", weight(qtype, n_embd, H, rng))
                add(p + "ssm_beta.weight", weight(qtype, n_embd, H, rng))
            add(p + "ssm_norm.weight", norm(hdd))
            add(p + "ssm_out.weight", weight(qtype, H * hdd, n_embd, rng))
        elif i in mlp_layers or (i in ssm_layers and not parallel_ssm):
            pass
        elif i in conv_layers:
            add(p + "shortconv.in_proj.weight", weight(qtype, n_embd, 3 * n_embd, rng))
            add(p + "shortconv.conv.weight", ((rng.standard_normal((n_embd, conv_taps)) / 2).astype(np.float32), None))
            add(p + "shortconv.out_proj.weight", weight(qtype, n_embd, n_embd, rng))
        elif mla:
            qk, lat = mla["nope"] + mla["rope"], mla["kv_lora"]
            if mla.get("q_lora", 0):
                add(p + "attn_q_a.weight", weight(qtype, n_embd, mla["q_lora"], rng))
                add(p + "attn_q_a_norm.weight", norm(mla["q_lora"]))
                add(p + "attn_q_b.weight", weight(qtype, mla["q_lora"], n_head * qk, rng))
            else:
                add(p + "attn_q.weight", weight(qtype, n_embd, n_head * qk, rng))
            add(p + "attn_kv_a_mqa.weight", weight(qtype, n_embd, lat + mla["rope"], rng))
            add(p + "attn_kv_a_norm.weight", norm(lat))
            if mla.get("split", True):   # per head: Wk_i^T (lat rows of nope), Wv_i (v rows of lat)
                arr, raw = weight(mla.get("kb_type", qtype), mla["nope"], lat * n_head, rng)
                add(p + "attn_k_b.weight", (arr.reshape(n_head, lat, -1), raw))
                arr, raw = weight(qtype, lat, mla["v"] * n_head, rng)
                add(p + "attn_v_b.weight", (arr.reshape(n_head, mla["v"], -1), raw))
            else:
                add(p + "attn_kv_b.weight", weight(qtype, lat, n_head * (mla["nope"] + mla["v"]), rng))
            add(p + "attn_output.weight", weight(qtype, q_dim, n_embd, rng))
        else:
            if fused_qkv:
                add(p + "attn_qkv.weight", weight(qtype, n_embd, q_dim + 2 * kv_dim, rng))
                if qkv_bias:
                    add(p + "attn_qkv.bias", bias(q_dim + 2 * kv_dim))
            else:
                add(p + "attn_q.weight", weight(qtype, n_embd, 2 * q_dim if q_gated else q_dim, rng))
                add(p + "attn_k.weight", weight(qtype, n_embd, kv_dim, rng))
                add(p + "attn_v.weight", weight(qtype, n_embd, kv_dim, rng))
            if qkv_bias and not fused_qkv:
                add(p + "attn_q.bias", bias(q_dim))
                add(p + "attn_k.bias", bias(kv_dim))
                add(p + "attn_v.bias", bias(kv_dim))
            if qk_norm:
                add(p + "attn_q_norm.weight", norm(q_dim if qk_norm == "full" else hd))
                add(p + "attn_k_norm.weight", norm(kv_dim if qk_norm == "full" else hd))
            add(p + "attn_output.weight", weight(qtype, q_dim, n_embd, rng))
            if biases:
                add(p + "attn_output.bias", bias(n_embd))
            if sinks:
                add(p + "attn_sinks.weight", (rng.standard_normal(n_head).astype(np.float32), None))
        if post_norms:
            add(p + "post_attention_norm.weight", norm(n_embd))
        if (mlp_layers and i not in mlp_layers) or no_attention:
            continue   # a mixer alone
        if pre_norms and ffn_norm and not mlp_layers:
            if bare_ffn_norm:
                add(p + "ffn_norm", norm(n_embd))
            else:
                norms(p + (ffn_norm if isinstance(ffn_norm, str) else "ffn_norm"), n_embd)
        moe = experts and i not in dense_layers
        if moe:
            n_exp_ff = n_ff_exp or n_ff
            add(p + "ffn_gate_inp.weight", weight(QT.F32, n_embd, experts, rng, scale=1.0))
            gate_up = ((("gate_up", n_embd, 2 * n_exp_ff),) if fused_experts else
                       (("gate", n_embd, n_exp_ff), ("up", n_embd, n_exp_ff))) if gated else (("up", n_embd, n_exp_ff),)
            for name, n_in, n_out in gate_up + (("down", n_exp_ff, n_embd),):
                arr, raw = weight(qtype, n_in, n_out * experts, rng)
                add(p + f"ffn_{name}_exps.weight", (arr.reshape(experts, n_out, -1), raw))
                if expert_biases:
                    add(p + f"ffn_{name}_exps.bias", bias((experts, n_out)))
            if expert_biases:
                add(p + "ffn_gate_inp.bias", bias(experts))
            if select_bias:   # on the softmax's scale: enough to change some choices
                add(p + "exp_probs_b.bias", ((0.2 * rng.random(experts)).astype(np.float32), None))
            if shared_expert:
                if gated and not fused_shared:
                    add(p + "ffn_gate_shexp.weight", weight(qtype, n_embd, shared_expert, rng))
                add(p + "ffn_up_shexp.weight", weight(qtype, n_embd, (1 + fused_shared) * shared_expert, rng))
                add(p + "ffn_down_shexp.weight", weight(qtype, shared_expert, n_embd, rng))
            if shared_gate:
                add(p + "ffn_gate_inp_shexp.weight", ((rng.standard_normal(n_embd) / 4).astype(np.float32), None))
        elif fused_up:
            add(p + "ffn_up.weight", weight(qtype, n_embd, 2 * n_ff, rng))
        else:
            if gated:
                add(p + "ffn_gate.weight", weight(qtype, n_embd, n_ff, rng))
            add(p + "ffn_up.weight", weight(qtype, n_embd, n_ff, rng))
        if not moe:
            add(p + "ffn_down.weight", weight(qtype, n_ff, n_embd, rng))
        if biases and not moe:
            add(p + "ffn_up.bias", bias(n_ff))
            add(p + "ffn_down.bias", bias(n_embd))
            if gated and not fused_up:   # JAIS
                add(p + "ffn_gate.bias", bias(n_ff))
        if post_norms:
            add(p + "post_ffw_norm.weight", norm(n_embd))
    for name, arr in (extra_tensors or {}).items():
        add(name, (np.asarray(arr, np.float32), None))
    return finish(w, path)


def write_llama(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """A tiny llama model (SmolLM2, Llama 2; rope_freqs=True: Llama 3)."""
    return write_model(path, kw.pop("arch", "llama"), qtype, **kw)


def write_mistral(path: str | Path, qtype: QT = QT.Q8_0, window: int = 16, **kw) -> str:
    """Mistral 7B's layout: a llama file with llama.attention.sliding_window."""
    return write_model(path, "llama", qtype, keys={"sliding_window": window, **kw.pop("keys", {})}, **kw)


def write_qwen2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    kw.setdefault("tied", True)
    return write_model(path, "qwen2", qtype, qkv_bias=True, rope_base=1e6, **kw)


def write_qwen3(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    kw.setdefault("head_dim", 128)   # wider than n_embd / n_head, as in Qwen3-0.6B
    return write_model(path, "qwen3", qtype, qk_norm=True, rope_base=1e6, **kw)


def write_phi3(path: str | Path, qtype: QT = QT.Q8_0, long_rope: bool = False, **kw) -> str:
    """Phi-3: fused attn_qkv and ffn_up; long_rope adds the 128k files' RoPE
    factors, original context length and attention factor."""
    keys = dict(kw.pop("keys", {}))
    if long_rope:
        keys.update(rope_scaling_orig_ctx_len=256, rope_scaling_attn_factors=1.1902380714238083)
    return write_model(path, "phi3", qtype, fused_qkv=True, fused_up=True, rope_factors=long_rope,
                       keys=keys, **kw)


def write_gemma3(path: str | Path, qtype: QT = QT.Q8_0, window: int = 8, **kw) -> str:
    """Gemma 3: 6 layers by default so that layer 5 is a global one among
    sliding-window layers; q/k norms, post norms, tied output."""
    kw.setdefault("n_layer", 6)
    kw.setdefault("tied", True)
    kw.setdefault("n_head_kv", 1)
    keys = {"sliding_window": window, **kw.pop("keys", {})} if window else kw.pop("keys", {})
    return write_model(path, "gemma3", qtype, qk_norm=True, post_norms=True, rope_base=1e6, keys=keys, **kw)


def write_gemma_embedding(path: str | Path, qtype: QT = QT.Q8_0, window: int = 8, dense: int = 384,
                          **kw) -> str:
    """EmbeddingGemma: Gemma 3's layers attending both ways (the local ones over 4 positions either
    side), mean pooling, dense projections n_embd -> dense -> n_embd after the final norm (0: none)."""
    kw.setdefault("n_layer", 6)
    kw.setdefault("tied", True)
    kw.setdefault("n_head_kv", 1)
    n_embd = kw.setdefault("n_embd", 256)
    keys = {"sliding_window": window, "pooling_type": gguf.PoolingType.MEAN, "causal_attention": False,
            **kw.pop("keys", {})}
    extra = {}
    if dense:
        rng = np.random.default_rng(kw.get("seed", 0) + 100)
        extra = {"dense_2.weight": (rng.standard_normal((dense, n_embd)) / np.sqrt(n_embd)).astype(np.float32),
                 "dense_3.weight": (rng.standard_normal((n_embd, dense)) / np.sqrt(dense)).astype(np.float32)}
    plain = write_model(Path(str(path) + ".plain"), "gemma-embedding", qtype, qk_norm=True, post_norms=True,
                        rope_base=1e6, keys=keys, extra_tensors=extra, **kw)
    sizes = {"dense_2_feat_in": n_embd, "dense_2_feat_out": dense, "dense_3_feat_in": dense,
             "dense_3_feat_out": n_embd} if dense else {}   # llama.cpp sizes the tensors by these keys
    rewrite_metadata(plain, path, {f"gemma-embedding.{k}": v for k, v in sizes.items()})
    Path(plain).unlink()
    return str(path)


def write_gemma(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Gemma 1: Llama's layout, tied output; head_dim 128 by default, wider than
    n_embd / n_head (as on the 7B: 16 heads of 256 over 3072)."""
    kw.setdefault("tied", True)
    kw.setdefault("head_dim", 128)
    return write_model(path, "gemma", qtype, **kw)


def write_gemma2(path: str | Path, qtype: QT = QT.Q8_0, window: int = 8, attn_softcap: float = 0.5,
                 final_softcap: float = 30.0, **kw) -> str:
    """Gemma 2: post norms, tied output, no q/k norms. The attention cap is
    far below the real 50 by default, so that tanh bends these small random
    models' scores (their logits, of spread ~20, are bent by the real 30)."""
    kw.setdefault("n_layer", 4)
    kw.setdefault("tied", True)
    kw.setdefault("n_head_kv", 1)
    keys = {"sliding_window": window, "attn_logit_softcapping": attn_softcap,
            "final_logit_softcapping": final_softcap, **kw.pop("keys", {})}
    keys = {k: v for k, v in keys.items() if v is not None}
    return write_model(path, "gemma2", qtype, post_norms=True, keys=keys, **kw)


def write_granite(path: str | Path, qtype: QT = QT.Q8_0, embedding_scale: float = 12.0,
                  residual_scale: float = 0.22, attention_scale: float = 0.015625, logit_scale: float = 8.0,
                  rope: Optional[bool] = None, arch: str = "granite", **kw) -> str:
    """Granite 3: Llama's layout and Granite 3.x's multipliers (the softmax
    scale 1/64 is not 1/sqrt(head_dim) = 1/8); a multiplier of None is not
    written; rope=False writes rope.scaling.finetuned = false (no RoPE)."""
    keys = {"embedding_scale": embedding_scale, "residual_scale": residual_scale,
            "attention_scale": attention_scale, "logit_scale": logit_scale, "rope_scaling_finetuned": rope,
            **kw.pop("keys", {})}
    kw.setdefault("tied", True)
    return write_model(path, arch, qtype, keys={k: v for k, v in keys.items() if v is not None}, **kw)


def write_granite_swa(path: str | Path, qtype: QT = QT.Q8_0, experts: int = 0, **kw) -> str:
    """Granite SWA: Granite 3's multipliers over 4 layers, attention sinks, a window of 8 in layers
    0, 2 and 3, no RoPE in layer 2; experts > 0: that many (n_ff wide, 2 chosen, gate and up fused)
    and a shared expert of 512 whose gate and up are one ffn_up_shexp."""
    n_layer = kw.setdefault("n_layer", 4)
    keys = {"sliding_window": 8, "sliding_window_pattern": [i % 4 != 1 for i in range(n_layer)],
            "attention.rope_pattern": [i % 4 != 2 for i in range(n_layer)], **kw.pop("keys", {})}
    if experts:
        kw.update(experts=experts, fused_experts=True, shared_expert=512, fused_shared=True)
    return write_granite(path, qtype, arch="granite_swa", sinks=True, keys=keys, **kw)


def write_granitemoe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Granite 3.x MoE: Granite's multipliers, 8 experts (n_ff wide, as llama.cpp reads them), 2 chosen."""
    kw.setdefault("experts", 8)
    return write_granite(path, qtype, arch="granitemoe", **kw)


def write_smollm3(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """SmolLM3: Llama's layout; 4 layers by default, so that layer 3 is a NoPE layer."""
    kw.setdefault("n_layer", 4)
    kw.setdefault("tied", True)
    return write_model(path, "smollm3", qtype, rope_base=5e6, **kw)


def write_olmo2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """OLMo 2: post norms only, q/k norms over the whole of q and k."""
    kw.setdefault("qk_norm", "full")
    return write_model(path, "olmo2", qtype, post_norms=True, pre_norms=False, rope_base=500000.0, **kw)


def write_phi2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Phi-2: LayerNorm, parallel block, ungated GELU FFN, biases everywhere
    (output too), fused q/k/v, NEOX RoPE on 32 of 64 dims, head 64 (Phi-2's is 80)."""
    kw.setdefault("fused_qkv", True)
    kw.setdefault("n_head_kv", 4)
    kw.setdefault("rope_dim", 32)
    return write_model(path, "phi2", qtype, layer_norm=True, ffn_norm=False, gated=False, qkv_bias=True,
                       biases=True, out_bias=True, **kw)


def write_starcoder2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """StarCoder 2: LayerNorm, ungated GELU FFN, biases, tied output."""
    kw.setdefault("tied", True)
    return write_model(path, "starcoder2", qtype, layer_norm=True, gated=False, qkv_bias=True, biases=True,
                       rope_base=100000.0, **kw)


def write_codeshell(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """CodeShell: StarCoder 2's layout with a fused attn_qkv and its bias (GQA), the output untied."""
    return write_model(path, "codeshell", qtype, layer_norm=True, gated=False, fused_qkv=True, qkv_bias=True,
                       biases=True, **kw)


def write_qwen(path: str | Path, qtype: QT = QT.Q8_0, n_ff: int = 512, **kw) -> str:
    """Qwen 1: the Llama layout with a fused attn_qkv and its bias, every head its own KV head, and
    feed_forward_length twice the FFN matrices' width (the converter writes intermediate_size)."""
    kw.setdefault("n_head_kv", kw.get("n_head", 4))
    tmp = Path(str(path) + ".tmp")
    write_model(tmp, "qwen", qtype, fused_qkv=True, qkv_bias=True, n_ff=n_ff, **kw)
    rewrite_metadata(tmp, path, {"qwen.feed_forward_length": 2 * n_ff})
    tmp.unlink()
    return str(path)


def write_jais2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """JAIS 2: StarCoder 2's layout (q/k/v biases, biases on the output and the FFN) with a
    squared-ReLU FFN, the output untied."""
    return write_model(path, "jais2", qtype, layer_norm=True, gated=False, qkv_bias=True, biases=True, **kw)


def write_stablelm(path: str | Path, qtype: QT = QT.Q8_0, parallel: bool = False, **kw) -> str:
    """StableLM 2: LayerNorm, q/k/v biases, NEOX RoPE on 16 of 64 dims;
    parallel: no FFN norms (the parallel block)."""
    kw.setdefault("rope_dim", 16)
    return write_model(path, "stablelm", qtype, layer_norm=True, qkv_bias=True, ffn_norm=not parallel, **kw)


def write_command_r(path: str | Path, qtype: QT = QT.Q8_0, arch: str = "command-r", **kw) -> str:
    """Command R: LayerNorm without biases, the parallel block, scaled logits, tied output."""
    kw.setdefault("tied", True)
    keys = {"logit_scale": 0.5, **kw.pop("keys", {})}
    return write_model(path, arch, qtype, layer_norm=True, norm_bias=False, ffn_norm=False, keys=keys, **kw)


def write_cohere2(path: str | Path, qtype: QT = QT.Q8_0, window: int = 8, **kw) -> str:
    """Command R7B: Command R's block; 4 layers so that layer 3 is global (no RoPE, no window)."""
    kw.setdefault("n_layer", 4)
    return write_command_r(path, qtype, "cohere2", keys={"sliding_window": window, **kw.pop("keys", {})}, **kw)


def write_ernie4_5(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    kw.setdefault("tied", True)
    return write_model(path, "ernie4_5", qtype, **kw)


def write_exaone(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    return write_model(path, "exaone", qtype, rope_base=1e6, **kw)


def write_exaone4(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """EXAONE 4: output norms only, q/k norms per head; n_layer=64 makes the
    32B's sliding-window layout (window from keys, else 4096)."""
    kw.setdefault("tied", True)
    return write_model(path, "exaone4", qtype, qk_norm=True, post_norms=True, pre_norms=False, rope_base=1e6, **kw)


def write_mixtral(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Mixtral: a llama file with 8 experts per FFN, 2 chosen per token."""
    kw.setdefault("experts", 8)
    return write_model(path, "llama", qtype, rope_base=1e6, **kw)


def write_qwen3moe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Qwen3-MoE: Qwen 3's attention, 16 experts of 256 (not n_ff), 4 chosen."""
    kw.setdefault("experts", 16)
    kw.setdefault("experts_used", 4)
    kw.setdefault("n_ff_exp", 256)
    kw.setdefault("head_dim", 128)
    kw.setdefault("arch", "qwen3moe")
    kw.setdefault("rope_base", 1e6)
    return write_model(path, qtype=qtype, qk_norm=True, **kw)


def write_mellum(path: str | Path, qtype: QT = QT.Q8_0, yarn: bool = False, **kw) -> str:
    """Mellum: Qwen3-MoE with a window of 8 in layer 0 of 2 (sliding_window_pattern: keys to set
    other flags, None to write none: layers 0-2 of every 4 windowed); 16 experts of 256, 4 chosen; yarn: YaRN (factor 4 over 16 positions) in the
    global layers, unscaled RoPE in the windowed."""
    keys = {"sliding_window": 8, "sliding_window_pattern": [True, False], **kw.pop("keys", {})}
    if yarn:
        keys.update(rope_scaling_type=gguf.RopeScalingType.YARN, rope_scaling_factor=4.0,
                    rope_scaling_orig_ctx_len=16)
    return write_qwen3moe(path, qtype, arch="mellum", keys={k: v for k, v in keys.items() if v is not None}, **kw)


def write_qwen2moe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Qwen2-MoE: Qwen 2's biases, 8 experts of 256, 2 chosen, and a gated shared expert of 512."""
    kw.setdefault("experts", 8)
    kw.setdefault("n_ff_exp", 256)
    kw.setdefault("shared_expert", 512)
    return write_model(path, "qwen2moe", qtype, qkv_bias=True, shared_gate=True, rope_base=1e6, **kw)


def write_olmoe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """OLMoE: pre-norms, q/k norms over all heads, 8 experts, 2 chosen (weights not renormalized)."""
    kw.setdefault("experts", 8)
    kw.setdefault("n_head_kv", 4)
    return write_model(path, "olmoe", qtype, qk_norm="full", rope_base=10000.0, **kw)


def write_gpt_oss(path: str | Path, qtype: QT = QT.Q8_0, window: int = 8, **kw) -> str:
    """gpt-oss: biases on q/k/v/o, the router and every expert matrix; attention sinks;
    post_attention_norm as the FFN's input norm; even layers over a window; heads of 64
    wider than n_embd (8 x 64 over 256, as the 20B's 64 x 64 over 2880)."""
    kw.setdefault("experts", 16)        # the 20B: 4 of 32
    kw.setdefault("experts_used", 4)
    kw.setdefault("n_ff_exp", 256)
    kw.setdefault("n_head", 8)
    kw.setdefault("head_dim", 64)
    keys = {"sliding_window": window, **kw.pop("keys", {})}
    return write_model(path, "gpt-oss", qtype, qkv_bias=True, biases=True, sinks=True, expert_biases=True,
                       ffn_norm="post_attention_norm", rope_base=150000.0, keys=keys, **kw)


def write_glm4(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """GLM-4: input and output norms on each branch, fused q/k/v with bias, fused
    [gate | up], half of each head rotated."""
    kw.setdefault("rope_dim", 32)
    kw.setdefault("fused_qkv", True)
    return write_model(path, "glm4", qtype, qkv_bias=True, fused_up=True, post_norms=True, **kw)


def write_nemotron(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Nemotron: LayerNorm with biases, ungated relu^2 FFN, half of each head rotated (NEOX)."""
    kw.setdefault("rope_dim", 32)
    return write_model(path, "nemotron", qtype, layer_norm=True, gated=False, **kw)


def write_arcee(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Arcee: the Llama block with an ungated relu^2 FFN."""
    return write_model(path, "arcee", qtype, gated=False, **kw)


def write_gptneox(path: str | Path, qtype: QT = QT.Q8_0, parallel: bool = True, **kw) -> str:
    """GPT-NeoX (Pythia): LayerNorm, fused q/k/v, biases everywhere, ungated GELU, a quarter
    of each head rotated (NEOX); parallel: attention and FFN side by side, each its own norm."""
    kw.setdefault("rope_dim", 16)
    keys = {"parallel_residual": parallel, **kw.pop("keys", {})}
    return write_model(path, "gptneox", qtype, layer_norm=True, fused_qkv=True, qkv_bias=True, biases=True,
                       gated=False, keys=keys, **kw)


def write_falcon(path: str | Path, qtype: QT = QT.Q8_0, norm2: bool = False, **kw) -> str:
    """Falcon: LayerNorm, fused q/k/v, one KV head, ungated GELU, attention and FFN side by side
    on one norm (7B), or with the attention on its own attn_norm_2 (norm2: 40B)."""
    kw.setdefault("n_head_kv", 1)
    return write_model(path, "falcon", qtype, layer_norm=True, fused_qkv=True, gated=False, ffn_norm=False,
                       extra_norms=("attn_norm_2",) if norm2 else (), **kw)


def write_granitehybrid(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Granite 4.0-H: Granite's multipliers, 4 layers of which 0, 1 and 3 are Mamba 2 mixers
    (8 heads of 64, state 16, 1 group) and 2 attention without RoPE (rope.scaling.finetuned
    false, as Granite 4.0-H files say), every layer with a dense FFN; experts=n: experts
    with a shared expert of n_ff, as granite-4.0-h-tiny."""
    kw.setdefault("n_layer", 4)
    kw.setdefault("ssm_layers", (0, 1, 3))
    kw.setdefault("rope", False)
    if kw.get("experts"):
        kw.setdefault("shared_expert", kw.get("n_ff", 512))
    return write_granite(path, qtype, arch="granitehybrid", **kw)


def write_nemotron_h(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Nemotron-H: 6 single-branch layers, Mamba 2 (8 heads of 64, 2 groups) in 0 and 3,
    attention (no RoPE) in 2, the ungated relu^2 FFN in 1, 4 and 5."""
    kw.setdefault("n_layer", 6)
    kw.setdefault("ssm_layers", (0, 3))
    kw.setdefault("mlp_layers", (1, 4, 5))
    kw.setdefault("ssm", {"groups": 2})
    keys = {"layer_norm_eps": 1e-5, **kw.pop("keys", {})}   # llama.cpp requires it, and reads the RMS one
    return write_model(path, kw.pop("arch", "nemotron_h"), qtype, gated=False, keys=keys, **kw)


def write_nemotron_h_moe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Nemotron 3 Nano's layout: Nemotron-H's layers with 8 ungated relu^2 experts of 256 (4
    chosen by sigmoid + exp_probs_b, renormalized, x 2.5) and an ungated shared expert of 512
    in place of each FFN."""
    moe_defaults(kw, experts=8, dense=())
    kw.setdefault("shared_expert", 512)
    keys = {"expert_weights_norm": True, "expert_weights_scale": 2.5, **kw.pop("keys", {})}
    return write_nemotron_h(path, qtype, arch="nemotron_h_moe", select_bias=True, keys=keys, **kw)


def write_mamba2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Mamba 2: 3 layers of Mamba 2 mixers alone (8 heads of 64, 1 group), head_count and
    feed_forward_length 0 and no attention keys, as the converter writes them."""
    kw.setdefault("n_layer", 3)
    kw.setdefault("ssm_layers", tuple(range(kw["n_layer"])))
    return write_model(path, "mamba2", qtype, n_head=0, n_ff=0, no_attention=True, **kw)


def write_mamba(path: str | Path, qtype: QT = QT.Q8_0, *, arch: str = "mamba", n_embd: int = 256, n_layer: int = 3,
                n_vocab: int = 512, d_state: int = 16, dt_rank: int = 16, d_conv: int = 4, bc_norm: bool = False,
                attn_layers: tuple = (), n_head: int = 4, n_head_kv: int = 2, n_ff: int = 0, moe_layers: tuple = (),
                experts: int = 4, experts_used: int = 2, seed: int = 0, tokenizer_from: Optional[dict] = None) -> str:
    """Mamba 1 (arch `mamba`): layers of a Mamba 1 mixer alone (d_inner 2 n_embd, every channel with
    its own decay per state), as the converter writes them: no attention keys; bc_norm: Falcon
    Mamba's ssm.dt_b_c_rms. The output tied. Jamba (write_jamba): attention (no RoPE) in attn_layers,
    dt/B/C norm weights in the others, and an FFN in every layer (n_ff), experts in moe_layers."""
    rng = np.random.default_rng(seed)
    d_inner = 2 * n_embd
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(1 << 20)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head if attn_layers else 0)
    if attn_layers:
        w.add_head_count_kv([n_head_kv if i in attn_layers else 0 for i in range(n_layer)])
    if moe_layers:
        w.add_expert_count(experts)
        w.add_expert_used_count(experts_used)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    if bc_norm:
        w.add_bool(f"{arch}.ssm.dt_b_c_rms", True)
    n_vocab = copy_tokenizer(w, tokenizer_from) if tokenizer_from is not None else small_vocab(w, n_vocab)

    def add(name, array_and_type):
        w.add_tensor(name, array_and_type[0], raw_dtype=array_and_type[1])

    def vec(values):
        return np.asarray(values, np.float32), None
    add("token_embd.weight", weight(qtype, n_embd, n_vocab, rng, scale=1.0))
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", vec(1.0 + 0.1 * rng.standard_normal(n_embd)))
        if i in attn_layers:
            hd = n_embd // n_head
            for name, n_out in (("q", n_head * hd), ("k", n_head_kv * hd), ("v", n_head_kv * hd)):
                add(p + f"attn_{name}.weight", weight(qtype, n_embd, n_out, rng))
            add(p + "attn_output.weight", weight(qtype, n_head * hd, n_embd, rng))
        else:
            add(p + "ssm_in.weight", weight(qtype, n_embd, 2 * d_inner, rng))
            add(p + "ssm_conv1d.weight", vec(rng.standard_normal((d_inner, d_conv)) / 2))
            add(p + "ssm_conv1d.bias", vec(0.1 * rng.standard_normal(d_inner)))
            add(p + "ssm_x.weight", weight(qtype, d_inner, dt_rank + 2 * d_state, rng))
            add(p + "ssm_dt.weight", weight(QT.F32 if qtype == QT.F32 else QT.F16, dt_rank, d_inner, rng))
            # softplus(dt + bias) around 0.1..1 and A in [-8, -1], as Mamba initializes them
            add(p + "ssm_dt.bias", vec(rng.uniform(-2.0, 0.5, d_inner)))
            add(p + "ssm_a", vec(-np.exp(rng.uniform(0, np.log(8), (d_inner, d_state)))))
            add(p + "ssm_d", vec(1.0 + 0.1 * rng.standard_normal(d_inner)))
            add(p + "ssm_out.weight", weight(qtype, d_inner, n_embd, rng))
            if arch == "jamba":
                for name, n in (("dt", dt_rank), ("b", d_state), ("c", d_state)):
                    add(p + f"ssm_{name}_norm.weight", vec(1.0 + 0.1 * rng.standard_normal(n)))
        if n_ff:
            add(p + "ffn_norm.weight", vec(1.0 + 0.1 * rng.standard_normal(n_embd)))
            if i in moe_layers:
                add(p + "ffn_gate_inp.weight", weight(QT.F32, n_embd, experts, rng, scale=1.0))
                for name, n_in, n_out in (("gate", n_embd, n_ff), ("up", n_embd, n_ff), ("down", n_ff, n_embd)):
                    arr, raw = weight(qtype, n_in, n_out * experts, rng)
                    add(p + f"ffn_{name}_exps.weight", (arr.reshape(experts, n_out, -1), raw))
            else:
                for name, n_in, n_out in (("gate", n_embd, n_ff), ("up", n_embd, n_ff), ("down", n_ff, n_embd)):
                    add(p + f"ffn_{name}.weight", weight(qtype, n_in, n_out, rng))
    add("output_norm.weight", vec(1.0 + 0.1 * rng.standard_normal(n_embd)))
    return finish(w, path)


def write_jamba(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Jamba: 4 layers, attention (4 heads, 2 KV heads, no RoPE) in layer 2, Mamba 1 mixers with
    dt/B/C norm weights in the others, SwiGLU FFNs of 512, 4 experts (2 chosen) in layers 1 and 3."""
    kw.setdefault("n_layer", 4)
    kw.setdefault("attn_layers", (2,))
    kw.setdefault("moe_layers", (1, 3))
    kw.setdefault("n_ff", 512)
    return write_mamba(path, qtype, arch="jamba", **kw)


def write_falcon_h1(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Falcon-H1: 3 layers, each attention (NEOX RoPE) and a Mamba 2 mixer (8 heads of 64,
    state 16, 1 group) side by side on the same norm, then a SwiGLU FFN."""
    kw.setdefault("n_layer", 3)
    kw.setdefault("ssm_layers", tuple(range(kw["n_layer"])))
    # its FFN norm has no ".weight" in its name in the files llama.cpp loads
    return write_model(path, "falcon-h1", qtype, parallel_ssm=True, bare_ffn_norm=True, **kw)


def write_qwen35(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Qwen3.5: 4 layers, 0-2 linear attention (4 value heads over 2 key heads of 64), 3 gated
    full attention with per-head q/k norms and NEOX RoPE on 16 of 64 dims (M-RoPE sections
    3, 3, 2, 0), the FFN norm stored as post_attention_norm."""
    kw.setdefault("n_layer", 4)
    interval = kw.pop("interval", 4)
    kw.setdefault("delta_layers", tuple(i for i in range(kw["n_layer"]) if (i + 1) % interval))
    keys = {"full_attention_interval": interval, **kw.pop("keys", {})}
    extra_keys = {"rope.dimension_sections": np.array([3, 3, 2, 0], np.int32)}
    return write_model(path, kw.pop("arch", "qwen35"), qtype, qk_norm=True, q_gated=True, rope_dim=16, rope_base=1e7,
                       ffn_norm="post_attention_norm", keys=keys, array_keys=extra_keys, **kw)


def write_qwen35moe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Qwen3.5 MoE: Qwen3.5's layers with 8 experts of 256 (2 chosen) and a gated shared expert of 512."""
    kw.setdefault("experts", 8)
    kw.setdefault("n_ff_exp", 256)
    kw.setdefault("shared_expert", 512)
    kw.setdefault("arch", "qwen35moe")
    return write_qwen35(path, qtype, shared_gate=True, **kw)


def write_qwen3next(path: str | Path, qtype: QT = QT.Q8_0, legacy: bool = False, **kw) -> str:
    """Qwen3-Next: Qwen3.5 MoE's layout with 4 value heads over 2 key heads read in groups, a and b
    in one ssm_ba; legacy: one ssm_in in place of attn_qkv and attn_gate (its older files)."""
    kw.setdefault("delta", {"fused_ba": True, "ssm_in": legacy})
    return write_qwen35moe(path, qtype, arch="qwen3next", **kw)


def write_lfm2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """LFM2: 4 layers, 0, 1 and 3 short convolutions (3 taps), 2 attention with per-head q/k norms."""
    kw.setdefault("n_layer", 4)
    kw.setdefault("conv_layers", (0, 1, 3))
    kw.setdefault("arch", "lfm2")
    return write_model(path, qtype=qtype, qk_norm=True, rope_base=1e6, **kw)


def write_lfm2moe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """LFM2 MoE: LFM2's 4 layers (0, 1, 3 convolutions), layer 0 with a dense FFN, then 8 experts
    of 256, 4 chosen by sigmoid + exp_probs_b, renormalized."""
    kw.setdefault("n_ff", 512)
    moe_defaults(kw, experts=8)
    keys = {"leading_dense_block_count": 1, "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
            **kw.pop("keys", {})}
    return write_lfm2(path, qtype, arch="lfm2moe", select_bias=True, keys=keys, **kw)


def write_mistral3(path: str | Path, qtype: QT = QT.Q8_0, temperature: bool = True, **kw) -> str:
    """Mistral 3: Llama with YaRN (factor 4 over 16 tokens here) and, with temperature,
    the attention temperature of long positions (scale 0.1, period the original 16)."""
    keys = {"rope_scaling_type": gguf.RopeScalingType.YARN, "rope_scaling_factor": 4.0,
            "rope_scaling_orig_ctx_len": 16, **kw.pop("keys", {})}
    if temperature:
        keys["attention.temperature_scale"] = 0.1
    return write_model(path, "mistral3", qtype, rope_base=1e6, keys=keys, **kw)


def write_ernie4_5_moe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """ERNIE 4.5 MoE: layer 0 dense, then experts (16 of 256, 4 chosen by softmax + exp_probs_b)
    and a shared expert of 512."""
    kw.setdefault("experts", 16)
    kw.setdefault("experts_used", 4)
    kw.setdefault("n_ff_exp", 256)
    kw.setdefault("dense_layers", (0,))
    keys = {"leading_dense_block_count": 1, "interleave_moe_layer_step": 1, **kw.pop("keys", {})}
    return write_model(path, "ernie4_5-moe", qtype, select_bias=True, shared_expert=512,
                       tied=True, keys=keys, **kw)


def write_gpt2(path: str | Path, qtype: QT = QT.Q8_0, arch: str = "gpt2", **kw) -> str:
    """GPT-2: learned positions (position_embd, context_length rows), no RoPE, LayerNorm,
    fused q/k/v with biases, ungated GELU, biases everywhere; the output tied."""
    kw.setdefault("tied", True)
    return write_model(path, arch, qtype, layer_norm=True, fused_qkv=True, qkv_bias=True, biases=True,
                       gated=False, pos_embd=True, **kw)


def wordpiece_vocab(w: gguf.GGUFWriter, n_vocab: int = 512) -> int:
    """A made-up WordPiece vocabulary as llama.cpp's converter writes one: [PAD] [UNK] [CLS]
    [SEP] [MASK] (control tokens), then word starts (U+2581 ...) and continuations."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = [f"\u2581w{i}" if i % 2 else f"p{i}" for i in range(n_vocab - len(specials))]
    w.add_tokenizer_model("bert")
    w.add_token_list(specials + words)
    w.add_token_types([3] * len(specials) + [1] * len(words))
    for key, tid in (("bos", 2), ("eos", 3), ("unknown", 1), ("seperator", 3), ("padding", 0), ("mask", 4)):
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", tid)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    return n_vocab


def write_bert(path: str | Path, qtype: QT = QT.Q8_0, arch: str = "bert", *, n_embd: int = 256, n_layer: int = 2,
               n_head: int = 4, n_ff: int = 512, n_vocab: int = 512, context_length: int = 512, pooling: int = 1,
               embd_type: Optional[QT] = None, tokenizer_from: Optional[dict] = None, seed: int = 0,
               drop_tensor: Optional[str] = None, rank: int = 0, head_type: QT = QT.F32) -> str:
    """A tiny sentence encoder, tensors as llama.cpp's converter names them: bert (learned positions,
    q/k/v and every layer with biases, ungated GELU FFN) or nomic-bert (RoPE, a fused attn_qkv, a
    SwiGLU FFN, no biases); LayerNorms with biases after each residual sum, token type embeddings of
    2 types, pooling as llama.cpp numbers it (1: mean). rank: a cross-encoder (pooling 4) with a
    classification head of `rank` scores (cls: dense + tanh, cls.output), its matrices of head_type.
    nomic-bert-moe (nomic-embed-text-v2-moe): nomic-bert's attention with bert's ungated GELU FFN, and
    in every second layer (i % 2 == 1) 8 ungated experts of n_ff, 2 chosen."""
    rng = np.random.default_rng(seed)
    nomic = arch.startswith("nomic-bert")
    moe = arch == "nomic-bert-moe"
    jina = arch == "jina-bert-v2"   # bert's layers, no positions (ALiBi), a GEGLU up of [gate | up] with its bias
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(4 if rank else pooling))
    w.add_token_type_count(2)
    if nomic:
        w.add_rope_freq_base(1000.0)
    if moe:
        w.add_moe_every_n_layers(2)
        w.add_expert_count(8)
        w.add_expert_used_count(2)
    n_vocab = copy_tokenizer(w, tokenizer_from) if tokenizer_from is not None else wordpiece_vocab(w, n_vocab)

    def add(name, array_and_type):
        if name != drop_tensor:
            w.add_tensor(name, array_and_type[0], raw_dtype=array_and_type[1])

    def vec(n, centre=0.0, spread=0.1):   # F32 vectors: norm weights about 1, biases about 0
        return (centre + spread * rng.standard_normal(n)).astype(np.float32), None

    add("token_embd.weight", weight(embd_type or qtype, n_embd, n_vocab, rng, scale=1.0))
    if not nomic and not jina:
        add("position_embd.weight", ((rng.standard_normal((context_length, n_embd)) * 0.5).astype(np.float32), None))
    add("token_types.weight", ((rng.standard_normal((2, n_embd)) * 0.5).astype(np.float32), None))
    add("token_embd_norm.weight", vec(n_embd, 1.0))
    add("token_embd_norm.bias", vec(n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        if nomic:
            add(p + "attn_qkv.weight", weight(qtype, n_embd, 3 * n_embd, rng))
        else:
            for m in ("q", "k", "v"):
                add(p + f"attn_{m}.weight", weight(qtype, n_embd, n_embd, rng))
                add(p + f"attn_{m}.bias", vec(n_embd))
        add(p + "attn_output.weight", weight(qtype, n_embd, n_embd, rng))
        if moe and i % 2 == 1:
            add(p + "ffn_gate_inp.weight", weight(QT.F32, n_embd, 8, rng, scale=1.0))
            for name, n_in, n_out in (("up", n_embd, n_ff), ("down", n_ff, n_embd)):
                arr, raw = weight(qtype, n_in, n_out * 8, rng)
                add(p + f"ffn_{name}_exps.weight", (arr.reshape(8, n_out, -1), raw))
        elif jina:
            add(p + "attn_output.bias", vec(n_embd))
            add(p + "ffn_up.weight", weight(qtype, n_embd, 2 * n_ff, rng))
            add(p + "ffn_up.bias", vec(2 * n_ff))
            add(p + "ffn_down.bias", vec(n_embd))
            add(p + "ffn_down.weight", weight(qtype, n_ff, n_embd, rng))
        else:
            add(p + "ffn_up.weight", weight(qtype, n_embd, n_ff, rng))
            if nomic and not moe:
                add(p + "ffn_gate.weight", weight(qtype, n_embd, n_ff, rng))
            else:
                if not nomic:
                    add(p + "attn_output.bias", vec(n_embd))
                add(p + "ffn_up.bias", vec(n_ff))
                add(p + "ffn_down.bias", vec(n_embd))
            add(p + "ffn_down.weight", weight(qtype, n_ff, n_embd, rng))
        for norm in ("attn_output_norm", "layer_output_norm"):
            add(p + norm + ".weight", vec(n_embd, 1.0))
            add(p + norm + ".bias", vec(n_embd))
    if rank:
        add("cls.weight", weight(head_type, n_embd, n_embd, rng, scale=0.2))
        add("cls.bias", vec(n_embd))
        add("cls.output.weight", weight(head_type, n_embd, rank, rng, scale=0.5))
        add("cls.output.bias", vec(rank))
    return finish(w, path)


def write_nomic_bert(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    return write_bert(path, qtype, "nomic-bert", **kw)


def write_modern_bert(path: str | Path, qtype: QT = QT.Q8_0, window: int = 8, act: Optional[str] = None, **kw) -> str:
    """ModernBERT: LayerNorms without biases (one of the embeddings, none before layer 0's attention),
    fused q/k/v, a fused [gate | up] GEGLU (act: hidden_activation, e.g. "silu"), no biases, no output
    matrix; 4 layers, 1 and 2 local (window 8 either way, RoPE base 10000), 0 and 3 global (base
    160000); mean pooling."""
    kw.setdefault("n_layer", 4)
    rng = np.random.default_rng(kw.get("seed", 0) + 200)
    keys = {"sliding_window": window, "sliding_window_pattern": 3, "rope.freq_base_swa": 10000.0,
            "causal_attention": False, "pooling_type": gguf.PoolingType.MEAN, **kw.pop("keys", {})}
    if act is not None:
        keys["hidden_activation"] = act
    norm = {"token_embd_norm.weight": 1.0 + 0.1 * rng.standard_normal(kw.get("n_embd", 256))}
    return write_model(path, "modern-bert", qtype, layer_norm=True, norm_bias=False, fused_qkv=True, fused_up=True,
                       tied=True, rope_base=160000.0, n_head_kv=kw.pop("n_head_kv", kw.get("n_head", 4)),
                       drop_tensor="blk.0.attn_norm.weight", extra_tensors=norm, keys=keys, **kw)


def write_jina_bert_v2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    return write_bert(path, qtype, "jina-bert-v2", **kw)


def write_nomic_bert_moe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    return write_bert(path, qtype, "nomic-bert-moe", **kw)


def write_safetensors(path: Path, tensors: dict) -> None:
    """A .safetensors file of float32 / int64 arrays."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": {np.float32: "F32", np.int64: "I64"}[a.dtype.type], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_hf_bert(src: Path, n_embd: int = 64, n_layer: int = 2, n_head: int = 4, n_ff: int = 128,
                  seed: int = 0) -> tuple[Path, dict, list]:
    """A Hugging Face BertModel folder in sentence-transformers' layout (config.json, vocab.txt,
    model.safetensors, a mean Pooling module), random weights: (folder, its tensors, vocabulary)."""
    rng = np.random.default_rng(seed)
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(3)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat",
                                                              "sat", "##s", "mat", ".", "on"]
    src = Path(src)
    (src / "1_Pooling").mkdir(parents=True)
    (src / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (src / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_size": n_embd, "num_hidden_layers": n_layer, "num_attention_heads": n_head,
        "intermediate_size": n_ff, "max_position_embeddings": 32, "layer_norm_eps": 1e-12, "type_vocab_size": 2,
        "hidden_act": "gelu", "position_embedding_type": "absolute"}))
    (src / "special_tokens_map.json").write_text(json.dumps(
        {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}))
    (src / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (src / "modules.json").write_text(json.dumps([{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
                                                  {"idx": 1, "path": "1_Pooling",
                                                   "type": "sentence_transformers.models.Pooling"}]))
    (src / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))

    def r(*shape, scale=0.2, centre=0.0):
        return (centre + scale * rng.standard_normal(shape)).astype(np.float32)
    t = {"embeddings.position_ids": np.arange(32, dtype=np.int64)[None],
         "embeddings.word_embeddings.weight": r(len(vocab), n_embd, scale=1.0),
         "embeddings.position_embeddings.weight": r(32, n_embd), "embeddings.token_type_embeddings.weight": r(2, n_embd),
         "embeddings.LayerNorm.weight": r(n_embd, centre=1.0), "embeddings.LayerNorm.bias": r(n_embd),
         "pooler.dense.weight": r(n_embd, n_embd), "pooler.dense.bias": r(n_embd)}
    for i in range(n_layer):
        p = f"encoder.layer.{i}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + m + ".weight"], t[p + m + ".bias"] = r(n_embd, n_embd), r(n_embd)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = r(n_ff, n_embd), r(n_ff)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = r(n_embd, n_ff), r(n_embd)
        for m in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + m + ".weight"], t[p + m + ".bias"] = r(n_embd, centre=1.0), r(n_embd)
    write_safetensors(src / "model.safetensors", t)
    return src, t, vocab


def write_starcoder(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """StarCoder (v1): GPT-2's layout with one key/value head."""
    kw.setdefault("n_head_kv", 1)
    return write_gpt2(path, qtype, arch="starcoder", **kw)


def write_qwen2vl(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Qwen 2 VL's language model: Qwen 2 with M-RoPE sections (time, height, width) of 8, 12, 12 pairs."""
    keys = {"rope_dimension_sections": [8, 12, 12, 0], **kw.pop("keys", {})}
    return write_model(path, "qwen2vl", qtype, qkv_bias=True, rope_base=1e6, keys=keys, **kw)


def write_paddleocr(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """PaddleOCR-VL's language model: ERNIE 4.5 with M-RoPE sections of 8, 12, 12 pairs and q, k
    and v biases (llama.cpp reads them as optional)."""
    keys = {"rope_dimension_sections": [8, 12, 12, 0], **kw.pop("keys", {})}
    return write_model(path, "paddleocr", qtype, qkv_bias=True, rope_base=5e5, keys=keys, **kw)


def write_qwen3vl(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Qwen 3 VL's language model: Qwen 3 (heads of 128) with interleaved M-RoPE sections 24, 20, 20."""
    keys = {"rope_dimension_sections": [24, 20, 20, 0], **kw.pop("keys", {})}
    kw.setdefault("head_dim", 128)
    return write_model(path, "qwen3vl", qtype, qk_norm=True, rope_base=5e6, keys=keys, **kw)


def write_deepseek2(path: str | Path, qtype: QT = QT.Q8_0, split: bool = True, q_lora: int = 0,
                    sigmoid: bool = False, dims: Optional[dict] = None, **kw) -> str:
    """DeepSeek 2: latent attention (latent 256, heads of 64 unrotated + 32 rotated dims, values of 64;
    q_lora > 0: q through attn_q_a/attn_q_b, as V2 and V3), layer 0 dense, then 16 experts of 256
    (4 chosen, weights times 1.5) and 2 shared experts (dense FFN 768 wide); sigmoid: V3's gating (sigmoid, exp_probs_b,
    renormalized). split: attn_k_b + attn_v_b (llama.cpp's converter since 2025), else attn_kv_b.
    attn_k_b is Q8_0 when qtype's blocks do not fit its 64-wide rows (llama.cpp's fallback).
    dims: other sizes of the latent attention ({"kv_lora": 512, "nope": 128, "rope": 64, "v": 128})."""
    kw.setdefault("experts", 16)
    kw.setdefault("experts_used", 4)
    kw.setdefault("n_ff_exp", 256)
    kw.setdefault("dense_layers", (0,))
    kw.setdefault("n_ff", 1024)   # the dense FFN wider than the shared experts, as in the released files
    kb_type = qtype if gguf.GGML_QUANT_SIZES[qtype][0] <= 64 else QT.Q8_0
    mla = {"kv_lora": 256, "nope": 64, "rope": 32, "v": 64, **(dims or {}), "q_lora": q_lora, "split": split,
           "kb_type": kb_type}
    kw.setdefault("n_head_kv", 1 if split else kw.get("n_head", 4))   # the converter's: MQA over the latent, or MHA
    keys = {"leading_dense_block_count": 1, "expert_shared_count": 2, "expert_weights_scale": 1.5,
            **kw.pop("keys", {})}
    if sigmoid:
        keys.update(expert_gating_func=gguf.ExpertGatingFuncType.SIGMOID, expert_weights_norm=True)
    return write_model(path, kw.pop("arch", "deepseek2"), qtype, mla=mla, select_bias=sigmoid,
                       shared_expert=2 * kw["n_ff_exp"], keys=keys, **kw)


def write_mistral4(path: str | Path, qtype: QT = QT.Q8_0, temperature: bool = True, **kw) -> str:
    """Mistral 4: DeepSeek 2's latent attention (q_a/q_b, split k_b/v_b) and experts, each
    expert's gate and up in one ffn_gate_up_exps, softmax gating renormalized; temperature:
    Llama 4's attention temperature (scale 0.1 every 4 positions: it changes the logits within
    the tests' prompts)."""
    keys = {"expert_weights_norm": True, **kw.pop("keys", {})}
    if temperature:
        keys.update({"attention.temperature_scale": 0.1, "attention.temperature_length": 4})
    return write_deepseek2(path, qtype, q_lora=256, arch="mistral4", fused_experts=True, keys=keys, **kw)


def write_plm(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """PLM: DeepSeek 2's latent attention with q from attn_q and one attn_kv_b (every head its own KV
    head, as the converter writes it), an ungated squared-ReLU FFN in every layer, the output tied."""
    kw.setdefault("n_head_kv", kw.get("n_head", 4))
    mla = {"kv_lora": 256, "nope": 64, "rope": 32, "v": 64, "q_lora": 0, "split": False}
    return write_model(path, "plm", qtype, mla=mla, gated=False, tied=True, **kw)


def moe_defaults(kw: dict, experts: int = 16, used: int = 4, dense: tuple = (0,)) -> None:
    """A MoE writer's defaults: `experts` of 256, `used` chosen per token, dense FFNs of 768 in
    the `dense` layers."""
    for name, value in (("experts", experts), ("experts_used", used), ("n_ff_exp", 256), ("n_ff", 768),
                        ("dense_layers", dense)):
        kw.setdefault(name, value)


def mtp_tensors(layer: int, n_embd: int, output_norm: bool = False) -> dict:
    """The tensors of a multi-token-prediction block `layer` beyond an ordinary block's: its
    nextn.* projection and norms (and layer_output_norm: BailingMoE 2)."""
    rng = np.random.default_rng(7)
    extra = {f"blk.{layer}.nextn.eh_proj.weight": rng.standard_normal((n_embd, 2 * n_embd)) / 16,
             f"blk.{layer}.nextn.enorm.weight": np.ones(n_embd), f"blk.{layer}.nextn.hnorm.weight": np.ones(n_embd)}
    if output_norm:
        extra[f"blk.{layer}.layer_output_norm.weight"] = np.ones(n_embd)
    return extra


def write_bailingmoe2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """BailingMoE 2 (Ling 2.0): fused q/k/v, per-head q/k norms, NEOX RoPE on half of each head;
    layer 0 dense (768), then 16 experts of 256 in 4 groups (2 kept), 4 chosen by sigmoid +
    exp_probs_b, renormalized, times 2.5, and a shared expert of 512 (its own width); one more
    block for multi-token prediction (with its nextn.* and layer_output_norm), not run."""
    moe_defaults(kw)
    n_layer, n_embd = kw.pop("n_layer", 2), kw.setdefault("n_embd", 256)
    hd = n_embd // kw.get("n_head", 4)
    keys = {"leading_dense_block_count": 1, "expert_shared_count": 1, "expert_weights_scale": 2.5,
            "expert_weights_norm": True, "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
            "expert_group_count": 4, "expert_group_used_count": 2, "nextn_predict_layers": 1, **kw.pop("keys", {})}
    return write_model(path, "bailingmoe2", qtype, n_layer=n_layer + 1, fused_qkv=True, qk_norm=True,
                       rope_dim=hd // 2, select_bias=True, shared_expert=512, keys=keys,
                       extra_tensors=mtp_tensors(n_layer, n_embd, output_norm=True), **kw)


def write_hunyuan_dense(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Hunyuan dense: Llama with per-head q/k norms (taken after RoPE) and NEOX RoPE."""
    kw.setdefault("arch", "hunyuan-dense")
    return write_model(path, qtype=qtype, qk_norm=True, rope_base=1e6, **kw)


def write_llama4(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Llama 4: 4 layers (layer 3 without RoPE, attending over everything), experts in layers 1
    and 3 (interleave step 2; dense FFNs of 768 in 0 and 2): 8 of 256, one chosen by its
    sigmoid, which scales its input; a shared expert as wide."""
    kw.setdefault("n_layer", 4)
    moe_defaults(kw, experts=8, used=1, dense=tuple(i for i in range(kw["n_layer"]) if (i + 1) % 2))
    keys = {"interleave_moe_layer_step": 2, **kw.pop("keys", {})}
    return write_model(path, "llama4", qtype, rope_base=500000.0, shared_expert=kw["n_ff_exp"], keys=keys, **kw)


def write_smallthinker(path: str | Path, qtype: QT = QT.Q8_0, window: bool = True, **kw) -> str:
    """SmallThinker: 5 layers of 8 experts of 256 (2 chosen, ReLU-gated, routed by the layer's
    input); with window a sliding window in the file (layers 0 and 4 then full and without
    RoPE, the others windowed: 4096 as llama.cpp reads it)."""
    kw.setdefault("n_layer", 5)
    moe_defaults(kw, experts=8, used=2, dense=())
    keys = {**({"sliding_window": 4096} if window else {}), "expert_gating_func": gguf.ExpertGatingFuncType.SOFTMAX,
            **kw.pop("keys", {})}
    return write_model(path, "smallthinker", qtype, rope_base=1e6, keys=keys, **kw)


def write_dots1(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """dots.llm1: Qwen 3's attention; layer 0 dense (768), then 16 experts of 256, 4 chosen by
    sigmoid + exp_probs_b, renormalized, times 2.5, and 2 shared experts."""
    moe_defaults(kw)
    kw.setdefault("n_head_kv", kw.get("n_head", 4))   # llama.cpp loads its K and V as wide as q (the released MHA)
    keys = {"leading_dense_block_count": 1, "expert_shared_count": 2, "expert_weights_scale": 2.5,
            "expert_weights_norm": True, "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID, **kw.pop("keys", {})}
    return write_model(path, "dots1", qtype, qk_norm=True, rope_base=1e6, select_bias=True, shared_expert=512,
                       keys=keys, **kw)


def write_exaone_moe(path: str | Path, qtype: QT = QT.Q8_0, pattern: Optional[list] = None, **kw) -> str:
    """EXAONE MoE: 4 layers with per-head q/k norms, a window of 8 and NEOX RoPE in layers 0-2
    (or where `pattern` says), layer 3 global without RoPE; layer 0 dense (768), then 16 experts
    of 256 (4 chosen by sigmoid + exp_probs_b, renormalized, times 1.5: with dots1's 2.5 the
    quantized files flip more choices over 3 MoE layers than the tests allow) and a shared expert
    of 512 (expert_shared_feed_forward_length, which write_model writes); one more block for
    multi-token prediction (dense, with its nextn.* tensors), not run."""
    moe_defaults(kw)
    n_layer, n_embd = kw.pop("n_layer", 4), kw.setdefault("n_embd", 256)
    keys = {"leading_dense_block_count": 1, "expert_shared_count": 2, "expert_weights_scale": 1.5,
            "expert_weights_norm": True, "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
            "sliding_window": 8, "nextn_predict_layers": 1, **kw.pop("keys", {})}
    if pattern is not None:
        keys["sliding_window_pattern"] = pattern
    kw["dense_layers"] = tuple(kw["dense_layers"]) + (n_layer,)
    return write_model(path, "exaone-moe", qtype, n_layer=n_layer + 1, qk_norm=True, select_bias=True,
                       shared_expert=512, keys=keys, extra_tensors=mtp_tensors(n_layer, n_embd), **kw)


def write_afmoe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """AFMoE (Trinity): 4 layers, norms before and after each branch, per-head q/k norms, an output
    gate on attention (attn_gate), NEOX RoPE and a window of 8 in layers 0-2, layer 3 global and
    without RoPE; layer 0 dense (768), then 16 experts of 256 (4 chosen by sigmoid + exp_probs_b,
    renormalized, times 2.5) and one shared expert."""
    kw.setdefault("n_layer", 4)
    moe_defaults(kw)
    n_layer, n_embd, n_head = kw["n_layer"], kw.setdefault("n_embd", 256), kw.get("n_head", 4)
    rng = np.random.default_rng(9)
    gates = {f"blk.{i}.attn_gate.weight": rng.standard_normal((n_head * (n_embd // n_head), n_embd)) / 16
             for i in range(n_layer)}
    keys = {"leading_dense_block_count": 1, "expert_shared_count": 1, "expert_weights_scale": 2.5,
            "expert_weights_norm": True, "sliding_window": 8, **kw.pop("keys", {})}
    return write_model(path, "afmoe", qtype, qk_norm=True, post_norms=True, rope_base=1e4, select_bias=True,
                       shared_expert=kw["n_ff_exp"], keys=keys, extra_tensors=gates, **kw)


def write_qwen3vlmoe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Qwen 3 VL MoE's language model: Qwen3-MoE (heads of 128, 16 experts of 256, 4 chosen) with
    interleaved M-RoPE sections 24, 20, 20."""
    keys = {"rope_dimension_sections": [24, 20, 20, 0], **kw.pop("keys", {})}
    kw.setdefault("head_dim", 128)
    return write_qwen3moe(path, qtype, arch="qwen3vlmoe", rope_base=5e6, keys=keys, **kw)


def write_hunyuan_moe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Hunyuan MoE: Hunyuan dense's attention, 8 experts as wide as n_ff (512), 2 chosen, and a
    shared expert of 256."""
    kw.setdefault("experts", 8)
    kw.setdefault("n_ff_exp", kw.get("n_ff", 512))   # llama.cpp requires the key; the experts are n_ff wide
    return write_hunyuan_dense(path, qtype, arch="hunyuan-moe", shared_expert=256, **kw)


def write_seed_oss(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Seed-OSS: Llama with q/k/v biases, NEOX RoPE, the FFN's norm named post_attention_norm and
    heads of 128 (wider than n_embd / n_head)."""
    kw.setdefault("head_dim", 128)
    return write_model(path, "seed_oss", qtype, qkv_bias=True, ffn_norm="post_attention_norm", rope_base=1e7, **kw)


def write_minicpm(path: str | Path, qtype: QT = QT.Q8_0, scales: bool = True, long_rope: bool = False, **kw) -> str:
    """MiniCPM: Llama's layout with the multipliers the converter writes (scales=False: none,
    as files from before it; the family's defaults apply); long_rope: MiniCPM 4's LongRoPE
    factors over an original context of 256."""
    keys = {"embedding_scale": 12.0, "residual_scale": 1.4 / math.sqrt(kw.get("n_layer", 2)),
            "logit_scale": kw.get("n_embd", 256) / 64} if scales else {}
    if long_rope:
        keys.update(rope_scaling_type=gguf.RopeScalingType.LONGROPE, rope_scaling_orig_ctx_len=256)
    keys.update(kw.pop("keys", {}))
    kw.setdefault("tied", True)
    return write_model(path, "minicpm", qtype, rope_factors=long_rope, keys=keys, **kw)


def write_minicpm3(path: str | Path, qtype: QT = QT.Q8_0, long_rope: bool = True, **kw) -> str:
    """MiniCPM 3: latent attention as DeepSeek 2's unsplit files (q_lora 256, latent 256, heads
    of 64 + 32 rotated dims, values of n_embd / n_head = 64, no value_length key), dense FFNs,
    tied output, LongRoPE factors (long_rope) over an original context of 256."""
    mla = {"kv_lora": 256, "nope": 64, "rope": 32, "v": kw.get("n_embd", 256) // kw.get("n_head", 4),
           "q_lora": 256, "split": False, "value_length": False}
    kw.setdefault("n_head_kv", kw.get("n_head", 4))
    kw.setdefault("tied", True)
    keys = dict(kw.pop("keys", {}))
    if long_rope:
        keys.update(rope_scaling_type=gguf.RopeScalingType.LONGROPE, rope_scaling_orig_ctx_len=256)
    return write_model(path, "minicpm3", qtype, mla=mla, rope_factors=long_rope, keys=keys, **kw)


def write_chatglm(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """ChatGLM (GLM-4-9B-chat): fused q/k/v with bias, fused [gate | up], RoPE on half of each head
    (adjacent pairs), untied output, multi-query groups of 2 KV heads."""
    kw.setdefault("rope_dim", 32)
    return write_model(path, "chatglm", qtype, fused_qkv=True, qkv_bias=True, fused_up=True, **kw)


def write_bloom(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """BLOOM: GPT-2's layout without positions (ALiBi), a LayerNorm of the embeddings
    (token_embd_norm), the output tied."""
    kw.setdefault("tied", True)
    rng = np.random.default_rng(kw.get("seed", 0) + 100)
    n = kw.get("n_embd", 256)
    norm = {"token_embd_norm.weight": 1.0 + 0.1 * rng.standard_normal(n), "token_embd_norm.bias": 0.1 * rng.standard_normal(n)}
    return write_model(path, "bloom", qtype, layer_norm=True, fused_qkv=True, qkv_bias=True, biases=True, gated=False,
                       extra_tensors=norm, **kw)


def write_mpt(path: str | Path, qtype: QT = QT.Q8_0, alibi: float = 8.0, **kw) -> str:
    """MPT-7B: LayerNorm without biases, fused q/k/v without bias, ungated GELU, no biases at all,
    ALiBi with the file's maximum bias (alibi), the output tied."""
    kw.setdefault("tied", True)
    keys = {"max_alibi_bias": alibi, **kw.pop("keys", {})}
    return write_model(path, "mpt", qtype, layer_norm=True, norm_bias=False, fused_qkv=True, gated=False,
                       keys=keys, **kw)


def write_jais(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """JAIS: LayerNorm with biases, fused q/k/v with bias, a SiLU-gated FFN with biases on all three
    matrices, ALiBi (max_alibi_bias 8), the output untied."""
    keys = {"max_alibi_bias": 8.0, **kw.pop("keys", {})}
    return write_model(path, "jais", qtype, layer_norm=True, fused_qkv=True, qkv_bias=True, biases=True, keys=keys, **kw)


def write_llama_embed(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """llama-embed: the Llama layout without an output matrix, causal_attention false, mean pooling."""
    keys = {"causal_attention": False, "pooling_type": gguf.PoolingType.MEAN, **kw.pop("keys", {})}
    return write_model(path, "llama-embed", qtype, tied=True, keys=keys, **kw)


def write_olmo(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """OLMo 1: the Llama layout without any norm tensor (its LayerNorms have no parameters)."""
    return write_model(path, "olmo", qtype, layer_norm=True, norm_bias=False, pre_norms=False,
                       drop_tensor="output_norm.weight", **kw)


def write_bailingmoe(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Bailing MoE (Ling-lite): DeepSeek-MoE's layout without dense layers, the chosen experts'
    softmax values renormalized (expert_weights_norm, the converter's norm_topk_prob), scale 1."""
    kw.setdefault("dense_layers", ())
    keys = {"leading_dense_block_count": 0, "expert_weights_scale": 1.0, "expert_weights_norm": True,
            **kw.pop("keys", {})}
    return write_deepseek(path, qtype, arch="bailingmoe", keys=keys, **kw)


class RwkvTensors:
    """An RWKV file being written (w) and its tensors: add(name, (array, raw type)); vec(values, shape): a float
    vector; small(n_in, n_out): a LoRA matrix, in qtype where its rows are whole blocks, else F16;
    norm(name): a norm's weight (and bias) of n_embd."""

    def __init__(self, path: str | Path, arch: str, qtype: QT, rng: np.random.Generator, n_embd: int, n_layer: int,
                 n_ff: int, head_size: int):
        """A writer for `path` with the keys every RWKV file has (head_count 0, as the converter writes it)."""
        self.w, self.qtype, self.rng, self.n_embd = gguf.GGUFWriter(str(path), arch), qtype, rng, n_embd
        for add, value in ((self.w.add_block_count, n_layer), (self.w.add_context_length, 1 << 20),
                           (self.w.add_embedding_length, n_embd), (self.w.add_feed_forward_length, n_ff),
                           (self.w.add_head_count, 0), (self.w.add_wkv_head_size, head_size)):
            add(value)

    def __call__(self, name: str, array_and_type) -> None:
        self.w.add_tensor(name, array_and_type[0], raw_dtype=array_and_type[1])

    @staticmethod
    def vec(values, shape=None):
        a = np.asarray(values, np.float32)
        return (a if shape is None else a.reshape(shape)), None

    def small(self, n_in: int, n_out: int, scale: Optional[float] = None):
        fits = self.qtype in (QT.F32, QT.F16) or n_in % GGML_QUANT_SIZES[self.qtype][0] == 0
        return weight(self.qtype if fits else QT.F16, n_in, n_out, self.rng, scale)

    def norm(self, name: str, bias: bool = True) -> None:
        self(name + ".weight", self.vec(1.0 + 0.1 * self.rng.standard_normal(self.n_embd)))
        if bias:
            self(name + ".bias", self.vec(0.1 * self.rng.standard_normal(self.n_embd)))

    def begin(self, qwen: bool, tokenizer_from: Optional[dict], n_vocab: int) -> int:
        """The norms' epsilon (QRWKV, ARWKV: RMSNorms and one token shift), the vocabulary, the token
        embedding and (RWKV's own) its LayerNorm; returns the vocabulary's size."""
        if qwen:
            self.w.add_layer_norm_rms_eps(1e-6)
            self.w.add_token_shift_count(1)
        else:
            self.w.add_layer_norm_eps(1e-5)
        n_vocab = copy_tokenizer(self.w, tokenizer_from) if tokenizer_from is not None else small_vocab(self.w, n_vocab)
        self("token_embd.weight", weight(self.qtype, self.n_embd, n_vocab, self.rng, scale=1.0))
        if not qwen:
            self.norm("token_embd_norm")
        return n_vocab

    def ffn(self, p: str, qwen: bool, n_ff: int, receptance: bool) -> None:
        """Layer p's FFN: Qwen's SwiGLU after an RMSNorm (QRWKV, ARWKV), or RWKV's channel mix after
        attn_norm_2, with its receptance gate (RWKV 6) or without (RWKV 7)."""
        n, rng, qt = self.n_embd, self.rng, self.qtype
        if qwen:
            self(p + "ffn_norm.weight", self.vec(1.0 + 0.1 * rng.standard_normal(n)))
            for name, n_in, n_out in (("gate", n, n_ff), ("up", n, n_ff), ("down", n_ff, n)):
                self(p + f"ffn_{name}.weight", weight(qt, n_in, n_out, rng))
            return
        self.norm(p + "attn_norm_2")
        for c in "kr" if receptance else "k":
            self(p + f"channel_mix_lerp_{c}.weight", self.vec(rng.uniform(0, 1, n), (1, 1, n)))
        self(p + "channel_mix_key.weight", weight(qt, n, n_ff, rng))
        self(p + "channel_mix_value.weight", weight(qt, n_ff, n, rng))
        if receptance:
            self(p + "channel_mix_receptance.weight", weight(qt, n, n, rng))

    def end(self, qwen: bool, n_vocab: int, path: str | Path) -> str:
        """The output norm (with its bias unless Qwen's) and matrix; the file written out."""
        self.norm("output_norm", bias=not qwen)
        self("output.weight", weight(self.qtype, self.n_embd, n_vocab, self.rng))
        return finish(self.w, path)


def write_rwkv6(path: str | Path, qtype: QT = QT.Q8_0, *, arch: str = "rwkv6", n_embd: int = 256, n_layer: int = 3,
                head_size: int = 64, n_ff: int = 512, extra: int = 32, decay_extra: int = 64, rescale_every: int = 2,
                kv_heads: int = 0, fused_lerps: bool = True, n_vocab: int = 512, seed: int = 0,
                tokenizer_from: Optional[dict] = None) -> str:
    """RWKV 6 (arch `rwkv6`) as the converter writes it: head_count 0, wkv.head_size, the LoRA sizes
    of the lerps and the decay, LayerNorms with biases (the embeddings' too), a time mix and a channel
    mix per layer; fused_lerps False: the five time_mix_lerp_{w,k,v,r,g} apart (older files). arch
    `rwkv6qwen2` (QRWKV 6): RMSNorms, no time_mix_first nor time_mix_ln (a gated linear attention),
    r/k/v biases, keys and values of kv_heads heads, a SwiGLU FFN. The small LoRA matrices are F16 where
    qtype's blocks do not divide their rows."""
    rng = np.random.default_rng(seed)
    qrwkv = arch == "rwkv6qwen2"
    heads = n_embd // head_size
    kv = (kv_heads or heads) * head_size
    add = RwkvTensors(path, arch, qtype, rng, n_embd, n_layer, n_ff, head_size)
    w, vec, small, norm = add.w, add.vec, add.small, add.norm
    w.add_time_mix_extra_dim(extra)
    w.add_time_decay_extra_dim(decay_extra)
    if qrwkv:
        if kv_heads:
            w.add_head_count_kv(kv_heads)
    else:
        w.add_rescale_every_n_layers(rescale_every)
    n_vocab = add.begin(qrwkv, tokenizer_from, n_vocab)
    for i in range(n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm", bias=not qrwkv)
        add(p + "time_mix_lerp_x.weight", vec(rng.uniform(0, 1, n_embd), (1, 1, n_embd)))
        if fused_lerps:
            add(p + "time_mix_lerp_fused.weight", vec(rng.uniform(0, 1, (5, n_embd)), (5, 1, 1, n_embd)))
        else:
            for c in "wkvrg":
                add(p + f"time_mix_lerp_{c}.weight", vec(rng.uniform(0, 1, n_embd), (1, 1, n_embd)))
        add(p + "time_mix_w1.weight", small(n_embd, 5 * extra))
        arr, raw = small(extra, 5 * n_embd, scale=0.5 / np.sqrt(extra))
        add(p + "time_mix_w2.weight", (arr.reshape(5, n_embd, -1), raw))
        # decays exp(-exp(d)) between about 0.08 and 0.998, as trained models have them
        add(p + "time_mix_decay.weight", vec(rng.uniform(-6.0, 0.9, n_embd)))
        add(p + "time_mix_decay_w1.weight", small(n_embd, decay_extra))
        add(p + "time_mix_decay_w2.weight", small(decay_extra, n_embd, scale=0.5 / np.sqrt(decay_extra)))
        for name, n_out in (("receptance", n_embd), ("key", kv), ("value", kv), ("gate", n_embd)):
            add(p + f"time_mix_{name}.weight", weight(qtype, n_embd, n_out, rng))
        add(p + "time_mix_output.weight", weight(qtype, n_embd, n_embd, rng))
        if qrwkv:
            for name, n_out in (("receptance", n_embd), ("key", kv), ("value", kv)):
                add(p + f"time_mix_{name}.bias", vec(0.1 * rng.standard_normal(n_out)))
        else:
            add(p + "time_mix_first.weight", vec(0.5 * rng.standard_normal((heads, head_size))))
            norm(p + "time_mix_ln")
        add.ffn(p, qrwkv, n_ff, receptance=True)
    return add.end(qrwkv, n_vocab, path)


def write_rwkv6qwen2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """QRWKV 6: 8 heads of 32, keys and values of 2 (GQA), 2 layers."""
    kw.setdefault("head_size", 32)
    kw.setdefault("kv_heads", 2)
    kw.setdefault("n_layer", 2)
    return write_rwkv6(path, qtype, arch="rwkv6qwen2", **kw)


def write_rwkv7(path: str | Path, qtype: QT = QT.Q8_0, *, arch: str = "rwkv7", n_embd: int = 256, n_layer: int = 3,
                head_size: int = 64, n_ff: int = 512, ranks: tuple = (32, 32, 32, 64), gated: bool = True,
                out_norm: bool = True, n_vocab: int = 512, seed: int = 0, tokenizer_from: Optional[dict] = None) -> str:
    """RWKV 7 (arch `rwkv7`) as the converter writes it: head_count 0, wkv.head_size, the LoRA ranks
    (decay, iclr, value residual, gate: `ranks`), LayerNorms with biases (the embeddings' too), a time
    mix with six fused lerps (five without the gate: gated False), its per-head output norm
    (out_norm), and a channel mix without receptance per layer. Layer 0's value-residual LoRA has the
    iclr rank, as llama.cpp loads it (and never runs). arch `arwkv7` (ARWKV 7): RMSNorms, a SwiGLU FFN,
    no embedding norm. The small LoRA matrices are F16 where qtype's blocks do not divide their rows."""
    rng = np.random.default_rng(seed)
    qwen = arch == "arwkv7"
    decay_rank, iclr_rank, v_rank, gate_rank = ranks
    add = RwkvTensors(path, arch, qtype, rng, n_embd, n_layer, n_ff, head_size)
    w, vec, small, norm = add.w, add.vec, add.small, add.norm
    w.add_decay_lora_rank(decay_rank)
    w.add_iclr_lora_rank(iclr_rank)
    w.add_value_residual_mix_lora_rank(v_rank)
    w.add_gate_lora_rank(gate_rank if gated else 0)
    n_vocab = add.begin(qwen, tokenizer_from, n_vocab)
    for i in range(n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm", bias=not qwen)
        n_lerps = 6 if gated else 5
        add(p + "time_mix_lerp_fused.weight", vec(rng.uniform(0, 1, (n_lerps, n_embd)), (n_lerps, 1, 1, n_embd)))
        # decays exp(-0.606531 sigmoid(w)) between about 0.55 and 0.97
        add(p + "time_mix_w0.weight", vec(rng.uniform(-3.0, 3.0, n_embd)))
        add(p + "time_mix_w1.weight", small(n_embd, decay_rank))
        add(p + "time_mix_w2.weight", small(decay_rank, n_embd, scale=0.5 / np.sqrt(decay_rank)))
        add(p + "time_mix_a0.weight", vec(rng.standard_normal(n_embd)))
        add(p + "time_mix_a1.weight", small(n_embd, iclr_rank))
        add(p + "time_mix_a2.weight", small(iclr_rank, n_embd))
        rank = iclr_rank if i == 0 else v_rank
        add(p + "time_mix_v0.weight", vec(rng.standard_normal(n_embd)))
        add(p + "time_mix_v1.weight", small(n_embd, rank))
        add(p + "time_mix_v2.weight", small(rank, n_embd))
        if gated:
            add(p + "time_mix_g1.weight", small(n_embd, gate_rank))
            add(p + "time_mix_g2.weight", small(gate_rank, n_embd))
        add(p + "time_mix_k_k.weight", vec(1.0 + 0.3 * rng.standard_normal(n_embd)))
        add(p + "time_mix_k_a.weight", vec(rng.uniform(0, 1, n_embd)))
        add(p + "time_mix_r_k.weight", vec(0.5 * rng.standard_normal(n_embd)))
        for name in ("receptance", "key", "value", "output"):
            add(p + f"time_mix_{name}.weight", weight(qtype, n_embd, n_embd, rng))
        if out_norm:
            norm(p + "time_mix_ln")
        add.ffn(p, qwen, n_ff, receptance=False)
    return add.end(qwen, n_vocab, path)


def write_arwkv7(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """ARWKV 7: 2 layers, no gate (five lerps) and no output norm, as the converted Qwen 2.5 models."""
    kw.setdefault("n_layer", 2)
    kw.setdefault("gated", False)
    kw.setdefault("out_norm", False)
    return write_rwkv7(path, qtype, arch="arwkv7", **kw)


def write_openelm(path: str | Path, qtype: QT = QT.Q8_0, *, n_embd: int = 256, heads: tuple = (4, 8, 4),
                  kv_heads: tuple = (2, 4, 1), ffs: tuple = (256, 512, 768), head_dim: int = 64, n_vocab: int = 512,
                  seed: int = 0, tokenizer_from: Optional[dict] = None) -> str:
    """OpenELM: a layer's query heads, key/value heads and FFN width its own (lists in the file),
    a fused attn_qkv, q/k RMSNorm weights per head dim, the output tied; 3 layers by default."""
    rng = np.random.default_rng(seed)
    n_layer = len(heads)
    w = gguf.GGUFWriter(str(path), "openelm")
    w.add_block_count(n_layer)
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(list(ffs))
    w.add_head_count(list(heads))
    w.add_head_count_kv(list(kv_heads))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    n_vocab = copy_tokenizer(w, tokenizer_from) if tokenizer_from is not None else small_vocab(w, n_vocab)

    def add(name, array_and_type):
        w.add_tensor(name, array_and_type[0], raw_dtype=array_and_type[1])

    def vec(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), None
    add("token_embd.weight", weight(qtype, n_embd, n_vocab, rng, scale=1.0))
    for i, (nq, nk, ff) in enumerate(zip(heads, kv_heads, ffs)):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", vec(n_embd))
        add(p + "attn_qkv.weight", weight(qtype, n_embd, (nq + 2 * nk) * head_dim, rng))
        add(p + "attn_q_norm.weight", vec(head_dim))
        add(p + "attn_k_norm.weight", vec(head_dim))
        add(p + "attn_output.weight", weight(qtype, nq * head_dim, n_embd, rng))
        add(p + "ffn_norm.weight", vec(n_embd))
        add(p + "ffn_gate.weight", weight(qtype, n_embd, ff, rng))
        add(p + "ffn_up.weight", weight(qtype, n_embd, ff, rng))
        add(p + "ffn_down.weight", weight(qtype, ff, n_embd, rng))
    add("output_norm.weight", vec(n_embd))
    return finish(w, path)


def write_orion(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Orion: LayerNorm with biases, NEOX RoPE over whole heads, no q/k/v biases, untied output."""
    return write_model(path, "orion", qtype, layer_norm=True, **kw)


def write_deepseek(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """DeepSeek-MoE: Llama's attention; layer 0 dense (768), then 16 experts of 256 (4 chosen by
    the softmax, not renormalized, times 1.5) and 2 shared experts (one FFN 512 wide)."""
    kw.setdefault("experts", 16)
    kw.setdefault("experts_used", 4)
    kw.setdefault("n_ff_exp", 256)
    kw.setdefault("dense_layers", (0,))
    kw.setdefault("n_ff", 768)
    keys = {"leading_dense_block_count": 1, "expert_shared_count": 2, "expert_weights_scale": 1.5,
            **kw.pop("keys", {})}
    return write_model(path, kw.pop("arch", "deepseek"), qtype, shared_expert=2 * kw["n_ff_exp"], keys=keys, **kw)


def write_glm4moe(path: str | Path, qtype: QT = QT.Q8_0, nextn: bool = True, **kw) -> str:
    """GLM-4.5: q/k/v biases, NEOX RoPE on half of each head, the FFN's norm named
    post_attention_norm; layer 0 dense (768), then 16 experts of 256 (4 chosen by sigmoid +
    exp_probs_b, renormalized, times 1.5) and one shared expert; qk_norm=True: per-head q/k
    norms (the 355B). nextn: one more block, the multi-token prediction layer (its nextn.*
    tensors too), which is not run."""
    moe_defaults(kw)
    n_layer, n_embd = kw.setdefault("n_layer", 2), kw.setdefault("n_embd", 256)
    hd = kw.get("head_dim") or n_embd // kw.get("n_head", 4)
    keys = {"leading_dense_block_count": 1, "expert_shared_count": 1, "expert_weights_scale": 1.5,
            "expert_weights_norm": True, **kw.pop("keys", {})}
    extra = {}
    if nextn:   # block n_layer is the MTP layer: a whole block plus its own projections and norms
        kw["n_layer"] = n_layer + 1
        keys["nextn_predict_layers"] = 1
        extra = mtp_tensors(n_layer, n_embd)
    return write_model(path, "glm4moe", qtype, qkv_bias=True, ffn_norm="post_attention_norm", rope_dim=hd // 2,
                       select_bias=True, shared_expert=kw["n_ff_exp"], keys=keys, extra_tensors=extra, **kw)



def write_apertus(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """Apertus: per-head q/k norms, rope_freqs, an ungated FFN with xIELU whose parameters differ by
    layer (alpha_p and alpha_n near the released ones' ~0.8-1.5, beta 0.5, eps -1e-6)."""
    rng = np.random.default_rng(kw.get("seed", 0) + 100)
    n_layer = kw.get("n_layer", 2)
    extra = {"xielu.alpha_n": rng.uniform(0.8, 1.5, n_layer).tolist(), "xielu.alpha_p": rng.uniform(0.8, 1.5, n_layer).tolist(),
             "xielu.beta": [0.5] * n_layer, "xielu.eps": [-1e-6] * n_layer}
    return write_model(path, "apertus", qtype, qk_norm=True, rope_freqs=True, rope_base=500000.0, gated=False,
                       float_arrays=extra, **kw)


def write_minimax_m2(path: str | Path, qtype: QT = QT.Q8_0, **kw) -> str:
    """MiniMax-M2: q/k norms as wide as q and k, half of each head rotated, 8 experts (2 chosen
    by sigmoids + exp_probs_b, renormalized)."""
    kw.setdefault("n_ff", 256)   # the experts' width (feed_forward_length and expert_feed_forward_length agree)
    moe_defaults(kw, experts=8, used=2, dense=())
    hd = kw.get("head_dim") or kw.get("n_embd", 256) // kw.get("n_head", 4)
    keys = {"expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID, **kw.pop("keys", {})}
    return write_model(path, "minimax-m2", qtype, qk_norm="full", rope_dim=hd // 2, select_bias=True, keys=keys,
                       **kw)

def write_gemma4(path: str | Path, qtype: QT = QT.Q8_0, *, n_embd: int = 256, n_head: int = 4, n_ff: int = 512,
                 swa: tuple = (1, 1, 1, 0, 1, 0), swa_head: tuple = (64, 2), full_head: tuple = (128, 1),
                 shared_kv: int = 2, per_layer: int = 32, v_from_k: bool = True, window: int = 8,
                 n_vocab: int = 512, tokenizer_from: Optional[dict] = None, embd_type: Optional[QT] = None,
                 experts: int = 0, experts_used: int = 2, n_ff_exp: int = 256, fused_experts: bool = True,
                 seed: int = 0, drop_tensor: Optional[str] = None, image_tokens: bool | str = False) -> str:
    """A tiny Gemma 4: layers local (swa flags) or global, with heads of (head_dim, kv_heads)
    swa_head or full_head; the last shared_kv layers without keys or values (their FFNs twice
    as wide, as E2B's); per_layer > 0: per-layer inputs that wide (E2B, E4B); v_from_k: the
    global layers without attn_v (their values from Wk h, as the 31B's); experts > 0: that many
    experts beside every dense FFN, experts_used per token, n_ff_exp wide, their gate and up
    fused (ffn_gate_up_exps) or not, scaled per expert (26B-A4B)."""
    rng = np.random.default_rng(seed)
    n_layer = len(swa)
    n_own = n_layer - shared_kv
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_block_count(n_layer)
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length([n_ff if i < n_own else 2 * n_ff for i in range(n_layer)] if shared_kv else n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv([swa_head[1] if f else full_head[1] for f in swa])
    w.add_key_length(full_head[0])
    w.add_value_length(full_head[0])
    w.add_key_length_swa(swa_head[0])
    w.add_value_length_swa(swa_head[0])
    w.add_rope_dimension_count(full_head[0])
    w.add_rope_dimension_count_swa(swa_head[0])
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_sliding_window(window)
    w.add_sliding_window_pattern([bool(f) for f in swa])
    w.add_shared_kv_layers(shared_kv)
    w.add_embedding_length_per_layer_input(per_layer)
    w.add_final_logit_softcapping(30.0)
    w.add_layer_norm_rms_eps(1e-6)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(experts_used)
        w.add_expert_feed_forward_length(n_ff_exp)
    n_vocab = copy_tokenizer(w, tokenizer_from) if tokenizer_from is not None else \
        small_vocab(w, n_vocab, image_tokens=image_tokens)

    def add(name, array_and_type):
        if name != drop_tensor:
            w.add_tensor(name, array_and_type[0], raw_dtype=array_and_type[1])

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), None

    def mat(n_in, n_out, qt=None, scale=None):   # rows too short for the type: Q8_0, as llama.cpp's quantizer
        qt = qt or qtype
        return weight(qt if n_in % GGML_QUANT_SIZES[qt][0] == 0 else QT.Q8_0, n_in, n_out, rng, scale)

    add("token_embd.weight", weight(embd_type or qtype, n_embd, n_vocab, rng, scale=1.0))
    add("output_norm.weight", norm(n_embd))
    rotated = full_head[0] // 8   # "proportional" RoPE: a quarter of the global heads' dims turn
    add("rope_freqs.weight", (np.array([1.0] * rotated + [1e30] * (full_head[0] // 2 - rotated), np.float32), None))
    if per_layer:
        add("per_layer_token_embd.weight", mat(per_layer * n_layer, n_vocab, embd_type or qtype,
                                                   scale=1.0 / np.sqrt(per_layer)))   # ~1 once scaled
        add("per_layer_model_proj.weight", mat(n_embd, per_layer * n_layer))
        add("per_layer_proj_norm.weight", norm(per_layer))
    for i, local in enumerate(swa):
        p = f"blk.{i}."
        hd, kvh = swa_head if local else full_head
        ff = n_ff if i < n_own else 2 * n_ff
        add(p + "attn_norm.weight", norm(n_embd))
        add(p + "attn_q.weight", mat(n_embd, n_head * hd))
        add(p + "attn_q_norm.weight", (norm(hd)[0] * hd ** -0.25, None))   # q.k is not scaled: norms
                                                                             # of hd^-1/4 keep scores ~1
        if i < n_own:
            add(p + "attn_k.weight", mat(n_embd, kvh * hd))
            if local or not v_from_k:
                add(p + "attn_v.weight", mat(n_embd, kvh * hd))
            add(p + "attn_k_norm.weight", (norm(hd)[0] * hd ** -0.25, None))
        add(p + "attn_output.weight", mat(n_head * hd, n_embd))
        add(p + "post_attention_norm.weight", norm(n_embd))
        add(p + "ffn_norm.weight", norm(n_embd))
        add(p + "ffn_gate.weight", mat(n_embd, ff))
        add(p + "ffn_up.weight", mat(n_embd, ff))
        add(p + "ffn_down.weight", mat(ff, n_embd))
        add(p + "post_ffw_norm.weight", norm(n_embd))
        if experts:
            add(p + "ffn_gate_inp.weight", weight(QT.F32, n_embd, experts, rng, scale=1.0))
            add(p + "ffn_gate_inp.scale", norm(n_embd))
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                add(p + name + ".weight", norm(n_embd))
            for name, n_in, n_out in (((("gate_up", n_embd, 2 * n_ff_exp),) if fused_experts else
                                       (("gate", n_embd, n_ff_exp), ("up", n_embd, n_ff_exp))) +
                                      (("down", n_ff_exp, n_embd),)):
                arr, raw = mat(n_in, n_out * experts)
                add(p + f"ffn_{name}_exps.weight", (arr.reshape(experts, n_out, -1), raw))
            add(p + "ffn_down_exps.scale", (rng.uniform(0.5, 1.5, experts).astype(np.float32), None))
        if per_layer:
            add(p + "inp_gate.weight", mat(n_embd, per_layer))
            add(p + "proj.weight", mat(per_layer, n_embd))
            add(p + "post_norm.weight", norm(n_embd))
        add(p + "layer_output_scale.weight", (rng.uniform(0.5, 1.0, 1).astype(np.float32), None))
    return finish(w, path)


def write_gemma3n(path: str | Path, qtype: QT = QT.Q8_0, *, n_embd: int = 256, n_head: int = 4, n_head_kv: int = 2,
                  head_dim: int = 64, n_ff: int = 512, n_layer: int = 7, shared_kv: Optional[int] = None,
                  window: int = 8, n_altup: int = 4, per_layer: int = 256, laurel_rank: int = 64,
                  sparsity: Optional[list] = None, n_vocab: int = 512, tokenizer_from: Optional[dict] = None,
                  embd_type: Optional[QT] = None, seed: int = 0, drop_tensor: Optional[str] = None) -> str:
    """A tiny Gemma 3n: every fifth layer global (4, 9, ...), the others local over `window`
    tokens; layers from 20 on (shared_kv: the last that many) reading earlier layers' caches; the
    residual as n_altup AltUp streams; LAuReL of laurel_rank; per-layer inputs per_layer wide;
    activation sparsity 0.95 in layers 0-9 (sparsity: a share per layer). llama.cpp fixes the
    per-layer width at 256, the rank at 64 and 20 layers with their own caches, so the
    defaults are those (n_layer=25 shares; these random models' streams compound the
    engines' rounding over many layers: 7 by default)."""
    rng = np.random.default_rng(seed)
    shared_kv = max(0, n_layer - 20) if shared_kv is None else shared_kv
    w = gguf.GGUFWriter(str(path), "gemma3n")
    w.add_block_count(n_layer)
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length([n_ff] * n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_sliding_window(window)
    w.add_sliding_window_pattern([i % 5 < 4 for i in range(n_layer)])
    w.add_shared_kv_layers(shared_kv)
    w.add_embedding_length_per_layer_input(per_layer)
    w.add_altup_num_inputs(n_altup)
    w.add_altup_active_idx(0)
    w.add_activation_sparsity_scale(sparsity if sparsity is not None else
                                    [0.95 if i < 10 else 0.0 for i in range(n_layer)])
    w.add_final_logit_softcapping(30.0)
    w.add_layer_norm_rms_eps(1e-6)
    n_vocab = copy_tokenizer(w, tokenizer_from) if tokenizer_from is not None else small_vocab(w, n_vocab)

    def add(name, array_and_type):
        if name != drop_tensor:
            w.add_tensor(name, array_and_type[0], raw_dtype=array_and_type[1])

    def norm(n, scale=1.0):
        return ((1.0 + 0.1 * rng.standard_normal(n)) * scale).astype(np.float32), None

    def mat(n_in, n_out, qt=None, scale=None):   # rows too short for the type: Q8_0, or F32 below 32
        qt = qt or qtype
        if n_in % GGML_QUANT_SIZES[qt][0]:
            qt = QT.Q8_0 if n_in % 32 == 0 else QT.F32
        return weight(qt, n_in, n_out, rng, scale)

    add("token_embd.weight", weight(embd_type or qtype, n_embd, n_vocab, rng, scale=1.0))
    add("output_norm.weight", norm(n_embd))
    add("per_layer_token_embd.weight", mat(per_layer * n_layer, n_vocab, embd_type or qtype,
                                           scale=1.0 / np.sqrt(per_layer)))
    add("per_layer_model_proj.weight", mat(n_embd, per_layer * n_layer))
    add("per_layer_proj_norm.weight", norm(per_layer))
    for name in ("altup_proj.weight", "altup_unembd_proj.weight"):
        arr, raw = mat(n_embd, n_embd * (n_altup - 1))
        add(name, (arr.reshape(n_altup - 1, n_embd, -1), raw))
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", norm(n_embd))
        add(p + "attn_q.weight", mat(n_embd, n_head * head_dim))
        add(p + "attn_q_norm.weight", norm(head_dim, head_dim ** -0.25))   # q.k is not scaled: the norms
        add(p + "attn_k.weight", mat(n_embd, n_head_kv * head_dim))         # keep scores ~1; the shared KV
        add(p + "attn_v.weight", mat(n_embd, n_head_kv * head_dim))         # layers have keys and values
        add(p + "attn_k_norm.weight", norm(head_dim, head_dim ** -0.25))    # too, unused (as released)
        add(p + "attn_output.weight", mat(n_head * head_dim, n_embd))
        add(p + "post_attention_norm.weight", norm(n_embd))
        add(p + "ffn_norm.weight", norm(n_embd))
        add(p + "ffn_gate.weight", mat(n_embd, n_ff))
        add(p + "ffn_up.weight", mat(n_embd, n_ff))
        add(p + "ffn_down.weight", mat(n_ff, n_embd))
        add(p + "post_ffw_norm.weight", norm(n_embd))
        add(p + "inp_gate.weight", mat(n_embd, per_layer))
        add(p + "proj.weight", mat(per_layer, n_embd))
        add(p + "post_norm.weight", norm(n_embd))
        add(p + "altup_router.weight", mat(n_embd, n_altup, scale=1.0))    # router values of ~0.5
        add(p + "altup_router_norm.weight", norm(n_embd, np.sqrt(n_embd)))
        add(p + "altup_predict_coef.weight", mat(n_altup, n_altup * n_altup, QT.F32, scale=0.05))
        add(p + "altup_correct_coef.weight", mat(n_altup, n_altup, QT.F32, scale=0.05))
        add(p + "altup_correct_scale.weight", norm(n_embd))
        add(p + "laurel_l.weight", mat(n_embd, laurel_rank))
        add(p + "laurel_r.weight", mat(laurel_rank, n_embd))
        add(p + "laurel_post_norm.weight", norm(n_embd))
    return finish(w, path)


def gemma4_vocab(md: dict) -> dict:
    """A 'gemma4' tokenizer made from Gemma 3's SentencePiece vocabulary (no real Gemma 4
    vocabulary is on PyPI): the same tokens, with BPE merges derived as Hugging Face's
    SentencePiece extractor does, every split of a normal token into two tokens, the merged
    token's score first. The metadata md with its tokenizer keys replaced."""
    tokens, scores = list(md["tokenizer.ggml.tokens"]), md["tokenizer.ggml.scores"]
    types = md["tokenizer.ggml.token_type"]
    ids = {t: i for i, t in enumerate(tokens)}
    merges = []
    for i, t in enumerate(tokens):
        if int(types[i]) != 1 or len(t) < 2 or " " in t:
            continue
        for j in range(1, len(t)):
            a, b = ids.get(t[:j]), ids.get(t[j:])
            if a is not None and b is not None:
                merges.append((-float(scores[i]), i, a, b))
    merges.sort()
    return {**md, "tokenizer.ggml.model": "gemma4", "tokenizer.ggml.pre": "gemma4",
            "tokenizer.ggml.merges": [f"{tokens[a]} {tokens[b]}" for _, _, a, b in merges]}


def write_metadata_only(src: str | Path, dst: str | Path, md: dict) -> str:
    """A GGUF without tensors holding src's metadata with md's values where they differ (for a
    vocabulary-only load); types follow src's keys, new string arrays are written as such."""
    reader = gguf.GGUFReader(str(src))
    arch = str(md["general.architecture"])
    w = gguf.GGUFWriter(str(dst), arch)
    done = {"general.architecture"}
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name in done:
            continue
        done.add(name)
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = md[name] if name in md else field.contents()
        w.add_key_value(name, value.tolist() if isinstance(value, np.ndarray) else value, vtype, sub_type=sub)
    for name, value in md.items():
        if name not in done and not name.startswith("GGUF."):
            if isinstance(value, list):
                w.add_key_value(name, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
            else:
                w.add_key_value(name, value, gguf.GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return str(dst)

WRITERS = {"llama": write_llama, "bert": write_bert, "nomic-bert": write_nomic_bert,
           "nomic-bert-moe": write_nomic_bert_moe, "jina-bert-v2": write_jina_bert_v2,
           "modern-bert": write_modern_bert, "mistral": write_mistral, "qwen2": write_qwen2, "qwen3": write_qwen3,
           "phi3": write_phi3, "gemma": write_gemma, "gemma2": write_gemma2, "gemma3": write_gemma3, "gemma-embedding": write_gemma_embedding, "gemma3n": write_gemma3n, "gemma4": write_gemma4, "granite": write_granite,
           "smollm3": write_smollm3, "olmo2": write_olmo2, "phi2": write_phi2, "starcoder2": write_starcoder2,
           "stablelm": write_stablelm, "command-r": write_command_r, "cohere2": write_cohere2,
           "ernie4_5": write_ernie4_5, "exaone": write_exaone, "exaone4": write_exaone4, "mixtral": write_mixtral,
           "qwen3moe": write_qwen3moe, "olmoe": write_olmoe, "granitemoe": write_granitemoe,
           "granitehybrid": write_granitehybrid, "nemotron_h": write_nemotron_h,
           "nemotron_h_moe": write_nemotron_h_moe, "mamba2": write_mamba2,
           "falcon-h1": write_falcon_h1, "qwen35": write_qwen35, "qwen35moe": write_qwen35moe, "qwen3next": write_qwen3next,
           "qwen2moe": write_qwen2moe, "gpt-oss": write_gpt_oss, "glm4": write_glm4, "nemotron": write_nemotron,
           "arcee": write_arcee, "gptneox": write_gptneox, "falcon": write_falcon,
           "lfm2": write_lfm2, "lfm2moe": write_lfm2moe, "mistral3": write_mistral3, "ernie4_5-moe": write_ernie4_5_moe,
           "gpt2": write_gpt2, "starcoder": write_starcoder, "qwen2vl": write_qwen2vl, "qwen3vl": write_qwen3vl,
           "paddleocr": write_paddleocr,
           "deepseek2": write_deepseek2, "glm4moe": write_glm4moe, "bailingmoe2": write_bailingmoe2,
           "hunyuan-dense": write_hunyuan_dense, "llama4": write_llama4, "smallthinker": write_smallthinker,
           "dots1": write_dots1, "afmoe": write_afmoe, "qwen3vlmoe": write_qwen3vlmoe,
           "hunyuan-moe": write_hunyuan_moe, "seed_oss": write_seed_oss,
           "minimax-m2": write_minimax_m2, "apertus": write_apertus,
           "minicpm": write_minicpm, "llama-embed": write_llama_embed, "olmo": write_olmo, "bailingmoe": write_bailingmoe, "openelm": write_openelm, "mamba": write_mamba, "jamba": write_jamba, "bloom": write_bloom, "mpt": write_mpt, "jais": write_jais,
           "refact": functools.partial(write_llama, arch="refact"), "baichuan": functools.partial(write_llama, arch="baichuan"),
           "chatglm": write_chatglm, "minicpm3": write_minicpm3, "orion": write_orion, "deepseek": write_deepseek,
           "internlm2": functools.partial(write_llama, arch="internlm2"),
           "xverse": functools.partial(write_llama, arch="xverse"), "rwkv6": write_rwkv6,
           "rwkv6qwen2": write_rwkv6qwen2, "rwkv7": write_rwkv7, "arwkv7": write_arwkv7,
           "qwen": write_qwen, "codeshell": write_codeshell, "jais2": write_jais2,
           "maincoder": functools.partial(write_llama, arch="maincoder", qk_norm=True),
           "nanbeige": functools.partial(write_llama, arch="nanbeige"), "plm": write_plm,
           "mistral4": write_mistral4, "exaone-moe": write_exaone_moe,
           "granite_swa": write_granite_swa, "mellum": write_mellum}


def _gguf_string(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def _gguf_value(v) -> tuple[int, bytes]:
    """(GGUF value type, payload) for a Python/numpy value: bool, str, float (f32),
    int (u32, else i64), ("f64"|"i32"|"u32"|"u64", x) to pick a type, numpy array, list of str."""
    if isinstance(v, tuple):
        vtype, fmt = {"f64": (12, "<d"), "i32": (5, "<i"), "u32": (4, "<I"), "u64": (10, "<Q")}[v[0]]
        return vtype, struct.pack(fmt, v[1])
    if isinstance(v, bool):
        return 7, struct.pack("<?", v)
    if isinstance(v, str):
        return 8, _gguf_string(v)
    if isinstance(v, float):
        return 6, struct.pack("<f", v)
    if isinstance(v, int):
        return (4, struct.pack("<I", v)) if 0 <= v < 2**32 else (11, struct.pack("<q", v))
    if isinstance(v, np.ndarray):
        etype = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "uint32": 4, "int32": 5, "float32": 6,
                 "bool": 7, "uint64": 10, "int64": 11, "float64": 12}[v.dtype.name]
        return 9, struct.pack("<IQ", etype, len(v)) + v.astype(v.dtype.newbyteorder("<")).tobytes()
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return 9, struct.pack("<IQ", 8, len(v)) + b"".join(_gguf_string(x) for x in v)
    raise TypeError(f"no GGUF encoding for {type(v).__name__}")


def _gguf_tensor_info(name: str, shape, ttype: int, offset: int) -> bytes:
    return (_gguf_string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
            + struct.pack("<IQ", ttype, offset))


def raw_gguf(path: str | Path, version: int = 3, kv: Optional[list] = None,
             tensors: Optional[list] = None, data: bytes = b"") -> str:
    """A GGUF written byte by byte, for files no writer would make.
    kv: [(key, "str"|"u32", value)]; tensors: [(name, shape, type, offset)]."""
    kv = kv or []
    tensors = tensors or []
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, kind, value in kv:
        vtype, payload = _gguf_value(value if kind == "str" else ("u32", value))
        out += _gguf_string(key) + struct.pack("<I", vtype) + payload
    for name, shape, ttype, offset in tensors:
        out += _gguf_tensor_info(name, shape, ttype, offset)
    out += b"\0" * (-len(out) % 32) + data
    Path(path).write_bytes(out)
    return str(path)


def rewrite_metadata(src: str | Path, dst: str | Path, changes: dict) -> str:
    """A copy of GGUF `src` at `dst` with metadata `changes` applied (value None
    deletes a key); tensor infos and data are kept byte for byte."""
    from pyllm.model_file import ModelFile
    with ModelFile(src) as mf:
        meta = {**mf.metadata, **changes}
        meta = {k: v for k, v in meta.items() if v is not None}
        out = b"GGUF" + struct.pack("<IQQ", 3, len(mf.tensors), len(meta))
        for key, value in meta.items():
            vtype, payload = _gguf_value(value)
            out += _gguf_string(key) + struct.pack("<I", vtype) + payload
        for name, t in mf.tensors.items():
            out += _gguf_tensor_info(name, t.shape, t.type, t.offset - mf.data_offset)
        out += b"\0" * (-len(out) % int(mf.metadata.get("general.alignment", 32)))  # the source's
        with open(src, "rb") as f:
            f.seek(mf.data_offset)
            out += f.read()
    Path(dst).write_bytes(out)
    return str(dst)


LORA_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_lora(path: str | Path, model_path: str | Path, targets: Optional[list[str]] = None, rank: int = 8,
               qtype: QT = QT.F16, alpha: Optional[float] = 16.0, size: float = 1.0, seed: int = 0,
               arch: Optional[str] = None, extra: Optional[dict] = None) -> str:
    """A LoRA adapter in llama.cpp's GGUF layout for the model at model_path: random A
    (r rows of n_in) and B (n_out rows of r) for each target tensor (default: every
    layer's attention and FFN matrices), so that B A x is about `size` times W x's scale
    for unit x. token_embd.weight's pair is stored the other way round (A: a row of r per
    token, B: n_embd rows of r). extra: more tensors (name -> float32 array) as they are."""
    from pyllm.model_file import ModelFile
    rng = np.random.default_rng(seed)
    with ModelFile(model_path) as mf:
        if targets is None:
            targets = [n for n in mf.tensors if n.startswith("blk.") and n.split(".")[2] in LORA_TARGETS]
        shapes = {n: mf.tensor(n).shape for n in targets}
        model_arch = mf.architecture
    w = gguf.GGUFWriter(str(path), arch or model_arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", alpha)

    def add(name: str, rows: int, n_in: int, scale: float) -> None:
        f = (rng.standard_normal((rows, n_in)) * scale).astype(np.float32)
        if qtype == QT.F32:
            w.add_tensor(name, f)
        elif qtype == QT.F16:
            w.add_tensor(name, f.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(f, qtype), raw_dtype=qtype)
    for name, (n_in, n_out) in shapes.items():
        if name == "token_embd.weight":   # (n_embd, n_vocab): A a row of r per token, B n_embd rows of r
            add(name + ".lora_a", n_out, rank, size)
            add(name + ".lora_b", n_in, rank, 1.0 / np.sqrt(rank))
        else:
            add(name + ".lora_a", rank, n_in, 1.0 / np.sqrt(n_in))
            add(name + ".lora_b", n_out, rank, size / np.sqrt(rank))
    for name, value in (extra or {}).items():
        w.add_tensor(name, np.asarray(value, dtype=np.float32))
    return finish(w, path)


def write_control_vector(path: str | Path, n_embd: int, layers, size: float = 1.0, seed: int = 0,
                         model_hint: str = "llama", qtype: QT = QT.F32) -> str:
    """A control vector in llama.cpp's layout (llama-cvector-generator, repeng): a random
    direction.N of n_embd values, of RMS `size`, for each layer N in `layers` (from 1)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "controlvector")
    w.add_string("controlvector.model_hint", model_hint)
    w.add_int32("controlvector.layer_count", len(list(layers)))
    for n in layers:
        v = (rng.standard_normal(n_embd) * size).astype(np.float32)
        w.add_tensor(f"direction.{n}", v if qtype == QT.F32 else v.astype(np.float16), raw_dtype=qtype)
    return finish(w, path)


def finish(w: gguf.GGUFWriter, path: str | Path) -> str:
    """Writes the file out (header, keys, tensors) and closes it; returns its path."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def add_as(w: gguf.GGUFWriter, name: str, a, t: QT = QT.F32) -> None:
    """Tensor `a` (numbers, as float32) written as type t: F32, F16 or a quantized type."""
    a = np.asarray(a, np.float32)
    if t == QT.F16:
        w.add_tensor(name, a.astype(np.float16))
    elif t == QT.F32:
        w.add_tensor(name, a)
    else:
        w.add_tensor(name, gguf.quants.quantize(a, t), raw_dtype=t)


def write_gemma4v(w, rng, n_out: int, n_embd: int, n_head: int, n_ff: int, n_layer: int, image_size: int,
                  patch: int, merge: int, qtype: QT, use_gelu: bool, path: str, n_positions: int,
                  drop_tensor: Optional[str] = None) -> str:
    """Gemma 4's projector (write_mmproj's "gemma4v")."""
    w.add_bool("clip.use_gelu", use_gelu)
    for key, v in (("image_size", image_size), ("patch_size", patch), ("embedding_length", n_embd),
                   ("feed_forward_length", n_ff), ("block_count", n_layer), ("attention.head_count", n_head),
                   ("projection_dim", n_out), ("projector.scale_factor", merge)):
        w.add_uint32(f"clip.vision.{key}", v)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.0, 0.0, 0.0])
    w.add_array("clip.vision.image_std", [1.0, 1.0, 1.0])
    d = n_embd // n_head

    def add(name: str, a, t: QT = QT.F32) -> None:
        if name != drop_tensor:
            add_as(w, name, a, t)

    def mat(name: str, n_in: int, n_o: int, clamp: bool = True) -> None:    # with its clamps
        add(name + ".weight", rng.normal(0, 1.0 / np.sqrt(n_in), (n_o, n_in)), qtype)
        if clamp:
            for suffix, v in ((".input_min", -1.5), (".input_max", 1.5), (".output_min", -1.0), (".output_max", 1.0)):
                add(name + suffix, [v + rng.normal(0, 0.1)])

    add("v.patch_embd.weight", rng.normal(0, 1.0 / patch, (n_embd, 3, patch, patch)), QT.F16)
    add("v.position_embd.weight", rng.normal(0, 0.3, (2, n_positions, n_embd)))
    for i in range(n_layer):
        p = f"v.blk.{i}."
        for norm in ("ln1", "ln2", "attn_post_norm", "ffn_post_norm"):
            add(p + norm + ".weight", 1 + rng.normal(0, 0.1, n_embd))
        add(p + "attn_q_norm.weight", 1 + rng.normal(0, 0.1, d))
        add(p + "attn_k_norm.weight", 1 + rng.normal(0, 0.1, d))
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            mat(p + m, n_embd, n_embd, clamp=m != "attn_v")
        mat(p + "ffn_gate", n_embd, n_ff)
        mat(p + "ffn_up", n_embd, n_ff)
        mat(p + "ffn_down", n_ff, n_embd)
        add(p + "out_scale.weight", [0.9 + 0.1 * i])
    add("v.std_bias", rng.normal(0, 0.1, n_embd))
    add("v.std_scale", 1 + rng.normal(0, 0.1, n_embd))
    mat("mm.input_projection", n_embd, n_out)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_mmproj(path: str | Path, n_out: int = 256, *, n_embd: int = 64, n_head: int = 4, n_ff: int = 96,
                 n_layer: int = 2, image_size: int = 32, patch: int = 4, merge: int = 2, seed: int = 5,
                 qtype: QT = QT.F16, use_gelu: bool = True, pre_ln: bool = False,
                 swapped_ffn: bool = False, projector: str = "gemma3", drop_tensor: Optional[str] = None,
                 longest_edge: int = 0, n_mid: int = 80, input_norm: bool = True, n_wa_pattern: int = 2,
                 deepstack: tuple = (0,), n_positions: int = 2048, class_row: bool = True,
                 identity_last: bool = False, mlp_norm: bool = False, keys: Optional[dict] = None,
                 flat_positions: bool = False) -> str:
    """A tiny Gemma 3 multimodal projector (llama.cpp's mmproj GGUF, architecture "clip"): a
    SigLIP-like encoder of `n_layer` layers over (image_size / patch)^2 patches, pooled
    merge x merge, projected to the language model's n_out. swapped_ffn: the ffn_up/ffn_down
    names of old conversions (fc1 named ffn_down). projector "idefics3": SmolVLM's instead
    (merge x merge patches side by side, one Linear; images scaled to longest_edge and tiled);
    "lfm2": LFM2-VL's (the same shuffle, a layer norm and a two-layer MLP of n_mid; the learned
    positions a grid of image_size / patch a side, resized to each image's); "pixtral":
    Pixtral's (RMS norms, no biases, no learned positions, a gated SiLU FFN; merge x merge
    patches unfolded and merged when merge > 1, an RMS norm and a two-layer MLP, the
    [IMG_BREAK] row; "lightonocr": the same without it); "paddleocr": PaddleOCR-VL's (SigLIP's
    layers, the learned positions a grid of image_size / patch a side, resized to each image's; each
    patch's row layer-normed, 2 x 2 side by side through a two-layer GELU MLP; its sizes from the
    image_min_pixels / image_max_pixels keys); "qwen2vl_merger" / "qwen2.5vl_merger": Qwen 2 / 2.5 VL's (two patch
    kernels, a 2D RoPE; 2.5: RMS norms, a gated SiLU FFN, windows of attention but every
    n_wa_pattern-th layer; 2 x 2 patches side by side through a two-layer GELU MLP);
    "qwen3vl_merger": Qwen 3 VL's (Qwen 2's with a patch bias, learned positions resized to each
    image, a fused qkv, GELU; the `deepstack` layers' rows through their own layernorm and MLP,
    each a slice of n_out more in each row); "gemma4v": Gemma 4's (pixels in [-1, 1], a table
    of column and one of row positions, RMS norms of heads of q, k and v, a 2D RoPE, norms after
    the attention and the FFN, a gated FFN, a layer scale, clamped matrices; merge x merge
    patches pooled, standardized, RMS-normed and projected); "mlp": LLaVA 1.5's (CLIP: a class
    row before the patches when class_row, a pre-norm and no post-norm, quick-GELU unless
    use_gelu; every patch's row through Linear, GELU, Linear; mlp_norm: Yi-VL's Linear, layer
    norm, GELU, Linear, layer norm, named mm.0, mm.1, mm.3, mm.4). identity_last: the last layer
    adds nothing to the residual (its output matrices and biases zero), so an encoder that runs
    one layer fewer (llama.cpp's mtmd for LLaVA) gives the same rows. "internvl": InternVL's
    (InternViT: a class row, layer scales ls1 / ls2 on each branch, GELU, no pre- or post-norm;
    merge x merge patches side by side through a layer norm and a two-layer GELU MLP of n_mid).
    flat_positions: every row of the position table the same (so where the class row goes does
    not matter). keys: more clip.vision.* keys (name: an int, a string or a list of ints); with
    image_grid_pinpoints among them, "mlp" is LLaVA 1.6's and has its newline row."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    for name, v in (keys or {}).items():
        if isinstance(v, list):
            w.add_array("clip.vision." + name, v)
        elif isinstance(v, str):
            w.add_string("clip.vision." + name, v)
        else:
            w.add_uint32("clip.vision." + name, v)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_text_encoder", False)
    w.add_string("clip.projector_type", projector)
    pixtral, qwen, qwen25 = projector in ("pixtral", "lightonocr"), projector.startswith("qwen"), \
        projector == "qwen2.5vl_merger"
    qwen3 = projector == "qwen3vl_merger"
    gemma4 = projector == "gemma4v"
    if gemma4:
        return write_gemma4v(w, rng, n_out, n_embd, n_head, n_ff, n_layer, image_size, patch, merge, qtype,
                             use_gelu, str(path), n_positions, drop_tensor)
    llava, internvl = projector == "mlp", projector == "internvl"
    rms, gated = pixtral or qwen25, pixtral or qwen25    # RMS norms (weights only); a gated SiLU FFN
    w.add_bool("clip.use_gelu", use_gelu and not gated and (qwen3 or not qwen))    # Qwen 2 VL's: quick-GELU
    if gated:
        w.add_bool("clip.use_silu", True)
    if qwen25:
        w.add_uint32("clip.vision.n_wa_pattern", n_wa_pattern)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch)
    w.add_uint32("clip.vision.embedding_length", n_embd)
    w.add_uint32("clip.vision.feed_forward_length", n_ff)
    w.add_uint32("clip.vision.block_count", n_layer)
    w.add_uint32("clip.vision.attention.head_count", n_head)
    w.add_uint32("clip.vision.projection_dim", n_out)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    if pixtral or qwen:
        w.add_uint32("clip.vision.spatial_merge_size", merge)
    elif not llava and (merge != 4 or projector != "gemma3"):
        w.add_uint32("clip.vision.projector.scale_factor", merge)
    if longest_edge:
        w.add_uint32("clip.vision.preproc_image_size", longest_edge)
    w.add_uint32("general.file_type", 1)
    side = image_size // patch

    last = f"v.blk.{n_layer - 1}."
    zeroed = {last + m + k for m in ("attn_out", "ffn_up" if swapped_ffn else "ffn_down")
              for k in (".weight", ".bias")} if identity_last else set()

    def add(name: str, a: np.ndarray, t: QT = QT.F32) -> None:
        if name != drop_tensor:
            add_as(w, name, np.zeros_like(a) if name in zeroed else a, t)

    def mat(n_in: int, n_o: int, scale: float) -> np.ndarray:    # numpy [n_o, n_in] = GGUF (n_in, n_o)
        return rng.normal(0, scale / np.sqrt(n_in), (n_o, n_in))

    def bias(name: str, n: int) -> None:     # Pixtral's have none, RMS norms neither
        if not pixtral and not (rms and name.endswith(("ln1.bias", "ln2.bias", "ln.bias"))):
            add(name, rng.normal(0, 0.1, n))

    add("v.patch_embd.weight", rng.normal(0, 1.0 / patch, (n_embd, 3, patch, patch)), QT.F16)
    if qwen:
        add("v.patch_embd.weight.1", rng.normal(0, 1.0 / patch, (n_embd, 3, patch, patch)), QT.F16)
    if not qwen or qwen3:
        bias("v.patch_embd.bias", n_embd)
    has_class = (llava or internvl) and class_row
    if has_class:
        add("v.class_embd", rng.normal(0, 1.0, n_embd))
    if not pixtral and (not qwen or qwen3):   # F32: llama.cpp adds it as is; the class row's first
        rows = side * side + has_class
        table = np.broadcast_to(rng.normal(0, 0.3, n_embd), (rows, n_embd)) if flat_positions else \
            rng.normal(0, 0.3, (rows, n_embd))
        add("v.position_embd.weight", table)
    if pre_ln or pixtral or llava:
        add("v.pre_ln.weight", 1 + rng.normal(0, 0.1, n_embd))
        bias("v.pre_ln.bias", n_embd)
    for i in range(n_layer):
        p = f"v.blk.{i}."
        for norm in ("ln1", "ln2"):
            add(p + norm + ".weight", 1 + rng.normal(0, 0.1, n_embd))
            bias(p + norm + ".bias", n_embd)
        if qwen3:
            add(p + "attn_qkv.weight", mat(n_embd, 3 * n_embd, 1.0), qtype)
            bias(p + "attn_qkv.bias", 3 * n_embd)
        for m in ("attn_out",) if qwen3 else ("attn_q", "attn_k", "attn_v", "attn_out"):
            add(p + m + ".weight", mat(n_embd, n_embd, 1.0), qtype)
            bias(p + m + ".bias", n_embd)
        up, down = ("ffn_down", "ffn_up") if swapped_ffn else ("ffn_up", "ffn_down")
        if gated:
            add(p + "ffn_gate.weight", mat(n_embd, n_ff, 1.0), qtype)
            bias(p + "ffn_gate.bias", n_ff)
        add(p + up + ".weight", mat(n_embd, n_ff, 1.0), qtype)
        bias(p + up + ".bias", n_ff)
        add(p + down + ".weight", mat(n_ff, n_embd, 1.0), qtype)
        bias(p + down + ".bias", n_embd)
        if internvl:    # layer scales of the attention's and the FFN's outputs
            add(p + "ls1.weight", rng.uniform(0.2, 1.5, n_embd))
            add(p + "ls2.weight", rng.uniform(0.2, 1.5, n_embd))
    if not pixtral and not llava and not internvl:
        add("v.post_ln.weight", 1 + rng.normal(0, 0.1, n_embd))
        bias("v.post_ln.bias", n_embd)
    if projector == "idefics3":   # one Linear (no bias) from merge^2 patches side by side
        add("mm.model.fc.weight", mat(n_embd * merge * merge, n_out, 1.0), QT.F16)
    elif projector == "lfm2":     # layer norm, Linear, GELU, Linear over merge^2 patches side by side
        n_in = n_embd * merge * merge
        if input_norm:
            add("mm.input_norm.weight", 1 + rng.normal(0, 0.1, n_in))
            add("mm.input_norm.bias", rng.normal(0, 0.1, n_in))
        add("mm.1.weight", mat(n_in, n_mid, 1.0), qtype)
        add("mm.1.bias", rng.normal(0, 0.1, n_mid))
        add("mm.2.weight", mat(n_mid, n_out, 1.0), qtype)
        add("mm.2.bias", rng.normal(0, 0.1, n_out))
    elif qwen:                    # 2 x 2 patches side by side: Linear, GELU, Linear
        for i in deepstack if qwen3 else ():    # the same from layer i's rows, after a layernorm
            p = f"v.deepstack.{i}."
            add(p + "norm.weight", 1 + rng.normal(0, 0.1, n_embd * 4))
            add(p + "norm.bias", rng.normal(0, 0.1, n_embd * 4))
            add(p + "fc1.weight", mat(n_embd * 4, n_embd * 4, 1.0), qtype)
            add(p + "fc1.bias", rng.normal(0, 0.1, n_embd * 4))
            add(p + "fc2.weight", mat(n_embd * 4, n_out, 1.0), qtype)
            add(p + "fc2.bias", rng.normal(0, 0.1, n_out))
        add("mm.0.weight", mat(n_embd * 4, n_mid, 1.0), qtype)
        add("mm.0.bias", rng.normal(0, 0.1, n_mid))
        add("mm.2.weight", mat(n_mid, n_out, 1.0), qtype)
        add("mm.2.bias", rng.normal(0, 0.1, n_out))
    elif internvl:                # merge x merge patches side by side: layer norm, Linear, GELU, Linear
        n_in = n_embd * merge * merge
        add("mm.model.mlp.0.weight", 1 + rng.normal(0, 0.1, n_in))
        add("mm.model.mlp.0.bias", rng.normal(0, 0.1, n_in))
        add("mm.model.mlp.1.weight", mat(n_in, n_mid, 1.0), qtype)
        add("mm.model.mlp.1.bias", rng.normal(0, 0.1, n_mid))
        add("mm.model.mlp.3.weight", mat(n_mid, n_out, 1.0), qtype)
        add("mm.model.mlp.3.bias", rng.normal(0, 0.1, n_out))
    elif llava:                   # each patch's row: Linear, GELU, Linear (Yi-VL's: layer norms after each Linear)
        add("mm.0.weight", mat(n_embd, n_mid, 1.0), qtype)
        add("mm.0.bias", rng.normal(0, 0.1, n_mid))
        if mlp_norm:
            add("mm.1.weight", 1 + rng.normal(0, 0.1, n_mid))
            add("mm.1.bias", rng.normal(0, 0.1, n_mid))
        add(f"mm.{3 if mlp_norm else 2}.weight", mat(n_mid, n_out, 1.0), qtype)
        add(f"mm.{3 if mlp_norm else 2}.bias", rng.normal(0, 0.1, n_out))
        if mlp_norm:
            add("mm.4.weight", 1 + rng.normal(0, 0.1, n_out))
            add("mm.4.bias", rng.normal(0, 0.1, n_out))
        if "image_grid_pinpoints" in (keys or {}):     # LLaVA 1.6's newline row, named as its converter names it
            add("model.image_newline", rng.normal(0, 1.0, n_out))
    elif projector == "paddleocr":   # each patch's row layer-normed, 2 x 2 side by side: Linear, GELU, Linear
        add("mm.input_norm.weight", 1 + rng.normal(0, 0.1, n_embd))
        add("mm.input_norm.bias", rng.normal(0, 0.1, n_embd))
        add("mm.1.weight", mat(n_embd * 4, n_mid, 1.0), qtype)
        add("mm.1.bias", rng.normal(0, 0.1, n_mid))
        add("mm.2.weight", mat(n_mid, n_out, 1.0), qtype)
        add("mm.2.bias", rng.normal(0, 0.1, n_out))
    elif pixtral:                 # RMS norm, the unfolded patches merged, Linear, GELU, Linear; the break row
        if merge > 1:             # Mistral Small's; the original Pixtral has neither
            add("mm.input_norm.weight", 1 + rng.normal(0, 0.1, n_embd))
            add("mm.patch_merger.weight", mat(n_embd * merge * merge, n_embd, 1.0), qtype)
        add("mm.1.weight", mat(n_embd, n_mid, 1.0), qtype)
        add("mm.1.bias", rng.normal(0, 0.1, n_mid))
        add("mm.2.weight", mat(n_mid, n_out, 1.0), qtype)
        add("mm.2.bias", rng.normal(0, 0.1, n_out))
        if projector == "pixtral":   # LightOnOCR's has none
            add("v.token_embd.img_break", rng.normal(0, 1.0, n_out))
    else:
        add("mm.soft_emb_norm.weight", 1 + rng.normal(0, 0.1, n_embd))
        add("mm.input_projection.weight", rng.normal(0, 1.0 / np.sqrt(n_embd), (n_embd, n_out)), QT.F16)
    return finish(w, path)


def write_audio_mmproj(path: str | Path, n_out: int = 256, *, projector: str = "qwen2a", n_embd: int = 64,
                       n_head: int = 4, n_ff: int = 128, n_layer: int = 2, n_mel: int = 16, stack: int = 4,
                       n_mid: int = 96, seed: int = 7, qtype: QT = QT.F16, drop_tensor: Optional[str] = None,
                       n_positions: int = 1500, n_conv: int = 24) -> str:
    """A tiny Whisper-encoder audio projector, as llama.cpp's converters write one (mmproj GGUF,
    architecture "clip", clip.has_audio_encoder): two 1D convolutions over n_mel mel bins (F16,
    their biases [1, n_embd]), learned positions, n_layer pre-norm layers (k without bias, exact
    GELU), a post-norm, then the projector: "qwen2a" (Qwen2-Audio: rows pooled 2 by 2, one
    Linear), "ultravox" (`stack` rows side by side, RMS norm, a SwiGLU Linear of 2 n_mid, RMS
    norm, Linear), "voxtral" (`stack` rows side by side, Linear, GELU, Linear, no biases),
    "musicflamingo" (Audio Flamingo 3: rows pooled 2 by 2, Linear, GELU, Linear, biases) or
    "glma" (GLM-ASR: a layer norm, `stack` rows side by side, Linear, GELU, Linear, biases, and
    a begin and an end row, v.boi and v.eoi), "meralion" (`stack` rows side by side, a layer
    norm, Linear + SiLU, a SiLU-gated pair of Linears, Linear, biases) or "qwen3a" (Qwen3-ASR: three 2D convolutions of
    n_conv channels over each 100 frames, a Linear into n_embd; then Linear, GELU, Linear)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_vision_encoder", False)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_bool("clip.has_text_encoder", False)
    w.add_string("clip.projector_type", projector)
    for key, v in (("embedding_length", n_embd), ("feed_forward_length", n_ff), ("block_count", n_layer),
                   ("attention.head_count", n_head), ("num_mel_bins", n_mel), ("projection_dim", n_out)):
        w.add_uint32("clip.audio." + key, v)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    if projector not in ("qwen2a", "musicflamingo", "qwen3a"):
        w.add_uint32("clip.audio.projector.stack_factor", stack)
    w.add_uint32("general.file_type", 1)

    def add(name: str, a: np.ndarray, t: QT = QT.F32) -> None:
        if name != drop_tensor:
            add_as(w, name, a, t)

    def mat(n_in: int, n_o: int, scale: float = 1.0) -> np.ndarray:    # numpy [n_o, n_in] = GGUF (n_in, n_o)
        return rng.normal(0, scale / np.sqrt(n_in), (n_o, n_in))

    if projector == "qwen3a":
        for i, c_in in ((1, 1), (2, n_conv), (3, n_conv)):
            add(f"a.conv2d.{i}.weight", rng.normal(0, 1 / np.sqrt(9 * c_in), (n_conv, c_in, 3, 3)), QT.F16)
            add(f"a.conv2d.{i}.bias", rng.normal(0, 0.1, (n_conv, 1, 1)))
        height = (((n_mel - 1) // 2) // 2) // 2 + 1
        add("a.conv_out.weight", mat(n_conv * height, n_embd), qtype)
    else:
        add("a.conv1d.1.weight", rng.normal(0, 1 / np.sqrt(3 * n_mel), (n_embd, n_mel, 3)), QT.F16)
        add("a.conv1d.1.bias", rng.normal(0, 0.1, (n_embd, 1)))
        add("a.conv1d.2.weight", rng.normal(0, 1 / np.sqrt(3 * n_embd), (n_embd, n_embd, 3)), QT.F16)
        add("a.conv1d.2.bias", rng.normal(0, 0.1, (n_embd, 1)))
    add("a.position_embd.weight", rng.normal(0, 0.5, (n_positions, n_embd)))
    for i in range(n_layer):
        p = f"a.blk.{i}."
        for ln in ("ln1", "ln2"):
            add(p + ln + ".weight", 1 + rng.normal(0, 0.1, n_embd))
            add(p + ln + ".bias", rng.normal(0, 0.1, n_embd))
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            add(p + m + ".weight", mat(n_embd, n_embd), qtype)
            if m != "attn_k":      # Whisper's k has no bias
                add(p + m + ".bias", rng.normal(0, 0.1, n_embd))
        add(p + "ffn_up.weight", mat(n_embd, n_ff), qtype)
        add(p + "ffn_up.bias", rng.normal(0, 0.1, n_ff))
        add(p + "ffn_down.weight", mat(n_ff, n_embd), qtype)
        add(p + "ffn_down.bias", rng.normal(0, 0.1, n_embd))
    add("a.post_ln.weight", 1 + rng.normal(0, 0.1, n_embd))
    add("a.post_ln.bias", rng.normal(0, 0.1, n_embd))
    if projector == "qwen2a":
        add("mm.a.fc.weight", mat(n_embd, n_out), qtype)
        add("mm.a.fc.bias", rng.normal(0, 0.1, n_out))
    elif projector == "meralion":
        add("mm.a.norm_pre.weight", 1 + rng.normal(0, 0.1, n_embd * stack))
        add("mm.a.norm_pre.bias", rng.normal(0, 0.1, n_embd * stack))
        for i, (a, b) in enumerate(((n_embd * stack, n_mid), (n_mid, n_mid), (n_mid, n_mid), (n_mid, n_out))):
            add(f"mm.a.mlp.{i}.weight", mat(a, b), qtype)
            add(f"mm.a.mlp.{i}.bias", rng.normal(0, 0.1, b))
    elif projector == "ultravox":
        add("mm.a.norm_pre.weight", 1 + rng.normal(0, 0.1, n_embd * stack))
        add("mm.a.mlp.1.weight", mat(n_embd * stack, 2 * n_mid), qtype)
        add("mm.a.norm_mid.weight", 1 + rng.normal(0, 0.1, n_mid))
        add("mm.a.mlp.2.weight", mat(n_mid, n_out), qtype)
    else:
        n_in = n_embd * (1 if projector in ("musicflamingo", "qwen3a") else stack)
        if projector == "glma":
            add("mm.a.norm_pre.weight", 1 + rng.normal(0, 0.1, n_embd))
            add("mm.a.norm_pre.bias", rng.normal(0, 0.1, n_embd))
            add("v.boi", rng.normal(0, 1.0, n_out))
            add("v.eoi", rng.normal(0, 1.0, n_out))
        add("mm.a.mlp.1.weight", mat(n_in, n_mid), qtype)
        add("mm.a.mlp.2.weight", mat(n_mid, n_out), qtype)
        if projector != "voxtral":
            add("mm.a.mlp.1.bias", rng.normal(0, 0.1, n_mid))
            add("mm.a.mlp.2.bias", rng.normal(0, 0.1, n_out))
    return finish(w, path)


def write_gemma4_audio_mmproj(path: str | Path, n_out: int = 256, *, n_embd: int = 64, n_head: int = 4,
                              n_layer: int = 2, n_mel: int = 32, channels: tuple = (16, 8), n_proj: int = 96,
                              taps: int = 5, seed: int = 11, qtype: QT = QT.F16, clamp: float = 2.5,
                              drop_tensor: Optional[str] = None, vision: bool = False) -> str:
    """A tiny Gemma 4 audio conformer (projector "gemma4a"), as llama.cpp's converter writes one:
    two 3 x 3 convolutions with channel norms (F32), the input Linear, n_layer conformer blocks
    (half-step FFNs 4 n_embd wide, chunked attention with relative keys and softplus'd per-dim
    scales, the light convolution of `taps` taps, RMS norms), the output Linear with a bias, and
    the embedder's projection into n_out. Every clippable matrix's input and output clipped to
    +-clamp (scalars beside its weight), so the clips act on the random weights."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_vision_encoder", vision)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_string("clip.audio.projector_type", "gemma4a")
    for key, v in (("embedding_length", n_embd), ("feed_forward_length", 4 * n_embd), ("block_count", n_layer),
                   ("attention.head_count", n_head), ("num_mel_bins", n_mel), ("projection_dim", n_out)):
        w.add_uint32("clip.audio." + key, v)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 0.01)     # what the converter wrote; never read
    w.add_uint32("general.file_type", 1)

    def add(name: str, a: np.ndarray, t: QT = QT.F32) -> None:
        if name != drop_tensor:
            add_as(w, name, a, t)

    def mat(name: str, n_in: int, n_o: int, clipped: bool = True) -> None:   # numpy [n_o, n_in] = GGUF (n_in, n_o)
        add(name + ".weight", rng.normal(0, 1 / np.sqrt(n_in), (n_o, n_in)), qtype)
        if clipped:
            for end, v in (("input_min", -clamp), ("input_max", clamp), ("output_min", -clamp), ("output_max", clamp)):
                add(f"{name}.{end}", np.array([v]))

    def norm(name: str, n: int) -> None:
        add(name + ".weight", 1 + rng.normal(0, 0.2, n))

    c0, c1 = channels
    add("a.conv1d.0.weight", rng.normal(0, 1 / 3, (c0, 1, 3, 3)))
    norm("a.conv1d.0.norm", c0)
    add("a.conv1d.1.weight", rng.normal(0, 1 / np.sqrt(9 * c0), (c1, c0, 3, 3)))
    norm("a.conv1d.1.norm", c1)
    freq = ((n_mel - 1) // 2) // 2 + 1
    mat("a.input_projection", freq * c1, n_embd, clipped=False)
    d = n_embd // n_head
    for i in range(n_layer):
        p = f"a.blk.{i}."
        for ffn in ("", "_1"):
            norm(p + "ffn_norm" + ffn, n_embd)
            mat(p + "ffn_up" + ffn, n_embd, 4 * n_embd)
            mat(p + "ffn_down" + ffn, 4 * n_embd, n_embd)
            norm(p + "ffn_post_norm" + ffn, n_embd)
        norm(p + "attn_pre_norm", n_embd)
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            mat(p + m, n_embd, n_embd)
        mat(p + "attn_k_rel", n_embd, n_embd, clipped=False)
        add(p + "per_dim_scale.weight", np.log1p(np.exp(rng.normal(0, 1, d))))     # softplus, as converted
        norm(p + "attn_post_norm", n_embd)
        norm(p + "conv_norm", n_embd)            # the light convolution's norm before its first matrix ...
        mat(p + "conv_pw1", n_embd, 2 * n_embd)
        add(p + "conv_dw.weight", rng.normal(0, 1 / np.sqrt(taps), (n_embd, taps)))
        norm(p + "norm_conv", n_embd)            # ... and after the depthwise taps (llama.cpp's names, swapped)
        mat(p + "conv_pw2", n_embd, n_embd)
        norm(p + "ln2", n_embd)
    add("a.pre_encode.out.weight", rng.normal(0, 1 / np.sqrt(n_embd), (n_proj, n_embd)), qtype)
    add("a.pre_encode.out.bias", rng.normal(0, 0.1, n_proj))
    add("mm.a.input_projection.weight", rng.normal(0, 1 / np.sqrt(n_proj), (n_out, n_proj)), qtype)
    return finish(w, path)


def write_gemma4_unified_mmproj(path: str | Path, n_out: int = 256, *, patch: int = 4, merge: int = 3,
                                n_embd: int = 96, n_positions: int = 40, frame: int = 640, seed: int = 13,
                                qtype: QT = QT.F16, vision: bool = True, audio: bool = True,
                                drop_tensor: Optional[str] = None) -> str:
    """A tiny Gemma 4 Unified projector ("gemma4uv" and "gemma4ua"), as llama.cpp's converter
    writes one: patches of patch x merge pixels through LN1, a dense layer with a bias and LN2,
    a table of column and one of row positions, LN3 and the projection (the first two's inputs
    put from transformers' order, a pixel's R G B together, into one channel's values after
    another's, as the converter puts them); sounds in frames of `frame` samples through the
    audio projection alone. The layer norms' weights and biases random, so their order shows."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_vision_encoder", vision)
    w.add_bool("clip.has_audio_encoder", audio)
    w.add_uint32("general.file_type", 1)

    def add(name: str, a: np.ndarray, t: QT = QT.F32) -> None:
        if name != drop_tensor:
            add_as(w, name, a, t)
    if vision:
        w.add_string("clip.vision.projector_type", "gemma4uv")
        for key, v in (("image_size", 224), ("patch_size", patch), ("embedding_length", n_embd),
                       ("feed_forward_length", 0), ("block_count", 0), ("attention.head_count", 0),
                       ("projection_dim", n_out)):
            w.add_uint32("clip.vision." + key, v)
        w.add_array("clip.vision.image_mean", [0.0] * 3)
        w.add_array("clip.vision.image_std", [1.0] * 3)
        w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
        P = patch * merge
        n_in = 3 * P * P
        ch, rest = np.divmod(np.arange(n_in), P * P)       # the file's value i: channel ch, pixel (row, col)
        row, col = np.divmod(rest, P)
        from_hf = row * P * 3 + col * 3 + ch                # transformers' index of that value
        ln1_w, ln1_b = 1 + rng.normal(0, 0.3, n_in), rng.normal(0, 0.3, n_in)
        dense = rng.normal(0, 1 / np.sqrt(n_in), (n_embd, n_in))
        add("v.patch_norm.1.weight", ln1_w[from_hf])
        add("v.patch_norm.1.bias", ln1_b[from_hf])
        add("v.patch_embd.weight", dense[:, from_hf], qtype)
        add("v.patch_embd.bias", rng.normal(0, 0.3, n_embd))
        for i in (2, 3):
            add(f"v.patch_norm.{i}.weight", 1 + rng.normal(0, 0.3, n_embd))
            add(f"v.patch_norm.{i}.bias", rng.normal(0, 0.3, n_embd))
        add("v.position_embd.weight", rng.normal(0, 1, (2, n_positions, n_embd)))   # columns', then rows'
        add("mm.input_projection.weight", rng.normal(0, 1 / np.sqrt(n_embd), (n_out, n_embd)), qtype)
    if audio:
        w.add_string("clip.audio.projector_type", "gemma4ua")
        for key, v in (("embedding_length", frame), ("feed_forward_length", 0), ("block_count", 0),
                       ("attention.head_count", 0), ("num_mel_bins", 128), ("projection_dim", n_out)):
            w.add_uint32("clip.audio." + key, v)
        w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-6)
        add("mm.a.input_projection.weight", rng.normal(0, 1 / np.sqrt(frame), (n_out, frame)), qtype)
    return finish(w, path)


def write_granite_speech_mmproj(path: str | Path, n_out: int = 256, *, n_embd: int = 64, n_head: int = 4,
                                n_layer: int = 4, n_mel: int = 32, context: int = 20, max_pos: int = 32,
                                taps: int = 15, n_ctc: int = 42, n_query_layers: int = 2, proj_heads: int = 4,
                                window: int = 15, rate: int = 5, feature_layers: tuple = (), seed: int = 13,
                                n_query_ff: int = 0,
                                qtype: QT = QT.F16, drop_tensor: Optional[str] = None,
                                folded_name: str = "conv_norm") -> str:
    """A tiny Granite Speech encoder and Q-Former (projector "granite_speech"), as llama.cpp's
    converter writes one: the input Linear over n_mel features (two frames' bins), n_layer
    conformer blocks (layer norms, half-step FFNs 4 n_embd wide, block attention of `context`
    rows with a Shaw table of 2 max_pos + 1 distances, a centred depthwise convolution of `taps`
    over 2 n_embd channels, the batch norm folded into `folded_name` weight and bias), the CTC
    head fed back after the middle block, and a Q-Former of n_query_layers reading windows of
    `window` rows with window / rate queries (its FFN n_query_ff wide, else 2 n_embd).
    feature_layers: Granite Speech 4.1 plus's layers whose rows go beside the last's."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_vision_encoder", False)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_string("clip.projector_type", "granite_speech")
    for key, v in (("embedding_length", n_embd), ("feed_forward_length", 4 * n_embd), ("block_count", n_layer),
                   ("attention.head_count", n_head), ("num_mel_bins", n_mel), ("projection_dim", n_out),
                   ("chunk_size", context), ("conv_kernel_size", taps), ("max_pos_emb", max_pos),
                   ("projector.window_size", window), ("projector.downsample_rate", rate),
                   ("projector.head_count", proj_heads)):
        w.add_uint32("clip.audio." + key, v)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    if feature_layers:
        w.add_array("clip.audio.feature_layer", list(feature_layers))
    w.add_uint32("general.file_type", 1)

    add, mat, norm = _conformer_writers(w, rng, qtype, drop_tensor)

    n, inner = n_embd, 2 * n_embd
    mat("a.input_projection", n_mel, n)
    for i in range(n_layer):
        p = f"a.blk.{i}."
        for ffn in ("", "_1"):
            norm(p + "ffn_norm" + ffn, n)
            mat(p + "ffn_up" + ffn, n, 4 * n)
            mat(p + "ffn_down" + ffn, 4 * n, n)
        norm(p + "ln1", n)
        for m in ("attn_q", "attn_k", "attn_v"):
            mat(p + m, n, n, bias=False)
        mat(p + "attn_out", n, n)
        add(p + "attn_rel_pos_emb", rng.normal(0, 0.5, (2 * max_pos + 1, n // n_head)))
        norm(p + "norm_conv", n)                 # the convolution module's norm before its first matrix
        mat(p + "conv_pw1", n, 2 * inner)
        add(p + "conv_dw.weight", rng.normal(0, 1 / np.sqrt(taps), (inner, taps)))
        add(f"{p}{folded_name}.weight", rng.uniform(0.5, 1.5, inner))      # the batch norm, folded
        add(f"{p}{folded_name}.bias", rng.normal(0, 0.1, inner))
        mat(p + "conv_pw2", inner, n)
        norm(p + "ln2", n)
    mat("a.enc_ctc_out", n, n_ctc)
    mat("a.enc_ctc_out_mid", n_ctc, n)
    n_enc = n * (len(feature_layers) + 1)
    add("a.proj_query", rng.normal(0, 1, (1, window // rate, n)))
    norm("a.proj_norm", n)
    for i in range(n_query_layers):
        p = f"a.proj_blk.{i}."
        for m in ("q", "k", "v", "out"):
            mat(p + "self_attn_" + m, n, n)
        norm(p + "self_attn_norm", n)
        mat(p + "cross_attn_q", n, n)
        mat(p + "cross_attn_k", n_enc, n)
        mat(p + "cross_attn_v", n_enc, n)
        mat(p + "cross_attn_out", n, n)
        norm(p + "cross_attn_norm", n)
        mat(p + "ffn_up", n, n_query_ff or 2 * n)
        mat(p + "ffn_down", n_query_ff or 2 * n, n)
        norm(p + "ffn_norm", n)
    mat("a.proj_linear", n, n_out)
    return finish(w, path)


def write_lfm2_audio_mmproj(path: str | Path, n_out: int = 256, *, n_embd: int = 64, n_head: int = 4,
                            n_layer: int = 2, n_mel: int = 32, channels: int = 16, n_ff: int = 128, taps: int = 9,
                            n_mid: int = 96, seed: int = 17, qtype: QT = QT.F16,
                            drop_tensor: Optional[str] = None) -> str:
    """A tiny LFM2-Audio encoder (projector "lfm2a", a NeMo FastConformer), as llama.cpp's
    converter writes one: the sub-sampling (a 3 x 3 convolution of `channels`, then twice a
    depthwise 3 x 3 and a pointwise one; F32, biases [1, 1, c]) and its output Linear, n_layer
    blocks (layer norms, half-step FFNs n_ff wide, relative attention with linear_pos and the
    u / v biases, a depthwise convolution of `taps` with its batch norm folded into conv_norm),
    and the adapter (layer norm, Linear, GELU, Linear)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_vision_encoder", False)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_string("clip.projector_type", "lfm2a")
    for key, v in (("embedding_length", n_embd), ("feed_forward_length", n_embd), ("block_count", n_layer),
                   ("attention.head_count", n_head), ("num_mel_bins", n_mel), ("projection_dim", n_out)):
        w.add_uint32("clip.audio." + key, v)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    w.add_uint32("general.file_type", 1)

    add, mat, norm = _conformer_writers(w, rng, qtype, drop_tensor)

    c = channels
    for i, shape in ((0, (c, 1, 3, 3)), (2, (c, 1, 3, 3)), (3, (c, c, 1, 1)), (5, (c, 1, 3, 3)), (6, (c, c, 1, 1))):
        add(f"a.conv1d.{i}.weight", rng.normal(0, 1 / np.sqrt(np.prod(shape[1:])), shape))
        add(f"a.conv1d.{i}.bias", rng.normal(0, 0.1, (c, 1, 1)))
    freq = ((((n_mel + 1) // 2 + 1) // 2) + 1) // 2
    mat("a.pre_encode.out", c * freq, n_embd)
    d = n_embd // n_head
    for i in range(n_layer):
        p = f"a.blk.{i}."
        for ffn in ("", "_1"):
            norm(p + "ffn_norm" + ffn, n_embd)
            mat(p + "ffn_up" + ffn, n_embd, n_ff)
            mat(p + "ffn_down" + ffn, n_ff, n_embd)
        norm(p + "ln1", n_embd)
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            mat(p + m, n_embd, n_embd)
        mat(p + "linear_pos", n_embd, n_embd, bias=False)
        add(p + "pos_bias_u", rng.normal(0, 0.3, (n_head, d)))
        add(p + "pos_bias_v", rng.normal(0, 0.3, (n_head, d)))
        norm(p + "norm_conv", n_embd)            # the convolution module's norm before its first matrix
        mat(p + "conv_pw1", n_embd, 2 * n_embd)
        add(p + "conv_dw.weight", rng.normal(0, 1 / np.sqrt(taps), (n_embd, taps)))
        add(p + "conv_dw.bias", rng.normal(0, 0.1, n_embd))
        add(p + "conv_norm.weight", rng.uniform(0.5, 1.5, n_embd))   # the batch norm, folded
        add(p + "conv_norm.bias", rng.normal(0, 0.1, n_embd))
        mat(p + "conv_pw2", n_embd, n_embd)
        norm(p + "ln2", n_embd)
    norm("mm.a.mlp.0", n_embd)
    mat("mm.a.mlp.1", n_embd, n_mid)
    mat("mm.a.mlp.3", n_mid, n_out)
    # the audio output's code embeddings land here (mtmd checks it has a row per two frames)
    add("a.position_embd.weight", np.zeros((8192, n_out)))    # mtmd reads the rows' width from it too
    return finish(w, path)


def _conformer_writers(w: gguf.GGUFWriter, rng, qtype: QT, drop_tensor: Optional[str]):
    """(add, mat, norm) for a projector writer: a tensor (unless it is drop_tensor), a random
    Linear [n_in -> n_o] of qtype with its bias, a layer norm's weight and bias."""
    def add(name: str, a: np.ndarray, t: QT = QT.F32) -> None:
        if name != drop_tensor:
            add_as(w, name, a, t)

    def mat(name: str, n_in: int, n_o: int, bias: bool = True) -> None:
        add(name + ".weight", rng.normal(0, 1 / np.sqrt(n_in), (n_o, n_in)), qtype)
        if bias:
            add(name + ".bias", rng.normal(0, 0.1, n_o))

    def norm(name: str, n: int) -> None:
        add(name + ".weight", 1 + rng.normal(0, 0.2, n))
        add(name + ".bias", rng.normal(0, 0.1, n))
    return add, mat, norm
