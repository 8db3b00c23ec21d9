"""Cancel a route whose client hung up before it answered: every route, every protocol.

A generation route spends the prefill awaiting the engine's first output before it
sends any byte; a client that disconnects then would otherwise keep its request
prefilling (and its pages held) until the response starts. This pure ASGI middleware
watches the connection from the moment the request body has been read until the
response starts, and cancels the route on a disconnect; the generation's cleanup
aborts the engine requests (`start_generation` aborts on any exception).

Once the response has started, Starlette's streaming response watches for the
disconnect itself (and non-streamed generations use `disconnect.unless_disconnected`).
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class CancelOnDisconnectMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in _WITH_BODY:
            await self.app(scope, receive, send)  # no body to wait for; such routes answer at once
            return
        body_read = asyncio.Event()

        async def receive_body() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            return message

        watcher = asyncio.ensure_future(_hang_up(receive, body_read))

        async def send_first(message: Message) -> None:
            if message["type"] == "http.response.start":
                watcher.cancel()  # from here on the response itself notices a disconnect
            await send(message)

        route = asyncio.ensure_future(self.app(scope, receive_body, send_first))
        try:
            await asyncio.wait({route, watcher}, return_when=asyncio.FIRST_COMPLETED)
            hung_up = watcher.done() and not watcher.cancelled() and watcher.exception() is None
            if hung_up and not route.done():
                route.cancel()  # the client is gone and nothing was sent: stop the work
                with contextlib.suppress(asyncio.CancelledError):
                    await route
                return
            await route
        finally:
            watcher.cancel()
            if not route.done():  # this task itself was cancelled (server shutdown)
                route.cancel()


async def _hang_up(receive: Receive, body_read: asyncio.Event) -> None:
    """Return when the client disconnects (after the body was read)."""
    await body_read.wait()
    while (await receive())["type"] != "http.disconnect":
        pass
