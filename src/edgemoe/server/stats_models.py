"""Response shapes of the operations endpoints (`/health`, `/v1/stats`, `/v1/requests`).

Pydantic models, so the OpenAPI document describes exactly what is sent (schemathesis
checks every response against it) and `edgemoe ctl` can rely on the fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Health(BaseModel):
    status: Literal["ok"]
    model: str
    uptime: float  # seconds since the server started


class Summary(BaseModel):
    """Percentiles over the window (None: no sample in it)."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


class RequestCounts(BaseModel):
    running: int
    queued: int
    finished: int  # since the server started
    by_finish_reason: dict[str, int]
    finished_per_s: float


class Throughput(BaseModel):
    prompt_tokens_per_s: float
    generation_tokens_per_s: float


class Latency(BaseModel):
    ttft_s: Summary
    inter_token_s: Summary
    e2e_s: Summary


class KVPool(BaseModel):
    """Pages: free + cached (prefix cache) + owned by running requests == total."""

    pages_total: int
    pages_free: int
    pages_cached: int
    pages_evictable: int  # cached pages no request uses
    pages_in_use: int  # total - free - evictable
    usage: float  # pages_in_use / pages_total


class PrefixCache(BaseModel):
    queries: int
    query_tokens: int
    hit_tokens: int
    hit_rate: float  # hit_tokens / query_tokens


class ExpertCache(BaseModel):
    hits: int
    misses: int
    hit_rate: float
    experts_cpu: int
    bytes_copied: int
    tokens: int
    misses_per_token: float
    hit_rate_by_layer: list[float]


class Memory(BaseModel):
    plan: dict[str, int | float | str | bool | None]  # the engine's device memory plan, bytes
    device_allocated_bytes: int | None
    device_reserved_bytes: int | None
    engine_host_rss_bytes: int | None


class EngineView(BaseModel):
    age_s: float  # how old the snapshot is
    requests_running: int
    requests_waiting: int
    moe_backend: str | None
    kv_pool: KVPool
    prefix_cache: PrefixCache
    expert_cache: ExpertCache | None
    memory: Memory


class Stats(BaseModel):
    object: Literal["stats"] = "stats"
    model: str | None
    uptime_s: float
    window_s: int
    requests: RequestCounts
    throughput: Throughput
    latency: Latency
    engine: EngineView | None  # None until the engine sent its first snapshot


class RequestEntry(BaseModel):
    id: str
    endpoint: str
    status: Literal["queued", "running", "finished"]
    arrival: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None
    e2e_s: float | None
    decode_tokens_per_s: float | None
    finish_reason: str | None
    error: str | None


class RequestList(BaseModel):
    object: Literal["list"] = "list"
    in_flight: int
    data: list[RequestEntry]  # in-flight requests first, then finished ones, newest first


class ExpertMapView(BaseModel):
    """`cells[i][e]`: MoE layer `layers[i]`, expert e, since the previous frame: "0" not on the
    device, "1" resident (in a slot), "2" hit, "3" miss (copied in), "4" computed on the CPU."""

    layers: list[int]
    num_experts: int
    cells: list[str]


class LiveRates(BaseModel):
    """Tokens per second over the last frame's interval (`seconds`)."""

    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    seconds: float


class LiveFrame(BaseModel):
    """One frame of `GET /v1/stats/stream`."""

    object: Literal["stats.frame"] = "stats.frame"
    time: float  # the server's wall clock
    interval_s: float
    stats: Stats  # as GET /v1/stats
    rates: LiveRates
    in_flight: list[RequestEntry]  # newest first, at most 50
    experts: ExpertMapView | None  # None: not asked for, or no new map since the last frame
