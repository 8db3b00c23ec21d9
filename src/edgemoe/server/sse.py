"""Server-sent events: framing, and a response that streams an async iterator of frames."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.responses import StreamingResponse

from edgemoe.server.api_error import APIError

DONE = b"data: [DONE]\n\n"

_encode = msgspec.json.Encoder().encode


def json_bytes(obj: Any) -> bytes:
    return _encode(obj)


def data_frame(obj: Any) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


def event_frame(event: str, obj: Any) -> bytes:
    """A named event (`event: X`), as the Anthropic API streams."""
    return b"event: " + event.encode() + b"\ndata: " + _encode(obj) + b"\n\n"


def error_frame(err: APIError) -> bytes:
    """An OpenAI-style error in a stream: the SDKs raise it as an APIError."""
    return data_frame(err.body())


def sse_response(frames: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        frames,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
