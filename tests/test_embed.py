"""Embeddings: Model.embed and `pyllm embed` on a real sentence encoder (all-MiniLM-L6-v2,
converted from its wheel by pyllm.convert) and on decoders loaded for embeddings; the
BERT converter against a hand-made checkpoint."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import synth
from pyllm import ContextFullError, InvalidArgumentError, Model, ModelFileError, UnsupportedModelError
from pyllm.convert import convert_bert, read_safetensors
from pyllm.model_file import ModelFile
from pyllm.reference import Reference, gelu_tanh, layernorm

HF = json.loads((Path(__file__).parent / "data" / "minilm_hf.json").read_text())


def cos(a, b):
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def minilm(minilm_path):
    with Model(minilm_path, n_threads=2) as m:
        yield m


def test_minilm_equals_sentence_transformers(minilm):
    """The same ids as Hugging Face's tokenizer and, to float rounding (F16 weights, f16 KV
    cache, GELU's tanh form as llama.cpp runs it), the vectors sentence-transformers computed
    (tests/data/minilm_hf.json says how)."""
    got = minilm.embed(HF["texts"])
    assert got.shape == (len(HF["texts"]), 384) and got.dtype == np.float32
    for text, ids, want, v in zip(HF["texts"], HF["ids"], HF["embeddings"], got):
        assert minilm.tokenize(text) == ids
        assert cos(v, np.array(want)) > 0.99999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)


def test_minilm_matches_reference(minilm):
    """Every token's row against the float32 reference over the dequantized weights."""
    ids = minilm.tokenize("A quick brown fox jumps over the lazy dog, twice; then it rests.")
    rows = minilm.embed_tokens(ids, pooling="none", normalize=False)
    ref = Reference(minilm.arch).forward(ids)
    assert rows.shape == ref.shape == (len(ids), 384)
    assert np.sqrt(np.mean((rows - ref) ** 2)) / ref.std() < 1e-3
    np.testing.assert_allclose(minilm.embed_tokens(ids, normalize=False), ref.mean(0), atol=2e-3)


def test_minilm_meaning(minilm):
    """Sentences that mean the same sit closer than unrelated ones."""
    a, b, c = minilm.embed(["The cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell sharply."])
    assert np.dot(a, b) > 0.5 > 0.2 > max(np.dot(a, c), np.dot(b, c))


def test_embed_pooling_and_options(minilm):
    ids = minilm.tokenize("pooling picks rows")
    assert ids[0] == 101 and ids[-1] == 102   # [CLS] ... [SEP]
    rows = minilm.embed_tokens(ids, pooling="none", normalize=False)
    np.testing.assert_array_equal(minilm.embed_tokens(ids, pooling="cls", normalize=False), rows[0])
    np.testing.assert_array_equal(minilm.embed_tokens(ids, pooling="last", normalize=False), rows[-1])
    np.testing.assert_allclose(minilm.embed_tokens(ids, normalize=False), rows.mean(0), rtol=1e-5, atol=1e-6)
    unit = minilm.embed("pooling picks rows")
    np.testing.assert_allclose(unit, rows.mean(0) / np.linalg.norm(rows.mean(0)), rtol=1e-5, atol=1e-6)
    per_token = minilm.embed(["one", "one two three"], pooling="none")
    assert [p.shape for p in per_token] == [(3, 384), (5, 384)]
    # a text alone or among others: the same vector, bit for bit
    np.testing.assert_array_equal(minilm.embed(["x y", "pooling picks rows"])[1], unit)
    assert minilm.embed([]).shape == (0, 384)
    assert minilm.embed("").shape == (384,)   # [CLS] [SEP]: BERT embeds an empty text


