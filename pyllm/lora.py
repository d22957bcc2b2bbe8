"""LoRA adapters: llama.cpp's GGUF adapter files, applied at run time.

An adapter holds, for some of a model's weight matrices W (n_out rows of
n_in), a pair of low-rank matrices A (r rows of n_in, `<name>.lora_a`) and
B (n_out rows of r, `<name>.lora_b`). The adapted layer computes

    y = W x + s B (A x),    s = scale * alpha / r   (scale alone when alpha is 0)

which is what merging W + s B A would give, without touching W (still
quantized and mmapped). The token embedding is the one table that is looked
up rather than multiplied: its pair is stored the other way round, A with a
row of r per token and B with n_embd rows of r, and the adapted row of a
token is E[t] + s B A[t] (llama.cpp's layout, made by convert_lora_to_gguf).

s is folded into A once at load: pyllm keeps its own copy of s A in F16, so
changing s (the server's /lora-adapters) rewrites that copy in place without
rebuilding anything; and of B in float32 by its r rows (B transposed), which the
step adds into the output scaled by A x's r values (Graph.matmul_cols): n_out dot
products of r numbers each would cost more in overhead than in arithmetic.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace
from typing import Iterable, Optional

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from .errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from .graph import SUPPORTED_WEIGHT_TYPES
from .model_file import ModelFile, Tensor

log = logging.getLogger("pyllm")

TOKEN_EMBD = "token_embd.weight"
F16 = int(GGMLQuantizationType.F16)


@dataclass
class LoraPair:
    """One adapted weight: `target` (the model's tensor), A and B as in the file, the
    F16 copy of s A the forward step reads, and B as float32 by its r rows of n_out
    (B transposed: the step adds r scaled rows into the output, Graph.matmul_cols, where
    n_out dot products of r numbers would each cost more than their arithmetic)."""
    target: str
    a: Tensor
    b: Tensor
    scaled_a: Optional[Tensor] = None
    b_cols: Optional[Tensor] = None

    @property
    def rank(self) -> int:
        return self.b.shape[0] if self.target != TOKEN_EMBD else self.a.shape[0]


class LoraAdapter:
    """An adapter file opened for one model: its pairs checked against the model's
    tensors, at `scale` (the user's multiplier: --lora-scaled)."""

    def __init__(self, path: str | os.PathLike, model: ModelFile, scale: float = 1.0):
        self.path = str(path)
        self.file = ModelFile(path)
        try:
            self.alpha = self._check_header(model)
            self.pairs = self._pairs(model)
            self.scale = float("nan")
            self.set_scale(scale)
        except BaseException:
            self.file.close()
            raise

    def _check_header(self, model: ModelFile) -> float:
        md = self.file.metadata
        if md.get("general.type") != "adapter" or md.get("adapter.type") != "lora":
            raise ModelFileError(f"{self.path} is not a LoRA adapter (general.type {md.get('general.type')!r}, "
                                 f"adapter.type {md.get('adapter.type')!r}); convert one with llama.cpp's "
                                 f"convert_lora_to_gguf.py")
        arch = md.get("general.architecture")
        if arch != model.architecture:
            raise InvalidArgumentError(f"{self.path} adapts a {arch} model, not {model.architecture} "
                                       f"({os.path.basename(model.path)}): use the adapter made for this model")
        alpha = md.get("adapter.lora.alpha", 0.0)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
            raise ModelFileError(f"{self.path}: adapter.lora.alpha should be a number, not {alpha!r}")
        return float(alpha)

    def _pairs(self, model: ModelFile) -> list[LoraPair]:
        halves: dict[str, dict[str, Tensor]] = {}
        for name, t in self.file.tensors.items():
            base, dot, half = name.rpartition(".")
            if dot and half in ("lora_a", "lora_b"):
                halves.setdefault(base, {})[half] = t
            elif not name.endswith("_norm.weight"):   # norm deltas: skipped, as llama.cpp does
                raise ModelFileError(f"{self.path}: tensor {name} is neither a .lora_a nor a .lora_b half")
        if not halves:
            raise ModelFileError(f"{self.path} holds no LoRA pairs (tensors ending in .lora_a/.lora_b)")
        pairs = []
        for target, ab in sorted(halves.items()):
            if len(ab) != 2:
                raise ModelFileError(f"{self.path}: {target} has {', '.join(ab)} but not its other half")
            a, b = ab["lora_a"], ab["lora_b"]
            if not model.has_tensor(target):
                raise InvalidArgumentError(f"{self.path} adapts {target}, which {os.path.basename(model.path)} "
                                           f"does not have: is it the adapter of another model?")
            w = model.tensor(target)
            for t in (a, b):
                if t.type not in SUPPORTED_WEIGHT_TYPES or len(t.shape) != 2:
                    raise UnsupportedModelError(f"{self.path}: {t.name} is a {len(t.shape)}-D {t.type_name} "
                                                f"tensor; pyllm runs 2-D adapters of F32, F16, BF16 or the "
                                                f"quantized types")
            if len(w.shape) != 2:
                raise UnsupportedModelError(f"{self.path} adapts {target}, a {len(w.shape)}-D tensor (experts "
                                            f"or heads); pyllm applies LoRA to 2-D weights only")
            r = a.shape[0] if target == TOKEN_EMBD else b.shape[0]
            want = ((r, w.shape[1]), (r, w.shape[0])) if target == TOKEN_EMBD else \
                ((w.shape[0], r), (r, w.shape[1]))
            if (a.shape, b.shape) != want:
                raise InvalidArgumentError(f"{self.path}: {target} is {list(w.shape)} but its pair is A "
                                           f"{list(a.shape)}, B {list(b.shape)} (expected {list(want[0])}, "
                                           f"{list(want[1])}): the adapter is for another model")
            cols = np.ascontiguousarray(
                dequantize(b.data, GGMLQuantizationType(b.type)).astype(np.float32).reshape(b.rows, b.shape[0]).T)
            # tensor names key the backends' weights: make them unique across adapters
            b_cols = Tensor(f"{self.path}:{b.name}.cols", 0, (cols.shape[1], cols.shape[0]), -1, cols.nbytes,
                            cols.reshape(-1).view(np.uint8))
            pairs.append(LoraPair(target, a, b, b_cols=b_cols))
        return pairs

    def set_scale(self, scale: float) -> None:
        """Sets the user's multiplier (0 turns the adapter off): rewrites each s A in place (all
        or, if one would overflow F16, none)."""
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
            raise InvalidArgumentError(f"a LoRA scale must be a finite number, not {scale!r}")
        scaled = []
        for p in self.pairs:
            a = dequantize(p.a.data, GGMLQuantizationType(p.a.type)).astype(np.float32)
            sa = (a * np.float32(self._scale_of(float(scale), p))).astype(np.float16)
            if not np.isfinite(sa).all():
                raise InvalidArgumentError(f"{self.path}: scale {scale} overflows {p.a.name} in F16")
            scaled.append(sa.reshape(-1).view(np.uint8))
        self.scale = float(scale)
        for p, sa in zip(self.pairs, scaled):
            if p.scaled_a is None:
                p.scaled_a = replace(p.a, name=f"{self.path}:{p.a.name}", type=F16, offset=-1,
                                     nbytes=sa.nbytes, data=np.empty(sa.nbytes, dtype=np.uint8))
            p.scaled_a.data[:] = sa

    def effective_scale(self, pair: LoraPair) -> float:
        """s = scale * alpha / rank, or scale where the file gives no alpha (llama.cpp's rule)."""
        return self._scale_of(self.scale, pair)

    def _scale_of(self, scale: float, pair: LoraPair) -> float:
        return scale * self.alpha / pair.rank if self.alpha else scale

    def close(self) -> None:
        self.file.close()

    def __repr__(self) -> str:
        return f"LoraAdapter({self.path!r}, scale={self.scale}, pairs={len(self.pairs)})"


def graph_pairs(adapters: Iterable[LoraAdapter]) -> dict[str, dict]:
    """Graph(**graph_pairs(adapters)): target tensor name -> the (s A, B) of every adapter
    on it, for the linear layers (lora) and the token embedding (lora_embed)."""
    out: dict[str, dict] = {"lora": {}, "lora_embed": {}}
    for adapter in adapters:
        for p in adapter.pairs:
            table = out["lora_embed" if p.target == TOKEN_EMBD else "lora"]
            table.setdefault(p.target, []).append((p.scaled_a, p.b_cols))
    return out


def check_applied(adapters: Iterable[LoraAdapter], applied: set[str], arch: str) -> None:
    """UnsupportedModelError if an adapter targets a weight the forward step does not
    multiply as a plain matrix (pyllm would silently ignore its pair)."""
    for adapter in adapters:
        left = [p.target for p in adapter.pairs if p.target not in applied]
        if left:
            raise UnsupportedModelError(f"{adapter.path} adapts {', '.join(left[:3])}"
                                        f"{' ...' if len(left) > 3 else ''}, which pyllm's {arch} forward step "
                                        f"does not run as a plain matrix product: LoRA there is not supported")


def parse_scaled(spec: str, flag: str = "--lora-scaled") -> tuple[str, float]:
    """'PATH:SCALE' (--lora-scaled, --control-vector-scaled) -> (PATH, SCALE)."""
    path, colon, scale = spec.rpartition(":")
    try:
        if not colon or not path:
            raise ValueError
        return path, float(scale)
    except ValueError:
        raise InvalidArgumentError(f"{flag} takes FILE:SCALE (such as file.gguf:0.5), not {spec!r}") \
            from None


def open_adapters(specs: Optional[Iterable], model: ModelFile) -> list[LoraAdapter]:
    """Adapters from paths or (path, scale) pairs, each checked against `model`."""
    adapters: list[LoraAdapter] = []
    try:
        for spec in specs or ():
            path, scale = (spec, 1.0) if isinstance(spec, (str, os.PathLike)) else spec
            if not os.path.isfile(path):
                raise InvalidArgumentError(f"no LoRA adapter at {path}")
            adapters.append(LoraAdapter(path, model, scale))
            log.info("LoRA adapter %s: %d weights, scale %g", path, len(adapters[-1].pairs), scale)
    except BaseException:
        for a in adapters:
            a.close()
        raise
    return adapters
