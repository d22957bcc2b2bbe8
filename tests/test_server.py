"""pyllm.server (`pyllm serve`): OpenAI's API over HTTP, against the same Model called directly."""
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager

import numpy as np
import pytest

from pyllm import BackendError, Model
from pyllm.server import make_server

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def serving(model):
    server = make_server(model, "127.0.0.1", 0, name="test-model")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextmanager
def served(model, **kw):
    """A server for `model` on a free port (make_server's keywords), shut down afterwards."""
    server = make_server(model, "127.0.0.1", 0, **kw)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def smol(smollm2_path):
    with Model(smollm2_path, n_threads=2, n_ctx=1024) as m:
        server = serving(m)
        yield m, server.url, server
        server.shutdown()
        server.server_close()


def call(url, path, body=None, method=None, raw=None, headers=None):
    """(status, parsed JSON body) of one request."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def events(url, path, body):
    """The server-sent events of a streamed request: the JSON objects, then '[DONE]'."""
    req = urllib.request.Request(url + path, data=json.dumps({**body, "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        chunks = [c for c in r.read().decode().split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks)
    return [json.loads(c[6:]) if c[6:] != "[DONE]" else "[DONE]" for c in chunks]


def test_health_and_models(smol):
    _, url, _ = smol
    assert call(url, "/health") == (200, {"status": "ok"})
    status, body = call(url, "/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == ["test-model"]
    assert call(url, "/v1/models/test-model") == (200, body["data"][0])   # OpenAI's retrieve
    status, listed = call(url, "/v1/models", headers={"anthropic-version": "2023-06-01"})   # Anthropic's shape
    assert [(m["type"], m["id"]) for m in listed["data"]] == [("model", "test-model")] and not listed["has_more"]
    status, body = call(url, "/v1/models/other")
    assert status == 404 and "no model 'other' here" in body["error"]["message"]
    for path, want in (("/health", 200), ("/", 200), ("/nothing", 404)):   # HEAD: a health check's
        req = urllib.request.Request(url + path, method="HEAD")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        assert (status, data) == (want, b""), path


def test_chat_completion_equals_the_model(smol):
    m, url, server = smol
    want = m.chat(CHAT, temperature=0, max_tokens=12)
    status, body = call(url, "/v1/chat/completions", {"model": "x", "messages": CHAT, "temperature": 0,
                                                       "max_tokens": 12})
    assert status == 200 and body["object"] == "chat.completion" and body["model"] == "test-model"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": want.text}
    assert choice["finish_reason"] == {"length": "length", "stop": "stop"}[want.finish_reason]
    assert body["usage"] == {"prompt_tokens": want.metrics.prompt_tokens, "completion_tokens": len(want.tokens),
                             "total_tokens": want.metrics.prompt_tokens + len(want.tokens)}
    # content as a list of text parts, as OpenAI's clients may send it
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                          {"type": "text", "text": "of France?"}]}]
    assert call(url, "/v1/chat/completions", {"messages": parts, "temperature": 0, "max_tokens": 12})[1][
        "choices"][0]["message"]["content"] == want.text


def test_chat_stream(smol):
    m, url, server = smol
    want = m.chat(CHAT, temperature=0, max_tokens=12)
    got = events(url, "/v1/chat/completions", {"messages": CHAT, "temperature": 0, "max_tokens": 12})
    assert got[-1] == "[DONE]"
    chunks = got[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == want.text and len(chunks) > 3
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_completions_and_stop(smol):
    m, url, server = smol
    want = m.generate("The capital of France is", temperature=0, max_tokens=16)
    status, body = call(url, "/v1/completions", {"prompt": "The capital of France is", "temperature": 0})
    assert status == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == want.text   # 16 tokens: OpenAI's default
    cut = want.text.split()[1]
    status, body = call(url, "/v1/completions", {"prompt": "The capital of France is", "temperature": 0,
                                                 "stop": [cut], "max_tokens": 16})
    assert body["choices"][0]["finish_reason"] == "stop" and cut not in body["choices"][0]["text"]
    streamed = events(url, "/v1/completions", {"prompt": "The capital of France is", "temperature": 0})
    assert "".join(c["choices"][0]["text"] for c in streamed[:-1]) == want.text
    ids = m.tokenize("The capital of France is")
    assert call(url, "/v1/completions", {"prompt": ids, "temperature": 0})[1]["choices"][0]["text"] == want.text


def test_sampling_fields_reach_the_sampler(smol):
    """seed makes a sampled reply repeat; logit_bias bans a token, as Model takes them."""
    m, url, server = smol
    body = {"messages": CHAT, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7, "max_tokens": 10}
    a, b = (call(url, "/v1/chat/completions", body)[1]["choices"][0]["message"]["content"] for _ in range(2))
    assert a == b == m.chat(CHAT, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7, max_tokens=10).text
    greedy = m.chat(CHAT, temperature=0, max_tokens=1).tokens[0]
    banned = call(url, "/v1/chat/completions", {"messages": CHAT, "temperature": 0, "max_tokens": 1,
                                                "logit_bias": {str(greedy): -100}})[1]
    assert m.tokenize(banned["choices"][0]["message"]["content"])[:1] != [greedy]
    loop = "one two three: one two three: one two three: one two three:"
    dry = {"dry_multiplier": 1.5, "dry_allowed_length": 1, "dry_sequence_breakers": [":"]}
    want = m.generate(loop, max_tokens=12, temperature=0, **dry).text
    assert want != m.generate(loop, max_tokens=12, temperature=0).text
    got = call(url, "/v1/completions", {"prompt": loop, "max_tokens": 12, "temperature": 0, **dry})[1]
    assert got["choices"][0]["text"] == want
    status, bad = call(url, "/v1/completions", {"prompt": loop, "dry_sequence_breakers": "x"})
    assert status == 400 and "dry_sequence_breakers must be a list of strings" in bad["error"]["message"]


def test_errors(smol):
    _, url, _ = smol
    cases = [
        ("/v1/chat/completions", None, b"{bad", 400, "not valid JSON"),
        ("/v1/chat/completions", {"messages": []}, None, 400, "messages must be a non-empty list"),
        ("/v1/chat/completions", {"messages": CHAT, "n": 0}, None, 400, "n must be 1..16"),
        ("/v1/completions", {"prompt": "x", "n": 17}, None, 400, "n must be 1..16"),
        ("/v1/chat/completions", {"messages": CHAT, "temperature": -1}, None, 400, "temperature"),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 0}, None, 400, "max_tokens"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None, 400,
         "--mmproj"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, None, 400,
         "content parts must be"),
        ("/v1/completions", {"prompt": ""}, None, 400, "empty"),
        ("/v1/completions", {"prompt": ["a", "b"]}, None, 400, "one prompt per request"),
        ("/v1/completions", {"prompt": [10 ** 9]}, None, 400, "outside the vocabulary"),
        ("/v1/embeddings", {"input": "x"}, None, 400, "embedding model"),
        ("/v1/nothing", {}, None, 404, "no such endpoint"),
    ]
    for path, body, raw, status, text in cases:
        got, out = call(url, path, body, raw=raw)
        assert got == status and text in out["error"]["message"] and out["error"]["code"] == status, (path, out)
    assert call(url, "/v1/chat/completions")[0] == 405   # GET
    assert call(url, "/health", {})[0] == 405            # POST
    big = urllib.request.Request(url + "/v1/completions", data=b"{}", headers={"Content-Length": str(1 << 30)})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(big, timeout=30)
    assert e.value.code == 413


def test_a_client_that_goes_away_stops_its_reply(smol):
    """Read the first event of a long reply, hang up: the server stops generating (it is free
    again well before 500 tokens would take) and answers the next request."""
    m, url, server = smol
    host, port = url.rsplit(":", 1)
    body = json.dumps({"messages": CHAT, "max_tokens": 500, "temperature": 0.8, "top_k": 0, "min_p": 0.0,
                       "logit_bias": {str(t): -100 for t in m.tokenizer.eog_ids}, "stream": True}).encode()
    with socket.create_connection((host.removeprefix("http://"), int(port)), timeout=60) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body)
                  + body)
        got = b""
        while b"data: " not in got:
            piece = s.recv(4096)
            assert piece, got   # the server answered and closed without streaming
            got += piece
    prompt = len(m.chat_tokens(CHAT))
    with server.slots.take():   # the reply has stopped: it holds the prompt and the few tokens before the hang-up
        assert prompt < len(m._seq) < prompt + 100
    status, out = call(url, "/v1/chat/completions", {"messages": CHAT, "temperature": 0, "max_tokens": 3})
    assert status == 200 and out["usage"]["completion_tokens"] == 3


def test_requests_wait_their_turn(smol):
    """Four requests at once: each gets its own whole reply (the model runs one at a time)."""
    m, url, server = smol
    want = m.chat(CHAT, temperature=0, max_tokens=8).text
    results = []
    threads = [threading.Thread(target=lambda: results.append(call(url, "/v1/chat/completions", {
        "messages": CHAT, "temperature": 0, "max_tokens": 8}))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [(s, b["choices"][0]["message"]["content"]) for s, b in results] == [(200, want)] * 4


def test_embeddings(minilm_path):
    with Model(minilm_path, n_threads=2) as m:
        server = serving(m)
        try:
            texts = ["The cat sits on the mat.", "A kitten rests on a rug."]
            status, body = call(server.url, "/v1/embeddings", {"input": texts, "model": "x"})
            assert status == 200 and [d["index"] for d in body["data"]] == [0, 1]
            np.testing.assert_array_equal(np.array([d["embedding"] for d in body["data"]], np.float32), m.embed(texts))
            assert body["usage"]["prompt_tokens"] == sum(len(m.tokenize(t)) for t in texts)
            status, body = call(server.url, "/v1/embeddings", {"input": texts[0], "encoding_format": "base64"})
            v = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), "<f4")
            np.testing.assert_array_equal(v, m.embed(texts[0]))
            ids = m.tokenize(texts[0])
            np.testing.assert_array_equal(call(server.url, "/v1/embeddings", {"input": ids})[1]["data"][0]["embedding"],
                                          m.embed(texts[0]).tolist())
            status, body = call(server.url, "/v1/chat/completions", {"messages": CHAT})
            assert status == 400 and "embedding model" in body["error"]["message"]
            assert call(server.url, "/v1/embeddings", {"input": "word " * 600})[0] == 400
            # llama-server's own /embedding: [{index, embedding: [vector]}], normalized unless -1
            status, body = call(server.url, "/embedding", {"content": texts})
            assert status == 200 and [d["index"] for d in body] == [0, 1]
            np.testing.assert_array_equal(np.array([d["embedding"][0] for d in body], np.float32), m.embed(texts))
            status, body = call(server.url, "/embeddings", {"content": ids, "embd_normalize": -1})
            assert status == 200, body
            np.testing.assert_array_equal(np.float32(body[0]["embedding"][0]), m.embed(texts[0], normalize=False))
            pooling, m.pooling = m.pooling, "none"   # every token's row, as it is
            status, body = call(server.url, "/embedding", {"content": texts[0]})
            np.testing.assert_array_equal(np.float32(body[0]["embedding"]), m.embed(texts[0], normalize=False))
            assert len(body[0]["embedding"]) == len(ids)
            m.pooling = pooling
            assert call(server.url, "/embedding", {"content": "x", "embd_normalize": 1})[0] == 400
        finally:
            server.shutdown()
            server.server_close()


def test_cli_serve_and_ctrl_c(smollm2_path):
    """`pyllm serve` on $PYLLM_PORT 0 (--port) says where it listens, answers, and stops on Ctrl-C with
    exit 130; the API key comes from $PYLLM_API_KEY (or --api-key)."""
    p = subprocess.Popen([sys.executable, "-m", "pyllm.cli.main", "serve", "-m", smollm2_path, "-t", "1",
                          "--alias", "my-model"],
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "COLUMNS": "300", "PYLLM_API_KEY": "sesame", "PYLLM_PORT": "0",
                              "PYLLM_HOST": "127.0.0.1"})
    try:
        line = p.stderr.readline()
        assert "listening on http://127.0.0.1:" in line and "1 API key" in line, line
        url = line.split("listening on ")[1].split()[0]
        assert call(url, "/health") == (200, {"status": "ok"})
        body = {"prompt": "Hello", "max_tokens": 2}
        assert call(url, "/v1/completions", body)[0] == 401
        status, reply = call(url, "/v1/completions", body, headers={"Authorization": "Bearer sesame"})
        assert status == 200 and reply["model"] == "my-model"            # --alias names it
        assert [d["id"] for d in call(url, "/v1/models")[1]["data"]] == ["my-model"]
    finally:
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
    assert rc == 130


# -- ollama's API -----------------------------------------------------------------------------------

def lines(url, path, body):
    """The JSON lines of a streamed ollama request."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"] == "application/x-ndjson"
        return [json.loads(line) for line in r.read().decode().splitlines()]


