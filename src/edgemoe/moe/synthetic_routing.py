"""Synthetic routing for cache studies (`--routing synthetic[:key=value,…]`): the router's
choices replaced by a seeded process with the temporal statistics published for
Qwen3-30B-A3B, so slot policies and prefetchers can be compared on random weights.

Targets (defaults; overridable): `repeat` — the share of a token's K experts that the
previous token also used (~0.45); `window` — the share used by one of the previous 8
tokens (~0.80); `top` — the most used expert's share of a layer's routes (~0.05).

The process, per MoE layer and per sequence (all layers at once, vectorised):
- popularity: Zipf over a seeded permutation of the experts, p_e ∝ rank^-s;
- token t keeps each expert of token t-1 with probability `keep`, takes back each
  expert of tokens t-2 … t-8 (not in t-1) with probability `back` (as many as fit, in a
  random order), and fills the rest of its K by popularity without replacement: in the
  order experts first come up in independent popularity draws (the order Gumbel top-k
  or an exponential race gives);
- (s, keep, back) are calibrated at construction (a few hundred simulated tokens,
  common random numbers, damped fixed-point steps) so that the measured statistics
  hit the targets for this model's E and K.
The process itself (`Params`, `Stream`, `RoutingProcess`) is `moe/synthetic_process.py`;
here: its calibration, its statistics, and the router override the engine carries.
Sequences keep their own history and random numbers (keyed by page-table row, reset
when a sequence starts at position 0; numbered in the order they start), so a sequence's
ids don't depend on what shares its steps, and overlap scheduling's extra step for a
request that has just finished shifts no other sequence's draws. The router's top-k
weights are kept, its ids replaced (on a padded decode batch's padding rows the router's
ids stay: no draws for them). The ids are staged in one static device buffer, so decode
steps replay from CUDA graphs as with the router. Off by default; `serve` refuses it;
every output that it affects says so.

Decode prefetch's predictor under synthetic routing reads the drawn ids (an oracle), or, with
`recall` below 1, a guess drawn from them per step (`moe/noisy_prediction.py`), staged in a
buffer of its own, for decode steps of up to `PREDICTED_ROWS` tokens: wider steps never
prefetch (the slots hold a decode step's experts, not a prompt chunk's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from edgemoe.moe.noisy_prediction import predict
from edgemoe.moe.routing_spec import WINDOW, RoutingSpec
from edgemoe.moe.staged_ids import StagedIds
from edgemoe.moe.synthetic_process import Params, RoutingProcess, Stream

__all__ = ["Params", "RoutingProcess", "Stream", "SyntheticRouting", "calibrate", "measure"]

PREDICTED_ROWS = 64  # the widest step whose prefetch guess is drawn (decode prefetch's steps are narrower)

if TYPE_CHECKING:
    from edgemoe.moe.executor import RoutingObserver


def measure(ids: np.ndarray, experts: int) -> tuple[float, float, float]:
    """(repeat, window, top) of one sequence's routing [T, layers, K], averaged over layers."""
    T, L, K = ids.shape
    used = np.zeros((T, L, experts), dtype=bool)
    np.put_along_axis(used, ids, True, axis=2)
    repeat = (used[1:] & used[:-1]).sum() / ((T - 1) * L * K)
    seen = np.zeros((T - WINDOW, L, experts), dtype=bool)
    for lag in range(1, WINDOW + 1):
        seen |= used[WINDOW - lag : T - lag]
    window = (used[WINDOW:] & seen).sum() / ((T - WINDOW) * L * K)
    top = (used.sum(0).max(1) / (T * K)).mean()
    return float(repeat), float(window), float(top)


def calibrate(spec: RoutingSpec, layers: int, experts: int, top_k: int, tokens: int = 384,
              steps: int = 14) -> Params:
    """(zipf, keep, back) whose measured statistics approach the targets; a few hundred
    tokens over min(layers, 16) layers per evaluation, the same random numbers each time
    so the steps see the parameters' effect, not noise."""
    params = Params(zipf=0.6, keep=spec.repeat, back=0.1)
    probe_layers = min(layers, 16)
    for _ in range(steps):
        proc = RoutingProcess(probe_layers, experts, top_k, params, seed=spec.seed + 7919)
        repeat, window, top = measure(proc.tokens(proc.stream(), tokens), experts)
        params = Params(
            zipf=float(np.clip(params.zipf + 0.4 * (np.log(spec.top) - np.log(top)), 0.0, 4.0)),
            keep=float(np.clip(params.keep + (spec.repeat - repeat), 0.0, 1.0)),
            back=float(np.clip(params.back + 0.5 * ((spec.window - window) - (spec.repeat - repeat)), 0.0, 1.0)),
        )
    return params


