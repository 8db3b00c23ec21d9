"""The MoE executor interface and the resident executor.

Executors differ only in *where* an expert's weights are when it runs: all on the
device (resident), a slot cache fed from host memory (offload, moe/offload.py), the host
CPU for misses (cpu) or misses split between the two (hybrid, moe/cpu.py). All of them
translate a layer's routing into slot ids on the device and call the one slot-addressed
kernel (`kernels/moe_experts.py`), so every residency gives the same numbers on one
device. `moe/registry.py` builds one by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import numpy as np
import torch

from edgemoe.kernels.cell_sources import CellSources
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.moe_experts import Activation, moe_combine, moe_combine_norm
from edgemoe.kernels.moe_quant import moe_slots_parts
from edgemoe.kernels.norm_fused import RowNorm, rms_norm
from edgemoe.moe.stats import MoEStats
from edgemoe.moe.store import ExpertStore
from edgemoe.profiling import DISABLED, StepProfiler


class RoutingOverride(Protocol):
    """Replaces the router's expert ids (cache studies: `moe/synthetic_routing.py`);
    the runner prepares it once per step, before the forward pass. `graph_safe`: its
    ids come from a static device buffer, so a captured step replays fresh ones."""

    label: str
    graph_safe: bool

    def ids(self, layer: int, router_ids: torch.Tensor) -> torch.Tensor: ...


class RoutingObserver(Protocol):
    """Sees every MoE layer's routed ids, in call order (`moe/routing_trace.py`)."""

    def record(self, layer: int, ids: torch.Tensor) -> None: ...