def test_ollama_chat_and_generate(smol):
    m, url, _ = smol
    want = m.chat(CHAT, temperature=0, max_tokens=10)
    options = {"temperature": 0, "num_predict": 10}
    status, body = call(url, "/api/chat", {"model": "x", "messages": CHAT, "stream": False, "options": options})
    assert status == 200 and body["done"] and body["done_reason"] == "length"
    assert body["message"] == {"role": "assistant", "content": want.text}
    assert (body["prompt_eval_count"], body["eval_count"]) == (want.metrics.prompt_tokens, 10)
    streamed = lines(url, "/api/chat", {"messages": CHAT, "options": options})   # stream: ollama's default
    assert [x["done"] for x in streamed] == [False] * (len(streamed) - 1) + [True]
    assert "".join(x["message"]["content"] for x in streamed) == want.text
    # generate: the prompt as the user's message through the chat template; raw: as it is
    status, body = call(url, "/api/generate", {"prompt": CHAT[0]["content"], "stream": False, "options": options})
    assert body["response"] == want.text and body["done_reason"] == "length"
    raw = m.generate("The capital of France is", temperature=0, max_tokens=10)
    streamed = lines(url, "/api/generate", {"prompt": "The capital of France is", "raw": True, "options": options})
    assert "".join(x["response"] for x in streamed) == raw.text and streamed[-1]["eval_count"] == 10
    assert call(url, "/api/generate", {"model": "x"})[1]["done_reason"] == "load"   # ollama's way to load


def test_ollama_tags_version_and_errors(smol):
    m, url, _ = smol
    status, body = call(url, "/api/tags")
    assert status == 200 and body["models"][0]["name"] == "test-model"
    assert body["models"][0]["details"]["family"] == "llama" and body["models"][0]["size"] == m.file.file_size
    assert call(url, "/api/version")[1]["version"]
    for req, text in (({"messages": CHAT, "format": "xml"}, 'format takes "json"'),
                      ({"messages": CHAT, "options": {"temperature": "hot"}}, "temperature"),
                      ({"messages": "hi"}, "messages must be")):
        status, body = call(url, "/api/chat", {**req, "stream": False})
        assert status == 400 and text in body["error"], body   # ollama's error: a string
    status, body = call(url, "/api/embed", {"input": "x"})
    assert status == 400 and "embedding model" in body["error"]


