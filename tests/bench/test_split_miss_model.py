"""scripts/split_miss_model.py: the balanced split finishes a layer's two sides together
(to its grain), never waits longer than either side alone, and every rule loads every miss
(the link's whole load is the LRU misses' copies, whatever the split)."""

from __future__ import annotations

from argparse import Namespace

import pytest


@pytest.fixture(scope="module")
def model(script_module):  # noqa: ANN001, ANN201
    return script_module("split_miss_model")


def fp8_args(**overrides: float) -> Namespace:
    base = dict(slots=2426, tokens=24, seed=0, copy_us=92.0, cpu_us=55.0, fixed_us=25.0, chain_us=73.0,
                host_gbps=0.0, expert_mb=4.72, grain=16, carried_loads=False)
    return Namespace(**{**base, **overrides})


@pytest.mark.parametrize("misses", [1, 2, 5])
def test_balanced_fraction_beats_both_sides_alone(model, misses: int) -> None:
    args = fp8_args()
    f = model.balanced_fraction(misses, args)
    assert 0 < f < 1
    split = model.miss_us(misses, f, args)
    assert split < model.miss_us(misses, 0.0, args)  # the link alone
    assert split < model.miss_us(misses, 1.0, args)  # the CPU alone
    # the two sides differ by at most one grain step of the CPU's channels
    cpu = args.fixed_us + misses * f * args.cpu_us
    link = misses * (1 - f) * args.copy_us
    assert abs(cpu - link) <= misses * (args.cpu_us + args.copy_us) / args.grain


def test_whole_experts_pick_the_best_count(model) -> None:
    args = fp8_args()
    assert model.whole_fraction(0, args) == 0.0
    assert model.whole_fraction(1, args) in (0.0, 1.0)
    f = model.whole_fraction(3, args)
    assert f * 3 == round(f * 3)
    assert model.miss_us(3, f, args) == min(model.miss_us(3, k / 3, args) for k in range(4))


def test_no_miss_no_wait_and_host_limits(model) -> None:
    args = fp8_args(host_gbps=10.0)
    assert model.balanced_fraction(0, args) == 0.0
    assert model.miss_us(0, 0.0, args) == 0.0
    # 2 misses of 4.72 MB through 10 GB/s of host reads: 944 µs, longer than either side
    assert model.miss_us(2, 0.5, args) == pytest.approx(2 * 4.72 / 10.0 * 1e3)


def test_rules_load_every_miss_and_split_is_fastest(model) -> None:
    args = fp8_args(slots=600)  # the cache full after a few tokens: most of the short trace counts
    accesses = model.trace(args.tokens, args.seed)
    rows = {rule: model.step_ms(accesses, args, rule) for rule in ("offload", "whole", "split", "cpu")}
    misses = {row[3] for row in rows.values()}
    assert len(misses) == 1 and misses.pop() > 0  # one replay: the same LRU misses
    links = {round(row[2], 9) for row in rows.values()}
    assert len(links) == 1  # every miss copied once, whichever side computed it first
    assert rows["split"][1] <= rows["whole"][1] <= min(rows["cpu"][1], rows["offload"][1])
    assert rows["split"][1] < rows["offload"][1]
    for ms, layers, link, _ in rows.values():
        assert ms == max(layers, link)


def test_carried_loads_read_beside_the_next_layers_misses(model) -> None:
    """`--carried-loads`: the previous layer's CPU part is read from host memory in this
    layer's window: offload (nothing on the CPU) is unchanged, the rules that load the CPU's
    part after their layer wait longer where the host limits."""
    args = fp8_args(host_gbps=10.0)
    assert model.miss_us(2, 0.5, args, carried=1.0) == pytest.approx(3 * 4.72 / 10.0 * 1e3)
    args = fp8_args(slots=600, host_gbps=94.0)
    accesses = model.trace(args.tokens, args.seed)
    carried = Namespace(**{**vars(args), "carried_loads": True})
    for rule in ("offload", "whole", "split", "cpu"):
        plain, loaded = model.step_ms(accesses, args, rule), model.step_ms(accesses, carried, rule)
        if rule == "offload":
            assert loaded == plain
        else:
            assert loaded[1] > plain[1] and loaded[2:] == plain[2:]  # the same copies, longer layers


def test_a_trace_that_never_fills_the_cache_is_a_clear_error(model) -> None:
    args = fp8_args(tokens=2)
    with pytest.raises(SystemExit, match="never fill 2426 slots"):
        model.step_ms(model.trace(args.tokens, args.seed), args, "split")
