#!/usr/bin/env python3
"""Speculative decoding: pyllm's ngram-simple against plain decoding, and against
llama-cpp-python's prompt lookup decoding (LlamaPromptLookupDecoding, its
draft-model-free speculation), on the same prompts, greedy.

Each task is a chat prompt (pyllm renders the model's template; both engines
get the same text): "copy" asks to repeat a block of code, "edit" to rewrite
it with a change, "free" is an open question (little to copy: speculation must
not cost much there). Generation runs n tokens with the end tokens banned, so
both engines produce exactly n; the decode rate is (n - 1) / (time(n) -
time(1)), the same for both engines. pyllm with and without speculation must
give the same tokens (checked); llama.cpp's two runs are compared as well.
Runs alternate (pyllm plain, pyllm ngram, llama.cpp plain, llama.cpp lookup)
--reps times; the best of each is reported.

llama.cpp runs in its own virtual environment as a subprocess (pyllm never
imports it): --peer-python, default $PYLLM_PEER_PYTHON or
/tmp/peer-avx512/bin/python.

    python benchmarks/compare_speculative.py [-m smollm2-135m -m gemma3-270m] [-n 200] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CODE = (ROOT / "pyllm" / "speculative.py").read_text().split("class NgramDrafter")[1].split("class DraftModelDrafter")[0]
CODE = "class NgramDrafter" + CODE.rstrip() + "\n"
TASKS = {
    "copy": "Repeat this code exactly, with nothing before or after it:\n\n" + CODE,
    "edit": "Rewrite this code with the variable `h` renamed to `seen`; change nothing else:\n\n" + CODE,
    "free": "Write a long story about a lighthouse keeper who finds a message in a bottle.",
}

PEER = r'''
import json, sys, time
import numpy as np
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
job = json.loads(sys.stdin.read())
out = {}
for mode in ("plain", "lookup"):
    draft = LlamaPromptLookupDecoding(num_pred_tokens=job["num_pred"]) if mode == "lookup" else None
    llm = Llama(job["model"], n_ctx=job["n_ctx"], n_threads=job["threads"], n_threads_batch=job["threads"],
                n_batch=512, verbose=False, draft_model=draft, logits_all=draft is not None)
    bias = {int(t): -1e9 for t in job["banned"]}
    times = {}
    for n in (1, job["n"]):
        llm.reset()
        t0 = time.perf_counter()
        r = llm.create_completion(job["prompt"], max_tokens=n, temperature=0.0, logit_bias=bias, seed=0)
        times[n] = time.perf_counter() - t0
    out[mode] = {"decode_s": times[job["n"]] - times[1], "n": r["usage"]["completion_tokens"],
                 "text": r["choices"][0]["text"]}
    del llm
print(json.dumps(out))
'''


def run_pyllm(m, prompt_ids, n, banned):
    """(decode seconds for n - 1 tokens, tokens, metrics) with the end tokens banned."""
    bias = {t: float("-inf") for t in banned}
    m.generate(prompt_ids, max_tokens=1, temperature=0)   # the prompt's blocks cached for both timed runs
    times, c = {}, None
    for k in (1, n):
        m._seq.truncate(0)
        t0 = time.perf_counter()
        c = m.generate(prompt_ids, max_tokens=k, temperature=0, logit_bias=bias)
        times[k] = time.perf_counter() - t0
    return times[n] - times[1], c


def peer_run(python, job):
    r = subprocess.run([python, "-c", PEER], input=json.dumps(job), capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", action="append", help="registry names or paths (default: both test models)")
    ap.add_argument("-n", type=int, default=200, help="tokens per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--task", action="append", choices=sorted(TASKS))
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--ngram", type=int, default=6)
    ap.add_argument("--num-pred", type=int, default=10, help="llama-cpp-python's num_pred_tokens")
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-avx512/bin/python"))
    args = ap.parse_args()
    from pyllm import Model, registry

    print("| model | task | pyllm plain tok/s | pyllm ngram tok/s | speed-up | kept/guessed | same tokens "
          "| llama.cpp plain | llama.cpp lookup | speed-up | pyllm ngram / llama.cpp lookup |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.model or ["smollm2-135m", "gemma3-270m"]:
        path = str(registry.resolve(name))
        plain_m = Model(path, n_ctx=2048, n_threads=args.threads)
        spec_m = Model(path, n_ctx=2048, n_threads=args.threads, spec_type="ngram-simple",
                       spec_draft_max=args.draft_max, spec_ngram_size=args.ngram)
        banned = sorted(plain_m.chat_stop()[0] | set(plain_m.tokenizer.eog_ids))
        for task in args.task or list(TASKS):
            text = plain_m.apply_chat_template([{"role": "user", "content": TASKS[task]}])
            ids = plain_m.tokenize(text, special=True)
            job = {"model": path, "prompt": text, "n": args.n, "threads": args.threads, "n_ctx": 2048,
                   "banned": banned, "num_pred": args.num_pred}
            best = {"plain": 1e9, "ngram": 1e9, "lplain": 1e9, "lookup": 1e9}
            same = True
            peer_same = True
            for _ in range(args.reps):
                s_plain, c_plain = run_pyllm(plain_m, ids, args.n, banned)
                s_spec, c_spec = run_pyllm(spec_m, ids, args.n, banned)
                same &= c_spec.tokens == c_plain.tokens
                peer = peer_run(args.peer_python, job)
                peer_same &= peer["plain"]["text"] == peer["lookup"]["text"]
                best["plain"] = min(best["plain"], s_plain)
                best["ngram"] = min(best["ngram"], s_spec)
                best["lplain"] = min(best["lplain"], peer["plain"]["decode_s"])
                best["lookup"] = min(best["lookup"], peer["lookup"]["decode_s"])
            rate = {k: (args.n - 1) / v for k, v in best.items()}
            mm = c_spec.metrics
            print(f"| {name} | {task} | {rate['plain']:.1f} | {rate['ngram']:.1f} | "
                  f"{rate['ngram'] / rate['plain']:.2f}x | {mm.accepted_tokens}/{mm.draft_tokens} | "
                  f"{'yes' if same else 'NO'} | {rate['lplain']:.1f} | {rate['lookup']:.1f} "
                  f"({'same' if peer_same else 'other'} text) | {rate['lookup'] / rate['lplain']:.2f}x | "
                  f"{rate['ngram'] / rate['lookup']:.2f}x |", flush=True)
        plain_m.close()
        spec_m.close()


if __name__ == "__main__":
    main()
