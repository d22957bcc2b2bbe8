"""A reply's reasoning apart from its answer, as the text streams.

Reasoning models write their thinking before the answer, in one of two ways:
  - think tags (Qwen 3, DeepSeek-R1 and its distills, SmolLM3):
        <think>thinking</think>answer
    or Gemma 4's thought channel, <|channel>thought\nthinking<channel|>answer.
    Some templates open the thinking in the prompt itself: then the reply
    starts inside it (start_thinking=True).
  - OpenAI's harmony format (gpt-oss): messages on channels,
        <|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final<|message|>answer
    "final" is the answer; every other channel (analysis, commentary) counts
    as thinking here.
A reply with neither is all answer. The chat keeps only the answer in the
history (gpt-oss's template refuses a channel tag in a message; Qwen 3's
drops old thinking anyway), and `pyllm chat` shows the thinking dimmed.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional

THINKING, ANSWER = "thinking", "answer"

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THOUGHT_OPEN, THOUGHT_CLOSE = "<|channel>thought", "<channel|>"   # Gemma 4
CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
_MARKERS = (THINK_OPEN, THINK_CLOSE, THOUGHT_OPEN, THOUGHT_CLOSE, CHANNEL, MESSAGE, END, START, "<|return|>",
            "<|call|>", "<|constrain|>")


def _held_back(text: str) -> int:
    """How many chars at the end of text could start a marker (kept until the next piece)."""
    for n in range(min(len(text), max(map(len, _MARKERS)) - 1), 0, -1):
        tail = text[-n:]
        if any(m.startswith(tail) for m in _MARKERS):
            return n
    return 0


class ReasoningSplitter:
    """Feed it a reply's text pieces; it returns (kind, text) parts, kind
    THINKING or ANSWER, with the markup removed. finish() returns what it
    held back."""

    def __init__(self, start_thinking: bool = False):
        self._buf = ""
        self._mode = "think" if start_thinking else "start"   # start, think, answer, header, body, between
        self._channel = ""
        self._strip = False    # drop the whitespace that follows </think>
        self._wrote = False    # this message emitted something
        self._newline = False  # a thinking message ended: the next starts on a new line

    @property
    def phase(self) -> str:
        """Where the reply is: "start" (nothing but blanks yet, or the start of a marker),
        THINKING, or ANSWER (what comes next is answer)."""
        if self._mode == "start":
            return "start"
        if self._mode == "answer" or (self._mode == "body" and self._channel == "final"):
            return ANSWER
        return THINKING

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self._buf += piece
        out: list[tuple[str, str]] = []
        while self._buf:
            if not self._step(out):
                break
        return out

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        buf, self._buf = self._buf, ""
        if self._mode in ("think", "body", "answer", "start") and buf:
            self._emit(out, self._kind(), buf)
        return out

    # -- the state machine ---------------------------------------------------------------
    def _kind(self) -> str:
        if self._mode == "think" or (self._mode == "body" and self._channel != "final"):
            return THINKING
        return ANSWER

    def _emit(self, out: list, kind: str, text: str) -> None:
        if self._strip:
            text = text.lstrip()
            if not text:
                return
            self._strip = False
        if not text:
            return
        if kind == THINKING and self._newline:
            text, self._newline = "\n" + text, False
        self._wrote = True
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        elif text:
            out.append((kind, text))

    def _take_until(self, out: list, marker: str, kind: Optional[str]) -> bool:
        """Emits (or drops, kind None) the text before `marker` and consumes the
        marker: True. Without the marker in the buffer, emits what cannot be its
        start and keeps the rest: False."""
        i = self._buf.find(marker)
        if i >= 0:
            if kind and i:
                self._emit(out, kind, self._buf[:i])
            self._buf = self._buf[i + len(marker):]
            return True
        keep = _held_back(self._buf)
        if kind and len(self._buf) > keep:
            self._emit(out, kind, self._buf[:len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep:]
        return False

    def _step(self, out: list) -> bool:
        """One move of the state machine; False when it needs more text."""
        mode = self._mode
        if mode == "start":   # which format, from the first non-blank text
            head = self._buf.lstrip()
            if not head:
                return False
            for marker, nxt in ((THINK_OPEN, "think"), (THOUGHT_OPEN, "think"), (CHANNEL, "header")):
                if head.startswith(marker):
                    self._buf, self._mode = head[len(marker):], nxt
                    self._strip = marker == THOUGHT_OPEN   # the newline after it
                    return True
                if marker.startswith(head):
                    return False   # could still be the marker
            self._mode = "answer"
            return True
        if mode == "think":   # up to whichever closing marker comes first
            found = [(i, m) for m in (THINK_CLOSE, THOUGHT_CLOSE) if (i := self._buf.find(m)) >= 0]
            close = min(found)[1] if found else THINK_CLOSE
            if self._take_until(out, close, THINKING):
                self._mode, self._strip = "answer", True
                return True
            return False
        if mode == "answer":
            self._emit(out, ANSWER, self._buf)
            self._buf = ""
            return False
        if mode == "header":   # <|channel|>NAME[ to=...][<|constrain|>...]<|message|>
            i = self._buf.find(MESSAGE)
            if i < 0:
                return False
            words = self._buf[:i].split()
            self._channel = words[0] if words else ""
            self._buf, self._mode, self._wrote = self._buf[i + len(MESSAGE):], "body", False
            return True
        if mode == "body":
            ends = [(self._buf.find(m), m) for m in (END, "<|return|>", "<|call|>") if m in self._buf]
            if ends:
                i, m = min(ends)
                if i:
                    self._emit(out, self._kind(), self._buf[:i])
                self._buf, self._mode = self._buf[i + len(m):], "between"
                self._newline = self._newline or (self._channel != "final" and self._wrote)
                return True
            keep = _held_back(self._buf)
            if len(self._buf) > keep:
                self._emit(out, self._kind(), self._buf[:len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        # between messages: <|start|>assistant ... up to the next channel
        if self._take_until(out, CHANNEL, None):
            self._mode = "header"
            return True
        return False


def split_pieces(pieces: Iterable[str], start_thinking: bool = False) -> Iterator[tuple[str, str]]:
    """The (kind, text) parts of a stream of text pieces, as they come."""
    s = ReasoningSplitter(start_thinking)
    for piece in pieces:
        yield from s.feed(piece)
    yield from s.finish()


def split_reasoning(text: str, start_thinking: bool = False) -> tuple[str, str]:
    """(thinking, answer) of a whole reply; a reply without reasoning markup
    is all answer, as it is."""
    parts = list(split_pieces([text], start_thinking))
    if all(k == ANSWER for k, _ in parts) and not start_thinking and not any(
            m in text for m in (THINK_OPEN, THOUGHT_OPEN, CHANNEL)):
        return "", text
    return ("".join(t for k, t in parts if k == THINKING).strip(),
            "".join(t for k, t in parts if k == ANSWER).strip())


def prompt_opens_thinking(prompt: str) -> bool:
    """Does the rendered prompt end inside a <think> (DeepSeek-R1's templates) or Gemma 4's
    thought channel?"""
    tail = prompt.rstrip()
    return tail.endswith(THINK_OPEN) or tail.endswith(THOUGHT_OPEN)


def reply_starts_thinking(prompt: str, prefill: str = "") -> bool:
    """Does a reply that goes on from `prefill` (the start of the reply, after the rendered
    prompt) start inside the thinking?"""
    s = ReasoningSplitter(prompt_opens_thinking(prompt))
    s.feed(prefill)
    return s._mode == "think"
