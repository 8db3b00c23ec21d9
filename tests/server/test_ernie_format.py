"""ERNIE-4.5 Thinking's answer tags on a served model: an `ernie4_5_moe` server (scripted model
output, the demo's Qwen3 template and tokenizer) gives the real openai SDK the answer without
`<response>` / `</response>`, streamed and not, cut off by max_tokens, and beside a hermes call.
The filter itself: tests/server/parsers/test_ernie45.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_harness import ScriptedLLM, ServerHarness, scripted_server, streamed_completion
from server_scripts import WEATHER_TOOL, ask, message_calls

from edgemoe.tokenizer import TokenizerBundle

SCRIPTS = {
    "ernie_answer": "<think>\nAdd them.\n</think>\n\n<response>\nIt is 4.\n</response>\n",
    "ernie_plain": "<think>\nAdd them.\n</think>\nIt is 4.",
    "ernie_long": "<think>\nx\n</think>\n\n<response>\none two three four five six seven eight nine ten\n</response>\n",
    "ernie_call": '<think>\nCall it.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n',
}


@pytest.fixture(scope="module")
def ernie(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = scripted_server(demo_tokenizer, SCRIPTS, demo_dir, "ernie4_5_moe")
    yield harness
    harness.stop()


@pytest.mark.parametrize("script", ["ernie_answer", "ernie_plain"])
def test_answer_without_tags(ernie: ServerHarness, script: str) -> None:
    client = ernie.openai()
    full = client.chat.completions.create(model="m", messages=ask(script))
    streamed = streamed_completion(client, model="m", messages=ask(script))
    for out in (full, streamed):
        message = out.choices[0].message
        assert message.content == "It is 4."
        assert (message.model_extra or {})["reasoning_content"] == "Add them."


def test_cut_off_answer_has_no_tag(ernie: ServerHarness) -> None:
    client = ernie.openai()
    full = client.chat.completions.create(model="m", messages=ask("ernie_long"), max_tokens=14)
    chunks = list(client.chat.completions.create(model="m", messages=ask("ernie_long"), max_tokens=14, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    content = full.choices[0].message.content
    assert full.choices[0].finish_reason == "length" == chunks[-1].choices[0].finish_reason
    assert content == streamed and content.startswith("one") and "<" not in content


def test_call_beside_the_filter(ernie: ServerHarness) -> None:
    client = ernie.openai()
    full = client.chat.completions.create(model="m", messages=ask("ernie_call"), tools=[WEATHER_TOOL])
    streamed = streamed_completion(client, model="m", messages=ask("ernie_call"), tools=[WEATHER_TOOL])
    for out in (full, streamed):
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        assert message_calls(choice.message) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("model_type, unwrapped", [("ernie4_5_moe", True), ("qwen3_moe", False)])
def test_edgemoe_chat_unwraps_the_answer_as_the_server_does(demo_tokenizer: TokenizerBundle, model_type: str,
                                                            unwrapped: bool) -> None:
    """`edgemoe chat --model` (the in-process backend) chooses the answer-tag filter by the
    server's rule: an ERNIE model's answer without its tags; another family's text as written."""
    from edgemoe.chat_backends import Answer, LocalBackend, Sampling

    llm = ScriptedLLM(demo_tokenizer, model_type, SCRIPTS["ernie_answer"])
    backend = LocalBackend(llm, Sampling(max_tokens=64, temperature=None, thinking=True))
    answer = Answer()
    for piece in backend.stream([{"role": "user", "content": "2 + 2?"}], answer):
        answer.add(piece)
    assert answer.reasoning.strip() == "Add them."
    assert answer.content == ("It is 4." if unwrapped else "<response>\nIt is 4.\n</response>\n")
