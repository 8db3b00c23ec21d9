"""Routed-expert compute addressed by slot: cells[t, k] = w[t, k] * down(act(gate(x[t])) *
up(x[t])) with the expert's weights in bank row `slot_ids[t, k]`.

The banks are addressed by *slot*, so the same kernel runs on a full resident bank
(slot = expert id) and on a slot cache. A slot of -1 means "not computed in this pass":
its cell is left untouched, so waves, CPU splits and hit/miss passes are masks over one
routing. Work is split in two stages so that any partition of the experts gives
bitwise-identical results: `moe_slots` writes each (token, k) contribution into its own
fp32 cell, and `moe_combine` sums the K cells in a fixed order.

`moe_slots` dispatches: on a GPU with Triton, the fused kernels of `moe_fused.py`
(decode rows through the per-pair GEMV kernel, prompt rows through the grouped GEMM, so
a decode token's result never depends on what else shares its step); otherwise one of
two torch implementations with the same signature:
- `moe_slots_grouped`: one GEMM per used slot over its tokens (reads each expert once);
  it needs the per-slot counts on the host: one device→host read per call.
- `moe_slots_gather`: every (token, k) pair at once through gathered weights and
  batched GEMVs, no host read (so decode steps never wait for the device); its
  workspace grows with T·K, so it serves small batches only (`GATHER_MAX_PAIRS`).
A pair's result depends only on the number of pairs in the call, never on the slots'
masks, so every residency gives the same numbers for the same batch.

Expert biases (`ExpertBias`, gpt-oss) stay resident for every expert, so they are read by
expert id (`expert_ids` [T, K], the routing's), while the weights are read by slot; the
activation is GLU-level (`Activation.glu`: gpt-oss's clamped SwiGLU is no act(gate)·up).
"""

from __future__ import annotations

import torch

from edgemoe.kernels.activations import Activation as KernelActivation
from edgemoe.kernels.activations import glu, kernel_name  # noqa: F401 - kernel_name re-exported
from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.cell_sources import CellSources
from edgemoe.kernels.expert_bias import ExpertBias, check_bias
from edgemoe.kernels.moe_reference import Activation, expert_mlp, moe_combine_ref
from edgemoe.kernels.norm_fused import RowNorm, rms_norm

# Pairs up to which the sync-free gather path runs on a GPU: 16 pairs gather
# 16 experts' weights (~150 MB for Qwen3-30B-A3B in bf16) into a workspace.
GATHER_MAX_PAIRS = 16


