"""Routing traces for the expert slot caches' tests (the device cache against `SlotCache`
in tests/moe, the fused plan kernel against the torch plan in tests/kernels, and on the
GPU). Importable because tests/conftest.py puts this folder on sys.path."""

from __future__ import annotations

import random

import torch


def routing(rng: random.Random, T: int, E: int, K: int, skew: float) -> torch.Tensor:
    """[T, K] distinct experts per row, popularity ∝ rank^-skew (hits need repeats)."""
    weights = [1.0 / (i + 1) ** skew for i in range(E)]
    perm = list(range(E))
    rng.shuffle(perm)
    rows = []
    for _ in range(T):
        row: list[int] = []
        while len(row) < K:
            e = perm[rng.choices(range(E), weights)[0]]
            if e not in row:
                row.append(e)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int32)


CONFIGS = [  # (layers, experts, slots, top_k, token counts)
    (1, 8, 2, 2, (1, 3, 8)),  # the pool is exactly top-k
    (3, 8, 2, 2, (1, 2, 5)),
    (2, 16, 4, 4, (1, 2, 6)),  # exactly top-k with wide batches: many waves
    (3, 16, 11, 3, (1, 4, 16)),
    (4, 32, 40, 4, (1, 1, 3, 12)),  # more slots than a layer's experts
    (2, 64, 24, 8, (1, 2, 8)),
]


STATE = ("slot_map", "slot_owners", "recency", "clock", "counts", "events", "wave_end")  # DeviceSlotCache's state


def check_same_plans(ref, fused, plans_ref: list, plans_fused: list) -> None:  # noqa: ANN001
    """Two DeviceSlotCaches (the torch plan, the fused kernel) made the same wave plans,
    field by field and dtype by dtype, and hold the same state."""
    assert len(plans_ref) == len(plans_fused)
    for want, got in zip(plans_ref, plans_fused, strict=True):
        for field in want._fields:
            a, b = getattr(want, field), getattr(got, field)
            assert a.dtype == b.dtype and torch.equal(a, b), (field, a, b)
    for name in STATE:
        assert torch.equal(getattr(ref, name), getattr(fused, name)), (name, getattr(ref, name), getattr(fused, name))
