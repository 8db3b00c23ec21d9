"""The expert cache on the device (`--expert-cache device`) on the GPU:

- the mapped-memory gather (Triton, reading pinned host banks through their device
  address) writes exactly the store's bytes into the slots, bf16, fp8 and int4 parts alike
  (every part of a wave in one launch);
- a decode step captured whole in a CUDA graph with the device cache gives the host
  cache's greedy tokens (bitwise: same kernels, same decisions) and the same statistics,
  at pools down to top-k slots;
- no host synchronisation per layer: a graph-replayed decode step is one graph launch
  and one wait, and an eager one waits once too (the host cache waits per MoE layer).
- `--routing synthetic`: the host-drawn ids staged in a static device buffer replay from
  graphs with the eager runs' tokens, draws and cache counts (padding rows included).
- slots preloaded at start-up (`--expert-preload`): the same tokens, fewer misses, the
  host cache's decisions;
- a pool smaller than a token's working set (the scan-resistant `lru` against `lru-plain`):
  the fused plan decides as `SlotCache` does, wave by wave, at Qwen3-30B-A3B's 8 GiB shape
  (48 x 8 through 276 slots), and the engine's greedy tokens do not depend on the policy.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.bench.api_trace import count_api_calls
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.movers import GatherMover
from edgemoe.moe.offload import SlotBanks
from edgemoe.moe.parts_store import PartsStore
from edgemoe.moe.slots import SlotCache
from edgemoe.moe.stats import MoEStats
from edgemoe.moe.store import BankStore
from edgemoe.testing.moe_material import random_bank_store
from edgemoe.quant import ExpertFormat, Fp8Block, Int4Group, quantise_expert

PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]  # decode batch 3: padded to 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
TOP_K, ALL = 4, 16 * 4  # the small model: top-4 of 16 experts, 4 MoE layers
CUDA = torch.device("cuda")


def pinned_bf16_store(layers: int, E: int, H: int, I: int) -> BankStore:
    return random_bank_store(layers, E, H, I, torch.bfloat16, pinned=True, scaled=False)


def pinned_quant_store(layers: int, E: int, H: int, I: int, fmt: ExpertFormat = Fp8Block()) -> PartsStore:
    g = torch.Generator().manual_seed(1)
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


@pytest.mark.parametrize("kind", ["bf16", "fp8", "int4"])
def test_mapped_gather_writes_the_store_bytes(kind: str) -> None:
    # The Qwen3-30B-A3B expert shape (9.4 MB in bf16): thousands of column blocks per row;
    # int4's six parts (weights, scales, zero points) in one launch.
    layers, E, H, I, S = 2, 8, 2048, 768, 5
    formats = {"fp8": Fp8Block(), "int4": Int4Group()}
    store = pinned_bf16_store(layers, E, H, I) if kind == "bf16" else pinned_quant_store(layers, E, H, I, formats[kind])
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


@pytest.mark.parametrize("slots", [16, ALL])
def test_preloaded_slots_give_the_same_tokens_with_fewer_misses(small_ckpt, slots: int) -> None:  # noqa: ANN001
    cold_tokens, cold, _ = run(small_ckpt, moe_backend="offload", moe_slots=slots, expert_cache="device",
                               expert_preload="off")
    tokens, warm, graphs = run(small_ckpt, moe_backend="offload", moe_slots=slots, expert_cache="device",
                               expert_preload="on")
    host_tokens, host, _ = run(small_ckpt, moe_backend="offload", moe_slots=slots, expert_cache="host",
                               expert_preload="on")
    assert graphs and tokens == cold_tokens == host_tokens
    assert warm["preloaded_experts"] == host["preloaded_experts"] == slots and "preloaded_experts" not in cold
    assert warm["misses"] < cold["misses"] and (warm["misses"] == 0) == (slots == ALL)
    for key in ("hits", "misses", "bytes_copied", "hit_rate_by_layer"):
        assert warm[key] == host[key], key


@pytest.mark.parametrize("copier", ["1", "0"])
def test_copy_engine_mover_gives_the_same_tokens(small_ckpt, copier: str,  # noqa: ANN001
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy engine through the copier (EDGEMOE_COPIER=1: captured in the decode graphs,
    nothing in them holds an expert's address) or eagerly: the host cache's tokens."""
    monkeypatch.setenv("EDGEMOE_COPIER", copier)
    want, _, _ = run(small_ckpt, moe_backend="offload", moe_slots=8, expert_cache="host")
    tokens, moe, graphs = run(small_ckpt, moe_backend="offload", moe_slots=8, expert_cache="device",
                              expert_mover="copy")
    assert tokens == want and graphs == (copier == "1") and moe["expert_mover"] == "copy"


def read_then_admit(path, **settings):  # noqa: ANN001, ANN003, ANN202
    """A prompt stepped to its first token, the statistics read at once (the next step in
    flight), then a second prompt admitted (an eager chunk) beside the decoding row: each
    request's tokens, and the last statistics."""
    with LLM(str(path), dtype="bfloat16", device="cuda", moe_backend="offload", moe_slots=8, **settings) as llm:
        engine, got = llm.engine, {}
        ids = [engine.add_request(PROMPTS[0], GREEDY)]
        while not any(o.token_ids for o in engine.step()):
            pass
        llm.stats()  # blocking copies: the step in flight ends first
        ids.append(engine.add_request(PROMPTS[1], GREEDY))
        while engine.has_work():
            for o in engine.step():
                got.setdefault(o.request_id, []).extend(o.token_ids)
        return [got[i] for i in ids], llm.stats()["moe"], engine.runtime.executor.quiet_eager


