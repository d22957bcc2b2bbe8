"""pyllm quantize (pyllm/quantize.py): which tensors get which type, the file it writes (metadata
copied, tensors decoding to their source values within each format's error), and the model it makes
running close to the float one."""
import json
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

import synth
from pyllm import Model
from pyllm.errors import InvalidArgumentError
from pyllm.model_file import ModelFile
from pyllm.quantize import _more_bits, is_quantizable, plan, quantize_file


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    """A tiny llama in F32 (8 layers: the _M mixes' layer rule shows), its row length 256."""
    return synth.write_model(tmp_path_factory.mktemp("q") / "f32.gguf", "llama", QT.F32, n_layer=8, n_embd=256,
                             n_ff=512, n_vocab=512)


def test_which_tensors_are_quantized():
    assert is_quantizable("blk.0.attn_q.weight", (256, 256))
    assert is_quantizable("token_embd.weight", (256, 512))
    assert not is_quantizable("blk.0.attn_norm.weight", (256,))
    assert not is_quantizable("blk.0.attn_q.bias", (256, 4))
    assert not is_quantizable("blk.0.ffn_gate_inp.weight", (256, 8))        # the MoE router
    assert not is_quantizable("position_embd.weight", (256, 512))
    assert not is_quantizable("blk.0.ssm_conv1d.weight", (4, 512))
    assert not is_quantizable("blk.3.post_attention_norm.weight", (256, 1))


