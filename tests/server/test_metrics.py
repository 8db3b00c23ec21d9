"""Visibility: /metrics (parsed back with prometheus_client), /v1/stats, /v1/requests,
/health and `edgemoe ctl`, over the scripted engine that reports real-shaped stats."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ops_support import family_names, metrics, start_ops_server
from server_harness import ServerHarness

from edgemoe.engine.stats_report import StatsReporter, to_engine_stats
from edgemoe.tokenizer import TokenizerBundle

USER = [{"role": "user", "content": "Tell me a story."}]

# Exactly the names of the issue (counters gain `_total` in the text format).
FAMILIES = {
    "edgemoe:num_requests_running", "edgemoe:num_requests_waiting", "edgemoe:kv_cache_usage_perc",
    "edgemoe:prompt_tokens", "edgemoe:generation_tokens", "edgemoe:prefix_cache_queries",
    "edgemoe:prefix_cache_hits", "edgemoe:request_success", "edgemoe:time_to_first_token_seconds",
    "edgemoe:inter_token_latency_seconds", "edgemoe:e2e_request_latency_seconds",
    "edgemoe:expert_cache_hits", "edgemoe:expert_cache_misses", "edgemoe:expert_bytes_copied",
    "edgemoe:experts_cpu",
}


@pytest.fixture(scope="module")
def ops(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = start_ops_server(demo_dir, demo_tokenizer)
    yield harness
    harness.stop()


def scrape(h: ServerHarness) -> str:
    r = httpx.get(f"{h.base_url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return r.text


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    for key, v in samples.get(name, {}).items():
        if all(dict(key).get(k) == want for k, want in labels.items()):
            return v
    return 0.0


def wait_for(predicate: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_metrics_names_labels_and_counts(ops: ServerHarness, demo_dir: Path) -> None:
    before = metrics(scrape(ops))
    client = ops.openai()
    done = client.chat.completions.create(model="m", messages=USER, max_tokens=5)
    streamed = list(client.chat.completions.create(model="m", messages=USER, max_tokens=4, stream=True,
                                                   stream_options={"include_usage": True}))
    usage = [done.usage, streamed[-1].usage]
    assert all(u is not None for u in usage)
    # Engine counters come with the next snapshot (at most ~0.5 s after the steps).
    wait_for(lambda: value(metrics(scrape(ops)), "edgemoe:expert_cache_hits_total") > 0)
    text = scrape(ops)
    assert family_names(text) == FAMILIES
    after = metrics(text)
    for name, samples in after.items():
        assert all(dict(key).get("model_name") == demo_dir.name for key in samples), name

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("edgemoe:prompt_tokens_total") == sum(u.prompt_tokens for u in usage if u)
    assert delta("edgemoe:generation_tokens_total") == sum(u.completion_tokens for u in usage if u)
    assert delta("edgemoe:request_success_total", finished_reason="length") == 2
    assert delta("edgemoe:time_to_first_token_seconds_count") == 2
    assert delta("edgemoe:e2e_request_latency_seconds_count") == 2
    assert delta("edgemoe:inter_token_latency_seconds_count") == (5 - 1) + (4 - 1)
    assert value(after, "edgemoe:num_requests_running") == 0
    assert value(after, "edgemoe:expert_cache_hits_total") > 0
    assert 0 <= value(after, "edgemoe:kv_cache_usage_perc") <= 1


def test_disconnected_long_stream_drops_running_to_zero(ops: ServerHarness) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "[[hang]]"}], "stream": True}
    with httpx.stream("POST", f"{ops.base_url}/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()  # NOTE: keep it alive: dropping it is the disconnect
        for _ in range(5):
            next(lines)
        assert value(metrics(scrape(ops)), "edgemoe:num_requests_running") == 1
    t0 = time.monotonic()
    wait_for(lambda: value(metrics(scrape(ops)), "edgemoe:num_requests_running") == 0, timeout=2.0)
    assert time.monotonic() - t0 < 2.0
    wait_for(lambda: not ops.engine.requests, timeout=1.0)  # aborted in the engine too
    assert value(metrics(scrape(ops)), "edgemoe:request_success_total", finished_reason="abort") >= 1


def test_stats(ops: ServerHarness) -> None:
    ops.openai().chat.completions.create(model="m", messages=USER, max_tokens=6)
    stats = httpx.get(f"{ops.base_url}/v1/stats").json()
    assert stats["object"] == "stats" and stats["window_s"] == 60 and stats["uptime_s"] > 0
    assert stats["requests"]["running"] == 0 and stats["requests"]["finished"] >= 1
    assert stats["throughput"]["generation_tokens_per_s"] > 0
    assert stats["latency"]["ttft_s"]["count"] >= 1 and stats["latency"]["ttft_s"]["p50"] > 0
    engine = stats["engine"]
    pool = engine["kv_pool"]
    # Fresh: asked for at request time, so the finished request's pages are back.
    assert pool["pages_free"] + pool["pages_cached"] == pool["pages_total"] == 64
    assert engine["expert_cache"]["hit_rate"] == pytest.approx(30 / 33)  # one float64 division each side
    assert engine["expert_cache"]["hit_rate_by_layer"] == [0.9, 0.95]
    assert engine["memory"]["plan"]["kv_tokens"] == 1024 and engine["memory"]["engine_host_rss_bytes"] > 0
    assert engine["prefix_cache"]["query_tokens"] > 0


@pytest.mark.parametrize(("query", "param"), [
    ("/v1/stats?window=abc", "window"), ("/v1/stats?window=60", "window"),
    ("/v1/requests?limit=abc", "limit"), ("/v1/requests?limit=5&limit=abc", "limit"),
    ("/v1/requests?limit=5&since=1", "since"),
])
def test_ops_query_parameters_are_checked(ops: ServerHarness, query: str, param: str) -> None:
    """A parameter a route does not take, or one given twice, is a 400 naming it, never ignored."""
    r = httpx.get(f"{ops.base_url}{query}")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{ops.base_url}/v1/stats").status_code == 200
    assert httpx.get(f"{ops.base_url}/v1/requests?limit=5").status_code == 200


def test_requests_log_has_timings_and_no_text(ops: ServerHarness) -> None:
    secret = "zebra-quartz-marker"
    ops.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": secret}], max_tokens=3)
    r = httpx.get(f"{ops.base_url}/v1/requests", params={"limit": 5})
    assert r.status_code == 200 and secret not in r.text and "zebra" not in r.text
    body = r.json()
    assert body["object"] == "list" and 1 <= len(body["data"]) <= 5
    last = body["data"][0]
    assert last["endpoint"] == "POST /v1/chat/completions" and last["status"] == "finished"
    assert last["finish_reason"] == "length" and last["completion_tokens"] == 3 and last["prompt_tokens"] > 0
    assert 0 < last["ttft_s"] <= last["e2e_s"]
    assert httpx.get(f"{ops.base_url}/v1/requests", params={"limit": 0}).status_code == 400


def test_requests_log_shows_in_flight(ops: ServerHarness) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "[[hang]]"}], "stream": True}
    with httpx.stream("POST", f"{ops.base_url}/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        next(lines)
        listing = httpx.get(f"{ops.base_url}/v1/requests").json()
        assert listing["in_flight"] == 1 and listing["data"][0]["status"] in ("queued", "running")
    wait_for(lambda: not ops.engine.requests)


def test_ops_routes_need_the_key_health_does_not(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> None:
    h = start_ops_server(demo_dir, demo_tokenizer, api_key="sekret")
    try:
        assert httpx.get(f"{h.base_url}/health").status_code == 200
        assert httpx.head(f"{h.base_url}/health").status_code == 200
        for path in ("/metrics", "/v1/stats", "/v1/requests", "/openapi.json", "/debug/engine"):
            assert httpx.get(f"{h.base_url}{path}").status_code == 401, path
            ok = httpx.get(f"{h.base_url}{path}", headers={"Authorization": "Bearer sekret"})
            assert ok.status_code == 200, path
    finally:
        h.stop()


def test_ctl_prints_for_a_person(ops: ServerHarness, capsys: pytest.CaptureFixture[str]) -> None:
    from edgemoe.cli import main

    ops.openai().chat.completions.create(model="m", messages=USER, max_tokens=2)
    assert main(["ctl", "health", "--url", ops.base_url]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["ctl", "stats", "--url", ops.base_url]) == 0
    out = capsys.readouterr().out
    assert "KV pool" in out and "TTFT" in out and "expert cache" in out
    assert main(["ctl", "requests", "--url", ops.base_url, "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "/v1/chat/completions" in out and "length" in out
    assert main(["ctl", "health", "--url", "http://127.0.0.1:9"]) == 1  # nobody listens
    assert "cannot reach" in capsys.readouterr().err


def test_stats_reporter_timing() -> None:
    calls: list[int] = []

    def stats() -> dict[str, Any]:
        calls.append(1)
        return {"kv_pages_total": 8, "kv_pages_free": 8, "prefix_cache": {"hit_tokens": 3}}

    reporter = StatsReporter(stats, interval_s=0.5)
    first = reporter.due(now=10.0)  # the first snapshot goes out at once
    assert first is not None and first.kv_pages_total == 8 and first.prefix_cache_hit_tokens == 3
    assert reporter.due(now=10.1) is None  # nothing changed
    reporter.changed()
    assert reporter.due(now=10.2) is None  # changed, but too soon
    assert reporter.due(now=10.6) is not None
    reporter.ask()
    assert reporter.due(now=10.61) is not None  # asked: at once
    assert StatsReporter(None).due() is None and len(calls) == 3


def test_engine_stats_conversion_is_lenient() -> None:
    empty = to_engine_stats({})
    assert empty.kv_pages_total == 0 and empty.expert_cache is None and empty.memory_plan == {}
    odd = to_engine_stats({"memory_plan": {"a": 1, "b": [1, 2], "c": None}, "moe": {"hits": 2.0}})
    assert odd.memory_plan == {"a": 1, "c": None} and odd.expert_cache is not None and odd.expert_cache.hits == 2

