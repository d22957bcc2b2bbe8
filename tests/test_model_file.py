"""GGUF validation: every broken or unsupported file gets one clear error."""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm.arch import load_architecture
from pyllm.errors import ModelFileError, ModelNotFoundError, UnsupportedModelError
from pyllm.model_file import ModelFile


def test_reads_real_model(smollm2_path):
    mf = ModelFile(smollm2_path)
    assert mf.architecture == "llama"
    assert mf.version == 3
    assert mf.arch_require("block_count") == 30
    assert mf.arch_require("embedding_length") == 576
    assert len(mf.metadata["tokenizer.ggml.tokens"]) == 49152
    emb = mf.tensor("token_embd.weight")
    assert emb.shape == (576, 49152) and emb.type_name == "Q8_0"
    assert emb.nbytes == 576 // 32 * 34 * 49152
    assert mf.type_histogram() == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    # a view into the mapping, not a copy
    assert not emb.data.flags.owndata and not emb.data.flags.writeable


def test_missing_file(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no model file"):
        ModelFile(tmp_path / "nope.gguf")


def test_random_bytes(tmp_path):
    p = tmp_path / "random.gguf"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        ModelFile(p)


def test_tiny_file(tmp_path):
    p = tmp_path / "tiny.gguf"
    p.write_bytes(b"GGUF")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        ModelFile(p)


def test_truncated_header(smollm2_path, tmp_path):
    p = tmp_path / "head.gguf"
    with open(smollm2_path, "rb") as f:
        p.write_bytes(f.read(100_000))  # cut inside the vocabulary
    with pytest.raises(ModelFileError, match="truncated"):
        ModelFile(p)


def test_truncated_data(smollm2_path, tmp_path):
    p = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        p.write_bytes(f.read(40_000_000))  # header intact, tensor data cut
    with pytest.raises(ModelFileError, match="outside the file"):
        ModelFile(p)


def test_tensor_offset_past_end(tmp_path):
    p = synth.raw_gguf(tmp_path / "off.gguf", kv=[("general.architecture", "str", "llama")],
                       tensors=[("w", (32, 4), int(QT.F32), 1 << 20)], data=b"\0" * 512)
    with pytest.raises(ModelFileError, match="outside the file"):
        ModelFile(p)


def test_unsupported_version(tmp_path):
    p = synth.raw_gguf(tmp_path / "v9.gguf", version=9)
    with pytest.raises(UnsupportedModelError, match="GGUF version 9"):
        ModelFile(p)


def test_corrupt_counts(tmp_path):
    p = synth.raw_gguf(tmp_path / "n.gguf")
    raw = bytearray(open(p, "rb").read())
    raw[8:16] = (10**15).to_bytes(8, "little")  # tensor count far beyond the file
    open(p, "wb").write(raw)
    with pytest.raises(ModelFileError, match="corrupt header"):
        ModelFile(p)


def test_unknown_tensor_type(tmp_path):
    p = synth.raw_gguf(tmp_path / "t.gguf", tensors=[("w", (32, 4), 250, 0)], data=b"\0" * 1024)
    with pytest.raises(ModelFileError, match="unknown type id 250"):
        ModelFile(p)


def test_unknown_architecture(tmp_path):
    p = synth.write_llama(tmp_path / "a.gguf", arch="mamba9")
    with pytest.raises(UnsupportedModelError, match="architecture 'mamba9' is not supported.*llama"):
        load_architecture(ModelFile(p))


def test_unsupported_tensor_type(tmp_path):
    # IQ2_XXS blocks are well-formed GGUF, but no kernel runs them
    import gguf
    w = gguf.GGUFWriter(str(tmp_path / "iq2b.gguf"), "llama")
    for key, value in (("block_count", 1), ("embedding_length", 256), ("feed_forward_length", 256),
                       ("attention.head_count", 4)):
        w.add_uint32(f"llama.{key}", value)
    synth.small_vocab(w)
    blocks = np.zeros((512, 66), dtype=np.uint8)  # IQ2_XXS: 66 bytes per 256
    w.add_tensor("token_embd.weight", blocks, raw_dtype=QT.IQ2_XXS)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS.*supported: .*Q4_K"):
        load_architecture(ModelFile(tmp_path / "iq2b.gguf"))


def test_shape_mismatch(tmp_path):
    p = synth.write_llama(tmp_path / "s.gguf", bad_shape="blk.1.attn_k.weight")
    with pytest.raises(ModelFileError, match="blk.1.attn_k.weight has shape"):
        load_architecture(ModelFile(p))


def test_missing_tensor(tmp_path):
    p = synth.write_llama(tmp_path / "m.gguf", drop_tensor="blk.0.ffn_up.weight")
    with pytest.raises(ModelFileError, match="required tensor 'blk.0.ffn_up.weight' is missing"):
        load_architecture(ModelFile(p))


def test_missing_key(tmp_path):
    p = synth.raw_gguf(tmp_path / "k.gguf", kv=[("general.architecture", "str", "llama")])
    with pytest.raises(ModelFileError, match="'llama.embedding_length' is missing"):
        load_architecture(ModelFile(p))
