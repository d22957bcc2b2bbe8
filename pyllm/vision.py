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
    projector "lfm2": the same shuffle; rows = W2 gelu(W1 layernorm(x) + b1) + b2
    projector "pixtral" (Pixtral, Mistral Small 3.x): RMS norms, no learned positions but 2D
        RoPE on q and k (a patch's row in the first half of each head, its column in the
        second), a gated SiLU FFN; x = each k x k patches unfolded into one row, x Wmerge (when
        k > 1); rows = W2 gelu(W1 rmsnorm(x) + b1) + b2, and an [IMG_BREAK] row after each row
        of the image but the last
    projector "lightonocr" (LightOnOCR): Pixtral's encoder and projector, no [IMG_BREAK] rows; the
        image scaled so its longer side is preproc_image_size (up or down), between <|im_start|>
        and <|im_end|> (mtmd's)
    projector "paddleocr" (PaddleOCR-VL): SigLIP's encoder (layer norms, GELU) with learned positions
        resized to the image (plain bilinear, transformers'; mtmd antialiases) and the 2D RoPE of Qwen's on q and k (row,
        then column, by halves of each head); x = layernorm(x), then 2 x 2 patches side by side;
        rows = W2 gelu(W1 x + b1) + b2 (exact GELU, transformers' nn.GELU), M-RoPE positions as Qwen's
    projector "qwen2vl_merger" / "qwen2.5vl_merger": the two patch kernels of Qwen's temporal
        patch summed (a still image is both frames), a 2D RoPE on q and k (row, then column, by
        halves of each head); 2.5: RMS norms, a gated SiLU FFN, and attention within windows of
        112 pixels but in every n_wa_pattern-th layer; x = 2 x 2 patches' rows side by side;
        rows = W2 gelu(W0 x + b0) + b2; the language model gives the rows M-RoPE positions
        (row and column: Engine.mrope_positions)
    projector "gemma4v" (Gemma 4): pixels in [-1, 1]; positions from a table of columns plus one
        of rows; RMS norms, also of each head of q, k (weights) and v (none), and of the attention's
        and the FFN's outputs; a 2D RoPE (each half of a head NEOX-turned, by the column, by the
        row), unscaled scores, a gated FFN, each layer's output scaled, matrices clamped where
        the file says; x = avg_pool(x, 3 x 3) sqrt(n), standardized, rmsnorm(x); rows = x Wproj
    projector "gemma4uv" (Gemma 4 Unified): no encoder; each 48 x 48 pixels (in [0, 1]) a row:
        x = LN2(W LN1(patch) + b) + positions as Gemma 4's; rows = rmsnorm(LN3(x)) Wproj
    projector "mlp" (LLaVA 1.5 and its kin; CLIP): a class row before the patches (position 0),
        pre_ln, every stored layer (the converter already dropped the last), quick-GELU;
        rows = W2 gelu(W0 x + b0) + b2 of each patch's row, the class row left out (Yi-VL's
        "mlp_norm": a layer norm after each Linear). LLaVA 1.6 (image_grid_pinpoints): the whole
        image's rows, then the grid's tiles' packed (llava_next_rows). As transformers' LLaVA and
        LLaVA-NeXT; llama.cpp's mtmd, as of this writing, puts the class row last and runs one
        layer fewer (its issues 25814, 25817), and packs 1.6's rows otherwise
    projector "internvl" (InternVL 2.5 / 3 / 3.5): InternViT, a class row first (as LLaVA's; mtmd
        puts it last here too), each branch's output scaled (ls1, ls2) before it joins x; x = each
        2 x 2 patches side by side; rows = W3 gelu(W1 layernorm(x) + b1) + b3
    projector "qwen3vl_merger" (Qwen 3 VL, Qwen3.5): Qwen 2 VL's, with a patch bias, a fused qkv
        and learned positions resized to the image (bilinear, corners aligned); DeepStack: each
        marked layer's output, 2 x 2 patches side by side, through its own layernorm and GELU
        MLP, becomes a further slice of every row, rows = [merger | slice 1 | slice 2 ...] (the
        language model adds slice k after its layer k - 1)

Gemma 3 reads one image fitted into the square; Idefics3 (SmolVLM) reads the image
as tiles of the square plus an overview, each between marker tokens (layout()).
LFM2-VL reads an image of any shape (its sides made multiples of 2 patches, its
area within a budget of rows; the learned position grid resized to its patches),
and a large one as tiles of 512 pixels plus a thumbnail. Pixtral, Qwen 2 / 2.5 / 3 VL
and Gemma 4 read an image of any shape too, fitted (aspect kept, black bands) into its
planned size; `limit_tokens` moves that size's budget of rows (--image-min/max-tokens).

As llama.cpp's mtmd runs them: a patch is a stride-p convolution (here one
matmul over unfolded patches), patches are numbered row by row, attention is
scaled by 1/sqrt(head_dim) (Gemma 4's not at all), `clip.use_gelu` picks GELU (tanh
form) over quick-GELU, an image that is not square keeps its aspect ratio and is padded
with black. The encoder runs in float32: numpy's BLAS multiplies the matrices,
the core's dense kernels (csrc/dense.c) do the softmax, activations and norms,
and our threads split the work (rows, or attention's heads), BLAS held to one
thread each. It runs once per image, and its rows are kept (`MediaStore`), so a
conversation does not encode the same picture again.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import logging
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from .encoder import LayerWork, Tower
from .errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from .model_file import ModelFile

log = logging.getLogger("pyllm")

PROJECTORS = ("gemma3", "gemma4uv", "gemma4v", "idefics3", "internvl", "lfm2", "lightonocr", "mlp", "paddleocr",
              "pixtral", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")
PIXTRAL = ("pixtral", "lightonocr")   # Pixtral's encoder and projector (LightOnOCR's without [IMG_BREAK] rows)
QWEN = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")
GEMMA4 = ("gemma4v", "gemma4uv")     # Gemma 4's encoder, and Gemma 4 Unified's encoder-free embedder
LFM2_TILE = 512              # LFM2-VL's tiles (mtmd's and its processor's constants)
LFM2_TILES = (2, 10)         # the fewest and most tiles of a tiled image
LFM2_ROWS = (64, 256)        # the fewest and most rows of an image read whole (and of the thumbnail)
PIXTRAL_ROWS = (8, 1024)     # the fewest and most rows (before the breaks) of a Pixtral image
PIXTRAL_ROPE_BASE = 10000.0  # its 2D RoPE's (mtmd's constant), and Qwen's
QWEN_ROWS = (8, 4096)        # the fewest and most rows of a Qwen 2 / 2.5 VL image
QWEN_WINDOW = 112            # Qwen 2.5 VL's attention windows, in pixels a side (mtmd's constant)
GEMMA4_ROWS = (70, 1120)     # the fewest and most rows of a Gemma 4 image
GEMMA4_ROPE_BASE = 100.0     # its 2D RoPE's
GEMMA4_CAUSAL_WIDTHS = (1536, 2560)   # E2B's and E4B's: llama.cpp's mtmd reads their images causally
INTERNVL_TILES = (1, 12)     # the fewest and most tiles of an InternVL image, where its file does not say
LLAVA_PAD = (122, 116, 104)  # LLaVA's padding colour (CLIP's mean, as mtmd and LLaVA's pad-to-square use)


@dataclass(frozen=True)
class ImagePlan:
    """How an image is read: a grid of `cols` x `rows` tiles of `tile` (w, h) pixels, cut row by
    row, then `whole`, the whole image scaled to (w, h) (an overview after the tiles, or the only
    input when there are no tiles)."""
    cols: int
    rows: int
    tile: tuple
    whole: tuple

    @property
    def n_tiles(self) -> int:
        return self.cols * self.rows


@dataclass
class DeepStack:
    """Qwen 3 VL: the rows of encoder layer `layer` taken aside, each 2 x 2 patches side by side,
    through layernorm, Linear, GELU, Linear: an extra slice of each image row."""
    layer: int
    norm: tuple
    fc1: tuple
    fc2: tuple


class VisionEncoder(Tower):
    """An mmproj file's vision tower and projector. encode(image) -> float32
    [n_tokens, n_embd of the language model]."""

    tiles_at_once = 4    # 4 x 1024 patches: as fast as 16 here, 340 MB less at SmolVLM's size

    def __init__(self, path: str | os.PathLike, n_threads: Optional[int] = None,
                 min_tokens: Optional[int] = None, max_tokens: Optional[int] = None):
        """min_tokens, max_tokens: llama.cpp's --image-min-tokens / --image-max-tokens, the fewest
        and most rows an image becomes where the projector sizes images itself (None: its own)."""
        super().__init__(path, n_threads)
        try:
            self.limit_tokens(min_tokens, max_tokens)
        except BaseException:
            self.mf.close()
            raise

    def _read(self, mf: ModelFile) -> None:
        """The hyperparameters and tensors, every shape checked."""
        if mf.get("clip.has_vision_encoder") is False:
            raise UnsupportedModelError(f"{self.path} has no vision encoder (an audio projector: give it as "
                                        f"the model's mmproj and pass audio)")
        self.projector = str(mf.get("clip.vision.projector_type") or mf.get("clip.projector_type") or "")
        if self.projector == "qwen2.5o":    # Qwen2.5-Omni's legacy type: its pictures are Qwen 2.5 VL's
            self.projector = "qwen2.5vl_merger"
        if self.projector not in PROJECTORS:
            raise UnsupportedModelError(f"{self.path}: projector type {self.projector!r} is not supported yet "
                                        f"(supported: {', '.join(PROJECTORS)}: Gemma 3's, SmolVLM's, LFM2-VL's, "
                                        f"InternVL's, LLaVA 1.5's, Pixtral's / Mistral Small's, Qwen 2 / 2.5 / 3 "
                                        f"VL's, Qwen3.5's, Gemma 4's, Gemma 4 Unified's, LightOnOCR's and PaddleOCR-VL's)")
        if self.projector == "gemma4uv":
            return self._read_gemma4_unified()
        self.n_embd, self.n_head = self._int("embedding_length"), self._int("attention.head_count")
        self.n_ff, self.n_layer = self._int("feed_forward_length"), self._int("block_count")
        self.image_size, self.patch = self._int("image_size"), self._int("patch_size")
        eps = mf.get("clip.vision.attention.layer_norm_epsilon", 1e-6)
        if not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ModelFileError(f"{self.path}: clip.vision.attention.layer_norm_epsilon is {eps!r}; the file is corrupt")
        self.eps = float(eps)
        self.mean = self._triple("clip.vision.image_mean")
        self.std = self._triple("clip.vision.image_std")
        # PaddleOCR-VL's image_size is its most pixels' square root: its positions' grid is the table's
        if self.n_embd % self.n_head or (self.image_size % self.patch and self.projector != "paddleocr"):
            raise ModelFileError(f"{self.path}: {self.n_head} heads do not divide {self.n_embd}, or patches of "
                                 f"{self.patch} do not tile {self.image_size}; the file is corrupt")
        self.gelu = bool(mf.get("clip.use_gelu", False))    # else quick-gelu, x sigmoid(1.702 x)
        self.side = self.image_size // self.patch              # patches per side (of the learned positions)
        if self.projector == "paddleocr":
            t = mf.tensor("v.position_embd.weight") if mf.has_tensor("v.position_embd.weight") else None
            self.side = math.isqrt(int(t.shape[-1])) if t is not None else 0
        # Gemma 3 pools 4 x 4 patches into a row; Idefics3 (SmolVLM), LFM2 and Qwen stack s x s patches'
        # rows; Pixtral unfolds s x s patches (1: none, the original Pixtral)
        self.qwen = self.projector in QWEN
        self.mrope = self.qwen or self.projector == "paddleocr"    # rows at M-RoPE positions of their grid
        self.merge = 1 if self.projector == "mlp" else \
            self._int("spatial_merge_size", 1 if self.projector in PIXTRAL else 2) \
            if self.projector in PIXTRAL or self.qwen else \
            self._int("projector.scale_factor", {"gemma3": 4, "gemma4v": 3}.get(self.projector, 2))
        if self.side % self.merge and self.projector not in ("gemma4v", "paddleocr"):   # resized or unused
            raise ModelFileError(f"{self.path}: a merge of {self.merge} does not divide {self.side} patches")
        self.n_tokens = (self.side // self.merge) ** 2        # rows per tile of image_size
        self.check_shape("v.patch_embd.weight", (self.patch, self.patch, 3, self.n_embd))
        # Pixtral's and Qwen 2.5's norms are RMS norms; their positions are a 2D RoPE
        self.rms = self.projector in ("pixtral", "lightonocr", "qwen2.5vl_merger", "gemma4v")
        # a gated FFN's activation: Gemma 4's the file's GELU or quick-GELU, the others' (Pixtral, Qwen 2.5) SiLU
        self.gated_act = self.gelu if self.projector == "gemma4v" else "silu"
        self.deepstack: list[DeepStack] = []
        # CLIP's (LLaVA's) and InternViT's class row: read with the patches (position 0), left out of
        # the image's rows
        self.class_row = self.projector == "internvl" or (self.projector == "mlp" and self.mf.has_tensor("v.class_embd"))
        if self.class_row:
            self.check_shape("v.class_embd", (self.n_embd,))
        if self.projector == "gemma4v":    # a table of columns, then one of rows
            t = self.mf.tensor("v.position_embd.weight") if self.mf.has_tensor("v.position_embd.weight") else None
            self.n_positions = int(t.shape[1]) if t is not None and len(t.shape) == 3 else 0
            self.check_shape("v.position_embd.weight", (self.n_embd, self.n_positions, 2))
        elif self.projector not in PIXTRAL and self.projector not in QWEN[:2]:    # Qwen 3's are resized
            self.check_shape("v.position_embd.weight", (self.n_embd, self.side * self.side + self.class_row))
        if self.qwen:     # a still image is both frames of Qwen's temporal patch: the kernels' sum
            self.check_shape("v.patch_embd.weight.1", (self.patch, self.patch, 3, self.n_embd))
        self.align = self.patch * self.merge                  # LFM2: an image's sides are multiples of this
        if self.projector == "gemma4v":   # the image at its own shape between <|image> and <image|>
            self.bidirectional = True
            self.n_out = self._projection("mm.input_projection.weight", self.n_embd, inputs_first=True)
            if self.align > 64 or (self.n_embd // self.n_head) % 4:
                raise ModelFileError(f"{self.path}: patches of {self.patch} pooled {self.merge} x {self.merge}, or heads "
                                     f"of {self.n_embd // self.n_head} (not a multiple of 4), are beyond Gemma 4's; "
                                     f"the file is corrupt")
            for name in ("v.std_bias", "v.std_scale"):
                if self.mf.has_tensor(name):
                    self.check_shape(name, (self.n_embd,))
            self.pixel_budget = tuple(r * self.align ** 2 for r in GEMMA4_ROWS)
            self.longest_edge = self.image_size
            self.read_clamps()
        elif self.projector == "gemma3":
            self.bidirectional = True    # an image's rows see each other (mtmd: Gemma 3's do)
            self.n_out = self._projection("mm.input_projection.weight", self.n_embd, inputs_first=False)
            self.check_shape("mm.soft_emb_norm.weight", (self.n_embd,))
            self.longest_edge = self.image_size
        elif self.projector == "mlp":   # LLaVA 1.5: the image fitted into the square, its rows alone
            self.bidirectional = False
            if self.mf.get("clip.vision.feature_layer") is not None:
                raise UnsupportedModelError(f"{self.path}: rows from several encoder layers (Granite Vision's, "
                                            f"clip.vision.feature_layer) are not supported yet; LLaVA 1.5's and "
                                            f"1.6's projectors are")
            self.pinpoints = self._pinpoints()     # LLaVA 1.6's grids, (height, width) in pixels
            n_mid = self._projection("mm.0.weight", self.n_embd, inputs_first=True)
            self.mlp_norms = None
            if self.mf.has_tensor("mm.3.weight"):    # Yi-VL's: a layer norm after each Linear (mtmd's mlp_norm)
                self.n_out = self._projection("mm.3.weight", n_mid, inputs_first=True)
                self.mlp = (self._pair("mm.0", (self.n_embd, n_mid)), self._pair("mm.3", (n_mid, self.n_out)))
                self.mlp_norms = (self._pair("mm.1", (n_mid,)), self._pair("mm.4", (self.n_out,)))
            else:
                self.n_out = self._projection("mm.2.weight", n_mid, inputs_first=True)
                self.mlp = (self._pair("mm.0", (self.n_embd, n_mid)), self._pair("mm.2", (n_mid, self.n_out)))
            self.newline = None    # LLaVA 1.6's row that ends each row of the grid's patches ("spatial_unpad")
            merge = self.mf.get("clip.vision.mm_patch_merge_type", "spatial_unpad")
            if self.pinpoints and merge not in ("spatial_unpad", "flat"):
                raise UnsupportedModelError(f"{self.path}: a patch merge of {merge!r} is not supported (LLaVA 1.6's: "
                                            f"spatial_unpad or flat)")
            if self.pinpoints and merge == "spatial_unpad":
                self.newline = next((n for n in ("model.image_newline", "v.image_newline") if self.mf.has_tensor(n)),
                                    None)
                if self.newline is None:
                    raise ModelFileError(f"{self.path}: LLaVA 1.6's image_newline tensor is missing; the file is corrupt")
                self.check_shape(self.newline, (self.n_out,))
            self.longest_edge = self.image_size
        elif self.projector == "internvl":   # tiles of the square, then an overview, between <img> and </img>
            self.bidirectional = False
            if self.mf.has_tensor("v.blk.0.attn_q_norm.weight"):
                raise UnsupportedModelError(f"{self.path}: InternViT-6B's encoder (q and k norms; InternVL 26B and "
                                            f"larger) is not supported yet; the 300M one of InternVL 1B to 14B is")
            n_in = self.n_embd * self.merge ** 2
            n_mid = self._projection("mm.model.mlp.1.weight", n_in, inputs_first=True)
            self.n_out = self._projection("mm.model.mlp.3.weight", n_mid, inputs_first=True)
            self.input_norm = self._pair("mm.model.mlp.0", (n_in,))
            self.mlp = (self._pair("mm.model.mlp.1", (n_in, n_mid)), self._pair("mm.model.mlp.3", (n_mid, self.n_out)))
            lo, hi = self._int("preproc_min_tiles", INTERNVL_TILES[0]), self._int("preproc_max_tiles", INTERNVL_TILES[1])
            if lo > hi or hi > 64:
                raise ModelFileError(f"{self.path}: {lo} to {hi} tiles an image is beyond InternVL's; the file is "
                                     f"corrupt")
            self.tile_grids = internvl_grids(lo, hi)
            self.longest_edge = self.image_size
        elif self.projector == "idefics3":   # tiles of the image and a downscaled whole, between marker tokens
            self.bidirectional = False
            self.n_out = self._projection("mm.model.fc.weight", self.n_embd * self.merge ** 2, inputs_first=True)
            # the image is scaled so its longer side is this long, then cut into tiles
            self.longest_edge = self._int("preproc_image_size", self.image_size)
        elif self.projector == "lfm2":   # the image at its own shape (or tiles and a thumbnail), between markers
            self.bidirectional = False
            n_in = self.n_embd * self.merge ** 2
            n_mid = self._projection("mm.1.weight", n_in, inputs_first=True)
            self.n_out = self._projection("mm.2.weight", n_mid, inputs_first=True)
            self.mlp = (self._pair("mm.1", (n_in, n_mid)), self._pair("mm.2", (n_mid, self.n_out)))
            self.input_norm = self._pair("mm.input_norm", (n_in,)) if self.mf.has_tensor("mm.input_norm.weight") \
                else None
            if self.align > 64:    # real ones: 32; a larger one would make pictures of gigabytes
                raise ModelFileError(f"{self.path}: patches of {self.patch} merged {self.merge} x {self.merge} are "
                                     f"beyond LFM2's; the file is corrupt")
            self.pixel_budget = tuple(r * self.align ** 2 for r in LFM2_ROWS)
            self.longest_edge = LFM2_TILE
        elif self.projector == "paddleocr":   # the image at its own shape between <|IMAGE_START|> and <|IMAGE_END|>
            self.bidirectional = False
            if (self.n_embd // self.n_head) % 4 or self.align > 64 or self.merge != 2 or not self.side:
                raise ModelFileError(f"{self.path}: heads of {self.n_embd // self.n_head} (not a multiple of 4), "
                                     f"patches of {self.patch}, a merge of {self.merge} (not 2) or a table of "
                                     f"{self.side} positions a side are beyond PaddleOCR-VL's; the file is corrupt")
            n_mid = self._projection("mm.1.weight", self.n_embd * 4, inputs_first=True)
            self.n_out = self._projection("mm.2.weight", n_mid, inputs_first=True)
            self.mlp = (self._pair("mm.1", (self.n_embd * 4, n_mid)), self._pair("mm.2", (n_mid, self.n_out)))
            self.input_norm = self._pair("mm.input_norm", (self.n_embd,))
            lo, hi = self._int("image_min_pixels"), self._int("image_max_pixels")
            if lo > hi or hi > 1 << 26:
                raise ModelFileError(f"{self.path}: images of {lo} to {hi} pixels are beyond PaddleOCR-VL's; the "
                                     f"file is corrupt")
            self.pixel_budget = (lo, hi)
            self.longest_edge = 0
        elif self.qwen:   # Qwen 2 / 2.5 VL: the image at its own shape between <|vision_start|> and <|vision_end|>
            self.bidirectional = False
            if (self.n_embd // self.n_head) % 4 or self.align > 64 or self.merge != 2:
                raise ModelFileError(f"{self.path}: heads of {self.n_embd // self.n_head} (not a multiple of 4), "
                                     f"patches of {self.patch} or a merge of {self.merge} (not 2) are beyond Qwen "
                                     f"VL's; the file is corrupt")
            # Qwen 2.5: every n-th layer sees the whole image, the others windows of it
            self.window_every = self._int("n_wa_pattern") if self.projector == "qwen2.5vl_merger" else 0
            n_mid = self._projection("mm.0.weight", self.n_embd * 4, inputs_first=True)
            n_lm = self._projection("mm.2.weight", n_mid, inputs_first=True)
            self.mlp = (self._pair("mm.0", (self.n_embd * 4, n_mid)), self._pair("mm.2", (n_mid, n_lm)))
            self.deepstack = [self._deepstack(i, n_lm) for i in range(self.n_layer)
                              if self.mf.has_tensor(f"v.deepstack.{i}.fc1.weight")]
            self.n_out = n_lm * (1 + len(self.deepstack))     # the row, then DeepStack's slices
            self.input_norm = None
            self.pixel_budget = tuple(r * self.align ** 2 for r in QWEN_ROWS)
            self.longest_edge = self.image_size
        else:   # pixtral: the image at its own shape, its rows then [IMG_END]; lightonocr: the same, scaled
            self.bidirectional = False
            if (self.n_embd // self.n_head) % 4 or self.align > 64:
                raise ModelFileError(f"{self.path}: heads of {self.n_embd // self.n_head} (not a multiple of 4) or "
                                     f"patches of {self.patch} merged {self.merge} x {self.merge} are beyond "
                                     f"Pixtral's; the file is corrupt")
            # Mistral Small's merge of k x k patches (with its norm); the original Pixtral has none
            self.input_norm = self._pair("mm.input_norm", (self.n_embd,)) if self.merge > 1 else None
            self.merger = self._pair("mm.patch_merger", (self.n_embd * self.merge ** 2, self.n_embd)) \
                if self.merge > 1 else None
            n_mid = self._projection("mm.1.weight", self.n_embd, inputs_first=True)
            self.n_out = self._projection("mm.2.weight", n_mid, inputs_first=True)
            self.mlp = (self._pair("mm.1", (self.n_embd, n_mid)), self._pair("mm.2", (n_mid, self.n_out)))
            if self.projector == "pixtral":
                self.check_shape("v.token_embd.img_break", (self.n_out,))
                self.pixel_budget = tuple(r * self.align ** 2 for r in PIXTRAL_ROWS)
                self.longest_edge = self.image_size
            else:   # no bounds on the rows but --image-min/max-tokens (mtmd's longest_edge preprocessor)
                self.pixel_budget = (0, 0)
                self.longest_edge = self._int("preproc_image_size", self.image_size)
        if self.image_size > 4096 or self.longest_edge > 16384:   # a picture of gigabytes: a corrupt file
            raise ModelFileError(f"{self.path}: an image size of {self.image_size} (scaled to "
                                 f"{self.longest_edge}) is beyond any projector's; the file is corrupt")
        self.layers = self._layers()

    def _read_gemma4_unified(self) -> None:
        """Gemma 4 Unified's embedder (gemma4_unified_rows): no layers; patches of patch_size x k
        pixels (k: projector.scale_factor, the pooling Gemma 4's encoder does after its layers),
        an image at its own shape as Gemma 4's."""
        self.n_embd, self.n_head, self.n_ff, self.n_layer = self._int("embedding_length"), 0, 0, 0
        self.patch = self._int("patch_size") * self._int("projector.scale_factor", 3)
        self.image_size, self.merge, self.side, self.n_tokens = self._int("image_size"), 1, 0, 0
        eps = self.mf.get("clip.vision.attention.layer_norm_epsilon", 1e-6)     # the RMS norm's
        if not isinstance(eps, (int, float)) or not 0 < eps < 1 or self.patch > 64 or self.n_embd > 65536:
            raise ModelFileError(f"{self.path}: an epsilon of {eps!r}, patches of {self.patch} or a width of "
                                 f"{self.n_embd} is beyond Gemma 4 Unified's; the file is corrupt")
        self.eps, self.gelu, self.bidirectional, self.class_row = float(eps), True, True, False
        self.qwen, self.mrope, self.deepstack = False, False, []
        self.mean, self.std = self._triple("clip.vision.image_mean"), self._triple("clip.vision.image_std")
        n_in = 3 * self.patch * self.patch
        self.check_shape("v.patch_embd.weight", (n_in, self.n_embd))
        self.check_shape("v.patch_embd.bias", (self.n_embd,))
        self.patch_norms = [self._pair(f"v.patch_norm.{i}", (width,)) for i, width in
                            ((1, n_in), (2, self.n_embd), (3, self.n_embd))]
        if any(b is None for _, b in self.patch_norms):
            raise ModelFileError(f"{self.path}: a patch norm's bias is missing; the file is corrupt")
        t = self.mf.tensor("v.position_embd.weight") if self.mf.has_tensor("v.position_embd.weight") else None
        self.n_positions = int(t.shape[1]) if t is not None and len(t.shape) == 3 else 0
        self.check_shape("v.position_embd.weight", (self.n_embd, self.n_positions, 2))
        self.n_out = self._projection("mm.input_projection.weight", self.n_embd, inputs_first=True)
        self.align = self.patch
        self.pixel_budget = tuple(r * self.align ** 2 for r in GEMMA4_ROWS)
        self.longest_edge = self.image_size
        self.layers = []

    def bidirectional_for(self, n_embd: int) -> bool:
        """Whether an image's rows see each other in a language model n_embd wide (Gemma 3's and 4's
        do, but for Gemma 4 E2B's and E4B's widths, which llama.cpp's mtmd reads causally)."""
        return self.bidirectional and not (self.projector == "gemma4v" and n_embd in GEMMA4_CAUSAL_WIDTHS)

    def describe(self) -> dict:
        """What `pyllm info` says of a projector file."""
        return {"path": self.path, "kind": "multimodal projector (mmproj)", "projector": self.projector,
                "image_size": self.image_size, "patch_size": self.patch, "patches": self.side * self.side,
                "image_tokens": self.image_tokens(),
                "n_layer": self.n_layer, "n_embd": self.n_embd, "n_head": self.n_head,
                "n_ff": self.n_ff, "n_embd_out": self.n_out, "n_params": self.mf.n_params,
                "tensor_types": self.mf.type_histogram(),
                "activation": "none (no encoder)" if not self.n_layer else "gelu (tanh)" if self.gelu else "quick-gelu",
                "image_mean": [float(x) for x in self.mean], "image_std": [float(x) for x in self.std]}

    def image_tokens(self):
        """How many rows an image becomes (`pyllm info`)."""
        if self.projector == "mlp" and self.pinpoints:
            return (f"{self.n_tokens} for the image in one square, then those of the grid's squares that show it"
                    f"{' and a newline row after each row of them' if self.newline else ''}")
        if self.projector in ("gemma3", "mlp"):
            return self.n_tokens
        if self.projector == "idefics3":
            return f"{self.n_tokens} per tile (tiles of the image scaled to {self.longest_edge}, and an overview)"
        if self.projector == "internvl":
            most = max(c * r for c, r in self.tile_grids)
            return f"{self.n_tokens} per tile (an image past {self.image_size} pixels: up to {most} tiles and an overview)"
        lo, hi = (b // self.align ** 2 for b in self.pixel_budget)
        if self.projector == "lightonocr":
            most = (self.longest_edge // self.align) ** 2
            return (f"up to {most} (the image scaled so its longer side is {self.longest_edge} pixels)"
                    + (f", kept within {lo or 1} to {hi or most}" if lo or hi else ""))
        if self.projector == "lfm2":
            return (f"{lo} to {hi} (the image at its own shape; a large one in tiles of "
                    f"{LFM2_TILE} pixels, {self.rows_of(LFM2_TILE, LFM2_TILE)} each, and a thumbnail)")
        breaks = ", and a break after each row" if self.projector == "pixtral" else ""
        return f"{lo} to {hi} (the image at its own shape{breaks})"

    def limit_tokens(self, lo: Optional[int], hi: Optional[int]) -> None:
        """Sets the fewest and most rows (merged patches) of an image read at its own shape
        (LFM2's, Pixtral's, Qwen's, Gemma 4's; each projector's own where None), as llama.cpp's
        --image-min-tokens and --image-max-tokens do; a projector of fixed-size tiles (Gemma 3,
        SmolVLM) ignores them, saying so."""
        if lo is None and hi is None:
            return
        for name, v in (("--image-min-tokens", lo), ("--image-max-tokens", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 20):
                raise InvalidArgumentError(f"{name} must be a positive number of image rows, not {v!r}")
        if not hasattr(self, "pixel_budget"):
            log.warning("%s reads images in tiles of a fixed size: the image token limits are ignored", self.projector)
            return
        area = self.align ** 2
        if self.projector == "lightonocr":   # no bounds of its own: each limit alone, as mtmd's
            if lo is not None and hi is not None and lo > hi:
                raise InvalidArgumentError(f"an image cannot take at least {lo} and at most {hi} rows")
            self.pixel_budget = ((lo or 0) * area, (hi or 0) * area)
            return
        own_lo, own_hi = (b // area for b in self.pixel_budget)
        if lo is None or hi is None:   # one limit given: the other of its own, moved aside where they would cross
            lo, hi = (min(own_lo, hi) if lo is None else lo), (max(own_hi, lo) if hi is None else hi)
        if lo > hi:
            raise InvalidArgumentError(f"an image cannot take at least {lo} and at most {hi} rows")
        self.pixel_budget = (lo * area, hi * area)

    # -- reading the file ---------------------------------------------------------------------------
    def _triple(self, key: str) -> np.ndarray:
        v = self.mf.get(key)
        try:
            a = np.asarray(v, dtype=np.float32).reshape(3)
        except (TypeError, ValueError):
            raise ModelFileError(f"{self.path}: {key} is not three numbers; the file is corrupt") from None
        if key.endswith("std") and not np.all(a > 0):
            raise ModelFileError(f"{self.path}: {key} has a value that is not positive")
        return a

    def _pinpoints(self) -> list:
        """LLaVA 1.6's grids: clip.vision.image_grid_pinpoints, (height, width) pairs in pixels, each a
        whole number of the encoder's squares (none: LLaVA 1.5's single square)."""
        v = self.mf.get("clip.vision.image_grid_pinpoints")
        if v is None:
            return []
        S = self.image_size
        try:
            flat = [int(x) for x in v]
        except (TypeError, ValueError):
            flat = []
        pairs = list(zip(flat[0::2], flat[1::2]))
        if not pairs or len(flat) % 2 or len(pairs) > 64 or any(h <= 0 or w <= 0 or h % S or w % S or h * w > 64 * S * S
                                                               for h, w in pairs):
            raise ModelFileError(f"{self.path}: clip.vision.image_grid_pinpoints is not a list of (height, width) "
                                 f"sizes of up to 64 squares of {S} pixels; the file is corrupt")
        return pairs

    def _deepstack(self, i: int, n_lm: int) -> DeepStack:
        p, n = f"v.deepstack.{i}.", self.n_embd * 4
        n_mid = self._projection(p + "fc1.weight", n, inputs_first=True)
        return DeepStack(i, self._pair(p + "norm", (n,)), self._pair(p + "fc1", (n, n_mid)),
                         self._pair(p + "fc2", (n_mid, n_lm)))

    # -- running ------------------------------------------------------------------------------------
    def pixels(self, image) -> np.ndarray:
        """The image's first input (tile) as the encoder reads it: float32 [3, H, W], normalized."""
        return self.normalize(self.tiles(load_image(image))[0])

    def normalize(self, rgb: np.ndarray) -> np.ndarray:
        """uint8 [H, W, 3] -> float32 [3, H, W], each channel (v / 255 - mean) / std."""
        x = np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) / 255.0
        return (x - self.mean[:, None, None]) / self.std[:, None, None]

    def encode(self, image) -> np.ndarray:
        """An image (bytes, a path, a data: URL, a PIL image) -> float32 [rows, n_out]: the rows
        of its inputs (tiles, then the overview) in the order layout() shows them."""
        img = load_image(image)
        rows = self.encode_pixels([self.normalize(t) for t in self.tiles(img)])
        return self.llava_next_rows(rows, *img.size) if self.projector == "mlp" and self.pinpoints else rows

    def llava_next_rows(self, rows: np.ndarray, width: int, height: int) -> np.ndarray:
        """LLaVA 1.6's rows from its inputs' (the grid's tiles, then the whole image in one square),
        as transformers' LLaVA-NeXT packs them: the whole image's rows first; then the grid's rows
        put back into one picture of patches, cut to the image's own aspect ratio (the padding's
        rows or columns left out) and a newline row after each of its rows ("spatial_unpad");
        "flat": the tiles' rows as they are."""
        plan = self.plan(width, height)
        P, side = self.n_tokens, self.side
        grid, whole = rows[:plan.n_tiles * P], rows[plan.n_tiles * P:]
        if self.newline is None:
            return np.concatenate([whole, grid])
        x = grid.reshape(plan.rows, plan.cols, side, side, -1).transpose(0, 2, 1, 3, 4)
        x = x.reshape(plan.rows * side, plan.cols * side, -1)
        h, w = x.shape[:2]
        if width / height > w / h:     # a wide image: bands above and below
            cut = (h - int(round(height * (w / width), 7))) // 2
            x = x[cut:h - cut]
        else:
            cut = (w - int(round(width * (h / height), 7))) // 2
            x = x[:, cut:w - cut]
        newline = np.broadcast_to(self.floats(self.newline), (x.shape[0], 1, x.shape[2]))
        return np.concatenate([whole, np.concatenate([x, newline], axis=1).reshape(-1, x.shape[2])])

    def mrope_grid(self, width: int, height: int) -> Optional[tuple]:
        """(cols, rows) of the rows an image of width x height pixels becomes, for M-RoPE
        positions (Qwen's), else None."""
        if not self.mrope:
            return None
        w, h = self.plan(width, height).whole
        return w // self.align, h // self.align

    def rows_of(self, width: int, height: int) -> int:
        """Rows an input of width x height pixels becomes (Pixtral's with its breaks)."""
        cols, rows = width // self.patch // self.merge, height // self.patch // self.merge
        return cols * rows + (rows - 1 if self.projector == "pixtral" else 0)     # Pixtral's [IMG_BREAK] rows

    def plan(self, width: int, height: int) -> ImagePlan:
        """How an image of width x height pixels is read (see ImagePlan)."""
        S = self.image_size
        if self.projector == "mlp" and self.pinpoints:
            h, w = best_resolution(width, height, self.pinpoints)
            return ImagePlan(w // S, h // S, (S, S), (S, S))
        if self.projector in ("gemma3", "mlp"):
            return ImagePlan(0, 0, (S, S), (S, S))
        if self.projector == "idefics3":
            cols, rows = self.grid(width, height)
            return ImagePlan(cols, rows, (S, S), (S, S))
        if self.projector == "internvl":
            cols, rows = best_grid(width, height, self.tile_grids, S) if width > S or height > S else (0, 0)
            return ImagePlan(cols, rows, (S, S), (S, S))
        if self.projector == "lightonocr":
            whole = longest_edge_size(width, height, self.align, self.longest_edge, *self.pixel_budget)
            return ImagePlan(0, 0, whole, whole)
        whole = smart_resize(width, height, self.align, *self.pixel_budget)
        if self.projector in ("pixtral", "paddleocr") + GEMMA4 or self.qwen:
            return ImagePlan(0, 0, whole, whole)
        if not lfm2_tiles(width, height, self.patch, self.align, self.pixel_budget[1]):
            return ImagePlan(0, 0, (LFM2_TILE, LFM2_TILE), whole)
        cols, rows = lfm2_grid(width, height)
        return ImagePlan(cols, rows, (LFM2_TILE, LFM2_TILE), whole)

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(columns, rows) of an Idefics3 image's tiles, as mtmd computes them: the image scaled
        so its longer side is longest_edge (the scale in float32), each side rounded up to whole
        tiles."""
        S, L = self.image_size, np.float32(self.longest_edge)
        scale = min(L / np.float32(width), L / np.float32(height))
        return (math.ceil(float(np.float32(width) * scale) / S), math.ceil(float(np.float32(height) * scale) / S))

    def tiles(self, img) -> list[np.ndarray]:
        """An RGB PIL image as the encoder's inputs, uint8 [H, W, 3] each, in plan() order.
        Gemma 3: the image fitted into the square. Idefics3, as mtmd (and transformers'
        processor) does it: the image scaled (Lanczos) so its longer side is longest_edge,
        stretched over the grid's tiles, cut row by row; then that stretched image shrunk to
        one tile (the overview). LFM2, as mtmd does it (bilinear): the tiles cut from the image
        fitted into the grid (centred on black), then the whole image at its planned size.
        Pixtral and Qwen: the image fitted into its planned size (bicubic, centred on black).
        LLaVA 1.5: the image fitted into the square (bicubic, centred on LLAVA_PAD); 1.6: the tiles
        of the image fitted into its best grid (bicubic, on black), then the whole stretched to one. InternVL, as mtmd
        does it: an image larger than the square as the tiles of its best grid (llava-uhd's
        choice, best_grid), then the whole image stretched to the square (bicubic)."""
        from PIL import Image
        S = self.image_size
        if self.projector == "gemma3":
            return [np.asarray(fit_square(img, S))]
        plan = self.plan(*img.size)
        if self.projector == "internvl" or (self.projector == "mlp" and self.pinpoints):
            # the tiles of the image fitted into the grid (bicubic, on black), then the whole stretched
            grid = fit(img, plan.cols * S, plan.rows * S, bicubic=True) if plan.n_tiles else None
            return cut(grid, plan) + [np.asarray(resample(img, S, S, bicubic=True))]
        if self.projector == "mlp":
            return [np.asarray(fit(img, S, S, bicubic=True, pad=LLAVA_PAD))]
        if self.projector in PIXTRAL + GEMMA4 + ("paddleocr",) or self.qwen:    # mtmd's dynamic size: bicubic
            return [np.asarray(fit(img, *plan.whole, bicubic=True))]
        if self.projector == "lfm2":
            tw, th = plan.tile
            grid = fit(img, plan.cols * tw, plan.rows * th) if plan.n_tiles else None
            return cut(grid, plan) + [np.asarray(resample(img, *plan.whole))]

        def resized(im, size):
            return im if im.size == size else im.resize(size, Image.LANCZOS)
        stretched = resized(resized(img, scaled_to_longest_edge(*img.size, self.longest_edge)),
                            (plan.cols * S, plan.rows * S))
        return cut(stretched, plan) + [np.asarray(resized(stretched, (S, S)))]

    def layout(self, ids: list[int], image) -> list:
        """The prompt around an image's rows `ids` (encode()'s): pieces of text (special tokens
        read, each piece tokenized on its own as mtmd does) and runs of ids."""
        if self.projector == "gemma3":
            return ["<start_of_image>", ids, "<end_of_image>"]
        if self.projector == "pixtral":
            return [ids, "[IMG_END]"]
        if self.projector == "lightonocr":
            return ["<|im_start|>", ids, "<|im_end|>"]
        if self.projector == "paddleocr":
            return ["<|IMAGE_START|>", ids, "<|IMAGE_END|>"]
        if self.projector in GEMMA4:
            return ["<|image>", ids, "<image|>"]
        if self.projector == "mlp":
            return [ids]
        if self.projector == "internvl":    # the tiles' rows, then the overview's, in one run
            return ["<img>", ids, "</img>"]
        if self.qwen:
            return ["<|vision_start|>", ids, "<|vision_end|>"]
        plan = self.plan(*image_dimensions(image))
        per_tile, last = self.rows_of(*plan.tile) if plan.n_tiles else 0, self.rows_of(*plan.whole)
        if len(ids) != plan.n_tiles * per_tile + last:
            raise InvalidArgumentError(f"an image of {plan.cols} x {plan.rows} tiles has "
                                       f"{plan.n_tiles * per_tile + last} rows, not {len(ids)}")
        tiles = [ids[k * per_tile:(k + 1) * per_tile] for k in range(plan.n_tiles)]
        whole = ids[len(ids) - last:]
        parts: list = []
        if self.projector == "lfm2":
            for k, rows in enumerate(tiles):
                parts += [f"<|img_row_{k // plan.cols + 1}_col_{k % plan.cols + 1}|>", rows]
            return ["<|image_start|>"] + parts + (["<|img_thumbnail|>"] if tiles else []) + [whole, "<|image_end|>"]
        for k, rows in enumerate(tiles):
            parts += [f"<fake_token_around_image><row_{k // plan.cols + 1}_col_{k % plan.cols + 1}>", rows]
            if k % plan.cols == plan.cols - 1 and k < len(tiles) - 1:
                parts.append("\n")
        return parts + ["\n\n", "<fake_token_around_image><global-img>", whole, "<fake_token_around_image>"]

    def encode_pixels(self, pixels) -> np.ndarray:
        """Normalized inputs, float [3, H, W], [m, 3, H, W] or a list of [3, H, W] -> their rows
        in order. Gemma 3 and Idefics3 read squares of image_size; LFM2 and Pixtral any sides
        that are multiples of their merged patches."""
        inputs = [pixels] if isinstance(pixels, np.ndarray) and pixels.ndim == 3 else list(pixels)
        S, a = self.image_size, self.align
        for x in inputs:
            any_shape = self.projector in ("lfm2", "paddleocr") + PIXTRAL + GEMMA4 or self.qwen
            fits = x.shape[-2] % a == 0 and x.shape[-1] % a == 0 and x.shape[-2] > 0 and x.shape[-1] > 0 \
                if any_shape else x.shape[-2:] == (S, S)
            if x.ndim != 3 or x.shape[0] != 3 or not fits:
                raise InvalidArgumentError(f"pixels must be [3, H, W] with H and W multiples of {a}, not "
                                           f"{list(x.shape)}" if any_shape else
                                           f"pixels must be [3, {S}, {S}] each, not {list(x.shape)}")
        # one image at a time, its work split among our threads; BLAS's own threads would only
        # contend with them (and spin while the C kernels run)
        with self._lock, threadpool_limits(limits=1, user_api="blas"):
            try:   # inputs of one shape several at a time: larger matrix products, bounded memory
                out, i = [], 0
                while i < len(inputs):
                    j = i + 1
                    while j < len(inputs) and j - i < self.tiles_at_once and inputs[j].shape == inputs[i].shape:
                        j += 1
                    out.append(self._encode(np.stack(inputs[i:j]).astype(np.float32)))
                    i = j
                return np.concatenate(out)
            finally:
                self._buffers.clear()

    def positions(self, rows: int, cols: int) -> np.ndarray:
        """The learned position rows for a grid of rows x cols patches: the table itself when it
        is that grid, else the table resized as llama.cpp does it: LFM2's bilinear with
        antialiasing (PyTorch's interpolate), Qwen 3's bilinear with the corners aligned,
        PaddleOCR-VL's plain bilinear (transformers'; mtmd antialiases it too).
        [rows * cols, n_embd]"""
        table = self.floats("v.position_embd.weight")
        if (rows, cols) == (self.side, self.side):
            return table
        grid = table.reshape(self.side, self.side, self.n_embd).astype(np.float64)
        # Qwen 3's corners aligned; PaddleOCR-VL's plain bilinear as transformers' (mtmd antialiases
        # it, which a table shrunk to a small image's grid shows); LFM2's antialiased
        weights = corner_weights if self.qwen else bilinear_weights if self.projector == "paddleocr" else \
            resample_weights
        # separable: the table's rows resampled, then each result's columns (two matrix products;
        # einsum's three-way loop took seconds at Qwen 3 VL's 48 x 48 table)
        tall = np.tensordot(weights(self.side, rows), grid, axes=(1, 0))       # [rows, side, n]
        out = np.matmul(weights(self.side, cols)[None], tall)                  # [rows, cols, n]
        return np.ascontiguousarray(out.reshape(rows * cols, self.n_embd), dtype=np.float32)

    def _encode(self, tiles: np.ndarray) -> np.ndarray:
        """m inputs of one shape, [m, 3, H, W] -> their rows."""
        if self.projector == "gemma4uv":
            return self.gemma4_unified_rows(tiles)
        p, n = self.patch, self.n_embd
        m, gh, gw = len(tiles), tiles.shape[2] // p, tiles.shape[3] // p
        P = gh * gw
        T = m * P                                   # the inputs' patches in all
        # patch (row r, column c) of each input -> its 3 x p x p values, in the convolution weight's order
        patches = tiles.reshape(m, 3, gh, p, gw, p).transpose(0, 2, 4, 1, 3, 5).reshape(T, 3 * p * p)
        kernel = self.floats("v.patch_embd.weight")
        if self.qwen:
            kernel += self.floats("v.patch_embd.weight.1")
        if self.projector == "gemma4v":    # pixels in [-1, 1]
            patches = patches * 2.0 - 1.0
        x = patches @ kernel.reshape(n, -1).T
        if self.mf.has_tensor("v.patch_embd.bias"):
            x += self.floats("v.patch_embd.bias")
        spans = None
        if self.projector == "qwen3vl_merger":
            x.reshape(m, P, n)[:] += self.positions(gh, gw)
        if self.qwen:    # the patches in window order: each window's rows together, 2 x 2 patches by 2 x 2
            order, windows = qwen_windows(gh, gw, QWEN_WINDOW // self.patch // 2)
            x = np.ascontiguousarray(x.reshape(m, P, n)[:, order].reshape(T, n))
            spans = [(i * P + lo, i * P + hi) for i in range(m) for lo, hi in windows]
        elif self.projector == "gemma4v":    # a patch's column's row of one table plus its row's of the other
            table = self.floats("v.position_embd.weight")          # [2, n_positions, n]
            if max(gh, gw) > self.n_positions:
                raise InvalidArgumentError(f"an image of {gw} x {gh} patches is beyond the projector's "
                                           f"{self.n_positions} positions a side: crop the picture nearer a "
                                           f"square")
            r, c = np.divmod(np.arange(P), gw)
            x.reshape(m, P, n)[:] += table[0][c] + table[1][r]
        elif self.class_row:    # CLIP: the class row first in each input, at position 0
            x = np.concatenate([np.broadcast_to(self.floats("v.class_embd"), (m, 1, n)), x.reshape(m, P, n)], axis=1)
            P, T = P + 1, m * (P + 1)
            x = (x + self.floats("v.position_embd.weight")).reshape(T, n)
        elif self.projector not in PIXTRAL:
            x.reshape(m, P, n)[:] += self.positions(gh, gw)
        x = np.ascontiguousarray(self.optional_norm(x, "v.pre_ln"))
        # every layer works in the same buffers: a large new array costs its page faults each time
        work = LayerWork(T, n, self.n_ff, gated=self.layers[0].gate is not None)
        rope = None
        if self.projector in PIXTRAL:
            rope = rope_2d(gh, gw, n // self.n_head, PIXTRAL_ROPE_BASE, interleave=True) + ("adjacent",)
        elif self.qwen:
            cos, sin = rope_2d(gh, gw, n // self.n_head, PIXTRAL_ROPE_BASE, interleave=False)
            rope = (cos[order], sin[order], "halves")
        elif self.projector == "paddleocr":   # Qwen's 2D RoPE, the patches in raster order
            rope = rope_2d(gh, gw, n // self.n_head, PIXTRAL_ROPE_BASE, interleave=False) + ("halves",)
        elif self.projector == "gemma4v":   # the column in the first half of the head, the row in the second
            cos, sin = rope_2d(gh, gw, n // self.n_head, GEMMA4_ROPE_BASE, interleave=False)
            q = cos.shape[1] // 2
            rope = (np.roll(cos, q, axis=1), np.roll(sin, q, axis=1), "quarters")
        raster = np.argsort(order) if self.qwen else None    # the rows back in raster order
        scale = 1.0 if self.projector == "gemma4v" else None   # Gemma 4's scores unscaled (q and k normed)
        stacked = []    # DeepStack's slices
        for i, L in enumerate(self.layers):
            windowed = spans is not None and self.window_every and (i + 1) % self.window_every
            self.layer(x, L, work, seq=P, rope=rope, spans=spans if windowed else None, scale=scale)
            for ds in self.deepstack:
                if ds.layer == i:
                    cells = self.side_by_side(x.reshape(m, P, n)[:, raster].reshape(T, n), gh, gw)
                    h4 = self.norm(cells, ds.norm)
                    stacked.append(self.linear(self.activation(self.linear(h4, ds.fc1), gelu=True), ds.fc2))
        x = self.optional_norm(x, "v.post_ln")
        if self.qwen:
            x = x.reshape(m, P, n)[:, raster].reshape(T, n)
        first = int(self.class_row)     # the class row is not one of the image's rows
        rows = np.concatenate([self.project(x[i * P + first:(i + 1) * P], gh, gw) for i in range(m)])
        return np.concatenate([rows] + stacked, axis=1) if stacked else rows

    def gemma4_unified_rows(self, tiles: np.ndarray) -> np.ndarray:
        """Gemma 4 Unified's rows, one a patch of p x p pixels (in [0, 1]), no encoder layers:
            x = LN2(W LN1(patch) + b)
            x = rmsnorm(LN3(x + col_table[c] + row_table[r])) Wproj     (rmsnorm without a scale)
        A patch's values each channel's p x p in turn: the order the converter gives LN1 and W
        (transformers' a pixel's R G B together; llama.cpp's im2col order)."""
        p, n = self.patch, self.n_embd
        m, gh, gw = len(tiles), tiles.shape[2] // p, tiles.shape[3] // p
        P = gh * gw
        if max(gh, gw) > self.n_positions:
            raise InvalidArgumentError(f"an image of {gw} x {gh} patches is beyond the projector's {self.n_positions} "
                                       f"positions a side: crop the picture nearer a square")
        patches = np.ascontiguousarray(tiles.reshape(m, 3, gh, p, gw, p).transpose(0, 2, 4, 1, 3, 5).reshape(m * P, -1))
        x = self.norm(patches, self.patch_norms[0], eps=1e-5)      # nn.LayerNorm's default
        x = self.norm(self.linear(x, ("v.patch_embd.weight", "v.patch_embd.bias")), self.patch_norms[1], eps=1e-5)
        table = self.floats("v.position_embd.weight")           # [2, n_positions, n]: columns', rows'
        r, c = np.divmod(np.arange(P), gw)
        x.reshape(m, P, n)[:] += table[0][c] + table[1][r]
        x = self.norm(x, self.patch_norms[2], eps=1e-5)
        x = np.ascontiguousarray(x / np.sqrt((x * x).mean(axis=1, keepdims=True) + self.eps), dtype=np.float32)
        return self.linear(x, ("mm.input_projection.weight", None))

    def project(self, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
        """The encoder's rows for a grid of rows x cols patches [rows * cols, n_embd] into the
        language model's rows [n, n_out]. Gemma 3: the average of each k x k patches, RMSNorm,
        one matmul. Idefics3, LFM2 and Qwen: each k x k patches' rows side by side in one row
        (their pixel shuffle); then Idefics3 one matmul, LFM2 (layer norm and) Qwen a two-layer
        GELU MLP. Pixtral: pixtral_rows."""
        k, n = self.merge, self.n_embd
        if self.projector == "gemma3":
            x = x.reshape(rows // k, k, cols // k, k, n).mean(axis=(1, 3)).reshape(-1, n)
            x = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + self.eps) * self.floats("mm.soft_emb_norm.weight")
            return np.ascontiguousarray(x @ self.floats("mm.input_projection.weight"), dtype=np.float32)
        if self.projector in PIXTRAL:
            return self.pixtral_rows(x, rows, cols)
        if self.projector == "mlp":     # LLaVA: each patch's row through the MLP (Yi-VL's with norms)
            x = self.linear(np.ascontiguousarray(x), self.mlp[0])
            if self.mlp_norms:
                x = self.norm(x, self.mlp_norms[0])
            x = self.linear(self.activation(x, gelu=True), self.mlp[1])
            return self.norm(x, self.mlp_norms[1]) if self.mlp_norms else x
        if self.projector == "gemma4v":   # pooled, scaled by sqrt(n), standardized, RMS-normed, projected
            x = x.reshape(rows // k, k, cols // k, k, n).mean(axis=(1, 3)).reshape(-1, n) * np.float32(math.sqrt(n))
            if self.mf.has_tensor("v.std_bias"):
                x = (x - self.floats("v.std_bias")) * self.floats("v.std_scale")
            x = np.ascontiguousarray(x / np.sqrt((x * x).mean(axis=1, keepdims=True) + self.eps), dtype=np.float32)
            return self.linear(x, ("mm.input_projection.weight", None))
        if self.projector == "paddleocr":    # each patch's row normed, then 2 x 2 side by side
            x = self.side_by_side(self.norm(np.ascontiguousarray(x), self.input_norm, eps=1e-5), rows, cols)
            return self.linear(self.activation(self.linear(x, self.mlp[0]), gelu="erf"), self.mlp[1])
        x = self.side_by_side(x, rows, cols)
        if self.projector == "idefics3":
            return np.ascontiguousarray(x @ self.floats("mm.model.fc.weight").T, dtype=np.float32)
        if self.input_norm is not None:
            x = self.norm(x, self.input_norm, eps=1e-5)      # nn.LayerNorm's default, as mtmd uses
        return self.linear(self.activation(self.linear(x, self.mlp[0]), gelu=True), self.mlp[1])

    def side_by_side(self, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
        """Rows of grids of rows x cols patches [m * rows * cols, n] -> each k x k patches' rows side
        by side in one row [m * rows * cols / k^2, k^2 n]: patch (r, c) to row (r // k, c // k), at
        column block (c % k) + k (r % k), as transformers' Idefics3 pixel_shuffle (and mtmd's for
        Idefics3, LFM2 and Qwen) orders them."""
        k, n = self.merge, x.shape[1]
        x = x.reshape(-1, rows // k, k, cols // k, k, n).transpose(0, 1, 3, 2, 4, 5)
        return np.ascontiguousarray(x.reshape(-1, k * k * n))

    def pixtral_rows(self, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
        """Pixtral's projector: RMS norm, each k x k patches unfolded into one row (a patch's
        channels outermost, as torch's unfold) and merged by one matmul (when k > 1), the GELU
        MLP, then (Pixtral's, not LightOnOCR's) the [IMG_BREAK] row after each row of the image but
        the last."""
        k = self.merge
        if self.merger is not None:
            x = self.norm(np.ascontiguousarray(x), self.input_norm)
            x = x.reshape(rows // k, k, cols // k, k, self.n_embd).transpose(0, 2, 4, 1, 3)
            x = self.linear(np.ascontiguousarray(x.reshape(-1, self.n_embd * k * k)), self.merger)
        x = self.linear(self.activation(self.linear(np.ascontiguousarray(x), self.mlp[0]), gelu=True), self.mlp[1])
        if self.projector != "pixtral":
            return x
        per_row = cols // k
        out = np.empty((self.rows_of(cols * self.patch, rows * self.patch), self.n_out), np.float32)
        for r in range(rows // k):
            out[r * (per_row + 1):r * (per_row + 1) + per_row] = x[r * per_row:(r + 1) * per_row]
            if r < rows // k - 1:
                out[r * (per_row + 1) + per_row] = self.floats("v.token_embd.img_break")
        return out


# -- images -------------------------------------------------------------------------------------------

def image_bytes(image, what: str = "image") -> bytes:
    """The encoded bytes of an image (or a sound: `what` names it in errors) given as bytes, a
    path, a data: URL or base64 text."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, os.PathLike) or (isinstance(image, str) and os.path.isfile(image)):
        try:
            with open(image, "rb") as f:
                return f.read()
        except OSError as e:
            raise InvalidArgumentError(f"cannot read the {what} {image}: {e.strerror}") from None
    if isinstance(image, str):
        s = image.strip()
        if s.startswith("data:"):
            head, _, s = s.partition(",")
            if ";base64" not in head:
                raise InvalidArgumentError(f"an {what} data: URL must be base64 (data:image/png;base64,...)")
        elif s.startswith(("http://", "https://")):
            raise InvalidArgumentError(f"pyllm does not fetch media from the web: give the {what}'s bytes as a "
                                       f"data: URL (data:image/png;base64,...) or base64")
        try:
            return base64.b64decode(s, validate=True)
        except (binascii.Error, ValueError):
            shown = image if len(image) < 80 else image[:77] + "..."
            raise InvalidArgumentError(f"{shown!r} is neither an {what} file nor base64 data") from None
    raise InvalidArgumentError(f"an {what} is bytes, a file path, a data: URL or base64 text, not "
                               f"{type(image).__name__}")


def modalities(path: str | os.PathLike) -> tuple[bool, bool]:
    """(has a vision encoder, has an audio encoder) of an mmproj file, as its clip.has_* keys say
    (a file without them, from older converters: vision)."""
    with ModelFile(path) as mf:
        if mf.architecture != "clip":
            raise InvalidArgumentError(f"{path} is a {mf.architecture!r} model, not a multimodal projector (an "
                                       f"mmproj .gguf file: architecture 'clip')")
        audio = bool(mf.get("clip.has_audio_encoder", False))
        vision = bool(mf.get("clip.has_vision_encoder", not audio))
    if not vision and not audio:
        raise ModelFileError(f"{path} says it has neither a vision nor an audio encoder; the file is corrupt")
    return vision, audio


def rows_seen_together(path: str | os.PathLike, n_embd: int, min_tokens: Optional[int] = None,
                       max_tokens: Optional[int] = None) -> int:
    """The most rows one image of an mmproj file becomes where its rows see each other in a
    language model n_embd wide (Gemma 3's, Gemma 4's: one step must hold them all), else 0."""
    if not modalities(path)[0]:
        return 0
    enc = VisionEncoder(path, n_threads=1, min_tokens=min_tokens, max_tokens=max_tokens)
    try:
        if not enc.bidirectional_for(n_embd):
            return 0
        return enc.pixel_budget[1] // enc.align ** 2 if hasattr(enc, "pixel_budget") else enc.n_tokens
    finally:
        enc.close()


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


def cut(grid, plan: ImagePlan) -> list[np.ndarray]:
    """A PIL image of plan's grid of tiles (None where it has none) as the tiles, row by row."""
    if grid is None:
        return []
    a, (tw, th) = np.asarray(grid), plan.tile
    return [a[y * th:(y + 1) * th, x * tw:(x + 1) * tw] for y in range(plan.rows) for x in range(plan.cols)]


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


# -- LFM2-VL's sizes and resampling, as mtmd computes them --------------------------------------------

def smart_resize(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) made multiples of `align` with the aspect ratio about kept and the area
    within [min_pixels, max_pixels] (transformers' smart_resize as mtmd computes it: halves
    round away from zero, where transformers' round to even)."""
    w_bar, h_bar = (max(align, math.floor(v / align + 0.5) * align) for v in (width, height))
    if w_bar * h_bar > max_pixels:
        beta = math.sqrt(width * height / max_pixels)
        w_bar, h_bar = (max(align, math.floor(v / beta / align) * align) for v in (width, height))
    elif w_bar * h_bar < min_pixels:
        beta = math.sqrt(min_pixels / (width * height))
        w_bar, h_bar = (math.ceil(v * beta / align) * align for v in (width, height))
    return w_bar, h_bar


def longest_edge_size(width: int, height: int, align: int, longest: int, min_pixels: int = 0,
                      max_pixels: int = 0) -> tuple[int, int]:
    """(width, height) scaled (up or down) so the longer side is `longest`, each rounded up to a
    multiple of `align`, then kept within [min_pixels, max_pixels] where they are set: mtmd's
    longest_edge sizing, its float32 arithmetic included (a side at `longest` stays there)."""
    f32, a = np.float32, np.float32(align)
    scale = min(f32(longest) / f32(width), f32(longest) / f32(height))
    w_bar, h_bar = (int(math.ceil(f32(f32(v) * scale) / a)) * align for v in (width, height))
    if max_pixels and w_bar * h_bar > max_pixels:
        beta = math.sqrt(width * height / max_pixels)
        w_bar, h_bar = (max(align, math.floor(v / beta / align) * align) for v in (width, height))
    elif min_pixels and w_bar * h_bar < min_pixels:
        beta = math.sqrt(min_pixels / (width * height))
        w_bar, h_bar = (math.ceil(v * beta / align) * align for v in (width, height))
    return w_bar, h_bar


def lfm2_tiles(width: int, height: int, patch: int, align: int, max_pixels: int) -> bool:
    """Whether LFM2 cuts the image into tiles: its area, sides rounded to `align`, above twice
    the budget of one image."""
    w_bar, h_bar = (max(patch, round(v / align) * align) for v in (width, height))
    return w_bar * h_bar > 2 * max_pixels


def lfm2_grid(width: int, height: int) -> tuple[int, int]:
    """(columns, rows) of tiles whose aspect ratio is nearest the image's, among grids of
    LFM2_TILES tiles (fewer tiles first; on a tie the larger grid when the image fills half
    of it)."""
    lo, hi = LFM2_TILES
    found = [(c, r) for n in range(lo, hi + 1) for c in range(1, n + 1) for r in range(1, n + 1) if lo <= c * r <= hi]
    grids = sorted(dict.fromkeys(found), key=lambda g: g[0] * g[1])    # first found first, among equal areas
    aspect, best, best_diff = np.float32(width) / np.float32(height), (1, 1), np.inf
    for c, r in grids:
        diff = abs(aspect - np.float32(c) / np.float32(r))
        if diff < best_diff:
            best, best_diff = (c, r), diff
        elif diff == best_diff and width * height > 0.5 * LFM2_TILE * LFM2_TILE * c * r:
            best = (c, r)
    return best


def internvl_grids(lo: int, hi: int) -> list[tuple[int, int]]:
    """InternVL's grids of lo to hi tiles, (columns, rows), in mtmd's order (columns outer)."""
    return [(a, b) for a in range(lo, hi + 1) for b in range(max(-(-lo // a), lo), min(hi // a, hi) + 1)]


def best_resolution(width: int, height: int, sizes: list) -> tuple[int, int]:
    """Of `sizes`, (height, width) each, the one that shows most of an image of width x height
    fitted into it, the least of it wasted on a tie; the first such (transformers'
    select_best_resolution, LLaVA-NeXT's)."""
    best, most, least = sizes[0], 0, None
    for h, w in sizes:
        scale = min(w / width, h / height)
        shown = min(int(width * scale) * int(height * scale), width * height)
        if shown > most or (shown == most and h * w - shown < least):
            best, most, least = (h, w), shown, h * w - shown
    return best


def best_grid(width: int, height: int, grids: list, tile: int) -> tuple[int, int]:
    """The grid whose size (in tiles) shows most of an image of width x height fitted into it,
    the least of it wasted on a tie (llava-uhd's select_best_resolution, as mtmd computes it:
    the fitted size truncated, the scale in float32); the first such grid."""
    best, most, least = (1, 1), 0, None
    for c, r in grids:
        scale = min(np.float32(c * tile) / np.float32(width), np.float32(r * tile) / np.float32(height))
        shown = min(int(np.float32(width) * scale) * int(np.float32(height) * scale), width * height)
        wasted = c * r * tile * tile - shown
        if shown > most or (shown == most and wasted < least):
            best, most, least = (c, r), shown, wasted
    return best


def resample(img, width: int, height: int, bicubic: bool = False):
    """A PIL image resized with Pillow's bilinear (or bicubic) filter, widened when shrinking,
    which mtmd's resampling copies to the fixed-point rounding: one pass a side, the width
    first (Pillow itself may take the height first, which rounds differently)."""
    from PIL import Image
    kind = Image.BICUBIC if bicubic else Image.BILINEAR
    if img.width != width:
        img = img.resize((width, img.height), kind)
    return img if img.height == height else img.resize((width, height), kind)


def fit(img, width: int, height: int, bicubic: bool = False, pad: tuple = (0, 0, 0)):
    """A PIL image scaled (resample) to fit width x height with its aspect ratio kept, centred
    on the colour `pad` (mtmd's padded resize: the sides rounded up, the scale in float32)."""
    from PIL import Image
    w, h = img.size
    if (w, h) == (width, height):
        return img
    scale = min(np.float32(width) / np.float32(w), np.float32(height) / np.float32(h))
    nw, nh = min(math.ceil(np.float32(w) * scale), width), min(math.ceil(np.float32(h) * scale), height)
    canvas = Image.new("RGB", (width, height), pad)
    canvas.paste(resample(img, nw, nh, bicubic), ((width - nw) // 2, (height - nh) // 2))
    return canvas


def rope_2d(rows: int, cols: int, head_dim: int, base: float, interleave: bool) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) [rows * cols, head_dim / 2] of a 2D RoPE for a grid of patches, row by row: a
    head's first half of pairs turns by the patch's row at the frequencies base^(-4i / head_dim),
    its second half by the column; interleave (Pixtral's, as mtmd builds it from two RoPEs of
    half the head): the column's at the odd frequencies base^(-(4i + 2) / head_dim), else
    (Qwen's) at the row's."""
    quarter = head_dim // 4
    even = base ** (-4.0 * np.arange(quarter) / head_dim)
    odd = base ** (-(4.0 * np.arange(quarter) + 2) / head_dim) if interleave else even
    r, c = np.divmod(np.arange(rows * cols), cols)
    theta = np.concatenate([r[:, None] * even, c[:, None] * odd], axis=1)
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


def qwen_windows(rows: int, cols: int, window: int) -> tuple[list, list]:
    """Qwen 2.5 VL's windows over a grid of rows x cols patches (merged 2 x 2 into cells; windows
    of window x window cells from the top left, the last ones cut): (the patches' raster
    indices in window order, each cell's four patches together, row by row; each window's
    (start, end) in that order)."""
    order, spans = [], []
    for wy in range(0, rows // 2, window):
        for wx in range(0, cols // 2, window):
            start = len(order)
            for cy in range(wy, min(wy + window, rows // 2)):
                for cx in range(wx, min(wx + window, cols // 2)):
                    order += [(2 * cy + dy) * cols + 2 * cx + dx for dy in (0, 1) for dx in (0, 1)]
            spans.append((start, len(order)))
    return order, spans


def resample_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of bilinear resampling with antialiasing (PyTorch's
    interpolate(antialias=True), align_corners False; ggml's upscale with the antialias flag):
    a triangle filter, widened by the shrink factor when shrinking, normalized."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    out = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        j = np.arange(lo, hi)
        w = np.maximum(0.0, 1.0 - np.abs((j - center + 0.5) / support))
        out[i, lo:hi] = w / w.sum()
    return out

def bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of plain bilinear resampling (PyTorch's interpolate, align_corners
    False, no antialiasing): output i reads the two inputs about (i + 0.5) n_in / n_out - 0.5,
    clamped to the edges."""
    out = np.zeros((n_out, n_in))
    for i in range(n_out):
        src = max((i + 0.5) * n_in / n_out - 0.5, 0.0)
        j = min(int(src), n_in - 1)
        frac = src - j if j < n_in - 1 else 0.0
        out[i, j] += 1 - frac
        out[i, min(j + 1, n_in - 1)] += frac
    return out


def corner_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of bilinear resampling with the corners aligned (PyTorch's
    interpolate(align_corners=True); ggml's upscale with that flag, whose float32 arithmetic
    this copies): output i reads input i (n_in - 1) / (n_out - 1)."""
    out = np.zeros((n_out, n_in))
    sf = np.float32(n_out - 1) / np.float32(n_in - 1) if n_out > 1 and n_in > 1 else np.float32(n_out / n_in)
    for i in range(n_out):
        at = np.float32(i) / sf
        lo = min(int(np.floor(at)), n_in - 1)
        hi, frac = min(lo + 1, n_in - 1), min(max(float(at) - lo, 0.0), 1.0)
        out[i, lo] += 1.0 - frac
        out[i, hi] += frac
    return out


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

LINE = (0, 0)    # the "grid" of rows that take positions one after another, as text does (a sound's)


class MediaStore:
    """Encoded images, each under a run of negative token ids (-1-j for its row j
    after the store's earlier rows). The same picture gets the same ids again
    while it is kept, so a prompt that shows it again reuses the KV cache of
    the prefix that held it; ids are never given twice to different rows."""

    def __init__(self, keep: int = 32):
        self.keep = keep
        # key -> (first row, rows, grid: (cols, rows) of an image whose rows take M-RoPE positions)
        self._images: OrderedDict[bytes, tuple[int, np.ndarray, Optional[tuple]]] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()

    def ids(self, key: bytes, encode, grid: Optional[tuple] = None) -> list[int]:
        """The ids of the image under `key`, encoding it (encode() -> rows) if it is not kept;
        grid: its rows' (cols, rows) for M-RoPE positions (image_at)."""
        with self._lock:
            if key in self._images:
                self._images.move_to_end(key)
                first, rows, _ = self._images[key]
                return [-1 - (first + j) for j in range(len(rows))]
        rows = encode()
        if grid is not None and grid != LINE and grid[0] * grid[1] != len(rows):
            raise InvalidArgumentError(f"an image of {grid[0]} x {grid[1]} rows cannot have {len(rows)}")
        with self._lock:
            if key not in self._images:
                self._images[key] = (self._next, rows, grid)
                self._next += len(rows)
                while len(self._images) > self.keep:
                    self._images.popitem(last=False)
            first, rows, _ = self._images[key]
            return [-1 - (first + j) for j in range(len(rows))]

    def rows(self, ids: Sequence[int]) -> np.ndarray:
        """The rows of ids (all of one image, consecutive): float32 [len(ids), n]."""
        first = -1 - ids[0]
        with self._lock:
            for start, rows, _ in self._images.values():
                if start <= first < start + len(rows):
                    j = first - start
                    if j + len(ids) > len(rows) or any(-1 - t != first + i for i, t in enumerate(ids)):
                        break
                    return rows[j:j + len(ids)]
        raise InvalidArgumentError("the prompt names image rows this model no longer holds (images are kept "
                                   f"for the last {self.keep}); send the image again")

    def image_of(self, token: int) -> int:
        """Which image a media id belongs to (its first row), to cut steps between images."""
        found = self._image(token)
        return found[0] if found else -1

    def image_at(self, token: int) -> tuple[int, int, tuple]:
        """(first row, rows, (cols, rows) of its grid) of the image a media id belongs to, for
        M-RoPE positions (an image stored without a grid: one row of its rows; a sound: LINE)."""
        found = self._image(token)
        if found is None:
            raise InvalidArgumentError("the prompt names image rows this model no longer holds (images are kept "
                                       f"for the last {self.keep}); send the image again")
        start, rows, grid = found
        return start, len(rows), grid if grid is not None else (len(rows), 1)

    def is_sound(self, token: int) -> bool:
        """Whether a media id is a sound's row (stored on a LINE): read causally, as text is,
        where a model's images see each other (mtmd's Gemma 4 Unified: only its images do)."""
        found = self._image(token)
        return found is not None and found[2] == LINE

    def _image(self, token: int) -> Optional[tuple]:
        """(first row, rows, grid) of the kept image holding a media id's row, or None."""
        row = -1 - token
        with self._lock:
            for start, rows, grid in self._images.values():
                if start <= row < start + len(rows):
                    return start, rows, grid
        return None


def image_key(encoder: VisionEncoder, image) -> tuple[bytes, object]:
    """(a key naming this image for this projector, the image in a form encode() takes)."""
    from PIL import Image
    if isinstance(image, Image.Image):
        data = image.convert("RGB").tobytes() + repr(image.size).encode()
    else:
        data = image = image_bytes(image)
    return hashlib.sha256(encoder.path.encode() + b"\0" + data).digest(), image
