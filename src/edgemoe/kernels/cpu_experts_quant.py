"""Routed experts on the host CPU with quantised weights: int8 (per-row scales) and fp8
e4m3 (block scales) read in place from the expert store and converted in registers
(`kernels/cpu/em_quant.h`); other formats (int4, mxfp4) run the dequantise-first
reference in torch.

Weights come as a format's parts (`edgemoe.quant`): "gate_up", "gate_up_scale", "down",
"down_scale". Entry points mirror `cpu_experts.py`:
- `expert_mlp_q_cpu(x, parts, fmt)` → [n, H] fp32 (reference: `expert_mlp_q_ref`);
- `moe_experts_q_cpu(x, topk_ids, topk_weights, experts, weights, fmt, contrib)`: the
  routed form, weights[i] = the parts of experts[i] (e.g. `store.expert_parts(layer, e)`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from edgemoe.kernels.cpu_experts import (
    RoutedCells,
    _contrib_ok,
    _only,
    _routed_table,
    expert_mlp_ref,
    route_cells,
)
from edgemoe.kernels.cpu_kernel import CpuExperts, default_cpu_experts
from edgemoe.quant import ExpertFormat, Fp8Block, Int8Channel, Parts, dequantise_expert

QSTEP = 32  # NOTE: fp8 blocks must be a multiple of 32 (AMX B tiles span 32 k; em_experts checks)


def native_weights(fmt: ExpertFormat) -> tuple[str, int] | None:
    """(the C kernel's weight kind, fp8 block) for `fmt`, or None when it has no native path."""
    if isinstance(fmt, Int8Channel):
        return "int8", 0
    if isinstance(fmt, Fp8Block) and fmt.block % QSTEP == 0:
        return "fp8", fmt.block
    return None


def expert_mlp_q_ref(x: torch.Tensor, parts: Parts, fmt: ExpertFormat) -> torch.Tensor:
    """The oracle: the expert dequantised to fp32, then everything in fp32."""
    hidden, inter = x.shape[1], parts["gate_up"].shape[0] // 2
    return expert_mlp_ref(x, *dequantise_expert(fmt, parts, hidden, inter))


def _parts_ok(parts: Parts, fmt: ExpertFormat) -> bool:
    """CPU tensors in the format's dtypes with dense rows (bank rows or single experts)."""
    for name in ("gate_up", "down", "gate_up_scale", "down_scale"):
        t = parts.get(name)
        if t is None or t.device.type != "cpu" or not t.is_contiguous():
            return False
    data = torch.int8 if isinstance(fmt, Int8Channel) else torch.float8_e4m3fn
    return parts["gate_up"].dtype == parts["down"].dtype == data and parts["gate_up_scale"].dtype == torch.float32


def expert_mlp_q_cpu(x: torch.Tensor, parts: Parts, fmt: ExpertFormat, kernel: CpuExperts | None = None) -> torch.Tensor:
    """One expert on its tokens: x [n, H] → [n, H] fp32."""
    n, hidden = x.shape
    contrib = torch.empty(n, 1, hidden)
    ids = torch.zeros(n, 1, dtype=torch.int64)
    moe_experts_q_cpu(x, ids, torch.ones(n, 1), [0], [parts], fmt, contrib, kernel)
    return contrib[:, 0]


def moe_experts_q_cpu(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
    weights: Sequence[Parts], fmt: ExpertFormat, contrib: torch.Tensor, kernel: CpuExperts | None = None,
) -> None:
    """Fill contrib[t, k] = w[t, k] · expert(x[t]) for every (t, k) routed to one of
    `experts` (SiLU experts), weights[i] holding experts[i]'s parts in `fmt`."""
    kernel = kernel or default_cpu_experts()
    cells = route_cells(topk_ids, topk_weights, experts)
    native = native_weights(fmt)
    ok = native and kernel.native and _contrib_ok(x, topk_ids, contrib) and all(_parts_ok(p, fmt) for p in weights)
    if not ok:
        flat = contrib.view(-1, contrib.shape[-1])
        for parts, lo, hi in zip(weights, cells.lo, cells.hi, strict=True):
            if hi > lo:
                y = expert_mlp_q_ref(x[torch.from_numpy(cells.tokens[lo:hi]).long()], parts, fmt)
                flat[torch.from_numpy(cells.cells[lo:hi]).long()] = y * torch.from_numpy(cells.scale[lo:hi])[:, None]
        return
    hidden = x.shape[1]
    inter = weights[0]["gate_up"].shape[0] // 2 if weights else 1
    for p in weights:
        if tuple(p["gate_up"].shape) != (2 * inter, hidden) or tuple(p["down"].shape) != (hidden, inter):
            raise ValueError("moe_experts_q_cpu: every expert of a call must be [2I, H] / [H, I] with the same H, I")
    table = _routed_table(cells, _addresses(weights, "gate_up"), _addresses(weights, "down"))
    table[:, 6], table[:, 7] = _addresses(weights, "gate_up_scale"), _addresses(weights, "down_scale")
    kind, block = native  # type: ignore[misc]
    kernel.call(x, table, contrib.view(-1, hidden), hidden, inter, kind, block)


def moe_expert_cells_q_cpu(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
    weights: Sequence[Parts], fmt: ExpertFormat, kernel: CpuExperts | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`cpu_experts.moe_expert_cells_cpu` for quantised experts: (cells [C] int64, values
    [C, H] fp32), each expert's cells together in (t, k) order. `kernel` None (or no
    native path for `fmt`): the dequantise-first reference, in fp32."""
    cells = _only(route_cells(topk_ids, topk_weights, experts))
    rows = np.arange(len(cells.cells), dtype=np.int32)  # cell i → row i of values
    values = torch.empty(len(rows), x.shape[1], dtype=torch.float32)
    native = native_weights(fmt)
    if kernel is not None and kernel.native and native and weights and all(_parts_ok(p, fmt) for p in weights):
        hidden, inter = x.shape[1], weights[0]["gate_up"].shape[0] // 2
        table = _routed_table(RoutedCells(cells.tokens, rows, cells.scale, cells.lo, cells.hi),
                              _addresses(weights, "gate_up"), _addresses(weights, "down"))
        table[:, 6], table[:, 7] = _addresses(weights, "gate_up_scale"), _addresses(weights, "down_scale")
        kernel.call(x, table, values, hidden, inter, *native)
    else:
        for parts, lo, hi in zip(weights, cells.lo, cells.hi, strict=True):
            if hi > lo:
                y = expert_mlp_q_ref(x[torch.from_numpy(cells.tokens[lo:hi]).long()], parts, fmt)
                values[lo:hi] = y * torch.from_numpy(cells.scale[lo:hi])[:, None]
    return torch.from_numpy(cells.cells.astype(np.int64)), values


def _addresses(weights: Sequence[Parts], name: str) -> np.ndarray:
    return np.array([p[name].data_ptr() for p in weights], dtype=np.int64)
