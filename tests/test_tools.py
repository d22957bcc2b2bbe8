"""Tool calling (pyllm/tools.py): the formats read from chat templates, the prompt
the tools go into, the calls parsed out of replies, SmolLM2 calling tools through
the generic format and through a Hermes-style template, and the server's OpenAI
and ollama shapes."""
import json

import pytest

from pyllm import InvalidArgumentError, Model
from pyllm.chat_template import normalize_messages
from pyllm.tools import (ToolCall, check_tools, chosen_tools, detect_format, generic_messages, native_messages,
                         parse_reply)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# A Hermes-style template (as Qwen 2.5's renders tools and calls), written for these tests
HERMES = """{%- if tools %}<|im_start|>system
You may call functions. Available tools: <tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
For each call, return {"name": <function-name>, "arguments": <args-json-object>} within <tool_call></tool_call> tags.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_formats_come_from_the_template():
    assert detect_format(HERMES) == "hermes"
    assert detect_format("{% if tools %}[AVAILABLE_TOOLS]{{ tools }}{% endif %}[TOOL_CALLS]") == "mistral"
    assert detect_format("{% if tools %}...{% endif %}<|python_tag|>{{ m }}<|eom_id|>") == "llama3"
    assert detect_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "generic"   # no tools
    assert detect_format("{% if tools %}{{ tools | tojson }}{% endif %}") == "generic"        # no known call form
    assert detect_format(None) == "generic"


def test_replies_are_parsed_in_each_format():
    content, calls = parse_reply("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": '
                                           '{"city": "Paris"}}\n</tool_call>\n<tool_call>{"name": "add", '
                                           '"arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>')
    assert content == "Let me look." and [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]   # arguments as JSON text too
    content, calls = parse_reply("hermes", "<tool_call>{not json}</tool_call> ok")
    assert calls == [] and content == "<tool_call>{not json}</tool_call> ok"   # not a call: stays text
    assert parse_reply("hermes", '<tool_call>{"name": "add", "arguments": {}}')[1][0].name == "add"  # unclosed
    content, calls = parse_reply("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; '
                                           '{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert content == "" and [c.name for c in calls] == ["add", "get_weather"] and calls[0].arguments["b"] == 2
    assert parse_reply("llama3", "The answer is {x}.") == ("The answer is {x}.", [])
    content, calls = parse_reply("mistral", 'Sure.[TOOL_CALLS][{"name": "add", "arguments": {"a": 3, "b": 4}}]')
    assert content == "Sure." and calls[0].arguments == {"a": 3, "b": 4}
    assert parse_reply("generic", '{"response": "It is sunny."}') == ("It is sunny.", [])
    content, calls = parse_reply("generic", '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]}')
    assert content == "" and calls[0].name == "add" and calls[0].id.startswith("call_")
    assert parse_reply("generic", '{"tool_calls": [{"nam') == ('{"tool_calls": [{"nam', [])   # cut short
    call = ToolCall("add", {"a": 1, "b": "é"}, id="call_1")
    assert call.openai() == {"id": "call_1", "type": "function",
                             "function": {"name": "add", "arguments": '{"a": 1, "b": "é"}'}}


@pytest.mark.parametrize("tools,message", [
    ({"name": "x"}, "must be a list"), ([{"type": "retrieval"}], "must be"), ([{"function": {}}], "needs a name"),
    ([{"function": {"name": "a b"}}], "needs a name"), ([WEATHER, WEATHER], "two tools are named"),
    ([{"function": {"name": "f", "parameters": "x"}}], "parameters must be"),
])
def test_bad_tools_are_refused(tools, message):
    with pytest.raises(InvalidArgumentError, match=message):
        check_tools(tools)


def test_tool_choice():
    tools = check_tools([WEATHER, ADD["function"]])   # a bare function is taken too
    assert chosen_tools(tools, None) == (tools, False) and chosen_tools(tools, "none") == ([], False)
    assert chosen_tools(tools, "required") == (tools, True)
    assert chosen_tools(tools, {"type": "function", "function": {"name": "add"}}) == (tools[1:], True)
    with pytest.raises(InvalidArgumentError, match="not among the tools"):
        chosen_tools(tools, {"type": "function", "function": {"name": "sub"}})
    with pytest.raises(InvalidArgumentError, match="tool_choice must be"):
        chosen_tools(tools, "always")


HISTORY = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "18 C, sunny"},
    {"role": "tool", "tool_call_id": "call_b", "content": "3"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "Thanks"}]


def test_messages_for_templates_that_know_no_tools():
    tools = check_tools(TOOLS)
    out = generic_messages(normalize_messages([{"role": "system", "content": "Be brief."}] + HISTORY), tools, False)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\nYou can call these tools") and '"get_weather"' in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                            {"name": "add", "arguments": {"a": 1, "b": 2}}]}
    assert json.loads(out[3]["content"]) == {"tool_results": [{"name": "get_weather", "content": "18 C, sunny"},
                                                              {"name": "add", "content": "3"}]}   # one turn
    assert json.loads(out[4]["content"]) == {"response": "It is sunny."}   # as the model writes answers
    assert generic_messages(normalize_messages(ASK), [], False) == normalize_messages(ASK)   # tool_choice none


def test_messages_for_templates_that_know_tools():
    out = native_messages(normalize_messages(HISTORY))
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}   # objects, as templates want
    assert out[1]["tool_calls"][1]["id"] == "call_b" and out[2] == normalize_messages(HISTORY)[2]


@pytest.fixture(scope="module")
def smol(smollm2_path):
    with Model(smollm2_path, n_threads=2) as m:
        yield m


def test_generic_tool_calls(smol):
    """SmolLM2's template knows no tools: the generic format, held to the tools' schemas by a grammar."""
    c = smol.chat(ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80)
    assert c.finish_reason == "stop" and c.text == "" and c.tool_calls
    for call in c.tool_calls:   # valid for its tool's schema, whatever the model chose
        assert call.name in ("get_weather", "add")
        if call.name == "get_weather":
            assert isinstance(call.arguments["city"], str) and len(call.arguments["city"]) <= 30
            assert set(call.arguments) <= {"city", "unit"}
        else:
            assert set(call.arguments) == {"a", "b"} and all(type(v) is int for v in call.arguments.values())
    c = smol.chat(ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
                  temperature=0.9, seed=3, max_tokens=80)
    assert [call.name for call in c.tool_calls][:1] == ["add"] and set(c.tool_calls[0].arguments) == {"a", "b"}
    assert len(c.tool_calls) == 1   # one call a reply unless parallel_tool_calls
    for seed in range(3):   # auto: one JSON object, a call or an answer
        s = smol.chat(ASK, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=80, stream=True)
        raw = "".join(s)
        c = s.completion
        if c.finish_reason == "stop":
            obj = json.loads(raw)
            assert list(obj) in (["tool_calls"], ["response"]) and bool(c.tool_calls) == ("tool_calls" in obj)
            assert c.text == obj.get("response", "")
    s = smol.chat(ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=True, temperature=0,
                  max_tokens=120, stream=True)
    raw = "".join(s)   # a list the grammar lets grow: SmolLM2 writes two calls on AVX2 and stops; on AVX-512
    if s.completion.finish_reason == "stop":   # (its greedy path a hair apart) it repeats the call until max_tokens
        calls = json.loads(raw)["tool_calls"]
        assert calls and all(c["name"] == "get_weather" for c in calls) and s.completion.tool_calls
    else:
        assert s.completion.finish_reason == "length" and raw.startswith('{\n  "tool_calls": [')
        assert raw.count('"name": "get_weather"') >= 2 and '"name": "add"' not in raw
    plain = smol.chat(ASK, temperature=0, max_tokens=20)
    assert smol.chat(ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=20).text == plain.text
    c = smol.chat(HISTORY[:4], tools=TOOLS, temperature=0, max_tokens=60)   # after the results: a turn as usual
    assert c.finish_reason in ("stop", "length")
    with pytest.raises(InvalidArgumentError, match="give no format"):
        smol.chat(ASK, tools=TOOLS, format="json")


def test_hermes_tool_calls(smol):
    """A template that renders tools (Hermes-style): the tools in its prompt, a required call held
    to `<tool_call>{...}</tool_call>`, earlier calls rendered with their arguments as objects."""
    m = smol
    saved = m._template
    try:
        from pyllm.chat_template import ChatTemplate
        m._template = ChatTemplate.from_source(HERMES)
        prompt = m.apply_chat_template(native_messages(normalize_messages(HISTORY)), tools=check_tools(TOOLS))
        assert '"name": "get_weather"' in prompt and '{"name": "add", "arguments": {"a": 1, "b": 2}}' in prompt
        c = m.chat(ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80)
        assert c.finish_reason == "stop" and len(c.tool_calls) == 1 and c.text == ""
        assert c.tool_calls[0].name in ("get_weather", "add")
        c = m.chat(ASK, tools=[WEATHER], tool_choice="required", temperature=1.2, seed=5, max_tokens=80)
        assert c.tool_calls[0].name == "get_weather" and isinstance(c.tool_calls[0].arguments["city"], str)
        c = m.chat(ASK, tools=TOOLS, temperature=0, max_tokens=30)   # auto: free text, parsed afterwards
        assert c.finish_reason in ("stop", "length")
    finally:
        m._template = saved


# Llama 3.1-style and Mistral-style templates (how they render tools), written for these tests
LLAMA3 = """{%- if tools %}<|im_start|>system
Respond with a JSON function call {"name": function name, "parameters": dictionary of argument name and its value}, \
or answer in words. Functions: {% for t in tools %}{{ t | tojson }} {% endfor %}<|python_tag|><|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
MISTRAL = """{%- for message in messages %}
{%- if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- if message.role == "user" %}[INST]{{ message.content }}[/INST]{% else %}{{ message.content }}</s>{% endif %}
{%- endfor %}[TOOL_CALLS]"""