def test_more_bits_layers_are_llama_cpps():
    # 32 layers: the first 4, the last 4, and every third from layer 6 (llama.cpp's use_more_bits)
    assert [i for i in range(32) if _more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_the_mixes(f32_model):
    m = ModelFile(f32_model)
    try:
        q4km = plan(m, "Q4_K_M").types
        assert q4km["output.weight"] == QT.Q6_K and q4km["token_embd.weight"] == QT.Q4_K
        more = [QT.Q6_K if i in (0, 3, 6, 7) else QT.Q4_K for i in range(8)]   # use_more_bits(i, 8)
        assert [q4km[f"blk.{i}.attn_v.weight"] for i in range(8)] == more
        assert [q4km[f"blk.{i}.ffn_down.weight"] for i in range(8)] == more
        assert q4km["blk.3.attn_q.weight"] == QT.Q4_K and q4km["blk.3.attn_norm.weight"] == QT.F32
        q4ks = plan(m, "Q4_K_S").types
        assert [q4ks[f"blk.{i}.attn_v.weight"] for i in range(8)] == [QT.Q5_K] * 4 + [QT.Q4_K] * 4
        assert [q4ks[f"blk.{i}.ffn_down.weight"] for i in range(8)] == [QT.Q5_K] + [QT.Q4_K] * 7
        q8 = plan(m, "Q8_0").types
        assert q8["output.weight"] == QT.Q8_0 and q8["blk.0.ffn_down.weight"] == QT.Q8_0
        q40 = plan(m, "Q4_0").types
        assert q40["output.weight"] == QT.Q6_K and q40["blk.0.ffn_down.weight"] == QT.Q4_0
        assert set(plan(m, "Q4_0", pure=True).types.values()) == {QT.Q4_0, QT.F32}
        # the 2- and 3-bit mixes (8 layers: n_layer/16 = 0, so no down-projection gets Q5_K in Q3_K_M)
        q2k = plan(m, "Q2_K").types
        assert q2k["output.weight"] == QT.Q6_K and q2k["blk.2.attn_q.weight"] == QT.Q2_K
        assert q2k["blk.2.attn_v.weight"] == QT.Q3_K      # 2 query heads per KV head (4+: Q4_K, below)
        assert q2k["blk.2.attn_output.weight"] == QT.Q3_K and q2k["blk.2.ffn_down.weight"] == QT.Q3_K
        q3km = plan(m, "Q3_K_M").types
        assert [q3km[f"blk.{i}.attn_v.weight"] for i in range(8)] == [QT.Q5_K] * 2 + [QT.Q4_K] * 6
        assert q3km["blk.0.ffn_down.weight"] == QT.Q4_K and q3km["blk.5.attn_output.weight"] == QT.Q4_K
        assert q3km["blk.5.ffn_up.weight"] == QT.Q3_K
        q3kl = plan(m, "Q3_K_L").types
        assert {q3kl[f"blk.4.{n}.weight"] for n in ("attn_v", "attn_output", "ffn_down")} == {QT.Q5_K}
        q3ks = plan(m, "Q3_K_S").types
        assert {q3ks[f"blk.4.{n}.weight"] for n in ("attn_v", "attn_output", "ffn_down", "attn_q")} == {QT.Q3_K}
        # with an importance matrix, Q4_0 / Q5_0 guard their first eighth of down-projections (llama.cpp)
        assert plan(m, "Q4_0", has_imatrix=True).types["blk.0.ffn_down.weight"] == QT.Q4_1
        assert plan(m, "Q5_0", has_imatrix=True).types["blk.0.ffn_down.weight"] == QT.Q5_1
        assert plan(m, "Q5_0", has_imatrix=True).types["blk.1.ffn_down.weight"] == QT.Q5_0
        # the 4-bit i-quants: without an importance matrix, the first eighth of the down-projections Q5_K
        iq4xs = plan(m, "IQ4_XS").types
        assert iq4xs["output.weight"] == QT.Q6_K and iq4xs["blk.3.attn_q.weight"] == QT.IQ4_XS
        assert [iq4xs[f"blk.{i}.ffn_down.weight"] for i in range(8)] == [QT.Q5_K] + [QT.IQ4_XS] * 7
        assert iq4xs["blk.0.attn_v.weight"] == QT.IQ4_XS   # 2 query heads per KV head (4+: Q5_K, below)
        assert plan(m, "IQ4_XS", has_imatrix=True).types["blk.0.ffn_down.weight"] == QT.IQ4_XS
        assert plan(m, "IQ4_NL").types["blk.0.ffn_down.weight"] == QT.Q5_K
        with pytest.raises(InvalidArgumentError, match="unknown type"):
            plan(m, "IQ3_XXS")
    finally:
        m.close()


def test_q2_k_value_projections_with_grouped_heads(tmp_path):
    """Q2_K gives the value projections Q4_K where 4 or more query heads share a KV head."""
    path = synth.write_model(tmp_path / "gqa.gguf", "llama", QT.F32, n_layer=2, n_head=4, n_head_kv=1)
    m = ModelFile(path)
    try:
        assert plan(m, "Q2_K").types["blk.1.attn_v.weight"] == QT.Q4_K
        assert plan(m, "IQ4_XS").types["blk.1.attn_v.weight"] == QT.Q5_K
    finally:
        m.close()


def test_a_row_the_blocks_do_not_divide_falls_back(tmp_path):
    """Rows of 288 (not a multiple of 256): K types fall back as llama.cpp's do; the output to Q8_0."""
    path = synth.write_model(tmp_path / "odd.gguf", "llama", QT.F32, n_layer=2, n_embd=288, n_head=4, n_head_kv=2,
                             n_ff=544, n_vocab=320, tied=True)
    m = ModelFile(path)
    try:
        t = plan(m, "Q4_K_M").types
        assert t["token_embd.weight"] == QT.Q8_0           # tied: the output's rule
        assert t["blk.1.attn_q.weight"] == QT.Q5_0         # Q4_K -> Q5_0
        assert t["blk.0.attn_v.weight"] == QT.Q5_0         # with 2 layers, the last gets more bits:
        assert t["blk.1.attn_v.weight"] == QT.Q8_0         # Q6_K -> Q8_0
        assert t["blk.1.ffn_down.weight"] == QT.Q8_0       # rows of 544, Q6_K -> Q8_0
        assert plan(m, "Q3_K_S").types["blk.1.attn_q.weight"] == QT.Q4_0   # Q3_K -> Q4_0
        assert plan(m, "IQ4_XS").types["blk.1.attn_q.weight"] == QT.IQ4_NL  # IQ4_XS -> IQ4_NL
    finally:
        m.close()


# every format's relative RMS error on these random weights (measured, with margin)
ERROR = {QT.F16: 1e-3, QT.BF16: 5e-3, QT.Q8_0: 0.01, QT.Q6_K: 0.03, QT.Q5_1: 0.05, QT.Q5_0: 0.06, QT.Q5_K: 0.05,
         QT.Q4_1: 0.1, QT.Q4_0: 0.12, QT.Q4_K: 0.1, QT.Q3_K: 0.18, QT.Q2_K: 0.34, QT.IQ4_NL: 0.1, QT.IQ4_XS: 0.1}


@pytest.mark.parametrize("ftype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q6_K", "Q5_K_M",
                                   "Q4_K_M", "Q4_K_S", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "IQ4_NL", "IQ4_XS"])
