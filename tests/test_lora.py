"""LoRA adapters (pyllm/lora.py): the run-time product W x + s B (A x) against the
reference with the pair merged into the weights (W + s B A, as llama.cpp's
export-lora bakes it in), the scale rules, and every way an adapter file can be
wrong. Adapters here are random (tests/synth.py's write_lora) in llama.cpp's
layout; benchmarks/agreement.py --lora compares the same files with llama.cpp.

Tolerances: pyllm keeps s A in F16, so on float weights the logits sit about
1e-3 of their spread from the merged float32 reference (without an adapter:
about 1e-4, the f16 KV cache alone).
"""
import json
import threading

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from test_cli import one_error_line, pyllm
from test_server import call, served
from pyllm import Model
from pyllm.arch import load_architecture
from pyllm.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from pyllm.lora import open_adapters, parse_scaled
from pyllm.model_file import ModelFile
from pyllm.reference import Reference

TOKENS = [int(t) for t in np.random.default_rng(1).integers(0, 512, 24)]


def reference(model_path, specs, tokens=TOKENS):
    arch = load_architecture(ModelFile(model_path))
    adapters = open_adapters(specs, arch.mf)
    try:
        return Reference(arch, lora=adapters).forward(tokens)
    finally:
        for a in adapters:
            a.close()


def rel(out, ref):
    return float(np.sqrt(np.mean((out - ref) ** 2)) / ref.std())


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return synth.write_llama(tmp_path_factory.mktemp("lora") / "m.gguf", QT.F32)


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16, QT.Q8_0], ids=lambda t: t.name)
def test_adapter_matches_the_merged_reference(tmp_path, llama, qtype):
    """Every layer's attention and FFN matrices adapted, A and B stored in `qtype` (rank 32:
    Q8_0 blocks need whole rows of 32 in B; a Q8_0 B takes 8-bit activations, as every
    quantized matmul does: looser)."""
    adapter = synth.write_lora(tmp_path / "a.gguf", llama, rank=32, qtype=qtype, size=0.5)
    with Model(llama, n_threads=2) as plain, Model(llama, n_threads=2, lora=[adapter]) as m:
        base, out = plain.logits(TOKENS), m.logits(TOKENS)
    ref = reference(llama, [adapter])
    assert rel(out, ref) < (1e-2 if qtype == QT.Q8_0 else 3e-3), rel(out, ref)
    assert (out.argmax(1) == ref.argmax(1)).all()
    assert rel(base, ref) > 0.3   # the adapter changes the model: the comparison above means something


def test_embedding_output_and_tied_head(tmp_path):
    """The token embedding's pair (stored the other way round) adapts the lookup, scaled with it
    (Gemma: sqrt(n_embd)); a tied output head keeps the plain table; an untied output.weight
    is adapted as a matrix like any other."""
    for writer, kw, targets in ((synth.write_gemma3, {}, ["token_embd.weight", "blk.1.attn_v.weight"]),
                                (synth.write_llama, {"tied": True}, ["token_embd.weight"]),
                                (synth.write_llama, {}, ["token_embd.weight", "output.weight"])):
        model = writer(tmp_path / "m.gguf", QT.F16, **kw)
        adapter = synth.write_lora(tmp_path / "a.gguf", model, targets=targets, size=0.05)
        with Model(model, n_threads=2) as plain, Model(model, n_threads=2, lora=[adapter]) as m:
            base, out = plain.logits(TOKENS), m.logits(TOKENS)
        ref = reference(model, [adapter])
        assert rel(out, ref) < 3e-3, (writer.__name__, targets, rel(out, ref))
        assert rel(base, ref) > 0.05, (writer.__name__, targets)


