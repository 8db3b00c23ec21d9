"""GLM-4.5's chat format on the server: the chat template (`assets/glm_template.py`), its
round trip through the glm45 parser, the forced opening, and a GLM server end to end
(scripted model output, the real openai / anthropic SDKs).

Independent checks: the expected prompts below are written out from the published
format (zai-org's GLM-4.5 template, see glm_template.py), transformers' own renderer runs
the template too, and the parser reads back what the template writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from server_harness import ServerHarness, demo_with_template, scripted_server, streamed_completion
from server_scripts import EDIT_ARGUMENTS, EDIT_TOOL, SCRIPTS, TIME_TOOL, WEATHER_TOOL, ask, message_calls, tool_call

from edgemoe.assets.glm_template import GLM4_5_CHAT_TEMPLATE
from edgemoe.server.forced_call import call_opening
from edgemoe.server.parsers import ResponseParser, ThinkReasoningParser, get_tool_parser, prompt_opens_reasoning
from edgemoe.server.templates import ChatTemplate
from edgemoe.tokenizer import TokenizerBundle

TEMPLATE = ChatTemplate(GLM4_5_CHAT_TEMPLATE)
TOOLS = [WEATHER_TOOL, TIME_TOOL]
TOOLS_BLOCK = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in TOOLS)
    + "</tools>\n\nFor each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "Two tools.",
     "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 3}),
                    tool_call("get_time", '{"zone": "Europe/Paris"}', "c2")]},  # a JSON string, as clients send
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
    {"role": "assistant", "content": "Sunny, noon.", "reasoning_content": "Both answered."},
    {"role": "user", "content": "Thanks!"},
]
HISTORY = (
    "<|system|>\nBe brief.<|user|>\nWeather and time in Paris?"
    # reasoning before the last user turn is dropped: an empty think block
    "<|assistant|>\n<think></think>\nChecking."
    "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    "\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>Europe/Paris</arg_value>\n</tool_call>"
    "<|observation|>\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"
    "<|assistant|>\n<think></think>\nSunny, noon.<|user|>\nThanks!"
)


def test_conversation_with_tools_calls_and_results() -> None:
    got = TEMPLATE.render(CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    assert got == "[gMASK]<sop>" + TOOLS_BLOCK + HISTORY + "<|assistant|>"
    assert TEMPLATE.render(CONVERSATION, add_generation_prompt=False) == "[gMASK]<sop>" + HISTORY
    # It never names "developer": such a turn renders as a system one, as with zai-org's template.
    developer = TEMPLATE.render([{"role": "developer", "content": "Be brief."}, *CONVERSATION[1:]])
    assert developer == TEMPLATE.render(CONVERSATION)


def test_thinking_off_and_reasoning_after_the_last_user_turn() -> None:
    off = TEMPLATE.render(CONVERSATION, enable_thinking=False)
    assert off.endswith("<|user|>\nThanks!/nothink<|assistant|>\n<think></think>")
    assert "Paris?/nothink<|assistant|>" in off
    turn = {"role": "assistant", "content": "<think>\nThinking it over.\n</think>\n\nYou're welcome."}
    follow = TEMPLATE.render([*CONVERSATION, turn], add_generation_prompt=False)
    assert follow.endswith("Thanks!<|assistant|>\n<think>Thinking it over.</think>\nYou're welcome.")
    nothink = TEMPLATE.render([{"role": "user", "content": "Hi /nothink"}], enable_thinking=False)
    assert nothink == "[gMASK]<sop><|user|>\nHi /nothink<|assistant|>\n<think></think>"


def test_transformers_renders_it_the_same() -> None:
    render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template
    from edgemoe.server.templates import normalize_messages

    for thinking in ({}, {"enable_thinking": False}):
        ours = TEMPLATE.render(CONVERSATION, tools=TOOLS, **thinking)
        (theirs,), _ = render([normalize_messages(CONVERSATION)], chat_template=GLM4_5_CHAT_TEMPLATE, tools=TOOLS,
                              add_generation_prompt=True, **thinking)
        assert ours == theirs


@pytest.mark.parametrize("arguments", [
    *EDIT_ARGUMENTS, {"text": "def f():\n    return '</arg_value>'  # <tool_call>\n", "path": " spaced "}])
def test_template_call_parses_back(arguments: dict[str, Any]) -> None:
    """What the template writes for an assistant call, read as model output after the
    generation prompt, is that call again."""
    messages = [{"role": "user", "content": "Edit it."}]
    turn = {"role": "assistant", "content": "On it.", "tool_calls": [
        tool_call("edit", arguments), tool_call("edit", json.dumps({"path": "b.py"}), "c2")]}
    prompt = TEMPLATE.render(messages, tools=[EDIT_TOOL])
    whole = TEMPLATE.render([*messages, turn], tools=[EDIT_TOOL], add_generation_prompt=False)
    assert whole.startswith(prompt)
    parser = ResponseParser(ThinkReasoningParser(prompt_opens_reasoning(prompt)),
                            get_tool_parser("glm45")([EDIT_TOOL]))
    got = parser.parse_complete(whole[len(prompt):])
    assert (got.content, got.reasoning) == ("On it.", "")
    calls = [(c.name, json.loads(c.arguments)) for c in got.tool_calls]
    assert calls == [("edit", arguments), ("edit", {"path": "b.py"})]


@pytest.mark.parametrize("name", ["get_weather", "Read"])
def test_openings_are_what_the_template_writes(name: str, demo_tokenizer: TokenizerBundle) -> None:
    """Prompt + forced opening is where the template's own rendering of the call stands,
    in text and in tokens (the demo's Qwen3 tokenizer stands in for GLM's)."""
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Weather?"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [tool_call(name, {"city": "Paris"})]}
    whole = TEMPLATE.render([*messages, turn], tools=tools, add_generation_prompt=False, enable_thinking=False)
    prompt = TEMPLATE.render(messages, tools=tools, enable_thinking=False)
    for named in (name, None):
        opening = call_opening("glm45", named, GLM4_5_CHAT_TEMPLATE)
        assert opening.startswith("\n<tool_call>") and whole.startswith(prompt + opening)
        ids = demo_tokenizer.encode(prompt + opening, add_special_tokens=False)
        assert demo_tokenizer.encode(whole, add_special_tokens=False)[: len(ids)] == ids


# --------------------------------------------------------------------------- end to end

WEATHER_ARGS = {"city": "Paris", "days": 3}
GLM_REST = ("<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")
GLM_SCRIPTS = {
    **SCRIPTS,
    "glm_tool": f"\n<think>I should call the weather tool.</think>\n<tool_call>get_weather\n{GLM_REST}",
    "glm_rest": GLM_REST,  # after the forced opening "\n<tool_call>get_weather\n"
    "glm_any": f"get_weather\n{GLM_REST}",  # after "\n<tool_call>"
}


@pytest.fixture(scope="module")
def glm(demo_dir: Path, demo_tokenizer: TokenizerBundle, tmp_path_factory: pytest.TempPathFactory,
        ) -> Iterator[ServerHarness]:
    """The demo tokenizer with GLM-4.5's template: the template picks the glm45 parser."""
    model_dir = demo_with_template(demo_dir, tmp_path_factory.mktemp("glm45"), GLM4_5_CHAT_TEMPLATE)
    harness = scripted_server(demo_tokenizer, GLM_SCRIPTS, model_dir)
    yield harness
    harness.stop()


