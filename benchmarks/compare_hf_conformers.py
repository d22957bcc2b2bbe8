#!/usr/bin/env python3
"""pyllm's conformer audio encoders (pyllm/conformer.py) against transformers' own: small random
Gemma4ForConditionalGeneration (an audio tower, its clips at +-3 so they act) and
GraniteSpeechForConditionalGeneration / GraniteSpeechPlusForConditionalGeneration models (every
encoder and projector weight random, batch norms with random statistics), saved as transformers
saves them and converted by llama.cpp's own converter (convert_hf_to_gguf.py --mmproj), so pyllm
reads the very file llama.cpp would. Compared: Gemma 4's spectrogram (Gemma4AudioFeatureExtractor
against gemma4_log_mel), and the rows of both (get_audio_features on the same spectrogram against
encode_mel: Gemma 4's extractor's, Granite's pyllm's, as its extractor needs torchaudio, which has
no build for this torch).

    PYLLM_HF_PYTHON=/tmp/hf-venv/bin/python PYLLM_LLAMA_CPP=/path/to/llama.cpp \
        python3 benchmarks/compare_hf_conformers.py
    (/tmp/hf-venv: torch and transformers >= 5; PYLLM_LLAMA_CPP: a llama.cpp source tree, e.g.
    the one vendored in llama-cpp-python's sdist)
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
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from compare_audio import sound  # noqa: E402

from pyllm.audio import open_audio_encoder  # noqa: E402

MAKE = r'''
import json, sys
import torch
from transformers import Gemma4Config, Gemma4ForConditionalGeneration
job = json.load(sys.stdin)
torch.manual_seed(job["seed"])
cfg = Gemma4Config(
    text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=32, global_head_dim=32, hidden_size_per_layer_input=16),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=2, head_dim=16),
    audio_config=dict(hidden_size=job["n_embd"], num_hidden_layers=2, num_attention_heads=4,
                      subsampling_conv_channels=[128, 32], output_proj_dims=96))
m = Gemma4ForConditionalGeneration(cfg).eval()
with torch.no_grad():
    for name, p in m.named_parameters():
        if "audio" in name:
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 1.0 / p.shape[-1] ** 0.5)
                    + (1.0 if "norm" in name and p.ndim == 1 else 0.0))
    for name, b in m.named_buffers():
        if "audio_tower" in name and ("input_m" in name or "output_m" in name):
            b.fill_(3.0 if name.endswith("max") else -3.0)
m.save_pretrained(job["dir"])
json.dump({"image_mean": [0.0] * 3, "image_std": [1.0] * 3}, open(job["dir"] + "/preprocessor_config.json", "w"))
'''

GRANITE = r'''
import json, sys
import torch
import transformers
job = json.load(sys.stdin)
torch.manual_seed(job["seed"])
plus = job["plus"]
enc = dict(input_dim=160, num_layers=4, hidden_dim=64, feedforward_mult=4, num_heads=4, output_dim=42,
           context_size=20, max_pos_emb=32, dropout=0.0, conv_kernel_size=15, conv_expansion_factor=2)
if plus:
    enc["cat_hidden_layers"] = [1, 3]
kind = "GraniteSpeechPlus" if plus else "GraniteSpeech"
cfg = getattr(transformers, kind + "Config")(
    text_config=dict(model_type="granite", hidden_size=96, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, vocab_size=512),
    encoder_config=enc,
    projector_config=dict(model_type="blip_2_qformer", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, encoder_hidden_size=64 * (3 if plus else 1),
                          cross_attention_frequency=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    window_size=15, downsample_rate=5)
m = getattr(transformers, kind + "ForConditionalGeneration")(cfg).eval()
with torch.no_grad():
    for name, p in m.named_parameters():
        if "language_model" not in name and "lm_head" not in name:
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 1.0 / p.shape[-1] ** 0.5)
                    + (1.0 if ("norm" in name or "LayerNorm" in name) and name.endswith("weight") else 0.0))
    for name, b in m.named_buffers():
        if "running_var" in name:
            b.copy_(torch.rand_like(b) + 0.5)
        elif "running_mean" in name:
            b.copy_(torch.randn_like(b) * 0.2)
m.save_pretrained(job["dir"])
json.dump({"feature_extractor_type": "GraniteSpeechFeatureExtractor"}, open(job["dir"] + "/preprocessor_config.json", "w"))
'''

GRANITE_ROWS = r'''
import json, sys
import numpy as np
import torch
import transformers
job = json.load(sys.stdin)
kind = "GraniteSpeechPlus" if job["plus"] else "GraniteSpeech"
m = getattr(transformers, kind + "ForConditionalGeneration").from_pretrained(job["dir"]).eval()
with torch.no_grad():
    out = m.model.get_audio_features(torch.tensor(np.load(job["mel"]))[None])
np.save(job["out"], out.pooler_output[0].numpy())
'''

ROWS = r'''
import json, sys
import numpy as np
import torch
from transformers import Gemma4ForConditionalGeneration
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
job = json.load(sys.stdin)
m = Gemma4ForConditionalGeneration.from_pretrained(job["dir"]).eval()
f = Gemma4AudioFeatureExtractor()([np.load(job["samples"])], return_tensors="pt")
mel, mask = f["input_features"], f["input_features_mask"]
with torch.no_grad():
    out = m.model.get_audio_features(mel, mask)
np.save(job["out"] + ".mel.npy", mel[0][mask[0]].numpy())
np.save(job["out"], out.pooler_output[0][out.attention_mask[0]].numpy())
'''


def run(python: str, script: str, job: dict) -> None:
    r = subprocess.run([python, "-c", script], input=json.dumps(job), capture_output=True, text=True, timeout=900)
    if r.returncode:
        sys.exit(r.stderr[-3000:])


def convert(hf: str, llama: str, src: Path, out: Path, outtype: str) -> None:
    r = subprocess.run([hf, str(Path(llama) / "convert_hf_to_gguf.py"), str(src), "--mmproj", "--outtype", outtype,
                        "--outfile", str(out)], capture_output=True, text=True, timeout=900)
    if r.returncode:
        sys.exit(r.stderr[-3000:])


def row(name: str, label: str, mel_diff, ours: np.ndarray, theirs: np.ndarray) -> None:
    if ours.shape != theirs.shape:
        print(f"{name:<22}{label:>12}   rows {ours.shape} against transformers' {theirs.shape}")
        return
    cos = float((ours * theirs).sum() / np.linalg.norm(ours) / np.linalg.norm(theirs))
    diff = np.abs(ours - theirs).max()
    mel = "-" if mel_diff is None else f"{mel_diff:.2e}"
    print(f"{name:<22}{label:>12}{mel:>16}{len(ours):>8}{diff:>16.2e}{diff / np.abs(theirs).max():>10.2e}{cos:>10.6f}")


SOUNDS = ((2.5, 1.0), (20.0, 1.0), (2.5, 0.01))


def main() -> None:
    hf, llama = os.environ.get("PYLLM_HF_PYTHON"), os.environ.get("PYLLM_LLAMA_CPP")
    if not hf or not llama:
        sys.exit("set PYLLM_HF_PYTHON (a python with torch and transformers) and PYLLM_LLAMA_CPP (a llama.cpp tree)")
    d = Path(tempfile.mkdtemp(prefix="pyllm-hf-conformers-"))
    print(f"{'encoder':<22}{'sound':>12}{'mel max |diff|':>16}{'rows':>8}{'max |row diff|':>16}{'of max':>10}"
          f"{'cosine':>10}")
    mm = d / "mmproj.gguf"
    for n_embd, outtype in ((64, "f32"), (128, "f16")):
        run(hf, MAKE, {"seed": 5, "n_embd": n_embd, "dir": str(d / "hf")})
        convert(hf, llama, d / "hf", mm, outtype)
        enc = open_audio_encoder(str(mm), n_threads=2)
        for seconds, loud in SOUNDS:
            samples = (sound(seconds) * loud).astype(np.float32)
            np.save(d / "samples.npy", samples)
            run(hf, ROWS, {"dir": str(d / "hf"), "samples": str(d / "samples.npy"), "out": str(d / "rows.npy")})
            mel_hf, theirs = np.load(d / "rows.npy.mel.npy"), np.load(d / "rows.npy")
            mel_diff = np.abs(enc.log_mel(samples)[0] - mel_hf).max()
            row(f"gemma4a {n_embd}, {outtype}", f"{seconds:g} s" + (" quiet" if loud < 1 else ""), mel_diff,
                enc.encode_mel([mel_hf.astype(np.float32)]), theirs)
        enc.close()
    for plus, outtype in ((False, "f32"), (True, "f32"), (False, "f16")):
        hf_dir = d / ("granite-plus" if plus else "granite")
        run(hf, GRANITE, {"seed": 5, "plus": plus, "dir": str(hf_dir)})
        convert(hf, llama, hf_dir, mm, outtype)
        enc = open_audio_encoder(str(mm), n_threads=2)
        for seconds, loud in SOUNDS:
            mel = enc.log_mel((sound(seconds) * loud).astype(np.float32))[0]
            np.save(d / "mel.npy", mel)
            run(hf, GRANITE_ROWS, {"dir": str(hf_dir), "plus": plus, "mel": str(d / "mel.npy"),
                                   "out": str(d / "rows.npy")})
            row(f"granite{' plus' if plus else ''}, {outtype}", f"{seconds:g} s" + (" quiet" if loud < 1 else ""),
                None, enc.encode_mel([mel]), np.load(d / "rows.npy"))
        enc.close()


if __name__ == "__main__":
    main()
