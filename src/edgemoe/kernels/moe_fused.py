"""Routed experts addressed by slot, fused: the hot-path form of `moe_experts.py`.

cells[t, k] = weights[t, k] * down[s] @ act.glu(gate[s] @ x[t], up[s] @ x[t]) (glu =
act(gate) * up but for swiglu_oai) for s = slot_ids[t, k] >= 0; a cell whose slot is -1
(not computed in this pass: a later wave, a CPU expert) is left untouched. gate_up [S, 2I, H] holds the gate rows first,
then the up rows; down [S, H, I]; cells [T, K, H] float32.

Biases (`ExpertBias`, gpt-oss): `bias` [E, …] read by `expert_ids` [T, K] int32 (the
routing's ids: biases stay resident for every expert, weights move between slots), added
in fp32 where `moe_reference.expert_mlp` adds them. `act`: a kernel name or an
`Activation` (swiglu_oai's alpha and limit travel with it into the kernels' constexprs).

Two fast paths with that one signature:
- `moe_decode`: one program per (routed pair, block of output rows), streaming the
  slot's weight rows (few tokens: pure weight bandwidth);
- `moe_prefill`: the pairs sorted by slot on the device, then grouped GEMMs (many tokens).
They round where the reference rounds (after each projection, the activation and the
product; with a bias or swiglu_oai, h once), but their fp32 accumulation orders differ,
so the two paths agree with the reference (and each other) to bf16 rounding, not
bitwise. Each is batch-invariant on its own: a pair's cell depends only on x[t], its
slot, its expert id and its weight.

`moe_experts.moe_combine` sums a token's K cells in the fixed order k = 0..K-1 in fp32, so
any partition of the pairs over passes gives bitwise-identical sums.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.activations import Activation, kernel_activation
from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.expert_bias import ExpertBias, check_bias
from edgemoe.kernels.moe_reference import moe_experts_partial_ref


def moe_slots_ref(
    x: torch.Tensor,  # [T, H]
    slot_ids: torch.Tensor,  # [T, K] int32, -1 = leave the cell alone
    weights: torch.Tensor,  # [T, K] float32
    gate_up: torch.Tensor,  # [S, 2I, H]
    down: torch.Tensor,  # [S, H, I]
    cells: torch.Tensor,  # [T, K, H] float32, written in place
    act: str | Activation,
    workspace: torch.Tensor | None = None,
    bias: ExpertBias | None = None,  # [E, ...], read by expert_ids
    expert_ids: torch.Tensor | None = None,  # [T, K] int
) -> None:
    """Torch reference: `moe_experts_partial_ref` with the bank row = the slot itself.

    One host sync (the distinct slots); `workspace` is accepted for the shared
    signature and unused."""
    check_bias(bias, expert_ids, slot_ids, gate_up.shape[1] // 2, x.shape[1])
    slots = torch.unique(slot_ids[slot_ids >= 0]).tolist()
    moe_experts_partial_ref(x, slot_ids, weights, slots, slots, gate_up, down, kernel_activation(act), cells, bias,
                            expert_ids)


moe_decode_ref = moe_slots_ref
moe_prefill_ref = moe_slots_ref


def _check(x: torch.Tensor, slot_ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
           cells: torch.Tensor) -> None:
    T, H = x.shape
    S, two_i, H2 = gate_up.shape
    if H2 != H or down.shape != (S, H, two_i // 2) or cells.shape != (T, slot_ids.shape[1], H):
        raise ValueError(f"shape mismatch: x {tuple(x.shape)} gate_up {tuple(gate_up.shape)} "
                         f"down {tuple(down.shape)} slot_ids {tuple(slot_ids.shape)} cells {tuple(cells.shape)}")
    if cells.dtype != torch.float32:
        raise TypeError("cells must be float32")


def moe_decode(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
    down: torch.Tensor, cells: torch.Tensor, act: str | Activation, workspace: torch.Tensor | None = None,
    bias: ExpertBias | None = None, expert_ids: torch.Tensor | None = None,
) -> None:
    """Same contract as `moe_slots_ref`; per-pair weight streaming on CUDA. `workspace`:
    optional [>= T*K*I] buffer in x's dtype for the intermediate (static under graphs)."""
    _check(x, slot_ids, gate_up, down, cells)
    check_bias(bias, expert_ids, slot_ids, gate_up.shape[1] // 2, x.shape[1])
    if not use_triton(x):
        return moe_slots_ref(x, slot_ids, weights, gate_up, down, cells, act, workspace, bias, expert_ids)
    from edgemoe.kernels.triton_ops.moe_gemv import moe_decode_triton

    return moe_decode_triton(x, slot_ids, weights, gate_up, down, cells, act, workspace, bias, expert_ids)


def moe_prefill(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
    down: torch.Tensor, cells: torch.Tensor, act: str | Activation, workspace: torch.Tensor | None = None,
    bias: ExpertBias | None = None, expert_ids: torch.Tensor | None = None,
) -> None:
    """Same contract as `moe_slots_ref`; grouped GEMM over slot-sorted pairs on CUDA."""
    _check(x, slot_ids, gate_up, down, cells)
    check_bias(bias, expert_ids, slot_ids, gate_up.shape[1] // 2, x.shape[1])
    if not use_triton(x):
        return moe_slots_ref(x, slot_ids, weights, gate_up, down, cells, act, workspace, bias, expert_ids)
    from edgemoe.kernels.triton_ops.moe_gemm import moe_prefill_triton

    return moe_prefill_triton(x, slot_ids, weights, gate_up, down, cells, act, workspace, bias, expert_ids)
