"""QWEN3_CHAT_TEMPLATE rendered by transformers' own chat-template machinery, against hand-written text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgemoe.testing import QWEN3_CHAT_TEMPLATE, qwen3_tokenizer_json

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TOOLS_SYSTEM = (
    "<|im_start|>system\nYou are terse.\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Get weather", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
# A tool round trip: list-of-parts user content, one dict and one string argument, two results.
TOOL_TURNS: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need a tool.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
        ],
    },
    {"role": "tool", "content": "18C"},
    {"role": "tool", "content": "20C"},
    {"role": "assistant", "content": "Paris 18C, Lyon 20C.", "reasoning_content": "Summarise."},
]
TOOL_TURNS_TEXT = (
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n{think1}<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n20C\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n{think2}Paris 18C, Lyon 20C.<|im_end|>\n"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # Only the tokenizer files: building a model here would be wasted work.
    from edgemoe.testing.checkpoint import write_tokenizer_files

    root = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(root)
    return transformers.AutoTokenizer.from_pretrained(root)


def _tool_turns(think1: str, think2: str) -> str:
    return TOOL_TURNS_TEXT.replace("{think1}", think1).replace("{think2}", think2)


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_files_carry_the_template(checkpoints: dict[str, Path]) -> None:
    ckpt = checkpoints["olmoe"]
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    assert config["chat_template"] == QWEN3_CHAT_TEMPLATE
    assert (ckpt / "chat_template.jinja").read_text() == QWEN3_CHAT_TEMPLATE
    assert (config["eos_token"], config["pad_token"], config["add_bos_token"]) == ("<|im_end|>", "<|endoftext|>", False)
    assert (ckpt / "tokenizer.json").read_bytes() == qwen3_tokenizer_json().read_bytes()


def test_plain_chat_and_ids(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]
    text = _render(tokenizer, messages, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages[1:], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(ids) == [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
    assert tokenizer.eos_token_id == 151645 and tokenizer.pad_token_id == 151643 and tokenizer.bos_token is None


def test_tool_round_trip_after_last_query_keeps_reasoning(tokenizer: Any) -> None:
    text = _render(tokenizer, TOOL_TURNS, tools=TOOLS)
    body = _tool_turns(think1="<think>\nNeed a tool.\n</think>\n\n", think2="<think>\nSummarise.\n</think>\n\n")
    assert text == TOOLS_SYSTEM + body


def test_new_query_drops_old_reasoning_and_disables_thinking(tokenizer: Any) -> None:
    messages = TOOL_TURNS + [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Thanks"}]
    text = _render(tokenizer, messages, tools=TOOLS, add_generation_prompt=True, enable_thinking=False)
    expected = (
        TOOLS_SYSTEM
        + _tool_turns(think1="", think2="")
        + "<|im_start|>developer\nBe brief.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n"
        + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert text == expected


def test_inline_think_is_split_and_thinking_on_by_default(tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
    ]
    text = _render(tokenizer, messages, add_generation_prompt=True)
    assert text == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_unknown_role_is_an_error(tokenizer: Any) -> None:
    with pytest.raises(Exception, match="Unexpected message role"):
        _render(tokenizer, [{"role": "narrator", "content": "Once"}])
