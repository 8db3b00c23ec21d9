"""The slot banks' tail lent to streamed chunks on the GPU (moe/lendable_memory.py,
moe/slot_lending.py):

- the buffer: a loan gives the tail's memory to the driver (torch can allocate it), the
  tail comes back at the same address, the head's bytes untouched; a CUDA graph captured
  over the buffer replays correctly after a loan;
- engine level: a model whose plan lends (offload, the device cache, --gpu-memory 2.5 GiB,
  2,048-token chunks: ~300 slots, ~60 of them lent) gives the greedy tokens of the same engine without the loan
  (`EDGEMOE_LEND_SLOTS=0`), with more slots; and, in a fresh process, the driver-counted
  peak stays under the cap through a long prompt's loans and the decode after them.
"""

from __future__ import annotations

import gc

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.engine.budget import workspace_bytes
from edgemoe.moe.lendable_memory import LendableBuffer, vmm_granularity
from edgemoe.testing.isolation import DeviceUse, isolated

CUDA = torch.device("cuda")
MiB = 2**20
MEDIUM = dict(
    hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
    num_experts=64, num_experts_per_tok=8, moe_intermediate_size=512, tie_word_embeddings=True,
    max_position_embeddings=8192,
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = [list(range(1000, 4000)), list(range(5000, 5040))]  # 3,000 tokens: a streamed chunk, then a planned one


@pytest.fixture(autouse=True)
def _needs_vmm() -> None:
    if vmm_granularity(CUDA) is None:
        pytest.skip("no virtual memory management on this device")


def test_a_loan_frees_the_tail_and_it_returns_at_the_same_address() -> None:
    buf = LendableBuffer(512 * MiB, 100 * MiB, CUDA)
    assert 400 * MiB <= buf.tail_bytes <= 412 * MiB
    head = buf.tensor[: 100 * MiB]
    head.fill_(7)
    ptr = buf.tensor.data_ptr()
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    buf.release_tail()
    assert torch.cuda.mem_get_info()[0] - free_before >= buf.tail_bytes - 2 * MiB  # the driver has it back
    borrowed = torch.empty(buf.tail_bytes // 2, dtype=torch.uint8, device=CUDA).fill_(1)  # torch can use it
    del borrowed
    torch.cuda.empty_cache()
    buf.map_tail()
    assert buf.tensor.data_ptr() == ptr and bool((head == 7).all())
    buf.tensor[100 * MiB :].fill_(3)
    assert int(buf.tensor[-1]) == 3 and int(buf.tensor[100 * MiB]) == 3 and int(head[-1]) == 7
    torch.cuda.synchronize()
    free_mapped = torch.cuda.mem_get_info()[0]
    del buf, head
    gc.collect()
    assert torch.cuda.mem_get_info()[0] - free_mapped >= 500 * MiB  # the last tensor gone: the memory too


def test_a_graph_over_the_buffer_replays_after_a_loan() -> None:
    buf = LendableBuffer(64 * MiB, 16 * MiB, CUDA)
    view = buf.tensor.view(torch.float32)
    view.fill_(1.0)
    out = torch.zeros((), device=CUDA)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out.copy_(view.sum())  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(view.sum())
    graph.replay()
    assert float(out) == view.numel()
    torch.cuda.synchronize()
    buf.release_tail()
    buf.map_tail()
    view.fill_(2.0)
    graph.replay()
    assert float(out) == 2 * view.numel()


def _engine(path, **settings) -> LLM:  # noqa: ANN001, ANN003
    return LLM(str(path), dtype="bfloat16", device="cuda", moe_backend="offload", expert_cache="device",
               gpu_memory="2560MiB", max_prefill_tokens=2048, **settings)


@isolated  # plans from a fresh process's context (the tests above leave the allocator's cache)
def test_lending_keeps_the_greedy_tokens(make_ckpt, monkeypatch) -> None:  # noqa: ANN001
    """The same tokens with and without the loan; the loan's plan reserves only a short
    step's workspace (its slot count can't be compared across two engines of one process:
    the second measures the first's leftovers in its context)."""
    path = make_ckpt("qwen3_moe", **MEDIUM)
    tokens = {}
    for lend in ("0", "1"):
        monkeypatch.setenv("EDGEMOE_LEND_SLOTS", lend)
        with _engine(path) as llm:
            rt = llm.engine.runtime
            assert (rt.plan.lend_slots > 0) == (lend == "1")
            if lend == "1":
                assert rt.plan.workspace == workspace_bytes(rt.model.arch, 1023, rt.plan.max_running)
            tokens[lend] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
            moe = llm.stats()["moe"]
            assert moe["streamed_chunks"] >= 1 and (moe["slot_loans"] >= 1) == (lend == "1")
            assert rt.executor.workspace.loaned_buffer is None  # the chunk's cells went with the loan
            del rt  # the next engine plans without this one's memory
    assert tokens["1"] == tokens["0"]


@isolated  # measures the driver-counted device memory of a fresh process
def test_device_memory_stays_under_the_cap_through_loans(make_ckpt) -> None:  # noqa: ANN001
    path = make_ckpt("qwen3_moe", **MEDIUM)
    cap = 2560 * MiB
    use = DeviceUse()  # before this process's CUDA context: the parent pytest's share left out
    with _engine(path) as llm:
        engine = llm.engine
        assert engine.runtime.plan.lend_slots > 0
        rid = engine.add_request(list(range(1000, 7000)), SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
        peak = use.peak_until_finished(engine, rid)
        assert llm.stats()["moe"]["slot_loans"] >= 1
    assert peak <= cap, f"driver-counted peak {peak / 2**30:.2f} GiB > cap 2.5 GiB"
