"""`pyllm serve`: one model behind OpenAI's HTTP API (pyllm/server.py), until Ctrl-C."""
from __future__ import annotations

import contextlib
import os
from typing import Annotated, Optional

import typer

from pyllm.errors import InvalidArgumentError

from .common import created_model, err, handle_errors, model_path
from .options import ImageMaxTokensOpt, ImageMinTokensOpt, MlockOpt, MmprojOpt, NoMmapOpt, NoRepackOpt
from .options import OverrideKvOpt, file_kwargs
from .options import RopeFreqBaseOpt, RopeFreqScaleOpt, RopeScaleOpt, RopeScalingOpt, YarnOrigCtxOpt
from .options import CacheTypeK, CacheTypeV, CtxSize, ModelOpt, NGpuLayers, TemplateOpt, Think, Threads, template_arg
from .options import TemplateKwargsOpt, template_kwargs
from .options import (ControlLayerRangeOpt, ControlVectorOpt, ControlVectorScaledOpt, LoraOpt, LoraScaledOpt,
                      control_kwargs, lora_specs)
from .options import (ModelDraft, SpecDraftMax, SpecDraftMin, SpecNgramSize, SpecPMin, SpecType,
                      speculative_kwargs)


def registry_name(model: Optional[str]) -> Optional[str]:
    """The name clients see: the registry's or the created model's, else (None) the file's stem."""
    from pyllm import registry
    if model is None:
        return registry.DEFAULT_MODEL
    return model if model in registry.MODELS or created_model(model) is not None else None


