"""pyllm bench and the profile: the numbers exist and add up (no timing assertions)."""
import json
import os
import subprocess
import sys

import pytest


def pyllm(*args):
    r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_bench_json(smollm2_path):
    out = json.loads(pyllm("bench", "-m", smollm2_path, "-p", "32", "-n", "8", "-r", "2", "-t", "1",
                           "--ttft-prompt", "16", "--json").stdout)
    tests = {r["test"]: r for r in out["results"]}
    assert set(tests) == {"pp32", "tg8"}
    assert all(len(r["runs"]) == 2 and r["tokens_per_s"] > 0 for r in tests.values())
    per = out["per_threads"]["1"]
    assert per["ttft_s"] > 0 and per["tpot_s"] > 0
    # a decode step reads every matmul weight once: at least the file's Q4_1 and Q8_0 bytes
    assert per["decode_bytes_per_token"] > 90e6
    assert out["model"]["types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    from pyllm._native import ffi, lib
    assert out["model"]["kernels"] == ffi.string(lib.pyllm_level_name(lib.pyllm_get_level())).decode()


def test_bench_names_the_capped_kernel_level(smollm2_path):
    r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", "bench", "-m", smollm2_path, "-p", "8", "-n", "2",
                        "-r", "1", "-t", "1", "--ttft-prompt", "8", "--json"],
                       env={**os.environ, "PYLLM_MAX_ISA": "scalar"}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["kernels"] == "scalar"



def test_bench_table_piped_keeps_lines_whole(smollm2_path):
    """piped, the console is 80 columns: the model line and the per-thread
    line stay one line each (they used to break mid-figure)"""
    lines = pyllm("bench", "-m", smollm2_path, "-p", "8", "-n", "2", "-r", "1", "-t", "1",
                  "--ttft-prompt", "8").stdout.splitlines()
    assert any(l.startswith("SmolLM2-135M-Instruct.Q4_1.gguf") and "params" in l and "Q8_0:1]" in l
               and l.rstrip().endswith(("avx512+vnni", "avx2+avxvnni", "avx512", "avx2", "neon", "neon+dotprod",
                                        "scalar")) for l in lines), lines
    assert any(l.startswith("threads 1: TTFT(8)") and "GB/s" in l for l in lines), lines

def test_profile_cuts_a_prompt_longer_than_the_context(smollm2_path):
    """bench --profile's fixed text may take more tokens than a small context holds (a tokenizer
    that spends more on it): the prompt is cut to fit, with the decode steps after it"""
    from pyllm import Model
    from pyllm.bench import profile
    with Model(smollm2_path, n_ctx=48, n_threads=1) as m:
        pre, dec = profile(m, "The quick brown fox jumps over the lazy dog. " * 20, 8)
        assert dec.steps == 8 and pre.wall_s > 0


def test_run_profile(smollm2_path):
    out = json.loads(pyllm("run", "-m", smollm2_path, "-p", "The sky is", "-n", "6", "--temp", "0",
                           "--profile", "--json").stdout)
    prof = out["profile"]
    assert set(prof) == {"prefill", "decode"}
    dec = prof["decode"]
    assert dec["steps"] == out["generated_tokens"] - 1 or out["finish_reason"] == "stop"
    assert dec["op_s"]["matmul"] > 0 and set(dec["matmul_by_type_s"]) == {"Q4_1", "Q8_0"}
    # the wall time splits into the C steps, sampling and the Python between them
    assert abs(dec["c_wall_s"] + dec["sampling_s"] + dec["python_s"] - dec["wall_s"]) < 1e-6
    assert 0 <= dec["python_s"] < dec["wall_s"]


def test_bench_at_depth(smollm2_path):
    """-d D runs each test on top of D tokens (llama-bench's `pp N @ dD`)"""
    out = json.loads(pyllm("bench", "-m", smollm2_path, "-p", "16", "-n", "4", "-d", "0,40", "-r", "1", "-t", "1",
                           "--ttft-prompt", "8", "--json").stdout)
    assert [r["test"] for r in out["results"]] == ["pp16", "tg4", "pp16 @ d40", "tg4 @ d40"]
    assert all(r["tokens_per_s"] > 0 for r in out["results"])


def test_bench_bad_lists(smollm2_path):
    for flag, value in [("-p", "abc"), ("-d", "-5"), ("-t", "0"), ("-n", "1,x")]:
        r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", "bench", "-m", smollm2_path, flag, value],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (flag, value, r.stderr)
        assert "error:" in r.stderr and "Traceback" not in r.stderr, (flag, value, r.stderr)


