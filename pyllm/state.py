"""A conversation's KV cache on disk: llama-cli's --prompt-cache, llama-server's slot
save/restore, llama-cpp-python's save_state/load_state.

What is saved: the tokens a sequence holds and, for each layer's cache, the blocks
holding them, as the cache stores them (f16, or the quantized format -ctk/-ctv
chose), in a .npz file (numpy's zip of arrays, no pickles) with a header saying
what made them. Restoring checks the header against the model loaded (the same
file, cache formats and block size), puts the blocks into freshly allocated ones
and records the tokens, so that a prompt starting with them continues from there
without computing them again.

The CPU backend only (the KV cache in host memory); not for models with a
recurrent state (it is not kept per position).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import numpy as np

from .errors import InvalidArgumentError, ModelFileError, UnsupportedModelError

FORMAT = "pyllm-kv-state"
VERSION = 1


def identity(model) -> dict:
    """What a saved state must match to be loaded into `model`."""
    return {"format": FORMAT, "version": VERSION, "model": Path(model.path).name,
            "model_bytes": model.file.file_size, "architecture": model.arch.name,
            "kv_types": list(model.kv_types), "block_size": model.engine.pool.block_size,
            "lora": [[Path(a.path).name, a.scale] for a in model.adapters]}


def _caches(model):
    backend = model.backend
    if model.engine.pool.recurrent:
        raise UnsupportedModelError(f"{model.arch.name} keeps a recurrent state, which is not saved per position: "
                                    f"its conversation cannot be saved")
    if not hasattr(backend, "k_cache"):
        raise UnsupportedModelError("saving the KV cache works with the model on the CPU (its cache in host "
                                    "memory), not split onto a device")
    return backend.k_cache, backend.v_cache


def save(model, seq, path: str | os.PathLike, n_tokens: Optional[int] = None) -> int:
    """Writes seq's first n_tokens (default: all it holds) and their KV blocks to path;
    returns the bytes written."""
    k_cache, v_cache = _caches(model)
    n = len(seq.tokens) if n_tokens is None else max(0, min(int(n_tokens), len(seq.tokens)))
    if any(t < 0 for t in seq.tokens[:n]):   # an image's rows live in this process's image store only
        raise InvalidArgumentError("a prompt with images cannot be saved as a state (its image rows are not "
                                   "tokens a later run could check)")
    B = model.engine.pool.block_size
    blocks = np.asarray(seq.blocks[:(n + B - 1) // B], dtype=np.int64)
    arrays = {"header": np.array(json.dumps(identity(model))), "tokens": np.asarray(seq.tokens[:n], dtype=np.int32)}
    for layer in k_cache:
        arrays[f"k{layer}"] = k_cache[layer][blocks]
        arrays[f"v{layer}"] = v_cache[layer][blocks] if v_cache[layer].size else v_cache[layer]
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def load(model, seq, path: str | os.PathLike) -> int:
    """Makes seq hold the tokens saved at path, their KV blocks restored; returns how many."""
    k_cache, v_cache = _caches(model)
    if not Path(path).is_file():
        raise InvalidArgumentError(f"no saved state at {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path} is not a saved pyllm state ({e})") from None
    with data:
        try:
            header = json.loads(str(data["header"]))
            tokens = data["tokens"]
        except (OSError, ValueError, KeyError) as e:
            raise ModelFileError(f"{path} is not a saved pyllm state ({e})") from None
        want = identity(model)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ModelFileError(f"{path} is not a saved pyllm state")
        different = [k for k in want if header.get(k) != want[k]]
        if different:
            raise InvalidArgumentError(f"{path} was saved with another setup ({', '.join(different)} differ: "
                                       f"{', '.join(f'{header.get(k)} vs {want[k]}' for k in different)}); load "
                                       f"it with the model and settings it was saved with")
        n = len(tokens)
        if tokens.ndim != 1 or not ((tokens >= 0) & (tokens < model.n_vocab)).all():
            raise ModelFileError(f"{path}: its tokens are not this model's")
        B = want["block_size"]
        blocks = {}
        for layer in k_cache:
            for name, cache in ((f"k{layer}", k_cache[layer]), (f"v{layer}", v_cache[layer])):
                a = data[name] if name in data else None
                shape = ((n + B - 1) // B, *cache.shape[1:]) if cache.size else cache.shape
                if a is None or a.dtype != cache.dtype or a.shape != shape:
                    raise ModelFileError(f"{path}: the cache of layer {layer} is missing or not the model's shape")
                blocks[name] = a
    seq.release()
    seq.reserve(n)
    table = np.asarray(seq.blocks, dtype=np.int64)
    for layer in k_cache:
        k_cache[layer][table] = blocks[f"k{layer}"]
        if v_cache[layer].size:
            v_cache[layer][table] = blocks[f"v{layer}"]
    seq.commit(tokens.tolist())
    return n
