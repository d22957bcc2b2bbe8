"""`pyllm cvector-generator`: a control vector from pairs of contrasting prompts
(llama.cpp's llama-cvector-generator; pyllm.cvector)."""
from __future__ import annotations

from typing import Annotated

import typer

from pyllm.errors import InvalidArgumentError

from .common import err, handle_errors, model_path, process_escapes
from .options import ModelOpt, Threads


def read_prompts(path: str, what: str) -> list[str]:
    """One prompt per non-empty line, with \\n, \\t ... read as the characters (as llama.cpp)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [process_escapes(line.rstrip("\r\n")) for line in f if line.rstrip("\r\n")]
    except OSError as e:
        raise InvalidArgumentError(f"cannot read the {what} prompts {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"the {what} prompts {path} are not UTF-8 text") from None


def cvector_generator(
    positive_file: Annotated[str, typer.Option("--positive-file", help="prompts showing the behaviour to "
                                               "steer towards, one per line")],
    negative_file: Annotated[str, typer.Option("--negative-file", help="their counterparts, line by line")],
    model: ModelOpt = None,
    output: Annotated[str, typer.Option("-o", "--output", help="the control vector file to write")] =
    "control_vector.gguf",
    method: Annotated[str, typer.Option("--method", help="pca (the differences' first principal axis) or mean "
                                        "(their mean)")] = "pca",
    threads: Threads = None,
) -> None:
    """Make a control vector (for --control-vector) from pairs of contrasting prompts
    (llama-cvector-generator)."""
    with handle_errors():
        from pyllm.cvector import check, generate, write

        positive, negative = read_prompts(positive_file, "positive"), read_prompts(negative_file, "negative")
        check(positive, negative, method)
        path = model_path(model)
        err.print(f"cvector-generator: {len(positive)} prompt pairs, method {method}", soft_wrap=True)

        def progress(i: int, n: int) -> None:
            err.print(f"\rrunning prompt {i + 1}/{n}", end="", soft_wrap=True)
        directions, architecture = generate(path, positive, negative, method, threads, progress)
        err.print()
        write(output, directions, architecture)
        err.print(f"wrote {len(directions)} directions (direction.1..{max(directions)}) to {output}", soft_wrap=True)
