"""Chat templates: rendering, fallbacks by architecture, and the sandbox."""
from __future__ import annotations

import re

import pytest

from pyllm.chat_template import ChatTemplate, normalize_messages
from pyllm.errors import InvalidArgumentError, TemplateError

CONV = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "  How are you?\n"}]

# a typical Hugging Face template (Qwen2-like): system default, tojson, loop controls
HF_TEMPLATE = """\
{%- if messages[0]['role'] == 'system' %}
    {%- set sys = messages[0]['content'] %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set sys = 'You are helpful.' %}
    {%- set rest = messages %}
{%- endif %}
{{- bos_token + '<|im_start|>system\n' + sys + '<|im_end|>\n' }}
{%- for m in rest %}
    {%- if m.role not in ['user', 'assistant'] %}
        {{- raise_exception('roles must be user or assistant') }}
    {%- endif %}
    {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>' + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


class FakeTokenizer:
    def __init__(self):
        self.special_ids = {"bos": 1, "eos": 2, "eot": None}
        self._t = {1: "<s>", 2: "</s>"}

    def token_text(self, i):
        return self._t[i]


def test_gemma_fallback_folds_the_system_prompt_into_the_first_user_turn():
    t = ChatTemplate.for_model({"general.architecture": "gemma3"}, FakeTokenizer())
    assert t.name == "gemma" and "gemma3" in t.note and t.end_of_turn == ("<end_of_turn>",)
    assert t.render(CONV) == ("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                              "<start_of_turn>model\nHello!<end_of_turn>\n"
                              "<start_of_turn>user\nHow are you?<end_of_turn>\n"
                              "<start_of_turn>model\n")
    assert t.render(CONV[1:2], add_generation_prompt=False) == "<start_of_turn>user\nHi<end_of_turn>\n"
    for arch in ("gemma", "gemma2", "gemma3n"):
        assert ChatTemplate.for_model({"general.architecture": arch}).name == "gemma"


def test_chatml_fallback_with_a_warning():
    t = ChatTemplate.for_model({"general.architecture": "llama"}, FakeTokenizer())
    assert t.name == "chatml" and "ChatML" in t.note and t.end_of_turn == ("<|im_end|>",)
    assert t.render(CONV[:2]) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                  "<|im_start|>assistant\n")


def test_vicuna_is_llama_cpp_s():
    """llama.cpp's "vicuna" (llm_chat_apply_template): the system text and a blank line, USER: and
    ASSISTANT: turns, a reply closed by </s>, and "ASSISTANT:" to prompt the next; texts as given
    (it strips nothing)."""
    t = ChatTemplate.builtin("vicuna")
    assert t.render(CONV) == "Be brief.\n\nUSER: Hi\nASSISTANT: Hello!</s>\nUSER:   How are you?\n\nASSISTANT:"
    assert t.end_of_turn == ("</s>",)


def test_file_template_renders_like_transformers():
    t = ChatTemplate.for_model({"general.architecture": "llama", "tokenizer.chat_template": HF_TEMPLATE},
                               FakeTokenizer())
    assert t.name == "file" and t.note is None and t.end_of_turn == ("<|im_end|>",)
    out = t.render(CONV)
    assert out == ("<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n  How are you?\n<|im_end|>\n"
                   "<|im_start|>assistant\n")
    assert t.render(CONV[1:2]).startswith("<s><|im_start|>system\nYou are helpful.<|im_end|>")
    # earlier turns render the same whatever follows: the basis of KV reuse across turns
    assert out.startswith(t.render(CONV[:2]) + "Hello!")


# Gemma 4's template, in the shape of its generation prompt: <|turn>ROLE ... <turn|>, and with
# thinking off an empty thought channel the reply starts after
GEMMA4_TEMPLATE = """\
{{- bos_token -}}
{%- for m in messages -%}
    {{- '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' + m['content'] | trim + '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\n' -}}
    {%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\n<channel|>' -}}{%- endif -%}
{%- endif -%}
"""


def test_gemma4_template_ends_turns_with_its_marker():
    t = ChatTemplate.for_model({"general.architecture": "gemma4", "tokenizer.chat_template": GEMMA4_TEMPLATE},
                               FakeTokenizer())
    assert t.name == "file" and t.end_of_turn == ("<turn|>",) and t.has_thinking_switch
    assert t.render(CONV[1:2]) == "<s><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    assert t.render(CONV[1:2], enable_thinking=True) == "<s><|turn>user\nHi<turn|>\n<|turn>model\n"
    assert not ChatTemplate.from_source(HF_TEMPLATE).has_thinking_switch


def test_helpers_hf_templates_use():
    t = ChatTemplate.from_source("{{ messages[0].content | tojson }}|{{ strftime_now('%Y') | length }}|"
                                 "{{ {'b': 1, 'a': [1, 2]} | tojson(sort_keys=true) }}|{{ tools | length }}")
    assert t.render([{"role": "user", "content": "é <b>"}], tools=[{"name": "f"}]) == \
        '"é <b>"|4|{"a": [1, 2], "b": 1}|1'
    with pytest.raises(TemplateError, match="refused the conversation: roles must be user or assistant"):
        ChatTemplate.from_source(HF_TEMPLATE).render([{"role": "tool", "content": "x"}])
    # loop controls are enabled, as in transformers
    t = ChatTemplate.from_source("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                                 "{{ m.content }}{% endfor %}")
    assert t.render(CONV) == "Be brief."


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ messages['__class__'] }}",
    "{{ ''|attr('__class__') }}",
    "{% set x = namespace() %}{{ x.__dict__ }}",
])
def test_internals_are_refused_before_anything_runs(source):
    with pytest.raises(TemplateError, match="Python internals"):
        ChatTemplate.from_source(source)


@pytest.mark.parametrize("source, what", [
    ("{{ ''|attr('__cla' ~ 'ss__') }}", "__class__"),               # built at run time
    ("{{ messages[('_' * 2) ~ 'class' ~ ('_' * 2)] }}", "__class__"),
    ("{{ messages.append(1) }}", "append"),                          # immutable sandbox
    ("{{ '{0.__class__}'.format(1) }}", "__class__"),
    ("{% for i in range(100000000) %}{% endfor %}", "range"),
])
def test_unsafe_operations_at_render_time_are_refused(source, what):
    t = ChatTemplate.from_source(source)
    with pytest.raises(TemplateError, match=rf"{re.escape(what)}.*refusing to run it"):
        t.render([{"role": "user", "content": "hi"}])


def test_file_template_checked_at_load():
    md = {"general.architecture": "llama", "tokenizer.chat_template": "{{ ''.__class__.__mro__ }}"}
    with pytest.raises(TemplateError, match=r"Python internals \('__mro__'"):
        ChatTemplate.for_model(md)
    with pytest.raises(TemplateError, match="not valid Jinja"):
        ChatTemplate.from_source("{% if %}")


def test_messages_are_plain_data():
    assert normalize_messages([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]}]) == \
        [{"role": "user", "content": "ab"}]
    for bad in ("hi", [{"content": "x"}], [{"role": "user", "content": 3}], [{"role": "user", "content": "x",
                                                                             "obj": object()}]):
        with pytest.raises(InvalidArgumentError):
            normalize_messages(bad)
