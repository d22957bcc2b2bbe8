"""Several sequences at once: a step over rows of several sequences (CpuBackend.forward_batch),
the StepBatcher that makes such steps from several threads' generations, the slots a server's
parallel requests take, and the server itself with --parallel. A batched row must be the row
the sequence's own step computes, bit for bit, so parallel requests get the text they get alone."""
import json
import os
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import synth
from gguf import GGMLQuantizationType as QT

from pyllm import Model
from pyllm.errors import InvalidArgumentError

PROMPTS = ["Write a story about a dragon.", "Explain photosynthesis.", "List ten fruits.", "What is Python?"]


def own_rows(m, prefixes, steps):
    """Each sequence's rows computed alone: its prefix, then its step's tokens, in steps of its own."""
    out = []
    for prefix, toks in zip(prefixes, steps):
        s = m.engine.new_sequence()
        m.engine.prefill(s, prefix)
        out.append(m.engine._run(s, toks, n_out=min(len(toks), m.backend.n_out_max)).copy())
        s.release()
    return out


def batched_rows(m, prefixes, steps):
    seqs = []
    for prefix in prefixes:
        s = m.engine.new_sequence()
        m.engine.prefill(s, prefix)
        seqs.append(s)
    for s, toks in zip(seqs, steps):
        s.reserve(len(toks))
    rows = m.backend.forward_batch([(toks, len(s), s.blocks) for s, toks in zip(seqs, steps)]).copy()
    for s in seqs:
        s.release()
    out, r = [], 0
    for toks in steps:
        out.append(rows[r:r + len(toks)])
        r += len(toks)
    return out


def check_batch_matches(m, n_vocab, rng):
    # prefixes of several lengths: inside a block, across blocks, past a sliding window
    prefixes = [list(rng.integers(1, n_vocab, n)) for n in (5, 33, 70, 1)]
    steps = [list(rng.integers(1, n_vocab, k)) for k in (1, 3, 1, 2)]   # decode steps, and speculative ones
    want, got = own_rows(m, prefixes, steps), batched_rows(m, prefixes, steps)
    for a, b in zip(want, got):
        assert a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt-oss", "deepseek2", "llama4", "gemma4", "qwen3moe"])
def test_a_batched_step_gives_each_sequence_its_own_rows(tmp_path, arch):
    """Sliding windows (gemma3, gpt-oss's sinks), chunked attention (llama4), latent attention
    (deepseek2), layers reading another layer's cache (gemma4), experts (qwen3moe)."""
    path = synth.WRITERS[arch](tmp_path / f"{arch}.gguf", QT.Q8_0)
    with Model(path, n_threads=2, n_ctx=256) as m:
        assert m.backend.batches_sequences
        check_batch_matches(m, m.n_vocab, np.random.default_rng(1))


def test_a_batched_step_over_a_quantized_cache(tmp_path):
    path = synth.write_llama(tmp_path / "llama.gguf", QT.Q4_K, n_embd=256)
    with Model(path, n_threads=2, n_ctx=256, cache_type_k="q8_0", cache_type_v="q8_0") as m:
        check_batch_matches(m, m.n_vocab, np.random.default_rng(2))


def test_a_prompt_chunk_rides_along_first(tmp_path):
    """A prompt chunk first, two decode steps after it: the step returns the chunk's last row
    and the decode rows, each what its own step gives."""
    path = synth.write_gemma3(tmp_path / "g.gguf", QT.Q4_0)
    rng = np.random.default_rng(4)
    with Model(path, n_threads=2, n_ctx=256) as m:
        chunk, prefixes = list(rng.integers(1, 500, 40)), [list(rng.integers(1, 500, n)) for n in (12, 50)]
        want_chunk = own_rows(m, [[3]], [chunk])[0][-1]
        want = own_rows(m, prefixes, [[5], [6]])
        seqs = []
        for prefix in [[3]] + prefixes:
            s = m.engine.new_sequence()
            m.engine.prefill(s, prefix)
            seqs.append(s)
        steps = [chunk, [5], [6]]
        for s, toks in zip(seqs, steps):
            s.reserve(len(toks))
        rows = m.backend.forward_batch([(t, len(s), s.blocks) for s, t in zip(seqs, steps)], n_out=3)
        assert rows.shape[0] == 3
        assert np.array_equal(rows[0], want_chunk)
        assert np.array_equal(rows[1], want[0][0]) and np.array_equal(rows[2], want[1][0])


