"""Heartbeats on quiet streams, so a long prefill does not look like a dead server.

A stream that sends nothing for `--stream-heartbeat` seconds (a long prompt still
prefilling, the engine busy with others) gets a heartbeat frame that every client
skips: an SSE comment on the OpenAI routes (the openai SDK's SSE decoder, and
eventsource parsers generally, drop lines starting with ":"; the Responses API is
parsed by the same decoder) and Anthropic's own `event: ping` on /v1/messages.

The generation core waits up to one heartbeat period for the first token before the
response starts (`start_generation(first_output_wait=...)`), so a refused request
is still a plain HTTP error; past that the response starts and heartbeats run until
the first token, and an engine refusal arriving that late ends the stream with the
protocol's error event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from edgemoe.server.sse import event_frame

# An SSE comment: ignored by every SSE parser.
COMMENT_PING = b": ping\n\n"
# What Anthropic's API sends; its SDK skips it.
ANTHROPIC_PING = event_frame("ping", {"type": "ping"})


async def with_heartbeat(
    frames: AsyncIterator[bytes], ping: bytes, interval: float, *, ping_first: bool = False
) -> AsyncIterator[bytes]:
    """`frames`, with `ping` whenever `interval` seconds pass without one (and first,
    if `ping_first`: a response that starts before its first token says so at once).

    Closing this iterator (a client gone) cancels the frame being awaited, so the
    inner generator's cleanup (aborting its engine requests) runs.
    """
    if ping_first:
        yield ping
    it = aiter(frames)
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(it))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield ping
                continue
            frame, pending = pending, None
            try:
                value = frame.result()
            except StopAsyncIteration:
                return
            yield value
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()
