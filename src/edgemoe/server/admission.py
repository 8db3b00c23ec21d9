"""Who gets in and how long they may stay: the bounded queue and the request timeout.

Queue: a request is "queued" from its submission until its first token (waiting in the
engine's scheduler, or prefilling). Past `--max-queued-requests` queued engine
requests, new ones are refused with `Overloaded` (429 on the OpenAI routes, 529 on
the Anthropic ones, both with Retry-After) instead of piling up behind the others.
NOTE: an empty queue always admits, so a request with n > the bound still runs.

Timeout: with `--request-timeout`, a request still generating that long after it
arrived ends with a 504 `request_timeout` error (an error event once streaming) and is
aborted in the engine, which frees its pages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from edgemoe.server.errors import APIError, Overloaded

log = logging.getLogger(__name__)

# How often deadlines are checked: the timeout is enforced to within this.
DEADLINE_TICK_S = 0.1
# Retry-After bounds: at least a second (its unit), at most what a client should wait.
MIN_RETRY_AFTER_S = 1.0
MAX_RETRY_AFTER_S = 30.0


class AdmissionGate:
    def __init__(self, max_queued: int) -> None:
        self.max_queued = max_queued

    def check(self, queued: int, incoming: int, typical_wait_s: float | None) -> None:
        """Raise Overloaded if `incoming` more requests would overflow the queue."""
        if queued == 0 or queued + incoming <= self.max_queued:
            return
        # A slot frees when a queued request starts: about one typical TTFT from now.
        wait = typical_wait_s if typical_wait_s is not None else MIN_RETRY_AFTER_S
        retry_after = min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, wait))
        raise Overloaded(
            f"the server is overloaded: {queued} requests are queued (limit {self.max_queued}); "
            f"retry after {retry_after:.0f} s",
            retry_after=retry_after,
        )


def timeout_error(timeout_s: float) -> APIError:
    return APIError(504, f"the request took longer than the server's limit of {timeout_s:g} s",
                    code="request_timeout")


async def enforce_deadlines(
    expired: Callable[[], list[str]],
    fail: Callable[[list[str], BaseException, str], None],
    timeout_s: float,
    tick_s: float = DEADLINE_TICK_S,
) -> None:
    """Forever: end the requests `expired()` names with a timeout error (`fail`)."""
    while True:
        await asyncio.sleep(tick_s)
        ids = expired()
        if not ids:
            continue
        log.warning("%d request(s) timed out after %g s", len(ids), timeout_s)
        try:
            fail(ids, timeout_error(timeout_s), "timeout")
        except Exception:  # a failing sweep must not end the sweeper
            log.exception("ending timed-out requests failed")
