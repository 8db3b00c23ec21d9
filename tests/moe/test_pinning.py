"""InPlacePinner with a fake registrar: registration overlaps the caller's work, runs in
submission order, is all or nothing, and holds memory until it is unregistered."""

from __future__ import annotations

import gc
import logging
import threading
import weakref

import pytest
import torch

from edgemoe.moe.pinning import InPlacePinner, PinError
from edgemoe.moe.store import BankStore

WAIT_S = 10.0  # generous: only a broken implementation waits this long


class FakeRegistrar:
    """Records (ptr, nbytes); can refuse the n-th call and hold a call until released."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []
        self.fail_at = fail_at
        self.started = threading.Event()  # set when a register call begins
        self.go = threading.Event()  # a register call returns only once this is set
        self.go.set()
        self.threads: set[str] = set()

    def register(self, ptr: int, nbytes: int) -> None:
        self.threads.add(threading.current_thread().name)
        self.started.set()
        assert self.go.wait(WAIT_S), "the test never let registration finish"
        if self.fail_at is not None and len(self.registered) == self.fail_at:
            raise PinError("memlock limit")
        self.registered.append((ptr, nbytes))

    def unregister(self, ptr: int) -> None:
        self.unregistered.append(ptr)


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.numel() * t.element_size()


def test_registration_overlaps_the_next_fill_and_keeps_order() -> None:
    fake = FakeRegistrar()
    fake.go.clear()
    pinner = InPlacePinner(fake)
    first, second = torch.zeros(1000), torch.zeros(2000)
    pinner.submit(first)  # must return while `first` is still being registered
    assert fake.started.wait(WAIT_S)
    second.fill_(1.0)  # "filling the next layer" while the driver pins the previous one
    pinner.submit(second)
    assert fake.registered == []  # nothing finished yet: the fill really overlapped
    fake.go.set()
    assert pinner.finish()
    assert fake.registered == [_span(first), _span(second)]
    assert fake.threads == {"edgemoe-pin"}  # never on the caller's thread
    assert pinner.pinned_bytes == 3000 * 4


def test_a_refusal_unpins_everything_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeRegistrar(fail_at=1)
    pinner = InPlacePinner(fake, "expert store")
    tensors = [torch.zeros(100) for _ in range(4)]
    for t in tensors:
        pinner.submit(t)
    with caplog.at_level(logging.WARNING):
        assert not pinner.finish()
    assert fake.registered == [_span(tensors[0])]  # after the refusal nothing more is tried
    assert fake.unregistered == [tensors[0].data_ptr()]
    assert [r.getMessage() for r in caplog.records] == [
        "pinning the expert store failed (memlock limit); using pageable memory (slower copies)"
    ]
    assert not pinner.finish() and len(caplog.records) == 1  # finish is idempotent


def test_memory_is_held_until_unregistered() -> None:
    fake = FakeRegistrar()
    pinner = InPlacePinner(fake)
    t = torch.zeros(100)
    ref, ptr = weakref.ref(t), t.data_ptr()
    pinner.submit(t)
    assert pinner.finish()
    del t
    gc.collect()
    assert ref() is not None  # freeing registered memory would leave the driver a dangling range
    pinner.release()
    pinner.release()  # idempotent
    assert fake.unregistered == [ptr]
    gc.collect()
    assert ref() is None


def test_misuse_is_refused() -> None:
    pinner = InPlacePinner(FakeRegistrar())
    with pytest.raises(ValueError, match="contiguous host tensors"):
        pinner.submit(torch.zeros(4, 4).t())
    assert pinner.finish()  # nothing submitted: nothing to wait for
    with pytest.raises(RuntimeError, match="after finish"):
        pinner.submit(torch.zeros(4))


def test_bank_store_unpins_on_close_and_when_collected() -> None:
    for how in ("close", "collect"):
        fake = FakeRegistrar()
        store = BankStore.allocate([0, 1], num_experts=2, hidden=8, intermediate=4, dtype=torch.float32)
        pinner = InPlacePinner(fake)
        for layer in store.layers:
            pinner.submit(store.banks[layer].gate_up)
            pinner.submit(store.banks[layer].down)
        store.own_pins(pinner)
        assert store.pinned and len(fake.registered) == 4
        ptrs = sorted(p for p, _ in fake.registered)
        if how == "close":
            store.close()
            assert not store.pinned
        else:
            del store
            gc.collect()
        assert sorted(fake.unregistered) == ptrs, how