def test_the_file_decodes_to_its_source(f32_model, tmp_path, ftype):
    """The written file: the metadata as it was (file type changed), every tensor of the planned type
    decoding to its source within the format's error, vectors copied bit for bit."""
    out = tmp_path / f"{ftype}.gguf"
    p = quantize_file(f32_model, out, ftype)
    src, got = ModelFile(f32_model), ModelFile(out)
    try:
        assert got.get("general.file_type") == {"F16": 1, "BF16": 32, "Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8,
                                                 "Q5_1": 9, "Q6_K": 18, "Q5_K_M": 17, "Q4_K_M": 15, "Q4_K_S": 14,
                                                 "Q3_K_L": 13, "Q3_K_M": 12, "Q3_K_S": 11, "Q2_K": 10,
                                                 "IQ4_NL": 25, "IQ4_XS": 30}[ftype]
        for key in src.metadata:
            if key != "general.file_type":
                assert src.metadata_entry(key) == got.metadata_entry(key), key
        for name, t in src.tensors.items():
            q = got.tensors[name]
            assert QT(q.type) == p.types[name] and q.shape == t.shape
            x = t.data.view(np.float32).reshape(t.rows, t.shape[0])
            if q.type == t.type:
                assert np.array_equal(q.data, t.data)
                continue
            y = dequantize(np.asarray(q.data).reshape(q.rows, q.row_bytes), QT(q.type)).reshape(x.shape)
            rel = np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2))
            assert rel < ERROR[QT(q.type)], (name, QT(q.type).name, rel)
    finally:
        src.close()
        got.close()


def test_the_quantized_model_runs_close_to_the_float_one(f32_model, tmp_path):
    ids = list(range(1, 48))
    with Model(f32_model, n_ctx=128, n_threads=2) as m:
        want = m.logits(ids)
    errors = {}
    for ftype in ("Q8_0", "Q6_K", "Q4_K_M"):
        quantize_file(f32_model, tmp_path / f"{ftype}.gguf", ftype)
        with Model(str(tmp_path / f"{ftype}.gguf"), n_ctx=128, n_threads=2) as m:
            got = m.logits(ids)
        errors[ftype] = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert errors["Q8_0"] < errors["Q6_K"] < errors["Q4_K_M"] < 0.5, errors
    assert errors["Q8_0"] < 0.05, errors


def test_requantizing_needs_asking(tmp_path, smollm2_path):
    with pytest.raises(InvalidArgumentError, match="already Q"):
        quantize_file(smollm2_path, tmp_path / "x.gguf", "Q4_0")
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.gguf.part").exists()
    with pytest.raises(InvalidArgumentError, match="overwrite"):
        quantize_file(smollm2_path, smollm2_path, "Q4_0")


