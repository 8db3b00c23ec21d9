"""What the scripted engine plays back, and the tools the tests declare.

(A module of its own, not conftest.py: test files import these names, and a module
called ``conftest`` is ambiguous once several test folders are on ``sys.path``.)
"""

from __future__ import annotations

import json
from typing import Any

WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
TIME_CALL = '{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}'
WEATHER_REST = ' {"city": "Paris", "days": 3}}\n</tool_call>'  # after '… "arguments":'
WEATHER_XML_REST = "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"

# Model outputs the scripted engine plays back when the prompt contains [[NAME]].
SCRIPTS: dict[str, str] = {
    "think": "<think>\nThe user wants a number. 6 times 7.\n</think>\n\nThe answer is 42.",
    "tool": f"<think>\nI should call the weather tool.\n</think>\n\n<tool_call>\n{WEATHER_CALL}\n</tool_call>",
    "two_tools": f"Checking both.\n<tool_call>\n{WEATHER_CALL}\n</tool_call>\n<tool_call>\n{TIME_CALL}\n</tool_call>",
    "unicode": "naïve café — 你好 🎉 ok",
    "stops": "one two three STOP four five",
    # The rest of a call after a forced opening (edgemoe.server.forced_call): what the model
    # writes once the prompt has opened the call for it.
    "forced_named": WEATHER_REST,
    "forced_any": f'get_weather", "arguments":{WEATHER_REST}',
    "forced_two": f"{WEATHER_REST}\n<tool_call>\n{TIME_CALL}\n</tool_call>",
    "forced_then_text": f"{WEATHER_REST}\nDone.",
    "forced_bad": " I would rather not call anything.",
    "forced_xml_named": WEATHER_XML_REST,
    "forced_xml_any": f"=get_weather>\n{WEATHER_XML_REST}",
}

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}},
}

# A tool whose parameters take every JSON type, and arguments for it that read back exactly
# from the XML call formats (values typed by the schema): round trips through a template.
EDIT_TOOL: dict[str, Any] = {"type": "function", "function": {"name": "edit", "parameters": {
    "type": "object", "properties": {
        "path": {"type": "string"}, "text": {"type": "string"}, "line": {"type": ["integer", "null"]},
        "scale": {"type": "number"}, "force": {"type": "boolean"}, "opts": {"type": "object"},
        "tags": {"type": "array"}}}}}
EDIT_ARGUMENTS: list[dict[str, Any]] = [
    {"path": "a.py", "line": 7, "scale": 0.5, "force": True, "opts": {"a": [1, "ü"], "b": None}, "tags": ["x"]},
    {"path": "007", "text": '{"looks": "like JSON"}', "line": None, "force": False, "tags": []},
    {},
]


def ask(script: str) -> list[dict[str, Any]]:
    """A user turn that makes the scripted engine play back `SCRIPTS`-style entry `script`."""
    return [{"role": "user", "content": f"Go. [[{script}]]"}]


def tool_call(name: str, arguments: Any, call_id: str = "c1") -> dict[str, Any]:
    """An assistant message's tool call as OpenAI clients send it back."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def message_calls(message: Any) -> list[tuple[str, Any]]:
    """(name, parsed arguments) of an openai SDK message's tool calls."""
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