def test_one_thread_batches_like_two(tmp_path):
    path = synth.write_llama(tmp_path / "llama.gguf", QT.Q4_0)
    rng = np.random.default_rng(3)
    prefixes = [list(rng.integers(1, 500, n)) for n in (40, 9, 130)]
    steps = [[7], [8], [9]]
    with Model(path, n_threads=1, n_ctx=256) as one, Model(path, n_threads=2, n_ctx=256) as two:
        for a, b in zip(batched_rows(one, prefixes, steps), batched_rows(two, prefixes, steps)):
            assert np.array_equal(a, b)


def test_recurrent_and_encoder_models_do_not_batch(tmp_path):
    with Model(synth.write_mamba2(tmp_path / "m.gguf"), n_threads=1, n_ctx=64) as m:
        assert not m.backend.batches_sequences
        s, t = m.engine.new_sequence(), m.engine.new_sequence()
        s.reserve(1)
        t.reserve(1)
        with pytest.raises(InvalidArgumentError, match="recurrent"):   # the core refuses it too
            m.backend.forward_batch([([1], 0, s.blocks), ([2], 0, t.blocks)])
        assert m.parallel(4) is m.slots and len(m.slots) == 1           # one request at a time
    with Model(synth.write_bert(tmp_path / "b.gguf"), n_threads=1) as m:
        assert not m.backend.batches_sequences


def test_the_core_checks_every_rows_block_table(tmp_path):
    from pyllm._native import ffi, lib
    with Model(synth.write_llama(tmp_path / "l.gguf"), n_threads=1, n_ctx=64) as m:
        b = m.backend
        tokens, pos = np.array([1, 2], np.int32), np.array([0, 40], np.int32)
        table = np.array([0, 1], np.int32)
        for rows, why in (([0, 2], "outside the 2 entries"), ([0, -1], "outside the 2 entries"),
                          ([0, 1], "position 40 outside the 32")):
            row_table = np.array(rows, np.int32)
            st = ffi.new("pyllm_step *", {
                "n_tokens": 2, "n_out": 2, "tokens": ffi.from_buffer("int32_t[]", tokens),
                "pos": ffi.from_buffer("int32_t[]", pos), "block_table": ffi.from_buffer("int32_t[]", table),
                "n_table": 2, "block_size": b.step.block_size, "pool_blocks": b.step.pool_blocks,
                "row_table": ffi.from_buffer("int32_t[]", row_table)})
            assert lib.pyllm_run(b.ctx, b.ops, len(b.graph.ops), st) != 0
            assert why in ffi.string(lib.pyllm_error()).decode()


# -- generations on several threads -----------------------------------------------------------------

def chat_on_threads(m, prompts, **kw):
    out = [None] * len(prompts)

    def run(i):
        with m.slots.take():
            out[i] = m.chat([{"role": "user", "content": prompts[i]}], **kw)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return out


@pytest.fixture(scope="module")
def smol_parallel(smollm2_path):
    with Model(smollm2_path, n_threads=2, n_ctx=2048) as m:
        yield m


