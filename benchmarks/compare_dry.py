#!/usr/bin/env python3
"""DRY: pyllm.dry against llama.cpp's DRY sampler, case by case.

Each case is a random row of logits over the real SmolLM2 vocabulary, a token
history with planted repeats (copies of earlier spans, a small pool of tokens
that repeat by chance, text full of sequence breakers, long copies that reach
the exponent cap) and DRY settings. llama.cpp gets the breaker strings and the
history through its own API (llama_sampler_init_dry, llama_sampler_accept for
every history token, llama_sampler_apply on the whole vocabulary); pyllm gets
DryBreakers.from_strings and apply_dry. A case agrees when every penalised
logit is within 1e-4 (relative 1e-6 for huge ones); bitwise agreement is
counted too.

Most cases use llama.cpp's default breakers; 40% use multi-character
ones (breakers spanning tokens, a special token's text, a non-ASCII one, one
over 40 bytes that llama.cpp cuts inside a UTF-8 character).

penalty_last_n = -1 means "the context size" in pyllm (n_ctx); llama.cpp
0.3.36 has no such value (it clamps -1 to 0, off), so those cases give it the
same number of tokens directly.

llama.cpp runs in its own virtual environment as a subprocess (pyllm never
imports it): --peer-python, default $PYLLM_PEER_PYTHON or
/tmp/peer-avx512/bin/python.

    python benchmarks/compare_dry.py [-n 1000] [--seed 0] [-m models/SmolLM2-135M-Instruct.Q4_1.gguf]

--generate instead runs the whole sampler on the model: greedy decoding with
DRY (multiplier 0.8, llama.cpp's other defaults) from prompts that invite
loops, in pyllm (Model.generate) and in llama.cpp (its DRY sampler accepting
the prompt, then each token, ahead of an argmax). The texts are compared token
by token; where they part, the margin between pyllm's two candidates (its
logits after DRY) says whether llama.cpp's choice was a near-tie.

    python benchmarks/compare_dry.py --generate [-n 64]
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

DEFAULT_BREAKERS = ["\n", ":", '"', "*"]
MULTI_BREAKERS = ["\n\n", "###", " Answer:", "é", "<|im_end|>", "x" * 39 + "é", "**"]
WORDS = ["the", "cat", "sat", "on", "a", "mat", "Answer", "###", "é", "**bold**", "\"quoted\"", "key:",
         "value", "\n", "\n\n", ":", "*", "<|im_end|>", "éé", "x" * 39, "and", "so", "it", "went"]

PEER = r'''
import ctypes, json, sys
import numpy as np
import llama_cpp as L
job = json.load(open(sys.argv[1]))
L.llama_backend_init()
mp = L.llama_model_default_params()
mp.vocab_only = True
model = L.llama_model_load_from_file(job["model"].encode(), mp)
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)
logits = np.load(job["logits"])
out = np.empty_like(logits)
data = (L.llama_token_data * n_vocab)()
view = np.ctypeslib.as_array(data)
samplers = {}
for i, case in enumerate(job["cases"]):
    key = json.dumps([case["multiplier"], case["base"], case["allowed"], case["last_n"], case["breakers"]])
    if key not in samplers:
        brk = [b.encode("utf-8") for b in case["breakers"]]
        arr = (ctypes.c_char_p * max(len(brk), 1))(*brk)
        samplers[key] = L.llama_sampler_init_dry(vocab, case["multiplier"], case["base"], case["allowed"],
                                                 case["last_n"], arr, len(brk))
    s = samplers[key]
    L.llama_sampler_reset(s)
    for t in case["history"]:
        L.llama_sampler_accept(s, t)
    view["id"] = np.arange(n_vocab, dtype=np.int32)
    view["logit"] = logits[i]
    view["p"] = 0.0
    cur = L.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
    L.llama_sampler_apply(s, ctypes.byref(cur))
    out[i][view["id"]] = view["logit"]
np.save(job["out"], out)
print("ok", len(job["cases"]))
'''

PEER_GENERATE = r'''
import ctypes, json, sys
import numpy as np
import llama_cpp as L
job = json.load(open(sys.argv[1]))
llm = L.Llama(job["model"], n_ctx=2048, n_threads=2, verbose=False)
vocab = L.llama_model_get_vocab(llm._model.model)
n_vocab = llm.n_vocab()
brk = [b.encode("utf-8") for b in job["breakers"]]
arr = (ctypes.c_char_p * len(brk))(*brk)
data = (L.llama_token_data * n_vocab)()
view = np.ctypeslib.as_array(data)
out = []
for prompt in job["prompts"]:
    s = L.llama_sampler_init_dry(vocab, job["multiplier"], 1.75, 2, 64, arr, len(brk))
    for t in prompt:
        L.llama_sampler_accept(s, t)
    llm.reset()
    llm.eval(prompt)
    tokens = []
    for _ in range(job["n"]):
        view["id"] = np.arange(n_vocab, dtype=np.int32)
        view["logit"] = np.ctypeslib.as_array(L.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))
        view["p"] = 0.0
        cur = L.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
        L.llama_sampler_apply(s, ctypes.byref(cur))
        tok = int(view["id"][np.argmax(view["logit"])])
        if L.llama_vocab_is_eog(vocab, tok):
            break
        tokens.append(tok)
        L.llama_sampler_accept(s, tok)
        llm.eval([tok])
    L.llama_sampler_free(s)
    out.append(tokens)
print(json.dumps(out))
'''

LOOPY_PROMPTS = [
    "List the numbers: one two three one two three one two three one two three",
    "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,",
    "def f(x):\n    return x\n\ndef f(x):\n    return x\n\ndef f(x):",
    "<|im_start|>user\nWrite a poem about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nName ten fruits, one per line.<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, there was a little robot who",
]


def generate(a) -> int:
    from pyllm import Model
    from pyllm.dry import DEFAULT_SEQUENCE_BREAKERS

    multiplier = 0.8
    with Model(a.model, n_ctx=2048, n_threads=2) as m:
        prompts = [m.tokenize(p, special=True) for p in LOOPY_PROMPTS]
        with tempfile.TemporaryDirectory() as tmp:
            job = {"model": a.model, "prompts": prompts, "n": a.n_cases, "multiplier": multiplier,
                   "breakers": list(DEFAULT_SEQUENCE_BREAKERS)}
            Path(f"{tmp}/job.json").write_text(json.dumps(job))
            r = subprocess.run([a.peer_python, "-c", PEER_GENERATE, f"{tmp}/job.json"], capture_output=True,
                               text=True)
        if r.returncode != 0:
            sys.exit(f"llama.cpp side failed:\n{r.stderr[-3000:]}")
        theirs = json.loads(r.stdout.strip().splitlines()[-1])
        same = 0
        for text, prompt, peer in zip(LOOPY_PROMPTS, prompts, theirs):
            for dry in (multiplier, 0.0):
                gen = m.generate(prompt, max_tokens=a.n_cases, temperature=0, dry_multiplier=dry)
                if dry:
                    ours = gen.tokens
                else:
                    plain = gen.tokens
            k = next((i for i, (x, y) in enumerate(zip(ours, peer)) if x != y), min(len(ours), len(peer)))
            print(f"{text[:50]!r}")
            print(f"    DRY changed pyllm's text from token {next((i for i, (x, y) in enumerate(zip(ours, plain)) if x != y), '-')}"
                  f"; pyllm and llama.cpp agree on {k} of {max(len(ours), len(peer))} tokens")
            if ours == peer:
                same += 1
                continue
            # the margin at the parting: pyllm's logits after DRY, its choice against llama.cpp's
            sampler = m._sampler({"temperature": 0, "dry_multiplier": multiplier})
            row = m.engine.logits(prompt + ours[:k])[-1]
            x = sampler.adjusted_logits(row, prompt + ours[:k])
            if k < len(ours) and k < len(peer):
                print(f"    parted at token {k}: pyllm {m.tokenizer.decode([ours[k]])!r} ({x[ours[k]]:.3f}), "
                      f"llama.cpp {m.tokenizer.decode([peer[k]])!r} ({x[peer[k]]:.3f}): margin "
                      f"{x[ours[k]] - x[peer[k]]:.3f}")
            print(f"    pyllm:     {m.tokenizer.decode(ours)!r}")
            print(f"    llama.cpp: {m.tokenizer.decode(peer)!r}")
        print(f"{same}/{len(prompts)} texts identical")
    return 0


def make_cases(tokenizer, n_cases: int, seed: int) -> tuple[list[dict], np.ndarray]:
    rng = np.random.default_rng(seed)
    n_vocab = len(tokenizer.all_pieces())
    cases, rows = [], []

    def text_tokens(n_words: int) -> list[int]:
        words = rng.choice(WORDS, size=n_words)
        return tokenizer.encode(" ".join(words), add_bos=False, add_eos=False, parse_special=False)

    for _ in range(n_cases):
        pool = rng.integers(0, n_vocab, size=int(rng.integers(2, 40))).tolist()
        history: list[int] = []
        target = int(rng.choice([0, 1, 2, 3, 5, 20, 50, 100, 100, 300, 300, 300, 1200, 3000]))
        long_copy = rng.random() < 0.2
        multi = rng.random() < 0.4  # multi-character breakers, and text full of them
        while len(history) < target:
            kind = 1 if multi and rng.random() < 0.3 else rng.integers(0, 5)
            if kind == 0:
                history += rng.choice(pool, size=int(rng.integers(1, 12))).tolist()
            elif kind == 1:
                history += text_tokens(int(rng.integers(1, 10)))
            elif kind == 2 and history:  # a copy of an earlier span
                start = int(rng.integers(0, len(history)))
                length = int(rng.integers(1, 250 if long_copy else 40))
                history += history[start:start + length]
            elif kind == 3:
                history += rng.integers(0, n_vocab, size=int(rng.integers(1, 6))).tolist()
            else:  # a breaker, tokenized in two parts so that it can span tokens
                brk = str(rng.choice(MULTI_BREAKERS if multi else DEFAULT_BREAKERS))
                cut = int(rng.integers(1, len(brk))) if len(brk) > 1 else 1
                for part in (brk[:cut], brk[cut:]):
                    history += tokenizer.encode(part, add_bos=False, add_eos=False, parse_special=False)
        history = history[:target + int(rng.integers(0, 30))]
        if rng.random() < 0.15:  # stuck in a loop: a phrase over and over, what DRY is for
            phrase = rng.choice(pool, size=int(rng.integers(1, 8))).tolist()
            history += phrase * int(rng.integers(2, 60)) + phrase[:int(rng.integers(0, len(phrase)))]
        elif history and rng.random() < 0.8:  # end on the start of an earlier span: its next token is penalised
            start = int(rng.integers(0, len(history)))
            history += history[start:start + int(rng.integers(1, 250 if long_copy else 12))]
        breakers = DEFAULT_BREAKERS if not multi else \
            list(rng.choice(MULTI_BREAKERS, size=int(rng.integers(1, len(MULTI_BREAKERS) + 1)), replace=False))
        if rng.random() < 0.03:
            breakers = []
        last_n = int(rng.choice([64, 64, 64, 1, 2, 3, 5, 16, 200, 5000, -1, -1]))
        case = {
            "multiplier": float(rng.choice([0.8, 0.8, 0.8, 1.0, 2.5, 0.0, -0.5, 1e30])),
            "base": float(rng.choice([1.75, 1.75, 1.0, 1.1, 3.0, 3.0, 1.0000005, 0.5, 40.0, 40.0])),
            "allowed": int(rng.choice([2, 2, 0, 1, 3, 5, -1])),
            "last_n": last_n, "n_ctx": None, "breakers": breakers, "history": history,
        }
        if last_n == -1:  # pyllm: the context size; llama.cpp: that many tokens
            case["n_ctx"] = int(rng.choice([8, 100, 8192]))
            case["last_n"] = case["n_ctx"]
            case["ours_last_n"] = -1
        cases.append(case)
        row = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
        row[rng.integers(0, n_vocab, size=5)] = -np.inf
        rows.append(row)
    return cases, np.stack(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-n", "--n-cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-avx512/bin/python"))
    ap.add_argument("-v", "--verbose", action="store_true", help="print every disagreeing case")
    ap.add_argument("--generate", action="store_true", help="greedy decoding with DRY on the model (-n tokens)")
    a = ap.parse_args()
    if a.generate:
        return generate(a)

    from pyllm.dry import DryBreakers, DryParams, apply_dry
    from pyllm.model_file import ModelFile
    from pyllm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(dict(ModelFile(a.model).metadata))
    cases, logits = make_cases(tokenizer, a.n_cases, a.seed)

    with tempfile.TemporaryDirectory() as tmp:
        job = {"model": a.model, "cases": cases, "logits": f"{tmp}/logits.npy", "out": f"{tmp}/out.npy"}
        np.save(job["logits"], logits)
        Path(f"{tmp}/job.json").write_text(json.dumps(job))
        t0 = time.perf_counter()
        r = subprocess.run([a.peer_python, "-c", PEER, f"{tmp}/job.json"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"llama.cpp side failed:\n{r.stderr[-3000:]}")
        t_peer = time.perf_counter() - t0
        theirs = np.load(job["out"])

    breakers: dict[tuple[str, ...], DryBreakers] = {}
    agree = exact = penalised = 0
    t_ours = 0.0
    for i, case in enumerate(cases):
        key = tuple(case["breakers"])
        if key not in breakers:
            breakers[key] = DryBreakers.from_strings(tokenizer, key)
        params = DryParams(case["multiplier"], case["base"], case["allowed"], case.get("ours_last_n", case["last_n"]))
        row = logits[i]
        t0 = time.perf_counter()
        ours = apply_dry(row, case["history"], params, breakers[key], n_ctx=case["n_ctx"])
        t_ours += time.perf_counter() - t0
        penalised += ours is not row
        same = np.array_equal(ours, theirs[i])
        close = same or bool(np.allclose(ours, theirs[i], rtol=1e-6, atol=1e-4))
        exact += same
        agree += close
        if not close or (a.verbose and not same):
            d = np.flatnonzero(~np.isclose(ours, theirs[i], rtol=1e-6, atol=1e-4))
            print(f"case {i}: {'DIFFERS' if not close else 'not bitwise'} at {len(d)} tokens {d[:8].tolist()}; "
                  f"params {params}, n_ctx {case['n_ctx']}, breakers {case['breakers']!r}, "
                  f"history {len(case['history'])} tokens")
            for t in d[:4].tolist():
                print(f"    token {t}: in {row[t]!r} pyllm {ours[t]!r} llama.cpp {theirs[i][t]!r}")

    n = len(cases)
    print(f"{agree}/{n} cases agree within 1e-4 ({exact}/{n} bitwise); "
          f"{penalised} cases had penalties, {n - penalised} had none (DRY off, short history, ...)")
    print(f"time: pyllm {1e3 * t_ours / n:.2f} ms/case (breaker setup excluded), "
          f"llama.cpp subprocess {t_peer:.1f} s in all")
    return 0 if agree == n else 1


if __name__ == "__main__":
    sys.exit(main())
