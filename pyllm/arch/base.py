"""What every architecture shares: reading hyperparameters, checking tensors.

An architecture file subclasses `Architecture`, reads its hyperparameters in
`__init__` (through `HParams.read` and its own extras) and describes its
forward step in `build(graph)`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import ModelFileError, UnsupportedModelError
from ..graph import SUPPORTED_WEIGHT_TYPES, Graph
from ..model_file import ModelFile, Tensor, type_name


@dataclass
class HParams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    eps: float
    n_ctx_train: int
    rope_base: float
    rope_dim: int
    rope_freq_scale: float

    @classmethod
    def read(cls, mf: ModelFile) -> "HParams":
        n_embd = int(mf.arch_require("embedding_length"))
        n_head = int(mf.arch_require("attention.head_count"))
        n_head_kv = int(mf.arch_get("attention.head_count_kv", n_head))
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise ModelFileError(f"{mf.path}: {n_head} attention heads cannot share {n_head_kv} key/value heads")
        head_dim = int(mf.arch_get("attention.key_length", n_embd // n_head))
        tokens = mf.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens) if tokens is not None else int(mf.arch_require("vocab_size"))
        scaling = mf.arch_get("rope.scaling.type", "none")
        freq_scale = 1.0
        if scaling == "linear":
            freq_scale = 1.0 / float(mf.arch_get("rope.scaling.factor", 1.0))
        elif scaling not in ("none", None):
            raise UnsupportedModelError(f"{mf.path}: RoPE scaling {scaling!r} is not supported yet "
                                        f"(supported: none, linear)")
        hp = cls(
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_layer=int(mf.arch_require("block_count")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=int(mf.arch_require("feed_forward_length")),
            eps=float(mf.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
            n_ctx_train=int(mf.arch_get("context_length", 2048)),
            rope_base=float(mf.arch_get("rope.freq_base", 10000.0)),
            rope_dim=int(mf.arch_get("rope.dimension_count", head_dim)),
            rope_freq_scale=freq_scale,
        )
        for name in ("n_embd", "n_layer", "n_ff", "head_dim", "n_vocab", "rope_dim"):
            if getattr(hp, name) <= 0:
                raise ModelFileError(f"{mf.path}: hyperparameter {name} = {getattr(hp, name)} is not positive")
        if hp.head_dim > 512 or hp.rope_dim > hp.head_dim or hp.rope_dim % 2:
            raise UnsupportedModelError(f"{mf.path}: head size {hp.head_dim} with {hp.rope_dim} rotated "
                                        f"dims is not supported (head size at most 512)")
        return hp


class Architecture:
    """One model family: its tensors and its forward step."""

    name = ""

    def __init__(self, mf: ModelFile):
        self.mf = mf
        self.hp = HParams.read(mf)

    # -- tensors, checked against the hyperparameters ------------------------------
    def weight(self, name: str, n_in: int, n_out: int) -> Tensor:
        """A matrix of n_out rows of n_in (GGUF shape (n_in, n_out)), of a type we run."""
        t = self.mf.tensor(name)
        if t.shape != (n_in, n_out):
            raise ModelFileError(f"{self.mf.path}: tensor {name} has shape {list(t.shape)}, the "
                                 f"hyperparameters say {[n_in, n_out]}; the file is corrupt")
        if t.type not in SUPPORTED_WEIGHT_TYPES:
            supported = ", ".join(sorted(type_name(x) for x in SUPPORTED_WEIGHT_TYPES))
            raise UnsupportedModelError(f"{self.mf.path}: tensor {name} has type {t.type_name}, which pyllm "
                                        f"does not run yet (supported: {supported})")
        return t

    def vector(self, name: str, n: int) -> np.ndarray:
        """A 1-D float tensor (norm weight, bias) as float32."""
        t = self.mf.tensor(name)
        if t.shape != (n,):
            raise ModelFileError(f"{self.mf.path}: tensor {name} has shape {list(t.shape)}, expected [{n}]")
        if t.type == 0:
            return t.data.view(np.float32)
        if t.type == 1:
            return t.data.view(np.float16).astype(np.float32)
        raise UnsupportedModelError(f"{self.mf.path}: vector {name} has type {t.type_name}; expected F32 or F16")

    def optional_vector(self, name: str, n: int) -> Optional[np.ndarray]:
        return self.vector(name, n) if self.mf.has_tensor(name) else None

    def output_weight(self) -> Tensor:
        """The logits projection; tied to the token embedding when absent."""
        hp = self.hp
        name = "output.weight" if self.mf.has_tensor("output.weight") else "token_embd.weight"
        return self.weight(name, hp.n_embd, hp.n_vocab)

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.hp.head_dim)

    def build(self, g: Graph) -> None:  # pragma: no cover - every family overrides it
        raise NotImplementedError
