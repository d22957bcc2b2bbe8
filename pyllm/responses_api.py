"""OpenAI's Responses API (POST /v1/responses; GET and DELETE /v1/responses/ID), as ollama,
vLLM and LM Studio serve it, for OpenAI's newer clients (client.responses.create, agents SDKs).

A request becomes Model.chat's arguments: `instructions` a first system message; `input` (a
text, or items) the messages: message items (input_text / output_text parts; the developer
role a system message), function_call items an assistant's tool_calls, function_call_output
items "tool" messages, reasoning items the next assistant message's reasoning_content;
function tools (flat: name, parameters) OpenAI's chat tools; text.format the reply's JSON
format; reasoning.effort the template's reasoning_effort ("none": thinking off). The reply
becomes output items (reasoning, message with output_text, function_call), or their stream of
events, each with its sequence_number.

Responses are kept in memory (the last STORED, unless "store": false), so a request may go on
from one with previous_response_id: its conversation (input and output, not its instructions)
comes before the new input, as OpenAI's does.
"""
from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from .errors import InvalidArgumentError

NOT_TEXT = {"input_image": "an image", "input_file": "a file", "input_audio": "audio"}
STORED = 256   # responses kept for previous_response_id and GET, the oldest dropped first


@dataclass
class ResponsesRequest:
    """A Responses request as Model.chat's arguments, and what its response echoes."""
    messages: list[dict]                       # this request's input as OpenAI-style messages
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    max_tokens: Optional[int] = None
    sampling: dict = field(default_factory=dict)
    tools: Optional[list[dict]] = None         # OpenAI's chat tools
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    format: Any = None                         # None, "json" or a JSON schema
    think: Optional[bool] = None
    template_kwargs: dict = field(default_factory=dict)
    stream: bool = False
    store: bool = True
    echo: dict = field(default_factory=dict)   # the request's settings, as the response repeats them


def request_of(body: dict) -> ResponsesRequest:
    """The checked request."""
    req = ResponsesRequest(input_messages(body.get("input")))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidArgumentError("instructions must be text")
    req.instructions = instructions or None
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidArgumentError("previous_response_id must be a response's id")
    req.previous_response_id = previous
    n = body.get("max_output_tokens")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidArgumentError(f"max_output_tokens must be a positive integer, not {n!r}")
    req.max_tokens = n
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                 "repeat_penalty"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidArgumentError(f"{name} must be a number, not {value!r}")
            req.sampling[name] = value
    if body.get("tools"):
        req.tools = [chat_tool(t, i) for i, t in enumerate(_list(body["tools"], "tools"))]
    req.tool_choice = tool_choice_of(body.get("tool_choice", "auto"), req.tools is not None)
    req.parallel_tool_calls = bool(body.get("parallel_tool_calls", True))
    req.format = format_of(body.get("text"))
    req.think, req.template_kwargs = reasoning_of(body.get("reasoning"))
    req.stream, req.store = bool(body.get("stream")), body.get("store", True) is not False
    req.echo = {"instructions": req.instructions, "max_output_tokens": n, "metadata": body.get("metadata") or {},
                "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": previous,
                "reasoning": body.get("reasoning"), "store": req.store,
                "temperature": body.get("temperature", 1.0), "text": body.get("text") or {"format": {"type": "text"}},
                "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
                "top_p": body.get("top_p", 1.0), "truncation": "disabled", "user": body.get("user")}
    return req


def _list(value: Any, name: str) -> list:
    if not isinstance(value, list):
        raise InvalidArgumentError(f"{name} must be a list")
    return value


