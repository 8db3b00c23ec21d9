"""JSON request bodies parsed and validated off the event loop.

FastAPI parses a body (`json.loads`) and validates it (pydantic) on the event loop: a
30 MB body of a million tiny messages held the loop, and so `/health` and every other
client, for seconds. `ThreadedBodyRoute` does both in a worker thread with pydantic's
JSON validator (measured to let the loop run meanwhile: < 0.2 s pauses where
`model_validate` of the parsed dict held it for 3 s) and hands FastAPI the finished
model, which FastAPI's own validation then passes through as an instance.

Invalid Unicode is refused here for every route at once: a lone surrogate (`"\\ud800"`)
is invalid JSON text for pydantic's parser; the message then names the field it was
found in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from edgemoe.server.errors import APIError, bad_request

_SURROGATE = re.compile("[\ud800-\udfff]")


class ThreadedBodyRoute(APIRoute):
    """An APIRoute whose JSON body model is parsed and validated in a worker thread."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        model = self._body_model()
        if model is None:
            return handler

        async def parse_then_handle(request: Request) -> Response:
            body = await request.body()
            if body and _is_json(request.headers.get("content-type")):
                parsed = await anyio.to_thread.run_sync(parse_body, model, body)
                # NOTE: Starlette caches a request's parsed JSON in `_json`, and FastAPI reads
                # the body through `request.json()`: it receives the validated model.
                request._json = parsed  # type: ignore[attr-defined]
            return await handler(request)

        return parse_then_handle

    def _body_model(self) -> type[BaseModel] | None:
        annotation = self.body_field.field_info.annotation if self.body_field is not None else None
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation
        return None


def _is_json(content_type: str | None) -> bool:
    # FastAPI's own rule: application/json or application/*+json; anything else is left to it.
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def parse_body(model: type[BaseModel], body: bytes) -> BaseModel:
    """The validated model; raises RequestValidationError or APIError (invalid JSON). Blocking."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if errors and errors[0].get("type") == "json_invalid":
            raise invalid_json(body, str((errors[0].get("ctx") or {}).get("error", ""))) from None
        raise RequestValidationError([{**e, "loc": ("body", *e.get("loc", ()))} for e in errors]) from None


def invalid_json(body: bytes, why: str) -> APIError:
    """400 for a body that is not JSON; for invalid Unicode, naming the field that holds it."""
    if "surrogate" in why or "hex escape" in why:
        try:
            found = find_surrogate(json.loads(body))
        except (ValueError, RecursionError):
            found = None
        if found is not None:
            # The path may itself hold the surrogate (a key): escape it, or the answer cannot be encoded.
            path, char = found[0].encode("utf-8", "backslashreplace").decode("utf-8"), found[1]
            return bad_request(
                f"{path or 'the request body'} holds invalid Unicode: a lone surrogate (\\u{ord(char):04x}) is not "
                "a character; send UTF-8 text (a \\uD800-\\uDBFF escape must be followed by a \\uDC00-\\uDFFF one)",
                param=path or None, code="invalid_unicode",
            )
    return bad_request(f"the request body is not valid JSON: {why}".rstrip(": "))


def find_surrogate(value: Any) -> tuple[str, str] | None:
    """(path as the client wrote it, the surrogate) of the first string holding one, or None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if (m := _SURROGATE.search(node)) is not None:
                return path, m.group()
        elif isinstance(node, dict):
            children = []
            for key, child in node.items():
                where = f"{path}.{key}" if path else str(key)
                if (m := _SURROGATE.search(key)) is not None:
                    return where, m.group()
                children.append((where, child))
            stack.extend(reversed(children))
        elif isinstance(node, list):
            stack.extend(reversed([(f"{path}[{i}]", child) for i, child in enumerate(node)]))
    return None
