"""gpt-oss's harmony chat format on the server: the format's selection, forced openings,
the template round trip, and a harmony server end to end (scripted model output, the real
openai / anthropic SDKs). The parser itself: tests/server/parsers/test_parsers_harmony.py.

Independent checks: expected prompts follow harmony's published format (openai/harmony
docs/format.md), transformers' own renderer runs the test template, the parser reads back
what the template writes, and the tokenizer says where openings end. The test tokenizer
is the demo's Qwen3 one plus harmony's markers as special tokens (ids after Qwen's),
standing in for o200k_harmony.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from server_harness import ScriptedLLM, ServerHarness, add_tokens, demo_with_template, last_request, scripted_server, streamed_completion
from server_scripts import SCRIPTS, TIME_TOOL, WEATHER_TOOL, ask, message_calls, tool_call

from edgemoe.server.forced_call import PrimedParser, call_opening
from edgemoe.server.parsers import ResponseParser, get_tool_parser, parser_for_chat_template, parser_for_model_type
from edgemoe.server.parsers.harmony import FINAL_OPENING, template_inputs
from edgemoe.server.templates import ChatTemplate, normalize_messages
from edgemoe.tokenizer import TokenizerBundle

MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
FIRST_MARKER_ID = 151669  # after Qwen3's added tokens
TOOLS = [WEATHER_TOOL, TIME_TOOL]
A = "<|start|>assistant"
WEATHER = '{"city": "Paris", "days": 3}'
CALL = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{WEATHER}"
ANSWER = "<|channel|>analysis<|message|>Simple.<|end|>" + A + "<|channel|>final<|message|>2 + 2 = 4."


def parse(text: str) -> tuple[str, str, list[tuple[str, Any]]]:
    got = ResponseParser(None, get_tool_parser("harmony")(TOOLS)).parse_complete(text)
    return got.content, got.reasoning, [(c.name, json.loads(c.arguments)) for c in got.tool_calls]


def test_format_selection() -> None:
    assert parser_for_model_type("gpt_oss") == "harmony"
    assert parser_for_chat_template(TEMPLATE_SOURCE) == "harmony"
    assert parser_for_chat_template("{{ '<tool_call>' }}{{ '<arg_key>' }}{{ '<arg_value>' }}") == "glm45"


# --------------------------------------------------------------------------- template

# A compact harmony template in our own words, shaped as gpt-oss's published one: system
# message with the effort, developer message with instructions and tools, calls written
# as `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>`,
# tool results from `functions.NAME`, and its refusal of a call turn with content and thinking.
TEMPLATE_SOURCE = """\
<|start|>system<|message|>You are a test model.
Reasoning: {{ reasoning_effort if reasoning_effort is defined else "medium" }}

# Valid channels: analysis, commentary, final.<|end|>
{%- if messages and messages[0].role in ("system", "developer") %}
{%- set instructions, rest = messages[0].content, messages[1:] %}
{%- else %}{% set instructions, rest = "", messages %}{% endif %}
{%- if instructions or tools %}<|start|>developer<|message|>
{%- if instructions %}# Instructions

