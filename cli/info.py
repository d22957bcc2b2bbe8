"""`pyllm info`: what a model is and what running it takes."""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from .common import handle_errors, model_path


def info(
    model: Optional[str] = typer.Option(None, "-m", "--model",
                                        help="model: a registry name (see `pyllm list`) or a path to a .gguf file"),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size",
                                           help="context length to size the KV cache for (default: the "
                                                "training context, at most 4096)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Show a model's architecture, parameters, tensor types, context, RoPE,
    vocabulary, chat template and the memory it needs."""
    with handle_errors():
        from pyllm.errors import InvalidArgumentError
        from pyllm.info import model_info

        if ctx_size is not None and ctx_size < 1:
            raise InvalidArgumentError(f"the context size must be positive, not {ctx_size}")
        report = model_info(model_path(model), n_ctx=ctx_size)
        if as_json:
            json.dump(report.as_dict(), sys.stdout)
            sys.stdout.write("\n")
        else:
            print(report.format())
