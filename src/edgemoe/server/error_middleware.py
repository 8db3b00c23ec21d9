"""A route that fails unexpectedly answers a clean 500, and the connection stays usable.

Starlette's handler for `Exception` answers and then re-raises, so uvicorn drops the
keep-alive connection without `Connection: close`, and the client's next request on it
fails (ECONNRESET). This middleware, just outside the routes, answers the 500 itself in
the protocol's error shape, without the exception's text (that goes to the log), and
lets nothing through. If the response had already started (a stream), nothing can be
said in HTTP any more: the error propagates and uvicorn closes the connection, which
for a chunked stream the client sees as a truncated body.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgemoe.server.errors import APIError, error_response

log = logging.getLogger(__name__)


class UnexpectedErrorMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            err = APIError(500, "the server failed this request (an internal error; the server log has the details)")
            await error_response(err, scope.get("path", ""))(scope, receive, send)
