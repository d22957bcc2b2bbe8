"""`pyllm split`: a GGUF model as shards, or shards as one file, as llama.cpp's
gguf-split makes them (pyllm/gguf_split.py). Every pyllm command opens a split
model from its first shard, so merging is needed only for other programs.

stderr: each file as it is written.
"""
from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from pyllm.errors import InvalidArgumentError

from .common import err, handle_errors, model_path


def split(
    model: Annotated[str, typer.Argument(help="the model: a .gguf path or a registry name (with --merge: "
                                         "the first shard, ...-00001-of-0000N.gguf)")],
    output: Annotated[str, typer.Argument(help="the shards' prefix: PREFIX-00001-of-0000N.gguf ... (with "
                                          "--merge: the .gguf file to write)")],
    max_size: Annotated[Optional[str], typer.Option(
        "--max-size", help="the most tensor data per shard, e.g. 2G or 500M")] = None,
    max_tensors: Annotated[Optional[int], typer.Option(
        "--max-tensors", help="the most tensors per shard")] = None,
    merge: Annotated[bool, typer.Option("--merge", help="join a split model's shards into one file")] = False,
) -> None:
    """Split a GGUF model into shards, or --merge shards into one file (llama.cpp's gguf-split)."""
    with handle_errors():
        from pyllm.gguf_split import merge_model, split_model
        from pyllm.units import parse_bytes
        path = model_path(model, quiet=True)
        if merge:
            if max_size is not None or max_tensors is not None:
                raise InvalidArgumentError("--merge writes one file: leave out --max-size and --max-tensors")
            if os.path.isdir(output):
                raise InvalidArgumentError(f"{output} is a folder: give the output file's path")
            n = merge_model(path, output)
            err.print(f"{output}: {n} shards merged, {os.path.getsize(output) / 1e6:.1f} MB",
                      highlight=False, soft_wrap=True)
            return
        if max_size is None and max_tensors is None:
            raise InvalidArgumentError("say how large a shard may be: --max-size (e.g. 2G) or --max-tensors N")
        if os.path.isdir(output):
            raise InvalidArgumentError(f"{output} is a folder: give a prefix inside it, e.g. {output}/model")
        max_bytes = None if max_size is None else parse_bytes(max_size)

        def progress(shard: str, i: int, n: int) -> None:
            err.print(f"[{i}/{n}] {shard}: {os.path.getsize(shard) / 1e6:.1f} MB", highlight=False,
                      soft_wrap=True)
        split_model(path, output, max_tensors=max_tensors, max_bytes=max_bytes, progress=progress)
