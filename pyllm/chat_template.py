"""Chat templates: turning a conversation into the prompt text a model expects.

A GGUF file may carry a Jinja template (`tokenizer.chat_template`, the one
from the model's Hugging Face tokenizer_config.json). It is rendered the way
transformers renders it (trim_blocks, lstrip_blocks, loop controls; the
variables messages, add_generation_prompt, bos_token, eos_token; the helpers
raise_exception, strftime_now and a tojson that does not HTML-escape).

A template inside a downloaded file is untrusted input. It runs in jinja2's
ImmutableSandboxedEnvironment and sees only plain data (the messages are
copied through JSON). Anything that reaches for Python internals, such as
`{{ ''.__class__.__mro__ }}`, is refused with a TemplateError: attributes
and keys that start with an underscore are rejected when the template is
loaded, before anything runs, and any other unsafe access the sandbox sees
while rendering raises instead of quietly rendering nothing. Ranges are
capped and so is the rendered size.

Files without a template get a fallback chosen by architecture:

- gemma, gemma2, gemma3, gemma3n: Gemma's turn format,
  `<start_of_turn>user\\n{text}<end_of_turn>\\n<start_of_turn>model\\n`.
  Gemma has no system role: the system prompt goes at the start of the first
  user turn, followed by a blank line (as llama.cpp does). Message texts are
  stripped of surrounding whitespace, also as llama.cpp does.
- a model read with LLaVA 1.5's projector (pyllm.api picks it): Vicuna's
  `{system}\n\nUSER: {text}\nASSISTANT: {reply}</s>\n`, as llama.cpp's "vicuna".
- anything else: ChatML, `<|im_start|>{role}\\n{text}<|im_end|>\\n` and
  `<|im_start|>assistant\\n` to prompt a reply, with a warning, since the
  model may not have been trained on it.

`ChatTemplate.end_of_turn` lists the texts that end a reply (`<|im_end|>`,
`<end_of_turn>`, ...); with the tokenizer's end-of-generation ids they are
what stops a chat reply.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Optional

from .errors import InvalidArgumentError, TemplateError

log = logging.getLogger(__name__)

GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n", "gemma-embedding"})

# end-of-turn markers templates use (looked for in a template's source)
END_OF_TURN_TEXTS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|end_of_text|>",
                     "<|endoftext|>", "<end_of_utterance>", "<|return|>", "<｜end▁of▁sentence｜>", "</s>",
                     "<turn|>")

THINKING_SWITCH = "enable_thinking"   # the template variable that turns a model's thinking on or off

MAX_RENDERED_CHARS = 8_000_000     # a template may not render more than this
MAX_RANGE = 10_000                 # range() in a template yields at most this many items

BUILTIN = ("chatml", "gemma", "vicuna")


IMAGE_MARKER = "<__media__>"   # where an image or a sound goes in the prompt text (llama.cpp's marker)
NO_VISION = ("images and sounds need the model's multimodal projector: load it with --mmproj FILE "
             "(Model(..., mmproj=...))")


IMAGE_PARTS = ("image_url", "image", "input_image")


def _image_source(part: Mapping) -> Any:
    """The image of an OpenAI-style content part: {"type": "image_url", "image_url": {"url": ...}},
    or {"type": "image", "image": ...} (bytes, base64, a data: URL or a file)."""
    if part["type"] == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, Mapping) else url
        if not isinstance(url, str):
            raise InvalidArgumentError("an image_url part needs {'image_url': {'url': 'data:image/...;base64,...'}}")
        return url
    src = part.get("image", part.get("image_url"))
    if not isinstance(src, (str, bytes)):
        raise InvalidArgumentError(f"an {part['type']} part needs the image as base64 or a data: URL")
    return src


def _audio_source(part: Mapping) -> str:
    """The sound of an OpenAI-style {"type": "input_audio", "input_audio": {"data": base64,
    "format": "wav" | "mp3" | "flac"}} part (its bytes say which format they are)."""
    audio = part.get("input_audio")
    data = audio.get("data") if isinstance(audio, Mapping) else None
    if not isinstance(data, str):
        raise InvalidArgumentError("an input_audio part needs {'input_audio': {'data': '<base64>', 'format': 'wav'}}")
    return data


def _message_text(content: Any, images: Optional[list] = None) -> str:
    """A message's content as text: a string, None, or OpenAI-style parts
    ([{"type": "text", "text": ...}]) joined; image and input_audio parts become IMAGE_MARKER,
    their images or sounds appended to `images` (None: they are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, Mapping) and part.get("type") in IMAGE_PARTS + ("input_audio",):
                if images is None:
                    raise InvalidArgumentError(NO_VISION)
                images.append(_audio_source(part) if part["type"] == "input_audio" else _image_source(part))
                texts.append(IMAGE_MARKER)
            else:
                raise InvalidArgumentError("message content parts must be {'type': 'text', 'text': ...}, "
                                           "{'type': 'image_url', 'image_url': {'url': ...}} or "
                                           "{'type': 'input_audio', 'input_audio': {'data': ..., 'format': 'wav'}}")
        return "".join(texts)
    raise InvalidArgumentError(f"message content must be a string, not {type(content).__name__}")


