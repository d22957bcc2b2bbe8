"""The mixture-of-experts ops (csrc/moe.c) one at a time, against numpy and
against the dense matmul they stand for.

OP_MATMUL_ID must give, for every (token, slot), exactly the numbers an
ordinary OP_MATMUL of the chosen expert's matrix gives (same activation
quantization, same kernels; a row's product does not depend on the rows
sharing the call): so the checks there are bit for bit.
"""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm.graph import MOE_NORM, MOE_SIGMOID, MOE_SOFTMAX, Graph
from pyllm.model_file import Tensor
from test_forward import run_ops


def experts_tensor(qtype, n_in, n_out, n_experts, seed=0):
    arr, _ = synth.weight(qtype, n_in, n_out * n_experts, np.random.default_rng(seed))
    data = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    return Tensor("exps", int(qtype), (n_in, n_out, n_experts), 0, data.nbytes, data)


def expert(t: Tensor, e: int) -> Tensor:
    """Expert e of a 3-D tensor as an ordinary 2-D weight."""
    size = t.nbytes // t.shape[2]
    return Tensor(f"exps[{e}]", t.type, t.shape[:2], 0, size, t.data[e * size:(e + 1) * size])


def route_rows(ids: np.ndarray) -> np.ndarray:
    """A route buffer ([ids | weights]) for the given ids, weights 1."""
    return np.concatenate([ids.astype(np.float32), np.ones_like(ids, np.float32)], axis=1)


@pytest.mark.parametrize("select", [False, True], ids=["", "select-bias"])
@pytest.mark.parametrize("gating", [MOE_SOFTMAX, MOE_SOFTMAX | MOE_NORM, MOE_SIGMOID, MOE_SIGMOID | MOE_NORM],
                         ids=["softmax", "softmax-norm", "sigmoid", "sigmoid-norm"])
def test_route_picks_the_k_best(gating, select):
    """The k best gate values (by the logits: gating is monotonic), or with a
    selection bias the k best gate value + bias; weighted by the gate values."""
    rng = np.random.default_rng(gating)
    n, k, T = 60, 6, 9
    logits = (rng.standard_normal((T, n)) * 3).astype(np.float32)
    logits[0, :] = 0.5                      # all tied: the lowest ids win, in order
    # a bias on the gate values' scale, 0 for the first k experts (row 0 stays a tie among them)
    bias = np.concatenate([np.zeros(k), rng.uniform(0, 0.3, n - k)]).astype(np.float32) if select else None
    g = Graph()
    g.moe_route(g.buffer("logits", n), k, gating, "route", scale=1.5, select_bias=bias)
    got = run_ops(g, {"logits": logits}, T, "route")
    x = logits.astype(np.float64)
    p = 1 / (1 + np.exp(-x)) if gating & MOE_SIGMOID else np.exp(x - x.max(1, keepdims=True))
    if not gating & MOE_SIGMOID:
        p /= p.sum(1, keepdims=True)
    ids = np.argsort(-(x if bias is None else p + bias), axis=1, kind="stable")[:, :k]
    if bias is not None:   # the bias changed some choices, or the test would not see it
        assert (ids != np.argsort(-x, axis=1, kind="stable")[:, :k]).any()
        ids[0] = np.argsort(-(p[0] + bias), kind="stable")[:k]
    w = np.take_along_axis(p, ids, axis=1)
    if gating & MOE_NORM:
        w /= w.sum(1, keepdims=True)
    np.testing.assert_array_equal(got[:, :k], ids)
    if bias is None:
        assert list(got[0, :k]) == list(range(k))
    np.testing.assert_allclose(got[:, k:], 1.5 * w, rtol=2e-6)


def test_route_scales_each_expert():
    """Gemma 4: each chosen expert's (renormalized) weight times its own scale, after the choice
    (which the scales do not change)."""
    rng = np.random.default_rng(4)
    n, k, T = 16, 4, 7
    logits = (rng.standard_normal((T, n)) * 3).astype(np.float32)
    scales = rng.uniform(0.25, 4.0, n).astype(np.float32)
    g = Graph()
    g.moe_route(g.buffer("logits", n), k, MOE_SOFTMAX | MOE_NORM, "route", scale=1.5, expert_scale=scales)
    got = run_ops(g, {"logits": logits}, T, "route")
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    p = np.exp(logits - logits.max(1, keepdims=True))
    w = np.take_along_axis(p, ids, axis=1)
    np.testing.assert_array_equal(got[:, :k], ids)
    np.testing.assert_allclose(got[:, k:], 1.5 * w / w.sum(1, keepdims=True) * scales[ids], rtol=2e-6)


