"""Speculative decoding (pyllm/speculative.py): the drafters alone, then on real models,
where the text must be exactly plain decoding's, token for token, with guesses kept."""
import json

import pytest

import synth
from gguf import GGMLQuantizationType as QT

from pyllm.errors import InvalidArgumentError
from pyllm.speculative import DraftLength, NgramDrafter, SpecParams


# -- the drafters ------------------------------------------------------------------------------

def test_ngram_drafts_what_followed_the_latest_match():
    d = NgramDrafter(SpecParams(ngram_size=2))
    #          0  1  2  3  4  5  6  7  8  9 10
    history = [1, 2, 3, 4, 1, 2, 5, 6, 7, 1, 2]
    assert d.draft(history, 8) == [5, 6, 7, 1, 2]   # [1, 2] last seen at 4..5: what came after
    assert d.draft(history, 2) == [5, 6]
    assert d.draft(history + [9], 8) == []          # [2, 9] never seen before
    # the history grew by one token: the index follows it
    assert d.draft(history + [5], 8) == [6, 7, 1, 2, 5]


def test_ngram_needs_the_whole_n_gram():
    d = NgramDrafter(SpecParams(ngram_size=3))
    assert d.draft([1, 2, 3], 4) == []
    assert d.draft([7, 2, 3, 4, 8, 2, 3], 4) == []       # only [2, 3] matches, not [8, 2, 3]
    assert d.draft([7, 2, 3, 4, 8, 2, 3, 4, 9, 2, 3, 4], 4) == [9, 2, 3, 4]


def test_ngram_starts_again_on_another_history():
    d = NgramDrafter(SpecParams(ngram_size=1))
    assert d.draft([1, 2, 1], 3) == [2, 1]
    assert d.draft([5, 6, 1], 3) == []    # not an extension of the last: nothing of it is kept
    assert d.draft([5, 6, 1, 5], 3) == [6, 1, 5]


def test_draft_length_backs_off_after_a_miss():
    n = DraftLength(SpecParams(draft_max=16))
    assert n.now == 16
    n.update(16, 3)
    assert n.now == 6
    n.update(6, 0)
    assert n.now == 2
    n.update(2, 2)
    assert n.now == 16


@pytest.mark.parametrize("bad, what", [({"draft_max": 0}, "spec-draft-n-max"), ({"draft_max": 40}, "1..31"),
                                       ({"draft_min": 20}, "n-min"), ({"ngram_size": 0}, "n-gram"),
                                       ({"p_min": 1.5}, "p-min")])
def test_bad_settings_are_refused(bad, what):
    with pytest.raises(InvalidArgumentError, match=what):
        SpecParams(**bad).validate()


# -- on the real models ------------------------------------------------------------------------

CODE = '''def moving_average(values, width):
    """The mean of each run of `width` values."""
    out = []
    total = sum(values[:width])
    out.append(total / width)
    for i in range(width, len(values)):
        total += values[i] - values[i - width]
        out.append(total / width)
    return out
'''
COPY = [{"role": "user", "content": "Repeat this code exactly:\n\n" + CODE}]


def _reply(path, messages, spec_type=None, **kw):
    from pyllm import Model
    spec = {k: kw.pop(k) for k in list(kw) if k.startswith("spec_") or k == "draft_model"}
    with Model(path, n_ctx=1024, n_threads=2, spec_type=spec_type, **spec) as m:
        return m.chat(messages, **kw)


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_ngram_speculation_gives_plain_decodings_tokens(which, request):
    """Greedy: the same tokens as plain decoding, and most of them came from kept guesses."""
    path = request.getfixturevalue(f"{which}_path")
    plain = _reply(path, COPY, max_tokens=120, temperature=0)
    fast = _reply(path, COPY, "ngram-simple", spec_ngram_size=4, max_tokens=120, temperature=0)
    assert fast.tokens == plain.tokens and fast.text == plain.text
    assert fast.finish_reason == plain.finish_reason
    m = fast.metrics
    assert m.draft_tokens > 0 and m.accepted_tokens >= 15
    assert m.decode_steps + m.accepted_tokens == plain.metrics.decode_steps   # every token drawn once
    assert m.decode_steps <= plain.metrics.decode_steps - 15


