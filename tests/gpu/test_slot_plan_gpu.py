"""The device expert cache's fused plan kernel compiled on the GPU, against the torch plan
(tests/kernels/test_slot_plan.py checks the same under the interpreter):

- chosen by default on CUDA;
- random traces in lockstep, eager: every wave's outputs and every state tensor identical,
  from pools of top-k slots to Qwen3.8-Flash-Next's 512 experts top-10 with 8192 slots;
- a whole decode step's plans (48 layers) captured in a CUDA graph on both paths,
  replayed with new routings: identical again; µs per step and eager µs per wave are
  printed (`-s`) for docs/benchmarks.md — speed is measured, never asserted.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from expert_traces import CONFIGS, check_same_plans, routing

from edgemoe.moe.device_cache import DeviceSlotCache, WavePlan

CUDA = torch.device("cuda")


def test_the_fused_plan_is_the_default_on_cuda() -> None:
    assert DeviceSlotCache(8, 2, 16, CUDA).fused


BIG = [(2, 512, 8192, 10, (1, 8, 32)), (2, 512, 320, 10, (1, 32)), (3, 128, 1000, 8, (1, 16))]


@pytest.mark.parametrize("policy", ["lru", "lru-plain"])
@pytest.mark.parametrize("config", CONFIGS + BIG, ids=lambda c: "L{}-E{}-S{}-K{}".format(*c[:4]))
def test_random_traces_match_the_torch_plan(config: tuple, policy: str) -> None:
    L, E, S, K, sizes = config
    ref, fused = (DeviceSlotCache(S, L, E, CUDA, fused=False, policy=policy),
                  DeviceSlotCache(S, L, E, CUDA, fused=True, policy=policy))
    rng = random.Random(S)
    for step in range(12):
        T = rng.choice(sizes)
        live = torch.tensor([True] * T + [False] * (step % 3), device=CUDA)
        for layer in range(L):
            raw = routing(rng, len(live), E, K, rng.choice([0.0, 1.2])).to(CUDA)
            ids = torch.where(live[:, None], raw, -1)
            pinned, num_pinned = None, 0
            if step % 2 and S > 2 * K:  # pin a few owned slots, as another layer's unreleased plan would
                owned = torch.nonzero(ref.slot_owners >= 0).flatten()[: S // 2].tolist()
                pinned = torch.zeros(S, dtype=torch.bool, device=CUDA)
                pinned[owned] = True
                num_pinned = len(owned)
            # every other layer the kernel gets the padding rows' ids kept and named dead (offload's decode)
            dead = (~live, raw) if layer % 2 else (None, ids)
            check_same_plans(ref, fused, list(ref.layer_waves(layer, ids, pinned, num_pinned)),
                             list(fused.layer_waves(layer, dead[1], pinned, num_pinned, dead[0])))
    hits, misses = int(ref.counts[:, 0].sum()), int(ref.counts[:, 1].sum())
    # with no more slots than top-k every wave may evict the last one's experts: no hits
    assert misses > 0 and (hits > 0 or S <= K)


def capture(cache: DeviceSlotCache, ids: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, list[WavePlan]]:
    """A decode step's plans, every layer, in one graph (`ids` [L, T, K] all -1 meanwhile)."""
    plans: list[WavePlan] = []

    def step() -> None:
        plans.clear()
        for layer in range(cache.num_layers):
            plans.extend(cache.layer_waves(layer, ids[layer]))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile off the graph; routes nothing, changes nothing
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph, plans


def replay_us(graph: torch.cuda.CUDAGraph, ids: torch.Tensor, routings: list[torch.Tensor]) -> float:
    """µs per replay, a new routing copied in before each (hits, misses and evictions mixed)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for routing_ in routings:
        ids.copy_(routing_)
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / len(routings)


def eager_wave_us(cache: DeviceSlotCache, routings: list[torch.Tensor]) -> float:
    """µs per eager wave (one layer's plan), launch-bound: the host issues every op."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for routing_ in routings:
        for layer in range(cache.num_layers):
            cache.plan_wave(layer, routing_[layer])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (len(routings) * cache.num_layers)


@pytest.mark.parametrize("T,S", [(1, 2048), (32, 2048), (32, 8192)])
def test_captured_decode_step_matches(T: int, S: int) -> None:
    L, E, K = 48, 512, 10  # Qwen3.8-Flash-Next
    ids = torch.full((L, T, K), -1, dtype=torch.int32, device=CUDA)
    ref, fused = DeviceSlotCache(S, L, E, CUDA, fused=False), DeviceSlotCache(S, L, E, CUDA, fused=True)
    (graph_ref, plans_ref), (graph_fused, plans_fused) = capture(ref, ids), capture(fused, ids)
    assert bool((fused.slot_owners == -1).all()) and int(fused.clock) == 0  # capture changed nothing
    rng = random.Random(T)
    for _ in range(6):
        ids.copy_(torch.stack([routing(rng, T, E, K, 1.0) for _ in range(L)]))
        graph_ref.replay()
        graph_fused.replay()
        torch.cuda.synchronize()
        check_same_plans(ref, fused, plans_ref, plans_fused)
    routings = [torch.stack([routing(rng, T, E, K, 1.0) for _ in range(L)]).to(CUDA) for _ in range(8)] * 4
    times = {"T": T, "S": S, "layers": L, "step_us_torch_graph": replay_us(graph_ref, ids, routings),
             "step_us_fused_graph": replay_us(graph_fused, ids, routings),
             "wave_us_torch_eager": eager_wave_us(ref, routings[:4]), "wave_us_fused_eager": eager_wave_us(fused, routings[:4])}
    print("\n" + json.dumps({k: round(v, 1) for k, v in times.items()}))
    check_same_plans(ref, fused, [], [])  # the same routings on both: still the same state
