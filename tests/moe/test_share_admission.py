"""The CPU share's picks loaded after their layer (moe/share_admission.py,
`EDGEMOE_SHARE_ADMIT=1`) on CPU tensors, where the side copy is the stream's own: every
layer's output stays bitwise what its pieces give computed apart (so a loaded slot holds
its expert's exact weights: later steps hit it), every pick of a layer but the last is in
the cache after it, they are counted, and a skewed routing's CPU experts fall."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.moe.share_admission import admission_wanted

from cpu_share_support import CPU, E, K, L, Heat, cpu_experts_of, expected, routings, store_of



def hybrid(store, slots: int, kernel: CpuExperts, admit: bool, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
           mover: str = "gather") -> DeviceOffloadExecutor:
    monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", "1" if admit else "0")
    ex = DeviceOffloadExecutor(store, CPU, F.silu, L, slots, mover, cpu_experts_per_layer=2, cpu_kernel=kernel, top_k=K)
    ex.cpu_share.rows = 4  # steps of 7 and 16 tokens run every miss on the device (and load nothing after)
    return ex


def run(ex: DeviceOffloadExecutor, store, kernel: CpuExperts, dtype: torch.dtype,  # noqa: ANN001
        rows: int = 16) -> tuple[int, int]:
    """Every step of the trace of at most `rows` token rows through `ex`, each layer checked
    against its pieces computed apart; returns (CPU experts, the picks loaded: of layers but
    the last, in steps small enough to plan beside a load in flight)."""
    heat, num_cpu, loadable = Heat(), 0, 0
    for x, ids, w in routings(seed=7, dtype=dtype, steps=60):
        if x.shape[0] > rows:
            continue
        shared = x.shape[0] <= ex.cpu_share.rows
        for layer in range(L):
            on_cpu = cpu_experts_of(ex.cache.slot_map[layer], ids, 2 if shared else 0, heat.heat[layer])
            if shared:
                heat.update(layer, ids)
            got = ex.forward(layer, x, ids, w)
            assert torch.equal(got, expected(store, layer, x, ids, w, on_cpu, kernel)), (layer, on_cpu)
            resident = ex.cache.slot_map[layer][on_cpu] >= 0
            loads = ex.admission is not None and ex.admission.covers(x.shape[0]) and layer < L - 1
            if loads:
                assert bool(resident.all()), (layer, on_cpu)  # loaded after the layer
                loadable += len(on_cpu)
            else:
                assert not bool(resident.any()), (layer, on_cpu)  # the share's admission filter alone
            num_cpu += len(on_cpu)
    return num_cpu, loadable


@pytest.mark.parametrize("kind,slots", [("bf16", 5), ("int8", 6), ("int4", 4), ("bf16", 12)])
def test_picks_load_after_their_layer_and_compute_bitwise(kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch,
                                                          kind: str, slots: int) -> None:
    store = store_of(kind)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    admitted = hybrid(store, slots, kernel, True, monkeypatch)
    assert admitted.admission is not None
    num_cpu, loadable = run(admitted, store, kernel, dtype)
    assert loadable > 0
    info = admitted.stats.snapshot()
    assert info["share_admitted"] == loadable and info["experts_cpu"] == num_cpu
    admitted.close()


def test_loaded_picks_are_hits_later(kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode steps with every miss on the CPU (a quota of top-k): without loading, the cache
    never holds an expert and nothing hits; loaded after their layer, the picks are routed
    again while they hold their slots, and fewer experts run on the CPU."""
    store = store_of("bf16")
    got = {}
    for admit in (True, False):
        ex = hybrid(store, 12, kernel, admit, monkeypatch)
        num_cpu, _ = run(ex, store, kernel, torch.bfloat16, rows=1)
        info = ex.stats.snapshot()
        got[admit] = (num_cpu, info["hits"], info["misses"] - info.get("share_admitted", 0))
        assert int(ex._misses_so_far()) == got[admit][2]  # what the live quota's informed start counts
        ex.close()
    assert got[False][1] == 0 and got[True][1] > 0
    assert got[True][0] < got[False][0]
    assert got[True][2] < got[False][2]  # the routing's misses, the loads' copies left out


def test_a_copy_engine_mover_or_no_share_loads_nothing(kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_of("bf16")
    assert hybrid(store, 4, kernel, True, monkeypatch, mover="copy").admission is None  # no side stream to copy on
    monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", "1")
    assert DeviceOffloadExecutor(store, CPU, F.silu, L, 4).admission is None  # offload: no share


def test_the_setting_is_0_or_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEMOE_SHARE_ADMIT", raising=False)
    assert admission_wanted() is False
    for raw, want in (("0", False), ("1", True)):
        monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", raw)
        assert admission_wanted() is want
    monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", "yes")
    with pytest.raises(ValueError, match="EDGEMOE_SHARE_ADMIT='yes': 0 or 1"):
        admission_wanted()


def test_pins_name_the_slots_in_flight_until_joined(kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a layer loads its picks, the next layer's plan is handed their slots (a bound of
    a layer's most experts with them); once that layer joined, nothing is pinned."""
    store = store_of("bf16")
    ex = hybrid(store, 6, kernel, True, monkeypatch)
    ids = torch.tensor([[0, 1]], dtype=torch.int32)
    x, w = torch.randn(1, 32).to(torch.bfloat16), torch.tensor([[0.5, 0.5]])
    ex.cpu_share.quota.fill_(E)  # every miss on the CPU: both experts of layer 0 loaded after it
    ex.forward(0, x, ids, w)
    admission = ex.admission
    pins, bound = admission.pins(1, 1)
    assert bound == 2 and pins is not None
    assert torch.equal(pins.nonzero().flatten().sort().values, ex.cache.slot_map[0][[0, 1]].long().sort().values)
    ex.forward(1, x, ids, w)  # joins layer 0's load; loads its own for layer 2
    assert admission.pins(1, 1) == (None, 0) and admission.pins(2, 1)[0] is not None
    ex.forward(2, x, ids, w)  # the last layer: joins, loads nothing
    assert all(admission.pins(layer, 1) == (None, 0) for layer in range(L))
    assert bool((ex.cache.slot_map[2][[0, 1]] < 0).all())
    ex.close()


def test_prefetch_takes_the_side_stream(kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """One side gather at a time: decode prefetch switches the loads off, and says so."""
    ex = hybrid(store_of("bf16"), 6, kernel, True, monkeypatch)

    class Nothing:  # a predictor that predicts no expert
        label = "none"

        def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            return like

    with caplog.at_level("WARNING"):
        ex.enable_prefetch(Nothing(), K)
    assert ex.admission is None and ex.prefetch is not None
    assert any("EDGEMOE_SHARE_ADMIT" in r.getMessage() for r in caplog.records)
    ex.close()
