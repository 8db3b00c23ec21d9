"""Which implementations run the gated delta rule, chosen by name; fast paths import lazily.

A backend name is `<prefill>+<decode>`, or one name for both:

- prefill (the chunked rule): `torch` (`gdn.chunk_gated_delta_rule_ref`) or `fla` (fla-core's
  chunked Triton kernel, an optional extra).
- decode (the recurrent rule): `torch` (`gdn.recurrent_gated_delta_rule_ref`), `fla` (fla-core's
  fused recurrent kernel, with a gather/scatter of the pool rows around it) or `triton`
  (`gdn_triton`: pool rows updated in place, one launch).
- `auto`: `torch` on a CPU device; on CUDA `fla+triton`, or `torch+triton` with a warning when
  fla-core is not installed (the torch chunked rule is slow for long prompts on the GPU).
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Protocol

import torch

log = logging.getLogger(__name__)
PREFILL = ("torch", "fla")
DECODE = ("torch", "fla", "triton")


class GdnRule(Protocol):
    """The shared signature (contract in `kernels/gdn.py`): o [T, Hv, Dv]; pool rows updated."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_idx: torch.Tensor, *,
        has_initial_state: torch.Tensor | None = None, use_qk_l2norm: bool = False, scale: float | None = None,
    ) -> torch.Tensor: ...


class GdnKernels(NamedTuple):
    prefill: GdnRule  # the chunked rule, any number of tokens per sequence
    decode: GdnRule  # the recurrent rule, one (or a few) tokens per sequence
    name: str  # the resolved `<prefill>+<decode>`, for logs and stats


def gdn_kernels(backend: str, device: torch.device) -> GdnKernels:
    """The pair named by `backend` for tensors on `device`. Nothing imports fla for a CPU
    device; resolving `auto` only looks fla up."""
    if backend == "auto":
        backend = _auto(device)
    prefill, _, decode = backend.partition("+")
    decode = decode or prefill
    if prefill not in PREFILL or decode not in DECODE:
        raise ValueError(f"gdn backend {backend!r}: auto, or <{'|'.join(PREFILL)}>+<{'|'.join(DECODE)}>")
    if device.type != "cuda" and (prefill, decode) != ("torch", "torch"):
        raise ValueError(f"gdn backend {backend!r} needs a CUDA device, not {device}")
    return GdnKernels(_prefill(prefill), _decode(decode), f"{prefill}+{decode}")


def _auto(device: torch.device) -> str:
    if device.type != "cuda":
        return "torch"
    from edgemoe.kernels.gdn_fla import fla_importable

    if fla_importable():
        return "fla+triton"
    log.warning("fla-core is not installed: GDN prefill runs the torch reference on the GPU (slow for long "
                "prompts); pip install 'fla-core>=0.5.1'")
    return "torch+triton"


def _require_fla(name: str) -> None:
    from edgemoe.kernels.gdn_fla import fla_importable

    if not fla_importable():
        raise ValueError(f"gdn backend {name!r} needs fla-core: pip install 'fla-core>=0.5.1'")


def _prefill(name: str) -> GdnRule:
    if name == "torch":
        from edgemoe.kernels.gdn import chunk_gated_delta_rule_ref

        return chunk_gated_delta_rule_ref
    _require_fla(name)
    from edgemoe.kernels.gdn_fla import chunk_gated_delta_rule_fla

    return chunk_gated_delta_rule_fla


def _decode(name: str) -> GdnRule:
    if name == "torch":
        from edgemoe.kernels.gdn import recurrent_gated_delta_rule_ref

        return recurrent_gated_delta_rule_ref
    if name == "triton":
        from edgemoe.kernels.gdn_triton import recurrent_gated_delta_rule_triton

        return recurrent_gated_delta_rule_triton
    _require_fla(name)
    from edgemoe.kernels.gdn_fla import recurrent_gated_delta_rule_fla

    return recurrent_gated_delta_rule_fla