def input_messages(value: Any) -> list[dict]:
    """The input (a text, or a list of items) as OpenAI-style chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidArgumentError("input must be a text or a non-empty list of items")
    out: list[dict] = []
    reasoning: list[str] = []   # a reasoning item's text, for the assistant message after it

    def assistant() -> dict:
        """The assistant message the next output item belongs to (one per turn)."""
        if not out or out[-1]["role"] != "assistant" or out[-1].get("_closed"):
            out.append({"role": "assistant", "content": ""})
        if reasoning:
            out[-1]["reasoning_content"] = out[-1].get("reasoning_content", "") + "".join(reasoning)
            reasoning.clear()
        return out[-1]
    for i, item in enumerate(value):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        where = f"input item {i}"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidArgumentError(f"{where} needs a role: user, assistant, system or developer")
            text = content_text(item.get("content"), where, images=role == "user")
            if role == "assistant":
                m = assistant()
                if m.get("tool_calls"):   # text after a call starts the next turn
                    m["_closed"] = True
                    m = assistant()
                m["content"] += text
            else:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments", "{}"), str):
                raise InvalidArgumentError(f"{where}: a function_call needs a name and its arguments as JSON text")
            assistant().setdefault("tool_calls", []).append({
                "id": str(item.get("call_id", "")), "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments", "{}")}})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": output if isinstance(output, str) else content_text(output, where)})
        elif kind == "reasoning":
            reasoning += [str(p.get("text", "")) for p in item.get("content") or item.get("summary") or []
                          if isinstance(p, dict)]
        else:
            raise InvalidArgumentError(f"{where} is of type {kind!r}: pyllm takes message, function_call, "
                                       f"function_call_output and reasoning items")
    if not out:
        raise InvalidArgumentError("input holds no message: give a text or message items")
    for m in out:
        m.pop("_closed", None)
    return out


def content_text(content: Any, where: str, images: bool = False) -> Any:
    """A message's content: text, or its text parts (input_text, output_text) joined; images
    True (a user's message): with input_images (data: URLs) among them, the parts as chat's
    text and image_url parts."""
    if isinstance(content, str):
        return content
    texts, parts = [], []
    for part in _list(content, f"{where}'s content"):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and images:
            url = part.get("image_url")
            if not isinstance(url, str):
                raise InvalidArgumentError(f"{where}'s input_image needs an image_url (a data: URL); file_id is "
                                           f"not supported")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind in NOT_TEXT:
            raise InvalidArgumentError(f"{where} holds {NOT_TEXT[kind]}: pyllm serves text models, send text only")
        else:
            raise InvalidArgumentError(f"{where} holds a content part of type {kind!r} where text was expected")
    return parts if len(parts) > len(texts) else "".join(texts)


def chat_tool(tool: Any, i: int) -> dict:
    """A Responses function tool ({type, name, description, parameters}) as a chat tool."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise InvalidArgumentError(f"tool {i} is of type {kind!r}: pyllm runs function tools only "
                                   f'({{"type": "function", "name": ..., "parameters": {{...}}}})')
    return {"type": "function", "function": {"name": tool.get("name"), "description": tool.get("description") or "",
                                             "parameters": tool.get("parameters") or {"type": "object",
                                                                                       "properties": {}}}}


def tool_choice_of(choice: Any, has_tools: bool) -> Any:
    """Model.chat's tool_choice: "auto", "none", "required" or {"type": "function", "name"}."""
    if choice in ("auto", "none", "required"):
        if choice == "required" and not has_tools:
            raise InvalidArgumentError("tool_choice required needs tools")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidArgumentError('tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}')


def format_of(text: Any) -> Any:
    """The reply's format from text.format: text (free), json_object, json_schema (its schema)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema" and isinstance(fmt.get("schema"), (dict, bool)):
        return fmt["schema"]
    raise InvalidArgumentError('text.format must be {"type": "text"}, {"type": "json_object"} or '
                               '{"type": "json_schema", "name": ..., "schema": {...}}')


def reasoning_of(reasoning: Any) -> tuple[Optional[bool], dict]:
    """(enable_thinking, template variables) of {"effort": ...}: "none" turns thinking off;
    another effort is the template's reasoning_effort (gpt-oss's)."""
    if reasoning is None:
        return None, {}
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if effort is None:
        return None, {}
    if effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
        raise InvalidArgumentError(f"reasoning.effort must be none, minimal, low, medium or high, not {effort!r}")
    return (False, {}) if effort == "none" else (None, {"reasoning_effort": effort})


# -- the reply ------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def reasoning_item(item_id: str, text: str) -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": "completed"}


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(call, status: str = "completed") -> dict:
    return {"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call", "status": status,
            "call_id": call.id, "name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}


def output_items(thinking: str, answer: str, calls: list) -> list[dict]:
    """A finished reply's output items: its reasoning, its message, its calls."""
    return ([reasoning_item(new_id("rs"), thinking)] if thinking else []) + \
           ([message_item(new_id("msg"), answer)] if answer or not calls else []) + [call_item(c) for c in calls]


