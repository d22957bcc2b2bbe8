"""Importance matrices (pyllm/imatrix.py) and quantizing with them (pyllm quantize --imatrix).

The sums of squares are checked against the numpy reference's inputs to the same
matrices on the same chunk; the weighted quantizers themselves are checked bit for
bit against llama.cpp's in test_kquants.py.
"""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from test_cli import one_error_line, pyllm
from pyllm import Model, kquants
from pyllm.arch import load_architecture
from pyllm.errors import InvalidArgumentError, ModelFileError
from pyllm.imatrix import Imatrix, compute
from pyllm.model_file import ModelFile
from pyllm.quantize import quantize_file
from pyllm.reference import Reference
from pyllm.tokenizer import load_tokenizer

TEXT = "the quick brown fox jumps over the lazy dog; " * 40


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """An F32 llama whose rows are whole K-quant super-blocks (256), BOS added to a text."""
    path = synth.write_model(tmp_path_factory.mktemp("im") / "m.gguf", "llama", QT.F32, n_layer=2, n_embd=256,
                             n_ff=512, n_vocab=512)
    return synth.rewrite_metadata(path, str(path).replace("m.gguf", "bos.gguf"), {"tokenizer.ggml.add_bos_token": True})


class Recording(Reference):
    """The reference, summing the squares of every layer matrix's input rows (an expert
    matrix's per expert, over the rows routed to it)."""

    def __init__(self, arch):
        super().__init__(arch)
        self.sums, self.rows = {}, {}

    def _linear(self, x, w, b):
        if w.name.startswith("blk."):
            x64 = np.asarray(x, dtype=np.float64)
            self.sums[w.name] = self.sums.get(w.name, 0) + (x64 * x64).sum(axis=0)
            self.rows[w.name] = self.rows.get(w.name, 0) + x64.shape[0]
        return super()._linear(x, w, b)

    def _expert_inputs(self, m, e, x, z):
        for t, row in ((m.gate, x), (m.up, x), (m.down, z)):
            if t is None:
                continue
            n_exp, n_in = t.shape[2], t.shape[0]
            sums = self.sums.setdefault(t.name, np.zeros((n_exp, n_in)))
            rows = self.rows.setdefault(t.name, np.zeros(n_exp, np.int64))
            sums[e] += np.asarray(row, np.float64) ** 2
            rows[e] += 1


def test_sums_of_squares_match_the_reference(model):
    """Two chunks of 64 tokens, each from an empty context with BOS first: every layer matrix's
    sums within float32 rounding of the reference's, counted in rows; the output head is not
    collected (llama-imatrix's default)."""
    im = compute(model, TEXT, n_ctx=64, n_batch=32, max_chunks=2, dataset="text")
    mf = ModelFile(model)
    tok = load_tokenizer(mf.metadata)
    ids = tok.encode(TEXT, add_bos=None)
    assert ids[0] == tok.bos_id
    ref = Recording(load_architecture(mf))
    for c in range(2):
        chunk = ids[c * 64:(c + 1) * 64]
        chunk[0] = tok.bos_id
        ref.forward(chunk)
    assert set(im.sums) == set(ref.sums) and "output.weight" not in im.sums
    for name, s in im.sums.items():
        np.testing.assert_allclose(s, ref.sums[name], rtol=2e-3, atol=1e-6 * ref.sums[name].max())
        assert im.counts[name] == ref.rows[name] == 128
    assert (im.chunks, im.chunk_size, im.datasets) == (2, 64, ["text"])


