"""The CPU share's picks loaded after their layer on the GPU (moe/share_admission.py,
`EDGEMOE_SHARE_ADMIT=N`): the side stream's gather inside the decode step, joined one or two
layers later.
- One executor, eager: every layer bitwise what its pieces give computed apart (the device
  kernel's cells for every pair, the CPU's picks' cells by the host path's C kernel): a
  loaded slot holds its expert's exact weights when later steps hit it; the picks resident
  after their layer but the last.
- The same steps replayed from a CUDA graph: an eager twin's outputs and cache, bitwise.
- End to end: greedy tokens equal offload's but at near-ties of its logits, graphs on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpu_family import assert_parted_only_at_near_ties

from edgemoe import LLM, SamplingParams
from edgemoe.kernels.cpu_experts import moe_expert_cells_cpu
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.kernels.moe_experts import moe_combine
from edgemoe.kernels.moe_quant import moe_slots_parts
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.testing.moe_material import random_bank_store

CUDA = torch.device("cuda")
LAYERS, E, H, I, S, K, QUOTA = 3, 16, 256, 128, 12, 4, 2
PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def kernel() -> CpuExperts:
    k = CpuExperts(threads=4)
    if not k.native:
        pytest.skip("no compiled CPU expert kernel")
    return k


@pytest.fixture(scope="module")
def store():  # noqa: ANN201
    return random_bank_store(LAYERS, E, H, I, torch.bfloat16, pinned=True)


def admitting(store, kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
              lag: int = 1) -> DeviceOffloadExecutor:
    monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", str(lag))
    ex = DeviceOffloadExecutor(store, CUDA, F.silu, LAYERS, S, cpu_experts_per_layer=QUOTA, cpu_kernel=kernel, top_k=K)
    assert ex.admission is not None and ex.admission.covers(1)
    return ex


def steps(n: int, seed: int):  # noqa: ANN201
    """Decode steps of one token row, routed by a skewed law (so experts recur)."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.tensor([8.0, 6.0, 5.0, 4.0] + [1.0] * (E - 4))
    for _ in range(n):
        ids = torch.multinomial(probs, K, generator=g).int()[None]
        yield (torch.randn(1, H, generator=g).bfloat16().to(CUDA), ids.to(CUDA),
               torch.softmax(torch.randn(1, K, generator=g), -1).to(CUDA))


def cpu_picks(ex: DeviceOffloadExecutor, layer: int, ids: torch.Tensor) -> list[int]:
    """The share's split before `layer` runs: its quota's coldest misses by the share's heat."""
    slot_row, heat = ex.cache.slot_map[layer].cpu(), ex.cpu_share.heat[layer].cpu().tolist()
    misses = [e for e in sorted(set(ids.flatten().tolist())) if slot_row[e] < 0]
    return sorted(sorted(misses, key=lambda e: (heat[e], -e))[:QUOTA])


@pytest.mark.parametrize("lag", [1, 2])
def test_eager_layers_are_their_pieces_and_picks_load(store, kernel: CpuExperts,  # noqa: ANN001
                                                      monkeypatch: pytest.MonkeyPatch, lag: int) -> None:
    ex = admitting(store, kernel, monkeypatch, lag)
    banks = {layer: {n: t.to(CUDA) for n, t in store.layer_parts(layer).items()} for layer in range(LAYERS)}
    loaded = 0
    for x, ids, w in steps(40, seed=3):
        for layer in range(LAYERS):
            on_cpu = cpu_picks(ex, layer, ids)
            out = ex.forward(layer, x, ids, w)
            torch.cuda.synchronize()
            cells = torch.empty(1, K, H, device=CUDA)
            moe_slots_parts(x, ids, w, banks[layer], store.format, F.silu, cells, num_decode=1)
            flat, values = moe_expert_cells_cpu(x.cpu(), ids.cpu(), w.cpu(), on_cpu,
                                                [store.expert(layer, e) for e in on_cpu], kernel)
            cells.view(-1, H)[flat.to(CUDA)] = values.to(CUDA)
            assert torch.equal(out, moe_combine(cells, x.dtype)), (layer, on_cpu)
            if layer < LAYERS - 1:
                assert bool((ex.cache.slot_map[layer][on_cpu] >= 0).all()), (layer, on_cpu)
                loaded += len(on_cpu)
    info = ex.stats.snapshot()
    assert loaded > 0 and info["share_admitted"] == loaded and info["hits"] > 0
    ex.close()


@pytest.mark.parametrize("lag", [1, 2])
def test_graph_replay_is_the_eager_twin(store, kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                        lag: int) -> None:
    eager, captured = admitting(store, kernel, monkeypatch, lag), admitting(store, kernel, monkeypatch, lag)
    x = torch.zeros(1, H, dtype=torch.bfloat16, device=CUDA)
    ids = torch.zeros(1, K, dtype=torch.int32, device=CUDA)
    w = torch.zeros(1, K, device=CUDA)
    outs = [torch.zeros(1, H, dtype=torch.bfloat16, device=CUDA) for _ in range(LAYERS)]

    def step(ex: DeviceOffloadExecutor) -> list[torch.Tensor]:
        return [ex.forward(layer, x, ids, w).clone() for layer in range(LAYERS)]

    def captured_step() -> None:
        for layer in range(LAYERS):
            outs[layer].copy_(captured.forward(layer, x, ids, w))

    trace = list(steps(30, seed=5))
    for xs, i, ws in trace[:3]:  # both warm eagerly, then one is captured
        x.copy_(xs), ids.copy_(i), w.copy_(ws)
        assert all(torch.equal(a, b) for a, b in zip(step(eager), step(captured), strict=True))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_step()
    torch.cuda.synchronize()
    for xs, i, ws in trace[3:]:
        x.copy_(xs), ids.copy_(i), w.copy_(ws)
        want = step(eager)
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(want, outs, strict=True))
        for a, b in ((eager.cache.slot_map, captured.cache.slot_map), (eager.cache.recency, captured.cache.recency)):
            assert torch.equal(a, b)
    assert captured.stats.snapshot()["share_admitted"] == eager.stats.snapshot()["share_admitted"] > 0
    eager.close()
    captured.close()


def test_greedy_tokens_match_offload_but_at_near_ties(small_ckpt, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """32 slots of 64 experts: a decode step of the three prompts (a graph of 4 rows, at most
    16 experts a layer) plans beside a load in flight (`SideGather.covers`: twice that)."""
    settings = dict(moe_slots=32, expert_cache="device")
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="offload", **settings) as llm:
        offload = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", "1")
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="hybrid", cpu_experts_per_layer=2,
             **settings) as llm:
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        moe = llm.stats()["moe"]
    assert moe["experts_cpu"] > 0 and moe["share_admitted"] > 0
    monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", "0")
    assert_parted_only_at_near_ties(small_ckpt, PROMPTS, offload, got, moe_backend="offload", **settings)
