"""pyllm.responses_api: OpenAI's Responses requests as Model.chat's arguments, and replies as output
items and numbered stream events (the server's endpoint is tested in test_server.py)."""
import json
from types import SimpleNamespace

import pytest

from pyllm import InvalidArgumentError
from pyllm.engine import Metrics
from pyllm.responses_api import (ResponseStore, ResponseStream, history, output_items, request_of,
                                 response_object)
from pyllm.tools import ToolCall

TOOL = {"type": "function", "name": "get_weather", "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_input_items_become_chat_messages():
    req = request_of({"instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.2, "top_p": 0.9,
                      "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"},
                      "parallel_tool_calls": False, "reasoning": {"effort": "low"},
                      "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
                      "input": [
                          {"role": "developer", "content": "Answer in French."},
                          {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                                          {"type": "input_text", "text": "in Paris?"}]},
                          {"type": "reasoning", "id": "rs_1", "summary": [],
                           "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
                          {"type": "message", "role": "assistant",
                           "content": [{"type": "output_text", "text": "Let me look."}]},
                          {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                           "arguments": '{"city": "Paris"}'},
                          {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
                          {"type": "message", "role": "assistant", "content": "Il fait 18C."},
                          {"role": "user", "content": "Merci"}]})
    assert req.messages == [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "Call the tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "assistant", "content": "Il fait 18C."},
        {"role": "user", "content": "Merci"}]
    assert req.instructions == "Be brief." and req.max_tokens == 50
    assert req.sampling == {"temperature": 0.2, "top_p": 0.9}
    assert req.tools == [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                                           "parameters": TOOL["parameters"]}}]
    assert req.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert req.parallel_tool_calls is False and req.format == {"type": "object"}
    assert (req.think, req.template_kwargs) == (None, {"reasoning_effort": "low"})
    plain = request_of({"input": "Hi", "reasoning": {"effort": "none"}, "text": {"format": {"type": "json_object"}},
                        "store": False})
    assert plain.messages == [{"role": "user", "content": "Hi"}] and plain.think is False
    assert plain.format == "json" and plain.store is False and plain.tools is None and plain.parallel_tool_calls


def test_input_images_become_image_parts():
    req = request_of({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is it?"}, {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]})
    assert req.messages == [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]


@pytest.mark.parametrize("body, says", [
    ({}, "input must be a text or a non-empty list"),
    ({"input": []}, "input must be a text or a non-empty list"),
    ({"input": [{"role": "tool", "content": "x"}]}, "needs a role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "needs an image_url"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}]}, "holds an image"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "type 'item_reference'"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": {"a": 1}}]}, "arguments as JSON text"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens must be a positive"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "function tools only"),
    ({"input": "Hi", "tool_choice": "required"}, "required needs tools"),
    ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "text.format must be"),
    ({"input": "Hi", "reasoning": {"effort": "huge"}}, "reasoning.effort must be"),
    ({"input": "Hi", "temperature": "0"}, "temperature must be a number"),
])
def test_bad_requests_say_what_is_wrong(body, says):
    with pytest.raises(InvalidArgumentError, match=says):
        request_of(body)


def finished(calls=(), finish="stop", prompt=10, reused=4, generated=5):
    return SimpleNamespace(tool_calls=list(calls), finish_reason=finish,
                           metrics=Metrics(prompt_tokens=prompt, reused_tokens=reused, generated_tokens=generated))


def test_the_response_object():
    req = request_of({"input": "Hi", "max_output_tokens": 5, "metadata": {"k": "v"}})
    call = ToolCall("get_weather", {"city": "Paris"}, id="call_7")
    out = output_items("Hmm.", "Sure.", [call])
    assert [i["type"] for i in out] == ["reasoning", "message", "function_call"]
    assert out[0]["content"] == [{"type": "reasoning_text", "text": "Hmm."}] and out[0]["id"].startswith("rs_")
    assert out[1]["content"][0]["text"] == "Sure." and out[1]["role"] == "assistant" and out[1]["status"] == "completed"
    assert {k: out[2][k] for k in ("id", "call_id", "name")} == {"id": "fc_7", "call_id": "call_7",
                                                                 "name": "get_weather"}
    assert json.loads(out[2]["arguments"]) == {"city": "Paris"}
    r = response_object("resp_1", 100, "m", req, out, finished(calls=[call]), 3)
    assert (r["id"], r["object"], r["status"], r["incomplete_details"]) == ("resp_1", "response", "completed", None)
    assert r["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 5,
                          "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 15}
    assert r["max_output_tokens"] == 5 and r["metadata"] == {"k": "v"} and r["store"] is True
    cut = response_object("resp_2", 100, "m", req, output_items("", "Su", []), finished(finish="length"))
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    empty = output_items("", "", [])   # an empty reply is an empty message; one that only calls, its calls
    assert [(i["type"], i["content"][0]["text"]) for i in empty] == [("message", "")]
    assert [i["type"] for i in output_items("", "", [call])] == ["function_call"]
    assert history([{"role": "user", "content": "Hi"}], "Hmm.", "Sure.", [call])[-1] == {
        "role": "assistant", "content": "Sure.", "reasoning_content": "Hmm.", "tool_calls": [call.openai()]}


def test_stream_events_are_numbered_and_close_each_item():
    req = request_of({"input": "Hi"})
    call = ToolCall("get_weather", {"city": "Paris"}, id="call_9")
    stream = ResponseStream(response_object("resp_1", 1, "m", req, []))
    parts = [("thinking", "Let me"), ("thinking", " see."), ("answer", ""), ("answer", "Sun"), ("answer", "ny.")]
    events = list(stream.events(iter(parts), lambda output: response_object(
        "resp_1", 1, "m", req, output + output_items("", "", [call])[-1:], finished(calls=[call]))))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert [e["output_index"] for e in events[2:-1]] == [0] * 7 + [1] * 7 + [2] * 4
    assert events[6]["text"] == "Let me see." and events[13]["text"] == "Sunny."
    assert events[15]["item"]["content"][0]["text"] == "Sunny." and events[15]["item"]["status"] == "completed"
    assert events[16]["item"]["arguments"] == "" and json.loads(events[18]["arguments"]) == {"city": "Paris"}
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    assert stream.error("server_error", "the device failed") == {
        "type": "error", "sequence_number": len(events), "code": "server_error", "message": "the device failed",
        "param": None}


def test_the_store_keeps_the_last_ones():
    store = ResponseStore(size=2)
    for i in range(3):
        store.put({"id": f"resp_{i}"}, [{"role": "user", "content": str(i)}])
    assert store.get("resp_0") is None and store.get("resp_2")[1] == [{"role": "user", "content": "2"}]
    assert store.delete("resp_1") and not store.delete("resp_1") and store.get("resp_1") is None