def test_ollama_embed(minilm_path):
    with Model(minilm_path, n_threads=2) as m:
        server = serving(m)
        try:
            texts = ["The cat sits on the mat.", "A kitten rests on a rug."]
            status, body = call(server.url, "/api/embed", {"model": "x", "input": texts})
            assert status == 200 and body["prompt_eval_count"] == sum(len(m.tokenize(t)) for t in texts)
            np.testing.assert_array_equal(np.array(body["embeddings"], np.float32), m.embed(texts))
            # ollama truncates by default
            assert len(call(server.url, "/api/embed", {"input": "word " * 600})[1]["embeddings"][0]) == 384
            status, body = call(server.url, "/api/embed", {"input": "word " * 600, "truncate": False})
            assert status == 400 and "truncate" in body["error"]
            # the older /api/embeddings: one prompt, the vector not normalized
            status, body = call(server.url, "/api/embeddings", {"model": "x", "prompt": texts[0]})
            assert status == 200
            np.testing.assert_array_equal(np.array(body["embedding"], np.float32),
                                          m.embed_tokens(m.embedding_tokens(texts[0]), normalize=False))
            assert abs(np.linalg.norm(body["embedding"]) - 1) > 1e-3
            assert call(server.url, "/api/embeddings", {"prompt": 5})[0] == 400
        finally:
            server.shutdown()
            server.server_close()


def test_thinking_switch_and_decoder_embeddings(smollm2_path):
    """chat_template_kwargs.enable_thinking (OpenAI's route) and think (ollama's), and any other
    chat_template_kwargs, reach the template for that request only; a decoder served with embedding=True and a pooling embeds."""
    template = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                "{% if enable_thinking is defined and not enable_thinking %} no thinking{% endif %}"
                "{% if effort is defined %} effort {{ effort }}{% endif %}"
                "{% if reasoning_effort is defined %} re {{ reasoning_effort }}{% endif %}")
    with Model(smollm2_path, n_threads=2, chat_template=template) as m:
        server = serving(m)
        try:
            def prompt_tokens(**extra):
                body = {"messages": CHAT, "max_tokens": 1, "temperature": 0, **extra}
                return call(server.url, "/v1/chat/completions", body)[1]["usage"]["prompt_tokens"]
            plain = prompt_tokens()
            assert prompt_tokens(chat_template_kwargs={"enable_thinking": False}) == plain + 2
            assert prompt_tokens() == plain and m.think is None
            # any other variable reaches the template too, for that request only
            effort = len(m.tokenize(" effort low", add_bos=False))
            assert prompt_tokens(chat_template_kwargs={"effort": "low"}) == plain + effort
            assert prompt_tokens() == plain
            out = call(server.url, "/api/chat", {"messages": CHAT, "think": False, "stream": False,
                                                 "options": {"num_predict": 1}})[1]
            assert out["prompt_eval_count"] == plain + 2
            # OpenAI's reasoning_effort and ollama's think levels (gpt-oss's): the template's reasoning_effort
            high = len(m.tokenize(" re high", add_bos=False))
            assert prompt_tokens(reasoning_effort="high") == plain + high
            assert prompt_tokens(reasoning_effort="none") == plain + 2   # thinking off
            out = call(server.url, "/api/chat", {"messages": CHAT, "think": "high", "stream": False,
                                                 "options": {"num_predict": 1}})[1]
            assert out["prompt_eval_count"] == plain + high
            status, out = call(server.url, "/api/chat", {"messages": CHAT, "think": "max", "stream": False})
            assert status == 400 and "low, medium or high" in out["error"]
        finally:
            server.shutdown()
            server.server_close()
    with Model(smollm2_path, n_threads=2, embedding=True) as m:
        m.pooling = "last"
        server = serving(m)
        try:
            body = call(server.url, "/v1/embeddings", {"input": ["Hello world", "Bonjour"]})[1]
            np.testing.assert_array_equal(np.array([d["embedding"] for d in body["data"]], np.float32),
                                          m.embed(["Hello world", "Bonjour"]))
            assert len(body["data"][0]["embedding"]) == 576
        finally:
            server.shutdown()
            server.server_close()


def test_json_format(smol):
    """OpenAI's response_format json_object and ollama's format "json": the reply of Model.chat's
    format="json", one JSON object."""
    m, url, _ = smol
    ask = [{"role": "user", "content": "Give me a JSON object describing a cat with name and age."}]
    want = m.chat(ask, temperature=0, max_tokens=150, format="json")
    assert want.finish_reason == "stop" and isinstance(json.loads(want.text), dict)
    body = call(url, "/v1/chat/completions", {"messages": ask, "temperature": 0, "max_tokens": 150,
                                              "response_format": {"type": "json_object"}})[1]
    assert body["choices"][0]["message"]["content"] == want.text and body["choices"][0]["finish_reason"] == "stop"
    out = call(url, "/api/chat", {"messages": ask, "format": "json", "stream": False,
                                  "options": {"temperature": 0, "num_predict": 150}})[1]
    assert out["message"]["content"] == want.text and out["done_reason"] == "stop"
    status, body = call(url, "/v1/chat/completions", {"messages": ask, "response_format": {"type": "json_schema"}})
    assert status == 400 and "json_schema" in body["error"]["message"]
    status, body = call(url, "/v1/chat/completions", {"messages": ask, "response_format": {"type": "xml"}})
    assert status == 400 and "not supported" in body["error"]["message"]


CAT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                        "age": {"type": "integer", "minimum": 0}},
       "required": ["name", "age"]}


def test_json_schema_and_grammar(smol):
    """A JSON schema through OpenAI's response_format json_schema, ollama's format and llama-server's
    json_schema field, and a GBNF grammar through llama-server's grammar field: each reply is
    Model.chat's with the same schema or grammar."""
    m, url, _ = smol
    ask = [{"role": "user", "content": "Describe a cat as JSON."}]
    want = m.chat(ask, temperature=0, max_tokens=80, format=CAT)
    cat = json.loads(want.text)
    assert want.finish_reason == "stop" and set(cat) == {"name", "age"} and isinstance(cat["age"], int)
    body = call(url, "/v1/chat/completions", {"messages": ask, "temperature": 0, "max_tokens": 80, "response_format": {
        "type": "json_schema", "json_schema": {"name": "cat", "schema": CAT, "strict": True}}})[1]
    assert body["choices"][0]["message"]["content"] == want.text
    out = call(url, "/api/chat", {"messages": ask, "format": CAT, "stream": False,
                                  "options": {"temperature": 0, "num_predict": 80}})[1]
    assert out["message"]["content"] == want.text
    body = call(url, "/v1/chat/completions", {"messages": ask, "temperature": 0, "max_tokens": 80,
                                              "json_schema": CAT})[1]
    assert body["choices"][0]["message"]["content"] == want.text
    grammar = 'root ::= "The cat is " ("black" | "white" | "grey") "."'
    want = m.chat(ask, temperature=0, max_tokens=20, grammar=grammar)
    body = call(url, "/v1/chat/completions", {"messages": ask, "temperature": 0, "max_tokens": 20, "grammar": grammar})[1]
    assert body["choices"][0]["message"]["content"] == want.text and want.text.startswith("The cat is ")
    status, body = call(url, "/v1/chat/completions", {"messages": ask, "grammar": "root ::= root"})
    assert status == 400 and "left-recursive" in body["error"]["message"]
    status, body = call(url, "/api/chat", {"messages": ask, "format": {"type": "string", "pattern": "(?!a)"},
                                           "stream": False})
    assert status == 400 and "pattern" in body["error"]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"]}}}