def test_scales_alpha_and_two_adapters(tmp_path, llama):
    """s = scale * alpha / rank (scale alone without alpha); scale 0 gives the plain model
    bit for bit; two adapters on the same weights add up."""
    with_alpha = synth.write_lora(tmp_path / "a.gguf", llama, rank=8, alpha=4.0, size=0.5, seed=1)
    no_alpha = synth.write_lora(tmp_path / "b.gguf", llama, rank=8, alpha=None, size=0.5, seed=2)
    with Model(llama, n_threads=2) as plain, Model(llama, n_threads=2, lora=[(with_alpha, 0.0)]) as off:
        assert np.array_equal(plain.logits(TOKENS), off.logits(TOKENS))
    specs = [(with_alpha, 1.5), (no_alpha, 0.25)]
    adapters = open_adapters(specs, ModelFile(llama))
    assert [a.effective_scale(a.pairs[0]) for a in adapters] == [1.5 * 4.0 / 8, 0.25]
    with Model(llama, n_threads=2, lora=specs) as m:
        out = m.logits(TOKENS)
    ref = reference(llama, specs)
    assert rel(out, ref) < 3e-3
    assert rel(reference(llama, specs[:1]), ref) > 0.1   # the second adapter counts


def test_set_lora_scale_drops_what_the_cache_holds(tmp_path, llama):
    """A new scale acts as a model loaded with it, also for text the old scale already read
    (the prompt and the conversation are recomputed, not taken from the cache)."""
    adapter = synth.write_lora(tmp_path / "a.gguf", llama, size=0.5)
    prompt = list(TOKENS[:12])
    with Model(llama, n_threads=2, lora=[adapter]) as m, Model(llama, n_threads=2, lora=[(adapter, 0.3)]) as fresh:
        m.generate(prompt, max_tokens=4, temperature=0)
        m.set_lora_scale(0, 0.3)
        again = m.generate(prompt, max_tokens=8, temperature=0)
        want = fresh.generate(prompt, max_tokens=8, temperature=0)
        assert again.tokens == want.tokens
        assert np.array_equal(m.logits(TOKENS), fresh.logits(TOKENS))
        for bad in ((1, 0.5), (0, float("nan")), (0, "1")):
            with pytest.raises(InvalidArgumentError):
                m.set_lora_scale(*bad)


