#!/usr/bin/env python3
"""pyllm against llama.cpp (llama-cpp-python, the peer), side by side, one run.

Both engines load the same model with the same thread count; then the
tests alternate, rep by rep, so that both see the same machine state:
  pp N   prefill N tokens into an empty context (one batch)
  tg N   decode N tokens one step at a time from an empty context
With -d D both first fill the context with D tokens, untimed (llama-bench's
-d: the speed deep into a conversation or a long document).
Warm-up runs are excluded. Prints each side's tokens/s and pyllm/llama.cpp.

The peer runs in its own virtual environment, as a subprocess serving
timing requests (pyllm never imports it). Install it with
../shared/peer/install-llama-cpp.sh; without it this script says so and exits.

Usage: python benchmarks/compare_llama_cpp.py [-m MODEL] [-t 1,2] [-p 512] [-n 128] [-d 0] [-r 5] [--json]
                                              [--cache-type f16|q8_0] [--lora FILE[:SCALE]]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEER_PYTHON = os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-venv/bin/python")

PEER_SERVER = r'''
import json, sys, time
import llama_cpp
args = json.loads(sys.argv[1])
kv = {} if args["kv_type"] == 1 else {"type_k": args["kv_type"], "type_v": args["kv_type"], "flash_attn": True}
lora = {"lora_path": args["lora"][0], "lora_scale": args["lora"][1]} if args["lora"] else {}
llm = llama_cpp.Llama(model_path=args["model"], n_ctx=args["n_ctx"], n_batch=args["n_batch"],
                      n_threads=args["threads"], n_threads_batch=args["threads"], verbose=False, **kv, **lora)
tok = args["token"]
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    kind, n, depth = line.split()
    n, depth = int(n), int(depth)
    llm.reset()
    if depth:
        llm.eval([tok] * depth)
    t0 = time.perf_counter()
    if kind == "pp":
        llm.eval([tok] * n)
    else:
        for _ in range(n):
            llm.eval([tok])
    print(json.dumps({"s": time.perf_counter() - t0}), flush=True)
'''


class Peer:
    def __init__(self, model: str, threads: int, n_ctx: int, n_batch: int, token: int, kv_type: int = 1,
                 lora: Optional[tuple[str, float]] = None):
        self.proc = subprocess.Popen(
            [PEER_PYTHON, "-c", PEER_SERVER,
             json.dumps({"model": model, "threads": threads, "n_ctx": n_ctx, "n_batch": n_batch, "token": token,
                         "kv_type": kv_type, "lora": lora})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError("the peer failed to load the model")

    def run(self, kind: str, n: int, depth: int = 0) -> float:
        self.proc.stdin.write(f"{kind} {n} {depth}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait(timeout=30)
            hint = (" (SIGILL: its build uses instructions this CPU refuses, e.g. AMX in a VM; rebuild it "
                    "with CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX512=ON ...\", see the README's Speed section)"
                    if rc == -4 else "")
            raise SystemExit(f"the peer (llama.cpp) died during {kind} {n}, exit status {rc}{hint}")
        return json.loads(line)["s"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def peer_available() -> bool:
    if not os.path.exists(PEER_PYTHON):
        return False
    return subprocess.run([PEER_PYTHON, "-c", "import llama_cpp"], capture_output=True).returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-d", "--depth", type=int, default=0, help="tokens in the context before each test")
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cache-type", choices=("f16", "q8_0", "q4_0"), default="f16",
                    help="both engines' KV cache format (quantized: llama.cpp with flash attention, as it requires)")
    ap.add_argument("--lora", help="FILE or FILE:SCALE: both engines apply this LoRA adapter")
    a = ap.parse_args()
    if not peer_available():
        print(f"llama-cpp-python is not installed at {PEER_PYTHON}: run ../shared/peer/install-llama-cpp.sh "
              f"(or set PYLLM_PEER_PYTHON); nothing to compare against", file=sys.stderr)
        return 0

    from pyllm import Model
    from pyllm.bench import run_pp, run_tg, test_name

    token = 100
    lora = None
    if a.lora:
        from pyllm.lora import parse_scaled
        lora = parse_scaled(a.lora) if ":" in a.lora else (a.lora, 1.0)
        lora = (str(Path(lora[0]).resolve()), lora[1])
    n_ctx = a.depth + max(a.n_prompt, a.n_gen) + 64
    results = []
    for threads in [int(x) for x in a.threads.split(",")]:
        model = Model(a.model, n_ctx=n_ctx, n_threads=threads, n_batch=max(a.n_prompt, 1),
                      cache_type_k=a.cache_type, cache_type_v=a.cache_type, lora=[lora] if lora else None)
        peer = Peer(str(Path(a.model).resolve()), threads, n_ctx, a.n_prompt, token,
                    {"f16": 1, "q8_0": 8, "q4_0": 2}[a.cache_type], lora)
        for kind, n in (("pp", a.n_prompt), ("tg", a.n_gen)):
            ours_fn = run_pp if kind == "pp" else run_tg
            ours_fn(model, min(n, 32), token)      # warm-up, excluded
            peer.run(kind, min(n, 32))
            ours, theirs = [], []
            for _ in range(a.reps):                # alternate: same machine state for both
                ours.append(n / ours_fn(model, n, token, depth=a.depth))
                theirs.append(n / peer.run(kind, n, a.depth))
            r = {"model": Path(a.model).name, "threads": threads, "test": test_name(kind, n, a.depth),
                 "pyllm": statistics.median(ours), "llama_cpp": statistics.median(theirs),
                 "pyllm_runs": ours, "llama_cpp_runs": theirs}
            r["ratio"] = r["pyllm"] / r["llama_cpp"]
            results.append(r)
            if not a.json:
                print(f"{r['model']:<36} t={threads} {r['test']:<6} pyllm {r['pyllm']:8.1f} tok/s   "
                      f"llama.cpp {r['llama_cpp']:8.1f} tok/s   ratio {r['ratio']:.2f}", flush=True)
        peer.close()
        model.close()
    if a.json:
        json.dump(results, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
