"""pyllm.anthropic_api: Anthropic's Messages requests as Model.chat's arguments, and replies as its
message object and stream events (the server's endpoints are tested in test_server.py)."""
import json
from types import SimpleNamespace

import pytest

from pyllm import InvalidArgumentError
from pyllm.anthropic_api import error_body, message, request_of, stream_events
from pyllm.engine import Metrics
from pyllm.tools import ToolCall

WEATHER = {"name": "get_weather", "description": "the weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_a_request_becomes_chat_messages_tools_and_settings():
    req = request_of({
        "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        "stop_sequences": ["END"], "temperature": 0.5, "top_k": 20, "top_p": 0.9, "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "They want weather.", "signature": "abc"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city", "is_error": True},
                {"type": "text", "text": "And tomorrow?"}]}]})
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "They want weather.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such city"},
        {"role": "user", "content": "And tomorrow?"}]
    assert req.tools == [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                                           "parameters": WEATHER["input_schema"]}}]
    assert req.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert req.parallel_tool_calls is False and req.think is True and req.stream is True
    assert (req.max_tokens, req.stop, req.sampling) == (64, ["END"], {"temperature": 0.5, "top_p": 0.9, "top_k": 20})
    # Anthropic's tool_choice kinds, and its parallel calls allowed unless disabled
    for choice, want in [({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
                         (None, "auto")]:
        got = request_of({"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "tool_choice": choice})
        assert (got.tool_choice, got.parallel_tool_calls) == (want, True)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    shaped = request_of({"messages": [{"role": "user", "content": "hi"}], "output_config": {
        "format": {"type": "json_schema", "schema": schema}, "effort": "max"}})
    assert shaped.format == schema and shaped.template_kwargs == {"reasoning_effort": "high"}
    assert request_of({"messages": [{"role": "user", "content": "hi"}],   # the beta's name
                       "output_format": {"type": "json_schema", "schema": schema}}).format == schema
    plain = request_of({"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "disabled"}})
    assert plain.tools is None and plain.think is False and plain.max_tokens is None and not plain.stream


def test_images_become_image_parts():
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    req = request_of({"messages": [{"role": "user", "content": [{"type": "image", "source": png},
                                                                {"type": "text", "text": "what is it?"}]}]})
    assert req.messages == [{"role": "user", "content": [
        {"type": "image", "image": "data:image/png;base64,iVBORw0KGgo="}, {"type": "text", "text": "what is it?"}]}]


@pytest.mark.parametrize("body, says", [
    ({"messages": []}, "non-empty list"),
    ({"messages": [{"role": "system", "content": "x"}]}, "role user or assistant"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}]},
     "source of type 'url'"),
    ({"messages": [{"role": "assistant", "content": [{"type": "image", "source": {}}]}]}, "holds an image"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]}, "tool_use"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens must be a positive"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop_sequences": "END"}, "stop_sequences"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature must be a number"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "web_search_20250305", "name": "w"}]},
     "server tool"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "tool_choice": {"type": "some"}},
     "tool_choice must be"),
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "any"}}, "tool_choice needs tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "on"}}, "thinking must be"),
    ({"messages": [{"role": "user", "content": "hi"}], "output_config": {"format": {"type": "json"}}},
     "output_config.format must be"),
    ({"messages": [{"role": "user", "content": "hi"}], "output_config": {"effort": "extreme"}}, "effort must be"),
])
def test_bad_requests_say_what_is_wrong(body, says):
    with pytest.raises(InvalidArgumentError, match=says):
        request_of(body)


def finished(text="", calls=(), finish="stop", stop_string="", prompt=10, reused=4, generated=5):
    return SimpleNamespace(text=text, tool_calls=list(calls), finish_reason=finish, stop_string=stop_string,
                           metrics=Metrics(prompt_tokens=prompt, reused_tokens=reused, generated_tokens=generated))


def test_the_message_object_and_its_stop_reason():
    call = ToolCall("get_weather", {"city": "Paris"}, id="call_ab12")
    got = message("m", "Hmm.", "Sure.", finished(calls=[call]), [])
    assert got["type"] == "message" and got["role"] == "assistant" and got["id"].startswith("msg_")
    assert got["content"] == [{"type": "thinking", "thinking": "Hmm.", "signature": ""}, {"type": "text", "text": "Sure."},
                              {"type": "tool_use", "id": "toolu_ab12", "name": "get_weather", "input": {"city": "Paris"}}]
    assert (got["stop_reason"], got["stop_sequence"]) == ("tool_use", None)
    assert got["usage"] == {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4,
                            "output_tokens": 5}
    for c, stops, want in [(finished(finish="length"), [], ("max_tokens", None)),
                           (finished(finish="context"), [], ("model_context_window_exceeded", None)),
                           (finished(stop_string="END"), ["END"], ("stop_sequence", "END")),
                           (finished(stop_string="<|im_end|>"), ["END"], ("end_turn", None)),   # the template's
                           (finished(), [], ("end_turn", None))]:
        got = message("m", "", "x", c, stops)
        assert (got["stop_reason"], got["stop_sequence"]) == want and got["content"] == [{"type": "text", "text": "x"}]


def test_stream_events_open_and_close_a_block_per_kind():
    call = ToolCall("get_weather", {"city": "Paris"}, id="call_1")
    parts = [("thinking", "Let me "), ("thinking", "think."), ("answer", ""), ("answer", "Paris"), ("answer", "!")]
    events = list(stream_events("m", iter(parts), lambda: finished(calls=[call], generated=9), 12, []))
    kinds = [(e["type"], e.get("index")) for e in events]
    assert kinds == [("message_start", None),
                     ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0),
                     ("content_block_delta", 0), ("content_block_stop", 0),
                     ("content_block_start", 1), ("content_block_delta", 1), ("content_block_delta", 1),
                     ("content_block_stop", 1),
                     ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2),
                     ("message_delta", None), ("message_stop", None)]
    assert events[0]["message"]["usage"]["input_tokens"] == 12 and events[0]["message"]["content"] == []
    assert [e["delta"] for e in events[2:5]] == [{"type": "thinking_delta", "thinking": "Let me "},
                                                 {"type": "thinking_delta", "thinking": "think."},
                                                 {"type": "signature_delta", "signature": ""}]
    assert "".join(e["delta"]["text"] for e in events[7:9]) == "Paris!"
    assert events[10]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    assert json.loads(events[11]["delta"]["partial_json"]) == {"city": "Paris"}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 9


def test_errors_in_anthropic_form():
    assert error_body("invalid_request_error", "bad") == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "bad"}}
    assert error_body("server_error", "oops")["error"]["type"] == "api_error"
    assert error_body("unavailable_error", "busy")["error"]["type"] == "overloaded_error"
