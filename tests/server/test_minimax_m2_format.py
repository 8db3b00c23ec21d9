"""MiniMax-M2's chat format on the server: the format's selection, MiniMax-M2's chat
template (tests/server/fixtures/minimax_m2_chat_template.jinja) with tools, calls, results
and interleaved thinking, its round trip through the minimax_m2 parser, the forced
openings, and a MiniMax server end to end (scripted model output, the real openai /
anthropic SDKs). The parser itself: tests/server/parsers/test_minimax_m2.py.

Independent checks: the expected system prompt is the one MiniMax's tool-calling guide
shows, transformers' own renderer runs the template too, and the parser reads back what
the template writes. The demo model's Qwen3 tokenizer stands in for MiniMax's (not
available offline): its byte-level BPE pre-tokenizes as GPT-style tokenizers do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from server_harness import ServerHarness, demo_with_template, last_request, scripted_server, streamed_completion
from server_scripts import EDIT_ARGUMENTS, EDIT_TOOL, SCRIPTS, TIME_TOOL, WEATHER_TOOL, ask, message_calls, tool_call

from edgemoe.server.forced_call import PrimedParser, call_opening
from edgemoe.server.parsers import (
    ResponseParser,
    ThinkReasoningParser,
    accumulate,
    get_tool_parser,
    parser_for_chat_template,
    pick_tool_format,
    prompt_opens_reasoning,
)
from edgemoe.server.templates import ChatTemplate
from edgemoe.tokenizer import TokenizerBundle

SOURCE = (Path(__file__).parent / "fixtures" / "minimax_m2_chat_template.jinja").read_text(encoding="utf-8")
TEMPLATE = ChatTemplate(SOURCE)
EOT = "[e~[\n"  # the end of a turn; `[e~[` is MiniMax's EOS
TOOLS = [WEATHER_TOOL, TIME_TOOL]
WEATHER = {"city": "Paris", "days": 3}


def test_format_selection() -> None:
    """The template picks minimax_m2 whatever the family; the family does without a template."""
    assert parser_for_chat_template(SOURCE) == "minimax_m2"
    assert pick_tool_format(None, SOURCE, "qwen3_moe") == "minimax_m2"
    assert pick_tool_format(None, "", "minimax_m2") == "minimax_m2"
    assert pick_tool_format("hermes", SOURCE, "minimax_m2") == "hermes"


# MiniMax-AI/MiniMax-M2's docs/tool_calling_guide.md, "Internal Processing Format": the system
# turn with one tool, a user turn and the generation prompt. The guide's listing leaves out
# the `</minimax:tool_call>` line every published copy of the template writes.
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search_web", "description": "Search function.", "parameters": {
        "type": "object", "properties": {
            "query_list": {"type": "array", "items": {"type": "string"},
                           "description": "Keywords for search, list should contain 1 element."},
            "query_tag": {"type": "array", "items": {"type": "string"}, "description": "Category of query"}},
        "required": ["query_list", "query_tag"]}}}
GUIDE_PROMPT = """]~!b[]~b]system
You are a helpful assistant.

# Tools
You may call one or more tools to assist with the user query.
Here are the tools available in JSONSchema format:

<tools>
<tool>{"name": "search_web", "description": "Search function.", "parameters": {"type": "object", "properties": {"query_list": {"type": "array", "items": {"type": "string"}, "description": "Keywords for search, list should contain 1 element."}, "query_tag": {"type": "array", "items": {"type": "string"}, "description": "Category of query"}}, "required": ["query_list", "query_tag"]}}</tool>
</tools>

When making tool calls, use XML format to invoke tools and pass parameters:

