"""Vision encoders: llama.cpp's multimodal projector files (`--mmproj`, GGUF of
architecture "clip") turn an image into rows of embeddings that the language
model reads in place of tokens.

    pixels = fit(image, S x S), each channel (v / 255 - mean) / std        # [3, S, S]
    x = patches(pixels) Wpatch + bpatch + position_embd                   # [n_patches, n_embd]
    (x = layernorm(x), where the file has pre_ln)
    for each layer:
        x = x + Wo attention(Wq h + bq, Wk h + bk, Wv h + bv) + bo,  h = layernorm1(x)   # every patch sees all
        x = x + Wdown act(Wup layernorm2(x) + bup) + bdown
    x = post_ln(x)
    projector "gemma3": x = avg_pool(x, k x k patches); x = rmsnorm(x) * w; rows = x Wproj
    projector "idefics3": x = each k x k patches' rows side by side (pixel shuffle); rows = x Wfc

Gemma 3 reads one image fitted into the square; Idefics3 (SmolVLM) reads the image
as tiles of the square plus an overview, each between marker tokens (layout()).

As llama.cpp's mtmd runs them: a patch is a stride-p convolution (here one
matmul over unfolded patches), patches are numbered row by row, attention is
scaled by 1/sqrt(head_dim), `clip.use_gelu` picks GELU (tanh form) over
quick-GELU, an image that is not square keeps its aspect ratio and is padded
with black. The encoder runs in float32: numpy's BLAS multiplies the matrices,
the core's dense kernels (csrc/dense.c) do the softmax, activation and norms,
and our threads split the work (rows, or attention's heads), BLAS held to one
thread each. It runs once per image, and its rows are kept (`MediaStore`), so a
conversation does not encode the same picture again.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from gguf import GGMLQuantizationType, dequantize
from threadpoolctl import threadpool_limits

from ._native import ffi, lib
from .errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from .model_file import ModelFile

PROJECTORS = ("gemma3", "idefics3")


@dataclass
class EncoderLayer:
    ln1: tuple
    ln2: tuple
    q: tuple     # (name of the weight, bias or None)
    k: tuple
    v: tuple
    out: tuple
    up: tuple
    down: tuple


class VisionEncoder:
    """An mmproj file's vision tower and projector. encode(image) -> float32
    [n_tokens, n_embd of the language model]."""

    tiles_at_once = 4    # 4 x 1024 patches: as fast as 16 here, 340 MB less at SmolVLM's size

    def __init__(self, path: str | os.PathLike, n_threads: Optional[int] = None):
        self.path = str(path)
        self.n_threads = max(1, n_threads or os.cpu_count() or 1)
        self._pool: Optional[ThreadPoolExecutor] = None
        self._buffers: dict = {}
        self.mf = ModelFile(path)
        try:
            self._read(self.mf)
        except BaseException:
            self.mf.close()
            raise
        self._lock = threading.Lock()

    def _read(self, mf: ModelFile) -> None:
        """The hyperparameters and tensors, every shape checked."""
        if mf.architecture != "clip":
            raise InvalidArgumentError(f"{self.path} is a {mf.architecture!r} model, not a multimodal projector "
                                       f"(an mmproj .gguf file: architecture 'clip')")
        if mf.get("clip.has_vision_encoder") is False:
            raise UnsupportedModelError(f"{self.path} has no vision encoder (an audio projector?); pyllm reads "
                                        f"images only")
        self.projector = str(mf.get("clip.projector_type") or mf.get("clip.vision.projector_type") or "")
        if self.projector not in PROJECTORS:
            raise UnsupportedModelError(f"{self.path}: projector type {self.projector!r} is not supported yet "
                                        f"(supported: {', '.join(PROJECTORS)}: Gemma 3's and SmolVLM's)")
        self.n_embd, self.n_head = self._int("embedding_length"), self._int("attention.head_count")
        self.n_ff, self.n_layer = self._int("feed_forward_length"), self._int("block_count")
        self.image_size, self.patch = self._int("image_size"), self._int("patch_size")
        eps = mf.get("clip.vision.attention.layer_norm_epsilon", 1e-6)
        if not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ModelFileError(f"{self.path}: clip.vision.attention.layer_norm_epsilon is {eps!r}; the file is corrupt")
        self.eps = float(eps)
        self.mean = self._triple("clip.vision.image_mean")
        self.std = self._triple("clip.vision.image_std")
        if self.n_embd % self.n_head or self.image_size % self.patch:
            raise ModelFileError(f"{self.path}: {self.n_head} heads do not divide {self.n_embd}, or patches of "
                                 f"{self.patch} do not tile {self.image_size}; the file is corrupt")
        self.gelu = bool(mf.get("clip.use_gelu", False))    # else quick-gelu, x sigmoid(1.702 x)
        self.side = self.image_size // self.patch              # patches per side
        # Gemma 3 pools 4 x 4 patches into a row; Idefics3 (SmolVLM) stacks s x s patches' rows
        self.merge = self._int("projector.scale_factor", 4 if self.projector == "gemma3" else 2)
        if self.side % self.merge:
            raise ModelFileError(f"{self.path}: a merge of {self.merge} does not divide {self.side} patches")
        self.n_tokens = (self.side // self.merge) ** 2        # rows per tile
        self.check_shape("v.patch_embd.weight", (self.patch, self.patch, 3, self.n_embd))
        self.check_shape("v.position_embd.weight", (self.n_embd, self.side * self.side))
        if self.projector == "gemma3":
            self.bidirectional = True    # an image's rows see each other (mtmd: Gemma 3's do)
            self.n_out = self._projection("mm.input_projection.weight", self.n_embd, inputs_first=False)
            self.check_shape("mm.soft_emb_norm.weight", (self.n_embd,))
            self.longest_edge = self.image_size
        else:   # idefics3: tiles of the image and a downscaled whole, each between marker tokens
            self.bidirectional = False
            self.n_out = self._projection("mm.model.fc.weight", self.n_embd * self.merge ** 2, inputs_first=True)
            # the image is scaled so its longer side is this long, then cut into tiles
            self.longest_edge = self._int("preproc_image_size", self.image_size)
        if self.image_size > 4096 or self.longest_edge > 16384:   # a picture of gigabytes: a corrupt file
            raise ModelFileError(f"{self.path}: an image size of {self.image_size} (scaled to "
                                 f"{self.longest_edge}) is beyond any projector's; the file is corrupt")
        self.layers = [self._layer(i) for i in range(self.n_layer)]

    def describe(self) -> dict:
        """What `pyllm info` says of a projector file."""
        return {"path": self.path, "kind": "multimodal projector (mmproj)", "projector": self.projector,
                "image_size": self.image_size, "patch_size": self.patch, "patches": self.side * self.side,
                "image_tokens": self.n_tokens if self.projector == "gemma3" else
                f"{self.n_tokens} per tile (tiles of the image scaled to {self.longest_edge}, and an overview)",
                "n_layer": self.n_layer, "n_embd": self.n_embd, "n_head": self.n_head,
                "n_ff": self.n_ff, "n_embd_out": self.n_out, "n_params": self.mf.n_params,
                "tensor_types": self.mf.type_histogram(),
                "activation": "gelu (tanh)" if self.gelu else "quick-gelu",
                "image_mean": [float(x) for x in self.mean], "image_std": [float(x) for x in self.std]}

    # -- reading the file ---------------------------------------------------------------------------
    def _int(self, name: str, default: Optional[int] = None) -> int:
        """clip.vision.{name}, a positive integer."""
        key = "clip.vision." + name
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

    def _triple(self, key: str) -> np.ndarray:
        v = self.mf.get(key)
        try:
            a = np.asarray(v, dtype=np.float32).reshape(3)
        except (TypeError, ValueError):
            raise ModelFileError(f"{self.path}: {key} is not three numbers; the file is corrupt") from None
        if key.endswith("std") and not np.all(a > 0):
            raise ModelFileError(f"{self.path}: {key} has a value that is not positive")
        return a

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

    def _layer(self, i: int) -> EncoderLayer:
        p, n, f = f"v.blk.{i}.", self.n_embd, self.n_ff
        up, down = p + "ffn_up", p + "ffn_down"
        if n != f and self.mf.has_tensor(up + ".weight") and self.mf.tensor(up + ".weight").shape[0] == f:
            up, down = down, up     # old conversions named fc1 ffn_down (llama.cpp swaps them back too)
        return EncoderLayer(ln1=self._pair(p + "ln1", (n,)), ln2=self._pair(p + "ln2", (n,)),
                            q=self._pair(p + "attn_q", (n, n)), k=self._pair(p + "attn_k", (n, n)),
                            v=self._pair(p + "attn_v", (n, n)), out=self._pair(p + "attn_out", (n, n)),
                            up=self._pair(up, (n, f)), down=self._pair(down, (f, n)))

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

    def linear(self, x: np.ndarray, *wbs: tuple, out: Optional[np.ndarray] = None, bias: bool = True) -> np.ndarray:
        """x W^T + b (without b: x W^T), into out when given; several (W, b) give their outputs side
        by side from one matrix product (attention's q, k and v). The threads take a share of the
        rows each."""
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

    def norm(self, x: np.ndarray, wb: tuple, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Layer norm of each row of x (float32, contiguous), into out when given."""
        out = np.empty_like(x) if out is None else out
        w, b = self.floats(wb[0]), self.floats(wb[1])
        n = x.shape[1]
        self.parallel(len(x), lambda r0, r1: lib.pyllm_dense_layernorm(
            _ptr(x[r0:r1]), _ptr(out[r0:r1]), r1 - r0, n, _ptr(w), _ptr(b) if b is not None else ffi.NULL,
            self.eps))
        return out

    def optional_norm(self, x: np.ndarray, name: str) -> np.ndarray:
        if not self.mf.has_tensor(name + ".weight"):
            return x
        return self.norm(x, self._pair(name, (self.n_embd,)))

    def activation(self, x: np.ndarray, bias: Optional[np.ndarray] = None) -> np.ndarray:
        """act(x + bias) in place, x float32 [rows, n] contiguous."""
        isa, n = lib.pyllm_get_level(), x.shape[1]
        act = lib.DENSE_GELU_TANH if self.gelu else lib.DENSE_QUICK_GELU
        b = _ptr(bias) if bias is not None else ffi.NULL
        self.parallel(len(x), lambda r0, r1: lib.pyllm_dense_activation(isa, act, _ptr(x[r0:r1]), r1 - r0, n, b))
        return x

    def parallel(self, n: int, run, grain: int = 16) -> None:
        """run(lo, hi) over [0, n) in one share per thread (at least `grain` each), this thread
        taking the first: numpy's BLAS (held to one thread while encoding) and the C kernels let
        go of the GIL. A nonzero return from a kernel is a bug, not the user's error."""
        nt = max(1, min(self.n_threads, n // grain))
        cuts = [n * i // nt for i in range(nt + 1)]
        if nt > 1 and self._pool is None:
            self._pool = ThreadPoolExecutor(self.n_threads - 1, thread_name_prefix="pyllm-vision")
        rest = [self._pool.submit(run, cuts[i], cuts[i + 1]) for i in range(1, nt)]
        codes = [run(cuts[0], cuts[1])] + [f.result() for f in rest]
        if any(codes):
            raise RuntimeError(f"a vision kernel refused its arguments (codes {codes})")

    # -- running ------------------------------------------------------------------------------------
    def pixels(self, image) -> np.ndarray:
        """The image's first tile as the encoder reads it: float32 [3, S, S], normalized."""
        return self.normalize(self.tiles(load_image(image))[0])

    def normalize(self, rgb: np.ndarray) -> np.ndarray:
        """uint8 [S, S, 3] -> float32 [3, S, S], each channel (v / 255 - mean) / std."""
        x = np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) / 255.0
        return (x - self.mean[:, None, None]) / self.std[:, None, None]

    def encode(self, image) -> np.ndarray:
        """An image (bytes, a path, a data: URL, a PIL image) -> float32 [rows, n_out]: the rows
        of its tiles in the order layout() shows them."""
        return self.encode_pixels(np.stack([self.normalize(t) for t in self.tiles(load_image(image))]))

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(columns, rows) of an Idefics3 image's tiles, as mtmd computes them: the image scaled
        so its longer side is longest_edge (the scale in float32), each side rounded up to whole
        tiles."""
        S, L = self.image_size, np.float32(self.longest_edge)
        scale = min(L / np.float32(width), L / np.float32(height))
        return (math.ceil(float(np.float32(width) * scale) / S), math.ceil(float(np.float32(height) * scale) / S))

    def tiles(self, img) -> list[np.ndarray]:
        """An RGB PIL image as the encoder's square inputs, uint8 [S, S, 3] each. Gemma 3: the
        image fitted into the square. Idefics3, as mtmd (and transformers' processor) does it:
        the image scaled (Lanczos) so its longer side is longest_edge, stretched over the grid's
        tiles, cut row by row; then that stretched image shrunk to one tile (the overview)."""
        from PIL import Image
        S = self.image_size
        if self.projector == "gemma3":
            return [np.asarray(fit_square(img, S))]

        def resized(im, size):
            return im if im.size == size else im.resize(size, Image.LANCZOS)
        cols, rows = self.grid(*img.size)
        stretched = resized(resized(img, scaled_to_longest_edge(*img.size, self.longest_edge)), (cols * S, rows * S))
        whole = np.asarray(stretched)
        return [whole[y * S:(y + 1) * S, x * S:(x + 1) * S] for y in range(rows) for x in range(cols)] + \
            [np.asarray(resized(stretched, (S, S)))]

    def layout(self, ids: list[int], image) -> list:
        """The prompt around an image's rows `ids` (encode()'s): pieces of text (special tokens
        read, each piece tokenized on its own as mtmd does) and runs of ids."""
        if self.projector == "gemma3":
            return ["<start_of_image>", ids, "<end_of_image>"]
        cols, rows = self.grid(*image_dimensions(image))
        T = self.n_tokens
        if len(ids) != (cols * rows + 1) * T:
            raise InvalidArgumentError(f"an image of {cols} x {rows} tiles has {(cols * rows + 1) * T} rows, "
                                       f"not {len(ids)}")
        parts: list = []
        for y in range(rows):
            for x in range(cols):
                k = y * cols + x
                parts += [f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>", ids[k * T:(k + 1) * T]]
            if y < rows - 1:
                parts.append("\n")
        return parts + ["\n\n", "<fake_token_around_image><global-img>", ids[-T:], "<fake_token_around_image>"]

    def encode_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Normalized tiles, float [3, S, S] or [m, 3, S, S] -> their rows, [m * n_tokens, n_out]."""
        S = self.image_size
        if pixels.shape[-3:] != (3, S, S) or pixels.ndim not in (3, 4):
            raise InvalidArgumentError(f"pixels must be [3, {S}, {S}] or [m, 3, {S}, {S}], not {list(pixels.shape)}")
        tiles = pixels.reshape(-1, 3, S, S).astype(np.float32)
        # one image at a time, its work split among our threads; BLAS's own threads would only
        # contend with them (and spin while the C kernels run)
        with self._lock, threadpool_limits(limits=1, user_api="blas"):
            try:   # several tiles at a time through the layers: larger matrix products, bounded memory
                k = self.tiles_at_once
                return np.concatenate([self._encode(tiles[i:i + k]) for i in range(0, len(tiles), k)])
            finally:
                self._buffers.clear()

    def _encode(self, tiles: np.ndarray) -> np.ndarray:
        p, n, side = self.patch, self.n_embd, self.side
        m, P = len(tiles), side * side
        T = m * P                                   # the tiles' patches in all
        # patch (row r, column c) of each tile -> its 3 x p x p values, in the convolution weight's order
        patches = tiles.reshape(m, 3, side, p, side, p).transpose(0, 2, 4, 1, 3, 5).reshape(T, 3 * p * p)
        x = patches @ self.floats("v.patch_embd.weight").reshape(n, -1).T
        if self.mf.has_tensor("v.patch_embd.bias"):
            x += self.floats("v.patch_embd.bias")
        x.reshape(m, P, n)[:] += self.floats("v.position_embd.weight")
        x = np.ascontiguousarray(self.optional_norm(x, "v.pre_ln"))
        # every layer works in the same buffers: a large new array costs its page faults each time
        h, y, up = np.empty((T, n), np.float32), np.empty((T, n), np.float32), np.empty((T, self.n_ff), np.float32)
        work = AttentionWork(T, n)
        for L in self.layers:
            x += self.attention(self.norm(x, L.ln1, out=h), L, work=work, out=y, seq=P)
            self.norm(x, L.ln2, out=h)
            self.activation(self.linear(h, L.up, out=up, bias=False), self.floats(L.up[1]))
            x += self.linear(up, L.down, out=y)
        x = self.optional_norm(x, "v.post_ln")
        return np.concatenate([self.project(x[i * P:(i + 1) * P]) for i in range(m)])

    def attention(self, h: np.ndarray, L: EncoderLayer, block: int = 512, work: Optional["AttentionWork"] = None,
                  out: Optional[np.ndarray] = None, seq: Optional[int] = None) -> np.ndarray:
        """Every row attends to every row of its tile (`seq` rows each; default all of h), head by
        head, `block` query rows at a time (their scores stay in the cache: 8 MB at 4096 patches);
        the threads share the (tile, head, block) units."""
        T, H = h.shape[0], self.n_head
        P = T if seq is None else seq
        d, n_blocks = self.n_embd // H, -(-P // block)
        n = self.n_embd
        w = AttentionWork(T, n) if work is None else work
        qkv = self.linear(h, L.q, L.k, L.v, out=w.qkv)
        q, k, v = qkv[:, :n], qkv[:, n:2 * n], qkv[:, 2 * n:]
        isa = lib.pyllm_get_level()

        def units(lo: int, hi: int) -> int:
            scores, sums = np.empty((min(block, P), P), np.float32), np.empty(min(block, P), np.float32)
            tile_head = -1
            for u in range(lo, hi):
                if u // n_blocks != tile_head:
                    tile_head = u // n_blocks
                    rows, cols = slice(tile_head // H * P, (tile_head // H + 1) * P), slice(tile_head % H * d,
                                                                                           (tile_head % H + 1) * d)
                    qh = q[rows, cols] * np.float32(1.0 / math.sqrt(d))
                    kt, vh = np.ascontiguousarray(k[rows, cols].T), np.ascontiguousarray(v[rows, cols])
                a = u % n_blocks * block
                b = min(P, a + block)
                s = np.matmul(qh[a:b], kt, out=scores[:b - a])
                if lib.pyllm_dense_softmax_rows(isa, _ptr(s), b - a, P, P, _ptr(sums)):
                    return -1
                w.heads[rows.start + a:rows.start + b, cols] = (s @ vh) / sums[:b - a, None]   # normalized after
            return 0
        self.parallel(T // P * H * n_blocks, units, grain=1)
        return self.linear(w.heads, L.out, out=out)

    def project(self, x: np.ndarray) -> np.ndarray:
        """The encoder's rows [side * side, n_embd] into the language model's [n_tokens, n_out].
        Gemma 3: the average of each k x k patches, RMSNorm, one matmul. Idefics3: each k x k
        patches' rows side by side in one row (its pixel shuffle), one matmul."""
        side, k, n = self.side, self.merge, self.n_embd
        if self.projector == "gemma3":
            x = x.reshape(side // k, k, side // k, k, n).mean(axis=(1, 3)).reshape(-1, n)
            x = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + self.eps) * self.floats("mm.soft_emb_norm.weight")
            return np.ascontiguousarray(x @ self.floats("mm.input_projection.weight"), dtype=np.float32)
        # patch (r, c) -> row (r // k, c // k), at column block (c % k) + k (r % k), as transformers'
        # Idefics3 pixel_shuffle orders them
        x = x.reshape(side, side // k, k * n).transpose(1, 0, 2).reshape(side // k, side // k, k * k * n)
        x = x.transpose(1, 0, 2).reshape(-1, k * k * n)
        return np.ascontiguousarray(x @ self.floats("mm.model.fc.weight").T, dtype=np.float32)

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


# -- images -------------------------------------------------------------------------------------------

def image_bytes(image) -> bytes:
    """The encoded bytes of an image given as bytes, a path, a data: URL or base64 text."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, os.PathLike) or (isinstance(image, str) and os.path.isfile(image)):
        try:
            with open(image, "rb") as f:
                return f.read()
        except OSError as e:
            raise InvalidArgumentError(f"cannot read the image {image}: {e.strerror}") from None
    if isinstance(image, str):
        s = image.strip()
        if s.startswith("data:"):
            head, _, s = s.partition(",")
            if ";base64" not in head:
                raise InvalidArgumentError("an image data: URL must be base64 (data:image/png;base64,...)")
        elif s.startswith(("http://", "https://")):
            raise InvalidArgumentError("pyllm does not fetch images from the web: give the image's bytes as a "
                                       "data: URL (data:image/png;base64,...) or base64")
        try:
            return base64.b64decode(s, validate=True)
        except (binascii.Error, ValueError):
            shown = image if len(image) < 80 else image[:77] + "..."
            raise InvalidArgumentError(f"{shown!r} is neither an image file nor base64 image data") from None
    raise InvalidArgumentError(f"an image is bytes, a file path, a data: URL or base64 text, not "
                               f"{type(image).__name__}")


def load_image(image):
    """A PIL image in RGB, from anything image_bytes() takes (or a PIL image)."""
    from PIL import Image, UnidentifiedImageError
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    data = image_bytes(image)
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise InvalidArgumentError(f"cannot decode the image ({len(data)} bytes): {e}; give a PNG, JPEG, "
                                   f"WebP, GIF or BMP") from None
    return img.convert("RGB")


def fit_square(img, size: int):
    """img scaled (bilinear) to fit size x size with its aspect ratio kept, centred on black."""
    from PIL import Image
    w, h = img.size
    if (w, h) == (size, size):
        return img
    scale = min(size / w, size / h)
    nw, nh = min(size, max(1, math.ceil(w * scale))), min(size, max(1, math.ceil(h * scale)))
    canvas = Image.new("RGB", (size, size), (0, 0, 0))
    canvas.paste(img.resize((nw, nh), Image.BILINEAR), ((size - nw) // 2, (size - nh) // 2))
    return canvas


def scaled_to_longest_edge(width: int, height: int, longest: int) -> tuple[int, int]:
    """(width, height) with the longer side `longest`, the other in proportion, truncated and
    then made even (transformers' Idefics3 resize, which mtmd follows)."""
    if width >= height:
        other = int(longest / (width / height))
        return longest, max(1, other + other % 2)
    other = int(longest * (width / height))
    return max(1, other + other % 2), longest


def image_dimensions(image) -> tuple[int, int]:
    """(width, height) of an image (anything load_image takes), reading only its header."""
    from PIL import Image
    if isinstance(image, Image.Image):
        return image.size
    try:
        return Image.open(io.BytesIO(image_bytes(image))).size
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"cannot read the image: {e}") from None


# -- the rows of encoded images, by id ------------------------------------------------------------------

class MediaStore:
    """Encoded images, each under a run of negative token ids (-1-j for its row j
    after the store's earlier rows). The same picture gets the same ids again
    while it is kept, so a prompt that shows it again reuses the KV cache of
    the prefix that held it; ids are never given twice to different rows."""

    def __init__(self, keep: int = 32):
        self.keep = keep
        self._images: OrderedDict[bytes, tuple[int, np.ndarray]] = OrderedDict()   # key -> (first row, rows)
        self._next = 0
        self._lock = threading.Lock()

    def ids(self, key: bytes, encode) -> list[int]:
        """The ids of the image under `key`, encoding it (encode() -> rows) if it is not kept."""
        with self._lock:
            if key in self._images:
                self._images.move_to_end(key)
                first, rows = self._images[key]
                return [-1 - (first + j) for j in range(len(rows))]
        rows = encode()
        with self._lock:
            if key not in self._images:
                self._images[key] = (self._next, rows)
                self._next += len(rows)
                while len(self._images) > self.keep:
                    self._images.popitem(last=False)
            first, rows = self._images[key]
            return [-1 - (first + j) for j in range(len(rows))]

    def rows(self, ids: Sequence[int]) -> np.ndarray:
        """The rows of ids (all of one image, consecutive): float32 [len(ids), n]."""
        first = -1 - ids[0]
        with self._lock:
            for start, rows in self._images.values():
                if start <= first < start + len(rows):
                    j = first - start
                    if j + len(ids) > len(rows) or any(-1 - t != first + i for i, t in enumerate(ids)):
                        break
                    return rows[j:j + len(ids)]
        raise InvalidArgumentError("the prompt names image rows this model no longer holds (images are kept "
                                   f"for the last {self.keep}); send the image again")

    def image_of(self, token: int) -> int:
        """Which image a media id belongs to (its first row), to cut steps between images."""
        row = -1 - token
        with self._lock:
            for start, rows in self._images.values():
                if start <= row < start + len(rows):
                    return start
        return -1


def image_key(encoder: VisionEncoder, image) -> tuple[bytes, object]:
    """(a key naming this image for this projector, the image in a form encode() takes)."""
    from PIL import Image
    if isinstance(image, Image.Image):
        data = image.convert("RGB").tobytes() + repr(image.size).encode()
    else:
        data = image = image_bytes(image)
    return hashlib.sha256(encoder.path.encode() + b"\0" + data).digest(), image
