"""Choosing the next token from logits: samplers, seeded.

Greedy when temperature is 0. Otherwise, in llama.cpp's default order:
penalties -> top-k -> top-p -> min-p -> temperature -> random draw.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .errors import InvalidArgumentError


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: Optional[int] = None

    def validate(self) -> "SamplingParams":
        if self.temperature < 0:
            raise InvalidArgumentError(f"temperature must be >= 0, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidArgumentError(f"top_p must be in (0, 1], not {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise InvalidArgumentError(f"min_p must be in [0, 1], not {self.min_p}")
        if self.top_k < 0:
            raise InvalidArgumentError(f"top_k must be >= 0 (0 = all), not {self.top_k}")
        if self.repeat_penalty <= 0:
            raise InvalidArgumentError(f"repeat_penalty must be > 0, not {self.repeat_penalty}")
        return self


class Sampler:
    def __init__(self, params: SamplingParams):
        self.p = params.validate()
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        p = self.p
        logits = np.asarray(logits, dtype=np.float32)
        if p.repeat_penalty != 1.0 and history:
            logits = logits.copy()
            recent = np.unique(np.asarray(history[-p.repeat_last_n:], dtype=np.int64))
            vals = logits[recent]
            logits[recent] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        if p.temperature == 0:
            return int(np.argmax(logits))
        # candidates, best first
        k = p.top_k if 0 < p.top_k < len(logits) else len(logits)
        idx = np.argpartition(-logits, k - 1)[:k] if k < len(logits) else np.arange(len(logits))
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        vals = logits[idx].astype(np.float64)
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            idx, vals, probs = idx[:keep], vals[:keep], probs[:keep]
        if p.min_p > 0:
            keep = probs >= p.min_p * probs[0]
            idx, vals = idx[keep], vals[keep]
        probs = np.exp((vals - vals[0]) / p.temperature)
        probs /= probs.sum()
        return int(idx[self.rng.choice(len(idx), p=probs)])
