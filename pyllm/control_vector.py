"""Control vectors: llama.cpp's --control-vector, steering a model by adding a
fixed direction to its residual stream.

A control vector file (GGUF, from llama-cvector-generator or repeng) holds
`direction.N` tensors: n_embd float32 values for layer N, counted from 1
(there is none for layer 0). After layer N of the model (counted from 0, so
the second layer onwards) the forward step adds

    x += sum over files of scale * direction.N

to every token's row, for N within the layer range (default: all layers),
exactly where llama.cpp adds them (its build_cvec, at the end of each layer).
Several files add up, each at its own scale (--control-vector-scaled).
"""
from __future__ import annotations

import logging
import os
import re
from typing import Iterable, Optional

import numpy as np
from gguf.constants import GGMLQuantizationType

from .errors import InvalidArgumentError, ModelFileError
from .model_file import ModelFile

log = logging.getLogger("pyllm")

F32 = int(GGMLQuantizationType.F32)
_DIRECTION = re.compile(r"direction\.(\d+)")


def read_directions(path: str | os.PathLike) -> dict[int, np.ndarray]:
    """A control vector file's directions: layer N (from 1) -> its n_embd float32 values."""
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"no control vector at {path}")
    with ModelFile(path) as mf:
        out: dict[int, np.ndarray] = {}
        for name, t in mf.tensors.items():
            m = _DIRECTION.fullmatch(name)
            if m is None or int(m.group(1)) == 0:
                raise ModelFileError(f"{path}: tensor {name!r} is not a control vector's direction.N "
                                     f"(N a layer from 1); is this a control vector file?")
            if t.type != F32 or len(t.shape) != 1:
                raise ModelFileError(f"{path}: {name} should be one row of F32 values, not {t.type_name} "
                                     f"of shape {t.shape}")
            out[int(m.group(1))] = t.data.view(np.float32).copy()
        if not out:
            raise ModelFileError(f"{path} holds no direction.N tensors: it is not a control vector")
        widths = {v.size for v in out.values()}
        if len(widths) > 1:
            raise ModelFileError(f"{path}: its directions have different lengths {sorted(widths)}")
        return out


def combine(specs: Optional[Iterable], n_embd: int, n_layer: int,
            layer_range: Optional[tuple[int, int]] = None) -> dict[int, np.ndarray]:
    """Model layer (from 0) -> the vector added after it: the files' directions (each spec a
    path or a (path, scale) pair) summed at their scales, for the layers in layer_range
    (inclusive, llama.cpp's numbering from 1; as in llama.cpp, a start or end of 0 or less
    means the first or the last layer)."""
    total: dict[int, np.ndarray] = {}
    for spec in specs or ():
        path, scale = (spec, 1.0) if isinstance(spec, (str, os.PathLike)) else spec
        directions = read_directions(path)
        width = next(iter(directions.values())).size
        if width != n_embd:
            raise InvalidArgumentError(f"control vector {path} is for a model {width} wide; this model is "
                                       f"{n_embd} wide: use a vector made for this model")
        for layer, v in directions.items():
            total[layer] = total.get(layer, np.zeros(n_embd, np.float32)) + np.float32(scale) * v
        log.info("control vector %s: %d layers, scale %g", path, len(directions), scale)
    start, end = layer_range or (0, 0)
    start, end = start if start > 0 else 1, end if end > 0 else n_layer
    return {layer: v for layer, v in sorted(total.items()) if start <= layer <= end and layer < n_layer}
