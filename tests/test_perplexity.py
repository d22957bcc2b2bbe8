"""Perplexity as llama-perplexity measures it: the chunking, BOS and scoring rules
on stand-in logits worked out by hand, then the real model against the numpy
reference and the command line against the API."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyllm.errors import InvalidArgumentError
from pyllm.perplexity import nll_of_rows, perplexity

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


class StandIn:
    """logits_of for a 7-token vocabulary: row p's logits depend on the token at p and p
    itself, so every score is checkable; records what it was asked to run."""
    n_vocab = 7

    def __init__(self):
        self.calls = []

    def row(self, token: int, pos: int) -> np.ndarray:
        return np.cos(np.arange(self.n_vocab) * (token + 1) + pos).astype(np.float32) * 3

    def __call__(self, tokens, skip):
        self.calls.append((list(tokens), skip))
        rows = np.stack([self.row(t, p) for p, t in enumerate(tokens)])
        for start in range(skip, len(tokens), 3):           # in pieces, as the engine returns them
            yield start, rows[start:start + 3]


def by_hand(stand_in: StandIn, tokens, n_ctx: int, bos) -> tuple[float, float, int]:
    """llama-perplexity's definition, one token at a time."""
    nll = []
    for c in range(len(tokens) // n_ctx):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        for p in range(n_ctx // 2, n_ctx - 1):
            x = stand_in.row(chunk[p], p).astype(np.float64)
            nll.append(math.log(sum(math.exp(v - x.max()) for v in x)) - (x[chunk[p + 1]] - x.max()))
    mean = sum(nll) / len(nll)
    var = sum(v * v for v in nll) / len(nll) - mean * mean
    return math.exp(mean), math.sqrt(var / (len(nll) - 1)) * math.exp(mean), len(nll)


@pytest.mark.parametrize("n_ctx,n_tokens,bos", [(8, 35, 6), (9, 18, None), (4, 12, 0), (16, 100, 5)])
def test_chunks_bos_and_second_half_scoring(n_ctx, n_tokens, bos):
    tokens = np.random.default_rng(n_ctx).integers(0, 7, n_tokens).tolist()
    stand_in = StandIn()
    seen = []
    got = perplexity(stand_in, tokens, n_ctx, bos, on_chunk=lambda i, n, p: seen.append((i, n, p)))
    ppl, error, count = by_hand(StandIn(), tokens, n_ctx, bos)
    n_chunks = n_tokens // n_ctx
    assert (got.chunks, got.tokens_scored, got.n_ctx) == (n_chunks, count, n_ctx)
    assert count == n_chunks * (n_ctx - n_ctx // 2 - 1)
    assert got.ppl == pytest.approx(ppl, rel=1e-6) and got.error == pytest.approx(error, rel=1e-5)
    assert got.running[-1] == got.ppl and [s[0] for s in seen] == list(range(n_chunks))
    # each chunk runs alone, from its own first token (or BOS), the first half without logits
    for c, (ran, skip) in enumerate(stand_in.calls):
        want = tokens[c * n_ctx:(c + 1) * n_ctx]
        assert ran == ([bos] + want[1:] if bos is not None else want) and skip == n_ctx // 2


def test_limits_and_degenerate_text():
    tokens = list(range(7)) * 10
    assert perplexity(StandIn(), tokens, 8, None, max_chunks=3).chunks == 3
    uniform = lambda toks, skip: iter([(skip, np.zeros((len(toks) - skip, 7), np.float32))])   # noqa: E731
    flat = perplexity(uniform, tokens, 8, None)
    assert flat.ppl == pytest.approx(7.0) and flat.error == 0.0      # every token 1/7 likely: no spread
    for bad in ({"n_ctx": 80}, {"n_ctx": 3}, {"n_ctx": 8, "max_chunks": 0}):
        with pytest.raises(InvalidArgumentError):
            perplexity(StandIn(), tokens, bad.pop("n_ctx"), None, **bad)


def test_nll_of_rows():
    rows = np.random.default_rng(1).standard_normal((5, 50)).astype(np.float32) * 10
    targets = np.array([0, 49, 3, 3, 20])
    x = rows.astype(np.float64)
    want = [np.log(np.exp(r - r.max()).sum()) + r.max() - r[t] for r, t in zip(x, targets)]
    np.testing.assert_allclose(nll_of_rows(rows, targets), want, rtol=1e-6)


def test_smollm2_against_the_reference(smollm2_path):
    """The model's perplexity against the numpy reference's on the same chunks, and
    the skipped first half costs nothing in accuracy (same as scoring full logits)."""
    from pyllm import Model
    from pyllm.reference import Reference
    with Model(smollm2_path, n_ctx=64) as m:
        ids = m.tokenize(README)[:3 * 64 + 10]
        got = m.perplexity(ids)
        assert got.chunks == 3 and got.tokens_scored == 3 * 31
        bos = m.tokenizer.bos_id if m.tokenizer.add_bos else None
        reference = Reference(m.arch, kv_f16=True)
        full = perplexity(lambda toks, skip: iter([(0, m.engine.logits(toks))]), ids, 64, bos)
        ref = perplexity(lambda toks, skip: iter([(0, reference.forward(toks).astype(np.float32))]), ids, 64, bos)
    assert got.ppl == pytest.approx(full.ppl, rel=1e-4)
    assert abs(math.log(got.ppl) - math.log(ref.ppl)) < 0.02, (got.ppl, ref.ppl)
    assert 1.5 < got.ppl < 500          # markdown with code, in chunks of 64: hard to predict


def test_cli_prints_llama_perplexity_s_lines(smollm2_path, tmp_path):
    from pyllm import Model
    text = tmp_path / "text.txt"
    text.write_text(README, encoding="utf-8")
    base = [sys.executable, "-m", "pyllm.cli.main", "perplexity", "-m", smollm2_path, "-f", str(text), "-c", "128"]
    with Model(smollm2_path, n_ctx=128) as m:
        want = m.perplexity(README, max_chunks=3)
    r = subprocess.run(base + ["--chunks", "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "".join(f"[{i + 1}]{p:.4f}," for i, p in enumerate(want.running))
    assert lines[1] == f"Final estimate: PPL = {want.ppl:.4f} +/- {want.error:.5f}"
    r = subprocess.run(base + ["--chunks", "2", "--json"], capture_output=True, text=True, timeout=300)
    out = json.loads(r.stdout)
    assert out["chunks"] == 2 and out["ppl"] == pytest.approx(want.running[1], rel=1e-9)
    for flags, message in ((["--chunks", "0"], "--chunks must be at least 1"),
                           (["-c", "100000"], "fewer than one chunk")):
        r = subprocess.run(base + flags, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
