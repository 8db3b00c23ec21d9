"""One access-log line per HTTP request: who, what, the status, tokens in and out, time.

    edgemoe: 127.0.0.1:53122 "POST /v1/chat/completions" 200 in=1532 cached=1408 out=87 2.914s

Logged when the response is over (a stream included), on the `edgemoe.access` logger at
INFO. Never any request text: the method and path only (no query string), the status,
and the token counts the request tracker gathered for this request (`in` = prompt
tokens, `cached` = of those from the prefix cache, `out` = generated, all choices).
`--quiet` leaves this middleware out.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgemoe.server.disconnect import CLIENT_CLOSED
from edgemoe.server.request_context import Usage, current_arrival

log = logging.getLogger("edgemoe.access")


def access_line(client: str, method: str, path: str, status: int, usage: Usage | None, seconds: float) -> str:
    tokens = ""
    if usage is not None and (usage.prompt_tokens or usage.completion_tokens):
        tokens = f" in={usage.prompt_tokens} cached={usage.cached_tokens} out={usage.completion_tokens}"
    return f'{client} "{method} {path}" {status}{tokens} {seconds:.3f}s'


class AccessLogMiddleware:
    """Sits inside `RequestContextMiddleware` (whose arrival carries the token counts)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = CLIENT_CLOSED  # nothing was sent: the client went away first

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except BaseException:
            if status == CLIENT_CLOSED:
                status = 500
            raise
        finally:
            arrival = current_arrival()
            host, port = scope.get("client") or ("-", 0)
            log.info("%s", access_line(f"{host}:{port}", scope.get("method", ""), scope.get("path", ""), status,
                                       arrival.usage if arrival is not None else None, time.monotonic() - start))
