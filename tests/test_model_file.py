"""GGUF validation: every broken or unsupported file gets one clear error."""
import re
import struct

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
    # TQ2_0 (ternary) blocks are well-formed GGUF, but no kernel runs them
    import gguf
    w = gguf.GGUFWriter(str(tmp_path / "iq2b.gguf"), "llama")
    for key, value in (("block_count", 1), ("embedding_length", 256), ("feed_forward_length", 256),
                       ("attention.head_count", 4)):
        w.add_uint32(f"llama.{key}", value)
    synth.small_vocab(w)
    blocks = np.zeros((512, 66), dtype=np.uint8)  # TQ2_0: 66 bytes per 256
    w.add_tensor("token_embd.weight", blocks, raw_dtype=QT.TQ2_0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(UnsupportedModelError, match="TQ2_0.*supported: .*Q4_K"):
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


@pytest.mark.parametrize("key, value, expected", [
    ("llama.context_length", "4096", "an integer from 0 to 2\\^31-1"),
    ("llama.block_count", ("i32", -1), "an integer from 0 to 2\\^31-1"),
    ("llama.embedding_length", np.array([64, 64], np.uint32), "an integer from 0 to 2\\^31-1"),
    ("llama.rope.freq_base", float("nan"), "a finite number"),
    ("llama.attention.layer_norm_rms_epsilon", "1e-5", "a finite number"),
    ("llama.rope.scaling.type", 2, "a string"),
    ("general.alignment", ("u64", 2**40), "an integer from 0 to 2\\^31-1"),
    ("tokenizer.ggml.eos_token_id", 1.5, "an integer"),
    ("tokenizer.ggml.tokens", np.arange(512, dtype=np.int32), "an array of strings"),
    ("tokenizer.ggml.scores", ["a"] * 512, "an array of numbers"),
    ("tokenizer.ggml.add_bos_token", "yes", "a boolean"),
    ("tokenizer.chat_template", ["{{ x }}"], "a string"),
])
def test_metadata_of_the_wrong_kind_is_one_error(tmp_path, key, value, expected):
    """A value of the wrong type under a key pyllm reads (a string for a
    count, an array for a size, NaN for a float) names the key, not an
    int()/float() traceback from deep inside the loader."""
    from pyllm import Model
    base = synth.write_llama(tmp_path / "base.gguf")
    bad = synth.rewrite_metadata(base, tmp_path / "bad.gguf", {key: value})
    with pytest.raises(ModelFileError, match=f"metadata {re.escape(key)} should be {expected} but is"):
        Model(bad, n_ctx=64).close()


def test_absurd_hyperparameters_are_refused_before_allocation(tmp_path):
    from pyllm import Model
    llama, phi3 = synth.write_llama(tmp_path / "llama.gguf"), synth.write_phi3(tmp_path / "phi3.gguf")
    for base, key, value, match in (
            (llama, "llama.block_count", 2**31 - 1, "block_count 2147483647 is more than"),
            (llama, "llama.rope.freq_base", -1.0, "rope_base = -1.0 is not positive"),
            (llama, "llama.expert_count", 8, "'llama.expert_used_count' is missing"),   # a Mixtral's, incomplete
            (phi3, "phi3.expert_count", 8, "phi3 with experts .* not supported")):
        bad = synth.rewrite_metadata(base, tmp_path / "bad.gguf", {key: value})
        with pytest.raises((ModelFileError, UnsupportedModelError), match=match):
            Model(bad, n_ctx=64).close()


def test_names_with_control_characters_are_escaped_in_messages(tmp_path):
    p = synth.raw_gguf(tmp_path / "c.gguf", tensors=[("w\n\x1b[2J", (32, 4), 250, 0)], data=b"\0" * 1024)
    with pytest.raises(ModelFileError) as e:
        ModelFile(p)
    assert "w\\n\\x1b[2J has unknown type id 250" in str(e.value)
    assert "\n" not in str(e.value) and "\x1b" not in str(e.value)


def _mutants(base: str, out_dir, n: int, rng: np.random.Generator) -> list[str]:
    """n copies of `base` with 1-3 random changes each: bit flips, random bytes
    and extreme 64-bit values in the header; NaN, inf and huge floats in the data."""
    raw = open(base, "rb").read()
    with ModelFile(base) as mf:
        header = mf.data_offset
    extremes = [0, 1, 255, 2**16, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1]
    paths = []
    for i in range(n):
        b = bytearray(raw)
        kind = int(rng.integers(0, 4))
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(4, header))
            if kind == 0:
                b[at] ^= 1 << int(rng.integers(0, 8))
            elif kind == 1:
                b[at] = int(rng.integers(0, 256))
            elif kind == 2:
                b[at:at + 8] = extremes[int(rng.integers(0, len(extremes)))].to_bytes(8, "little")
            else:
                at = int(rng.integers(header, len(raw) - 4))
                b[at:at + 4] = struct.pack("<f", [np.nan, np.inf, -np.inf, 3e38][int(rng.integers(0, 4))])
        paths.append(str(out_dir / f"m{i:04d}.gguf"))
        open(paths[-1], "wb").write(b[:len(raw)])
    return paths


