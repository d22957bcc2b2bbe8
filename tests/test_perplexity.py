"""Perplexity as llama-perplexity measures it: the chunking, BOS and scoring rules
on stand-in logits worked out by hand, then the real model against the numpy
reference and the command line against the API. Then KL divergence: the base
file's 16-bit encoding and its layout by hand, the per-token values and the
statistics by hand, a bad or partial file refused, and the command line."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyllm.errors import InvalidArgumentError, ModelFileError
from pyllm.perplexity import (BaseLogProbs, LogProbsWriter, decode_log_probs, encode_log_probs, kl_divergence,
                              kld_of_rows, nll_of_rows, percentile, perplexity)

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


# -- KL divergence ------------------------------------------------------------------------------

def encode_by_hand(row: np.ndarray) -> list[int]:
    """llama-perplexity's record of one row of logits, one value at a time: float32
    scale and min log-prob in 4 uint16, each logit above the floor as round((x - low) /
    scale), the others 0, padded to an even count."""
    top, low = float(row.max()), max(float(row.min()), float(row.max()) - 16)
    lse = math.log(sum(math.exp(float(x) - top) for x in row))
    scale = np.float32((top - low) / 65535)
    head = np.array([scale, low - top - lse], dtype=np.float32).view(np.uint16).tolist()
    values = [int(np.rint((float(x) - low) / scale)) if x > low and scale > 0 else 0 for x in row]
    return head + values + [0] * (len(row) % 2)


@pytest.mark.parametrize("n_vocab", [1, 7, 50, 33])
def test_base_records_match_llama_perplexity_s_encoding(n_vocab):
    rng = np.random.default_rng(n_vocab)
    rows = (rng.standard_normal((4, n_vocab)) * [[1], [10], [0], [40]]).astype(np.float32)
    got = encode_log_probs(rows)
    assert got.shape == (4, 2 * ((n_vocab + 1) // 2) + 4)
    for r, row in enumerate(rows):
        want = encode_by_hand(row)
        assert np.abs(got[r].astype(int) - want).max() <= 1    # rounding of (x - low) * (1/scale) vs / scale
        np.testing.assert_allclose(got[r, :4].view(np.float32), np.array(want[:4], np.uint16).view(np.float32),
                                   rtol=1e-6)
    # decoded: each log-probability within half a step, those below the floor read as the floor
    lp = rows - np.log(np.exp(rows.astype(np.float64) - rows.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - rows.max(1, keepdims=True)
    back = decode_log_probs(got, n_vocab)
    floor = np.maximum(lp.min(1), lp.max(1) - 16)[:, None]
    step = (lp.max(1) - floor[:, 0]) / 65535
    assert (np.abs(back - np.maximum(lp, floor)) <= step[:, None] / 2 + 1e-5).all()


def kld_by_hand(row: np.ndarray, base_lp: np.ndarray, target: int) -> tuple[float, float, bool]:
    x = row.astype(np.float64)
    lp = x - x.max() - math.log(sum(math.exp(v - x.max()) for v in x))
    kld = sum(math.exp(b) * (b - q) for b, q in zip(base_lp, lp) if b > -16)
    same = int(np.argmax(x)) == int(np.argmax(base_lp))
    return kld, math.exp(lp[target]) - math.exp(base_lp[target]), same


def test_kld_of_rows_by_hand():
    rng = np.random.default_rng(3)
    base_rows = (rng.standard_normal((6, 41)) * 4).astype(np.float32)
    base_rows[2, 5:9] = base_rows[2].max()                 # ties: the first maximum is the top, as llama.cpp
    rows = base_rows + (rng.standard_normal((6, 41)) * 0.5).astype(np.float32)
    rows[2, 5:9] = rows[2].max() + 1
    targets = rng.integers(0, 41, 6)
    records = encode_log_probs(base_rows)
    got = kld_of_rows(rows, records, targets)
    base_lp = decode_log_probs(records, 41)
    for i in range(6):
        kld, dp, same = kld_by_hand(rows[i], base_lp[i].astype(np.float64), targets[i])
        assert got["kld"][i] == pytest.approx(kld, rel=1e-4, abs=2e-6)   # float32 terms, as llama.cpp
        assert got["p_diff"][i] == pytest.approx(dp, abs=1e-6) and got["same_top"][i] == same
    assert got["same_top"][2] and (got["kld"] > 0).all()
    np.testing.assert_allclose(got["nll"], nll_of_rows(rows, targets), rtol=1e-5)


class Nudged(StandIn):
    """The stand-in with every logit moved a little: a "quantized" model of it."""

    def row(self, token: int, pos: int) -> np.ndarray:
        return super().row(token, pos) + np.sin(np.arange(self.n_vocab) * 7.0 + token).astype(np.float32) * 0.3


def test_kl_divergence_over_a_saved_base_file(tmp_path):
    tokens = np.random.default_rng(5).integers(0, 7, 100).tolist()
    path = tmp_path / "base.kld"
    writer = LogProbsWriter(path, 7)
    ppl = perplexity(StandIn(), tokens, 16, 6, save=writer)
    writer.close(complete=True)
    base = BaseLogProbs(path)
    assert (base.n_ctx, base.n_vocab, base.n_chunks) == (16, 7, 6)
    assert base.tokens.tolist() == tokens[:96]                  # as in the text: BOS is put in when run
    assert path.stat().st_size == 20 + 4 * 96 + 2 * 6 * 7 * (8 + 4)
    same = kl_divergence(StandIn(), base, 6)
    s = same.statistics()
    assert s["tokens"] == ppl.tokens_scored == 42 and s["same_top"][0] == 1.0
    assert abs(s["kld"][0]) < 1e-6 and s["ppl"][0] == pytest.approx(ppl.ppl, rel=1e-6)   # nll in float32 here
    assert s["ppl_base"][0] == pytest.approx(ppl.ppl, rel=1e-3)
    seen = []
    nudged = kl_divergence(Nudged(), base, 6, max_chunks=4, on_chunk=lambda i, n, so_far: seen.append((i, n)))
    assert seen == [(i, 4) for i in range(4)] and nudged.chunks == 4
    want = []
    for c in range(4):
        chunk = [6] + tokens[c * 16 + 1:(c + 1) * 16]
        for p in range(8, 15):
            base_lp = decode_log_probs(base.records[c, p - 8:p - 7], 7)[0].astype(np.float64)
            want.append(kld_by_hand(Nudged().row(chunk[p], p), base_lp, chunk[p + 1]))
    n = nudged.statistics()
    assert n["tokens"] == 28
    assert n["kld"][0] == pytest.approx(np.mean([w[0] for w in want]), rel=1e-4)
    assert n["same_top"][0] == pytest.approx(np.mean([w[2] for w in want]))
    dp = np.array([w[1] for w in want])
    assert n["p_diff"][0] == pytest.approx(dp.mean(), abs=1e-6)
    assert n["rms_p_diff"][0] == pytest.approx(math.sqrt((dp * dp).mean()), rel=1e-4)
    assert n["p_diff_percentiles"]["Maximum"] == pytest.approx(dp.max(), abs=1e-6)
    assert n["p_diff_percentiles"]["Median"] == pytest.approx(np.median(dp), abs=1e-6)


def test_statistics_as_llama_perplexity_computes_them():
    values = np.sort(np.random.default_rng(2).random(21))
    assert percentile(values, 0.0) == values[0] and percentile(values, 1.0) == values[-1]
    assert percentile(values, 0.5) == values[10] and percentile(values, 0.125) == pytest.approx(
        0.5 * values[2] + 0.5 * values[3])
    from pyllm.perplexity import KlDivergence
    k = KlDivergence(8)
    rng = np.random.default_rng(9)
    nll = rng.random(50) * 3
    nll_base = nll + rng.standard_normal(50) * 0.1
    k.add({"nll": nll, "nll_base": nll_base, "kld": rng.random(50) * 0.01, "p_diff": rng.standard_normal(50) * 0.02,
           "same_top": rng.random(50) < 0.9})
    s = k.statistics()
    sd = nll.std() / math.sqrt(49)
    assert s["ppl"][0] == pytest.approx(math.exp(nll.mean())) and s["ppl"][1] == pytest.approx(math.exp(nll.mean()) * sd)
    cov = np.cov(nll, nll_base, bias=True)[0, 1] / 49
    assert s["cor_ln_ppl"] == pytest.approx(cov / (sd * nll_base.std() / math.sqrt(49)))
    assert s["ln_ppl_ratio"][0] == pytest.approx(nll.mean() - nll_base.mean())
    assert s["ln_ppl_ratio"][1] == pytest.approx(math.sqrt(sd ** 2 + (nll_base.std() / math.sqrt(49)) ** 2 - 2 * cov))


def test_bad_and_partial_base_files(tmp_path):
    path = tmp_path / "base.kld"
    writer = LogProbsWriter(path, 7)
    perplexity(StandIn(), list(range(7)) * 5, 8, None, save=writer)
    writer.close(complete=True)
    whole = path.read_bytes()
    for name, data, message in (("short", whole[:-2], "truncated"), ("other", b"GGUF" + whole[4:], "not a log-prob"),
                                ("empty", b"", "not a log-prob"),
                                ("huge", whole[:8] + np.array([8, 7, 10 ** 6], "<i4").tobytes() + whole[20:],
                                 "truncated")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ModelFileError, match=message):
            BaseLogProbs(tmp_path / name)
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        BaseLogProbs(tmp_path / "missing")
    with pytest.raises(InvalidArgumentError, match="vocabulary of 7"):
        kl_divergence(lambda toks, skip: iter([(skip, np.zeros((len(toks) - skip, 9), np.float32))]),
                      BaseLogProbs(path))


def test_model_base_file_complete_or_absent(smollm2_path, tmp_path):
    """An interrupted base run leaves neither the file nor its .part; a finished one
    compares with itself to within the 16-bit encoding."""
    from pyllm import Model
    path = tmp_path / "base.kld"

    def interrupt(i, n, p):
        if i == 1:
            raise KeyboardInterrupt
    with Model(smollm2_path, n_ctx=64) as m:
        with pytest.raises(KeyboardInterrupt):
            m.perplexity(README, max_chunks=3, on_chunk=interrupt, kl_divergence_base=path)
        assert list(tmp_path.iterdir()) == []
        ppl = m.perplexity(README, max_chunks=2, kl_divergence_base=path)
        s = m.kl_divergence(path).statistics()
    assert s["tokens"] == 2 * 31 and s["same_top"][0] == 1.0 and abs(s["kld"][0]) < 1e-5
    # a true token more than 16 below the top logit reads back as the floor: the base's nll is never higher
    assert s["ppl"][0] == pytest.approx(ppl.ppl, rel=1e-5) and s["ln_ppl_ratio"][0] > -1e-5


def test_cli_kl_divergence(smollm2_path, gemma3_path, tmp_path):
    text, base = tmp_path / "text.txt", tmp_path / "base.kld"
    text.write_text(README, encoding="utf-8")
    cli = [sys.executable, "-m", "pyllm.cli.main", "perplexity"]
    r = subprocess.run(cli + ["-m", smollm2_path, "-f", str(text), "-c", "64", "--chunks", "3",
                              "--kl-divergence-base", str(base)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Final estimate" in r.stdout, r.stderr
    r = subprocess.run(cli + ["-m", smollm2_path, "--kl-divergence-base", str(base), "--kl-divergence",
                              "-ctk", "q4_0", "-ctv", "q4_0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["chunk", "PPL", "ln(PPL(Q)/PPL(base))", "KL", "Divergence", "Δp", "RMS", "Same",
                                "top", "p"]
    assert [line.split()[0] for line in lines[1:4]] == ["1", "2", "3"]
    for heading in ("====== KL divergence statistics ======", "Mean    KLD:", "99.0%   KLD:", "RMS Δp    :",
                    "Same top p:", "Mean PPL(Q)/PPL(base)         :"):
        assert any(line.startswith(heading) for line in lines), heading
    r = subprocess.run(cli + ["-m", smollm2_path, "--kl-divergence-base", str(base), "--kl-divergence", "--json",
                              "-ctk", "q4_0", "-ctv", "q4_0"], capture_output=True, text=True, timeout=300)
    out = json.loads(r.stdout)
    assert out["tokens"] == 3 * 31 and 1e-4 < out["kld"][0] < 1 and 0.5 < out["same_top"][0] < 1.0
    assert f"{out['kld'][0]:10.6f}" in next(line for line in lines if line.startswith("Mean    KLD:"))
    for flags, message in ((["-m", smollm2_path, "--kl-divergence"], "needs --kl-divergence-base"),
                           (["-m", gemma3_path, "--kl-divergence-base", str(base), "--kl-divergence"],
                            "compare models of one vocabulary"),
                           (["-m", smollm2_path, "--kl-divergence-base", str(text), "--kl-divergence"],
                            "not a log-probabilities file")):
        r = subprocess.run(cli + flags, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
