#!/usr/bin/env python3
"""Throw random request bodies at `pyllm serve`'s endpoints and report any that get a 500.

A valid body for each endpoint has one to three of its fields replaced by random JSON (objects
and lists of the field names the APIs use, nested a few deep, and odd atoms: empty strings, huge
numbers, a lone surrogate). A bad request should be a 4xx (501: a model without what the
endpoint needs), never a 500 (an internal error, logged with its traceback). Dev tool only.

    python3 benchmarks/fuzz_server.py -n 1500 --seed 0
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyllm import Model  # noqa: E402
from pyllm.server import make_server  # noqa: E402

ATOMS = [None, True, False, 0, -1, 1.5, "", "x", "user", "assistant", "text", "tool_use", "tool_result", "image",
         "thinking", "message", "function_call", "function_call_output", "reasoning", "json_schema", "auto", "any",
         "none", "tool", "function", [], {}, [1, 2], {"type": "text"}, {"type": "text", "text": "hi"},
         {"type": "tool_use", "name": "f"}, {"type": "json_schema", "schema": {}}, "input_text", "output_text",
         "enabled", "disabled", 10 ** 12, "\x00\ud800"]
FIELDS = ["prompt", "model", "options", "think", "format", "n_predict", "input_prefix", "suffix", "logprobs",
          "top_logprobs", "response_format", "grammar", "json_schema", "logit_bias", "lora", "chat_template_kwargs",
          "reasoning_effort", "messages", "role", "content", "type", "text", "system", "tools", "tool_choice", "name",
          "input", "input_schema", "max_tokens", "stop_sequences", "thinking", "stream", "output_config", "schema",
          "effort", "tool_use_id", "is_error", "id", "call_id", "arguments", "output", "instructions",
          "previous_response_id", "reasoning", "query", "documents", "texts", "top_n", "temperature", "parameters",
          "summary", "store", "budget_tokens", "disable_parallel_tool_use", "parallel_tool_calls", "return_documents"]
CHAT = {"max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
ENDPOINTS = {"/v1/chat/completions": CHAT, "/v1/messages": CHAT, "/v1/messages/count_tokens": CHAT,
             "/v1/responses": {"max_output_tokens": 3, "input": "hi"}, "/v1/rerank": {"query": "q", "documents": ["d"]},
             "/api/chat": CHAT, "/api/generate": {"prompt": "hi", "options": {"num_predict": 3}},
             "/v1/completions": {"prompt": "hi", "max_tokens": 3}, "/completion": {"prompt": "hi", "n_predict": 3},
             "/v1/embeddings": {"input": "hi"}, "/tokenize": {"content": "hi"}, "/infill": {"input_prefix": "a"}}
LIMITS = {"max_tokens": 3, "max_output_tokens": 3, "n_predict": 3}   # kept small: replies stay short


def random_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth < 4 and r < 0.3:
        return {rng.choice(FIELDS): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if depth < 4 and r < 0.5:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice(ATOMS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-n", type=int, default=1500, help="requests")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with Model(args.model, n_threads=2, n_ctx=512) as m:
        server = make_server(m, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        failed: dict[str, list] = {}
        for _ in range(args.n):
            path = rng.choice(list(ENDPOINTS))
            body = dict(ENDPOINTS[path])
            for _ in range(rng.randint(1, 3)):
                body[rng.choice(FIELDS)] = random_value(rng)
            body.update({k: v for k, v in LIMITS.items() if k in body and not isinstance(body[k], dict)})
            data = json.dumps(body).encode()
            try:
                with urllib.request.urlopen(urllib.request.Request(server.url + path, data=data), timeout=120) as r:
                    status = r.status
                    r.read()
            except urllib.error.HTTPError as e:
                status = e.code
                e.read()
            if status == 500:
                failed.setdefault(path, []).append(body)
        server.shutdown()
        server.server_close()
    print(f"{args.n} requests, {sum(map(len, failed.values()))} answered 500")
    for path, bodies in failed.items():
        print(f"  {path}: {len(bodies)}, e.g. {json.dumps(bodies[0])[:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
