"""The gated delta rule through fla-core's Triton kernels, behind the shared signature of
`kernels/gdn.py` (varlen batch, state pool rows read and written in place).

Optional extra: `pip install fla-core` (≥ 0.5.1, which reads Hk < Hv key heads natively; 0.6.0
is the version measured). `fla` is imported on the first call only, and the calls refuse
non-CUDA tensors: on a CPU machine nothing here imports it (and it must not be installed there,
since transformers then routes its own GDN to Triton and fails).

fla takes gathered initial states [B, Hv, Dk, Dv] and returns new final states, so the pool
costs one gather and one scatter per call around its kernel (`gdn_triton.py` updates the rows
in place for decode). fla in bf16 normalises q/k into bf16 and multiplies in bf16 on tensor
cores: expect agreement with the fp32 reference to bf16 rounding, not fp32.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Callable

import torch

from edgemoe.kernels.gdn import pool_rows

FLA_MIN_VERSION = (0, 5, 1)  # native grouped value heads (GVA) in both GDN kernels


def fla_importable() -> bool:
    """True when the `fla` package is installed (looked up, not imported)."""
    return importlib.util.find_spec("fla") is not None


def _version() -> tuple[int, ...]:
    for dist in ("fla-core", "flash-linear-attention"):
        try:
            text = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())
    return ()


@functools.cache
def fla_ops() -> tuple[Callable, Callable]:
    """(chunk_gated_delta_rule, fused_recurrent_gated_delta_rule), imported on first use."""
    version = _version()
    if version and version < FLA_MIN_VERSION:
        wanted = ".".join(map(str, FLA_MIN_VERSION))
        raise RuntimeError(f"fla-core {'.'.join(map(str, version))} is too old: the GDN kernels need >= {wanted}")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def _initial_states(
    state_pool: torch.Tensor, state_idx: torch.Tensor, has_initial_state: torch.Tensor | None
) -> torch.Tensor:
    if not state_pool.is_cuda:
        raise ValueError("the fla GDN kernels run on CUDA tensors only")
    states = state_pool.index_select(0, pool_rows(state_idx, state_pool))
    if has_initial_state is not None:  # where(), not a multiply: an unread row may hold NaN
        states = torch.where(has_initial_state.view(-1, 1, 1, 1), states, 0.0)
    return states


def chunk_gated_delta_rule_fla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_idx: torch.Tensor, *,
    has_initial_state: torch.Tensor | None = None, use_qk_l2norm: bool = False, scale: float | None = None,
) -> torch.Tensor:
    """Prefill through fla's chunked kernel (chunks of 64 from each sequence's start)."""
    chunk, _ = fla_ops()
    states = _initial_states(state_pool, state_idx, has_initial_state)
    o, final = chunk(
        q[None], k[None], v[None], g=g[None].float(), beta=beta[None], scale=scale, initial_state=states,
        output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=cu_seqlens.long(),
    )
    state_pool.index_copy_(0, pool_rows(state_idx, state_pool), final.to(state_pool.dtype))
    return o[0].to(q.dtype)


def recurrent_gated_delta_rule_fla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_idx: torch.Tensor, *,
    has_initial_state: torch.Tensor | None = None, use_qk_l2norm: bool = False, scale: float | None = None,
) -> torch.Tensor:
    """Decode through fla's fused recurrent kernel. One token per sequence (T == B) runs as a
    batch of length-1 sequences without reading `cu_seqlens`: no host sync, capturable."""
    _, recurrent = fla_ops()
    dtype, states = q.dtype, _initial_states(state_pool, state_idx, has_initial_state)
    # [B, 1, ...] (a batch of length-1 sequences) or [1, T, ...] with cu_seqlens.
    one_each = q.shape[0] == state_idx.numel()
    q, k, v, g, beta = (x[:, None] if one_each else x[None] for x in (q, k, v, g.float(), beta))
    # NOTE: keywords: fused_recurrent's 5th positional parameter is `gk`, not beta.
    o, final = recurrent(
        q, k, v, g=g, beta=beta, scale=scale, initial_state=states, output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=None if one_each else cu_seqlens.long(),
    )
    state_pool.index_copy_(0, pool_rows(state_idx, state_pool), final.to(state_pool.dtype))
    return o.flatten(0, 1).to(dtype)
