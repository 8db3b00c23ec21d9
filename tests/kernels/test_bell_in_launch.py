"""The CPU share's bell rung and awaited from inside launches (kernels/cpu_bell.py,
triton_ops/host_words.py), under Triton's interpreter on CPU tensors:
- the share's launch clears the answer word, writes the mailbox as without the bell and
  rings last;
- the combines (and the torch path) read the CPU's cells only once the answer says the
  layer: a thread writes the cells late, then the answer, and the kernels must return
  what it wrote, never the stale cells;
- end to end with the C bell thread: a layer rung from the launch runs on the thread, and
  the combine's output is bitwise what the mailbox called directly gives."""

from __future__ import annotations

import importlib.util
import os
import threading
import time

import pytest
import torch

from cpu_expert_support import kernel_for, make_expert
from share_split_support import mailbox, state

from edgemoe.kernels.cell_sources import CellSources, apply_sources
from edgemoe.kernels.cpu_bell import LINE, BellTurn
from edgemoe.kernels.share_split import share_begin_ref

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
# A kernel that never sees its answer spins forever: a failure here must not hang the suite.
pytestmark = [pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)"),
              pytest.mark.timeout(300)]
H = 40


def words_turn(value: int) -> tuple[torch.Tensor, BellTurn]:
    words = torch.zeros(2 * LINE, dtype=torch.int32)
    return words, BellTurn(words[0:1], words[LINE:LINE + 1], value)


def routing(g: torch.Generator, T: int, K: int, E: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
    return ids, torch.softmax(torch.randn(T, K, generator=g), -1), torch.randn(T, H, generator=g).bfloat16()


def test_the_share_launch_clears_the_answer_writes_the_mailbox_and_rings() -> None:
    from edgemoe.kernels.triton_ops.share_split import share_begin_triton

    E, T, K = 16, 3, 4
    g = torch.Generator().manual_seed(5)
    resident = torch.where(torch.rand(E, generator=g) < 0.3, 0, -1).int()
    ids, w, x = routing(g, T, K, E)
    mb_ref, mb_tri = mailbox(T, T * K + 1, H), mailbox(T, T * K + 1, H)
    ref, tri = state(E, T * K, resident, 3), state(E, T * K, resident, 3)
    words, turn = words_turn(8)
    words[LINE] = 8  # the layer's previous answer: cleared, else the combine would not wait
    want = share_begin_ref(ids, w, x, ref, mb_ref)
    got = share_begin_triton(ids, w, x, tri, mb_tri, turn=turn)
    assert int(words[0]) == 8 and int(words[LINE]) == 0
    assert torch.equal(got, want) and torch.equal(tri.cpu_col, ref.cpu_col)
    n = int(mb_ref.count)
    assert n > 0 and int(mb_tri.count) == n
    assert torch.equal(mb_tri.pairs[:, :n], mb_ref.pairs[:, :n]) and torch.equal(mb_tri.x, mb_ref.x)
    rows = 65  # a prompt chunk's: its rows are copied after the launch, which may not ring then
    with pytest.raises(AssertionError, match="whole mailbox"):
        share_begin_triton(torch.zeros(rows, K, dtype=torch.int32), torch.zeros(rows, K),
                           torch.zeros(rows, H, dtype=torch.bfloat16), state(E, rows * K, resident, 3),
                           mailbox(rows, 4096, H), turn=turn)


def late_answer(turn: BellTurn, cpu_out: torch.Tensor, cells: torch.Tensor) -> threading.Thread:
    """A thread that writes the CPU's cells after a while, then the answer."""
    def answer() -> None:
        time.sleep(0.3)
        cpu_out.copy_(cells)
        turn.done[0] = turn.value

    thread = threading.Thread(target=answer)
    thread.start()
    return thread


@pytest.mark.parametrize("path", ["combine", "combine_norm", "torch"])
def test_the_combine_reads_the_cpus_cells_only_once_answered(path: str) -> None:
    from edgemoe.kernels.triton_ops.moe_combine import moe_combine_norm_triton, moe_combine_triton

    T, K = 2, 3
    g = torch.Generator().manual_seed(9)
    cells = torch.randn(T, K, H, generator=g)
    cpu_cells = torch.randn(2, H, generator=g)
    cpu_col = torch.tensor([-1, 0, -1, -1, -1, 1], dtype=torch.int32)
    residual, weight = torch.randn(T, H, generator=g).bfloat16(), torch.ones(H).bfloat16()
    want = apply_sources(cells.clone(), CellSources(cpu_col=cpu_col, cpu_out=cpu_cells))
    words, turn = words_turn(8)
    words[LINE] = 7  # the layer before's answer
    cpu_out = torch.full((2, H), float("nan"))  # not yet written
    sources = CellSources(cpu_col=cpu_col, cpu_out=cpu_out, ready=turn)
    thread = late_answer(turn, cpu_out, cpu_cells)
    if path == "combine":
        got, expect = (moe_combine_triton(cells, torch.bfloat16, residual, sources),
                       moe_combine_triton(want, torch.bfloat16, residual))
    elif path == "combine_norm":
        got, expect = (moe_combine_norm_triton(cells, torch.bfloat16, residual, weight, 1e-6, 0.0, sources)[1],
                       moe_combine_norm_triton(want, torch.bfloat16, residual, weight, 1e-6, 0.0)[1])
    else:
        got, expect = apply_sources(cells.clone(), sources), want
    thread.join()
    assert torch.equal(got, expect)


def test_a_layer_rung_from_the_launch_runs_on_the_bell_thread() -> None:
    from edgemoe.kernels.cpu_bell import CpuBell
    from edgemoe.kernels.cpu_host_layer import HostLayerMailboxes
    from edgemoe.kernels.triton_ops.moe_combine import moe_combine_triton
    from edgemoe.kernels.triton_ops.share_split import share_begin_triton

    E, I, T, K, layer = 8, 24, 2, 3, 1
    kernel = kernel_for("scalar", "gemv")
    experts = [make_expert(H, I, seed=40 + e) for e in range(E)]
    banks = {layer: {"gate_up": torch.stack([gu for gu, _ in experts]), "down": torch.stack([d for _, d in experts])}}
    mb = HostLayerMailboxes(banks, ("bf16", 0), kernel, T, K, torch.bfloat16)
    bell = CpuBell(mb, None)
    g = torch.Generator().manual_seed(3)
    try:
        for step in range(3):  # the same layer each step: its previous answer must not pass for this one
            ids, w, x = routing(g, T, K, E)
            resident = torch.full((E,), -1, dtype=torch.int32)
            st = state(E, T * K, resident, quota=2 + step % 2)
            turn = bell.turn(layer)
            device_ids = share_begin_triton(ids, w, x, st, mb.buffers, turn=turn)
            cells = torch.where((device_ids >= 0)[..., None], torch.randn(T, K, H, generator=g), float("inf"))
            got = moe_combine_triton(cells, torch.bfloat16, None, CellSources(cpu_col=st.cpu_col, cpu_out=mb.buffers.out,
                                                                              ready=turn))
            n = int(mb.buffers.count)
            assert n > 0 and mb.status(layer) == 0
            thread_cells = mb.buffers.out[:n].clone()
            mb.run(layer)  # the same mailbox called directly
            assert torch.equal(thread_cells, mb.buffers.out[:n])
            want = apply_sources(cells.clone(), CellSources(cpu_col=st.cpu_col, cpu_out=mb.buffers.out))
            assert torch.equal(got, moe_combine_triton(want, torch.bfloat16))
        assert mb.busy()[0].tolist() == [6]  # three rung from the launch, three direct calls
    finally:
        bell.close()
