"""Errors in the Anthropic shape, for the `/v1/messages` routes.

Core code raises the same `APIError`s everywhere; only their rendering differs.
Anthropic clients (Claude Code, the `anthropic` SDK) read
`{"type": "error", "error": {"type", "message"}}` and pick the exception class from
the status, so the OpenAI body would be misread (a known bug of other servers).

Status mapping: the status is kept, except that an `Overloaded` server answers 529
`overloaded_error` (Anthropic's "try again later", which Claude Code retries) where
the OpenAI routes answer 429; both carry `Retry-After`.

A prompt over the context is worded as Anthropic words it, "prompt is too long: N tokens
> M maximum": the body has no error code, so Claude Code (which then compacts) and the
agents that copied its check (OpenCode, pi) recognise a full context by that text.
"""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse

from edgemoe.server.api_error import APIError, ContextLengthExceeded, Overloaded
from edgemoe.server.sse import event_frame

ANTHROPIC_PATH = "/v1/messages"

OVERLOADED_STATUS = 529

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
    OVERLOADED_STATUS: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    """Whether a request path belongs to the Messages API (any sub-path, any trailing slash)."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def anthropic_status(err: APIError) -> int:
    return OVERLOADED_STATUS if isinstance(err, Overloaded) else err.status


def anthropic_error_type(err: APIError) -> str:
    status = anthropic_status(err)
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_message(err: APIError) -> str:
    """`err`'s message, in Anthropic's words where clients match on them."""
    if isinstance(err, ContextLengthExceeded):
        # A lower bound still exceeds the maximum; the note keeps the sentence honest.
        note = "" if err.exact else " (counted up to the limit)"
        return f"prompt is too long: {err.tokens} tokens > {err.max_prompt_tokens} maximum{note}"
    if err.code == "context_length_exceeded":  # the engine's own refusal: no numbers to reword
        return f"prompt is too long: {err.message}"
    return err.message


def anthropic_error_body(err: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": anthropic_error_type(err), "message": anthropic_message(err)}}


def retry_after_header(err: APIError) -> dict[str, str]:
    """`Retry-After` (whole seconds, at least 1) for an overloaded server, else nothing."""
    if isinstance(err, Overloaded):
        return {"Retry-After": str(max(1, math.ceil(err.retry_after)))}
    return {}


def anthropic_error_response(err: APIError) -> JSONResponse:
    headers = retry_after_header(err)
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(anthropic_error_body(err), status_code=anthropic_status(err), headers=headers or None)


def anthropic_error_frame(err: APIError) -> bytes:
    """An error inside a started stream: `event: error`, which the SDK raises as an APIError."""
    return event_frame("error", anthropic_error_body(err))
