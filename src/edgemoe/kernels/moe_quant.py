"""Routed experts by slot over banks in any expert format (`edgemoe.quant`).

The banks come as a format's parts (`parts["gate_up"]`, `parts["gate_up_scale"]`, …,
each [S, …]). Three entry points share `moe_fused.py`'s contract (cells[t, k] written for
slot_ids[t, k] >= 0, others untouched):
- `moe_quant_ref`: the torch reference — each used slot dequantised to fp32, cast to x's
  dtype, then the plain expert MLP (`moe_experts_partial_ref`'s order);
- `moe_decode_quant` / `moe_prefill_quant`: the fused Triton kernels on CUDA
  (`triton_ops/moe_gemv_q.py`, `moe_gemm_q.py`: dequantisation in registers), the
  reference elsewhere;
- `moe_slots_parts(x, slot_ids, weights, parts, fmt, act, cells, num_decode, bias,
  expert_ids)`: the executors' entry (activation as a callable): unquantised banks take
  `moe_experts.moe_slots` unchanged, quantised ones the fused kernels on CUDA (as
  `moe_slots` splits them: the leading `num_decode` decode rows through the GEMV, the
  rest through the grouped GEMM; no host sync) or the reference.
Every entry takes optional expert biases (`ExpertBias`, unquantised: the model dtype) read
by `expert_ids` [T, K] (`moe_fused.py`'s contract).
"""

from __future__ import annotations

import torch

from edgemoe.kernels.activations import Activation as KernelActivation
from edgemoe.kernels.activations import kernel_activation
from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.expert_bias import ExpertBias, check_bias
from edgemoe.kernels.moe_experts import Activation, expert_mlp, kernel_name, moe_slots
from edgemoe.quant import ExpertFormat, Parts, dequantise_expert


def slot_expert(parts: Parts, slot: int) -> Parts:
    return {name: t[slot] for name, t in parts.items()}


def _reference(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
               act: Activation, cells: torch.Tensor, bias: ExpertBias | None = None,
               expert_ids: torch.Tensor | None = None) -> None:
    hidden, inter = x.shape[1], parts["gate_up"].shape[1] // 2  # gate_up data rows: [S, 2I, ...]
    check_bias(bias, expert_ids, slot_ids, inter, hidden)
    for slot in torch.unique(slot_ids[slot_ids >= 0]).tolist():  # NOTE: host sync
        gate_up, down = dequantise_expert(fmt, slot_expert(parts, slot), hidden, inter)
        t_idx, k_idx = torch.where(slot_ids == slot)
        b = bias.take(expert_ids[t_idx, k_idx]) if bias is not None else None  # type: ignore[index]
        y = expert_mlp(x[t_idx], gate_up.to(x.dtype), down.to(x.dtype), act, b)
        cells[t_idx, k_idx] = y.float() * weights[t_idx, k_idx, None].float()


def moe_quant_ref(
    x: torch.Tensor,  # [T, H]
    slot_ids: torch.Tensor,  # [T, K] int, -1 = leave the cell alone
    weights: torch.Tensor,  # [T, K]
    parts: Parts,  # the format's banks, each [S, ...]
    fmt: ExpertFormat,
    cells: torch.Tensor,  # [T, K, H] float32, written in place
    act: str | KernelActivation,
    workspace: torch.Tensor | None = None,
    bias: ExpertBias | None = None,  # [E, ...], read by expert_ids
    expert_ids: torch.Tensor | None = None,  # [T, K] int
) -> None:
    """The dequantise-first reference; one host sync (the distinct slots). `workspace` is
    accepted for the shared signature and unused."""
    _reference(x, slot_ids, weights, parts, fmt, kernel_activation(act), cells, bias, expert_ids)


def moe_decode_quant(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts,
                     fmt: ExpertFormat, cells: torch.Tensor, act: str | KernelActivation,
                     workspace: torch.Tensor | None = None, bias: ExpertBias | None = None,
                     expert_ids: torch.Tensor | None = None) -> None:
    """Same contract as `moe_quant_ref`; per-pair weight streaming on CUDA."""
    if not use_triton(x):
        return moe_quant_ref(x, slot_ids, weights, parts, fmt, cells, act, workspace, bias, expert_ids)
    from edgemoe.kernels.triton_ops.moe_gemv_q import moe_decode_q_triton

    check_bias(bias, expert_ids, slot_ids, parts["gate_up"].shape[1] // 2, x.shape[1])
    return moe_decode_q_triton(x, slot_ids, weights, parts, fmt, cells, act, workspace, bias, expert_ids)


def moe_prefill_quant(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts,
                      fmt: ExpertFormat, cells: torch.Tensor, act: str | KernelActivation,
                      workspace: torch.Tensor | None = None, bias: ExpertBias | None = None,
                      expert_ids: torch.Tensor | None = None) -> None:
    """Same contract as `moe_quant_ref`; grouped GEMM over slot-sorted pairs on CUDA."""
    if not use_triton(x):
        return moe_quant_ref(x, slot_ids, weights, parts, fmt, cells, act, workspace, bias, expert_ids)
    from edgemoe.kernels.triton_ops.moe_gemm_q import moe_prefill_q_triton

    check_bias(bias, expert_ids, slot_ids, parts["gate_up"].shape[1] // 2, x.shape[1])
    return moe_prefill_q_triton(x, slot_ids, weights, parts, fmt, cells, act, workspace, bias=bias,
                                expert_ids=expert_ids)


def moe_slots_parts(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
    act: Activation, cells: torch.Tensor, num_decode: int = 0, bias: ExpertBias | None = None,
    expert_ids: torch.Tensor | None = None,
) -> None:
    """Fill cells[t, k] for every pair with slot_ids[t, k] >= 0 from banks in `fmt`;
    `num_decode`: the leading rows that are decode tokens (as `moe_slots`); `bias` read by
    `expert_ids` [T, K] (required with it: ValueError)."""
    if not fmt.quantised:
        moe_slots(x, slot_ids, weights, parts["gate_up"], parts["down"], act, cells, num_decode, bias, expert_ids)
        return
    check_bias(bias, expert_ids, slot_ids, parts["gate_up"].shape[1] // 2, x.shape[1])
    if kernel_name(act) is None or not use_triton(x):
        _reference(x, slot_ids, weights, parts, fmt, act, cells, bias, expert_ids)
        return
    # NOTE: by row role, never by batch size: a token's result does not depend on the batch.
    n, ids, w = min(num_decode, x.shape[0]), slot_ids.to(torch.int32), weights.float()
    eids = expert_ids.to(torch.int32) if expert_ids is not None else None
    kact: KernelActivation = act  # type: ignore[assignment]  # kernel_name(act) is not None: an Activation
    if n:
        moe_decode_quant(x[:n], ids[:n], w[:n], parts, fmt, cells[:n], kact, None, bias,
                         eids[:n] if eids is not None else None)
    if n < x.shape[0]:
        moe_prefill_quant(x[n:], ids[n:], w[n:], parts, fmt, cells[n:], kact, None, bias,
                          eids[n:] if eids is not None else None)