def test_sampled_speculation_draws_as_plain_decoding(smollm2_path):
    """With a seed, the sampler draws once a token either way: the same text."""
    kw = dict(max_tokens=100, temperature=0.7, seed=11, repeat_penalty=1.05)
    plain = _reply(smollm2_path, COPY, **kw)
    fast = _reply(smollm2_path, COPY, "ngram-simple", spec_ngram_size=3, **kw)
    assert fast.tokens == plain.tokens
    assert fast.metrics.accepted_tokens > 0


def test_speculation_keeps_the_cache_to_the_reply(smollm2_path):
    """After a reply the cache holds the prompt and reply (never a dropped guess), so the next
    turn reuses it and replies as a fresh model would; a stop string and a grammar cut guesses
    short as they cut plain decoding."""
    from pyllm import Model
    follow = [{"role": "assistant", "content": None}, {"role": "user", "content": "Now the first line only."}]
    replies = {}
    for spec in (None, "ngram-simple"):
        with Model(smollm2_path, n_ctx=1024, n_threads=2, spec_type=spec, spec_ngram_size=3) as m:
            first = m.chat(COPY, max_tokens=80, temperature=0, stop=["sum("])
            said = m.chat_tokens(COPY) + first.tokens
            assert m._seq.tokens == said[:len(m._seq)] and len(m._seq) >= len(said) - 1
            follow[0]["content"] = first.text
            second = m.chat(COPY + follow, max_tokens=30, temperature=0)
            constrained = m.chat(COPY, max_tokens=40, temperature=0, format={"type": "object", "properties": {
                "code": {"type": "string"}}, "required": ["code"]})
            replies[spec] = (first, second, constrained)
    (p1, p2, p3), (f1, f2, f3) = replies[None], replies["ngram-simple"]
    assert f1.text == p1.text and f1.stop_string == p1.stop_string == "sum("
    assert f2.tokens == p2.tokens and f2.metrics.reused_tokens == p2.metrics.reused_tokens > 0
    assert f3.tokens == p3.tokens


def test_a_draft_model_of_the_same_weights_is_always_right(smollm2_path):
    """SmolLM2 drafting for itself: every greedy guess is the target's choice (a step's rows are
    the decode rows, bit for bit), so every guess is kept and the text is plain decoding's. No
    guess runs past the end token (the scalar path's reply ends at 43 tokens, within a draft)."""
    plain = _reply(smollm2_path, COPY, max_tokens=60, temperature=0)
    drafted = _reply(smollm2_path, COPY, draft_model=smollm2_path, spec_p_min=0.0, spec_draft_max=5,
                     max_tokens=60, temperature=0)
    assert drafted.tokens == plain.tokens
    m = drafted.metrics
    assert m.accepted_tokens == m.draft_tokens > 0
    assert m.decode_steps <= len(drafted.tokens) // 5 + 1     # 5 guesses a step, short ones at the end


def test_a_draft_model_stops_guessing_where_it_is_unsure(smollm2_path):
    """p_min near 1: the draft model rarely guesses; the text stays the same."""
    plain = _reply(smollm2_path, COPY, max_tokens=40, temperature=0)
    drafted = _reply(smollm2_path, COPY, draft_model=smollm2_path, spec_p_min=0.999, max_tokens=40,
                     temperature=0)
    assert drafted.tokens == plain.tokens
    assert drafted.metrics.draft_tokens < 20


def test_a_draft_model_needs_the_same_vocabulary(smollm2_path, gemma3_path):
    from pyllm import Model
    with pytest.raises(InvalidArgumentError, match="another vocabulary"):
        Model(smollm2_path, n_ctx=256, draft_model=gemma3_path)


