"""The sampler chain on fixed logits, against values worked out by hand."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from pyllm.errors import InvalidArgumentError
from pyllm.sampling import (Candidates, Mirostat, Sampler, _smallest, apply_logit_bias, apply_penalties,
                            min_p, temperature, top_k, top_n_sigma, top_p, typical, xtc)

# probabilities 0.5, 0.3, 0.15, 0.05 for tokens 0..3
P4 = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)


def ids(c: Candidates) -> list[int]:
    return c.token_ids().tolist()


def test_top_k_keeps_the_k_best_sorted():
    c = top_k(Candidates.of(np.array([1.0, 3.0, 2.0, 0.5], np.float32)), 2)
    assert ids(c) == [1, 2] and c.sorted
    assert c.logits.tolist() == [3.0, 2.0]
    assert ids(top_k(Candidates.of(P4), 0)) == [0, 1, 2, 3]          # 0 = off
    assert ids(top_k(Candidates.of(P4), 10)) == [0, 1, 2, 3]         # more than there are
    assert ids(top_k(Candidates.of(P4), 1, min_keep=3)) == [0, 1, 2]  # min_keep wins


def test_top_p_keeps_the_nucleus():
    # cumulative: 0.5, 0.8, 0.95, 1.0; the token that reaches p is kept
    for p, want in ((0.3, [0]), (0.75, [0, 1]), (0.9, [0, 1, 2]), (0.97, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])):
        assert ids(top_p(Candidates.of(P4), p)) == want, p
    # unsorted input comes out sorted
    shuffled = Candidates.of(P4[[2, 0, 3, 1]])
    assert ids(top_p(shuffled, 0.75)) == [1, 3]
    assert ids(top_p(Candidates.of(P4), 0.3, min_keep=2)) == [0, 1]


def test_min_p_is_relative_to_the_best():
    # min_p 0.2: p >= 0.1 survives (0.5, 0.3, 0.15); 0.5: p >= 0.25 (0.5, 0.3)
    assert ids(min_p(Candidates.of(P4), 0.2)) == [0, 1, 2]
    assert ids(min_p(Candidates.of(P4), 0.5)) == [0, 1]
    assert ids(min_p(Candidates.of(P4), 0.0)) == [0, 1, 2, 3]
    # order is kept when unsorted
    assert ids(min_p(Candidates.of(P4[[3, 1, 0, 2]]), 0.5)) == [1, 2]
    assert ids(min_p(Candidates.of(P4), 0.9, min_keep=2)) == [0, 1]


def test_typical_orders_by_distance_to_entropy():
    # H = -sum p ln p = 1.14212; |-ln p - H| = 0.4490, 0.0619, 0.7550, 1.8536
    # -> order 1, 0, 2, 3 with cumulative 0.3, 0.8, 0.95, 1.0; kept until it exceeds p
    assert ids(typical(Candidates.of(P4), 0.5)) == [1, 0]
    assert ids(typical(Candidates.of(P4), 0.9)) == [1, 0, 2]
    assert ids(typical(Candidates.of(P4), 0.2)) == [1]
    assert ids(typical(Candidates.of(P4), 1.0)) == [0, 1, 2, 3]


def test_temperature_scales_logits():
    c = temperature(Candidates.of(np.array([2.0, 1.0, 0.0], np.float32)), 0.5)
    # softmax([4, 2, 0]) = e^4, e^2, 1 over 63.987
    np.testing.assert_allclose(c.probs(), [0.866813, 0.117310, 0.015876], atol=1e-6)
    assert ids(temperature(Candidates.of(P4[[1, 0, 2]]), 0.0)) == [1]


def test_penalties_by_hand():
    logits = np.array([2.0, -1.0, 0.5, 3.0], np.float32)
    # whole history: token 0 twice, 1 and 2 once; 3 never
    out = apply_penalties(logits, [0, 1, 0, 2], -1, repeat=2.0, frequency=0.1, presence=0.5)
    # 0: 2/2 - 2*0.1 - 0.5; 1: -1*2 - 0.1 - 0.5; 2: 0.5/2 - 0.1 - 0.5; 3: untouched
    np.testing.assert_allclose(out, [0.3, -2.6, -0.35, 3.0], atol=1e-6)
    # window of the last 2 tokens: [0, 2], each once
    out = apply_penalties(logits, [0, 1, 0, 2], 2, repeat=2.0, frequency=0.1, presence=0.5)
    np.testing.assert_allclose(out, [0.4, -1.0, -0.35, 3.0], atol=1e-6)
    assert apply_penalties(logits, [0, 1], 0, repeat=2.0) is logits       # off: no copy
    assert logits.tolist() == [2.0, -1.0, 0.5, 3.0]                        # input untouched


def test_logit_bias_and_greedy():
    logits = np.array([2.0, -1.0, 0.5, 3.0], np.float32)
    assert Sampler(temperature=0)(logits) == 3
    assert Sampler(temperature=0, logit_bias={3: -math.inf})(logits) == 0
    assert Sampler(temperature=0, logit_bias={1: 5.0})(logits) == 1
    # greedy sees the penalties: 3 is in the history, 3/2 < 2
    assert Sampler(temperature=0, repeat_penalty=2.0)(logits, [3]) == 0
    np.testing.assert_allclose(apply_logit_bias(logits, {0: 1.5}), [3.5, -1.0, 0.5, 3.0])
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        Sampler(logit_bias={9: 1.0})(logits)


def test_chain_order_is_top_k_then_top_p_then_min_p():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1])).astype(np.float32)
    # top-k 2 renormalises to 4/7, 3/7; top-p 0.5 is then reached by the first
    s = Sampler(temperature=1.0, top_k=2, top_p=0.5, min_p=0.0, seed=0)
    assert s.candidates(logits).as_dict() == pytest.approx({0: 1.0})
    # without top-k the nucleus needs two (0.4 < 0.5)
    s = Sampler(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, seed=0)
    assert s.candidates(logits).as_dict() == pytest.approx({0: 4 / 7, 1: 3 / 7})
    # defaults: top_k 40, top_p 0.95 (cum 0.4 .7 .9 1.0 -> all 4), min_p 0.05 (all), temp 0.8
    d = Sampler(seed=0).candidates(logits).as_dict()
    w = np.array([0.4, 0.3, 0.2, 0.1]) ** (1 / 0.8)
    assert d == pytest.approx(dict(enumerate(w / w.sum())))


def test_draws_follow_the_distribution():
    s = Sampler(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=1234)
    n = 4000
    counts = np.bincount([s(P4) for _ in range(n)], minlength=4)
    assert counts[3] == 0
    np.testing.assert_allclose(counts[:3] / n, np.array([0.5, 0.3, 0.15]) / 0.95, atol=0.03)


def test_same_seed_same_tokens():
    rng = np.random.default_rng(7)
    rows = [rng.standard_normal(1000).astype(np.float32) * 3 for _ in range(30)]
    a = [Sampler(seed=42)(r) for r in rows]
    s1, s2, s3 = Sampler(seed=42), Sampler(seed=42), Sampler(seed=43)
    assert [s1(r) for r in rows] == [s2(r) for r in rows]
    assert [Sampler(seed=42)(r) for r in rows] == a
    assert [s3(r) for r in rows] != [s1(r) for r in rows]
    assert Sampler().seed != Sampler().seed or True  # a random seed is chosen and recorded
    assert isinstance(Sampler().seed, int)


def test_bad_parameters():
    for kw in (dict(temperature=-1), dict(top_p=1.5), dict(min_p=-0.1), dict(top_k=-2),
               dict(repeat_penalty=0), dict(typical_p=2), dict(seed=-1), dict(repeat_last_n=-5),
               dict(logit_bias={"x": 1}), dict(temperature="hot")):
        with pytest.raises(InvalidArgumentError):
            Sampler(**kw)


def test_partial_selection_matches_a_full_sort():
    rng = np.random.default_rng(3)
    for n, m in ((10, 3), (5000, 40), (262144, 1), (262144, 40), (262144, 700), (100003, 64)):
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.integers(0, n, 20)] = 1.5      # ties
        got = _smallest(x, m)
        want = np.lexsort((np.arange(n), x))[:m]
        assert got.tolist() == want.tolist(), (n, m)


def test_big_vocabulary_is_cheap():
    """Gemma's 262k vocabulary: the default chain must stay far below a decode step."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(262144) * 2).astype(np.float32)
    logits[rng.integers(0, 262144, 50)] += 12       # a peaked distribution, as models give
    history = rng.integers(0, 262144, 300).tolist()
    s = Sampler(seed=1, repeat_penalty=1.1)
    for f in (lambda: s(logits, history), lambda: Sampler(seed=1, top_k=0)(logits, history)):
        f()
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        assert np.median(times) < 0.010, np.median(times)


