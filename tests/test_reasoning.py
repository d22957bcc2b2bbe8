"""The reasoning/answer split of chat replies (pyllm/reasoning.py)."""
import pytest

from pyllm.reasoning import ANSWER, THINKING, ReasoningSplitter, prompt_opens_thinking, split_reasoning

HARMONY = ("<|channel|>analysis<|message|>The user greets. Reply.<|end|><|start|>assistant"
           "<|channel|>final<|message|>Hello! How can I help?")
CASES = [
    # (reply, start_thinking, thinking, answer)
    ("Plain answer, <think> later is text.", False, "", "Plain answer, <think> later is text."),
    ("<think>\nLet me add: 2 + 2 = 4.\n</think>\n\nIt is 4.", False, "Let me add: 2 + 2 = 4.", "It is 4."),
    ("  <think>a</think>b", False, "a", "b"),
    ("<think>\n\n</think>\n\nNo thinking today.", False, "", "No thinking today."),
    ("<think>cut off before the end", False, "cut off before the end", ""),
    ("still thinking (the prompt opened it)</think>Answer.", True, "still thinking (the prompt opened it)", "Answer."),
    (HARMONY, False, "The user greets. Reply.", "Hello! How can I help?"),
    ("<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>commentary to=functions.f "
     "<|constrain|>json<|message|>{}<|call|>", False, "one\n{}", ""),
    ("<|channel|>final<|message|>Straight to it.", False, "", "Straight to it."),
    ("<|channel|>analysis<|message|>thinking, cut", False, "thinking, cut", ""),
    # Gemma 4's thought channel
    ("<|channel>thought\nThe user wants 2 + 2.<channel|>It is 4.", False, "The user wants 2 + 2.", "It is 4."),
    ("<|channel>thought\n<channel|>No thinking.", False, "", "No thinking."),
    ("weighing it</think> no: <channel|> closes Gemma's", True, "weighing it", "no: <channel|> closes Gemma's"),
    ("still weighing<channel|>Answer.", True, "still weighing", "Answer."),
]


@pytest.mark.parametrize("reply,start,thinking,answer", CASES)
def test_split(reply, start, thinking, answer):
    assert split_reasoning(reply, start) == (thinking, answer)


@pytest.mark.parametrize("reply,start,thinking,answer", CASES)
def test_pieces_of_any_size_split_the_same(reply, start, thinking, answer):
    """Markers cut across pieces: one char at a time, and in pieces of 3."""
    for size in (1, 3):
        s = ReasoningSplitter(start)
        parts = []
        for i in range(0, len(reply), size):
            parts += s.feed(reply[i:i + size])
        parts += s.finish()
        got = ("".join(t for k, t in parts if k == THINKING).strip(), "".join(t for k, t in parts if k == ANSWER).strip())
        assert got == (thinking, answer), size
        assert all("<|" not in t and "<think>" not in t and "</think>" not in t for k, t in parts
                   if reply.startswith(("<", " ")))


def test_thinking_streams_before_the_answer():
    """The thinking is shown as it comes, not held until its end."""
    s = ReasoningSplitter()
    assert s.feed("<think>") == []
    assert s.feed("step one, ") == [(THINKING, "step one, ")]
    assert s.feed("step two</thi") == [(THINKING, "step two")]
    assert s.feed("nk>\n\nDone") == [(ANSWER, "Done")]


def test_prompt_opens_thinking():
    assert prompt_opens_thinking("<｜Assistant｜><think>\n")
    assert prompt_opens_thinking("<|turn>model\n<|channel>thought\n")
    assert not prompt_opens_thinking("<|turn>model\n<|channel>thought\n<channel|>")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")


class _Generation:
    """What ChatStream drives: pieces, then a Completion."""

    def __init__(self, pieces):
        self.pieces, self.completion = pieces, None

    def __iter__(self):
        from pyllm.engine import Completion
        yield from self.pieces
        self.completion = Completion(text="".join(self.pieces), tokens=[], finish_reason="stop")

    def cancel(self):
        pass


class _Model:
    """Enough of a Model for ChatSession: each reply is the next of `replies`, in pieces."""
    n_ctx = 4096
    vision = audio = None   # no projector: a text model
    has_media = False

    def __init__(self, replies):
        self.replies, self.prompts = list(replies), []

    def _sampler(self, sampling):
        pass

    def _max_tokens(self, n):
        return n

    def _chat_prompt(self, msgs, images=None):
        text = "".join(f"<{m['role']}>{m['content']}" for m in msgs) + "<assistant><think>\n" * (
            self.replies[0].startswith("R1:"))
        self.prompts.append(msgs)
        return text, list(range(len(text) // 4))

    def _chat_stream(self, text, tokens, max_tokens, stop, sampling, format=None, grammar=None):
        from pyllm.api import ChatStream
        from pyllm.reasoning import prompt_opens_thinking
        reply = self.replies.pop(0).removeprefix("R1:")
        return ChatStream(_Generation([reply[i:i + 2] for i in range(0, len(reply), 2)]), lambda c: None,
                          prompt_opens_thinking(text))


def test_chat_keeps_only_the_answer():
    """The next turn's history holds the answer, not the thinking: gpt-oss's
    template refuses channel tags in a message; the parts stream apart."""
    from pyllm.chat import ChatSession
    model = _Model([HARMONY, "<think>hmm</think>\n\nTwo.", "R1:opened by the prompt</think>Three.", "Plain."])
    chat = ChatSession(model)
    parts = list(chat.send("hi").parts())
    assert "".join(t for k, t in parts if k == THINKING) == "The user greets. Reply."
    assert "".join(t for k, t in parts if k == ANSWER) == "Hello! How can I help?"
    assert chat.messages[-1] == {"role": "assistant", "content": "Hello! How can I help?"}
    chat.send("one more").run()
    assert model.prompts[-1][-2]["content"] == "Hello! How can I help?"   # what turn 2 rendered
    assert chat.messages[-1]["content"] == "Two."
    turn = chat.send("and?")
    assert [k for k, _ in turn.parts()][0] == THINKING and chat.messages[-1]["content"] == "Three."
    chat.send("last").run()
    assert chat.messages[-1]["content"] == "Plain." and len(chat.messages) == 8
