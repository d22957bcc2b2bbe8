#!/usr/bin/env python3
"""Compare pyllm's vision path (an mmproj file's encoder, an image's rows in the prompt) with
llama.cpp's mtmd.

No registry model has a projector, so this writes small random language models and projectors
(tests/synth.py) for each supported projector: Gemma 3's, SmolVLM's (idefics3), LFM2-VL's,
Pixtral's (merged and not), Qwen 2 / 2.5 / 3 VL's, Gemma 4's (and Gemma 4 Unified's) and LLaVA 1.5's (and Yi-VL's), in F32
and F16 (+ Gemma 3 with Q8_0 matrices), and asks llama.cpp (llama-cpp-python's mtmd, in its own environment) for:
  - the image's embeddings (mtmd_encode_chunk), against pyllm's VisionEncoder.encode;
  - the prompt's layout (the text chunks' token ids and the image's row count);
  - the logits after "<text> <image> <text>" evaluated with mtmd_helper_eval_chunks (Gemma 3's
    image with causal attention off, Qwen's at M-RoPE positions), against pyllm's.
LLaVA's are compared where mtmd's two known slips do not show (no class row, a last layer that
adds nothing); "llava class row" shows the class row's place alone, and that mtmd's rows are
those of the class row put last (the tests' plain loops in that order). Images: a square, a wide
and a large one for Gemma 3, SmolVLM and LLaVA; for the others nine, from a
constant colour (any resampling keeps it: the encoder alone) to tiled ones and sides with a half
to round.

--speed [gemma3|smolvlm|lfm2|pixtral|qwen2.5vl|qwen3vl|llava|internvl|gemma4]: instead, times one image's encoding at a real
size, F16 matrices, random, in pyllm and in llama.cpp's mtmd, alternating, same threads (SPEED
lists them); run it on a quiet machine. Dev tool only.

    PYLLM_PEER_PYTHON=/tmp/peer-avx512/bin/python python3 benchmarks/compare_vision.py [--only lfm2] [--speed pixtral]
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
from gguf.constants import GGMLQuantizationType as QT  # noqa: E402

from pyllm.vision import VisionEncoder  # noqa: E402

PROMPT = "hello there <__media__> what is in this picture"

PEER = r'''
import ctypes, json, sys
import numpy as np
import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
job = json.load(sys.stdin)
b = job.get("batch", 512)   # a step of images whose rows see each other: mtmd splits larger ones
m = llama_cpp.Llama(model_path=job["lm"], n_ctx=8192, n_batch=b, n_ubatch=b, verbose=False, n_threads=2)
p = mtmd.mtmd_context_params_default()
p.use_gpu, p.n_threads, p.warmup, p.print_timings = False, 2, False, False
if job.get("tokens"):   # --image-min-tokens, --image-max-tokens
    p.image_min_tokens, p.image_max_tokens = job["tokens"]
ctx = mtmd.mtmd_init_from_file(job["mmproj"].encode(), m.model, p)
assert ctx, "mtmd_init_from_file failed"
out = []
for img in job["images"]:
    rgb = np.load(img)
    h, w, _ = rgb.shape
    buf = (ctypes.c_ubyte * rgb.size).from_buffer_copy(rgb.tobytes())
    bmp = mtmd.mtmd_bitmap_init(w, h, buf)
    chunks = mtmd.mtmd_input_chunks_init()
    text = mtmd.mtmd_input_text(job["prompt"].encode(), len(job["prompt"].encode()), True, True)
    arr = (ctypes.c_void_p * 1)(bmp)
    assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), arr, 1) == 0
    layout, embd = [], []
    for i in range(mtmd.mtmd_input_chunks_size(chunks)):
        c = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_input_chunk_get_type(c) == 0:
            n = ctypes.c_size_t()
            ids = mtmd.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
            layout.append([int(ids[j]) for j in range(n.value)])
        else:
            n_tok = mtmd.mtmd_input_chunk_get_n_tokens(c)
            assert mtmd.mtmd_encode_chunk(ctx, c) == 0
            ptr = mtmd.mtmd_get_output_embd(ctx)
            embd.append(np.ctypeslib.as_array(ptr, shape=(n_tok * job["width"],)).reshape(n_tok, -1).copy())
            layout.append(int(n_tok))
    m.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(m.ctx), True)
    new_past = llama_cpp.llama_pos(0)
    assert mtmd.mtmd_helper_eval_chunks(ctx, m.ctx, chunks, 0, 0, b, True, ctypes.byref(new_past)) == 0
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(m.ctx, -1), shape=(m.n_vocab(),)).copy()
    np.save(img + ".embd.npy", np.concatenate(embd))
    np.save(img + ".logits.npy", logits)
    out.append({"layout": layout})
    mtmd.mtmd_input_chunks_free(chunks)
    mtmd.mtmd_bitmap_free(bmp)
print(json.dumps(out))
'''


PEER_SPEED = r'''
import ctypes, json, sys, time
import numpy as np
import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
job = json.load(sys.stdin)
m = llama_cpp.Llama(model_path=job["lm"], n_ctx=512, verbose=False, n_threads=job["threads"])
p = mtmd.mtmd_context_params_default()
p.use_gpu, p.n_threads, p.warmup, p.print_timings = False, job["threads"], False, False
ctx = mtmd.mtmd_init_from_file(job["mmproj"].encode(), m.model, p)
rgb = np.load(job["image"])
h, w, _ = rgb.shape
buf = (ctypes.c_ubyte * rgb.size).from_buffer_copy(rgb.tobytes())
bmp = mtmd.mtmd_bitmap_init(w, h, buf)
chunks = mtmd.mtmd_input_chunks_init()
text = mtmd.mtmd_input_text(b"<__media__>", 11, True, True)
arr = (ctypes.c_void_p * 1)(bmp)
assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), arr, 1) == 0
images = [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))
          if mtmd.mtmd_input_chunk_get_type(mtmd.mtmd_input_chunks_get(chunks, i)) != 0]
t = time.perf_counter()
for image in images:   # SmolVLM's tiles and overview: one chunk each
    assert mtmd.mtmd_encode_chunk(ctx, image) == 0
print(json.dumps({"s": time.perf_counter() - t}))
'''


# the encoders at their real sizes: (language model writer, its shape, the projector's, the image, what it is)
SPEED = {
    "gemma3": (synth.write_gemma3, dict(n_embd=2560, n_head=8),
               dict(n_embd=1152, n_head=16, n_ff=4304, n_layer=27, image_size=896, patch=14, merge=4),
               (896, 896, 3), "one 896x896 image through Gemma 3's encoder (4096 patches, 27 layers)"),
    "smolvlm": (synth.write_llama, dict(n_embd=576, n_head=9, n_head_kv=3, image_tokens=True),
                dict(n_embd=768, n_head=12, n_ff=3072, n_layer=12, image_size=512, patch=16, merge=4,
                     projector="idefics3", longest_edge=2048),
                (768, 1024, 3), "one 1024x768 image through SmolVLM-256M's encoder (13 tiles of 1024 patches, "
                                "12 layers)"),
    "lfm2": (synth.write_lfm2, dict(n_embd=1024, n_head=16, n_head_kv=8, n_layer=4, image_tokens="lfm2"),
             dict(n_embd=768, n_head=12, n_ff=3072, n_layer=12, image_size=256, patch=16, merge=2, projector="lfm2",
                  n_mid=1024),
             (768, 1024, 3), "one 1024x768 image through LFM2-VL-450M's encoder (6 tiles of 1024 patches and a "
                             "thumbnail of 936, 12 layers)"),
    "pixtral": (synth.write_llama, dict(n_embd=1024, n_head=8, n_head_kv=8, image_tokens="pixtral"),
                dict(n_embd=1024, n_head=16, n_ff=4096, n_layer=24, image_size=1540, patch=14, merge=2,
                     projector="pixtral", n_mid=1024),
                (768, 1024, 3), "one 1024x768 image through Mistral Small 3.1's encoder (1036x756: 3996 patches, "
                                "24 layers of 1024)"),
    "qwen2.5vl": (synth.write_qwen2vl, dict(n_embd=2048, n_head=16, n_head_kv=2, image_tokens="qwen"),
                  dict(n_embd=1280, n_head=16, n_ff=3420, n_layer=32, image_size=560, patch=14, merge=2,
                       projector="qwen2.5vl_merger", n_mid=5120, n_wa_pattern=8),
                  (768, 1024, 3), "one 1024x768 image through Qwen 2.5 VL's encoder (1036x756: 3996 patches, "
                                  "32 layers of 1280, windows but every 8th)"),
    "qwen3vl": (synth.write_qwen3vl, dict(n_embd=2048, n_head=16, n_head_kv=8, n_layer=4, image_tokens="qwen",
                                          keys={"num_deepstack_layers": 3}),
                dict(n_embd=1024, n_head=16, n_ff=4096, n_layer=24, image_size=768, patch=16, merge=2,
                     projector="qwen3vl_merger", n_mid=4096, deepstack=(5, 11, 17)),
                (768, 1024, 3), "one 1024x768 image through Qwen 3 VL 2B's encoder (3072 patches, 24 layers of "
                                "1024, DeepStack from 3)"),
    "llava": (synth.write_llama, dict(n_embd=4096, n_head=32, n_head_kv=32),
              dict(n_embd=1024, n_head=16, n_ff=4096, n_layer=23, image_size=336, patch=14, projector="mlp",
                   use_gelu=False, n_mid=4096),
              (768, 1024, 3), "one 1024x768 image through LLaVA 1.5's CLIP ViT-L/14-336 (577 rows, 23 layers of "
                              "1024; mtmd runs 22 of them)"),
    "internvl": (synth.write_qwen2, dict(n_embd=896, n_head=14, n_head_kv=2, image_tokens="internvl"),
                 dict(n_embd=1024, n_head=16, n_ff=4096, n_layer=24, image_size=448, patch=14, merge=2,
                      projector="internvl", n_mid=896),
                 (448, 896, 3), "one 896x448 image through InternVL3-1B's InternViT-300M (2 tiles and the overview, "
                                "1025 rows each, 24 layers of 1024)"),
    "gemma4": (synth.write_gemma4, dict(n_embd=1536, n_ff=256, image_tokens="gemma4"),
               dict(n_embd=768, n_head=12, n_ff=3072, n_layer=12, image_size=224, patch=16, merge=3,
                    projector="gemma4v"),
               (768, 1024, 3), "one 1024x768 image through a Gemma 4 encoder of SigLIP-B's size (1008x768: 3024 "
                               "patches, 12 layers of 768)"),
}


def speed(python: str, kind: str = "gemma3", rounds: int = 2, threads: int = 2) -> None:
    """An encoder at its real size (SPEED[kind]), pyllm and llama.cpp alternating: Gemma 3's
    (SigLIP-So400m, one 896x896 image); for a 1024x768 picture, SmolVLM-256M's (SigLIP-B/16, 4 x 3
    tiles of 512 and the overview), LFM2-VL-450M's (SigLIP2-B/16, 3 x 2 tiles and a 576x416
    thumbnail), Mistral Small 3.1's and Qwen 2.5 VL's (the picture at 1036x756), Qwen 3 VL 2B's (at
    1024x768)."""
    import time
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        if kind not in SPEED:
            raise SystemExit(f"--speed takes one of {', '.join(SPEED)}, not {kind!r}")
        write_lm, lm_kw, mm_kw, shape, what = SPEED[kind]
        small = {} if write_lm is synth.write_gemma4 else {"n_layer": 1, "n_ff": 256}   # Gemma 4's: its layer flags
        lm = write_lm(t / "lm.gguf", QT.Q8_0, **(small | lm_kw))
        mm = synth.write_mmproj(t / "mm.gguf", n_out=lm_kw["n_embd"], **mm_kw)
        img = str(t / "img.npy")
        np.save(img, np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8))
        from PIL import Image
        enc = VisionEncoder(mm, n_threads=threads)
        pic = Image.fromarray(np.load(img))
        ours, theirs = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            enc.encode(pic)
            ours.append(time.perf_counter() - t0)
            r = subprocess.run([python, "-c", PEER_SPEED], input=json.dumps(
                {"lm": lm, "mmproj": mm, "image": img, "threads": threads}), capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"peer failed:\n{r.stderr[-3000:]}")
            theirs.append(json.loads(r.stdout.strip().splitlines()[-1])["s"])
        print(f"{what}, {threads} threads:")
        print(f"  pyllm {min(ours):.2f} s   llama.cpp mtmd {min(theirs):.2f} s   "
              f"ratio {min(theirs) / min(ours):.2f}x (best of {rounds})")


def peer(python: str, job: dict) -> list:
    r = subprocess.run([python, "-c", PEER], input=json.dumps(job), capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"peer failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    python = os.environ.get("PYLLM_PEER_PYTHON")
    if not python:
        raise SystemExit("set PYLLM_PEER_PYTHON to a python with llama-cpp-python (see ../shared/peer)")
    if "--speed" in sys.argv[1:]:
        rest = sys.argv[sys.argv.index("--speed") + 1:]
        speed(python, rest[0] if rest else "gemma3")
        return
    from pyllm import Model
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv[1:] else ""
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        images, lfm2_images = [], []
        for name, shape in (("square", (32, 32, 3)), ("wide", (20, 45, 3)), ("large", (70, 100, 3))):
            path = str(t / f"{name}.npy")
            np.save(path, rng.integers(0, 256, shape, dtype=np.uint8))
            images.append((name, path))
        # LFM2's: a constant colour (the encoder alone: any resampling keeps it), the position grid's
        # own size (no resampling), a wide one (resampled), a small one (scaled up), and large ones
        # (tiles and a thumbnail; the tiles padded)
        for name, shape, const in (("flat", (200, 300, 3), True), ("grid", (256, 256, 3), False),
                                   ("wide", (300, 600, 3), False), ("small", (45, 70, 3), False),
                                   ("flat-tiled", (700, 900, 3), True), ("tiled", (700, 900, 3), False),
                                   ("tall-tiled", (1500, 500, 3), False), ("halves", (200, 300, 3), True),
                                   ("720", (720, 720, 3), True)):
            path = str(t / f"lfm2-{name}.npy")
            np.save(path, np.broadcast_to(rng.integers(0, 256, 3, dtype=np.uint8), shape) if const else
                    rng.integers(0, 256, shape, dtype=np.uint8))
            lfm2_images.append((name, path))
        print(f"{'projector':<22} {'image':<10} {'embd max|d|':>11} {'embd cos':>9} {'layout':>7} "
              f"{'logits max|d|':>13} {'top-1':>6}")
        for label, proj_type, lm_type, kind in (
                ("gemma3 F32", QT.F32, QT.F32, "gemma3"), ("gemma3 F16", QT.F16, QT.F16, "gemma3"),
                ("gemma3 Q8_0 matrices", QT.Q8_0, QT.Q8_0, "gemma3"),
                ("idefics3 F32", QT.F32, QT.F32, "idefics3"), ("idefics3 F16", QT.F16, QT.F16, "idefics3"),
                ("lfm2 F32", QT.F32, QT.F32, "lfm2"), ("lfm2 F16", QT.F16, QT.F16, "lfm2"),
                ("pixtral F32", QT.F32, QT.F32, "pixtral"), ("pixtral merge=1", QT.F32, QT.F32, "pixtral1"),
                ("pixtral F16", QT.F16, QT.F16, "pixtral"),
                ("lightonocr F32", QT.F32, QT.F32, "lightonocr"), ("lightonocr F16", QT.F16, QT.F16, "lightonocr"),
                ("paddleocr F32", QT.F32, QT.F32, "paddleocr"), ("paddleocr F16", QT.F16, QT.F16, "paddleocr"),
                ("qwen2.5vl F32", QT.F32, QT.F32, "qwen2.5vl_merger"),
                ("qwen2.5vl F16", QT.F16, QT.F16, "qwen2.5vl_merger"),
                ("qwen2vl F32", QT.F32, QT.F32, "qwen2vl_merger"),
                ("qwen3vl F32", QT.F32, QT.F32, "qwen3vl_merger"),
                ("qwen3vl F16", QT.F16, QT.F16, "qwen3vl_merger"),
                ("qwen3.5 F32", QT.F32, QT.F32, "qwen3.5"),
                ("llava F32", QT.F32, QT.F32, "mlp"), ("llava F16", QT.F16, QT.F16, "mlp"),
                ("yi-vl mlp_norm F32", QT.F32, QT.F32, "mlp_norm"),
                ("llava class row", QT.F32, QT.F32, "mlp-class"),
                ("llava-1.6 flat", QT.F32, QT.F32, "mlp-next"),
                ("internvl F32", QT.F32, QT.F32, "internvl"), ("internvl F16", QT.F16, QT.F16, "internvl"),
                ("internvl class row", QT.F32, QT.F32, "internvl-class"),
                ("gemma4 F32", QT.F32, QT.F32, "gemma4v"), ("gemma4 F16", QT.F16, QT.F16, "gemma4v"),
                ("gemma4 E2B-wide", QT.F32, QT.F32, "gemma4v-causal"),
                ("gemma4 unified F32", QT.F32, QT.F32, "gemma4uv"), ("gemma4 unified F16", QT.F16, QT.F16, "gemma4uv"),
                ("qwen3vl min 1024 rows", QT.F32, QT.F32, "qwen3vl_merger"),
                ("gemma4 max 100 rows", QT.F32, QT.F32, "gemma4v")):
            if only and not label.startswith(only):
                continue
            pictures = lfm2_images if kind in ("lfm2", "pixtral", "pixtral1", "lightonocr", "paddleocr") or kind.startswith(("qwen", "gemma4",
                                                                                                  "internvl")) \
                else images
            if kind == "qwen3vl_merger":    # Qwen 3 VL's: a qwen3vl model (interleaved M-RoPE, DeepStack of 2)
                lm = synth.write_qwen3vl(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="qwen", n_layer=3,
                                         keys={"num_deepstack_layers": 2})
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector=kind,
                                        image_size=256, patch=16, n_head=4, deepstack=(0, 1))
            elif kind == "gemma4uv":    # Gemma 4 Unified's: no encoder; patches of 4 x 3 pixels
                lm = synth.write_gemma4(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="gemma4")
                mm = synth.write_gemma4_unified_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, audio=False,
                                                       n_positions=256)
            elif kind.startswith("gemma4v"):    # Gemma 4's: per-layer inputs (the padding token's for an image)
                wide = kind == "gemma4v-causal"     # E2B's width: its images are read causally
                lm = synth.write_gemma4(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="gemma4",
                                        **(dict(n_embd=1536, n_ff=256) if wide else {}))
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=1536 if wide else 256, qtype=proj_type,
                                        projector="gemma4v", image_size=224, patch=16, merge=3, n_head=4)
            elif kind == "qwen3.5":    # Qwen3.5's: Qwen 3 VL's projector without DeepStack, a hybrid model
                lm = synth.write_qwen35(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="qwen")
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector="qwen3vl_merger",
                                        image_size=256, patch=16, n_head=4, deepstack=())
            elif kind.startswith("qwen"):    # Qwen 2 / 2.5 VL's: a qwen2vl model (M-RoPE) with its image tokens
                lm = synth.write_qwen2vl(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="qwen")
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector=kind,
                                        image_size=560, patch=14, n_head=4)
            elif kind.startswith("pixtral"):    # Mistral Small 3.x's (2 x 2 patches merged) or Pixtral 12B's
                lm = synth.write_llama(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="pixtral")
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector="pixtral",
                                        image_size=1024, patch=16, merge=1 if kind == "pixtral1" else 2)
            elif kind == "lightonocr":    # LightOnOCR's: Pixtral's with a merge of 2, no breaks, scaled to 320
                lm = synth.write_qwen3(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="chatml")
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector="lightonocr",
                                        image_size=1024, patch=16, merge=2, longest_edge=320)
            elif kind == "paddleocr":    # PaddleOCR-VL's: its ERNIE model with M-RoPE; positions of 6 x 6 resized
                lm = synth.write_paddleocr(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="paddleocr")
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector="paddleocr",
                                        image_size=84, patch=14, keys={"image_min_pixels": 8 * 28 * 28,
                                                                       "image_max_pixels": 1024 * 28 * 28})
            elif kind == "lfm2":    # LFM2-VL's: an lfm2 model with its image tokens; a projector of 16-pixel patches
                lm = synth.write_lfm2(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="lfm2")
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector="lfm2",
                                        image_size=256, patch=16)
            elif kind.startswith("mlp"):
                # LLaVA 1.5's: a llama model; CLIP's quick-GELU and pre-norm. mtmd puts the class row
                # last and runs one stored layer fewer (llama.cpp issues 25814, 25817), so the like-
                # for-like rows have no class row and a last layer that adds nothing; "mlp-class"
                # shows what the class row's place changes
                lm = synth.write_llama(t / f"lm-{label}.gguf", lm_type, n_vocab=512)
                # "mlp-next": LLaVA 1.6's grids with the tiles' rows as they are ("flat": nearest mtmd's way;
                # transformers' LLaVA-NeXT cuts and packs them, which benchmarks/compare_hf_vision.py checks).
                # mtmd reads an image within the square whole (64 rows; transformers: the grid too), and
                # puts the whole image's rows after the tiles' (transformers: first): compared so moved
                pins = {"image_grid_pinpoints": [32, 64, 64, 32, 64, 64, 96, 32, 32, 96],
                        "mm_patch_merge_type": "flat"} if kind == "mlp-next" else None
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector="mlp",
                                        use_gelu=False, n_layer=3, class_row=kind == "mlp-class",
                                        identity_last=True, mlp_norm=kind == "mlp_norm", keys=pins)
            elif kind.startswith("internvl"):
                # InternVL's: a qwen2 model with <img> and </img>; tiles of 64 pixels (16 rows each), at most
                # 12. mtmd puts the class row last here too: like for like, every position the same
                lm = synth.write_qwen2(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens="internvl")
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector="internvl",
                                        image_size=64, patch=8, n_layer=3, flat_positions=kind == "internvl")
            elif kind == "gemma3":
                lm = synth.write_gemma3(t / f"lm-{label}.gguf", lm_type, n_vocab=512)
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type)
            else:   # SmolVLM's: a llama model with the image tokens; images scaled to 64 and cut in tiles of 32
                lm = synth.write_llama(t / f"lm-{label}.gguf", lm_type, n_vocab=512, image_tokens=True)
                mm = synth.write_mmproj(t / f"mm-{label}.gguf", n_out=256, qtype=proj_type, projector="idefics3",
                                        merge=2, longest_edge=64)
            tokens = (1024, 4096) if "min 1024" in label else (70, 100) if "max 100" in label else None
            enc = VisionEncoder(mm, **(dict(min_tokens=tokens[0], max_tokens=tokens[1]) if tokens else {}))
            got = peer(python, {"lm": lm, "mmproj": mm, "prompt": PROMPT, "images": [p for _, p in pictures],
                                "width": enc.n_out, "tokens": tokens, "batch": 2048 if kind == "gemma4uv" else 512})
            model = Model(lm, mmproj=mm, n_ctx=8192, n_threads=2,
                          **(dict(image_min_tokens=tokens[0], image_max_tokens=tokens[1]) if tokens else {}))
            for (name, path), theirs in zip(pictures, got):
                from PIL import Image
                img = Image.fromarray(np.load(path))
                ours = enc.encode(img)
                if kind == "mlp-next":    # mtmd puts LLaVA 1.6's whole image after the tiles, transformers first
                    ours = np.concatenate([ours[enc.n_tokens:], ours[:enc.n_tokens]])
                embd = np.load(path + ".embd.npy")
                if ours.shape != embd.shape:
                    print(f"{label:<22} {name:<10} rows {len(ours)} against llama.cpp's {len(embd)}")
                    continue
                cos = float((ours * embd).sum() / np.linalg.norm(ours) / np.linalg.norm(embd))
                tokens = model.media_prompt(PROMPT, [img])
                layout = layout_of(tokens)
                same = "same" if layout == merged(theirs["layout"]) else "DIFF"
                seq = model.engine.new_sequence()
                lg, _ = model.engine.prefill(seq, tokens)
                seq.release()
                ref = np.load(path + ".logits.npy")
                print(f"{label:<22} {name:<10} {np.abs(ours - embd).max():11.2e} {cos:9.6f} {same:>7} "
                      f"{np.abs(lg - ref).max():13.2e} {'same' if lg.argmax() == ref.argmax() else 'DIFF':>6}")
                if same != "same":
                    print("  ours:  ", layout, "\n  theirs:", theirs["layout"])
                if kind == "mlp-class":    # the difference is the class row's place: mtmd's order, simulated
                    from test_vision import slow_llava_encode
                    sim = slow_llava_encode(enc, enc.pixels(img).astype(np.float64), class_last=True)
                    print(f"{'  mtmd order simulated':<33} {np.abs(sim - embd).max():11.2e}")
                if kind == "internvl-class":    # the same, tile by tile
                    from test_vision import slow_internvl_encode
                    sim = np.concatenate([slow_internvl_encode(enc, enc.normalize(t).astype(np.float64), class_last=True)
                                          for t in enc.tiles(img)])
                    print(f"{'  mtmd order simulated':<33} {np.abs(sim - embd).max():11.2e}")
            model.close()
            enc.close()


def merged(layout: list) -> list:
    """mtmd's chunks with the image chunks that follow each other as one run of rows (InternVL's
    tiles and overview: one chunk each, nothing between them)."""
    out: list = []
    for part in layout:
        if isinstance(part, int) and out and isinstance(out[-1], int):
            out[-1] += part
        else:
            out.append(part)
    return out


def layout_of(tokens: list) -> list:
    """Text runs as id lists, an image's rows as their count (mtmd's chunks)."""
    out: list = []
    for tok in tokens:
        if tok < 0:
            if out and isinstance(out[-1], int):
                out[-1] += 1
            else:
                out.append(1)
        elif out and isinstance(out[-1], list):
            out[-1].append(tok)
        else:
            out.append([tok])
    return out


if __name__ == "__main__":
    main()
