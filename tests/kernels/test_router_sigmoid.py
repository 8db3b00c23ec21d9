"""The sigmoid router's Triton launch (`triton_ops/router_sigmoid.py`) under Triton's
interpreter against the torch routing it replaces on a GPU (`route_scores_ref`, itself
checked against transformers' in tests/models/test_glm4_moe.py): the same ids in the
same order and the same weights to fp32 rounding, with groups (a power of two or not),
renormalised or not, scaled, with and without the shared expert's pair, E not a power of
two; the softmax mode (DeepSeek-V2: no bias, a group ranked by its best score) likewise, and
with a selection bias and a clamped renormalisation (ERNIE-4.5); and `route_grouped_sigmoid`
picking it for CUDA's activations only."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.kernels.router_sigmoid import GroupedSigmoid, SigmoidRouter, route_scores_ref, with_shared

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")

# (experts, top_k, n_group, topk_group, renormalize, scale, shared)
CASES = [
    (16, 4, 4, 2, True, 2.5, True),
    (128, 8, 1, 1, True, 1.0, True),  # GLM-4.5-Air
    (160, 8, 1, 1, True, 2.5, False),  # GLM-4.5: E not a power of two
    (24, 3, 3, 2, False, 1.0, True),  # three groups of eight
    (64, 6, 8, 3, True, 1.5, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"E{c[0]}-k{c[1]}-g{c[2]}of{c[3]}")
def test_triton_routing_equals_the_torch_routing(case: tuple) -> None:
    from edgemoe.kernels.triton_ops.router_sigmoid import sigmoid_route_triton

    E, K, G, TG, renorm, scale, shared = case
    g = torch.Generator().manual_seed(E + K)
    logits = torch.randn(37, E, generator=g) * 2
    router = SigmoidRouter(torch.empty(E, 1), 0.2 * torch.randn(E, generator=g), GroupedSigmoid(G, TG, scale),
                           E if shared else None)
    want = with_shared(*route_scores_ref(logits, router, K, renorm), router.shared_id)
    got = sigmoid_route_triton(logits, router.bias, K, renorm, G, TG, scale, router.shared_id)
    assert got[0].dtype == torch.int32 and got[0].shape == want[0].shape == (37, K + shared)
    assert torch.equal(got[0], want[0])  # the same experts in the same (descending) order
    torch.testing.assert_close(got[1], want[1], atol=0, rtol=4 * 2**-23)


# (experts, top_k, n_group, topk_group, renormalize, scale, shared): DeepSeek-V2's softmax router
SOFTMAX_CASES = [
    (64, 6, 1, 1, False, 1.0, False),  # V2-Lite: greedy, one group
    (160, 6, 8, 3, False, 16.0, False),  # V2 / V2.5: group-limited greedy, E not a power of two
    (24, 4, 3, 1, True, 2.0, True),  # three groups of eight, renormalised, a shared pair
    (12, 3, 12, 5, False, 1.0, False),  # groups of one (softmax only: a group's best is its one score)
]


@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=lambda c: f"E{c[0]}-k{c[1]}-g{c[2]}of{c[3]}")
def test_triton_softmax_routing_equals_the_torch_routing(case: tuple) -> None:
    from edgemoe.kernels.triton_ops.router_sigmoid import sigmoid_route_triton

    E, K, G, TG, renorm, scale, shared = case
    g = torch.Generator().manual_seed(E + K)
    logits = torch.randn(37, E, generator=g) * 2
    spec = GroupedSigmoid(G, TG, scale, softmax=True)
    assert spec.check(E, K) is None
    router = SigmoidRouter(torch.empty(E, 1), None, spec, E if shared else None)
    want = with_shared(*route_scores_ref(logits, router, K, renorm), router.shared_id)
    got = sigmoid_route_triton(logits, None, K, renorm, G, TG, scale, router.shared_id, softmax=True)
    assert torch.equal(got[0], want[0])  # the same experts in the same (descending) order
    # Each weight, either way: exp within an ulp, a sum of E exps (γ_E), the division, the
    # renormalisation's sum of K and division, the scale: under (E + 8) roundings (u = 2^-24).
    torch.testing.assert_close(got[1], want[1], atol=0, rtol=2 * (E + 8) * 2**-24)


# (experts, top_k, n_group, topk_group, scale, shared, norm_min): the softmax mode with a selection
# bias, renormalised by max(sum, norm_min) (ERNIE-4.5's router; its torch reference is checked
# against transformers' in tests/models/test_ernie4_5_moe.py)
BIASED_SOFTMAX_CASES = [
    (64, 6, 1, 1, 1.0, False, 1e-12),  # ERNIE-4.5-21B-A3B
    (64, 8, 1, 1, 1.0, False, 1e-12),  # ERNIE-4.5-300B-A47B
    (16, 4, 1, 1, 1.0, True, 0.8),  # the clamp acting on most rows, a shared pair
    (24, 4, 3, 2, 2.0, False, 0.5),  # groups ranked by their best biased score, scaled
]


@pytest.mark.parametrize("case", BIASED_SOFTMAX_CASES, ids=lambda c: f"E{c[0]}-k{c[1]}-g{c[2]}of{c[3]}-min{c[6]}")
def test_triton_biased_softmax_routing_equals_the_torch_routing(case: tuple) -> None:
    from edgemoe.kernels.triton_ops.router_sigmoid import sigmoid_route_triton

    E, K, G, TG, scale, shared, norm_min = case
    g = torch.Generator().manual_seed(E + K)
    logits = torch.randn(37, E, generator=g) * 2
    bias = 0.05 * torch.randn(E, generator=g)  # softmax scores of these logits: ~1/E, so it reorders some
    spec = GroupedSigmoid(G, TG, scale, softmax=True, norm_min=norm_min)
    router = SigmoidRouter(torch.empty(E, 1), bias, spec, E if shared else None)
    want = with_shared(*route_scores_ref(logits, router, K, True), router.shared_id)
    got = sigmoid_route_triton(logits, bias, K, True, G, TG, scale, router.shared_id, softmax=True, norm_min=norm_min)
    assert torch.equal(got[0], want[0])  # the same experts in the same (descending) order
    unbiased = route_scores_ref(logits, SigmoidRouter(router.weight, None, spec), K, True)[0]
    assert not torch.equal(unbiased, want[0][:, :K])  # the bias chose differently somewhere
    # As the unbiased softmax's bound: the renormalisation's max is exact, the rest the same roundings.
    torch.testing.assert_close(got[1], want[1], atol=0, rtol=2 * (E + 8) * 2**-24)
    if norm_min == 0.8:  # the clamp acted: those rows' routed weights sum to under 1 (before the scale)
        assert (want[1][:, :K].sum(-1) < 0.99).sum() > 5


def test_the_torch_path_runs_off_cuda() -> None:
    from edgemoe.kernels.router_sigmoid import route_grouped_sigmoid

    g = torch.Generator().manual_seed(0)
    router = SigmoidRouter(torch.randn(16, 8, generator=g), torch.zeros(16), GroupedSigmoid(4, 2, 2.0), 16)
    x = torch.randn(5, 8, generator=g).bfloat16()  # bf16 on the CPU: the reference, not the launch
    ids, weights = route_grouped_sigmoid(x, router, 3, True, shared=True)
    want = with_shared(*route_scores_ref(torch.nn.functional.linear(x.float(), router.weight), router, 3, True), 16)
    assert torch.equal(ids, want[0]) and torch.equal(weights, want[1])
    assert (ids[:, -1] == 16).all() and (weights[:, -1] == 1).all()