def usage_of(c, reasoning_tokens: int = 0) -> dict:
    m = c.metrics
    return {"input_tokens": m.prompt_tokens, "input_tokens_details": {"cached_tokens": m.reused_tokens},
            "output_tokens": m.generated_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": m.prompt_tokens + m.generated_tokens}


def response_object(response_id: str, created_at: int, model: str, req: ResponsesRequest, output: list[dict],
                    c=None, reasoning_tokens: int = 0) -> dict:
    """The response: in progress (c None) or finished (c: its completion); incomplete where the
    reply ran out of tokens."""
    status, incomplete = "in_progress", None
    if c is not None:
        cut = c.finish_reason in ("length", "context") and not c.tool_calls
        status = "incomplete" if cut else "completed"
        incomplete = {"reason": "max_output_tokens"} if cut else None
    return {"id": response_id, "object": "response", "created_at": created_at, "status": status,
            "completed_at": int(time.time()) if c is not None else None, "error": None,
            "incomplete_details": incomplete, "model": model, "output": output, **req.echo,
            "usage": usage_of(c, reasoning_tokens) if c is not None else None}


def history(messages: list[dict], thinking: str, answer: str, calls: list) -> list[dict]:
    """The conversation after a reply: its messages and the assistant's turn (a stored
    response's, for previous_response_id)."""
    turn = {"role": "assistant", "content": answer}
    if calls:
        turn["tool_calls"] = [c.openai() for c in calls]
    if thinking:
        turn["reasoning_content"] = thinking
    return messages + [turn]


class ResponseStream:
    """The events of a streamed response, numbered: response.created, then per output item
    output_item.added, its content's deltas and dones, output_item.done; then response.completed
    (or .incomplete). error() makes the error event for a failure midway."""

    def __init__(self, head: dict):
        self.head = head   # the response in progress (response_object with c None)
        self._numbers = itertools.count()
        self.output: list[dict] = []

    def _event(self, kind: str, **fields: Any) -> dict:
        return {"type": kind, "sequence_number": next(self._numbers), **fields}

    def events(self, parts: Iterator[tuple[str, str]], finish) -> Iterator[dict]:
        """parts: the reply's ("thinking" | "answer", text) as they come; finish(output): the
        finished response object (with these output items)."""
        yield self._event("response.created", response=self.head)
        yield self._event("response.in_progress", response=self.head)
        kind_open, item, text = None, None, ""
        for kind, piece in parts:
            if not piece:
                continue
            if kind != kind_open:
                if item is not None:
                    yield from self._close(item, text)
                kind_open, text = kind, ""
                item = reasoning_item(new_id("rs"), "") if kind == "thinking" else message_item(new_id("msg"), "",
                                                                                                "in_progress")
                yield from self._open(item)
            text += piece
            index = len(self.output)
            if item["type"] == "reasoning":
                yield self._event("response.reasoning_text.delta", item_id=item["id"], output_index=index,
                                  content_index=0, delta=piece)
            else:
                yield self._event("response.output_text.delta", item_id=item["id"], output_index=index,
                                  content_index=0, delta=piece, logprobs=[])
        if item is not None:
            yield from self._close(item, text)
        response = finish(self.output)   # the calls are known now
        for call in response["output"][len(self.output):]:
            index = len(self.output)
            yield self._event("response.output_item.added", output_index=index,
                              item={**call, "arguments": "", "status": "in_progress"})
            yield self._event("response.function_call_arguments.delta", item_id=call["id"], output_index=index,
                              delta=call["arguments"])
            yield self._event("response.function_call_arguments.done", item_id=call["id"], output_index=index,
                              arguments=call["arguments"])
            yield self._event("response.output_item.done", output_index=index, item=call)
            self.output.append(call)
        yield self._event("response.completed" if response["status"] == "completed" else "response.incomplete",
                          response=response)

    def _open(self, item: dict) -> Iterator[dict]:
        index = len(self.output)
        yield self._event("response.output_item.added", output_index=index, item={**item, "content": []})
        part = {**item["content"][0], "text": ""}
        yield self._event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                          part=part)

    def _close(self, item: dict, text: str) -> Iterator[dict]:
        index = len(self.output)
        done = reasoning_item(item["id"], text) if item["type"] == "reasoning" else message_item(item["id"], text)
        if item["type"] == "reasoning":
            yield self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=text)
        else:
            yield self._event("response.output_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=text, logprobs=[])
        yield self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                          part=done["content"][0])
        yield self._event("response.output_item.done", output_index=index, item=done)
        self.output.append(done)

    def error(self, kind: str, message: str) -> dict:
        return self._event("error", code=kind, message=message, param=None)


class ResponseStore:
    """The last STORED responses and their conversations, by id (thread-safe)."""

    def __init__(self, size: int = STORED):
        self.size = size
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, response: dict, conversation: list[dict]) -> None:
        with self._lock:
            self._kept[response["id"]] = (response, conversation)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)

    def get(self, response_id: str) -> Optional[tuple[dict, list[dict]]]:
        with self._lock:
            return self._kept.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._kept.pop(response_id, None) is not None
