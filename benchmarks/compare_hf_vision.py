#!/usr/bin/env python3
"""pyllm's LLaVA 1.5 / 1.6 and InternVL image encoders against transformers' own models, the
reference the projectors were trained with (LLaVA 1.6: also the processor's tiles and
LLaVA-NeXT's packing of their rows).

llama.cpp's mtmd, at this writing, reads the class row of both encoders after the patches and
runs LLaVA's one layer short (its issues 25814, 25817); pyllm reads them as transformers does.
This checks that claim against transformers itself: small random LlavaForConditionalGeneration
and InternVLForConditionalGeneration models (in a Python with torch and transformers, given by
PYLLM_HF_PYTHON), their weights written as llama.cpp's converters lay out an mmproj file (LLaVA:
the legacy converter's, which drops CLIP's last layer; InternVL: convert_hf_to_gguf's), the same
pixels through both, and the image rows compared (get_image_features against
VisionEncoder.encode_pixels). transformers' GELU is erf's, pyllm's and llama.cpp's the tanh form:
that, not the layout, is what is left between them.

    PYLLM_HF_PYTHON=/tmp/hf-venv/bin/python python3 benchmarks/compare_hf_vision.py
    (/tmp/hf-venv: python3 -m venv /tmp/hf-venv && /tmp/hf-venv/bin/pip install torch transformers)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from pyllm.vision import VisionEncoder  # noqa: E402

HF = r'''
import json, sys
import numpy as np
import torch
job = json.load(sys.stdin)
torch.manual_seed(job["seed"])
v = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, image_size=job["image_size"], patch_size=4)
text = dict(hidden_size=256, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, vocab_size=512)
extra = {}
if job["kind"] == "llava-next":    # LLaVA 1.6: its grids, the newline row; the processor's pixels as well
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,
                              LlavaNextImageProcessorPil)
    from PIL import Image
    S = job["image_size"]
    cfg = LlavaNextConfig(vision_config=CLIPVisionConfig(num_hidden_layers=4, hidden_act="quick_gelu", **v),
                          text_config=LlamaConfig(num_key_value_heads=4, **text), image_token_index=511,
                          image_grid_pinpoints=job["pinpoints"])
    model = LlavaNextForConditionalGeneration(cfg)
    proc = LlavaNextImageProcessorPil(size={"shortest_edge": S}, crop_size={"height": S, "width": S},
                                      image_grid_pinpoints=job["pinpoints"], image_mean=[0.5] * 3, image_std=[0.5] * 3)
    got = proc(images=Image.fromarray(np.load(job["image"])), return_tensors="pt")
    np.save(job["out"] + ".pixels.npy", got["pixel_values"][0].numpy())
    extra["image_sizes"] = got["image_sizes"]
elif job["kind"] == "llava":
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration
    cfg = LlavaConfig(vision_config=CLIPVisionConfig(num_hidden_layers=4, hidden_act="quick_gelu", **v),
                      text_config=LlamaConfig(num_key_value_heads=4, **text), image_token_index=511)
    model = LlavaForConditionalGeneration(cfg)
else:
    from transformers import InternVLConfig, InternVLForConditionalGeneration, InternVLVisionConfig, Qwen2Config
    cfg = InternVLConfig(vision_config=InternVLVisionConfig(num_hidden_layers=3, attention_bias=True, **v),
                         text_config=Qwen2Config(num_key_value_heads=2, **text))
    model = InternVLForConditionalGeneration(cfg)
model.eval()
with torch.no_grad():   # every weight random (initializers leave norms at 1, layer scales small, biases 0)
    for name, p in model.named_parameters():
        if "language_model" not in name and "lm_head" not in name:
            p.copy_(torch.randn_like(p) * (0.1 if p.ndim == 1 else 1.0 / max(p.shape[-1], 1) ** 0.5)
                    + (1.0 if name.endswith(("norm1.weight", "norm2.weight", "layrnorm.weight", "before.weight",
                                              "after.weight", "layer_norm.weight")) else 0.0))
    px = torch.tensor(np.load(job["pixels"])) if job["pixels"] else got["pixel_values"]   # "": the processor's
    rows = model.model.get_image_features(pixel_values=px, **extra).pooler_output
    rows = torch.cat(list(rows)) if isinstance(rows, (list, tuple)) else rows.reshape(-1, rows.shape[-1])
np.save(job["out"], rows.float().numpy())
np.savez(job["weights"], **{k: t.float().numpy() for k, t in model.state_dict().items()
                            if "language_model" not in k and "lm_head" not in k})
'''


def write_llava(path: str, w: dict, image_size: int, pinpoints: list = ()) -> None:
    """The legacy LLaVA converter's mmproj: CLIP without its last layer (LLaVA reads the one before),
    fc1 named ffn_down and fc2 ffn_up as it names them; LLaVA 1.6's: its grids (flattened) and
    newline row."""
    p = "model.vision_tower."
    n_layer = 1 + max(int(k.split(".")[4]) for k in w if ".layers." in k)
    out = gguf.GGUFWriter(path, "clip")
    keys(out, "mlp", w[p + "embeddings.class_embedding"].shape[0], 96, n_layer - 1, image_size, 1e-5, gelu=False)
    if pinpoints:
        out.add_array("clip.vision.image_grid_pinpoints", [v for pair in pinpoints for v in pair])
        out.add_string("clip.vision.mm_patch_merge_type", "spatial_unpad")
        out.add_tensor("model.image_newline", w["model.image_newline"])
    out.add_tensor("v.class_embd", w[p + "embeddings.class_embedding"])
    out.add_tensor("v.patch_embd.weight", w[p + "embeddings.patch_embedding.weight"].astype(np.float16))
    out.add_tensor("v.position_embd.weight", w[p + "embeddings.position_embedding.weight"])
    out.add_tensor("v.pre_ln.weight", w[p + "pre_layrnorm.weight"])
    out.add_tensor("v.pre_ln.bias", w[p + "pre_layrnorm.bias"])
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2", "mlp.fc1": "ffn_down",
             "mlp.fc2": "ffn_up"}
    for i in range(n_layer - 1):
        for hf, ours in names.items():
            for kind in ("weight", "bias"):
                out.add_tensor(f"v.blk.{i}.{ours}.{kind}", w[f"{p}encoder.layers.{i}.{hf}.{kind}"])
    for hf, ours in (("linear_1", "mm.0"), ("linear_2", "mm.2")):
        for kind in ("weight", "bias"):
            out.add_tensor(f"{ours}.{kind}", w[f"model.multi_modal_projector.{hf}.{kind}"])
    finish(out)


def write_internvl(path: str, w: dict, image_size: int) -> None:
    """convert_hf_to_gguf's InternVL mmproj (the -hf model's names)."""
    p = "model.vision_tower."
    n_layer = 1 + max(int(k.split(".")[4]) for k in w if ".layer." in k)
    n = w[p + "embeddings.cls_token"].size
    out = gguf.GGUFWriter(path, "clip")
    keys(out, "internvl", n, 96, n_layer, image_size, 1e-6, gelu=True)
    out.add_uint32("clip.vision.projector.scale_factor", 2)
    out.add_tensor("v.class_embd", w[p + "embeddings.cls_token"].reshape(n))
    out.add_tensor("v.patch_embd.weight", w[p + "embeddings.patch_embeddings.projection.weight"].astype(np.float16))
    out.add_tensor("v.patch_embd.bias", w[p + "embeddings.patch_embeddings.projection.bias"])
    out.add_tensor("v.position_embd.weight", w[p + "embeddings.position_embeddings"].reshape(-1, n))
    names = {"attention.q_proj": "attn_q", "attention.k_proj": "attn_k", "attention.v_proj": "attn_v",
             "attention.projection_layer": "attn_out", "layernorm_before": "ln1", "layernorm_after": "ln2",
             "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
    for i in range(n_layer):
        for hf, ours in names.items():
            for kind in ("weight", "bias"):
                out.add_tensor(f"v.blk.{i}.{ours}.{kind}", w[f"{p}encoder.layer.{i}.{hf}.{kind}"])
        out.add_tensor(f"v.blk.{i}.ls1.weight", w[f"{p}encoder.layer.{i}.lambda_1"])
        out.add_tensor(f"v.blk.{i}.ls2.weight", w[f"{p}encoder.layer.{i}.lambda_2"])
    for hf, ours in (("layer_norm", "mm.model.mlp.0"), ("linear_1", "mm.model.mlp.1"), ("linear_2", "mm.model.mlp.3")):
        for kind in ("weight", "bias"):
            out.add_tensor(f"{ours}.{kind}", w[f"model.multi_modal_projector.{hf}.{kind}"])
    finish(out)


def keys(out: gguf.GGUFWriter, projector: str, n: int, n_ff: int, n_layer: int, image_size: int, eps: float,
         gelu: bool) -> None:
    out.add_bool("clip.has_vision_encoder", True)
    out.add_string("clip.projector_type", projector)
    out.add_bool("clip.use_gelu", gelu)
    for key, value in (("image_size", image_size), ("patch_size", 4), ("embedding_length", n),
                       ("feed_forward_length", n_ff), ("block_count", n_layer), ("attention.head_count", 4)):
        out.add_uint32("clip.vision." + key, value)
    out.add_float32("clip.vision.attention.layer_norm_epsilon", eps)
    out.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    out.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])


def finish(out: gguf.GGUFWriter) -> None:
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()


PINPOINTS = [[32, 64], [64, 32], [64, 64], [96, 32], [32, 96]]    # LLaVA 1.6's, at a 32-pixel square


def llava_next(python: str, t: Path, seed: int) -> None:
    """LLaVA 1.6 on a picture: pyllm's pixels against transformers' processor's, and its rows
    (from pyllm's pixels, through the grid, unpadded, with newline rows) against LLaVA-NeXT's."""
    from PIL import Image
    shape = [(20, 45, 3), (70, 33, 3), (50, 50, 3)][seed - 1]
    rgb = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    np.save(t / "img.npy", rgb)
    S = 32
    # the processor's grid: a first writing gives the encoder; its inputs then go to transformers
    job = {"kind": "llava-next", "seed": seed, "image_size": S, "pinpoints": PINPOINTS, "image": str(t / "img.npy"),
           "pixels": "", "out": str(t / "rows.npy"), "weights": str(t / "w.npz")}
    for _ in range(2):    # the first run writes the weights and the processor's pixels; the second gets our pixels
        r = subprocess.run([python, "-c", HF], input=json.dumps(job), capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"transformers failed:\n{r.stderr[-3000:]}")
        path = str(t / "next.gguf")
        write_llava(path, dict(np.load(t / "w.npz")), S, PINPOINTS)
        enc = VisionEncoder(path, n_threads=2)
        img = Image.fromarray(rgb)
        tiles = [enc.normalize(x) for x in enc.tiles(img)]
        ours_px = np.stack(tiles[-1:] + tiles[:-1])          # the whole first, as transformers orders them
        np.save(t / "px.npy", ours_px[None])
        job["pixels"] = str(t / "px.npy")
    theirs_px = np.load(str(t / "rows.npy") + ".pixels.npy")
    theirs, ours = np.load(t / "rows.npy"), enc.encode(img)
    px = f"{np.abs(ours_px - theirs_px).max():.2e}" if ours_px.shape == theirs_px.shape else \
        f"{list(ours_px.shape)} vs {list(theirs_px.shape)}"
    if ours.shape != theirs.shape:
        print(f"{'llava-1.6':<10} {seed:>4} rows {ours.shape} against transformers' {theirs.shape}")
    else:
        d = np.abs(ours - theirs).max()
        cos = float((ours * theirs).sum() / np.linalg.norm(ours) / np.linalg.norm(theirs))
        print(f"{'llava-1.6':<10} {seed:>4} {str(ours.shape):>9} {d:9.2e} {d / np.abs(theirs).max():8.1e} "
              f"{cos:9.6f}   (a {shape[1]} x {shape[0]} picture; pixels against the processor's: {px})")
    enc.close()


def main() -> None:
    python = os.environ.get("PYLLM_HF_PYTHON")
    if not python:
        raise SystemExit("set PYLLM_HF_PYTHON to a Python with torch and transformers (see the docstring)")
    print(f"{'model':<10} {'seed':>4} {'rows':>9} {'max|d|':>9} {'of max':>8} {'cosine':>9}   as mtmd orders it: cosine")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for kind, image_size, write in (("llava", 32, write_llava), ("internvl", 32, write_internvl)):
            for seed in (1, 2, 3):
                if kind == "llava":
                    llava_next(python, t, seed)
                pixels = np.random.default_rng(seed).uniform(-1, 1, (1, 3, image_size, image_size)).astype(np.float32)
                np.save(t / "px.npy", pixels)
                job = {"kind": kind, "seed": seed, "image_size": image_size, "pixels": str(t / "px.npy"),
                       "out": str(t / "rows.npy"), "weights": str(t / "w.npz")}
                r = subprocess.run([python, "-c", HF], input=json.dumps(job), capture_output=True, text=True)
                if r.returncode != 0:
                    raise SystemExit(f"transformers failed:\n{r.stderr[-3000:]}")
                theirs = np.load(t / "rows.npy")
                path = str(t / f"{kind}.gguf")
                write(path, dict(np.load(t / "w.npz")), image_size)
                enc = VisionEncoder(path, n_threads=2)
                ours = enc.encode_pixels(pixels[0])
                cos = float((ours * theirs).sum() / np.linalg.norm(ours) / np.linalg.norm(theirs))
                sys.path.insert(0, str(ROOT / "tests"))
                from test_vision import slow_internvl_encode, slow_llava_encode
                slow = slow_llava_encode if kind == "llava" else slow_internvl_encode
                mtmd = slow(enc, pixels[0].astype(np.float64), class_last=True)
                mtmd_cos = float((mtmd * theirs).sum() / np.linalg.norm(mtmd) / np.linalg.norm(theirs))
                d = np.abs(ours - theirs).max()
                print(f"{kind:<10} {seed:>4} {str(ours.shape):>9} {d:9.2e} {d / np.abs(theirs).max():8.1e} "
                      f"{cos:9.6f}   {mtmd_cos:9.6f}")
                enc.close()


if __name__ == "__main__":
    main()