def test_pyllm_quantize_cli(f32_model, tmp_path):
    from test_cli import one_error_line, pyllm
    out = tmp_path / "cli.gguf"
    r = pyllm("quantize", f32_model, str(out), "q4_k_m")
    assert r.returncode == 0, r.stderr
    assert "Q4_K_M" in r.stderr and "Q6_K" in r.stderr and r.stdout == ""
    r = pyllm("run", "-m", str(out), "-p", "hello", "-n", "4", "--temp", "0", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["generated_tokens"] >= 1, r.stderr
    one_error_line(pyllm("quantize", f32_model, str(tmp_path / "y.gguf"), "iq2_xxs"), "unknown type")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    one_error_line(pyllm("quantize", str(bad), str(tmp_path / "z.gguf"), "q8_0"))


def test_value_projections_count_in_layer_order(tmp_path):
    """The file lists blk.10 before blk.2; llama.cpp's count of value projections goes by layer."""
    path = synth.write_model(tmp_path / "l12.gguf", "llama", QT.F32, n_layer=12, n_embd=256, n_ff=256, n_vocab=256)
    m = ModelFile(path)
    try:
        m.tensors = dict(sorted(m.tensors.items()))   # names in text order, as many converters write them
        assert list(m.tensors).index("blk.10.attn_v.weight") < list(m.tensors).index("blk.2.attn_v.weight")
        t = plan(m, "Q4_K_M").types
        assert [i for i in range(12) if t[f"blk.{i}.attn_v.weight"] == QT.Q6_K] == [0, 3, 6, 9, 10, 11]
    finally:
        m.close()


def test_output_and_embedding_types_can_be_chosen(f32_model, tmp_path):
    from pyllm.quantize import tensor_type
    m = ModelFile(f32_model)
    try:
        t = plan(m, "Q4_K_M", output_type=QT.Q8_0, embedding_type=QT.Q6_K).types
        assert t["output.weight"] == QT.Q8_0 and t["token_embd.weight"] == QT.Q6_K
        assert t["blk.1.attn_q.weight"] == QT.Q4_K
    finally:
        m.close()
    assert tensor_type("q8_0", "x") == QT.Q8_0
    with pytest.raises(InvalidArgumentError, match="--output-tensor-type must be one of"):
        tensor_type("iq2_xxs", "--output-tensor-type")
    from test_cli import pyllm
    r = pyllm("quantize", f32_model, str(tmp_path / "o.gguf"), "Q4_0", "--output-tensor-type", "f16",
              "--token-embedding-type", "q8_0")
    assert r.returncode == 0, r.stderr
    got = ModelFile(tmp_path / "o.gguf")
    try:
        assert QT(got.tensors["output.weight"].type) == QT.F16
        assert QT(got.tensors["token_embd.weight"].type) == QT.Q8_0
    finally:
        got.close()


def test_tensor_type_patterns_and_leave_output(f32_model, tmp_path):
    """--tensor-type PATTERN=TYPE over the mix's choice (regex searched in the name, the last
    matching pattern winning, not with --pure), --leave-output-tensor keeps output.weight."""
    from pyllm.quantize import tensor_types
    m = ModelFile(f32_model)
    try:
        mixed = plan(m, "Q4_K_M").types
        over = tensor_types([r"attn_v=q8_0", r"blk\.1\.attn_v=Q5_0", "ffn_(up|gate)=q6_k"])
        t = plan(m, "Q4_K_M", overrides=over).types
        assert t["blk.0.attn_v.weight"] == QT.Q8_0 and t["blk.1.attn_v.weight"] == QT.Q5_0
        assert t["blk.0.ffn_up.weight"] == t["blk.1.ffn_gate.weight"] == QT.Q6_K
        others = [n for n in t if not any(k in n for k in ("attn_v", "ffn_up", "ffn_gate"))]
        assert others and all(t[n] == mixed[n] for n in others)
        assert plan(m, "Q4_K_M", overrides=over, pure=True).types["blk.0.attn_v.weight"] == QT.Q4_K
        left = plan(m, "Q4_0", leave_output=True).types
        assert left["output.weight"] == QT(m.tensors["output.weight"].type) == QT.F32
        assert left["blk.0.attn_q.weight"] == QT.Q4_0
    finally:
        m.close()
    for bad, message in (("attn_v", "PATTERN=TYPE"), ("attn_v=q3", "must be one of"), ("(=q8_0", "not a regular")):
        with pytest.raises(InvalidArgumentError, match=message):
            tensor_types([bad])
    from test_cli import pyllm
    r = pyllm("quantize", f32_model, str(tmp_path / "o.gguf"), "Q4_K_M", "--tensor-type", "attn_q=q8_0",
              "--tensor-type", "blk\\.0\\.attn_q=q5_1", "--leave-output-tensor")
    assert r.returncode == 0, r.stderr
    got = ModelFile(tmp_path / "o.gguf")
    try:
        assert QT(got.tensors["blk.0.attn_q.weight"].type) == QT.Q5_1
        assert QT(got.tensors["blk.1.attn_q.weight"].type) == QT.Q8_0
        assert QT(got.tensors["output.weight"].type) == QT.F32
    finally:
        got.close()


def test_a_tensor_with_nan_fails_and_leaves_no_file(f32_model, tmp_path):
    from pyllm.errors import ModelFileError
    bad = tmp_path / "nan.gguf"
    data = bytearray(open(f32_model, "rb").read())
    m = ModelFile(f32_model)
    t = m.tensors["blk.5.ffn_up.weight"]
    offset = t.offset + 4 * 1000
    m.close()
    data[offset:offset + 4] = struct.pack("<f", float("nan"))
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="blk.5.ffn_up.weight holds NaN"):
        quantize_file(bad, tmp_path / "out.gguf", "Q4_K_M")
    assert not (tmp_path / "out.gguf").exists() and not (tmp_path / "out.gguf.part").exists()
