"""The OpenAPI document at `/openapi.json`, made true to what the server sends.

FastAPI's generated document promises a 422 validation error (we answer 400) and
JSON only (generation routes stream `text/event-stream` when asked). This rewrites
it once: every operation documents its errors as a `default` response in the shape
its clients read (OpenAI's, or Anthropic's on `/v1/messages`), streaming routes list
the event-stream media type, and the 422 schemas go. Schemathesis checks every
response against the result.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

# One server-sent event as schemathesis parses it: the data alone, or the data with the
# event name (Responses and Anthropic streams name every event).
SSE_EVENT: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "object",
            "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
            "required": ["data"],
        },
    ]
}

from edgemoe.server.anthropic_errors import is_anthropic_path

_OPENAI_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        },
    },
}

_ANTHROPIC_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}


def install_openapi(app: FastAPI) -> None:
    """Serve the rewritten document (built on first request, then cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            app.openapi_schema = rewrite(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def rewrite(schema: dict[str, Any]) -> dict[str, Any]:
    components = schema.get("components", {}).get("schemas", {})
    for path, item in schema.get("paths", {}).items():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            error = _ANTHROPIC_ERROR if is_anthropic_path(path) else _OPENAI_ERROR
            responses["default"] = {"description": "Error", "content": {"application/json": {"schema": error}}}
            if _streams(operation, components) and "200" in responses:
                content = responses["200"].setdefault("content", {})
                content["text/event-stream"] = {"schema": SSE_EVENT}
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    return schema


def _streams(operation: dict[str, Any], components: dict[str, Any]) -> bool:
    """Whether the request body has a `stream` field (then the answer may be SSE)."""
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    ref = body.get("$ref", "")
    target = components.get(ref.rsplit("/", 1)[-1], {}) if ref else body
    return "stream" in target.get("properties", {})
