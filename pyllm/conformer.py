"""Gemma 4's audio encoder (llama.cpp's mtmd "gemma4a", transformers' Gemma4AudioModel): a
Universal Speech Model conformer turning a sound into rows the language model reads.

    samples = the file decoded to mono 16 kHz floats; each 30 s of them a chunk (as mtmd cuts):
    mel = log(mel_filters |rfft(frame * hann, 512)| + 0.001): 320-sample frames (20 ms) every 160
          (10 ms), 160 zeros before the sound, a frame only where all its samples are sound;
          n_mel HTK mel bins over 0..8 kHz, not area-normalized                   # [frames, n_mel]
    x = relu(layernorm_c(conv2d(x, 3 x 3, stride 2))), twice, over (frames, mel bins)  # [T, F, c]
    x = each row's F x c values (c innermost) Win                                # [T, n_embd]
    each layer, a conformer block (every norm an RMS norm with its weight):
        x = x + ffn1(x) / 2,   ffn(x) = postnorm(Wdown silu(Wup prenorm(x)))
        x = x + postnorm(Wo attention(prenorm(x)))
        x = x + Wend silu(norm2(depthwise_conv(a sigmoid(b), k taps of the past)))   [a | b] = Wstart norm1(x)
        x = x + ffn2(x) / 2;   x = norm_out(x)
    rows = Wproj rmsnorm(Wout x + bout)                                           # [T, n_lm]

The attention is local and causal: a row sees itself and the 11 rows before it (chunks of 12
with a past of 12, the masked layout both transformers and mtmd compute, come to that window):
    score(t, t - d) = 50 tanh((q_t . k_(t-d) + q_t . r_d) / 50),  d = 0..11, per head
    q = Wq h / sqrt(head_dim) / ln 2 * softplus(per_dim_scale),  k = Wk h * ln(1 + e) / ln 2
    r_d = Wrel [sin(d w_i) | cos(d w_i)],  w_i = 10000^(-i / (n_embd / 2 - 1))
The file holds softplus(per_dim_scale) (llama.cpp's converter applies it). Matrices clip their
inputs and outputs where the file gives bounds (ClippableLinear). The spectrogram's floor is
added before the log, as transformers' Gemma4AudioFeatureExtractor does (mtmd takes the larger of
the two instead: the same but where a bin's energy is near 0.001).
"""
from __future__ import annotations

import math

import numpy as np

from .encoder import Tower
from .errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from .model_file import ModelFile

SAMPLE_RATE = 16000
FRAME = 320             # samples a frame (20 ms), Hann-windowed ...
HOP = 160               # ... every 10 ms ...
N_FFT = 512             # ... zero-padded to the FFT's length
MEL_FLOOR = 1e-3        # added to each mel value before its log
CHUNK_SAMPLES = 30 * SAMPLE_RATE    # mtmd encodes a sound 30 s at a time
WINDOW = 12             # rows an attention row sees: itself and 11 before (attention_context_left - 1)
SOFT_CAP = 50.0
RESIDUAL = 0.5          # the half-step feed-forward blocks' weight


