#!/usr/bin/env python3
"""Parallel requests: the decode rate of N sequences generated at once, pyllm against
llama.cpp, as llama-batched-bench measures it (npl sequences, npp prompt tokens each,
ntg generated each; the aggregate tokens/s of the generation).

pyllm runs the sequences as a server does with --parallel N: N threads, each with a
slot of the model (Model.parallel), their decode steps batched by pyllm.batching. The
baseline is the same N requests one after another. llama.cpp (llama-cpp-python's
low-level API, in its own virtual environment: --peer-python, default
$PYLLM_PEER_PYTHON or /tmp/peer-avx512/bin/python) decodes the N sequences in one
llama_batch per step (one token of each sequence, a unified KV cache), its own
batched decoding with no server around it.

Prompts are stretches of npp tokens of the README, one for each sequence; decoding is greedy with
the end-of-generation tokens banned, so every sequence makes ntg tokens. The decode rate
is N (ntg - 1) / (time(ntg) - time(1)): the prompts' time cancels out. Runs alternate
between the engines, --reps times; the best of each is kept.

    python benchmarks/compare_parallel.py [-m smollm2-135m -m gemma3-270m] [--npl 1,2,4,8] [--ntg 64]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEER = r'''
import ctypes, json, sys, time
import numpy as np
import llama_cpp as L
job = json.loads(sys.stdin.read())
L.llama_backend_init()
mp = L.llama_model_default_params()
model = L.llama_model_load_from_file(job["model"].encode(), mp)
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)
banned = np.array(job["banned"], dtype=np.int64)
out = {}
for npl in job["npl"]:
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = job["n_ctx"], 512, 512
    cp.n_seq_max, cp.kv_unified = npl, True
    cp.n_threads = cp.n_threads_batch = job["threads"]
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(512, 0, npl)

    def add(i, tok, pos, seq, logits):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, logits

    def run(ntg):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        def greedy(i):
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
            row[banned] = -np.inf
            return int(np.argmax(row))

        toks = []
        for s in range(npl):   # each prompt in its own decode calls, as a server takes them
            prompt = job["prompts"][s]
            for c in range(0, len(prompt), 512):
                chunk = prompt[c:c + 512]
                batch.n_tokens = len(chunk)
                for i, t in enumerate(chunk):
                    add(i, t, c + i, s, int(c + i == len(prompt) - 1))
                assert L.llama_decode(ctx, batch) == 0
            toks.append(greedy(len(chunk) - 1))
        pos = [len(p) for p in job["prompts"][:npl]]
        made = [[t] for t in toks]
        for step in range(1, ntg):
            batch.n_tokens = npl
            for s in range(npl):
                add(s, toks[s], pos[s], s, 1)
                pos[s] += 1
            assert L.llama_decode(ctx, batch) == 0
            toks = [greedy(s) for s in range(npl)]
            for s in range(npl):
                made[s].append(toks[s])
        return time.perf_counter() - t0, made

    t1, _ = run(1)
    tn, made = run(job["ntg"])
    out[str(npl)] = {"t1": t1, "tn": tn, "tokens": made}
    L.llama_batch_free(batch)
    L.llama_free(ctx)
print(json.dumps(out))
'''


def pyllm_run(m, prompts, ntg, banned, parallel: bool):
    """(seconds, tokens of each sequence) for the prompts generated at once (or one by one)."""
    m.parallel(len(prompts))   # fresh slots (the old ones give their blocks back)
    m.engine.pool.forget_cached()   # every run computes its prompts (llama.cpp's start from a cleared cache too)
    out = [None] * len(prompts)
    bias = {t: -float("inf") for t in banned}

    def gen(i):
        with m.slots.take():
            out[i] = m.generate(prompts[i], max_tokens=ntg, temperature=0, logit_bias=bias).tokens
    t0 = time.perf_counter()
    if parallel:
        threads = [threading.Thread(target=gen, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(len(prompts)):
            gen(i)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append")
    ap.add_argument("--npl", default="1,2,4,8", help="sequences at once (comma-separated)")
    ap.add_argument("--npp", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--ntg", type=int, default=64, help="tokens generated per sequence")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-avx512/bin/python"))
    args = ap.parse_args()
    from pyllm import Model, registry

    npls = [int(x) for x in args.npl.split(",")]
    rows = []
    for name in args.model or ["smollm2-135m", "gemma3-270m"]:
        path = registry.resolve(name)
        n_ctx = max(npls) * (args.npp + args.ntg) + 64
        with Model(path, n_threads=args.threads, n_ctx=n_ctx) as m:
            text = m.tokenize((ROOT / "README.md").read_text())   # a different stretch of it for each sequence
            step = (len(text) - args.npp) // max(npls)
            prompts = [text[i * step:i * step + args.npp] for i in range(max(npls))]
            banned = sorted(m.tokenizer.eog_ids)
            job = {"model": str(path), "n_ctx": n_ctx, "threads": args.threads, "prompts": prompts,
                   "banned": banned, "npl": npls, "ntg": args.ntg}
            best = {}
            for _ in range(args.reps):
                for npl in npls:
                    for mode in ("alone", "parallel"):
                        t1, _ = pyllm_run(m, prompts[:npl], 1, banned, mode == "parallel")
                        tn, toks = pyllm_run(m, prompts[:npl], args.ntg, banned, mode == "parallel")
                        rate = npl * (args.ntg - 1) / (tn - t1)
                        key = (npl, mode)
                        if rate > best.get(key, (0,))[0]:
                            best[key] = (rate, toks)
                r = subprocess.run([args.peer_python, "-c", PEER], input=json.dumps(job), capture_output=True,
                                   text=True, timeout=3600)
                if r.returncode != 0:
                    sys.exit(f"llama.cpp failed:\n{r.stderr[-3000:]}")
                for npl, v in json.loads(r.stdout).items():
                    rate = int(npl) * (args.ntg - 1) / (v["tn"] - v["t1"])
                    key = (int(npl), "llama.cpp")
                    if rate > best.get(key, (0,))[0]:
                        best[key] = (rate, v["tokens"])
            for npl in npls:
                alone, par, peer = best[(npl, "alone")], best[(npl, "parallel")], best[(npl, "llama.cpp")]
                same = par[1] == alone[1]
                agree = np.mean([a == b for pa, pb in zip(par[1], peer[1]) for a, b in zip(pa, pb)])
                rows.append((m.path.stem, npl, alone[0], par[0], peer[0], same, agree))
    print(f"\n{args.threads} threads, prompts of {args.npp} tokens, {args.ntg} generated each, "
          f"best of {args.reps}; decode tokens/s of all sequences together\n")
    print("| model | sequences | pyllm one by one | pyllm parallel | llama.cpp batched | parallel / llama.cpp "
          "| same tokens as one by one | tokens as llama.cpp's |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, npl, a, p, q, same, agree in rows:
        print(f"| {name} | {npl} | {a:.1f} | {p:.1f} ({p / a:.2f}x) | {q:.1f} | {p / q:.2f}x | "
              f"{'yes' if same else 'NO'} | {agree:.0%} |")


if __name__ == "__main__":
    main()
