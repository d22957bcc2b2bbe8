"""Broken inputs at the command line: one line on stderr, exit code 2."""
import re
import subprocess
import sys

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth


def pyllm(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "pyllm.cli.main", *args], capture_output=True, text=True,
                          input=stdin, timeout=120)


def assert_one_line_error(r, pattern):
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_truncated_model(smollm2_path, tmp_path):
    p = tmp_path / "trunc.gguf"
    with open(smollm2_path, "rb") as f:
        p.write_bytes(f.read(40_000_000))
    assert_one_line_error(pyllm("run", "-m", str(p), "-p", "hi", "-n", "2"), "outside the file.*truncated")


def test_random_bytes(tmp_path):
    p = tmp_path / "rand.gguf"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes())
    assert_one_line_error(pyllm("run", "-m", str(p), "-p", "hi", "-n", "2"), "not a GGUF file")


def test_offset_past_end(tmp_path):
    p = synth.raw_gguf(tmp_path / "off.gguf", kv=[("general.architecture", "str", "llama")],
                       tensors=[("token_embd.weight", (32, 4), int(QT.F32), 1 << 30)], data=b"\0" * 64)
    assert_one_line_error(pyllm("run", "-m", p, "-p", "hi"), "token_embd.weight lies outside the file")


def test_missing_model():
    assert_one_line_error(pyllm("run", "-p", "x", "-m", "/nonexistent"), "no model file at /nonexistent")


def test_unknown_architecture(tmp_path):
    p = synth.write_llama(tmp_path / "a.gguf", arch="mamba9")
    assert_one_line_error(pyllm("run", "-m", p, "-p", "hi"), "architecture 'mamba9' is not supported")


@pytest.mark.parametrize("args, pattern", [
    (["--temp", "-1"], "temperature must be >= 0"),
    (["-n", "0"], "max_tokens must be at least 1"),
    (["-t", "0"], "n_threads must be in"),
])
def test_bad_arguments(tmp_path, args, pattern):
    p = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0)
    assert_one_line_error(pyllm("run", "-m", p, "-p", "hi", *args), pattern)


def test_context_too_large_for_memory(tmp_path):
    """No machine has the ~20 GiB a billion positions of this model's KV cache
    take: refused before anything is allocated, saying which -c fits."""
    p = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0)
    r = pyllm("run", "-m", p, "-p", "hi", "-n", "2", "-c", str(10 ** 9))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert "longer than the 512 the model was trained on" in lines[0]
    assert re.search(r"error: a context of 1000000000 tokens needs .* GiB for its KV cache .* "
                     r"use a smaller context \(-c / n_ctx \d+ or less\)", lines[-1]), lines[-1]


def test_suggested_context_is_the_largest_that_fits(tmp_path, monkeypatch):
    """With the machine's free memory pinned, the context the error suggests
    opens and one block more does not."""
    import pyllm.backend.cpu as cpu
    from pyllm import Model
    from pyllm.backend.base import DeviceMemoryError
    from pyllm.defaults import BLOCK_SIZE
    p = synth.write_llama(tmp_path / "m.gguf", QT.Q8_0)
    monkeypatch.setattr(cpu, "available_memory", lambda: 8 << 20)
    with pytest.raises(DeviceMemoryError, match="KV cache") as e:
        Model(p, n_ctx=4096)
    fits = int(re.search(r"n_ctx (\d+) or less", str(e.value)).group(1))
    assert 0 < fits < 4096 and fits % BLOCK_SIZE == 0
    with Model(p, n_ctx=fits) as m:
        assert len(m.generate("hi", max_tokens=2, temperature=0).tokens) == 2
    with pytest.raises(DeviceMemoryError):
        Model(p, n_ctx=fits + BLOCK_SIZE)


def test_prompts_that_are_not_utf8_run_with_a_warning(smollm2_path, tmp_path):
    """Latin-1 bytes on stdin, in -f and in -p (argv): each invalid byte becomes
    U+FFFD, as in llama.cpp, with one warning; no traceback."""
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 au lait")
    runs = [subprocess.run([sys.executable, "-m", "pyllm.cli.main", "run", "-m", smollm2_path, "-n", "2",
                            "--temp", "0", *args], capture_output=True, input=stdin, timeout=120)
            for args, stdin in (([], b"caf\xe9 au lait"), (["-f", str(bad)], None),
                                (["-p", b"caf\xe9 au lait".decode("utf-8", "surrogateescape")], None))]
    for r in runs:
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
        assert b"the text is not valid UTF-8: 1 invalid byte became U+FFFD" in r.stderr
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout and runs[0].stdout.strip()
    # chat reads lines: the same, even where stdin would be strict UTF-8
    import os
    r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", "chat", "-m", smollm2_path, "-n", "2", "--temp", "0"],
                       capture_output=True, input=b"caf\xe9\n", timeout=120, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
    assert b"1 invalid byte became U+FFFD" in r.stderr


def test_a_model_that_computes_nan_is_one_error(tmp_path):
    """NaN in a weight (a corrupt download) makes every logit NaN: greedy
    decoding used to emit token 0 forever, sampling said "no token is left";
    now both name the cause."""
    p = synth.write_llama(tmp_path / "nan.gguf", QT.F32)
    from pyllm.model_file import ModelFile
    with ModelFile(p) as mf:
        at = mf.tensor("output_norm.weight").offset
    raw = bytearray(open(p, "rb").read())
    raw[at:at + 4] = np.float32(np.nan).tobytes()
    open(p, "wb").write(raw)
    for temp in ("0", "0.8"):
        assert_one_line_error(pyllm("run", "-m", p, "-p", "to", "-n", "3", "--temp", temp),
                              "the model computed NaN logits at position 1: .* corrupt")
