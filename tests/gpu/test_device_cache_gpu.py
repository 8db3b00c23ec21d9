"""The expert cache on the device (`--expert-cache device`) on the GPU:

- the mapped-memory gather (Triton, reading pinned host banks through their device
  address) writes exactly the store's bytes into the slots, bf16 and fp8 parts alike;
- a decode step captured whole in a CUDA graph with the device cache gives the host
  cache's greedy tokens (bitwise: same kernels, same decisions) and the same statistics,
  at pools down to top-k slots;
- no host synchronisation per layer: a graph-replayed decode step is one graph launch
  and one wait, and an eager one waits once too (the host cache waits per MoE layer).
- `--routing synthetic`: the host-drawn ids staged in a static device buffer replay from
  graphs with the eager runs' tokens, draws and cache counts (padding rows included).
"""

from __future__ import annotations

import json

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.bench.api_trace import count_api_calls
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.movers import GatherMover
from edgemoe.moe.offload import SlotBanks
from edgemoe.moe.parts_store import PartsStore
from edgemoe.moe.stats import MoEStats
from edgemoe.moe.store import BankStore
from edgemoe.quant import Fp8Block, quantise_expert

PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]  # decode batch 3: padded to 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
TOP_K, ALL = 4, 16 * 4  # the small model: top-4 of 16 experts, 4 MoE layers
CUDA = torch.device("cuda")


def pinned_bf16_store(layers: int, E: int, H: int, I: int) -> BankStore:
    g = torch.Generator().manual_seed(0)
    store = BankStore.allocate(list(range(layers)), E, H, I, torch.bfloat16)
    for bank in store.banks.values():
        bank.gate_up.copy_(torch.randn(bank.gate_up.shape, generator=g))
        bank.down.copy_(torch.randn(bank.down.shape, generator=g))
    pinned = {i: type(b)(b.gate_up.pin_memory(), b.down.pin_memory()) for i, b in store.banks.items()}
    return BankStore(pinned, pinned=True)


def pinned_fp8_store(layers: int, E: int, H: int, I: int) -> PartsStore:
    fmt, g = Fp8Block(), torch.Generator().manual_seed(1)
    store = PartsStore.allocate_parts(list(range(layers)), E, H, I, fmt, pin=True)
    assert store.pinned
    for layer in range(layers):
        for e in range(E):
            gate, up, down = (torch.randn(shape, generator=g) for shape in ((I, H), (I, H), (H, I)))
            for name, t in quantise_expert(fmt, gate, up, down).items():
                store.banks[layer][name][e].copy_(t)
    return store


def check_slots(store: BankStore, slots: SlotBanks, layer: int, pairs: list[tuple[int, int]]) -> None:
    for name, bank in slots.parts.items():
        host = store.tensor(layer, name)
        for expert, slot in pairs:
            assert torch.equal(bank[slot].cpu().view(torch.uint8), host[expert].view(torch.uint8)), (name, expert)


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_mapped_gather_writes_the_store_bytes(kind: str) -> None:
    # The Qwen3-30B-A3B expert shape (9.4 MB in bf16): thousands of column blocks per row.
    layers, E, H, I, S = 2, 8, 2048, 768, 5
    store = pinned_bf16_store(layers, E, H, I) if kind == "bf16" else pinned_fp8_store(layers, E, H, I)
    slots = SlotBanks(store, S, CUDA, MoEStats(layers))
    for bank in slots.parts.values():
        bank.view(torch.uint8).fill_(0xAB)  # stale bytes a missed row must not leave
    mover = GatherMover(store, slots)
    misses = torch.tensor([[6, 0, 3, -1, -1], [2, 4, 0, -1, -1]], dtype=torch.int32, device=CUDA)
    mover.move(1, misses)
    torch.cuda.synchronize()
    check_slots(store, slots, 1, [(6, 2), (0, 4), (3, 0)])
    for slot in (1, 3):  # not named by the list: untouched
        assert bool((slots.parts["gate_up"][slot].view(torch.uint8) == 0xAB).all())


def test_the_gather_is_captured_in_a_graph() -> None:
    """The cache's plan and the gather replay from a graph: new misses each replay."""
    layers, E, H, I, S = 1, 8, 256, 128, 2
    store = pinned_bf16_store(layers, E, H, I)
    slots = SlotBanks(store, S, CUDA, MoEStats(layers))
    cache, mover = DeviceSlotCache(S, layers, E, CUDA), GatherMover(store, slots)
    ids = torch.full((1, 2), -1, dtype=torch.int32, device=CUDA)  # routes nothing: the warm-up changes nothing

    def step() -> None:
        for plan in cache.layer_waves(0, ids):
            mover.move(0, plan.misses)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile the kernels off the graph
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    assert bool((cache.slot_owners == -1).all())
    for routed in ([1, 2], [3, 1], [5, 6]):
        ids.copy_(torch.tensor([routed], dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        owners = cache.slot_owners.tolist()
        assert sorted(owners) == sorted(routed)
        check_slots(store, slots, 0, [(e, s) for s, e in enumerate(owners)])


def run(path, **settings):  # noqa: ANN001, ANN003, ANN202
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        graphs = llm.engine.runner.graphs is not None
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)], llm.stats()["moe"], graphs