def test_openai_sdk_gets_the_call(glm: ServerHarness) -> None:
    client = glm.openai()
    full = client.chat.completions.create(model="m", messages=ask("glm_tool"), tools=TOOLS)
    streamed = streamed_completion(client, model="m", messages=ask("glm_tool"), tools=TOOLS)
    for out in (full, streamed):
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        assert message_calls(choice.message) == [("get_weather", WEATHER_ARGS)]
        assert (choice.message.model_extra or {})["reasoning_content"] == "I should call the weather tool."


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_forced_and_strict_calls(glm: ServerHarness, demo_tokenizer: TokenizerBundle, choice: Any) -> None:
    """A named tool_choice ends the prompt with GLM's opening; `required` and a strict tool
    are served as for a format the server doesn't constrain (no grammar, never a 500)."""
    strict_weather = {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}}
    named = isinstance(choice, dict)
    out = glm.openai().chat.completions.create(model="m", messages=ask("glm_rest" if named else "glm_any"),
                                               tools=[strict_weather, TIME_TOOL], tool_choice=choice)
    prompt = demo_tokenizer.decode(glm.engine.seen[-1][0])  # type: ignore[attr-defined]
    opening = "\n<tool_call>get_weather\n" if named else "\n<tool_call>"
    assert prompt.endswith("/nothink<|assistant|>\n<think></think>" + opening)
    assert out.choices[0].finish_reason == "tool_calls" and not out.choices[0].message.content
    assert message_calls(out.choices[0].message) == [("get_weather", WEATHER_ARGS)]


def test_anthropic_sdk_gets_tool_use(glm: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=glm.base_url, api_key="unused")
    tools = [{"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}]
    message = client.messages.create(model="m", max_tokens=200, tools=tools,  # type: ignore[arg-type]
                                     messages=ask("glm_tool"))
    assert message.stop_reason == "tool_use"
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in uses] == [("get_weather", WEATHER_ARGS)]