class SyntheticRouting:
    """The router override an executor carries (`MoEExecutor.routing`): `prepare(the
    step's real chunks' host metadata, rows)` once per step, before its forward, draws
    every layer's experts for the step's real tokens and stages them on the device
    (`moe/staged_ids.py`: one static buffer); `ids(layer, router_ids)` hands layer
    `layer`'s [T, K] view of it: the drawn ids on the real rows, the router's on padding
    rows. Graph-safe: a captured decode step reads whatever the latest `prepare` staged.
    `trace` (the runtime's `RoutingTrace`) hears each step's draws per MoE layer from
    here, so a recorded trace holds graph-replayed steps too."""

    graph_safe = True

    def __init__(self, spec: RoutingSpec, moe_layers: Sequence[int], experts: int, top_k: int,
                 max_tokens: int = 256, device: torch.device | str = "cpu") -> None:
        self.spec, self.label = spec, spec.label
        self.moe_layers = list(moe_layers)
        self.index = {layer: i for i, layer in enumerate(moe_layers)}
        self.params = calibrate(spec, len(moe_layers), experts, top_k)
        self.process = RoutingProcess(len(moe_layers), experts, top_k, self.params, spec.seed)
        self.streams: dict[int, Stream] = {}  # by page-table row
        self.started = 0  # sequences so far: the next one's ordinal (its random numbers)
        self.staged = StagedIds(len(moe_layers), top_k, max_tokens, device)
        self.predicted = StagedIds(len(moe_layers), top_k, min(max_tokens, PREDICTED_ROWS), device) \
            if spec.recall < 1 else None  # None: prefetch reads `staged`, the oracle
        self.guess_rng = np.random.default_rng([spec.seed, 0x9E55])  # the guesses' own numbers
        self.last = np.zeros((len(moe_layers), 0, top_k), np.int64)  # the latest draws [layers, n, K]
        self.trace: RoutingObserver | None = None
        self.draw_seconds = 0.0  # host time in the draws the device idled for (benchmarks subtract it)

    def prepare(self, q_lens: Sequence[int], seq_lens: Sequence[int], rows: Sequence[int],
                padded: int | None = None) -> None:
        """Draw the step's ids for its real chunks (padding chunks draw nothing, so the
        process is the same with and without padding); `padded`: the router's row count
        when the batch is padded (default: the real tokens)."""
        parts, t0 = [], time.perf_counter()
        for n, total, row in zip(q_lens, seq_lens, rows, strict=True):
            if total == n or row not in self.streams:  # a sequence starting at position 0: fresh history
                self.streams[row] = self.process.stream(self.started)
                self.started += 1
            parts.append(self.process.tokens(self.streams[row], n))
        self._count_draw_time(time.perf_counter() - t0)
        ids = np.concatenate(parts) if parts else np.zeros((0, self.process.layers, self.process.top_k), np.int64)
        self.last = np.ascontiguousarray(ids.transpose(1, 0, 2))
        rows = ids.shape[0] if padded is None else padded
        self.staged.stage(self.last, rows)
        self._stage_guess(rows)
        if self.trace is not None:
            for i, layer in enumerate(self.moe_layers):
                self.trace.record(layer, torch.from_numpy(self.last[i]))

    def _stage_guess(self, rows: int) -> None:
        """The prefetch predictor's guess at this step's draws (`recall` < 1), for a step
        narrow enough to prefetch; its host time counts with the draws'."""
        if self.predicted is None or rows > self.predicted.max_tokens:
            return
        t0 = time.perf_counter()
        guess = predict(self.last, self.spec.recall, self.process, self.guess_rng, self.spec.precision)
        self._count_draw_time(time.perf_counter() - t0)
        self.predicted.stage(guess, rows)

    def _count_draw_time(self, seconds: float) -> None:
        """A step's draws idle the device only if nothing is running once they are done
        (overlap scheduling draws step N+1's ids while step N computes: those cost nothing).
        NOTE: a device that finished during the draws counts them whole: the benchmark's
        draw-free rate errs low."""
        idle = not self.staged.cuda or torch.cuda.current_stream(self.staged.buffer.device).query()
        if idle:
            self.draw_seconds += seconds

    def ids(self, layer: int, router_ids: torch.Tensor) -> torch.Tensor:
        return self.staged.view(self.index[layer], router_ids)

    def real_ids(self, layer: int, fill: torch.Tensor) -> torch.Tensor:
        """The step's draws for `layer` on its real rows, `fill`'s on the padding rows."""
        return self.staged.view_real(self.index[layer], fill)

    def predicted_ids(self, layer: int, fill: torch.Tensor) -> torch.Tensor:
        """Decode prefetch's guess at `layer`'s draws (`real_ids` itself at recall 1), `fill`'s
        on the padding rows."""
        staged = self.staged if self.predicted is None else self.predicted
        return staged.view_real(self.index[layer], fill)
