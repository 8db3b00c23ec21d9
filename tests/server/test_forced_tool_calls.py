"""Forced tool calls (`tool_choice` required / named; Anthropic `any` / `tool`) by a forced
opening (`edgemoe.server.forced_call`).

Checked against independent things: the real chat templates' own rendering of an
assistant tool call (text and tokens), the unprimed parsers on the same full text, and
the `openai` / `anthropic` SDKs' strict types over the scripted engine, whose scripts
`forced_*` are the rest of a call after the opening.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from agents_support import call, strict
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from server_harness import MakeServer, ScriptedEngine, ServerHarness, demo_with_template
from server_scripts import SCRIPTS, TIME_TOOL, WEATHER_TOOL

from edgemoe.assets.chat_template import QWEN3_5_CHAT_TEMPLATE
from edgemoe.server.config import ServerConfig
from edgemoe.server.forced_call import PrimedParser, call_opening
from edgemoe.server.parsers import ResponseParser, accumulate, get_tool_parser
from edgemoe.server.templates import ChatTemplate
from edgemoe.tokenizer import TokenizerBundle

TOOLS = [WEATHER_TOOL, TIME_TOOL]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
WEATHER_ARGS = {"city": "Paris", "days": 3}
HERMES_NAMED = '<tool_call>\n{"name": "get_weather", "arguments":'
HERMES_ANY = '<tool_call>\n{"name": "'
XML_NAMED = "<tool_call>\n<function=get_weather>\n"
XML_ANY = "<tool_call>\n<function"
NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # the template's closed think block


def ask(script: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Go. [[{script}]]"}]


def seen_prompt(harness: ServerHarness, tokenizer: TokenizerBundle) -> str:
    return tokenizer.decode(harness.engine.seen[-1][0])  # type: ignore[attr-defined]


def script_tokens(tokenizer: TokenizerBundle, script: str) -> int:
    return len(tokenizer.encode(SCRIPTS[script], add_special_tokens=False)) + 1  # + EOS


# --------------------------------------------------------------------------- the openings


def test_openings_per_format() -> None:
    assert call_opening("hermes", "get_weather") == HERMES_NAMED
    assert call_opening("hermes", None) == HERMES_ANY
    assert call_opening("qwen3_coder", "get_weather") == XML_NAMED
    assert call_opening("qwen3_coder", None) == XML_ANY
    assert call_opening("hermes", 'say "hi"') == '<tool_call>\n{"name": "say \\"hi\\"", "arguments":'
    assert call_opening("unknown", "x") == ""


@pytest.mark.parametrize(("tool_format", "source"), [("hermes", None), ("qwen3_coder", QWEN3_5_CHAT_TEMPLATE)])
@pytest.mark.parametrize("name", ["get_weather", "Read"])
def test_openings_are_what_the_template_writes(tool_format: str, source: str | None, name: str,
                                               demo_tokenizer: TokenizerBundle) -> None:
    """Prompt + opening is where the template's own rendering of that call stands, in text
    and in tokens (so the model continues in distribution); hermes: the demo's Qwen3 template."""
    template = ChatTemplate(source) if source else ChatTemplate.from_tokenizer(demo_tokenizer)
    assert template is not None
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Weather?"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": name, "arguments": WEATHER_ARGS}}]}
    whole = template.render([*messages, turn], tools=tools, add_generation_prompt=False, enable_thinking=False)
    prompt = template.render(messages, tools=tools, add_generation_prompt=True, enable_thinking=False)
    encode = demo_tokenizer.encode
    for opening in (call_opening(tool_format, name), call_opening(tool_format, None)):
        assert whole.startswith(prompt + opening)
        ids = encode(prompt + opening, add_special_tokens=False)
        assert encode(whole, add_special_tokens=False)[: len(ids)] == ids