class MoEExecutor(ABC):
    """Contract: `forward(layer, x, topk_ids, topk_weights, residual=None)` returns
    sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) as [T, H] in x's dtype
    (plus `residual` when given, rounded as `residual + out` would be).

    Called once per MoE layer per step, in layer order, from the engine's forward
    thread only; `x` and the routing are valid only during the call. Executors keep
    state across calls (a cache, statistics) but the result never depends on it.
    Counters live where they are cheapest and are read lazily (`stats.snapshot()`).
    `close()` releases device memory and threads; the executor is unusable after.

    The routing hooks travel with the executor to the MoE blocks that call it (the
    runtime sets them, off by default): `routing` replaces the router's ids,
    `trace` records them.
    """

    stats: MoEStats
    profiler: StepProfiler = DISABLED  # the runtime shares its own
    graph_safe = False  # whether a forward may be captured in a CUDA graph (no host reads)
    # A host thread answers waits in its graphs with driver calls (the copier): an eager step,
    # which may load a kernel while holding the driver, starts once the step before it ended.
    quiet_eager = False
    routing: RoutingOverride | None = None
    trace: RoutingObserver | None = None

    @abstractmethod
    def forward(
        self,
        layer: int,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        residual: torch.Tensor | None = None,
        num_decode: int = 0,
        num_padding: int = 0,
    ) -> torch.Tensor:
        """`num_decode`: the leading rows of `x` that are decode tokens (kernels treat
        them apart so a decode token's result doesn't depend on its step's company).
        `num_padding`: trailing rows that only pad the batch to a CUDA-graph size; an
        executor may skip them (their output rows are then garbage, never read)."""

    def forward_normed(
        self,
        layer: int,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        residual: torch.Tensor,
        norm: RowNorm,
        num_decode: int = 0,
        num_padding: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, norm(h)) with h = `forward(...)` with `residual`: the next layer's input
        norm too. This default runs the two apart; executors whose forward ends in the
        device combine fuse them (`moe_combine_norm`), bitwise equal."""
        h = self.forward(layer, x, topk_ids, topk_weights, residual, num_decode, num_padding)
        return h, rms_norm(h, norm.weight, norm.eps, norm.weight_offset)

    # Captured forwards may differ by a mode the executor switches between steps (the
    # device cache's CPU share on or off): the runner captures each variant and replays
    # the one `graph_variant` names. One variant (None) for most executors.
    graph_variants: tuple[str | None, ...] = (None,)
    graph_variant: str | None = None

    def register_router(self, layer: int, router: torch.Tensor, bias: torch.Tensor | None = None,  # noqa: B027
                        sigmoid: bool = False, softmax: bool = False) -> None:
        """A MoE block hands over its router [E, H] and how it ranks (`prefetch.RouterScores`:
        gpt-oss's logit bias; GLM's sigmoid scores and selection bias; ERNIE's softmax
        probabilities and selection bias): decode prefetch predicts
        with the next layer's; executors that predict keep it."""

    def register_expert_bias(self, layer: int, bias: ExpertBias) -> None:
        """A model with biased experts (gpt-oss) hands over layer `layer`'s biases, resident
        for every expert; the executor's kernels add them by expert id."""
        self.__dict__.setdefault("expert_biases", {})[layer] = bias

    def host_bias(self, layer: int) -> ExpertBias | None:
        """Layer `layer`'s expert biases in host memory, where the CPU expert kernel reads
        them in place (copied at the first ask; None: no biases)."""
        bias = self.__dict__.get("expert_biases", {}).get(layer)
        if bias is None or bias.gate_up.device.type == "cpu":
            return bias
        copies = self.__dict__.setdefault("_host_biases", {})
        if layer not in copies:
            copies[layer] = ExpertBias(bias.gate_up.cpu().contiguous(), bias.down.cpu().contiguous())
        return copies[layer]

    def host_biases(self) -> dict[int, ExpertBias]:
        """`host_bias` of every layer with biases (the CPU share's mailboxes take them all)."""
        return {layer: b for layer in self.__dict__.get("expert_biases", {}) if (b := self.host_bias(layer))}

    def bias_args(self, layer: int, topk_ids: torch.Tensor) -> dict[str, object]:
        """`moe_slots_parts`' bias arguments for this layer's routing ({} without biases)."""
        bias = self.__dict__.get("expert_biases", {}).get(layer)
        return {} if bias is None else {"bias": bias, "expert_ids": topk_ids}

    def use_graph_variant(self, variant: str | None) -> None:
        """Run the following forwards as `variant` (one of `graph_variants`): the runner
        sets each in turn to capture it; `before_step` may switch between steps."""
        if variant not in self.graph_variants:
            raise ValueError(f"graph variant {variant!r}: this executor has {self.graph_variants}")
        self.graph_variant = variant

    def before_step(self, now: float, decode_batch: int | None, prompt_rows: int = 0) -> None:
        """The runner calls this on the host before each step's forward or graph replay:
        `now` (perf_counter seconds), the step's decode batch size (None: the step has
        prompt tokens) and its prompt rows. Executors that tune themselves between steps,
        or lend memory to long prompt chunks, listen."""

    def set_live_rows(self, live: torch.Tensor | None) -> None:
        """The runner names, once per step and inside what it may capture, which rows of
        the coming forward are real: `live` [T] bool on the device (a decode batch padded
        to a captured size), None when every row is. Executors that skip padding rows on
        the device use it (`num_padding` is a Python int, frozen in a captured graph)."""

    def resident_mask(self) -> np.ndarray | None:
        """[layers, experts] bool: which experts sit on the device now; None: every one."""
        return None

    def recover(self) -> None:
        """Forget per-step state after a forward aborted midway (device OOM)."""

    def close(self) -> None:
        """Release device memory and threads."""


