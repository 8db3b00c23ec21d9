"""The shared expert's pair appended to the routing (contract: `kernels/shared_gate.py`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import interpreting, pdl_start, round_to, round_trip, sigmoid_torch, tl_dtype

MAX_BLOCK_H = 2048  # hidden elements a load


@triton.jit
def _append_shared(
    x_ptr, g_ptr, ids_ptr, w_ptr, ids_out_ptr, w_out_ptr, H, shared_id, stride_x, stride_i, stride_w,
    K: tl.constexpr, K_PAD: tl.constexpr, DTYPE: tl.constexpr, BLOCK_H: tl.constexpr, INTERP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    pdl_start(USE_PDL)
    acc = tl.zeros([BLOCK_H], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + cols
        acc += tl.load(x_ptr + t * stride_x + hs, mask=hs < H, other=0.0).to(tl.float32) * \
            tl.load(g_ptr + hs, mask=hs < H, other=0.0).to(tl.float32)
    logit = round_trip(tl.sum(acc, axis=0), DTYPE, INTERP)  # F.linear's output, in x's dtype
    gate = round_trip(sigmoid_torch(logit, INTERP), DTYPE, INTERP)
    k = tl.arange(0, K_PAD)
    routed = k < K
    ids = tl.load(ids_ptr + t * stride_i + k, mask=routed, other=0)
    w = tl.load(w_ptr + t * stride_w + k, mask=routed, other=0.0)
    tl.store(ids_out_ptr + t * (K + 1) + k, tl.where(routed, ids, shared_id), mask=k <= K)
    tl.store(w_out_ptr + t * (K + 1) + k, tl.where(routed, w, gate), mask=k <= K)


def append_shared_triton(
    x: torch.Tensor, gate: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, shared_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    T, H = x.shape
    K = ids.shape[1]
    x = x if x.stride(-1) == 1 else x.contiguous()
    ids = ids if ids.stride(-1) == 1 else ids.contiguous()
    weights = weights if weights.stride(-1) == 1 else weights.contiguous()
    ids_out = torch.empty(T, K + 1, dtype=ids.dtype, device=x.device)
    w_out = torch.empty(T, K + 1, dtype=weights.dtype, device=x.device)
    if T:
        pdl = pdl_enabled(x.device)
        _append_shared[(T,)](
            x, gate.reshape(-1).contiguous(), ids, weights, ids_out, w_out, H, shared_id, x.stride(0), ids.stride(0),
            weights.stride(0), K=K, K_PAD=triton.next_power_of_2(K + 1), DTYPE=tl_dtype(x.dtype),
            BLOCK_H=min(MAX_BLOCK_H, triton.next_power_of_2(H)), INTERP=interpreting(x), USE_PDL=pdl, launch_pdl=pdl,
            num_warps=4,
        )
    return ids_out, w_out
