"""Tool calls held to their tools' schemas in MiniMax-M2's format (`minimax_m2`): the demo
model (random weights) served with MiniMax-M2's chat template and a tokenizer that has
MiniMax's block tags, `<minimax:tool_call>` / `</minimax:tool_call>`, as single added
tokens (as MiniMax's own tokenizer has them), so the minimax_m2 parser reads the calls.
Strict tools and forced calls make every call the random model writes valid — checked by
the openai SDK's own parsing into the pydantic model and by `jsonschema_rs` — on Chat and
Anthropic; parallel calls off holds the block to one invoke (read from the raw tokens); a
strict tool whose schema the format can't hold is a 400 naming the tool and the parameter.
Without those single tokens nothing is held: test_minimax_m2_format.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_harness import ServerHarness, add_tokens, demo_with_template
from strict_call_support import MIXED, NOTE, USER, SetLight, check, function, served


SOURCE = (Path(__file__).parent / "fixtures" / "minimax_m2_chat_template.jinja").read_text(encoding="utf-8")
BLOCK_TAGS = ("<minimax:tool_call>", "</minimax:tool_call>")
FIRST_TAG_ID = 151669  # after Qwen3's added tokens, within the demo model's 151936 embedding rows
BLOCK_CLOSE = FIRST_TAG_ID + 1


@pytest.fixture(scope="module")
def minimax(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHarness]:
    """The demo checkpoint with MiniMax-M2's template and block tags (the real engine, CPU)."""
    model_dir = demo_with_template(demo_dir, tmp_path_factory.mktemp("minimax_strict"), SOURCE)
    add_tokens(model_dir, FIRST_TAG_ID, BLOCK_TAGS, special=False)
    yield from served(demo_dir, model_dir)


def test_the_server_reads_minimax_calls(minimax: ServerHarness) -> None:
    assert httpx.get(f"{minimax.base_url}/debug/engine").json()["tool_call_parser"] == "minimax_m2"


@pytest.mark.parametrize("choice, seed", [
    ("required", 5), ("required", 6), ({"type": "function", "function": {"name": "SetLight"}}, 7),
])
def test_parse_helper_reads_every_call(minimax: ServerHarness, choice: Any, seed: int) -> None:
    """Parallel calls off: the random model, free to, would go on writing invokes past max_tokens."""
    out = minimax.openai().chat.completions.parse(
        model="m", messages=USER, tools=[openai.pydantic_function_tool(SetLight), function("note", NOTE, True)],
        tool_choice=choice, max_tokens=300, temperature=1.0, seed=seed, reasoning_effort="none",
        parallel_tool_calls=False)
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and message.tool_calls, message
    for call in message.tool_calls:
        if call.function.name == "SetLight":
            assert isinstance(call.function.parsed_arguments, SetLight)
        check(call.function.name, call.function.arguments)
    if isinstance(choice, dict):
        assert [c.function.name for c in message.tool_calls] == ["SetLight"]


def generated_text(choice: Any) -> str:
    """The choice's raw output, from its tokens' bytes (block tags and all)."""
    return b"".join(bytes(t.bytes) for t in choice.logprobs.content).decode("utf-8", "replace")


@pytest.mark.parametrize("parallel", [False, True])
def test_parallel_calls_off_writes_one_invoke(minimax: ServerHarness, parallel: bool) -> None:
    """The block's closing token is all but banned, so the model would go on with invokes:
    with parallel calls off the grammar leaves it nothing else after the first, so it
    closes the block; with them on, it writes another (the control that shows the ban bites)."""
    out = minimax.openai().chat.completions.create(
        model="m", messages=USER, tools=[function("note", NOTE, True)], tool_choice="required", max_tokens=200,
        temperature=1.0, seed=3, parallel_tool_calls=parallel, logprobs=True, logit_bias={str(BLOCK_CLOSE): -100})
    choice = out.choices[0]
    text = generated_text(choice)
    if parallel:
        assert text.count("</invoke>") >= 2, text
        return
    assert text.count("</invoke>") == 1 and BLOCK_TAGS[1] in text, text
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls or []) == 1
    check("note", choice.message.tool_calls[0].function.arguments)  # type: ignore[index]


def test_a_named_tool_streamed(minimax: ServerHarness) -> None:
    stream = minimax.openai().chat.completions.create(
        model="m", messages=USER, tools=[function("note", NOTE), function("other", MIXED)], max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "note"}}, temperature=1.0, seed=11, stream=True)
    pieces = [d for chunk in stream for c in chunk.choices for d in c.delta.tool_calls or []]
    assert pieces and pieces[0].function.name == "note" and {p.index for p in pieces} == {0}
    check("note", "".join(p.function.arguments or "" for p in pieces))


def test_anthropic_any_without_parallel_use(minimax: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=minimax.base_url, api_key="unused", max_retries=0, timeout=60)
    message = client.messages.create(
        model="m", max_tokens=200, messages=USER, thinking={"type": "disabled"},  # type: ignore[arg-type]
        tools=[{"name": "note", "input_schema": NOTE, "strict": True}],  # type: ignore[list-item]
        tool_choice={"type": "any", "disable_parallel_tool_use": True})
    uses = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and len(uses) == 1
    check("note", uses[0].input)  # type: ignore[arg-type]


def test_a_strict_tool_the_format_cannot_hold_is_a_400(minimax: ServerHarness) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        minimax.openai().chat.completions.create(model="m", messages=USER, max_tokens=5,
                                                 tools=[function("odd", MIXED, True)])
    text = str(info.value)
    assert info.value.status_code == 400 and "'odd'" in text and "properties.a" in text and "minimax_m2" in text
    with pytest.raises(openai.BadRequestError, match="'say"):  # a quote can't stand in MiniMax's name="…"
        minimax.openai().chat.completions.create(model="m", messages=USER, max_tokens=5,
                                                 tools=[function('say"hi', NOTE, True)])