def test_top_n_sigma_keeps_tokens_near_the_best():
    x = np.array([4.0, 3.0, 1.0, 0.0, -np.inf, 2.5], np.float32)
    finite = np.array([4.0, 3.0, 1.0, 0.0, 2.5])
    std = math.sqrt(((finite - finite.mean()) ** 2).mean())   # 1.428: the population deviation
    for n in (0.5, 1.0, 2.0, 3.0):
        want = [i for i in range(6) if x[i] >= 4.0 - n * std]
        assert ids(top_n_sigma(Candidates.of(x), n)) == want, n
    assert ids(top_n_sigma(Candidates.of(x), 1.0)) == [0, 1]               # 4 - 1.428 = 2.57 > 2.5
    assert ids(top_n_sigma(Candidates.of(x), 1.2)) == [0, 1, 5]            # 4 - 1.714 = 2.29
    assert ids(top_n_sigma(Candidates.of(x), -1.0)) == list(range(6))      # off
    sorted_c = top_k(Candidates.of(x), 0 + 6)
    assert ids(top_n_sigma(sorted_c, 1.2)) == [0, 1, 5] and top_n_sigma(sorted_c, 1.2).sorted


class Always:
    """An rng whose draws are all `value`."""

    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


def test_xtc_drops_the_top_choices_but_the_last():
    # probabilities 0.5, 0.3, 0.15, 0.05: above 0.1 are tokens 0, 1, 2; all but token 2 go
    assert ids(xtc(Candidates.of(P4), 1.0, 0.1, 0, Always(0.5))) == [2, 3]
    shuffled = Candidates.of(P4[[2, 0, 3, 1]])   # tokens 0..3 hold 0.15, 0.5, 0.05, 0.3
    assert ids(xtc(shuffled, 1.0, 0.1, 0, Always(0.5))) == [0, 2]
    assert ids(xtc(top_k(Candidates.of(P4), 4), 1.0, 0.2, 0, Always(0.5))) == [1, 2, 3]   # sorted input
    assert ids(xtc(Candidates.of(P4), 1.0, 0.4, 0, Always(0.5))) == [0, 1, 2, 3]   # one above: nothing
    assert ids(xtc(Candidates.of(P4), 0.5, 0.1, 0, Always(0.6))) == [0, 1, 2, 3]   # the chance did not come
    assert ids(xtc(Candidates.of(P4), 0.5, 0.1, 0, Always(0.5))) == [2, 3]
    assert ids(xtc(Candidates.of(P4), 1.0, 0.6, 0, Always(0.0))) == [0, 1, 2, 3]   # threshold > 0.5: off
    assert ids(xtc(Candidates.of(P4), 1.0, 0.1, 3, Always(0.0))) == [0, 1, 2, 3]   # would leave < min_keep