def test_parallel_and_split_runs_apply_the_adapter(tmp_path, llama):
    """Batched steps of several sequences, and a run split between the CPU and the simulated
    device, give the adapter's logits."""
    adapter = synth.write_lora(tmp_path / "a.gguf", llama, size=0.5)
    with Model(llama, n_threads=2, lora=[adapter]) as m:
        want = m.logits(TOKENS)
        alone = [m.generate(p, max_tokens=6, temperature=0).tokens for p in (TOKENS[:5], TOKENS[5:11])]
        m.parallel(2)
        got = [None, None]

        def run(i, p):
            with m.slots.take():
                got[i] = m.generate(p, max_tokens=6, temperature=0).tokens
        threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate((TOKENS[:5], TOKENS[5:11]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == alone
    with Model(llama, n_threads=2, lora=[adapter], device="sim", n_gpu_layers=1) as split:
        assert rel(split.logits(TOKENS), want) < 1e-4


def test_smollm2_adapter_matches_the_merged_reference(tmp_path, smollm2_path):
    """A rank-8 F16 adapter on every attention and FFN matrix of the real model, on
    test_forward's text: the C core with 8-bit activations sits about as far from exact
    math as without an adapter (3.3% of the logits' spread there; llama.cpp sits 3.2%
    away with a like adapter, benchmarks/agreement.py --lora)."""
    from test_forward import SMOLLM2_TEXT
    adapter = synth.write_lora(tmp_path / "a.gguf", smollm2_path, size=0.15)
    with Model(smollm2_path, n_threads=2, lora=[adapter]) as m:
        tokens = m.tokenize(SMOLLM2_TEXT)[:64]
        out = m.logits(tokens)
    arch = load_architecture(ModelFile(smollm2_path))
    adapters = open_adapters([adapter], arch.mf)
    ref = Reference(arch, lora=adapters).forward(tokens)
    plain = Reference(load_architecture(ModelFile(smollm2_path))).forward(tokens)
    assert rel(out, ref) < 0.05, rel(out, ref)
    assert rel(plain, ref) > 0.2
    rms = float(np.sqrt(np.mean((out - ref) ** 2)))
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 3 * rms
    assert clear.sum() >= 30 and (out.argmax(1)[clear] == ref.argmax(1)[clear]).all()


def test_bad_adapters_are_refused(tmp_path, llama):
    mf = ModelFile(llama)
    good = synth.write_lora(tmp_path / "good.gguf", llama, targets=["blk.0.attn_q.weight"])
    cases = [
        (llama, ModelFileError, "not a LoRA adapter"),
        (tmp_path / "missing.gguf", InvalidArgumentError, "no LoRA adapter at"),
        (synth.write_lora(tmp_path / "arch.gguf", llama, targets=["blk.0.attn_q.weight"], arch="qwen2"),
         InvalidArgumentError, "adapts a qwen2 model"),
        (synth.write_lora(tmp_path / "none.gguf", llama, targets=["blk.0.attn_q.weight"], rank=8,
                          extra={"blk.0.attn_q.weight.lora_z": np.zeros(8)}), ModelFileError, "neither"),
    ]
    # a pair for a tensor the model lacks, a half without its other half, a pair of the wrong shape
    other = synth.write_llama(tmp_path / "other.gguf", QT.F32, n_embd=128)
    cases.append((synth.write_lora(tmp_path / "shape.gguf", other, targets=["blk.0.attn_q.weight"]),
                  InvalidArgumentError, "the adapter is for another model"))
    cases.append((synth.write_lora(tmp_path / "absent.gguf", llama, targets=[], extra={
        "blk.9.attn_q.weight.lora_a": np.zeros((8, 256)), "blk.9.attn_q.weight.lora_b": np.zeros((256, 8))}),
        InvalidArgumentError, "does not have"))
    cases.append((synth.write_lora(tmp_path / "half.gguf", llama, targets=[], extra={
        "blk.0.attn_q.weight.lora_a": np.zeros((8, 256))}), ModelFileError, "not its other half"))
    for path, error, words in cases:
        with pytest.raises(error, match=words):
            open_adapters([str(path)], mf)
    with pytest.raises(InvalidArgumentError, match="finite"):
        open_adapters([(good, float("inf"))], mf)
    with pytest.raises(InvalidArgumentError, match="is a LoRA adapter, not a model"):
        Model(good, n_threads=2)
    assert open_adapters([good], mf)[0].pairs[0].target == "blk.0.attn_q.weight"
    # norm deltas are skipped, as llama.cpp skips them
    normed = synth.write_lora(tmp_path / "norm.gguf", llama, targets=["blk.0.attn_q.weight"],
                              extra={"blk.0.attn_norm.weight": np.ones(256)})
    assert len(open_adapters([normed], mf)[0].pairs) == 1


def test_adapters_on_expert_matrices_are_refused(tmp_path):
    """A pair pyllm would have no plain matrix product to apply to is an error, not ignored."""
    moe = synth.write_mixtral(tmp_path / "moe.gguf", QT.F32)
    names = [n for n in ModelFile(moe).tensors if "exps" in n][:1]
    adapter = synth.write_lora(tmp_path / "a.gguf", moe, targets=[], extra={
        names[0] + ".lora_a": np.zeros((8, 256)), names[0] + ".lora_b": np.zeros((8, 8))})
    with pytest.raises(UnsupportedModelError, match="2-D weights only"):
        Model(moe, n_threads=2, lora=[adapter])


def test_lora_scaled_syntax():
    assert parse_scaled("a.gguf:0.5") == ("a.gguf", 0.5)
    assert parse_scaled("C:/x/a.gguf:2") == ("C:/x/a.gguf", 2.0)
    for bad in ("a.gguf", "a.gguf:half", ":1"):
        with pytest.raises(InvalidArgumentError, match="FILE:SCALE"):
            parse_scaled(bad)


def test_cli_run_with_an_adapter(tmp_path, llama):
    """--lora and --lora-scaled give what the Python API gives; a bad adapter is one clear line."""
    adapter = synth.write_lora(tmp_path / "a.gguf", llama, size=0.5)
    prompt = "hello world"
    with Model(llama, n_threads=2, lora=[(adapter, 0.5)]) as m:
        want = m.generate(prompt, max_tokens=8, temperature=0).text
    with Model(llama, n_threads=2) as m:
        plain = m.generate(prompt, max_tokens=8, temperature=0).text
    assert want != plain
    common = ["run", "-m", llama, "-p", prompt, "-n", "8", "--temp", "0", "-t", "2"]
    r = pyllm(*common, "--lora-scaled", f"{adapter}:0.5")
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + ("" if want.endswith("\n") else "\n")
    assert "LoRA adapter" in r.stderr   # a note says what was applied
    one_error_line(pyllm(*common, "--lora", llama), "not a LoRA adapter")
    one_error_line(pyllm(*common, "--lora-scaled", adapter), "FILE:SCALE")


def test_bench_counts_the_adapter(tmp_path, llama):
    """pyllm bench --lora: a decode step reads the adapter's s A (F16) and B (float32) too."""
    adapter = synth.write_lora(tmp_path / "a.gguf", llama, rank=8)
    common = ["bench", "-m", llama, "-p", "8", "-n", "4", "-r", "1", "-t", "2", "--json"]
    plain, adapted = (json.loads(pyllm(*common, *extra).stdout)["per_threads"]["2"]["decode_bytes_per_token"]
                      for extra in ((), ("--lora", adapter)))
    pairs = open_adapters([adapter], ModelFile(llama))[0].pairs
    assert adapted - plain == sum(p.scaled_a.nbytes + p.b_cols.nbytes for p in pairs)


def test_server_lists_and_rescales_adapters(tmp_path, llama):
    """llama-server's GET/POST /lora-adapters: the list with each adapter's scale, and new scales
    that the next request runs with."""
    adapter = synth.write_lora(tmp_path / "a.gguf", llama, size=0.5)
    prompt = list(TOKENS[:10])
    with Model(llama, n_threads=2, lora=[(adapter, 0.3)]) as fresh:
        want = fresh.generate(prompt, max_tokens=6, temperature=0).tokens
    with Model(llama, n_threads=2, lora=[adapter]) as m:
        with served(m, parallel=1) as server:
            assert call(server.url, "/lora-adapters") == (200, [{"id": 0, "path": adapter, "scale": 1.0}])
            assert call(server.url, "/lora-adapters", [{"id": 0, "scale": 0.3}])[0] == 200
            assert call(server.url, "/lora-adapters")[1][0]["scale"] == 0.3
            status, got = call(server.url, "/completion", {"prompt": prompt, "n_predict": 6, "temperature": 0,
                                                           "return_tokens": True})
            assert status == 200 and got["tokens"] == want
            assert call(server.url, "/lora-adapters", [{"id": 3, "scale": 1}])[0] == 400


def test_server_takes_scales_per_request(tmp_path, llama):
    """A request's "lora" list (llama-server's: the adapters it leaves out at 0) runs with those
    scales, also when requests with other scales come before and after; a request without one
    gets the server's scales, which GET /lora-adapters still lists."""
    adapter = synth.write_lora(tmp_path / "a.gguf", llama, size=0.5)
    prompt = list(TOKENS[:10])
    want = {}
    for scale in (0.0, 0.3, 1.0):
        with Model(llama, n_threads=2, lora=[(adapter, scale)]) as fresh:
            want[scale] = fresh.generate(prompt, max_tokens=6, temperature=0).tokens
    assert len({tuple(t) for t in want.values()}) == 3
    body = {"prompt": prompt, "n_predict": 6, "temperature": 0, "return_tokens": True}
    with Model(llama, n_threads=2, lora=[adapter]) as m, served(m, parallel=2) as server:
        for lora, scale in (([{"id": 0, "scale": 0.3}], 0.3), (None, 1.0), ([], 0.0), ([{"id": 0}], 0.0),
                            ([{"id": 0, "scale": 0.3}], 0.3), (None, 1.0)):
            status, got = call(server.url, "/completion", {**body, **({} if lora is None else {"lora": lora})})
            assert status == 200 and got["tokens"] == want[scale], (lora, got)
        status, got = call(server.url, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                           "lora": [{"id": 0, "scale": 0.3}]})
        assert status == 200 and got["choices"][0]["text"] == m.detokenize(want[0.3])
        assert call(server.url, "/lora-adapters")[1][0]["scale"] == 1.0
        for bad in ([{"id": 1, "scale": 1}], [{"scale": 1}], {"id": 0}, [{"id": 0, "scale": "x"}]):
            assert call(server.url, "/completion", {**body, "lora": bad})[0] == 400, bad
