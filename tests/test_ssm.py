"""State-space layers (csrc/ssm.c): the recurrent ops against numpy, their state carried
across steps and reset at position 0, and the engine's rule for a model with a state."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import synth
from pyllm._native import lib
from pyllm.backend.base import Range, Shape, StepData
from pyllm.backend.cpu import HostDevice
from pyllm.errors import InvalidArgumentError
from pyllm.graph import WKV_6, WKV_7, WKV_GLA, Graph

LEVELS = [lvl for lvl in range(4) if lib.pyllm_level_available(lvl)]


@pytest.fixture
def level():
    """Runs a test at every ISA level this CPU has (the scan's dot product is dispatched)."""
    before = lib.pyllm_get_level()
    yield
    lib.pyllm_set_level(before)


def run_steps(g: Graph, inputs: dict, steps: list[tuple[int, int]], output: str, n_threads: int = 2) -> np.ndarray:
    """Runs graph g over rows [a, b) of each input for each (a, b) of `steps`, as one step at
    positions a.. each (the program, and its state, kept between them); output's rows, stacked."""
    n = max(b - a for a, b in steps)
    prog = HostDevice(n_threads).bind(g, [Range(0, len(g.ops))], Shape(n, n, 64, 16))
    out = []
    try:
        for a, b in steps:
            for name, rows in inputs.items():
                prog.write(name, 0, rows[a:b])
            pos = np.arange(a, b, dtype=np.int32)
            prog.run(0, StepData(np.zeros(b - a, np.int32), pos, np.arange(64, dtype=np.int32), b - a))
            out.append(np.array(prog.read(output, 0, b - a)))
    finally:
        prog.close()
    return np.concatenate(out)


def conv_numpy(x: np.ndarray, w: np.ndarray, bias) -> np.ndarray:
    taps = w.shape[1]
    padded = np.concatenate([np.zeros((taps - 1, x.shape[1])), x.astype(np.float64)])
    return sum(w[:, j] * padded[j:j + len(x)] for j in range(taps)) + (0 if bias is None else bias)


def scan_numpy(xbc, dt, a, d, dt_bias, H, P, G, N) -> np.ndarray:
    """The selective scan in float64, token by token (Mamba 2: a per head; Mamba 1: per head and state)."""
    T = len(xbc)
    x, B, C = xbc[:, :H * P].reshape(T, H, P), xbc[:, H * P:H * P + G * N], xbc[:, H * P + G * N:]
    B, C = B.reshape(T, G, N).astype(np.float64), C.reshape(T, G, N).astype(np.float64)
    dtv = dt.astype(np.float64) + (0 if dt_bias is None else dt_bias)
    dtv = np.where(dtv > 20, dtv, np.log1p(np.exp(np.minimum(dtv, 20))))
    grp = np.arange(H) // (H // G)
    A = np.asarray(a, np.float64).reshape(H, -1)       # [H, 1] or [H, N]
    s = np.zeros((H, P, N))
    y = np.empty((T, H, P))
    for t in range(T):
        s = s * np.exp(dtv[t][:, None] * A)[:, None, :] + (dtv[t][:, None] * x[t])[:, :, None] * B[t][grp][:, None, :]
        y[t] = np.einsum("hpn,hn->hp", s, C[t][grp]) + d[:, None] * x[t]
    return y.reshape(T, H * P)


# a few steps of one sequence, then a new one from position 0 (the state must start again)
STEPS = [(0, 5), (5, 6), (6, 7), (7, 19)]


@pytest.mark.parametrize("channels,taps,with_bias", [(77, 4, True), (64, 2, False), (5, 7, True)])
def test_ssm_conv_carries_its_state_across_steps(channels, taps, with_bias):
    """OP_SSM_CONV over steps of 5, 1, 1 and 12 rows equals the causal convolution of the whole
    sequence (the state holds the last taps - 1 inputs; steps shorter than that included), and a
    second sequence from position 0 is not mixed with the first one's state."""
    rng = np.random.default_rng(channels)
    x = rng.standard_normal((19, channels)).astype(np.float32)
    w = rng.standard_normal((channels, taps)).astype(np.float32)
    bias = rng.standard_normal(channels).astype(np.float32) if with_bias else None
    g = Graph()
    g.ssm_conv(g.buffer("x", channels), w, bias, "out")
    got = run_steps(g, {"x": np.concatenate([x, x[:6]])}, STEPS + [(19, 22), (22, 25)], "out")
    want = conv_numpy(x, w, bias)
    np.testing.assert_allclose(got[:19], want, rtol=1e-5, atol=1e-5)
    # rows 19.. are positions 19.. of the same program: the sequence goes on, not a fresh one
    np.testing.assert_allclose(got[19:], conv_numpy(np.concatenate([x, x[:6]]), w, bias)[19:], rtol=1e-5, atol=1e-5)


def test_ssm_conv_restarts_at_position_zero():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 40)).astype(np.float32)
    w = rng.standard_normal((40, 4)).astype(np.float32)
    g = Graph()
    g.ssm_conv(g.buffer("x", 40), w, None, "out")
    prog = HostDevice(2).bind(g, [Range(0, 1)], Shape(12, 12, 4, 16))
    table = np.arange(4, dtype=np.int32)
    try:
        outs = []
        for rows in (x, x[6:]):   # a second sequence of the last 6 rows, from position 0
            prog.write("x", 0, rows)
            prog.run(0, StepData(np.zeros(len(rows), np.int32), np.arange(len(rows), dtype=np.int32), table, 1))
            outs.append(np.array(prog.read("out", 0, len(rows))))
    finally:
        prog.close()
    np.testing.assert_allclose(outs[1], conv_numpy(x[6:], w, None), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lvl", LEVELS)
@pytest.mark.parametrize("case", ["mamba2", "mamba2-groups", "mamba1", "no-bias"])
def test_ssm_scan_against_numpy(level, lvl, case):
    """OP_SSM_SCAN at every ISA level against a float64 scan, over the steps of STEPS: heads of
    odd widths, a state size no multiple of 8 (the dispatched dot product's tail), dt past
    softplus's threshold of 20, groups of B and C shared by heads, and Mamba 1's decay per state."""
    lib.pyllm_set_level(lvl)
    H, P, G, N = {"mamba2": (4, 5, 1, 19), "mamba2-groups": (6, 3, 3, 16), "mamba1": (7, 1, 1, 9),
                  "no-bias": (2, 8, 2, 33)}[case]
    rng = np.random.default_rng(len(case))
    T = 19
    xbc = rng.standard_normal((T, H * P + 2 * G * N)).astype(np.float32)
    dt = rng.uniform(-3, 2, (T, H)).astype(np.float32)
    dt[3, 0] = 25.0   # softplus(x) = x above 20
    a = -np.exp(rng.uniform(0, 2, H * (N if case == "mamba1" else 1))).astype(np.float32)
    d = rng.standard_normal(H).astype(np.float32)
    dt_bias = None if case == "no-bias" else rng.uniform(-1, 1, H).astype(np.float32)
    g = Graph()
    g.ssm_scan(g.buffer("xbc", xbc.shape[1]), g.buffer("dt", H), a, d, dt_bias, H, P, G, N, "y")
    got = run_steps(g, {"xbc": xbc, "dt": dt}, STEPS, "y")
    want = scan_numpy(xbc, dt, a, d, dt_bias, H, P, G, N)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def delta_numpy(qkv, ab, a, dt_bias, H, Hk, dk, dv, eps, grouped=False) -> np.ndarray:
    """The gated delta rule in float64, token by token (value head h reads key head h % Hk, or
    grouped h // (H / Hk))."""
    T = len(qkv)
    q, k, v = qkv[:, :Hk * dk], qkv[:, Hk * dk:2 * Hk * dk], qkv[:, 2 * Hk * dk:]
    S = np.zeros((H, dk, dv))
    y = np.empty((T, H, dv))
    for t in range(T):
        for h in range(H):
            hk = h // (H // Hk) if grouped else h % Hk
            qh, kh = q[t, hk * dk:(hk + 1) * dk].astype(np.float64), k[t, hk * dk:(hk + 1) * dk].astype(np.float64)
            qh = qh / max(np.sqrt((qh ** 2).sum()), eps) / np.sqrt(dk)
            kh = kh / max(np.sqrt((kh ** 2).sum()), eps)
            x = float(ab[t, h]) + float(dt_bias[h])
            g = np.exp(float(a[h]) * (x if x > 20 else np.log1p(np.exp(x))))
            beta = 1.0 / (1.0 + np.exp(-float(ab[t, H + h])))
            S[h] *= g
            S[h] += np.outer(kh, (v[t, h * dv:(h + 1) * dv] - S[h].T @ kh) * beta)
            y[t, h] = S[h].T @ qh
    return y.reshape(T, H * dv)


@pytest.mark.parametrize("lvl", LEVELS)
@pytest.mark.parametrize("case", ["grouped", "in-groups", "mha", "odd", "wide"])
def test_delta_net_against_numpy(level, lvl, case):
    """OP_DELTA_NET at every ISA level (its axpy and dot are dispatched) against a float64 delta
    rule over the steps of STEPS: key heads shared by value heads (h % Hk, or h // (H / Hk) in
    groups: Qwen3-Next), key and value heads of other sizes, odd sizes, a gate past softplus's
    threshold, and a near-zero key (the eps floor of the L2 norm)."""
    lib.pyllm_set_level(lvl)
    H, Hk, dk, dv = {"grouped": (4, 2, 16, 16), "in-groups": (6, 2, 16, 8), "mha": (3, 3, 8, 8), "odd": (6, 3, 7, 5),
                     "wide": (2, 1, 64, 128)}[case]
    in_groups = case == "in-groups"
    rng = np.random.default_rng(len(case) + 7)
    T = 19
    qkv = rng.standard_normal((T, 2 * Hk * dk + H * dv)).astype(np.float32)
    qkv[4, Hk * dk:Hk * dk + dk] = 1e-9   # |k| below eps
    ab = rng.standard_normal((T, 2 * H)).astype(np.float32)
    ab[2, 0] = 30.0
    a = -np.exp(rng.uniform(0, 2, H)).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, H).astype(np.float32)
    g = Graph()
    g.delta_net(g.buffer("qkv", qkv.shape[1]), g.buffer("ab", 2 * H), a, dt_bias, H, Hk, dk, dv, 1e-6, "y",
                grouped=in_groups)
    got = run_steps(g, {"qkv": qkv, "ab": ab}, STEPS, "y")
    want = delta_numpy(qkv, ab, a, dt_bias, H, Hk, dk, dv, 1e-6, grouped=in_groups)
    if in_groups:   # the other mapping is another answer: the test sees which one ran
        assert np.abs(delta_numpy(qkv, ab, a, dt_bias, H, Hk, dk, dv, 1e-6) - want).max() > 0.1 * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_rmsnorm_with_a_weight_per_group():
    """OPF_GROUP_WEIGHTS: each group's RMSNorm with its own slice of a row-wide weight (Mamba 2's norm)."""
    from test_forward import run_ops
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4 * 24)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 4 * 24).astype(np.float32)
    g = Graph()
    g.rmsnorm(g.buffer("x", 96), w, 1e-5, "out", groups=4)
    got = run_ops(g, {"x": x}, 3, "out")
    xg = x.reshape(3, 4, 24).astype(np.float64)
    want = (xg / np.sqrt((xg ** 2).mean(2, keepdims=True) + 1e-5)).reshape(3, 96) * w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def wkv_numpy(x: np.ndarray, kind: int, H: int, D: int, first=None, scale: float = 1.0, norm=None,
              eps: float = 0.0) -> np.ndarray:
    """RWKV's WKV recurrences in float64, token by token, as ggml's rwkv_wkv6, gated_linear_attn
    and rwkv_wkv7 write them (csrc/pyllm.h, OP_WKV); WKV 7's output then LayerNormed per head (norm:
    weight, bias) and given its bonus (r . (first k)) v, as llama.cpp's build_rwkv7_time_mix."""
    T, C = len(x), H * D
    parts = x.astype(np.float64).reshape(T, -1, H, D)
    r, k, v, w = parts[:, 0], parts[:, 1], parts[:, 2], parts[:, 3]
    S = np.zeros((H, D, D))
    y = np.zeros((T, H, D))
    for t in range(T):
        if kind == WKV_7:   # S [value][key]: S = S diag(d) + (S a) b^T + v k^T, y = S r
            a, b = parts[t, 4], parts[t, 5]
            d = np.exp(-0.606531 / (1.0 + np.exp(-w[t])))
            sa = np.einsum("hij,hj->hi", S, a)
            S = S * d[:, None, :] + sa[:, :, None] * b[:, None, :] + v[t][:, :, None] * k[t][:, None, :]
            y[t] = np.einsum("hij,hj->hi", S, r[t])
            if norm is not None:
                c = y[t] - y[t].mean(1, keepdims=True)
                y[t] = c / np.sqrt((c ** 2).mean(1, keepdims=True) + eps) * norm[0].reshape(H, D) + norm[1].reshape(H, D)
            if first is not None:
                y[t] += (r[t] * k[t] * first.reshape(H, D)).sum(1, keepdims=True) * v[t]
            continue
        d = np.exp(-np.exp(w[t]))   # S [key][value]
        if kind == WKV_6:
            kv = k[t][:, :, None] * v[t][:, None, :]
            y[t] = np.einsum("hi,hij->hj", r[t], S + first.reshape(H, D)[:, :, None] * kv)
            S = S * d[:, :, None] + kv
        else:
            S = S * d[:, :, None] + (k[t] * (1.0 - d))[:, :, None] * v[t][:, None, :]
            y[t] = scale * np.einsum("hi,hij->hj", r[t], S)
    return y.reshape(T, C)


