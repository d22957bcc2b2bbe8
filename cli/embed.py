"""`pyllm embed`: texts in, embedding vectors out; made for shell scripts.

Each text is a TEXT argument, or a line of -f FILE or of stdin. stdout gets one
JSON array of floats per text, a line each (or, with --json, one object);
everything else goes to stderr. Exit codes as `pyllm run`'s.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Optional

import numpy as np
import typer

from pyllm.errors import InvalidArgumentError

from .common import err, handle_errors, model_path, read_input
from .options import MlockOpt, NoMmapOpt
from .options import OverrideKvOpt, file_kwargs
from .options import CtxSize, ModelOpt, NGpuLayers, Threads


def read_texts(texts: list[str], file: Optional[str]) -> list[str]:
    """The arguments, else the lines of FILE, else of stdin (blank lines skipped)."""
    if texts and file is not None:
        raise InvalidArgumentError("give the texts as arguments or with -f, not both")
    if texts:
        return texts
    lines = read_input(file, "file", "no text: give TEXT arguments, -f FILE (a text per line), or pipe lines in")
    lines = [line for line in lines.splitlines() if line.strip()]
    if not lines:
        raise InvalidArgumentError("no text to embed: the input is empty")
    return lines


def vector_json(v: np.ndarray) -> str:
    """A vector as a JSON array; 9 significant digits give every float32 back exactly."""
    if not np.isfinite(v).all():
        raise InvalidArgumentError("the model computed a non-finite embedding; the file is corrupt or badly quantized")
    if v.ndim == 2:
        return "[" + ",".join(vector_json(row) for row in v) + "]"
    return "[" + ",".join(f"{x:.9g}" for x in v.tolist()) + "]"


def embed(
    texts: Annotated[Optional[list[str]], typer.Argument(help="texts to embed (else -f, else stdin: a text per line)",
                                                         show_default=False)] = None,
    file: Annotated[Optional[str], typer.Option("-f", "--file", help="embed each line of this file")] = None,
    model: ModelOpt = None,
    no_mmap: NoMmapOpt = False,
    mlock: MlockOpt = False,
    override_kv: OverrideKvOpt = [],
    pooling: Annotated[Optional[str], typer.Option(
        "--pooling", help="how a text's token rows become one vector: mean, cls, last, or none (one vector per "
        "token); default: as the model file says")] = None,
    normalize: Annotated[bool, typer.Option("--normalize/--no-normalize", help="scale each vector to unit length")]
    = True,
    truncate: Annotated[bool, typer.Option("--truncate", help="cut a text longer than the context instead of "
                                           "failing")] = False,
    dimensions: Annotated[Optional[int], typer.Option("--dimensions", help="keep the first N values (before "
                                                      "normalizing): a Matryoshka model's shorter embedding")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object: model, embeddings, token counts, "
                                          "timing")] = False,
    threads: Threads = None,
    ctx_size: CtxSize = None,
    n_gpu_layers: NGpuLayers = "auto",
) -> None:
    """Print the embedding of each text (a sentence encoder such as all-minilm-l6-v2, or any model)."""
    with handle_errors():
        items = read_texts(texts or [], file)
        from pyllm import Model

        path = model_path(model)
        t0 = time.perf_counter()
        with Model(path, n_ctx=ctx_size, n_threads=threads, n_gpu_layers=n_gpu_layers, embedding=True,
                   **file_kwargs(no_mmap, mlock, override_kv)) as m:
            load_s = time.perf_counter() - t0
            if pooling is None and m.pooling == "none":
                err.print(f"note: {m.path.name} does not say how to pool its tokens' rows: a vector per token "
                          f"(--pooling mean|cls|last makes one per text)", style="cyan", highlight=False,
                          soft_wrap=True)
            lines, counts = [], []
            for text in items:
                ids = m.embedding_tokens(text, truncate)
                counts.append(len(ids))
                line = vector_json(m.embed_tokens(ids, pooling, normalize, dimensions))
                if as_json:
                    lines.append(line)
                else:
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
            if as_json:
                total = time.perf_counter() - t0
                head = json.dumps({"model": str(m.path), "pooling": pooling or m.pooling, "normalized": normalize,
                                   "dims": dimensions or m.embedding_dims, "prompt_tokens": sum(counts),
                                   "tokens": counts,
                                   "load_s": round(load_s, 6), "total_s": round(total, 6)})
                sys.stdout.write(head[:-1] + ', "embeddings": [' + ",".join(lines) + "]}\n")
                sys.stdout.flush()


def rerank(
    query: Annotated[str, typer.Argument(help="the query")],
    documents: Annotated[Optional[list[str]], typer.Argument(
        help="the documents to rank (else -f, else stdin: a document per line)", show_default=False)] = None,
    file: Annotated[Optional[str], typer.Option("-f", "--file", help="rank each line of this file")] = None,
    model: ModelOpt = None,
    top_n: Annotated[Optional[int], typer.Option("--top-n", help="print the N most relevant only")] = None,
    truncate: Annotated[bool, typer.Option("--truncate", help="cut a document that does not fit the context "
                                           "instead of failing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object: results (index, score, "
                                          "document), token count")] = False,
    threads: Threads = None,
    ctx_size: CtxSize = None,
) -> None:
    """Rank documents by relevance to a query with a reranker (bge-reranker and other cross-encoders):
    a line each, most relevant first: score, index, document."""
    with handle_errors():
        items = read_texts(documents or [], file)
        if top_n is not None and top_n < 1:
            raise InvalidArgumentError(f"--top-n must be positive, not {top_n}")
        from pyllm import Model

        with Model(model_path(model), n_ctx=ctx_size, n_threads=threads, embedding=True) as m:
            scores = m.rerank(query, items, truncate=truncate)
            order = sorted(range(len(items)), key=lambda i: -scores[i])[:top_n]
            if as_json:
                n = sum(len(m.rerank_tokens(query, d, truncate)) for d in items)
                json.dump({"model": str(m.path), "prompt_tokens": n, "results": [
                    {"index": i, "score": scores[i], "document": items[i]} for i in order]}, sys.stdout,
                    ensure_ascii=False)
                sys.stdout.write("\n")
            else:
                for i in order:
                    sys.stdout.write(f"{scores[i]:.6g}\t{i}\t{items[i]}\n")
