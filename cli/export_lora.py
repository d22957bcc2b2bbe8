"""`pyllm export-lora`: a model with LoRA adapters merged into its weights, as
llama.cpp's llama-export-lora writes it (pyllm/export_lora.py).

stderr: each tensor as it is written, then what was merged.
"""
from __future__ import annotations

import os
import time
from typing import Annotated

import typer

from pyllm.errors import InvalidArgumentError

from .common import err, handle_errors, model_path
from .options import LoraOpt, LoraScaledOpt, ModelOpt, lora_specs


def export_lora(
    output: Annotated[str, typer.Option("-o", "--output", help="the .gguf file to write")],
    model: ModelOpt = None,
    lora: LoraOpt = [],
    lora_scaled: LoraScaledOpt = [],
) -> None:
    """Merge LoRA adapters into a model's weights and write it as one GGUF file (llama-export-lora)."""
    with handle_errors():
        from pyllm.export_lora import export_lora as merge
        path = model_path(model)
        if os.path.isdir(output):
            raise InvalidArgumentError(f"{output} is a folder: give the output file's path")
        t0 = time.perf_counter()

        def progress(name: str, done: int, total: int) -> None:
            err.print(f"[{done:4d}/{total}] {name}", highlight=False, soft_wrap=True)
        merged = merge(path, lora_specs(lora, lora_scaled), output, progress=progress)
        err.print(f"{output}: {len(merged)} weights merged, {os.path.getsize(output) / 1e6:.1f} MB in "
                  f"{time.perf_counter() - t0:.1f} s", highlight=False, soft_wrap=True)
