"""JSON request bodies parsed and validated off the event loop.

FastAPI parses a body (`json.loads`) and validates it (pydantic) on the event loop: a
30 MB body of a million tiny messages held the loop, and so `/health` and every other
client, for seconds. `ThreadedBodyRoute` does both in a worker thread and hands FastAPI
the finished model, which FastAPI's own validation then passes through as an instance.

NOTE: a thread alone is not enough: pydantic's validator holds the GIL for the whole
call (150 K messages: 1.5 s without the loop getting a turn). So the JSON is parsed in
pieces when large (`json_body`), and long top-level lists of models (`messages`,
`tools`, …) are validated item by item from Python, which lets the loop run between
items; the final validation only meets instances. Invalid Unicode (a lone surrogate)
is refused here for every route, naming the field.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from edgemoe.server.errors import APIError, bad_request
from edgemoe.server.json_body import InvalidJSON, InvalidUnicode, parse_json

# Lists at least this long are validated item by item (see the module docstring).
LONG_LIST = 256
_UNIONS = (typing.Union, types.UnionType)


class ThreadedBodyRoute(APIRoute):
    """An APIRoute whose JSON body model is parsed and validated in a worker thread."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        model = self._body_model()
        if model is None:
            return handler

        async def parse_then_handle(request: Request) -> Response:
            body = await request.body()
            encoding = request.headers.get("content-encoding", "identity").strip().lower()
            if body and encoding != "identity":  # else its bytes were refused as "not valid JSON"
                raise bad_request(f"Content-Encoding {encoding!r} is not supported: send the body uncompressed",
                                  param="Content-Encoding")
            if body and not _is_json(request.headers.get("content-type")):
                raise bad_request("the request body must be JSON, sent with Content-Type: application/json")
            if body:
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
        data = parse_json(body)
    except InvalidUnicode as exc:
        raise invalid_unicode(exc) from None
    except InvalidJSON as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    try:
        if isinstance(data, dict):
            _validate_long_lists(model, data)
        return model.model_validate(data, strict=True)  # JSON types as sent: "4" is not a number, true not 1
    except ValidationError as exc:
        raise _request_error(exc.errors(include_url=False)) from None


def invalid_unicode(exc: InvalidUnicode) -> APIError:
    return bad_request(
        f"{exc.path or 'the request body'} holds invalid Unicode: a lone surrogate (\\u{ord(exc.char):04x}) is not "
        "a character; send UTF-8 text (a \\uD800-\\uDBFF escape must be followed by a \\uDC00-\\uDFFF one)",
        param=exc.path or None, code="invalid_unicode",
    )


def _request_error(errors: list[Any], *prefix: str | int) -> RequestValidationError:
    return RequestValidationError([{**e, "loc": ("body", *prefix, *e.get("loc", ()))} for e in errors])


def _validate_long_lists(model: type[BaseModel], data: dict[str, Any]) -> None:
    """Replace each long top-level list of models in `data` by the validated models."""
    for name, field in model.model_fields.items():
        key = field.alias or name
        items = data.get(key)
        item_model = _list_item_model(field.annotation)
        if not isinstance(items, list) or len(items) < LONG_LIST or item_model is None:
            continue
        validated = []
        for i, item in enumerate(items):
            try:
                validated.append(item_model.model_validate(item, strict=True))
            except ValidationError as exc:
                raise _request_error(exc.errors(include_url=False), key, i) from None
        data[key] = validated


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    """M for a field typed `list[M]` or `list[M] | None` with M a model, else None."""
    for option in typing.get_args(annotation) if typing.get_origin(annotation) in _UNIONS else (annotation,):
        if typing.get_origin(option) is list:
            (item,) = typing.get_args(option) or (None,)
            if isinstance(item, type) and issubclass(item, BaseModel):
                return item
    return None
