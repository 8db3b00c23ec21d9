"""The tools the strict-call tests hold calls to (test_strict_xml_calls.py for Qwen3-Coder's
XML, test_strict_minimax_calls.py for MiniMax-M2's blocks): one set, so both formats are
held to the same schemas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import jsonschema_rs
from pydantic import BaseModel, Field
from server_harness import ServerHarness

from edgemoe.server.config import ServerConfig

USER = [{"role": "user", "content": "Turn on a light."}]


class SetLight(BaseModel):
    on: bool
    room: Literal["hall", "kitchen"]
    level: int = Field(ge=0, le=100)
    label: str = Field(max_length=6)
    tags: list[Literal["warm", "cold"]] = Field(max_length=2)


# A string or null (each value raw text or JSON, as the parser types it by the schema).
NOTE = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 8},
                                         "when": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]}},
        "required": ["text", "when"], "additionalProperties": False}
# A parameter that may be a string or another type: the XML formats can't hold it.
MIXED = {"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}


def function(name: str, parameters: dict[str, Any], strict: bool | None = None) -> dict[str, Any]:
    f: dict[str, Any] = {"name": name, "parameters": parameters}
    if strict is not None:
        f["strict"] = strict
    return {"type": "function", "function": f}


def check(name: str, arguments: str | dict) -> None:
    """A call's arguments valid for its tool (SetLight's schema, else NOTE)."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    schema = SetLight.model_json_schema() if name == "SetLight" else NOTE
    assert jsonschema_rs.is_valid(schema, args), (name, args)


def served(demo_dir: Path, model_dir: Path) -> Iterator[ServerHarness]:
    """`model_dir` (the demo's config and tokenizer, a template of a format's) with the demo's
    weights, served by the real engine on the CPU: a module fixture's body."""
    from edgemoe.engine.service import build_engine

    for weights in demo_dir.glob("*.safetensors*"):
        (model_dir / weights.name).symlink_to(weights)
    engine, ready = build_engine({"model": str(model_dir), "max_model_len": 1024, "dtype": "float32"})
    harness = ServerHarness(engine, ready, ServerConfig()).start(timeout=120)
    yield harness
    harness.stop()
