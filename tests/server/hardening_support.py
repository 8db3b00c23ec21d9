"""The acceptance check of issue 11 for one attack on a live server.

During and after the attack, an ordinary request from another client completes within
max(3 × its latency alone, its latency alone + 2 s), `/health` answers within 1 s, and
afterwards `/v1/stats` shows nothing running or queued.

(Importable because conftest.py puts this folder on sys.path.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from server_harness import ServerHarness

ORDINARY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
HEALTH_LIMIT_S = 1.0


def ordinary_latency(h: ServerHarness) -> float:
    t0 = time.monotonic()
    r = httpx.post(f"{h.base_url}/v1/chat/completions", json=ORDINARY, timeout=30)
    assert r.status_code == 200, r.text
    return time.monotonic() - t0


def health_latency(h: ServerHarness) -> float:
    t0 = time.monotonic()
    r = httpx.get(f"{h.base_url}/health", timeout=10)
    assert r.status_code == 200, r.text
    return time.monotonic() - t0


def wait_idle(h: ServerHarness, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        requests = httpx.get(f"{h.base_url}/v1/stats", timeout=10).json()["requests"]
        if requests["running"] == 0 and requests["queued"] == 0:
            return requests
        assert time.monotonic() < deadline, f"requests left behind: {requests}"
        time.sleep(0.02)


def assert_unharmed(h: ServerHarness, attack: Callable[[], Any], *, probes: int = 2) -> Any:
    """Run `attack` in a thread while probing the server as another client; returns what
    the attack returned (re-raising what it raised)."""
    alone = min(ordinary_latency(h) for _ in range(2))
    budget = max(3 * alone, alone + 2.0)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = attack()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.05)  # let the attack reach the server
    for _ in range(probes):
        assert health_latency(h) < HEALTH_LIMIT_S
        latency = ordinary_latency(h)
        assert latency < budget, f"an ordinary request took {latency:.2f} s (alone {alone:.2f} s)"
    thread.join(60)
    assert not thread.is_alive(), "the attack did not finish"
    assert health_latency(h) < HEALTH_LIMIT_S
    assert ordinary_latency(h) < budget
    wait_idle(h)
    if "error" in result:
        raise result["error"]
    return result.get("value")