@pytest.mark.parametrize("lvl", LEVELS)
@pytest.mark.parametrize("case", ["wkv6", "gla", "wkv7", "wkv7-bare"])
@pytest.mark.parametrize("H,D", [(4, 16), (3, 7), (1, 64)])
def test_wkv_against_numpy(level, lvl, case, H, D):
    """OP_WKV at every ISA level (WKV 7's dot products are dispatched) against float64 recurrences
    over the steps of STEPS (the state carried between them, reset at position 0), odd head sizes
    included; decays from near 0 to near 1, and WKV 7's a = -kk, b = kk * gate as RWKV 7 feeds them
    (bounded: its state would grow without), with its per-head norm and bonus (RWKV 7) or neither."""
    lib.pyllm_set_level(lvl)
    kind = {"wkv6": WKV_6, "gla": WKV_GLA}.get(case, WKV_7)
    rng = np.random.default_rng(H * 100 + D + kind)
    T, C = 19, H * D
    parts = 6 if kind == WKV_7 else 4
    x = rng.standard_normal((T, parts * C)).astype(np.float32)
    x[:, 3 * C:4 * C] = rng.uniform(-5.0, 1.5, (T, C))   # decays exp(-exp(w)) from 0.01 to 0.99
    if kind == WKV_7:
        kk = rng.standard_normal((T, H, D))
        kk /= np.linalg.norm(kk, axis=2, keepdims=True)
        x[:, 4 * C:5 * C] = -kk.reshape(T, C)
        x[:, 5 * C:] = (kk * rng.uniform(0, 1, (T, H, D))).reshape(T, C)
    first = rng.standard_normal(C).astype(np.float32) if case in ("wkv6", "wkv7") else None
    norm = (rng.uniform(0.5, 1.5, C).astype(np.float32), rng.standard_normal(C).astype(np.float32)) \
        if case == "wkv7" else None
    scale = D ** -0.5 if kind == WKV_GLA else 1.0
    g = Graph()
    g.wkv(g.buffer("x", parts * C), kind, H, D, "y", bonus=first, scale=scale, norm=norm, eps=64e-5)
    got = run_steps(g, {"x": x}, STEPS + [(0, 5)], "y")   # the last step back at position 0: a fresh state
    want = wkv_numpy(x, kind, H, D, first, scale, norm, 64e-5)
    np.testing.assert_allclose(got, np.concatenate([want, want[:5]]), rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_lerp_against_numpy():
    """OP_LERP: x + dx * mix per group, and with accumulate x + dx * (mix + y) (RWKV's data-dependent lerps)."""
    from test_forward import run_ops
    rng = np.random.default_rng(3)
    x, dx, y0 = (rng.standard_normal((3, 20)).astype(np.float32) for _ in range(3))
    mixes = rng.uniform(0, 1, (5, 20)).astype(np.float32)
    g = Graph()
    g.lerp(g.buffer("x", 20), g.buffer("dx", 20), mixes, "out")
    got = run_ops(g, {"x": x, "dx": dx}, 3, "out")
    np.testing.assert_allclose(got, np.concatenate([x + dx * m for m in mixes], axis=1), rtol=1e-6, atol=1e-6)
    g = Graph()
    g.lerp(g.buffer("x", 20), g.buffer("dx", 20), mixes, g.buffer("y", 100), accumulate=True)
    got = run_ops(g, {"x": x, "dx": dx, "y": np.tile(y0, 5)}, 3, "y")
    np.testing.assert_allclose(got, np.concatenate([x + dx * (m + y0) for m in mixes], axis=1), rtol=1e-6, atol=1e-6)


def test_token_shift_carries_the_last_row():
    """graph.token_shift: each row's previous row minus itself, the first from the step before (zeros at 0)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((19, 12)).astype(np.float32)
    g = Graph()
    g.token_shift(g.buffer("x", 12), "dx", "shift")
    got = run_steps(g, {"x": x}, STEPS, "dx")
    np.testing.assert_allclose(got, np.concatenate([np.zeros((1, 12)), x[:-1]]) - x, rtol=1e-6, atol=1e-6)


def test_layernorm_with_weights_and_biases_per_group():
    """OPF_GROUP_WEIGHTS with a LayerNorm: each group's own slice of the weights and of the biases (RWKV)."""
    from test_forward import run_ops
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 4 * 24)).astype(np.float32)
    w, b = rng.uniform(0.5, 1.5, 96).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    g = Graph()
    g.layernorm(g.buffer("x", 96), w, b, 1e-5, "out", groups=4)
    got = run_ops(g, {"x": x}, 3, "out")
    xg = x.reshape(3, 4, 24).astype(np.float64)
    c = xg - xg.mean(2, keepdims=True)
    want = (c / np.sqrt((c ** 2).mean(2, keepdims=True) + 1e-5)).reshape(3, 96) * w + b
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_recurrent_step_needs_consecutive_positions():
    g = Graph()
    g.ssm_conv(g.buffer("x", 16), np.ones((16, 4), np.float32), None, "out")
    prog = HostDevice(1).bind(g, [Range(0, 1)], Shape(4, 4, 4, 16))
    try:
        with pytest.raises(InvalidArgumentError, match="consecutive positions"):
            prog.run(0, StepData(np.zeros(3, np.int32), np.array([4, 5, 7], np.int32), np.arange(4, dtype=np.int32), 1))
    finally:
        prog.close()