def normalize_messages(messages: Any, images: Optional[list] = None) -> list[dict[str, Any]]:
    """Checks OpenAI-style messages and returns a plain-data copy (role and
    content strings; other JSON fields kept for templates that use them).
    images: a list that takes the messages' images in order (image parts, and
    ollama's "images" of a message, which go before its text), each marked in
    the content by IMAGE_MARKER; None: a message with an image is refused."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidArgumentError("messages must be a list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidArgumentError(f"message {i} is a {type(m).__name__}, not a dict with role and content")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidArgumentError(f"message {i} has no role (system, user or assistant)")
        attached = m.get("images") or []
        if attached and (images is None or not isinstance(attached, list)):
            raise InvalidArgumentError(NO_VISION if images is None else f"message {i}'s images must be a list")
        try:
            extra = json.loads(json.dumps({k: v for k, v in m.items() if k not in ("role", "content", "images")}))
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"message {i} holds something that is not plain JSON data") from None
        if attached:
            images.extend(attached)
        text = IMAGE_MARKER * len(attached) + _message_text(m.get("content"), images)
        out.append({**extra, "role": role, "content": text})
    return out


def _render_chatml(messages: list[dict], add_generation_prompt: bool) -> str:
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _render_gemma(messages: list[dict], add_generation_prompt: bool) -> str:
    parts, system = [], ""
    for m in messages:
        role = m["role"]
        if role == "system":
            system += m["content"].strip()
            continue
        role = "model" if role == "assistant" else role
        parts.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            parts.append(system + "\n\n")
            system = ""
        parts.append(m["content"].strip() + "<end_of_turn>\n")
    if add_generation_prompt:
        parts.append("<start_of_turn>model\n")
    return "".join(parts)


def _render_vicuna(messages: list[dict], add_generation_prompt: bool) -> str:
    turn = {"system": "{}\n\n", "user": "USER: {}\n", "assistant": "ASSISTANT: {}</s>\n"}
    parts = [turn[m["role"]].format(m["content"]) for m in messages if m["role"] in turn]
    if add_generation_prompt:
        parts.append("ASSISTANT:")
    return "".join(parts)


_BUILTIN_RENDER = {"chatml": (_render_chatml, ("<|im_end|>",)),
                   "gemma": (_render_gemma, ("<end_of_turn>",)),
                   "vicuna": (_render_vicuna, ("</s>",))}


def _sandbox():
    """The jinja2 environment templates run in (built on first use)."""
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Sandbox(ImmutableSandboxedEnvironment):
        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            # the stock sandbox returns an undefined value that renders as '';
            # a template that tries this is refused outright
            raise SecurityError(f"access to {attribute!r} on a {type(obj).__name__} value is not allowed")

    def raise_exception(message: str = "") -> None:
        raise _TemplateRaised(str(message))

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(str(fmt))

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def capped_range(*args: int) -> range:
        r = range(*args)
        if len(r) > MAX_RANGE:
            raise SecurityError(f"range() of {len(r)} items is more than a chat template may use")
        return r

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], autoescape=False)
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, range=capped_range)
    return env, nodes, SecurityError


class _TemplateRaised(Exception):
    """raise_exception() called by a template."""


_ENV = None


def _env():
    global _ENV
    if _ENV is None:
        _ENV = _sandbox()
    return _ENV


def _check_static(source: str):
    """Parses the template and refuses private attribute or key access."""
    from jinja2 import TemplateSyntaxError

    env, nodes, _ = _env()
    try:
        tree = env.parse(source)
    except TemplateSyntaxError as e:
        raise TemplateError(f"the chat template is not valid Jinja: {e.message} (line {e.lineno})") from None

    def private(name: Any) -> bool:
        return isinstance(name, str) and name.startswith("_")

    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter)):
        name = None
        if isinstance(node, nodes.Getattr):
            name = node.attr
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            name = node.arg.value
        elif isinstance(node, nodes.Filter) and node.name == "attr" and node.args \
                and isinstance(node.args[0], nodes.Const):
            name = node.args[0].value
        if private(name):
            raise TemplateError(f"the chat template tries to reach Python internals ({name!r}, line "
                                f"{node.lineno}); refusing to run it")
    try:
        return env.from_string(source)
    except TemplateSyntaxError as e:
        raise TemplateError(f"the chat template is not valid Jinja: {e.message} (line {e.lineno})") from None


class ChatTemplate:
    """Renders a conversation into prompt text.

    Build one with `ChatTemplate.from_source(jinja_text, ...)`,
    `ChatTemplate.builtin("chatml" | "gemma" | "vicuna")`, or
    `ChatTemplate.for_model(metadata, tokenizer)` (the file's template or the
    fallback). `name` is "file", "custom", "chatml", "gemma" or "vicuna"; `note` says
    why a fallback was chosen (None for a file's own template).
    """

    def __init__(self, name: str, *, source: Optional[str] = None, bos_token: str = "", eos_token: str = "",
                 end_of_turn: Sequence[str] = (), note: Optional[str] = None,
                 extra_tokens: Optional[Mapping[str, str]] = None):
        self.name, self.source, self.note = name, source, note
        self.bos_token, self.eos_token = bos_token, eos_token
        self.extra_tokens = dict(extra_tokens or {})
        self._compiled = None
        if name in _BUILTIN_RENDER:
            self._builtin, eot = _BUILTIN_RENDER[name]
            end_of_turn = tuple(end_of_turn) or eot
        else:
            if source is None:
                raise TemplateError(f"unknown chat template {name!r}; built in: {', '.join(BUILTIN)}")
            self._builtin = None
            self._compiled = _check_static(source)
            if not end_of_turn:
                end_of_turn = tuple(t for t in END_OF_TURN_TEXTS if t in source)
        self.end_of_turn: tuple[str, ...] = tuple(end_of_turn)
        # the Hugging Face switch of reasoning templates (Qwen 3, Gemma 4, SmolLM3, ...)
        self.has_thinking_switch = source is not None and THINKING_SWITCH in source

    @classmethod
    def from_source(cls, source: str, bos_token: str = "", eos_token: str = "", name: str = "custom",
                    **kw) -> "ChatTemplate":
        """A Jinja template; raises TemplateError if it is invalid or unsafe."""
        if not isinstance(source, str):
            raise TemplateError("a chat template must be text")
        return cls(name, source=source, bos_token=bos_token, eos_token=eos_token, **kw)

    @classmethod
    def builtin(cls, name: str, bos_token: str = "", eos_token: str = "", note: Optional[str] = None) -> "ChatTemplate":
        if name not in _BUILTIN_RENDER:
            raise TemplateError(f"unknown chat template {name!r}; built in: {', '.join(BUILTIN)}")
        return cls(name, bos_token=bos_token, eos_token=eos_token, note=note)

    @classmethod
    def for_model(cls, metadata: Mapping[str, Any], tokenizer: Any = None) -> "ChatTemplate":
        """The template in a GGUF file's metadata, or the fallback for its
        architecture (see the module's docstring)."""
        bos = eos = ""
        extra = {}
        if tokenizer is not None:
            for slot, value in tokenizer.special_ids.items():
                if value is not None:
                    extra[f"{slot}_token"] = tokenizer.token_text(value)
            bos, eos = extra.get("bos_token", ""), extra.get("eos_token", "")
        source = metadata.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls.from_source(source, bos, eos, name="file", extra_tokens=extra)
        arch = str(metadata.get("general.architecture") or "")
        if arch in GEMMA_ARCHS:
            return cls.builtin("gemma", bos, eos,
                               note=f"the model file has no chat template; using Gemma's turn format "
                                    f"(the {arch} architecture's own)")
        return cls.builtin("chatml", bos, eos,
                           note=f"the model file has no chat template and pyllm knows no format for the "
                                f"{arch or 'unknown'} architecture; using ChatML, which this model may not "
                                f"have been trained on")

    @property
    def is_fallback(self) -> bool:
        return self.name in _BUILTIN_RENDER and self.note is not None

    def render(self, messages: Any, add_generation_prompt: bool = True, **variables: Any) -> str:
        """The prompt text for `messages` (OpenAI-style dicts). Extra keyword
        variables (plain data, e.g. tools=...) are passed to Jinja templates."""
        msgs = normalize_messages(messages)
        if self._builtin is not None:
            return self._builtin(msgs, add_generation_prompt)
        try:
            variables = json.loads(json.dumps(variables))
        except (TypeError, ValueError):
            raise InvalidArgumentError("template variables must be plain JSON data") from None
        context = {**self.extra_tokens, **variables, "messages": msgs,
                   "add_generation_prompt": bool(add_generation_prompt),
                   "bos_token": self.bos_token, "eos_token": self.eos_token}
        _, _, SecurityError = _env()
        from jinja2 import TemplateError as JinjaError
        out, size = [], 0
        try:
            for piece in self._compiled.generate(context):
                size += len(piece)
                if size > MAX_RENDERED_CHARS:
                    raise TemplateError(f"the chat template rendered more than {MAX_RENDERED_CHARS} characters; "
                                        f"refusing it")
                out.append(piece)
        except _TemplateRaised as e:
            raise TemplateError(f"the chat template refused the conversation: {e}") from None
        except SecurityError as e:
            raise TemplateError(f"the chat template tried something unsafe ({e}); refusing to run it") from None
        except TemplateError:
            raise
        except (JinjaError, TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError,
                OverflowError, RecursionError) as e:
            raise TemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None
        return "".join(out)

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r}, end_of_turn={self.end_of_turn!r})"
