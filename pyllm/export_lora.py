"""Merging LoRA adapters into a model file: `pyllm export-lora`, llama.cpp's
llama-export-lora.

Each adapted weight becomes W + s B A (the token embedding's rows E + s A B^T,
its pair stored the other way round; see pyllm/lora.py), s = scale x alpha /
rank, summed over the adapters; every other tensor and the metadata are copied
as they are. A merged weight keeps its type when it is F32, F16 or BF16; a
quantized one is written in F16, as llama-export-lora does (quantizing the sum
again would add its error to the adapter's change: `pyllm quantize` it
afterwards if wanted). Where the output head is the token embedding (no
output.weight) and the embedding is adapted, the file gains an output.weight
holding the original table: the adapter changes the lookup only, as it does at
run time in pyllm and llama.cpp.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable, Optional

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .errors import InvalidArgumentError
from .lora import TOKEN_EMBD, open_adapters
from .model_file import DEFAULT_ALIGNMENT, ModelFile, Tensor, write_gguf
from .quantize import float_rows, quantizer, tensor_bytes

OUTPUT = "output.weight"


def _floats(t: Tensor) -> np.ndarray:
    """A 2-D tensor as float32 [rows, row length] (possibly a read-only view of the file)."""
    return float_rows(t, slice(0, t.rows))


def export_lora(model: str | os.PathLike, adapters: Iterable, out: str | os.PathLike,
                progress: Optional[Callable[[str, int, int], None]] = None) -> list[str]:
    """Writes `model` with the adapters (paths or (path, scale) pairs) merged in at `out`;
    returns the names of the weights merged. progress(name, done, all) after each tensor."""
    if os.path.realpath(out) == os.path.realpath(model):
        raise InvalidArgumentError("the output would overwrite the model: give another output path")
    with ModelFile(model) as mf:
        opened = open_adapters(adapters, mf)
        if not opened:
            raise InvalidArgumentError("no adapter to merge: give at least one --lora or --lora-scaled")
        try:
            pairs: dict[str, list] = {}
            for adapter in opened:
                for p in adapter.pairs:
                    pairs.setdefault(p.target, []).append((np.float32(adapter.effective_scale(p)), p))
            tensors = list(mf.tensors.values())
            types = {t.name: (t.type if t.name not in pairs or t.type in (T.F32, T.F16, T.BF16) else T.F16)
                     for t in tensors}
            keep_head = TOKEN_EMBD in pairs and OUTPUT not in mf.tensors
            if keep_head:   # the head reads the unadapted table
                tensors.append(mf.tensors[TOKEN_EMBD])
                types[OUTPUT] = mf.tensors[TOKEN_EMBD].type
            names = [t.name for t in tensors[:len(mf.tensors)]] + ([OUTPUT] if keep_head else [])

            def write_data(f, i: int) -> None:
                t, name = tensors[i], names[i]
                if name not in pairs:   # copied (the kept head too: it is named output.weight)
                    f.write(memoryview(t.data))
                else:
                    w = _floats(t)
                    for s, p in pairs[name]:
                        if name == TOKEN_EMBD:   # A: a row of r per token, B: n_embd rows of r
                            w = w + s * (_floats(p.a) @ _floats(p.b).T)
                        else:                    # B: n_out rows of r, A: r rows of n_in
                            w = w + s * (_floats(p.b) @ _floats(p.a))
                    f.write(np.ascontiguousarray(quantizer(T(types[name]))(w)).tobytes())
                if progress is not None:
                    progress(name, i + 1, len(tensors))

            kv = [mf.metadata_entry(k) for k in mf.metadata if not k.startswith("split.")]
            write_gguf(out, kv, [(n, t.shape, types[n], tensor_bytes(t.shape, T(types[n])))
                                 for n, t in zip(names, tensors)], write_data,
                       int(mf.get("general.alignment", DEFAULT_ALIGNMENT)))
            return sorted(pairs)
        finally:
            for a in opened:
                a.close()