<minimax:tool_call>
<invoke name="tool-name-1">
<parameter name="param-key-1">param-value-1</parameter>
<parameter name="param-key-2">param-value-2</parameter>
...
</invoke>
</minimax:tool_call>[e~[
]~b]user
When were the latest announcements from OpenAI and Gemini?[e~[
]~b]ai
<think>
"""  # noqa: E501


def test_system_prompt_is_the_guides() -> None:
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "When were the latest announcements from OpenAI and Gemini?"}]
    assert TEMPLATE.render(messages, tools=[SEARCH_TOOL]) == GUIDE_PROMPT
    assert TEMPLATE.render(messages[1:], tools=[SEARCH_TOOL]) == GUIDE_PROMPT  # the default identity


CALLS_TURN = {"role": "assistant", "content": "Checking.", "reasoning_content": "Two tools.",
              "tool_calls": [tool_call("get_weather", WEATHER),
                             tool_call("get_time", '{"zone": "Europe/Paris"}', "c2")]}  # JSON text, as clients send
RESULTS = [{"role": "tool", "tool_call_id": "c1", "content": "sunny"},
           {"role": "tool", "tool_call_id": "c2", "content": "12:00"}]
CALLS_TEXT = ('\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
              '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n'
              '<parameter name="zone">Europe/Paris</parameter>\n</invoke>\n</minimax:tool_call>')
RESULTS_TEXT = "]~b]tool\n<response>sunny</response>\n<response>12:00</response>" + EOT


def test_interleaved_thinking_in_an_agent_loop() -> None:
    """Mid-loop (no user turn after the calls) the call turn keeps its reasoning; once a user
    turn follows, earlier reasoning is dropped. Results are one tool turn of <response> blocks."""
    messages = [{"role": "user", "content": "Weather and time in Paris?"}, CALLS_TURN, *RESULTS]
    head = "]~!b[]~b]system\nYou are a helpful assistant." + EOT + "]~b]user\nWeather and time in Paris?" + EOT
    loop = TEMPLATE.render(messages)
    assert loop == (head + "]~b]ai\n<think>\nTwo tools.\n</think>\n\nChecking." + CALLS_TEXT + EOT + RESULTS_TEXT
                    + "]~b]ai\n<think>\n")
    after = TEMPLATE.render([*messages, {"role": "assistant", "content": "Sunny, noon.", "reasoning_content": "Done."},
                             {"role": "user", "content": "Thanks!"}])
    assert after == (head + "]~b]ai\nChecking." + CALLS_TEXT + EOT + RESULTS_TEXT + "]~b]ai\nSunny, noon." + EOT
                     + "]~b]user\nThanks!" + EOT + "]~b]ai\n<think>\n")


def test_transformers_renders_it_the_same() -> None:
    render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template
    from edgemoe.server.templates import normalize_messages

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}, CALLS_TURN,
                *RESULTS]
    (theirs,), _ = render([normalize_messages(messages)], chat_template=SOURCE, tools=TOOLS,
                          add_generation_prompt=True)
    assert TEMPLATE.render(messages, tools=TOOLS) == theirs


@pytest.mark.parametrize("arguments", [
    *EDIT_ARGUMENTS,
    {"text": "    if a < b:\n        return '</parameter>'  # <minimax:tool_call>\n", "path": " spaced "}])
def test_template_call_parses_back(arguments: dict[str, Any]) -> None:
    """What the template writes for an assistant turn after the last user turn (reasoning,
    content, two calls), read as model output after the generation prompt, is that turn again."""
    messages = [{"role": "user", "content": "Edit it."}]
    turn = {"role": "assistant", "content": "On it.", "reasoning_content": "Two edits.", "tool_calls": [
        tool_call("edit", arguments), tool_call("edit", json.dumps({"path": "b.py"}), "c2")]}
    prompt = TEMPLATE.render(messages, tools=[EDIT_TOOL])
    whole = TEMPLATE.render([*messages, turn], tools=[EDIT_TOOL], add_generation_prompt=False)
    assert whole.startswith(prompt) and whole.endswith(EOT) and prompt_opens_reasoning(prompt)
    parser = ResponseParser(ThinkReasoningParser(prompt_opens_reasoning(prompt)),
                            get_tool_parser("minimax_m2")([EDIT_TOOL]))
    got = parser.parse_complete(whole[len(prompt) : -len(EOT)])
    assert (got.content, got.reasoning) == ("On it.", "Two edits.")
    calls = [(c.name, json.loads(c.arguments)) for c in got.tool_calls]
    assert calls == [("edit", arguments), ("edit", {"path": "b.py"})]


@pytest.mark.parametrize("name", ["get_weather", "Read", "mcp__fs__read_file"])
def test_openings_end_on_token_boundaries(name: str, demo_tokenizer: TokenizerBundle) -> None:
    """The forced turn (prompt, the server's closing of the think block the template leaves
    open, the opening) is where a call turn written as the template writes calls stands, in
    text and in tokens; the parser primed with the opening reads the model's rest."""
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Weather?"}]
    prompt = TEMPLATE.render(messages, tools=tools, enable_thinking=False) + "</think>\n\n"
    history = TEMPLATE.render([*messages, {"role": "assistant", "content": "", "tool_calls": [
        tool_call(name, {"city": "Paris"})]}], tools=tools, add_generation_prompt=False)
    call = history[history.rindex("<minimax:tool_call>") : -len(EOT)]
    for named in (name, None):
        opening = call_opening("minimax_m2", named)
        assert call.startswith(opening)
        ids = demo_tokenizer.encode(prompt + opening, add_special_tokens=False)
        assert demo_tokenizer.encode(prompt + call, add_special_tokens=False)[: len(ids)] == ids
        primed = PrimedParser(get_tool_parser("minimax_m2")(tools), opening)
        got = accumulate([primed.opening, primed.feed(call[len(opening):]), primed.finish()])
        assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [(name, {"city": "Paris"})]