def test_depth_fills_the_context_first(smollm2_path):
    from pyllm import Model
    from pyllm import bench as B
    with Model(smollm2_path, n_ctx=256, n_threads=1) as m:
        calls = []
        run = m.engine._run
        m.engine._run = lambda seq, tokens, *a, **k: (calls.append((len(seq), len(tokens))), run(seq, tokens, *a, **k))[1]
        B.run_pp(m, 8, depth=40)
        B.run_tg(m, 2, depth=40)
    assert calls == [(0, 40), (40, 8), (0, 40), (40, 1), (41, 1)]


def test_profile_counts_matmuls_by_type_id(tmp_path):
    """every weight type has its own slot in the profile, MXFP4 (type id 39,
    past the 32 slots of old) too: a synthetic MXFP4 model's matmul time is
    MXFP4's, not Q5_1's (39 & 31)"""
    import synth
    from gguf.constants import GGMLQuantizationType as QT
    from pyllm.arch import load_architecture
    from pyllm.backend.cpu import CpuBackend
    from pyllm.bench import read_profile
    from pyllm.graph import Graph
    from pyllm.model_file import ModelFile
    g = Graph()
    load_architecture(ModelFile(synth.write_llama(tmp_path / "m.gguf", QT.MXFP4))).build(g)
    be = CpuBackend(g, 1, 8, 8, 4, 16)
    be.profile(True)
    be.forward([1, 2, 3], 0, [0], 3)
    p = read_profile(be, "prefill", 1, 1.0)
    assert set(p.matmul_by_type_s) == {"MXFP4"} and p.matmul_by_type_s["MXFP4"] > 0
    assert abs(p.matmul_by_type_s["MXFP4"] - p.op_s["matmul"]) <= 1e-9 * p.op_s["matmul"]


def test_bench_llama_bench_outputs_and_prompt_gen(smollm2_path, gemma3_path):
    """-pg PP,TG, -o md|csv|jsonl (llama-bench's fields and table), several -m in turn"""
    import csv
    import io
    base = ("bench", "-m", smollm2_path, "-p", "8", "-n", "2", "-pg", "8,2", "-r", "2", "-t", "1", "--ttft-prompt", "8")
    records = [json.loads(line) for line in pyllm(*base, "-o", "jsonl").stdout.splitlines()]
    assert [(r["test"], r["n_prompt"], r["n_gen"], r["n_depth"]) for r in records] == [
        ("pp8", 8, 0, 0), ("tg2", 0, 2, 0), ("pp8+tg2", 8, 2, 0)]
    for r in records:
        assert r["model_filename"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and r["n_threads"] == 1
        assert len(r["samples_ts"]) == 2 and r["avg_ts"] == pytest.approx(sum(r["samples_ts"]) / 2, rel=1e-5)
        assert r["backend"] == "CPU" and (r["type_k"], r["type_v"]) == ("f16", "f16")
    rows = list(csv.DictReader(io.StringIO(pyllm(*base, "-o", "csv").stdout)))
    assert [row["test"] for row in rows] == ["pp8", "tg2", "pp8+tg2"] and float(rows[2]["avg_ts"]) > 0
    md = pyllm(*base, "-o", "md", "-m", gemma3_path).stdout.splitlines()
    assert md[0] == "| model | size | params | backend | threads | test | t/s |" and len(md) == 2 + 6
    assert [line.split(" | ")[0] for line in md[2:]] == ["| SmolLM2-135M-Instruct.Q4_1.gguf"] * 3 + \
        ["| gemma-3-270m-q4_k_m.gguf"] * 3
    assert md[4].split(" | ")[5] == "pp8+tg2"
    for flags in (["-pg", "8"], ["-pg", "8,0"], ["-o", "xml"]):
        r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", "bench", "-m", smollm2_path, *flags],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr, (flags, r.stderr)


def test_prompt_then_generation_runs_both(smollm2_path):
    from pyllm import Model
    from pyllm import bench as B
    with Model(smollm2_path, n_ctx=256, n_threads=1) as m:
        calls = []
        run = m.engine._run
        m.engine._run = lambda seq, tokens, *a, **k: (calls.append((len(seq), len(tokens))), run(seq, tokens, *a, **k))[1]
        B.run_pg(m, 8, 3, depth=5)
    assert calls == [(0, 5), (5, 8), (13, 1), (14, 1), (15, 1)]
