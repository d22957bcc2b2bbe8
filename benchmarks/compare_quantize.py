#!/usr/bin/env python3
"""pyllm quantize against llama.cpp's llama_model_quantize, on the same float file.

The float file is made from a real model: its weights dequantized to F16
(`pyllm quantize --allow-requantize MODEL f16.gguf F16`), default SmolLM2-135M.
Both tools then quantize it to each type; the script compares, per type:
- each tensor's type (the mixes' rules);
- the share of tensor bytes that are identical;
- each file's error against the F16 weights (relative RMS over all matrices);
- with --ppl, the perplexity of the text (pyllm perplexity, 512-token chunks) of
  the F16 file and of both quantized files;
- the time each tool took (llama.cpp on --threads threads, pyllm on one).

llama.cpp runs in its own virtual environment as a subprocess (pyllm never
imports it): --peer-python, default $PYLLM_PEER_PYTHON or /tmp/peer-avx512/bin/python.

    python benchmarks/compare_quantize.py [-m smollm2-135m] [--types Q4_K_M,Q8_0] [--ppl /tmp/pydoc.txt]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEER = r'''
import ctypes, json, sys, time
import llama_cpp
job = json.loads(sys.stdin.read())
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.nthread = job["ftype"], job["threads"]
t0 = time.perf_counter()
rc = llama_cpp.llama_model_quantize(job["src"].encode(), job["dst"].encode(), ctypes.byref(p))
print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t0}))
'''


def matrix_error(src, q) -> float:
    """Relative RMS error of q's matrices against src's, over all of them."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize
    num = den = 0.0
    for name, t in src.tensors.items():
        if len(t.shape) < 2:
            continue
        a = dequantize(np.asarray(t.data).reshape(t.rows, t.row_bytes), T(t.type)).astype(np.float64)
        u = q.tensors[name]
        b = dequantize(np.asarray(u.data).reshape(u.rows, u.row_bytes), T(u.type)).astype(np.float64)
        num += float(((a - b) ** 2).sum())
        den += float((a ** 2).sum())
    return (num / den) ** 0.5


def perplexity(path: str, text: str, threads: int) -> float:
    from pyllm import Model
    with Model(path, n_ctx=512, n_threads=threads) as m:
        return m.perplexity(text, max_chunks=8).ppl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--types", default="Q4_K_M,Q4_K_S,Q5_K_M,Q6_K,Q8_0,Q4_0,Q5_1")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--ppl", help="a text file: also compare perplexity (8 chunks of 512)")
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-avx512/bin/python"))
    args = ap.parse_args()
    from pyllm import registry
    from pyllm.model_file import ModelFile
    from pyllm.quantize import FTYPES, quantize_file

    work = Path(tempfile.mkdtemp(prefix="pyllm-quant-"))
    f16 = work / "f16.gguf"
    quantize_file(registry.resolve(args.model), f16, "F16", allow_requantize=True)
    text = Path(args.ppl).read_text() if args.ppl else None
    if text:
        print(f"F16: perplexity {perplexity(str(f16), text, args.threads):.4f}")
    src = ModelFile(f16)
    print("| type | same tensor types | identical bytes | error pyllm | error llama.cpp | ppl pyllm | ppl llama.cpp "
          "| time pyllm (1 thread) | time llama.cpp |")
    print("|---|---|---|---|---|---|---|---|---|")
    for ftype in args.types.split(","):
        ours, theirs = work / f"pyllm-{ftype}.gguf", work / f"lcpp-{ftype}.gguf"
        t0 = time.perf_counter()
        quantize_file(f16, ours, ftype)
        t_ours = time.perf_counter() - t0
        job = {"src": str(f16), "dst": str(theirs), "ftype": FTYPES[ftype][1], "threads": args.threads}
        r = subprocess.run([args.peer_python, "-c", PEER], input=json.dumps(job), capture_output=True, text=True)
        if r.returncode != 0 or json.loads(r.stdout.splitlines()[-1])["rc"] != 0:
            raise SystemExit(f"llama.cpp failed on {ftype}:\n{r.stderr[-2000:]}")
        t_theirs = json.loads(r.stdout.splitlines()[-1])["seconds"]
        a, b = ModelFile(ours), ModelFile(theirs)
        same_types = sum(a.tensors[n].type == b.tensors[n].type for n in a.tensors)
        same = total = 0
        for n, t in a.tensors.items():
            u = b.tensors[n]
            if t.type == u.type:
                x, y = np.asarray(t.data), np.asarray(u.data)
                same += int((x == y).sum())
            total += t.nbytes
        row = (f"| {ftype} | {same_types}/{len(a.tensors)} | {same / total:.1%} | {matrix_error(src, a):.4f} | "
               f"{matrix_error(src, b):.4f} | ")
        if text:
            row += f"{perplexity(str(ours), text, args.threads):.4f} | {perplexity(str(theirs), text, args.threads):.4f} | "
        else:
            row += "- | - | "
        print(row + f"{t_ours:.1f} s | {t_theirs:.1f} s |", flush=True)
        a.close()
        b.close()


if __name__ == "__main__":
    main()
