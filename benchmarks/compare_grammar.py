#!/usr/bin/env python3
"""Constrained generation: pyllm against llama.cpp, the same grammar, prompt and model.

Each case is a GBNF grammar both engines take as it is (pyllm's JSON-mode grammar,
a JSON schema through pyllm.json_schema, a small hand-written one) or none (the
baseline). The prompt is the model's chat template applied by pyllm, given to both
as raw text. Each engine generates up to -n tokens, greedy and hot, and the figure
is wall time per generated token (prefill included: the prompt is short and the
same for both), median of -r runs, pyllm and llama.cpp alternating. The outputs
differ once sampling differs, so the replies' lengths do too: compare per token.
Each reply is checked against its grammar with pyllm's matcher.

llama.cpp runs in its own virtual environment as a subprocess (pyllm never imports
it): --peer-python, default $PYLLM_PEER_PYTHON or /tmp/peer-venv/bin/python.

    python benchmarks/compare_grammar.py [-m MODEL] [-t 2] [-n 128] [-r 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CAT = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 30},
    "colours": {"type": "array", "items": {"type": "string", "enum": ["black", "white", "grey", "orange"]},
                "maxItems": 3}}, "required": ["name", "age", "colours"]}
ASK = "Describe a cat as JSON with its name, age and colours."
LIST = 'root ::= "Colours:" ( " " colour "," ){1,6} " and " colour "."\ncolour ::= [a-z]+'

PEER = r'''
import json, sys, time
import llama_cpp
job = json.loads(sys.argv[1])
m = llama_cpp.Llama(job["path"], n_ctx=1024, n_threads=job["threads"], n_threads_batch=job["threads"], verbose=False)
out = []
for run in job["runs"]:
    grammar = llama_cpp.LlamaGrammar.from_string(run["grammar"], verbose=False) if run["grammar"] else None
    t0 = time.perf_counter()
    r = m(run["prompt"], max_tokens=run["n"], temperature=run["temperature"], seed=run["seed"], grammar=grammar,
          top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0)
    out.append({"s": time.perf_counter() - t0, "tokens": r["usage"]["completion_tokens"],
                "text": r["choices"][0]["text"]})
print(json.dumps(out))
'''


def peer(peer_python: str, job: dict) -> list[dict]:
    r = subprocess.run([peer_python, "-c", PEER, json.dumps(job)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llama.cpp side failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-venv/bin/python"))
    a = ap.parse_args()

    from pyllm import Model, registry
    from pyllm.gbnf import Grammar
    from pyllm.grammar import JSON_OBJECT
    from pyllm.json_schema import schema_to_gbnf
    path = str(registry.fetch(a.model) if a.model in registry.MODELS else a.model)
    cases = {"none": None, "json": JSON_OBJECT, "schema": schema_to_gbnf(CAT), "gbnf": LIST}
    with Model(path, n_ctx=1024, n_threads=a.threads) as m:
        prompts = {"none": ASK, "json": ASK, "schema": ASK, "gbnf": "Name some colours."}
        prompts = {k: m.apply_chat_template([{"role": "user", "content": v}]) for k, v in prompts.items()}
        print(f"{Path(path).name}, {a.threads} threads, up to {a.n_predict} tokens, ms per generated token "
              f"(median of {a.reps}), pyllm / llama.cpp")
        for temperature in (0.0, 1.0):
            for name, grammar in cases.items():
                ours, theirs, lengths, bad = [], [], [], 0
                for rep in range(a.reps):
                    t0 = time.perf_counter()
                    c = m.generate(prompts[name], max_tokens=a.n_predict, temperature=temperature, seed=rep,
                                   grammar=grammar)
                    ours.append((time.perf_counter() - t0) / max(1, c.metrics.generated_tokens))
                    r = peer(a.peer_python, {"path": path, "threads": a.threads, "runs": [
                        {"prompt": prompts[name], "n": a.n_predict, "temperature": temperature, "seed": rep,
                         "grammar": grammar}]})[0]
                    theirs.append(r["s"] / max(1, r["tokens"]))
                    lengths.append((c.metrics.generated_tokens, r["tokens"]))
                    if grammar is not None:   # both replies stay in the grammar (a prefix when cut short)
                        g = Grammar.parse(grammar)
                        bad += sum(g.feed(g.start, t.encode()) < 0 for t in (c.text, r["text"]))
                o, t = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
                print(f"  temp {temperature:.1f} {name:<6} pyllm {o:6.2f} ms  llama.cpp {t:6.2f} ms  {t / o:5.2f}x"
                      f"   tokens {lengths}" + (f"   {bad} replies left the grammar" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
