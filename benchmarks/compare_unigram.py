#!/usr/bin/env python3
"""Compare pyllm's SentencePiece Unigram tokenizer ('t5': T5, XLM-RoBERTa encoders such as
bge-m3), an encoder with such a vocabulary, and a reranker (bge-reranker-v2-m3's kind) with
llama.cpp's.

No registry model has a Unigram vocabulary, so this trains some here (tests/synth.py's
unigram_vocab: NFKC folding or not, a space in front or not, spaces merged or not), writes each
into a small random BERT-style encoder file, and asks llama.cpp (llama-cpp-python, in its own
environment) for the ids of curated and random texts (with <s> </s>, and with special tokens
parsed) and for two texts' embeddings; then rerankers: a decoder of Qwen3-Reranker's kind (the
"yes"/"no" head, softmax, the last row) on random token ids, and cross-encoders of the first
vocabulary (a classification head, rank pooling; F32 and Q8_0), each pair as pyllm builds it,
scored by both. Dev tool only.

    PYLLM_PEER_PYTHON=/tmp/peer-avx512/bin/python python3 benchmarks/compare_unigram.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import synth  # noqa: E402
from test_tokenizer import unigram_cases  # noqa: E402

from pyllm import Model  # noqa: E402

CONFIGS = {"nmt_nfkc": {}, "nmt_nfkc_cf, no prefix, spaces kept": dict(
    normalization="nmt_nfkc_cf", add_dummy_prefix=False, remove_extra_whitespaces=False),
    "identity, spaces kept": dict(normalization="identity", remove_extra_whitespaces=False)}
EMBED = ["caf\u00e9 \ufb01nance hello", "Tokyo \uff34\uff4f\uff4b\uff59\uff4f world"]
FLAGS = ((True, False), (False, True))   # (add <s> and </s>, parse special tokens)
RANK_QUERIES = ["caf\u00e9 hello", "\u6771\u4eac model", "world of tokens"]

PEER = r'''
import ctypes, json, sys
import llama_cpp
out = {}
for name, c in json.load(sys.stdin).items():
    m = llama_cpp.Llama(model_path=c["path"], embedding=True, verbose=False, n_ctx=512, pooling_type=2)
    vocab = llama_cpp.llama_model_get_vocab(m.model)
    ids = []
    for add, parse in c["flags"]:
        rows = []
        for t in c["texts"]:
            b = t.encode()
            arr = (llama_cpp.llama_token * (2 * len(b) + 8))()
            n = llama_cpp.llama_tokenize(vocab, b, len(b), arr, 2 * len(b) + 8, add, parse)
            rows.append(list(arr[:n]))
        ids.append(rows)
    out[name] = {"ids": ids, "embd": m.embed(c["embed"])}
    for rank in c.get("rankers", []):   # each pair's score: the rank pooling's first value
        r = llama_cpp.Llama(model_path=rank["path"], embedding=True, verbose=False, n_ctx=512, pooling_type=4)
        scores = []
        for pair in rank["pairs"]:
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(r.ctx), True)
            arr = (llama_cpp.llama_token * len(pair))(*pair)
            assert llama_cpp.llama_decode(r.ctx, llama_cpp.llama_batch_get_one(arr, len(pair))) == 0
            scores.append(llama_cpp.llama_get_embeddings_seq(r.ctx, 0)[0])
        out[name].setdefault("rank", []).append(scores)
json.dump(out, sys.stdout)
'''


def main() -> int:
    python = os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-venv/bin/python")
    cases, ours = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, kw) in enumerate(CONFIGS.items()):
            md, _ = synth.unigram_vocab(**kw)
            path = synth.write_bert(Path(tmp) / f"unigram{i}.gguf", synth.QT.F32, tokenizer_from=md, pooling=2)
            texts = unigram_cases(seed=7, n=1500)
            cases[name] = {"path": path, "texts": texts, "flags": FLAGS, "embed": EMBED}
            with Model(path, n_threads=1) as m:
                ours[name] = {"ids": [[m.tokenizer.encode(t, add_bos=a, add_eos=a, parse_special=p) for t in texts]
                                      for a, p in FLAGS], "embd": m.embed(EMBED)}
            if i == 0:   # a decoder reranker (Qwen3-Reranker's kind: yes/no rows, softmax, the last row)
                rng = np.random.default_rng(1)
                head = (rng.standard_normal((2, 256)) * 0.3).astype(np.float32)
                qpath = synth.rewrite_metadata(
                    synth.write_qwen3(Path(tmp) / "q.gguf", synth.QT.F32, extra_tensors={"cls.output.weight": head}),
                    Path(tmp) / "qrank.gguf", {"qwen3.pooling_type": 4, "qwen3.classifier.output_labels": ["yes", "no"]})
                with Model(qpath, n_threads=1) as m:
                    seqs = [list(map(int, np.random.default_rng(k).integers(3, 500, 12))) for k in range(40)]
                    cases[name]["rankers"] = [{"path": qpath, "pairs": seqs}]
                    ours[name]["rank"] = [[float(m.embed_tokens(ids)[0]) for ids in seqs]]
            if i == 0:   # rerankers of this vocabulary, as bge-reranker-v2-m3 (<s> q </s></s> d </s>)
                md["tokenizer.ggml.add_sep_token"] = True

                for qtype in (synth.QT.F32, synth.QT.Q8_0):
                    rpath = synth.write_bert(Path(tmp) / f"rank{qtype.name}.gguf", qtype, tokenizer_from=md, rank=1,
                                             head_type=qtype)
                    with Model(rpath, n_threads=1) as m:
                        pairs = [m.rerank_tokens(q, d) for q in RANK_QUERIES for d in texts[:40]]
                        cases[name]["rankers"].append({"path": rpath, "pairs": pairs})
                        ours[name]["rank"].append([float(m.embed_tokens(p)[0]) for p in pairs])
        r = subprocess.run([python, "-c", PEER], input=json.dumps(cases), capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    theirs = json.loads(r.stdout)
    failed = 0
    for name in CONFIGS:
        a, b = ours[name], theirs[name]
        pairs = [(t, x, y) for k in range(len(FLAGS)) for t, x, y in zip(cases[name]["texts"], a["ids"][k],
                                                                         b["ids"][k])]
        differ = [(t, x, y) for t, x, y in pairs if x != y]
        e, f = np.asarray(a["embd"]), np.asarray(b["embd"])
        cos = [float(np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v)) for u, v in zip(e, f)]
        print(f"{name}: ids differ in {len(differ)} of {len(pairs)} tokenizations; embeddings' cosine "
              f"{min(cos):.7f}")
        for t, x, y in differ[:5]:
            print(f"  {t!r}: pyllm {x} llama.cpp {y}")
        failed += bool(differ) or min(cos) < 0.9999
        for qtype, x, y in zip(("Qwen3-Reranker's kind, F32", "cross-encoder, F32", "cross-encoder, Q8_0"),
                               a.get("rank", []), b.get("rank", [])):
            x, y = np.asarray(x), np.asarray(y)
            same_best = np.mean([np.argmax(x[k:k + 40]) == np.argmax(y[k:k + 40]) for k in range(0, len(x), 40)])
            corr = float(np.corrcoef(x, y)[0, 1])
            print(f"  reranker ({qtype}): {len(x)} pairs, scores' max difference {np.abs(x - y).max():.4f} "
                  f"(spread {y.std():.3f}), correlation {corr:.6f}, same best document {100 * same_best:.0f}%")
            failed += corr < 0.99
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
