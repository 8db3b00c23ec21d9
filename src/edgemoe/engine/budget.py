"""The device memory plan: weights + expert slots + KV pages + GDN state + workspace, under a cap.

`--gpu-memory` caps what the process holds on the device as the driver counts it
(`torch.cuda.mem_get_info`), so the CUDA context and library workspaces, measured
before planning, are inside the cap: a plan that fits here fits a real card that size.
On a CPU-only machine there is no cap; the "device" is host memory and the defaults
only keep the slot cache honest (a quarter of the experts) for offload tests.

Hybrid models (GDN layers) hold a recurrent state per sequence (~61 MiB at the
Qwen3.5-35B-A3B shape): `--state-slots` device rows of it. Each running request owns one,
and with the prefix cache two more on average hold snapshots (its rolling one, one kept in
the tree); the plan caps `max_running_requests` at what the rows allow and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import NamedTuple

from edgemoe.kernels.attn_decode_tiles import split_workspace_bytes
from edgemoe.kernels.moe_gemv_tiles import split_partials_bytes
from edgemoe.models.arch import ModelArch, kept_dtypes, shared_kv
from edgemoe.quant import Dense, ExpertFormat
from edgemoe.quant import expert_nbytes as format_expert_nbytes

MiB, GiB = 2**20, 2**30
FIXED_WORKSPACE = 256 * MiB  # allocator slack, graph pools, small buffers
KV_SHARE_DEFAULT = 0.25  # of what is left after weights, when --kv-tokens is unset
STATE_SHARE_DEFAULT = 0.1  # of what is left after weights, for GDN state rows when --state-slots is unset


class PlanError(ValueError):
    """The requested configuration cannot fit; the message says what to lower."""


def parse_size(text: str) -> int:
    """'16GiB', '16G', '1.5 GiB', '900MiB', '1000000' → bytes."""
    m = re.fullmatch(r"\s*([0-9]+\.?[0-9]*|\.[0-9]+)\s*([KMGT]?)(i?B?)\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"gpu_memory (--gpu-memory): cannot parse size {text!r} (e.g. 16GiB, 900MiB)")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


@dataclass(frozen=True)
class MemoryPlan:
    budget: int | None  # bytes the process may hold on the device; None on CPU
    context: int  # CUDA context + library workspaces, measured
    weights: int  # dense (non-expert) weights on the device
    experts_resident: int  # bytes of resident experts (resident backend)
    num_slots: int
    slot_bytes: int
    kv_tokens: int
    kv_bytes: int
    workspace: int
    backend: str
    graphs: int = 0  # the CUDA graphs' memory pool (decode activations at captured sizes)
    expert_format: str = ""  # how experts are stored (slots and resident banks), e.g. "fp8 e4m3 (128x128 blocks)"
    dense_note: str = ""  # e.g. "fp8 checkpoint, dequantised at load"
    kv_fp8: bool = False  # --kv-cache-dtype fp8
    max_running: int = 0  # requests running at once (the setting, capped by the state rows)
    state_rows: int = 0  # GDN state rows on the device (hybrid models; 0 otherwise)
    state_row_bytes: int = 0  # one sequence's recurrent + conv state, all GDN layers
    snapshot_rows: int = 0  # of state_rows, those for prefix-cache snapshots (the rest are live)
    running_note: str = ""  # why max_running is below the setting, if it is
    extras: tuple[tuple[str, int], ...] = ()  # a model's own rows (PLE tables / step rows, QSA selection)
    lend_slots: int = 0  # the last slots, lent to a streamed chunk's activations (moe/slot_lending.py)
    lend_tokens: int = 0  # prompt chunks of this many tokens or more stream and borrow them

    @property
    def state_bytes(self) -> int:
        """The rows plus the scratch row padded batch entries use (engine/build.py)."""
        return (self.state_rows + 1) * self.state_row_bytes if self.state_rows else 0

    @property
    def total(self) -> int:
        return (
            self.context + self.weights + self.experts_resident + self.num_slots * self.slot_bytes
            + self.kv_bytes + self.state_bytes + self.workspace + self.graphs + sum(n for _, n in self.extras)
        )

    def table(self) -> str:
        rows = [
            ("CUDA context + libraries", self.context),
            ("dense weights" + (f" ({self.dense_note})" if self.dense_note else ""), self.weights),
            ("resident experts", self.experts_resident),
            (f"expert slots ({self.num_slots} x {self.slot_bytes / MiB:.1f} MiB)", self.num_slots * self.slot_bytes),
            (f"KV cache ({self.kv_tokens} tokens{', fp8' if self.kv_fp8 else ''})", self.kv_bytes),
            *self._state_rows(),
            *self.extras,
            ("workspace", self.workspace),
            ("CUDA graphs", self.graphs),
            ("total", self.total),
        ]
        if self.budget is not None:
            rows.append(("budget (--gpu-memory)", self.budget))
        width = max(len(r[0]) for r in rows)
        fmt = f", experts {self.expert_format}" if self.expert_format else ""
        live = " = slot cache, misses copied or split with the CPU as measured" if self.backend == "auto" else ""
        lines = [f"memory plan (moe backend: {self.backend}{live}{fmt})"]
        lines += [f"  {name:<{width}}  {nbytes / GiB:8.2f} GiB" for name, nbytes in rows]
        if self.lend_slots:
            lines.append(f"  prompt chunks of {self.lend_tokens}+ tokens: their workspace beyond this one borrows the "
                         f"last {self.lend_slots} expert slots ({self.lend_slots * self.slot_bytes / GiB:.2f} GiB) "
                         "while they stream")
        if self.running_note:
            lines.append(f"  {self.running_note}")
        return "\n".join(lines)

    def _state_rows(self) -> list[tuple[str, int]]:
        if not self.state_rows:
            return []
        live = self.state_rows - self.snapshot_rows
        rows = f"{live} live + {self.snapshot_rows} snapshot + 1 scratch rows x {self.state_row_bytes / MiB:.1f} MiB"
        return [(f"GDN state ({rows})", self.state_bytes)]


def slot_pool_warning(num_slots: int, moe_layers: int, pairs_per_layer: int) -> str | None:
    """A warning when the slot pool is smaller than one token's experts over all MoE layers.

    NOTE: the pool is shared by the layers, visited in a cycle each step. Below one token's
    working set the default scan-resistant LRU (`--moe-policy lru`) keeps about
    (slots - one layer's experts) of it resident and streams the rest through the other
    slots, so even a repeating routing misses the remainder every step (plain LRU,
    `lru-plain`, misses all of it: measured on an H200, 276 slots for 48 x 8, 384 misses a
    token, docs/benchmarks.md). None when the pool holds that set, or there is no pool."""
    working_set = moe_layers * pairs_per_layer
    if num_slots <= 0 or num_slots >= working_set:
        return None
    kept = max(0, num_slots - pairs_per_layer)
    return (f"the expert slot pool ({num_slots} slots) is smaller than one token's experts over all MoE layers "
            f"({moe_layers} x {pairs_per_layer} = {working_set}): the scan-resistant eviction keeps about {kept} "
            f"of them resident ({kept / working_set:.0%}) and copies the other ~{working_set - kept} in every "
            "step even when the routing repeats; raise --gpu-memory, store experts in fewer bytes (--expert-dtype "
            "fp8/int4), or compute them on the CPU (--expert-cache host --moe-backend cpu)")


def kv_bytes_per_token(arch: ModelArch, kv_cache_dtype: str = "auto") -> int:
    """K and V of every layer that holds KV (a hybrid's GDN layers hold none) for one
    token: the model dtype, or e4m3 plus a 4-byte scale per kv head (`--kv-cache-dtype fp8`);
    and its sparse-attention index key (Qwen3.8-Flash-Next's QSA, model dtype) where it has one.
    Multi-head latent attention keeps one row (its value is its key: `shared_kv`)."""
    per_head = arch.head_dim + 4 if kv_cache_dtype == "fp8" else arch.head_dim * arch.dtype.itemsize
    planes = 1 if shared_kv(arch) else 2
    return len(arch.kv_layers) * (planes * arch.num_kv_heads * per_head + arch.index_key_dim * arch.dtype.itemsize)


def expert_nbytes(arch: ModelArch, fmt: ExpertFormat | None = None) -> int:
    """One expert's bytes in `fmt` (default: unquantised in the model's dtype), scales included."""
    return format_expert_nbytes(fmt or Dense(arch.dtype), arch.hidden_size, arch.moe_intermediate_size)


def dense_weight_bytes(arch: ModelArch) -> int:
    kept = kept_dtypes(arch)  # a few params in another dtype (a sigmoid router's fp32)
    return sum(_numel(s) * kept.get(n, arch.dtype).itemsize for n, s in arch.param_shapes().items())


def graph_pool_bytes(arch: ModelArch, max_bs: int) -> int:
    """The decode graphs' shared pool and their one static fp32 logits buffer (every size
    and variant writes it): logits (bf16 and fp32) and one layer's activations and kernel
    workspaces at the largest captured size, plus slack."""
    if max_bs <= 0:
        return 0
    per_row = 6 * arch.vocab_size + 4 * arch.hidden_size * (arch.moe_pairs + 16) + 4 * arch.projection_width
    per_row += split_partials_bytes(arch.moe_pairs, arch.moe_intermediate_size)  # moe_decode's split-K workspace
    per_row += split_workspace_bytes(1, arch.num_heads, arch.head_dim)  # decode attention's split outputs
    return max_bs * per_row + 64 * MiB


def workspace_bytes(arch: ModelArch, max_prefill_tokens: int, max_running: int) -> int:
    """Peak activations of one step (fp32 MoE cells dominate; a hybrid's GDN prefill adds
    its per-chunk states), plus logits and slack."""
    T, H = max_prefill_tokens + max_running, arch.hidden_size
    inter = max(arch.moe_intermediate_size, arch.intermediate_size)
    per_token = 4 * (8 * H + arch.moe_pairs * H + 4 * inter + arch.projection_width) + arch.state_workspace_per_token
    logits = 3 * 4 * arch.vocab_size * max_running
    partials = max_running * split_partials_bytes(arch.moe_pairs, arch.moe_intermediate_size)  # decode rows only
    partials += split_workspace_bytes(max_running, arch.num_heads, arch.head_dim)  # decode attention's splits
    return int(1.5 * (T * per_token + logits + partials)) + FIXED_WORKSPACE


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class StatePlan(NamedTuple):
    rows: int  # GDN state rows on the device (live + snapshot)
    max_running: int  # requests running at once: one live row each
    snapshot_rows: int  # rows for prefix-cache snapshots
    note: str  # why max_running is below the setting ("" if it is not)


def plan_state(
    arch: ModelArch, state_slots: int | None, max_running: int, budget: int | None, used: int, snapshots: bool = False,
) -> StatePlan:
    """GDN state rows (`--state-slots`, or a share of what `used` bytes leave of the budget;
    on the CPU what the running requests use) and the running requests they allow. A running
    request owns a live row (NOTE: live rows are the page-table rows, so running <= rows);
    with `snapshots` (the prefix cache) a third of the rows are live, the rest snapshots."""
    row = arch.state_bytes
    if row == 0:
        return StatePlan(0, max_running, 0, "")
    per_request = 3 if snapshots else 1  # its live row, and its rolling snapshot + one in the tree
    if state_slots is not None:
        rows = state_slots
    elif budget is None:
        rows = per_request * max_running
    else:
        rows = max(1, min(per_request * max_running, int(STATE_SHARE_DEFAULT * max(0, budget - used)) // row - 1))
    running = max(1, min(max_running, rows // per_request))
    note = "" if running == max_running else (
        f"max running requests: {running} (max_running_requests (--max-running-requests) {max_running} is capped "
        f"by the {rows} GDN state rows of {row / MiB:.1f} MiB"
        + (", a third of them live, the rest prefix-cache snapshots" if snapshots else "")
        + ": raise --state-slots or --gpu-memory for more)"
    )
    return StatePlan(rows, running, rows - running, note)


def plan_memory(
    arch: ModelArch,
    *,
    backend: str,
    moe_slots: int | None,
    kv_tokens: int | None,
    max_model_len: int,
    max_prefill_tokens: int,
    max_running: int,
    budget: int | None,
    context: int = 0,
    graph_max_bs: int = 0,
    state_slots: int | None = None,
    snapshots: bool = False,
    expert_bytes: int | None = None,
    expert_format: ExpertFormat | None = None,
    dense_note: str = "",
    kv_cache_dtype: str = "auto",
    extras: tuple[tuple[str, int], ...] = (),
    host_params: tuple[str, ...] = (),
    lend_tokens: int = 0,
) -> MemoryPlan:
    """Decide the backend (when auto), expert slots, KV tokens and GDN state rows (hybrid
    models; they cap the running requests); raise PlanError naming the setting to change
    when nothing fits. Experts count at their bytes in `expert_format` (scales included),
    so a smaller format leaves more slots; `expert_bytes` overrides that size (`edgemoe
    plan`'s what-ifs). `extras`: (name, bytes) a model reserves beside these (PLE tables
    or step rows); `host_params`: params kept in host memory (`--embed-weights host`), so
    their device bytes go to the slots and KV. `lend_tokens` (the device cache's streamed
    chunks, where the slot banks' memory can be lent; 0: none): chunks of that many tokens
    or more borrow their workspace beyond a shorter step's from the last slots
    (`moe/slot_lending.py`), so the plan reserves only the shorter step's."""
    shapes = arch.param_shapes()
    weights = dense_weight_bytes(arch) - sum(_numel(shapes[n]) for n in host_params) * arch.dtype.itemsize
    extras = (*extras, *model_workspace_rows(arch, max_running, max_model_len))
    state = plan_state(arch, state_slots, max_running, budget, context + weights, snapshots)
    plan = _plan_weights_kv(
        arch, backend, moe_slots, kv_tokens, max_model_len, max_prefill_tokens, state.max_running, budget, context,
        ((state.rows + 1) * arch.state_bytes if state.rows else 0) + sum(n for _, n in extras),
        graph_pool_bytes(arch, graph_max_bs), expert_bytes or expert_nbytes(arch, expert_format),
        kv_bytes_per_token(arch, kv_cache_dtype), weights, lend_tokens,
    )
    label = expert_format.label if expert_format is not None else ""
    return replace(
        plan, max_running=state.max_running, state_rows=state.rows, state_row_bytes=arch.state_bytes,
        snapshot_rows=state.snapshot_rows, running_note=state.note, expert_format=label, dense_note=dense_note,
        kv_fp8=kv_cache_dtype == "fp8", extras=extras,
    )


def model_workspace_rows(arch: ModelArch, max_running: int, max_model_len: int) -> tuple[tuple[str, int], ...]:
    """A model's own step workspaces beyond `workspace_bytes` (Qwen3.8-Flash-Next's QSA selection)."""
    rows = getattr(arch, "workspace_rows", None)
    return tuple(rows(max_running, max_model_len)) if rows is not None else ()


LEND_SLACK = 12 * MiB  # each bank's lent tail starts at a mapping boundary (2 MiB; up to 6 banks)


def _lend(
    arch: ModelArch, backend: str, moe_slots: int | None, kv_tokens: int | None, max_model_len: int,
    max_prefill_tokens: int, max_running: int, budget: int | None, context: int, reserved: int, graphs: int,
    e_bytes: int, per_tok: int, weights: int | None, lend_tokens: int,
) -> MemoryPlan | None:
    """The plan whose workspace is a step's of `lend_tokens` - 1 prompt tokens, the largest
    chunk's extra activations lent by the last slots; None where that can't be (no budget,
    chunks too short to stream, resident experts, or too few slots left below the tail for
    the stream's double buffer of 2·E)."""
    if budget is None or lend_tokens <= 0 or max_prefill_tokens < lend_tokens or backend == "resident":
        return None
    extra = workspace_bytes(arch, max_prefill_tokens, max_running) - workspace_bytes(arch, lend_tokens - 1, max_running)
    if extra <= 0:
        return None
    try:
        plan = _plan_weights_kv(arch, backend, moe_slots, kv_tokens, max_model_len, lend_tokens - 1, max_running,
                                budget, context, reserved, graphs, e_bytes, per_tok, weights)
    except PlanError:
        return None
    lend_slots = -(-(extra + LEND_SLACK) // e_bytes)
    if plan.backend == "resident" or plan.num_slots - lend_slots < 2 * arch.store_experts:
        return None
    return replace(plan, lend_slots=lend_slots, lend_tokens=lend_tokens)


def _plan_weights_kv(
    arch: ModelArch, backend: str, moe_slots: int | None, kv_tokens: int | None, max_model_len: int,
    max_prefill_tokens: int, max_running: int, budget: int | None, context: int, reserved: int, graphs: int,
    e_bytes: int, per_tok: int, weights: int | None = None, lend_tokens: int = 0,
) -> MemoryPlan:
    """The backend, slots and KV in what is left after `reserved` bytes (the GDN state, a
    model's extras) and the graph pool, experts at `e_bytes` each, KV at `per_tok` bytes
    per token; `weights`: the dense weights on the device. With `lend_tokens`, the
    workspace of a step short of them, and the rest lent from the slots where the pool
    allows (`_lend`); else the largest step's."""
    lent = _lend(arch, backend, moe_slots, kv_tokens, max_model_len, max_prefill_tokens, max_running, budget, context,
                 reserved, graphs, e_bytes, per_tok, weights, lend_tokens)
    if lent is not None:
        return lent
    weights = dense_weight_bytes(arch) if weights is None else weights
    total_experts = len(arch.moe_layers) * arch.store_experts
    ws = workspace_bytes(arch, max_prefill_tokens, max_running)
    if budget is None:  # CPU: no cap to plan against
        backend = "resident" if backend == "auto" else backend
        kv = kv_tokens or max(max_model_len, min(2 * max_model_len, 65536))
        slots = 0 if backend == "resident" else moe_slots or max(arch.top_k, total_experts // 4)
        resident = total_experts * e_bytes if backend == "resident" else 0
        return MemoryPlan(None, 0, weights, resident, slots, e_bytes, kv, kv * per_tok, ws, backend, graphs)
    free = budget - context - weights - ws - graphs - reserved
    if free <= 0:
        state = f" + GDN state and model rows ({reserved / GiB:.2f})" if reserved else ""
        raise PlanError(
            f"gpu_memory (--gpu-memory) {budget / GiB:.2f} GiB is below the CUDA context "
            f"({context / GiB:.2f}) + dense weights ({weights / GiB:.2f}) + workspace ({(ws + graphs) / GiB:.2f})"
            f"{state} GiB: "
            "raise --gpu-memory or lower --max-prefill-tokens / --max-running-requests"
            + (" / --state-slots" if reserved else "")
        )
    all_experts = total_experts * e_bytes
    # NOTE: per_tok is 0 for a hybrid whose layers are all linear attention (no KV): divide by 1
    if backend == "auto":
        # Too big to hold: the slot cache, with the CPU used or not as the live rates say.
        backend = "resident" if all_experts + max_model_len * per_tok <= free else "auto"
    if backend == "resident":
        kv = kv_tokens or min((free - all_experts) // max(per_tok, 1), max_running * max_model_len)
        if kv < 1 or all_experts + kv * per_tok > free:
            raise PlanError(
                f"resident experts ({all_experts / GiB:.2f} GiB) + KV do not fit in {free / GiB:.2f} GiB: "
                "use --moe-backend offload|cpu|hybrid, lower --kv-tokens, or raise --gpu-memory"
            )
        return MemoryPlan(budget, context, weights, all_experts, 0, e_bytes, kv, kv * per_tok, ws, backend, graphs)
    min_slots = arch.top_k
    kv = kv_tokens or max(1, min(max_model_len, int(free * KV_SHARE_DEFAULT) // max(per_tok, 1)))
    room = free - kv * per_tok
    slots = moe_slots or max(0, min(total_experts, room // e_bytes))  # a KV past the budget leaves none, not fewer
    if slots < min_slots or slots * e_bytes > room:
        raise PlanError(
            f"{slots} expert slots ({slots * e_bytes / GiB:.2f} GiB) + KV {kv} tokens "
            f"({kv * per_tok / GiB:.2f} GiB) do not fit in {free / GiB:.2f} GiB (at least {min_slots} slots "
            "needed): lower --kv-tokens / --max-model-len / --moe-slots, or raise --gpu-memory"
        )
    return MemoryPlan(budget, context, weights, 0, slots, e_bytes, kv, kv * per_tok, ws, backend, graphs)
