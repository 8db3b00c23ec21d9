"""Stop work for clients that hung up: a non-streamed generation must not run on for nobody.

(Streamed responses need nothing extra: Starlette cancels the stream when the client
disconnects, and the generation's `finally` aborts the engine requests. Before any
response starts, e.g. mid-prefill, `disconnect_watch` cancels the route itself.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from edgemoe.server.errors import APIError

T = TypeVar("T")

# nginx's "client closed request"; nobody reads it, but logs show why the request ended.
CLIENT_CLOSED = 499


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Run `work`; cancel it (raising APIError 499) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()  # the generation's `finally` aborts its engine requests
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise APIError(CLIENT_CLOSED, "the client closed the connection")
    return task.result()