def test_parallel_chats_are_the_chats_alone(smol_parallel):
    m = smol_parallel
    kw = dict(temperature=0, max_tokens=24, logit_bias={t: -float("inf") for t in m.tokenizer.eog_ids})
    alone = [m.chat([{"role": "user", "content": p}], **kw) for p in PROMPTS]
    m.parallel(4)
    together = chat_on_threads(m, PROMPTS, **kw)
    assert [c.tokens for c in together] == [c.tokens for c in alone]
    b = m.engine.batcher
    assert b.batched_steps > b.batches   # some steps held several sequences
    # seeded sampling too: a request's draws depend on its own seed only
    kw = dict(temperature=0.9, seed=5, max_tokens=16)
    alone = [m.chat([{"role": "user", "content": p}], **kw).tokens for p in PROMPTS]
    assert [c.tokens for c in chat_on_threads(m, PROMPTS, **kw)] == alone


def test_a_slot_keeps_its_conversation(smol_parallel):
    m = smol_parallel
    slots = m.parallel(2)
    ask = [{"role": "user", "content": "Name a fruit."}]
    with slots.take():
        first = m.chat(ask, temperature=0, max_tokens=8)
    ask += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And a vegetable?"}]
    with slots.take():   # the slot released last comes back: the first turn is in its cache
        again = m.chat(ask, temperature=0, max_tokens=8)
    assert again.metrics.reused_tokens >= first.metrics.prompt_tokens


def test_a_full_cache_takes_back_idle_slots(smollm2_path):
    """Two slots in a cache of 256 positions: a request of 200 fits once the idle slot's blocks go."""
    with Model(smollm2_path, n_threads=2, n_ctx=256) as m:
        slots = m.parallel(2)
        first, second = " ".join(["alpha beta gamma delta"] * 40), " ".join(["red green blue yellow"] * 40)
        assert 150 < len(m.tokenize(first)) < 250 and 150 < len(m.tokenize(second)) < 250
        other_held, done = threading.Event(), threading.Event()

        def hold_the_other():
            with slots.take():
                other_held.set()
                done.wait(60)
        t = threading.Thread(target=hold_the_other)
        with slots.take() as x:
            t.start()
            assert other_held.wait(60)
            m.generate(first, max_tokens=4, temperature=0)
        assert len(x.seq.blocks) >= 5     # idle, it keeps its cache
        done.set()
        t.join()
        with slots.take() as y:           # the other slot: released last
            assert y is not x
            c = m.generate(second, max_tokens=4, temperature=0)
        assert c.finish_reason == "length" and x.seq.blocks == [] and x.chat_cache == []


def test_requests_that_fill_the_cache_between_them_end_with_context(smollm2_path):
    with Model(smollm2_path, n_threads=2, n_ctx=128) as m:
        m.parallel(2)
        kw = dict(temperature=0, max_tokens=100, logit_bias={t: -float("inf") for t in m.tokenizer.eog_ids})
        out = chat_on_threads(m, ["Tell me a long story.", "Write a long poem."], **kw)
        assert "context" in [c.finish_reason for c in out]
        assert all(len(c.tokens) > 10 for c in out)


def test_parallel_with_speculative_decoding(smollm2_path):
    text = "def square(x):\n    return x * x\n\ndef cube(x):\n    return x * x * x\n"
    prompts = [f"Copy this code exactly:\n{text}", f"Repeat it:\n{text}{text}"]
    with Model(smollm2_path, n_threads=2, n_ctx=1024) as plain:
        kw = dict(temperature=0, max_tokens=40)
        want = [plain.chat([{"role": "user", "content": p}], **kw).tokens for p in prompts]
    with Model(smollm2_path, n_threads=2, n_ctx=1024, spec_type="ngram-simple") as m:
        m.parallel(2)
        got = chat_on_threads(m, prompts, **kw)
        assert [c.tokens for c in got] == want
        assert sum(c.metrics.accepted_tokens for c in got) > 0


# -- the server --------------------------------------------------------------------------------------

