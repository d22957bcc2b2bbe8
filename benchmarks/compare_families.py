#!/usr/bin/env python3
"""Every family pyllm runs, on tiny synthetic models, against llama.cpp and
against pyllm/reference.py: the table of the families issue.

For each family a random F32 model is written with tests/synth.py (with
SmolLM2's tokenizer copied in, so that llama.cpp loads it); llama.cpp's own
quantizer (llama_model_quantize) then makes the quantized files, K-quant
mixes included, so the type mixes are the ones real files have. Both engines
read the same token ids; the logits of every position are compared:

  max|d|   largest |pyllm - llama.cpp| of one logit
  rel      RMS(pyllm - llama.cpp) / std(llama.cpp logits)
  top1     positions where the argmaxes agree, of those where llama.cpp's top-2
           margin is clear (> 5% of the logits' std; random models have many
           near ties), and in brackets of all positions
  ref rel  RMS(pyllm - reference) / std(reference), the same for llama.cpp

llama.cpp runs in its own virtual environment as a subprocess (pyllm never
imports it): --peer-python, default /tmp/peer-venv/bin/python.

Usage: python benchmarks/compare_families.py [--families llama,gemma3] [--types Q4_K_M,Q8_0]
       [--synth-types IQ3_XXS] [--out DIR] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import RopeScalingType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

# YaRN over an original context of 256: with head size 64 the ramp runs over pairs 0..13 of 32
YARN = {"rope_scaling_type": RopeScalingType.YARN, "rope_scaling_factor": 4.0, "rope_scaling_orig_ctx_len": 256}

# row label: (writer name, writer keywords[, context both engines run with, default 64])
FAMILIES = {
    "llama": ("llama", {}),
    "llama3": ("llama", {"rope_freqs": True, "rope_base": 500000.0}),
    "llama-yarn": ("llama", {"keys": YARN}),
    "qwen2-yarn": ("qwen2", {"keys": YARN}),                       # NEOX pairs
    "llama3-yarn": ("llama", {"rope_freqs": True, "keys": YARN}),  # with per-pair divisors of its own
    "mistral": ("mistral", {"window": 4096}),          # window longer than the test: llama.cpp ignores the key
    "mistral-swa16": ("mistral", {"window": 16}),      # window inside the test: the engines part ways after it
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "phi3": ("phi3", {}),
    "phi3-longrope": ("phi3", {"long_rope": True}),                # context 64 <= 256: short factors
    "phi3-longrope-ctx512": ("phi3", {"long_rope": True}, 512),    # context 512 > 256: long factors
    "gemma2": ("gemma2", {}),                                      # caps from the file (0.5 and 30)
    "gemma2-defaults": ("gemma2", {"attn_softcap": None, "final_softcap": None}),  # no caps in the file: 50 and 30
    "gemma": ("gemma", {}),                                        # head_dim 128 over n_embd 256, 4 heads
    "gemma3": ("gemma3", {}),
    "gemma3n": ("gemma3n", {}),                                    # AltUp, LAuReL, sparse gates over 7 layers
    "gemma3n-25": ("gemma3n", {"n_layer": 25}),                    # layers 20-24 share 18's and 19's caches
    "gemma4": ("gemma4", {}),                                      # E2B-like: per-layer inputs, shared KV layers
    "gemma4-31b": ("gemma4", {"per_layer": 0, "shared_kv": 0}),    # 31B-like: neither; global values from Wk h
    "gemma4-vproj": ("gemma4", {"v_from_k": False}),               # every layer with its own attn_v
    "gemma4-moe": ("gemma4", {"experts": 8, "per_layer": 0, "shared_kv": 0}),   # 26B-A4B-like, fused gate_up
    "gemma4-moe-split": ("gemma4", {"experts": 8, "fused_experts": False}),     # separate gate and up experts
    "minimax-m2": ("minimax-m2", {}),
    "apertus": ("apertus", {}),
    "gemma3-global": ("gemma3", {"window": 0}),                    # no sliding window: llama.cpp's other graph
    "gemma3-cap": ("gemma3", {"keys": {"final_logit_softcapping": 5.0}}),
    "gemma3-global-cap": ("gemma3", {"window": 0, "keys": {"final_logit_softcapping": 5.0}}),
    "granite": ("granite", {}),                                    # Granite 3.x's four multipliers
    "granite-norope": ("granite", {"rope": False, "attention_scale": None}),  # RoPE off; 1/sqrt(head_dim)
    "smollm3": ("smollm3", {}),                                    # layer 3 of 4 without RoPE
    "olmo2": ("olmo2", {}),
    "olmo3": ("olmo2", {"n_layer": 4, "keys": {"sliding_window": 8, **YARN}}),   # layers 0-2 local, plain RoPE
    "phi2": ("phi2", {}),                                          # parallel block, fused q/k/v
    "phi2-head80": ("phi2", {"n_embd": 320, "n_ff": 1280, "fused_qkv": False}),  # Phi-2's head size
    "starcoder2": ("starcoder2", {}),
    "stablelm": ("stablelm", {}),
    "stablelm-parallel": ("stablelm", {"parallel": True}),         # no FFN norms: the parallel block
    "command-r": ("command-r", {}),
    "cohere2": ("cohere2", {}),                                    # window 8: layers 0-2 local, 3 global (no RoPE)
    "ernie4_5": ("ernie4_5", {}),
    "exaone": ("exaone", {}),
    "exaone4": ("exaone4", {}),
    "exaone4-swa": ("exaone4", {"n_layer": 64, "n_embd": 64, "n_ff": 128, "n_head": 2, "n_head_kv": 1,
                                "keys": {"sliding_window": 8}}),  # 64 layers: the 32B's local/global layout
    "mixtral": ("mixtral", {}),                                    # 8 experts, 2 per token
    "qwen3moe": ("qwen3moe", {}),                                  # 16 experts of 256, 4 per token
    "olmoe": ("olmoe", {}),                                        # weights not renormalized
    "granitemoe": ("granitemoe", {}),                              # Granite's multipliers around the experts
    "granitemoe-shared": ("granitemoe", {"shared_expert": 256}),   # + a shared expert
    "granitehybrid": ("granitehybrid", {}),                        # Mamba 2 layers 0, 1, 3; attention 2
    "granitehybrid-groups": ("granitehybrid", {"ssm": {"groups": 2, "heads": 16}, "rope": True}),
    "granitehybrid-moe": ("granitehybrid", {"experts": 8}),        # + experts and a shared expert
    "nemotron_h": ("nemotron_h", {}),                              # one branch per layer: Mamba 2, attention, FFN
    "nemotron_h_moe": ("nemotron_h_moe", {}),                      # ungated relu^2 experts + shared expert
    "mamba2": ("mamba2", {}),                                      # Mamba 2 mixers alone
    "falcon-h1": ("falcon-h1", {}),                                # attention and Mamba 2 side by side
    "qwen35": ("qwen35", {}),                                      # gated delta rule in 3 of 4 layers
    "qwen35-mha": ("qwen35", {"delta": {"kv_heads": 4}, "n_layer": 5}),  # as many key as value heads
    "qwen35moe": ("qwen35moe", {}),                                # + experts and a gated shared expert
    "qwen3next": ("qwen3next", {}),                                # key heads in groups, one ssm_ba
    "qwen3next-legacy": ("qwen3next", {"legacy": True}),           # one ssm_in of [q | k | v | z] per key head
    "mamba2-groups": ("mamba2", {"ssm": {"groups": 4, "heads": 16, "d_state": 64}}),
    "qwen2moe": ("qwen2moe", {}),                                  # + a sigmoid-gated shared expert
    "glm4": ("glm4", {}),                                          # pre and post norms, fused qkv + bias, half RoPE
    "glm4-split": ("glm4", {"fused_qkv": False}),
    "nemotron": ("nemotron", {}),                                  # LayerNorm + biases, relu^2, partial NEOX
    "nemotron-biases": ("nemotron", {"biases": True}),             # + attention output and FFN biases
    "arcee": ("arcee", {}),
    "gptneox": ("gptneox", {}),                                    # two norms side by side, biases, 1/4 RoPE
    "gptneox-sequential": ("gptneox", {"parallel": False}),
    "falcon": ("falcon", {}),                                      # 7B: one norm, multi-query
    "falcon-40b": ("falcon", {"norm2": True, "n_head_kv": 2}),     # 40B: the attention's own norm
    "lfm2": ("lfm2", {}),                                          # layers 0, 1, 3 short convolutions
    "lfm2-seed1": ("lfm2", {"seed": 1}),
    "lfm2-conv-first": ("lfm2", {"n_layer": 6, "conv_layers": (0, 1, 2, 4, 5)}),
    "mistral3": ("mistral3", {}),                                  # YaRN without its factor; temperature, L=16
    "mistral3-notemp": ("mistral3", {"temperature": False}),
    "mistral3-logmul1": ("mistral3", {"keys": {"rope.scaling.yarn_log_multiplier": 1.0}}),
    "mistral3-logmul01": ("mistral3", {"keys": {"rope.scaling.yarn_log_multiplier": 0.1}}),
    "ernie4_5-moe": ("ernie4_5-moe", {}),                          # softmax + exp_probs_b chooses, 2 shared
    # DeepSeek 2: llama.cpp takes a file of 26 or 27 layers for a Lite one (q without q_a/q_b)
    "deepseek2": ("deepseek2", {"q_lora": 256}),     # MLA (split k_b/v_b), softmax experts, 2 shared
    # (dense layers only: 27 layers of random experts flip choices and amplify any difference)
    "deepseek2-lite": ("deepseek2", {"n_layer": 27, "dense_layers": tuple(range(27)),
                                     "keys": {"leading_dense_block_count": 27}}),
    "deepseek2-kv_b": ("deepseek2", {"q_lora": 256, "split": False}),   # a file from before the split
    "deepseek2-v3": ("deepseek2", {"q_lora": 256, "sigmoid": True}),    # sigmoid + exp_probs_b, renormalized
    "exaone-moe": ("exaone-moe", {}),              # window in 3 of 4 layers, NoPE global layer, experts, MTP block
    "exaone-moe-pattern": ("exaone-moe", {"pattern": [True, False, True, True]}),
    "mistral4": ("mistral4", {}),
    "mellum": ("mellum", {}),                      # Qwen3-MoE + a window in layer 0 of 2
    "mellum-yarn": ("mellum", {"yarn": True, "keys": {"sliding_window_pattern": [False, True]}}),
    "mellum-default": ("mellum", {"n_layer": 4, "keys": {"sliding_window_pattern": None}}),   # 3 of 4 windowed
    "granite_swa": ("granite_swa", {}),            # sinks, window flags, rope flags
    "granite_swa-moe": ("granite_swa", {"experts": 8}),   # fused experts and shared expert                  # MLA, fused ffn_gate_up_exps, attention temperature
    "deepseek2-v3-groups": ("deepseek2", {"q_lora": 256, "sigmoid": True,     # + 4 expert groups, 2 kept
                                          "keys": {"expert_group_count": 4, "expert_group_used_count": 2}}),
    "lfm2moe": ("lfm2moe", {}),                      # LFM2 + sigmoid experts after a dense layer
    "bailingmoe2": ("bailingmoe2", {}),              # fused qkv + q/k norms, grouped sigmoid experts, MTP block
    "hunyuan-dense": ("hunyuan-dense", {}),          # q/k norms after RoPE
    "llama4": ("llama4", {}),                        # NoPE every 4th layer, weightless q/k norms, input-weighted expert
    "smallthinker": ("smallthinker", {}),            # ReLU experts routed by the layer input, NoPE layer 0
    "smallthinker-nowindow": ("smallthinker", {"window": False}),
    "dots1": ("dots1", {}),                          # Qwen 3 attention + DeepSeek V3 experts
    "afmoe": ("afmoe", {}),                          # gated attention, pre+post norms, window 8, NoPE layer 3
    "qwen3vlmoe": ("qwen3vlmoe", {}),                # Qwen3-MoE's text through interleaved M-RoPE
    "hunyuan-moe": ("hunyuan-moe", {}),              # + softmax experts as wide as n_ff, a shared expert
    "seed_oss": ("seed_oss", {}),                    # Llama + biases, NEOX, post_attention_norm as the FFN norm
    "minicpm": ("minicpm", {}),                      # Granite's multipliers as the converter writes them
    # none written: llama.cpp's default logit divisor is 256 / n_embd, the configs' n_embd / 256
    "minicpm-defaults": ("minicpm", {"scales": False, "n_embd": 512, "n_head": 8}),
    "minicpm-longrope": ("minicpm", {"long_rope": True}),             # context 64 <= 256: short factors
    "minicpm-longrope-ctx512": ("minicpm", {"long_rope": True}, 512),  # context 512 > 256: long factors
    "minicpm3": ("minicpm3", {}),                                     # MLA (unsplit kv_b), LongRoPE short
    "minicpm3-ctx512": ("minicpm3", {}, 512),                         # long factors
    "mamba": ("mamba", {}),                          # Mamba 1 mixers alone
    "falcon-mamba": ("mamba", {"bc_norm": True}),    # + dt, B, C RMS-normed without weights
    "jamba": ("jamba", {}),                          # Mamba 1 (dt/B/C norms) + attention without RoPE, experts
    "openelm": ("openelm", {}),                      # heads, KV heads and FFN width per layer
    "rwkv6": ("rwkv6", {}),                          # WKV 6 time mix, channel mix, rescaled every 2 layers
    "rwkv6-lerps": ("rwkv6", {"fused_lerps": False, "n_layer": 2}),   # the five lerps apart
    "rwkv6qwen2": ("rwkv6qwen2", {}),                # gated linear attention, GQA k/v, SwiGLU
    "qwen": ("qwen", {}),                            # fused qkv + bias, NEOX, FFN half the file's width
    "codeshell": ("codeshell", {}),                  # StarCoder 2 with fused qkv + bias, GQA
    "jais2": ("jais2", {}),                          # StarCoder 2's block, squared ReLU
    "maincoder": ("maincoder", {}),                  # q/k norms after adjacent-pair RoPE
    "nanbeige": ("nanbeige", {}),
    "nanbeige-loops": ("nanbeige", {"keys": {"num_loops": 3}}),     # 2 layers run 3 times, normed between
    "nanbeige-loops-bare": ("nanbeige", {"keys": {"num_loops": 2, "skip_loop_final_norm": True}}),
    "plm": ("plm", {}),                              # MLA (attn_q, one kv_b), squared-ReLU FFN, tied
    "rwkv7": ("rwkv7", {}),                          # WKV 7, v_first, per-head norm + bonus, gate
    "arwkv7": ("arwkv7", {}),                        # neither gate nor norm, SwiGLU
    "arwkv7-gated": ("arwkv7", {"gated": True, "out_norm": True}),
    "olmo": ("olmo", {}),                            # parameterless LayerNorms
    "bloom": ("bloom", {}),                          # ALiBi, LayerNorm of the embeddings
    "bloom-6heads": ("bloom", {"n_embd": 384, "n_head": 6, "n_head_kv": 6}),   # slopes past a power of 2
    "mpt": ("mpt", {}),                              # ALiBi, LayerNorm without biases
    "jais": ("jais", {}),                            # ALiBi, biased SwiGLU, softmax scale 1/d
    "refact": ("refact", {}),
    "baichuan-13b": ("baichuan", {"n_layer": 40, "n_ff": 256}),   # ALiBi (llama.cpp: 40 layers, else neither)
    "baichuan-7b": ("baichuan", {"n_layer": 32, "n_ff": 256}),   # RoPE
    "chatglm": ("chatglm", {}),                      # fused qkv + bias, fused gate|up, NORM RoPE on half
    "internlm2": ("internlm2", {}),
    "xverse": ("xverse", {}),
    "orion": ("orion", {}),                          # LayerNorm + biases, NEOX
    "deepseek": ("deepseek", {}),
    "bailingmoe": ("bailingmoe", {}),                # softmax experts renormalized, 2 shared                    # softmax experts, not renormalized, x1.5; 2 shared
    "glm4moe": ("glm4moe", {}),                      # half NEOX RoPE, biases, sigmoid experts, MTP block unused
    "glm4moe-qknorm": ("glm4moe", {"qk_norm": True}),  # per-head q/k norms (GLM-4.5 355B)
    "deepseek2-yarn": ("deepseek2", {"q_lora": 256, "keys": {**YARN, "rope.scaling.yarn_log_multiplier": 0.0707}}),
    "gpt2": ("gpt2", {}),                                          # learned positions, no RoPE
    "starcoder": ("starcoder", {}),                                # + one KV head
    "qwen2vl": ("qwen2vl", {}),                                    # text through M-RoPE
    "qwen3vl": ("qwen3vl", {}),                                    # text through interleaved M-RoPE
    "gpt-oss": ("gpt-oss", {}),                                    # sinks, biased experts, swiglu_oai, window 8
    "gpt-oss-yarn": ("gpt-oss", {"keys": {**YARN, "rope_scaling_factor": 32.0}}),   # the released files' YaRN
}
# llama.cpp's LLAMA_FTYPE_MOSTLY_* (what `llama-quantize` calls them)
LLAMA_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_M"]
OTHER_TYPES = ["Q8_0", "Q4_K_M"]

PEER = r'''
import json, sys
import numpy as np
import llama_cpp
job = json.loads(sys.argv[1])
for q in job["quantize"]:
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + q["type"])
    p.nthread = job["threads"]
    rc = llama_cpp.llama_model_quantize(q["src"].encode(), q["dst"].encode(), p)
    if rc != 0:
        sys.exit(f"quantizing {q['dst']} failed: {rc}")
for e in job["eval"]:
    m = llama_cpp.Llama(model_path=e["path"], logits_all=True, n_ctx=e["n_ctx"], n_batch=e["n_ctx"],
                        n_threads=job["threads"], verbose=False)
    m.eval(e["ids"])
    np.save(e["out"], np.asarray(m.scores[:len(e["ids"])], dtype=np.float32))
    del m
'''


def peer(peer_python: str, job: dict) -> None:
    r = subprocess.run([peer_python, "-c", PEER, json.dumps(job)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llama.cpp side failed:\n{r.stderr[-3000:]}")


def rel(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x.astype(np.float64) - y) ** 2)) / y.std())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--types", help="quant types for every family (default: all for llama, Q8_0,Q4_K_M else)")
    ap.add_argument("--synth-types", default="",
                    help="also files whose matrices are all of these ggml types, random blocks written by "
                         "tests/synth.py as tests/test_families.py makes them (types llama.cpp's quantizer "
                         "makes only with an importance matrix, e.g. IQ3_XXS); rows labelled TYPE*")
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-venv/bin/python"))
    ap.add_argument("--tokenizer-from", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--n-tokens", type=int, default=40)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--out", help="keep the model files here (default: a temporary folder)")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    a = ap.parse_args()

    import synth
    from pyllm.arch import load_architecture
    from pyllm.backend.cpu import CpuBackend
    from pyllm.graph import Graph
    from pyllm.model_file import ModelFile
    from pyllm.reference import Reference

    tok_md = ModelFile(a.tokenizer_from).metadata
    out = Path(a.out or tempfile.mkdtemp(prefix="families-"))
    out.mkdir(parents=True, exist_ok=True)
    ids = [int(t) for t in np.random.default_rng(7).integers(100, 20000, a.n_tokens)]

    files = []   # (label, type, path, n_ctx)
    job = {"threads": a.threads, "quantize": [], "eval": []}
    for fam in a.families.split(","):
        writer, kw, *ctx = FAMILIES[fam]
        n_ctx = ctx[0] if ctx else 64
        src = synth.WRITERS[writer](out / f"{fam}-F32.gguf", synth.QT.F32, tokenizer_from=tok_md, **kw)
        files.append((fam, "F32", src, n_ctx))
        for t in filter(None, a.synth_types.split(",")):
            path = synth.WRITERS[writer](out / f"{fam}-synth-{t}.gguf", synth.QT[t], tokenizer_from=tok_md, **kw)
            files.append((fam, t + "*", path, n_ctx))
        types = a.types.split(",") if a.types else (LLAMA_TYPES if fam == "llama" else OTHER_TYPES)
        for t in types:
            dst = str(out / f"{fam}-{t}.gguf")
            job["quantize"].append({"src": src, "dst": dst, "type": t})
            files.append((fam, t, dst, n_ctx))
    for i, (_, _, path, n_ctx) in enumerate(files):
        job["eval"].append({"path": path, "ids": ids, "n_ctx": n_ctx, "out": str(out / f"peer{i}.npy")})
    peer(a.peer_python, job)

    rows = []
    for i, (fam, t, path, n_ctx) in enumerate(files):
        mf = ModelFile(path)
        arch = load_architecture(mf, n_ctx=n_ctx)
        g = Graph()
        arch.build(g)
        be = CpuBackend(g, a.threads, len(ids), len(ids), 4, 16)
        ours = be.forward(ids, 0, [0, 1, 2, 3], len(ids)).copy()
        be.close()
        theirs = np.load(out / f"peer{i}.npy")
        ref = Reference(arch).forward(ids)
        mix = "+".join(f"{k}:{v}" for k, v in mf.type_histogram().items() if k not in ("F32",)) or "F32"
        top2 = np.sort(theirs, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 0.05 * theirs.std()
        agree = ours.argmax(1) == theirs.argmax(1)
        rows.append({"family": fam, "type": t, "mix": mix, "max": float(np.abs(ours - theirs).max()),
                     "rel": rel(ours, theirs), "top1": float(np.mean(agree[clear])) if clear.any() else 1.0,
                     "top1_all": float(np.mean(agree)),
                     "ref_rel": rel(ours, ref), "peer_ref_rel": rel(theirs, ref)})
    head = ["family", "type", "max|d|", "rel", "top1", "ref rel", "llama.cpp ref rel", "tensor types"]
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print(f"{head[0]:<14} {head[1]:<7} {head[2]:>8} {head[3]:>8} {head[4]:>11} {head[5]:>8} "
              f"{head[6]:>8}  {head[7]}")
    for r in rows:
        cells = [r["family"], r["type"], f"{r['max']:.4f}", f"{r['rel']:.4%}",
                 f"{r['top1']:.0%} ({r['top1_all']:.0%})",
                 f"{r['ref_rel']:.4%}", f"{r['peer_ref_rel']:.4%}", r["mix"]]
        if a.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print(f"{cells[0]:<14} {cells[1]:<7} {cells[2]:>8} {cells[3]:>8} {cells[4]:>11} {cells[5]:>8} "
                  f"{cells[6]:>8}  {cells[7]}")
    json.dump(rows, open(out / "table.json", "w"), indent=1)
    print(f"files and table.json in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
