"""The CPU's share of the device expert cache's misses, inside the step (`--moe-backend
hybrid|auto --expert-cache device`): no host read, so a decode step with CPU experts still
replays from one CUDA graph.

Per MoE layer (`begin` before the layer's waves are planned, `join` before the k-sum):
1. On the device (`kernels/share_split.py`, one launch): the layer's misses against the
   slot map, and the `quota[layer]` coldest of them go to the CPU: lowest heat first (a
   decayed count of the layer's routings of each expert over earlier decode steps), ties
   to the higher id. A hot miss (routed often lately: likely routed again soon) is worth
   its slot; a cold one is computed where it lies and evicts nothing (an admission
   filter, as TinyLFU's). Their pairs become -1 in the routing the cache plans, so they
   take no slot and change no cache state (the plan is the cache's plan of the routing
   without them). Their pairs (token row, expert, pair index, weight), their count and
   the step's token rows are written into the mailbox (`kernels/cpu_host_layer.py`),
   pinned host memory the device writes through mapped views.
2. Hand-off: the bell rings (`kernels/cpu_bell.py`: a word the C thread polls for, written
   by step 1's launch itself in a decode step, else by a stream memory write after it)
   and the thread runs `em_host_layer(mailbox)`: the C kernel computes
   the CPU pairs' weighted cells from the store's banks while the stream moves and
   computes the GPU's pairs. Where the driver can't (no stream memory operations in
   graphs) or `EDGEMOE_CPU_BELL=0`: a side stream runs the same function as a host
   function (`kernels/host_func.py`; a host node in a captured graph), ~20% slower at
   16 GiB (docs/benchmarks.md).
3. Join: the bell's answer is awaited — by the combine's launch itself where step 1's
   launch rang (it spins on the answer word), else by the stream (or it waits for the
   side stream); `moe_combine`'s fixed-order k-sum follows, reading the CPU's cells from
   the mailbox where they lie (`join` hands it their columns and the turn to await:
   `kernels/cell_sources.py`; until 2026-12-04 a launch of its own copied them into the
   step's [T, K, H] cells first).
On a CPU the host function is called directly at step 2 (the same mailbox and function).

Steps of more than `rows` tokens (prompt chunks) run every miss on the device, unless the
prompt rule is on (`prompt_rows`, `--prompt-cpu`): then chunks of up to `prompt_rows`
tokens give the CPU the misses with the fewest tokens, as many as its predicted time
(`rates`, `share_rates`) stays within the device's for the rest (their copies and every
routed expert's GEMMs but the CPU's) — a short agent turn
routes a few tokens to almost every expert, and copying an expert for them costs more
than computing them where they lie.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.nn.functional import silu

from edgemoe.env_switch import env_whole
from edgemoe.kernels.cell_sources import CellSources
from edgemoe.kernels.cpu_bell import BellTurn, CpuBell, await_turn, bell_supported, bell_wanted, quiet_wanted
from edgemoe.kernels.cpu_host_layer import HostLayerMailboxes, MailboxBuffers
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.moe_reference import Activation
from edgemoe.kernels.share_split import drop_cpu_picks, rings_itself, share_begin
from edgemoe.kernels.share_state import DECODE, FRACTION_ONE, PROMPT, ShareState
from edgemoe.moe import share_prior
from edgemoe.moe.controller import FLOOR_S, NOISE, LinearCost
from edgemoe.moe.pinning import uva_view
from edgemoe.moe.quota_levels import LevelScale
from edgemoe.moe.store import ExpertStore

log = logging.getLogger(__name__)

ROWS = 64  # token rows of the largest decode step with a CPU share
HEAT_UNIT = 1 << 10  # one routing's heat (integers: the same bits on every device)
PROMPT_PAIRS = 4096  # CPU pairs a prompt chunk's layer may take (the mailbox's cells: 4096 x H fp32)
# Fixed estimates for the prompt rule (GB/s of expert bytes; flop/s of an expert's
# tokens on the CPU): the device cache's gather in the engine, the C kernel's layer calls
# and its multi-token rate, as `edgemoe bench bw` measured them on the GPU machine's 16
# cores (bench/results/bw-20261202-144806.json: 8 experts a call at one token; one expert
# at 32 tokens, 463 µs: ~11 µs a token past its bytes). The CPU's two are replaced at
# start-up by this machine's own calls (`moe/share_prior.py`) unless EDGEMOE_SHARE_PRIOR=0;
# the device's stay (EDGEMOE_SHARE_GEMM_NS replaces the GEMMs' for an A/B). Priors the fit corrects.
DEVICE_GBPS = 45.0
# A routed expert's device time in a prompt chunk beyond its copy: its grouped GEMMs (a
# 512-token fp8 prompt's profile: 25.6 ms a step over 48 layers of ~90 device experts,
# ~6 µs each: ~35 tokens in 64-row tiles, the tiles' count rather than the bytes) and its
# share of the layer's other launches. Counted as 0: in a warmed engine 12 µs was the best
# of 0 / 6 / 12 / 24 (scripts/gpu_cpu_share_ab.py --gemm-ns, medians against 0: fp8 512
# tokens x1.02-1.10, fp8 300 x1.05, bf16 300 x1.04-1.15, bf16 700 x0.99-1.02), but the
# first prompt after start-up, split by the CPU's prior before any prompt chunk has fitted
# it, lost with it (fp8 512 tokens through bench decode: 1,379-1,426 tok/s against
# 1,410-1,588 with 0, interleaved; 1,368-1,409 against 1,521-1,536 the day before;
# 2026-12-04): more experts on the CPU than a guessed rate can afford. A/B: EDGEMOE_SHARE_GEMM_NS.
DEVICE_GEMM_NS = 0
# mxfp4: int4's nibble path with a fixed table (unmeasured on the GPU machine: int4's rate).
CPU_GBPS = {"bf16": 86.0, "int8": 49.0, "fp8": 41.0, "int4": 30.0, "mxfp4": 30.0}
# An expert's tokens past its bytes, flop/s (6·H·I a token): bf16 and fp8 from the GPU
# machine's fits of prompt chunks' calls and start-up readings (2026-12-04: ~2.7 µs a token
# bf16, ~9 fp8, at Qwen3-30B-A3B's 2048 x 768), the others the 32-token call's 0.85 (above).
# The turn after start-up split by bf16's old 11 µs took 0.62 s, by a measured 2.7 0.53.
CPU_FLOPS = {"bf16": 3.5e12, "int8": 0.85e12, "fp8": 1.05e12, "int4": 0.85e12, "mxfp4": 0.85e12}
CALL_S = 20e-6  # the fit's prior for a call's own cost (hand-off, job table)


def fit_cpu_rates(sums: dict[str, float], prior: tuple[float, float]) -> tuple[float, float]:
    """(ns an expert, ns a pair) of the C kernel's calls, from `HostLayerMailboxes.fit_sums`:
    the host controller's cost law (`moe/controller.LinearCost`: least squares toward a
    prior known to ±100%) over t = c + a·jobs + b·pairs, every call weighted as within
    ±NOISE of the calls' mean time. Calls that can't separate a from b (decode steps: a
    pair or two an expert) leave the prior's split; prompt chunks' calls correct it."""
    n = sums["fit_n"]
    if n < 1.0:
        return prior
    ns = 1e-9
    w = 1.0 / (NOISE * max(sums["fit_t"] / n * ns, FLOOR_S)) ** 2
    a = [[n, sums["fit_j"], sums["fit_p"]], [sums["fit_j"], sums["fit_jj"], sums["fit_jp"]],
         [sums["fit_p"], sums["fit_jp"], sums["fit_pp"]]]
    b = [sums["fit_t"], sums["fit_jt"], sums["fit_pt"]]
    cost = LinearCost.from_sums([CALL_S, prior[0] * ns, prior[1] * ns], [[w * v for v in row] for row in a],
                                [w * ns * v for v in b])
    _, per_expert, per_pair = cost.theta
    return per_expert / ns, per_pair / ns


def share_rates(store: ExpertStore, weights: tuple[str, int]) -> list[int]:
    """[fixed, per token, copy, GEMM] ns: the prompt rule's cost of an expert on the CPU
    (its bytes read, then each token's 6·H·I flops) and on the device (its copy if missed,
    its GEMMs)."""
    nbytes, (hidden, inter) = store.expert_nbytes, (store.down_shape[0], store.down_shape[1])
    return [round(nbytes / CPU_GBPS[weights[0]]), round(6 * hidden * inter / CPU_FLOPS[weights[0]] * 1e9),
            round(nbytes / DEVICE_GBPS), _gemm_ns()]


def _gemm_ns() -> int:
    """`EDGEMOE_SHARE_GEMM_NS` (ns a device GEMM of an expert, for an A/B), else DEVICE_GEMM_NS."""
    return env_whole("EDGEMOE_SHARE_GEMM_NS", DEVICE_GEMM_NS, "nanoseconds")


def host_weights(store: ExpertStore) -> tuple[str, int] | None:
    """(the C kernel's weight kind, fp8 block, int4 group or mxfp4's 32) for the store's
    experts; None: no native path (fp8 blocks or int4 groups not a multiple of 32)."""
    from edgemoe.kernels.cpu_experts_quant import native_weights

    if store.format.quantised:
        return native_weights(store.format)
    return ("bf16", 0) if store.dtype == torch.bfloat16 else None


def device_views(buffers: MailboxBuffers, device: torch.device) -> MailboxBuffers:
    """The mailbox buffers as the device writes and reads them: mapped views on a GPU."""
    if device.type != "cuda":
        return buffers
    return MailboxBuffers(*(uva_view(t, device) if t.is_pinned() else t for t in buffers))


class CpuShare:
    """Misses computed on the CPU, picked on the device: decode steps (up to `rows` tokens)
    by a per-layer quota of the coldest, prompt chunks (up to `prompt_rows`; 0: none) by
    the balance of `rates` (`rule_for`).

    `quota` [num_layers] int64 and `fraction` 0-d int64 on the device: a decode step's
    layer gives the CPU at most `quota[layer]` of its misses and `fraction` sixteenths of
    them (`kernels/share_split.decode_take`; `FRACTION_ONE`: the quota alone); the host may
    rewrite both between steps (0: the layer runs as without a share, bitwise). `cpu_counts` [num_layers] int64: CPU
    experts per layer, cumulative, read lazily. `heat` [num_layers, E] int64: each
    expert's decayed routing count, updated by every decode step with a share. `rates`
    [4] int64 ns on the device (`rate_ns` on the host): a CPU expert's fixed cost and its
    cost a pair (learnt: `refit_rates`), a device expert's copy and GEMMs. Used by one thread (the
    executor's)."""

    def __init__(self, store: ExpertStore, kernel: CpuExperts, num_layers: int, quota: int, device: torch.device,
                 rows: int = ROWS, prompt_rows: int = 0, act: Activation = silu,
                 biases: Callable[[], dict[int, ExpertBias]] = dict) -> None:
        weights = host_weights(store)
        if not kernel.native:  # auto takes torch without AVX2 or a C compiler (kernels/cpu_kernel.py)
            raise ValueError("the CPU share inside the step needs the compiled C expert kernel, and this "
                             f"process has {kernel.name!r} (a CPU without AVX2, no C compiler, or "
                             "EDGEMOE_CPU_KERNEL): use --expert-cache host for the host cache's CPU split")
        if weights is None:
            raise ValueError(f"the CPU share inside the step needs the C expert kernel and bf16, int8, fp8, int4 or mxfp4 "
                             f"experts (got {store.format.name} {store.dtype}, kernel {kernel.name}): use --dtype "
                             "bfloat16 or --expert-dtype int8|fp8|int4|mxfp4, or --expert-cache host for the "
                             "host cache's CPU split")
        if quota < 0:
            raise ValueError(f"cpu_experts_per_layer must be >= 0 (got {quota})")
        self.store, self.kernel, self.weights, self.device, self.rows = store, kernel, weights, device, rows
        # The experts' activation and (gpt-oss) biases by layer, read when the mailboxes are
        # built at the first step: the model registers its biases after the executor exists.
        self.act, self.biases = act, biases
        self.prompt_rows = prompt_rows if prompt_rows > rows else 0  # 0: prompt chunks run every miss on the device
        self.rate_ns = share_rates(store, weights)  # [fixed, per pair, copy, GEMM] ns: refined by `refit_rates`
        self.prior_times_ns: list[float] | None = None  # the start-up calls' times (stats: what the prior read)
        self._prior = (float(self.rate_ns[0]), float(self.rate_ns[1]))
        self.rates = torch.tensor(self.rate_ns, dtype=torch.int64, device=device)
        self.num_experts = store.num_experts
        self.quota = torch.full((num_layers,), quota, dtype=torch.int64, device=device)
        self.fraction = torch.tensor(FRACTION_ONE, dtype=torch.int64, device=device)
        self._levels = torch.zeros(0, num_layers + 1, dtype=torch.int64, device=device)  # a live share's (`set_levels`)
        self.cpu_counts = torch.zeros(num_layers, dtype=torch.int64, device=device)
        self.heat = torch.zeros(num_layers, store.num_experts, dtype=torch.int64, device=device)
        # A device scalar, so an A/B can zero it (with `heat`) between steps: the pick is then
        # the last `quota` misses by id, with no re-capture.
        self.heat_unit = torch.tensor(HEAT_UNIT, dtype=torch.int64, device=device)
        self.mailboxes: HostLayerMailboxes | None = None
        self._views: MailboxBuffers | None = None
        self._bell: CpuBell | None = None  # the hand-off on a GPU where the driver allows (kernels/cpu_bell.py)
        self._turn: BellTurn | None = None  # the turn the last `begin` rang from its launch (its join's combine awaits it)
        self._quiet = False  # the bell's polling told that no ring is coming (`expect_rings`)
        if device.type == "cuda":
            self._side = torch.cuda.Stream(device)
            self._fork, self._join = torch.cuda.Event(), torch.cuda.Event()

    def measure_prior(self) -> None:
        """The prompt rule's CPU prior from this machine's own calls (`moe/share_prior.py`),
        where the rule runs; once the engine is built (the host quiet). Between steps."""
        if not self.prompt_rows or not share_prior.wanted():
            return
        self.prior_times_ns = share_prior.measure_times(self.store, self.weights, self.kernel)
        measured = share_prior.solve(self.prior_times_ns) if self.prior_times_ns is not None else None
        if measured is None:
            log.info("CPU share: the start-up calls could not be read (a small model or a busy machine: %s ns "
                     "at %s experts x tokens): the rates' constants stand until prompt chunks correct them",
                     self.prior_times_ns, share_prior.SHAPES)
            return
        log.info("CPU share: an expert costs %.0f µs + %.1f µs a token on the CPU (measured at start-up; "
                 "the constants said %.0f + %.1f)", measured[0] / 1e3, measured[1] / 1e3,
                 self.rate_ns[0] / 1e3, self.rate_ns[1] / 1e3)
        self._set_cpu_rates(*measured)
        self._prior = (float(self.rate_ns[0]), float(self.rate_ns[1]))

    def set_levels(self, scale: LevelScale, max_level: int) -> None:
        """A live share's levels 0..max_level as device rows (`apply_level`): each level's
        per-layer quota and its fraction, by `scale` (moe/quota_levels.py)."""
        layers = self.quota.shape[0]
        rows = [[*scale.rows(level, layers, self.num_experts), scale.fraction(level)] for level in range(max_level + 1)]
        self._levels = torch.tensor(rows, dtype=torch.int64, device=self.device)

    def set_fraction(self, fraction: float) -> float:
        """A fixed share of each layer's misses for decode steps (`--moe-hybrid-fraction`):
        sixteenths, rounded half up (`kernels/share_split.decode_take`), within the quota.
        Returns the share it takes."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"the CPU's fraction of the misses must be in [0, 1] (got {fraction})")
        sixteenths = int(fraction * FRACTION_ONE + 0.5)
        self.fraction.fill_(sixteenths)
        return sixteenths / FRACTION_ONE

    def apply_level(self, level: int) -> None:
        """The decode pick of `level` (`set_levels`) for the coming steps: device copies,
        stream-ordered, no wait."""
        self.quota.copy_(self._levels[level, :-1])
        self.fraction.copy_(self._levels[level, -1])

    def rule_for(self, x: torch.Tensor) -> int | None:
        """The pick for this step (`kernels/share_split`: DECODE, PROMPT), or None: no
        share. Its size alone decides (capture-safe)."""
        if x.shape[0] <= self.rows:
            return DECODE
        return PROMPT if x.shape[0] <= self.prompt_rows else None

    def _build(self, x: torch.Tensor, top_k: int) -> MailboxBuffers:
        """The mailboxes, at the first step (K and the activations' dtype known)."""
        if self.mailboxes is None:
            banks = {layer: self.store.layer_parts(layer) for layer in self.store.layers}
            rows = max(self.rows, self.prompt_rows)
            pairs = max(self.rows * top_k, PROMPT_PAIRS if self.prompt_rows else 0)
            self.mailboxes = HostLayerMailboxes(banks, self.weights, self.kernel, rows, top_k, x.dtype,
                                                pinned=self.device.type == "cuda", pairs=pairs, act=self.act,
                                                biases=self.biases())
            self._views = device_views(self.mailboxes.buffers, self.device)
            self._cpu_col = torch.full((rows * top_k,), -1, dtype=torch.int32, device=self.device)
            self._scratch = torch.zeros(self.num_experts, dtype=torch.int32, device=self.device)
            if self.device.type == "cuda" and bell_wanted() and bell_supported(self.device.index or 0):
                self._bell = CpuBell(self.mailboxes, self.device)
                self._bell.set_quiet(self._quiet)
        if x.dtype != self.mailboxes.buffers.x.dtype or top_k != self.mailboxes.top_k:
            raise ValueError("the CPU share's mailbox was built for other activations or another top-k")
        assert self._views is not None
        return self._views

    def begin(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
              resident: torch.Tensor, rule: int = DECODE, dead: torch.Tensor | None = None,
              prefetched: torch.Tensor | None = None) -> torch.Tensor:
        """Split `ids` [T, K] (-1 = not routed; the `dead` rows', [T] bool, too) against
        `resident` (the layer's slot map row [E], -1 = not resident) by `rule`
        (`rule_for`); write the mailbox and start the CPU's pairs. Returns the device's
        routing (the CPU pairs and dead rows -1). `prefetched` ([E] bool or None): the
        experts the decode prefetch copied for this layer (`ShareState.prefetched`)."""
        mb = self._build(x, ids.shape[1])
        state = ShareState(resident, self.heat[layer], self.quota[layer], self.fraction, self.heat_unit,
                           self.cpu_counts[layer], self._cpu_col, self._scratch, self.rates, prefetched)
        in_launch = self._bell is not None and rings_itself(ids, x)
        self._turn = self._bell.turn(layer) if in_launch else None
        device_ids = share_begin(ids if ids.is_contiguous() else ids.contiguous(),
                                 weights if weights.is_contiguous() else weights.contiguous(), x, state, mb, rule,
                                 dead, self._turn)
        if self._turn is None:
            self._launch(layer)
        return device_ids

    def drop_picks(self, layer: int, ids: torch.Tensor, resident: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        """`ids` [T, K] without the pairs of the misses (against `resident`, the layer's slot
        map row) that `layer`'s decode pick would give the CPU now, the heat untouched: the
        decode prefetch leaves them to it. `scratch`: [E] int32, the caller's (overwritten)."""
        return drop_cpu_picks(ids, resident, self.heat[layer], self.quota[layer], self.fraction, scratch)

    def expect_rings(self, expected: bool) -> None:
        """Whether the coming steps may ring the bell (a live quota's level 0 runs graphs
        without the share: none will). Without, the bell polls slowly between bursts."""
        quiet = not expected and quiet_wanted()
        if quiet != self._quiet and self._bell is not None:
            self._bell.set_quiet(quiet)
        self._quiet = quiet

    @property
    def quiet(self) -> bool:
        """Whether the bell was last told that no ring is coming."""
        return self._quiet

    def _launch(self, layer: int) -> None:
        assert self.mailboxes is not None
        if self.device.type != "cuda":
            self.mailboxes.run(layer)
            return
        if self._bell is not None:
            self._bell.ring(torch.cuda.current_stream(), layer)
            return
        from edgemoe.kernels.host_func import launch_host_func

        self._fork.record()
        self._side.wait_event(self._fork)
        launch_host_func(self._side, self.mailboxes.function, self.mailboxes.address(layer))
        self._join.record(self._side)

    def join(self, layer: int) -> CellSources:
        """The combine's sources for the CPU's cells: the mailbox rows by `begin`'s column
        map, read where they lie (`kernels/cell_sources.py`), once the CPU is done — the
        combine awaits the bell's turn itself where `begin`'s launch rang, else the stream
        waits here."""
        turn, self._turn = self._turn, None
        if turn is None and self._bell is not None:
            await_turn(self._bell.turn(layer))
        elif turn is None and self.device.type == "cuda":
            torch.cuda.current_stream().wait_event(self._join)
        assert self._views is not None, "join() without begin()"
        return CellSources(cpu_col=self._cpu_col, cpu_out=self._views.out, ready=turn)

    def refit_rates(self) -> None:
        """The prompt rule's CPU rates from the calls so far (`fit_cpu_rates`, the start-up
        estimates as the prior), written to the device for the coming step (a pinned copy,
        stream-ordered: no wait)."""
        if self.mailboxes is None:
            return
        self._set_cpu_rates(*fit_cpu_rates(self.mailboxes.fit_sums(), self._prior))

    def _set_cpu_rates(self, fixed: float, per_pair: float) -> None:
        """The CPU's two rates, on the host and (a pinned copy, stream-ordered: no wait) on
        the device; the device's two stay."""
        self.rate_ns = [round(fixed), round(per_pair), *self.rate_ns[2:]]
        host = torch.tensor(self.rate_ns, dtype=torch.int64)
        self.rates.copy_(host.pin_memory() if self.device.type == "cuda" else host, non_blocking=True)

    def close(self) -> None:
        """Stop the bell's thread (the executor's close; a graph must not replay after).
        Work already queued may still ring it: that finishes first."""
        if self._bell is not None:
            torch.cuda.synchronize(self.device)
            self._bell.close()
            self._bell = None

    def read_busy(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """([num_layers] CPU calls with pairs, [num_layers] their wall ns), cumulative; None
        before the first step with a share."""
        if self.mailboxes is None:
            return None
        return self.mailboxes.busy()

    def busy_totals(self) -> tuple[int, int]:
        """(CPU calls with pairs, their wall ns) over every layer so far: (0, 0) before the
        first step with a share (a step anatomy's reader, engine/step_anatomy.py)."""
        busy = self.read_busy()
        return (0, 0) if busy is None else (int(busy[0].sum()), int(busy[1].sum()))

    def read_counts(self) -> torch.Tensor:
        """[num_layers] CPU experts per layer since construction (one device read)."""
        return self.cpu_counts.to("cpu", copy=True)
