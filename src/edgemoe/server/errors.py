"""API errors: one exception type carrying status, message, param and code, and its JSON.

Core code raises `APIError`s; the app's handlers render them in the OpenAI shape
`{"error": {"message", "type", "param", "code"}}` (the Anthropic routes will render
the same exceptions in their own shape). FastAPI's 422 for validation errors is
replaced by a 400 in this shape: clients (the openai SDK) treat 422 differently.
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edgemoe.server.anthropic_errors import (
    anthropic_error_response,
    is_anthropic_path,
    retry_after_header,
)
from edgemoe.server.api_error import (  # noqa: F401 - re-exported
    APIError,
    ContextLengthExceeded,
    Overloaded,
    bad_request,
    unavailable,
)
from edgemoe.server.validation import describe, param_of  # noqa: F401 - param_of re-exported


def error_response(err: APIError, path: str = "") -> JSONResponse:
    """`err` in the shape the clients of `path` read: Anthropic's on /v1/messages, else OpenAI's."""
    # Imported here: anthropic_errors builds on this module.

    if is_anthropic_path(path):
        return anthropic_error_response(err)
    headers = retry_after_header(err)
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(err.body(), status_code=err.status, headers=headers or None)


def error_body_bytes(err: APIError) -> bytes:
    return json.dumps(err.body()).encode()


def validation_error(exc: RequestValidationError) -> APIError:
    """A request the models refused: 400 with one message written for the client."""
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return bad_request(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(": "))
    message, param = describe(errors)
    return bad_request(message, param=param)


def install_handlers(app: FastAPI) -> None:
    """Every error leaves the app in the error shape; validation errors are 400."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return error_response(APIError(exc.status_code, message), request.url.path)
