"""Control vectors from contrasting prompts, as llama.cpp's cvector-generator makes
them: `pyllm cvector-generator`.

Each pair of prompts (line i of a positive and of a negative file) is tokenized
(BOS as the vocabulary says, special tokens parsed), the shorter padded with the
token of " " to the same length T, and both run from an empty context. After each
layer l but the last, the forward step copies the residual stream's T rows out
(Graph's hidden states, OP_SAVE_ROWS). Per layer, the differences positive -
negative of all pairs' rows (rows that are all zero dropped: tokens the two
prompts share before they differ) make one matrix D, and the layer's direction is

    pca:   the first principal axis of D, the unit v maximizing |D v| (D's top right
           singular vector, exact; llama.cpp iterates towards it), signed so that the
           rows' mean points along it (llama.cpp's sign is left to chance)
    mean:  the mean of D's rows, to unit length

The file is llama.cpp's control vector GGUF: general.architecture
"controlvector", controlvector.model_hint (the model's architecture),
controlvector.layer_count, and F32 direction.{l + 1} for the state after layer l.
Applied (--control-vector), direction.N is added after layer N, so a direction
acts one layer after the one it was read from, in llama.cpp as here.
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

import numpy as np

from .errors import InvalidArgumentError, UnsupportedModelError

METHODS = ("pca", "mean")
ZERO = 1e-6          # a difference row with no |value| above this is two prompts' shared token


def pair_tokens(tok, positive: str, negative: str) -> tuple[list[int], list[int]]:
    """Both prompts' tokens, the shorter padded with the token of " " to the other's length."""
    pos, neg = (tok.encode(text, add_bos=None, parse_special=True) for text in (positive, negative))
    pad = tok.encode(" ", add_bos=False)[-1:]
    if not pad:
        raise UnsupportedModelError("the vocabulary has no token for a space to pad the shorter prompt with")
    n = max(len(pos), len(neg))
    return pos + pad * (n - len(pos)), neg + pad * (n - len(neg))


def direction(diffs: np.ndarray, method: str) -> np.ndarray:
    """A layer's unit direction from its difference rows [rows, n_embd] (module docstring)."""
    d = diffs.astype(np.float64)
    mean = d.mean(axis=0)
    if method == "mean":
        v = mean
    else:
        v = np.linalg.svd(d, full_matrices=False)[2][0]
        if mean @ v < 0:
            v = -v
    norm = np.linalg.norm(v)
    return (v / norm if norm > 0 else v).astype(np.float32)


def hidden_states(model: str | os.PathLike, prompts: Sequence[list[int]], n_threads: Optional[int] = None,
                  on_prompt: Optional[Callable[[int, int], None]] = None) -> list[dict[int, np.ndarray]]:
    """For each token list, layer (from 0, all but the last) -> the residual stream's rows
    after it, [len(tokens), n_embd], each list run from an empty context."""
    from .arch import load_architecture
    from .backend.cpu import CpuBackend, physical_cores
    from .defaults import BLOCK_SIZE, N_BATCH
    from .graph import Graph
    from .model_file import ModelFile

    n_ctx = max(len(p) for p in prompts)
    with ModelFile(model) as mf:
        arch = load_architecture(mf, n_ctx=max(n_ctx, 16))
        if not arch.causal:
            raise UnsupportedModelError(f"{arch.name} is an embedding model: control vectors steer generating "
                                        f"models")
        n_layer, n_embd = arch.hp.n_layer, arch.hp.n_embd
        if n_layer < 2:
            raise UnsupportedModelError(f"a model of {n_layer} layer has no layer before its last to read")
        n_batch = min(N_BATCH, n_ctx)
        taps = {layer: np.zeros((n_batch, n_embd), np.float32) for layer in range(n_layer - 1)}
        g = Graph(hidden=taps)
        arch.build(g)
        if g.hidden_saved != set(taps):
            raise UnsupportedModelError(f"{arch.name}: pyllm cvector-generator reads the layers of the families "
                                        f"that take control vectors, not this one's")
        if g.states:
            raise UnsupportedModelError(f"{arch.name} keeps a recurrent state: pyllm cvector-generator runs "
                                        f"transformer models")
        n_blocks = (n_ctx + BLOCK_SIZE - 1) // BLOCK_SIZE
        backend = CpuBackend(g, n_threads or physical_cores(), n_batch, 1, n_blocks, BLOCK_SIZE)
        table = list(range(n_blocks))
        out = []
        try:
            for i, tokens in enumerate(prompts):
                rows = {layer: np.empty((len(tokens), n_embd), np.float32) for layer in taps}
                for start in range(0, len(tokens), n_batch):
                    chunk = tokens[start:start + n_batch]
                    backend.forward(chunk, start, table, 1)
                    for layer, tap in taps.items():
                        rows[layer][start:start + len(chunk)] = tap[:len(chunk)]
                out.append(rows)
                if on_prompt is not None:
                    on_prompt(i, len(prompts))
        finally:
            backend.close()
        return out


def check(positive: Sequence[str], negative: Sequence[str], method: str) -> None:
    """InvalidArgumentError unless the prompts pair up and the method is known."""
    if method not in METHODS:
        raise InvalidArgumentError(f"--method takes {' or '.join(METHODS)}, not {method!r}")
    if len(positive) != len(negative):
        raise InvalidArgumentError(f"{len(positive)} positive and {len(negative)} negative prompts: the files pair "
                                   f"them line by line, so they need as many lines")
    if not positive:
        raise InvalidArgumentError("no prompt pairs: give at least one positive and one negative line")


def generate(model: str | os.PathLike, positive: Sequence[str], negative: Sequence[str], method: str = "pca",
             n_threads: Optional[int] = None,
             on_prompt: Optional[Callable[[int, int], None]] = None) -> tuple[dict[int, np.ndarray], str]:
    """(direction.N index -> unit n_embd float32, the model's architecture) from the prompt
    pairs (module docstring). on_prompt(i, n) after each prompt run (two per pair)."""
    from .model_file import ModelFile
    from .tokenizer import load_tokenizer

    check(positive, negative, method)
    with ModelFile(model) as mf:
        tok, architecture = load_tokenizer(mf.metadata), mf.architecture
    pairs = [pair_tokens(tok, p, n) for p, n in zip(positive, negative)]
    states = hidden_states(model, [t for pair in pairs for t in pair], n_threads, on_prompt)
    directions = {}
    for layer in states[0]:
        diffs = np.concatenate([states[2 * i][layer] - states[2 * i + 1][layer] for i in range(len(pairs))])
        diffs = diffs[np.abs(diffs).max(axis=1) > ZERO]
        if not len(diffs):
            raise InvalidArgumentError("every positive prompt reads the same as its negative one: nothing to tell "
                                       "them apart")
        directions[layer + 1] = direction(diffs, method)
    return directions, architecture


def write(path: str | os.PathLike, directions: dict[int, np.ndarray], model_hint: str) -> None:
    """llama.cpp's control vector file (module docstring)."""
    from .model_file import KV_I32, KV_STRING, kv_entry, write_gguf
    from .control_vector import F32
    names = sorted(directions)
    kv = [kv_entry("general.architecture", KV_STRING, "controlvector"),
          kv_entry("controlvector.model_hint", KV_STRING, model_hint),
          kv_entry("controlvector.layer_count", KV_I32, len(names))]
    tensors = [(f"direction.{n}", (directions[n].size,), F32, directions[n].nbytes) for n in names]
    write_gguf(path, kv, tensors, lambda f, i: f.write(directions[names[i]].astype("<f4").tobytes()))
