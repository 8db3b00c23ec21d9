"""Expert traffic counters: hits, misses, CPU-computed experts, bytes copied, time.

Per layer where it matters (misses/token per layer shows which layers thrash).
Timing is wall-clock around host-side work; device copies are timed with CUDA events
resolved lazily in `snapshot()`, so the hot path never synchronises for statistics.
With every expert resident nothing is counted per layer at all: each routed (token, k)
pair of each MoE layer is a hit, derived from the token count (`all_resident`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from edgemoe.moe.activity import HIT, ExpertActivity


@dataclass
class MoEStats:
    num_layers: int
    first_layer: int = 0  # the MoE layer at which a forward's tokens are counted
    count_in_forward: bool = True
    hits: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    cpu_experts: list[int] = field(default_factory=list)
    bytes_copied: int = 0
    tokens: int = 0  # token-layer passes / num MoE layers ≈ tokens forwarded
    copy_s: float = 0.0
    cpu_s: float = 0.0
    cpu_calls: int = 0  # CPU jobs timed into cpu_s where an executor counts them (the device cache's share)
    _events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list, repr=False)
    all_resident: tuple[tuple[int, ...], int] | None = None  # (MoE layers, top_k): hits = tokens × top_k
    # Labels and live figures executors add (CPU kernel, split controller): in every snapshot.
    info: dict[str, Any] = field(default_factory=dict)
    sources: list[Callable[[], dict[str, Any]]] = field(default_factory=list, repr=False)
    activity: ExpertActivity | None = field(default=None, repr=False)  # per-expert marks while watched
    routed: torch.Tensor | None = field(default=None, repr=False)  # [L, E] device marks while watched (resident)
    # Counts kept on the device (the device expert cache): each drain moves them into the
    # fields above with one read, at `resolve` time only (never per layer).
    drains: list[Callable[[MoEStats], None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        for name in ("hits", "misses", "cpu_experts"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.num_layers)

    def count_tokens(self, layer: int, n: int) -> None:
        """Executors called directly (tests, tools) count their tokens at the first MoE
        layer; the engine's runner counts a step's real tokens with `add_tokens` and
        switches this off (padded CUDA-graph batches would inflate it)."""
        if layer == self.first_layer and self.count_in_forward:
            self.tokens += n

    def add_tokens(self, n: int) -> None:
        self.tokens += n

    def watch(self, num_experts: int | None) -> None:
        """Start (`num_experts` given) or stop marking per-(layer, expert) activity."""
        if num_experts is None:
            self.activity, self.routed = None, None
        elif self.activity is None:
            self.activity = ExpertActivity(self.num_layers, num_experts)

    def mark_routed(self, layer: int, topk_ids: torch.Tensor, num_experts: int) -> None:
        """While watched, mark the layer's routed experts on the device (one fill, no host
        read); `resolve` turns them into hits. Only eager forwards get here: a captured
        CUDA graph replays without it."""
        if self.routed is None:
            self.routed = torch.zeros(self.num_layers, num_experts, dtype=torch.uint8, device=topk_ids.device)
        self.routed[layer].index_fill_(0, topk_ids.flatten(), 1)

    def add_copy_interval(self, start: torch.cuda.Event, end: torch.cuda.Event) -> None:
        self._events.append((start, end))

    def reset(self) -> None:
        """Forget every count (after warm-up and graph capture)."""
        self.resolve()
        self.hits, self.misses, self.cpu_experts = [0] * self.num_layers, [0] * self.num_layers, [0] * self.num_layers
        self.bytes_copied, self.tokens, self.copy_s, self.cpu_s, self.cpu_calls = 0, 0, 0.0, 0.0, 0

    def resolve(self) -> None:
        for drain in self.drains:
            drain(self)
        if self.routed is not None and self.activity is not None:
            self.activity.mark_counts(self.routed.cpu().numpy(), HIT)
            with torch.inference_mode():  # created inside the forward: an inference tensor
                self.routed.zero_()
        if self._events:
            self._events[-1][1].synchronize()
            self.copy_s += sum(s.elapsed_time(e) for s, e in self._events) / 1000
            self._events.clear()

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able view: totals, hit rate, and per-layer misses per token."""
        self.resolve()
        layer_hits = list(self.hits)
        if self.all_resident is not None:
            layers, top_k = self.all_resident
            for layer in layers:
                layer_hits[layer] += self.tokens * top_k
        hits, misses, cpu = sum(layer_hits), sum(self.misses), sum(self.cpu_experts)
        uses = hits + misses
        per_tok = [m / self.tokens if self.tokens else 0.0 for m in self.misses]
        return {
            "hits": hits,
            "misses": misses,
            "hit_rate": hits / uses if uses else 0.0,
            "experts_cpu": cpu,
            "bytes_copied": self.bytes_copied,
            "copy_seconds": self.copy_s,
            "cpu_seconds": self.cpu_s,
            **({"cpu_calls": self.cpu_calls, "cpu_us_per_call": round(self.cpu_s / self.cpu_calls * 1e6, 1)}
               if self.cpu_calls else {}),
            "tokens": self.tokens,
            "misses_per_token": sum(per_tok),
            "misses_per_token_by_layer": per_tok,
            "hit_rate_by_layer": [
                h / (h + m) if h + m else 0.0 for h, m in zip(layer_hits, self.misses, strict=True)
            ],
            **self.info,
            **{k: v for source in self.sources for k, v in source().items()},
        }


class Stopwatch:
    """`with Stopwatch() as w: ...; w.seconds` — host wall-clock time."""

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
