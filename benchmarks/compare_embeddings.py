#!/usr/bin/env python3
"""Embeddings: pyllm against llama.cpp (and the float32 reference), agreement and speed.

Agreement: for each model, the pooled, unnormalized embedding of every text from
both engines and from pyllm/reference.py:

  cos min   the smallest cosine between pyllm's and llama.cpp's vectors of a text
  rel       RMS(pyllm - llama.cpp) / std(llama.cpp), over all texts
  ref rel   each engine's rel from the reference

Models: the registry's all-minilm-l6-v2 (a real BERT, converted by pyllm.convert),
and with --synthetic random bert, nomic-bert, nomic-bert-moe, jina-bert-v2 and modern-bert encoders, a llama-embed (Llama both ways) (tests/synth.py, all-MiniLM's
vocabulary copied in), an EmbeddingGemma (gemma-embedding: windows both ways, dense
projections) and a random Qwen 3 decoder pooled by its last token or by the mean
(as Qwen3-Embedding files say; SmolLM2's vocabulary), at F32 and as llama.cpp's
quantizer makes them (Q8_0, Q4_K_M).

Speed (--speed): texts per second embedding a batch of sentences (8-60 words) and of
long documents (about 500 tokens), pyllm and llama.cpp alternating, median of -r runs,
each engine timing its own embed calls (model loading excluded). llama-cpp-python
packs several short texts into one batch; pyllm runs a text per step.

llama.cpp runs in its own virtual environment as a subprocess (pyllm never imports
it): --peer-python, default $PYLLM_PEER_PYTHON or /tmp/peer-venv/bin/python.

    python benchmarks/compare_embeddings.py [--synthetic] [--speed -t 1,2 -r 3]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TEXTS = ["The cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell sharply today.",
         "Héllo, wörld! naïve café, Ångström", "What is the capital of France?", "Paris is the capital of France.",
         "def add(a, b): return a + b  # $%^&*", "I loved this movie; the acting was superb!!!", "",
         "The quick brown fox jumps over the lazy dog " * 20]
POOLING_TYPES = {"mean": 1, "cls": 2, "last": 3}

PEER = r'''
import json, sys, time
import llama_cpp
job = json.loads(sys.argv[1])
for q in job.get("quantize", []):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + q["type"])
    p.nthread = 2
    if llama_cpp.llama_model_quantize(q["src"].encode(), q["dst"].encode(), p) != 0:
        sys.exit("quantizing " + q["dst"] + " failed")
out = {}
for e in job.get("embed", []):
    m = llama_cpp.Llama(e["path"], embedding=True, n_ctx=e["n_ctx"], n_batch=e["n_ctx"], n_ubatch=e["n_ctx"],
                        n_threads=e["threads"], n_threads_batch=e["threads"], verbose=False)
    t0 = time.perf_counter()
    vecs = m.embed(e["texts"], normalize=False)
    out[e["key"]] = {"s": time.perf_counter() - t0, "vecs": vecs if e.get("keep", True) else None,
                     "tokens": sum(len(m.tokenize(t.encode())) for t in e["texts"])}
    del m
print(json.dumps(out))
'''


def peer(peer_python: str, job: dict) -> dict:
    r = subprocess.run([peer_python, "-c", PEER, json.dumps(job)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llama.cpp side failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def rel(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x.astype(np.float64) - y) ** 2)) / y.std())


def cosines(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)


def pyllm_embed(path: str, texts: list[str], threads: int, n_ctx: int) -> tuple[np.ndarray, float, int]:
    from pyllm import Model
    with Model(path, n_ctx=n_ctx, n_threads=threads, embedding=True) as m:
        ids = [m.embedding_tokens(t, truncate=True) for t in texts]
        t0 = time.perf_counter()
        vecs = np.stack([m.embed_tokens(i, normalize=False) for i in ids])
        return vecs, time.perf_counter() - t0, sum(map(len, ids))


def reference_embed(path: str, texts: list[str], n_ctx: int) -> np.ndarray:
    from pyllm import Model
    from pyllm.reference import Reference
    with Model(path, n_ctx=n_ctx, embedding=True, n_threads=1) as m:
        ref, out = Reference(m.arch), []
        for t in texts:
            rows = ref.forward(m.embedding_tokens(t, truncate=True), embeddings=True)
            out.append({"mean": lambda: rows.mean(0), "cls": lambda: rows[0], "last": lambda: rows[-1]}[m.pooling]())
        return np.stack(out)


def agreement(files: list[tuple[str, str]], a) -> None:
    texts = [t for t in TEXTS if t]   # llama-cpp-python cannot embed an empty text
    job = {"embed": [{"key": label, "path": path, "texts": texts, "n_ctx": a.n_ctx, "threads": a.threads[-1]}
                     for label, path in files]}
    theirs = peer(a.peer_python, job)
    print(f"{'model':<24} {'cos min':>10} {'rel':>9} {'ref rel':>9} {'llama.cpp ref rel':>17}")
    for label, path in files:
        ours, _, _ = pyllm_embed(path, texts, a.threads[-1], a.n_ctx)
        peer_vecs = np.asarray(theirs[label]["vecs"], np.float32)
        ref = reference_embed(path, texts, a.n_ctx)
        print(f"{label:<24} {cosines(ours, peer_vecs).min():>10.7f} {rel(ours, peer_vecs):>9.4%} "
              f"{rel(ours, ref):>9.4%} {rel(peer_vecs, ref):>17.4%}")


def corpus(n: int, words: tuple, seed: int = 0) -> list[str]:
    """n texts of random English words, each `words` (lo, hi) words long."""
    vocab = ("time person year way day thing man world life hand part child eye woman place work week case point "
             "government company number group problem fact be have do say get make go know take see come think look "
             "want give use find tell ask seem feel try leave call good new first last long great little own other "
             "old right big high different small large next early young important few public bad same able").split()
    rng = random.Random(seed)
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(*words))).capitalize() + "." for _ in range(n)]


def speed(path: str, a) -> None:
    sets = {"sentences": corpus(200, (8, 60)), "documents": corpus(16, (380, 420), seed=1)}
    print(f"\nspeed, {Path(path).name}: texts/s and tokens/s, median of {a.reps} (pyllm / llama.cpp)")
    for threads in a.threads:
        for name, texts in sets.items():
            ours_s, theirs_s, tokens = [], [], 0
            for _ in range(a.reps):
                _, s, tokens = pyllm_embed(path, texts, threads, a.n_ctx)
                ours_s.append(s)
                r = peer(a.peer_python, {"embed": [{"key": "x", "path": path, "texts": texts, "n_ctx": a.n_ctx,
                                                     "threads": threads, "keep": False}]})["x"]
                theirs_s.append(r["s"])
            o, t = statistics.median(ours_s), statistics.median(theirs_s)
            print(f"  t={threads} {name:<10} {len(texts)} texts, {tokens} tokens: pyllm {len(texts) / o:8.1f} texts/s "
                  f"({tokens / o:7.0f} tok/s), llama.cpp {len(texts) / t:8.1f} texts/s ({r['tokens'] / t:7.0f} tok/s): "
                  f"{t / o:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", help="model files or registry names "
                    "(default: all-minilm-l6-v2)")
    ap.add_argument("--synthetic", action="store_true", help="also random bert and nomic-bert files, F32 and "
                    "quantized by llama.cpp")
    ap.add_argument("--speed", action="store_true", help="time both engines (on the first model)")
    ap.add_argument("-t", "--threads", default="2", help="threads, e.g. 1,2 (agreement uses the last)")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-c", "--n-ctx", type=int, default=512)
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-venv/bin/python"))
    ap.add_argument("--out", help="keep the synthetic files here")
    a = ap.parse_args()
    a.threads = [int(t) for t in a.threads.split(",")]

    from pyllm import registry
    models = [str(registry.fetch(m) if m in registry.MODELS else m) for m in (a.model or ["all-minilm-l6-v2"])]
    files = [(Path(m).stem, m) for m in models]
    if a.synthetic:
        import synth
        from pyllm.model_file import ModelFile
        out = Path(a.out or tempfile.mkdtemp(prefix="embeddings-"))
        out.mkdir(parents=True, exist_ok=True)
        vocab = ModelFile(str(registry.fetch("all-minilm-l6-v2"))).metadata
        job = {"quantize": []}
        smol = ModelFile(str(registry.fetch("smollm2-135m"))).metadata
        for arch in ("bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "modern-bert", "llama-embed", "gemma-embedding", "qwen3-last", "qwen3-mean"):
            if arch.startswith("qwen3"):   # a decoder embedding as Qwen3-Embedding does (causal; last token)
                plain = synth.write_qwen3(out / f"{arch}-plain.gguf", synth.QT.F32, tokenizer_from=smol)
                src = synth.rewrite_metadata(plain, out / f"{arch}-F32.gguf",
                                             {"qwen3.pooling_type": POOLING_TYPES[arch.split("-")[1]]})
            elif arch == "llama-embed":   # Llama's layers both ways, mean pooling (SmolLM2's vocabulary)
                src = synth.write_llama_embed(out / f"{arch}-F32.gguf", synth.QT.F32, tokenizer_from=smol)
            elif arch == "modern-bert":   # 4 layers, 1 and 2 local over 4 positions either way
                src = synth.write_modern_bert(out / f"{arch}-F32.gguf", synth.QT.F32, tokenizer_from=vocab)
            elif arch == "gemma-embedding":   # 6 layers, a window of 8 (4 either way), dense projections
                src = synth.write_gemma_embedding(out / f"{arch}-F32.gguf", synth.QT.F32, tokenizer_from=smol)
            else:
                src = synth.write_bert(out / f"{arch}-F32.gguf", synth.QT.F32, arch, tokenizer_from=vocab,
                                       n_layer=4 if arch == "nomic-bert-moe" else 2)   # experts in layers 1 and 3
            files.append((f"{arch}-F32", src))
            for t in ("Q8_0", "Q4_K_M"):
                job["quantize"].append({"src": src, "dst": str(out / f"{arch}-{t}.gguf"), "type": t})
                files.append((f"{arch}-{t}", str(out / f"{arch}-{t}.gguf")))
        peer(a.peer_python, job)
    agreement(files, a)
    if a.speed:
        speed(models[0], a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
