"""A checkpoint loaded with a pinned expert store on CUDA: every bank page-locked in
place by cudaHostRegister (no pinned allocation, exact sizes), the values those of a
pageable load, asynchronous copies from the banks correct, and the locks released."""

from __future__ import annotations

import torch

from edgemoe.models.loader import load_checkpoint
from edgemoe.moe.pinning import CudaRegistrar


def test_checkpoint_banks_registered_in_place(small_ckpt) -> None:  # noqa: ANN001
    device = torch.device("cuda", torch.cuda.current_device())
    store = load_checkpoint(small_ckpt, progress=False, expert_store="pinned", registrar=CudaRegistrar(device)).experts
    ram = load_checkpoint(small_ckpt, progress=False).experts
    assert store.pinned
    for layer in store.layers:
        for which in ("gate_up", "down"):
            bank, ref = store.tensor(layer, which), ram.tensor(layer, which)
            assert bank.is_pinned() and not ref.is_pinned()
            assert bank.untyped_storage().nbytes() == bank.nbytes  # pageable allocation: exact size
            assert torch.equal(bank, ref)
            on_device = bank.to(device, non_blocking=True)  # from locked memory: the copy engine
            torch.cuda.synchronize(device)
            assert torch.equal(on_device.cpu(), ref)
    store.close()
    assert not store.pinned and not store.tensor(store.layers[0], "down").is_pinned()
