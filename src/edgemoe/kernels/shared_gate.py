"""The shared expert's routing pair (Qwen3-Next / Qwen3.5 / Qwen3.8, a shared expert in the
expert bank: `layers/shared_moe.py`): every token's routed (ids, weights) [T, K] with one
more pair appended, (the shared expert's id, sigmoid(x · g_shared)).

`append_shared_ref` is transformers' gate (the projection rounded to x's dtype, its sigmoid
in that dtype) followed by the two concatenations: five launches and a GEMV on a GPU.
`append_shared` is one launch there for decode batches (`triton_ops/shared_gate.py`: a
program a token, the gate's dot product in fp32 in another order than the GEMV's, so the
weight agrees to one rounding of x's dtype; the routed pairs are copied bitwise).
"""

from __future__ import annotations

import torch

from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.dense_gemv import MAX_TOKENS, Linear, dense_gemv_ref


def append_shared_ref(
    x: torch.Tensor, gate: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, shared_id: int,
    linear: Linear = dense_gemv_ref,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], gate [1, H], ids [T, K] int32, weights [T, K] fp32 → [T, K+1] each."""
    g = torch.sigmoid(linear(x, gate))  # [T, 1] in x's dtype, as transformers
    ids = torch.cat([ids, ids.new_full((x.shape[0], 1), shared_id)], dim=1)
    return ids, torch.cat([weights, g.to(weights.dtype)], dim=1)


def append_shared(
    x: torch.Tensor, gate: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, shared_id: int,
    linear: Linear = dense_gemv_ref,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`append_shared_ref`'s contract; one launch for decode batches on a GPU."""
    T = x.shape[0]
    if not (x.dim() == 2 and 0 < T <= MAX_TOKENS and use_triton(x) and gate.dtype == x.dtype
            and ids.dtype == torch.int32 and weights.dtype == torch.float32):
        return append_shared_ref(x, gate, ids, weights, shared_id, linear)
    from edgemoe.kernels.triton_ops.shared_gate import append_shared_triton

    return append_shared_triton(x, gate, ids, weights, shared_id)
