"""`pyllm imatrix`: an importance matrix for `pyllm quantize --imatrix`, as llama-imatrix makes one.

stderr: the progress, chunk by chunk, and what was written.
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Annotated, Optional

import typer

from pyllm.errors import InvalidArgumentError

from .common import err, handle_errors, model_path, read_input
from .options import ModelOpt, Threads


def imatrix(
    file: Annotated[Optional[str], typer.Option("-f", "--file", help="the calibration text (else stdin): text "
                                                "like what the model will read")] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="the importance matrix file to write "
                                        "(llama.cpp's imatrix GGUF)")] = "imatrix.gguf",
    model: ModelOpt = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", help="tokens per chunk (llama-imatrix's "
                                          "default)")] = 512,
    chunks: Annotated[int, typer.Option("--chunks", help="use at most this many chunks (-1 = all)")] = -1,
    in_file: Annotated[list[str], typer.Option(
        "--in-file", help="an importance matrix to add this one's statistics to (repeatable; without -f and "
        "stdin, the files are only combined)")] = [],
    chunk: Annotated[int, typer.Option("--chunk", "--from-chunk", help="skip this many chunks of the text "
                                       "first")] = 0,
    parse_special: Annotated[bool, typer.Option("--parse-special", help="special-token text in the file "
                                                "(<|im_start|>, ...) becomes its token")] = False,
    output_frequency: Annotated[int, typer.Option("-ofreq", "--output-frequency", help="write the matrix so far "
                                                  "to -o every this many chunks (0: only at the end)")] = 10,
    save_frequency: Annotated[int, typer.Option("--save-frequency", help="also keep a copy every this many chunks "
                                                "(OUTPUT's name with .at_N chunks; 0: none)")] = 0,
    threads: Threads = None,
) -> None:
    """Compute an importance matrix (llama-imatrix's) for quantizing with --imatrix, or combine several."""
    with handle_errors():
        if chunks == 0 or chunks < -1:
            raise InvalidArgumentError(f"--chunks must be at least 1 (or -1 for all), not {chunks}")
        if min(chunk, output_frequency, save_frequency) < 0:
            raise InvalidArgumentError("--chunk, --output-frequency and --save-frequency take 0 or more")
        if os.path.isdir(output):
            raise InvalidArgumentError(f"{output} is a folder: give the output file's path")
        from pyllm.backend.cpu import physical_cores
        from pyllm.imatrix import Imatrix, compute
        from pyllm.model_file import ModelFile

        t0 = time.perf_counter()
        combined = None
        for f in in_file:
            im = Imatrix.load(f)
            combined = im if combined is None else combined.add(im)
        piped = sys.stdin is not None and not sys.stdin.isatty()
        text = read_input(file, "file", "no text: give -f FILE or pipe the text in") \
            if file is not None or piped or combined is None else ""
        if combined is not None and not text.strip():   # nothing to compute: the files combined
            combined.save(output, combined.architecture or "llama")
            err.print(f"{output}: {len(combined.sums)} matrices, {combined.chunks} chunks, from {len(in_file)} "
                      f"files", highlight=False, soft_wrap=True)
            return
        path = model_path(model)

        def progress(i: int, n: int) -> None:
            err.print(f"[{i + 1}/{n}] {(i + 1) * ctx_size} tokens, {time.perf_counter() - t0:.1f} s",
                      highlight=False)
        with ModelFile(path) as mf:
            architecture = mf.architecture

        def save(partial) -> None:   # the matrix so far (llama-imatrix's --output-frequency, --save-frequency)
            whole = partial if combined is None else combined.add(partial)
            if output_frequency and partial.chunks % output_frequency == 0:
                whole.save(output, architecture)
            if save_frequency and partial.chunks % save_frequency == 0:
                stem, ext = os.path.splitext(output)
                whole.save(f"{stem}.at_{partial.chunks}{ext or '.gguf'}", architecture)
        im = compute(path, text, n_ctx=ctx_size, n_threads=threads or physical_cores(),
                     max_chunks=None if chunks < 0 else chunks,
                     dataset=os.path.basename(file) if file else "stdin", on_chunk=progress, first_chunk=chunk,
                     parse_special=parse_special, snapshot_every=math.gcd(output_frequency, save_frequency),
                     on_snapshot=save)
        if combined is not None:
            im = combined.add(im)
        im.save(output, architecture)
        err.print(f"{output}: {len(im.sums)} matrices, {im.chunks} chunks of {im.chunk_size} tokens, "
                  f"in {time.perf_counter() - t0:.1f} s", highlight=False, soft_wrap=True)
