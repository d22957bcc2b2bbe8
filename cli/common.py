"""What every command shares: opening a model, reporting errors."""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import os
import re
import sys
import typing
from typing import Any, Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.text import Text

from pyllm import registry
from pyllm.errors import InvalidArgumentError, PyllmError

err = Console(stderr=True, highlight=False)

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class _StderrHandler(logging.Handler):
    """pyllm's log messages (warnings, notes) as one line each on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        label, style = ("warning: ", "yellow") if record.levelno >= logging.WARNING else ("note: ", "cyan")
        err.print(Text.assemble((label, style), record.getMessage()), soft_wrap=True)


def _setup_logging() -> None:
    log = logging.getLogger("pyllm")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        log.addHandler(_StderrHandler())
        log.setLevel(logging.INFO)
        log.propagate = False


@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """One line on stderr and exit code 2 for our errors, 130 for Ctrl-C."""
    _setup_logging()
    try:
        yield
    except PyllmError as e:
        err.print(Text.assemble(("error: ", "red"), str(e)), soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        # the reader went away (`pyllm run ... | head`): not an error of ours; point
        # stdout at /dev/null so the interpreter's last flush does not complain
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        raise typer.Exit(0)


def read_input(file: Optional[str], what: str, missing: str) -> str:
    """The text of `file`, else of stdin; InvalidArgumentError `missing` when stdin is a terminal.
    Bytes that are not UTF-8 stay as surrogate escapes (as in argv): the tokenizer turns them
    into U+FFFD, as llama.cpp does, with a warning."""
    if file is not None:
        try:
            with open(file, encoding="utf-8", errors="surrogateescape") as f:
                return f.read()
        except OSError as e:
            raise InvalidArgumentError(f"cannot read the {what} {file}: {e.strerror}") from None
    if sys.stdin is None or sys.stdin.isatty():
        raise InvalidArgumentError(missing)
    stdin = getattr(sys.stdin, "buffer", None)
    return stdin.read().decode("utf-8", "surrogateescape") if stdin is not None else sys.stdin.read()


def model_path(model: Optional[str], quiet: bool = False) -> str:
    """A registry name, created model (pyllm create) or path -> a local file, pulling a
    registry model if missing."""
    if model is None:
        model = registry.DEFAULT_MODEL
        if not quiet:
            err.print(f"using the default model, {model} (choose another with -m)")
    created = created_model(model)
    if created is not None:
        model = created.source
    if model in registry.MODELS and not registry.local_path(model).is_file():
        pull(model, quiet)
    return str(registry.resolve(model))


def created_model(model: Optional[str]):
    """The created model (pyllm.created) `model` names, with what it inherits; None
    for a registry name, a file, or no such model."""
    from pyllm import created
    if model is None or model in registry.MODELS or not created.NAME.fullmatch(model):
        return None
    return created.resolved(model)


# a created model's PARAMETER -> the option of run / chat / serve it is the default of
CREATED_OPTIONS = {
    "temperature": "temp", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "typical_p": "typical_p",
    "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "seed": "seed", "num_predict": "n_predict", "num_ctx": "ctx_size",
    "stop": "stop", "mirostat": "mirostat", "mirostat_eta": "mirostat_lr", "mirostat_tau": "mirostat_ent",
    "num_thread": "threads", "num_gpu": "n_gpu_layers",
}
CREATED: contextvars.ContextVar = contextvars.ContextVar("created_model", default=None)


def created_messages() -> list[dict[str, str]]:
    """The conversation the running command's created model starts from (its MESSAGE lines)."""
    model = CREATED.get()
    return list(model.messages) if model is not None else []


