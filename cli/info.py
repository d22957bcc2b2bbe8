"""`pyllm info`: what a model is and what running it takes."""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from .common import handle_errors, model_path
from .options import CacheTypeK, CacheTypeV, OverrideKvOpt, overrides_of


def info(
    model_arg: Optional[str] = typer.Argument(None, metavar="MODEL", help="the model (ollama's `show NAME` "
                                              "way; or -m)"),
    model: Optional[str] = typer.Option(None, "-m", "--model",
                                        help="model: a registry name (see `pyllm list`) or a path to a .gguf file"),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size",
                                           help="context length to size the KV cache for (default: the "
                                                "training context, at most 4096)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
    override_kv: OverrideKvOpt = [],
    show_modelfile: bool = typer.Option(False, "--modelfile", help="a created model (pyllm create): print "
                                        "the Modelfile it was made from"),
) -> None:
    """Show a model's architecture, parameters, tensor types, context, RoPE,
    vocabulary, chat template and the memory it needs."""
    with handle_errors():
        from pyllm.errors import InvalidArgumentError
        from pyllm.info import model_info

        from .common import created_model
        if model_arg is not None and model is not None and model_arg != model:
            raise InvalidArgumentError(f"two models given: {model_arg} and -m {model}; give one")
        model = model if model is not None else model_arg
        created = created_model(model)
        if show_modelfile:
            if created is None:
                raise InvalidArgumentError(f"{model or 'the default model'} is not a created model (pyllm create): "
                                           f"it has no Modelfile")
            sys.stdout.write(created.modelfile if created.modelfile.endswith("\n") else created.modelfile + "\n")
            return
        if ctx_size is not None and ctx_size < 1:
            raise InvalidArgumentError(f"the context size must be positive, not {ctx_size}")
        from pyllm.api import kv_type
        path = model_path(model)
        if is_projector(path):   # an mmproj file: its encoder, not a model
            from pyllm.audio import open_audio_encoder
            from pyllm.vision import VisionEncoder, modalities
            has = modalities(path)
            facts = {}
            for there, kind, name in zip(has, (VisionEncoder, open_audio_encoder), ("vision", "audio")):
                if there:   # a file of both: each encoder's facts under its name
                    enc = kind(path)
                    facts.update({(f"{name} {k}" if all(has) else k): v for k, v in enc.describe().items()})
                    enc.close()
            if as_json:
                sys.stdout.write(json.dumps(facts) + "\n")
            else:
                width = max(15, max(len(k) for k in facts) + 2)    # "audio n_embd_out" and such in a file of both
                for key, value in facts.items():
                    print(f"{key:<{width}}{value}")
                print(f"{'use':<{width}}beside its language model: --mmproj {path}")
            return
        report = model_info(path, n_ctx=ctx_size, k_type=kv_type(cache_type_k, "--cache-type-k"),
                            v_type=kv_type(cache_type_v, "--cache-type-v"), overrides=overrides_of(override_kv))
        if as_json:
            out = report.as_dict()
            if created is not None:
                out["created"] = {"name": created.name, "from": created.source, "parameters": created.parameters,
                                  "system": created.system, "adapters": created.adapters,
                                  "messages": len(created.messages), "template": created.template is not None}
            json.dump(out, sys.stdout)
            sys.stdout.write("\n")
        else:
            if created is not None:   # ollama's show: the defaults a created model runs with
                from pyllm.created import parameters_text
                print(f"{'created':<15}{created.name} FROM {created.source}")
                for line in parameters_text(created.parameters).splitlines():
                    print(f"{'  parameter':<15}{line}")
                if created.system is not None:
                    print(f"{'  system':<15}{created.system!r}")
                for a in created.adapters:
                    print(f"{'  adapter':<15}{a}")
                if created.messages or created.template:
                    print(f"{'  chat':<15}{len(created.messages)} messages to start from" +
                          (", its own template" if created.template else ""))
            print(report.format())


def is_projector(path: str) -> bool:
    """Whether the file at path is a multimodal projector (general.architecture clip)."""
    from pyllm.model_file import ModelFile
    with ModelFile(path) as mf:
        return mf.architecture == "clip"
