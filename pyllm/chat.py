"""A conversation with a model: history, system prompt, a full context.

    from pyllm import Model
    from pyllm.chat import ChatSession

    with Model() as m:
        chat = ChatSession(m, system="Answer in one sentence.", temperature=0)
        for piece in chat.send("What is a GGUF file?"):
            print(piece, end="", flush=True)

Each turn renders the whole conversation with the chat template; the model
reuses the KV cache of what it has seen (see Model.chat), so turn N computes
only the new user message. When the conversation no longer fits the context,
the oldest turns are dropped (the system prompt stays) and `dropped` says how
many; a reply cut short by a full context ends with finish_reason "context".

A reasoning model's thinking (<think> tags, gpt-oss's analysis channel) is
not kept in the history: only the answer is (pyllm.reasoning); Turn.parts()
streams the two apart.
"""
from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence as Seq

from .engine import Completion, Metrics
from .errors import ContextFullError, InvalidArgumentError
from .grammar import Format, constraint_for
from .chat_template import normalize_messages
from .reasoning import split_pieces, split_reasoning
from .vision import image_bytes

SAVE_FORMAT = "pyllm-chat/1"


@dataclass
class SessionStats:
    turns: int = 0
    prompt_tokens: int = 0          # summed over turns
    reused_tokens: int = 0
    generated_tokens: int = 0
    dropped_turns: int = 0
    last: Optional[Metrics] = None  # the last turn's metrics
    history: list = field(default_factory=list)   # per-turn metrics, in order


class Turn:
    """One reply in progress. Iterate for text pieces; `completion` holds the
    result once it is over; close() stops it where it is ("interrupted")."""

    def __init__(self, session: "ChatSession", user: dict, stream, dropped: int, context_tokens: int):
        self.session, self.user, self.dropped, self.context_tokens = session, user, dropped, context_tokens
        self._stream = stream
        self._it: Optional[Iterator[str]] = None

    @property
    def completion(self) -> Optional[Completion]:
        return self._stream.completion

    def __iter__(self) -> Iterator[str]:
        if self._it is None:
            self._it = self._run()
        return self._it

    def _run(self) -> Iterator[str]:
        try:
            yield from self._stream
        finally:
            self._stream.close()
            c = self._stream.completion
            if c is not None:
                self.session._finish(self.user, c, self._stream.start_thinking)

    def parts(self) -> Iterator[tuple[str, str]]:
        """Iterates the reply as ("thinking" | "answer", text) parts, markup removed."""
        return split_pieces(self, self._stream.start_thinking)

    def cancel(self) -> None:
        """Stops the reply at the next step (safe in a signal handler)."""
        self._stream.cancel()

    def close(self) -> None:
        if self._it is not None:
            self._it.close()
        else:
            self._stream.close()

    def run(self) -> Completion:
        for _ in self:
            pass
        return self.completion