def test_tool_calls(smol):
    """OpenAI's tools (whole and streamed) and ollama's: the calls of Model.chat with the same tools,
    in each API's shape; a tool result in the history goes back to the model."""
    m, url, _ = smol
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    want = m.chat(ask, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=60)
    assert want.tool_calls and want.text == ""
    calls = [(t.name, t.arguments) for t in want.tool_calls]
    req = {"messages": ask, "tools": [WEATHER], "tool_choice": "required", "temperature": 0, "max_tokens": 60}
    status, body = call(url, "/v1/chat/completions", req)
    choice = body["choices"][0]
    assert status == 200 and choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    got = choice["message"]["tool_calls"]
    assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in got] == calls
    assert all(t["type"] == "function" and t["id"].startswith("call_") for t in got)
    chunks = events(url, "/v1/chat/completions", req)
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    streamed = [t for d in deltas for t in d.get("tool_calls", [])]
    assert [(t["index"], t["function"]["name"], json.loads(t["function"]["arguments"])) for t in streamed] == \
        [(i, *c) for i, c in enumerate(calls)]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1] == "[DONE]"
    history = ask + [{"role": "assistant", "content": None, "tool_calls": got},
                     {"role": "tool", "tool_call_id": got[0]["id"], "content": "18 degrees and sunny"}]
    status, body = call(url, "/v1/chat/completions", {"messages": history, "tools": [WEATHER], "temperature": 0,
                                                      "max_tokens": 40})
    want = m.chat(history, tools=[WEATHER], temperature=0, max_tokens=40)
    assert status == 200 and body["choices"][0]["message"]["content"] == (want.text or None)
    # an answer with tools streams as it comes (the generic format's "response", decoded from its JSON);
    # SmolLM2 would rather call the tool again: tokens that spell "tool..." are banned
    no_call = {t: -100 for t, p in enumerate(m.tokenizer.all_pieces()) if p.lstrip(b' "').startswith(b"tool")}
    want = m.chat(history, tools=[WEATHER], temperature=0, max_tokens=60, logit_bias=no_call)
    chunks = events(url, "/v1/chat/completions", {"messages": history, "tools": [WEATHER], "temperature": 0,
                                                  "max_tokens": 60, "logit_bias": no_call})
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert not want.tool_calls and len(want.text) > 10
    assert "".join(pieces) == want.text and len(pieces) > 3 and not any("response" in p for p in pieces)
    ollama = {"messages": ask, "tools": [WEATHER], "options": {"temperature": 0, "num_predict": 60}}
    out = call(url, "/api/chat", {**ollama, "stream": False})[1]
    got = out["message"]["tool_calls"]
    assert out["done"] and [(t["function"]["name"], t["function"]["arguments"]) for t in got] == [
        (t.name, t.arguments) for t in m.chat(ask, tools=[WEATHER], temperature=0, max_tokens=60).tool_calls]
    streamed = lines(url, "/api/chat", ollama)
    assert streamed[-1]["done"] and streamed[0]["message"].get("tool_calls") == got
    status, body = call(url, "/api/generate", {"prompt": "hi", "tools": [WEATHER], "stream": False})
    assert status == 400 and "tools take /api/chat" in body["error"]
    status, body = call(url, "/v1/chat/completions", {"messages": ask, "tools": [{"function": {}}]})
    assert status == 400 and "needs a name" in body["error"]["message"]


def failing_steps(m, monkeypatch) -> list:
    """Makes the model fail ("the device failed") at the third decode step of each reply; clear
    the list it returns before the next reply."""
    run, steps = m.engine._run, []

    def failing(*args, **kwargs):
        steps.append(1)
        if len(steps) == 4:
            raise BackendError("the device failed")
        return run(*args, **kwargs)

    monkeypatch.setattr(m.engine, "_run", failing)
    return steps


def test_errors_before_and_after_a_stream_begins(smol, monkeypatch):
    """A prompt past the context is refused before the stream starts (a 400); a failure once it has
    begun ends it with an error in the stream's own form (the 200 has gone out)."""
    m, url, _ = smol
    long = [{"role": "user", "content": "word " * 1500}]   # past the server's 1024 tokens
    for path, body in (("/v1/chat/completions", {"messages": long, "stream": True}),
                       ("/v1/completions", {"prompt": "word " * 1500, "stream": True}),
                       ("/api/chat", {"messages": long})):
        status, out = call(url, path, body)
        message = out["error"] if path.startswith("/api/") else out["error"]["message"]
        assert status == 400 and "context holds 1024" in message
    steps = failing_steps(m, monkeypatch)
    chunks = events(url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 20})
    assert chunks[-1] == {"error": {"message": "the device failed", "type": "server_error", "code": 500}}
    assert [c["choices"][0]["delta"] for c in chunks[:2]][0]["role"] == "assistant"
    steps.clear()
    out = lines(url, "/api/chat", {"messages": CHAT, "options": {"num_predict": 20}})
    assert out[-1] == {"error": "the device failed"} and not any(line.get("done") for line in out)
    monkeypatch.undo()
    assert call(url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4})[0] == 200   # it goes on


def test_logprobs(smol):
    """OpenAI's logprobs: the chat's (content entries with top_logprobs, whole and streamed) and
    the completions' (tokens, token_logprobs, top_logprobs, text_offset), with echo scoring the
    prompt as lm-eval does; each equal to Model's."""
    m, url, _ = smol
    want = m.chat(CHAT, max_tokens=6, temperature=0, logprobs=3)
    req = {"messages": CHAT, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    body = call(url, "/v1/chat/completions", req)[1]
    content = body["choices"][0]["logprobs"]["content"]
    pieces = m.tokenizer.all_pieces()
    assert [bytes(e["bytes"]) for e in content] == [pieces[t] for t in want.tokens]
    assert [e["logprob"] for e in content] == pytest.approx([t.logprob for t in want.logprobs], abs=1e-9)
    assert all(e["top_logprobs"][0]["logprob"] == e["logprob"] and len(e["top_logprobs"]) == 3 for e in content)
    streamed = events(url, "/v1/chat/completions", req)
    assert streamed[-2]["choices"][0]["logprobs"] == body["choices"][0]["logprobs"]
    assert "logprobs" not in call(url, "/v1/chat/completions", {**req, "logprobs": False})[1]["choices"][0]

    prompt = "The capital of France is"
    ids = m.tokenize(prompt, special=True)
    out = call(url, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1})[1]
    lp = out["choices"][0]["logprobs"]
    scored = m.prompt_logprobs(ids, top=1)
    assert out["choices"][0]["text"] == prompt and out["usage"]["completion_tokens"] == 0
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx([t.logprob for t in scored[1:]], abs=1e-9)
    assert "".join(lp["tokens"]) == prompt and lp["text_offset"] == [len("".join(lp["tokens"][:i]))
                                                                     for i in range(len(ids))]
    gen = m.generate(prompt, max_tokens=4, temperature=0, logprobs=2)
    out = call(url, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": True,
                                        "logprobs": 2})[1]["choices"][0]
    assert out["text"] == prompt + gen.text and len(out["logprobs"]["tokens"]) == len(ids) + 4
    assert out["logprobs"]["token_logprobs"][len(ids):] == pytest.approx([t.logprob for t in gen.logprobs], abs=1e-9)
    chunks = events(url, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 2})
    assert chunks[-2]["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
        [t.logprob for t in gen.logprobs], abs=1e-9)
    for bad, message in (({"logprobs": 50}, "0 to 20"), ({"echo": True, "stream": True}, "echo is not streamed")):
        status, body = call(url, "/v1/completions", {"prompt": prompt, "max_tokens": 2, **bad})
        assert status == 400 and message in body["error"]["message"]