@pytest.mark.parametrize("writer", [synth.write_mixtral, synth.write_qwen3moe], ids=["mixtral", "qwen3moe"])
def test_expert_statistics_match_the_reference(tmp_path, writer):
    """A mixture of experts: each expert matrix's sums and row counts per expert (the rows routed
    to it: a token's input for gate/up, its own hidden row for down) as the reference routes them;
    they survive the file (llama.cpp's [n_in, n_experts] sums, [1, n_experts] counts) and become
    per-expert means, 1 for an expert that saw nothing."""
    moe = writer(tmp_path / "moe.gguf", QT.F32, n_layer=2, n_embd=256, n_vocab=512)
    im = compute(moe, TEXT, n_ctx=64, n_batch=32, max_chunks=2)
    mf = ModelFile(moe)
    tok = load_tokenizer(mf.metadata)
    ids = tok.encode(TEXT, add_bos=None)
    ref = Recording(load_architecture(mf))
    for c in range(2):
        ref.forward(ids[c * 64:(c + 1) * 64])
    experts = [n for n in im.sums if "_exps" in n]
    assert set(im.sums) == set(ref.sums) and len(experts) == 6
    for name, s in im.sums.items():   # the down projections' inputs carry the f16 KV cache's rounding
        np.testing.assert_allclose(s, ref.sums[name], rtol=5e-3, atol=1e-6 * ref.sums[name].max())
        np.testing.assert_array_equal(im.counts[name], ref.rows[name])
    k = load_architecture(mf).layers[0].ffn.k
    for name in experts:
        assert im.sums[name].shape[0] == mf.tensors[name].shape[2] and im.counts[name].sum() == 128 * k
    for layer in range(2):   # each token's router input goes to k experts' up projections
        up, router = im.sums[f"blk.{layer}.ffn_up_exps.weight"], im.sums[f"blk.{layer}.ffn_gate_inp.weight"]
        np.testing.assert_allclose(up.sum(axis=0), k * router, rtol=1e-4)
    im.counts[experts[0]][1] = 0   # an expert that saw nothing
    im.save(tmp_path / "im.gguf", "llama")
    with ModelFile(tmp_path / "im.gguf") as f:
        n_in, n_exp = mf.tensors[experts[0]].shape[0], mf.tensors[experts[0]].shape[2]
        assert f.tensors[experts[0] + ".in_sum2"].shape == (n_in, n_exp)
        assert f.tensors[experts[0] + ".counts"].shape == (1, n_exp)
    means = Imatrix.load(tmp_path / "im.gguf").mean_squares()
    np.testing.assert_array_equal(means[experts[0]][1], 1)
    np.testing.assert_allclose(means[experts[0]][0], im.sums[experts[0]][0] / im.counts[experts[0]][0], rtol=1e-6)
    mf.close()