def htk_mel_filters(n_mel: int, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE,
                    f_max: float = 8000.0) -> np.ndarray:
    """Triangular filters on the HTK mel scale, 2595 log10(1 + f / 700), peak 1 (no area
    normalization): float64 [n_mel, n_fft / 2 + 1] over the FFT's bins."""
    mel = 2595.0 * np.log10(1.0 + np.array([0.0, f_max]) / 700.0)
    edges = 700.0 * (10.0 ** (np.linspace(mel[0], mel[1], n_mel + 2) / 2595.0) - 1.0)
    f = np.arange(n_fft // 2 + 1) * sample_rate / n_fft
    left, centre, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising, falling = (f - left) / (centre - left), (right - f) / (right - centre)
    return np.maximum(0.0, np.minimum(rising, falling))


def gemma4_log_mel(samples: np.ndarray, n_mel: int) -> list[np.ndarray]:
    """The spectrogram of each 30 s of the sound: float32 [frames, n_mel] each (1 frame for a
    piece shorter than a frame's 10 ms)."""
    x = np.asarray(samples, np.float32).reshape(-1)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(FRAME) / FRAME)).astype(np.float32)   # periodic Hann
    filters = htk_mel_filters(n_mel)
    out = []
    for a in range(0, len(x), CHUNK_SAMPLES):
        part = x[a:a + CHUNK_SAMPLES]
        n_frames = max(1, (len(part) - FRAME // 2 - 1) // HOP + 1)     # frames whose samples are all sound
        padded = np.zeros((n_frames - 1) * HOP + FRAME, np.float32)
        padded[FRAME // 2:FRAME // 2 + len(part)] = part[:len(padded) - FRAME // 2]
        frames = np.lib.stride_tricks.sliding_window_view(padded, FRAME)[::HOP][:n_frames]
        magnitude = np.abs(np.fft.rfft(frames * window, n=N_FFT, axis=1))
        out.append(np.log(magnitude @ filters.T + MEL_FLOOR).astype(np.float32))
    return out


def rows_for_frames(n_frames: int) -> int:
    """A chunk's rows: its frames after two convolutions of stride 2."""
    return ((n_frames - 1) // 2) // 2 + 1


class Conformer(Tower):
    """What the conformer encoders share: their file's first numbers, and the block

        x = x + ffn1(x) / 2,   ffn(x) = post(Wdown silu(Wup norm(x) + bup) + bdown)
        x = x + post(attention(norm(x)))
        x = x + Wend silu(dwnorm(depthwise_conv(a sigmoid(b)))) + bend,   [a | b] = Wstart norm(x) + bstart
        x = x + ffn2(x) / 2;   x = norm_out(x)

    with the norms, the attention and the depthwise convolution's padding and norm each
    encoder's own (a block: a dict of tensor names, (weight, bias or None) pairs)."""

    section, prefix = "audio", "a"
    kind = ""                # the projector type this class reads
    begin = end = ""         # the tokens around a sound's rows (mtmd's): none unless said
    causal = False           # the depthwise convolution sees both sides (Gemma 4's: only the past)
    max_frames = 1 << 20     # the whole sound at once (Gemma 4: 30 s chunks)

    def _read_common(self, mf: ModelFile, name: str) -> None:
        if not mf.get("clip.has_audio_encoder", False):
            raise UnsupportedModelError(f"{self.path} has no audio encoder (a vision projector: give it images)")
        self.projector = str(mf.get("clip.audio.projector_type") or mf.get("clip.projector_type") or "")
        if self.projector != self.kind:
            raise UnsupportedModelError(f"{self.path}: audio projector {self.projector!r} is not {name}")
        self.n_embd, self.n_head = self._int("embedding_length"), self._int("attention.head_count")
        self.n_ff, self.n_layer = self._int("feed_forward_length"), self._int("block_count")
        self.n_mel = self._int("num_mel_bins")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2 or self.n_mel > 256 or self.n_embd > 16384:
            raise ModelFileError(f"{self.path}: {self.n_head} heads do not divide {self.n_embd} into even widths, or "
                                 f"{self.n_mel} mel bins are too many; the file is corrupt")

    def _norms(self, p: str, names: dict, n: int) -> dict:
        return {key: self._pair(p + name, (n,)) for key, name in names.items()}

    def _depthwise(self, name: str, n: int) -> tuple:
        t = self.mf.tensor(name + ".weight") if self.mf.has_tensor(name + ".weight") else None
        if t is None or len(t.shape) != 2 or int(t.shape[1]) != n or not 0 < int(t.shape[0]) <= 64:
            raise ModelFileError(f"{self.path}: tensor {name}.weight is missing or not [taps, {n}]; the file is "
                                 f"corrupt")
        return self._pair(name, (int(t.shape[0]), n))

    def encode(self, sound) -> np.ndarray:
        """A sound (a file's bytes, or float32 samples at 16 kHz) -> float32 [rows, n_out]."""
        from .audio import load_audio
        samples = load_audio(sound) if isinstance(sound, (bytes, bytearray, memoryview)) else \
            np.asarray(sound, np.float32)
        return self.encode_mel(self.log_mel(samples))

    def encode_mel(self, chunks: list[np.ndarray]) -> np.ndarray:
        """Spectrogram chunks, float32 [frames, n_mel] each -> their rows, in order."""
        for c in chunks:
            if c.ndim != 2 or c.shape[1] != self.n_mel or not 0 < c.shape[0] <= self.max_frames:
                raise InvalidArgumentError(f"a mel chunk must be [frames, {self.n_mel}] with 1 to {self.max_frames} "
                                           f"frames, not {list(c.shape)}")
        return self.rows_of_each(chunks, self._encode)

    def layout(self, ids: list[int]) -> list:
        """A sound's part of the prompt: its rows, between the model's markers (mtmd's)."""
        return [p for p in (self.begin, ids, self.end) if len(p)]

    def describe(self) -> dict:
        """What `pyllm info` says of a projector file."""
        return {"path": self.path, "kind": "multimodal projector (mmproj), audio", "projector": self.projector,
                "sample_rate": SAMPLE_RATE, "n_mel": self.n_mel, "window_s": self.window_s,
                "window_tokens": self.rows_per_chunk, "n_layer": self.n_layer, "n_embd": self.n_embd,
                "n_head": self.n_head, "n_ff": self.n_ff, "n_embd_out": self.n_out, "n_params": self.mf.n_params,
                "tensor_types": self.mf.type_histogram(), "activation": "silu (conformer)"}

    # -- the block ----------------------------------------------------------------------------------
    def block(self, x: np.ndarray, L: dict, *attention) -> None:
        """One conformer block on the rows x [T, n_embd], in place."""
        x += RESIDUAL * self.feed_forward(x, *L["ffn1"])
        a = self.attention_block(self.norm(x, L["attn_norm"]), L, *attention)
        x += a if L.get("attn_post") is None else self.norm(a, L["attn_post"], out=a)
        x += self.convolution(x, L)
        x += RESIDUAL * self.feed_forward(x, *L["ffn2"])
        self.norm(x, L["out_norm"], out=x)

    def feed_forward(self, x: np.ndarray, norm: tuple, up: tuple, down: tuple, post: tuple | None) -> np.ndarray:
        u = self.linear(self.norm(x, norm), up)
        self.parallel(len(u), lambda a, b: silu_(u[a:b]))
        y = self.linear(u, down)
        return y if post is None else self.norm(y, post, out=y)

    def convolution(self, x: np.ndarray, L: dict) -> np.ndarray:
        """The convolution module: GLU, then each channel over `taps` rows (the past's, or centred;
        zeros beyond the ends), a norm, SiLU, a matrix."""
        ab = self.linear(self.norm(x, L["conv_norm"]), L["start"])
        T, m = len(ab), ab.shape[1] // 2
        w = self.floats(L["dw"][0]).T                      # [taps, m]: tap j reads row t - before + j
        taps = len(w)
        before = taps - 1 if self.causal else taps // 2
        gp = np.zeros((T + taps - 1, m), np.float32)       # the gated rows, zeros beyond the ends
        y = np.empty((T, m), np.float32)

        def glu(r0: int, r1: int) -> None:
            gp[before + r0:before + r1] = ab[r0:r1, :m] / (1 + np.exp(-ab[r0:r1, m:]))

        def taps_of(r0: int, r1: int) -> None:
            y[r0:r1] = gp[r0:r1] * w[0]
            for j in range(1, taps):
                y[r0:r1] += gp[r0 + j:r1 + j] * w[j]
        self.parallel(T, glu)
        self.parallel(T, taps_of)
        if L["dw"][1] is not None:
            y += self.floats(L["dw"][1])
        self.depthwise_norm(y, L["dw_norm"])
        self.parallel(T, lambda r0, r1: silu_(y[r0:r1]))
        return self.linear(y, L["end"])

    def depthwise_norm(self, y: np.ndarray, wb: tuple) -> None:
        self.norm(y, wb, out=y)


class Gemma4AudioEncoder(Conformer):
    """An mmproj file's Gemma 4 audio conformer and projector. encode(sound) -> float32
    [rows, n_out]: each 30 s chunk's rows (750 for a whole one), in order."""

    kind = "gemma4a"
    begin, end = "<|audio>", "<audio|>"
    causal = True
    rows_per_chunk = rows_for_frames((CHUNK_SAMPLES - FRAME // 2 - 1) // HOP + 1)
    max_frames = CHUNK_SAMPLES // HOP
    window_s = CHUNK_SAMPLES / SAMPLE_RATE

    def _read(self, mf: ModelFile) -> None:
        """The hyperparameters and tensors, every shape checked."""
        self._read_common(mf, "Gemma 4's")
        # every Gemma 4 audio encoder's; llama.cpp's converter wrote another value (mtmd ignores it too)
        self.eps, self.rms = 1e-6, True
        n = self.n_embd
        # the sub-sampling: two 3 x 3 convolutions (1 -> c0 -> c1 channels), each a layer norm of its channels
        c0, c1 = (self._channels(f"a.conv1d.{i}.weight") for i in (0, 1))
        self.check_shape("a.conv1d.0.weight", (3, 3, 1, c0))
        self.check_shape("a.conv1d.1.weight", (3, 3, c0, c1))
        self.subsample = [(f"a.conv1d.{i}.weight", self._pair(f"a.conv1d.{i}.norm", (c,))[0])
                          for i, c in ((0, c0), (1, c1))]
        self.freq = rows_for_frames(self.n_mel)          # mel bins after the two strides
        self.inp = self._pair("a.input_projection", (self.freq * c1, n))
        n_proj = self._projection("a.pre_encode.out.weight", n, inputs_first=True)
        self.out = self._pair("a.pre_encode.out", (n, n_proj))
        self.soft_norm = self._pair("mm.a.soft_emb_norm", (n_proj,)) \
            if mf.has_tensor("mm.a.soft_emb_norm.weight") else None
        self.n_out = self._projection("mm.a.input_projection.weight", n_proj, inputs_first=True)
        self.proj = self._pair("mm.a.input_projection", (n_proj, self.n_out))
        self.layers = [self._block(i) for i in range(self.n_layer)]
        self.read_clamps()

    def _channels(self, name: str) -> int:
        t = self.mf.tensor(name) if self.mf.has_tensor(name) else None
        if t is None or len(t.shape) != 4 or not 0 < int(t.shape[3]) <= 4096:
            raise ModelFileError(f"{self.path}: tensor {name} is missing or not a 3 x 3 convolution; the file is "
                                 f"corrupt")
        return int(t.shape[3])

    def _block(self, i: int) -> dict:
        """Layer i's tensor names ((weight, bias or None) pairs), shapes checked."""
        p, n, f = f"a.blk.{i}.", self.n_embd, self.n_ff
        d = n // self.n_head
        L = self._norms(p, dict(attn_norm="attn_pre_norm", attn_post="attn_post_norm", conv_norm="conv_norm",
                                dw_norm="norm_conv", out_norm="ln2"), n)   # conv_norm before, norm_conv after (names swapped)
        for key, ffn in (("ffn1", ""), ("ffn2", "_1")):
            L[key] = (self._pair(p + "ffn_norm" + ffn, (n,)), self._pair(p + "ffn_up" + ffn, (n, f)),
                      self._pair(p + "ffn_down" + ffn, (f, n)), self._pair(p + "ffn_post_norm" + ffn, (n,)))
        self.check_shape(p + "per_dim_scale.weight", (d,))
        L["q_scale"] = p + "per_dim_scale.weight"
        L["k_scale"] = p + "per_dim_k_scale.weight" if self.mf.has_tensor(p + "per_dim_k_scale.weight") else None
        if L["k_scale"] is not None:
            self.check_shape(L["k_scale"], (d,))
        for key, name, shape in (("q", "attn_q", (n, n)), ("k", "attn_k", (n, n)), ("v", "attn_v", (n, n)),
                                 ("o", "attn_out", (n, n)), ("rel", "attn_k_rel", (n, n)),
                                 ("start", "conv_pw1", (n, 2 * n)), ("end", "conv_pw2", (n, n))):
            L[key] = self._pair(p + name, shape)
        L["dw"] = self._depthwise(p + "conv_dw", n)
        return L

    def log_mel(self, samples: np.ndarray) -> list[np.ndarray]:
        return gemma4_log_mel(samples, self.n_mel)

    def _encode(self, mel: np.ndarray) -> np.ndarray:
        """One chunk [frames, n_mel] -> its rows [rows_for_frames(frames), n_out]."""
        x = np.ascontiguousarray(mel, np.float32)[None, :, :, None]        # one image (frames, bins), 1 channel
        for weight, norm in self.subsample:
            x = self.conv3x3(x, weight)
            flat = x.reshape(-1, x.shape[-1])
            mu = flat.mean(axis=1, keepdims=True)
            var = np.square(flat - mu).mean(axis=1, keepdims=True)
            flat[:] = np.maximum((flat - mu) / np.sqrt(var + self.eps) * self.floats(norm), 0)
        x = self.linear(np.ascontiguousarray(x.reshape(x.shape[1], -1)), self.inp)
        for L in self.layers:
            self.block(x, L, self.relative(L))
        x = self.linear(x, self.out)
        x = self.norm(x, self.soft_norm) if self.soft_norm is not None else rms_norm_bare(x, self.eps)
        return self.linear(x, self.proj)

    def relative(self, L: dict) -> np.ndarray:
        """The relative positions' keys r_d, d = 0..WINDOW - 1: [WINDOW, n_embd]."""
        half = self.n_embd // 2
        inv = np.exp(-np.arange(half) * math.log(10000.0) / max(half - 1, 1))
        angle = np.arange(WINDOW)[:, None] * inv[None]
        return self.linear(np.concatenate([np.sin(angle), np.cos(angle)], axis=1).astype(np.float32), L["rel"])

    def attention_block(self, h: np.ndarray, L: dict, rel: np.ndarray) -> np.ndarray:
        """Each row attends to itself and the WINDOW - 1 rows before it (see the module's note)."""
        T, H, n = len(h), self.n_head, self.n_embd
        d = n // H
        q, k, v = (self.linear(h, L[m]) for m in ("q", "k", "v"))
        q *= np.tile(self.floats(L["q_scale"]), H) / (math.sqrt(d) * math.log(2))
        k *= math.log(1 + math.e) / math.log(2)
        if L["k_scale"] is not None:
            k *= np.tile(self.floats(L["k_scale"]), H)
        past = np.zeros((WINDOW - 1, n), np.float32)
        # window slot j holds row t - (WINDOW - 1) + j: distance WINDOW - 1 - j
        keys = np.lib.stride_tricks.sliding_window_view(np.concatenate([past, k]), WINDOW, axis=0)   # [T, n, W]
        values = np.lib.stride_tricks.sliding_window_view(np.concatenate([past, v]), WINDOW, axis=0)
        qh = q.reshape(T, H, d)
        s = np.einsum("thd,thdj->thj", qh, keys.reshape(T, H, d, WINDOW))
        s += np.einsum("thd,jhd->thj", qh, rel[::-1].reshape(WINDOW, H, d))
        s = SOFT_CAP * np.tanh(s / SOFT_CAP)
        before = np.arange(WINDOW)[None, :] < (WINDOW - 1 - np.arange(T))[:, None]    # slots before row 0
        s[before[:, None, :].repeat(H, axis=1)] = -np.inf
        p = np.exp(s - s.max(axis=2, keepdims=True))
        p /= p.sum(axis=2, keepdims=True)
        heads = np.einsum("thj,thdj->thd", p, values.reshape(T, H, d, WINDOW)).reshape(T, n)
        return self.linear(np.ascontiguousarray(heads, np.float32), L["o"])


class GraniteSpeechEncoder(Conformer):
    """An mmproj file's Granite Speech conformer and Q-Former projector (projector type
    "granite_speech"; Granite Speech 3.3, 4.0, 4.1 plus). encode(sound) -> float32 [rows, n_out]:
    the whole sound at once, 3 rows (window / downsample) for each 15 stacked frames (0.3 s).

        x = Win mel + b                      # mel: two 10 ms frames' 80 bins side by side
        the blocks (layer norms; attention within blocks of 200 rows, Shaw's relative positions;
        a centred depthwise convolution and a folded batch norm); after the middle one
        x = x + Wmid softmax(Wctc x + bctc) + bmid
        x = [the feature layers' x ..., x]   (4.1 plus: earlier layers' rows beside the last's)
        rows = Wproj qformer(x) + b          # each window of 15 rows read by 3 learned queries
    """

    kind = "granite_speech"

    def _read(self, mf: ModelFile) -> None:
        """The hyperparameters and tensors, every shape checked."""
        self._read_common(mf, "Granite Speech's")
        self.eps, self.rms = 1e-5, False
        n = self.n_embd
        self.context = self._int("chunk_size")                # attention in blocks of this many rows
        self.max_pos = self._int("max_pos_emb")
        self.window, rate = self._int("projector.window_size"), self._int("projector.downsample_rate")
        self.proj_heads = self._int("projector.head_count")
        if self.context > min(self.max_pos, 8192) or self.window % rate or self.window > 4096 or self.n_mel % 2:
            raise ModelFileError(f"{self.path}: blocks of {self.context} rows beyond {self.max_pos} positions, a "
                                 f"window of {self.window} not a multiple of {rate}, or {self.n_mel} features "
                                 f"(two frames' mel bins); the file is corrupt")
        self.n_queries = self.window // rate
        layers = mf.get("clip.audio.feature_layer", None)     # Granite Speech 4.1 plus: earlier layers kept
        self.feature_layers = sorted({int(v) for v in layers}) if layers is not None else []
        if any(not 0 <= v <= self.n_layer for v in self.feature_layers):
            raise ModelFileError(f"{self.path}: clip.audio.feature_layer {list(layers)} are not layers 0.."
                                 f"{self.n_layer}; the file is corrupt")
        self.inp = self._pair("a.input_projection", (self.n_mel, n))
        self.layers = [self._block(i) for i in range(self.n_layer)]
        n_ctc = self._projection("a.enc_ctc_out.weight", n, inputs_first=True)
        self.ctc = (self._pair("a.enc_ctc_out", (n, n_ctc)), self._pair("a.enc_ctc_out_mid", (n_ctc, n)))
        # the Q-Former: learned queries, normed, through layers of self- and cross-attention
        t = mf.tensor("a.proj_query") if mf.has_tensor("a.proj_query") else None
        if t is None or [int(v) for v in t.shape if v != 1][1:] != [self.n_queries]:
            raise ModelFileError(f"{self.path}: a.proj_query is missing or not {self.n_queries} queries; the file is "
                                 f"corrupt")
        m = self.n_query = int(t.shape[0])
        n_enc = n * (len(self.feature_layers) + 1)
        if m % self.proj_heads:
            raise ModelFileError(f"{self.path}: {self.proj_heads} heads do not divide the Q-Former's {m}")
        self.query_norm = self._pair("a.proj_norm", (m,))
        self.qformer = []
        i = 0
        while mf.has_tensor(f"a.proj_blk.{i}.self_attn_q.weight"):
            p = f"a.proj_blk.{i}."
            n_mid = self._projection(p + "ffn_up.weight", m, inputs_first=True)
            self.qformer.append({
                "self": tuple(self._pair(p + "self_attn_" + w, (m, m)) for w in ("q", "k", "v", "out")),
                "self_norm": self._pair(p + "self_attn_norm", (m,)),
                "cross": (self._pair(p + "cross_attn_q", (m, m)), self._pair(p + "cross_attn_k", (n_enc, m)),
                          self._pair(p + "cross_attn_v", (n_enc, m)), self._pair(p + "cross_attn_out", (m, m))),
                "cross_norm": self._pair(p + "cross_attn_norm", (m,)),
                "up": self._pair(p + "ffn_up", (m, n_mid)), "down": self._pair(p + "ffn_down", (n_mid, m)),
                "ffn_norm": self._pair(p + "ffn_norm", (m,))})
            i += 1
        if not self.qformer:
            raise ModelFileError(f"{self.path}: tensor a.proj_blk.0.self_attn_q.weight is missing; the file is corrupt")
        self.n_out = self._projection("a.proj_linear.weight", m, inputs_first=True)
        self.proj = self._pair("a.proj_linear", (m, self.n_out))
        self.rows_per_chunk = self.n_queries                    # each window of the Q-Former ...
        self.window_s = self.window * 2 * HOP / SAMPLE_RATE     # ... of 15 stacked frames: 0.3 s

    def _block(self, i: int) -> dict:
        p, n, f = f"a.blk.{i}.", self.n_embd, self.n_ff
        d = n // self.n_head
        L = self._norms(p, dict(attn_norm="ln1", conv_norm="norm_conv", out_norm="ln2"), n)
        for key, ffn in (("ffn1", ""), ("ffn2", "_1")):
            L[key] = (self._pair(p + "ffn_norm" + ffn, (n,)), self._pair(p + "ffn_up" + ffn, (n, f)),
                      self._pair(p + "ffn_down" + ffn, (f, n)), None)
        for key, name in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_out")):
            L[key] = self._pair(p + name, (n, n))
        self.check_shape(p + "attn_rel_pos_emb", (d, 2 * self.max_pos + 1))
        L["rel"] = p + "attn_rel_pos_emb"
        inner = self._projection(p + "conv_pw1.weight", n, inputs_first=True) // 2
        L["start"] = self._pair(p + "conv_pw1", (n, 2 * inner))
        L["end"] = self._pair(p + "conv_pw2", (inner, n))
        L["dw"] = self._depthwise(p + "conv_dw", inner)
        # the batch norm after the depthwise taps, folded into a scale and a shift (named conv_norm;
        # llama.cpp's converter, as of this writing, writes conv_norm_var, which mtmd does not read)
        folded = "conv_norm" if self.mf.has_tensor(p + "conv_norm.weight") else "conv_norm_var"
        L["dw_norm"] = self._pair(p + folded, (inner,))
        if L["dw_norm"][1] is None:
            raise ModelFileError(f"{self.path}: tensor {p}{folded}.bias is missing; the file is corrupt")
        return L

    def rows_for(self, n_frames: int) -> int:
        """The rows a spectrogram of n_frames stacked frames becomes."""
        return -(-n_frames // self.window) * self.n_queries

    def log_mel(self, samples: np.ndarray) -> list[np.ndarray]:
        return [granite_log_mel(samples, self.n_mel // 2)]

    def depthwise_norm(self, y: np.ndarray, wb: tuple) -> None:
        y *= self.floats(wb[0])
        y += self.floats(wb[1])

    def _encode(self, mel: np.ndarray) -> np.ndarray:
        """The stacked spectrogram [frames, n_mel] -> its rows [rows_for(frames), n_out]."""
        x = self.linear(np.ascontiguousarray(mel, np.float32), self.inp)
        kept = [x.copy()] if 0 in self.feature_layers else []
        for i, L in enumerate(self.layers, start=1):
            self.block(x, L)
            if i in self.feature_layers:
                kept.append(x.copy())
            if i == self.n_layer // 2:     # the CTC head's softmax fed back
                logits = self.linear(x, self.ctc[0])
                logits = np.exp(logits - logits.max(axis=1, keepdims=True))
                x += self.linear(np.ascontiguousarray(logits / logits.sum(axis=1, keepdims=True)), self.ctc[1])
        x = np.concatenate(kept + [x], axis=1) if kept else x
        return self.project(x)

    def attention_block(self, h: np.ndarray, L: dict) -> np.ndarray:
        """Within each block of `context` rows (the last one shorter), every row sees every row:
        scores (q_i . k_j + q_i . E[i - j]) / sqrt(head_dim), E a table of distances (Shaw's)."""
        T, H, n = len(h), self.n_head, self.n_embd
        d, C = n // H, self.context
        q, k, v = (self.linear(h, L[m]).reshape(T, H, d).transpose(1, 0, 2) for m in ("q", "k", "v"))  # [H, T, d]
        table = self.floats(L["rel"])[self.max_pos - C:self.max_pos + C + 1]      # distances -C..C
        out = np.empty((T, H, d), np.float32)
        for a in range(0, T, C):
            b = min(T, a + C)
            i = np.arange(b - a)
            qb = q[:, a:b]
            s = qb @ k[:, a:b].transpose(0, 2, 1)                                  # [H, c, c]
            s += np.take_along_axis(qb @ table.T, (i[:, None] - i[None, :] + C)[None].repeat(H, 0), axis=2)
            s *= 1 / math.sqrt(d)
            s = np.exp(s - s.max(axis=2, keepdims=True))
            out[a:b] = ((s / s.sum(axis=2, keepdims=True)) @ v[:, a:b]).transpose(1, 0, 2)
        return self.linear(out.reshape(T, n), L["o"])

    def project(self, x: np.ndarray) -> np.ndarray:
        """The Q-Former: each window of rows (zeros after the last) read by the learned queries."""
        W = -(-len(x) // self.window)
        windows = np.zeros((W * self.window, x.shape[1]), np.float32)
        windows[:len(x)] = x
        m, nq = self.n_query, self.n_queries
        qs = self.norm(np.ascontiguousarray(self.floats("a.proj_query").reshape(nq, m)), self.query_norm, eps=1e-12)
        qs = np.ascontiguousarray(np.tile(qs, (W, 1)))                              # [W nq, m]
        for B in self.qformer:
            a = self.cross_attention(qs, qs, B["self"], W, nq)
            qs = self.norm(a + qs, B["self_norm"], eps=1e-12)
            a = self.cross_attention(qs, windows, B["cross"], W, self.window)
            qs = self.norm(a + qs, B["cross_norm"], eps=1e-12)
            y = self.linear(self.activation(self.linear(qs, B["up"]), gelu="erf"), B["down"])
            qs = self.norm(y + qs, B["ffn_norm"], eps=1e-12)
        return self.linear(qs, self.proj)

    def cross_attention(self, qs: np.ndarray, src: np.ndarray, wbs: tuple, W: int, n_src: int) -> np.ndarray:
        """Each window's queries attend to that window's n_src rows of src (biases on q, k, v, out)."""
        H, m = self.proj_heads, self.n_query
        d, nq = m // H, len(qs) // W
        q = self.linear(qs, wbs[0]).reshape(W, nq, H, d).transpose(0, 2, 1, 3)
        k = self.linear(src, wbs[1]).reshape(W, n_src, H, d).transpose(0, 2, 3, 1)
        v = self.linear(src, wbs[2]).reshape(W, n_src, H, d).transpose(0, 2, 1, 3)
        s = (q @ k) * (1 / math.sqrt(d))                                             # [W, H, nq, n_src]
        s = np.exp(s - s.max(axis=3, keepdims=True))
        heads = ((s / s.sum(axis=3, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(W * nq, m)
        return self.linear(np.ascontiguousarray(heads, np.float32), wbs[3])


class Lfm2AudioEncoder(Conformer):
    """An mmproj file's LFM2-Audio encoder (projector type "lfm2a"; a NeMo FastConformer) and its
    adapter. encode(sound) -> float32 [rows, n_out]: the whole sound at once, 12.5 rows a second.

        x = relu(conv2d(mel, 3 x 3, stride 2) + b); then twice: x = relu(pw(dw(x, stride 2)))
        x = each row's c x F values (F innermost) Wout + b                          # [T, n_embd]
        the blocks (layer norms; every row sees every row: Transformer-XL's relative attention,
            scores ((q + u) . k_j + shift((q + v) . p)_j) / sqrt(head_dim), p = Wpos sinusoids of
            the distances T - 1 .. -(T - 1); a centred depthwise convolution, batch norm folded)
        rows = W3 gelu(W1 layernorm(x) + b1) + b3
    """

    kind = "lfm2a"

    def _read(self, mf: ModelFile) -> None:
        """The hyperparameters and tensors, every shape checked."""
        self._read_common(mf, "LFM2-Audio's")
        self.eps, self.rms = 1e-5, False
        n = self.n_embd
        # the sub-sampling: a 3 x 3 convolution, then twice a depthwise 3 x 3 and a pointwise one
        t = mf.tensor("a.conv1d.0.weight") if mf.has_tensor("a.conv1d.0.weight") else None
        if t is None or len(t.shape) != 4 or tuple(int(v) for v in t.shape[:3]) != (3, 3, 1):
            raise ModelFileError(f"{self.path}: tensor a.conv1d.0.weight is missing or not a 3 x 3 convolution of "
                                 f"one channel; the file is corrupt")
        c = int(t.shape[3])
        self.stem = [self._conv("a.conv1d.0", (3, 3, 1, c), c)] + \
            [self._conv(f"a.conv1d.{i}", shape, c) for i, shape in ((2, (3, 3, 1, c)), (3, (1, 1, c, c)),
                                                                    (5, (3, 3, 1, c)), (6, (1, 1, c, c)))]
        self.freq = ((((self.n_mel + 1) // 2 + 1) // 2) + 1) // 2        # mel bins after three strides of 2
        self.inp = self._pair("a.pre_encode.out", (c * self.freq, n))
        self.layers = [self._block(i) for i in range(self.n_layer)]
        self.adapter_norm = self._pair("mm.a.mlp.0", (n,))
        n_mid = self._projection("mm.a.mlp.1.weight", n, inputs_first=True)
        self.n_out = self._projection("mm.a.mlp.3.weight", n_mid, inputs_first=True)
        self.adapter = (self._pair("mm.a.mlp.1", (n, n_mid)), self._pair("mm.a.mlp.3", (n_mid, self.n_out)))
        self.rows_per_chunk, self.window_s = 1, 8 * HOP / SAMPLE_RATE     # a row each 80 ms

    def _conv(self, name: str, shape: tuple, c: int) -> tuple:
        """A convolution's (weight, bias): its bias c values (the converter stores [1, 1, c])."""
        self.check_shape(name + ".weight", shape)
        bias = self.mf.tensor(name + ".bias") if self.mf.has_tensor(name + ".bias") else None
        if bias is None or [int(v) for v in bias.shape if v != 1] != [c]:
            raise ModelFileError(f"{self.path}: tensor {name}.bias is missing or not {c} values; the file is corrupt")
        return name + ".weight", name + ".bias"

    def _block(self, i: int) -> dict:
        p, n = f"a.blk.{i}.", self.n_embd
        H, d = self.n_head, self.n_embd // self.n_head
        L = self._norms(p, dict(attn_norm="ln1", conv_norm="norm_conv", dw_norm="conv_norm", out_norm="ln2"), n)
        f = self._projection(p + "ffn_up.weight", n, inputs_first=True)
        for key, ffn in (("ffn1", ""), ("ffn2", "_1")):
            L[key] = (self._pair(p + "ffn_norm" + ffn, (n,)), self._pair(p + "ffn_up" + ffn, (n, f)),
                      self._pair(p + "ffn_down" + ffn, (f, n)), None)
        for key, name in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_out")):
            L[key] = self._pair(p + name, (n, n))
        L["pos"] = self._pair(p + "linear_pos", (n, n))
        for bias in ("pos_bias_u", "pos_bias_v"):
            self.check_shape(p + bias, (d, H))
            L[bias] = p + bias
        L["start"] = self._pair(p + "conv_pw1", (n, 2 * n))
        L["end"] = self._pair(p + "conv_pw2", (n, n))
        L["dw"] = self._depthwise(p + "conv_dw", n)
        if L["dw_norm"][1] is None:
            raise ModelFileError(f"{self.path}: tensor {p}conv_norm.bias is missing; the file is corrupt")
        return L

    def rows_for(self, n_frames: int) -> int:
        """The rows a spectrogram of n_frames becomes: three strides of 2."""
        return (((n_frames + 1) // 2 + 1) // 2 + 1) // 2

    def log_mel(self, samples: np.ndarray) -> list[np.ndarray]:
        return [nemo_log_mel(samples, self.n_mel)]

    def depthwise_norm(self, y: np.ndarray, wb: tuple) -> None:
        y *= self.floats(wb[0])
        y += self.floats(wb[1])

    def _encode(self, mel: np.ndarray) -> np.ndarray:
        """The spectrogram [frames, n_mel] -> its rows [rows_for(frames), n_out]."""
        x = np.ascontiguousarray(mel, np.float32)[None, :, :, None]      # one image (frames, bins), 1 channel
        (w0, b0), dw1, pw1, dw2, pw2 = self.stem
        x = np.maximum(self.conv3x3(x, w0) + self.floats(b0).reshape(-1), 0)
        for dw, pw in ((dw1, pw1), (dw2, pw2)):
            x = self.depthwise3x3(x, self.floats(dw[0]).reshape(-1, 9), self.floats(dw[1]).reshape(-1))
            x = self.pointwise_relu(x, self.floats(pw[0]).reshape(x.shape[3], -1), self.floats(pw[1]).reshape(-1))
        T = x.shape[1]
        x = self.linear(np.ascontiguousarray(x[0].transpose(0, 2, 1).reshape(T, -1)), self.inp)   # c outer, F inner
        distances = sinusoids(T, self.n_embd)
        for L in self.layers:
            self.block(x, L, self.linear(distances, L["pos"]))
        x = self.linear(self.norm(x, self.adapter_norm), self.adapter[0])
        return self.linear(self.activation(x, gelu="erf"), self.adapter[1])

    def depthwise3x3(self, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Each channel of x [m, H, W, c] by its own 3 x 3 kernel (w [c, 9]) at a stride of 2 with
        a zero all round, plus b: nine shifted multiply-adds, the threads taking a share of the
        output rows."""
        m, H, W, c = x.shape
        xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        h, w_ = (H - 1) // 2 + 1, (W - 1) // 2 + 1
        out, taps = np.empty((m, h, w_, c), np.float32), np.ascontiguousarray(w.T)      # taps [9, c]

        def rows(r0: int, r1: int) -> None:
            o = out[:, r0:r1]
            o[...] = b
            product = np.empty_like(o)
            for k in range(9):
                i, j = divmod(k, 3)     # output (r, s) reads padded input (2 r + i, 2 s + j)
                o += np.multiply(xp[:, i + 2 * r0:i + 2 * r1 - 1:2, j:j + 2 * w_ - 1:2], taps[k], out=product)
        self.parallel(h, rows)
        return out

    def pointwise_relu(self, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        """max(0, x W^T + b) at each position of x [m, H, W, c] (a 1 x 1 convolution, w [out, c])."""
        flat = x.reshape(-1, x.shape[3])
        out = np.empty((len(flat), len(w)), np.float32)

        def rows(r0: int, r1: int) -> None:
            np.matmul(flat[r0:r1], w.T, out=out[r0:r1])
            out[r0:r1] += b
            np.maximum(out[r0:r1], 0, out=out[r0:r1])
        self.parallel(len(flat), rows)
        return out.reshape(*x.shape[:3], -1)

    def attention_block(self, h: np.ndarray, L: dict, rel: np.ndarray) -> np.ndarray:
        """Every row sees every row; row i's score of row j takes the distance i - j's key (rel:
        the layer's keys of the distances T - 1 .. -(T - 1), [2 T - 1, n_embd])."""
        T, H, n = len(h), self.n_head, self.n_embd
        d = n // H
        q, k, v = (self.linear(h, L[m]).reshape(T, H, d).transpose(1, 0, 2) for m in ("q", "k", "v"))  # [H, T, d]
        u, w = (self.floats(L[b]).reshape(H, 1, d) for b in ("pos_bias_u", "pos_bias_v"))
        p = rel.reshape(2 * T - 1, H, d).transpose(1, 2, 0)                               # [H, d, 2T - 1]
        at = (T - 1) - np.arange(T)[:, None] + np.arange(T)[None, :]                      # distance i - j's row
        out = np.empty((T, H, d), np.float32)

        def heads(h0: int, h1: int) -> None:
            for head in range(h0, h1):       # one head's [T, T] and [T, 2T - 1] scores at a time
                s = (q[head] + u[head]) @ k[head].T
                s += np.take_along_axis((q[head] + w[head]) @ p[head], at, axis=1)
                s *= 1 / math.sqrt(d)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, head] = (s / s.sum(axis=1, keepdims=True)) @ v[head]
        self.parallel(H, heads, grain=1)
        return self.linear(out.reshape(T, n), L["o"])


def sinusoids(T: int, n: int) -> np.ndarray:
    """Transformer-XL's distance table, [sin | cos interleaved] of d = T - 1 .. -(T - 1): [2 T - 1, n]."""
    inv = np.exp(-(math.log(10000.0) / n) * 2 * np.arange(n // 2))
    angle = np.arange(T - 1, -T, -1)[:, None] * inv[None]
    return np.stack([np.sin(angle), np.cos(angle)], axis=2).reshape(2 * T - 1, n).astype(np.float32)


def nemo_log_mel(samples: np.ndarray, n_mel: int) -> np.ndarray:
    """LFM2-Audio's spectrogram (NeMo's AudioToMelSpectrogramPreprocessor, as mtmd computes it):
    pre-emphasis 0.97, 256 zeros at both ends, a symmetric 400-sample Hann window centred in 512
    every 160 samples, power through Slaney's area-normed filters, ln(v + 2^-24), each mel bin
    standardized over the sound's frames (std + 1e-5), the frame after them zeros:
    float32 [samples / 160 + 1, n_mel]."""
    from .audio import MEL_FLOOR, mel_filters
    x = np.asarray(samples, np.float64).reshape(-1)
    x = np.concatenate([x[:1], x[1:] - 0.97 * x[:-1]])
    padded = np.concatenate([np.zeros(N_FFT // 2), x, np.zeros(N_FFT // 2)])
    n_frames = (len(padded) - N_FFT) // HOP + 1
    window = np.zeros(N_FFT)
    window[(N_FFT - 400) // 2:(N_FFT + 400) // 2] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 399)
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:n_frames]
    spectrum = np.fft.rfft(frames * window, axis=1)
    mel = np.log((spectrum.real ** 2 + spectrum.imag ** 2) @ mel_filters(n_mel, N_FFT).astype(np.float64).T
                 + MEL_FLOOR)
    n = len(samples) // HOP           # the frames of the sound itself
    if n < 2:
        raise InvalidArgumentError(f"a sound of {len(samples)} samples is too short for LFM2-Audio: give at least "
                                   f"{2 * HOP} ({2 * HOP * 1000 // SAMPLE_RATE} ms)")
    mean = mel[:n].mean(axis=0)
    std = np.sqrt(((mel[:n] - mean) ** 2).sum(axis=0) / (n - 1)) + 1e-5
    out = np.zeros_like(mel)
    out[:n] = (mel[:n] - mean) / std
    return out.astype(np.float32)


def granite_log_mel(samples: np.ndarray, n_mel: int) -> np.ndarray:
    """Granite Speech's spectrogram (torchaudio's MelSpectrogram as its extractor sets it, and
    mtmd): the sound reflected 256 samples at both ends, a 400-sample periodic Hann window centred
    in 512 every 160 samples, power through n_mel HTK filters (0..8 kHz), log10 floored at
    1e-10, then floored at the max - 8 and mapped by v / 4 + 1; an even number of frames, each
    two side by side: float32 [frames / 2, 2 n_mel]."""
    x = np.asarray(samples, np.float32).reshape(-1)
    n, pad = len(x), N_FFT // 2
    left = x[np.minimum(np.arange(1, pad + 1), n - 1)][::-1]              # reflected (clamped, as mtmd's)
    right = x[np.maximum(n - 2 - np.arange(pad), 0)]
    padded = np.concatenate([left, x, right])
    n_frames = (len(padded) - N_FFT) // HOP + 1
    window = np.zeros(N_FFT, np.float32)
    window[(N_FFT - 400) // 2:(N_FFT + 400) // 2] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:n_frames]
    spectrum = np.fft.rfft(frames * window, axis=1)
    power = spectrum.real ** 2 + spectrum.imag ** 2
    mel = np.log10(np.maximum(power @ htk_mel_filters(n_mel, f_max=SAMPLE_RATE / 2).T, 1e-10))
    mel = np.maximum(mel, mel.max() - 8.0) / 4 + 1
    n_even = n_frames - n_frames % 2
    return np.ascontiguousarray(mel[:n_even].reshape(n_even // 2, 2 * n_mel), np.float32)


def rms_norm_bare(x: np.ndarray, eps: float) -> np.ndarray:
    """x / rms(x), each row (no weight)."""
    return (x * (1 / np.sqrt(np.einsum("ij,ij->i", x, x) / x.shape[1] + eps))[:, None]).astype(np.float32)


def silu_(x: np.ndarray) -> None:
    """x sigmoid(x), in place."""
    with np.errstate(over="ignore"):
        x /= 1 + np.exp(-x)