def test_the_copier_survives_a_read_and_a_prompt_beside_its_graphs(small_ckpt,  # noqa: ANN001
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The full-size bench's order, which hung the copier (moe/movers.CopierMover's note),
    gives the host cache's tokens."""
    monkeypatch.setenv("EDGEMOE_COPIER", "1")
    want, _, _ = read_then_admit(small_ckpt, expert_cache="host")
    tokens, moe, quiet = read_then_admit(small_ckpt, expert_cache="device", expert_mover="copy")
    assert tokens == want and quiet and moe["copier_errors"] == 0 and moe["copier_rings"] > 0


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


def near_repeating_routing(rng: random.Random, base: list[list[int]], E: int) -> list[list[int]]:
    """Each layer's experts of the last step, one of them replaced now and then (a routing
    that nearly repeats, as the random presets' router does)."""
    for row in base:
        if rng.random() < 0.1:
            row[rng.randrange(len(row))] = rng.choice([e for e in range(E) if e not in row])
    return base


@pytest.mark.parametrize("policy", ["lru", "lru-plain"])
def test_fused_plan_below_the_working_set_is_the_reference(policy: str) -> None:
    """Qwen3-30B-A3B in bf16 at 8 GiB: 48 MoE layers x top-8 of 128 experts, 276 slots. A
    16-token step first (a prefill), then decode at batch 1 with a nearly repeating routing:
    the fused plan on the GPU makes `SlotCache`'s decisions, wave by wave (misses, slots,
    map, owners, recency stamps, wave ends). `lru` keeps most of the cycle resident (the
    replay floor: (276 - 8) / 384 less the routing's changes), `lru-plain` nearly nothing."""
    L, E, S, K = 48, 128, 276, 8
    py, dev = SlotCache(S, L, E, policy), DeviceSlotCache(S, L, E, CUDA, policy=policy)
    assert dev.fused
    rng = random.Random(5)
    base = [rng.sample(range(E), K) for _ in range(L)]
    steady = [0, 0]  # hits, uses from the third decode step on
    for step in range(12):
        rows = [[rng.sample(range(E), K) for _ in range(16)] for _ in range(L)] if step == 0 else None
        routing_now = near_repeating_routing(rng, base, E) if rows is None else None
        for layer in range(L):
            ids = torch.tensor(rows[layer] if rows is not None else [routing_now[layer]], dtype=torch.int32)
            with py.layer_waves(layer, torch.unique(ids)) as waves:
                plans = list(dev.layer_waves(layer, ids.to(CUDA)))
                assert len(plans) == len(waves) == 1
                got = [(e, s) for e, s in plans[0].misses.T.tolist() if e >= 0]
                assert got == [(m.expert, m.slot) for m in waves[0].misses], (step, layer)
            if step >= 3:
                steady[0] += waves[0].num_hits
                steady[1] += len(waves[0].experts)
        assert torch.equal(dev.slot_map.cpu(), py.slot_map), step
        owners = dev.slot_owners.cpu()
        want = py.slot_owners[:, 0].long() * E + py.slot_owners[:, 1].long()
        assert torch.equal(owners, torch.where(py.slot_owners[:, 0] >= 0, want, -1)), step
        if policy == "lru":
            owned = owners >= 0
            assert dev.recency.cpu()[owned].tolist() == [py.policy.stamp(k) for k in owners[owned].tolist()]
            assert dev.wave_end.cpu().tolist() == [py.policy.wave_end(layer) for layer in range(L)]
    rate = steady[0] / steady[1]
    print(f"\n{policy}: {rate:.3f} of the experts hit at decode (48 x 8 through 276 slots)")
    if policy == "lru":
        assert rate > 0.6, rate  # the floor 0.698, less ~10% of the layers changing one expert a step
    else:
        assert rate < 0.05, rate  # each key evicted just before its reuse: only a changed routing's luck


@pytest.mark.parametrize("slots", [10, TOP_K])  # below one token's 4 x 4 experts; the minimum pool
def test_the_policy_does_not_change_the_tokens(small_ckpt, slots: int) -> None:  # noqa: ANN001
    """Below the working set the two LRUs evict differently; the tokens are the host cache's
    (same kernels, cells summed in a fixed order) and the device cache's statistics are its
    host cache's, policy by policy."""
    out = {}
    for policy in ("lru", "lru-plain"):
        for cache in ("host", "device"):
            out[policy, cache] = run(small_ckpt, moe_backend="offload", moe_slots=slots, expert_cache=cache,
                                     moe_policy=policy)
    tokens = out["lru", "host"][0]
    for (policy, cache), (got, moe, graphs) in out.items():
        assert got == tokens, (policy, cache)
        assert graphs == (cache == "device")
        assert moe["expert_policy"] == policy
        host = out[policy, "host"][1]
        for key in ("hits", "misses", "bytes_copied", "hit_rate_by_layer"):
            assert moe[key] == host[key], (policy, key)