def with_created_defaults(command: Callable[..., None]) -> Callable[..., None]:
    """The command, where -m names a created model, with that model's PARAMETERs,
    SYSTEM, TEMPLATE and ADAPTERs as the defaults of the options not given on the
    command line (its MESSAGEs through created_messages())."""
    @functools.wraps(command)
    def wrapper(ctx: typer.Context, **kwargs: Any) -> None:
        with handle_errors():
            created = created_model(kwargs.get("model") or kwargs.get("model_arg"))
        if created is not None:
            def unset(option: str) -> bool:
                source = ctx.get_parameter_source(option)
                return option in kwargs and getattr(source, "name", "DEFAULT") in ("DEFAULT", "DEFAULT_MAP")
            for key, value in created.parameters.items():
                option = CREATED_OPTIONS[key]
                if unset(option):
                    kwargs[option] = str(value) if option == "n_gpu_layers" else value
            chatting = kwargs.get("chat", True) or kwargs.get("model_arg") is not None   # `run NAME` chats
            if created.system is not None and unset("system") and chatting:
                kwargs["system"] = created.system
            if created.template is not None and unset("chat_template"):
                kwargs["chat_template"] = created.template
            if created.adapters and "lora" in kwargs:
                kwargs["lora"] = created.adapters + list(kwargs["lora"])
        token = CREATED.set(created)
        try:
            command(**kwargs)
        finally:
            CREATED.reset(token)

    # typer reads the options from the signature: the command's, and the context
    signature = inspect.signature(command, eval_str=True)
    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    wrapper.__signature__ = signature.replace(parameters=[context, *signature.parameters.values()])
    wrapper.__annotations__ = {"ctx": typer.Context, **typing.get_type_hints(command, include_extras=True)}
    return wrapper


def pull(name: str, quiet: bool = False) -> str:
    """Fetches a registry model with a progress display on stderr."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn, TransferSpeedColumn)

    if name not in registry.MODELS:
        return str(registry.fetch(name))          # raises the not-in-registry error
    if quiet:
        return str(registry.fetch(name))
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeElapsedColumn(), console=err, transient=True) as progress:
        task = progress.add_task(f"pulling {name}", total=None)
        current = [""]

        def report(stage: str, done: int, total: Optional[int]) -> None:
            if stage != current[0]:           # a new stage: a fresh bar (and speed) for it
                current[0] = stage
                progress.reset(task, description=f"{name}: {stage}", total=total, completed=done)
            else:
                progress.update(task, completed=done, total=total)

        path = registry.fetch(name, report)
    err.print(f"{name} is at {path}")
    return str(path)


_ESCAPES = {ord(k): v for k, v in {"n": b"\n", "r": b"\r", "t": b"\t", "'": b"'", '"': b'"', "\\": b"\\",
                                    "0": b"\0", "a": b"\a", "b": b"\b", "f": b"\f", "v": b"\v", "?": b"?"}.items()}
_HEX = b"0123456789abcdefABCDEF"


def process_escapes(text: str) -> str:
    """\\n, \\t, \\xNN (a byte: \\xe2\\x82\\xac is the euro sign) ... in a command-line text made into
    what they stand for, as llama.cpp's -e/--escape (on by default there) does; any other
    backslash stays as it is."""
    raw = text.encode("utf-8", "surrogateescape")
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i] == 0x5C and i + 1 < len(raw):   # a backslash
            nxt, hexd = raw[i + 1], raw[i + 2:i + 4]
            if nxt in _ESCAPES:
                out += _ESCAPES[nxt]
                i += 2
                continue
            if nxt == ord("x") and len(hexd) == 2 and all(c in _HEX for c in hexd):
                out.append(int(hexd, 16))
                i += 4
                continue
        out.append(raw[i])
        i += 1
    return out.decode("utf-8", "surrogateescape")


def media_file(path: str, what: str = "image") -> bytes:
    """An image or sound file (--image, --audio, /image)'s bytes (a missing file is named as such,
    not taken for base64)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgumentError(f"cannot read the {what} {path}: {e.strerror}") from None


def image_file(path: str) -> bytes:
    return media_file(path, "image")


IMAGE_PATH = re.compile(r"""(?:'([^']+\.(?:png|jpe?g|webp|gif|bmp))'|"([^"]+\.(?:png|jpe?g|webp|gif|bmp))"|"""
                        r"""((?:[^\s'"\\]|\\ )+\.(?:png|jpe?g|webp|gif|bmp)))(?=\s|$)""", re.IGNORECASE)


def images_in(text: str) -> tuple[str, list[bytes]]:
    """ollama's way: paths of image files written in a message (quoted, or with \\-escaped
    spaces) are the images it shows; they leave the text. Paths that are no files stay text."""
    found: list[bytes] = []

    def take(m: re.Match) -> str:
        path = os.path.expanduser((m.group(1) or m.group(2) or m.group(3)).replace("\\ ", " "))
        if not os.path.isfile(path):
            return m.group(0)
        found.append(image_file(path))
        return ""
    rest = IMAGE_PATH.sub(take, text)
    return (re.sub(r"[ \t]{2,}", " ", rest).strip() if found else text), found