class CellWorkspace:
    """The fp32 contribution cells [T, K, H], allocated once for the largest step
    (`max_tokens`; the memory plan counts it) at the first call, when K is known.
    `loaned`: steps of more tokens are chunks whose workspace the slot pool lends
    (`moe/slot_lending.py`; the plan counts only `max_tokens`): their cells are a buffer of
    their own, dropped with `drop_loaned` before the loan ends (the other may be captured
    in a graph: it never moves).
    NOTE: cells are not cleared between layers: every routed pair's cell is written
    exactly once per layer (the passes of one layer partition the pairs)."""

    def __init__(self, max_tokens: int, hidden: int, device: torch.device, loaned: bool = False) -> None:
        self.max_tokens, self.hidden, self.device, self.loaned = max_tokens, hidden, device, loaned
        self.buffer: torch.Tensor | None = None
        self.loaned_buffer: torch.Tensor | None = None

    def drop_loaned(self) -> None:
        self.loaned_buffer = None

    def cells(self, topk_ids: torch.Tensor) -> torch.Tensor:
        T, K = topk_ids.shape
        if self.loaned and T > self.max_tokens:
            b = self.loaned_buffer
            if b is None or T > b.shape[0] or K != b.shape[1]:
                b = self.loaned_buffer = torch.empty((T, K, self.hidden), dtype=torch.float32, device=self.device)
            return b[:T]
        b = self.buffer
        if b is None or T > b.shape[0] or K != b.shape[1]:
            rows = max(T, self.max_tokens)
            b = self.buffer = torch.empty((rows, K, self.hidden), dtype=torch.float32, device=self.device)
        return b[:T]


class CellsExecutor(MoEExecutor):
    """An executor whose layer output is its routed pairs' cells [T, K, H] summed on the
    device: `forward` combines them (residual add fused), `forward_normed` also writes the
    next layer's input norm in the same kernel (`moe_combine_norm`, bitwise the pair)."""

    def forward(self, layer, x, topk_ids, topk_weights, residual=None, num_decode=0, num_padding=0):  # type: ignore[override]
        cells = self._cells(layer, x, topk_ids, topk_weights, num_decode, num_padding)
        return moe_combine(cells, x.dtype, residual, self._take_sources())

    def forward_normed(self, layer, x, topk_ids, topk_weights, residual, norm, num_decode=0, num_padding=0):  # type: ignore[override]
        cells = self._cells(layer, x, topk_ids, topk_weights, num_decode, num_padding)
        return moe_combine_norm(cells, x.dtype, residual, norm, self._take_sources())

    @abstractmethod
    def _cells(self, layer, x, topk_ids, topk_weights, num_decode, num_padding) -> torch.Tensor:  # noqa: ANN001
        """The layer's contribution cells [T, K, H] (fp32), every real row's pairs written
        or named by `_take_sources`."""

    def _take_sources(self) -> CellSources | None:
        """The cells the last `_cells` left to be read elsewhere (`kernels/cell_sources.py`),
        once; None: its buffer holds them all."""
        return None


class ResidentExecutor(CellsExecutor):
    """Every expert of every layer on the compute device: slot = expert id."""

    graph_safe = True

    def __init__(
        self, store: ExpertStore, device: torch.device, act: Activation, num_layers: int, max_tokens: int = 256
    ) -> None:
        self.act, self.num_experts, self.format = act, store.num_experts, store.format
        # Banks in the store's format: quantised experts stay quantised on the device.
        self.banks = {i: {n: t.to(device) for n, t in store.layer_parts(i).items()} for i in store.layers}
        self.stats = MoEStats(num_layers, first_layer=store.layers[0])
        hidden = store.down_shape[0]
        self.workspace = CellWorkspace(max_tokens, hidden, device)

    def _cells(self, layer, x, topk_ids, topk_weights, num_decode, num_padding) -> torch.Tensor:  # noqa: ANN001
        """The layer's contribution cells [T, K, H], every routed pair written."""
        # NOTE: padding rows are computed (a captured graph has fixed shapes); the
        # per-pair kernels make the real rows' results the same either way.
        self.stats.count_tokens(layer, x.shape[0])
        if self.stats.all_resident is None:  # every routed pair is a hit: nothing to count per layer
            self.stats.all_resident = (tuple(self.banks), topk_ids.shape[1])
        if self.stats.activity is not None:  # a live view watches: mark the real rows' experts
            self.stats.mark_routed(layer, topk_ids[: topk_ids.shape[0] - num_padding], self.num_experts)
        cells = self.workspace.cells(topk_ids)
        moe_slots_parts(x, topk_ids, topk_weights, self.banks[layer], self.format, self.act, cells, num_decode,
                        **self.bias_args(layer, topk_ids))
        return cells

    def close(self) -> None:
        self.banks.clear()