@pytest.mark.parametrize("select", [False, True], ids=["", "select-bias"])
@pytest.mark.parametrize("gating", [MOE_SOFTMAX, MOE_SIGMOID | MOE_NORM], ids=["softmax", "sigmoid-norm"])
def test_route_within_the_best_groups(gating, select):
    """DeepSeek V3's group limit: 64 experts in 8 groups, 6 chosen from the 3 groups whose two
    best gate values (+ bias) sum highest, against numpy; the limit changes some choices (else
    the test would not see it), and every choice lies in a chosen group."""
    rng = np.random.default_rng(gating + 7)
    n, k, T, groups, used = 64, 6, 40, 8, 3
    logits = (rng.standard_normal((T, n)) * 2).astype(np.float32)
    bias = rng.uniform(0, 0.3, n).astype(np.float32) if select else None
    g = Graph()
    g.moe_route(g.buffer("logits", n), k, gating, "route", scale=2.5, select_bias=bias, groups=(groups, used))
    got = run_ops(g, {"logits": logits}, T, "route")
    x = logits.astype(np.float64)
    p = 1 / (1 + np.exp(-x)) if gating & MOE_SIGMOID else np.exp(x - x.max(1, keepdims=True))
    if not gating & MOE_SIGMOID:
        p /= p.sum(1, keepdims=True)
    key = p + (0 if bias is None else bias)
    per = key.reshape(T, groups, n // groups)
    top2 = np.sort(per, axis=2)[:, :, -2:].sum(axis=2)
    kept = np.argsort(-top2, axis=1, kind="stable")[:, :used]
    mask = np.zeros((T, groups), bool)
    np.put_along_axis(mask, kept, True, axis=1)
    ids = np.argsort(-np.where(np.repeat(mask, n // groups, axis=1), key, -np.inf), axis=1, kind="stable")[:, :k]
    assert (ids != np.argsort(-key, axis=1, kind="stable")[:, :k]).any()
    np.testing.assert_array_equal(got[:, :k], ids)
    assert np.take_along_axis(mask, ids // (n // groups), axis=1).all()
    w = np.take_along_axis(p, ids, axis=1)
    if gating & MOE_NORM:
        w /= w.sum(1, keepdims=True)
    np.testing.assert_allclose(got[:, k:], 2.5 * w, rtol=2e-6)


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.MXFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("T", [1, 3, 100])
def test_matmul_id_is_the_chosen_experts_matmul(qtype, T):
    """Shared input (gate/up) and one slice per slot (down); 100 tokens put
    more than one gather (64 rows) on the popular expert; 1 is decode."""
    n_in, n_out, n_exp, k = 256, 80, 6, 3
    w = experts_tensor(qtype, n_in, n_out, n_exp)
    rng = np.random.default_rng(T)
    ids = np.stack([rng.permutation(n_exp)[:k] for _ in range(T)])
    ids[: T * 3 // 4, 0] = 2                 # most tokens choose expert 2 first
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    xs = rng.standard_normal((T, k * n_in)).astype(np.float32)
    for slot_input, inp in ((False, x), (True, xs)):
        g = Graph()
        g.linear_id(g.buffer("x", inp.shape[1]), w, g.buffer("route", 2 * k), k, "y", slot_input=slot_input)
        got = run_ops(g, {"x": inp, "route": route_rows(ids)}, T, "y")
        for e in range(n_exp):
            d = Graph()
            d.linear(d.buffer("x", n_in), expert(w, e), "y")
            for j in range(k):
                rows = np.nonzero(ids[:, j] == e)[0]
                if len(rows) == 0:
                    continue
                src = inp[:, j * n_in:(j + 1) * n_in] if slot_input else inp
                want = run_ops(d, {"x": np.ascontiguousarray(src[rows])}, len(rows), "y")
                np.testing.assert_array_equal(got[rows, j * n_out:(j + 1) * n_out], want)


def test_moe_sum_and_ids_out_of_range():
    """The weighted sum of the slots (into or over y), and a route whose ids
    are no experts' (negative, too large): those slots are left alone, no crash."""
    rng = np.random.default_rng(0)
    T, n, k = 5, 40, 3
    e = rng.standard_normal((T, k * n)).astype(np.float32)
    wts = rng.uniform(0, 1, (T, k)).astype(np.float32)
    route = np.concatenate([np.zeros((T, k), np.float32), wts], axis=1)
    y0 = rng.standard_normal((T, n)).astype(np.float32)
    want = sum(wts[:, j:j + 1] * e[:, j * n:(j + 1) * n] for j in range(k))
    for accumulate in (False, True):
        g = Graph()
        g.moe_sum(g.buffer("e", k * n), g.buffer("route", 2 * k), k, "y", accumulate=accumulate)
        got = run_ops(g, {"e": e, "route": route, "y": y0}, T, "y")
        np.testing.assert_allclose(got, want + y0 if accumulate else want, rtol=1e-6, atol=1e-6)

    w = experts_tensor(QT.Q8_0, 64, 32, 4)
    g = Graph()
    g.linear_id(g.buffer("x", 64), w, g.buffer("route", 4), 2, "y")
    bad = route_rows(np.array([[-1, 1], [4, 1e9], [3, -7]]))
    y = run_ops(g, {"x": rng.standard_normal((3, 64)).astype(np.float32), "route": bad,
                    "y": np.full((3, 64), 7.0, np.float32)}, 3, "y")
    assert (y[0, :32] == 7).all() and (y[1] == 7).all() and (y[2, 32:] == 7).all()
    assert not (y[0, 32:] == 7).all() and not (y[2, :32] == 7).all()


def test_experts_split_between_cpu_and_sim(tmp_path):
    """A mixture of experts split at a layer boundary between the CPU and the
    simulated device gives the CPU's logits (the device runs the same C core:
    this checks the expert weights, route buffers and bus copies travel)."""
    from pyllm.arch import load_architecture
    from pyllm.backend.base import Shape
    from pyllm.backend.cpu import CpuBackend
    from pyllm.backend.select import make_backend
    from pyllm.model_file import ModelFile
    arch = load_architecture(ModelFile(synth.write_qwen2moe(tmp_path / "m.gguf", QT.Q8_0, n_layer=4)))
    g = Graph()
    arch.build(g)
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, 512, 12)]
    cpu = CpuBackend(g, 1, 16, 16, 4, 16)
    want = cpu.forward(tokens, 0, [0, 1, 2, 3], 2).copy()
    cpu.close()
    be, plan = make_backend(g, 1, Shape(16, 16, 4, 16), 2, device="sim")
    assert plan is not None and plan.uses_gpu
    got = be.forward(tokens, 0, [0, 1, 2, 3], 2).copy()
    be.close()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
