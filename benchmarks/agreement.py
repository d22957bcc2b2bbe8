#!/usr/bin/env python3
"""Teacher-forced agreement of pyllm with llama.cpp on a real model.

For each built-in prompt: llama.cpp (llama-cpp-python, run in its own
virtual environment as a subprocess; pyllm never imports it) tokenizes the
prompt and writes its own greedy continuation of --n-gen tokens; then both
engines read prompt + continuation in one batch and their logits are
compared at the continuation positions (the positions that predict each
continuation token):

  top-1   pyllm's argmax equals llama.cpp's, counted where llama.cpp's top-2
          margin exceeds --margin (elsewhere the order is a coin toss)
  rel     RMS(pyllm - llama.cpp) / std(llama.cpp logits)
  max     the largest |difference| of one logit
  greedy  how many tokens of pyllm's own greedy continuation (decoded step by
          step) equal llama.cpp's before the first difference

With --reference, both engines are also compared with exact math (the
float32 numpy reference, pyllm/reference.py, on the same dequantized
weights) at the same positions: it tells whether a disagreement between the
two is one engine being less precise or two sets of rounding going their own
ways (top-1 counted where the reference's margin exceeds --margin).

Usage: python benchmarks/agreement.py -m models/gemma-3-270m-q4_k_m.gguf
       [--peer-python /tmp/peer-venv/bin/python] [--n-gen 48] [-t 2] [--reference] [--cache-type q8_0]
       [--lora ADAPTER.gguf[:SCALE]]   (a test adapter: tests/synth.py's write_lora)
       [--control-vector CVEC.gguf[:SCALE]]   (applied on llama.cpp's side through llama_set_adapter_cvec,
                                               as llama.cpp's common code loads --control-vector-scaled)
Exit status 1 when the totals miss --min-top1 (0.97) or --max-rel (0.08).
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
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a forest, there lived",
    "Photosynthesis is the process by which plants",
    "Here is a list of the planets of the solar system, in order from the Sun:\n1.",
    "Q: What is 17 times 3?\nA:",
]

PEER = r'''
import json, sys
import numpy as np
import llama_cpp
args = json.loads(sys.argv[1])
kv = {} if args["kv_type"] == 1 else {"type_k": args["kv_type"], "type_v": args["kv_type"], "flash_attn": True}
lora = {"lora_path": args["lora"][0], "lora_scale": args["lora"][1]} if args["lora"] else {}
m = llama_cpp.Llama(model_path=args["model"], logits_all=True, n_ctx=args["n_ctx"], n_batch=args["n_ctx"],
                    n_threads=args["threads"], verbose=False, **kv, **lora)
if args["cvec"]:   # layers 1..n: their directions, as llama.cpp's common code lays them out
    import ctypes
    data = np.ascontiguousarray(np.load(args["cvec"]["data"]), dtype=np.float32)
    n_embd = args["cvec"]["n_embd"]
    rc = llama_cpp.llama_set_adapter_cvec(m.ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), data.size,
                                          n_embd, 1, data.size // n_embd)
    assert rc == 0, rc
out = {}
for i, prompt in enumerate(args["prompts"]):
    ids = m.tokenize(prompt.encode(), add_bos=True, special=False)
    m.reset()
    m.eval(ids)
    gen = []
    for _ in range(args["n_gen"]):
        nxt = int(np.argmax(m.scores[m.n_tokens - 1]))
        gen.append(nxt)
        if nxt == m.token_eos():
            break
        m.eval([nxt])
    full = ids + gen
    m.reset()
    m.eval(full)
    P = len(ids)
    logits = np.asarray(m.scores[P - 1:len(full) - 1], dtype=np.float32)
    np.save(f"{args['out']}/peer{i}.npy", logits)
    out[i] = {"ids": full, "n_prompt": P, "text": m.detokenize(gen).decode("utf-8", "replace")}
json.dump(out, open(f"{args['out']}/peer.json", "w"))
'''


def run_peer(peer_python: str, model: str, prompts: list[str], n_gen: int, threads: int, tmp: str,
             kv_type: int = 1, lora: Optional[tuple[str, float]] = None, cvec: Optional[dict] = None) -> dict:
    """cvec: layer (from 0) -> the control vector added after it, as pyllm's Graph takes them"""
    flat = None
    if cvec:
        n_embd = len(next(iter(cvec.values())))
        rows = np.zeros((max(cvec), n_embd), np.float32)
        for layer, v in cvec.items():
            rows[layer - 1] = v
        np.save(f"{tmp}/cvec.npy", rows.ravel())
        flat = {"data": f"{tmp}/cvec.npy", "n_embd": n_embd}
    args = {"model": model, "prompts": prompts, "n_gen": n_gen, "threads": threads, "out": tmp, "n_ctx": 512,
            "kv_type": kv_type, "lora": lora, "cvec": flat}
    r = subprocess.run([peer_python, "-c", PEER, json.dumps(args)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llama.cpp side failed (status {r.returncode}):\n{r.stderr[-2000:]}{r.stdout[-500:]}")
    return {int(k): v for k, v in json.load(open(f"{tmp}/peer.json")).items()}


def pyllm_logits(model: str, threads: int, n_max: int, kv_type: int = 1, lora: Optional[tuple[str, float]] = None,
                 cvec: Optional[dict] = None):
    from pyllm.arch import load_architecture
    from pyllm.backend.cpu import CpuBackend
    from pyllm.graph import Graph
    from pyllm.lora import graph_pairs, open_adapters
    from pyllm.model_file import ModelFile

    arch = load_architecture(ModelFile(model), n_ctx=512)
    g = Graph(control=cvec, **graph_pairs(open_adapters([lora] if lora else [], arch.mf)))
    arch.build(g)
    block = 32
    n_blocks = (n_max + block - 1) // block
    be = CpuBackend(g, threads, n_max, n_max, n_blocks, block, k_type=kv_type, v_type=kv_type)

    def run(ids: list[int], n_prompt: int) -> np.ndarray:
        out = be.forward(ids, 0, list(range(n_blocks)), len(ids))
        return out[n_prompt - 1:len(ids) - 1].copy()

    def greedy(prompt: list[int], n: int) -> list[int]:
        """pyllm's own greedy continuation, decoded one step at a time"""
        logits = be.forward(prompt, 0, list(range(n_blocks)), 1)[-1]
        gen = []
        for i in range(n):
            gen.append(int(np.argmax(logits)))
            if len(prompt) + len(gen) >= n_max:
                break
            logits = be.forward(gen[-1:], len(prompt) + i, list(range(n_blocks)), 1)[-1]
        return gen
    return run, greedy


def compare(ours: np.ndarray, peer: np.ndarray, margin: float) -> dict:
    top2 = np.sort(peer, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > margin
    agree = ours.argmax(1) == peer.argmax(1)
    d = ours - peer
    return {"positions": len(peer), "clear": int(clear.sum()), "top1_clear": int(agree[clear].sum()),
            "top1_all": int(agree.sum()), "sq": float(np.sum(d.astype(np.float64) ** 2)), "n": d.size,
            "peer_sum": float(peer.sum(dtype=np.float64)), "peer_sq": float(np.sum(peer.astype(np.float64) ** 2)),
            "max": float(np.abs(d).max())}


def rel_of(c: dict) -> float:
    mean = c["peer_sum"] / c["n"]
    std = np.sqrt(c["peer_sq"] / c["n"] - mean ** 2)
    return float(np.sqrt(c["sq"] / c["n"]) / std)


def against_reference(model: str, kept: list, margin: float, lora: Optional[tuple[str, float]] = None,
                      cvec: Optional[dict] = None) -> None:
    """prints how far each engine's logits are from the float32 reference's"""
    from pyllm.arch import load_architecture
    from pyllm.model_file import ModelFile
    from pyllm.lora import open_adapters
    from pyllm.reference import Reference

    arch = load_architecture(ModelFile(model), n_ctx=512)
    ref = Reference(arch, lora=open_adapters([lora] if lora else [], arch.mf), control=cvec)
    exact = np.concatenate([ref.forward(ids)[n_prompt - 1:len(ids) - 1] for _, _, ids, n_prompt in kept])
    top2 = np.sort(exact, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > margin
    for name, k in (("pyllm", 0), ("llama.cpp", 1)):
        got = np.concatenate([x[k] for x in kept])
        rel = np.sqrt(np.mean((got - exact).astype(np.float64) ** 2)) / exact.std()
        top1 = np.mean(got.argmax(1)[clear] == exact.argmax(1)[clear])
        print(f"{name:<10} vs float32 reference: rel {rel:.2%}, top-1 {top1:.1%} "
              f"(where the reference's margin > {margin}: {int(clear.sum())} positions)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-venv/bin/python"))
    ap.add_argument("--n-gen", type=int, default=48)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--margin", type=float, default=0.1)
    ap.add_argument("--min-top1", type=float, default=0.97)
    ap.add_argument("--max-rel", type=float, default=0.08)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--cache-type", choices=("f16", "q8_0", "q4_0"), default="f16",
                    help="both engines' KV cache format (quantized: llama.cpp with flash attention, as it requires)")
    ap.add_argument("--reference", action="store_true",
                    help="also compare both engines with the float32 reference (slow on big models)")
    ap.add_argument("--lora", help="FILE or FILE:SCALE: both engines apply this LoRA adapter")
    ap.add_argument("--control-vector", help="FILE or FILE:SCALE: both engines add this control vector")
    a = ap.parse_args()
    from pyllm.lora import parse_scaled
    lora = cvec = None
    if a.lora:
        path, scale = parse_scaled(a.lora) if ":" in a.lora else (a.lora, 1.0)
        lora = (str(Path(path).resolve()), scale)
    if a.control_vector:
        from pyllm.control_vector import combine
        from pyllm.model_file import ModelFile
        spec = parse_scaled(a.control_vector) if ":" in a.control_vector else (a.control_vector, 1.0)
        with ModelFile(a.model) as mf:
            cvec = combine([spec], int(mf.arch_require("embedding_length")), int(mf.arch_require("block_count")))

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        kv_type = {"f16": 1, "q8_0": 8, "q4_0": 2}[a.cache_type]
        peer = run_peer(a.peer_python, a.model, PROMPTS, a.n_gen, a.threads, tmp, kv_type, lora, cvec)
        t_peer = time.time() - t0
        n_max = max(len(p["ids"]) for p in peer.values())
        run, greedy = pyllm_logits(a.model, a.threads, n_max, kv_type, lora, cvec)
        rows, total = [], None
        kept = []  # (pyllm, llama.cpp, ids, n_prompt) per prompt, for --reference
        print(f"{'prompt':<44} {'pos':>4} {'clear':>5} {'top1':>7} {'rel':>7} {'max|d|':>7} {'greedy':>7}")
        for i, prompt in enumerate(PROMPTS):
            p = peer[i]
            ours_logits, peer_logits = run(p["ids"], p["n_prompt"]), np.load(f"{tmp}/peer{i}.npy")
            c = compare(ours_logits, peer_logits, a.margin)
            if a.reference:
                kept.append((ours_logits, peer_logits, p["ids"], p["n_prompt"]))
            top1 = c["top1_clear"] / max(1, c["clear"])
            theirs = p["ids"][p["n_prompt"]:]
            ours = greedy(p["ids"][:p["n_prompt"]], len(theirs))
            same = next((k for k, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
            c["greedy_same"] = same
            label = prompt.replace("\n", "\\n")[:42]
            print(f"{label:<44} {c['positions']:>4} {c['clear']:>5} {top1:>7.1%} {rel_of(c):>7.2%} {c['max']:>7.3f} "
                  f"{same:>3}/{len(theirs):<3}")
            rows.append({"prompt": prompt, "continuation": p["text"], "top1": top1, "rel": rel_of(c), **c})
            if total is None:
                total = dict(c)
            else:
                for k in c:
                    total[k] = max(total[k], c[k]) if k == "max" else total[k] + c[k]
        top1 = total["top1_clear"] / max(1, total["clear"])
        rel = rel_of(total)
        print(f"{'total':<44} {total['positions']:>4} {total['clear']:>5} {top1:>7.1%} {rel:>7.2%} "
              f"{total['max']:>7.3f}")
        print(f"(top-1 over all positions, clear or not: {total['top1_all'] / total['positions']:.1%}; "
              f"llama.cpp side {t_peer:.1f} s)")
        ok = top1 >= a.min_top1 and rel <= a.max_rel
        print(f"{'PASS' if ok else 'FAIL'}: top-1 {top1:.1%} (need >= {a.min_top1:.0%}), "
              f"rel {rel:.2%} (need <= {a.max_rel:.0%})")
        if a.reference:
            against_reference(a.model, kept, a.margin, lora, cvec)
        if a.json:
            json.dump({"model": a.model, "prompts": rows, "top1": top1, "rel": rel, "max": total["max"]},
                      open(a.json, "w"), indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
