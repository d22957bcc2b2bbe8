"""Log-probabilities (pyllm.engine.token_logprob): of generated tokens (logprobs=) and of a
prompt's tokens (Model.prompt_logprobs), against numpy's log-softmax of the model's logits."""
import numpy as np
import pytest

from pyllm import InvalidArgumentError, Model
from pyllm.engine import token_logprob


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    z = x - x.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize("n,top", [(1, 0), (7, 3), (1000, 20), (5, 5)])
def test_token_logprob_is_the_log_softmax(n, top):
    rng = np.random.default_rng(n)
    logits = (rng.standard_normal(n) * 8).astype(np.float32)
    logits[n // 2] = logits.max()   # a tie at the top
    ref = log_softmax(logits)
    t = token_logprob(logits, n // 3, top)
    assert t.token == n // 3 and t.logprob == pytest.approx(ref[n // 3], abs=1e-9)
    assert [i for i, _ in t.top] == list(np.argsort(-ref, kind="stable")[:top])
    assert [lp for _, lp in t.top] == pytest.approx(sorted(ref, reverse=True)[:top], abs=1e-9)


@pytest.fixture(scope="module")
def smol(smollm2_path):
    with Model(smollm2_path, n_threads=2) as m:
        yield m


def test_generated_and_prompt_logprobs_agree_with_the_logits(smol):
    m = smol
    c = m.generate("The capital of France is", max_tokens=6, temperature=0, logprobs=4)
    assert [t.token for t in c.logprobs] == c.tokens and len(c.tokens) == 6
    prompt = m.tokenize("The capital of France is", special=True)
    ref = log_softmax(m.logits(prompt + c.tokens))
    for i, t in enumerate(c.logprobs):   # greedy: the token drawn is the most likely
        row = ref[len(prompt) + i - 1]
        assert t.logprob == pytest.approx(row[t.token], abs=2e-4) and t.top[0] == (t.token, t.logprob)
        assert [j for j, _ in t.top] == list(np.argsort(-row)[:4])
    scored = m.prompt_logprobs(prompt + c.tokens, top=2)
    assert scored[0] is None and len(scored) == len(prompt) + 6
    for i in range(1, len(scored)):
        assert scored[i].logprob == pytest.approx(ref[i - 1][(prompt + c.tokens)[i]], abs=2e-4)
    hot = m.generate("Once upon a time", max_tokens=8, temperature=1.5, seed=2, logprobs=0)
    assert [t.top for t in hot.logprobs] == [[]] * len(hot.tokens) and all(t.logprob <= 0 for t in hot.logprobs)
    chat = m.chat([{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, logprobs=1)
    assert [t.token for t in chat.logprobs] == chat.tokens
    assert m.generate("x", max_tokens=2).logprobs == []   # off unless asked
    for bad in (21, -1, True, 2.0):
        with pytest.raises(InvalidArgumentError, match="0 to 20"):
            m.generate("x", max_tokens=2, logprobs=bad)
