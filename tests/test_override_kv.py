"""--override-kv (ModelFile's overrides, Model(override_kv=)): a value used instead of the
file's, read as the file's own would be (a RoPE base override gives the logits of a file
written with that base), written out by quantize, and every bad spec one clear error."""
import json

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from test_cli import one_error_line, pyllm
from pyllm import Model
from pyllm.errors import InvalidArgumentError
from pyllm.model_file import ModelFile, parse_override
from pyllm.quantize import quantize_file


def test_specs():
    assert parse_override("llama.context_length=int:8192") == ("llama.context_length", 8192)
    assert parse_override("llama.rope.freq_base=float:1e6") == ("llama.rope.freq_base", 1e6)
    assert parse_override("tokenizer.ggml.add_bos_token=bool:False") == ("tokenizer.ggml.add_bos_token", False)
    assert parse_override("general.name=str:a=b:c") == ("general.name", "a=b:c")
    for bad, words in (("x", "KEY=TYPE:VALUE"), ("x=int", "KEY=TYPE:VALUE"), ("x=int:1.5", "not an int"),
                       ("x=bool:yes", "not a bool"), ("x=float:nan", "not a float"), ("x=list:1", "int, float")):
        with pytest.raises(InvalidArgumentError, match=words):
            parse_override(bad)


def test_a_rope_base_override_is_that_file(tmp_path):
    a = synth.write_llama(tmp_path / "a.gguf", QT.F32, rope_base=10000.0)
    b = synth.write_llama(tmp_path / "b.gguf", QT.F32, rope_base=50000.0)
    ids = list(range(1, 40))
    with Model(a, n_threads=2) as plain, Model(b, n_threads=2) as want, \
            Model(a, n_threads=2, override_kv={"llama.rope.freq_base": 50000.0}) as got:
        assert np.array_equal(got.logits(ids), want.logits(ids))
        assert not np.array_equal(plain.logits(ids), want.logits(ids))
    with pytest.raises(InvalidArgumentError, match="override llama.block_count=-1"):
        Model(a, override_kv={"llama.block_count": -1})
    with pytest.raises(InvalidArgumentError, match="override general.architecture=3"):
        ModelFile(a, overrides={"general.architecture": 3})


def test_bos_override_and_quantize(smollm2_path, tmp_path):
    with Model(smollm2_path, n_ctx=64) as m, \
            Model(smollm2_path, n_ctx=64, override_kv={"tokenizer.ggml.add_bos_token": True}) as bos:
        assert bos.tokenize("Hi") == [m.tokenizer.bos_id] + m.tokenize("Hi")
    f32 = synth.write_llama(tmp_path / "f.gguf", QT.F32)
    quantize_file(f32, tmp_path / "q.gguf", "Q8_0", overrides={"general.name": "renamed", "llama.context_length": 99,
                                                               "llama.rope.freq_base": 20000.0, "x.flag": True})
    with ModelFile(tmp_path / "q.gguf") as q:
        assert (q.get("general.name"), q.get("llama.context_length"), q.get("x.flag")) == ("renamed", 99, True)
        assert q.get("llama.rope.freq_base") == 20000.0


def test_cli(smollm2_path):
    r = pyllm("tokenize", "-m", smollm2_path, "-p", "Hi", "--ids",
              "--override-kv", "tokenizer.ggml.add_bos_token=bool:true")
    assert r.returncode == 0 and json.loads(r.stdout)[0] == 1, r.stderr
    r = pyllm("info", "-m", smollm2_path, "--override-kv", "general.name=str:Renamed")
    assert r.returncode == 0 and "Renamed" in r.stdout and "metadata overridden" in r.stdout, r.stderr
    one_error_line(pyllm("run", "-m", smollm2_path, "-p", "hi", "--override-kv", "llama.context_length=int:x"),
                   "not an int")


def test_rope_flags_are_the_file_s_keys(tmp_path):
    """--rope-scaling/--rope-scale/--rope-freq-scale/--rope-freq-base/--yarn-orig-ctx: the same
    logits as a file carrying those keys (the family's, through "{arch}." overrides)."""
    from cli.options import rope_overrides
    model = synth.write_llama(tmp_path / "m.gguf", QT.F32)
    ids = list(range(1, 60))
    cases = [(("linear", 2.0, None, None, None),
              {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}),
             ((None, None, 20000.0, 0.25, None), {"llama.rope.freq_base": 20000.0, "llama.rope.scaling.factor": 4.0}),
             (("yarn", 4.0, None, None, 32), {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
                                              "llama.rope.scaling.original_context_length": 32})]
    with Model(model, n_threads=2) as plain:
        base = plain.logits(ids)
    for flags, keys in cases:
        want_path = synth.rewrite_metadata(model, tmp_path / "w.gguf", keys)
        with Model(want_path, n_threads=2) as want, \
                Model(model, n_threads=2, override_kv=rope_overrides(*flags)) as got:
            assert np.array_equal(got.logits(ids), want.logits(ids)), flags
            assert not np.array_equal(got.logits(ids), base), flags
    for bad in (("cubic", None, None, None, None), (None, 2.0, None, 0.5, None), (None, -1.0, None, None, None)):
        with pytest.raises(InvalidArgumentError):
            rope_overrides(*bad)
    r = pyllm("run", "-m", model, "-p", "hi", "-n", "2", "--rope-scaling", "yarn", "--rope-scale", "4",
              "--yarn-orig-ctx", "32", "--json")
    assert r.returncode == 0, r.stderr
    one_error_line(pyllm("run", "-m", model, "-p", "hi", "--rope-scaling", "cubic"), "none, linear or yarn")
