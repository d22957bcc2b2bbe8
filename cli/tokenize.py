"""`pyllm tokenize`: a text's tokens under a model's vocabulary, as llama.cpp's
llama-tokenize prints them. Only the vocabulary is read, not the weights.

stdout: a line per token, `    ID -> 'PIECE'` (the piece's bytes as they are),
or with --ids one list of the ids, [1, 2, 3]; --show-count adds the total.
"""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from pyllm.errors import InvalidArgumentError

from .common import handle_errors, model_path, read_input
from .options import ModelOpt, OverrideKvOpt, overrides_of


def tokenize(
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="the text (else -f, else stdin)")] = None,
    file: Annotated[Optional[str], typer.Option("-f", "--file", help="tokenize this file's text")] = None,
    model: ModelOpt = None,
    ids: Annotated[bool, typer.Option("--ids", help="print only the ids, as one list: [1, 2, 3]")] = False,
    no_bos: Annotated[bool, typer.Option("--no-bos", help="no beginning-of-text token, even where the model "
                                         "adds one")] = False,
    no_parse_special: Annotated[bool, typer.Option(
        "--no-parse-special", help="read special-token text such as <|im_start|> as plain text")] = False,
    show_count: Annotated[bool, typer.Option("--show-count", help="also print the number of tokens")] = False,
    override_kv: OverrideKvOpt = [],
) -> None:
    """Print a text's tokens (llama-tokenize)."""
    with handle_errors():
        from pyllm.model_file import ModelFile
        from pyllm.tokenizer import load_tokenizer
        if prompt is not None and file is not None:
            raise InvalidArgumentError("give the text with -p or -f, not both")
        text = prompt if prompt is not None else read_input(
            file, "file", "no text: give -p TEXT, -f FILE, or pipe the text in")
        with ModelFile(model_path(model, quiet=True), overrides=overrides_of(override_kv)) as mf:
            tok = load_tokenizer(mf.metadata)
        tokens = tok.encode(text, add_bos=False if no_bos else None, parse_special=not no_parse_special)
        out = sys.stdout.buffer
        if ids:
            out.write(f"[{', '.join(map(str, tokens))}]\n".encode())
        else:
            for t in tokens:
                out.write(f"{t:6d} -> '".encode() + tok.token_to_piece(t) + b"'\n")
        if show_count:
            out.write(f"Total number of tokens: {len(tokens)}\n".encode())
        out.flush()