def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def test_the_server_answers_requests_at_once(smollm2_path):
    from pyllm.server import make_server
    with Model(smollm2_path, n_threads=2, n_ctx=2048) as m:
        body = lambda p: {"messages": [{"role": "user", "content": p}], "max_tokens": 16, "temperature": 0}
        alone = [m.chat(body(p)["messages"], temperature=0, max_tokens=16).text for p in PROMPTS]
        server = make_server(m, "127.0.0.1", 0, parallel=4)
        t = threading.Thread(target=server.serve_forever, daemon=True)
        t.start()
        try:
            out = [None] * len(PROMPTS)

            def ask(i):
                out[i] = post(server.url + "/v1/chat/completions", body(PROMPTS[i]))
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=300)
            assert [o["choices"][0]["message"]["content"] for o in out] == alone
            with urllib.request.urlopen(server.url + "/props", timeout=30) as r:
                assert json.load(r)["total_slots"] == 4
            with urllib.request.urlopen(server.url + "/slots", timeout=30) as r:
                slots = json.load(r)
            assert [s["id"] for s in slots] == [0, 1, 2, 3] and not any(s["is_processing"] for s in slots)
            assert sum(s["n_past"] > 0 for s in slots) >= 2   # the slots the requests took keep their conversations
            assert m.engine.batcher.batched_steps > m.engine.batcher.batches
        finally:
            server.shutdown()
            server.server_close()


# -- several models on one server (ollama's way) ------------------------------------------------------

def test_the_server_switches_to_the_model_a_request_names(tmp_path, monkeypatch):
    from pyllm.server import make_server
    monkeypatch.setenv("PYLLM_MODELS", str(tmp_path))
    a, b = synth.write_llama(tmp_path / "a.gguf"), synth.write_gemma3(tmp_path / "b.gguf")
    load = lambda path: Model(path, n_ctx=128, n_threads=1)   # noqa: E731
    prompt = [5, 6, 7, 8]
    want = {}
    for name, path in (("a", a), ("b", b)):
        with load(path) as m:
            want[name] = m.generate(prompt, max_tokens=6, temperature=0).text
    assert want["a"] != want["b"]
    server = make_server(load(a), "127.0.0.1", 0, name="a", parallel=None, load=load)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        def complete(model):
            return post(server.url + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 6,
                                                         "temperature": 0})["choices"][0]["text"]
        with urllib.request.urlopen(server.url + "/api/tags", timeout=30) as r:
            assert {t["name"] for t in json.load(r)["models"]} == {"a", "b"}
        assert complete("b") == want["b"] and server.name == "b"
        with urllib.request.urlopen(server.url + "/api/ps", timeout=30) as r:
            assert [p["name"] for p in json.load(r)["models"]] == ["b"]
        assert complete("a:latest") == want["a"] and server.name == "a"
        assert complete(None) == want["a"]          # no name: the loaded model
        with pytest.raises(urllib.error.HTTPError) as e:
            complete("nothing-like-it")
        assert e.value.code == 404 and "a, b" in json.load(e.value)["error"]["message"]
        # requests for both at once: each answered by its own model
        names = ["a", "b", "a", "b", "b", "a"]
        out = [None] * len(names)

        def ask(i):
            out[i] = complete(names[i])
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(names))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert out == [want[n] for n in names]
    finally:
        server.shutdown()
        server.server_close()
        server.host.close()


