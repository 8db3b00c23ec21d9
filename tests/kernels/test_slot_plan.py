"""The fused plan kernel of the device expert cache (Triton, under the interpreter on CPU
tensors) against the torch plan it replaces (itself proven equal to `SlotCache` and its
policy in tests/moe/test_device_cache.py): two caches run the same traces in lockstep, and
every wave's outputs and every state tensor (map, owners, recency, clock, counts, events,
wave ends) must be identical, for the scan-resistant "lru" and for "lru-plain". Traces:
tests/moe's configurations (pools down to top-k slots, waves, padding rows), random pins,
a wave past capacity, a layer cycle larger than the pool, and Qwen3.8-Flash-Next's 512
experts top-10 at decode batch 32. The compiled path: tests/gpu/test_slot_plan_gpu.py."""

from __future__ import annotations

import os
import random

import pytest
import torch
from expert_traces import CONFIGS, check_same_plans, routing

from edgemoe.kernels.slot_plan import MAX_EXPERTS, MAX_SLOTS, fused_plan_supported
from edgemoe.moe.device_cache import DeviceSlotCache

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
CPU = torch.device("cpu")


def caches(S: int, L: int, E: int, policy: str = "lru") -> tuple[DeviceSlotCache, DeviceSlotCache]:
    """(the torch plan, the fused kernel) on the same empty pool."""
    return (DeviceSlotCache(S, L, E, CPU, fused=False, policy=policy),
            DeviceSlotCache(S, L, E, CPU, fused=True, policy=policy))


def random_pins(rng: random.Random, cache: DeviceSlotCache, K: int) -> tuple[torch.Tensor | None, int]:
    """Some owned slots pinned (as another layer's unreleased plan pins them), at least K left open."""
    if rng.random() < 0.5:
        return None, 0
    owned = [s for s, o in enumerate(cache.slot_owners.tolist()) if o >= 0]
    chosen = rng.sample(owned, min(len(owned), rng.randint(0, max(0, cache.num_slots - K))))
    pinned = torch.zeros(cache.num_slots, dtype=torch.bool)
    pinned[chosen] = True
    return pinned, len(chosen)


def run_trace(ref: DeviceSlotCache, fused: DeviceSlotCache, rng: random.Random, K: int, sizes: tuple, steps: int) -> None:
    L, E = ref.num_layers, ref.num_experts
    for step in range(steps):
        T = rng.choice(sizes)
        live = torch.tensor([True] * T + [False] * (step % 3))  # some steps padded: -1 rows
        for cache in (ref, fused):
            cache.mark_events = step % 4 != 3  # the live view unwatched now and then
        for layer in range(L):
            raw = routing(rng, len(live), E, K, skew=rng.choice([0.0, 1.2]))
            ids = torch.where(live[:, None], raw, -1)
            pinned, num_pinned = random_pins(rng, ref, K)
            plans_ref = list(ref.layer_waves(layer, ids, pinned, num_pinned))
            if layer % 2:  # the padding rows keep their ids and are named dead: the plan drops them itself
                plans_fused = list(fused.layer_waves(layer, raw, pinned, num_pinned, dead=~live))
            else:
                plans_fused = list(fused.layer_waves(layer, ids, pinned, num_pinned))
            check_same_plans(ref, fused, plans_ref, plans_fused)
            if layer + 1 < L and len(plans_ref) == 1 and rng.random() < 0.4:  # a prefetch's plan of the next layer
                guess = routing(rng, len(live), E, K, skew=0.0)
                held = torch.zeros(ref.num_slots, dtype=torch.bool)
                held[plans_ref[0].slot_ids[plans_ref[0].slot_ids >= 0].long()] = True
                check_same_plans(ref, fused, [ref.plan_wave(layer + 1, guess, held, ahead=True)],
                                 [fused.plan_wave(layer + 1, guess, held, ahead=True)])


