#!/usr/bin/env python3
"""Samplers: pyllm's against llama.cpp's own, on the same random logits.

For each sampler whose cut is deterministic, the tokens it keeps must be the same:
top-n-sigma, XTC (its chance forced to 1), mirostat 2's cut at its first step
(mu = 2 tau) and mirostat 1's (the top k of its Zipf estimate). The draws
themselves differ (each engine has its own random generator), so they are not
compared. Logits are random normal (scaled), Zipf-like, and with -inf entries,
over vocabularies of 1000 and 49152 tokens.

llama.cpp runs in its own virtual environment as a subprocess (pyllm never imports
it): --peer-python, default $PYLLM_PEER_PYTHON or /tmp/peer-venv/bin/python.

    python benchmarks/compare_sampling.py [--cases 200]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEER = r'''
import ctypes, json, sys
import numpy as np
import llama_cpp as L
job = json.loads(sys.stdin.read())
out = []
for case in job:
    x = np.array(case["logits"], dtype=np.float32)
    n = len(x)
    arr = (L.llama_token_data * n)()
    for i in range(n):
        arr[i].id, arr[i].logit, arr[i].p = i, float(x[i]), 0.0
    cur = L.llama_token_data_array(data=arr, size=n, selected=-1, sorted=False)
    kind, a = case["kind"], case["args"]
    if kind == "top_n_sigma":
        s = L.llama_sampler_init_top_n_sigma(a[0])
    elif kind == "xtc":
        s = L.llama_sampler_init_xtc(1.0, a[0], 0, 1)
    elif kind == "mirostat_v2":
        s = L.llama_sampler_init_mirostat_v2(1, a[0], 0.1)
    else:
        s = L.llama_sampler_init_mirostat(n, 1, a[0], 0.1, 100)
    L.llama_sampler_apply(s, ctypes.byref(cur))
    data = ctypes.cast(cur.data, ctypes.POINTER(L.llama_token_data))
    out.append(sorted(data[i].id for i in range(cur.size) if data[i].logit != float("-inf")))
    L.llama_sampler_free(s)
print(json.dumps(out))
'''


def ours(kind: str, args: list, x: np.ndarray) -> list[int]:
    from pyllm.sampling import Candidates, Mirostat, top_k, top_n_sigma, xtc

    class Sure:
        def random(self) -> float:
            return 0.0

    c = Candidates.of(x)
    if kind == "top_n_sigma":
        kept = top_n_sigma(c, args[0])
    elif kind == "xtc":
        kept = xtc(c, 1.0, args[0], 0, Sure())
    elif kind == "mirostat_v2":
        m = Mirostat(2, args[0], 0.1, len(x))
        lp = x.astype(np.float64) - x.max()
        lp = (lp - np.log(np.exp(lp).sum())) / np.log(2)
        keep = np.flatnonzero(-lp <= m.mu)
        return sorted(keep.tolist()) if len(keep) else [int(np.argmax(x))]
    else:
        kept = top_k(c, Mirostat(1, args[0], 0.1, len(x))._k(c), 1)
    return sorted(i for i in kept.token_ids().tolist() if x[i] != -np.inf)   # as the peer's list


def logits(rng: np.random.Generator, n: int, style: int) -> np.ndarray:
    if style == 0:
        x = rng.standard_normal(n) * rng.uniform(0.5, 6)
    elif style == 1:
        x = -rng.uniform(0.8, 1.6) * np.log(rng.permutation(np.arange(1, n + 1)))
    else:
        x = rng.standard_normal(n) * 3
        x[rng.random(n) < 0.3] = -np.inf
    return x.astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200, help="cases per sampler")
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-venv/bin/python"))
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    cases = []
    for kind in ("top_n_sigma", "xtc", "mirostat_v2", "mirostat_v1"):
        for i in range(a.cases):
            n = 1000 if i % 4 else 49152
            x = logits(rng, n, i % 3 if kind in ("top_n_sigma", "xtc") else i % 2)
            arg = {"top_n_sigma": lambda: float(rng.choice([0.5, 1.0, 1.5, 2.0, 3.0])),
                   "xtc": lambda: float(rng.choice([0.01, 0.05, 0.1, 0.2])),
                   "mirostat_v2": lambda: float(rng.choice([1.0, 2.0, 3.0, 5.0, 8.0])),
                   "mirostat_v1": lambda: float(rng.choice([2.0, 3.0, 5.0, 8.0]))}[kind]()
            cases.append({"kind": kind, "args": [arg], "logits": x.tolist()})
    r = subprocess.run([a.peer_python, "-c", PEER], input=json.dumps(cases), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llama.cpp side failed:\n{r.stderr[-3000:]}")
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    bad = 0
    for kind in ("top_n_sigma", "xtc", "mirostat_v2", "mirostat_v1"):
        same = total = 0
        for case, want in zip(cases, theirs):
            if case["kind"] != kind:
                continue
            got = ours(kind, case["args"], np.array(case["logits"], dtype=np.float32))
            total += 1
            if got == want:
                same += 1
            elif bad < 5:
                print(f"  {kind} {case['args']} n={len(case['logits'])}: ours keeps {len(got)}, "
                      f"llama.cpp {len(want)}")
        bad += total - same
        print(f"{kind:<12} {same}/{total} cases keep the same tokens")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
