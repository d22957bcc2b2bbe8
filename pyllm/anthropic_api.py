"""Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens), as llama-server,
ollama and vLLM serve it, so Anthropic's clients (its SDKs, Claude Code) can talk to a local model.

A request becomes Model.chat's arguments: the system prompt a first system message; text blocks
a message's content; an assistant's tool_use blocks its OpenAI-style tool_calls and a user's
tool_result blocks "tool" messages before the user's text; thinking blocks reasoning_content;
tools and tool_choice OpenAI's; output_config's format (structured outputs) the reply's JSON
schema and its effort the template's reasoning_effort; a last assistant message the start of the
reply (Anthropic's prefill). The reply becomes a message object, content blocks of thinking, text and tool_use, or
its stream of named events (message_start, content_block_start/delta/stop, message_delta,
message_stop). Images and documents are refused: pyllm serves text models.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from .errors import InvalidArgumentError

# Model.chat's finish reasons -> Anthropic's stop_reason (a tool call: "tool_use", a stop
# sequence: "stop_sequence", both decided apart)
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "context": "model_context_window_exceeded",
                "interrupted": "end_turn"}

# the server's error kinds (OpenAI's types) -> Anthropic's error types
ERROR_TYPES = {"invalid_request_error": "invalid_request_error", "authentication_error": "authentication_error",
               "permission_error": "permission_error",
               "not_found_error": "not_found_error", "not_supported_error": "invalid_request_error",
               "unavailable_error": "overloaded_error", "server_error": "api_error"}

SAMPLING_FIELDS = ("temperature", "top_p", "top_k")


@dataclass
class MessagesRequest:
    """A Messages API request as Model.chat's arguments."""
    messages: list[dict]                       # OpenAI-style, the system prompt first
    max_tokens: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    sampling: dict = field(default_factory=dict)
    tools: Optional[list[dict]] = None         # OpenAI-style function tools
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    think: Optional[bool] = None
    format: Any = None                         # a JSON schema the reply keeps to (structured outputs)
    template_kwargs: dict = field(default_factory=dict)
    stream: bool = False


