"""What the vision and audio encoders of an mmproj file share: its tensors read as float32,
and the float32 transformer they run. numpy's BLAS multiplies the matrices, the core's dense
kernels (csrc/dense.c) do the softmax, activations and norms, and our threads split the work
(rows, or attention's heads), BLAS held to one thread each.

    for each layer:
        x = x + Wo attention(Wq h + bq, Wk h + bk, Wv h + bv) + bo,  h = norm1(x)   # every row sees all
        x = x + Wdown act(Wup norm2(x) + bup) + bdown

A tower's tensors are named as llama.cpp's converters name them: "v." (vision) or "a." (audio)
then blk.{i}.attn_q, ffn_up, ln1...; its numbers are under clip.vision.* or clip.audio.*.
"""
from __future__ import annotations

import math
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import numpy as np
from gguf import GGMLQuantizationType, dequantize
from threadpoolctl import threadpool_limits

from ._native import ffi, lib
from .errors import InvalidArgumentError, ModelFileError
from .model_file import ModelFile

CLAMP_NAMES = (".input_min", ".input_max", ".output_min", ".output_max")   # a clippable matrix's bounds


@dataclass
class EncoderLayer:
    ln1: tuple
    ln2: tuple
    qkv: tuple   # ((name of the weight, bias or None) of q, of k, of v), or of one fused [q | k | v]
    out: tuple
    up: tuple
    down: tuple
    gate: Optional[tuple] = None    # a gated FFN's: down(act(gate h) * up h)
    # Gemma 4's: RMS norms of each head of q and k (these weights; v's without), of the attention's
    # and the FFN's outputs before they join the residual, and a scale of the layer's output
    q_norm: Optional[str] = None
    k_norm: Optional[str] = None
    attn_post_norm: Optional[tuple] = None
    ffn_post_norm: Optional[tuple] = None
    out_scale: Optional[str] = None
    # InternViT's: each branch's output scaled (per channel) before it joins the residual
    attn_scale: Optional[str] = None
    ffn_scale: Optional[str] = None