# -- a model with a state, through the engine ------------------------------------------------------

@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from pyllm import Model
    path = synth.write_granitehybrid(tmp_path_factory.mktemp("ssm") / "gh.gguf", QT.Q8_0)
    with Model(str(path), n_ctx=256, n_batch=32, n_threads=2, n_gpu_layers=0) as m:
        yield m


def fresh_logits(model, tokens) -> np.ndarray:
    return model.engine.logits(tokens)[-1]


def test_engine_reuses_a_recurrent_prefix_only_whole(hybrid):
    """A recurrent model keeps what a sequence ran only when the next prompt extends all of it
    (the next chat turn); a prompt that diverges runs again from position 0. Both give the
    logits of a fresh context."""
    eng = hybrid.engine
    rng = np.random.default_rng(0)
    base = [int(t) for t in rng.integers(1, 500, 50)]
    seq = eng.new_sequence()
    logits, reused = eng.prefill(seq, base)
    assert reused == 0
    longer = base + [7, 8, 9]
    logits, reused = eng.prefill(seq, longer)
    assert reused == len(base)
    np.testing.assert_allclose(logits, fresh_logits(hybrid, longer), rtol=1e-4, atol=1e-4)
    diverged = base[:30] + [11, 12]
    seq_logits, reused = eng.prefill(seq, diverged)
    assert reused == 0   # a state cannot go back to position 30
    np.testing.assert_allclose(seq_logits, fresh_logits(hybrid, diverged), rtol=1e-4, atol=1e-4)
    seq.release()