def test_quantizing_experts_with_it(tmp_path):
    """Each expert's rows are quantized with that expert's importances (llama-quantize's slices):
    the same bytes as quantizing the expert alone."""
    moe = synth.write_mixtral(tmp_path / "moe.gguf", QT.F32, n_layer=1, n_embd=256, n_vocab=512)
    compute(moe, TEXT, n_ctx=64, max_chunks=2).save(tmp_path / "im.gguf", "llama")
    quantize_file(moe, tmp_path / "q.gguf", "Q4_K_M", imatrix=tmp_path / "im.gguf")
    means = Imatrix.load(tmp_path / "im.gguf").mean_squares()
    with ModelFile(moe) as src, ModelFile(tmp_path / "q.gguf") as got:
        for name in ("blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"):
            t = got.tensors[name]
            n_in, n_out, n_exp = t.shape
            x = src.tensors[name].data.view(np.float32).reshape(n_exp, n_out, n_in)
            quant = {QT.Q4_K: kquants.quantize_q4_k, QT.Q6_K: kquants.quantize_q6_k}[QT(t.type)]
            want = b"".join(quant(x[e], means[name][e]).tobytes() for e in range(n_exp))
            assert bytes(t.data) == want, name
            # another expert's importances would give other bytes: the slices are each expert's own
            assert quant(x[0], means[name][1]).tobytes() != want[:len(want) // n_exp], name


def test_file_round_trip_and_means(model, tmp_path):
    im = compute(model, TEXT, n_ctx=64, max_chunks=1)
    im.counts["blk.0.attn_q.weight"] = 0   # a matrix that saw nothing: importance 1, as llama-quantize reads it
    im.save(tmp_path / "im.gguf", "llama")
    back = Imatrix.load(tmp_path / "im.gguf")
    mf = ModelFile(tmp_path / "im.gguf")
    assert mf.get("general.type") == "imatrix" and mf.tensors["blk.1.ffn_down.weight.in_sum2"].shape == (512, 1)
    mf.close()
    assert back.chunks == 1 and back.chunk_size == 64 and set(back.sums) == set(im.sums)
    means = back.mean_squares()
    np.testing.assert_array_equal(means["blk.0.attn_q.weight"], 1)
    name = "blk.1.ffn_up.weight"
    np.testing.assert_allclose(means[name], im.sums[name] / 64, rtol=1e-6)
    with pytest.raises(ModelFileError, match="not an importance matrix"):
        Imatrix.load(model)
    with pytest.raises(InvalidArgumentError, match="is an importance matrix, not a model"):
        Model(tmp_path / "im.gguf", n_threads=2)
    with pytest.raises(InvalidArgumentError, match="no importance matrix"):
        Imatrix.load(tmp_path / "missing.gguf")
    with pytest.raises(InvalidArgumentError, match="at least one chunk"):
        compute(model, "short", n_ctx=64)


def test_quantizing_with_it(model, tmp_path):
    """The K-type matrices it has entries for are quantized by the weighted quantizers with
    its means; the rest as without; llama-quantize's metadata records the file."""
    im = compute(model, TEXT, n_ctx=64, max_chunks=2, dataset="text")
    del im.sums["blk.1.attn_k.weight"]   # no entry: quantized without
    im.save(tmp_path / "im.gguf", "llama")
    p = quantize_file(model, tmp_path / "q.gguf", "Q4_K_M", imatrix=tmp_path / "im.gguf")
    plain = tmp_path / "plain.gguf"
    quantize_file(model, plain, "Q4_K_M")
    src, got, ref = ModelFile(model), ModelFile(tmp_path / "q.gguf"), ModelFile(plain)
    keep_src = ModelFile(model)
    means = Imatrix.load(tmp_path / "im.gguf").mean_squares()
    try:
        assert "blk.0.attn_q.weight" in p.importance and "blk.1.attn_k.weight" not in p.importance
        for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.0.attn_v.weight"):
            t = got.tensors[name]
            x = src.tensors[name].data.view(np.float32).reshape(t.rows, t.shape[0])
            quant = {QT.Q4_K: kquants.quantize_q4_k, QT.Q6_K: kquants.quantize_q6_k}[QT(t.type)]
            assert bytes(t.data) == quant(x, means[name]).tobytes(), name
            assert bytes(t.data) != bytes(ref.tensors[name].data), name
        assert bytes(got.tensors["blk.1.attn_k.weight"].data) == bytes(ref.tensors["blk.1.attn_k.weight"].data)
        assert got.get("quantize.imatrix.file") == str(tmp_path / "im.gguf")
        assert got.get("quantize.imatrix.dataset") == "text" and got.get("quantize.imatrix.chunks_count") == 2
        assert got.get("quantize.imatrix.entries_count") == len(means)
    finally:
        for f in (got, ref):
            f.close()
    src = keep_src
    # the legacy types take it too, and Q4_0's first eighth of down-projections becomes Q4_1 with one
    p = quantize_file(model, tmp_path / "q40.gguf", "Q4_0", imatrix=tmp_path / "im.gguf")
    assert p.types["blk.1.ffn_down.weight"] == QT.Q4_0 and "blk.1.ffn_down.weight" in p.importance
    got = ModelFile(tmp_path / "q40.gguf")
    t = got.tensors["blk.1.ffn_up.weight"]
    x = src.tensors["blk.1.ffn_up.weight"].data.view(np.float32).reshape(t.rows, t.shape[0])
    assert bytes(t.data) == kquants.quantize_legacy_weighted(x, means["blk.1.ffn_up.weight"], "q4_0").tobytes()
    got.close()
    other = synth.write_model(tmp_path / "wide.gguf", "llama", QT.F32, n_layer=2, n_embd=512, n_ff=512, n_vocab=512)
    with pytest.raises(ModelFileError, match="for another model"):
        quantize_file(other, tmp_path / "x.gguf", "Q4_K_M", imatrix=tmp_path / "im.gguf")


def test_cli(model, tmp_path):
    (tmp_path / "t.txt").write_text(TEXT)
    r = pyllm("imatrix", "-m", model, "-f", str(tmp_path / "t.txt"), "-c", "64", "--chunks", "2",
              "-o", str(tmp_path / "im.gguf"), "-t", "2")
    assert r.returncode == 0, r.stderr
    assert "[2/2]" in r.stderr and "14 matrices, 2 chunks of 64 tokens" in r.stderr
    r = pyllm("quantize", model, str(tmp_path / "q.gguf"), "q3_k_m", "--imatrix", str(tmp_path / "im.gguf"))
    assert r.returncode == 0, r.stderr
    assert "14 weighed by" in r.stderr
    one_error_line(pyllm("imatrix", "-m", model, "-f", str(tmp_path / "t.txt"), "-c", "100000", "-o",
                         str(tmp_path / "x.gguf")), "at least one chunk")
    one_error_line(pyllm("quantize", model, str(tmp_path / "y.gguf"), "q8_0", "--imatrix",
                         str(tmp_path / "missing.gguf")), "no importance matrix")


def test_combining(model, tmp_path):
    """--in-file: two runs' statistics add up matrix by matrix (experts expert by expert), their
    chunks and datasets counted; different chunk sizes or shapes refuse; the command combines
    files alone, or adds a new run to them."""
    first = compute(model, TEXT, n_ctx=64, max_chunks=1, dataset="a")
    both = compute(model, TEXT, n_ctx=64, max_chunks=2)
    second = compute(model, "a second text, about other things, " * 20, n_ctx=64, max_chunks=1, dataset="b")
    total = first.add(second)
    assert total.chunks == 2 and total.datasets == ["a", "b"] and set(total.sums) == set(both.sums)
    for name in total.sums:
        np.testing.assert_allclose(total.sums[name], first.sums[name] + second.sums[name], rtol=1e-6)
        assert total.counts[name] == first.counts[name] + second.counts[name] == 128
    experts = Imatrix({"e": np.ones((3, 4), np.float32)}, {"e": np.array([1, 0, 2])}, chunks=1, chunk_size=64)
    doubled = experts.add(experts)
    np.testing.assert_array_equal(doubled.sums["e"], 2)
    np.testing.assert_array_equal(doubled.counts["e"], [2, 0, 4])
    with pytest.raises(InvalidArgumentError, match="one -c"):
        first.add(compute(model, TEXT, n_ctx=32, max_chunks=1))
    with pytest.raises(InvalidArgumentError, match="different models"):
        experts.add(Imatrix({"e": np.ones(4, np.float32)}, {"e": 1}, chunk_size=64))
    first.save(tmp_path / "a.gguf", "llama")
    second.save(tmp_path / "b.gguf", "llama")
    r = pyllm("imatrix", "--in-file", str(tmp_path / "a.gguf"), "--in-file", str(tmp_path / "b.gguf"),
              "-o", str(tmp_path / "ab.gguf"), input="")
    assert r.returncode == 0 and "2 chunks, from 2 files" in r.stderr, r.stderr
    back = Imatrix.load(tmp_path / "ab.gguf")
    np.testing.assert_allclose(back.sums["blk.0.attn_q.weight"], total.sums["blk.0.attn_q.weight"], rtol=1e-6)
    (tmp_path / "t.txt").write_text(TEXT)
    r = pyllm("imatrix", "-m", model, "-f", str(tmp_path / "t.txt"), "-c", "64", "--chunks", "1",
              "--in-file", str(tmp_path / "ab.gguf"), "-o", str(tmp_path / "abc.gguf"))
    assert r.returncode == 0 and Imatrix.load(tmp_path / "abc.gguf").chunks == 3, r.stderr


def test_skipping_chunks_and_snapshots(model, tmp_path):
    """--chunk N skips the text's first N chunks (chunk 0 and 1 together are chunk 1 after
    chunk 0), snapshots come every so many chunks with the statistics so far, and the
    command writes them (-ofreq to -o, --save-frequency as copies)."""
    first, both = compute(model, TEXT, n_ctx=64, max_chunks=1), compute(model, TEXT, n_ctx=64, max_chunks=2)
    second = compute(model, TEXT, n_ctx=64, max_chunks=1, first_chunk=1)
    for name in both.sums:
        np.testing.assert_allclose(first.sums[name] + second.sums[name], both.sums[name], rtol=1e-5)
    seen = []
    last = compute(model, TEXT, n_ctx=64, max_chunks=3, snapshot_every=1, on_snapshot=seen.append)
    assert [s.chunks for s in seen] == [1, 2, 3]
    for name in both.sums:
        np.testing.assert_allclose(seen[1].sums[name], both.sums[name], rtol=1e-6)
        np.testing.assert_array_equal(seen[2].sums[name], last.sums[name])
        assert seen[0].counts[name] * 2 == seen[1].counts[name] == both.counts[name]
    with pytest.raises(InvalidArgumentError, match="one after the 100 skipped"):
        compute(model, TEXT, n_ctx=64, first_chunk=100)
    (tmp_path / "t.txt").write_text(TEXT)
    out = tmp_path / "im.gguf"
    r = pyllm("imatrix", "-m", model, "-f", str(tmp_path / "t.txt"), "-c", "64", "--chunks", "3", "--chunk", "1",
              "-o", str(out), "-ofreq", "2", "--save-frequency", "1", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert [Imatrix.load(tmp_path / f"im.at_{n}.gguf").chunks for n in (1, 2, 3)] == [1, 2, 3]
    np.testing.assert_allclose(Imatrix.load(tmp_path / "im.at_1.gguf").sums["blk.0.attn_q.weight"],
                               second.sums["blk.0.attn_q.weight"], rtol=1e-6)
    assert Imatrix.load(out).chunks == 3


def test_parse_special(smollm2_path):
    """--parse-special: <|im_start|> in the text is the one token, and the statistics change with it."""
    text = "<|im_start|>user\nHello there, how are you today?<|im_end|>\n" * 6
    with ModelFile(smollm2_path) as mf:
        tok = load_tokenizer(mf.metadata)
    tok_ids = {flag: len(tok.encode(text, parse_special=flag)) for flag in (False, True)}
    assert tok_ids[True] < tok_ids[False]
    plain = compute(smollm2_path, text, n_ctx=32, max_chunks=1)
    special = compute(smollm2_path, text, n_ctx=32, max_chunks=1, parse_special=True)
    name = "blk.0.attn_q.weight"
    assert not np.allclose(plain.sums[name], special.sums[name])
