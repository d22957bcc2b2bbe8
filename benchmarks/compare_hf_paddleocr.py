#!/usr/bin/env python3
"""PaddleOCR-VL's image encoder and projector (vision.py "paddleocr") against transformers' own:
a small random PaddleOCRVLForConditionalGeneration (every encoder and projector weight random),
saved as transformers saves it and converted by llama.cpp's own converter
(convert_hf_to_gguf.py --mmproj), so pyllm reads the very file llama.cpp would. The same pixels
(patches in raster order, as its processor gives them) through get_image_features and through
VisionEncoder.encode_pixels, on grids smaller than the 6 x 6 table of positions (shrunk), its
size, and larger (grown): transformers resizes the table by plain bilinear interpolation, as
pyllm does (llama.cpp's mtmd antialiases it, which only a shrunk table shows).

    PYLLM_HF_PYTHON=/tmp/hf-venv/bin/python PYLLM_LLAMA_CPP=/path/to/llama.cpp \\
        python3 benchmarks/compare_hf_paddleocr.py
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from compare_hf_conformers import convert, row, run  # noqa: E402

from pyllm.vision import VisionEncoder  # noqa: E402

MAKE = r'''
import json, sys
import torch
from transformers import PaddleOCRVLConfig, PaddleOCRVLForConditionalGeneration
job = json.load(sys.stdin)
torch.manual_seed(job["seed"])
cfg = PaddleOCRVLConfig(
    text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=512),
    vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                       patch_size=14, image_size=84, spatial_merge_size=2))
m = PaddleOCRVLForConditionalGeneration(cfg).eval()
with torch.no_grad():
    for name, p in m.named_parameters():
        if "visual" in name or "projector" in name:
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 1.0 / p.shape[-1] ** 0.5)
                    + (1.0 if p.ndim == 1 and "norm" in name and "bias" not in name else 0.0))
m.save_pretrained(job["dir"])
c = json.load(open(job["dir"] + "/config.json"))
c["vision_config"]["architectures"] = ["PaddleOCRVisionModel"]     # the converter's name for the mmproj part
json.dump(c, open(job["dir"] + "/config.json", "w"))
json.dump({"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "min_pixels": 8 * 784, "max_pixels": 1024 * 784},
          open(job["dir"] + "/preprocessor_config.json", "w"))
'''

ROWS = r'''
import json, sys
import numpy as np, torch
from transformers import PaddleOCRVLForConditionalGeneration
job = json.load(sys.stdin)
m = PaddleOCRVLForConditionalGeneration.from_pretrained(job["dir"]).eval()
px = torch.from_numpy(np.load(job["pixels"]))                        # [3, H, W]
p = 14
gh, gw = px.shape[1] // p, px.shape[2] // p
patches = px.reshape(3, gh, p, gw, p).permute(1, 3, 0, 2, 4).reshape(gh * gw, 3, p, p)
with torch.no_grad():
    out = m.model.get_image_features(patches, torch.tensor([[1, gh, gw]]))
np.save(job["out"], out.pooler_output[0].numpy())
'''


def main() -> None:
    hf, llama = os.environ.get("PYLLM_HF_PYTHON"), os.environ.get("PYLLM_LLAMA_CPP")
    if not hf or not llama:
        sys.exit("set PYLLM_HF_PYTHON (a python with torch and transformers) and PYLLM_LLAMA_CPP (a llama.cpp tree)")
    d = Path(tempfile.mkdtemp(prefix="pyllm-hf-paddleocr-"))
    print(f"{'encoder':<22}{'grid':>12}{'':>16}{'rows':>8}{'max |row diff|':>16}{'of max':>10}{'cosine':>10}")
    mm = d / "mmproj.gguf"
    run(hf, MAKE, {"seed": 4, "dir": str(d / "hf")})
    for outtype in ("f32", "f16"):
        convert(hf, llama, d / "hf", mm, outtype)
        enc = VisionEncoder(str(mm), n_threads=2)
        for gh, gw in ((2, 10), (4, 6), (6, 6), (8, 12), (24, 18)):
            pixels = np.random.default_rng(gh * 100 + gw).uniform(-1, 1, (3, 14 * gh, 14 * gw)).astype(np.float32)
            np.save(d / "pixels.npy", pixels)
            run(hf, ROWS, {"dir": str(d / "hf"), "pixels": str(d / "pixels.npy"), "out": str(d / "rows.npy")})
            row(f"paddleocr, {outtype}", f"{gh} x {gw}", None, enc.encode_pixels(pixels), np.load(d / "rows.npy"))
        enc.close()


if __name__ == "__main__":
    main()
