"""DRY against a plain reference written from llama.cpp's definition, against
hand-worked penalties, against llama.cpp's own test vectors, and, for the
breaker strings, on the real SmolLM2 vocabulary. benchmarks/compare_dry.py
checks it against llama.cpp itself."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from pyllm.dry import DEFAULT_SEQUENCE_BREAKERS, DryBreakers, DryParams, _suffix_matches, apply_dry

MULT, BASE = 0.8, 1.75


# ---- a toy vocabulary, and the reference ----------------------------------

class PieceTokenizer:
    """A stand-in tokenizer: pieces by id; encode is greedy longest match."""

    def __init__(self, pieces: Sequence[bytes]):
        self.pieces = list(pieces)
        self.ids = {p: i for i, p in enumerate(self.pieces)}

    def all_pieces(self) -> list[bytes]:
        return self.pieces

    def encode(self, text: str, add_bos=None, parse_special=False, add_eos=None) -> list[int]:
        data, out, i = text.encode("utf-8"), [], 0
        while i < len(data):
            n = max(n for n in range(1, len(data) - i + 1) if data[i:i + n] in self.ids)
            out.append(self.ids[data[i:i + n]])
            i += n
        return out


def reference_breakers(tokenizer, breakers: Sequence[str]) -> set[tuple[int, ...]]:
    """Every breaker as a full token sequence (head, *tail), from llama.cpp's
    rule said plainly: a token containing the breaker is one by itself; a token
    ending with the breaker's first k bytes, followed by the tokens of the
    remaining bytes (at most 20), is one too. Breakers: UTF-8, cut at a NUL and
    to 40 bytes."""
    detokenize = getattr(tokenizer, "detokenize", None)
    words = [detokenize([t], unparse_special=True) if detokenize else p
             for t, p in enumerate(tokenizer.all_pieces())]
    out = set()
    for text in breakers:
        brk = text.encode().split(b"\0")[0][:40]
        if not brk:
            continue
        for tid, word in enumerate(words):
            if brk in word:
                out.add((tid,))
                continue
            for k in range(1, len(brk)):
                if word.endswith(brk[:k]):
                    rest = brk[k:].decode("utf-8", errors="replace")  # only ASCII-cut breakers here
                    out.add((tid, *tokenizer.encode(rest, add_bos=False, add_eos=False)[:20]))
    return out


def as_sequences(breakers: DryBreakers) -> set[tuple[int, ...]]:
    return {(head, *tail) for head, tails in breakers.tails.items() for tail in tails}


def reference_dry(logits, history, multiplier, base, allowed, last_n, breakers=(), n_ctx=None) -> np.ndarray:
    """llama.cpp's DRY, the slow obvious way. breakers: full token sequences."""
    out = np.array(logits, dtype=np.float32)
    multiplier, base = np.float32(multiplier), np.float32(base)
    if multiplier == 0 or base < 1 or last_n == 0 or last_n < -1:
        return out
    if last_n == -1:
        last_n = len(history) if n_ctx is None else n_ctx
    w = list(history)[-last_n:]
    n = len(w)
    if n <= allowed:
        return out
    # the limit: tokens after the most recent head that completes a breaker
    # (heads tried from the end; that head's longest complete tail counts)
    limit = n
    for after in range(n):
        pos = n - 1 - after
        tails = [len(s) - 1 for s in breakers
                 if s[0] == w[pos] and len(s) - 1 <= after and tuple(w[pos + 1:pos + len(s)]) == tuple(s[1:])]
        if tails:
            limit = after - max(tails)
            break
    if limit < allowed:
        return out
    # for each earlier position j: how many tokens ending at j equal the last
    # ones; the token after j would make that repeat one longer
    longest: dict[int, int] = {}
    for j in range(n - 1):
        length = 0
        while length <= j and w[j - length] == w[n - 1 - length]:
            length += 1
        length = min(length, limit)
        if length >= allowed:
            longest[w[j + 1]] = max(longest.get(w[j + 1], length), length)
    singles = {s[0] for s in breakers if len(s) == 1}
    max_exponent = int(np.float32(88.7228391) / np.float32(math.log(base))) if base > 1.000001 else 0
    for token, length in longest.items():
        if token in singles or not 0 <= token < len(out):
            continue
        exponent = length - allowed
        if max_exponent > 0:
            exponent = min(exponent, max_exponent)
        with np.errstate(over="ignore"):
            out[token] -= np.float32(float(multiplier) * float(base) ** exponent)
    return out