def test_dimensions_keep_the_leading_values(minilm, minilm_path):
    """dimensions N (OpenAI's field, Matryoshka embeddings): the pooled vector's first N values,
    then normalized; the API, /v1/embeddings and ollama's /api/embed alike."""
    full = minilm.embed_tokens(minilm.tokenize("a short text"), normalize=False)
    short = minilm.embed("a short text", dimensions=64)
    np.testing.assert_allclose(short, full[:64] / np.linalg.norm(full[:64]), rtol=1e-5, atol=1e-7)
    assert minilm.embed(["a", "b"], dimensions=8).shape == (2, 8) and minilm.embed([], dimensions=8).shape == (0, 8)
    for bad in (0, 385, 2.5, True):
        with pytest.raises(InvalidArgumentError, match="dimensions must be 1..384"):
            minilm.embed("x", dimensions=bad)
    import json
    import threading
    import urllib.request

    from pyllm.server import make_server
    server = make_server(minilm, "127.0.0.1", 0, name="minilm")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for path, body, pick in (("/v1/embeddings", {"input": "a short text", "dimensions": 64},
                                  lambda r: r["data"][0]["embedding"]),
                                 ("/api/embed", {"input": "a short text", "dimensions": 64},
                                  lambda r: r["embeddings"][0])):
            req = urllib.request.Request(server.url + path, data=json.dumps(body).encode())
            with urllib.request.urlopen(req, timeout=60) as r:
                np.testing.assert_array_equal(np.array(pick(json.loads(r.read())), np.float32), short)
    finally:
        server.shutdown()
        server.server_close()
    from test_cli import pyllm
    r = pyllm("embed", "-m", minilm_path, "--dimensions", "64", "a short text")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(json.loads(r.stdout), short, rtol=1e-6, atol=1e-7)


def test_embed_errors(minilm, minilm_path):
    long = "word " * 600
    with pytest.raises(ContextFullError, match="602 tokens; the model embeds at most 512 .*truncate"):
        minilm.embed(long)
    ids = minilm.embedding_tokens(long, truncate=True)
    assert len(ids) == 512 and ids[0] == 101 and ids[-1] == 102
    assert minilm.embed(long, truncate=True).shape == (384,)
    with pytest.raises(InvalidArgumentError, match="pooling must be one of"):
        minilm.embed("x", pooling="max")
    with pytest.raises(InvalidArgumentError, match="embedding model .*cannot generate"):
        minilm.generate("x")
    with pytest.raises(InvalidArgumentError, match="embedding model"):
        minilm.chat([{"role": "user", "content": "x"}])
    with pytest.raises(InvalidArgumentError, match="embedding model"):
        Model(minilm_path, embedding=False)
    with pytest.raises(InvalidArgumentError, match="str or a list of str"):
        minilm.embed([1, 2])
    with pytest.raises(InvalidArgumentError, match="context"):
        Model(minilm_path, n_ctx=1024)   # learned positions for 512


def test_decoder_embeddings(smollm2_path):
    """A decoder loaded for embeddings: its final norm's rows, pooled (the file says nothing:
    one row per token; "last" pools the last), equal to the reference's; generation refused."""
    with Model(smollm2_path, n_threads=2, embedding=True, n_batch=8) as m:
        assert m.pooling == "none"
        ids = m.tokenize("The capital of France is Paris, and the capital of Italy is Rome.")
        assert len(ids) > 8   # several steps of 8
        rows = m.embed_tokens(ids, normalize=False)
        ref = Reference(m.arch).forward(ids, embeddings=True)
        assert rows.shape == ref.shape == (len(ids), 576)
        # Q4_1 weights and 8-bit activations: 4.1% of the rows' spread from the reference, llama.cpp's
        # own rows (pooling none) 3.8% (measured on this text), the two engines 4.1% apart
        assert np.sqrt(np.mean((rows - ref) ** 2)) / ref.std() < 0.06
        last = m.embed("The capital of France is Paris, and the capital of Italy is Rome.", pooling="last")
        np.testing.assert_allclose(last, rows[-1] / np.linalg.norm(rows[-1]), rtol=1e-5, atol=1e-6)
        assert cos(last, ref[-1]) > 0.995
        with pytest.raises(InvalidArgumentError, match="loaded for embeddings"):
            m.generate("x")
    with Model(smollm2_path, n_threads=2) as m:
        with pytest.raises(InvalidArgumentError, match="embedding=True"):
            m.embed("x")