@pytest.mark.parametrize(("tool_format", "name", "rest"), [
    ("hermes", "get_weather", SCRIPTS["forced_named"]),
    ("hermes", None, SCRIPTS["forced_any"]),
    ("qwen3_coder", "get_weather", SCRIPTS["forced_xml_named"]),
    ("qwen3_coder", None, SCRIPTS["forced_xml_any"]),
    ("hermes", "get_weather", SCRIPTS["forced_bad"]),
    ("qwen3_coder", "get_weather", SCRIPTS["forced_bad"]),
    ("hermes", "get_weather", SCRIPTS["forced_then_text"]),
])
def test_primed_parser_reads_as_if_generated(tool_format: str, name: str | None, rest: str) -> None:
    """Primed with the opening, a parser gives exactly what an unprimed one gives for
    opening + rest (invalid calls included), for every split of the rest."""
    opening = call_opening(tool_format, name)
    parser_class = get_tool_parser(tool_format)
    ids = iter(range(1000))
    expected = ResponseParser(None, parser_class(TOOLS, lambda: f"call_{next(ids)}")).parse_complete(opening + rest)
    for size in (1, 3, len(rest)):
        ids = iter(range(1000))
        primed = PrimedParser(parser_class(TOOLS, lambda: f"call_{next(ids)}"), opening)
        deltas = [primed.opening, *(primed.feed(rest[i : i + size]) for i in range(0, len(rest), size))]
        deltas.append(primed.finish())
        assert accumulate(deltas) == expected
        if expected.tool_calls:  # the call's start comes first (fed 1 character at a time: alone)
            first = next(d for d in deltas if not d.empty)
            assert first.tool_calls[0].name == expected.tool_calls[0].name
            assert first.content == "" or size > 1


# --------------------------------------------------------------------------- Chat Completions


def _chat_both(harness: ServerHarness, script: str, choice: Any, **extra: Any) -> list[ChatCompletion]:
    client = harness.openai()
    full = call(client.chat.completions.create, model="m", messages=ask(script), tools=TOOLS, tool_choice=choice,
                **extra)
    with call(client.chat.completions.stream, model="m", messages=ask(script), tools=TOOLS, tool_choice=choice,
              stream_options={"include_usage": True}, **extra) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion()
    raw = httpx.post(f"{harness.base_url}/v1/chat/completions", timeout=30, json={
        "model": "m", "messages": ask(script), "tools": TOOLS, "tool_choice": choice, **extra}).json()
    return [full, streamed, strict(ChatCompletion, raw)]


def _calls(completion: ChatCompletion) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in completion.choices[0].message.tool_calls or []]


@pytest.mark.parametrize(("choice", "script", "opening"), [
    (NAMED, "forced_named", HERMES_NAMED), ("required", "forced_any", HERMES_ANY)])
def test_chat_forced_call(scripted: ServerHarness, demo_tokenizer: TokenizerBundle,
                          choice: Any, script: str, opening: str) -> None:
    results = _chat_both(scripted, script, choice)
    # Thinking is on by default, yet the forced turn renders with it off, the opening last.
    assert seen_prompt(scripted, demo_tokenizer).endswith(NO_THINK + opening)
    for completion in results:
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "tool_calls"
        assert not message.content and "reasoning_content" not in (message.model_extra or {})
        assert _calls(completion) == [("get_weather", WEATHER_ARGS)]
        assert completion.usage is not None and completion.usage.completion_tokens == script_tokens(demo_tokenizer, script)
    assert results[0].choices[0].message.tool_calls[0].id.startswith("call_")  # type: ignore[index]


def test_chat_forced_stream_starts_with_the_call(scripted: ServerHarness) -> None:
    body = {"model": "m", "messages": ask("forced_named"), "tools": TOOLS, "tool_choice": NAMED, "stream": True}
    with httpx.stream("POST", f"{scripted.base_url}/v1/chat/completions", json=body, timeout=30) as r:
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.iter_lines() if line.startswith("data: {")]
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["index"] == 0
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == WEATHER_ARGS
    assert not any(d.get("content") for d in deltas)


def test_chat_forced_parallel_false_keeps_the_first(scripted: ServerHarness) -> None:
    for completion in _chat_both(scripted, "forced_two", NAMED, parallel_tool_calls=False):
        assert _calls(completion) == [("get_weather", WEATHER_ARGS)]
    for completion in _chat_both(scripted, "forced_two", NAMED):
        assert _calls(completion) == [("get_weather", WEATHER_ARGS), ("get_time", {"zone": "Europe/Paris"})]


def test_chat_forced_invalid_continuation_is_content(scripted: ServerHarness) -> None:
    """Not a call after all: as for any invalid call the parser reads, its raw text is content."""
    for completion in _chat_both(scripted, "forced_bad", NAMED):
        assert completion.choices[0].finish_reason == "stop" and not completion.choices[0].message.tool_calls
        assert completion.choices[0].message.content == HERMES_NAMED + SCRIPTS["forced_bad"]