def test_engine_runs_a_sequence_again_when_another_took_the_state(hybrid):
    """Two sequences taking turns on one model: each step of one after the other ran recomputes
    its tokens from position 0, so decoding either still gives a fresh context's logits."""
    eng = hybrid.engine
    a, b = eng.new_sequence(), eng.new_sequence()
    ta, tb = [5, 6, 7, 8, 9], [40, 41, 42]
    eng.prefill(a, ta)
    eng.prefill(b, tb)
    got = eng._run(a, [10])[-1].copy()   # a's next token, after b moved the state on
    assert len(a) == len(ta) + 1 and a.owns_state and not b.owns_state
    np.testing.assert_allclose(got, fresh_logits(hybrid, ta + [10]), rtol=1e-4, atol=1e-4)
    _, reused = eng.prefill(b, tb + [43])
    assert reused == 0
    a.release()
    b.release()


def test_chat_turns_on_a_hybrid_model_reuse_the_state(hybrid):
    """Generating twice where the second prompt extends the first's text + reply: the second
    prefill reuses everything the first ran."""
    from pyllm.sampling import Sampler
    eng = hybrid.engine
    seq = eng.new_sequence()
    prompt = [3, 4, 5, 6]
    c = eng.generate(seq, prompt, 5, Sampler(temperature=0.0), stop_ids=set()).run()
    assert c.finish_reason == "length"
    ran = len(seq)
    c2 = eng.generate(seq, prompt + c.tokens + [9, 9], 2, Sampler(temperature=0.0), stop_ids=set()).run()
    assert c2.metrics.reused_tokens == ran
    seq.release()


@pytest.mark.parametrize("writer", [synth.write_rwkv6, synth.write_rwkv6qwen2, synth.write_rwkv7, synth.write_arwkv7],
                         ids=["rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"])
def test_rwkv_runs_the_same_in_steps_of_any_size(tmp_path, writer):
    """An RWKV model's prompt in one step, in steps of 7 and token by token: its token shifts and
    WKV states carried across steps (and RWKV 7's first-layer values, within each) give the same
    logits as one pass."""
    from pyllm import Model
    path = writer(tmp_path / "rwkv.gguf", QT.Q8_0)
    tokens = [int(t) for t in np.random.default_rng(2).integers(1, 500, 30)]
    got = {}
    for n_batch in (32, 7, 1):
        with Model(str(path), n_ctx=64, n_batch=n_batch, n_threads=2, n_gpu_layers=0) as m:
            got[n_batch] = m.engine.logits(tokens)
    assert got[32].shape == (30, 512) and got[32].std() > 0.1
    for n_batch in (7, 1):
        np.testing.assert_allclose(got[n_batch], got[32], rtol=1e-4, atol=1e-4 * got[32].std())