def request_of(body: dict, counting: bool = False) -> MessagesRequest:
    """The checked request (counting: a count_tokens body, which has no max_tokens)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {role, content} objects")
    out = [{"role": "system", "content": system}] if (system := system_text(body.get("system"))) else []
    for i, m in enumerate(messages):
        out += chat_messages(m, i)
    req = MessagesRequest(out, think=thinking_switch(body.get("thinking")))
    config = body.get("output_config") or {}
    if not isinstance(config, dict):
        raise InvalidArgumentError("output_config must be an object")
    req.format = output_schema(config.get("format", body.get("output_format")))   # output_format: the beta's name
    effort = config.get("effort")
    if effort is not None:
        if effort not in ("low", "medium", "high", "xhigh", "max"):
            raise InvalidArgumentError(f"output_config.effort must be low, medium, high, xhigh or max, not {effort!r}")
        req.template_kwargs["reasoning_effort"] = effort if effort in ("low", "medium") else "high"
    if body.get("tools"):
        req.tools = [openai_tool(t, i) for i, t in enumerate(_list(body["tools"], "tools"))]
        req.tool_choice, req.parallel_tool_calls = openai_tool_choice(body.get("tool_choice"))
    elif body.get("tool_choice") not in (None, {"type": "none"}, {"type": "auto"}):
        raise InvalidArgumentError("tool_choice needs tools")
    if counting:
        return req
    n = body.get("max_tokens")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidArgumentError(f"max_tokens must be a positive integer, not {n!r}")
    req.max_tokens = n
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidArgumentError("stop_sequences must be a list of non-empty strings")
    req.stop = stops
    for name in SAMPLING_FIELDS:
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidArgumentError(f"{name} must be a number, not {value!r}")
            req.sampling[name] = value
    req.stream = bool(body.get("stream"))
    return req


def _list(value: Any, name: str) -> list:
    if not isinstance(value, list):
        raise InvalidArgumentError(f"{name} must be a list")
    return value


def system_text(system: Any) -> str:
    """The system prompt: text, or a list of text blocks (their cache_control is a no-op here)."""
    if system is None or isinstance(system, str):
        return system or ""
    return block_text(_list(system, "system"), "system")


def block_text(blocks: Any, where: str) -> str:
    """The text of content that is text or a list of text blocks, joined."""
    if isinstance(blocks, str):
        return blocks
    texts = []
    for block in _list(blocks, f"{where}'s content"):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in ("image", "document"):
            raise InvalidArgumentError(f"{where} holds an {kind}: pyllm serves text models, send text only")
        else:
            raise InvalidArgumentError(f"{where} holds a content block of type {kind!r} where text was expected")
    return "".join(texts)


def chat_messages(m: Any, i: int) -> list[dict]:
    """One Anthropic message as OpenAI-style messages: a user's tool results each a "tool"
    message (before the user's text, if any); an assistant's tool uses its tool_calls."""
    where = f"message {i}"
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise InvalidArgumentError(f"{where} must be an object with role user or assistant and a content")
    role, content = m["role"], m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    out, texts, calls, thinking, parts = [], [], [], [], []
    for block in _list(content, f"{where}'s content"):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append({"type": "image", "image": image_data(block.get("source"), where)})
        elif kind == "tool_result" and role == "user":
            result = block_text(block.get("content") or "", f"{where}'s tool_result")
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": f"Error: {result}" if block.get("is_error") else result})
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise InvalidArgumentError(f"{where}'s tool_use needs a name and an input object")
            calls.append({"id": str(block.get("id", "")), "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
        elif kind == "thinking" and role == "assistant":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking" and role == "assistant":
            continue   # encrypted by Anthropic: nothing a local model can read
        elif kind in ("image", "document"):
            raise InvalidArgumentError(f"{where} holds an {kind}: pyllm serves text models, send text only")
        else:
            raise InvalidArgumentError(f"{where} holds a content block of type {kind!r}, which a {role} "
                                       f"message cannot have here")
    if role == "assistant":
        message = {"role": "assistant", "content": "".join(texts)}
        if calls:
            message["tool_calls"] = calls
        if thinking:
            message["reasoning_content"] = "".join(thinking)
        return [message]
    content = parts if len(parts) > len(texts) else "".join(texts)   # images among the text: the parts
    return out + ([{"role": "user", "content": content}] if parts or not out else [])


def image_data(source: Any, where: str) -> str:
    """An image block's picture as a data: URL (Anthropic's base64 source)."""
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    kind = source.get("type") if isinstance(source, dict) else None
    raise InvalidArgumentError(f"{where}'s image has a source of type {kind!r}: give it as base64 "
                               f"(pyllm fetches nothing from the web)")


def openai_tool(tool: Any, i: int) -> dict:
    """An Anthropic tool ({name, description, input_schema}) as OpenAI's function tool."""
    if not isinstance(tool, dict):
        raise InvalidArgumentError(f"tool {i} must be an object with a name and an input_schema")
    if tool.get("type", "custom") != "custom":   # web_search_..., bash_..., text_editor_...: Anthropic runs those
        raise InvalidArgumentError(f"tool {i} is Anthropic's server tool {tool['type']!r}, which only Anthropic "
                                   f"runs: give it as a custom tool with an input_schema")
    schema = tool.get("input_schema", {"type": "object", "properties": {}})
    if not isinstance(schema, dict):
        raise InvalidArgumentError(f"tool {i}'s input_schema must be a JSON schema (an object)")
    return {"type": "function", "function": {"name": tool.get("name"), "description": tool.get("description", ""),
                                             "parameters": schema}}


def openai_tool_choice(choice: Any) -> tuple[Any, bool]:
    """(Model.chat's tool_choice, parallel_tool_calls) of Anthropic's tool_choice."""
    if choice is None:
        return "auto", True
    kind = choice.get("type") if isinstance(choice, dict) else None
    parallel = not choice.get("disable_parallel_tool_use", False) if isinstance(choice, dict) else True
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise InvalidArgumentError('tool_choice must be {"type": "auto" | "any" | "none"} or {"type": "tool", '
                               '"name": ...}')


