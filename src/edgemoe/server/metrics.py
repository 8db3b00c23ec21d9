"""`GET /metrics`: Prometheus text with vLLM's metric names under the `edgemoe:` prefix.

Each app has a private `CollectorRegistry` (several servers share a test process).
Latency histograms and token/finish counters are fed by the request tracker as
outputs arrive; the request gauges are read from the tracker at scrape time; KV
occupancy, prefix-cache and expert-cache counters come from the engine's latest
`EngineStats` snapshot (at most half a second old while busy). Label: `model_name`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edgemoe.messages import EngineStats

# NOTE: process-wide. The `*_created` series are noise to dashboards and would add
# names beyond the documented ones.
prometheus_client.disable_created_metrics()

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST

# Buckets as vLLM's, so existing dashboards' quantiles mean the same.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)

LiveCounts = Callable[[], tuple[int, int]]  # (running, waiting)


class _LiveCollector(Collector):
    """Gauges and engine-side counters, computed at scrape time."""

    def __init__(self, model_name: Callable[[], str | None], live: LiveCounts,
                 engine_stats: Callable[[], EngineStats | None]) -> None:
        self._model_name = model_name
        self._live = live
        self._engine_stats = engine_stats

    def collect(self) -> Iterator[Metric]:
        name = self._model_name()
        if name is None:
            return  # nothing is served yet: no label value to report under
        running, waiting = self._live()
        yield _gauge("num_requests_running", "Requests generating tokens", name, running)
        yield _gauge("num_requests_waiting", "Requests queued: submitted, no token yet", name, waiting)
        stats = self._engine_stats()
        if stats is None:
            return
        total = stats.kv_pages_total
        # Pages only the prefix cache holds are reclaimable on demand: not "used".
        used = total - stats.kv_pages_free - stats.kv_pages_evictable
        yield _gauge("kv_cache_usage_perc", "KV-cache pages in use, 0 to 1", name, used / total if total else 0.0)
        yield _counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache", name,
                       stats.prefix_cache_query_tokens)
        yield _counter("prefix_cache_hits", "Prompt tokens served by the prefix cache", name,
                       stats.prefix_cache_hit_tokens)
        experts = stats.expert_cache
        if experts is None:
            return
        yield _counter("expert_cache_hits", "Expert uses served from device slots", name, experts.hits)
        yield _counter("expert_cache_misses", "Expert uses not in a device slot", name, experts.misses)
        yield _counter("expert_bytes_copied", "Expert bytes copied host to device", name, experts.bytes_copied)
        yield _counter("experts_cpu", "Experts computed on the CPU", name, experts.experts_cpu)


def _gauge(name: str, doc: str, model: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"edgemoe:{name}", doc, labels=["model_name"])
    family.add_metric([model], value)
    return family


def _counter(name: str, doc: str, model: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(f"edgemoe:{name}", doc, labels=["model_name"])
    family.add_metric([model], value)
    return family


class ServerMetrics:
    """The registry and the instruments the tracker feeds."""

    def __init__(self, model_name: Callable[[], str | None], live: LiveCounts,
                 engine_stats: Callable[[], EngineStats | None]) -> None:
        self.registry = CollectorRegistry()
        self._model_name = model_name
        r, labels = self.registry, ["model_name"]
        self._ttft = Histogram("edgemoe:time_to_first_token_seconds", "Arrival to first token",
                               labels, buckets=TTFT_BUCKETS, registry=r)
        self._itl = Histogram("edgemoe:inter_token_latency_seconds", "Time between output tokens",
                              labels, buckets=ITL_BUCKETS, registry=r)
        self._e2e = Histogram("edgemoe:e2e_request_latency_seconds", "Arrival to last token",
                              labels, buckets=E2E_BUCKETS, registry=r)
        self._prompt = Counter("edgemoe:prompt_tokens", "Prompt tokens processed", labels, registry=r)
        self._generation = Counter("edgemoe:generation_tokens", "Tokens generated", labels, registry=r)
        self._success = Counter("edgemoe:request_success", "Requests ended, by finish reason",
                                ["model_name", "finished_reason"], registry=r)
        r.register(_LiveCollector(model_name, live, engine_stats))

    def _label(self) -> str:
        return self._model_name() or ""

    def first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        self._ttft.labels(self._label()).observe(ttft_s)
        self._prompt.labels(self._label()).inc(prompt_tokens)

    def tokens(self, n: int, interval_s: float | None) -> None:
        """`n` tokens arrived, `interval_s` after the previous ones (None: the first)."""
        self._generation.labels(self._label()).inc(n)
        if interval_s is not None and n:
            per_token = interval_s / n
            for _ in range(n):
                self._itl.labels(self._label()).observe(per_token)

    def finished(self, reason: str, e2e_s: float) -> None:
        self._success.labels(self._label(), reason).inc()
        self._e2e.labels(self._label()).observe(e2e_s)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
