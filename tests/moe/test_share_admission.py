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
from edgemoe.moe.share_admission import admission_lag

from cpu_share_support import CPU, E, K, L, Heat, cpu_experts_of, expected, routings, store_of



def hybrid(store, slots: int, kernel: CpuExperts, lag: int, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
           mover: str = "gather") -> DeviceOffloadExecutor:
    """The share at 2 experts a layer, its picks loaded `lag` layers ahead of their join (0: not loaded)."""
    monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", str(int(lag)))
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


@pytest.mark.parametrize("kind,slots,lag", [("bf16", 5, 1), ("int8", 6, 1), ("int4", 4, 1), ("bf16", 12, 1),
                                            ("bf16", 12, 2), ("int4", 9, 3)])
def test_picks_load_after_their_layer_and_compute_bitwise(kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch,
                                                          kind: str, slots: int, lag: int) -> None:
    store = store_of(kind)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    admitted = hybrid(store, slots, kernel, lag, monkeypatch)
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


def test_the_setting_is_off_or_a_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEMOE_SHARE_ADMIT", raising=False)
    assert admission_lag() == 0
    for raw, want in (("0", 0), ("1", 1), ("3", 3), ("8", 8)):
        monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", raw)
        assert admission_lag() == want
    for raw in ("yes", "9", "-1", "1.5", ""):
        monkeypatch.setenv("EDGEMOE_SHARE_ADMIT", raw)
        with pytest.raises(ValueError, match=f"EDGEMOE_SHARE_ADMIT={raw!r}: 0 \\(off\\) or the MoE layers"):
            admission_lag()


def slots_of(mask: torch.Tensor) -> set[int]:
    return {int(v) for v in mask.nonzero().flatten()}


@pytest.mark.parametrize("lag", [1, 2])
def test_every_plan_pins_the_last_lists_until_the_step_ends(kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch,
                                                             lag: int) -> None:
    """After a layer loads its picks, every later plan of the step is handed the slots of the
    last `lag` lists (a bound of `lag` layers' most experts) and the join waits `lag` layers
    (the last layer at most); the last layer joins every load and empties the mask."""
    store = store_of("bf16")
    ex = hybrid(store, 6, kernel, lag, monkeypatch)
    ids = torch.tensor([[0, 1]], dtype=torch.int32)
    x, w = torch.randn(1, 32).to(torch.bfloat16), torch.tensor([[0.5, 0.5]])
    ex.cpu_share.quota.fill_(E)  # every miss on the CPU: both experts of each layer loaded after it
    admission = ex.admission
    assert admission.join_layer == {0: min(lag, 2), 1: 2} and admission.covers(1) and not admission.covers(2)
    ex.forward(0, x, ids, w)
    first = {int(s) for s in ex.cache.slot_map[0][[0, 1]]}
    pins, bound = admission.pins(1, 1)
    assert bound == 2 * lag and slots_of(pins) == first
    ex.forward(1, x, ids, w)  # lag 1: joins layer 0's load, whose list leaves the mask when its buffer takes 1's
    second = {int(s) for s in ex.cache.slot_map[1][[0, 1]]}
    assert slots_of(admission.pins(2, 1)[0]) == (second if lag == 1 else first | second)
    assert list(admission.side._pending) == [2]
    ex.forward(2, x, ids, w)  # the last layer: joins all, loads nothing
    assert not admission.union.any() and not admission.side._pending
    assert bool((admission.side.ring(slice(None)) == -1).all())  # no list left to clear into the next step
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