@needs_interpreter
@pytest.mark.parametrize("policy", ["lru", "lru-plain"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "L{}-E{}-S{}-K{}".format(*c[:4]))
def test_random_traces_match_the_torch_plan(config: tuple, policy: str) -> None:
    L, E, S, K, sizes = config
    ref, fused = caches(S, L, E, policy)
    run_trace(ref, fused, random.Random(S), K, sizes, steps=10)
    assert ref.read_counts()[:, 1].sum() > 0 and ref.clock.item() > 0


@needs_interpreter
def test_a_layer_cycle_larger_than_the_pool_matches() -> None:
    """6 layers x top-2 through 9 slots, the same experts every step (a padding row, and
    a layer now and then with nothing routed: no wave of its cycle): once warm no key is
    stale at eviction, so the kernel takes the fresh branch (the newest key) every miss."""
    L, E, S = 6, 8, 9
    ref, fused = caches(S, L, E)
    for step in range(5):
        for layer in range(L):
            ids = torch.tensor([[layer, layer + 2], [-1, -1]], dtype=torch.int32)
            if step == 3 and layer == 4:
                ids = torch.full_like(ids, -1)  # wave_end[4] must stay
            check_same_plans(ref, fused, list(ref.layer_waves(layer, ids)), list(fused.layer_waves(layer, ids)))
    hits = ref.read_counts()[:, 0]
    assert int(hits.sum()) > 0 and int(ref.wave_end.min()) > 0


@needs_interpreter
@pytest.mark.parametrize("S", [700, 320])  # the pool block ragged (1024); fewer slots than pairs: waves
def test_qwen38_flash_next_decode_batch_matches(S: int) -> None:
    """512 experts top-10 at decode batch 32 (320 pairs): several pair chunks, the 512-expert
    block, hundreds of victims chosen one by one once the pool is full."""
    ref, fused = caches(S, 2, 512)
    run_trace(ref, fused, random.Random(S), 10, (32, 4, 1), steps=4)
    assert ref.read_counts()[:, 0].sum() > 0  # some hits


@needs_interpreter
def test_a_wave_past_capacity_matches() -> None:
    """`plan_wave` alone with more misses than open slots (some pinned): the same overflow,
    the same -1 for the misses left without a slot, the same state."""
    ref, fused = caches(4, 2, 8)
    warm = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    check_same_plans(ref, fused, [ref.plan_wave(1, warm)], [fused.plan_wave(1, warm)])
    pinned = torch.tensor([False, True, False, False])
    ids = torch.tensor([[4, 5], [6, 7], [0, -1]], dtype=torch.int32)
    plans = [ref.plan_wave(0, ids, pinned)], [fused.plan_wave(0, ids, pinned)]
    check_same_plans(ref, fused, *plans)
    assert bool(plans[1][0].overflow) and int((plans[1][0].misses[0] >= 0).sum()) == 3


def test_a_plan_ahead_counts_only_its_copies_and_keeps_the_cycle() -> None:
    """A prefetch's plan (`ahead`) decides and updates as a wave does, but its hits are not
    counted and the layer's `wave_end` stays (the torch plan; the kernel is held to it above)."""
    ahead, plain = DeviceSlotCache(6, 2, 8, CPU, fused=False), DeviceSlotCache(6, 2, 8, CPU, fused=False)
    warm, guess = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([[1, 2], [3, -1]], dtype=torch.int32)
    for cache in (ahead, plain):
        cache.plan_wave(1, warm)
    a, p = ahead.plan_wave(1, guess, ahead=True), plain.plan_wave(1, guess)
    for got, want in zip(a, p, strict=True):
        assert torch.equal(got, want)
    for name in ("slot_map", "slot_owners", "recency", "clock"):
        assert torch.equal(getattr(ahead, name), getattr(plain, name)), name
    assert ahead.counts[1].tolist() == [0, 2 + 2] and plain.counts[1].tolist() == [1, 2 + 2]
    assert int(ahead.wave_end[1]) == 2 and int(plain.wave_end[1]) == int(plain.clock)


def test_the_fused_plan_is_chosen_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEMOE_TRITON", raising=False)
    assert not fused_plan_supported(CPU, 64, 512)
    assert not DeviceSlotCache(4, 1, 8, CPU).fused  # the torch ops on CPU
    cuda = torch.device("cuda")
    assert not fused_plan_supported(cuda, MAX_SLOTS + 1, 512)  # past the kernel's registers
    assert not fused_plan_supported(cuda, 64, MAX_EXPERTS + 1)
    if fused_plan_supported(cuda, MAX_SLOTS, MAX_EXPERTS):  # Triton importable here
        monkeypatch.setenv("EDGEMOE_TRITON", "0")
        assert not fused_plan_supported(cuda, 64, 512)