class Tower:
    """An mmproj file's encoder (subclasses read its hyperparameters in _read: n_embd, n_head,
    n_ff, n_layer, eps, gelu, rms, projector). `section` names its keys ("vision": clip.vision.*)
    and `prefix` its tensors ("v": v.blk.0.attn_q.weight...)."""

    section, prefix = "vision", "v"

    def __init__(self, path: str | os.PathLike, n_threads: Optional[int] = None):
        self.path = str(path)
        self.n_threads = max(1, n_threads or os.cpu_count() or 1)
        self._pool: Optional[ThreadPoolExecutor] = None
        self._buffers: dict = {}
        self.clamps: dict = {}     # Gemma 4: a matrix's input and output clamped to [min, max] where the file says
        self.rms = False           # RMS norms (Pixtral's, Qwen 2.5's, Gemma 4's), else layer norms
        self.gated_act = "silu"    # a gated FFN's activation (as gated() takes it)
        self.projector = ""
        self.mf = ModelFile(path)
        try:
            if self.mf.architecture != "clip":
                raise InvalidArgumentError(f"{self.path} is a {self.mf.architecture!r} model, not a multimodal "
                                           f"projector (an mmproj .gguf file: architecture 'clip')")
            self._read(self.mf)
        except BaseException:
            self.mf.close()
            raise
        self._lock = threading.Lock()

    def _read(self, mf: ModelFile) -> None:
        raise NotImplementedError

    # -- reading the file ---------------------------------------------------------------------------
    def _int(self, name: str, default: Optional[int] = None) -> int:
        """clip.{section}.{name}, a positive integer."""
        key = f"clip.{self.section}.{name}"
        v = self.mf.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) <= 0:
            raise ModelFileError(f"{self.path}: {key} is missing or not a positive integer; is this an mmproj file?")
        return int(v)

    def _projection(self, name: str, n_in: int, inputs_first: bool) -> int:
        """The projector's matrix into the language model's width: checks it takes n_in
        and returns its width."""
        t = self.mf.tensor(name) if self.mf.has_tensor(name) else None
        dims = None if t is None or len(t.shape) != 2 else [int(v) for v in t.shape]
        if dims is None or dims[0 if inputs_first else 1] != n_in:
            raise ModelFileError(f"{self.path}: {name} is missing or does not take {n_in} inputs; the file is "
                                 f"corrupt")
        return dims[1 if inputs_first else 0]

    def check_shape(self, name: str, shape: tuple) -> None:
        if not self.mf.has_tensor(name):
            raise ModelFileError(f"{self.path}: tensor {name} is missing; the file is corrupt")
        got = tuple(self.mf.tensor(name).shape)
        while len(got) > len(shape) and got[-1] == 1:
            got = got[:-1]
        if got != shape:
            raise ModelFileError(f"{self.path}: tensor {name} has shape {list(got)}, expected {list(shape)}")

    def _pair(self, name: str, shape: tuple) -> tuple:
        self.check_shape(name + ".weight", shape)
        bias = name + ".bias"
        if self.mf.has_tensor(bias):
            self.check_shape(bias, (shape[-1],))
        return name + ".weight", bias if self.mf.has_tensor(bias) else None

    def _layers(self) -> list[EncoderLayer]:
        """The n_layer layers, all gated or none (their work buffers are shared)."""
        layers = [self._layer(i) for i in range(self.n_layer)]
        if len({L.gate is None for L in layers}) > 1:
            raise ModelFileError(f"{self.path}: some layers have an ffn_gate and some do not; the file is corrupt")
        return layers

    def _layer(self, i: int) -> EncoderLayer:
        p, n, f = f"{self.prefix}.blk.{i}.", self.n_embd, self.n_ff
        up, down = p + "ffn_up", p + "ffn_down"
        if n != f and self.mf.has_tensor(up + ".weight") and self.mf.tensor(up + ".weight").shape[0] == f:
            up, down = down, up     # old conversions named fc1 ffn_down (llama.cpp swaps them back too)
        gate = self._pair(p + "ffn_gate", (n, f)) if self.mf.has_tensor(p + "ffn_gate.weight") else None
        extra = {}
        if self.projector == "gemma4v":
            d = n // self.n_head
            for norm in ("q_norm", "k_norm"):
                self.check_shape(f"{p}attn_{norm}.weight", (d,))
                extra[norm] = f"{p}attn_{norm}.weight"
            extra |= dict(attn_post_norm=self._pair(p + "attn_post_norm", (n,)),
                          ffn_post_norm=self._pair(p + "ffn_post_norm", (n,)))
            if self.mf.has_tensor(p + "out_scale.weight"):
                got = tuple(self.mf.tensor(p + "out_scale.weight").shape)
                if got not in ((1,), (n,)):
                    raise ModelFileError(f"{self.path}: tensor {p}out_scale.weight has shape {list(got)}, expected "
                                         f"[1] or [{n}]")
                extra["out_scale"] = p + "out_scale.weight"
        for scale, name in (("attn_scale", "ls1"), ("ffn_scale", "ls2")):    # InternViT's layer scales
            if self.mf.has_tensor(f"{p}{name}.weight"):
                self.check_shape(f"{p}{name}.weight", (n,))
                extra[scale] = f"{p}{name}.weight"
        qkv = (self._pair(p + "attn_qkv", (n, 3 * n)),) if self.mf.has_tensor(p + "attn_qkv.weight") else \
            tuple(self._pair(p + m, (n, n)) for m in ("attn_q", "attn_k", "attn_v"))
        return EncoderLayer(ln1=self._pair(p + "ln1", (n,)), ln2=self._pair(p + "ln2", (n,)), qkv=qkv,
                            out=self._pair(p + "attn_out", (n, n)),
                            up=self._pair(up, (n, f)), down=self._pair(down, (f, n)), gate=gate, **extra)

    def read_clamps(self) -> None:
        """The bounds of each clippable matrix (Gemma 4's ClippableLinear: [name].input_min,
        input_max, output_min, output_max beside its weight), unbounded where unsaid."""
        for name in list(self.mf.tensors):
            if name.endswith(".weight") and any(self.mf.has_tensor(name[:-7] + end) for end in CLAMP_NAMES):
                self.clamps[name] = self._clamp(name[:-7])

    def _clamp(self, base: str) -> tuple:
        """(input min, max, output min, max) of a clippable matrix (Gemma 4's), unbounded where unsaid."""
        def scalar(suffix: str, default: float) -> float:
            name = base + suffix
            if not self.mf.has_tensor(name):
                return default
            v = self.floats(name).reshape(-1)
            if v.size != 1 or not np.isfinite(v[0]):
                raise ModelFileError(f"{self.path}: {name} is not one finite number; the file is corrupt")
            return float(v[0])
        return tuple(scalar(end, bound) for end, bound in zip(CLAMP_NAMES, (-np.inf, np.inf, -np.inf, np.inf)))

    def floats(self, name: Optional[str]) -> Optional[np.ndarray]:
        """A tensor as a new float32 array in numpy's order (rows = its last GGUF dimension)."""
        if name is None:
            return None
        t = self.mf.tensor(name)
        return self.dequantize(t, np.empty(tuple(int(v) for v in reversed(t.shape)), np.float32))

    def dequantize(self, t, out: np.ndarray) -> np.ndarray:
        """Tensor t as float32 into out (its size), by the core's kernels when it has the type."""
        if lib.pyllm_type_supported(int(t.type)) and out.ndim == 2 and out.flags.c_contiguous:
            rows, n = out.shape
            row_bytes = t.data.nbytes // rows
            src = np.ascontiguousarray(t.data).view(np.uint8).reshape(rows, row_bytes)
            isa = lib.pyllm_get_level()
            self.parallel(rows, lambda a, b: lib.pyllm_kernel_dequant(isa, int(t.type), _ptr(src[a:b], "void *"),
                                                                   _ptr(out[a:b]), (b - a) * n))
            return out
        out[...] = dequantize(t.data, GGMLQuantizationType(t.type)).reshape(out.shape)
        return out

    def matrix(self, *names: str) -> np.ndarray:
        """Weight matrices [rows, cols] as float32, stacked by rows, in a buffer kept for the
        shape: the next matrix of that shape overwrites it (an encoder's layers dequantize into
        the same memory)."""
        tensors = [self.mf.tensor(name) for name in names]
        shapes = [tuple(int(v) for v in reversed(t.shape)) for t in tensors]
        shape = (sum(r for r, _ in shapes), shapes[0][1])
        if shape not in self._buffers:
            self._buffers[shape] = np.empty(shape, np.float32)
        out, row = self._buffers[shape], 0
        for t, (rows, _) in zip(tensors, shapes):
            self.dequantize(t, out[row:row + rows])
            row += rows
        return out

    def linear(self, x: np.ndarray, *wbs: tuple, out: Optional[np.ndarray] = None, bias: bool = True,
               clamp: bool = True) -> np.ndarray:
        """x W^T + b (without b: x W^T), into out when given; several (W, b) give their outputs side
        by side from one matrix product (attention's q, k and v). The threads take a share of the
        rows each. A matrix with clamps (Gemma 4's) clips its input and its output to them."""
        if clamp and any(wb[0] in self.clamps for wb in wbs):   # clamped matrices one at a time
            out = np.empty((len(x), sum(int(self.mf.tensor(wb[0]).shape[-1]) for wb in wbs)), np.float32) \
                if out is None else out
            col = 0
            for wb in wbs:
                lo, hi, out_lo, out_hi = self.clamps.get(wb[0], (-np.inf, np.inf, -np.inf, np.inf))
                width = int(self.mf.tensor(wb[0]).shape[-1])
                part = self.linear(np.clip(x, lo, hi), wb, bias=bias, clamp=False)
                out[:, col:col + width] = np.clip(part, out_lo, out_hi)
                col += width
            return out
        w = self.matrix(*(wb[0] for wb in wbs))
        b = None
        if bias and any(wb[1] is not None for wb in wbs):
            b = np.concatenate([self.floats(wb[1]) if wb[1] is not None else np.zeros(self.mf.tensor(wb[0]).shape[-1],
                                                                                    np.float32) for wb in wbs])
        out = np.empty((len(x), len(w)), np.float32) if out is None else out

        def rows(r0: int, r1: int) -> None:
            np.matmul(x[r0:r1], w.T, out=out[r0:r1])
            if b is not None:
                out[r0:r1] += b
        self.parallel(len(x), rows)
        return out

    def rows_of_each(self, chunks: list, encode_one) -> np.ndarray:
        """encode_one(chunk)'s rows for each chunk, in order: [all rows, n_out]. One chunk at a
        time, its work split among our threads, BLAS held to one thread (its own threads would
        only contend with ours)."""
        with self._lock, threadpool_limits(limits=1, user_api="blas"):
            try:
                return np.concatenate([encode_one(c) for c in chunks]) if chunks else \
                    np.empty((0, self.n_out), np.float32)
            finally:
                self._buffers.clear()

    def conv3x3(self, x: np.ndarray, weight: str) -> np.ndarray:
        """x * W of m images, channels last, x [m, H, W, c] -> [m, H / 2, W / 2, out]: 3 x 3
        kernels (the file's [out, c, 3, 3]) at a stride of 2 with a zero all round, as one matrix
        product over each output's 3 x 3 x c inputs (gathered channels innermost, so the copy runs
        along memory)."""
        m, H, W, c = x.shape
        xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        h, w = (H - 1) // 2 + 1, (W - 1) // 2 + 1
        s = xp.strides
        cols = np.lib.stride_tricks.as_strided(xp, (m, h, w, 3, 3, c), (s[0], 2 * s[1], 2 * s[2], s[1], s[2], s[3]),
                                               writeable=False).reshape(m * h * w, 9 * c)
        # the file's [out, c, 3, 3] as [out, 3, 3, c], the order of cols' columns
        kernel = np.ascontiguousarray(self.floats(weight).transpose(0, 2, 3, 1).reshape(-1, 9 * c))
        y = np.empty((len(cols), len(kernel)), np.float32)

        def rows(r0: int, r1: int) -> None:
            np.matmul(cols[r0:r1], kernel.T, out=y[r0:r1])
        self.parallel(len(cols), rows)
        return y.reshape(m, h, w, -1)

    def norm(self, x: np.ndarray, wb: tuple, out: Optional[np.ndarray] = None,
             eps: Optional[float] = None) -> np.ndarray:
        """Layer norm of each row of x (float32, contiguous), into out when given (eps: the
        encoder's unless given); an RMS norm in an encoder of RMS norms (Pixtral's)."""
        out = np.empty_like(x) if out is None else out
        w, b = self.floats(wb[0]), self.floats(wb[1])
        n = x.shape[1]
        if self.rms:
            def rms(r0: int, r1: int) -> None:
                v = x[r0:r1]
                np.multiply(v, (1.0 / np.sqrt(np.einsum("ij,ij->i", v, v) / n + (self.eps if eps is None else eps)))
                            .astype(np.float32)[:, None], out=out[r0:r1])
                out[r0:r1] *= w
            self.parallel(len(x), rms)
            return out
        self.parallel(len(x), lambda r0, r1: lib.pyllm_dense_layernorm(
            _ptr(x[r0:r1]), _ptr(out[r0:r1]), r1 - r0, n, _ptr(w), _ptr(b) if b is not None else ffi.NULL,
            self.eps if eps is None else eps))
        return out

    def optional_norm(self, x: np.ndarray, name: str) -> np.ndarray:
        if not self.mf.has_tensor(name + ".weight"):
            return x
        return self.norm(x, self._pair(name, (self.n_embd,)))

    def activation(self, x: np.ndarray, bias: Optional[np.ndarray] = None, gelu=None) -> np.ndarray:
        """act(x + bias) in place, x float32 [rows, n] contiguous: GELU (True: the tanh form;
        "erf": the exact one, Whisper's) or quick-GELU (False), the encoder's unless `gelu` says."""
        isa, n = lib.pyllm_get_level(), x.shape[1]
        kind = self.gelu if gelu is None else gelu
        act = lib.DENSE_GELU_ERF if kind == "erf" else lib.DENSE_GELU_TANH if kind else lib.DENSE_QUICK_GELU
        b = _ptr(bias) if bias is not None else ffi.NULL
        self.parallel(len(x), lambda r0, r1: lib.pyllm_dense_activation(isa, act, _ptr(x[r0:r1]), r1 - r0, n, b))
        return x

    def gated(self, gate_up: np.ndarray, act) -> np.ndarray:
        """Rows of [gate | up] (n_ff each, contiguous) -> act(gate) * up in their first n_ff columns,
        in place: act "silu", GELU (True: tanh form) or quick-GELU (False)."""
        isa, n = lib.pyllm_get_level(), gate_up.shape[1] // 2
        kind = lib.DENSE_SILU if act == "silu" else lib.DENSE_GELU_TANH if act else lib.DENSE_QUICK_GELU
        self.parallel(len(gate_up), lambda r0, r1: lib.pyllm_dense_gated(isa, kind, _ptr(gate_up[r0:r1]), r1 - r0, n))
        return gate_up

    def parallel(self, n: int, run, grain: int = 16) -> None:
        """run(lo, hi) over [0, n) in one share per thread (at least `grain` each), this thread
        taking the first: numpy's BLAS (held to one thread while encoding) and the C kernels let
        go of the GIL. A nonzero return from a kernel is a bug, not the user's error."""
        nt = max(1, min(self.n_threads, n // grain))
        cuts = [n * i // nt for i in range(nt + 1)]
        if nt > 1 and self._pool is None:
            self._pool = ThreadPoolExecutor(self.n_threads - 1, thread_name_prefix="pyllm-encoder",
                                            initializer=signal.pthread_sigmask,   # Ctrl-C is the main thread's
                                            initargs=(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}))
        rest = [self._pool.submit(run, cuts[i], cuts[i + 1]) for i in range(1, nt)]
        codes = [run(cuts[0], cuts[1])] + [f.result() for f in rest]
        if any(codes):
            raise RuntimeError(f"an encoder kernel refused its arguments (codes {codes})")

    # -- running ------------------------------------------------------------------------------------
    def layer(self, x: np.ndarray, L: EncoderLayer, work: "LayerWork", **attention) -> None:
        """One pre-norm layer on the rows x [T, n_embd], in place (attention: attention()'s options):
        x += attention(norm1(x)), then x += ffn(norm2(x)), with the scales and post-norms a layer has."""
        a = self.attention(self.norm(x, L.ln1, out=work.h), L, work=work.attention, out=work.y, **attention)
        if L.attn_scale is not None:
            a *= self.floats(L.attn_scale)
        if L.attn_post_norm is not None:    # Gemma 4: each branch's output normed before it joins x
            self.norm(a, L.attn_post_norm, out=a)
        x += a
        h = self.norm(x, L.ln2, out=work.h)
        if L.gate is not None:    # act(gate h) * up h, from one matrix product
            self.gated(self.linear(h, L.gate, L.up, out=work.up), self.gated_act)
            f = self.linear(work.up[:, :self.n_ff], L.down, out=work.y)
        else:
            self.activation(self.linear(h, L.up, out=work.up, bias=False), self.floats(L.up[1]))
            f = self.linear(work.up, L.down, out=work.y)
        if L.ffn_post_norm is not None:
            self.norm(f, L.ffn_post_norm, out=f)
        if L.ffn_scale is not None:
            f *= self.floats(L.ffn_scale)
        x += f
        if L.out_scale is not None:
            x *= self.floats(L.out_scale)

    def attention(self, h: np.ndarray, L: EncoderLayer, block: int = 512, work: Optional["AttentionWork"] = None,
                  out: Optional[np.ndarray] = None, seq: Optional[int] = None,
                  rope: Optional[tuple] = None, spans: Optional[list] = None,
                  scale: Optional[float] = None) -> np.ndarray:
        """Every row attends to every row of its tile (`seq` rows each; default all of h), or of
        its span (`spans`: (start, end) row ranges, Qwen 2.5's windows), head by head, `block`
        query rows at a time (their scores stay in the cache: 8 MB at 4096 patches); the threads
        share the (span, head, block) units; scores scaled by `scale`, else 1/sqrt(head_dim).
        rope: (cos, sin, pairs) with cos and sin [seq, head_dim / 2], turning each head's pairs
        of q and k: "adjacent" (x[2i], x[2i + 1]) (Pixtral's 2D RoPE), "halves" (x[i], x[i +
        head_dim / 2]) (Qwen's) or "quarters", each half's (x[i], x[i + head_dim / 4]) (Gemma 4's).
        Gemma 4 norms each head of q and k (RMS, the layer's weights) and of v (no weights)."""
        T, H = h.shape[0], self.n_head
        P = T if seq is None else seq
        spans = [(i, i + P) for i in range(0, T, P)] if spans is None else spans
        d, n = self.n_embd // H, self.n_embd
        w = AttentionWork(T, n) if work is None else work
        qkv = self.linear(h, *L.qkv, out=w.qkv)
        q, k, v = qkv[:, :n], qkv[:, n:2 * n], qkv[:, 2 * n:]
        isa = lib.pyllm_get_level()
        if L.q_norm is not None:
            def head_norms(r0: int, r1: int) -> None:
                for x, wname in ((q, L.q_norm), (k, L.k_norm), (v, None)):
                    heads = x[r0:r1].reshape(r1 - r0, H, d)
                    heads *= 1.0 / np.sqrt(np.einsum("thi,thi->th", heads, heads) / d + self.eps)[..., None]
                    if wname is not None:
                        heads *= self.floats(wname)
            self.parallel(T, head_norms)
        if rope is not None:
            # the pairs' two sides (views of the head) and their angles' columns: Qwen's the head's
            # halves, Pixtral's its even and odd dims, Gemma 4's each half's quarters
            h2, h4 = d // 2, d // 4
            pairs = {"halves": [(slice(0, h2), slice(h2, d), slice(0, h2))],
                     "adjacent": [(slice(0, d, 2), slice(1, d, 2), slice(0, h2))],
                     "quarters": [(slice(0, h4), slice(h4, h2), slice(0, h4)),
                                  (slice(h2, h2 + h4), slice(h2 + h4, d), slice(h4, h2))]}[rope[2]]

            def turn(r0: int, r1: int) -> None:
                at = np.arange(r0, r1) % P
                cos, sin = rope[0][at][:, None], rope[1][at][:, None]
                for x in (q[r0:r1], k[r0:r1]):
                    heads = x.reshape(r1 - r0, H, d)
                    for one, two, cols in pairs:
                        a, b = heads[..., one].copy(), heads[..., two].copy()
                        heads[..., one] = a * cos[..., cols] - b * sin[..., cols]
                        heads[..., two] = a * sin[..., cols] + b * cos[..., cols]
            self.parallel(T, turn)
        jobs = [(lo, hi, head, a) for lo, hi in spans for head in range(H) for a in range(lo, hi, block)]
        longest = max(hi - lo for lo, hi in spans)

        def units(first: int, last: int) -> int:
            scores, sums = np.empty((min(block, longest), longest), np.float32), np.empty(block, np.float32)
            current = None
            for lo, hi, head, a in jobs[first:last]:
                cols = slice(head * d, (head + 1) * d)
                if current != (lo, head):
                    current = (lo, head)
                    qh = q[lo:hi, cols] * np.float32(1.0 / math.sqrt(d) if scale is None else scale)
                    kt, vh = np.ascontiguousarray(k[lo:hi, cols].T), np.ascontiguousarray(v[lo:hi, cols])
                b, m = min(hi, a + block), hi - lo
                s = np.matmul(qh[a - lo:b - lo], kt, out=scores[:b - a, :m])
                if lib.pyllm_dense_softmax_rows(isa, _ptr(s), b - a, m, longest, _ptr(sums)):
                    return -1
                w.heads[a:b, cols] = (s @ vh) / sums[:b - a, None]   # normalized after
            return 0
        self.parallel(len(jobs), units, grain=1)
        return self.linear(w.heads, L.out, out=out)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self.mf.close()


class AttentionWork:
    """The attention's buffers for T rows of width n, kept from layer to layer."""

    def __init__(self, T: int, n: int):
        self.qkv, self.heads = np.empty((T, 3 * n), np.float32), np.empty((T, n), np.float32)


def _ptr(a: np.ndarray, kind: str = "float *"):
    return ffi.cast(kind, a.ctypes.data)


class LayerWork:
    """A layer's buffers for T rows of width n (the FFN's n_ff wide, twice that for a gated one),
    kept from layer to layer: a large new array costs its page faults each time."""

    def __init__(self, T: int, n: int, n_ff: int, gated: bool):
        self.h, self.y = np.empty((T, n), np.float32), np.empty((T, n), np.float32)
        self.up = np.empty((T, n_ff * (2 if gated else 1)), np.float32)
        self.attention = AttentionWork(T, n)
