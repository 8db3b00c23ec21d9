"""The cpu/hybrid executors run bf16 SiLU experts through the C kernel: the result
matches the resident executor (torch's bf16 path) within both paths' rounding bounds,
the kernel's thread pool is the executor's (cores − 1 beside a GPU), and fp32 stores
bypass it (bitwise: tests/moe/test_executors.py)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from cpu_expert_support import U32, UBF, error_bound

from edgemoe.kernels import cpu_isa
from edgemoe.kernels.activations import activation
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.moe.cpu import cpu_kernel_for, cpu_threads
from edgemoe.moe.registry import make_executor
from edgemoe.moe.store import BankStore

L, E, K, H, I = 2, 8, 2, 64, 32


def native_kernel_available() -> bool:
    return CpuExperts().native


@pytest.fixture(scope="module")
def store() -> BankStore:
    g = torch.Generator().manual_seed(0)
    s = BankStore.allocate(list(range(L)), E, H, I, torch.bfloat16)
    for b in s.banks.values():  # scaled like trained weights: unit-sized outputs
        b.gate_up.copy_((torch.randn(b.gate_up.shape, generator=g) / H**0.5).bfloat16())
        b.down.copy_((torch.randn(b.down.shape, generator=g) / I**0.5).bfloat16())
    return s


def output_bound(store: BankStore, layer: int, x, ids, w) -> torch.Tensor:  # noqa: ANN001
    """|kernel − resident| per output element [T, H]. Per cell: the kernel (fp32 GEMV)
    and torch's bf16 path each within their bound of the fp32 reference, times the routing
    weight, plus one fp32 rounding of that product on each side; the K cells summed in
    fp32 (K·u32 of their magnitude, each side); the sum rounded once to bf16 on each side."""
    bank, xd = store.banks[layer], x.float()
    delta = torch.zeros(x.shape[0], H)
    size = torch.zeros(x.shape[0], H)
    for t in range(x.shape[0]):
        for k in range(K):
            gu, dn, wk = bank.gate_up[ids[t, k]], bank.down[ids[t, k]], float(w[t, k])
            xt = x[t : t + 1]
            gate, up = (xd[t] @ gu.float().T).chunk(2)
            y = (dn.float() @ (F.silu(gate) * up)).abs()
            b = error_bound(xt, gu, dn, False, False)[0] + error_bound(xt, gu, dn, False, True, True)[0]
            delta[t] += wk * b + 2 * U32 * wk * y
            size[t] += wk * (y + b)
    delta += 2 * K * U32 * size
    return delta + UBF * (2 * size + delta)


def routings(seed: int, steps: int = 6):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        T = [1, 3, 1, 5, 2, 4][step]
        x = torch.randn(T, H, generator=g).bfloat16()
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
        w = torch.softmax(torch.randn(T, K, generator=g), -1).bfloat16()
        yield x, ids, w


@pytest.mark.parametrize("backend,kw", [("cpu", dict(num_slots=K)), ("hybrid", dict(num_slots=4, hybrid_fraction=0.5))])
def test_bf16_split_matches_resident_within_rounding(store: BankStore, backend: str, kw: dict) -> None:
    dev = torch.device("cpu")
    resident = make_executor("resident", store, dev, F.silu, L, 0)
    other = make_executor(backend, store, dev, F.silu, L, **kw)
    assert (other.kernel is not None) == native_kernel_available()
    for x, ids, w in routings(seed=1):
        for layer in range(L):
            want = resident.forward(layer, x, ids, w)
            got = other.forward(layer, x, ids, w)
            assert got.dtype == torch.bfloat16
            excess = (got.float() - want.float()).abs() - output_bound(store, layer, x, ids, w)
            assert (excess <= 0).all(), f"error exceeds its bound by {excess.max().item():.3g}"
    assert other.stats.snapshot()["experts_cpu"] > 0
    other.close()


def test_kernel_only_for_bf16_silu_and_threads_leave_a_core_to_the_gpu(store: BankStore) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    cores = cpu_isa.physical_cores()
    assert cpu_threads(cpu) == cores and cpu_threads(cuda) == max(1, cores - 1)
    fp32 = BankStore.allocate([0], 2, 8, 4, torch.float32)
    assert cpu_kernel_for(fp32, F.silu, cpu) is None  # torch: bitwise with the device reference
    assert cpu_kernel_for(store, F.gelu, cpu) is None  # the kernel computes SiLU experts only
    for act in (F.silu, activation("silu")):  # a test's plain function and the engine's Activation
        kernel = cpu_kernel_for(store, act, cpu)
        if native_kernel_available():
            assert kernel is not None and kernel.threads == cores
            kernel.close()
        else:
            assert kernel is None
    assert cpu_kernel_for(store, activation("gelu"), cpu) is None


def test_close_joins_the_kernel_pool(store: BankStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stats name the kernel and its pinned workers (every one of them: pinning by default,
    no other pool alive); close joins the pool and gives its cores back."""
    from edgemoe.kernels import cpu_pinning

    monkeypatch.delenv("EDGEMOE_CPU_PIN", raising=False)
    monkeypatch.delenv("EDGEMOE_CPU_THREADS", raising=False)
    monkeypatch.setattr(cpu_pinning, "_held", {})  # earlier tests' live pools aside
    ex = make_executor("cpu", store, torch.device("cpu"), F.silu, L, num_slots=K)
    x, ids, w = next(routings(seed=2))
    ex.forward(0, x, ids, w)
    snap = ex.stats.snapshot()
    assert snap["cpu_kernel"] == (ex.kernel.name if ex.kernel else "torch")
    if ex.kernel is not None and sys.platform.startswith("linux"):
        assert snap["cpu_pinned_workers"] == ex.kernel.threads - 1
    ex.close()
    if ex.kernel is not None:
        assert ex.kernel._pool is None  # em_destroy ran: no worker threads left
        assert cpu_pinning._held == {}
