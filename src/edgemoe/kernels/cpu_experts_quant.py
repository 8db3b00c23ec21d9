"""Routed experts on the host CPU with quantised weights: int8 (per-row scales), fp8
e4m3 (block scales), int4 (fp16 scales and zero points per group of a multiple of 32) and
mxfp4 (E2M1 nibbles, an E8M0 exponent per 32) read in place from the expert store and
converted in registers (`kernels/cpu/em_quant.h`, `em_int4.h`); other formats (fp8 blocks
or int4 groups not a multiple of 32) run the dequantise-first reference in torch.

Weights come as a format's parts (`edgemoe.quant`): "gate_up", "gate_up_scale", "down",
"down_scale" (int4: also "gate_up_zero", "down_zero"; mxfp4: the scales are E8M0 bytes). Entry points mirror `cpu_experts.py`:
- `expert_mlp_q_cpu(x, parts, fmt)` → [n, H] fp32 (reference: `expert_mlp_q_ref`);
- `moe_experts_q_cpu(x, topk_ids, topk_weights, experts, weights, fmt, contrib)`: the
  routed form, weights[i] = the parts of experts[i] (e.g. `store.expert_parts(layer, e)`);
- `moe_expert_cells_q_cpu(...)`: the routed form's cells compactly.
Each takes `act` (SiLU, or gpt-oss's swiglu_oai) and `bias` (`ExpertBias`: the one
expert's rows, or [E, …] by expert id in the routed forms), as `cpu_experts.py`'s do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from edgemoe.kernels.cpu_experts import (
    RoutedCells,
    _contrib_ok,
    _one_expert,
    _only,
    _routed_table,
    bias_addresses,
    expert_mlp_ref,
    route_cells,
)
from edgemoe.kernels.cpu_kernel import CpuExperts, default_cpu_experts, kernel_glu
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.moe_reference import Activation
from edgemoe.quant import ExpertFormat, Fp8Block, Int4Group, Int8Channel, Parts, dequantise_expert, expert_specs
from edgemoe.quant.mxfp4 import BLOCK as MX_BLOCK
from edgemoe.quant.mxfp4 import Mxfp4

# NOTE: fp8 blocks and int4 groups must be a multiple of 32 (em_experts checks): AMX B
# tiles span 32 k, and an int4 group starts at a whole GEMV step (32 k with AVX-512) and a
# whole byte. Int4Group's default 128 and "one group per row" (2^30) qualify.
QSTEP = 32
# The parts the C kernel reads per format, and their dtypes (data, scales, zero points).
_PART_DTYPES = {
    "int8": (torch.int8, torch.float32, None),
    "fp8": (torch.float8_e4m3fn, torch.float32, None),
    "int4": (torch.uint8, torch.float16, torch.uint8),
    "mxfp4": (torch.uint8, torch.uint8, None),
}


def native_weights(fmt: ExpertFormat) -> tuple[str, int] | None:
    """(the C kernel's weight kind, fp8 block, int4 group or mxfp4's 32) for `fmt`, or None
    when it has no native path."""
    if isinstance(fmt, Int8Channel):
        return "int8", 0
    if isinstance(fmt, Fp8Block) and fmt.block % QSTEP == 0:
        return "fp8", fmt.block
    if isinstance(fmt, Int4Group) and fmt.group % QSTEP == 0 and fmt.group < 2**31:
        return "int4", fmt.group
    if isinstance(fmt, Mxfp4):
        return "mxfp4", MX_BLOCK
    return None


def expert_mlp_q_ref(x: torch.Tensor, parts: Parts, fmt: ExpertFormat, act: Activation = F.silu,
                     bias: ExpertBias | None = None) -> torch.Tensor:
    """The oracle: the expert dequantised to fp32, then everything in fp32 (`bias`: its
    [2I], [H] rows, or each token's)."""
    hidden, inter = x.shape[1], parts["gate_up"].shape[0] // 2
    return expert_mlp_ref(x, *dequantise_expert(fmt, parts, hidden, inter), act, bias)


def _parts_ok(parts: Parts, fmt: ExpertFormat) -> bool:
    """CPU tensors in the format's dtypes with dense rows (bank rows or single experts)."""
    native = native_weights(fmt)
    if native is None:
        return False
    dtypes = _PART_DTYPES[native[0]]
    for proj in ("gate_up", "down"):
        for suffix, dt in zip(("", "_scale", "_zero"), dtypes, strict=True):
            t = parts.get(proj + suffix)
            if dt is None:
                continue
            if t is None or t.dtype != dt or t.device.type != "cpu" or not t.is_contiguous():
                return False
    return True


def _inter(weights: Sequence[Parts], fmt: ExpertFormat, hidden: int) -> int:
    """I of a call's experts, every part checked against the format's shapes for (H, I):
    the kernel reads them by these shapes alone."""
    inter = weights[0]["gate_up"].shape[0] // 2 if weights else 1
    specs = expert_specs(fmt, hidden, inter)
    for p in weights:
        if any(tuple(p[name].shape) != shape for name, (shape, _) in specs.items()):
            raise ValueError(f"every expert of a call must have {fmt.name} parts of H={hidden}, I={inter}")
    return inter


def _quant_table(cells: RoutedCells, weights: Sequence[Parts], bias_addr: np.ndarray | None = None) -> np.ndarray:
    """The job table of `cells` over quantised experts: data, scale and zero-point addresses
    (zero points: int4 only; 0 otherwise), bias rows `bias_addr` (`bias_addresses`)."""
    table = _routed_table(cells, _addresses(weights, "gate_up"), _addresses(weights, "down"), bias_addr)
    for col, name in ((6, "gate_up_scale"), (7, "down_scale"), (8, "gate_up_zero"), (9, "down_zero")):
        table[:, col] = _addresses(weights, name)
    return table


def expert_mlp_q_cpu(x: torch.Tensor, parts: Parts, fmt: ExpertFormat, kernel: CpuExperts | None = None,
                     act: Activation = F.silu, bias: ExpertBias | None = None) -> torch.Tensor:
    """One expert on its tokens: x [n, H] → [n, H] fp32 (`bias`: its [2I], [H] rows)."""
    n, hidden = x.shape
    contrib = torch.empty(n, 1, hidden)
    ids = torch.zeros(n, 1, dtype=torch.int64)
    banks = _one_expert(bias) if bias is not None else None
    moe_experts_q_cpu(x, ids, torch.ones(n, 1), [0], [parts], fmt, contrib, kernel, act, banks)
    return contrib[:, 0]


def _ref_cells(x: torch.Tensor, cells: RoutedCells, experts: Sequence[int], weights: Sequence[Parts],
               fmt: ExpertFormat, act: Activation, bias: ExpertBias | None, out: torch.Tensor,
               out_rows: np.ndarray) -> None:
    """The reference's cells: expert i's [lo, hi) weighted into rows out_rows[lo:hi] of out."""
    for e, parts, lo, hi in zip(experts, weights, cells.lo, cells.hi, strict=True):
        if hi > lo:
            b = bias.of(e) if bias is not None else None
            y = expert_mlp_q_ref(x[torch.from_numpy(cells.tokens[lo:hi]).long()], parts, fmt, act, b)
            out[torch.from_numpy(out_rows[lo:hi]).long()] = y * torch.from_numpy(cells.scale[lo:hi])[:, None]


def moe_experts_q_cpu(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
    weights: Sequence[Parts], fmt: ExpertFormat, contrib: torch.Tensor, kernel: CpuExperts | None = None,
    act: Activation = F.silu, bias: ExpertBias | None = None,
) -> None:
    """Fill contrib[t, k] = w[t, k] · expert(x[t]) for every (t, k) routed to one of
    `experts`, weights[i] holding experts[i]'s parts in `fmt`, `bias` [E, …] by expert id.
    No native path (the format, `act`, the biases' place or dtype): the reference, in fp32."""
    kernel = kernel or default_cpu_experts()
    cells = route_cells(topk_ids, topk_weights, experts)
    native, glu = native_weights(fmt), kernel_glu(act, bias)
    ok = native is not None and glu is not None and kernel.native and _contrib_ok(x, topk_ids, contrib)
    if not (ok and all(_parts_ok(p, fmt) for p in weights)):
        _ref_cells(x, cells, experts, weights, fmt, act, bias, contrib.view(-1, contrib.shape[-1]), cells.cells)
        return
    hidden = x.shape[1]
    inter = _inter(weights, fmt, hidden)
    table = _quant_table(cells, weights, bias_addresses(bias, experts, hidden, inter))
    kind, block = native  # type: ignore[misc]
    kernel.call(x, table, contrib.view(-1, hidden), hidden, inter, kind, block, glu)  # type: ignore[arg-type]


def quant_job_table(topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
                    weights: Sequence[Parts], bias: ExpertBias | None = None) -> tuple[np.ndarray, RoutedCells]:
    """`moe_experts_q_cpu`'s job table (biases by expert id) and the cells its addresses
    point into (keep both alive until the call returns); the caller has checked the parts
    (`moe_experts_q_cpu`)."""
    cells = route_cells(topk_ids, topk_weights, experts)
    if bias is None:
        return _quant_table(cells, weights), cells
    hidden, inter = weights[0]["down"].shape[0], weights[0]["gate_up"].shape[0] // 2  # int4's columns are packed
    return _quant_table(cells, weights, bias_addresses(bias, experts, hidden, inter)), cells


def moe_expert_cells_q_cpu(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
    weights: Sequence[Parts], fmt: ExpertFormat, kernel: CpuExperts | None = None,
    act: Activation = F.silu, bias: ExpertBias | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`cpu_experts.moe_expert_cells_cpu` for quantised experts: (cells [C] int64, values
    [C, H] fp32), each expert's cells together in (t, k) order; `bias` [E, …] by expert id.
    `kernel` None (or no native path for `fmt`, `act` or the biases): the dequantise-first
    reference, in fp32."""
    cells = _only(route_cells(topk_ids, topk_weights, experts))
    rows = np.arange(len(cells.cells), dtype=np.int32)  # cell i → row i of values
    values = torch.empty(len(rows), x.shape[1], dtype=torch.float32)
    native, glu = native_weights(fmt), kernel_glu(act, bias)
    ok = kernel is not None and kernel.native and native is not None and glu is not None and len(weights) > 0
    if ok and all(_parts_ok(p, fmt) for p in weights):
        hidden = x.shape[1]
        inter = _inter(weights, fmt, hidden)
        table = _quant_table(RoutedCells(cells.tokens, rows, cells.scale, cells.lo, cells.hi), weights,
                             bias_addresses(bias, experts, hidden, inter))
        kernel.call(x, table, values, hidden, inter, *native, glu)  # type: ignore[union-attr, misc]
    else:
        _ref_cells(x, cells, experts, weights, fmt, act, bias, values, rows)
    return torch.from_numpy(cells.cells.astype(np.int64)), values


def _addresses(weights: Sequence[Parts], name: str) -> np.ndarray:
    """Each expert's `name` part's address (0 where the format has no such part)."""
    return np.array([p[name].data_ptr() if name in p else 0 for p in weights], dtype=np.int64)
