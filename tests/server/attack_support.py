"""The issue-11 acceptance check, shared by the hardening tests: during and after an
attack, another client's ordinary request completes within max(3 × its latency alone,
its latency alone + 2 s), `/health` answers within 1 s, and afterwards `/v1/stats`
shows nothing running or queued.

(Importable because conftest.py puts this folder on sys.path.)
"""

from __future__ import annotations

import time
from typing import Any

import httpx

ORDINARY = {"model": "m", "messages": [{"role": "user", "content": "an ordinary question"}], "max_tokens": 8}


def ordinary_latency(base_url: str) -> float:
    """Seconds for one ordinary chat request on a fresh connection (asserts it succeeds)."""
    t0 = time.monotonic()
    r = httpx.post(f"{base_url}/v1/chat/completions", json=ORDINARY, timeout=30)
    elapsed = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    return elapsed


def baseline(base_url: str) -> float:
    """The ordinary request's latency alone: the best of three (warm)."""
    return min(ordinary_latency(base_url) for _ in range(3))


def assert_serving(base_url: str, alone: float) -> None:
    """Another client is served in time, and /health answers within 1 s."""
    bound = max(3 * alone, alone + 2.0)
    took = ordinary_latency(base_url)
    assert took <= bound, f"an ordinary request took {took:.2f} s (alone {alone:.2f} s, bound {bound:.2f} s)"
    t0 = time.monotonic()
    r = httpx.get(f"{base_url}/health", timeout=5)
    assert r.status_code == 200 and time.monotonic() - t0 <= 1.0, f"/health: {r.status_code} after {time.monotonic() - t0:.2f} s"


def assert_idle(base_url: str, timeout: float = 3.0) -> dict[str, Any]:
    """/v1/stats reaches nothing running or queued within `timeout`; returns its requests block."""
    deadline = time.monotonic() + timeout
    while True:
        counts = httpx.get(f"{base_url}/v1/stats", timeout=5).json()["requests"]
        if counts["running"] == 0 and counts["queued"] == 0:
            return counts
        assert time.monotonic() < deadline, f"still busy after the attack: {counts}"
        time.sleep(0.02)