def dry(logits, history, multiplier=MULT, base=BASE, allowed=2, last_n=64, breakers=(), n_ctx=None):
    b = DryBreakers.from_token_sequences(breakers) if breakers else None
    return apply_dry(np.asarray(logits, dtype=np.float32), history,
                     DryParams(multiplier, base, allowed, last_n), b, n_ctx=n_ctx)


def penalties(history, n_vocab=9, **kw) -> dict[int, float]:
    """{token: penalty} for zero logits (penalties as positive numbers)."""
    out = dry(np.zeros(n_vocab), history, **kw)
    return {t: float(-out[t]) for t in np.flatnonzero(out)}


# ---- against the reference --------------------------------------------------

def test_random_against_reference():
    rng = np.random.default_rng(0)
    for case in range(3000):
        alphabet = int(rng.integers(1, 7))
        n_vocab = alphabet + 1
        history = rng.integers(0, alphabet, size=int(rng.integers(0, 70))).tolist()
        if history and rng.random() < 0.5:  # plant a repeat: the history ends on a copy of an earlier span
            start = int(rng.integers(0, len(history)))
            history += history[start:start + int(rng.integers(1, 30))]
        breakers = [tuple(rng.integers(0, n_vocab, size=int(rng.integers(1, 4))).tolist())
                    for _ in range(int(rng.integers(0, 4)))]
        multiplier = float(rng.choice([0.8, 1.0, 2.0, 0.0, -1.0]))
        base = float(rng.choice([1.75, 1.0, 1.1, 3.0, 40.0, 0.9]))
        allowed = int(rng.choice([2, 2, 0, 1, 3, -1]))
        last_n = int(rng.choice([64, 1, 2, 3, 10, 30, 1000, 0, -1, -2]))
        n_ctx = int(rng.choice([5, 50])) if rng.random() < 0.5 else None
        logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
        got = dry(logits, history, multiplier, base, allowed, last_n, breakers, n_ctx)
        want = reference_dry(logits, history, multiplier, base, allowed, last_n, breakers, n_ctx)
        np.testing.assert_array_equal(got, want, err_msg=f"case {case}: {history} {breakers} "
                                      f"{multiplier} {base} {allowed} {last_n} {n_ctx}")


def test_suffix_matches_against_naive():
    rng = np.random.default_rng(1)
    for _ in range(300):
        w = rng.integers(0, int(rng.integers(1, 4)), size=int(rng.integers(0, 300)))
        n = len(w)
        naive = [0] * n
        for j in range(n - 1):
            while naive[j] <= j and w[j - naive[j]] == w[n - 1 - naive[j]]:
                naive[j] += 1
        assert _suffix_matches(w).tolist() == naive


