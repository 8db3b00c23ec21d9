"""scripts/share_layer_model.py's `--parts`: each routed expert becomes its channel parts, in
order and together, so LRU without a share misses every part of an expert exactly when it
misses the expert (the same step, misses counted in parts)."""

from __future__ import annotations

from argparse import Namespace

import pytest

from edgemoe.moe.quota_levels import FRACTION
from edgemoe.moe.routing_trace import Access


@pytest.fixture(scope="module")
def model(script_module):  # noqa: ANN001, ANN201
    return script_module("share_layer_model")


def test_parts_expand_each_pick_in_place(model) -> None:
    trace = [Access(0, (3, 1)), Access(5, (0,))]
    assert model.in_parts(trace, 1) is trace
    assert model.in_parts(trace, 2) == [Access(0, (6, 7, 2, 3)), Access(5, (0, 1))]


def test_parts_without_a_share_step_as_whole_experts(model) -> None:
    args = Namespace(parts=1, fixed_us=25.0, cpu_us=55.0, copy_us=92.0, chain_us=73.0, host_gbps=0.0, expert_mb=4.72)
    whole_trace = model.trace(20, 0)
    whole = model.step_ms(whole_trace, 600, FRACTION, 0, args)
    args.parts = 2
    halves = model.step_ms(model.in_parts(whole_trace, 2), 1200, FRACTION, 0, args)
    assert whole[1] > 0
    assert halves[0] == pytest.approx(whole[0]) and halves[1] == pytest.approx(2 * whole[1])