def test_keep_alive_unloads_an_idle_model_and_the_next_request_loads_it(tmp_path, monkeypatch):
    """ollama's keep_alive: 0 unloads as soon as the request is done (and on a load request:
    `ollama stop`), a duration schedules it, negative keeps the model; /api/ps shows it; the
    next request loads the model again and answers as before."""
    from pyllm.model_host import keep_alive_seconds
    from pyllm.server import make_server
    monkeypatch.setenv("PYLLM_MODELS", str(tmp_path))
    a = synth.write_llama(tmp_path / "a.gguf")
    loads = []

    def load(path):
        loads.append(path)
        return Model(path, n_ctx=128, n_threads=1)
    assert [keep_alive_seconds(v) for v in ("5m", "1h30m", "45s", "0", 12, "-1", -3)] == \
        [300, 5400, 45, 0, 12, float("inf"), float("inf")]
    with pytest.raises(InvalidArgumentError):
        keep_alive_seconds("soon")
    server = make_server(load(a), "127.0.0.1", 0, name="a", load=load)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def ps():
        with urllib.request.urlopen(server.url + "/api/ps", timeout=30) as r:
            return json.load(r)["models"]

    def generate(**kw):
        return post(server.url + "/api/generate", {"model": "a", "prompt": "hi", "stream": False, "raw": True,
                                                   "options": {"num_predict": 4, "temperature": 0}, **kw})
    try:
        assert ps()[0]["expires_at"].startswith(str(time.gmtime().tm_year))   # unused since loading: it expires too
        first = generate()["response"]
        assert server.host.model is not None and len(loads) == 1
        assert 290 < server.host.expires_at - time.monotonic() <= 300   # ollama's default: five minutes
        expires = ps()[0]["expires_at"]
        assert expires.startswith(str(time.gmtime().tm_year))   # five minutes from now, not "never"
        assert generate(keep_alive=0)["response"] == first
        for _ in range(100):   # the timer fires at once
            if server.host.model is None:
                break
            time.sleep(0.05)
        assert server.host.model is None and ps() == []
        with urllib.request.urlopen(server.url + "/api/tags", timeout=30) as r:   # listing does not load it
            assert [t["name"] for t in json.load(r)["models"]] == ["a"]
        assert server.host.model is None
        assert generate(keep_alive=-1)["response"] == first and len(loads) == 2
        assert ps()[0]["expires_at"].startswith("2999")
        stop = post(server.url + "/api/generate", {"model": "a", "keep_alive": 0})   # ollama stop
        assert stop["done_reason"] == "unload" and server.host.model is None
        assert post(server.url + "/api/chat", {"model": "a", "messages": []})["done_reason"] == "load"
        assert server.host.model is not None and len(loads) == 3
    finally:
        server.shutdown()
        server.server_close()
        server.host.close()


def test_unload_waits_briefly_for_a_request_leaving_and_refuses_a_long_one(tmp_path, monkeypatch):
    """A client's next request (delete, `ollama stop`) can arrive while the thread that sent its
    last reply is still leaving host.use: unload waits for it; a request that goes on past the
    wait keeps the model loaded."""
    from pyllm.model_host import ModelHost
    monkeypatch.setenv("PYLLM_MODELS", str(tmp_path))
    m = Model(synth.write_llama(tmp_path / "a.gguf"), n_ctx=64, n_threads=1)
    host = ModelHost(m, "a", load=lambda path: Model(path, n_ctx=64, n_threads=1))
    inside, leave = threading.Event(), threading.Event()

    def request():
        with host.use(None, slot=False):
            inside.set()
            leave.wait(30)
    try:
        for hold_s, wait_s, unloaded in ((0.2, 5.0, True), (30, 0.2, False)):
            if host.model is None:
                host.current()
            inside.clear()
            leave.clear()
            t = threading.Thread(target=request)
            t.start()
            assert inside.wait(30)
            timer = threading.Timer(hold_s, leave.set)
            timer.start()
            t0 = time.monotonic()
            assert host.unload(wait=wait_s) is unloaded and (host.model is None) is unloaded
            assert (time.monotonic() - t0 < wait_s) is unloaded
            timer.cancel()
            leave.set()
            t.join(30)
    finally:
        host.close()