def test_encoder_pooling_from_the_file(tmp_path):
    """{arch}.pooling_type picks the pooling: 2 is the first row ([CLS]), 3 the last; an unknown
    kind is refused."""
    for kind, name, row in ((2, "cls", 0), (3, "last", -1)):
        path = synth.write_bert(tmp_path / f"p{kind}.gguf", synth.QT.F32, pooling=kind)
        with Model(path, n_threads=1) as m:
            assert m.pooling == name
            rows = m.embed_tokens([2, 7, 9, 3], pooling="none", normalize=False)
            np.testing.assert_array_equal(m.embed_tokens([2, 7, 9, 3], normalize=False), rows[row])
    path = synth.rewrite_metadata(synth.write_bert(tmp_path / "m.gguf", synth.QT.F32), tmp_path / "bad.gguf",
                                  {"bert.pooling_type": 9})
    with pytest.raises(UnsupportedModelError, match="pooling type 9"):
        Model(path)


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "pyllm.cli.main", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_cli_embed(minilm, minilm_path):
    r = run_cli("embed", "-m", minilm_path, "The cat sits on the mat.", "A kitten rests on a rug.")
    assert r.returncode == 0, r.stderr
    got = np.array([json.loads(line) for line in r.stdout.splitlines()], np.float32)
    np.testing.assert_array_equal(got, minilm.embed(["The cat sits on the mat.", "A kitten rests on a rug."]))
    r = run_cli("embed", "-m", minilm_path, "--json", "--pooling", "cls", "--no-normalize", stdin="one\n\ntwo words\n")
    out = json.loads(r.stdout)
    assert (out["pooling"], out["normalized"], out["dims"], out["tokens"]) == ("cls", False, 384, [3, 4])
    np.testing.assert_array_equal(np.array(out["embeddings"], np.float32),
                                  minilm.embed(["one", "two words"], pooling="cls", normalize=False))
    r = run_cli("embed", "-m", minilm_path, "word " * 600)
    assert r.returncode == 2 and "--truncate" in r.stderr and not r.stdout
    for args in (["run", "-p", "hi"], ["chat"], ["bench", "-p", "8", "-n", "4"]):   # generation: refused, one line
        r = run_cli(*args, "-m", minilm_path, stdin="hi\n")
        assert r.returncode == 2 and "is an embedding model (bert)" in r.stderr and "Traceback" not in r.stderr, args
    r = run_cli("info", "-m", minilm_path)
    assert "384 dims, mean pooling" in r.stdout and "attention both ways" in r.stdout


# -- the converter ------------------------------------------------------------------------------

