"""Expert traffic counters: hits, misses, CPU-computed experts, bytes copied, time.

Per layer where it matters (misses/token per layer shows which layers thrash).
Timing is wall-clock around host-side work; device copies are timed with CUDA events
resolved lazily in `snapshot()`, and counters an executor keeps on the device
(`device_hits`) are read there too, so the hot path never synchronises for statistics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from edgemoe.moe.activity import HIT, ExpertActivity


@dataclass
class MoEStats:
    num_layers: int
    first_layer: int = 0  # the MoE layer at which a forward's tokens are counted
    hits: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    cpu_experts: list[int] = field(default_factory=list)
    bytes_copied: int = 0
    tokens: int = 0  # token-layer passes / num MoE layers ≈ tokens forwarded
    copy_s: float = 0.0
    cpu_s: float = 0.0
    _events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list, repr=False)
    device_hits: torch.Tensor | None = field(default=None, repr=False)  # [L, E] int64, folded lazily
    activity: ExpertActivity | None = field(default=None, repr=False)  # per-expert marks while watched

    def __post_init__(self) -> None:
        for name in ("hits", "misses", "cpu_experts"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.num_layers)

    def count_tokens(self, layer: int, n: int) -> None:
        if layer == self.first_layer:
            self.tokens += n

    def watch(self, num_experts: int | None) -> None:
        """Start (`num_experts` given) or stop marking per-(layer, expert) activity."""
        if num_experts is None:
            self.activity = None
        elif self.activity is None:
            self.activity = ExpertActivity(self.num_layers, num_experts)

    def add_copy_interval(self, start: torch.cuda.Event, end: torch.cuda.Event) -> None:
        self._events.append((start, end))

    def count_device_hits(self, layer: int, topk_ids: torch.Tensor, num_experts: int) -> None:
        """Add the layer's distinct routed experts to a device counter (no host read).

        Per expert, at the cost of the per-layer count it replaces (one fill, one add)."""
        if self.device_hits is None:
            self.device_hits = torch.zeros(self.num_layers, num_experts, dtype=torch.int64, device=topk_ids.device)
        used = torch.zeros(num_experts, dtype=torch.int64, device=topk_ids.device)
        used.index_fill_(0, topk_ids.flatten(), 1)
        self.device_hits[layer] += used

    def resolve(self) -> None:
        if self.device_hits is not None:
            counts = self.device_hits.cpu()
            for layer, n in enumerate(counts.sum(dim=1).tolist()):
                self.hits[layer] += n
            if self.activity is not None:
                self.activity.mark_counts(counts.numpy(), HIT)
            with torch.inference_mode():  # created inside the forward: an inference tensor
                self.device_hits.zero_()
        if self._events:
            self._events[-1][1].synchronize()
            self.copy_s += sum(s.elapsed_time(e) for s, e in self._events) / 1000
            self._events.clear()

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able view: totals, hit rate, and per-layer misses per token."""
        self.resolve()
        hits, misses, cpu = sum(self.hits), sum(self.misses), sum(self.cpu_experts)
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
            "tokens": self.tokens,
            "misses_per_token": sum(per_tok),
            "misses_per_token_by_layer": per_tok,
            "hit_rate_by_layer": [
                h / (h + m) if h + m else 0.0 for h, m in zip(self.hits, self.misses, strict=True)
            ],
        }


class Stopwatch:
    """`with Stopwatch() as w: ...; w.seconds` — host wall-clock time."""

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
