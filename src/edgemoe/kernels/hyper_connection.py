"""The hyper-connections' elementwise steps (`layers/hyper_connection.py` has the maths),
each one launch on a GPU where transformers' ops launch ~20 small kernels a mix:

- `hc_norm(h, weight, eps, hidden, inject=None)`: the grouped zero-centred RMSNorm of the
  hc streams h [T, hc·H] (a weight slice per stream); with `inject` = (y [T, H], g [T, hc])
  first the injection h + y ⊗ g, returned beside the norm (the block's attention output
  goes in and the MoE's mix reads it in the same launch);
- `hc_gates(z, rank, hc)`: from the stacked down/inject projection z [T, R (+ hc)] the mix's
  low-rank input silu(z[:, :R] / hc) and the inject weights 2·sigmoid(z[:, R:] / hc);
- `hc_mix(w, n, hc)`: x = mean_s(sigmoid(w_s) · n_s), the sub-layer's input [T, H];
- `hc_inject(h, y, g)`: h + y ⊗ g alone.

The references are transformers' ops in its order and dtypes (bitwise what the model did
before these kernels). The kernels round where torch's ops round and compute silu/sigmoid
as torch's CUDA kernels do (`expf`, an IEEE division: `triton_ops/common.py`), so on a GPU
they agree with the references bitwise except where an fp32 sum runs in another order —
the norm's sum of squares (Triton's tree, not torch's), the mean over the streams — which
moves a result by at most one rounding of the dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.norm_fused import grouped_rms_norm_ref

Inject = tuple[torch.Tensor, torch.Tensor]  # (y [T, H], g [T, hc]): a pending h + y ⊗ g


def hc_inject_ref(h: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """h [T, hc·H] + y [T, H] scaled per stream by g [T, hc]."""
    return h + (y[:, None, :] * g[:, :, None]).flatten(1)


def hc_norm_ref(
    h: torch.Tensor, weight: torch.Tensor, eps: float, hidden: int, inject: Inject | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the grouped norm of h' [T, hc·H], h') with h' = h, or `hc_inject_ref(h, *inject)`."""
    if inject is not None:
        h = hc_inject_ref(h, *inject)
    return grouped_rms_norm_ref(h, weight, eps, hidden), h


def hc_gates_ref(z: torch.Tensor, rank: int, hc: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(silu(z[:, :rank] / hc) [T, R], 2·sigmoid(z[:, rank:] / hc) [T, hc] or None when z has
    no inject columns), each op in z's dtype."""
    a = F.silu(z[:, :rank] / hc)
    g = 2 * torch.sigmoid(z[:, rank:] / hc) if z.shape[1] > rank else None
    return a, g


def hc_mix_ref(w: torch.Tensor, n: torch.Tensor, hc: int) -> torch.Tensor:
    """w, n [T, hc·H] → mean over the streams of sigmoid(w) · n, [T, H]."""
    T, hidden = n.shape[0], n.shape[1] // hc
    return (torch.sigmoid(w).view(T, hc, hidden) * n.view(T, hc, hidden)).mean(dim=-2)


def _fast(*tensors: torch.Tensor) -> bool:
    """The kernels' case: `use_triton` (a GPU, bf16/fp16), 2-D rows in one dtype."""
    first = tensors[0]
    return use_triton(first) and all(t.dtype == first.dtype and t.dim() == 2 for t in tensors)


def hc_inject(h: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """`hc_inject_ref`'s contract (bitwise: a product and a sum, each rounded once)."""
    if not _fast(h, y, g):
        return hc_inject_ref(h, y, g)
    from edgemoe.kernels.triton_ops.hyper_connection import hc_norm_triton

    return hc_norm_triton(h, None, 0.0, y.shape[1], (y, g), norm=False)[1]


def hc_norm(
    h: torch.Tensor, weight: torch.Tensor, eps: float, hidden: int, inject: Inject | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`hc_norm_ref`'s contract; one launch on a GPU (the injection bitwise, the norm to a
    rounding of the dtype)."""
    if not _fast(h, *(inject or ())) or weight.dtype != h.dtype:
        return hc_norm_ref(h, weight, eps, hidden, inject)
    from edgemoe.kernels.triton_ops.hyper_connection import hc_norm_triton

    return hc_norm_triton(h, weight, eps, hidden, inject)


def hc_gates(z: torch.Tensor, rank: int, hc: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`hc_gates_ref`'s contract; one launch on a GPU."""
    if not _fast(z) or hc & (hc - 1):  # the kernel's z / hc: a product by 1 / hc, exact for powers of two
        return hc_gates_ref(z, rank, hc)
    from edgemoe.kernels.triton_ops.hyper_connection import hc_gates_triton

    return hc_gates_triton(z, rank, hc)


def hc_mix(w: torch.Tensor, n: torch.Tensor, hc: int) -> torch.Tensor:
    """`hc_mix_ref`'s contract; one launch on a GPU."""
    if not _fast(w, n):
        return hc_mix_ref(w, n, hc)
    from edgemoe.kernels.triton_ops.hyper_connection import hc_mix_triton

    return hc_mix_triton(w, n, hc)
