"""Tool (function) calling: the tools go into the prompt, the calls come out of the reply.

Tools are OpenAI's (and ollama's) `[{"type": "function", "function": {"name",
"description", "parameters": JSON schema}}]`. How a model writes a call depends
on its training; the chat template says which format it knows (as llama.cpp's
common/chat.cpp reads it):

- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one
  block per call (Qwen 2.5 and 3, SmolLM3, Hermes, ...);
- llama3: the reply is `{"name": ..., "parameters": {...}}` (Llama 3.1-3.3);
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`;
- generic, for templates that know no tools (SmolLM2, Gemma 3): pyllm
  describes the tools in a system message and the reply is one JSON object,
  `{"tool_calls": [{"name", "arguments"}, ...]}` or `{"response": "..."}`,
  held to that by a grammar built from the tools' schemas (llama.cpp's generic
  format works the same way).

tool_choice: "auto" (the model decides), "none" (no tools), "required" (a call
must come), or {"type": "function", "function": {"name": N}} (a call of N).
Where a call must come, the reply is held to the format by a grammar; under
"auto" the generic format's reply is too (it is always one JSON object), and
the native formats' calls are from where they start (lazy grammars, as
llama.cpp's): a Hermes call from its `<tool_call>`, a Mistral call from its
`[TOOL_CALLS]`, a Llama 3 reply that begins with `{"` or `<|python_tag|>`.
parallel_tool_calls (off by default, as in llama-server) lets the generic
format's reply hold several calls; small models otherwise repeat a call.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import InvalidArgumentError
from .engine import split_stop
from .grammar import Trigger

FORMATS = ("hermes", "llama3", "mistral", "generic")


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(8))

    def openai(self) -> dict:
        """As OpenAI's API sends it: arguments as JSON text."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


# --- checking the request ---------------------------------------------------------------

def check_tools(tools: Any) -> list[dict]:
    """OpenAI-style tools, checked: [{"type": "function", "function": {"name", "description"?,
    "parameters"?}}] (a bare {"name", ...} is taken as the function)."""
    if not isinstance(tools, list):
        raise InvalidArgumentError("tools must be a list of {'type': 'function', 'function': {...}} objects")
    out, names = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or (isinstance(tool, dict) and tool.get("type", "function") != "function"):
            raise InvalidArgumentError(f"tool {i} must be {{'type': 'function', 'function': {{'name': ...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", name):
            raise InvalidArgumentError(f"tool {i} needs a name of letters, digits, '_', '.', ':' or '-'")
        if name in names:
            raise InvalidArgumentError(f"two tools are named {name!r}")
        names.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise InvalidArgumentError(f"tool {name!r}: parameters must be a JSON schema (an object)")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    return out


def chosen_tools(tools: list[dict], tool_choice: Any) -> tuple[list[dict], bool]:
    """The tools the reply may call and whether it must call one."""
    if tool_choice in (None, "auto"):
        return tools, False
    if tool_choice == "none":
        return [], False
    if tool_choice == "required":
        return tools, True
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise InvalidArgumentError(f"tool_choice names {name!r}, which is not among the tools")
        return chosen, True
    raise InvalidArgumentError('tool_choice must be "auto", "none", "required" or '
                               '{"type": "function", "function": {"name": ...}}')


def detect_format(template_source: Optional[str]) -> str:
    """The call format a chat template knows, from its text."""
    src = template_source or ""
    if "tools" not in src:
        return "generic"
    if "<tool_call>" in src:
        return "hermes"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|python_tag|>" in src or "ipython" in src:
        return "llama3"
    return "generic"


# --- the prompt ------------------------------------------------------------------------

def _arguments(value: Any) -> Any:
    """A call's arguments as templates want them: an object (OpenAI sends JSON text)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _calls_of(message: dict) -> list[dict]:
    """An assistant message's tool calls as [{"name", "arguments"}]."""
    out = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        out.append({"name": fn.get("name"), "arguments": _arguments(fn.get("arguments", {}))})
    return out