def _wrong_kinds(base: str, out_dir) -> list[str]:
    """Every metadata key of `base` (and a few it lacks) replaced by values of
    other types and extreme sizes."""
    with ModelFile(base) as mf:
        keys = list(mf.metadata) + [f"{mf.architecture}.{k}" for k in (
            "attention.sliding_window", "rope.scaling.type", "rope.scaling.factor", "expert_count",
            "attention.sliding_window_pattern")] + ["general.alignment", "tokenizer.ggml.padding_token_id"]
    values = ["x", "", 1.5, float("nan"), float("inf"), ("i32", -1), -2**40, ("u64", 2**63), 0, 2**32 - 1,
              2**31 - 1, True, np.array([1, 2], np.uint32), np.array([], np.int32), ["a", "b"],
              np.full(3, np.nan, np.float32), ("f64", 1e300)]
    paths = []
    for key in keys:
        for j, value in enumerate(values):
            paths.append(synth.rewrite_metadata(base, out_dir / f"{key}-{j}.gguf", {key: value}))
    return paths


def test_broken_files_run_or_fail_with_one_error(tmp_path):
    """Fuzzing the loader: thousands of mutated small models (random header
    bytes, wrong-typed metadata, NaN weights), of six families (a mixture of experts among them). Each must
    open and generate, or raise a PyllmError: never another exception, a
    crash, a hang or a runaway allocation (the child runs under a 4 GiB
    address-space limit). Found before this test: int() tracebacks on
    wrong-typed keys and a 2^32-entry list for a corrupt block_count."""
    import resource
    import subprocess
    import sys
    from pathlib import Path
    rng = np.random.default_rng(1)
    paths = []
    for arch, write, qtype in (("llama", synth.write_llama, QT.Q8_0), ("gemma3", synth.write_gemma3, QT.Q4_K),
                               ("phi3", synth.write_phi3, QT.Q4_0), ("granite", synth.write_granite, QT.Q8_0),
                               ("phi2", synth.write_phi2, QT.Q8_0), ("mixtral", synth.write_mixtral, QT.Q4_0)):
        d = tmp_path / arch
        d.mkdir()
        n_embd = 256 if qtype == QT.Q4_K else 64
        base = write(d / "base.gguf", qtype, n_embd=n_embd, n_ff=n_embd * 2, n_head=2, n_head_kv=1, n_vocab=300)
        paths += [base] + _mutants(base, d, 600, rng) + _wrong_kinds(base, d)

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    worker = Path(__file__).with_name("open_each.py")
    r = subprocess.run([sys.executable, str(worker), *paths], capture_output=True, text=True, timeout=600,
                       preexec_fn=limit_memory)
    lines = r.stdout.splitlines()
    tried = [line.split(" ", 1)[1] for line in lines if line.startswith("try ")]
    assert r.returncode == 0, f"crashed (exit {r.returncode}) on {tried[-1] if tried else '?'}: {r.stderr[-2000:]}"
    bugs = [line for line in lines if line.startswith("BUG")]
    assert not bugs, "\n".join(bugs[:20]) + "\n" + r.stderr[-3000:]
    outcomes = [line.split()[0] for line in lines if not line.startswith("try ")]
    assert len(outcomes) == len(paths)
    assert outcomes[0] == "ok"  # the unmutated llama model runs
    assert 0.2 < outcomes.count("ok") / len(paths) < 0.8  # the mutants reach past the parser


def test_no_mmap_and_mlock(smollm2_path, tmp_path):
    """use_mmap=False (--no-mmap) reads the file into memory: the same logits, read-only tensor
    views, shards too; use_mlock (--mlock) locks it where the memory-lock limit allows (root, or
    a limit above the file's size), else says why and runs unlocked."""
    import logging
    import os
    import resource
    from pyllm import Model
    from pyllm.gguf_split import split_model
    ids = [1, 504, 3458, 314, 253, 1345]
    with Model(smollm2_path, n_ctx=64, n_threads=2) as mapped, \
            Model(smollm2_path, n_ctx=64, n_threads=2, use_mmap=False) as read:
        assert isinstance(read.file._mmap, bytearray)
        assert np.array_equal(mapped.logits(ids), read.logits(ids))
        t = read.file.tensor("output_norm.weight")
        with pytest.raises(ValueError):
            t.data[0] = 1
    first = split_model(smollm2_path, str(tmp_path / "s"), max_tensors=100)[0]
    with ModelFile(first, use_mmap=False) as mf:
        assert len(mf.shards) > 1 and all(isinstance(p._mmap, bytearray) for p in mf._parts)
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    size = os.path.getsize(smollm2_path)
    allowed = os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= size
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("pyllm").addHandler(handler)
    try:
        with Model(smollm2_path, n_ctx=64, n_threads=2, use_mlock=True) as m:
            assert m.locked == allowed
            assert m.logits(ids).shape == (len(ids), m.n_vocab)
    finally:
        logging.getLogger("pyllm").removeHandler(handler)
    assert allowed or any("ulimit -l" in r.getMessage() for r in records)
