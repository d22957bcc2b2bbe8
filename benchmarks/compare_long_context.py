#!/usr/bin/env python3
"""A family's logits deep into a long context, pyllm against llama.cpp: what only shows past
thousands of tokens (Llama 4's 8192-token attention chunks and its NoPE layers' temperature,
a sliding window longer than compare_families' 40 tokens).

A random F32 model of the family is written with tests/synth.py (SmolLM2's tokenizer copied
in, so that llama.cpp loads it). Both engines prefill the same `--prefill` token ids, then
decode `--steps` more one at a time; the logits of each decoded position are compared (rel:
RMS(pyllm - llama.cpp) / std(llama.cpp), per position and over all).

Usage: python benchmarks/compare_long_context.py [--family llama4] [--prefill 8180] [--steps 40]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PEER = r'''
import json, sys
import numpy as np
import llama_cpp
job = json.loads(sys.argv[1])
m = llama_cpp.Llama(model_path=job["path"], n_ctx=job["n_ctx"], n_batch=512, n_threads=job["threads"],
                    logits_all=True, verbose=False)
ids = job["ids"]
m.eval(ids[:job["prefill"]])
rows = []
for t in ids[job["prefill"]:]:
    m.eval([t])
    rows.append(np.asarray(m.scores[m.n_tokens - 1], dtype=np.float32))
np.save(job["out"], np.stack(rows))
'''


def main() -> int:
    import synth
    from pyllm.arch import load_architecture
    from pyllm.backend.cpu import CpuBackend
    from pyllm.graph import Graph
    from pyllm.model_file import ModelFile
    import os

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="llama4")
    ap.add_argument("--prefill", type=int, default=8180)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-venv/bin/python"))
    ap.add_argument("--tokenizer-from", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    if not Path(a.peer_python).exists():
        sys.exit(f"no llama.cpp peer at {a.peer_python}: install it with ../shared/peer/install-llama-cpp.sh")

    out = Path(tempfile.mkdtemp(prefix="long-"))
    n = a.prefill + a.steps
    n_ctx = (n + 15) // 16 * 16
    path = synth.WRITERS[a.family](out / f"{a.family}.gguf", synth.QT.F32,
                                   tokenizer_from=ModelFile(a.tokenizer_from).metadata, context_length=n_ctx)
    ids = [int(t) for t in np.random.default_rng(7).integers(100, 20000, n)]
    job = {"path": str(path), "n_ctx": n_ctx, "ids": ids, "prefill": a.prefill, "threads": a.threads,
           "out": str(out / "peer.npy")}
    r = subprocess.run([a.peer_python, "-c", PEER, json.dumps(job)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llama.cpp side failed:\n{r.stderr[-3000:]}")
    theirs = np.load(out / "peer.npy")

    arch = load_architecture(ModelFile(path), n_ctx=n_ctx)
    g = Graph()
    arch.build(g)
    table = list(range(n_ctx // 16))
    be = CpuBackend(g, a.threads, 512, 1, len(table), 16)
    for p in range(0, a.prefill, 512):
        be.forward(ids[p:min(p + 512, a.prefill)], p, table, 1)
    ours = np.stack([be.forward([ids[p]], p, table, 1)[0].copy() for p in range(a.prefill, n)])
    be.close()
    per_pos = np.sqrt(np.mean((ours - theirs) ** 2, axis=1)) / theirs.std()
    agree = ours.argmax(1) == theirs.argmax(1)
    for i, p in enumerate(range(a.prefill, n)):
        print(f"position {p:6d}  rel {per_pos[i]:.4%}  top1 {'same' if agree[i] else 'DIFFERS'}")
    print(f"{a.family}: positions {a.prefill}..{n - 1}, rel {np.sqrt(np.mean((ours - theirs) ** 2)) / theirs.std():.4%}, "
          f"top1 agreement {agree.mean():.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