def moe_slots_grouped(
    x: torch.Tensor,  # [T, H]
    slot_ids: torch.Tensor,  # [T, K] int, -1 = skip
    weights: torch.Tensor,  # [T, K]
    gate_up: torch.Tensor,  # [S, 2I, H]
    down: torch.Tensor,  # [S, H, I]
    act: Activation,
    cells: torch.Tensor,  # [T, K, H] float32
    bias: ExpertBias | None = None,
    expert_ids: torch.Tensor | None = None,  # [T, K]: addresses `bias`
) -> None:
    T, K = slot_ids.shape
    flat = slot_ids.flatten().long()  # [T*K]
    # Stable: within a slot, pairs stay in (t, k) order, so an expert's tokens are
    # always batched in the same order whatever else is in the pass.
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat + 1, minlength=gate_up.shape[0] + 1).tolist()  # NOTE: host read
    cells_flat, w_flat = cells.view(T * K, -1), weights.flatten()
    pos = counts[0]  # the skipped pairs (-1) sort first
    for slot, n in enumerate(counts[1:]):
        if n == 0:
            continue
        pairs = order[pos : pos + n]
        b = bias.take(expert_ids.flatten()[pairs]) if bias is not None else None  # type: ignore[union-attr]
        y = expert_mlp(x[pairs // K], gate_up[slot], down[slot], act, b)  # [n, H]
        cells_flat[pairs] = y.float() * w_flat[pairs, None].float()
        pos += n


def moe_slots_gather(
    x: torch.Tensor,
    slot_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: Activation,
    cells: torch.Tensor,
    bias: ExpertBias | None = None,
    expert_ids: torch.Tensor | None = None,
) -> None:
    T, K = slot_ids.shape
    H = x.shape[1]
    flat = slot_ids.flatten()
    slots = flat.clamp(min=0).long()  # skipped pairs compute from slot 0, never written
    xs = x.repeat_interleave(K, dim=0)[:, :, None]  # [T*K, H, 1]
    gate, up = torch.bmm(gate_up[slots], xs).squeeze(-1).chunk(2, dim=-1)  # [T*K, I] each
    b = bias.take(expert_ids.flatten().clamp(min=0)) if bias is not None else None  # type: ignore[union-attr]
    if b is not None:  # the reference's rounding points (`expert_mlp`)
        gate_bias, up_bias = b.gate_up.float().chunk(2, dim=-1)
        gate, up = gate.float() + gate_bias, up.float() + up_bias
    h = glu(act, gate, up).to(down.dtype)
    y = torch.bmm(down[slots], h[:, :, None]).squeeze(-1)  # [T*K, H]
    if b is not None:
        y = y.float() + b.down.float()
    y = y.float() * weights.flatten()[:, None].float()
    cells_flat = cells.view(T * K, H)
    cells_flat.copy_(torch.where((flat >= 0)[:, None], y, cells_flat))


def moe_slots(
    x: torch.Tensor,
    slot_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: Activation,
    cells: torch.Tensor,
    num_decode: int = 0,
    bias: ExpertBias | None = None,
    expert_ids: torch.Tensor | None = None,
) -> None:
    """Fill cells[t, k] for every pair with slot_ids[t, k] >= 0 (see the module doc).
    `num_decode`: the leading rows that are decode tokens (the scheduler puts them
    first). On a GPU without Triton, small batches take the path that never reads back.
    `bias` (`ExpertBias`) is read by `expert_ids` [T, K] (required with it: ValueError)."""
    check_bias(bias, expert_ids, slot_ids, gate_up.shape[1] // 2, x.shape[1])
    if isinstance(act, KernelActivation) and use_triton(x):
        _moe_slots_triton(x, slot_ids, weights, gate_up, down, act, cells, min(num_decode, x.shape[0]), bias,
                          expert_ids)
    elif x.is_cuda and slot_ids.numel() <= GATHER_MAX_PAIRS:
        moe_slots_gather(x, slot_ids, weights, gate_up, down, act, cells, bias, expert_ids)
    else:
        moe_slots_grouped(x, slot_ids, weights, gate_up, down, act, cells, bias, expert_ids)


def _moe_slots_triton(x, slot_ids, weights, gate_up, down, act: KernelActivation, cells, n: int,  # noqa: ANN001
                      bias: ExpertBias | None, expert_ids: torch.Tensor | None) -> None:
    from edgemoe.kernels.moe_fused import moe_decode, moe_prefill

    ids, w = slot_ids.to(torch.int32), weights.float()
    eids = expert_ids.to(torch.int32) if expert_ids is not None else None
    if n:
        moe_decode(x[:n], ids[:n], w[:n], gate_up, down, cells[:n], act, None, bias,
                   eids[:n] if eids is not None else None)
    if n < x.shape[0]:
        moe_prefill(x[n:], ids[n:], w[n:], gate_up, down, cells[n:], act, None, bias,
                    eids[n:] if eids is not None else None)


def moe_combine(
    cells: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor | None = None,
    sources: CellSources | None = None,
) -> torch.Tensor:
    """cells [T, K, H] → [T, H]: the K contributions summed in fp32 in the order
    k = 0..K-1 (the fast kernels' order too), rounded once to `dtype`; plus `residual`
    (in `dtype`, as the unfused `residual + out`). `sources`: cells read elsewhere
    (`kernels/cell_sources.py`; the torch path writes them into `cells` first). One fused
    kernel on a GPU (bitwise equal)."""
    if use_triton(cells, dtype):
        from edgemoe.kernels.triton_ops.moe_combine import moe_combine_triton

        return moe_combine_triton(cells, dtype, residual, sources)
    return moe_combine_ref(cells, dtype, residual, sources)


def moe_combine_norm(
    cells: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor, norm: RowNorm,
    sources: CellSources | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, rms_norm(h)) with h = moe_combine(cells, dtype, residual): the next layer's
    input norm fused into the combine, one kernel where the pair would both run Triton.
    NOTE: bitwise the unfused pair everywhere: the fused kernel runs exactly when
    `moe_combine` and `rms_norm` would each take their Triton kernel (same conditions),
    and it computes the norm with that kernel's code and reduction layout; otherwise
    this *is* the pair."""
    if use_triton(cells, dtype) and norm.weight.dtype == dtype:
        from edgemoe.kernels.triton_ops.moe_combine import moe_combine_norm_triton

        return moe_combine_norm_triton(cells, dtype, residual, norm.weight, norm.eps, norm.weight_offset, sources)
    h = moe_combine(cells, dtype, residual, sources)
    return h, rms_norm(h, norm.weight, norm.eps, norm.weight_offset)