# --------------------------------------------------------------------------- end to end

WEATHER_INVOKE = ('<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                  '<parameter name="days">3</parameter>\n</invoke>\n')
TIME_INVOKE = '<invoke name="get_time">\n<parameter name="zone">Europe/Paris</parameter>\n</invoke>\n'
MM_SCRIPTS = {
    **SCRIPTS,
    # the prompt opened the think block (`]~b]ai\n<think>\n`)
    "mm_tool": "I should call the tools.\n</think>\n\nChecking.\n<minimax:tool_call>\n" + WEATHER_INVOKE
               + TIME_INVOKE + "</minimax:tool_call>",
    "mm_text": "Plain.\n</think>\n\nUse a <minimax:tool_call> block, <invoke name=x>.",
    "mm_rest": '<parameter name="city">Paris</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n'
               "</minimax:tool_call>",  # after the named opening '…<invoke name="get_weather">\n'
    "mm_any": 'get_weather">\n<parameter name="city">Paris</parameter>\n<parameter name="days">3</parameter>\n'
              "</invoke>\n</minimax:tool_call>",  # after '<minimax:tool_call>\n<invoke name="'
}
BOTH_CALLS = [("get_weather", WEATHER), ("get_time", {"zone": "Europe/Paris"})]


@pytest.fixture(scope="module")
def minimax(demo_dir: Path, demo_tokenizer: TokenizerBundle, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[ServerHarness]:
    """The demo tokenizer with MiniMax-M2's template, the family minimax_m2."""
    model_dir = demo_with_template(demo_dir, tmp_path_factory.mktemp("minimax_m2"), SOURCE)
    harness = scripted_server(demo_tokenizer, MM_SCRIPTS, model_dir, "minimax_m2")
    yield harness
    harness.stop()


def test_server_picks_the_format(minimax: ServerHarness) -> None:
    info = httpx.get(f"{minimax.base_url}/debug/engine").json()
    assert info["tool_call_parser"] == "minimax_m2" and info["model_type"] == "minimax_m2"


def test_openai_sdk_gets_reasoning_and_calls(minimax: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    client = minimax.openai()
    full = client.chat.completions.create(model="m", messages=ask("mm_tool"), tools=TOOLS)
    prompt, params = last_request(minimax, demo_tokenizer)
    assert prompt.endswith("]~b]ai\n<think>\n") and params.skip_special_tokens is False
    streamed = streamed_completion(client, model="m", messages=ask("mm_tool"), tools=TOOLS)
    for out in (full, streamed):
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
        assert message_calls(choice.message) == BOTH_CALLS
        assert (choice.message.model_extra or {})["reasoning_content"] == "I should call the tools."


def test_stream_deltas(minimax: ServerHarness) -> None:
    """As OpenAI streams calls: a first delta per call with id, type, name and "" arguments,
    argument pieces after it keyed by index; no markup in any content delta."""
    chunks = list(minimax.openai().chat.completions.create(model="m", messages=ask("mm_tool"), tools=TOOLS,
                                                           stream=True))
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(content) == "Checking." and not any("<" in piece for piece in content)
    calls: dict[int, list[Any]] = {}
    for chunk in chunks:
        for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            calls.setdefault(piece.index, []).append(piece)
    assert sorted(calls) == [0, 1]
    for index, (name, args) in enumerate(BOTH_CALLS):
        first, *rest = calls[index]
        assert first.id and first.type == "function" and first.function.name == name
        assert first.function.arguments == "" and all(p.id is None and p.function.name is None for p in rest)
        assert json.loads("".join(p.function.arguments for p in rest)) == args
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_markup_in_prose_stays_text(minimax: ServerHarness) -> None:
    out = minimax.openai().chat.completions.create(model="m", messages=ask("mm_text"), tools=TOOLS)
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == "Use a <minimax:tool_call> block, <invoke name=x>."


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_forced_calls(minimax: ServerHarness, demo_tokenizer: TokenizerBundle, choice: Any) -> None:
    """The forced turn closes the think block MiniMax's template leaves open (it ignores
    enable_thinking), then opens the call as the template writes one; nothing else is
    constrained (the demo tokenizer has no single `<minimax:tool_call>` token:
    test_strict_minimax_calls.py holds calls where it has)."""
    named = isinstance(choice, dict)
    for stream in (False, True):
        out = minimax.openai().chat.completions.create(model="m", messages=ask("mm_rest" if named else "mm_any"),
                                                       tools=TOOLS, tool_choice=choice, stream=stream)
        prompt, params = last_request(minimax, demo_tokenizer)
        opening = call_opening("minimax_m2", "get_weather" if named else None)
        assert prompt.endswith("]~b]ai\n<think>\n</think>\n\n" + opening) and params.structured is None
        if stream:
            chunks = list(out)  # type: ignore[arg-type]
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
            pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
            assert pieces[0].function.name == "get_weather"
            assert json.loads("".join(p.function.arguments or "" for p in pieces)) == WEATHER
        else:
            message = out.choices[0].message  # type: ignore[union-attr]
            assert out.choices[0].finish_reason == "tool_calls" and not message.content  # type: ignore[union-attr]
            assert message_calls(message) == [("get_weather", WEATHER)]


def test_without_single_block_tokens_nothing_is_held(minimax: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    """A tokenizer without `<minimax:tool_call>` / `</minimax:tool_call>` as single tokens
    (the demo's): a strict tool, even one the format could not hold, is served
    unconstrained, with no 400 (the grammar needs the tags as tokens)."""
    odd = {"type": "function", "function": {"name": "odd", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": ["string", "integer"]}}}}}
    out = minimax.openai().chat.completions.create(model="m", messages=ask("mm_tool"), tools=[*TOOLS, odd])
    _, params = last_request(minimax, demo_tokenizer)
    assert params.structured is None and out.choices[0].finish_reason == "tool_calls"


ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]


def test_anthropic_sdk_gets_tool_use(minimax: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=minimax.base_url, api_key="unused")
    message = client.messages.create(model="m", max_tokens=300, tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
                                     messages=ask("mm_tool"))
    with client.messages.stream(model="m", max_tokens=300, tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
                                messages=ask("mm_tool")) as stream:
        streamed = stream.get_final_message()
    for out in (message, streamed):
        assert out.stop_reason == "tool_use"
        assert [b.text for b in out.content if b.type == "text"] == ["Checking."]
        assert [(b.name, b.input) for b in out.content if b.type == "tool_use"] == BOTH_CALLS


def test_anthropic_history_renders_calls_and_results(minimax: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    """Claude Code's next turn: its tool_use blocks and tool_result blocks reach the template
    as the calls and results MiniMax's format writes."""
    client = anthropic.Anthropic(base_url=minimax.base_url, api_key="unused")
    history: list[Any] = [
        {"role": "user", "content": "Weather and time in Paris? [[mm_tool]]"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": WEATHER},
            {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {"zone": "Europe/Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "12:00"}]}]},
    ]
    client.messages.create(model="m", max_tokens=300, tools=ANTHROPIC_TOOLS, messages=history)  # type: ignore[arg-type]
    prompt, _ = last_request(minimax, demo_tokenizer)
    assert prompt.endswith("]~b]ai\nChecking." + CALLS_TEXT + EOT + RESULTS_TEXT + "]~b]ai\n<think>\n")
