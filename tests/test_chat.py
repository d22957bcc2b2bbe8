"""Model.chat and ChatSession on SmolLM2: KV reuse across turns, stops,
interruption, a full context, save/load."""
from __future__ import annotations

import json

import pytest

from pyllm import Model
from pyllm.chat import ChatSession
from pyllm.errors import ContextFullError, InvalidArgumentError, TemplateError

pytestmark = pytest.mark.model

GREEDY = dict(temperature=0)


@pytest.fixture(scope="module")
def model(smollm2_path):
    with Model(smollm2_path, n_ctx=1024) as m:
        yield m


def test_second_turn_reuses_the_first(model):
    msgs = [{"role": "user", "content": "Name three colors."}]
    c1 = model.chat(msgs, max_tokens=24, **GREEDY)
    assert c1.text and c1.finish_reason in ("stop", "length")
    msgs += [{"role": "assistant", "content": c1.text}, {"role": "user", "content": "And three animals?"}]
    prompt2 = model.chat_tokens(msgs)
    c2 = model.chat(msgs, max_tokens=8, **GREEDY)
    m1, m2 = c1.metrics, c2.metrics
    assert m2.prompt_tokens == len(prompt2)
    # all of turn 1 (prompt and reply, as generated) is reused; at most the
    # reply's last token (sampled, never run) and the new text are computed
    assert m2.reused_tokens >= m1.prompt_tokens + m1.generated_tokens - 1
    new_text = "<|im_end|>\n<|im_start|>user\nAnd three animals?<|im_end|>\n<|im_start|>assistant\n"
    assert m2.prompt_tokens - m2.reused_tokens <= len(model.tokenize(new_text, special=True)) + 1
    # the prompt's tokens start with turn 1's tokens exactly as they went in
    assert prompt2[:m1.prompt_tokens + len(c1.tokens)] == model.chat_tokens(msgs[:1]) + c1.tokens


def test_reply_stops_at_the_end_of_turn(model):
    ids, texts = model.chat_stop()
    im_end = model.tokenizer.token_id("<|im_end|>")
    assert im_end in ids and texts == []
    c = model.chat([{"role": "user", "content": "What is 2+2? Answer with a number."}], max_tokens=40, **GREEDY)
    assert c.finish_reason == "stop" and "4" in c.text and "<|im_end|>" not in c.text


def test_stream_and_seed(model):
    msgs = [{"role": "user", "content": "Say something."}]
    s = model.chat(msgs, max_tokens=10, stream=True, seed=7)
    pieces = list(s)
    assert "".join(pieces) == s.completion.text and s.seed == 7
    again = model.chat(msgs, max_tokens=10, seed=7)
    assert again.text == s.completion.text


def test_interrupted_turn_keeps_the_cache_consistent(model, smollm2_path):
    session = ChatSession(model, system="You are terse.", max_tokens=60, **GREEDY)
    turn = session.send("Write a long poem about the sea.")
    it = iter(turn)
    got = [next(it) for _ in range(4)]
    turn.close()
    c = turn.completion
    assert c.finish_reason == "interrupted" and c.text == "".join(got)
    assert session.messages[-1] == {"role": "assistant", "content": c.text}   # the partial reply is kept
    turn2 = session.send("Now one line about the moon.", max_tokens=1)
    prompt = model.chat_tokens(session.conversation("Now one line about the moon."))
    c2 = turn2.run()
    # turn 2 computed little: the first turn's tokens were reused
    assert c2.metrics.reused_tokens >= c.metrics.prompt_tokens + len(c.tokens) - 1
    # and what the cache held was right: a fresh model on the same tokens agrees
    with Model(smollm2_path, n_ctx=1024) as fresh:
        ref = fresh.generate(prompt, max_tokens=1, **GREEDY)
    assert c2.tokens == ref.tokens


def test_full_context_drops_the_oldest_turns(smollm2_path):
    with Model(smollm2_path, n_ctx=192) as m:
        s = ChatSession(m, system="SYSTEM-PROMPT-KEPT", max_tokens=8, **GREEDY)
        filler = "Remember this list: " + ", ".join(f"item {i}" for i in range(12)) + "."
        dropped = 0
        for i in range(5):
            turn = s.send(f"{filler} Question {i}?")
            turn.run()
            dropped += turn.dropped
        assert dropped >= 2 and s.stats.dropped_turns == dropped
        conv = s.conversation("x")
        assert conv[0] == {"role": "system", "content": "SYSTEM-PROMPT-KEPT"}
        assert "Question 4?" in s.messages[-2]["content"] and "Question 0?" not in json.dumps(s.messages)
        with pytest.raises(ContextFullError, match="context holds 192"):
            s.send("word " * 400)
        assert "Question 4?" in s.messages[-2]["content"]        # the conversation survives