def test_bad_speculation_is_refused_at_load(smollm2_path, tmp_path):
    from pyllm import Model
    with pytest.raises(InvalidArgumentError, match="unknown speculative"):
        Model(smollm2_path, n_ctx=256, spec_type="medusa")
    with pytest.raises(InvalidArgumentError, match="needs a draft model"):
        Model(smollm2_path, n_ctx=256, spec_type="draft")
    with pytest.raises(InvalidArgumentError, match="1..31"):
        Model(smollm2_path, n_ctx=256, spec_type="ngram-simple", spec_draft_max=64)
    hybrid = synth.write_granitehybrid(tmp_path / "gh.gguf", QT.Q8_0)
    with pytest.raises(InvalidArgumentError, match="recurrent state"):
        Model(str(hybrid), n_ctx=256, spec_type="ngram-simple")


def test_the_server_reports_the_guesses(smollm2_path):
    """llama-server's /completion timings say how many tokens were guessed and kept."""
    from pyllm import Model
    from test_server import call, serving
    prompt = "Copy: " + CODE + "\nCopy: " + CODE[:40]
    with Model(smollm2_path, n_ctx=1024, n_threads=2) as m:
        want = m.generate(prompt, max_tokens=50, temperature=0)
    with Model(smollm2_path, n_ctx=1024, n_threads=2, spec_type="ngram-simple", spec_ngram_size=4) as m:
        server = serving(m)
        try:
            status, body = call(server.url, "/completion", {"prompt": prompt, "n_predict": 50, "temperature": 0})
        finally:
            server.shutdown()
            server.server_close()
    assert status == 200 and body["content"] == want.text
    t = body["timings"]
    assert t["draft_n"] >= t["draft_n_accepted"] > 3     # how many: SmolLM2's copy (on AVX2 6, on AVX-512 > 10)
    assert t["predicted_n"] == 50


def test_pyllm_run_speculates(smollm2_path):
    """pyllm run --spec-type ngram-simple: the same text as without, the guesses in --json; a bad
    draft model is one error line."""
    from test_cli import one_error_line, pyllm
    prompt = "Copy: " + CODE + "\nCopy: " + CODE[:40]
    plain = pyllm("run", "-p", prompt, "-n", "40", "--temp", "0", "--json")
    fast = pyllm("run", "-p", prompt, "-n", "40", "--temp", "0", "--json", "--spec-type", "ngram-simple",
                 "--spec-ngram-size-n", "4", "--draft-max", "8")
    assert plain.returncode == 0 and fast.returncode == 0, fast.stderr
    p, f = json.loads(plain.stdout), json.loads(fast.stdout)
    assert f["tokens"] == p["tokens"] and "draft_tokens" not in p
    assert f["draft_tokens"] >= f["accepted_tokens"] > 3   # as above
    one_error_line(pyllm("run", "-p", "hi", "-md", "/nonexistent/draft.gguf"), "draft.gguf")
    one_error_line(pyllm("run", "-p", "hi", "--spec-type", "ngram", "-n", "1"), "ngram-simple")


def test_no_guess_runs_past_an_end_token(smollm2_path):
    """A drafter that guesses the end token and more: the guesses stop before it (the reply
    would end there, so rows after it are computed for nothing); the text is unchanged."""
    from pyllm import Model
    with Model(smollm2_path, n_ctx=1024, n_threads=2, spec_type="ngram-simple") as m:
        plain = m.chat(COPY, max_tokens=20, temperature=0)
        end = min(m.engine.tokenizer.eog_ids)

        prompt = len(m.chat_tokens(COPY))

        class Guesser:
            def draft(self, history, n_max):   # the next token right, then the end, then junk
                i = len(history) - prompt
                return ([plain.tokens[i]] if i < len(plain.tokens) else []) + [end, 7, 8][:n_max]

            def close(self):
                pass
        m.engine.new_drafter = Guesser
        guessed = m.chat(COPY, max_tokens=20, temperature=0)
    assert guessed.tokens == plain.tokens
    assert guessed.metrics.draft_tokens == guessed.metrics.accepted_tokens > 0
