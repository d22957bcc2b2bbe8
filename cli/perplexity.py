"""`pyllm perplexity`: how well a model predicts a text, as llama.cpp's
llama-perplexity measures it (same chunks, same BOS rule, same second-half
scoring, same default context of 512), so the numbers compare with published
ones and between quantizations of one model.

stdout: the running estimate after each chunk ([1]12.3456,[2]...), then
"Final estimate: PPL = ... +/- ..."; with --json one object instead.
stderr: what is being measured and how fast it went.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Optional

import typer

from pyllm.errors import InvalidArgumentError

from .common import err, handle_errors, model_path, read_input
from .options import MlockOpt, NoMmapOpt
from .options import OverrideKvOpt, overrides_of
from .options import (RopeFreqBaseOpt, RopeFreqScaleOpt, RopeScaleOpt, RopeScalingOpt, YarnOrigCtxOpt,
                      rope_overrides)
from .options import (CacheTypeK, CacheTypeV, ControlLayerRangeOpt, ControlVectorOpt, ControlVectorScaledOpt, LoraOpt,
                      LoraScaledOpt, ModelOpt, NGpuLayers, Threads, control_kwargs, lora_specs)


def perplexity(
    file: Annotated[Optional[str], typer.Option("-f", "--file", help="the text to score (else stdin), e.g. "
                                                "wikitext-2's wiki.test.raw")] = None,
    model: ModelOpt = None,
    no_mmap: NoMmapOpt = False,
    mlock: MlockOpt = False,
    override_kv: OverrideKvOpt = [],
    rope_scaling: RopeScalingOpt = None,
    rope_scale: RopeScaleOpt = None,
    rope_freq_base: RopeFreqBaseOpt = None,
    rope_freq_scale: RopeFreqScaleOpt = None,
    yarn_orig_ctx: YarnOrigCtxOpt = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", help="tokens per chunk (the context each chunk "
                                          "runs in); llama-perplexity's default")] = 512,
    chunks: Annotated[int, typer.Option("--chunks", help="score at most this many chunks (-1 = all)")] = -1,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object: ppl, error, tokens, chunks, the "
                                          "running estimates, timing")] = False,
    threads: Threads = None,
    n_gpu_layers: NGpuLayers = "auto",
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
    lora: LoraOpt = [],
    lora_scaled: LoraScaledOpt = [],
    control_vector: ControlVectorOpt = [],
    control_vector_scaled: ControlVectorScaledOpt = [],
    control_vector_layer_range: ControlLayerRangeOpt = None,
) -> None:
    """Measure a model's perplexity on a text (llama-perplexity's method)."""
    with handle_errors():
        if chunks == 0 or chunks < -1:
            raise InvalidArgumentError(f"--chunks must be at least 1 (or -1 for all), not {chunks}")
        text = read_input(file, "file", "no text: give -f FILE or pipe the text in")
        from pyllm import Model

        path = model_path(model)
        with Model(path, n_ctx=ctx_size, n_threads=threads, n_gpu_layers=n_gpu_layers, cache_type_k=cache_type_k,
                   use_mmap=not no_mmap, use_mlock=mlock,
                   override_kv={**overrides_of(override_kv), **rope_overrides(
                       rope_scaling, rope_scale, rope_freq_base, rope_freq_scale, yarn_orig_ctx)},
                   cache_type_v=cache_type_v, lora=lora_specs(lora, lora_scaled),
                   **control_kwargs(control_vector, control_vector_scaled, control_vector_layer_range)) as m:
            m.require_generation()
            ids = m.tokenize(text)
            max_chunks = None if chunks < 0 else chunks
            n_chunks = len(ids) // ctx_size if max_chunks is None else min(max_chunks, len(ids) // ctx_size)
            err.print(f"perplexity: {len(ids)} tokens, {n_chunks} chunks of {ctx_size}, the second half of each "
                      f"scored", soft_wrap=True)
            t0 = time.perf_counter()

            def progress(i: int, n: int, running: float) -> None:
                if not as_json:
                    sys.stdout.write(f"[{i + 1}]{running:.4f},")
                    sys.stdout.flush()
            result = m.perplexity(ids, max_chunks=max_chunks, on_chunk=progress)
            seconds = time.perf_counter() - t0
            if as_json:
                sys.stdout.write(json.dumps({"model": str(m.path), **result.as_dict(), "seconds": seconds}) + "\n")
            else:
                sys.stdout.write(f"\nFinal estimate: PPL = {result.ppl:.4f} +/- {result.error:.5f}\n")
            err.print(f"{result.chunks * ctx_size} tokens in {seconds:.1f} s "
                      f"({result.chunks * ctx_size / seconds:.1f} tokens/s)")