def output_schema(fmt: Any) -> Any:
    """The JSON schema of structured outputs' {"type": "json_schema", "schema": {...}}, or None."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise InvalidArgumentError('output_config.format must be {"type": "json_schema", "schema": {...}}')
    return fmt["schema"]


def thinking_switch(thinking: Any) -> Optional[bool]:
    """The reply's enable_thinking from {"type": "enabled", "budget_tokens": N} (the budget is
    not held to: the model thinks as long as it does) or {"type": "disabled"}; None: the model's."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise InvalidArgumentError('thinking must be {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}')
    return kind != "disabled"


# -- the reply ------------------------------------------------------------------------------------

def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def tool_use_id(call) -> str:
    return "toolu_" + call.id.removeprefix("call_")


def stop_of(c, stop: list[str]) -> tuple[str, Optional[str]]:
    """(stop_reason, stop_sequence) of a finished reply: stop: the request's stop sequences."""
    if c.tool_calls:
        return "tool_use", None
    if c.finish_reason == "stop" and c.stop_string and c.stop_string in stop:
        return "stop_sequence", c.stop_string
    return STOP_REASONS.get(c.finish_reason, "end_turn"), None


def usage_of(c) -> dict:
    """Token counts: the prompt's split into what was computed and what the KV cache held."""
    m = c.metrics
    return {"input_tokens": m.prompt_tokens - m.reused_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": m.reused_tokens, "output_tokens": m.generated_tokens}


def tool_use_block(call) -> dict:
    return {"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": call.arguments}


def message(model: str, thinking: str, answer: str, c, stop: list[str]) -> dict:
    """The message object of a finished reply."""
    content = ([{"type": "thinking", "thinking": thinking, "signature": ""}] if thinking else []) + \
              ([{"type": "text", "text": answer}] if answer or not c.tool_calls else []) + \
              [tool_use_block(call) for call in c.tool_calls]
    reason, sequence = stop_of(c, stop)
    return {"id": message_id(), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_of(c)}


def stream_events(model: str, parts: Iterator[tuple[str, str]], completion, n_prompt: int,
                  stop: list[str]) -> Iterator[dict]:
    """The events of a streamed reply, each {"type": its event name, ...}: parts: its ("thinking" |
    "answer", text) as they come; completion(): the finished reply (its tool calls, stop, usage);
    n_prompt: the prompt's tokens, for message_start."""
    yield {"type": "message_start", "message": {
        "id": message_id(), "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": n_prompt, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": 0}}}
    index, open_kind = -1, None
    for kind, text in parts:
        if not text:
            continue
        if kind != open_kind:
            if open_kind is not None:
                yield from block_end(index, open_kind)
            index, open_kind = index + 1, kind
            yield {"type": "content_block_start", "index": index, "content_block":
                   {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                   else {"type": "text", "text": ""}}
        yield {"type": "content_block_delta", "index": index, "delta":
               {"type": "thinking_delta", "thinking": text} if kind == "thinking"
               else {"type": "text_delta", "text": text}}
    if open_kind is not None:
        yield from block_end(index, open_kind)
    c = completion()
    for call in c.tool_calls:
        index += 1
        yield {"type": "content_block_start", "index": index, "content_block": {**tool_use_block(call), "input": {}}}
        yield {"type": "content_block_delta", "index": index, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(call.arguments, ensure_ascii=False)}}
        yield {"type": "content_block_stop", "index": index}
    reason, sequence = stop_of(c, stop)
    yield {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
           "usage": usage_of(c)}
    yield {"type": "message_stop"}


def block_end(index: int, kind: str) -> Iterator[dict]:
    if kind == "thinking":   # Anthropic signs its thinking; a local model's has no signature
        yield {"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": ""}}
    yield {"type": "content_block_stop", "index": index}


def error_body(kind: str, message: str) -> dict:
    """Anthropic's error object for the server's error kind."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(kind, "api_error"), "message": message}}