def native_messages(messages: list[dict]) -> list[dict]:
    """Messages for a template that knows tools: call arguments as objects."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "function": {**c.get("function", {}), "arguments": _arguments(c.get("function", {}).get(
                "arguments", {}))}} if isinstance(c, dict) and "function" in c else c for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


GENERIC_PROMPT = (
    "You can call these tools (the parameters are JSON schemas of their arguments):\n{tools}\n\n"
    "Reply with one JSON object: {{\"tool_calls\": [{{\"name\": \"<tool name>\", \"arguments\": "
    "{{<its arguments>}}}}]}} to call tools, or {{\"response\": \"<your answer>\"}} to answer directly.")
GENERIC_PROMPT_REQUIRED = (
    "You can call these tools (the parameters are JSON schemas of their arguments):\n{tools}\n\n"
    "Reply with one JSON object that calls tools: {{\"tool_calls\": [{{\"name\": \"<tool name>\", "
    "\"arguments\": {{<its arguments>}}}}]}}.")


def generic_messages(messages: list[dict], tools: list[dict], required: bool) -> list[dict]:
    """Messages for a template that knows no tools: the tools described in the system
    message, earlier calls as the JSON the model writes, tool results as user turns."""
    described = json.dumps([t["function"] for t in tools], indent=2, ensure_ascii=False)
    note = (GENERIC_PROMPT_REQUIRED if required else GENERIC_PROMPT).format(tools=described)
    out: list[dict] = []
    names: dict[str, str] = {}          # tool call id -> the tool's name
    results: list[dict] = []
    results_turn: Optional[dict] = None  # the user turn that carries consecutive tool results
    for m in messages:
        role = m["role"]
        if role == "tool":
            result = {"name": m.get("name") or names.get(m.get("tool_call_id"), ""), "content": m["content"]}
            if not (out and out[-1] is results_turn):
                results, results_turn = [], {"role": "user"}
                out.append(results_turn)
            results.append(result)
            results_turn["content"] = json.dumps({"tool_results": results}, ensure_ascii=False)
        elif role == "assistant" and m.get("tool_calls"):
            calls = _calls_of(m)
            for raw, call in zip(m["tool_calls"], calls):
                if isinstance(raw, dict) and raw.get("id"):
                    names[raw["id"]] = call["name"]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
        elif role == "assistant" and tools:
            out.append({"role": "assistant", "content": json.dumps({"response": m["content"]}, ensure_ascii=False)})
        else:
            out.append(dict(m))
    if tools:
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + note}
        else:
            out.insert(0, {"role": "system", "content": note})
    return out


# --- the constraint ---------------------------------------------------------------------

def _call_schema(tools: list[dict], arguments_key: str = "arguments") -> dict:
    one = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                             arguments_key: t["function"]["parameters"]},
            "required": ["name", arguments_key]} for t in tools]
    return one[0] if len(one) == 1 else {"anyOf": one}


def generic_schema(tools: list[dict], required: bool, parallel: bool = False) -> dict:
    calls = {"type": "object", "properties": {"tool_calls": {"type": "array", "minItems": 1,
                                                             **({} if parallel else {"maxItems": 1}),
                                                             "items": _call_schema(tools)}},
             "required": ["tool_calls"]}
    if required:
        return calls
    return {"anyOf": [calls, {"type": "object", "properties": {"response": {"type": "string"}},
                              "required": ["response"]}]}


def constraint_kwargs(fmt: str, tools: list[dict], required: bool, parallel: bool = False) -> dict:
    """format= / grammar= that hold the reply to the format (empty: none)."""
    from .json_schema import schema_to_gbnf
    if not tools:
        return {}
    if fmt == "generic":
        return {"format": generic_schema(tools, required, parallel)}
    if fmt == "hermes":   # under auto, from the first <tool_call> on
        block = '"<tool_call>" tc-ws call tc-ws "</tool_call>"'
        root = f"root ::= {block} ( tc-ws {block} )*" if parallel else f"root ::= {block}"
        trigger = Trigger(("<tool_call>",))
    elif fmt == "mistral":   # under auto, from [TOOL_CALLS] on (a special token: its text is its piece)
        calls = 'call ( tc-ws "," tc-ws call )*' if parallel else "call"
        root = f'root ::= "[TOOL_CALLS]" tc-ws "[" tc-ws {calls} tc-ws "]"'
        trigger = Trigger(("[TOOL_CALLS]",))
    else:   # llama3; under auto, a reply that begins as a call is one
        calls = 'call ( tc-ws ";" tc-ws call )*' if parallel else "call"
        root = f'root ::= "<|python_tag|>"? tc-ws {calls}'
        trigger = Trigger(('{"', "<|python_tag|>"), at_start=True)
    arguments = "parameters" if fmt == "llama3" else "arguments"
    grammar = f"{root}\ntc-ws ::= [ \\n]{{0,2}}\n" + schema_to_gbnf(_call_schema(tools, arguments), root="call")
    return {"grammar": grammar} if required else {"grammar": grammar, "trigger": trigger}


# --- the reply --------------------------------------------------------------------------

def _call(obj: Any, arguments_keys=("arguments", "parameters")) -> Optional[ToolCall]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in arguments_keys:
        if key in obj:
            args = _arguments(obj[key])
            return ToolCall(obj["name"], args if isinstance(args, dict) else {"value": args})
    return ToolCall(obj["name"], {})


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def parse_reply(fmt: str, text: str) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of a reply in format `fmt`; text that is not a well-formed
    call stays content."""
    if fmt == "hermes":
        calls, kept, last = [], [], 0
        for m in _HERMES.finditer(text):
            try:
                call = _call(json.loads(m.group(1)))
            except json.JSONDecodeError:
                call = None
            if call is not None:
                calls.append(call)
                kept.append(text[last:m.start()])
                last = m.end()
        kept.append(text[last:])
        return "".join(kept).strip(), calls
    if fmt == "llama3":
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if body.startswith("{"):
            calls = []
            for part in body.split(";"):   # Llama 3.2 separates several calls so
                try:
                    call = _call(json.loads(part))
                except json.JSONDecodeError:
                    call = None
                if call is None:
                    return text, []
                calls.append(call)
            return "", calls
        return text, []
    if fmt == "mistral":
        head, sep, rest = text.partition("[TOOL_CALLS]")
        if sep:
            try:
                items = json.loads(rest.strip())
            except json.JSONDecodeError:
                return text, []
            calls = [_call(c) for c in (items if isinstance(items, list) else [items])]
            if calls and all(calls):
                return head.strip(), calls
        return text, []
    try:   # generic
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text, []
    if isinstance(obj, dict) and isinstance(obj.get("tool_calls"), list):
        calls = [_call(c, ("arguments",)) for c in obj["tool_calls"]]
        if all(calls):
            return "", calls
    if isinstance(obj, dict) and isinstance(obj.get("response"), str):
        return obj["response"], []
    return text, []


