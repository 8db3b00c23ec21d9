"""Dense projections y = x @ W.T of the decode path (attention q/k/v and o, GDN in/out,
routers, shared-expert gates, hyper-connections, the LM head): the torch reference
(`F.linear`, cuBLAS on a GPU) or the Triton weight-streaming GEMV of
`triton_ops/dense_gemv.py` (tiles: `dense_gemv_tiles.py`, `EDGEMOE_DENSE_GEMV_TILES`).

`--dense-kernel` picks the implementation (`make_dense_linear`, built once by the engine
and handed to the model's layers):
- torch: cuBLAS for every M;
- triton: the Triton GEMV for every M up to `MAX_TOKENS` (one kernel for all of them, so
  a row's bits do not depend on the batch size);
- auto (the default): the Triton GEMV for a single token, cuBLAS from two. Measured on an
  H200 (docs/benchmarks.md): the GEMV beats cuBLAS at one token (o_proj 1.36x: cuBLAS
  splits K and adds a reduce; and it chains with the neighbouring Triton kernels through
  programmatic dependent launch, which cuBLAS's kernels do not), batch-1 decode +4.8%
  at 1K and +5.5% at 32K; from two tokens it loses (0.1-0.85x).
The Triton path runs only where it is meant to: bf16/fp16 CUDA tensors
(`backend.use_triton`); prefill-sized batches always take cuBLAS, whose large-M GEMMs it
does not try to beat.

NOTE: the triton setting is batch-invariant (a row's output does not depend on M or on
the other rows); torch and auto are whatever cuBLAS picks for the shape, which may differ
between M = 1 and M = 7 (auto: M = 1 takes the GEMV, M = 2 cuBLAS).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from edgemoe.kernels.backend import triton_importable, use_triton

MAX_TOKENS = 32  # the largest M the Triton GEMV takes (decode batches up to cuda_graph_max_bs' default)
DENSE_KERNELS = ("torch", "triton", "auto")

class Linear(Protocol):
    """A projection: x [M, K] @ w [N, K].T (+ bias [N]) → [M, N] in x's dtype."""

    def __call__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor: ...


def dense_gemv_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference: x [M, K] @ w[N, K].T (+ bias, added before the one rounding) → [M, N]
    in x's dtype."""
    return F.linear(x, w, None if bias is None else bias.to(x.dtype))


def dense_gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton GEMV where it applies (CUDA, bf16/fp16, M <= MAX_TOKENS, 2-D x),
    else the reference. Same signature as `dense_gemv_ref`."""
    if x.dim() == 2 and 0 < x.shape[0] <= MAX_TOKENS and w.dtype == x.dtype and use_triton(x):
        from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

        return dense_gemv_triton(x, w, bias=bias)
    return dense_gemv_ref(x, w, bias)


def dense_gemv_single(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`--dense-kernel auto`: the Triton GEMV for one token (where it beats cuBLAS), the
    reference for more. Same signature as `dense_gemv_ref`."""
    if x.dim() == 2 and x.shape[0] == 1:
        return dense_gemv(x, w, bias)
    return dense_gemv_ref(x, w, bias)


def resolve_dense_kernel(setting: str, device: torch.device) -> str:
    """torch, triton or auto for `--dense-kernel`: auto stays auto on a GPU with Triton
    (the GEMV for one token) and is torch elsewhere."""
    if setting not in DENSE_KERNELS:
        raise ValueError(f"--dense-kernel {setting!r}: choose one of {', '.join(DENSE_KERNELS)}")
    if setting == "auto" and not (device.type == "cuda" and triton_importable()):
        return "torch"
    return setting


def make_dense_linear(setting: str, device: torch.device) -> Linear:
    """The projection function the model's layers call for `--dense-kernel setting`."""
    return {"torch": dense_gemv_ref, "triton": dense_gemv, "auto": dense_gemv_single}[
        resolve_dense_kernel(setting, device)]
