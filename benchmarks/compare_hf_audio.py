#!/usr/bin/env python3
"""pyllm's audio encoders against transformers' own models: WhisperFeatureExtractor's log-mel
spectrogram, and the rows of Qwen2-Audio's and Voxtral's encoders and projectors.

llama.cpp's mtmd, at this writing, aborts on Voxtral ("expected output 187 tokens, got 188":
it averages Voxtral's rows two by two, which transformers' VoxtralEncoder does not), so pyllm
reads Voxtral as transformers does; this checks that, and Qwen2-Audio's reading (which mtmd
shares), against transformers itself: small random Qwen2AudioForConditionalGeneration and
VoxtralForConditionalGeneration models (in a Python with torch and transformers, given by
PYLLM_HF_PYTHON), their weights written as llama.cpp's converter lays out an mmproj file, the
same mel through both (the extractor's, so the encoders are compared alone), and the rows
compared (get_audio_features against AudioEncoder.encode_mel). The spectrograms are compared
apart: the extractor floors a power at 1e-10 before its log, mtmd (and pyllm) at 2^-24, which
shows only where a frame is nearly silent and the sound is quiet.

    PYLLM_HF_PYTHON=/tmp/hf-venv/bin/python python3 benchmarks/compare_hf_audio.py
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
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from compare_audio import sound  # noqa: E402

from pyllm.audio import AudioEncoder, log_mel  # noqa: E402

HF = r'''
import json, sys
import numpy as np
import torch
from transformers import WhisperFeatureExtractor
job = json.load(sys.stdin)
torch.manual_seed(job["seed"])
n_mel = job["n_mel"]
samples = np.load(job["samples"])
mel = WhisperFeatureExtractor(feature_size=n_mel)(samples, sampling_rate=16000, return_tensors="np")["input_features"]
np.save(job["out"] + ".mel.npy", mel[0])
a = dict(num_mel_bins=n_mel, d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256)
if job["kind"] == "qwen2a":
    from transformers import Qwen2AudioConfig, Qwen2AudioEncoderConfig, Qwen2AudioForConditionalGeneration, Qwen2Config
    cfg = Qwen2AudioConfig(audio_config=Qwen2AudioEncoderConfig(**a),
                           text_config=Qwen2Config(hidden_size=256, intermediate_size=128, num_hidden_layers=1,
                                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512))
    model = Qwen2AudioForConditionalGeneration(cfg)
else:
    from transformers import LlamaConfig, VoxtralConfig, VoxtralEncoderConfig, VoxtralForConditionalGeneration
    cfg = VoxtralConfig(audio_config=VoxtralEncoderConfig(**a, hidden_size=64, intermediate_size=256,
                                                          num_attention_heads=4, num_hidden_layers=2),
                        text_config=LlamaConfig(hidden_size=256, intermediate_size=128, num_hidden_layers=1,
                                                num_attention_heads=4, num_key_value_heads=4, vocab_size=512))
    model = VoxtralForConditionalGeneration(cfg)
model.eval()
with torch.no_grad():   # every weight random (initializers leave norms at 1 and biases 0)
    for name, p in model.named_parameters():
        if "language_model" not in name and "lm_head" not in name:
            p.copy_(torch.randn_like(p) * (0.1 if p.ndim == 1 else 1.0 / max(p[0].numel(), 1) ** 0.5)
                    + (1.0 if name.endswith("layer_norm.weight") else 0.0))
    feats = torch.tensor(mel)
    inner = getattr(model, "model", model)    # transformers 5 keeps the towers in model.model
    if job["kind"] == "qwen2a":
        rows = inner.multi_modal_projector(inner.audio_tower(feats).last_hidden_state)[0]
    else:
        rows = inner.get_audio_features(feats).pooler_output
np.save(job["out"], rows.float().numpy())
np.savez(job["weights"], **{k: t.float().numpy() for k, t in model.state_dict().items()
                            if "language_model" not in k and "lm_head" not in k})
'''

# transformers' names -> llama.cpp's (its converter's tensor map for Whisper encoders)
NAMES = {"conv1": "a.conv1d.1", "conv2": "a.conv1d.2", "embed_positions": "a.position_embd", "layer_norm": "a.post_ln",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.out_proj": "attn_out", "self_attn_layer_norm": "ln1", "final_layer_norm": "ln2",
         "fc1": "ffn_up", "fc2": "ffn_down"}


def gguf_name(hf: str) -> str | None:
    """A transformers weight's name in an mmproj file (None: not one of the encoder's)."""
    name, _, suffix = hf.removeprefix("model.").rpartition(".")
    if name.startswith("multi_modal_projector."):
        part = name.split(".", 1)[1]
        return {"linear": "mm.a.fc", "linear_1": "mm.a.mlp.1", "linear_2": "mm.a.mlp.2"}[part] + "." + suffix
    if not name.startswith("audio_tower.") or "avg_pooler" in name:
        return None
    name = name[len("audio_tower."):]
    if name.startswith("layers."):
        _, i, rest = name.split(".", 2)
        return f"a.blk.{i}.{NAMES[rest]}.{suffix}"
    return f"{NAMES[name]}.{suffix}"


def write_mmproj(path: Path, weights: dict, kind: str, n_mel: int) -> None:
    """The weights as llama.cpp's converter writes an audio mmproj file (the convolutions' weights
    F16, their biases [1, n], the rest F32)."""
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_vision_encoder", False)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_string("clip.projector_type", kind)
    for key, v in (("embedding_length", 64), ("feed_forward_length", 256), ("block_count", 2),
                   ("attention.head_count", 4), ("num_mel_bins", n_mel), ("projection_dim", 256)):
        w.add_uint32("clip.audio." + key, v)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    if kind == "voxtral":
        w.add_uint32("clip.audio.projector.stack_factor", 4)
    for hf, a in weights.items():
        name = gguf_name(hf)
        if name is None:
            continue
        if name.startswith("a.conv1d") and name.endswith(".bias"):
            a = a[:, None]
        if name.startswith("a.conv1d") and name.endswith(".weight"):
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    hf = os.environ.get("PYLLM_HF_PYTHON")
    if not hf:
        sys.exit("set PYLLM_HF_PYTHON to a python with torch and transformers")
    d = Path(tempfile.mkdtemp(prefix="pyllm-hf-audio-"))
    print(f"{'model':<14}{'sound':>8}{'mel max |diff|':>16}{'rows':>12}{'max |row diff|':>16}{'of max':>10}"
          f"{'cosine':>10}")
    for kind in ("qwen2a", "voxtral"):
        for seconds, loud in ((2.5, 1.0), (20.0, 1.0), (2.5, 0.01)):
            n_mel = 128 if kind == "voxtral" else 80
            samples = (sound(seconds) * loud).astype(np.float32)
            np.save(d / "samples.npy", samples)
            job = {"kind": kind, "seed": 5, "n_mel": n_mel, "samples": str(d / "samples.npy"), "out": str(d / "rows.npy"),
                   "weights": str(d / "w.npz")}
            r = subprocess.run([hf, "-c", HF], input=json.dumps(job), capture_output=True, text=True, timeout=900)
            if r.returncode:
                sys.exit(r.stderr[-3000:])
            mel_hf = np.load(d / "rows.npy.mel.npy")
            ours_mel = log_mel(samples, n_mel)[0]
            write_mmproj(d / "mm.gguf", dict(np.load(d / "w.npz")), kind, n_mel)
            enc = AudioEncoder(d / "mm.gguf", n_threads=2)
            ours = enc.encode_mel([mel_hf.astype(np.float32)])
            enc.close()
            theirs = np.load(d / "rows.npy")
            label = f"{seconds:g} s" + (" quiet" if loud < 1 else "")
            if ours.shape != theirs.shape:
                print(f"{kind:<14}{label:>8}   rows {ours.shape} against transformers' {theirs.shape}")
                continue
            cos = float((ours * theirs).sum() / np.linalg.norm(ours) / np.linalg.norm(theirs))
            diff = np.abs(ours - theirs).max()
            print(f"{kind:<14}{label:>8}{np.abs(ours_mel - mel_hf).max():>16.2e}{len(ours):>12}{diff:>16.2e}"
                  f"{diff / np.abs(theirs).max():>10.2e}{cos:>10.6f}")


if __name__ == "__main__":
    main()
