"""`GET /v1/stats/stream`: frames over the real link from an engine double that keeps an
expert map; the API key, bounds, the watch lease, and merging maps between frames."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import ScriptedEngine, ServerHarness
from server_scripts import SCRIPTS

from edgemoe.engine.stats_report import StatsReporter
from edgemoe.messages import EngineStats, ExpertMap
from edgemoe.server.config import ServerConfig
from edgemoe.server.live import ExpertMapMerger, merge_cells
from edgemoe.tokenizer import TokenizerBundle

KEY = "sk-live"


class WatchedEngine(ScriptedEngine):
    """A scripted engine with statistics and an expert map that marks expert `n % 4` of
    layer 0 as a miss on its n-th map."""

    def __init__(self, tokenizer: TokenizerBundle) -> None:
        super().__init__(tokenizer, SCRIPTS)
        self.watch_calls: list[bool] = []
        self.maps = 0

    def stats(self) -> dict[str, Any]:
        return {"moe_backend": "offload", "moe": {"hits": 3, "misses": 1, "tokens": 1},
                "kv_pages_total": 4, "kv_pages_free": 4, "memory_plan": {"num_slots": 2}}

    def watch_experts(self, on: bool) -> None:
        self.watch_calls.append(on)

    def expert_map(self) -> dict[str, Any]:
        cells = ["1100", "0000"]
        n = self.maps % 4
        cells[0] = cells[0][:n] + "3" + cells[0][n + 1:]
        self.maps += 1
        return {"layers": [0, 2], "num_experts": 4, "cells": cells}


@pytest.fixture(scope="module")
def live(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Any:
    engine = WatchedEngine(demo_tokenizer)
    harness = ServerHarness(engine, engine.ready(demo_dir), ServerConfig(api_key=KEY)).start()
    yield harness
    harness.stop()


def _frames(url: str, n: int, query: str = "interval=0.1") -> list[dict[str, Any]]:
    frames = []
    with httpx.stream("GET", f"{url}/v1/stats/stream?{query}", headers={"x-api-key": KEY}, timeout=10) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                frames.append(json.loads(line[6:]))
                if len(frames) == n:
                    break
    return frames


def test_frames_carry_stats_rates_and_expert_maps(live: Any) -> None:
    frames = _frames(live.base_url, 4)
    for f in frames:
        assert f["object"] == "stats.frame" and f["interval_s"] == 0.1
        assert f["stats"]["object"] == "stats" and f["stats"]["engine"]["moe_backend"] == "offload"
        assert f["rates"]["seconds"] > 0 and f["in_flight"] == []
    maps = [f["experts"] for f in frames if f["experts"]]
    assert maps and all(m["layers"] == [0, 2] and m["num_experts"] == 4 for m in maps)
    assert all(m["cells"][1] == "0000" and m["cells"][0].count("3") >= 1 for m in maps)
    assert live.engine.watch_calls[0] is True  # asking for the map turned marking on


def test_key_and_bounds(live: Any) -> None:
    assert httpx.get(f"{live.base_url}/v1/stats/stream", timeout=5).status_code == 401
    for bad in ("interval=0.01", "interval=11", "interval=x", "experts=maybe", "window=5", "interval=1&interval=x"):
        r = httpx.get(f"{live.base_url}/v1/stats/stream?{bad}", headers={"x-api-key": KEY}, timeout=5)
        assert r.status_code == 400, bad
    frames = _frames(live.base_url, 2, "interval=0.1&experts=false")
    assert all(f["experts"] is None for f in frames)


def test_watch_lease_ends_without_requests() -> None:
    class Engine:
        calls: list[bool] = []

        def watch_experts(self, on: bool) -> None:
            self.calls.append(on)

        def expert_map(self) -> dict[str, Any]:
            return {"layers": [0], "num_experts": 2, "cells": ["12"]}

    engine = Engine()
    reporter = StatsReporter(lambda: {}, engine, interval_s=0.5, lease_s=5.0)
    reporter.ask(experts=True, now=100.0)
    reporter.ask(experts=True, now=101.0)  # renewing does not turn it on twice
    snap = reporter.due(now=101.0)
    assert snap is not None and snap.experts is not None and snap.experts.cells == ["12"]
    assert engine.calls == [True]
    reporter.ask(now=105.0)  # a plain request does not renew the lease
    assert reporter.due(now=105.5) is not None and reporter.watching
    reporter.changed()
    snap = reporter.due(now=106.5)  # past the lease: marking stops, no map
    assert engine.calls == [True, False] and not reporter.watching and snap is not None and snap.experts is None


def test_merging_keeps_every_event() -> None:
    assert merge_cells("0234", "1100") == "1234"  # events stay, residency from the newer map
    assert merge_cells("2100", "3011") == "3011"
    merger = ExpertMapMerger()
    for cells in (["2000"], ["0300"], ["1104"]):
        merger.add(EngineStats(time=time.time(), experts=ExpertMap(layers=[1], num_experts=4, cells=cells)))
    merged = merger.take()
    assert merged is not None and merged.cells == ["2304"] and merger.take() is None
