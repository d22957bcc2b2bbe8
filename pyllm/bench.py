"""Measuring speed: prompt processing, decode, TTFT/TPOT, bandwidth, profile.

The tests mirror llama-bench: `pp N` prefills N tokens into an empty
context; `tg N` decodes N tokens one step at a time from an empty context
(no sampling, a fixed token), so the two engines do the same work; `pp N+tg M`
(llama-bench's -pg) prefills N and then decodes M, its tokens/s counting both.
With a depth D (llama-bench's -d, shown as `pp N @ dD`) the context first holds
D tokens, prefilled untimed: the speed of a long conversation or document.
"""
from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .backend.base import kv_row_bytes
from .graph import OP_MATMUL, OP_MATMUL_COLS, OP_MATMUL_ID, OP_NAMES
from .model_file import type_name


@dataclass
class Result:
    test: str                 # "pp512", "tg128", "pp512+tg128", with " @ d4096" at a depth
    threads: int
    tokens_per_s: list[float] = field(default_factory=list)
    n_prompt: int = 0         # the tokens prefilled, decoded, and in the context before (llama-bench's fields)
    n_gen: int = 0
    n_depth: int = 0

    @property
    def mean(self) -> float:
        return statistics.fmean(self.tokens_per_s)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.tokens_per_s) if len(self.tokens_per_s) > 1 else 0.0

    def as_dict(self) -> dict:
        return {"test": self.test, "threads": self.threads, "tokens_per_s": round(self.mean, 3),
                "sd": round(self.sd, 3), "runs": [round(x, 3) for x in self.tokens_per_s],
                "n_prompt": self.n_prompt, "n_gen": self.n_gen, "n_depth": self.n_depth}


def _fresh(model):
    """An empty sequence (nothing reused), releasing whatever the model held."""
    model._seq.release()
    return model.engine.new_sequence()


def _at_depth(model, depth: int, token: int):
    """A fresh sequence already holding `depth` tokens (prefilled, untimed)."""
    seq = _fresh(model)
    if depth:
        model.engine._run(seq, [token] * depth)
    return seq


def run_pp(model, n: int, token: int = 100, depth: int = 0) -> float:
    """Seconds to prefill n tokens into a context holding `depth` tokens."""
    seq = _at_depth(model, depth, token)
    tokens = [token] * n
    t0 = time.perf_counter()
    model.engine._run(seq, tokens)
    dt = time.perf_counter() - t0
    seq.release()
    return dt


def run_tg(model, n: int, token: int = 100, depth: int = 0) -> float:
    """Seconds to decode n tokens, one step each, after `depth` tokens."""
    seq = _at_depth(model, depth, token)
    t0 = time.perf_counter()
    for _ in range(n):
        model.engine._run(seq, [token])
    dt = time.perf_counter() - t0
    seq.release()
    return dt


def run_pg(model, n_prompt: int, n_gen: int, token: int = 100, depth: int = 0) -> float:
    """Seconds to prefill n_prompt tokens and then decode n_gen, after `depth` tokens."""
    seq = _at_depth(model, depth, token)
    t0 = time.perf_counter()
    model.engine._run(seq, [token] * n_prompt)
    for _ in range(n_gen):
        model.engine._run(seq, [token])
    dt = time.perf_counter() - t0
    seq.release()
    return dt


def test_name(kind: str, n, depth: int = 0) -> str:
    name = f"pp{n[0]}+tg{n[1]}" if kind == "pg" else f"{kind}{n}"
    return name + (f" @ d{depth}" if depth else "")


def bench(model, tests: list[tuple[str, object]], reps: int, warmup: bool = True, depth: int = 0) -> list[Result]:
    """tests: [("pp", 512), ("tg", 128), ("pg", (512, 128))]; each run reps times after
    one warm-up, on top of `depth` tokens already in the context."""
    results = []
    for kind, n in tests:
        n_prompt, n_gen = n if kind == "pg" else (n, 0) if kind == "pp" else (0, n)
        if warmup:
            run_test(model, min(n_prompt, 16), min(n_gen, 16) if not n_prompt else 0)
        r = Result(test_name(kind, n, depth), model.n_threads, n_prompt=n_prompt, n_gen=n_gen, n_depth=depth)
        for _ in range(reps):
            r.tokens_per_s.append((n_prompt + n_gen) / run_test(model, n_prompt, n_gen, depth))
        results.append(r)
    return results


def run_test(model, n_prompt: int, n_gen: int, depth: int = 0) -> float:
    """Seconds of one test: a prefill, a decode, or one then the other."""
    if n_prompt and n_gen:
        return run_pg(model, n_prompt, n_gen, depth=depth)
    return run_pp(model, n_prompt, depth=depth) if n_prompt else run_tg(model, n_gen, depth=depth)


