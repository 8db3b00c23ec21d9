"""Per-expert biases of the routed experts (gpt-oss): gu = W_gu·x + b_gu, y = W_d·h + b_d.

The weights move between host banks and device slots; the biases are small (E·(2I + H)
values a layer) and stay resident for every expert, so the kernels address them by
*expert id* (the routing's `expert_ids` [T, K]), never by slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertBias:
    """One MoE layer's expert biases, in the model dtype on the banks' device (CPU banks:
    on the CPU). Indexed (`take`, `of`), the leading [E] becomes the index's shape."""

    gate_up: torch.Tensor  # [E, 2I], gate half first (the loader de-interleaves gpt-oss's columns)
    down: torch.Tensor  # [E, H]

    def take(self, expert_ids: torch.Tensor) -> ExpertBias:
        """The biases of each id: [n, 2I] and [n, H] for ids [n]."""
        ids = expert_ids.long()
        return ExpertBias(self.gate_up[ids], self.down[ids])

    def of(self, expert: int) -> ExpertBias:
        """One expert's biases: [2I] and [H]."""
        return ExpertBias(self.gate_up[expert], self.down[expert])


def check_bias(bias: ExpertBias | None, expert_ids: torch.Tensor | None, slot_ids: torch.Tensor,
               inter: int, hidden: int) -> None:
    """ValueError unless `bias` comes with `expert_ids` shaped like `slot_ids` and its
    tensors are [E, 2I] / [E, H] for the banks' I and H (shapes only: no device read)."""
    if bias is None:
        return
    if expert_ids is None:
        raise ValueError("expert biases are addressed by expert id: pass expert_ids with bias")
    if tuple(expert_ids.shape) != tuple(slot_ids.shape):
        raise ValueError(f"expert_ids {tuple(expert_ids.shape)} must match slot_ids {tuple(slot_ids.shape)}")
    E = bias.gate_up.shape[0]
    if tuple(bias.gate_up.shape) != (E, 2 * inter) or tuple(bias.down.shape) != (E, hidden):
        raise ValueError(f"bias gate_up {tuple(bias.gate_up.shape)} / down {tuple(bias.down.shape)} "
                         f"are not [E, 2I={2 * inter}] / [E, H={hidden}]")