def bert_by_hand(t: dict, ids: list, n_layer: int, n_head: int) -> np.ndarray:
    """BertModel's last hidden state, written from Hugging Face's tensor names (float64)."""
    def lin(x, name):
        return x @ t[name + ".weight"].astype(np.float64).T + t[name + ".bias"]

    def ln(x, name):
        return layernorm(x, t[name + ".weight"], t[name + ".bias"], 1e-12)
    T = len(ids)
    x = ln(t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:T]
           + t["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    for i in range(n_layer):
        p = f"encoder.layer.{i}."
        q, k, v = (lin(x, p + f"attention.self.{m}").reshape(T, n_head, -1) for m in ("query", "key", "value"))
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(q.shape[-1])
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        att = np.einsum("hts,shd->thd", a, v).reshape(T, -1)
        x = ln(x + lin(att, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        x = ln(x + lin(gelu_tanh(lin(x, p + "intermediate.dense")), p + "output.dense"), p + "output.LayerNorm")
    return x


def test_convert_bert(tmp_path):
    """A Hugging Face BERT folder converted as llama.cpp's converter would: names, types, the
    vocabulary respelled, the metadata; and the converted model computes what BertModel does."""
    src, t, vocab = synth.write_hf_bert(tmp_path / "hf")
    out = tmp_path / "m.gguf"
    convert_bert(src, out)
    mf = ModelFile(out)
    md = mf.metadata
    assert md["general.architecture"] == "bert" and md["bert.pooling_type"] == 1 and md["bert.attention.causal"] is False
    assert (md["bert.block_count"], md["bert.embedding_length"], md["bert.context_length"]) == (2, 64, 32)
    assert md["tokenizer.ggml.model"] == "bert" and md["tokenizer.ggml.normalizer.lowercase"] is True
    tokens = list(md["tokenizer.ggml.tokens"])
    assert tokens[:6] == ["[PAD]", "\u2581[unused0]", "\u2581[unused1]", "\u2581[unused2]", "[UNK]", "[CLS]"]
    assert tokens[8:] == ["\u2581the", "\u2581cat", "\u2581sat", "s", "\u2581mat", "\u2581.", "\u2581on"]
    assert [int(md[f"tokenizer.ggml.{k}_token_id"]) for k in ("bos", "eos", "unknown", "seperator", "padding", "mask")] \
        == [5, 6, 4, 6, 0, 7]
    assert [int(x) for x in md["tokenizer.ggml.token_type"]][:8] == [3, 1, 1, 1, 3, 3, 3, 3]
    assert not any(n.startswith("pooler") or "position_ids" in n for n in mf.tensors)
    assert mf.tensor("blk.1.ffn_up.weight").type_name == "F16" and mf.tensor("blk.1.ffn_up.weight").shape == (64, 128)
    assert {mf.tensor(n).type_name for n in ("position_embd.weight", "token_types.weight", "blk.0.attn_q.bias")} == {"F32"}
    np.testing.assert_array_equal(mf.tensor("blk.0.attn_k.weight").data.view(np.float16).reshape(64, 64),
                                  t["encoder.layer.0.attention.self.key.weight"].astype(np.float16))
    with Model(str(out), n_threads=1) as m:
        ids = m.tokenize("The cats sat on the mat.")
        assert ids == [5, 8, 9, 11, 10, 14, 8, 12, 13, 6]   # [CLS] the cat ##s sat on the mat . [SEP]
        want = bert_by_hand(t, ids, 2, 4)
        rows = m.embed_tokens(ids, pooling="none", normalize=False)
        assert np.sqrt(np.mean((rows - want) ** 2)) / want.std() < 2e-3   # F16 weights and KV cache
        np.testing.assert_allclose(m.embed("The cats sat on the mat."), want.mean(0) / np.linalg.norm(want.mean(0)),
                                   atol=2e-3)


def test_convert_refuses_what_it_cannot_read(tmp_path):
    src, t, _ = synth.write_hf_bert(tmp_path / "hf")
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[:len(data) // 2])            # truncated
    with pytest.raises(ModelFileError, match="outside the file"):
        read_safetensors(src / "model.safetensors")
    (src / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + data[8:])   # a header past the end
    with pytest.raises(ModelFileError, match="header length"):
        read_safetensors(src / "model.safetensors")
    (src / "model.safetensors").write_bytes(data)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "position_embedding_type": "rotary"}))
    with pytest.raises(UnsupportedModelError, match="absolute positions"):
        convert_bert(src, tmp_path / "x.gguf")
    (src / "config.json").write_text(json.dumps({**cfg, "hidden_size": "big"}))
    with pytest.raises(ModelFileError, match="config.json"):
        convert_bert(src, tmp_path / "x.gguf")
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(UnsupportedModelError, match="pooling"):
        convert_bert(src, tmp_path / "x.gguf")


def test_gemma_embedding(tmp_path):
    """EmbeddingGemma (synthetic): 6 layers attending both ways, the local ones over 4 positions
    either side; the mean of the rows through the dense projections, as the reference computes
    them; `pyllm info` says so."""
    path = synth.write_gemma_embedding(tmp_path / "m.gguf", synth.QT.F32)
    with Model(path, n_threads=2) as m:
        assert m.embedding and m.pooling == "mean" and [w.shape for w, _ in m.arch.dense_out] == [(256, 384), (384, 256)]
        ids = [int(t) for t in np.random.default_rng(2).integers(1, 500, 30)]
        ref = Reference(m.arch, kv_f16=True).forward(ids)
        assert ref.shape == (30, 256)
        got = m.embed_tokens(ids, normalize=False)
        np.testing.assert_allclose(got, ref.mean(0), rtol=0, atol=1e-4 * np.abs(ref).max())
        with pytest.raises(InvalidArgumentError, match="embedding model"):
            m.generate([1, 2, 3])
    r = run_cli("info", "-m", path)
    assert "through dense projections 256 -> 384 -> 256" in r.stdout and "the 4 positions either way" in r.stdout


def test_reranker(tmp_path):
    """A cross-encoder (bge-reranker's kind: XLM-RoBERTa's vocabulary, a classification head,
    pooling 4): each pair as llama-server builds it, <s> query </s></s> document </s> (or the file's
    rerank template), scored by the head on the first row as the reference scores it; truncation;
    models that do not rank say so."""
    md, _ = synth.unigram_vocab()
    md["tokenizer.ggml.add_sep_token"] = True
    path = synth.write_bert(tmp_path / "rerank.gguf", synth.QT.F32, tokenizer_from=md, rank=1, context_length=64)
    query, docs = "caf\u00e9 hello", ["hello world", "\ufb01nance token model", "\u6771\u4eac the world of izer", "a"]
    with Model(path, n_threads=1) as m:
        assert m.pooling == "rank" and m.embedding_dims == 1
        tok = m.tokenizer
        ids = m.rerank_tokens(query, docs[0])
        assert ids == [0] + tok.encode(query, add_bos=False, add_eos=False) + [2, 2] + \
            tok.encode(docs[0], add_bos=False, add_eos=False) + [2]
        scores = m.rerank(query, docs)
        n_tokens = sum(len(m.rerank_tokens(query, d)) for d in docs)
        ref = Reference(m.arch, kv_f16=True)    # the model's keys and values are f16, as llama.cpp's
        want = [float(m.arch.rank_head(ref.forward(m.rerank_tokens(query, d))[0])[0]) for d in docs]
        np.testing.assert_allclose(scores, want, rtol=1e-3, atol=1e-3)
        assert len(set(np.argsort(scores))) == 4 and max(scores) - min(scores) > 1.0   # the head tells them apart
        long = "hello world " * 40
        with pytest.raises(ContextFullError, match="ranks at most 64"):
            m.rerank(query, [long])
        cut = m.rerank_tokens(query, long, truncate=True)
        assert len(cut) == 64 and cut[-1] == 2 and cut[:len(ids) - 4] == ids[:len(ids) - 4]
        with pytest.raises(InvalidArgumentError, match="list of documents"):
            m.rerank(query, "hello")
    # a template named "rerank" in the file, filled in and read with its special tokens
    templated = synth.rewrite_metadata(path, tmp_path / "templated.gguf", {
        "tokenizer.chat_template.rerank": "<s>query: {query}</s>doc: {document}</s>"})
    with Model(templated, n_threads=1) as m:
        assert m.rerank_tokens("a", "b") == m.tokenizer.encode("<s>query: a</s>doc: b</s>", add_bos=False,
                                                               add_eos=False, parse_special=True)
    with Model(synth.write_bert(tmp_path / "plain.gguf", synth.QT.F32, pooling=2), n_threads=1) as m:
        with pytest.raises(InvalidArgumentError, match="is not a reranker"):
            m.rerank("q", ["d"])
    # `pyllm rerank`: most relevant first, score and index; --json; --top-n
    r = run_cli("rerank", "-m", path, query, *docs)
    assert r.returncode == 0, r.stderr
    best = sorted(range(4), key=lambda i: -scores[i])
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert [(int(i), d) for _, i, d in rows] == [(i, docs[i]) for i in best]
    np.testing.assert_allclose([float(x) for x, _, _ in rows], [scores[i] for i in best], rtol=1e-5)
    out = json.loads(run_cli("rerank", "-m", path, query, "--json", "--top-n", "2", stdin="\n".join(docs)).stdout)
    assert [x["index"] for x in out["results"]] == best[:2]
    assert out["prompt_tokens"] == n_tokens
    r = run_cli("rerank", "-m", synth.write_bert(tmp_path / "p2.gguf", synth.QT.F32), "q", "d")
    assert r.returncode == 2 and "is not a reranker" in r.stderr
    headless = synth.rewrite_metadata(synth.write_bert(tmp_path / "p3.gguf", synth.QT.F32), tmp_path / "h.gguf",
                                      {"bert.pooling_type": 4})
    with pytest.raises(ModelFileError, match="no classification head"):
        Model(headless)
    # Qwen3-Reranker's kind: a decoder, its head the "yes" and "no" rows, softmax over them, on the last row
    rng = np.random.default_rng(1)
    head = (rng.standard_normal((2, 256)) * 0.3).astype(np.float32)
    qwen = synth.rewrite_metadata(synth.write_qwen3(tmp_path / "q.gguf", synth.QT.F32,
                                                    extra_tensors={"cls.output.weight": head}),
                                  tmp_path / "qrank.gguf", {"qwen3.pooling_type": 4,
                                                            "qwen3.classifier.output_labels": ["yes", "no"]})
    with Model(qwen, n_threads=1) as m:
        assert m.pooling == "rank" and m.embedding   # loaded for its rows without asking
        ids = [5, 9, 23, 7, 11, 40, 3]
        last = Reference(m.arch).forward(ids, embeddings=True)[-1]
        p = np.exp(head @ last - (head @ last).max())
        np.testing.assert_allclose(m.embed_tokens(ids), p / p.sum(), rtol=1e-3, atol=1e-4)
    decoder = synth.rewrite_metadata(synth.write_llama(tmp_path / "l.gguf"), tmp_path / "lrank.gguf",
                                     {"llama.pooling_type": 4})
    with pytest.raises(UnsupportedModelError, match="a reranker of architecture llama is not supported"):
        Model(decoder, embedding=True)