def test_chat_auto_and_none_force_nothing(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    client = scripted.openai()
    auto = call(client.chat.completions.create, model="m", messages=ask("tool"), tools=TOOLS, tool_choice="auto")
    assert seen_prompt(scripted, demo_tokenizer).endswith("<|im_start|>assistant\n")
    assert _calls(auto) == [("get_weather", WEATHER_ARGS)] and auto.choices[0].message.model_extra["reasoning_content"]
    call(client.chat.completions.create, model="m", messages=ask("tool"), tools=TOOLS, tool_choice="none")
    assert seen_prompt(scripted, demo_tokenizer).endswith("<|im_start|>assistant\n")


def test_chat_forced_qwen3_coder(make_scripted: MakeServer, demo_tokenizer: TokenizerBundle) -> None:
    harness = make_scripted(tool_call_parser="qwen3_coder")
    for choice, script, opening in ((NAMED, "forced_xml_named", XML_NAMED), ("required", "forced_xml_any", XML_ANY)):
        results = _chat_both(harness, script, choice)
        assert seen_prompt(harness, demo_tokenizer).endswith(NO_THINK + opening)
        for completion in results:
            assert completion.choices[0].finish_reason == "tool_calls" and not completion.choices[0].message.content
            assert _calls(completion) == [("get_weather", WEATHER_ARGS)]
            assert completion.usage is not None
            assert completion.usage.completion_tokens == script_tokens(demo_tokenizer, script)


@pytest.fixture(scope="module")
def formatless(demo_dir: Path, demo_tokenizer: TokenizerBundle, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[ServerHarness]:
    """The demo model with a chat template that teaches no tool-call format."""
    model_dir = demo_with_template(demo_dir, tmp_path_factory.mktemp("formatless"),
                                   "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                   "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    engine = ScriptedEngine(demo_tokenizer, SCRIPTS)
    harness = ServerHarness(engine, engine.ready(model_dir), ServerConfig()).start()
    yield harness
    harness.stop()


def test_a_formatless_template_forces_nothing(formatless: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    for choice in (NAMED, "required"):
        out = call(formatless.openai().chat.completions.create, model="m", messages=ask("two_tools"), tools=TOOLS,
                   tool_choice=choice)
        assert seen_prompt(formatless, demo_tokenizer).endswith("[[two_tools]]<|im_end|>\n<|im_start|>assistant\n")
        assert len(_calls(out)) == 2  # parsed as with "auto" (the family's hermes format)


# --------------------------------------------------------------------------- Responses


@pytest.mark.parametrize(("choice", "script", "opening"), [
    ({"type": "function", "name": "get_weather"}, "forced_named", HERMES_NAMED),
    ("required", "forced_any", HERMES_ANY)])
def test_responses_forced_call(scripted: ServerHarness, demo_tokenizer: TokenizerBundle,
                               choice: Any, script: str, opening: str) -> None:
    client = scripted.openai()
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
             for t in TOOLS]
    kwargs = {"model": "m", "input": f"Go. [[{script}]]", "tools": tools, "tool_choice": choice}
    full = call(client.responses.create, **kwargs)
    assert seen_prompt(scripted, demo_tokenizer).endswith(NO_THINK + opening)
    with call(client.responses.stream, **kwargs) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_response()
    raw = strict(Response, httpx.post(f"{scripted.base_url}/v1/responses", json=kwargs, timeout=30).json())
    for response in (full, streamed, raw):
        assert [(i.type, getattr(i, "name", None)) for i in response.output] == [("function_call", "get_weather")]
        assert json.loads(response.output[0].arguments) == WEATHER_ARGS  # type: ignore[union-attr]
        assert response.status == "completed" and response.usage is not None
        assert response.usage.output_tokens == script_tokens(demo_tokenizer, script)


# --------------------------------------------------------------------------- Anthropic Messages

WEATHER_ANTHROPIC = {"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}
TIME_ANTHROPIC = {"name": "get_time", "input_schema": TIME_TOOL["function"]["parameters"]}


def _anthropic(harness: ServerHarness) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=harness.base_url, api_key="unused", max_retries=0, timeout=30)


@pytest.mark.parametrize(("choice", "script", "opening"), [
    ({"type": "tool", "name": "get_weather"}, "forced_named", HERMES_NAMED),
    ({"type": "any"}, "forced_any", HERMES_ANY)])
def test_anthropic_forced_call(scripted: ServerHarness, demo_tokenizer: TokenizerBundle,
                               choice: dict[str, Any], script: str, opening: str) -> None:
    sdk = _anthropic(scripted)
    kwargs = {"model": "claude-x", "max_tokens": 200, "messages": ask(script),
              "tools": [WEATHER_ANTHROPIC, TIME_ANTHROPIC], "tool_choice": choice}
    full = call(sdk.messages.create, **kwargs)
    assert seen_prompt(scripted, demo_tokenizer).endswith(NO_THINK + opening)
    prompt_tokens = len(scripted.engine.seen[-1][0])  # type: ignore[attr-defined]
    with call(sdk.messages.stream, **kwargs) as stream:
        streamed = call(stream.get_final_message)
    raw = strict(Message, httpx.post(f"{scripted.base_url}/v1/messages", json=kwargs, timeout=30).json())
    for message in (full, streamed, raw):
        assert message.stop_reason == "tool_use"
        (use,) = message.content
        assert use.type == "tool_use" and use.name == "get_weather" and use.input == WEATHER_ARGS
        assert message.usage.output_tokens == script_tokens(demo_tokenizer, script)
    counted = call(sdk.messages.count_tokens, model="claude-x", messages=ask(script),
                   tools=[WEATHER_ANTHROPIC, TIME_ANTHROPIC], tool_choice=choice)
    assert counted.input_tokens == prompt_tokens  # count_tokens counts the opening too


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"}, {"type": "any"}])
def test_anthropic_forced_call_refusals(scripted: ServerHarness, choice: dict[str, Any]) -> None:
    sdk = _anthropic(scripted)
    base = {"model": "claude-x", "max_tokens": 2000, "tools": [WEATHER_ANTHROPIC], "tool_choice": choice}
    with pytest.raises(anthropic.BadRequestError) as err:
        sdk.messages.create(**base, messages=ask("forced_any"), thinking={"type": "enabled", "budget_tokens": 1024})
    assert err.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "Thinking may not be enabled when tool_choice forces tool use."}}
    with pytest.raises(anthropic.BadRequestError) as err:
        sdk.messages.create(**base, messages=[*ask("forced_any"), {"role": "assistant", "content": "Sure:"}])
    assert err.value.body["type"] == "error" and "tool_choice" in err.value.body["error"]["message"]  # type: ignore[index]


def test_anthropic_auto_and_none_unchanged(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    sdk = _anthropic(scripted)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    auto = call(sdk.messages.create, model="claude-x", max_tokens=2000, messages=ask("tool"), tools=[WEATHER_ANTHROPIC],
                tool_choice={"type": "auto"}, thinking=thinking)
    assert seen_prompt(scripted, demo_tokenizer).endswith("<|im_start|>assistant\n")
    assert [b.type for b in auto.content] == ["thinking", "tool_use"] and auto.stop_reason == "tool_use"
    none = call(sdk.messages.create, model="claude-x", max_tokens=2000, messages=ask("tool"), tools=[WEATHER_ANTHROPIC],
                tool_choice={"type": "none"}, thinking=thinking)
    assert "get_weather" not in seen_prompt(scripted, demo_tokenizer)
    assert none.stop_reason == "end_turn" and all(b.type != "tool_use" for b in none.content)


# --------------------------------------------------------------------------- nothing to call

def test_a_forcing_choice_without_a_tool_is_400_on_every_route(scripted: ServerHarness) -> None:
    """`required` / `any` with no function tool (none given, only hosted or server tools) was
    served as `auto` on Responses and Messages; each route now refuses it naming
    `tool_choice`, as OpenAI and Anthropic do (Chat did already, as vLLM)."""
    oa = scripted.openai()
    for extra in ({}, {"tools": [{"type": "web_search"}]}):
        with pytest.raises(openai.BadRequestError) as err:
            oa.responses.create(model="m", input="hi", tool_choice="required", **extra)  # type: ignore[arg-type]
        assert err.value.body["param"] == "tool_choice"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tool_choice="required")
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]
    sdk = _anthropic(scripted)
    for extra in ({}, {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}):
        with pytest.raises(anthropic.BadRequestError) as a_err:
            sdk.messages.create(model="claude-x", max_tokens=50, messages=ask("forced_any"),
                                tool_choice={"type": "any"}, **extra)  # type: ignore[arg-type]
        assert a_err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "tool_choice" in a_err.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.count_tokens(model="claude-x", messages=ask("forced_any"), tool_choice={"type": "any"})
    # auto without tools stays fine everywhere
    assert oa.responses.create(model="m", input=ask("forced_any")[0]["content"], tool_choice="auto").status
    assert sdk.messages.create(model="claude-x", max_tokens=50, messages=ask("forced_any"),
                               tool_choice={"type": "auto"}).stop_reason
