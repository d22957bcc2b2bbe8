"""The forward step as a program of ops, described once per model.

An architecture file (pyllm/arch/*.py) calls these methods in the order of
its math; each call appends op records that name activation buffers (rows of
floats, one row per token) and weight tensors. A backend then binds the
names to memory and runs the whole list in one call per step.

What the builder works out, so architecture files stay plain math:
- activation quantization: a linear layer over a buffer gets an OP_QUANTIZE
  into the format its weight type's dot product takes, emitted once and
  shared by every linear layer that reads the same buffer version (q/k/v,
  gate/up);
- barriers: an op gets no barrier after it when nothing up to the next
  barrier reads or writes what it touches (the q, k and v matmuls run back
  to back, for instance).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .model_file import Tensor

# op kinds and flags: csrc/pyllm.h
OP_EMBED, OP_RMSNORM, OP_QUANTIZE, OP_MATMUL, OP_ROPE = 1, 2, 3, 4, 5
OP_KV_STORE, OP_ATTENTION, OP_GLU, OP_ADD, OP_SCALE = 6, 7, 8, 9, 10
OP_MOE_ROUTE, OP_MATMUL_ID, OP_MOE_SUM, OP_MIX, OP_POS_SCALE = 11, 12, 13, 14, 15
OP_COPY, OP_SSM_CONV, OP_SSM_SCAN, OP_DELTA_NET, OP_MATCH_NORM, OP_SPARSIFY, OP_SUMSQ = 16, 17, 18, 19, 20, 21, 22
OP_MATMUL_COLS, OP_SAVE_ROWS, OP_LERP, OP_WKV = 23, 24, 25, 26
OP_NAMES = {OP_EMBED: "embed", OP_RMSNORM: "rmsnorm", OP_QUANTIZE: "quantize", OP_MATMUL: "matmul",
            OP_ROPE: "rope", OP_KV_STORE: "kv_store", OP_ATTENTION: "attention", OP_GLU: "glu",
            OP_ADD: "add", OP_SCALE: "scale", OP_MOE_ROUTE: "moe_route", OP_MATMUL_ID: "matmul_id",
            OP_MOE_SUM: "moe_sum", OP_POS_SCALE: "pos_scale", OP_COPY: "copy",
            OP_SSM_CONV: "ssm_conv", OP_SSM_SCAN: "ssm_scan", OP_DELTA_NET: "delta_net", OP_MIX: "mix",
            OP_MATCH_NORM: "match_norm", OP_SPARSIFY: "sparsify", OP_SUMSQ: "sumsq",
            OP_MATMUL_COLS: "matmul_cols", OP_SAVE_ROWS: "save_rows", OP_LERP: "lerp", OP_WKV: "wkv"}
OPF_ACCUMULATE, OPF_LAST_ROWS, OPF_NO_SYNC, OPF_OUT_ROWS, OPF_SLOT_INPUT, OPF_BY_POS = 1, 2, 4, 8, 16, 32
OPF_V_IN_K, OPF_CHUNKED, OPF_GROUP_WEIGHTS, OPF_KV_GROUPED, OPF_NON_CAUSAL = 64, 128, 256, 512, 1024
OPF_MEDIA_ZERO, OPF_MEDIA_PAD = 2048, 4096   # EMBED: a media row's id gives zeros / row 0 (the padding token)
OPF_MEDIA_ONLY = 8192          # EMBED: media rows add their columns media_col.., text rows nothing (DeepStack)
OPF_ROPE_INTERLEAVED = 16384   # ROPE: M-RoPE's sections interleaved (Qwen 3 VL)
OPF_ROWS4 = 32768              # MATMUL, EMBED, MATMUL_ID: the weight is repacked in the ROWS4 layout (csrc/quants.h)
GLU_SILU, GLU_GELU_TANH, GLU_SWIGLU_OAI, GLU_RELU_SQR, GLU_MUL, GLU_RELU, GLU_SIGMOID, GLU_XIELU = 0, 1, 2, 3, 4, 5, 6, 7
GLU_TANH = 8
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0    # gpt-oss's constants (llama.cpp's too)
NORM_RMS, NORM_LAYER = 0, 1
WKV_6, WKV_GLA, WKV_7 = 0, 1, 2
MOE_SOFTMAX, MOE_SIGMOID, MOE_NORM = 0, 1, 2
ROPE_NORM, ROPE_NEOX = 0, 2

# activation formats (csrc/quants.h) and the one each weight type's dot product takes
ACT_F32, ACT_Q8_32, ACT_Q8_K = 0, 1, 2
ACT_BLOCK = {ACT_F32: 1, ACT_Q8_32: 32, ACT_Q8_K: 256}
ACT_BLOCK_BYTES = {ACT_F32: 4, ACT_Q8_32: 40, ACT_Q8_K: 292}
_TYPE_ACT = {0: ACT_F32, 1: ACT_F32, 30: ACT_F32,                      # F32, F16, BF16
             2: ACT_Q8_32, 3: ACT_Q8_32, 6: ACT_Q8_32, 7: ACT_Q8_32,   # Q4_0 Q4_1 Q5_0 Q5_1
             8: ACT_Q8_32, 20: ACT_Q8_32, 39: ACT_Q8_32,               # Q8_0 IQ4_NL MXFP4
             10: ACT_Q8_K, 11: ACT_Q8_K, 12: ACT_Q8_K, 13: ACT_Q8_K, 14: ACT_Q8_K,  # Q2_K..Q6_K
             23: ACT_Q8_K, 21: ACT_Q8_K, 18: ACT_Q8_K,                 # IQ4_XS IQ3_S IQ3_XXS
             16: ACT_Q8_K, 17: ACT_Q8_K, 22: ACT_Q8_K,                 # IQ2_XXS IQ2_XS IQ2_S
             19: ACT_Q8_K, 29: ACT_Q8_K}                               # IQ1_S IQ1_M
SUPPORTED_WEIGHT_TYPES = frozenset(_TYPE_ACT)


def act_format(weight_type: int) -> int:
    return _TYPE_ACT[weight_type]


def act_row_bytes(act: int, n: int) -> int:
    return n // ACT_BLOCK[act] * ACT_BLOCK_BYTES[act]


@dataclass(eq=False)
class Buffer:
    """Rows of float32 activations; `rows` is 'batch' (one per token of the
    step) or 'out' (one per output row: the logits head). Its width may grow while the graph
    is built (Graph.grow_buffers); views keep their own widths and read rows `width` apart."""
    name: str
    width: int
    rows: str = "batch"


@dataclass(frozen=True)
class View:
    """Columns [offset, offset + width) of a buffer (e.g. q inside a fused qkv)."""
    buf: Buffer
    offset: int
    width: int

    @property
    def name(self) -> str:
        return self.buf.name

    def cols(self, offset: int, width: int) -> "View":
        assert offset + width <= self.width
        return View(self.buf, self.offset + offset, width)


@dataclass(frozen=True)
class QBuffer:
    """Quantized rows of a float buffer, in activation format `act`."""
    name: str
    act: int
    n: int  # elements per row

    @property
    def row_bytes(self) -> int:
        return act_row_bytes(self.act, self.n)


@dataclass
class Op:
    kind: int
    layer: int = -1
    flags: int = 0
    type: int = 0
    weight: Optional[Tensor] = None        # EMBED / MATMUL
    vector: Optional[np.ndarray] = None    # RMSNORM weight (float32)
    bias: Optional[np.ndarray] = None      # MATMUL bias (float32)
    x: Optional[View] = None
    x2: Optional[View] = None
    xq: Optional[QBuffer] = None
    y: Optional[View] = None
    n_in: int = 0
    n_out: int = 0
    n_head: int = 0
    n_kv_head: int = 0
    head_dim: int = 0
    head_dim_v: int = 0                    # KV_STORE / ATTENTION: value dims per head (0: head_dim)
    n_rot: int = 0
    rope_mode: int = 0
    window: int = 0
    eps: float = 0.0
    scale: float = 1.0
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    freq_factors: Optional[np.ndarray] = None
    rope_sections: tuple = ()              # ROPE: M-RoPE's (time, height, width) pairs
    media_col: int = 0                     # EMBED with OPF_MEDIA_ONLY: the media rows' first column taken
    softcap: float = 0.0
    alibi: float = 0.0                     # ATTENTION: ALiBi's maximum bias, 0 = none
    kv_layer: int = -1                     # KV_STORE / ATTENTION: which layer's cache
    state: Optional[str] = None            # SSM_CONV / SSM_SCAN: which recurrent state (Graph.states)
    reads: frozenset = field(default_factory=frozenset)
    writes: frozenset = field(default_factory=frozenset)


def alibi_slopes(max_bias: float, n_head: int) -> np.ndarray:
    """ALiBi's slope of each head (csrc pyllm_alibi_slope, llama.cpp's): with n the largest power
    of 2 <= n_head, head h < n takes 2^(-max_bias (h + 1) / n), the others the odd powers
    2^(-max_bias (2 (h - n) + 1) / 2n) between them."""
    n = 1 << (n_head.bit_length() - 1)
    h = np.arange(n_head)
    m0, m1 = np.float32(2.0) ** np.float32(-max_bias / n), np.float32(2.0) ** np.float32(-max_bias / 2 / n)
    return np.where(h < n, m0 ** (h + 1.0), m1 ** (2.0 * (h - n) + 1)).astype(np.float32)


class Graph:
    """Builds the op list of one forward step."""

    def __init__(self, embeddings: bool = False, lora: Optional[dict] = None,
                 lora_embed: Optional[dict] = None, imatrix: Optional[dict] = None,
                 control: Optional[dict] = None, hidden: Optional[dict] = None) -> None:
        """embeddings: the output head ends at the final norm (the rows an embedding is pooled
        from), not at the logits. lora / lora_embed: weight name -> [(s A, B by its rows), ...],
        LoRA pairs (pyllm/lora.py) added to the linear layers / the embedding lookups of those
        weights (matmul_cols adds the B products).
        imatrix: a dict to fill with weight name -> float32 accumulator of the squares of its
        inputs (pyllm/imatrix.py), for the layers' matrices (blk.*), as llama-imatrix collects;
        an expert matrix's is [n_experts, n_in + 1], the last column counting the rows routed.
        control: layer -> a vector added to the residual stream after that layer (control
        vectors, pyllm/control_vector.py), by the families whose loop is Graph.layers.
        hidden: a dict of layer -> float32 [rows, n_embd] the residual stream's rows are copied
        into after that layer (then its control vector), for the layers it holds (pyllm
        cvector-generator; Graph.layers' families)."""
        self.embeddings = embeddings
        self.lora = lora or {}
        self.lora_embed = lora_embed or {}
        self.lora_used: set[str] = set()                  # the weights whose pairs were applied
        self.imatrix = imatrix
        self.control = control or {}
        self.control_used: set[int] = set()               # the layers whose vector was added
        self.hidden = hidden or {}
        self.hidden_saved: set[int] = set()               # the layers whose rows are copied out
        self.ops: list[Op] = []
        self.buffers: dict[str, Buffer] = {}
        self.grow_buffers = False   # a name may hold rows of several widths (set by families whose layers differ)
        self.qbuffers: dict[str, QBuffer] = {}
        self.kv_layers: dict[int, tuple[int, int]] = {}   # layer -> f16 per position in its (K, V) pools
        self.states: dict[str, int] = {}                  # recurrent state -> its floats (one sequence's)
        self._version: dict[str, int] = {}                # writes seen per buffer
        self._quantized: dict[tuple[str, int, int], tuple[int, QBuffer]] = {}
        self._epoch_reads: set = set()
        self._epoch_writes: set = set()
        self.layer = -1                                    # set by the architecture's loop
        self._head = False                                 # inside the output head
        self._head_ops = 0

    def layers(self, layers: list, x: "View", deepstack: tuple = (None, 0)):
        """The architecture's layer loop: yields (i, layer), setting self.layer; after each
        layer's ops, adds its control vector (if any) to the residual stream x, where
        llama.cpp adds it (the end of the layer), then, deepstack (token embedding, n): after
        layer i < n, the media rows' slice i + 1 (add_media_columns)."""
        for i, layer in enumerate(layers):
            self.layer = i
            yield i, layer
            if i in self.control:
                self.add_row(self.control[i], x)
                self.control_used.add(i)
            if i < deepstack[1]:
                self.add_media_columns(deepstack[0], x, (i + 1) * x.width)
            if i in self.hidden:
                self.save_rows(x, self.hidden[i])
                self.hidden_saved.add(i)

    # -- buffers ---------------------------------------------------------------
    def buffer(self, name: str, width: int) -> View:
        rows = "out" if self._head else "batch"
        buf = self.buffers.get(name)
        if buf is None:
            buf = self.buffers[name] = Buffer(name, width, rows)
        elif buf.rows != rows or (buf.width != width and not self.grow_buffers):
            raise ValueError(f"buffer {name} reused with another shape")
        buf.width = max(buf.width, width)   # layers of other widths (OpenELM) share the widest
        return View(buf, 0, width)

    def _out(self, out: str | View, width: int) -> View:
        return out if isinstance(out, View) else self.buffer(out, width)

    @staticmethod
    def _out_name(out: str | View) -> str:
        return out.name if isinstance(out, View) else out

    # -- op emission -------------------------------------------------------------
    def _emit(self, op: Op, reads: set, writes: set) -> Op:
        op.layer = self.layer
        if self._head:
            # the head's first op picks the last n_out rows; the rest work on those
            op.flags |= OPF_OUT_ROWS if self._head_ops else OPF_LAST_ROWS
            self._head_ops += 1
        op.reads, op.writes = frozenset(reads), frozenset(writes)
        # barrier before this op if it touches what the current epoch writes, or
        # writes what it reads; otherwise it joins the epoch without one
        conflict = (writes & (self._epoch_reads | self._epoch_writes)) or (reads & self._epoch_writes)
        if self.ops and not conflict:
            self.ops[-1].flags |= OPF_NO_SYNC
            self._epoch_reads |= reads
            self._epoch_writes |= writes
        else:
            self._epoch_reads, self._epoch_writes = set(reads), set(writes)
        for name in writes:
            self._version[name] = self._version.get(name, 0) + 1
        self.ops.append(op)
        return op

    def head(self) -> None:
        """Everything after this is the output head: it runs only on the rows
        whose logits are wanted (the last token when generating)."""
        self._head = True

    # -- ops -------------------------------------------------------------------
    def embed(self, w: Tensor, out: str | View = "x", scale: float = 1.0, by_pos: bool = False,
              media: str = "rows") -> View:
        """out = scale * w's rows of the tokens; by_pos: out += w's rows of the positions
        (learned position embeddings). A step's media rows (token ids -1 - j: an image's
        embeddings) are taken as they are (media "rows": the token embedding), as zeros
        ("zeros": a LoRA's rows of it) or as the padding token, row 0 ("pad": per-layer token inputs)."""
        n_in, n_rows = w.shape
        y = self._out(out, n_in)
        flags = OPF_BY_POS | OPF_ACCUMULATE if by_pos else {"rows": 0, "zeros": OPF_MEDIA_ZERO,
                                                             "pad": OPF_MEDIA_PAD}[media]
        self._emit(Op(OP_EMBED, flags=flags, type=w.type, weight=w, y=y, n_in=n_in, n_out=n_rows, scale=scale),
                   {y.name} if by_pos else set(), {y.name})
        for a, b_cols in () if by_pos else self.lora_embed.get(w.name, ()):
            # the adapted row: E[t] + B (s A[t]), everything times `scale`; a media row is not adapted
            self.matmul_cols(self.embed(a, f"lora:{a.name}", scale=scale, media="zeros"), b_cols, y, accumulate=True)
            self.lora_used.add(w.name)
        return y

    def add_media_columns(self, w: Tensor, x: View, col: int) -> None:
        """x += columns col .. col + x.width of each media row (text rows unchanged): Qwen 3 VL's
        DeepStack, an image's features from deeper encoder layers added after a first layer.
        (w, the token embedding, is only the op's formal weight: no row of it is read.)"""
        self._emit(Op(OP_EMBED, flags=OPF_MEDIA_ONLY | OPF_ACCUMULATE, type=w.type, weight=w, y=x, n_in=x.width,
                      n_out=w.shape[1], media_col=col), {x.name}, {x.name})

    def rmsnorm(self, x: View, w: np.ndarray, eps: float, out: str | View, groups: int = 1) -> View:
        """RMSNorm over `groups` equal parts of each row (one per head for q/k norms), with
        the same weights for each (w of a part's width) or each its own (w as wide as x)."""
        n = x.width // groups
        own = groups > 1 and w.shape == (x.width,)
        assert n * groups == x.width and (w.shape == (n,) or own)
        y = self._out(out, x.width)
        self._emit(Op(OP_RMSNORM, flags=OPF_GROUP_WEIGHTS if own else 0, vector=w, x=x, y=y, n_in=n, n_head=groups,
                      eps=eps), {x.name}, {y.name})
        return y

    def layernorm(self, x: View, w: np.ndarray, b: Optional[np.ndarray], eps: float, out: str | View,
                  groups: int = 1) -> View:
        """LayerNorm of each row, (x - mean) / sqrt(var + eps) * w (+ b), or of each of its `groups`
        equal parts (RWKV's per-head norm; w and b as wide as the row, each part its own)."""
        assert w.shape == (x.width,) and (b is None or b.shape == (x.width,)) and x.width % groups == 0
        y = self._out(out, x.width)
        self._emit(Op(OP_RMSNORM, flags=OPF_GROUP_WEIGHTS if groups > 1 else 0, type=NORM_LAYER, vector=w, bias=b,
                      x=x, y=y, n_in=x.width // groups, n_head=groups, eps=eps), {x.name}, {y.name})
        return y

    def quantized(self, x: View, act: int) -> QBuffer:
        """x in activation format `act`, quantized once per version of x."""
        key = (x.name, x.offset, act)
        version = self._version.get(x.name, 0)
        cached = self._quantized.get(key)
        if cached and cached[0] == version:
            return cached[1]
        name = f"{x.name}@{x.offset}.q{act}" + (f":{x.width}" if self.grow_buffers else "")
        qb = self.qbuffers.setdefault(name, QBuffer(name, act, x.width))
        self._emit(Op(OP_QUANTIZE, type=act, x=x, xq=qb, n_in=x.width), {x.name}, {name})
        self._quantized[key] = (self._version.get(x.name, 0), qb)
        return qb

    def linear(self, x: View, w: Tensor, out: str | View, bias: Optional[np.ndarray] = None,
               accumulate: bool = False) -> View:
        """out (+)= W x (+ bias). W is stored [n_out rows][n_in]: GGUF shape (n_in, n_out)."""
        n_in, n_out = w.shape[0], w.rows
        assert n_in == x.width, f"{w.name}: input width {x.width} != {n_in}"
        y = self._out(out, n_out)
        if self.imatrix is not None and not self._head and w.name.startswith("blk."):
            acc = self.imatrix.setdefault(w.name, np.zeros(n_in, np.float32))
            self._emit(Op(OP_SUMSQ, x=x, vector=acc, n_in=n_in), {x.name}, {f"imatrix:{w.name}"})
        act = act_format(w.type)
        reads = {x.name}
        xq = None
        if act != ACT_F32:
            xq = self.quantized(x, act)
            reads = {xq.name}
        if accumulate:
            reads.add(y.name)
        self._emit(Op(OP_MATMUL, flags=OPF_ACCUMULATE if accumulate else 0, type=w.type, weight=w,
                      bias=bias, x=x, xq=xq, y=y, n_in=n_in, n_out=n_out), reads, {y.name})
        for a, b_cols in self.lora.get(w.name, ()):
            # y += B (s A x): the low-rank product through a buffer of r columns
            self.matmul_cols(self.linear(x, a, f"lora:{a.name}"), b_cols, y, accumulate=True)
            self.lora_used.add(w.name)
        return y

    def save_rows(self, x: View, out: np.ndarray) -> None:
        """out[t] = x[t] for the step's rows (out: float32 [at most this many rows, width]),
        kept after the step."""
        assert out.dtype == np.float32 and out.ndim == 2 and out.shape[1] == x.width and out.flags.c_contiguous
        self._emit(Op(OP_SAVE_ROWS, x=x, vector=out, n_in=x.width, n_out=out.shape[0]), {x.name},
                   {f"saved:{id(out)}"})

    def matmul_cols(self, x: View, w: Tensor, out: str | View, accumulate: bool = False) -> View:
        """out (+)= x W for an F32 W stored by its input rows (GGUF shape (n_out, n_in)): a
        matrix of few input columns, such as a LoRA pair's B, as row updates of out."""
        n_out, n_in = w.shape
        assert w.type == 0 and n_in == x.width, f"{w.name}: {w.type_name} {w.shape} for {x.width} columns"
        y = self._out(out, n_out)
        self._emit(Op(OP_MATMUL_COLS, flags=OPF_ACCUMULATE if accumulate else 0, type=w.type, weight=w, x=x, y=y,
                      n_in=n_in, n_out=n_out), {x.name} | ({y.name} if accumulate else set()), {y.name})
        return y

    # -- mixture of experts (csrc/moe.c) -----------------------------------------
    def moe_route(self, logits: View, k: int, gating: int, out: str | View, scale: float = 1.0,
                  select_bias: Optional[np.ndarray] = None, groups: tuple[int, int] = (0, 0),
                  expert_scale: Optional[np.ndarray] = None) -> View:
        """out = [ids | weights] of the k experts with the largest gate values (+ select_bias,
        which only chooses) (gating: MOE_SOFTMAX or MOE_SIGMOID, | MOE_NORM to renormalize),
        weights * scale (* expert_scale[id], one per expert: Gemma 4); groups (n, used): the
        experts in n equal groups, chosen from the `used` groups whose two best gate values
        (+ bias) sum highest (DeepSeek V3)"""
        assert expert_scale is None or expert_scale.shape == (logits.width,)
        y = self._out(out, 2 * k)
        self._emit(Op(OP_MOE_ROUTE, type=gating, x=logits, y=y, n_in=logits.width, n_head=k, scale=scale,
                      bias=select_bias, vector=expert_scale, n_kv_head=groups[0], head_dim=groups[1]),
                   {logits.name}, {y.name})
        return y

    def linear_id(self, x: View, w: Tensor, route: View, k: int, out: str | View, slot_input: bool = False,
                  bias: Optional[np.ndarray] = None) -> View:
        """out[:, j n_out : (j+1) n_out] = W[e_j] x (+ bias[e_j]) for the k experts e_j of
        each row's route; W is 3-D, GGUF shape (n_in, n_out, n_experts), bias [n_experts, n_out].
        slot_input: slot j reads columns j n_in : (j+1) n_in of x (the experts' own activations)."""
        n_in, n_out, n_experts = w.shape
        assert x.width == n_in * (k if slot_input else 1), f"{w.name}: input width {x.width}"
        y = self._out(out, k * n_out)
        if self.imatrix is not None and not self._head and w.name.startswith("blk."):
            # per expert: the squares of the inputs routed to it, and their count in the last column
            acc = self.imatrix.setdefault(w.name, np.zeros((n_experts, n_in + 1), np.float32))
            self._emit(Op(OP_SUMSQ, flags=OPF_SLOT_INPUT if slot_input else 0, x=x, x2=route, vector=acc,
                          n_in=n_in, n_head=k, n_kv_head=n_experts), {x.name, route.name}, {f"imatrix:{w.name}"})
        act = act_format(w.type)
        xq = None if act == ACT_F32 else self.quantized(x, act)
        reads = {x.name if xq is None else xq.name, route.name}
        if bias is not None:
            assert bias.shape == (n_experts, n_out), f"{w.name}: bias shape {bias.shape}"
            bias = np.ascontiguousarray(bias, dtype=np.float32).reshape(-1)
        self._emit(Op(OP_MATMUL_ID, flags=OPF_SLOT_INPUT if slot_input else 0, type=w.type, weight=w, bias=bias, x=x,
                      x2=route, xq=xq, y=y, n_in=n_in, n_out=n_out, n_head=k, n_kv_head=n_experts), reads, {y.name})
        return y

    def linear_heads(self, x: View, w: Tensor, out: str | View, shared_input: bool = False) -> View:
        """out[:, h n_out : (h+1) n_out] = W[h] x[:, h n_in : (h+1) n_in]: a matrix per head
        (MLA's up-projections), W 3-D of GGUF shape (n_in, n_out, heads); shared_input: every
        W[h] reads all of x (Gemma 3n's AltUp projections)"""
        n_in, n_out, heads = w.shape
        assert x.width == n_in * (1 if shared_input else heads), f"{w.name}: input width {x.width}"
        y = self._out(out, heads * n_out)
        act = act_format(w.type)
        xq = None if act == ACT_F32 else self.quantized(x, act)
        self._emit(Op(OP_MATMUL_ID, flags=0 if shared_input else OPF_SLOT_INPUT, type=w.type, weight=w, x=x, xq=xq,
                      y=y, n_in=n_in,
                      n_out=n_out, n_head=heads, n_kv_head=heads), {x.name if xq is None else xq.name}, {y.name})
        return y

    def moe_sum(self, experts: View, route: View, k: int, out: str | View, accumulate: bool = False) -> View:
        """out (+)= sum_j weight_j experts[:, j n : (j+1) n], the route's weights"""
        n = experts.width // k
        y = self._out(out, n)
        reads = {experts.name, route.name} | ({y.name} if accumulate else set())
        self._emit(Op(OP_MOE_SUM, flags=OPF_ACCUMULATE if accumulate else 0, x=experts, x2=route, y=y, n_in=n,
                      n_head=k), reads, {y.name})
        return y

    def rope(self, q: Optional[View], k: Optional[View], n_head: int, n_kv_head: int, head_dim: int,
             n_rot: int, mode: int, freq_base: float, freq_scale: float = 1.0,
             freq_factors: Optional[np.ndarray] = None, sections: tuple = (), interleaved: bool = False) -> None:
        """q and k rotated (sections: M-RoPE's pairs of the time, height and width positions,
        a step's rope_pos; interleaved: Qwen 3 VL's order of them)."""
        names = {v.name for v in (q, k) if v is not None}
        self._emit(Op(OP_ROPE, flags=OPF_ROPE_INTERLEAVED if interleaved else 0, x=q, x2=k, n_head=n_head,
                      n_kv_head=n_kv_head, head_dim=head_dim,
                      n_rot=n_rot, rope_mode=mode, freq_base=freq_base, freq_scale=freq_scale,
                      freq_factors=freq_factors, rope_sections=tuple(sections)), names, names)

    def attention(self, q: View, k: Optional[View], v: Optional[View], n_head: int, n_kv_head: int, head_dim: int,
                  scale: float, out: str | View, window: int = 0, softcap: float = 0.0,
                  sinks: Optional[np.ndarray] = None, head_dim_v: int = 0, chunked: bool = False,
                  kv_from: int = -1, causal: bool = True, alibi: float = 0.0) -> View:
        """Stores this step's k, v in the layer's KV cache, then attends over it (over the
        last `window` positions, or with chunked over those of the position's chunk of `window`).
        sinks: one logit per head that joins its softmax with no value (gpt-oss).
        head_dim_v: value dims per head, when not head_dim; v None: a KV head's values
        are the first head_dim_v dims of its keys, stored once (MLA's latent).
        kv_from >= 0: stores nothing (k, v None) and attends over the cache of that earlier
        layer, which this step has already filled (Gemma 4's shared KV layers).
        causal False: every row attends over all positions up to the step's last (an
        encoder's bidirectional attention: the whole sequence must be one step), with a
        window over those within window // 2 of its own either way.
        alibi > 0: ALiBi with that maximum bias, head h's scores of position j from a query at p
        minus slope_h |p - j| (alibi_slopes)."""
        assert causal or not chunked, "a bidirectional attention has no chunks"
        head_dim_v = head_dim_v or head_dim
        if kv_from >= 0:
            assert k is None and v is None and kv_from in self.kv_layers, "shared KV: an earlier layer's cache"
            assert self.kv_layers[kv_from][0] == n_kv_head * head_dim, "shared KV: rows of another shape"
            kv, kv_layer = f"kv{kv_from}", kv_from
            v_in_k = self.kv_layers[kv_from][1] == 0
        else:
            kv, kv_layer, v_in_k = self._store_kv(k, v, n_head, n_kv_head, head_dim, head_dim_v), self.layer, v is None
        y = self._out(out, n_head * head_dim_v)
        flags = (OPF_V_IN_K if v_in_k else 0) | (OPF_CHUNKED if chunked and window > 0 else 0) | \
            (0 if causal else OPF_NON_CAUSAL)
        self._emit(Op(OP_ATTENTION, flags=flags, x=q, y=y, n_head=n_head,
                      n_kv_head=n_kv_head, head_dim=head_dim, head_dim_v=head_dim_v, scale=scale, window=window,
                      softcap=softcap, alibi=alibi, kv_layer=kv_layer, vector=sinks),
                   {q.name, kv}, {y.name})
        return y

    def _store_kv(self, k: View, v: Optional[View], n_head: int, n_kv_head: int, head_dim: int,
                  head_dim_v: int = 0) -> str:
        """The KV_STORE of this step's rows into the current layer's pools (keys alone
        when v is None); the pools' name."""
        head_dim_v = head_dim_v or head_dim
        assert v is not None or head_dim_v <= head_dim
        self.kv_layers[self.layer] = (n_kv_head * head_dim, 0 if v is None else n_kv_head * head_dim_v)
        kv = f"kv{self.layer}"
        self._emit(Op(OP_KV_STORE, flags=OPF_V_IN_K if v is None else 0, x=k, x2=v, n_head=n_head,
                      n_kv_head=n_kv_head, head_dim=head_dim, head_dim_v=head_dim_v, kv_layer=self.layer),
                   {k.name} | ({v.name} if v is not None else set()), {kv})
        return kv

    # -- state-space layers (csrc/ssm.c) ---------------------------------------------
    def _state(self, kind: str, floats: int) -> str:
        """Registers the current layer's recurrent state of `kind` (floats per sequence); its name."""
        name = f"{kind}{self.layer}"
        self.states[name] = floats
        return name

    def ssm_conv(self, x: View, w: np.ndarray, bias: Optional[np.ndarray], out: str | View,
                 state: str = "conv") -> View:
        """out[t] = bias + sum_j w[:, j] z[t + j], z = the K - 1 rows of x before this step (the
        layer's conv state) then this step's: Mamba's causal depthwise convolution of K = w.shape[1]
        taps. The state goes on with the sequence; a step at position 0 starts from zeros.
        state: the kind of state it is, where a layer has more than one (RWKV's two token shifts)."""
        n, taps = w.shape
        assert x.width == n and (bias is None or bias.shape == (n,)), f"ssm_conv of {n} channels on rows of {x.width}"
        name = self._state(state, (taps - 1) * n)
        y = self._out(out, n)
        self._emit(Op(OP_SSM_CONV, vector=np.ascontiguousarray(w, dtype=np.float32), bias=bias, x=x, y=y, n_in=n,
                      n_head=taps, state=name), {x.name, name}, {y.name, name})
        return y

    def ssm_scan(self, xbc: View, dt: View, a: np.ndarray, d: np.ndarray, dt_bias: Optional[np.ndarray],
                 heads: int, head_dim: int, groups: int, d_state: int, out: str | View) -> View:
        """Mamba's selective scan over this step's rows, from the layer's SSM state on:
        xbc's row is [x (heads x head_dim) | B (groups x d_state) | C (groups x d_state)], dt one
        value per head; a: the decay rates A, one per head (Mamba 2) or per head and state
        (Mamba 1); d: the skip D per head (csrc/pyllm.h, OP_SSM_SCAN)."""
        assert xbc.width == heads * head_dim + 2 * groups * d_state and dt.width == heads and heads % groups == 0
        assert a.size in (heads, heads * d_state) and d.shape == (heads,)
        name = self._state("ssm", heads * head_dim * d_state)
        y = self._out(out, heads * head_dim)
        w = np.concatenate([np.asarray(a, np.float32).reshape(-1), np.asarray(d, np.float32)])
        self._emit(Op(OP_SSM_SCAN, vector=w, bias=dt_bias, x=xbc, x2=dt, y=y, n_in=d_state, n_head=heads,
                      n_kv_head=groups, head_dim=head_dim, n_rot=a.size // heads, state=name),
                   {xbc.name, dt.name, name}, {y.name, name})
        return y

    def delta_net(self, qkv: View, ab: View, a: np.ndarray, dt_bias: np.ndarray, heads: int, kv_heads: int,
                  head_dim: int, head_dim_v: int, eps: float, out: str | View, grouped: bool = False) -> View:
        """The gated delta rule over this step's rows, from the layer's state on (Qwen3.5's
        linear attention): qkv's row [q | k | v] (kv_heads x head_dim twice, heads x head_dim_v),
        ab's [a | b] (heads each); per value head S = g S, S += k ((v - S^T k) beta)^T, out = S^T q
        with q, k L2-normalized, g = exp(A softplus(a + dt_bias)), beta = sigmoid(b); value head h
        reads key head h % kv_heads, or with grouped h // (heads / kv_heads) (Qwen3-Next)
        (csrc/pyllm.h, OP_DELTA_NET)."""
        assert qkv.width == 2 * kv_heads * head_dim + heads * head_dim_v and ab.width == 2 * heads
        assert heads % kv_heads == 0 and a.shape == (heads,) and dt_bias.shape == (heads,)
        name = self._state("delta", heads * head_dim * head_dim_v)
        y = self._out(out, heads * head_dim_v)
        w = np.concatenate([np.asarray(a, np.float32), np.asarray(dt_bias, np.float32)])
        self._emit(Op(OP_DELTA_NET, flags=OPF_KV_GROUPED if grouped else 0, vector=w, x=qkv, x2=ab, y=y, n_head=heads,
                      n_kv_head=kv_heads, head_dim=head_dim, head_dim_v=head_dim_v, eps=eps, state=name),
                   {qkv.name, ab.name, name}, {y.name, name})
        return y

    def token_shift(self, x: View, out: str | View, state: str) -> View:
        """out[t] = x[t - 1] - x[t], x[-1] the layer's last row of the step before (zeros at position
        0): RWKV's token shift, as a two-tap convolution whose state is the previous row."""
        taps = np.tile(np.array([1.0, -1.0], np.float32), (x.width, 1))
        return self.ssm_conv(x, taps, None, out, state=state)

    def lerp(self, x: View, dx: View, mixes: np.ndarray, out: str | View, accumulate: bool = False) -> View:
        """out[:, g n .. (g + 1) n] = x + dx * (mixes[g] (+ out's own columns, with accumulate)) for each of
        the len(mixes) groups, n = x.width: RWKV's interpolations between a row and the previous one
        (dx = x_prev - x), accumulate adding the data-dependent part the step worked out into out."""
        groups, n = mixes.shape
        assert x.width == n and dx.width == n
        y = self._out(out, groups * n)
        assert y.width == groups * n
        self._emit(Op(OP_LERP, flags=OPF_ACCUMULATE if accumulate else 0, vector=np.ascontiguousarray(mixes, np.float32),
                      x=x, x2=dx, y=y, n_in=n, n_head=groups),
                   {x.name, dx.name} | ({y.name} if accumulate else set()), {y.name})
        return y

    def wkv(self, x: View, kind: int, heads: int, head_dim: int, out: str | View,
            bonus: Optional[np.ndarray] = None, scale: float = 1.0, norm: Optional[tuple] = None,
            eps: float = 0.0) -> View:
        """RWKV's linear attention over this step's rows, from the layer's state on (csrc/pyllm.h,
        OP_WKV): x's row [r | k | v | w] (WKV_6, WKV_GLA) or [r | k | v | w | a | b] (WKV_7), each
        heads x head_dim. bonus: WKV_6's u of the current token ("time_first"), required; WKV_7's
        r_k, optional (y += (r . (r_k k)) v after the norm). scale: WKV_GLA's factor of the
        output. norm: WKV_7's per-head LayerNorm (weight, bias) of eps, applied inside the op."""
        c = heads * head_dim
        assert x.width == (6 if kind == WKV_7 else 4) * c
        assert (bonus is not None) if kind == WKV_6 else (bonus is None or kind == WKV_7)
        assert norm is None or kind == WKV_7
        name = self._state("wkv", heads * head_dim * head_dim)
        y = self._out(out, c)
        self._emit(Op(OP_WKV, type=kind, vector=None if bonus is None else np.ascontiguousarray(bonus, np.float32),
                      bias=None if norm is None else np.concatenate(norm).astype(np.float32), eps=eps,
                      x=x, y=y, n_head=heads, head_dim=head_dim, scale=scale, state=name), {x.name, name},
                   {y.name, name})
        return y

    def pos_scale(self, y: View, s: float, period: int, offset: float = 0.0) -> View:
        """y[t] *= 1 + s ln(1 + floor((pos[t] + offset) / period)): the attention temperature
        of long positions, on q (Llama 4, Mistral 3)"""
        self._emit(Op(OP_POS_SCALE, y=y, n_in=y.width, scale=s, window=period, eps=offset), {y.name}, {y.name})
        return y

    def copy(self, x: View, out: View, n: int, groups: int, x_step: int, out_step: int) -> View:
        """out[:, g out_step + i] = x[:, g x_step + i] for i < n, g < groups: columns gathered
        by group (a concatenation of heads' parts; x_step 0: the same n columns into every group)"""
        assert x.name != out.name and (groups - 1) * x_step + n <= x.width and (groups - 1) * out_step + n <= out.width
        self._emit(Op(OP_COPY, x=x, y=out, n_in=n, n_head=groups, n_out=x_step, head_dim=out_step),
                   {x.name}, {out.name})
        return out

    def glu(self, gate: View, up: View, kind: int, out: str | View, params: Optional[np.ndarray] = None) -> View:
        """out = act(gate) * up; GLU_SWIGLU_OAI: min(g, c) sigmoid(a min(g, c)) (clamp(up, -c, c) + 1),
        a = SWIGLU_OAI_ALPHA, c = SWIGLU_OAI_LIMIT; params: GLU_XIELU's [alpha_n, alpha_p, beta, eps]"""
        assert (params is not None and params.shape == (4,)) == (kind == GLU_XIELU)
        y = self._out(out, gate.width)
        oai = kind == GLU_SWIGLU_OAI
        self._emit(Op(OP_GLU, type=kind, x=gate, x2=up, y=y, n_in=gate.width, scale=SWIGLU_OAI_ALPHA if oai else 1.0,
                      softcap=SWIGLU_OAI_LIMIT if oai else 0.0, vector=params), {gate.name, up.name}, {y.name})
        return y

    def act(self, x: View, kind: int, out: str | View, params: Optional[np.ndarray] = None) -> View:
        """out = act(x): the activation of an ungated FFN (a GLU op without its up input); params:
        GLU_XIELU's [alpha_n, alpha_p, beta, eps]"""
        assert (params is not None and params.shape == (4,)) == (kind == GLU_XIELU)
        y = self._out(out, x.width)
        self._emit(Op(OP_GLU, type=kind, x=x, y=y, n_in=x.width, vector=params), {x.name}, {y.name})
        return y

    def add(self, x: View, into: View, s: float = 1.0) -> View:
        """into += s * x (s = -1: a difference)"""
        self._emit(Op(OP_ADD, x=x, y=into, n_in=x.width, scale=s), {x.name, into.name}, {into.name})
        return into

    def add_row(self, v: np.ndarray, into: View) -> View:
        """into[t] += v for every row t (BERT's token-type embedding, the same for every token)"""
        assert v.shape == (into.width,)
        self._emit(Op(OP_ADD, vector=np.ascontiguousarray(v, dtype=np.float32), y=into, n_in=into.width),
                   {into.name}, {into.name})
        return into

    def scale(self, y: View, s: float, softcap: float = 0.0, columns: Optional[np.ndarray] = None) -> View:
        """y *= s (and by a factor per column, where given); then, with softcap > 0,
        y = softcap * tanh(y / softcap)"""
        assert columns is None or columns.shape == (y.width,)
        self._emit(Op(OP_SCALE, y=y, n_in=y.width, scale=s, softcap=softcap, vector=columns), {y.name}, {y.name})
        return y

    def mix(self, x: View, coefs: View, n: int, out: str | View, accumulate: bool = False) -> View:
        """out[:, j n : (j+1) n] (+)= sum_k coefs[:, j K + k] x[:, k n : (k+1) n]: the K = x.width / n
        streams of x mixed into coefs.width / K streams by a matrix per token (Gemma 3n's AltUp)"""
        n_x = x.width // n
        n_y = coefs.width // n_x
        assert x.width == n_x * n and coefs.width == n_y * n_x and x.name != self._out_name(out)
        y = self._out(out, n_y * n)
        assert y.width == n_y * n
        self._emit(Op(OP_MIX, flags=OPF_ACCUMULATE if accumulate else 0, x=x, x2=coefs, y=y, n_in=n, n_head=n_y,
                      n_kv_head=n_x), {x.name, coefs.name} | ({y.name} if accumulate else set()), {y.name})
        return y

    def match_norm(self, y: View, target: View) -> View:
        """each target.width-wide group of y scaled to the Euclidean norm of target's row"""
        groups = y.width // target.width
        assert groups * target.width == y.width
        self._emit(Op(OP_MATCH_NORM, x=target, y=y, n_in=target.width, n_head=groups), {y.name, target.name},
                   {y.name})
        return y

    def sparsify(self, x: View, s: float, out: str | View) -> View:
        """out = max(x - (mean(x) + s std(x)), 0) per row (std with n - 1): Gemma 3n's FFN gate sparsity"""
        y = self._out(out, x.width)
        self._emit(Op(OP_SPARSIFY, x=x, y=y, n_in=x.width, scale=s), {x.name}, {y.name})
        return y

    # -- summary -----------------------------------------------------------------
    @property
    def n_barriers(self) -> int:
        return sum(1 for op in self.ops if not op.flags & OPF_NO_SYNC)
