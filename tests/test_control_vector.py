"""Control vectors (pyllm/control_vector.py): llama.cpp's direction.N files added to the
residual stream after layer N, against the reference adding them in its own loop, over the
block layouts that build their loop with Graph.layers (pre-norm, post-norm, Gemma 4, hybrid
layers of a mixer alone); the layer numbering, scales and range as llama.cpp's common code
reads them; and the ways a file or a flag can be wrong. benchmarks/agreement.py
--control-vector compares the same files with llama.cpp's llama_set_adapter_cvec."""
import json

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from test_cli import one_error_line, pyllm
from pyllm import Model
from pyllm.control_vector import combine, read_directions
from pyllm.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from pyllm.reference import Reference

TOKENS = [int(t) for t in np.random.default_rng(3).integers(0, 512, 20)]


def rel(out, ref):
    return float(np.sqrt(np.mean((out - ref) ** 2)) / ref.std())


def test_layers_scales_and_range(tmp_path):
    a = synth.write_control_vector(tmp_path / "a.gguf", 8, range(1, 6), seed=1)
    b = synth.write_control_vector(tmp_path / "b.gguf", 8, [2, 3], seed=2)
    da, db = read_directions(a), read_directions(b)
    assert sorted(da) == [1, 2, 3, 4, 5] and da[1].dtype == np.float32 and da[1].shape == (8,)
    # direction.N goes after model layer N (from 0): layer 0 gets none, N >= n_layer is dropped
    got = combine([(a, 2.0), (b, -0.5)], n_embd=8, n_layer=5)
    assert sorted(got) == [1, 2, 3, 4]
    np.testing.assert_allclose(got[2], 2.0 * da[2] - 0.5 * db[2], rtol=1e-6)
    np.testing.assert_allclose(got[4], 2.0 * da[4], rtol=1e-6)
    assert sorted(combine([a], 8, 5, (2, 3))) == [2, 3]
    assert sorted(combine([a], 8, 5, (0, -1))) == [1, 2, 3, 4]   # 0 or less: the first / the last layer
    assert combine([], 8, 5) == {} and combine(None, 8, 5) == {}
    with pytest.raises(InvalidArgumentError, match="8 wide.*16 wide"):
        combine([a], n_embd=16, n_layer=5)
    with pytest.raises(InvalidArgumentError, match="no control vector at"):
        combine([str(tmp_path / "none.gguf")], 8, 5)


def test_bad_files(tmp_path):
    import gguf
    f16 = synth.write_control_vector(tmp_path / "h.gguf", 8, [1], qtype=QT.F16)
    with pytest.raises(ModelFileError, match="F32"):
        read_directions(f16)
    for name in ("direction.0", "dir.1", "direction.x"):
        w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "controlvector")
        w.add_tensor(name, np.ones(8, np.float32))
        w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
        with pytest.raises(ModelFileError, match="direction.N"):
            read_directions(tmp_path / "bad.gguf")
    llama = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0)
    with pytest.raises(ModelFileError, match="direction.N"):   # a model given as a control vector
        read_directions(llama)
    with pytest.raises(InvalidArgumentError, match="control vector, not a model"):
        Model(f16)


FAMILIES = {"llama": lambda p: synth.write_llama(p, QT.F32, n_layer=4),
            "gemma3": lambda p: synth.write_gemma3(p, QT.F32, n_layer=4),
            "gemma4": lambda p: synth.write_gemma4(p, QT.F32),                  # 6 layers, some sharing KV
            "nemotron_h": lambda p: synth.write_nemotron_h(p, QT.F32, n_layer=4),   # mixer-only layers
            "qwen35": lambda p: synth.write_qwen35(p, QT.F32, n_layer=4)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_matches_the_reference(tmp_path, family):
    model = FAMILIES[family](tmp_path / "m.gguf")
    with Model(model, n_threads=2) as plain:
        n_embd = plain.arch.hp.n_embd
        base = plain.logits(TOKENS)
    cv = synth.write_control_vector(tmp_path / "cv.gguf", n_embd, range(1, 4), size=2.0)
    with Model(model, n_threads=2, control_vectors=[(cv, 1.5)], control_vector_layer_range=(1, 2)) as m:
        assert sorted(m.control) == [1, 2]
        out = m.logits(TOKENS)
        ref = Reference(m.arch, kv_f16=True, control=m.control).forward(np.array(TOKENS))
    assert rel(out, ref) < 3e-3, rel(out, ref)
    assert rel(base, ref) > 0.05, rel(base, ref)   # the vectors change the logits: the check above means something


def test_opposite_scales_cancel_and_encoders_refuse(tmp_path):
    model = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0, n_layer=3)
    cv = synth.write_control_vector(tmp_path / "cv.gguf", 256, [1, 2], size=3.0)
    with Model(model, n_threads=2) as plain, Model(model, n_threads=2, control_vectors=[cv, (cv, -1.0)]) as m:
        assert np.array_equal(plain.logits(TOKENS), m.logits(TOKENS))
    bert = synth.write_bert(tmp_path / "b.gguf", QT.F32)
    with pytest.raises(UnsupportedModelError, match="control vectors are not supported for bert"):
        Model(bert, control_vectors=[cv])


def test_cli_flags(tmp_path):
    model = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0, n_layer=3)
    cv = synth.write_control_vector(tmp_path / "cv.gguf", 256, [1, 2], size=4.0)
    args = ["-m", model, "-p", "hello", "-n", "6", "--temp", "0", "--json", "--ignore-eos"]
    plain = json.loads(pyllm("run", *args).stdout)
    r = pyllm("run", *args, "--control-vector-scaled", f"{cv}:2", "--control-vector-layer-range", "1", "2")
    assert r.returncode == 0, r.stderr
    steered = json.loads(r.stdout)
    assert steered["generated_tokens"] == plain["generated_tokens"] == 6
    assert steered["text"] != plain["text"]
    r = pyllm("run", *args, "--control-vector", cv, "--control-vector-layer-range", "3", "3")
    assert r.returncode == 0 and json.loads(r.stdout)["text"] == plain["text"], r.stderr   # no layer 3 of 3
    one_error_line(pyllm("run", *args, "--control-vector-scaled", cv), "FILE:SCALE")
    one_error_line(pyllm("run", "-m", cv, "-p", "hi"), "control vector, not a model")


def test_split_execution_adds_them_where_the_layer_runs(tmp_path):
    """Half the layers on the simulated GPU, or all: the same logits as the CPU alone."""
    model = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0, n_layer=4)
    cv = synth.write_control_vector(tmp_path / "cv.gguf", 256, [1, 2, 3], size=2.0)
    with Model(model, n_threads=2, control_vectors=[cv]) as m:
        want = m.logits(TOKENS)
    for ngl in (2, "all"):
        with Model(model, n_threads=2, control_vectors=[cv], device="sim", n_gpu_layers=ngl) as m:
            np.testing.assert_allclose(m.logits(TOKENS), want, rtol=0, atol=1e-5 * np.abs(want).max())
