"""Routed experts by slot over banks in any expert format (`edgemoe.quant`).

The banks come as a format's parts (`parts["gate_up"]`, `parts["gate_up_scale"]`, …,
each [S, …]). Three entry points share `moe_fused.py`'s contract (cells[t, k] written for
slot_ids[t, k] >= 0, others untouched):
- `moe_quant_ref`: the torch reference — each used slot dequantised to fp32, cast to x's
  dtype, then the plain expert MLP (`moe_experts_partial_ref`'s order);
- `moe_decode_quant` / `moe_prefill_quant`: the fused Triton kernels on CUDA
  (`triton_ops/moe_gemv_q.py`, `moe_gemm_q.py`: dequantisation in registers), the
  reference elsewhere;
- `moe_slots_parts(x, slot_ids, weights, parts, fmt, act, cells)`: the executors' entry
  (activation as a callable): unquantised banks take `moe_experts.moe_slots` unchanged,
  quantised ones the fused kernels on CUDA (decode below `DECODE_MAX_PAIRS` pairs, no
  host sync either way) or the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.moe_experts import Activation, expert_mlp, moe_slots
from edgemoe.kernels.moe_fused import ACTIVATIONS
from edgemoe.quant import ExpertFormat, Parts, dequantise_expert

DECODE_MAX_PAIRS = 64  # pairs (T·K) up to which the per-pair GEMV kernel runs; the grouped GEMM above


def slot_expert(parts: Parts, slot: int) -> Parts:
    return {name: t[slot] for name, t in parts.items()}


def _reference(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
               act: Activation, cells: torch.Tensor) -> None:
    hidden, inter = x.shape[1], parts["gate_up"].shape[1] // 2  # gate_up data rows: [S, 2I, ...]
    for slot in torch.unique(slot_ids[slot_ids >= 0]).tolist():  # NOTE: host sync
        gate_up, down = dequantise_expert(fmt, slot_expert(parts, slot), hidden, inter)
        t_idx, k_idx = torch.where(slot_ids == slot)
        y = expert_mlp(x[t_idx], gate_up.to(x.dtype), down.to(x.dtype), act)
        cells[t_idx, k_idx] = y.float() * weights[t_idx, k_idx, None].float()


def moe_quant_ref(
    x: torch.Tensor,  # [T, H]
    slot_ids: torch.Tensor,  # [T, K] int, -1 = leave the cell alone
    weights: torch.Tensor,  # [T, K]
    parts: Parts,  # the format's banks, each [S, ...]
    fmt: ExpertFormat,
    cells: torch.Tensor,  # [T, K, H] float32, written in place
    act: str,
    workspace: torch.Tensor | None = None,
) -> None:
    """The dequantise-first reference; one host sync (the distinct slots). `workspace` is
    accepted for the shared signature and unused."""
    _reference(x, slot_ids, weights, parts, fmt, ACTIVATIONS[act], cells)


def moe_decode_quant(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts,
                     fmt: ExpertFormat, cells: torch.Tensor, act: str, workspace: torch.Tensor | None = None) -> None:
    """Same contract as `moe_quant_ref`; per-pair weight streaming on CUDA."""
    if not use_triton(x):
        return moe_quant_ref(x, slot_ids, weights, parts, fmt, cells, act, workspace)
    from edgemoe.kernels.triton_ops.moe_gemv_q import moe_decode_q_triton

    return moe_decode_q_triton(x, slot_ids, weights, parts, fmt, cells, act, workspace)


def moe_prefill_quant(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts,
                      fmt: ExpertFormat, cells: torch.Tensor, act: str, workspace: torch.Tensor | None = None) -> None:
    """Same contract as `moe_quant_ref`; grouped GEMM over slot-sorted pairs on CUDA."""
    if not use_triton(x):
        return moe_quant_ref(x, slot_ids, weights, parts, fmt, cells, act, workspace)
    from edgemoe.kernels.triton_ops.moe_gemm_q import moe_prefill_q_triton

    return moe_prefill_q_triton(x, slot_ids, weights, parts, fmt, cells, act, workspace)


def _act_name(act: Activation) -> str | None:
    return next((name for name, fn in ACTIVATIONS.items() if fn is act), "silu" if act is F.silu else None)


def moe_slots_parts(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
    act: Activation, cells: torch.Tensor,
) -> None:
    """Fill cells[t, k] for every pair with slot_ids[t, k] >= 0 from banks in `fmt`."""
    if not fmt.quantised:
        moe_slots(x, slot_ids, weights, parts["gate_up"], parts["down"], act, cells)
        return
    name = _act_name(act)
    if name is not None and use_triton(x):
        kernel = moe_decode_quant if slot_ids.numel() <= DECODE_MAX_PAIRS else moe_prefill_quant
        kernel(x, slot_ids, weights, parts, fmt, cells, name)
        return
    _reference(x, slot_ids, weights, parts, fmt, act, cells)