def test_llama_server_completion(smol):
    """/completion: llama-server's fields, the same text as Model.generate; stop_type and
    stopping_word; n_probs as Model's logprobs; a stream ends with the full object, no [DONE]."""
    m, url, _ = smol
    prompt = "The capital of France is"
    want = m.generate(prompt, max_tokens=8, temperature=0, logprobs=2)
    status, got = call(url, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "n_probs": 2,
                                            "return_tokens": True})
    assert status == 200 and got["content"] == want.text and got["tokens"] == want.tokens
    assert (got["stop"], got["stop_type"], got["stopping_word"]) == (True, "limit", "")
    assert got["tokens_predicted"] == 8 and got["tokens_evaluated"] == len(m.tokenize(prompt, special=True))
    t = got["timings"]
    assert t["prompt_n"] + t["cache_n"] == got["tokens_evaluated"] and t["predicted_n"] == 8
    assert got["generation_settings"]["temperature"] == 0 and got["generation_settings"]["n_predict"] == 8
    probs = got["completion_probabilities"]
    assert [p["id"] for p in probs] == want.tokens
    for p, lp in zip(probs, want.logprobs):
        assert p["logprob"] == pytest.approx(lp.logprob, abs=1e-6)
        assert [(q["id"], pytest.approx(q["logprob"], abs=1e-6)) for q in p["top_logprobs"]] == lp.top
        assert bytes(p["bytes"]) == m.tokenizer.all_pieces()[p["id"]]
    cut = want.text.strip()[:3]
    stopped = call(url, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "stop": [cut]})[1]
    assert (stopped["stop_type"], stopped["stopping_word"]) == ("word", cut) and cut not in stopped["content"]
    ended = call(url, "/completion", {"prompt": m.apply_chat_template([{"role": "user", "content": "Say hi"}]),
                                      "temperature": 0, "n_predict": -1})[1]
    assert ended["stop_type"] == "eos"
    streamed = events(url, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0})
    assert "[DONE]" not in streamed and streamed[-1]["stop"] and not any(e["stop"] for e in streamed[:-1])
    assert "".join(e["content"] for e in streamed) == want.text and streamed[-1]["stop_type"] == "limit"
    # n_predict 0 only computes the prompt; the next request reuses it
    long = "Paris is the capital and largest city of France, on the Seine."
    first = call(url, "/completion", {"prompt": long, "n_predict": 0})[1]
    assert first["content"] == "" and first["tokens_predicted"] == 0
    again = call(url, "/completion", {"prompt": long, "n_predict": 1, "temperature": 0})[1]
    assert again["timings"]["cache_n"] == again["tokens_evaluated"] - 1
    # llama-server's logit_bias pairs: false bans the token
    greedy = want.tokens[0]
    banned = call(url, "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0, "return_tokens": True,
                                       "logit_bias": [[greedy, False]]})[1]
    assert banned["tokens"] != [greedy]
    for body, message in (({"prompt": prompt, "n_predict": "x"}, "n_predict must be an integer"),
                          ({"prompt": {}}, "prompt must be a text"),
                          ({"prompt": prompt, "logit_bias": [[1]]}, "[token id, bias] pairs")):
        status, err = call(url, "/completion", body)
        assert status == 400 and message in err["error"]["message"]


def test_llama_server_tokenize_template_props(smol):
    m, url, _ = smol
    text = "Hello world<|im_end|>"
    ids = call(url, "/tokenize", {"content": text})[1]["tokens"]
    assert ids == m.tokenize(text, add_bos=False, special=True) and m.tokenizer.token_id("<|im_end|>") in ids
    assert call(url, "/tokenize", {"content": text, "parse_special": False})[1]["tokens"] == m.tokenize(text)
    pieces = call(url, "/tokenize", {"content": "héllo", "with_pieces": True})[1]["tokens"]
    assert [p["id"] for p in pieces] == m.tokenize("héllo", add_bos=False)
    assert b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                    for p in pieces) == "héllo".encode()
    assert call(url, "/detokenize", {"tokens": ids})[1] == {"content": m.detokenize(ids)}
    assert call(url, "/detokenize", {"tokens": [10 ** 9]})[0] == 400
    messages = [{"role": "user", "content": "hi"}]
    assert call(url, "/apply-template", {"messages": messages})[1] == {"prompt": m.apply_chat_template(messages)}
    props = call(url, "/props")[1]
    assert props["default_generation_settings"]["n_ctx"] == m.n_ctx == 1024
    assert props["default_generation_settings"]["params"]["top_k"] == 40 and props["total_slots"] == 1
    assert "<|im_start|>" in props["chat_template"] and props["model_path"] == str(m.path)


def test_ollama_show_and_ps(smol):
    m, url, _ = smol
    status, show = call(url, "/api/show", {"model": "test-model"})
    assert status == 200 and show["capabilities"][:2] == ["completion", "tools"]
    assert show["model_info"]["general.architecture"] == "llama"
    assert show["model_info"]["llama.context_length"] == m.arch.hp.n_ctx_train
    assert show["model_info"]["general.parameter_count"] == m.file.n_params
    assert show["details"]["family"] == "llama" and "<|im_start|>" in show["template"]
    assert not any(k.startswith("tokenizer.ggml.tokens") for k in show["model_info"])
    assert call(url, "/api/show", {"model": "other"})[0] == 404
    ps = call(url, "/api/ps")[1]["models"]
    assert [p["name"] for p in ps] == ["test-model"] and ps[0]["context_length"] == 1024 and ps[0]["size_vram"] == 0


def test_server_metrics(tmp_path):
    """GET /metrics (with --metrics): llama-server's counters after one completion; 501 without."""
    from gguf.constants import GGMLQuantizationType as QT
    import synth
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 500, 20)]
    with Model(synth.write_llama(tmp_path / "m.gguf", QT.Q8_0), n_threads=2) as m:
        with served(m, parallel=1) as server:
            status, _ = call(server.url, "/metrics")
            assert status == 501
        with served(m, parallel=1, metrics=True) as server:
            before = m.engine.totals.prompt_tokens
            status, out = call(server.url, "/completion", {"prompt": prompt, "n_predict": 5, "temperature": 0})
            assert status == 200
            with urllib.request.urlopen(server.url + "/metrics", timeout=60) as r:
                assert r.headers["Content-Type"].startswith("text/plain")
                text = r.read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}
    assert "# TYPE llamacpp:prompt_tokens_total counter" in text
    assert values["llamacpp:prompt_tokens_total"] == before + 20
    assert values["llamacpp:tokens_predicted_total"] >= out["tokens_predicted"] > 0
    assert values["llamacpp:n_decode_total"] >= out["tokens_predicted"]
    assert values["llamacpp:requests_processing"] == 0 and values["llamacpp:requests_deferred"] == 0
    assert values["llamacpp:prompt_tokens_seconds"] > 0


def test_api_keys(smollm2_path, tmp_path):
    """With API keys, each request but the public few needs one (Bearer or X-Api-Key): 401 in
    OpenAI's error shape (ollama's under /api/) without it; --api-key and --api-key-file read."""
    from cli.serve import api_keys_of
    from pyllm.errors import InvalidArgumentError
    body = {"prompt": "Hi", "max_tokens": 2, "temperature": 0}
    with Model(smollm2_path, n_threads=2, n_ctx=256) as m, served(m, api_keys=["k1", "k2"], metrics=True) as s:
        for path in ("/health", "/v1/health", "/v1/models", "/models", "/api/tags"):
            assert call(s.url, path)[0] == 200, path
        for headers in ({}, {"Authorization": "Bearer k3"}, {"Authorization": "k1"}, {"X-Api-Key": "k"}):
            status, reply = call(s.url, "/v1/completions", body, headers=headers)
            assert status == 401 and reply["error"]["type"] == "authentication_error", (headers, reply)
        assert call(s.url, "/api/generate", {"prompt": "Hi"}) == (401, {"error": "Invalid API Key"})
        assert call(s.url, "/metrics")[0] == 401
        assert call(s.url, "/v1/completions", body, headers={"Authorization": "Bearer k2"})[0] == 200
        assert call(s.url, "/tokenize", {"content": "Hi"}, headers={"X-Api-Key": "k1"})[0] == 200
    keys = tmp_path / "keys"
    keys.write_text("a\n\n b \n")
    assert api_keys_of("x, y,", str(keys)) == ["x", "y", "a", "b"] and api_keys_of(None, None) == []
    keys.write_text("\n")
    with pytest.raises(InvalidArgumentError, match="holds no key"):
        api_keys_of(None, str(keys))


