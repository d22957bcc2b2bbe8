#!/usr/bin/env python3
"""Gemma 4 Unified's encoder-free embedders (vision.py "gemma4uv", audio.py "gemma4ua") against
transformers' own: a small random Gemma4UnifiedForConditionalGeneration (every embedder weight
random, the layer norms' too), saved as transformers saves it and converted by llama.cpp's own
converter (convert_hf_to_gguf.py --mmproj), so pyllm reads the very file llama.cpp would.

Pictures: pyllm's pixels for an image (its size chosen as mtmd chooses it) through transformers'
own patching (convert_image_to_patches, patches_merge) and Gemma4UnifiedVisionEmbedder, against
pyllm's rows. Sounds: Gemma4UnifiedAudioFeatureExtractor's frames through embed_audio, against
pyllm's rows of the same samples.

    PYLLM_HF_PYTHON=/tmp/hf-venv/bin/python PYLLM_LLAMA_CPP=/path/to/llama.cpp \\
        python3 benchmarks/compare_hf_gemma4_unified.py
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from compare_audio import sound  # noqa: E402
from compare_hf_conformers import convert, row, run  # noqa: E402

from pyllm.audio import open_audio_encoder  # noqa: E402
from pyllm.vision import VisionEncoder  # noqa: E402

MAKE = r'''
import json, sys
import torch
from transformers import Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration
job = json.load(sys.stdin)
torch.manual_seed(job["seed"])
cfg = Gemma4UnifiedConfig(
    text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=32, global_head_dim=32, vocab_size=512),
    vision_config=dict(patch_size=job["patch"], pooling_kernel_size=3, mm_embed_dim=job["n_embd"],
                       mm_posemb_size=64, output_proj_dims=job["n_embd"]),
    audio_config=dict(audio_embed_dim=640))
m = Gemma4UnifiedForConditionalGeneration(cfg).eval()
with torch.no_grad():
    for name, p in m.named_parameters():
        if "embed_vision" in name or "embed_audio" in name:
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 1.0 / p.shape[-1] ** 0.5)
                    + (1.0 if p.ndim == 1 and "bias" not in name else 0.0))
m.save_pretrained(job["dir"])
json.dump({"image_mean": [0.0] * 3, "image_std": [1.0] * 3}, open(job["dir"] + "/preprocessor_config.json", "w"))
'''

PICTURE = r'''
import json, sys, types
import numpy as np, torch
from transformers import Gemma4UnifiedForConditionalGeneration
if "torchvision" not in sys.modules:    # only its resizing needs torchvision (none built for every torch)
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2",
                 "torchvision.transforms.v2.functional"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["torchvision.transforms.v2.functional"].InterpolationMode = object
from transformers.models.gemma4_unified.image_processing_gemma4_unified import convert_image_to_patches, patches_merge
job = json.load(sys.stdin)
m = Gemma4UnifiedForConditionalGeneration.from_pretrained(job["dir"]).eval()
image = torch.from_numpy(np.load(job["pixels"]))                  # [3, H, W] in [0, 1]
p, k = job["patch"], 3
teacher = convert_image_to_patches(image, p)
gh, gw = image.shape[1] // p, image.shape[2] // p
xy = torch.stack(torch.meshgrid(torch.arange(gw), torch.arange(gh), indexing="xy"), dim=-1).reshape(-1, 2)
merged, positions = patches_merge(teacher[None], xy[None], teacher.shape[0] // k ** 2)
with torch.no_grad():
    out = m.model.get_image_features(merged, positions)
np.save(job["out"], out.pooler_output[0].numpy())
'''

SOUND = r'''
import json, sys
import numpy as np, torch
from transformers import Gemma4UnifiedForConditionalGeneration
from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor
job = json.load(sys.stdin)
m = Gemma4UnifiedForConditionalGeneration.from_pretrained(job["dir"]).eval()
f = Gemma4UnifiedAudioFeatureExtractor()(np.load(job["samples"]), return_tensors="pt")
with torch.no_grad():
    out = m.model.embed_audio(f["input_features"])
np.save(job["out"], out[0][f["input_features_mask"][0]].numpy())
'''


def picture(width: int, height: int, seed: int):
    """A picture with shapes and noise in it (not flat: the layer norms see real spread)."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) % 97) * 2], axis=-1)
    return Image.fromarray(np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8))


def main() -> None:
    hf, llama = os.environ.get("PYLLM_HF_PYTHON"), os.environ.get("PYLLM_LLAMA_CPP")
    if not hf or not llama:
        sys.exit("set PYLLM_HF_PYTHON (a python with torch and transformers) and PYLLM_LLAMA_CPP (a llama.cpp tree)")
    d = Path(tempfile.mkdtemp(prefix="pyllm-hf-gemma4u-"))
    print(f"{'embedder':<22}{'input':>12}{'':>16}{'rows':>8}{'max |row diff|':>16}{'of max':>10}{'cosine':>10}")
    mm = d / "mmproj.gguf"
    for patch, n_embd, outtype in ((4, 96, "f32"), (16, 256, "f16")):
        run(hf, MAKE, {"seed": 3, "patch": patch, "n_embd": n_embd, "dir": str(d / "hf")})
        convert(hf, llama, d / "hf", mm, outtype)
        enc = VisionEncoder(str(mm), n_threads=2)
        for w, h in ((640, 480), (300, 900)):
            tile = enc.tiles(picture(w, h, seed=w))[0]
            pixels = enc.normalize(tile)                       # mean 0, std 1: v / 255
            np.save(d / "pixels.npy", pixels)
            run(hf, PICTURE, {"dir": str(d / "hf"), "pixels": str(d / "pixels.npy"), "patch": patch,
                              "out": str(d / "rows.npy")})
            row(f"gemma4uv {n_embd}, {outtype}", f"{w}x{h}", None, enc.encode_pixels(pixels), np.load(d / "rows.npy"))
        enc.close()
        enc = open_audio_encoder(str(mm), n_threads=2)
        for seconds, loud in ((2.5, 1.0), (20.01, 1.0), (2.5, 0.01)):
            samples = (sound(seconds) * loud).astype(np.float32)
            np.save(d / "samples.npy", samples)
            run(hf, SOUND, {"dir": str(d / "hf"), "samples": str(d / "samples.npy"), "out": str(d / "rows.npy")})
            row(f"gemma4ua, {outtype}", f"{seconds:g} s" + (" quiet" if loud < 1 else ""), None, enc.encode(samples),
                np.load(d / "rows.npy"))
        enc.close()


if __name__ == "__main__":
    main()
