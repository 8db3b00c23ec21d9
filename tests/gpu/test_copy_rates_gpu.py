"""`edgemoe bench bw`'s host→device rates (bench/copy_rates.py): every rate it names is
measured and positive, the gather's among them, at both of its grids."""

from __future__ import annotations

import math

import torch

from edgemoe.bench.copy_rates import copy_rates, gather_rates


def test_the_gather_rates_are_measured_at_both_grids() -> None:
    pinned = torch.randint(0, 255, (8 * 2**20,), dtype=torch.uint8).pin_memory()
    rates = gather_rates(pinned, 2**20)
    assert set(rates) == {"h2d_gather_expert_gb_s", "h2d_gather_side_expert_gb_s"}
    assert all(math.isfinite(v) and v > 0 for v in rates.values())


def test_copy_rates_name_every_mover() -> None:
    rates = copy_rates(512 * 2**20, 4 * 2**20)  # the pool holds two 256 MiB copies
    assert {"h2d_pinned_expert_gb_s", "h2d_pageable_256MiB_gb_s", "d2d_1GiB_gb_s", "h2d_gather_expert_gb_s",
            "h2d_gather_side_expert_gb_s"} <= set(rates)
    assert all(math.isfinite(v) and v > 0 for v in rates.values())


def test_a_pool_smaller_than_a_size_leaves_that_size_out() -> None:
    rates = copy_rates(8 * 2**20, 4 * 2**20)  # `--pool-mib 8`: no 256 MiB copy (it raised before)
    assert "h2d_pinned_expert_gb_s" in rates and not any("256MiB" in key for key in rates)
