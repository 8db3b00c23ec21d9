"""The device cache's CPU share on the GPU (moe/cpu_share.py): the CPU's pairs run by
`em_host_layer` as a host function on a side stream, eagerly and as a host node replayed
from a CUDA graph:
- one executor layer: bitwise what its pieces give computed apart (the device kernel's
  cells for every pair, the CPU pairs' cells — the coldest misses by the reference's heat —
  replaced by the host path's C kernel cells; the fused Triton split on the device),
  eager and replayed with fresh routings, and the cache state of a cache that never saw
  the CPU's experts;
- end to end: greedy tokens with a CPU quota equal offload's (quota 0), or part where
  offload's top two logits are closer than two bf16 logit errors; graphs on and off."""

from __future__ import annotations

import os

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
from edgemoe.moe.store import BankStore
from edgemoe.testing.moe_material import random_bank_store

CUDA = torch.device("cuda")
PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def pinned_bf16_store(layers: int, E: int, H: int, I: int) -> BankStore:
    return random_bank_store(layers, E, H, I, torch.bfloat16, pinned=True)


@pytest.mark.parametrize("bell", ["1", "0"], ids=["bell", "host-node"])
def test_one_layer_eager_and_replayed_from_a_graph(bell: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-off both ways: the bell thread (stream memory operations) and the host node."""
    from edgemoe.kernels.cpu_bell import bell_supported

    monkeypatch.setenv("EDGEMOE_CPU_BELL", bell)
    if bell == "1" and not bell_supported(0):
        pytest.skip("this driver has no stream memory operations on host words in graphs")
    layers, E, H, I, S, T, K, quota = 2, 16, 256, 128, 6, 3, 4, 2
    store = pinned_bf16_store(layers, E, H, I)
    kernel = CpuExperts(threads=4)
    if not kernel.native:
        pytest.skip("no compiled CPU expert kernel")
    share = DeviceOffloadExecutor(store, CUDA, F.silu, layers, S, cpu_experts_per_layer=quota, cpu_kernel=kernel)
    ref = DeviceOffloadExecutor(store, CUDA, F.silu, layers, S)
    banks = {layer: {n: t.to(CUDA) for n, t in store.layer_parts(layer).items()} for layer in range(layers)}
    g = torch.Generator().manual_seed(1)
    x = torch.zeros(T, H, dtype=torch.bfloat16, device=CUDA)
    ids = torch.zeros(T, K, dtype=torch.int32, device=CUDA)
    w = torch.zeros(T, K, device=CUDA)
    outs = [torch.zeros(T, H, dtype=torch.bfloat16, device=CUDA) for _ in range(layers)]

    def step() -> None:
        for layer in range(layers):
            outs[layer].copy_(share.forward(layer, x, ids, w))

    def fresh() -> None:
        x.copy_(torch.randn(T, H, generator=g).bfloat16())
        ids.copy_(torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int())
        w.copy_(torch.softmax(torch.randn(T, K, generator=g), -1))

    heat = [[0] * E for _ in range(layers)]  # the reference pick's memory (moe/cpu_share.py)

    def check() -> None:
        """The outputs against the pieces, then the reference cache advanced the same way."""
        for layer in range(layers):
            slot_row = ref.cache.slot_map[layer].cpu()
            routed = ids.cpu().flatten().tolist()
            misses = [e for e in sorted(set(routed)) if slot_row[e] < 0]
            on_cpu = sorted(sorted(misses, key=lambda e: (heat[layer][e], -e))[:quota])  # noqa: B023
            heat[layer] = [h - (h >> 3) + 1024 * routed.count(e) for e, h in enumerate(heat[layer])]
            cells = torch.empty(T, K, H, device=CUDA)
            moe_slots_parts(x, ids, w, banks[layer], store.format, F.silu, cells, num_decode=T)
            flat, values = moe_expert_cells_cpu(x.cpu(), ids.cpu(), w.cpu(), on_cpu,
                                                [store.expert(layer, e) for e in on_cpu], kernel)
            cells.view(-1, H)[flat.to(CUDA)] = values.to(CUDA)
            assert torch.equal(outs[layer], moe_combine(cells, x.dtype)), (layer, on_cpu)
            masked = torch.where(torch.isin(ids, torch.tensor(on_cpu, device=CUDA, dtype=ids.dtype)), -1, ids)
            ref.forward(layer, x, masked, w)
        # NOTE: after every layer, not inside the loop: the step already ran all layers on
        # the share's cache (the layers share one pool, so layer 1 evicts layer 0's slots).
        assert torch.equal(ref.cache.slot_map, share.cache.slot_map)
        assert torch.equal(ref.cache.recency, share.cache.recency)

    for _ in range(3):  # eager: the host function launched on a side stream
        fresh()
        step()
        torch.cuda.synchronize()
        check()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the host function becomes a host node
        step()
    torch.cuda.synchronize()
    for _ in range(4):  # capturing ran nothing: the reference cache is where the share's is
        fresh()
        graph.replay()
        torch.cuda.synchronize()
        check()
    assert share.stats.snapshot()["experts_cpu"] > 0
    assert (share.cpu_share._bell is not None) == (bell == "1")
    share.close()


def greedy(path, **settings) -> tuple[list[list[int]], dict]:
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)], llm.stats()["moe"]


@pytest.fixture(scope="module")
def offload(small_ckpt):
    return greedy(small_ckpt, moe_backend="offload", moe_slots=8, expert_cache="device")[0]


@pytest.mark.parametrize("graphs,quota,prompt", [(True, 2, False), (False, 2, False), (True, None, False),
                                                 (True, None, True)],
                         ids=["graphs", "eager", "live-graphs", "live-prompt-cpu"])
def test_greedy_tokens_with_a_cpu_quota_match_offload(small_ckpt, offload, graphs: bool, quota: int | None,
                                                      prompt: bool) -> None:
    """A fixed quota, and the live one (None: hybrid starts at one CPU expert a layer and
    its controller moves between levels, the runner between the two captured variants);
    with `prompt_cpu` the 100-token prompt's chunk takes the prompt rule too."""
    settings = {} if graphs else {"no_cuda_graph": True}
    if quota is not None:
        settings["cpu_experts_per_layer"] = quota
    if prompt:
        settings["prompt_cpu"] = True
    got, moe = greedy(small_ckpt, moe_backend="hybrid", moe_slots=8, expert_cache="device", **settings)
    assert moe["experts_cpu"] > 0 and moe["expert_cache"] == "device"
    if quota is None:
        assert "cpu_quota_per_layer" in moe
    assert_parted_only_at_near_ties(small_ckpt, PROMPTS, offload, got, moe_backend="offload", moe_slots=8,
                                    expert_cache="device")


def test_engines_in_turn_each_pin_their_share_workers(small_ckpt, monkeypatch) -> None:
    """By default (EDGEMOE_CPU_PIN unset) the share's pool pins every worker to a core of its
    own; closing the engine gives the cores back, so the next engine in the process pins too
    (before the executor closed its kernel, the second engine's workers floated)."""
    from edgemoe.kernels import cpu_isa, cpu_pinning

    monkeypatch.delenv("EDGEMOE_CPU_PIN", raising=False)
    monkeypatch.delenv("EDGEMOE_CPU_THREADS", raising=False)
    monkeypatch.setattr(cpu_pinning, "_held", {})  # as if no other pool were alive (earlier tests' may be)
    for _ in range(2):
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="hybrid", moe_slots=8,
                 expert_cache="device") as llm:
            llm.generate(PROMPTS[:1], GREEDY)
            kernel = llm.engine.runtime.executor.cpu_share.kernel
            assert llm.stats()["moe"]["experts_cpu"] > 0
            assert len(kernel.pinned) == kernel.threads - 1, kernel.pinned
        assert kernel.pinned == {}
        assert cpu_pinning.free_cores() == cpu_isa.core_cpus(os.sched_getaffinity(0))