def test_https(smollm2_path):
    """--ssl-cert-file/--ssl-key-file: the server speaks HTTPS (tests/data's self-signed certificate,
    for localhost and 127.0.0.1, made for this test only); a client speaking plain HTTP gets
    nothing and the server goes on; a bad certificate or half the pair is one clear error."""
    import ssl
    from pathlib import Path
    from pyllm.errors import InvalidArgumentError
    data = Path(__file__).parent / "data"
    cert, key = str(data / "tls-test-cert.pem"), str(data / "tls-test-key.pem")
    trust = ssl.create_default_context(cafile=cert)

    def post(url, path, body, context):
        req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"X-Api-Key": "k"})
        with urllib.request.urlopen(req, timeout=60, context=context) as r:
            return r.status, json.loads(r.read())
    with Model(smollm2_path, n_threads=2, n_ctx=256) as m, served(m, tls=(cert, key), api_keys=["k"]) as s:
        assert s.url.startswith("https://127.0.0.1:")
        with pytest.raises((urllib.error.URLError, ConnectionError)):   # plain HTTP to the TLS port
            urllib.request.urlopen(s.url.replace("https", "http") + "/health", timeout=10)
        status, body = post(s.url, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": 0}, trust)
        assert status == 200 and body["usage"]["completion_tokens"] == 2
        with pytest.raises(urllib.error.URLError):   # a client that does not trust the certificate
            post(s.url, "/tokenize", {"content": "Hi"}, ssl.create_default_context())
        assert post(s.url, "/tokenize", {"content": "Hi"}, trust)[0] == 200
        with pytest.raises(InvalidArgumentError, match="cannot use the TLS certificate"):
            make_server(m, "127.0.0.1", 0, tls=(key, key))
    r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", "serve", "-m", smollm2_path, "--ssl-key-file", key],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "both --ssl-key-file and --ssl-cert-file" in r.stderr


def named_events(url, path, body, headers=None):
    """Anthropic's stream: [(event name, JSON data)], each name its data's type."""
    req = urllib.request.Request(url + path, data=json.dumps({**body, "stream": True}).encode(), headers=headers or {})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        chunks = [c for c in r.read().decode().split("\n\n") if c]
    out = []
    for c in chunks:
        name, data = c.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        out.append((name[7:], json.loads(data[6:])))
        assert out[-1][1]["type"] == out[-1][0]
    return out


def test_anthropic_messages(smol):
    """Anthropic's /v1/messages (whole and streamed) and /v1/messages/count_tokens: the reply,
    stop reasons, tool uses and token counts of Model.chat with the same messages."""
    m, url, _ = smol
    ask = [{"role": "system", "content": "Be brief."}] + CHAT
    want = m.chat(ask, temperature=0, max_tokens=12)
    req = {"model": "x", "system": "Be brief.", "messages": CHAT, "max_tokens": 12, "temperature": 0}
    status, body = call(url, "/v1/messages", req, headers={"x-api-key": "any", "anthropic-version": "2023-06-01"})
    assert status == 200 and body["type"] == "message" and body["role"] == "assistant"
    assert body["content"] == [{"type": "text", "text": want.text}] and body["model"] == "test-model"
    assert body["stop_reason"] == {"stop": "end_turn", "length": "max_tokens"}[want.finish_reason]
    usage = body["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == want.metrics.prompt_tokens
    assert usage["output_tokens"] == len(want.tokens)
    assert call(url, "/v1/messages/count_tokens", req) == (200, {"input_tokens": len(m.chat_tokens(ask))})
    got = named_events(url, "/v1/messages", req)
    names = [n for n, _ in got]
    assert names[:2] == ["message_start", "content_block_start"] and names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"] and set(names[2:-3]) == {"content_block_delta"}
    assert "".join(d["delta"]["text"] for n, d in got if n == "content_block_delta") == want.text
    assert got[-2][1]["delta"]["stop_reason"] == body["stop_reason"] and len(got) > 6
    # a stop sequence the reply reaches ends it there, and says which
    cut = want.text.split()[2]
    status, body = call(url, "/v1/messages", {**req, "stop_sequences": ["zzz", cut]})
    assert body["content"][0]["text"] == want.text[:want.text.index(cut)]
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", cut)
    # a last assistant message is the start of the reply (prefill), as in /v1/chat/completions
    start = [*CHAT, {"role": "assistant", "content": "Paris is"}]
    want = m.chat(start, temperature=0, max_tokens=8)
    assert call(url, "/v1/messages", {**req, "system": None, "messages": start, "max_tokens": 8})[1][
        "content"][0]["text"] == want.text
    assert call(url, "/v1/chat/completions", {"messages": start, "temperature": 0, "max_tokens": 8})[1][
        "choices"][0]["message"]["content"] == want.text
    # structured outputs: the reply keeps to the schema
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    body = call(url, "/v1/messages", {"messages": [{"role": "user", "content": "Name a city as JSON."}],
                                      "max_tokens": 40, "temperature": 0,
                                      "output_config": {"format": {"type": "json_schema", "schema": schema}}})[1]
    assert set(json.loads(body["content"][0]["text"])) == {"city"}
    # errors in Anthropic's shape
    picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    status, body = call(url, "/v1/messages", {"messages": [{"role": "user", "content": [picture]}]})
    assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "--mmproj" in body["error"]["message"]    # a text model: the projector is what images need


def test_anthropic_tool_use(smol):
    """Tools through /v1/messages: tool_use blocks (whole and streamed) as Model.chat calls them,
    and a tool_result in the history goes back to the model as a tool message."""
    m, url, _ = smol
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": WEATHER["function"]["parameters"]}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    want = m.chat(ask, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=60)
    req = {"messages": ask, "tools": [tool], "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
           "temperature": 0, "max_tokens": 60}
    body = call(url, "/v1/messages", req)[1]
    uses = [b for b in body["content"] if b["type"] == "tool_use"]
    assert body["stop_reason"] == "tool_use" and want.tool_calls
    assert [(b["name"], b["input"]) for b in uses] == [(t.name, t.arguments) for t in want.tool_calls]
    assert all(b["id"].startswith("toolu_") for b in uses)
    got = named_events(url, "/v1/messages", req)
    starts = [d["content_block"] for n, d in got if n == "content_block_start"]
    inputs = [json.loads(d["delta"]["partial_json"]) for n, d in got
              if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    assert [(b["type"], b["name"]) for b in starts] == [("tool_use", b["name"]) for b in uses]
    assert inputs == [b["input"] for b in uses] and got[-2][1]["delta"]["stop_reason"] == "tool_use"
    history = ask + [{"role": "assistant", "content": uses},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"],
                                                   "content": "18 degrees and sunny"}]}]
    openai_history = ask + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
        for b in uses]}, {"role": "tool", "tool_call_id": uses[0]["id"], "content": "18 degrees and sunny"}]
    want = m.chat(openai_history, tools=[WEATHER], parallel_tool_calls=True, temperature=0, max_tokens=40)
    body = call(url, "/v1/messages", {"messages": history, "tools": [tool], "temperature": 0, "max_tokens": 40})[1]
    assert [b.get("text", b.get("input")) for b in body["content"]] == \
        ([want.text] if want.text or not want.tool_calls else []) + [t.arguments for t in want.tool_calls]
    assert call(url, "/v1/messages/count_tokens", {"messages": history, "tools": [tool]})[1] == {
        "input_tokens": len(m.chat_tokens(openai_history, tools=[WEATHER]))}


def test_no_prefill_assistant(smollm2_path):
    """--no-prefill-assistant: a last assistant message is a whole turn, and the reply a new one."""
    start = [*CHAT, {"role": "assistant", "content": "Paris is"}]
    with Model(smollm2_path, n_threads=2, n_ctx=256) as m, served(m, prefill_assistant=False) as s:
        want = m.chat(start, temperature=0, max_tokens=6, prefill_assistant=False)
        assert want.metrics.prompt_tokens == len(m.chat_tokens(start, prefill_assistant=False)) > \
            len(m.chat_tokens(start))
        body = call(s.url, "/v1/chat/completions", {"messages": start, "temperature": 0, "max_tokens": 6})[1]
        assert body["choices"][0]["message"]["content"] == want.text
        assert body["usage"]["prompt_tokens"] == want.metrics.prompt_tokens