def test_save_and_load(model, tmp_path):
    s = ChatSession(model, system="Be kind.")
    s.messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    s.save(tmp_path / "c.json")
    t = ChatSession(model)
    t.load(tmp_path / "c.json")
    assert t.system == "Be kind." and t.messages == s.messages
    (tmp_path / "plain.json").write_text(json.dumps([{"role": "system", "content": "S"},
                                                     {"role": "user", "content": "u"}]))
    t.load(tmp_path / "plain.json")
    assert t.system == "S" and t.messages == [{"role": "user", "content": "u"}]
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(InvalidArgumentError, match="not a saved chat"):
        t.load(tmp_path / "bad.json")
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        t.load(tmp_path / "missing.json")


def test_template_choice_and_refusal(smollm2_path):
    with pytest.raises(TemplateError, match="Python internals"):
        Model(smollm2_path, chat_template="{{ ''.__class__.__mro__ }}")
    with Model(smollm2_path, n_ctx=256, chat_template="gemma") as m:
        assert m.apply_chat_template([{"role": "user", "content": "hi"}]) == \
            "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
        ids, texts = m.chat_stop()
        assert texts == ["<end_of_turn>"]          # not a token in SmolLM2's vocabulary: a stop string
        assert ids == set(m.tokenizer.eog_ids)


def test_api_argument_errors(model):
    with pytest.raises(InvalidArgumentError, match="unknown sampling option 'temp'"):
        model.generate("x", temp=0.5)
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        model.generate([10 ** 7])
    with pytest.raises(InvalidArgumentError):
        model.chat("hello")
    with pytest.raises(InvalidArgumentError, match="stop must be"):
        model.generate("x", stop=[""])


def test_cancel_while_the_prompt_is_computed(smollm2_path):
    with Model(smollm2_path, n_ctx=1024, n_batch=32) as m:
        msgs = [{"role": "user", "content": "Tell me about this: " + "apples and pears " * 60}]
        n_prompt = len(m.chat_tokens(msgs))
        s = m.chat(msgs, max_tokens=8, stream=True, **GREEDY)
        forward, calls = m.backend.forward, []

        def counting_forward(*a, **kw):
            calls.append(1)
            if len(calls) == 2:
                s.cancel()             # as the Ctrl-C handler does, between two prompt chunks
            return forward(*a, **kw)

        m.backend.forward = counting_forward
        try:
            assert list(s) == []
        finally:
            m.backend.forward = forward
        c = s.completion
        assert c.finish_reason == "interrupted" and c.tokens == [] and len(calls) == 2
        assert len(m._seq) == 64 < n_prompt          # the two chunks done are kept
        again = m.chat(msgs, max_tokens=2, **GREEDY)
        assert again.metrics.reused_tokens == 64


def test_gemma_without_a_template_uses_its_turn_format(gemma3_path, caplog):
    with caplog.at_level("INFO", logger="pyllm"), Model(gemma3_path, n_ctx=512) as m:
        assert m.file.metadata.get("tokenizer.chat_template") is None
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        assert m.apply_chat_template(msgs) == \
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        assert "Gemma's turn format" in caplog.text
        ids = m.chat_tokens(msgs)
        assert ids[0] == m.tokenizer.bos_id and ids[1] != m.tokenizer.bos_id     # one BOS
        assert m.tokenizer.token_id("<end_of_turn>") in m.chat_stop()[0]
        c1 = m.chat(msgs, max_tokens=4, **GREEDY)
        msgs += [{"role": "assistant", "content": c1.text}, {"role": "user", "content": "Bye"}]
        c2 = m.chat(msgs, max_tokens=2, **GREEDY)
        assert c2.metrics.reused_tokens >= c1.metrics.prompt_tokens + c1.metrics.generated_tokens - 1


def test_session_replies_follow_a_schema(model, smollm2_path):
    """ChatSession(format=schema) holds every reply to the schema, over several turns (the
    conversation itself stays free text); `pyllm chat -j` does the same from the terminal; a
    bad grammar is refused before the first turn."""
    import subprocess
    import sys

    from pyllm.errors import GrammarError
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    s = ChatSession(model, format=schema, max_tokens=60, **GREEDY)
    for ask in ("Give me a person.", "Another one, older."):
        reply = json.loads(s.send(ask).run().text)
        assert set(reply) == {"name", "age"} and isinstance(reply["name"], str) and isinstance(reply["age"], int)
    assert [m["role"] for m in s.messages] == ["user", "assistant"] * 2
    with pytest.raises(GrammarError):
        ChatSession(model, grammar="root ::= (")
    r = subprocess.run([sys.executable, "-m", "pyllm.cli.main", "chat", "-m", smollm2_path, "--temp", "0", "-n", "60",
                        "-j", json.dumps(schema)], input="Give me a person.\n", capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout[r.stdout.index("{"):r.stdout.rindex("}") + 1])) == {"name", "age"}
