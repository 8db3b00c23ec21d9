"""The copier on the GPU (`kernels/copy_bell.py`): rings and waits captured in a CUDA graph,
the copies issued by the C thread on the copy engine at replay time. Each replay moves the
lists then in the device buffers (nothing in the graph holds an expert's address), and a
kernel after the wait reads the copied slots: what it reads is the store's bytes, so the
wait orders compute after the copies. Two rows in flight, a padding entry, replayed lists
that reuse slots."""

from __future__ import annotations

import pytest
import torch

from edgemoe.kernels.copy_bell import CopyBell, copier_library

CUDA = torch.device("cuda")
E, S, W = 10, 8, 3


def _banks(layers: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [{"gate_up": torch.randn(E, 256, 512, generator=g).bfloat16().pin_memory(),
             "down": torch.randn(E, 512, 128, generator=g).bfloat16().pin_memory()} for _ in range(layers)]


def test_rings_replayed_from_a_graph_move_each_replays_lists() -> None:
    lib = copier_library()
    if lib is None:
        pytest.skip("no C compiler: no copier")
    store = _banks(2)
    slots = {name: torch.zeros((S, *bank.shape[1:]), dtype=bank.dtype, device=CUDA) for name, bank in store[0].items()}
    bell = CopyBell(lib, [4, 7], store, slots, rows=2, width=W, device=CUDA)
    misses = torch.full((2, 2, W), -1, dtype=torch.int32, device=CUDA)
    read = torch.zeros((2, W, 512, 128), dtype=torch.bfloat16, device=CUDA)
    stream = torch.cuda.Stream(CUDA)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        bell.ring(0, 4, misses[0])
        bell.ring(1, 7, misses[1])
        for row in (0, 1):
            bell.wait(row)
            read[row].copy_(slots["down"].index_select(0, misses[row, 1].clamp(min=0)))  # after the copies
    g = torch.Generator().manual_seed(8)
    for replay in range(6):
        perm = torch.randperm(S, generator=g)[:2 * W].view(2, W)  # two rows never share a slot
        ids = torch.randint(0, E, (2, W), generator=g)
        ids[replay % 2, replay % W] = -1  # padding
        misses.copy_(torch.stack([ids, perm], 1).int())
        graph.replay()
        torch.cuda.synchronize()
        for row, layer in enumerate((0, 1)):
            for i in range(W):
                e, s = int(ids[row, i]), int(perm[row, i])
                if e < 0:
                    continue
                for name, bank in slots.items():
                    assert torch.equal(bank[s].cpu(), store[layer][name][e]), (replay, row, i, name)
                assert torch.equal(read[row, i].cpu(), store[layer]["down"][e]), (replay, row, i)
    bell.drain()
    stats = bell.stats()
    bell.close()
    assert stats["errors"] == 0 and stats["rings"] == 12
