"""The device memory plan: weights + expert slots + KV pages + workspace, under a cap.

`--gpu-memory` caps what the process holds on the device as the driver counts it
(`torch.cuda.mem_get_info`), so the CUDA context and library workspaces, measured
before planning, are inside the cap: a plan that fits here fits a real card that size.
On a CPU-only machine there is no cap; the "device" is host memory and the defaults
only keep the slot cache honest (a quarter of the experts) for offload tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from edgemoe.models.arch import DecoderArch
from edgemoe.quant import Dense, ExpertFormat
from edgemoe.quant import expert_nbytes as format_expert_nbytes

MiB, GiB = 2**20, 2**30
FIXED_WORKSPACE = 256 * MiB  # allocator slack, graph pools, small buffers
KV_SHARE_DEFAULT = 0.25  # of what is left after weights, when --kv-tokens is unset


class PlanError(ValueError):
    """The requested configuration cannot fit; the message says what to lower."""


def parse_size(text: str) -> int:
    """'16GiB', '16G', '1.5 GiB', '900MiB', '1000000' → bytes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B?)\s*", text, flags=re.IGNORECASE)
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

    @property
    def total(self) -> int:
        return (
            self.context + self.weights + self.experts_resident + self.num_slots * self.slot_bytes
            + self.kv_bytes + self.workspace + self.graphs
        )

    def table(self) -> str:
        rows = [
            ("CUDA context + libraries", self.context),
            ("dense weights" + (f" ({self.dense_note})" if self.dense_note else ""), self.weights),
            ("resident experts", self.experts_resident),
            (f"expert slots ({self.num_slots} x {self.slot_bytes / MiB:.1f} MiB)", self.num_slots * self.slot_bytes),
            (f"KV cache ({self.kv_tokens} tokens{', fp8' if self.kv_fp8 else ''})", self.kv_bytes),
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
        return "\n".join(lines)


def kv_bytes_per_token(arch: DecoderArch, kv_cache_dtype: str = "auto") -> int:
    """K and V of every layer for one token: the model dtype, or e4m3 plus a 4-byte
    scale per kv head (`--kv-cache-dtype fp8`)."""
    per_head = arch.head_dim + 4 if kv_cache_dtype == "fp8" else arch.head_dim * arch.dtype.itemsize
    return 2 * arch.num_layers * arch.num_kv_heads * per_head


def expert_nbytes(arch: DecoderArch, fmt: ExpertFormat | None = None) -> int:
    """One expert's bytes in `fmt` (default: unquantised in the model's dtype), scales included."""
    return format_expert_nbytes(fmt or Dense(arch.dtype), arch.hidden_size, arch.moe_intermediate_size)


def dense_weight_bytes(arch: DecoderArch) -> int:
    n = sum(_numel(s) for s in arch.param_shapes().values())
    return n * arch.dtype.itemsize


def graph_pool_bytes(arch: DecoderArch, max_bs: int) -> int:
    """The decode graphs' shared pool: logits (bf16 and fp32) and one layer's
    activations and kernel workspaces at the largest captured size, plus slack."""
    if max_bs <= 0:
        return 0
    per_row = 6 * arch.vocab_size + 4 * arch.hidden_size * (arch.top_k + 16) + 4 * sum(arch.qkv_rows)
    return max_bs * per_row + 64 * MiB


def workspace_bytes(arch: DecoderArch, max_prefill_tokens: int, max_running: int) -> int:
    """Peak activations of one step (fp32 MoE cells dominate), plus logits and slack."""
    T, H = max_prefill_tokens + max_running, arch.hidden_size
    inter = max(arch.moe_intermediate_size, arch.intermediate_size)
    per_token = 4 * (8 * H + arch.top_k * H + 4 * inter + sum(arch.qkv_rows))
    logits = 3 * 4 * arch.vocab_size * max_running
    return int(1.5 * (T * per_token + logits)) + FIXED_WORKSPACE


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def plan_memory(
    arch: DecoderArch,
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
    expert_format: ExpertFormat | None = None,
    dense_note: str = "",
    kv_cache_dtype: str = "auto",
) -> MemoryPlan:
    """Decide the backend (when auto), expert slots and KV tokens; raise PlanError
    naming the setting to change when nothing fits. Experts count at their bytes in
    `expert_format` (scales included), so a smaller format leaves more slots."""
    plan = _plan(arch, backend, moe_slots, kv_tokens, max_model_len, max_prefill_tokens, max_running, budget,
                 context, graph_max_bs, expert_nbytes(arch, expert_format), kv_bytes_per_token(arch, kv_cache_dtype))
    label = expert_format.label if expert_format is not None else ""
    return replace(plan, expert_format=label, dense_note=dense_note, kv_fp8=kv_cache_dtype == "fp8")


def _plan(
    arch: DecoderArch, backend: str, moe_slots: int | None, kv_tokens: int | None, max_model_len: int,
    max_prefill_tokens: int, max_running: int, budget: int | None, context: int, graph_max_bs: int, e_bytes: int,
    per_tok: int,
) -> MemoryPlan:
    weights = dense_weight_bytes(arch)
    total_experts = len(arch.moe_layers) * arch.num_experts
    ws = workspace_bytes(arch, max_prefill_tokens, max_running)
    graphs = graph_pool_bytes(arch, graph_max_bs)
    if budget is None:  # CPU: no cap to plan against
        backend = "resident" if backend == "auto" else backend
        kv = kv_tokens or max(max_model_len, min(2 * max_model_len, 65536))
        slots = 0 if backend == "resident" else moe_slots or max(arch.top_k, total_experts // 4)
        resident = total_experts * e_bytes if backend == "resident" else 0
        return MemoryPlan(None, 0, weights, resident, slots, e_bytes, kv, kv * per_tok, ws, backend, graphs)
    free = budget - context - weights - ws - graphs
    if free <= 0:
        raise PlanError(
            f"gpu_memory (--gpu-memory) {budget / GiB:.2f} GiB is below the CUDA context "
            f"({context / GiB:.2f}) + dense weights ({weights / GiB:.2f}) + workspace ({(ws + graphs) / GiB:.2f}) GiB: "
            "raise --gpu-memory or lower --max-prefill-tokens / --max-running-requests"
        )
    all_experts = total_experts * e_bytes
    if backend == "auto":
        # Too big to hold: the slot cache, with the CPU used or not as the live rates say.
        backend = "resident" if all_experts + max_model_len * per_tok <= free else "auto"
    if backend == "resident":
        kv = kv_tokens or min((free - all_experts) // per_tok, max_running * max_model_len)
        if kv < 1 or all_experts + kv * per_tok > free:
            raise PlanError(
                f"resident experts ({all_experts / GiB:.2f} GiB) + KV do not fit in {free / GiB:.2f} GiB: "
                "use --moe-backend offload|cpu|hybrid, lower --kv-tokens, or raise --gpu-memory"
            )
        return MemoryPlan(budget, context, weights, all_experts, 0, e_bytes, kv, kv * per_tok, ws, backend, graphs)
    min_slots = arch.top_k
    kv = kv_tokens or max(1, min(max_model_len, int(free * KV_SHARE_DEFAULT) // per_tok))
    room = free - kv * per_tok
    slots = moe_slots or min(total_experts, room // e_bytes)
    if slots < min_slots or slots * e_bytes > room:
        raise PlanError(
            f"{slots} expert slots ({slots * e_bytes / GiB:.2f} GiB) + KV {kv} tokens "
            f"({kv * per_tok / GiB:.2f} GiB) do not fit in {free / GiB:.2f} GiB (at least {min_slots} slots "
            "needed): lower --kv-tokens / --max-model-len / --moe-slots, or raise --gpu-memory"
        )
    return MemoryPlan(budget, context, weights, 0, slots, e_bytes, kv, kv * per_tok, ws, backend, graphs)
