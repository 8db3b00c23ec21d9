"""The last requests the engine ran, for `GET /v1/requests`: timings, token counts, outcome.

NOTE: a record holds no prompt or output text, and no request field other than the
endpoint it came in on: the log is safe to show to whoever holds the API key.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_SIZE = 256


@dataclass(frozen=True)
class RequestRecord:
    """One engine request (one choice of an API request), finished or still in flight.

    `status`: "queued" (no token yet), "running", or "finished" (`finish_reason` says
    how: stop, length, abort, timeout, error, rejected). Times are seconds; `arrival`
    is Unix time. `ttft_s` counts from the HTTP request's arrival.
    """

    id: str
    endpoint: str
    status: str
    arrival: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None
    e2e_s: float | None
    decode_tokens_per_s: float | None
    finish_reason: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RequestLog:
    """A ring of finished records, newest last."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._records: deque[RequestRecord] = deque(maxlen=size)

    def add(self, record: RequestRecord) -> None:
        self._records.append(record)

    def recent(self, limit: int) -> list[RequestRecord]:
        """Up to `limit` records, newest first."""
        out: list[RequestRecord] = []
        for record in reversed(self._records):
            if len(out) >= limit:
                break
            out.append(record)
        return out

    def __len__(self) -> int:
        return len(self._records)
