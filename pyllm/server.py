"""An HTTP server for one model, speaking OpenAI's API (as llama-server and ollama do): `pyllm serve`.

    POST /v1/chat/completions   messages -> the assistant's reply (stream: server-sent events)
    POST /v1/completions        prompt -> its continuation, raw text (no chat template)
    POST /v1/embeddings         input (a text or a list of them) -> vectors (an embedding model)
    GET  /v1/models             the one model
    GET  /health                {"status": "ok"}

One model and one KV cache: requests run one at a time (a lock; /health answers
meanwhile), and a chat that resends its history reuses the cache of the turns
before, as `pyllm chat` does. Sampling takes OpenAI's fields (temperature,
top_p, max_tokens, stop, seed, presence/frequency_penalty, logit_bias) and
llama.cpp's (top_k, min_p, typical_p, repeat_penalty); unset ones keep
llama.cpp's defaults. A reasoning model's thinking comes apart from the answer,
as `reasoning_content` (llama-server's and DeepSeek's field). A client that
goes away mid-stream stops its reply. Errors are OpenAI's
{"error": {"message", "type", "code"}}: 400 for a bad request, 404, 405, 413,
500 when the model fails.

    from pyllm import Model
    from pyllm.server import make_server
    with Model() as m:
        make_server(m, "127.0.0.1", 8080).serve_forever()
"""
from __future__ import annotations

import base64
import json
import logging
import threading
import time
import traceback
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, Optional

import numpy as np

from .errors import ContextFullError, InvalidArgumentError, PyllmError, TemplateError

log = logging.getLogger("pyllm")

MAX_BODY = 32 << 20     # bytes of one request body
FINISH = {"stop": "stop", "length": "length", "context": "length", "interrupted": "stop"}
# request field -> Model sampling keyword (OpenAI's names, then llama.cpp's extras)
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
            "typical_p": "typical_p", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed"}


