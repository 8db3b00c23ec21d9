"""Dense projections y = x @ W.T of the decode path (attention q/k/v and o, GDN in/out,
routers, shared-expert gates, hyper-connections, the LM head): the torch reference
(`F.linear`, cuBLAS on a GPU) or the Triton weight-streaming GEMV of
`triton_ops/dense_gemv.py` (tiles: `dense_gemv_tiles.py`, `EDGEMOE_DENSE_GEMV_TILES`).

`--dense-kernel` picks the implementation (`DenseLinear`, built once by the engine and
handed to the model's layers): torch (the default until the Triton kernel is measured on
the GPU), triton, or auto (triton on a GPU with Triton). The Triton path runs only where
it is meant to: bf16/fp16 CUDA tensors (`backend.use_triton`) with at most
`MAX_TOKENS` rows; prefill-sized batches always take cuBLAS, whose large-M GEMMs it
does not try to beat. NOTE: one kernel serves every M up to MAX_TOKENS (switching kernels
by M would change a row's bits between batch sizes).

NOTE: the Triton path is batch-invariant (a row's output does not depend on M or on the
other rows); the torch path is whatever cuBLAS picks for the shape, which may differ
between M = 1 and M = 7.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from edgemoe.kernels.backend import triton_importable, use_triton

MAX_TOKENS = 32  # the largest M the Triton GEMV takes (decode batches up to cuda_graph_max_bs' default)
DENSE_KERNELS = ("torch", "triton", "auto")

Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def dense_gemv_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Torch reference: x [M, K] @ w[N, K].T → [M, N] in x's dtype."""
    return F.linear(x, w)


def dense_gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The Triton GEMV where it applies (CUDA, bf16/fp16, M <= MAX_TOKENS, 2-D x),
    else the reference. Same signature as `dense_gemv_ref`."""
    if x.dim() == 2 and 0 < x.shape[0] <= MAX_TOKENS and w.dtype == x.dtype and use_triton(x):
        from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

        return dense_gemv_triton(x, w)
    return dense_gemv_ref(x, w)


def resolve_dense_kernel(setting: str, device: torch.device) -> str:
    """torch or triton for `--dense-kernel`; auto = triton on a GPU with Triton."""
    if setting not in DENSE_KERNELS:
        raise ValueError(f"--dense-kernel {setting!r}: choose one of {', '.join(DENSE_KERNELS)}")
    if setting == "auto":
        return "triton" if device.type == "cuda" and triton_importable() else "torch"
    return setting


def make_dense_linear(setting: str, device: torch.device) -> Linear:
    """The projection function the model's layers call for `--dense-kernel setting`."""
    return dense_gemv if resolve_dense_kernel(setting, device) == "triton" else dense_gemv_ref