def test_mirostat_2_cuts_at_mu_and_learns_from_the_draw():
    m = Mirostat(2, tau=1.5, eta=0.5, n_vocab=4)
    assert m.mu == 3.0   # 2 tau: surprise up to 3 bits, p >= 0.125: tokens 0, 1, 2 (0.5/0.95 ...)
    token = m(Candidates.of(P4), Always(0.99))   # the last of the kept, renormalised: 0.15 / 0.95
    assert token == 2
    assert m.mu == pytest.approx(3.0 - 0.5 * (-math.log2(0.15 / 0.95) - 1.5))
    m.mu = 0.5   # nothing has surprise <= 0.5 bits (p >= 0.707): the best token alone
    assert m(Candidates.of(P4), Always(0.99)) == 0 and m.mu == pytest.approx(0.5 - 0.5 * (0 - 1.5))


def test_mirostat_1_keeps_the_k_of_the_zipf_estimate():
    x = np.log(1.0 / np.arange(1, 1001) ** 1.2).astype(np.float32)   # Zipf, exponent 1.2
    m = Mirostat(1, tau=5.0, eta=0.1, n_vocab=1000)
    eps = 0.2
    want = int(((eps * 2 ** 10.0) / (1 - 1000 ** -eps)) ** (1 / 1.2))   # s_hat is 1.2 exactly
    assert m._k(Candidates.of(x)) == want
    assert 0 <= m(Candidates.of(x), Always(0.99)) < want


def test_the_chain_with_the_new_samplers():
    s = Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, top_n_sigma=1.2, seed=0)
    x = np.array([4.0, 3.0, 1.0, 0.0, 2.5, -1.0], np.float32)
    assert sorted(s.candidates(x).as_dict()) == [0, 1, 4]
    s = Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.1, seed=0)
    assert sorted(s.candidates(P4).as_dict()) == [2, 3]
    draws = [Sampler(temperature=1.0, mirostat=2, mirostat_tau=1.5, seed=7) for _ in range(2)]
    seqs = [[d(P4) for _ in range(20)] for d in draws]
    assert seqs[0] == seqs[1] and set(seqs[0]) <= {0, 1, 2, 3}                     # seeded
    assert Sampler(temperature=0, mirostat=1)(P4) == 0                               # greedy stays greedy
    for bad in ({"mirostat": 3}, {"xtc_probability": 1.5}, {"mirostat_tau": -1.0}, {"top_n_sigma": "x"}):
        with pytest.raises(InvalidArgumentError):
            Sampler(**bad)