# --- streaming --------------------------------------------------------------------------

_GENERIC_ANSWER = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_JSON_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class AnswerStream:
    """The answer of a reply with tools, as it streams: the text a client may see now,
    never a call nor what may still become one. Hermes and Mistral replies stream up to
    the call's opening word (a possible start of it held back); a Llama 3 reply streams
    unless it begins as a call; the generic format's reply is JSON, and the text of its
    "response" streams as its string is decoded. finish() gives what the final parse
    found beyond what was streamed."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.text = ""        # the reply so far
        self.shown = ""       # what push() gave out
        self.held = False     # a call (or what may be one) started: nothing more streams
        self.at = -1          # generic: where the response string's next character is
        self.word = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}.get(fmt, "")

    def push(self, piece: str) -> str:
        self.text += piece
        if self.held:
            return ""
        out = getattr(self, "_" + ("word" if self.word else self.fmt))()
        self.shown += out
        return out

    def _word(self) -> str:
        out, _, hit = split_stop(self.text[len(self.shown):], [self.word])   # held back as a stop string is
        self.held = bool(hit)
        return out

    def _llama3(self) -> str:
        if self.shown:
            return self.text[len(self.shown):]
        head = self.text.lstrip()
        if not head:
            return ""
        if head.startswith("{") or "<|python_tag|>".startswith(head[:14]):
            self.held = True    # a call, or the start of one: the final parse decides
            return ""
        return self.text

    def _generic(self) -> str:
        if self.at < 0:
            m = _GENERIC_ANSWER.match(self.text)
            if m is None:
                compact = re.sub(r"\s", "", self.text)
                if not '{"response":"'.startswith(compact):
                    self.held = True   # calls, not an answer
                return ""
            self.at = m.end()
        out = []
        t, i = self.text, self.at
        while i < len(t):
            c = t[i]
            if c == '"':
                self.held = True       # the string closed
                break
            if c != "\\":
                out.append(c)
                i += 1
                continue
            if i + 1 >= len(t):
                break                  # an escape cut in two: wait for the rest
            e = t[i + 1]
            if e != "u":
                out.append(_JSON_ESCAPES.get(e, e))
                i += 2
                continue
            if i + 6 > len(t):
                break
            cp = _hex4(t[i + 2:i + 6])
            if 0xD800 <= cp < 0xDC00:  # a surrogate pair: wait for its low half
                if i + 12 > len(t):
                    break
                low = _hex4(t[i + 8:i + 12]) if t[i + 6:i + 8] == "\\u" else -1
                if 0xDC00 <= low < 0xE000:
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
                    i += 6
            out.append(chr(cp) if 0 <= cp and not 0xD800 <= cp < 0xE000 else "\ufffd")
            i += 6
        self.at = i
        return "".join(out)

    def _none(self) -> str:
        return self.text[len(self.shown):]

    def finish(self, content: str) -> str:
        """What of the final content (the reply less its calls) is still to be shown."""
        return content[len(self.shown):] if content.startswith(self.shown) else ""


def _hex4(digits: str) -> int:
    try:
        return int(digits, 16) if len(digits) == 4 else -1
    except ValueError:
        return -1


# --- one request ------------------------------------------------------------------------

class ToolUse:
    """Tools for one chat request: the messages and template variables that put them in
    the prompt, the constraint on the reply, and the parse of the reply."""

    def __init__(self, template_source: Optional[str], tools: Any, tool_choice: Any = None,
                 parallel_tool_calls: bool = False):
        self.tools, self.required = chosen_tools(check_tools(tools), tool_choice)
        self.format = detect_format(template_source)
        self.parallel = bool(parallel_tool_calls)

    def messages(self, messages: list[dict]) -> list[dict]:
        if self.format == "generic":
            return generic_messages(messages, self.tools, self.required)
        return native_messages(messages)

    @property
    def variables(self) -> dict:
        """Jinja variables: the tools, for templates that render them."""
        return {"tools": self.tools} if self.tools and self.format != "generic" else {}

    def constraint(self) -> dict:
        return constraint_kwargs(self.format, self.tools, self.required, self.parallel)

    def answer_stream(self) -> AnswerStream:
        return AnswerStream(self.format if self.tools else "none")

    def parse(self, answer: str) -> tuple[str, list[ToolCall]]:
        if not self.tools:
            return answer, []
        return parse_reply(self.format, answer)
