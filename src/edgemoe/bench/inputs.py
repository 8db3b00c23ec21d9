"""Seeded random MoE inputs in the slot-addressed kernels' layout, for kernel benchmarks
(`edgemoe bench moe-quant`) and, re-exported by `edgemoe.testing.kernel_inputs`, tests.
Slot banks have realistic magnitudes (gate/up outputs ~ N(0, 1))."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MoEBatch:
    x: torch.Tensor  # [T, H]
    slot_ids: torch.Tensor  # [T, K] int32, -1 = not in this pass
    weights: torch.Tensor  # [T, K] float32
    gate_up: torch.Tensor  # [S, 2I, H]
    down: torch.Tensor  # [S, H, I]


def moe_batch(
    tokens: int, top_k: int, hidden: int, inter: int, slots: int, dtype: torch.dtype,
    device: str | torch.device = "cpu", seed: int = 0, unrouted: float = 0.0,
) -> MoEBatch:
    """Each token routes to `top_k` distinct slots; a fraction `unrouted` of the cells is -1."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)
    gate_up = (torch.randn(slots, 2 * inter, hidden, generator=g, device=device) * hidden**-0.5).to(dtype)
    down = (torch.randn(slots, hidden, inter, generator=g, device=device) * inter**-0.5).to(dtype)
    ids = torch.rand(tokens, slots, generator=g, device=device).argsort(dim=1)[:, :top_k].to(torch.int32)
    drop = torch.rand(tokens, top_k, generator=g, device=device) < unrouted
    ids = torch.where(drop, torch.full_like(ids, -1), ids)
    weights = torch.rand(tokens, top_k, generator=g, device=device)
    return MoEBatch(x, ids, weights / weights.sum(1, keepdim=True), gate_up, down)