class RequestError(Exception):
    """A request the server refuses: its HTTP status, OpenAI error type and message."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model, address: tuple[str, int], name: Optional[str] = None):
        super().__init__(address, Handler)
        self.model = model
        self.name = name or model.path.stem
        self.lock = threading.Lock()      # one request at a time through the model
        self.created = int(time.time())

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def make_server(model, host: str = "127.0.0.1", port: int = 8080, name: Optional[str] = None) -> Server:
    """A server for `model` (a pyllm.Model) bound to host:port (0: any free port; see .url)."""
    return Server(model, (host, port), name)


# -- requests -> Model calls ----------------------------------------------------------------------

def sampling_of(body: dict) -> dict:
    """Model sampling keywords from a request's fields."""
    out = {}
    for field, key in SAMPLING.items():
        if body.get(field) is not None:
            out[key] = body[field]
    bias = body.get("logit_bias")
    if bias:
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
    """The request's messages, each content as text (OpenAI's list of text parts joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {role, content} objects")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidArgumentError("each message must be an object with a role and a content")
        content = m.get("content")
        if isinstance(content, list):   # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise InvalidArgumentError("message content parts other than text are not supported")
            content = "".join(p["text"] for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise InvalidArgumentError("a message's content must be text")
        out.append({**m, "content": content})
    return out


def one_choice(body: dict) -> None:
    if body.get("n", 1) != 1:
        raise InvalidArgumentError("n > 1 is not supported: ask once per reply")


# -- the handler ----------------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args) -> None:   # one line per request, through pyllm's logger
        log.debug("%s %s", self.address_string(), fmt % args)

    # -- routing ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route({"/health": self.health, "/v1/models": self.models}, {"/v1/chat/completions", "/v1/completions",
                                                                        "/v1/embeddings"})

    def do_POST(self) -> None:
        self._route({"/v1/chat/completions": self.chat, "/v1/completions": self.completions,
                     "/v1/embeddings": self.embeddings}, {"/health", "/v1/models"})

    def _route(self, routes: dict, other_method: set) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        t0 = time.perf_counter()
        try:
            if path in routes:
                routes[path]()
            elif path in other_method:
                raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not allowed on {path}")
            else:
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path} (see /v1/models, "
                                   f"/v1/chat/completions, /v1/completions, /v1/embeddings, /health)")
        except RequestError as e:
            self.send_json(e.status, {"error": {"message": str(e), "type": e.kind, "code": e.status}})
        except (InvalidArgumentError, ContextFullError, TemplateError) as e:
            self.send_json(HTTPStatus.BAD_REQUEST, {"error": {"message": str(e), "type": "invalid_request_error",
                                                              "code": 400}})
        except (BrokenPipeError, ConnectionResetError):
            pass   # the client went away
        except Exception as e:   # the model failed (PyllmError) or a bug: the server goes on
            if not isinstance(e, PyllmError):
                log.error("internal error on %s %s:\n%s", self.command, path, traceback.format_exc())
            self.send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {"message": str(e) or type(e).__name__,
                                                                        "type": "server_error", "code": 500}})
        log.info("%s %s %.2f s", self.command, path, time.perf_counter() - t0)

    # -- plumbing ---------------------------------------------------------------------------------
    def read_json(self) -> dict:
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
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        return body

    def send_json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_events(self, events: Iterator[dict]) -> None:
        """Server-sent events, one `data: JSON` each, then `data: [DONE]`; the connection closes after."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for event in events:
            self.wfile.write(b"data: " + json.dumps(event, ensure_ascii=False).encode("utf-8") + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def envelope(self, kind: str, prefix: str) -> dict:
        return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
                "model": self.server.name}

    # -- endpoints --------------------------------------------------------------------------------
    def health(self) -> None:
        self.send_json(HTTPStatus.OK, {"status": "ok"})

    def models(self) -> None:
        self.send_json(HTTPStatus.OK, {"object": "list", "data": [
            {"id": self.server.name, "object": "model", "created": self.server.created, "owned_by": "pyllm"}]})

    def chat(self) -> None:
        body = self.read_json()
        one_choice(body)
        messages, sampling, max_tokens = messages_of(body), sampling_of(body), max_tokens_of(body)
        m = self.server.model
        with self.server.lock:
            m.require_generation()
            stream = m.chat(messages, max_tokens=max_tokens, stop=body.get("stop"), stream=True, **sampling)
            head = self.envelope("chat.completion.chunk" if body.get("stream") else "chat.completion", "chatcmpl")
            if body.get("stream"):
                self._stream(stream, stream.parts(), stream.close, head, lambda kind, text: {
                    "delta": {"reasoning_content" if kind == "thinking" else "content": text}},
                    {"delta": {"role": "assistant", "content": ""}})
                return
            c = stream.run()
            thinking, answer = stream.reasoning()
            message = {"role": "assistant", "content": answer}
            if thinking:
                message["reasoning_content"] = thinking
            self.send_json(HTTPStatus.OK, {**head, "choices": [
                {"index": 0, "message": message, "finish_reason": FINISH[c.finish_reason]}], **usage(c)})

    def completions(self) -> None:
        body = self.read_json()
        one_choice(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))):
            raise InvalidArgumentError("prompt must be a text or a list of token ids (one prompt per request)")
        sampling, max_tokens = sampling_of(body), max_tokens_of(body)
        m = self.server.model
        with self.server.lock:
            m.require_generation()
            if isinstance(prompt, str) and not prompt:
                raise InvalidArgumentError("the prompt is empty")
            if not ({"max_tokens", "max_completion_tokens"} & set(body)):
                max_tokens = 16   # OpenAI's default for completions
            gen = m.stream(prompt, max_tokens=max_tokens, stop=body.get("stop"), **sampling)
            head = self.envelope("text_completion", "cmpl")
            if body.get("stream"):
                pieces = iter(gen)
                self._stream(gen, ((None, piece) for piece in pieces), pieces.close, head,
                             lambda kind, text: {"text": text, "logprobs": None})
                return
            c = gen.run()
            self.send_json(HTTPStatus.OK, {**head, "choices": [
                {"index": 0, "text": c.text, "logprobs": None, "finish_reason": FINISH[c.finish_reason]}],
                **usage(c)})

    def _stream(self, gen, parts: Iterator[tuple], close, head: dict, choice, first: Optional[dict] = None) -> None:
        """Streams a reply (gen: its .completion when done) as chunks of `head` with choice(kind, text)
        for each (kind, text) of parts; the last chunk carries the finish reason and the usage.
        close() stops the reply: a client that goes away stops it there."""
        def events() -> Iterator[dict]:
            if first is not None:
                yield {**head, "choices": [{"index": 0, **first, "finish_reason": None}]}
            for kind, text in parts:
                if text:
                    yield {**head, "choices": [{"index": 0, **choice(kind, text), "finish_reason": None}]}
            c = gen.completion
            last = choice(None, "")
            if "delta" in last:
                last["delta"] = {}
            yield {**head, "choices": [{"index": 0, **last, "finish_reason": FINISH[c.finish_reason]}], **usage(c)}
        try:
            self.send_events(events())
        finally:
            close()   # a reply cut short by the client stops here (the chat keeps its turn as far as it got)

    def embeddings(self) -> None:
        body = self.read_json()
        inputs = body.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and all(isinstance(t, int) for t in inputs)):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(
                isinstance(t, str) or (isinstance(t, list) and t and all(isinstance(i, int) for i in t)) for t in inputs):
            raise InvalidArgumentError("input must be a text, a list of texts, or token ids (a list, or lists)")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise InvalidArgumentError(f"encoding_format must be float or base64, not {fmt!r}")
        m = self.server.model
        with self.server.lock:
            if not m.embedding:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"{m.path.name} generates text; serve an embedding model, "
                                   f"or this one with --embedding, for /v1/embeddings")
            if m.pooling == "none":
                raise RequestError(HTTPStatus.BAD_REQUEST, f"{m.path.name} does not say how to pool its rows into "
                                   f"one vector; start the server with --pooling mean|cls|last")
            data, tokens = [], 0
            for i, item in enumerate(inputs):
                ids = m.embedding_tokens(item) if isinstance(item, str) else item
                v = m.embed_tokens(ids)
                tokens += len(ids)
                vector = base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else \
                    [float(x) for x in v]
                data.append({"object": "embedding", "index": i, "embedding": vector})
        self.send_json(HTTPStatus.OK, {"object": "list", "data": data, "model": self.server.name,
                                       "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def usage(c) -> dict:
    m = c.metrics
    return {"usage": {"prompt_tokens": m.prompt_tokens, "completion_tokens": m.generated_tokens,
                      "total_tokens": m.prompt_tokens + m.generated_tokens},
            "timings": {"cached_tokens": m.reused_tokens, "ttft_s": round(m.ttft_s, 6),
                        "decode_tokens_per_s": round(m.decode_tokens_per_s, 2)}}
