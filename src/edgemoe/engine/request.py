"""Per-request engine state."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from edgemoe.cache.prefix_cache import Snapshot
from edgemoe.messages import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """A request's tokens and where their KV lives.

    `num_computed` counts the leading tokens of `all_ids` whose KV is in the pool. The
    rest is still to compute: many tokens while prefilling, exactly one (the last
    sampled token) while decoding. After a preemption it drops back to 0 and the whole
    sequence is recomputed, which reproduces the same KV.

    `num_pending` (overlap scheduling) counts tokens sampled on the device whose ids have
    not reached the host yet: they follow `output_ids`, count in `num_tokens` (positions,
    pages, limits) and are fed to the next step from the device (engine/batch_buffers.py).
    NOTE: a request with pending tokens is never preempted or re-admitted, so `num_pending`
    is 0 whenever its rows are (re)written from the host lists.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    row: int | None = None  # page-table (and sampling-state) row while running
    sampling_row: int | None = None  # the row whose sampling state was written for it
    seed: int | None = None  # sampling seed (its own, or drawn by the engine)
    num_computed: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prefix_handle: object | None = None  # locked prefix-cache match while pages are held
    num_cached: int | None = None  # prompt tokens served by the prefix cache (first admission)
    snapshots: list[Snapshot] = field(default_factory=list)  # hybrid models: its GDN state copies (rows it owns)
    num_pending: int = 0  # sampled on the device, ids not on the host yet (overlap scheduling)

    @property
    def num_tokens(self) -> int:
        """Positions of the sequence so far, pending tokens included."""
        return len(self.prompt_ids) + len(self.output_ids) + self.num_pending

    @property
    def num_known(self) -> int:
        """Tokens whose ids the host has: the prompt and the appended outputs."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_generated(self) -> int:
        """Tokens sampled so far, pending ones included (min_tokens, max_tokens)."""
        return len(self.output_ids) + self.num_pending

    @property
    def num_remaining(self) -> int:
        return self.num_tokens - self.num_computed

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output (known tokens only), without building
        the concatenation."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]
