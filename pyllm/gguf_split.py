"""Splitting a GGUF model into shards and merging shards into one file, as
llama.cpp's gguf-split does (--split, --merge), in its layout: the shards are
PREFIX-00001-of-0000N.gguf ..., the first holds all the metadata, every shard
holds split.no (from 0), split.count and split.tensors.count, and the tensors
keep their order. ModelFile opens a split model from its first shard.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

from .errors import InvalidArgumentError
from .model_file import DEFAULT_ALIGNMENT, KV_I32, KV_U16, ModelFile, Tensor, kv_entry, write_gguf

Progress = Optional[Callable[[str, int, int], None]]   # (path written, shard number from 1, shards)


def plan_shards(tensors: list[Tensor], max_tensors: Optional[int] = None, max_bytes: Optional[int] = None,
                alignment: int = DEFAULT_ALIGNMENT) -> list[list[Tensor]]:
    """The tensors grouped into shards, in order: a shard takes the next tensor unless that
    would pass max_tensors tensors or max_bytes bytes of (padded) data; a tensor larger than
    max_bytes gets a shard of its own."""
    if max_tensors is None and max_bytes is None:
        raise InvalidArgumentError("say how large a shard may be: a number of tensors or of bytes")
    if (max_tensors is not None and max_tensors < 1) or (max_bytes is not None and max_bytes < 1):
        raise InvalidArgumentError("a shard holds at least one tensor: give a positive size")
    shards: list[list[Tensor]] = [[]]
    size = 0
    for t in tensors:
        padded = (t.nbytes + alignment - 1) // alignment * alignment
        full = ((max_tensors is not None and len(shards[-1]) >= max_tensors) or
                (max_bytes is not None and size + padded > max_bytes))
        if shards[-1] and full:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += padded
    return shards


def split_model(src: str | os.PathLike, prefix: str, max_tensors: Optional[int] = None,
                max_bytes: Optional[int] = None, progress: Progress = None) -> list[str]:
    """Writes the model at `src` (one file or already split) as shards PREFIX-0000i-of-0000N.gguf;
    returns their paths."""
    with ModelFile(src) as mf:
        alignment = int(mf.get("general.alignment", DEFAULT_ALIGNMENT))
        shards = plan_shards(list(mf.tensors.values()), max_tensors, max_bytes, alignment)
        count = len(shards)
        paths = [f"{prefix}-{i + 1:05d}-of-{count:05d}.gguf" for i in range(count)]
        inputs = {os.path.realpath(p) for p in mf.shards}
        if any(os.path.realpath(p) in inputs for p in paths):
            raise InvalidArgumentError("the shards would overwrite the model they are made from: "
                                       "give another prefix")
        metadata = [mf.metadata_entry(k) for k in mf.metadata if not k.startswith("split.")]
        for i, (path, tensors) in enumerate(zip(paths, shards)):
            kv = (metadata if i == 0 else []) + [
                kv_entry("split.no", KV_U16, i), kv_entry("split.count", KV_U16, count),
                kv_entry("split.tensors.count", KV_I32, len(mf.tensors))]
            _write(path, kv, tensors, alignment)
            if progress is not None:
                progress(path, i + 1, count)
        return paths


def merge_model(first: str | os.PathLike, dst: str | os.PathLike) -> int:
    """Writes the split model whose first shard is `first` as the one file `dst`; returns its
    number of shards."""
    with ModelFile(first) as mf:
        if os.path.realpath(dst) in {os.path.realpath(p) for p in mf.shards}:
            raise InvalidArgumentError("the output would overwrite a shard: give another output path")
        alignment = int(mf.get("general.alignment", DEFAULT_ALIGNMENT))
        metadata = [mf.metadata_entry(k) for k in mf.metadata if not k.startswith("split.")]
        _write(dst, metadata, list(mf.tensors.values()), alignment)
        return len(mf.shards)


def _write(path: str | os.PathLike, kv: list[bytes], tensors: list[Tensor], alignment: int) -> None:
    write_gguf(path, kv, [(t.name, t.shape, t.type, t.nbytes) for t in tensors],
               lambda f, i: f.write(tensors[i].data), alignment)
