"""Hugging Face checkpoints to GGUF, for models that PyPI carries only as safetensors.

One family so far: BERT sentence encoders in sentence-transformers' layout
(config.json, vocab.txt, model.safetensors, modules.json with a Pooling
module: all-MiniLM-L6-v2, bge-small-en, ...). The file is written as
llama.cpp's convert_hf_to_gguf.py writes it, so that either engine reads
what the other's converter made:

- tensors renamed to llama.cpp's names (embeddings.word_embeddings ->
  token_embd, encoder.layer.N.attention.self.query -> blk.N.attn_q, ...),
  the pooler dropped; matrices in F16, vectors, position and token-type
  embeddings in F32;
- the WordPiece vocabulary respelled: a word-start token gains U+2581, a
  continuation loses its '##', special tokens stay as they are;
- the special tokens, lower-casing, and the pooling of the Pooling module
  (mean or CLS) as metadata.

    pyllm.convert.convert_bert(Path("model_dir"), Path("model.gguf"))
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelFileError, UnsupportedModelError

# safetensors dtypes we read, as numpy types (BF16 is widened by hand)
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64, "I64": np.int64,
           "I32": np.int32}
_MAX_HEADER = 100 << 20

POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3}   # llama.cpp's {arch}.pooling_type values
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3                        # gguf's token types


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file as read-only arrays over a memory map
    (BF16 widened to float32), every offset checked against the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelFileError(f"{path}: too short to be a safetensors file")
        n = struct.unpack("<Q", head)[0]
        if not 2 <= n <= min(_MAX_HEADER, size - 8):
            raise ModelFileError(f"{path}: its header length {n} does not fit the file; it is corrupt")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelFileError(f"{path}: its header is not JSON ({e}); the file is corrupt") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: its header is not a JSON object; the file is corrupt")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"{path}: tensor {name!r} has a malformed entry; the file is corrupt") from None
        if dtype not in _DTYPES:
            raise UnsupportedModelError(f"{path}: tensor {name!r} is {dtype}; pyllm converts "
                                        f"{', '.join(_DTYPES)} tensors")
        itemsize = np.dtype(_DTYPES[dtype]).itemsize
        if (not all(isinstance(v, int) for v in (begin, end)) or min(shape, default=1) < 0
                or not 0 <= begin <= end <= len(data) or end - begin != math.prod(shape) * itemsize):
            raise ModelFileError(f"{path}: tensor {name!r} lies outside the file or has the wrong size; "
                                 f"the file is corrupt or truncated")
        a = data[begin:end].view(_DTYPES[dtype]).reshape(shape)
        if dtype == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a
    return out


def _json(path: Path, required: bool = True) -> dict:
    if not path.is_file():
        if required:
            raise ModelFileError(f"{path.parent}: no {path.name}; not a Hugging Face model folder")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ModelFileError(f"{path}: not a JSON object")
    return value


def _pooling(src: Path) -> str | None:
    """'mean' or 'cls' from sentence-transformers' Pooling module, None without one."""
    modules = json.loads((src / "modules.json").read_text()) if (src / "modules.json").is_file() else []
    for m in modules if isinstance(modules, list) else []:
        if isinstance(m, dict) and str(m.get("type", "")).endswith("models.Pooling"):
            cfg = _json(src / str(m.get("path", "")) / "config.json")
            if cfg.get("pooling_mode_mean_tokens"):
                return "mean"
            if cfg.get("pooling_mode_cls_token"):
                return "cls"
            raise UnsupportedModelError(f"{src}: pooling {cfg} is not supported; pyllm runs mean and CLS pooling")
    return None


def _bert_vocab(src: Path) -> tuple[list[str], list[int], dict[str, int], dict[str, Any]]:
    """(tokens respelled, token types, special ids by GGUF slot, normalizer flags)"""
    path = src / "vocab.txt"
    if not path.is_file():
        raise ModelFileError(f"{src}: no vocab.txt; pyllm converts WordPiece (BERT) vocabularies")
    words = path.read_text(encoding="utf-8").split("\n")
    if words and words[-1] == "":
        words.pop()
    words = [w.rstrip("\r") for w in words]
    specials = _json(src / "special_tokens_map.json", required=False)
    config = _json(src / "tokenizer_config.json", required=False)
    ids = {w: i for i, w in enumerate(words)}
    slots = {}
    for key, slot in (("cls_token", "bos"), ("sep_token", "eos"), ("unk_token", "unknown"),
                      ("sep_token", "seperator"), ("pad_token", "padding"), ("mask_token", "mask")):
        tok = specials.get(key, config.get(key))
        tok = tok.get("content") if isinstance(tok, dict) else tok
        if tok is not None and tok in ids:
            slots[slot] = ids[tok]
    control = {words[i] for i in slots.values()}
    types = [TOKEN_CONTROL if w in control else TOKEN_NORMAL for w in words]
    tokens = [w if w in control else w[2:] if w.startswith("##") else "\u2581" + w for w in words]
    normalizer = {"lowercase": bool(config.get("do_lower_case", True))}
    if config.get("strip_accents") is not None:
        normalizer["strip_accents"] = bool(config["strip_accents"])
    return tokens, types, slots, normalizer


