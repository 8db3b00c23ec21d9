"""The API error type every route raises: status, message, param and code.

A leaf module: the protocol-specific renderers (errors.py for OpenAI's shape,
anthropic_errors.py for Anthropic's, sse.py for streams) all import it.
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    """An error answer: `status` with `message`, naming the request field `param`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ContextLengthExceeded(APIError):
    """A prompt the context cannot hold: 400 `context_length_exceeded`, with the numbers
    each protocol words its own way. `tokens` is the prompt's size (a lower bound unless
    `exact`); `max_prompt_tokens` the largest prompt that fits (the context length less
    the one position the first generated token needs)."""

    def __init__(self, message: str, *, tokens: int, max_prompt_tokens: int, exact: bool, param: str | None) -> None:
        super().__init__(400, message, param=param, code="context_length_exceeded")
        self.tokens = tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.exact = exact


class Overloaded(APIError):
    """The server is at capacity (its queue is full): try again after `retry_after` seconds.

    OpenAI routes answer 429, the Anthropic routes 529 `overloaded_error`; both send
    `Retry-After`.
    """

    def __init__(self, message: str = "the server is overloaded; retry later", *, retry_after: float = 1.0) -> None:
        super().__init__(429, message, code="rate_limit_exceeded")
        self.retry_after = retry_after


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unavailable(message: str) -> APIError:
    return APIError(503, message, code="engine_unavailable")
