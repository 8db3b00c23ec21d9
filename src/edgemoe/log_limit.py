"""Warnings that an outsider can trigger at will, at most one line per interval.

A peer that keeps failing the engine link's handshake, or a client that keeps being
disconnected for not reading, must not be able to flood the log: the first event
logs at once, later ones within `interval_s` are counted and reported with the next
line that gets out.
"""

from __future__ import annotations

import logging
import threading
import time


class LogLimiter:
    """`warning(...)` at most once per `interval_s`; the suppressed count rides along."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last = -float("inf")
        self._suppressed = 0
        self._lock = threading.Lock()  # NOTE: the ZAP handler calls in from its own thread

    def warning(self, message: str, *args: object) -> bool:
        """Log (True) or count (False) one event."""
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.interval_s:
                self._suppressed += 1
                return False
            suppressed, since = self._suppressed, now - self._last
            self._suppressed, self._last = 0, now
        if suppressed:
            message += f" (and {suppressed} more like it in the {since:.0f} s before)"
        self.logger.warning(message, *args)
        return True