def test_openai_responses(smol):
    """OpenAI's /v1/responses (whole and streamed): the output of Model.chat with the same messages;
    previous_response_id goes on from a stored response; GET and DELETE /v1/responses/ID."""
    m, url, _ = smol
    ask = [{"role": "system", "content": "Be brief."}] + CHAT
    want = m.chat(ask, temperature=0, max_tokens=12)
    req = {"model": "x", "instructions": "Be brief.", "input": CHAT[0]["content"], "max_output_tokens": 12,
           "temperature": 0}
    status, body = call(url, "/v1/responses", req)
    assert status == 200 and body["object"] == "response" and body["id"].startswith("resp_")
    assert [(i["type"], i["content"][0]["text"]) for i in body["output"]] == [("message", want.text)]
    assert body["status"] == ("incomplete" if want.finish_reason == "length" else "completed")
    assert body["usage"]["input_tokens"] == want.metrics.prompt_tokens and body["usage"]["output_tokens"] == len(
        want.tokens)
    assert call(url, f"/v1/responses/{body['id']}") == (200, body)
    assert call(url, "/v1/responses/input_tokens", req) == (200, {"object": "response.input_tokens",
                                                                  "input_tokens": len(m.chat_tokens(ask))})
    # the next turn from the stored one: its input and output before the new input, not its instructions
    more = {"role": "user", "content": "And of Germany?"}
    want2 = m.chat(CHAT + [{"role": "assistant", "content": want.text}, more], temperature=0, max_tokens=12)
    status, body2 = call(url, "/v1/responses", {"previous_response_id": body["id"], "input": [more],
                                                "max_output_tokens": 12, "temperature": 0})
    assert status == 200 and body2["output"][0]["content"][0]["text"] == want2.text
    assert body2["previous_response_id"] == body["id"]
    assert call(url, f"/v1/responses/{body['id']}", method="DELETE")[1] == {
        "id": body["id"], "object": "response", "deleted": True}
    status, out = call(url, f"/v1/responses/{body['id']}")
    assert status == 404 and out["error"]["type"] == "not_found_error"
    status, out = call(url, "/v1/responses", {"previous_response_id": body["id"], "input": "Hi"})
    assert status == 404 and "keeps the last" in out["error"]["message"]
    # "store": false leaves nothing to go on from
    status, kept = call(url, "/v1/responses", {"input": "Hi", "max_output_tokens": 2, "store": False})
    assert status == 200 and call(url, f"/v1/responses/{kept['id']}")[0] == 404
    got = named_events(url, "/v1/responses", req)
    assert [e["sequence_number"] for _, e in got] == list(range(len(got)))
    assert [n for n, _ in got][:4] == ["response.created", "response.in_progress", "response.output_item.added",
                                       "response.content_part.added"]
    assert "".join(e["delta"] for n, e in got if n == "response.output_text.delta") == want.text
    assert got[-1][0] == ("response.incomplete" if want.finish_reason == "length" else "response.completed")
    assert got[-1][1]["response"]["output"][0]["content"][0]["text"] == want.text
    status, out = call(url, "/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_file"}]}]})
    assert status == 400 and out["error"]["message"] == "input item 0 holds a file: pyllm serves text models, " \
                                                        "send text only"


def test_openai_responses_tools_and_format(smol):
    """Function tools through /v1/responses: function_call items as Model.chat calls them (whole and
    streamed), their output back as a function_call_output item; text.format holds the reply to JSON."""
    m, url, _ = smol
    tool = {"type": "function", **WEATHER["function"]}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    want = m.chat(ask, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=60)
    req = {"input": ask, "tools": [tool], "tool_choice": "required", "parallel_tool_calls": False,
           "temperature": 0, "max_output_tokens": 60}
    body = call(url, "/v1/responses", req)[1]
    calls = [i for i in body["output"] if i["type"] == "function_call"]
    assert body["status"] == "completed" and want.tool_calls
    assert [(i["name"], json.loads(i["arguments"])) for i in calls] == [(t.name, t.arguments) for t in want.tool_calls]
    got = named_events(url, "/v1/responses", req)
    done = [e["arguments"] for n, e in got if n == "response.function_call_arguments.done"]
    assert [json.loads(a) for a in done] == [t.arguments for t in want.tool_calls]
    history = ask + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in calls]}, {"role": "tool", "tool_call_id": calls[0]["call_id"], "content": "18 degrees"}]
    want = m.chat(history, tools=[WEATHER], parallel_tool_calls=True, temperature=0, max_tokens=40)
    body = call(url, "/v1/responses", {"input": ask + calls + [{"type": "function_call_output", "call_id": calls[0][
        "call_id"], "output": "18 degrees"}], "tools": [tool], "temperature": 0, "max_output_tokens": 40})[1]
    assert [i.get("arguments") or i["content"][0]["text"] for i in body["output"]] == \
        ([want.text] if want.text or not want.tool_calls else []) + [t.openai()["function"]["arguments"]
                                                                     for t in want.tool_calls]
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    body = call(url, "/v1/responses", {"input": "Name a city as JSON.", "temperature": 0, "max_output_tokens": 40,
                                       "text": {"format": {"type": "json_schema", "name": "c", "schema": schema}}})[1]
    assert set(json.loads(body["output"][0]["content"][0]["text"])) == {"city"}


def test_chat_page(smollm2_path):
    """GET / is the chat page (no key needed: it holds no data; its requests carry the key), and
    every endpoint its script calls is one the server routes; --no-webui: a 404."""
    import re
    from pyllm.server import GET_ROUTES, POST_ROUTES
    with Model(smollm2_path, n_threads=2, n_ctx=256) as m, served(m, api_keys=["k"]) as s:
        with urllib.request.urlopen(s.url + "/", timeout=60) as r:
            page = r.read().decode()
            assert r.status == 200 and r.headers["Content-Type"] == "text/html; charset=utf-8"
            assert "connect-src 'self'" in r.headers["Content-Security-Policy"]
        assert page.startswith("<!DOCTYPE html>") and "<script>" in page
        called = set(re.findall(r'fetch\("(/[^"]*)"', page))
        assert called == {"/v1/chat/completions", "/props", "/v1/models"} and called <= set(GET_ROUTES) | set(
            POST_ROUTES)
        assert "innerHTML" not in page   # replies are shown as text, never as markup
        assert call(s.url, "/props")[0] == 401
    with Model(smollm2_path, n_threads=2, n_ctx=256) as m, served(m, webui=False) as s:
        status, body = call(s.url, "/")
        assert status == 404 and "--no-webui" in body["error"]["message"]


