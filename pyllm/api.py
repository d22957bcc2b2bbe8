"""The Python API: `from pyllm import Model`.

    with Model("smollm2-135m") as m:
        print(m.generate("The capital of France is", max_tokens=16, temperature=0).text)
"""
from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Sequence as Seq

import numpy as np

from . import registry
from .arch import load_architecture
from .backend.base import Shape
from .backend.cpu import physical_cores
from .backend.select import make_backend
from .defaults import BLOCK_SIZE, DEFAULT_MAX_CTX, N_BATCH, N_OUT_MAX
from .engine import Completion, Engine, Generation
from .errors import InvalidArgumentError
from .graph import Graph
from .model_file import ModelFile
from .sampling import Sampler, SamplingParams
from .tokenizer import load_tokenizer


class Model:
    """A GGUF model loaded for generation on this machine.

    model: a path to a .gguf file or a registry name (`pyllm list`); None is
    the default model. n_ctx: context length in tokens (default: 4096, or the
    model's training context if smaller). n_threads: CPU threads (default:
    physical cores). n_batch: prompt tokens per step. n_gpu_layers: "auto"
    (the default: the planner places layers on a GPU when there is one, and
    runs on the CPU when there is none), "all", or a number of layers (an
    error without a GPU). device: None (PYLLM_DEVICE, else auto), "cuda",
    "sim" (a simulated GPU, for tests) or "cpu". `plan` is the placement
    (None on the CPU alone).
    """

    def __init__(self, model: Optional[str | os.PathLike] = None, n_ctx: Optional[int] = None,
                 n_threads: Optional[int] = None, n_batch: int = N_BATCH, n_gpu_layers: Any = None,
                 device: Optional[str] = None):
        self.path = registry.resolve(None if model is None else str(model))
        self.file = ModelFile(self.path)
        self.arch = load_architecture(self.file)
        self.tokenizer = load_tokenizer(self.file.metadata)
        hp = self.arch.hp
        if n_ctx is None:
            n_ctx = min(DEFAULT_MAX_CTX, hp.n_ctx_train)
        if n_ctx < 1:
            raise InvalidArgumentError(f"n_ctx must be positive, not {n_ctx}")
        if not 1 <= n_batch <= 8192:
            raise InvalidArgumentError(f"n_batch must be in 1..8192, not {n_batch}")
        n_threads = physical_cores() if n_threads is None else n_threads
        if not 1 <= n_threads <= 256:
            raise InvalidArgumentError(f"n_threads must be in 1..256, not {n_threads}")
        self.n_ctx, self.n_batch, self.n_threads = n_ctx, n_batch, n_threads
        n_blocks = (n_ctx + BLOCK_SIZE - 1) // BLOCK_SIZE
        self.arch.n_ctx = n_ctx   # families whose math depends on it (Phi-3's RoPE factors)
        self.graph = Graph()
        self.arch.build(self.graph)
        self.backend, self.plan = make_backend(self.graph, n_threads,
                                               Shape(min(n_batch, n_ctx), N_OUT_MAX, n_blocks, BLOCK_SIZE),
                                               n_gpu_layers, device)
        self.engine = Engine(self.backend, self.tokenizer, n_ctx, min(n_batch, n_ctx), BLOCK_SIZE, n_blocks)
        self._seq = self.engine.new_sequence()

    # -- tokens ------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.arch.hp.n_vocab

    def tokenize(self, text: str, add_bos: Optional[bool] = None, special: bool = False) -> list[int]:
        """Token ids of text. add_bos None follows the model file; special=True
        turns special-token text such as <|im_start|> into its id."""
        return self.tokenizer.encode(text, add_bos=add_bos, parse_special=special)

    def detokenize(self, ids: Seq[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def logits(self, token_ids: Seq[int]) -> np.ndarray:
        """float32 [len(token_ids), n_vocab]: the logits at every position, from a fresh context."""
        ids = [int(t) for t in token_ids]
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise InvalidArgumentError(f"token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})")
        return self.engine.logits(ids)

    # -- generation --------------------------------------------------------------
    def _generation(self, prompt: str | Seq[int], max_tokens: int, stop: Optional[Seq[str]],
                    sampling: dict) -> Generation:
        ids = self.tokenize(prompt, special=True) if isinstance(prompt, str) else [int(t) for t in prompt]
        if max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be at least 1, not {max_tokens}")
        sampler = Sampler(SamplingParams(**sampling))
        return self.engine.generate(self._seq, ids, max_tokens, sampler, list(stop or ()))

    def generate(self, prompt: str | Seq[int], max_tokens: int = 128, stop: Optional[Seq[str]] = None,
                 **sampling) -> Completion:
        """Completes `prompt` (text or token ids). Returns text, tokens, finish
        reason and timings. Sampling keywords: temperature, top_k, top_p,
        min_p, repeat_penalty, repeat_last_n, seed."""
        return self._generation(prompt, max_tokens, stop, sampling).run()

    def stream(self, prompt: str | Seq[int], max_tokens: int = 128, stop: Optional[Seq[str]] = None,
               **sampling) -> Generation:
        """Like generate(), but iterating yields the text as it is decoded;
        `.completion` holds the result afterwards."""
        return self._generation(prompt, max_tokens, stop, sampling)

    # -- lifetime ----------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "backend", None) is not None:
            self.backend.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, arch={self.arch.name}, n_ctx={self.n_ctx}, threads={self.n_threads})"
