"""pyllm's audio encoders against llama.cpp's mtmd, on small random Whisper-encoder projectors
and Gemma 4 conformers written as llama.cpp's converters write them (tests/synth.py) beside a small
llama language model: for a made-up sound (a few seconds of tones and noise), the rows each
30 s chunk becomes (mtmd_encode_chunk against the encoder's encode), the prompt's layout, and
the logits after "<text> <sound> <text>" (mtmd_helper_eval_chunks against pyllm's chat path).

Run with PYLLM_PEER_PYTHON=/tmp/peer-venv/bin/python (../shared/peer/install-llama-cpp.sh).
Where mtmd refuses a projector (an error or an abort), the row says so. Words after the command
pick the rows whose names hold them. --speed [whisper-small|qwen3-asr|gemma4|granite|lfm2a]: instead, times 30 s
of sound through an encoder of a real model's size, pyllm and mtmd alternating.
"""
from __future__ import annotations

import functools
import itertools
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

from pyllm import Model  # noqa: E402
from pyllm.audio import open_audio_encoder, wav_bytes  # noqa: E402

PROMPT = "hello there <__media__> what is this sound"

PEER = r'''
import ctypes, json, sys
import numpy as np
import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
job = json.load(sys.stdin)
m = llama_cpp.Llama(model_path=job["lm"], n_ctx=4096, n_batch=512, n_ubatch=512, verbose=False, n_threads=2)
p = mtmd.mtmd_context_params_default()
p.use_gpu, p.n_threads, p.warmup, p.print_timings = False, 2, False, False
ctx = mtmd.mtmd_init_from_file(job["mmproj"].encode(), m.model, p)
assert ctx, "mtmd_init_from_file failed"
samples = np.load(job["samples"]).astype(np.float32)
buf = (ctypes.c_float * len(samples)).from_buffer_copy(samples.tobytes())
bmp = mtmd.mtmd_bitmap_init_from_audio(len(samples), buf)
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
new_past = llama_cpp.llama_pos(0)
assert mtmd.mtmd_helper_eval_chunks(ctx, m.ctx, chunks, 0, 0, 512, True, ctypes.byref(new_past)) == 0
logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(m.ctx, -1), shape=(m.n_vocab(),)).copy()
np.save(job["out"] + ".embd.npy", np.concatenate(embd))
np.save(job["out"] + ".logits.npy", logits)
print(json.dumps({"layout": layout}))
'''

# (what it is, the projector's shape) for each row of the table
CASES = [
    ("qwen2a (Qwen2-Audio)", dict(projector="qwen2a")),
    ("ultravox, stack 8", dict(projector="ultravox", stack=8)),
    ("ultravox, stack 4", dict(projector="ultravox", stack=4)),
    ("voxtral, stack 4", dict(projector="voxtral", stack=4)),
    ("qwen2a, F32", dict(projector="qwen2a", qtype=QT.F32)),
    ("musicflamingo (AF3)", dict(projector="musicflamingo")),
    ("glma (GLM-ASR), st. 4", dict(projector="glma", stack=4)),
    ("qwen3a (Qwen3-ASR)", dict(projector="qwen3a")),
    ("meralion, stack 15", dict(projector="meralion", stack=15)),
    ("gemma4a (Gemma 4)", dict(projector="gemma4a")),
    ("gemma4a, 128 mel, F32", dict(projector="gemma4a", n_mel=128, channels=(128, 32), qtype=QT.F32)),
    ("granite_speech", dict(projector="granite_speech", n_mel=160)),
    ("granite_speech, F32", dict(projector="granite_speech", n_mel=160, qtype=QT.F32)),
    ("granite_speech plus", dict(projector="granite_speech", n_mel=160, feature_layers=(1, 3), qtype=QT.F32)),
    # mtmd builds LFM2-Audio's positions 512 wide (its encoder's width) whatever the file says
    ("lfm2a (LFM2-Audio)", dict(projector="lfm2a", n_mel=128, n_embd=512, n_head=8, n_ff=512)),
    ("lfm2a, F32", dict(projector="lfm2a", n_mel=128, n_embd=512, n_head=8, n_ff=512, qtype=QT.F32)),
    ("gemma4ua (Gemma 4 U.)", dict(projector="gemma4ua")),
    ("gemma4ua, F32", dict(projector="gemma4ua", qtype=QT.F32)),
]


# projectors with writers of their own (the conformers; Gemma 4 Unified's sound alone, no vision)
OWN_WRITERS = {"gemma4a": synth.write_gemma4_audio_mmproj, "granite_speech": synth.write_granite_speech_mmproj,
               "lfm2a": synth.write_lfm2_audio_mmproj,
               "gemma4ua": functools.partial(synth.write_gemma4_unified_mmproj, vision=False)}