{{ instructions }}{% endif %}
{%- if tools %}# Tools
{% for t in tools %}
type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;
{%- endfor %}{% endif %}<|end|>{% endif %}
{%- set last = namespace(name=none) %}
{%- for m in rest %}
{%- if m.role == "user" %}<|start|>user<|message|>{{ m.content }}<|end|>
{%- elif m.role == "assistant" and m.tool_calls %}
{%- if m.content and m.thinking %}{{ raise_exception("Cannot pass both content and thinking") }}{% endif %}
{%- if m.content or m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.content or m.thinking }}<|end|>
{%- endif %}
{%- for c in m.tool_calls %}<|start|>assistant to=functions.{{ c.function.name -}}
<|channel|>commentary json<|message|>{{ c.function.arguments | tojson }}<|call|>
{%- set last.name = c.function.name %}{% endfor %}
{%- elif m.role == "assistant" %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == "tool" %}<|start|>functions.{{ last.name }} to=assistant<|channel|>commentary<|message|>
{{- m.content }}<|end|>
{%- endif %}{% endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""
TEMPLATE = ChatTemplate(TEMPLATE_SOURCE)


CONVERSATION = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
     "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 3})]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


def test_transformers_renders_the_template_the_same() -> None:
    render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template
    for variables in ({}, {"reasoning_effort": "high"}):
        ours = TEMPLATE.render(CONVERSATION, tools=TOOLS, **variables)
        (theirs,), _ = render([normalize_messages(CONVERSATION)], chat_template=TEMPLATE_SOURCE, tools=TOOLS,
                              add_generation_prompt=True, **variables)
        assert ours == theirs
    assert "Reasoning: high" in ours and ours.endswith('<|message|>sunny<|end|><|start|>assistant')


def test_template_call_parses_back() -> None:
    """A call turn as the template writes it, read as output after the generation prompt."""
    messages, turn = CONVERSATION[:2], CONVERSATION[2]
    second = {**turn, "tool_calls": [*turn["tool_calls"], tool_call("get_time", "{}", "c2")]}
    prompt = TEMPLATE.render(messages, tools=TOOLS)
    whole = TEMPLATE.render([*messages, second], tools=TOOLS, add_generation_prompt=False)
    assert whole.startswith(prompt)
    assert parse(whole[len(prompt):]) == ("", "Use the tool.", [("get_weather", {"city": "Paris", "days": 3}),
                                                               ("get_time", {})])


def test_template_inputs_map_effort_and_fold_preambles() -> None:
    turn = {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.",
            "tool_calls": [tool_call("get_weather", {"city": "Paris"})]}
    messages, variables = template_inputs([CONVERSATION[1], turn], {"reasoning_effort": "minimal", "x": 1}, True)
    assert variables == {"reasoning_effort": "low", "x": 1}
    assert template_inputs([], {}, True)[1] == {} and template_inputs([], {}, False)[1] == {"reasoning_effort": "low"}
    assert (messages[1]["content"], messages[1]["thinking"]) == ("", "Use the tool.\n\nChecking.")
    assert "analysis<|message|>Use the tool.\n\nChecking.<|end|>" in TEMPLATE.render(messages, tools=TOOLS)


@pytest.fixture(scope="module")
def harmony_dir(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model with harmony's markers as special tokens, `<|return|>` and `<|call|>`
    as EOS ids (as gpt-oss's generation_config has them) and the test template."""
    model_dir = demo_with_template(demo_dir, tmp_path_factory.mktemp("harmony"), TEMPLATE_SOURCE)
    add_tokens(model_dir, FIRST_MARKER_ID, MARKERS, special=True)
    generation_path = model_dir / "generation_config.json"
    generation = json.loads(generation_path.read_text())
    generation["eos_token_id"] += [FIRST_MARKER_ID + MARKERS.index(m) for m in ("<|return|>", "<|call|>")]
    generation_path.write_text(json.dumps(generation))
    return model_dir


@pytest.fixture(scope="module")
def harmony_tokenizer(harmony_dir: Path) -> TokenizerBundle:
    return TokenizerBundle.load(harmony_dir)


@pytest.mark.parametrize("name", ["get_weather", None])
def test_openings_end_on_token_boundaries(name: str | None, harmony_tokenizer: TokenizerBundle) -> None:
    """Prompt + forced opening is where the model's own spelling of the call stands, in
    text and in tokens; the parser primed with the opening reads the model's rest."""
    prompt = TEMPLATE.render(CONVERSATION[:2], tools=TOOLS)
    opening = call_opening("harmony", name)
    full = prompt + CALL + "<|call|>"
    assert full.startswith(prompt + opening)
    ids = harmony_tokenizer.encode(prompt + opening, add_special_tokens=False)
    assert harmony_tokenizer.encode(full, add_special_tokens=False)[: len(ids)] == ids
    primed = PrimedParser(get_tool_parser("harmony")(TOOLS), opening)
    rest = primed.parse_complete(full[len(prompt + opening):])
    assert [(c.name, json.loads(c.arguments)) for c in rest.tool_calls] == [("get_weather", json.loads(WEATHER))]


# --------------------------------------------------------------------------- end to end

HARMONY_SCRIPTS = {
    **SCRIPTS,
    "h_tool": "<|channel|>analysis<|message|>I should call the weather tool.<|end|>" + A + CALL + "<|call|>",
    "h_answer": ANSWER + "<|return|>",
    "h_rest": WEATHER + "<|call|>",  # after the named opening
    "h_any": ".get_weather <|constrain|>json<|message|>" + WEATHER + "<|call|>",  # after "… to=functions"
    "h_json": '{"answer": 4}<|return|>',  # after the final channel's opening
}


@pytest.fixture(scope="module")
def harmony(harmony_dir: Path, harmony_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = scripted_server(harmony_tokenizer, HARMONY_SCRIPTS, harmony_dir, "gpt_oss")
    yield harness
    harness.stop()


def test_openai_sdk_gets_reasoning_content_and_calls(harmony: ServerHarness, harmony_tokenizer: TokenizerBundle,
                                                     ) -> None:
    client = harmony.openai()
    answer = client.chat.completions.create(model="m", messages=ask("h_answer"), reasoning_effort="high")
    prompt, params = last_request(harmony, harmony_tokenizer)
    assert "Reasoning: high" in prompt and params.skip_special_tokens is False  # the markers reach the parser
    assert answer.choices[0].message.content == "2 + 2 = 4."
    assert (answer.choices[0].message.model_extra or {})["reasoning_content"] == "Simple."
    full = client.chat.completions.create(model="m", messages=ask("h_tool"), tools=TOOLS)
    streamed = streamed_completion(client, model="m", messages=ask("h_tool"), tools=TOOLS)
    for out in (full, streamed):
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        assert message_calls(choice.message) == [("get_weather", json.loads(WEATHER))]
        assert (choice.message.model_extra or {})["reasoning_content"] == "I should call the weather tool."


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_forced_calls(harmony: ServerHarness, harmony_tokenizer: TokenizerBundle, choice: Any) -> None:
    """The prompt ends with the opening; a named call's arguments are held to the tool's
    parameters (the opening ends at `<|message|>`); "required" is served loosely."""
    named = isinstance(choice, dict)
    out = harmony.openai().chat.completions.create(model="m", messages=ask("h_rest" if named else "h_any"),
                                                   tools=TOOLS, tool_choice=choice)
    prompt, params = last_request(harmony, harmony_tokenizer)
    assert prompt.endswith(A + call_opening("harmony", "get_weather" if named else None))
    assert (params.structured is not None) == named
    assert out.choices[0].finish_reason == "tool_calls" and not out.choices[0].message.content
    assert message_calls(out.choices[0].message) == [("get_weather", json.loads(WEATHER))]


def test_response_format_holds_the_final_channel(harmony: ServerHarness, harmony_tokenizer: TokenizerBundle) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    out = harmony.openai().chat.completions.create(model="m", messages=ask("h_json"),
                                                   response_format=response_format)  # type: ignore[arg-type]
    prompt, params = last_request(harmony, harmony_tokenizer)
    assert prompt.endswith(A + FINAL_OPENING) and params.structured.reasoning == "none"
    assert json.loads(out.choices[0].message.content or "") == {"answer": 4}
    # beside active tools the channel is not known ahead: no constraint, nothing opened
    harmony.openai().chat.completions.create(model="m", messages=ask("h_tool"), tools=TOOLS,
                                             response_format=response_format)  # type: ignore[arg-type]
    prompt, params = last_request(harmony, harmony_tokenizer)
    assert prompt.endswith(A) and params.structured is None


def test_call_turns_with_a_preamble_render(harmony: ServerHarness) -> None:
    """A client echoes a call turn's preamble (content) beside its reasoning: not a 400."""
    turn = {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.",
            "tool_calls": [tool_call("get_weather", {"city": "Paris"})]}
    messages = [*ask("h_answer"), turn, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    out = harmony.openai().chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert out.choices[0].message.content == "2 + 2 = 4."


def test_anthropic_sdk_gets_thinking_and_tool_use(harmony: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=harmony.base_url, api_key="unused")
    tools = [{"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}]
    message = client.messages.create(model="m", max_tokens=200, tools=tools,  # type: ignore[arg-type]
                                     messages=ask("h_tool"))
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == [("get_weather",
                                                                                     json.loads(WEATHER))]


# --------------------------------------------------------------------------- edgemoe chat


@pytest.mark.parametrize("model_type", ["gpt_oss", "qwen3_moe"])
def test_edgemoe_chat_reads_harmony_channels(harmony_dir: Path, harmony_tokenizer: TokenizerBundle,
                                             model_type: str) -> None:
    """The in-process chat backend picks the format as the server does (here the template
    teaches harmony, whatever the model_type): analysis → reasoning, final → content, the
    markers kept in the decoded text for the parser."""
    from edgemoe.chat_backends import Answer, LocalBackend, Sampling

    llm = ScriptedLLM(harmony_tokenizer, model_type, ANSWER + "<|return|>")
    backend = LocalBackend(llm, Sampling(max_tokens=64, temperature=None, thinking=None))
    answer = Answer()
    for piece in backend.stream([{"role": "user", "content": "2 + 2?"}], answer):
        answer.add(piece)
    assert (answer.reasoning, answer.content) == ("Simple.", "2 + 2 = 4.")
    assert backend.whole_format == "harmony" and llm.params.skip_special_tokens is False


def test_edgemoe_chat_keeps_think_parsing_elsewhere(demo_dir: Path) -> None:
    from edgemoe.chat_backends import Answer, LocalBackend, Sampling

    llm = ScriptedLLM(TokenizerBundle.load(demo_dir), "gpt_oss", "<think>Hm.</think>Hi.")
    backend = LocalBackend(llm, Sampling(max_tokens=64, temperature=None, thinking=True))
    answer = Answer()
    for piece in backend.stream([{"role": "user", "content": "Hi"}], answer):
        answer.add(piece)
    assert backend.whole_format is None and llm.params.skip_special_tokens is True
    assert (answer.reasoning.strip(), answer.content.strip()) == ("Hm.", "Hi.")