class ChatSession:
    """Messages so far, a system prompt, and sampling settings for `model`.

    max_tokens: per reply (None: until the reply ends or the context is
    full). format / grammar: every reply's constraint (see Model.chat).
    Other keywords are sampling settings (see Model.generate)."""

    def __init__(self, model, system: Optional[str] = None, max_tokens: Optional[int] = None, format: Format = None,
                 grammar: Optional[str] = None, **sampling: Any):
        self.model = model
        self.system = system or None
        self.max_tokens = max_tokens
        self.format, self.grammar = format, grammar
        if format is not None or grammar is not None:   # a bad grammar or schema fails now
            constraint_for(model.tokenizer, format, grammar)
        self.sampling = sampling
        self.messages: list[dict[str, str]] = []     # user and assistant turns, oldest first
        self.stats = SessionStats()
        model._sampler(sampling)                      # bad settings fail now, not at the first turn
        model._max_tokens(max_tokens)

    # -- the conversation ------------------------------------------------------------------
    def conversation(self, user: Optional[str] = None) -> list[dict[str, str]]:
        """The messages a turn sends: system prompt, history, the new message."""
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        msgs += self.messages
        if user is not None:
            msgs.append({"role": "user", "content": user})
        return msgs

    def reset(self) -> None:
        """Forgets the conversation (the system prompt stays)."""
        self.messages = []

    def _headroom(self, max_tokens: Optional[int]) -> int:
        n_ctx = self.model.n_ctx
        want = max_tokens if max_tokens and max_tokens > 0 else n_ctx
        return max(1, min(want, n_ctx // 4))

    def send(self, text: str, max_tokens: Any = ..., images: Seq[Any] = (), **sampling: Any) -> Turn:
        """Starts the reply to `text`; iterate the Turn for its pieces.
        max_tokens and sampling keywords override the session's for this turn.
        images: pictures that go with the message (a model with a vision
        projector), kept in the conversation as base64.

        If the conversation and room for a reply (max_tokens, at most a
        quarter of the context) do not fit, the oldest exchanges are dropped;
        if the new message does not fit even alone, ContextFullError is raised
        and the conversation is left as it was."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidArgumentError("the message is empty")
        max_tokens = self.max_tokens if max_tokens is ... else max_tokens
        n_ctx = self.model.n_ctx
        kept = list(self.messages)
        dropped = 0
        user = {"role": "user", "content": text}
        if images:
            user["images"] = [base64.b64encode(image_bytes(image)).decode() for image in images]
        while True:
            msgs = ([{"role": "system", "content": self.system}] if self.system else []) + kept + [user]
            shown: Optional[list] = [] if self.model.has_media else None
            prompt_text, tokens = self.model._chat_prompt(normalize_messages(msgs, shown), images=shown)
            if len(tokens) + self._headroom(max_tokens) <= n_ctx or not kept:
                break
            # drop the oldest exchange (a user turn and the reply to it)
            cut = 1
            while cut < len(kept) and kept[cut]["role"] != "user":
                cut += 1
            del kept[:cut]
            dropped += 1
        if len(tokens) >= n_ctx:
            raise ContextFullError(f"the message needs {len(tokens)} tokens with the system prompt; the context "
                                   f"holds {n_ctx} (use a larger context with -c, or a shorter message)")
        stream = self.model._chat_stream(prompt_text, tokens, max_tokens, None, {**self.sampling, **sampling},
                                         self.format, self.grammar)
        self.messages = kept
        self.stats.dropped_turns += dropped
        return Turn(self, user, stream, dropped, len(tokens))

    def _finish(self, user: dict, c: Completion, start_thinking: bool = False) -> None:
        if c.finish_reason == "interrupted" and not c.text.strip():
            return          # stopped before it said anything: as if never asked
        self.messages.append(user)
        self.messages.append({"role": "assistant", "content": split_reasoning(c.text, start_thinking)[1]})
        s = self.stats
        s.turns += 1
        s.prompt_tokens += c.metrics.prompt_tokens
        s.reused_tokens += c.metrics.reused_tokens
        s.generated_tokens += c.metrics.generated_tokens
        s.last = c.metrics
        s.history.append(c.metrics)

    # -- files -----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Writes the conversation as JSON (system prompt and messages)."""
        data = {"format": SAVE_FORMAT, "system": self.system, "messages": self.messages}
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False, indent=1)
                f.write("\n")
        except OSError as e:
            raise InvalidArgumentError(f"cannot write {path}: {e.strerror}") from None

    def load(self, path: str | os.PathLike) -> None:
        """Replaces the conversation with one saved by save() (or a plain JSON
        list of OpenAI-style messages)."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise InvalidArgumentError(f"cannot read {path}: {e.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"{path} is not a saved chat (not JSON: {e})") from None
        system = None
        if isinstance(data, dict):
            system, data = data.get("system"), data.get("messages")
        msgs = normalize_messages(data if data is not None else [])
        if system is not None and not isinstance(system, str):
            raise InvalidArgumentError(f"{path}: the system prompt must be text")
        if msgs and msgs[0]["role"] == "system":
            system = msgs.pop(0)["content"]
        if any(m["role"] not in ("user", "assistant") for m in msgs):
            raise InvalidArgumentError(f"{path}: after the system prompt, messages must be user or assistant turns")
        self.system = system or None
        self.messages = [{"role": m["role"], "content": m["content"]} for m in msgs]