def test_dry_in_the_chain_after_the_penalties():
    """DRY lowers the token that would lengthen a repeat, after the repetition penalty,
    greedy included; its settings are checked at the boundary."""
    from pyllm.dry import DryBreakers
    x = np.zeros(8, np.float32)
    x[5] = 0.5                                      # the best token before DRY
    history = [1, 2, 3, 5, 1, 2, 3]                 # "1 2 3" was followed by 5: 5 would repeat 4 tokens
    plain = Sampler(temperature=0, repeat_penalty=2.0, repeat_last_n=64)
    dry = Sampler(temperature=0, repeat_penalty=2.0, repeat_last_n=64, dry_multiplier=0.8, dry_base=1.75,
                  dry_allowed_length=2)
    assert plain(x, history) == 5 and dry(x, history) != 5
    # 0.5 / 2 (repeat penalty) - 0.8 * 1.75 ** (3 - 2) (DRY: a match of 3 tokens, 2 allowed)
    assert dry.adjusted_logits(x, history)[5] == pytest.approx(0.25 - 0.8 * 1.75)
    assert dry.adjusted_logits(x, history)[[0, 4, 6, 7]].tolist() == [0.0] * 4
    # a breaker inside the repeat (token 2): the match may not reach back past it, and only "3"
    # (1 token, fewer than the 2 allowed) follows it
    cut = Sampler(temperature=0, dry_multiplier=0.8, dry_breakers=DryBreakers.from_token_sequences([[2]]))
    assert cut.adjusted_logits(x, history)[5] == 0.5
    assert Sampler(temperature=0, dry_multiplier=0.8, dry_penalty_last_n=4).adjusted_logits(x, history)[5] == 0.5
    for bad in ({"dry_base": 0.5}, {"dry_allowed_length": -1}, {"dry_penalty_last_n": -2},
                {"dry_sequence_breakers": "\n"}, {"dry_sequence_breakers": [1]}, {"dry_multiplier": "x"}):
        with pytest.raises(InvalidArgumentError):
            Sampler(**bad)


def test_the_chain_in_another_order():
    """samplers= (llama.cpp's --samplers / --sampling-seq): the default order given explicitly draws
    what the default chain draws, seed for seed; another order is that order (min-p after a hot
    temperature keeps more); a step left out is off (no penalties: the repeated token wins)."""
    from pyllm.sampling import DEFAULT_CHAIN, chain_of
    rng = np.random.default_rng(5)
    for trial in range(40):
        x = (rng.standard_normal(300) * 3).astype(np.float32)
        history = rng.integers(0, 300, 20).tolist()
        kw = dict(temperature=float(rng.choice([0.0, 0.7, 1.5])), top_k=int(rng.choice([0, 40])),
                  top_p=float(rng.choice([1.0, 0.9])), min_p=float(rng.choice([0.0, 0.05])),
                  typical_p=float(rng.choice([1.0, 0.95])), repeat_penalty=1.3, presence_penalty=0.2,
                  xtc_probability=float(rng.choice([0.0, 0.5])), dry_multiplier=0.8, seed=trial)
        want = Sampler(**kw)
        got = Sampler(**kw, samplers=list(DEFAULT_CHAIN))
        letters = Sampler(**kw, samplers="edskypmxt")
        assert [want(x, history) for _ in range(5)] == [got(x, history) for _ in range(5)] == \
            [letters(x, history) for _ in range(5)], kw
    x = np.log(np.array([0.6, 0.25, 0.1, 0.04, 0.01])).astype(np.float32)
    after = Sampler(temperature=3.0, top_k=0, top_p=1.0, min_p=0.2, samplers="min_p;temperature")
    before = Sampler(temperature=3.0, top_k=0, top_p=1.0, min_p=0.2, samplers=["temperature", "min_p"])
    assert sorted(after.candidates(x).as_dict()) == [0, 1]            # 0.25 and up of 0.6
    assert sorted(before.candidates(x).as_dict()) == [0, 1, 2, 3, 4]  # flattened (p^(1/3)) first: all pass
    loud = np.array([1.0, 0.9, 0.0], np.float32)
    assert Sampler(temperature=0, repeat_penalty=2.0)(loud, [0]) == 1
    assert Sampler(temperature=0, repeat_penalty=2.0, samplers="top_k;temperature")(loud, [0]) == 0
    assert chain_of("temp") == ("temperature",) and chain_of("kt") == ("top_k", "temperature")
    assert chain_of("top-k;nucleus;min-p") == ("top_k", "top_p", "min_p")
    for bad in ("top_q", ["top_k", 3], 5):
        with pytest.raises(InvalidArgumentError):
            Sampler(samplers=bad)
