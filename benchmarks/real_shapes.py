#!/usr/bin/env python3
"""Synthetic models with a real model's widths (fewer layers and experts), quantized by
llama.cpp: files for benchmarks/agreement.py and compare_llama_cpp.py where no real file
of the family is on PyPI.

Each shape is a random F32 model written by tests/synth.py, then quantized with llama.cpp's own
quantizer (llama-cpp-python in its own virtual environment, --peer-python; pyllm never imports
it), so the file holds llama.cpp's mix of types for --type.

    python3 benchmarks/real_shapes.py gemma4-e2b --out /tmp/shapes
    python3 benchmarks/agreement.py -m /tmp/shapes/gemma4-e2b-Q4_K_M.gguf --reference -t 2
    python3 benchmarks/compare_llama_cpp.py -m /tmp/shapes/gemma4-e2b-Q4_K_M.gguf -t 1,2 -p 512 -n 64 -r 3
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

# name -> (writer, tokenizer file in models/, what it is, writer keywords)
SHAPES = {
    "gemma4-e2b": ("gemma4", "gemma-3-270m-q4_k_m.gguf",
                   "Gemma 4 E2B's widths, 10 of its 35 layers (4 local : 1 global), 5 sharing KV, per-layer inputs",
                   dict(n_embd=1536, n_head=8, n_ff=6144, swa=(1, 1, 1, 1, 0) * 2, swa_head=(256, 1),
                        full_head=(512, 1), shared_kv=5, per_layer=256, window=512)),
    "gemma3n-e2b": ("gemma3n", "gemma-3-270m-q4_k_m.gguf",
                    "Gemma 3n E2B's widths, 10 of its 30 layers (4 local : 1 global), 4 AltUp streams, per-layer inputs",
                    dict(n_embd=2048, n_head=8, n_head_kv=2, head_dim=256, n_ff=8192, n_layer=10, per_layer=256,
                         window=512)),
    "gemma4-26b-a4b": ("gemma4", "gemma-3-270m-q4_k_m.gguf",
                       "Gemma 4 26B-A4B's widths, 4 of its 30 layers, 32 of its 128 experts of 704 (8 used)",
                       dict(n_embd=2816, n_head=16, n_ff=2112, swa=(1, 1, 1, 0), swa_head=(256, 8), full_head=(512, 2),
                            shared_kv=0, per_layer=0, window=1024, experts=32, experts_used=8, n_ff_exp=704)),
    "qwen3next-80b-a3b": ("qwen3next", "SmolLM2-135M-Instruct.Q4_1.gguf",
                          "Qwen3-Next-80B-A3B's widths, 4 of its 48 layers (3 linear), 64 of its 512 experts (10 used)",
                          dict(n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_ff=512, experts=64,
                               experts_used=10, n_ff_exp=512, shared_expert=512,
                               delta={"heads": 32, "kv_heads": 16, "head_dim": 128, "d_conv": 4, "fused_ba": True})),
    "llama3.2-1b": ("llama", "SmolLM2-135M-Instruct.Q4_1.gguf",
                    "Llama 3.2 1B's widths (SmolLM2's vocabulary), 8 of its 16 layers: every row a multiple of 256",
                    dict(n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192, n_layer=8, tied=True)),
    "mamba-130m": ("mamba", "SmolLM2-135M-Instruct.Q4_1.gguf",
                   "state-spaces' mamba-130m's widths, all 24 layers (d_inner 1536, state 16, dt rank 48)",
                   dict(n_embd=768, n_layer=24, d_state=16, dt_rank=48)),
    "rwkv7-0.1b": ("rwkv7", "SmolLM2-135M-Instruct.Q4_1.gguf",
                   "RWKV-7 World 0.1B's widths, all 12 layers (12 heads of 64, LoRA ranks 64/64/32/128)",
                   dict(n_embd=768, n_layer=12, n_ff=3072, ranks=(64, 64, 32, 128))),
    "rwkv6-1.6b": ("rwkv6", "SmolLM2-135M-Instruct.Q4_1.gguf",
                   "RWKV-6 World 1.6B's widths, 8 of its 24 layers (32 heads of 64, rescaled every 6)",
                   dict(n_embd=2048, n_layer=8, n_ff=7168, extra=32, decay_extra=64, rescale_every=6)),
}

QUANTIZE = r'''
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--out", default="/tmp/shapes")
    ap.add_argument("--type", default="Q4_K_M", help="llama.cpp's LLAMA_FTYPE_MOSTLY_* name")
    ap.add_argument("--ctx", type=int, default=4096, help="context_length written into the file")
    ap.add_argument("--models", default=str(ROOT / "models"), help="where the tokenizer's file is")
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-venv/bin/python"))
    a = ap.parse_args()

    import synth
    from pyllm.model_file import ModelFile

    writer, tok_file, what, kw = SHAPES[a.shape]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    md = dict(ModelFile(os.path.join(a.models, tok_file)).metadata)
    if writer == "gemma4":   # Gemma 4's own tokenizer model, made from Gemma 3's vocabulary
        md = synth.gemma4_vocab(md)
    f32 = out / f"{a.shape}-F32.gguf"
    print(f"{a.shape}: {what}; writing {f32}")
    synth.WRITERS[writer](f32, synth.QT.F32, tokenizer_from=md, **kw)
    quant = out / f"{a.shape}-{a.type}.tmp.gguf"
    r = subprocess.run([a.peer_python, "-c", QUANTIZE, str(f32), str(quant), a.type])
    f32.unlink()
    if r.returncode != 0:
        print(f"llama.cpp's quantizer failed ({r.returncode})", file=sys.stderr)
        return 1
    final = out / f"{a.shape}-{a.type}.gguf"
    synth.rewrite_metadata(quant, final, {f"{writer}.context_length": a.ctx})
    quant.unlink()
    print(f"wrote {final} ({final.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
