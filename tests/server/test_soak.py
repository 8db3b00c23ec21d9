"""The real engine (demo model) under load: `scripts/soak.py` for half a minute with 8 clients
and random disconnects against `edgemoe serve`, then a disconnect mid-prefill of a
long prompt, each ending with every KV page back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from ops_support import metrics
from script_module import load_script
from server_harness import ServerHarness

from edgemoe.server.config import ServerConfig


def load_soak() -> ModuleType:
    return load_script("soak")


@pytest.fixture
def cache_env(monkeypatch: pytest.MonkeyPatch, demo_dir: Path) -> None:
    from edgemoe.testing.tokenizer_factory import cache_dir

    # The session built the demo model in this cache; the server subprocess reuses it.
    monkeypatch.setenv("EDGEMOE_CACHE_DIR", str(cache_dir()))


def test_soak_half_a_minute_with_disconnects(cache_env: None) -> None:
    soak = load_soak()
    with soak.local_server(["--cache-type", "radix"]) as url:
        # 16 requests at least, however slow the host (the count, not the rate, is what is tested)
        report = asyncio.run(soak.soak(url, clients=8, duration_s=30, disconnect_rate=0.25, max_tokens=24, seed=7,
                                       min_requests=16))
        soak.print_report(report)
        scraped = metrics(httpx.get(f"{url}/metrics").text)
    assert report["errors"] == 0, report["error_samples"]
    assert report["requests"] >= 16 and report["disconnects"] >= 1
    assert report["idle"] and report["kv_pool_back"], report["kv_pool"]
    assert {"chat_stream", "tool_turn", "completion"} <= set(report["by_scenario"])
    assert report["ttft_p50_s"] is not None
    # The real engine's counters reach /metrics too.
    assert sum(scraped["edgemoe:expert_cache_hits_total"].values()) > 0
    assert sum(scraped["edgemoe:prefix_cache_hits_total"].values()) > 0  # the shared system prompt
    assert sum(scraped["edgemoe:num_requests_running"].values()) == 0


def test_soak_refuses_remote_and_unbounded_runs() -> None:
    soak = load_soak()
    for url, clients, duration in [("http://10.0.0.1:1919", 1, 1), ("http://127.0.0.1:1", 65, 1),
                                   ("http://127.0.0.1:1", 1, 3601), ("http://example.com", 1, 1)]:
        with pytest.raises(ValueError):
            soak.check_bounds(url, clients, duration)


@pytest.fixture(scope="module")
def chunked(demo_dir: Path) -> Iterator[ServerHarness]:
    """The real engine with small prefill chunks: a long prompt prefills over many steps."""
    from edgemoe.engine.service import build_engine

    engine, ready = build_engine({"model": str(demo_dir), "max_model_len": 4096, "max_prefill_tokens": 32})
    harness = ServerHarness(engine, ready, ServerConfig()).start(timeout=120)
    yield harness
    harness.stop()


def wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [True, False])
def test_real_engine_disconnect_mid_prefill_frees_pages(chunked: ServerHarness, stream: bool) -> None:
    prompt = list(range(1000, 4000))  # 3000 tokens: ~94 prefill steps of 32
    body = {"model": "m", "prompt": prompt, "max_tokens": 8, "stream": stream}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{chunked.base_url}/v1/completions", json=body, timeout=0.3)

    def idle() -> bool:
        stats = httpx.get(f"{chunked.base_url}/v1/stats").json()
        pool = stats["engine"]["kv_pool"]
        return stats["engine"]["requests_running"] == 0 and pool["pages_in_use"] == 0 and \
            pool["pages_free"] + pool["pages_cached"] == pool["pages_total"]

    wait_for(idle, timeout=2.0)
    last = httpx.get(f"{chunked.base_url}/v1/requests", params={"limit": 1}).json()["data"][0]
    assert last["finish_reason"] == "abort" and last["ttft_s"] is None and last["completion_tokens"] == 0