def _bert_tensor_name(name: str) -> str | None:
    """llama.cpp's name of a BertModel tensor; None for what it drops."""
    name = name.removeprefix("bert.")
    if name in ("embeddings.position_ids",) or name.startswith(("pooler.", "cls.")):
        return None
    fixed = {"embeddings.word_embeddings.weight": "token_embd.weight",
             "embeddings.position_embeddings.weight": "position_embd.weight",
             "embeddings.token_type_embeddings.weight": "token_types.weight",
             "embeddings.LayerNorm.weight": "token_embd_norm.weight",
             "embeddings.LayerNorm.bias": "token_embd_norm.bias"}
    if name in fixed:
        return fixed[name]
    parts = name.split(".")
    if len(parts) < 5 or parts[:2] != ["encoder", "layer"] or not parts[2].isdigit():
        raise UnsupportedModelError(f"tensor {name!r} is not part of a BERT encoder pyllm knows")
    layer, rest = parts[2], ".".join(parts[3:])
    per_layer = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
                 "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
                 "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
    module, _, kind = rest.rpartition(".")
    if module not in per_layer or kind not in ("weight", "bias"):
        raise UnsupportedModelError(f"tensor {name!r} is not part of a BERT encoder pyllm knows")
    return f"blk.{layer}.{per_layer[module]}.{kind}"


def convert_bert(src: Path, out: Path) -> None:
    """Writes the BERT encoder in folder `src` (config.json, vocab.txt,
    model.safetensors) as a GGUF file at `out`."""
    import gguf   # the writer; only conversion needs it

    src = Path(src)
    cfg = _json(src / "config.json")
    if cfg.get("model_type") != "bert" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise UnsupportedModelError(f"{src}: model_type {cfg.get('model_type')!r} (positions "
                                    f"{cfg.get('position_embedding_type')!r}); pyllm converts BERT with absolute "
                                    f"positions")
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise UnsupportedModelError(f"{src}: activation {cfg.get('hidden_act')!r}; pyllm converts BERT with GELU")
    try:
        n_embd, n_layer = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        n_head, n_ff = int(cfg["num_attention_heads"]), int(cfg["intermediate_size"])
        n_ctx, eps = int(cfg["max_position_embeddings"]), float(cfg.get("layer_norm_eps", 1e-12))
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{src}/config.json: missing or bad {e}") from None
    weights = src / "model.safetensors"
    if not weights.is_file():
        raise ModelFileError(f"{src}: no model.safetensors (pyllm converts safetensors checkpoints)")
    tensors = read_safetensors(weights)
    tokens, types, slots, normalizer = _bert_vocab(src)
    pooling = _pooling(src)

    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name(str(cfg.get("_name_or_path") or src.name))
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_causal_attention(False)
    if pooling is not None:
        w.add_pooling_type(gguf.PoolingType(POOLING[pooling]))
    w.add_token_type_count(int(cfg.get("type_vocab_size", 1)))
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    for slot, tid in slots.items():
        w.add_uint32(f"tokenizer.ggml.{slot}_token_id", tid)
    w.add_add_bos_token(True)    # [CLS] text [SEP], as llama.cpp's converter says
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", normalizer["lowercase"])
    if "strip_accents" in normalizer:
        w.add_bool("tokenizer.ggml.normalizer.strip_accents", normalizer["strip_accents"])
    for name, a in tensors.items():
        new = _bert_tensor_name(name)
        if new is None:
            continue
        keep_f32 = a.ndim <= 1 or new in ("position_embd.weight", "token_types.weight")
        w.add_tensor(new, np.ascontiguousarray(a, dtype=np.float32 if keep_f32 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
