"""What the scripted engine plays back, and the tools the tests declare.

(A module of its own, not conftest.py: test files import these names, and a module
called ``conftest`` is ambiguous once several test folders are on ``sys.path``.)
"""

from __future__ import annotations

from typing import Any

WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
TIME_CALL = '{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}'

# Model outputs the scripted engine plays back when the prompt contains [[NAME]].
SCRIPTS: dict[str, str] = {
    "think": "<think>\nThe user wants a number. 6 times 7.\n</think>\n\nThe answer is 42.",
    "tool": f"<think>\nI should call the weather tool.\n</think>\n\n<tool_call>\n{WEATHER_CALL}\n</tool_call>",
    "two_tools": f"Checking both.\n<tool_call>\n{WEATHER_CALL}\n</tool_call>\n<tool_call>\n{TIME_CALL}\n</tool_call>",
    "unicode": "naïve café — 你好 🎉 ok",
    "stops": "one two three STOP four five",
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