def test_web_pages_of_other_sites_are_refused(smollm2_path):
    """A request with an Origin is taken from the server's own pages, localhost's and --origins
    (with CORS headers, and preflights answered), and refused (403) from any other site."""
    def post(url, origin, path="/tokenize", method="POST"):
        req = urllib.request.Request(url + path, data=b'{"content": "Hi"}' if method == "POST" else None,
                                     method=method, headers={"Origin": origin} if origin else {})
        if method == "OPTIONS":
            req.add_header("Access-Control-Request-Method", "POST")
            req.add_header("Access-Control-Request-Headers", "authorization, content-type")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.headers
        except urllib.error.HTTPError as e:
            return e.code, e.headers
    with Model(smollm2_path, n_threads=2, n_ctx=256) as m, \
            served(m, origins=["https://app.example.com", "chrome-extension://*"]) as s:
        host = s.url[len("http://"):]
        for origin in (None, s.url, "http://localhost:3000", "http://127.0.0.1:5173", "https://app.example.com",
                       "chrome-extension://abcdef"):
            status, headers = post(s.url, origin)
            assert status == 200, origin
            assert headers["Access-Control-Allow-Origin"] == origin, origin
        for origin in ("https://evil.example.com", "http://app.example.com", "null", f"http://{host}.evil.com"):
            status, headers = post(s.url, origin)
            assert status == 403 and headers["Access-Control-Allow-Origin"] is None, origin
        assert call(s.url, "/api/delete", {"model": "x"}, method="DELETE",
                    headers={"Origin": "https://evil.example.com"})[1]["error"].startswith(
            "requests from web pages of https://evil.example.com are refused: start the server with --origins")
        status, headers = post(s.url, "https://app.example.com", method="OPTIONS")
        assert status == 204 and headers["Access-Control-Allow-Origin"] == "https://app.example.com"
        assert "POST" in headers["Access-Control-Allow-Methods"]
        assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        assert post(s.url, "https://evil.example.com", method="OPTIONS")[0] == 403
        # a site whose name points at 127.0.0.1 (DNS rebinding) is same-origin to the browser: its Host gives it away
        status, body = call(s.url, "/tokenize", {"content": "Hi"}, headers={"Host": "evil.example.com:80",
                                                                           "Origin": "http://evil.example.com:80"})
        assert status == 403 and "does not answer for 'evil.example.com'" in body["error"]["message"]
        for host in (f"localhost:{s.server_address[1]}", "127.0.0.1", "[::1]:8080"):
            assert call(s.url, "/tokenize", {"content": "Hi"}, headers={"Host": host})[0] == 200, host
    with Model(smollm2_path, n_threads=2, n_ctx=256) as m, served(m, origins=["*"]) as s:
        assert post(s.url, "https://anywhere.example.org")[0] == 200


def test_rerank(tmp_path, minilm_path):
    """llama-server's /v1/rerank (and /rerank, /reranking): Model.rerank's scores, ordered by
    relevance, top_n kept, usage counted; TEI's {texts} shape; an embedding model, or embeddings
    from a reranker, refused with what to do."""
    import synth
    md, _ = synth.unigram_vocab()
    md["tokenizer.ggml.add_sep_token"] = True
    path = synth.write_bert(tmp_path / "rerank.gguf", synth.QT.F32, tokenizer_from=md, rank=1)
    query, docs = "caf\u00e9 hello", ["hello world", "\ufb01nance token model", "\u6771\u4eac the world of izer", "a"]
    with Model(path, n_threads=1) as m, served(m, name="rr") as s:
        scores = m.rerank(query, docs)
        best = sorted(range(4), key=lambda i: -scores[i])
        status, body = call(s.url, "/v1/rerank", {"query": query, "documents": docs, "top_n": 3,
                                                  "return_documents": True})
        assert status == 200 and body["model"] == "rr" and body["object"] == "list"
        assert [r["index"] for r in body["results"]] == best[:3]
        np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], [scores[i] for i in best[:3]],
                                   rtol=1e-6)
        assert [r["document"]["text"] for r in body["results"]] == [docs[i] for i in best[:3]]
        n = sum(len(m.rerank_tokens(query, d)) for d in docs)
        assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
        for path_ in ("/rerank", "/reranking", "/v1/reranking"):
            assert [r["index"] for r in call(s.url, path_, {"query": query, "documents": docs})[1]["results"]] == best
        tei = call(s.url, "/rerank", {"query": query, "texts": docs, "return_text": True})[1]
        assert [(r["index"], r["text"]) for r in tei] == [(i, docs[i]) for i in best]
        for bad, says in (({"query": "", "documents": docs}, "query must be"), ({"query": "q", "documents": []},
                          "documents must be"), ({"query": "q", "documents": docs, "top_n": 0}, "top_n must be")):
            status, body = call(s.url, "/v1/rerank", bad)
            assert status == 400 and says in body["error"]["message"]
        status, body = call(s.url, "/v1/embeddings", {"input": "hello"})
        assert status == 400 and "is a reranker" in body["error"]["message"]
    with Model(minilm_path, n_threads=1) as m, served(m) as s:
        status, body = call(s.url, "/v1/rerank", {"query": "q", "documents": ["d"]})
        assert status == 400 and "is not a reranker" in body["error"]["message"]
    r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", "serve", "-m", minilm_path, "--reranking",
                        "--port", "0"], capture_output=True, text=True, timeout=60)   # llama-server's flag: checked
    assert r.returncode == 2 and "is not a reranker (its file does not rank)" in r.stderr


def test_odd_bodies_are_answered_not_crashed_on(smol):
    """Found by throwing random bodies at the endpoints: a template variable that is the chat's own
    (messages) is a 400; text with a lone surrogate ("\\ud800", valid JSON) echoed back comes back as
    JSON's escape, not a 500."""
    _, url, _ = smol
    status, body = call(url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1,
                                                      "chat_template_kwargs": {"messages": None}})
    assert status == 400 and "may not set messages" in body["error"]["message"]
    raw = b'{"input": "Hi", "max_output_tokens": 1, "user": "\\ud800x"}'
    status, body = call(url, "/v1/responses", raw=raw)
    assert status == 200 and body["user"] == "\ud800x"


def test_several_choices(smol):
    """OpenAI's n (llama-server refuses it; ollama's OpenAI endpoint takes it): n replies, one
    after another, a seeded request's drawn from seed, seed + 1, ...; the usage counts the prompt
    once; streamed, each reply's chunks at its index, the usage on the last."""
    m, url, _ = smol
    want = [m.chat(CHAT, max_tokens=8, temperature=1.0, seed=7 + i) for i in range(3)]
    req = {"messages": CHAT, "max_tokens": 8, "temperature": 1.0, "seed": 7, "n": 3}
    status, body = call(url, "/v1/chat/completions", req)
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in body["choices"]] == [w.text for w in want]
    assert len({w.text for w in want}) > 1   # the seeds tell them apart
    assert body["usage"] == {"prompt_tokens": want[0].metrics.prompt_tokens,
                             "completion_tokens": sum(len(w.tokens) for w in want),
                             "total_tokens": want[0].metrics.prompt_tokens + sum(len(w.tokens) for w in want)}
    chunks = events(url, "/v1/chat/completions", req)[:-1]
    for i, w in enumerate(want):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert "".join(c["delta"].get("content", "") for c in mine) == w.text
        assert mine[-1]["finish_reason"] == {"length": "length", "stop": "stop"}[w.finish_reason]
    assert "usage" in chunks[-1] and not any("usage" in c for c in chunks[:-1])
    raw = [m.generate("The capital of France is", max_tokens=6, temperature=1.0, seed=3 + i).text for i in range(2)]
    body = call(url, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 1.0,
                                         "seed": 3, "n": 2})[1]
    assert [c["text"] for c in body["choices"]] == raw


def test_stream_errors_in_each_apis_shape(smol, monkeypatch):
    """A failure once a stream has begun ends it with an error in that API's own form: Anthropic's
    error event, the Responses API's numbered error event."""
    m, url, _ = smol
    steps = failing_steps(m, monkeypatch)
    got = named_events(url, "/v1/messages", {"messages": CHAT, "max_tokens": 20})
    assert got[0][0] == "message_start" and got[-1] == ("error", {"type": "error", "error": {
        "type": "api_error", "message": "the device failed"}})
    steps.clear()
    got = named_events(url, "/v1/responses", {"input": "Hi", "max_output_tokens": 20})
    name, last = got[-1]
    assert name == "error" and last == {"type": "error", "sequence_number": len(got) - 1, "code": "server_error",
                                        "message": "the device failed", "param": None}
    monkeypatch.undo()
    assert call(url, "/v1/messages", {"messages": CHAT, "max_tokens": 2})[0] == 200   # it goes on
