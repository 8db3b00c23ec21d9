"""Checks before any route runs: the API key (401) and the request body size (413).

A pure ASGI middleware: the body is read here, counted as it streams in (a chunked
upload has no Content-Length to trust), and replayed to the app, so an oversized body
is refused without ever being parsed.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgemoe.server.errors import APIError, error_response

# Routes that never need the key: health checks come from load balancers and supervisors.
OPEN_PATHS = frozenset({"/health"})


class GuardMiddleware:
    def __init__(
        self, app: ASGIApp, *, api_key: str | None, max_body_size: int, open_paths: Iterable[str] = OPEN_PATHS
    ) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_size = max_body_size
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        error = self._check_key(scope, headers) or self._check_length(headers)
        if error is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            body, error = await self._read_body(receive)
            if error is None:
                receive = _replay(body, receive)
        if error is not None:
            await error_response(error, scope.get("path", ""))(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check_key(self, scope: Scope, headers: dict[bytes, bytes]) -> APIError | None:
        if self.api_key is None or (scope.get("path", "").rstrip("/") or "/") in self.open_paths:
            return None
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        if given is not None and hmac.compare_digest(given, self.api_key):
            return None
        why = "no API key given" if given is None else "invalid API key"
        return APIError(401, f"{why} (send Authorization: Bearer KEY or x-api-key: KEY)", code="invalid_api_key")

    def _check_length(self, headers: dict[bytes, bytes]) -> APIError | None:
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_size:
            return self._too_large()
        return None

    def _too_large(self) -> APIError:
        return APIError(
            413, f"the request body is larger than the server's limit of {self.max_body_size} bytes",
            code="request_too_large",
        )

    async def _read_body(self, receive: Receive) -> tuple[bytes, APIError | None]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"", None  # disconnected: let the app see it
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_size:
                return b"", self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that gives the app the buffered body once, then the real channel."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
