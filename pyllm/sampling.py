"""Choosing the next token from logits: a chain of samplers, seeded.

The chain and its defaults follow llama.cpp (common/sampling.cpp,
src/llama-sampling.cpp):

    logit bias -> penalties (repeat, frequency, presence over the last
    repeat_last_n tokens) -> DRY (pyllm.dry) -> top-n-sigma -> top-k ->
    typical-p -> top-p -> min-p -> XTC -> temperature -> random draw

or, with mirostat 1 or 2 (which then replaces the whole chain but the logit
bias, as in llama.cpp): logit bias -> temperature -> mirostat's own choice.

`temperature == 0` is greedy: the highest logit after the logit bias, the
penalties and DRY (the filters cannot change which token that is, so they are skipped).

Every stage works on `Candidates`: token ids with their logits, possibly
sorted best first. Each stage is a plain function, so tests can check one at
a time on fixed logits. Speed matters: a vocabulary can have 262k entries and
sampling must stay small next to a decode step, so nothing sorts the whole
vocabulary unless a setting needs it (top-p or typical-p with top-k off grow a
partial selection until it covers the probability mass they need).

Defaults (llama.cpp's): temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
typical_p 1.0 (off), repeat_penalty 1.0 (off), repeat_last_n 64,
frequency_penalty 0, presence_penalty 0, top_n_sigma -1 (off),
xtc_probability 0 (off), xtc_threshold 0.1, mirostat 0 (off), mirostat_tau
5.0, mirostat_eta 0.1, dry_multiplier 0 (off), dry_base 1.75,
dry_allowed_length 2, dry_penalty_last_n 64, dry_sequence_breakers
["\\n", ":", "\"", "*"], no logit bias, a random seed.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

from .dry import DEFAULT_SEQUENCE_BREAKERS, DryBreakers, DryParams, apply_dry
from .errors import InvalidArgumentError


@dataclass
class SamplingParams:
    """Sampling settings. Disabled values: top_k 0, top_p 1, min_p 0,
    typical_p 1, repeat_penalty 1, repeat_last_n 0 (-1 = the whole history),
    top_n_sigma <= 0, xtc_probability 0 or xtc_threshold > 0.5, mirostat 0,
    dry_multiplier 0 or dry_penalty_last_n 0 (-1 = the whole history)."""
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: Optional[int] = None
    min_keep: int = 0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: Sequence[str] = DEFAULT_SEQUENCE_BREAKERS
    ignore_eos: bool = False        # never pick an end-of-generation token (Model adds their -inf biases)
    samplers: Optional[Sequence[str] | str] = None   # the chain's order (llama.cpp's --samplers); None: DEFAULT_CHAIN

    def dry(self) -> DryParams:
        return DryParams(self.dry_multiplier, self.dry_base, self.dry_allowed_length, self.dry_penalty_last_n)

    def validate(self) -> "SamplingParams":
        def bad(msg: str) -> InvalidArgumentError:
            return InvalidArgumentError(msg)
        for name in ("temperature", "top_p", "min_p", "typical_p", "repeat_penalty",
                     "frequency_penalty", "presence_penalty", "top_n_sigma", "xtc_probability", "xtc_threshold",
                     "mirostat_tau", "mirostat_eta", "dry_multiplier", "dry_base"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise bad(f"{name} must be a number, not {v!r}")
        for name in ("top_k", "repeat_last_n", "min_keep", "mirostat", "dry_allowed_length", "dry_penalty_last_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise bad(f"{name} must be an integer, not {v!r}")
        if self.temperature < 0:
            raise bad(f"temperature must be >= 0 (0 = greedy), not {self.temperature}")
        if self.top_k < 0:
            raise bad(f"top_k must be >= 0 (0 = off), not {self.top_k}")
        for name in ("top_p", "min_p", "typical_p"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise bad(f"{name} must be in [0, 1], not {v}")
        if self.repeat_penalty <= 0:
            raise bad(f"repeat_penalty must be > 0 (1 = off), not {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise bad(f"repeat_last_n must be >= -1 (-1 = all, 0 = off), not {self.repeat_last_n}")
        if self.min_keep < 0:
            raise bad(f"min_keep must be >= 0, not {self.min_keep}")
        if not 0 <= self.xtc_probability <= 1:
            raise bad(f"xtc_probability must be in [0, 1] (0 = off), not {self.xtc_probability}")
        if self.mirostat not in (0, 1, 2):
            raise bad(f"mirostat must be 0 (off), 1 or 2 (mirostat 2.0), not {self.mirostat}")
        if self.mirostat_tau < 0 or self.mirostat_eta < 0:
            raise bad(f"mirostat_tau and mirostat_eta must be >= 0, not {self.mirostat_tau}, {self.mirostat_eta}")
        if self.dry_base < 1:
            raise bad(f"dry_base must be >= 1 (the penalty's growth per repeated token), not {self.dry_base}")
        if self.dry_allowed_length < 0:
            raise bad(f"dry_allowed_length must be >= 0, not {self.dry_allowed_length}")
        if self.dry_penalty_last_n < -1:
            raise bad(f"dry_penalty_last_n must be >= -1 (-1 = all, 0 = off), not {self.dry_penalty_last_n}")
        if self.samplers is not None:
            self.samplers = chain_of(self.samplers)
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise bad(f"ignore_eos must be true or false, not {self.ignore_eos!r}")
        breakers = self.dry_sequence_breakers
        if not isinstance(breakers, (list, tuple)) or not all(isinstance(b, str) for b in breakers):
            raise bad(f"dry_sequence_breakers must be a list of strings, not {breakers!r}")
        self.dry_sequence_breakers = tuple(breakers)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or self.seed < 0):
            raise bad(f"seed must be a non-negative integer, not {self.seed!r}")
        bias = {}
        for k, v in dict(self.logit_bias or {}).items():
            try:
                tid, b = int(k), float(v)
            except (TypeError, ValueError):
                raise bad(f"logit_bias maps token ids to numbers; got {k!r}: {v!r}") from None
            if tid < 0 or math.isnan(b):
                raise bad(f"logit_bias: bad entry {k!r}: {v!r}")
            bias[tid] = b
        self.logit_bias = bias
        return self


# The chain between the logit bias and the draw, as llama.cpp names its steps (--samplers), in its
# default order; its alternative names; --sampling-seq's one letter per step.
DEFAULT_CHAIN = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
_STEP_NAMES = {**{s: s for s in DEFAULT_CHAIN}, "top-k": "top_k", "top-p": "top_p", "nucleus": "top_p",
               "typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "min-p": "min_p",
               "temp": "temperature", "top-n-sigma": "top_n_sigma"}
_STEP_LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
                 "m": "min_p", "x": "xtc", "t": "temperature"}


def chain_of(spec: Sequence[str] | str) -> tuple[str, ...]:
    """The sampler steps a list of names gives (llama.cpp's --samplers, separated by ';' in a
    string), or a string of letters (--sampling-seq, e.g. "edskypmxt")."""
    if isinstance(spec, str):
        if ";" not in spec and spec.strip().lower() not in _STEP_NAMES and all(ch in _STEP_LETTERS for ch in spec):
            return tuple(_STEP_LETTERS[ch] for ch in spec)
        spec = [name for name in spec.split(";") if name.strip()]
    if not isinstance(spec, (list, tuple)) or not all(isinstance(s, str) for s in spec):
        raise InvalidArgumentError(f"samplers must be a list of names or a string, not {spec!r}")
    out = []
    for name in spec:
        step = _STEP_NAMES.get(name.strip().lower())
        if step is None:
            raise InvalidArgumentError(f"unknown sampler {name!r}; known: {', '.join(DEFAULT_CHAIN)} (or the "
                                       f"letters {''.join(_STEP_LETTERS)})")
        out.append(step)
    return tuple(out)


class Candidates:
    """Token ids and their logits; `sorted` when logits are in descending order.

    ids None stands for the whole vocabulary in id order (no arange of 262k
    entries per step)."""

    __slots__ = ("ids", "logits", "sorted")

    def __init__(self, ids: Optional[np.ndarray], logits: np.ndarray, sorted: bool = False):
        self.ids, self.logits, self.sorted = ids, logits, sorted

    @classmethod
    def of(cls, logits: np.ndarray) -> "Candidates":
        return cls(None, np.asarray(logits, dtype=np.float32))

    def __len__(self) -> int:
        return len(self.logits)

    def token_ids(self) -> np.ndarray:
        return np.arange(len(self.logits)) if self.ids is None else self.ids

    def take(self, sel: np.ndarray | slice, sorted: bool) -> "Candidates":
        ids = (sel if not isinstance(sel, slice) else np.arange(len(self.logits))[sel]) if self.ids is None \
            else self.ids[sel]
        return Candidates(np.asarray(ids, dtype=np.int64), self.logits[sel], sorted)

    def probs(self) -> np.ndarray:
        """softmax of the logits (float64), in candidate order."""
        return _softmax(self.logits)

    def as_dict(self) -> dict[int, float]:
        """{token id: probability} (for tests and debugging)."""
        return dict(zip(self.token_ids().tolist(), self.probs().tolist()))


def _exp_shifted(x: np.ndarray) -> np.ndarray:
    """exp(x - max x): unnormalised probabilities (float64 for small sets;
    float32 for big ones, where float64 would cost more than it gives)."""
    x = np.asarray(x, dtype=np.float64 if len(x) <= 4096 else np.float32)
    m = x.max()
    if not np.isfinite(m):
        raise InvalidArgumentError("no token is left to sample (every logit is -inf or NaN)")
    return np.exp(x - m)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = _exp_shifted(x)
    return e / e.sum(dtype=np.float64)


def _smallest(keys: np.ndarray, m: int) -> np.ndarray:
    """Indices of the m smallest keys in increasing order (ties: lower index
    first), without sorting everything."""
    n = len(keys)
    if m >= n:
        return np.argsort(keys, kind="stable")
    if n > 8192 and m <= 256:
        # a cheap bound: the m-th smallest of 512 block minima is >= the m-th
        # smallest key, so every one of the m smallest keys is <= it
        cut = n - n % 512
        mins = keys[:cut].reshape(512, -1).min(axis=1)
        if cut < n:
            mins = np.append(mins, keys[cut:].min())
        bound = np.partition(mins, m - 1)[m - 1]
    else:
        bound = np.partition(keys, m - 1)[m - 1]
    pool = np.flatnonzero(keys <= bound)      # in index order
    if len(pool) < m:                         # NaNs in the way: plain and slower
        pool = np.sort(np.argpartition(keys, m - 1)[:m])
    elif len(pool) > m:
        kth = np.partition(keys[pool], m - 1)[m - 1]
        pool = pool[keys[pool] <= kth]
    return pool[np.argsort(keys[pool], kind="stable")[:m]]


def _prefix_reaching(keys: np.ndarray, weights: np.ndarray, target: float, strict: bool,
                     min_keep: int) -> np.ndarray:
    """Indices in increasing key order, up to and including the first where
    the running sum of weights reaches target (> if strict, else >=), and at
    least min_keep of them. Grows a partial selection instead of sorting all."""
    n = len(keys)
    m = min(n, max(64, min_keep))
    while True:
        idx = _smallest(keys, m)
        cum = np.cumsum(weights[idx])
        hit = (cum > target) if strict else (cum >= target)
        hit[:max(min_keep, 1) - 1] = False
        pos = int(np.argmax(hit))
        if hit[pos]:
            return idx[:pos + 1]
        if m >= n:
            return idx
        m = min(n, m * 8)


# ---- the stages ----------------------------------------------------------------------

def apply_logit_bias(logits: np.ndarray, bias: Mapping[int, float]) -> np.ndarray:
    """logits + bias[token] (a new array when there is any bias)."""
    if not bias:
        return logits
    ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
    if ids.max() >= len(logits):
        raise InvalidArgumentError(f"logit_bias names token {int(ids.max())}, outside the vocabulary "
                                   f"(0..{len(logits) - 1})")
    out = np.array(logits, dtype=np.float32)
    out[ids] += np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
    return out


def apply_penalties(logits: np.ndarray, history: Sequence[int], last_n: int, repeat: float = 1.0,
                    frequency: float = 0.0, presence: float = 0.0) -> np.ndarray:
    """Penalises tokens seen in the last `last_n` of history (-1: all of it).

    For a token seen c > 0 times: its logit is divided by `repeat` if
    positive, else multiplied by it; then c * frequency + presence is
    subtracted. Returns a new array when anything changes."""
    if last_n == 0 or not len(history) or (repeat == 1.0 and frequency == 0.0 and presence == 0.0):
        return logits
    window = history if last_n < 0 else history[-last_n:]
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    ids_ok = (ids >= 0) & (ids < len(logits))
    ids, counts = ids[ids_ok], counts[ids_ok]
    out = np.array(logits, dtype=np.float32)
    v = out[ids]
    v = np.where(v <= 0, v * repeat, v / repeat)
    v -= counts.astype(np.float32) * frequency + presence
    out[ids] = v
    return out


def top_k(c: Candidates, k: int, min_keep: int = 1) -> Candidates:
    """The k highest logits, sorted best first; k <= 0 keeps all (unsorted)."""
    if k <= 0:
        return c
    k = min(max(k, min_keep), len(c))
    if c.sorted:
        return c.take(slice(0, k), True)
    return c.take(_smallest(-c.logits, k), True)


def top_p(c: Candidates, p: float, min_keep: int = 1) -> Candidates:
    """Nucleus: the best tokens, in order, up to and including the one where
    their cumulative probability first reaches p (at least min_keep)."""
    if p >= 1.0 or len(c) <= 1:
        return c
    probs = c.probs()
    if c.sorted:
        cum = np.cumsum(probs)
        hit = cum >= p
        hit[:max(min_keep, 1) - 1] = False
        pos = int(np.argmax(hit))
        return c.take(slice(0, pos + 1 if hit[pos] else len(c)), True)
    return c.take(_prefix_reaching(-c.logits, probs, p, False, min_keep), True)


def min_p(c: Candidates, p: float, min_keep: int = 1) -> Candidates:
    """Keeps tokens whose probability is at least p times the best one's
    (logit >= max logit + ln p); order is preserved."""
    if p <= 0.0 or len(c) <= 1:
        return c
    threshold = float(c.logits.max()) + math.log(p)
    if c.sorted:
        n = int(np.count_nonzero(c.logits >= threshold))
        return c.take(slice(0, max(n, min_keep, 1)), True)
    keep = np.flatnonzero(c.logits >= threshold)
    if len(keep) >= max(min_keep, 1):
        return c.take(keep, False)
    return top_k(c, min_keep, min_keep)


def typical(c: Candidates, p: float, min_keep: int = 1) -> Candidates:
    """Locally typical sampling: tokens ordered by how far their surprisal
    (-ln p) is from the distribution's entropy, closest first, until their
    cumulative probability exceeds p (at least min_keep)."""
    if p >= 1.0 or len(c) <= 1:
        return c
    probs = c.probs()
    with np.errstate(divide="ignore"):
        logp = np.log(probs)
    entropy = -float(np.sum(np.where(probs > 0, probs * logp, 0.0)))
    shifted = np.abs(-logp - entropy)
    return c.take(_prefix_reaching(shifted, probs, p, True, min_keep), False)


def top_n_sigma(c: Candidates, n: float) -> Candidates:
    """Keeps the tokens whose logit is at least max - n * std (the standard deviation
    of the finite logits); n <= 0 keeps all. Order is preserved."""
    if n <= 0 or len(c) <= 1:
        return c
    x = c.logits
    finite = x[x != -np.inf]
    if not len(finite):
        return c
    threshold = float(finite.max()) - n * float(finite.astype(np.float64).std())
    keep = np.flatnonzero(x >= threshold)
    return c if len(keep) == len(c) else c.take(keep, c.sorted)


def xtc(c: Candidates, probability: float, threshold: float, min_keep: int, rng: np.random.Generator) -> Candidates:
    """Exclude Top Choices: with the given probability, drops every token at least
    `threshold` likely but the least likely of them, so the reply leaves its most
    obvious path (threshold > 0.5 can hold one token at most: off)."""
    if probability <= 0 or threshold > 0.5 or len(c) < 2:
        return c
    if rng.random() > probability:
        return c
    probs = c.probs()
    n_above = int(np.count_nonzero(probs >= threshold))
    drop = n_above - 1                       # all above the threshold but the last
    if drop <= 0 or len(c) - drop < min_keep:
        return c
    if c.sorted:
        return c.take(slice(drop, len(c)), True)
    top = _smallest(-c.logits, drop)
    keep = np.ones(len(c), dtype=bool)
    keep[top] = False
    return c.take(np.flatnonzero(keep), False)


def temperature(c: Candidates, t: float) -> Candidates:
    """Divides the logits by t (t > 0); t <= 0 keeps only the best token."""
    if t <= 0:
        i = int(np.argmax(c.logits))
        return c.take(np.array([i]), True)
    if t == 1.0:
        return c
    return Candidates(c.ids, c.logits / np.float32(t), c.sorted)


def draw(c: Candidates, rng: np.random.Generator) -> int:
    """A token drawn from softmax(logits), walking the candidates in order."""
    i = _draw_index(c, rng)
    return int(c.ids[i]) if c.ids is not None else i


def _draw_index(c: Candidates, rng: np.random.Generator) -> int:
    cum = np.cumsum(_exp_shifted(c.logits), dtype=np.float64)
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return min(i, len(c) - 1)


class Mirostat:
    """Mirostat (Basu et al. 2020), as llama.cpp runs it: each draw is cut to the tokens
    whose surprise (-log2 p) keeps the text near a target surprise tau, and mu, the cut,
    learns from the surprise of what was drawn (rate eta). Version 1 estimates the
    distribution's Zipf exponent from the top m tokens and keeps the top k it implies;
    version 2 keeps the tokens whose surprise is at most mu."""

    M = 100   # tokens version 1 estimates the Zipf exponent from (llama.cpp's)

    def __init__(self, version: int, tau: float, eta: float, n_vocab: int):
        self.version, self.tau, self.eta, self.n_vocab = version, tau, eta, n_vocab
        self.mu = 2.0 * tau

    def __call__(self, c: Candidates, rng: np.random.Generator) -> int:
        if self.version == 1:
            c = top_k(c, self._k(c), 1)
        else:
            x = c.logits.astype(np.float64)
            log2p = (x - x.max() - np.log(np.exp(x - x.max()).sum())) / math.log(2)
            keep = np.flatnonzero(-log2p <= self.mu)
            c = c.take(keep, c.sorted) if len(keep) else top_k(c, 1, 1)
        i = _draw_index(c, rng)
        surprise = -math.log2(float(c.probs()[i]))
        self.mu -= self.eta * (surprise - self.tau)
        return int(c.ids[i]) if c.ids is not None else i

    def _k(self, c: Candidates) -> int:
        """Version 1's cut: the k for which a Zipf law of the estimated exponent has
        surprise mu, from the m most likely tokens."""
        top = top_k(c, min(self.M, len(c)), 1)
        p = _exp_shifted(top.logits).astype(np.float64)
        i = np.arange(len(p) - 1)
        t = np.log((i + 2) / (i + 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.log(p[:-1] / p[1:])
            s_hat = float(np.sum(t * b) / np.sum(t * t)) if len(t) else 1.0
            eps = s_hat - 1
            k = ((eps * 2.0 ** self.mu) / (1 - self.n_vocab ** -eps)) ** (1 / s_hat)
        return max(int(k), 1) if math.isfinite(k) and k < len(c) else len(c)


class Sampler:
    """A seeded sampler chain: `sampler(logits, history) -> token id`.

    history: the tokens so far (prompt and generated); penalties look at its
    last repeat_last_n entries, DRY at its last dry_penalty_last_n.
    dry_breakers: dry_sequence_breakers as token sequences of the model's
    vocabulary (DryBreakers.from_strings; pyllm.Model keeps one per list);
    None: DRY has no breakers."""

    def __init__(self, params: Optional[SamplingParams] = None, dry_breakers: Optional[DryBreakers] = None,
                 **kwargs):
        if params is None:
            params = SamplingParams(**kwargs)
        elif kwargs:
            raise InvalidArgumentError("give SamplingParams or keywords, not both")
        self.p = params.validate()
        #: the seed in use (chosen at random when none was given), to reproduce a run
        self.seed: int = int(params.seed) if params.seed is not None else secrets.randbits(32)
        self.rng = np.random.default_rng(self.seed)
        self.mirostat: Optional[Mirostat] = None   # its state (mu) lives as long as this sampler
        self.dry = params.dry()
        self.dry_breakers = dry_breakers

    def adjusted_logits(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The logits after the logit bias, the penalties and DRY (those of them the chain has)."""
        p = self.p
        x = np.asarray(logits, dtype=np.float32)
        if x.ndim != 1 or not len(x):
            raise InvalidArgumentError(f"logits must be one non-empty row, not shape {x.shape}")
        x = apply_logit_bias(x, p.logit_bias)
        for step in p.samplers if p.samplers is not None else DEFAULT_CHAIN:
            if step in ("penalties", "dry"):
                x = self._penalize(step, x, history)
        return x

    def _penalize(self, step: str, x: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """The "penalties" or "dry" step on a whole-vocabulary row of logits."""
        p = self.p
        if step == "penalties":
            return apply_penalties(x, history, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                                   p.presence_penalty)
        return apply_dry(x, history, self.dry, self.dry_breakers)

    def _greedy(self) -> bool:
        """Temperature 0 in the chain: the best adjusted logit, whatever the other steps."""
        return self.p.temperature <= 0 and (self.p.samplers is None or "temperature" in self.p.samplers)

    def candidates(self, logits: np.ndarray, history: Sequence[int] = ()) -> Candidates:
        """What the final draw chooses from: the chain up to (and including)
        the temperature. `.as_dict()` gives {token: probability}."""
        p = self.p
        if self._greedy():
            return temperature(Candidates.of(self.adjusted_logits(logits, history)), 0.0)
        if p.samplers is not None:
            return self._chain(logits, history, p.samplers)
        keep = max(1, p.min_keep)
        c = Candidates.of(self.adjusted_logits(logits, history))
        c = top_n_sigma(c, p.top_n_sigma)
        c = top_k(c, p.top_k, keep)
        c = typical(c, p.typical_p, keep)
        if not c.sorted and p.top_p < 1.0 and p.min_p > 0.0 and len(c) > 1:
            # top-p and min-p both keep a prefix of the sorted candidates and
            # agree on the best one, so min-p's count bounds how far top-p
            # needs to sort (same result, much less work without top-k)
            n_min = int(np.count_nonzero(c.logits >= float(c.logits.max()) + math.log(p.min_p)))
            order = _smallest(-c.logits, max(n_min, keep))
            best = c.take(order, True)
            cum = np.cumsum(c.probs()[order])
            hit = cum >= p.top_p
            hit[:keep - 1] = False
            pos = int(np.argmax(hit))
            c = best.take(slice(0, pos + 1), True) if hit[pos] else best
        else:
            c = top_p(c, p.top_p, keep)
        c = min_p(c, p.min_p, keep)
        c = xtc(c, p.xtc_probability, p.xtc_threshold, p.min_keep, self.rng)
        return temperature(c, p.temperature)

    def _chain(self, logits: np.ndarray, history: Sequence[int], steps: Sequence[str]) -> Candidates:
        """The chain in the order given (samplers=): each step as llama.cpp's of that name; the
        penalties and DRY act on the candidates left at their place in it. (Temperature 0 with a
        temperature step is greedy, as in the default chain: see _greedy.)"""
        p = self.p
        keep = max(1, p.min_keep)
        c = Candidates.of(apply_logit_bias(np.asarray(logits, dtype=np.float32), p.logit_bias))
        if c.logits.ndim != 1 or not len(c):
            raise InvalidArgumentError(f"logits must be one non-empty row, not shape {c.logits.shape}")
        for step in steps:
            if step in ("penalties", "dry"):
                full = c.logits if c.ids is None else np.full(len(logits), -np.inf, np.float32)
                if c.ids is not None:
                    full[c.ids] = c.logits
                full = self._penalize(step, full, history)
                c = Candidates(c.ids, full if c.ids is None else full[c.ids])
            elif step == "top_n_sigma":
                c = top_n_sigma(c, p.top_n_sigma)
            elif step == "top_k":
                c = top_k(c, p.top_k, keep)
            elif step == "typ_p":
                c = typical(c, p.typical_p, keep)
            elif step == "top_p":
                c = top_p(c, p.top_p, keep)
            elif step == "min_p":
                c = min_p(c, p.min_p, keep)
            elif step == "xtc":
                c = xtc(c, p.xtc_probability, p.xtc_threshold, p.min_keep, self.rng)
            else:
                c = temperature(c, p.temperature)
        return c

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        p = self.p
        if p.mirostat:   # the logit bias, the temperature, then mirostat's own cut and draw
            x = apply_logit_bias(np.asarray(logits, dtype=np.float32), p.logit_bias)
            if p.temperature <= 0:
                return int(np.argmax(x))
            if self.mirostat is None:
                self.mirostat = Mirostat(p.mirostat, p.mirostat_tau, p.mirostat_eta, len(x))
            return self.mirostat(temperature(Candidates.of(x), p.temperature), self.rng)
        if self._greedy():
            return int(np.argmax(self.adjusted_logits(logits, history)))
        return draw(self.candidates(logits, history), self.rng)