def api_keys_of(keys: Optional[str], file: Optional[str]) -> list[str]:
    """--api-key's comma-separated keys and --api-key-file's lines (blank ones skipped)."""
    found = [k.strip() for k in (keys or "").split(",") if k.strip()]
    if file is not None:
        try:
            with open(file, encoding="utf-8") as f:
                found += [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise InvalidArgumentError(f"cannot read the API key file {file}: {e.strerror}") from None
        if not found:
            raise InvalidArgumentError(f"the API key file {file} holds no key")
    return found


def serve(
    model: ModelOpt = None,
    no_mmap: NoMmapOpt = False,
    no_repack: NoRepackOpt = False,
    mlock: MlockOpt = False,
    override_kv: OverrideKvOpt = [],
    rope_scaling: RopeScalingOpt = None,
    rope_scale: RopeScaleOpt = None,
    rope_freq_base: RopeFreqBaseOpt = None,
    rope_freq_scale: RopeFreqScaleOpt = None,
    yarn_orig_ctx: YarnOrigCtxOpt = None,
    host: Annotated[str, typer.Option("--host", envvar="PYLLM_HOST", help="address to listen on (0.0.0.0: every "
                                      "interface; give it an --api-key there)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", envvar="PYLLM_PORT", help="port to listen on (0: any free "
                                      "one)")] = 8080,
    alias: Annotated[Optional[str], typer.Option("-a", "--alias", help="the model's name in replies and "
                                                 "/v1/models (llama-server's; default: its registry name or file "
                                                 "name)")] = None,
    embedding: Annotated[bool, typer.Option("--embedding", "--embeddings", help="load the model for "
                                            "/v1/embeddings instead of generation (an encoder such as BERT always "
                                            "is)")] = False,
    reranking: Annotated[bool, typer.Option("--reranking", "--rerank", help="serve /v1/rerank (llama-server's "
                                            "flag: a reranker's file says so itself; this checks it does)")] = False,
    pooling: Annotated[Optional[str], typer.Option("--pooling", help="with --embedding: mean, cls or last "
                                                   "(default: as the model file says)")] = None,
    chat_template: TemplateOpt = None,
    chat_template_kwargs: TemplateKwargsOpt = None,
    think: Think = None,
    threads: Threads = None,
    ctx_size: CtxSize = None,
    n_gpu_layers: NGpuLayers = "auto",
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
    mmproj: MmprojOpt = None,
    image_min_tokens: ImageMinTokensOpt = None,
    image_max_tokens: ImageMaxTokensOpt = None,
    lora: LoraOpt = [],
    lora_scaled: LoraScaledOpt = [],
    control_vector: ControlVectorOpt = [],
    control_vector_scaled: ControlVectorScaledOpt = [],
    control_vector_layer_range: ControlLayerRangeOpt = None,
    spec_type: SpecType = None,
    model_draft: ModelDraft = None,
    spec_draft_max: SpecDraftMax = 16,
    spec_draft_min: SpecDraftMin = 0,
    spec_ngram_size: SpecNgramSize = 6,
    spec_p_min: SpecPMin = 0.75,
    keep_alive: Annotated[Optional[str], typer.Option(
        "--keep-alive", help="how long an idle model stays loaded (5m, 1h, 30s; -1: for ever); default 5m "
        "without -m (ollama's), for ever with -m (llama-server's); a request's keep_alive overrides it")] = None,
    metrics: Annotated[bool, typer.Option("--metrics", help="serve GET /metrics (Prometheus' format, "
                                          "llama-server's counters)")] = False,
    slot_save_path: Annotated[Optional[str], typer.Option(
        "--slot-save-path", help="a folder for POST /slots/ID?action=save|restore (a conversation's KV cache, "
        "llama-server's)")] = None,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="PYLLM_API_KEY", help="requests must carry this key (Authorization: Bearer KEY); "
        "several: comma-separated (llama-server's --api-key)")] = None,
    ssl_key_file: Annotated[Optional[str], typer.Option(
        "--ssl-key-file", help="serve HTTPS: the private key (PEM), with --ssl-cert-file")] = None,
    ssl_cert_file: Annotated[Optional[str], typer.Option(
        "--ssl-cert-file", help="serve HTTPS: the certificate (PEM), with --ssl-key-file")] = None,
    api_key_file: Annotated[Optional[str], typer.Option(
        "--api-key-file", help="a file of API keys, one per line (keeps them out of the process list)")] = None,
    no_prefill_assistant: Annotated[bool, typer.Option(
        "--no-prefill-assistant", help="a chat request's last message from the assistant is a whole turn, not "
        "the start of the reply (llama-server's)")] = False,
    origins: Annotated[Optional[str], typer.Option(
        "--origins", envvar="PYLLM_ORIGINS", help="web pages of these origins may call the server, besides its "
        "own and localhost's (comma-separated; patterns such as chrome-extension://*; * for any: ollama's "
        "OLLAMA_ORIGINS); other sites' requests are refused")] = None,
    no_webui: Annotated[bool, typer.Option(
        "--no-webui", help="serve no chat page at / (the API only)")] = False,
    parallel: Annotated[Optional[int], typer.Option(
        "--parallel", "-np", help="requests run at once, their decode steps batched; more wait for a slot "
        "(default 4, or 1 where steps cannot hold several sequences: recurrent models, GPU offload). "
        "They share the context's KV cache (-c)")] = None,
) -> None:
    """Serve a model over HTTP with OpenAI's API: /v1/chat/completions, /v1/completions, /v1/embeddings."""
    with handle_errors():
        if not 0 <= port <= 65535:
            raise InvalidArgumentError(f"--port must be in 0..65535, not {port}")
        if slot_save_path is not None and not os.path.isdir(slot_save_path):
            raise InvalidArgumentError(f"--slot-save-path {slot_save_path}: no such folder")
        if pooling is not None and pooling not in ("mean", "cls", "last"):
            raise InvalidArgumentError(f"--pooling must be mean, cls or last, not {pooling!r}")
        from pyllm import Model
        from pyllm.model_host import keep_alive_seconds
        from pyllm.server import make_server

        idle_s = None if keep_alive is None else keep_alive_seconds(keep_alive)
        api_keys = api_keys_of(api_key, api_key_file)
        if (ssl_key_file is None) != (ssl_cert_file is None):
            raise InvalidArgumentError("HTTPS needs both --ssl-key-file and --ssl-cert-file")
        tls = None if ssl_cert_file is None else (ssl_cert_file, ssl_key_file)
        reading = file_kwargs(no_mmap, mlock, override_kv, rope_scaling, rope_scale, rope_freq_base, rope_freq_scale,
                              yarn_orig_ctx, no_repack)

        path = model_path(model)

        def load(file, created=None):
            """The model at file; a created model's (a request named it) with its context,
            template and adapters where the command line sets none."""
            made = created.parameters if created is not None else {}
            template = chat_template if chat_template is not None or created is None else created.template
            m = Model(file, n_ctx=made.get("num_ctx") if ctx_size is None else ctx_size, n_threads=threads,
                      chat_template=template_arg(template), **reading,
                      chat_template_kwargs=template_kwargs(chat_template_kwargs),
                      n_gpu_layers=n_gpu_layers, cache_type_k=cache_type_k,
                      cache_type_v=cache_type_v, think=think, embedding=True if embedding else None,
                      lora=lora_specs((created.adapters if created is not None else []) + lora, lora_scaled),
                      mmproj=mmproj if file == path else None,   # the -m model's projector
                      image_min_tokens=image_min_tokens, image_max_tokens=image_max_tokens,
                      **control_kwargs(control_vector, control_vector_scaled, control_vector_layer_range),
                      **speculative_kwargs(spec_type, model_draft, spec_draft_max, spec_draft_min, spec_ngram_size,
                                           spec_p_min))
            if pooling is not None:
                m.pooling = pooling
            if reranking and m.pooling != "rank":
                m.close()
                raise InvalidArgumentError(f"{m.path.name} is not a reranker (its file does not rank): serve a "
                                           f"cross-encoder such as bge-reranker-v2-m3, or Qwen3-Reranker")
            return m

        # without -m, a request may name any model on disk (ollama's way); with -m, this one answers
        switching = (model is None and model_draft is None and not (lora or lora_scaled)
                     and not (control_vector or control_vector_scaled or reading["override_kv"]))
        with load(path) as m:
            try:
                server = make_server(m, host, port, name=alias or registry_name(model), parallel=parallel,
                                     load=load if switching else None, slot_save_path=slot_save_path,
                                     metrics=metrics, keep_alive=idle_s, api_keys=api_keys, tls=tls,
                                     prefill_assistant=not no_prefill_assistant, webui=not no_webui,
                                     origins=[o.strip() for o in (origins or "").split(",") if o.strip()])
            except OSError as e:
                raise InvalidArgumentError(f"cannot listen on {host}:{port}: {e.strerror}") from None
            with server, contextlib.closing(server.host):   # the model loaded last, which may not be m
                what = "reranking" if m.pooling == "rank" else "embeddings" if m.embedding else "chat and completions"
                slots = f", {len(server.slots)} requests at once" if len(server.slots) > 1 else ""
                others = ", others loaded when asked for" if switching else ""
                others += f", {len(api_keys)} API key{'s' if len(api_keys) > 1 else ''}" if api_keys else ""
                err.print(f"pyllm serve · {server.name} ({what}, context {m.n_ctx}{slots}{others}) · listening on {server.url} "
                          f"(OpenAI API under /v1{'' if no_webui or m.embedding else ', a chat page at /'}) · "
                          f"Ctrl-C to stop", highlight=False, soft_wrap=True)
                server.serve_forever()