def test_long_loops_against_reference():
    """What DRY is for: a phrase over and over, long matches, the exponent cap."""
    rng = np.random.default_rng(2)
    for period in (1, 2, 3, 7):
        phrase = rng.integers(0, 50, size=period).tolist()
        history = rng.integers(0, 50, size=20).tolist() + phrase * (400 // period)
        logits = rng.standard_normal(50).astype(np.float32)
        for base in (1.75, 3.0, 40.0):
            for last_n in (64, 300, -1):
                np.testing.assert_array_equal(dry(logits, history, 0.8, base, 2, last_n),
                                              reference_dry(logits, history, 0.8, base, 2, last_n))


# ---- hand-worked ---------------------------------------------------------

A, B, C, X, Y, P, Q, R, NL = range(9)


def test_llama_cpp_comment_example():
    # llama.cpp's example: a b c c b c y a b c. The end "a b c" also occurs at
    # the start, then c; "b c" is followed by y; "c" by b.
    history = [A, B, C, C, B, C, Y, A, B, C]
    assert penalties(history) == pytest.approx({C: MULT * BASE, Y: MULT})  # lengths 3, 2 (b: 1 < 2)
    assert penalties(history, allowed=1) == pytest.approx({C: MULT * BASE ** 2, Y: MULT * BASE, B: MULT})


def test_simple_repeat():
    assert penalties([A, B, C, X, A, B]) == pytest.approx({C: MULT})  # "a b" again: c would make it "a b c"
    assert penalties([A, B, C, X, A, B], multiplier=1.0, base=2.0, allowed=1) == pytest.approx({C: 2.0})


def test_the_longest_match_counts():
    # after "a b" comes x once, after "y a b" (longer) comes c
    assert penalties([A, B, X, Y, A, B, C, Y, A, B]) == pytest.approx({X: MULT, C: MULT * BASE})


def test_short_history():
    assert penalties([], allowed=2) == {}
    assert penalties([A], allowed=0) == {}
    assert penalties([A, A], allowed=2) == {}                        # no more tokens than allowed_length
    assert penalties([A, A], allowed=1) == pytest.approx({A: MULT})  # one more: a, then a again
    # allowed_length 0: every token seen after the first is penalised, a match of 0 included
    assert penalties([A, B], allowed=0) == pytest.approx({B: MULT})


def test_breaker_limits_the_match():
    history = [NL, A, B, Y, NL, A, B]
    assert penalties(history) == pytest.approx({Y: MULT * BASE})           # "\n a b" again: length 3
    assert penalties(history, breakers=[(NL,)]) == pytest.approx({Y: MULT})  # only "a b" after the newline
    # a breaker closer to the end than allowed_length: nothing at all
    assert penalties([A, B, A, NL, B], breakers=[(NL,)], allowed=2) == {}


def test_breaker_token_is_never_penalised():
    logits = np.zeros(9, dtype=np.float32)
    history = [A, B, NL, A, B]
    assert dry(logits, history)[NL] == pytest.approx(-MULT)
    assert dry(logits, history, breakers=[(NL,)]) is logits


def test_breaker_spanning_tokens():
    pq = [(P, Q)]  # p then q is a breaker; p alone is not
    history = [A, B, P, Q, A, B, Y, P, Q, A, B]
    assert penalties(history) == pytest.approx({Y: MULT * BASE ** 2, P: MULT})  # "a b p q a b" again
    assert penalties(history, breakers=pq) == pytest.approx({Y: MULT, P: MULT})  # only "a b" after "p q"
    # the head alone, without its tail, breaks nothing
    assert penalties([P, A, B, Y, P, A, B], breakers=pq) == pytest.approx({Y: MULT * BASE})
    # nor does a head at the very end, its tail not yet there
    assert penalties([A, B, P, Y, A, B, P], breakers=pq) == pytest.approx({Y: MULT * BASE})


def test_the_most_recent_head_decides():
    # Heads are tried from the end: q (a breaker by itself) is found before
    # p, the head of "p q r", though "p q r" ends later. So with both, only
    # q limits the match: 4 tokens (r a b c) instead of 3.
    history = [R, A, B, C, Y, P, Q, R, A, B, C]
    assert penalties(history, breakers=[(P, Q, R)]) == pytest.approx({Y: MULT * BASE})
    assert penalties(history, breakers=[(P, Q, R), (Q,)]) == pytest.approx({Y: MULT * BASE ** 2})


def test_penalty_last_n_window():
    history = [A, B, C, X, A, B]          # c is penalised when the whole history is seen
    full = {C: pytest.approx(MULT)}
    assert penalties(history, last_n=6) == full
    assert penalties(history, last_n=1000) == full
    assert penalties(history, last_n=-1) == full               # -1 without n_ctx: all of it
    assert penalties(history, last_n=-1, n_ctx=4096) == full
    assert penalties(history, last_n=5) == {}                  # b c x a b: "b" repeats, one token only
    assert penalties(history, last_n=-1, n_ctx=5) == {}
    assert penalties(history, last_n=2) == {}                  # window no longer than allowed_length
    assert penalties(history, last_n=1) == {}
    assert penalties(history, last_n=0) == {}                  # off
    assert penalties(history, last_n=-2) == {}                 # off, as llama.cpp's max(n, 0)


def test_exponent_cap_and_overflow():
    history = [A] * 30  # a repeated: a match of 29 before the next a
    # base 40: the exponent stops at int(ln(FLT_MAX) / ln 40) = 24, not 29 - 2
    assert int(88.7228391 / math.log(40)) == 24
    assert penalties(history, base=40.0) == pytest.approx({A: MULT * 40.0 ** 24}, rel=1e-6)
    assert penalties(history, base=1.75) == pytest.approx({A: MULT * 1.75 ** 27}, rel=1e-6)
    # a multiplier past float range: the penalty is inf, the token banned
    assert dry(np.zeros(4), history, multiplier=2.0, base=40.0)[A] == -np.inf


def test_off_returns_the_input():
    logits = np.zeros(8, dtype=np.float32)
    history = [A, B, C, A, B]
    for kw in ({"multiplier": 0.0}, {"base": 0.99}, {"last_n": 0}):
        assert dry(logits, history, **kw) is logits
    assert dry(logits, [A, B, C], breakers=[(NL,)]) is logits  # nothing repeats


def test_input_untouched():
    logits = np.arange(8, dtype=np.float32)
    out = apply_dry(logits, [A, B, C, A, B], DryParams(MULT))
    assert out is not logits and logits.tolist() == list(range(8))
    assert out[C] == pytest.approx(C - MULT) and out.dtype == np.float32
    assert apply_dry(np.arange(8.0), [A, B, C, A, B], DryParams(MULT)).dtype == np.float32
    # history ids outside the logits are matched but not penalised
    assert dry(np.zeros(3), [A, B, 7, A, B]).tolist() == [0, 0, 0]


@pytest.mark.parametrize("history, expected_probs, multiplier, allowed, last_n, breakers", [
    ([0, 1], [0.25, 0.25, 0.25, 0.25], 1.0, 2, 4, []),
    ([0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 2, 5, []),
    ([0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 2, 6, [(3,)]),
    ([0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 2, 5, []),
    ([0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 4, 7, []),
])
def test_llama_cpp_test_vectors(history, expected_probs, multiplier, allowed, last_n, breakers):
    """llama.cpp's tests/test-sampling.cpp cases (uniform probabilities, base 1.1)."""
    logits = np.log(np.full(len(expected_probs), 1.0 / len(expected_probs)))
    out = dry(logits, history, multiplier, 1.1, allowed, last_n, breakers).astype(np.float64)
    probs = np.exp(out - out.max())
    np.testing.assert_allclose(probs / probs.sum(), expected_probs, atol=1e-5)


# ---- breaker strings -----------------------------------------------------

TOY = [b"a", b"b", b"#", b"##", b"###", b"a#", b"x###y", b"a##b", b"\n", b"x\n", b":", b" :", b"\n\n", b"c"]


def test_breakers_from_strings_toy():
    tok = PieceTokenizer(TOY)
    ids = tok.ids
    got = as_sequences(DryBreakers.from_strings(tok, ["###"]))
    assert got == {
        (ids[b"###"],), (ids[b"x###y"],),                        # contain it
        (ids[b"#"], ids[b"##"]), (ids[b"a#"], ids[b"##"]),       # end with "#": then "##"
        (ids[b"##"], ids[b"#"]), (ids[b"##"], ids[b"##"]),       # end with "##" or with "#"
    }                                                            # "a##b": no "#" run at its end
    got = DryBreakers.from_strings(tok, ["\n", ":"])
    assert as_sequences(got) == {(ids[w],) for w in (b"\n", b"x\n", b"\n\n", b":", b" :")}
    assert got.single.tolist() == sorted(ids[w] for w in (b"\n", b"x\n", b"\n\n", b":", b" :"))


def test_breakers_from_strings_limits():
    tok = PieceTokenizer(TOY)
    ids = tok.ids
    # the tail keeps 20 tokens; the breaker 40 bytes
    got = as_sequences(DryBreakers.from_strings(tok, ["#" + "c" * 30]))
    assert (ids[b"#"], *[ids[b"c"]] * 20) in got
    assert (ids[b"a#"], *[ids[b"c"]] * 20) in got
    cs = PieceTokenizer([b"c", b"c" * 40, b"#"])
    got = DryBreakers.from_strings(cs, ["c" * 40 + "#"])   # cut to "c" * 40, which the long token contains
    assert got.single.tolist() == [1]
    # cut at a NUL (a C string in llama.cpp); empty breakers are skipped
    assert as_sequences(DryBreakers.from_strings(tok, ["#\0#", ""])) == {
        (ids[w],) for w in (b"#", b"##", b"###", b"a#", b"x###y", b"a##b")}
    assert DryBreakers.from_strings(tok, []).tails == {}


class SpacePrefixTokenizer(PieceTokenizer):
    """Detokenizes as a SentencePiece vocabulary with a space prefix: one
    token's text loses a leading space."""

    def detokenize(self, ids, remove_special=False, unparse_special=False) -> bytes:
        text = b"".join(self.pieces[t] for t in ids)
        return text[1:] if text[:1] == b" " else text


def test_breakers_use_the_detokenized_word():
    tok = SpacePrefixTokenizer([b" x", b"a x", b" ", b"x", b"a", b"a "])
    # " x" reads as "x" and " " as "": neither holds or ends with any of " x";
    # "a x" contains it, "a " ends with its first byte, then comes "x"
    assert as_sequences(DryBreakers.from_strings(tok, [" x"])) == {(1,), (5, 3)}
    assert as_sequences(DryBreakers.from_strings(tok, [" x"])) == reference_breakers(tok, [" x"])


def test_breakers_from_strings_against_reference():
    rng = np.random.default_rng(3)
    alphabet = [b"a", b"b", b"#", b"\n", b":"]
    for _ in range(50):
        pieces = list(dict.fromkeys(alphabet + [b"".join(rng.choice(alphabet, size=int(rng.integers(2, 5))))
                                                for _ in range(12)]))
        tok = PieceTokenizer(pieces)
        breakers = ["".join(rng.choice(["a", "b", "#", "\n", ":"], size=int(rng.integers(1, 5))))
                    for _ in range(int(rng.integers(1, 4)))]
        assert as_sequences(DryBreakers.from_strings(tok, breakers)) == reference_breakers(tok, breakers)


# ---- the real vocabulary -------------------------------------------------

def test_smollm2_breakers_and_penalties(smollm2_path):
    from pyllm.model_file import ModelFile
    from pyllm.tokenizer import load_tokenizer
    tok = load_tokenizer(dict(ModelFile(smollm2_path).metadata))
    strings = [*DEFAULT_SEQUENCE_BREAKERS, "\n\n", " Answer:", "<|im_end|>", "**"]
    breakers = DryBreakers.from_strings(tok, strings)
    sequences = as_sequences(breakers)
    assert sequences == reference_breakers(tok, strings)

    def ids(text):
        return tok.encode(text, add_bos=False, add_eos=False, parse_special=False)
    newline, = ids("\n")
    answer, colon = ids(" Answer:")
    assert (newline,) in sequences and (colon,) in sequences     # single-token breakers
    assert (answer, colon) in sequences                          # " Answer" then ":"
    assert (newline, newline) in sequences                       # "\n" then "\n" makes "\n\n"
    assert tok.token_id("<|im_end|>") in breakers.single.tolist()  # special tokens by their text

    # a looping reply, checked against the reference on the real ids
    history = ids("Question: what is it? Answer: it is a cat, a cat, a cat, a cat, a cat, a cat")
    logits = np.random.default_rng(4).standard_normal(tok.n_vocab).astype(np.float32)
    params = DryParams(MULT, BASE, 2, 64)
    got = apply_dry(logits, history, params, breakers)
    np.testing.assert_array_equal(got, reference_dry(logits, history, MULT, BASE, 2, 64, sequences))
    comma, = set(ids(" a cat,")) - set(ids(" a cat"))
    assert logits[comma] - got[comma] > MULT                     # "," continues the loop


def test_model_generation_applies_dry_to_prompt_and_reply(smollm2_path):
    """Model.generate: each greedy token is the argmax of the logits after DRY over the
    prompt and the reply so far (llama.cpp's history), with the model's breakers; DRY
    changes a looping text, and the breakers are built once per list."""
    from pyllm import Model
    with Model(smollm2_path, n_ctx=512) as m:
        prompt = m.tokenize("one two three one two three one two three one two three one two three")
        plain = m.generate(prompt, max_tokens=8, temperature=0).tokens
        gen = m.generate(prompt, max_tokens=8, temperature=0, dry_multiplier=MULT).tokens
        assert gen != plain
        breakers = DryBreakers.from_strings(m.tokenizer)
        assert as_sequences(m._sampler({"dry_multiplier": MULT}).dry_breakers) == as_sequences(breakers)
        assert m._sampler({"dry_multiplier": 1.0}).dry_breakers is m._sampler({"dry_multiplier": MULT}).dry_breakers
        assert m._sampler({}).dry_breakers is None                               # DRY off: no vocabulary scan
        for k, tok in enumerate(gen):
            history = prompt + gen[:k]
            want = apply_dry(m.engine.logits(history)[-1], history, DryParams(MULT, BASE, 2, 64), breakers)
            top2 = np.sort(want)[-2:]
            if top2[1] - top2[0] > 1e-3:                                      # not a tie
                assert tok == int(np.argmax(want)), k
