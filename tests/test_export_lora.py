"""pyllm export-lora (pyllm/export_lora.py): adapters merged into the weights give the model
that runs them (W + s B A, as the reference merges them), float weights keep their type and
quantized ones become F16 (llama-export-lora's rule), and a tied head keeps the plain table."""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from test_cli import one_error_line, pyllm
from pyllm import Model
from pyllm.arch import load_architecture
from pyllm.errors import InvalidArgumentError
from pyllm.export_lora import export_lora
from pyllm.lora import open_adapters
from pyllm.model_file import ModelFile
from pyllm.reference import Reference

TOKENS = [int(t) for t in np.random.default_rng(2).integers(0, 512, 24)]


def rel(out, ref):
    return float(np.sqrt(np.mean((out - ref) ** 2)) / ref.std())


def test_merged_weights_are_the_reference_s(tmp_path):
    """F32 weights: the merged file's matrices are the reference's W + s B A bit for bit (two
    adapters at their scales), its logits those of the model running the adapters."""
    model = synth.write_llama(tmp_path / "m.gguf", QT.F32)
    a = synth.write_lora(tmp_path / "a.gguf", model, size=0.5, seed=1)
    b = synth.write_lora(tmp_path / "b.gguf", model, size=0.5, seed=2, alpha=None)
    specs = [(a, 0.7), (b, 0.2)]
    merged = export_lora(model, specs, tmp_path / "merged.gguf")
    assert "blk.0.attn_q.weight" in merged
    arch = load_architecture(ModelFile(model))
    adapters = open_adapters(specs, arch.mf)
    ref = Reference(arch, lora=adapters)
    with ModelFile(tmp_path / "merged.gguf") as out:
        for name in merged:
            t = out.tensors[name]
            assert t.type == QT.F32
            np.testing.assert_array_equal(t.data.view(np.float32).reshape(t.rows, t.shape[0]),
                                          ref.w(arch.mf.tensor(name)))
        assert set(out.tensors) == set(arch.mf.tensors)
    with Model(tmp_path / "merged.gguf", n_threads=2) as m, Model(model, n_threads=2, lora=specs) as live:
        out_logits, live_logits = m.logits(TOKENS), live.logits(TOKENS)
    want = ref.forward(TOKENS)
    assert rel(out_logits, want) < 1e-3 and rel(live_logits, want) < 3e-3


def test_quantized_weights_become_f16_and_a_tied_head_stays(tmp_path):
    model = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0, tied=True)
    adapter = synth.write_lora(tmp_path / "a.gguf", model, targets=["token_embd.weight", "blk.1.attn_v.weight"],
                               size=0.05)
    export_lora(model, [adapter], tmp_path / "merged.gguf")
    with ModelFile(model) as src, ModelFile(tmp_path / "merged.gguf") as out:
        assert out.tensors["blk.1.attn_v.weight"].type == QT.F16 and out.tensors["token_embd.weight"].type == QT.F16
        assert out.tensors["blk.0.attn_v.weight"].type == QT.Q8_0
        assert bytes(out.tensors["blk.0.attn_v.weight"].data) == bytes(src.tensors["blk.0.attn_v.weight"].data)
        assert bytes(out.tensors["output.weight"].data) == bytes(src.tensors["token_embd.weight"].data)
    with Model(tmp_path / "merged.gguf", n_threads=2) as m, Model(model, n_threads=2, lora=[adapter]) as live, \
            Model(model, n_threads=2) as plain:
        got, want, base = m.logits(TOKENS), live.logits(TOKENS), plain.logits(TOKENS)
    arch = load_architecture(ModelFile(model))
    ref = Reference(arch, kv_f16=True, lora=open_adapters([adapter], arch.mf)).forward(TOKENS)
    # both within the Q8_0 products' activation rounding (about 1%) of the merged reference; the
    # adapter moves the logits about 12%
    assert rel(got, ref) < 0.02 and rel(want, ref) < 0.02 and rel(base, ref) > 0.06
    with pytest.raises(InvalidArgumentError, match="no adapter"):
        export_lora(model, [], tmp_path / "x.gguf")
    with pytest.raises(InvalidArgumentError, match="overwrite"):
        export_lora(model, [adapter], model)


def test_cli(tmp_path):
    model = synth.write_llama(tmp_path / "m.gguf", QT.F16)
    adapter = synth.write_lora(tmp_path / "a.gguf", model, size=0.5)
    r = pyllm("export-lora", "-m", model, "--lora-scaled", f"{adapter}:0.5", "-o", str(tmp_path / "out.gguf"))
    assert r.returncode == 0 and "weights merged" in r.stderr, r.stderr
    with Model(tmp_path / "out.gguf", n_threads=2) as m, Model(model, n_threads=2, lora=[(adapter, 0.5)]) as live:
        assert rel(m.logits(TOKENS), live.logits(TOKENS)) < 3e-3
    one_error_line(pyllm("export-lora", "-m", model, "-o", str(tmp_path / "x.gguf")), "no adapter")
