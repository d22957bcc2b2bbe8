"""pyllm cvector-generator (pyllm/cvector.py): the residual stream the forward step copies
out after each layer against the reference's, the directions against their definitions
(the differences' principal axis, or their mean), llama.cpp's file written and read back,
and the command line."""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from test_cli import one_error_line, pyllm
from pyllm.control_vector import read_directions
from pyllm.cvector import direction, generate, hidden_states, pair_tokens, write
from pyllm.errors import InvalidArgumentError, UnsupportedModelError
from pyllm.model_file import ModelFile
from pyllm.reference import Reference

FAMILIES = {"llama": lambda p: synth.write_llama(p, QT.F32, n_layer=4),
            "gemma3": lambda p: synth.write_gemma3(p, QT.F32, n_layer=4),
            "gemma4": lambda p: synth.write_gemma4(p, QT.F32)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hidden_states_match_the_reference(tmp_path, family):
    from pyllm.arch import load_architecture
    model = FAMILIES[family](tmp_path / "m.gguf")
    prompts = [[int(t) for t in np.random.default_rng(n).integers(1, 500, n)] for n in (3, 17)]
    got = hidden_states(model, prompts, n_threads=2)
    with ModelFile(model) as mf:
        arch = load_architecture(mf, n_ctx=32)
        ref = Reference(arch, kv_f16=True)
        n_layer = arch.hp.n_layer
        for tokens, rows in zip(prompts, got):
            ref.forward(np.array(tokens))
            assert sorted(rows) == list(range(n_layer - 1))       # every layer but the last
            for layer, x in rows.items():
                want = ref.layer_outputs[layer]
                assert x.shape == want.shape == (len(tokens), arch.hp.n_embd)
                err = np.sqrt(np.mean((x - want) ** 2)) / want.std()
                assert err < 3e-3, (layer, err)


def test_directions_by_their_definitions():
    rng = np.random.default_rng(1)
    axis = rng.standard_normal(64)
    axis /= np.linalg.norm(axis)
    diffs = (rng.standard_normal((40, 1)) * 3 + 1) * axis + rng.standard_normal((40, 64)) * 0.05
    v = direction(diffs.astype(np.float32), "pca")
    d = diffs.astype(np.float64)
    w, vecs = np.linalg.eigh(d.T @ d)
    top = vecs[:, -1] * np.sign(vecs[:, -1] @ d.mean(axis=0))   # the largest eigenvalue's, signed by the mean
    np.testing.assert_allclose(v, top, atol=1e-5)
    assert abs(np.linalg.norm(v) - 1) < 1e-6 and v @ axis > 0.99
    np.testing.assert_allclose(direction(-diffs, "pca"), -v, atol=1e-5)   # the sign follows the differences
    mean = d.mean(axis=0)
    np.testing.assert_allclose(direction(diffs, "mean"), mean / np.linalg.norm(mean), rtol=1e-5)


def test_pairs_padded_and_shared_rows_dropped(tmp_path):
    from pyllm.tokenizer import load_tokenizer
    model = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0, n_layer=3)
    with ModelFile(model) as mf:
        tok = load_tokenizer(mf.metadata)
    pos, neg = pair_tokens(tok, "a b c d e", "a b")
    space = tok.encode(" ", add_bos=False)[-1]
    n_neg = len(tok.encode("a b", add_bos=None))
    assert len(pos) == len(neg) > n_neg and neg[n_neg:] == [space] * (len(neg) - n_neg)
    assert pos == tok.encode("a b c d e", add_bos=None)
    # the first tokens of both are the same: their rows' differences are zero and left out;
    # a pair that reads the same throughout has nothing to give
    directions, hint = generate(model, ["a b c d e", "x y"], ["a b", "x z"], "mean", n_threads=1)
    assert hint == "llama" and sorted(directions) == [1, 2]
    with pytest.raises(InvalidArgumentError, match="reads the same"):
        generate(model, ["same"], ["same"], n_threads=1)


def test_file_written_read_back_and_steering(tmp_path):
    model = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0, n_layer=4)
    positive, negative = ["happy days are here", "joy and sun"], ["sad days are here", "grief and rain"]
    directions, hint = generate(model, positive, negative, n_threads=2)
    assert sorted(directions) == [1, 2, 3]
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 and v.dtype == np.float32 for v in directions.values())
    swapped, _ = generate(model, negative, positive, n_threads=2)
    for n in directions:
        np.testing.assert_allclose(swapped[n], -directions[n], atol=1e-5)
    path = tmp_path / "cv.gguf"
    write(path, directions, hint)
    back = read_directions(path)
    assert sorted(back) == [1, 2, 3] and all(np.array_equal(back[n], directions[n]) for n in back)
    with ModelFile(path) as mf:
        assert mf.architecture == "controlvector" and mf.get("controlvector.model_hint") == "llama"
        assert mf.get("controlvector.layer_count") == 3


def test_refused_models(tmp_path):
    for write_model, message in ((lambda p: synth.write_bert(p, QT.F32), "embedding model"),
                                 (lambda p: synth.write_qwen35(p, QT.F32, n_layer=4), "recurrent state")):
        with pytest.raises(UnsupportedModelError, match=message):
            generate(write_model(tmp_path / "m.gguf"), ["a"], ["b"], n_threads=1)


def test_cli(tmp_path):
    model = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0, n_layer=3)
    pos, neg, out = tmp_path / "pos.txt", tmp_path / "neg.txt", tmp_path / "cv.gguf"
    pos.write_text("happy\\tdays\n\nbright\n")
    neg.write_text("sad\\tdays\ndark\n")
    r = pyllm("cvector-generator", "-m", model, "--positive-file", str(pos), "--negative-file", str(neg),
              "-o", str(out), "--method", "mean", "-t", "1")
    assert r.returncode == 0 and "wrote 2 directions" in r.stderr, r.stderr
    want, _ = generate(model, ["happy\tdays", "bright"], ["sad\tdays", "dark"], "mean", n_threads=1)
    back = read_directions(out)
    assert all(np.allclose(back[n], want[n], atol=1e-6) for n in want)
    r = pyllm("run", "-m", model, "-p", "hello", "-n", "3", "--control-vector-scaled", f"{out}:2")
    assert r.returncode == 0, r.stderr
    neg.write_text("one\n")
    one_error_line(pyllm("cvector-generator", "-m", model, "--positive-file", str(pos), "--negative-file", str(neg)),
                   "2 positive and 1 negative prompts")
    one_error_line(pyllm("cvector-generator", "-m", model, "--positive-file", str(tmp_path / "none.txt"),
                         "--negative-file", str(neg)), "cannot read the positive prompts")
    one_error_line(pyllm("cvector-generator", "-m", model, "--positive-file", str(neg), "--negative-file", str(neg),
                         "--method", "svd"), "--method takes pca or mean")
