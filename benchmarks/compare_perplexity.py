#!/usr/bin/env python3
"""Perplexity: pyllm's (Model.perplexity, `pyllm perplexity`) against llama.cpp's
logits, on the same text, chunks and BOS rule.

The peer side runs llama-perplexity's procedure through llama-cpp-python (which
ships no llama-perplexity binary): each chunk of n_ctx tokens from an empty
context, its first token replaced by BOS when the vocabulary adds one, the
logits of its second half scored. Both sides score the same token ids (pyllm's
tokenization, which matches llama.cpp's: benchmarks/compare_tokenizer.py).
Prints both perplexities, their relative difference, the mean |nll difference|
per token, and the time each side took (pyllm first, then llama.cpp; a quiet
machine is needed for the times to mean anything).

The text: -f FILE, default the English text of Python's own documentation
topics (pydoc_data, shipped with Python), which needs no download.

llama.cpp runs in its own virtual environment as a subprocess (pyllm never
imports it): --peer-python, default $PYLLM_PEER_PYTHON or /tmp/peer-avx512/bin/python.

--reference N also scores the first N chunks with pyllm.reference (numpy, the
weights dequantized, float64 math, KV rounded to f16 as both engines store it)
and prints how far each engine's nll is from it.

--kl-divergence: the llama.cpp side also writes its log-probabilities as a
llama-perplexity --kl-divergence-base file (encoded here, independently of
pyllm's writer), and pyllm's Model.kl_divergence reads it: the KL divergence of
pyllm's next-token distributions from llama.cpp's, and how often both put the
same token on top.

    python benchmarks/compare_perplexity.py [-m MODEL] [-c 512] [--chunks 16] [-t 2] [-f FILE] [--reference 1]
                                            [--cache-type f16|q8_0|q4_0] [--kl-divergence]
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
import json, sys, time
import numpy as np
import llama_cpp as L
job = json.load(open(sys.argv[1]))
n_ctx = job["n_ctx"]
kv = {} if job["kv_type"] == 1 else {"type_k": job["kv_type"], "type_v": job["kv_type"], "flash_attn": True}
llm = L.Llama(job["model"], n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=job["threads"],
              n_threads_batch=job["threads"], logits_all=True, verbose=False, **kv)
first = n_ctx // 2
nll = []
out = None
if job["kld_out"]:
    # llama-perplexity's --kl-divergence-base layout: "_logits_", int32 n_ctx, n_vocab, n_chunk, the tokens,
    # then per scored token 4 uint16 (float32 scale, min log-prob) and the logits, 16 bits each, padded to even
    out = open(job["kld_out"], "wb")
    n_vocab = llm.n_vocab()
    out.write(b"_logits_" + np.array([n_ctx, n_vocab, len(job["chunks"])], "<i4").tobytes())
    out.write(np.array(job["chunks"], "<i4").tobytes())
t0 = time.perf_counter()
for chunk in job["chunks"]:
    llm.reset()
    llm.eval(chunk)
    rows = np.asarray(llm.scores[first:n_ctx - 1], dtype=np.float32)
    top = rows.max(axis=1)
    sums = np.exp(rows - top[:, None]).sum(axis=1, dtype=np.float64)
    picked = rows[np.arange(len(rows)), chunk[first + 1:]].astype(np.float64)
    nll.extend((np.log(sums) - (picked - top)).tolist())
    if out is not None:
        for row, mx, s in zip(rows, top, sums):
            low = max(float(row.min()), float(mx) - 16)
            scale = np.float32((mx - low) / 65535)
            rec = np.zeros(2 * ((n_vocab + 1) // 2) + 4, "<u2")
            rec[:4] = np.array([scale, low - mx - np.log(s)], "<f4").view("<u2")
            if scale > 0:
                rec[4:4 + n_vocab] = np.where(row > low, np.rint((row - low) / scale), 0)
            out.write(rec.tobytes())
if out is not None:
    out.close()
print(json.dumps({"nll": nll, "seconds": time.perf_counter() - t0}))
'''


def default_text() -> str:
    import pydoc_data.topics as topics
    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-f", "--file", help="the text (default: Python's documentation topics)")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reference", type=int, default=0, help="chunks to score with pyllm.reference too")
    ap.add_argument("--cache-type", choices=("f16", "q8_0", "q4_0"), default="f16",
                    help="both engines' KV cache format (quantized: llama.cpp with flash attention, as it requires)")
    ap.add_argument("--kl-divergence", action="store_true",
                    help="also the KL divergence of pyllm's distributions from llama.cpp's (through a base file)")
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-avx512/bin/python"))
    a = ap.parse_args()

    from pyllm import Model
    from pyllm.perplexity import chunk_nll

    text = Path(a.file).read_text(encoding="utf-8") if a.file else default_text()
    with Model(a.model, n_ctx=a.ctx_size, n_threads=a.threads, cache_type_k=a.cache_type,
               cache_type_v=a.cache_type) as m:
        ids = m.tokenize(text)
        t0 = time.perf_counter()
        result = m.perplexity(ids, max_chunks=a.chunks)
        t_ours = time.perf_counter() - t0
        bos = m.tokenizer.bos_id if m.tokenizer.add_bos else None
        chunks = []
        for i in range(result.chunks):
            chunk = ids[i * a.ctx_size:(i + 1) * a.ctx_size]
            chunks.append([bos] + chunk[1:] if bos is not None else chunk)
        ours = np.concatenate([chunk_nll(m.engine._fresh_logits, c, a.ctx_size // 2) for c in chunks])
        ref = None
        if a.reference:
            from pyllm.reference import Reference
            reference = Reference(m.arch, kv_f16=True, kv_quant=None if a.cache_type == "f16" else a.cache_type)

            def reference_logits(tokens, skip):
                yield skip, reference.forward(tokens)[skip:].astype(np.float32)
            ref = np.concatenate([chunk_nll(reference_logits, c, a.ctx_size // 2) for c in chunks[:a.reference]])

    with tempfile.TemporaryDirectory() as tmp:
        job = {"model": a.model, "n_ctx": a.ctx_size, "threads": a.threads, "chunks": chunks,
               "kv_type": {"f16": 1, "q8_0": 8, "q4_0": 2}[a.cache_type],
               "kld_out": f"{tmp}/llama-cpp.kld" if a.kl_divergence else None}
        Path(f"{tmp}/job.json").write_text(json.dumps(job))
        r = subprocess.run([a.peer_python, "-c", PEER, f"{tmp}/job.json"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"llama.cpp side failed:\n{r.stderr[-3000:]}")
        kld = None
        if a.kl_divergence:
            with Model(a.model, n_ctx=a.ctx_size, n_threads=a.threads, cache_type_k=a.cache_type,
                       cache_type_v=a.cache_type) as m:
                kld = m.kl_divergence(job["kld_out"]).statistics()
    peer = json.loads(r.stdout.strip().splitlines()[-1])
    theirs = np.array(peer["nll"])
    ppl_theirs = float(np.exp(theirs.mean()))
    print(f"{Path(a.model).name}: {result.chunks} chunks of {a.ctx_size}, {result.tokens_scored} tokens scored")
    print(f"  pyllm      PPL = {result.ppl:.4f} +/- {result.error:.5f}   {t_ours:.1f} s")
    print(f"  llama.cpp  PPL = {ppl_theirs:.4f}              {peer['seconds']:.1f} s (logits for every token)")
    print(f"  PPL relative difference {result.ppl / ppl_theirs - 1:+.4%}; per token |nll difference| mean "
          f"{np.abs(ours - theirs).mean():.4f}, max {np.abs(ours - theirs).max():.4f}")
    if kld is not None:
        print(f"  KL divergence of pyllm from llama.cpp: mean {kld['kld'][0]:.6f} +/- {kld['kld'][1]:.6f}, "
              f"99% {kld['kld_percentiles']['99.0%']:.6f}, max {kld['kld_percentiles']['Maximum']:.6f}; "
              f"RMS dp {100 * kld['rms_p_diff'][0]:.3f}%; same top token {100 * kld['same_top'][0]:.2f}%")
    if ref is not None:
        for name, nll in (("pyllm", ours), ("llama.cpp", theirs)):
            d = np.abs(nll[:len(ref)] - ref)
            print(f"  {name:10} against the numpy reference ({a.reference} chunks, {len(ref)} tokens): |nll "
                  f"difference| mean {d.mean():.4f}, max {d.max():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