def test_ps_and_stop_commands(tmp_path, monkeypatch):
    """`pyllm ps` lists what a running server holds and until when; `pyllm stop NAME` unloads it
    (a server of one model, -m, keeps it: said so); no server, one clear line."""
    from typer.testing import CliRunner

    from cli.main import app
    from test_server import served
    monkeypatch.setenv("PYLLM_MODELS", str(tmp_path))
    a = synth.write_llama(tmp_path / "a.gguf")
    load = lambda path: Model(path, n_ctx=128, n_threads=1)   # noqa: E731
    with served(load(a), name="a", load=load) as server:
        port = str(server.server_address[1])

        def lines(output):   # the in-process server's own log lines ("note: GET /api/ps") apart
            return [line for line in output.splitlines() if not line.startswith("note:")]
        r = CliRunner().invoke(app, ["ps", "--port", port])
        header, row = lines(r.output)
        assert r.exit_code == 0 and header.split() == ["NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
        assert row.split()[:5] == ["a", f"{os.path.getsize(a) / 1e6:.0f}", "MB", "100%", "CPU"]
        assert row.split()[5] == "128" and row.endswith(("5 minutes from now", "4 minutes from now"))
        r = CliRunner().invoke(app, ["stop", "b", "--port", port])
        assert r.exit_code == 2 and "b is not loaded on the server (it holds a)" in r.output
        r = CliRunner().invoke(app, ["stop", "a", "--port", port])
        assert r.exit_code == 0 and server.host.model is None
        assert lines(CliRunner().invoke(app, ["ps", "--port", port]).output) == [
            "NAME    SIZE    PROCESSOR    CONTEXT    UNTIL"]
        server.host.close()
    with served(load(a), name="a") as server:   # -m: this model only
        r = CliRunner().invoke(app, ["stop", "a", "--port", str(server.server_address[1])])
        assert r.exit_code == 2 and "serves a only (pyllm serve -m): it stays loaded" in r.output
        assert server.host.model is not None
        server.host.close()
    r = CliRunner().invoke(app, ["ps", "--port", port])
    assert r.exit_code == 2 and f"no pyllm server answers at http://127.0.0.1:{port}" in r.output


def test_deleting_models(tmp_path, monkeypatch):
    """`pyllm rm` and ollama's DELETE /api/delete: a file of the models folder goes (the loaded
    model unloaded first); unknown names, and paths outside the folder, are refused."""
    from pyllm import registry
    from pyllm.errors import ModelNotFoundError
    from test_cli import one_error_line, pyllm
    from test_server import call, served
    monkeypatch.setenv("PYLLM_MODELS", str(tmp_path))
    a, b, c = (synth.write_llama(tmp_path / f"{n}.gguf") for n in "abc")
    synth.write_llama(tmp_path.parent / "outside.gguf")
    with pytest.raises(ModelNotFoundError):
        registry.remove("../outside")
    with pytest.raises(ModelNotFoundError, match="not downloaded"):
        registry.remove(registry.DEFAULT_MODEL)   # the registry's models are not in this folder
    r = pyllm("rm", "c")
    assert r.returncode == 0 and "deleted" in r.stderr and not (tmp_path / "c.gguf").exists()
    one_error_line(pyllm("rm", "c"), "no model 'c'")
    load = lambda path: Model(path, n_ctx=128, n_threads=1)   # noqa: E731
    with served(load(a), name="a", load=load) as server:
        req = urllib.request.Request(server.url + "/api/delete", data=json.dumps({"model": "b"}).encode(),
                                     method="DELETE")
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        assert not (tmp_path / "b.gguf").exists() and server.host.model is not None
        req = urllib.request.Request(server.url + "/api/delete", data=json.dumps({"model": "a:latest"}).encode(),
                                     method="DELETE")
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        assert not (tmp_path / "a.gguf").exists() and server.host.model is None
        assert call(server.url, "/api/delete", {"model": "a"}, method="DELETE")[0] == 404
        server.host.close()
    assert (tmp_path.parent / "outside.gguf").exists() and c


def test_a_server_given_one_model_answers_every_name_with_it(smollm2_path):
    from pyllm.server import make_server
    with Model(smollm2_path, n_threads=2, n_ctx=512) as m:
        server = make_server(m, "127.0.0.1", 0, name="smol")
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            out = post(server.url + "/v1/chat/completions", {"model": "gpt-4o", "max_tokens": 2, "messages": [
                {"role": "user", "content": "Hi"}]})
            assert out["model"] == "smol" and out["choices"][0]["message"]["content"]
        finally:
            server.shutdown()
            server.server_close()


def test_api_pull_reports_as_ollama(smollm2_path):
    """A model already fetched: the lines end in success at once; a name outside the registry: 404."""
    from pyllm.server import make_server
    with Model(smollm2_path, n_threads=1, n_ctx=256) as m:
        server = make_server(m, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            req = urllib.request.Request(server.url + "/api/pull", data=json.dumps({"model": "smollm2-135m:latest"}).encode())
            with urllib.request.urlopen(req, timeout=300) as r:
                lines = [json.loads(x) for x in r.read().splitlines()]
            assert lines[-1] == {"status": "success"}
            assert post(server.url + "/api/pull", {"model": "smollm2-135m", "stream": False}) == {"status": "success"}
            with pytest.raises(urllib.error.HTTPError) as e:
                post(server.url + "/api/pull", {"model": "llama3:70b"})
            assert e.value.code == 404 and "registry" in json.load(e.value)["error"]
        finally:
            server.shutdown()
            server.server_close()


def test_pyllm_serve_without_m_serves_the_models_folder(smollm2_path, tmp_path):
    """The command line's wiring: the default model first, another of the folder when named."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path
    from pyllm import registry
    repo = Path(__file__).resolve().parent.parent
    os.symlink(smollm2_path, tmp_path / registry.MODELS[registry.DEFAULT_MODEL].file)
    synth.write_llama(tmp_path / "tiny.gguf")
    env = {**os.environ, "PYLLM_MODELS": str(tmp_path), "PYTHONPATH": str(repo)}
    p = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", "0", "-t", "1", "-c", "256"], cwd=repo,
                         env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        line = ""
        while "listening on" not in line:
            line = p.stderr.readline()
            assert line, "the server ended before listening"
        assert "4 requests at once" in line and "others loaded when asked for" in line
        url = re.search(r"http://[0-9.:]+", line).group(0)
        with urllib.request.urlopen(url + "/api/tags", timeout=60) as r:
            assert {m["name"] for m in json.load(r)["models"]} == {registry.DEFAULT_MODEL, "tiny"}
        out = post(url + "/v1/completions", {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0})
        assert out["model"] == "tiny" and out["usage"]["completion_tokens"] == 3
    finally:
        p.terminate()
        p.wait(timeout=60)


def test_a_long_prompt_does_not_stop_the_replies_under_way(smollm2_path):
    """A prompt of more than one chunk arrives while another reply decodes: its chunks ride along
    with that reply's steps (each leaves room for them), and both replies are what they are alone."""
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 120)   # ~1200 tokens
    with Model(smollm2_path, n_threads=2, n_ctx=2048) as m:
        kw = dict(temperature=0, logit_bias={t: -float("inf") for t in m.tokenizer.eog_ids})
        m.parallel(2)
        out = [None, None]
        started = threading.Event()

        def short():
            with m.slots.take():
                gen = m.stream("Once upon a time", max_tokens=60, **kw)
                for i, _ in enumerate(gen):
                    if i == 2:
                        started.set()
                out[0] = gen.completion.tokens

        def long():
            started.wait(60)
            with m.slots.take():
                out[1] = m.generate(long_prompt, max_tokens=4, **kw).tokens
        threads = [threading.Thread(target=short), threading.Thread(target=long)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert m.engine.batcher.chunks_along >= 2   # (the prompt was not in the cache yet)
        alone = [m.generate("Once upon a time", max_tokens=60, **kw).tokens,
                 m.generate(long_prompt, max_tokens=4, **kw).tokens]
        assert out == alone
