"""scripts/prefetch_model.py: an oracle prefetch's step as the engine orders it — each
layer's copies forked after the previous layer's move, joined before it computes — against
offload's layers, by hand on small steps and over the synthetic trace."""

from __future__ import annotations

from argparse import Namespace

import pytest


@pytest.fixture(scope="module")
def model(script_module):  # noqa: ANN001, ANN201
    return script_module("prefetch_model")


def args_of(**overrides: float) -> Namespace:
    base = dict(slots=600, tokens=24, seed=0, copy_us=5.0, side_copy_us=5.0, chain_us=10.0, plan_us=4.0, recall=1.0,
                precision=1.0, depth=1)
    return Namespace(**{**base, **overrides})


def test_copies_that_fit_the_previous_layers_rest_and_this_plan_are_hidden(model) -> None:
    # offload: 3 layers of 10 µs + 2 copies of 5. Prefetched: layer 1's copies start after
    # layer 0's plan (4) and land at 14, exactly when layer 1 has planned (4 + 6 + 4).
    assert model.step_times([0, 2, 0], args_of()) == (40.0, 30.0)


def test_a_late_copy_holds_its_layer(model) -> None:
    # 3 copies of 5 land at 19, 5 µs after layer 1 planned: layer 1 and all after wait for it.
    assert model.step_times([0, 3, 0], args_of()) == (45.0, 35.0)
    # a side grid twice as slow as the stream's copies can lose to offload
    assert model.step_times([0, 3, 0], args_of(side_copy_us=10.0)) == (45.0, 50.0)


def test_the_first_layer_copies_on_the_stream_and_no_miss_no_wait(model) -> None:
    assert model.step_times([2, 0, 0], args_of()) == (40.0, 40.0)
    assert model.step_times([0, 0, 0], args_of()) == (30.0, 30.0)


def test_a_predictor_that_predicts_nothing_is_offload(model) -> None:
    for misses in ([0, 2, 0], [1, 3, 2, 0, 4], [0, 0, 0]):
        offload, prefetch = model.step_times(misses, args_of(recall=0.0))
        assert prefetch == pytest.approx(offload)


def test_missed_and_unused_predictions_cost(model) -> None:
    # half of layer 1's 2 misses ahead (lands at 9), the other after its plan at 14: 14 + 5
    assert model.step_times([0, 2, 0], args_of(recall=0.5)) == (40.0, 35.0)
    # precision 1/2: its 2 predicted copies take the side 20 µs, landing at 24 — after the plan at 14
    assert model.step_times([0, 2, 0], args_of(precision=0.5)) == (40.0, 40.0)


def test_copies_forked_two_layers_ahead_fill_a_layer_without_misses(model) -> None:
    # Layer 2's 3 copies fork after layer 1's plan (14) and land at 29, 5 µs after layer 2
    # planned (24): 45. Two layers ahead they fork after layer 0's plan (4), land at 19: 40.
    assert model.step_times([0, 0, 3, 0], args_of()) == (55.0, 45.0)
    assert model.step_times([0, 0, 3, 0], args_of(depth=2)) == (55.0, 40.0)
    # a side stream busy throughout gains nothing from forking earlier
    assert model.step_times([0, 2, 2, 2, 0], args_of(depth=2)) == model.step_times([0, 2, 2, 2, 0], args_of())


def test_the_trace_whole_steps(model) -> None:
    args = args_of(copy_us=92.0, side_copy_us=92.0, chain_us=73.0, plan_us=50.0, slots=2426, tokens=40)
    offload, prefetch, misses = model.model(model.trace(args.tokens, args.seed), args)
    assert misses > 0 and prefetch < offload
    slow = Namespace(**{**vars(args), "side_copy_us": 400.0})
    assert model.model(model.trace(args.tokens, args.seed), slow)[1] > offload  # a slow side grid loses


def test_a_trace_without_a_whole_step_is_a_clear_error(model) -> None:
    args = args_of(slots=2426, tokens=2)
    with pytest.raises(SystemExit, match="no whole step"):
        model.model(model.trace(args.tokens, args.seed), args)