def sound(seconds: float, seed: int = 3) -> np.ndarray:
    """A made-up sound: two tones that come and go, and some noise, at 16 kHz, in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    x = 0.3 * np.sin(2 * np.pi * 440 * t) * np.sin(2 * np.pi * 0.7 * t) + 0.2 * np.sin(2 * np.pi * 1250 * t + 1)
    return np.clip(x + 0.05 * rng.standard_normal(len(t)), -1, 1)


def merged(layout: list) -> list:
    """mtmd's chunks with the sound's chunks that follow each other as one run of rows."""
    out: list = []
    for part in layout:
        if isinstance(part, int) and out and isinstance(out[-1], int):
            out[-1] += part
        else:
            out.append(part)
    return [p for p in out if p != []]


def run_peer(peer: str, job: dict) -> dict:
    r = subprocess.run([peer, "-c", PEER], input=json.dumps(job), capture_output=True, text=True, timeout=900)
    if r.returncode:
        lines = r.stderr.strip().splitlines() or ["(no message)"]
        said = next((line for line in lines if "expected" in line or "error" in line.lower()), lines[-1])
        return {"error": f"exit {r.returncode}: {said.strip()}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


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
samples = np.load(job["samples"]).astype(np.float32)
buf = (ctypes.c_float * len(samples)).from_buffer_copy(samples.tobytes())
t = time.perf_counter()     # the spectrogram (mtmd_tokenize computes it) and the encoder
bmp = mtmd.mtmd_bitmap_init_from_audio(len(samples), buf)
chunks = mtmd.mtmd_input_chunks_init()
text = mtmd.mtmd_input_text(b"<__media__>", 11, True, True)
arr = (ctypes.c_void_p * 1)(bmp)
assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), arr, 1) == 0
for i in range(mtmd.mtmd_input_chunks_size(chunks)):
    c = mtmd.mtmd_input_chunks_get(chunks, i)
    if mtmd.mtmd_input_chunk_get_type(c) != 0:
        assert mtmd.mtmd_encode_chunk(ctx, c) == 0
print(json.dumps({"s": time.perf_counter() - t}))
'''

# encoders at their real sizes: (the projector's writer, its shape, what it is); random F16 weights
SPEED = {
    "whisper-small": (synth.write_audio_mmproj, dict(projector="qwen2a", n_embd=768, n_head=12, n_ff=3072, n_layer=12,
                                                      n_mel=80, n_out=1024),
                      "30 s through an encoder of Whisper-small's size (12 layers of 768, 80 mel bins)"),
    "qwen3-asr": (synth.write_audio_mmproj, dict(projector="qwen3a", n_embd=896, n_head=14, n_ff=3584, n_layer=18,
                                                  n_mel=128, n_conv=480, n_out=1024),
                  "30 s through one of Qwen3-ASR-0.6B's size (18 layers of 896, 128 mel bins, 480 channels)"),
    "gemma4": (synth.write_gemma4_audio_mmproj, dict(n_embd=1024, n_head=8, n_layer=12, n_mel=128,
                                                     channels=(128, 32), n_proj=1536, n_out=1024),
               "30 s through Gemma 4 E2B/E4B's audio conformer (12 blocks of 1024, 128 mel bins)"),
    "granite": (synth.write_granite_speech_mmproj, dict(n_embd=1024, n_head=8, n_layer=16, n_mel=160, context=200,
                                                         max_pos=512, n_ctc=348, proj_heads=16, n_query_ff=4096,
                                                         n_out=1024),
                "30 s through Granite Speech 3.3's conformer and Q-Former (16 blocks of 1024, 2 Q-Former layers)"),
    "lfm2a": (synth.write_lfm2_audio_mmproj, dict(n_embd=512, n_head=8, n_layer=17, n_mel=128, channels=256,
                                                  n_ff=2048, n_mid=2048, n_out=1024),
              "30 s through LFM2-Audio's FastConformer (17 blocks of 512, 128 mel bins)"),
}


def speed(peer: str, kind: str, rounds: int = 2, threads: int = 2) -> None:
    """An encoder at its real size (SPEED[kind]) on 30 s of sound, pyllm and mtmd alternating,
    the spectrogram included in both."""
    import time
    if kind not in SPEED:
        raise SystemExit(f"--speed takes one of {', '.join(SPEED)}, not {kind!r}")
    write, shape, what = SPEED[kind]
    d = Path(tempfile.mkdtemp(prefix="pyllm-audio-speed-"))
    lm = synth.write_llama(d / "lm.gguf", QT.Q8_0, n_vocab=512, image_tokens="audio", n_embd=1024, n_head=8,
                           n_head_kv=8, n_layer=1, n_ff=256)
    mm = write(d / "mm.gguf", **shape)
    samples = sound(30.0).astype(np.float32)
    np.save(d / "samples.npy", samples)
    enc = open_audio_encoder(mm, n_threads=threads)
    ours, theirs = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        enc.encode(samples)
        ours.append(time.perf_counter() - t0)
        r = subprocess.run([peer, "-c", PEER_SPEED], input=json.dumps(
            {"lm": lm, "mmproj": mm, "samples": str(d / "samples.npy"), "threads": threads}),
            capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"mtmd failed:\n{r.stderr[-3000:]}")
        theirs.append(json.loads(r.stdout.strip().splitlines()[-1])["s"])
    enc.close()
    print(f"{what}, {threads} threads:")
    print(f"  pyllm {min(ours):.2f} s   llama.cpp mtmd {min(theirs):.2f} s   ratio {min(theirs) / min(ours):.2f}x "
          f"(best of {rounds})")


def main() -> None:
    peer = os.environ.get("PYLLM_PEER_PYTHON")
    if not peer:
        sys.exit("set PYLLM_PEER_PYTHON to a python with llama-cpp-python (../shared/peer/install-llama-cpp.sh)")
    if "--speed" in sys.argv[1:]:
        rest = sys.argv[sys.argv.index("--speed") + 1:]
        return speed(peer, rest[0] if rest else "gemma4")
    d = Path(tempfile.mkdtemp(prefix="pyllm-audio-"))
    lm = synth.write_llama(d / "lm.gguf", QT.F32, n_vocab=512, image_tokens="audio")
    # a sound of 2.5 s, one of 41 s (two chunks: mtmd keeps whole chunks of 30 s)
    for seconds in (2.5, 41.0):
        samples = sound(seconds)
        # as a 16-bit WAV file would give them, so both read the very same samples
        samples = np.round(samples * 32767) / 32767
        np.save(d / "samples.npy", samples.astype(np.float32))
        print(f"\na sound of {seconds} s")
        print(f"{'projector':<24}{'rows':>12}{'max |embd diff|':>18}{'of max |embd|':>15}{'max |logit diff|':>18}"
              f"{'top token':>11}")
        for name, shape in CASES:
            if sys.argv[1:] and not any(word in name for word in sys.argv[1:]):   # rows named on the command line
                continue
            if shape.get("projector") in OWN_WRITERS:
                write = OWN_WRITERS[shape["projector"]]
                mm = write(d / "mm.gguf", **{k: v for k, v in shape.items() if k != "projector"})
            else:
                mm = synth.write_audio_mmproj(d / "mm.gguf", **shape)
            got = run_peer(peer, {"lm": lm, "mmproj": mm, "samples": str(d / "samples.npy"), "prompt": PROMPT,
                                  "width": 256, "out": str(d / "peer")})
            enc = open_audio_encoder(mm, n_threads=2)
            ours = enc.encode(samples.astype(np.float32))
            enc.close()
            if "error" in got:
                print(f"{name:<24}{len(ours):>7} / -   llama.cpp: {got['error']}")
                continue
            theirs = np.load(d / "peer.embd.npy")
            rows = f"{len(ours)} / {len(theirs)}"
            if len(ours) != len(theirs):
                print(f"{name:<24}{rows:>12}   (row counts differ)")
                continue
            m = Model(lm, mmproj=mm, n_ctx=4096, n_threads=2)
            ids = m.media_prompt(PROMPT, [wav_bytes(samples)])
            layout = [len(list(g)) if neg else list(g) for neg, g in itertools.groupby(ids, key=lambda t: t < 0)]
            seq = m.engine.new_sequence()
            logits, _ = m.engine.prefill(seq, ids)
            seq.release()
            m.close()
            peer_logits = np.load(d / "peer.logits.npy")
            diff, ldiff = np.abs(ours - theirs).max(), np.abs(logits - peer_logits).max()
            top = "same" if logits.argmax() == peer_logits.argmax() else "differs"
            print(f"{name:<24}{rows:>12}{diff:>18.2e}{diff / np.abs(theirs).max():>15.2e}{ldiff:>18.2e}{top:>11}"
                  + ("" if layout == merged(got["layout"]) else f"   layout differs: {layout} {got['layout']}"))


if __name__ == "__main__":
    main()
