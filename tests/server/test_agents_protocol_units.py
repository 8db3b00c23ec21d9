"""Pure translations of the Responses input items and Anthropic blocks into chat messages."""

from __future__ import annotations

from typing import Any

import pytest

from edgemoe.server.anthropic_protocol import (
    CreateMessageRequest,
    strip_billing_header,
    system_text,
)
from edgemoe.server.errors import APIError
from edgemoe.server.responses_protocol import ResponsesRequest


def responses_messages(items: list[dict[str, Any]], **extra: Any) -> list[dict[str, Any]]:
    return ResponsesRequest(input=items, **extra).chat_messages()


def test_codex_history_becomes_chat() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
         "content": [{"type": "reasoning_text", "text": "long thought"}], "encrypted_content": None},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": '{"cmd": "pwd"}'},
        {"type": "local_shell_call", "id": "x", "action": {}},  # a hosted-tool record: skipped
        {"type": "function_call_output", "call_id": "c1", "output": "file.txt"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "/src"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "only a summary"}]},
        {"type": "function_call", "call_id": "c3", "name": "shell", "arguments": "{}"},
    ]
    assert responses_messages(items, instructions="sys") == [
        {"role": "system", "content": "sys"},
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "long thought", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}},
            {"id": "c2", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "pwd"}'}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "file.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "/src"},
        {"role": "assistant", "content": "", "reasoning_content": "only a summary", "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]},
    ]


def test_responses_tools_and_choice() -> None:
    req = ResponsesRequest(input="x", tools=[
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True},
        {"type": "custom", "name": "apply_patch"}, {"type": "web_search"}, {"type": "local_shell"},
    ], tool_choice={"type": "function", "name": "f"})
    assert req.chat_tools() == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}]
    assert req.tool_choice_mode() == ("required", "f")
    assert ResponsesRequest(input="x", tool_choice={"type": "web_search"}).tool_choice_mode() == ("auto", None)
    assert ResponsesRequest(input="x", tool_choice={"type": "allowed_tools", "mode": "required", "tools": []}
                            ).tool_choice_mode() == ("required", None)


def anthropic_request(messages: list[dict[str, Any]], **extra: Any) -> CreateMessageRequest:
    return CreateMessageRequest(model="m", max_tokens=10, messages=messages, **extra)


def test_anthropic_blocks_become_chat() -> None:
    req = anthropic_request([
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"}, {"type": "redacted_thinking", "data": "zz"},
            {"type": "text", "text": "Calling."}, {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "before"},
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"type": "tool_result", "tool_use_id": "t2", "is_error": True},
            {"type": "text", "text": "after"}]},
    ], system=[{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}])
    messages, prefill = req.conversation()
    assert prefill == ""
    assert messages == [
        {"role": "system", "content": "S1\n\nS2"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Calling.", "reasoning_content": "hmm", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}]},
        {"role": "user", "content": "before"},
        {"role": "tool", "tool_call_id": "t1", "content": "a\nb"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: "},
        {"role": "user", "content": "after"},
    ]


def test_anthropic_tools_choice_and_thinking() -> None:
    req = anthropic_request([{"role": "user", "content": "x"}], tools=[
        {"name": "Read", "input_schema": {"type": "object", "properties": {"p": {"type": "string"}}}},
        {"type": "web_search_20250305", "name": "web_search"},
    ], tool_choice={"type": "any", "disable_parallel_tool_use": True}, thinking={"type": "adaptive"})
    assert req.chat_tools() == [{"type": "function", "function": {
        "name": "Read", "parameters": {"type": "object", "properties": {"p": {"type": "string"}}}}}]
    assert req.tool_mode() == ("required", None, False)
    assert req.thinking_switch() is True
    assert anthropic_request([{"role": "user", "content": "x"}]).thinking_switch() is None


@pytest.mark.parametrize(("text", "expected"), [
    ("x-anthropic-billing-header: cc_version=1; cch=1;", ""),
    ("keep\nx-anthropic-billing-header: cc_version=1;\nalso keep", "keep\nalso keep"),
    ("mentions x-anthropic-billing-header inline", "mentions x-anthropic-billing-header inline"),
])
def test_billing_header(text: str, expected: str) -> None:
    assert strip_billing_header(text) == expected


def test_system_without_billing_block() -> None:
    system = [{"type": "text", "text": "x-anthropic-billing-header: a;"}, {"type": "text", "text": "Hello"}]
    assert system_text(system) == "Hello"


def test_image_is_refused() -> None:
    req = anthropic_request([{"role": "user", "content": [{"type": "image", "source": {}}]}])
    with pytest.raises(APIError) as err:
        req.conversation()
    assert err.value.status == 400 and err.value.code == "unsupported_content"