def decode_bytes_per_token(model, n_ctx_tokens: int = 0) -> int:
    """Bytes a decode step reads: every matmul weight once (LoRA pairs' too; the embedding
    table only for one row; of each mixture of experts, the k experts a token
    uses), plus the K/V of the context so far."""
    g = model.graph
    weights = sum(op.weight.nbytes for op in g.ops if op.kind in (OP_MATMUL, OP_MATMUL_COLS))
    weights += sum(op.weight.nbytes * op.n_head // op.n_kv_head for op in g.ops if op.kind == OP_MATMUL_ID)
    k_type, v_type = model.kv_types
    kv_per_token = sum(kv_row_bytes(k_type, dk) + kv_row_bytes(v_type, dv) for dk, dv in g.kv_layers.values())
    return weights + kv_per_token * n_ctx_tokens


def ttft_tpot(model, prompt_tokens: int, gen_tokens: int, token: int = 100) -> tuple[float, float]:
    """(time to first token, time per output token) for a prompt of that
    length: TTFT includes the prefill and one greedy sample."""
    from .sampling import Sampler, SamplingParams
    seq = _fresh(model)
    greedy = Sampler(SamplingParams(temperature=0))
    t0 = time.perf_counter()
    logits = model.engine._run(seq, [token] * prompt_tokens)[-1]
    tok = greedy(logits)
    ttft = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(gen_tokens):
        logits = model.engine._run(seq, [tok])[-1]
        tok = greedy(logits)
    tpot = (time.perf_counter() - t1) / gen_tokens
    seq.release()
    return ttft, tpot


def memory_bandwidth(n_threads: int, size_mb: int = 1024, reps: int = 5) -> float:
    """The machine's read bandwidth in GB/s, measured by the C core streaming
    a buffer larger than any cache (best of reps)."""
    from ._native import ffi, lib
    from .backend.cpu import aligned_zeros
    buf = aligned_zeros((size_mb << 20) // 4, np.float32)
    buf[:] = 1.0  # touch every page before timing
    ctx = lib.pyllm_ctx_new(n_threads)
    try:
        lib.pyllm_membw(ctx, ffi.from_buffer(buf), buf.nbytes, 1)  # warm-up
        return max(lib.pyllm_membw(ctx, ffi.from_buffer(buf), buf.nbytes, 1) for _ in range(reps))
    finally:
        lib.pyllm_ctx_free(ctx)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- profile ---------------------------------------------------------------------

@dataclass
class Profile:
    phase: str
    steps: int
    wall_s: float                       # whole phase, Python included
    c_wall_s: float                     # inside pyllm_run
    op_s: dict[str, float]              # summed over threads
    matmul_by_type_s: dict[str, float]
    thread_busy_s: list[float]
    sampling_s: float = 0.0
    tokenize_s: float = 0.0

    @property
    def python_s(self) -> float:
        return self.wall_s - self.c_wall_s - self.sampling_s

    def as_dict(self) -> dict:
        d = asdict(self)
        d["python_s"] = self.python_s
        return d


def _read(backend) -> tuple[float, dict, dict, list]:
    p = backend.read_profile()
    ops = {OP_NAMES[k]: v / 1e9 for k, v in enumerate(p["op_ns"]) if v and k in OP_NAMES}
    by_type = {type_name(t): v / 1e9 for t, v in enumerate(p["matmul_type_ns"]) if v}
    return p["wall_ns"] / 1e9, ops, by_type, [b / 1e9 for b in p["thread_busy_ns"]]


def read_profile(backend, phase: str, steps: int, wall_s: float, sampling_s: float = 0.0,
                 tokenize_s: float = 0.0) -> Profile:
    """The backend's counters since its last profile(True), as a Profile."""
    c_wall, ops, by_type, busy = _read(backend)
    return Profile(phase, steps, wall_s, c_wall, ops, by_type, busy, sampling_s, tokenize_s)


def format_profile(p: Profile) -> list[str]:
    """Three lines saying where one phase's time went."""
    ops = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(p.op_s.items(), key=lambda kv: -kv[1]))
    mm = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in p.matmul_by_type_s.items())
    busy = ", ".join(f"{b * 1e3:.0f}" for b in p.thread_busy_s)
    share = p.python_s / p.wall_s if p.wall_s > 0 else 0.0
    return [f"{p.phase} ({p.steps} steps): wall {p.wall_s * 1e3:.1f} ms, C {p.c_wall_s * 1e3:.1f} ms, "
            f"python {p.python_s * 1e3:.1f} ms ({share:.1%}), sampling {p.sampling_s * 1e3:.1f} ms, "
            f"tokenize {p.tokenize_s * 1e3:.1f} ms",
            f"  op ms (all threads): {ops}",
            f"  matmul ms by type: {mm}; busy ms per thread: {busy}"]


def profile(model, prompt: str, n_predict: int) -> tuple[Profile, Profile]:
    """Profiles one greedy generation: (prefill, decode). The prompt's tokens are cut to
    what fits in the context with the n_predict generated after them."""
    from .sampling import Sampler, SamplingParams
    greedy = Sampler(SamplingParams(temperature=0))
    be = model.backend
    seq = _fresh(model)
    t0 = time.perf_counter()
    ids = model.tokenize(prompt, special=True)
    tokenize_s = time.perf_counter() - t0
    ids = ids[:max(1, model.n_ctx - n_predict)]

    be.profile(True)
    t0 = time.perf_counter()
    logits = model.engine._run(seq, ids)[-1]
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    tok = greedy(logits)
    sampling = time.perf_counter() - t0
    pre = read_profile(be, "prefill", 1, wall + sampling, sampling, tokenize_s)

    be.profile(True)  # reset
    sampling = 0.0
    t0 = time.perf_counter()
    for _ in range(n_predict):
        logits = model.engine._run(seq, [tok])[-1]
        ts = time.perf_counter()
        tok = greedy(logits)
        sampling += time.perf_counter() - ts
    wall = time.perf_counter() - t0
    dec = read_profile(be, "decode", n_predict, wall, sampling)
    be.profile(False)
    seq.release()
    return pre, dec