def _with_template(m, source, fn):
    from pyllm.chat_template import ChatTemplate
    saved = m._template
    try:
        m._template = ChatTemplate.from_source(source)
        return fn()
    finally:
        m._template = saved


@pytest.mark.parametrize("source, fmt", [(LLAMA3, "llama3"), (MISTRAL, "mistral")])
def test_native_formats_hold_a_required_call(smol, source, fmt):
    """tool_choice required: the reply is one call in the template's own format."""
    assert detect_format(source) == fmt
    c = _with_template(smol, source, lambda: smol.chat(ASK, tools=TOOLS, tool_choice="required", temperature=0,
                                                        max_tokens=80))
    assert c.finish_reason == "stop" and len(c.tool_calls) == 1 and c.text == ""
    assert c.tool_calls[0].name in ("get_weather", "add")
    c = _with_template(smol, source, lambda: smol.chat(ASK, tools=[WEATHER], tool_choice="required",
                                                        temperature=1.0, seed=3, max_tokens=80))
    assert c.tool_calls[0].name == "get_weather" and isinstance(c.tool_calls[0].arguments["city"], str)


@pytest.mark.parametrize("fmt, call, prose", [
    ("llama3", '{"name": "add", "parameters": {"a": 1, "b": 2}}', 'Sure: {"name": "add"} is not a call'),
    ("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', "The answer is 3."),
    ("mistral", 'Let me add.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]', "It is 3 [TOOL"),
    ("hermes", 'Let me add.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "<tool 3"),
])
def test_auto_calls_are_held_from_where_they_start(smol, fmt, call, prose):
    """tool_choice auto: text stays free until a call starts (a Llama 3 reply only at its start);
    from there the grammar holds the call to the tools' schemas, and it ends where the call does."""
    from pyllm.grammar import constraint_for
    from pyllm.tools import constraint_kwargs
    kw = constraint_kwargs(fmt, check_tools(TOOLS), required=False)
    tok = smol.tokenizer

    def constrained(text):
        c = constraint_for(tok, grammar=kw["grammar"], trigger=kw["trigger"])
        for t in smol.tokenize(text, add_bos=False, special=True):
            assert c.allows(t), text
            c.advance(t)
        return c
    c = constrained(call)
    assert c.active and c.done
    c = constrained(call[:call.index('"a"') + 1])   # inside the call: only its schema's keys may come
    assert c.active and c.allows(smol.tokenize("a", add_bos=False)[0])
    assert not c.allows(smol.tokenize("x", add_bos=False)[0])
    c = constrained(prose)
    assert not c.active and c.mask().all()


def test_auto_tool_use_with_native_templates_still_answers(smol):
    for source in (LLAMA3, MISTRAL):
        c = _with_template(smol, source, lambda: smol.chat(ASK, tools=TOOLS, temperature=0, max_tokens=40))
        assert c.finish_reason in ("stop", "length")


@pytest.mark.parametrize("fmt, reply, content, shown", [
    ("hermes", 'Let me check.<tool_call>\n{"name": "add"}\n</tool_call>', "Let me check.", "Let me check."),
    ("hermes", "An answer with <tool in it", "An answer with <tool in it", "An answer with <tool in it"),
    ("mistral", 'Ok.[TOOL_CALLS][{"name": "add"}]', "Ok.", "Ok."),
    ("llama3", '  {"name": "add", "parameters": {}}', "", ""),
    ("llama3", "The answer is 4.", "The answer is 4.", "The answer is 4."),
    ("llama3", "{not a call} then text", "{not a call} then text", ""),      # held, given whole at the end
    ("generic", '{ "response" :\n "Hi \\"you\\"\\n\\ud83d\\ude00 \\u00e9" }', 'Hi "you"\n\U0001F600 é',
     'Hi "you"\n\U0001F600 é'),
    ("generic", '{"tool_calls": [{"name": "add", "arguments": {}}]}', "", ""),
])
@pytest.mark.parametrize("step", [1, 2, 5])
def test_an_answer_with_tools_streams_without_its_calls(fmt, reply, content, shown, step):
    """Streamed pieces hold no call markup, whatever the pieces' cuts (an escape or a call's
    opening word cut in two); with the end's rest they make the final content."""
    from pyllm.tools import AnswerStream
    a = AnswerStream(fmt)
    pieces = [a.push(reply[i:i + step]) for i in range(0, len(reply), step)]
    assert "".join(pieces) == shown
    assert "".join(pieces) + a.finish(content) == content