@pytest.mark.parametrize("slots", [TOP_K, 16, ALL])
def test_graph_captured_device_cache_gives_the_host_cache_tokens(small_ckpt, slots: int) -> None:  # noqa: ANN001
    host_tokens, host, host_graphs = run(small_ckpt, moe_backend="offload", moe_slots=slots, expert_cache="host")
    tokens, dev, graphs = run(small_ckpt, moe_backend="offload", moe_slots=slots, expert_cache="device")
    assert graphs and not host_graphs
    assert tokens == host_tokens
    # Padding rows route nothing on either path, so the decisions and counts are the same.
    for key in ("hits", "misses", "bytes_copied", "hit_rate_by_layer"):
        assert dev[key] == host[key], key


def test_copy_engine_mover_gives_the_same_tokens(small_ckpt) -> None:  # noqa: ANN001
    want, _, _ = run(small_ckpt, moe_backend="offload", moe_slots=8, expert_cache="host")
    tokens, moe, graphs = run(small_ckpt, moe_backend="offload", moe_slots=8, expert_cache="device",
                              expert_mover="copy")
    assert tokens == want and not graphs and moe["expert_mover"] == "copy"


@pytest.mark.parametrize("cache,graphs", [("device", True), ("device", False), ("host", False)])
def test_decode_step_waits_once_with_the_device_cache(small_ckpt, cache: str, graphs: bool) -> None:  # noqa: ANN001
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="offload", moe_slots=8,
             expert_cache=cache, no_cuda_graph=not graphs) as llm:
        engine = llm.engine
        assert (engine.runner.graphs is not None) == graphs
        engine.add_request(PROMPTS[0], GREEDY)
        for _ in range(4):
            engine.step()
        counts = count_api_calls(engine.step)
        print("\n" + json.dumps(counts.by_name))
        if cache == "host":  # the counter sees the per-layer waits this removes
            assert counts.syncs >= 4, json.dumps(counts.by_name)
            return
        assert counts.syncs <= 1, json.dumps(counts.by_name)
        if graphs:
            assert counts.graph_launches == 1


def run_synthetic(path, **settings):  # noqa: ANN001, ANN003, ANN202
    """Greedy tokens, the recorded routing trace, the MoE statistics and whether graphs were
    captured under `--routing synthetic`; then one more request's decode step profiled."""
    with LLM(str(path), dtype="bfloat16", device="cuda", moe_backend="offload", moe_slots=8,
             routing="synthetic:seed=4", **settings) as llm:
        engine, trace = llm.engine, llm.engine.runtime.trace
        trace.start()
        tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        accesses, moe = trace.stop(), llm.stats()["moe"]
        engine.add_request(PROMPTS[1], GREEDY)
        for _ in range(3):
            engine.step()
        return tokens, accesses, moe, engine.runner.graphs is not None, count_api_calls(engine.step)


def test_synthetic_routing_replays_from_graphs(small_ckpt) -> None:  # noqa: ANN001
    """Synthetic ids staged in a static device buffer: decode steps (3 sequences padded to
    4) replay from graphs with the eager runs' draws, tokens and cache decisions; a decode
    step is one graph launch."""
    tokens, trace, moe, graphs, counts = run_synthetic(small_ckpt, expert_cache="device")
    eager_tokens, eager_trace, eager, eager_graphs, _ = run_synthetic(small_ckpt, expert_cache="device",
                                                                      no_cuda_graph=True)
    host_tokens, host_trace, host, _, _ = run_synthetic(small_ckpt, expert_cache="host")
    assert graphs and not eager_graphs
    assert tokens == eager_tokens == host_tokens
    # every step's draws, graph-replayed ones too: one access per MoE layer (4) per step
    assert trace == eager_trace == host_trace and len(trace) >= 4 * GREEDY.max_tokens
    for key in ("hits", "misses", "bytes_copied", "hit_rate_by_layer"):
        assert moe[key] == eager[key] == host[key], key
    assert moe["misses"] > 0 and moe["routing"].startswith("synthetic:seed=4")
    assert counts.graph_launches == 1 and counts.syncs <= 1, json.dumps(counts.by_name)
