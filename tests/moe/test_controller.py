"""The live hybrid controller against a simulated machine: true per-expert costs with
noise, device timings that resolve a few layers late (as CUDA events do), start-up rates
that may be wrong. Checked against the pure strategies and an oracle that knows the
true costs (computed here independently, by brute force over every split)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import numpy as np
import pytest

from edgemoe.moe.controller import PROBE_AFTER, LinearCost, Rates, SplitController

EXPERT_BYTES = 9_437_184  # one Qwen3-30B-A3B expert in bf16


@dataclass(frozen=True)
class Machine:
    """True costs, seconds: device g0 + g1·copies; CPU c0 + c1·experts + c2·tokens."""

    g0: float = 30e-6
    g1: float = 180e-6  # 52 GB/s copies
    c0: float = 60e-6
    c1: float = 150e-6  # 63 GB/s CPU experts
    c2: float = 2e-6

    def device(self, copies: int) -> float:
        return self.g0 + self.g1 * copies

    def cpu(self, experts: int, tokens: int) -> float:
        return self.c0 + self.c1 * experts + self.c2 * tokens if experts else 0.0

    def rates(self, scale_copy: float = 1.0, scale_cpu: float = 1.0) -> Rates:
        """What a start-up probe would report, off by the given factors."""
        return Rates(copy_s=self.g1 * scale_copy, cpu_s=(self.c1 + self.c2) * scale_cpu,
                     cpu_token_s=self.c2 * scale_cpu, cpu_call_s=self.c0 * scale_cpu, device_fixed_s=self.g0)

    def best(self, tokens: list[int]) -> float:
        """Oracle: the fastest split of these misses, trying every subset size with the
        fewest-token misses on the CPU (the CPU's cost grows with tokens)."""
        t = sorted(tokens)
        return min(max(self.device(len(t) - n), self.cpu(n, sum(t[:n]))) for n in range(len(t) + 1))


class LateTiming:
    """A device interval whose result shows only after `delay` later layers."""

    def __init__(self, seconds: float, clock: list[int], delay: int = 3) -> None:
        self.seconds, self.clock, self.ready_at = seconds, clock, clock[0] + delay

    def query(self) -> float | None:
        return self.seconds if self.clock[0] >= self.ready_at else None


def workload(layers: int, seed: int, prefill: bool = False) -> list[list[int]]:
    """Misses per layer as token counts: decode (batch 1: 0-8 one-token misses) or
    prefill-like (many experts, 1-300 tokens each)."""
    rng = random.Random(seed)
    if prefill:
        return [[rng.randint(1, 300) for _ in range(rng.randint(20, 60))] for _ in range(layers)]
    return [[1] * sum(rng.random() < 0.8 for _ in range(8)) for _ in range(layers)]


def simulate(ctl: SplitController, machines: list[Machine], loads: list[list[int]], seed: int = 0,
             noise: float = 0.1) -> dict[str, object]:
    """Run the controller over `loads`; machines[i * len(machines) // len(loads)] is the
    truth at layer i (a change mid-run). Returns total times and the splits."""
    rng = np.random.default_rng(seed)
    clock, total, splits = [0], 0.0, []
    pure = {"offload": 0.0, "cpu": 0.0, "oracle": 0.0}
    for i, tokens in enumerate(loads):
        m = machines[i * len(machines) // len(loads)]
        s = ctl.split(tokens)
        cpu_tokens = sum(tokens[j] for j in s.order[: s.cpu])
        jitter = rng.lognormal(0, noise, 2)
        dev = m.device(len(tokens) - s.cpu + s.admit) * jitter[0]
        cpu = m.cpu(s.cpu, cpu_tokens) * jitter[1]
        ctl.observe_cpu(s.cpu, cpu_tokens, cpu)
        ctl.observe_device(len(tokens) - s.cpu + s.admit, LateTiming(dev, clock))
        total += max(dev, cpu)
        pure["offload"] += m.device(len(tokens))
        pure["cpu"] += max(m.device(0), m.cpu(len(tokens), sum(tokens)))
        pure["oracle"] += m.best(tokens)
        splits.append(s)
        clock[0] += 1
    return {"total": total, "splits": splits, **pure}


def test_linear_cost_recovers_a_linear_law() -> None:
    # noise-free observations of 3e-5 + 2e-4·n + 4e-6·t: least squares on all of them is exact
    truth = np.array([3e-5, 2e-4, 4e-6])
    cost = LinearCost([1e-4, 5e-4, 1e-5], forget=1.0)  # every prior off by 2.5-3x
    rng = random.Random(0)
    for _ in range(400):
        phi = (1.0, rng.randint(1, 8), rng.randint(1, 200))
        cost.update(phi, float(truth @ phi))
    for phi in [(1.0, 1, 1), (1.0, 8, 200), (1.0, 4, 30)]:
        assert cost.predict(phi) == pytest.approx(float(truth @ phi), rel=0.02)


SCENARIOS = {
    "balanced": Machine(),
    "slow-cpu": Machine(c1=3e-3),  # a laptop core or a busy host: 3 ms an expert
    "slow-copies": Machine(g1=800e-6),  # PCIe 3 x8: ~12 GB/s
    "fast-cpu": Machine(c1=60e-6),
}


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("prefill", [False, True], ids=["decode", "prefill"])
def test_never_worse_than_the_better_pure_strategy(name: str, prefill: bool) -> None:
    m = SCENARIOS[name]
    loads = workload(3000 if not prefill else 600, seed=1, prefill=prefill)
    for scale in (1 / 3, 1.0, 3.0):  # start-up rates right, or off by 3x either way
        result = simulate(SplitController(m.rates(scale, 1 / scale)), [m], loads)
        better = min(result["offload"], result["cpu"])
        assert result["total"] <= 1.05 * better, (name, scale, result["total"] / better)


def test_a_slow_cpu_gets_nothing_but_rare_paid_probes() -> None:
    m = SCENARIOS["slow-cpu"]
    result = simulate(SplitController(m.rates()), [m], workload(3000, seed=2))
    chosen = [s.cpu for s in result["splits"] if not s.probe]
    assert sum(chosen) == 0
    probes = sum(s.probe for s in result["splits"])
    assert 0 < probes <= 3000 / PROBE_AFTER  # it keeps checking, never more than once per PROBE_AFTER layers
    assert result["total"] <= 1.01 * result["offload"] * 1.02  # probes cost ≤ 1% (+ the 10% noise's mean)


def test_slow_copies_send_more_to_the_cpu() -> None:
    loads = workload(2000, seed=3)
    share = {}
    for name in ("balanced", "slow-copies"):
        m = SCENARIOS[name]
        splits = simulate(SplitController(m.rates()), [m], loads)["splits"]
        share[name] = sum(s.cpu for s in splits) / sum(len(t) for t in loads)
    assert 0.2 < share["balanced"] < 0.8 and share["slow-copies"] > share["balanced"] + 0.15


def test_converges_to_the_oracle_split_from_wrong_rates() -> None:
    m = SCENARIOS["balanced"]
    loads = workload(3000, seed=4)
    ctl = SplitController(m.rates(3.0, 1 / 3))
    result = simulate(ctl, [m], loads, noise=0.05)
    tail = range(2000, 3000)
    oracle_n = [_oracle_n(m, loads[i]) for i in tail]
    agree = np.mean([abs(result["splits"][i].cpu - n) <= 1 for i, n in zip(tail, oracle_n, strict=True)])
    assert agree >= 0.9
    # the learnt costs at the operating point (4 copies, 2 one-token CPU experts)
    assert ctl.device.predict((1.0, 4)) == pytest.approx(m.device(4), rel=0.1)
    assert ctl.cpu.predict((1.0, 2, 2)) == pytest.approx(m.cpu(2, 2), rel=0.1)


def _oracle_n(m: Machine, tokens: list[int]) -> int:
    t = sorted(tokens)
    times = [max(m.device(len(t) - n), m.cpu(n, sum(t[:n]))) for n in range(len(t) + 1)]
    return int(np.argmin(times))


def test_auto_picks_by_the_rates_and_switches_when_they_change(caplog) -> None:  # noqa: ANN001
    with caplog.at_level(logging.WARNING, logger="edgemoe.moe.controller"):
        fast = SplitController(SCENARIOS["balanced"].rates(), mode="auto")
        assert fast.decide_initial(6, EXPERT_BYTES) == "hybrid"
        slow = SplitController(SCENARIOS["slow-cpu"].rates(), mode="auto")
        assert slow.decide_initial(6, EXPERT_BYTES) == "offload"
    start = [r.getMessage() for r in caplog.records]
    assert len(start) == 2 and "hybrid:" in start[0] and "offload:" in start[1] and "GB/s" in start[0]
    caplog.clear()
    # the CPU becomes slow half-way (another job took the cores): auto falls back to offload
    loads = workload(4000, seed=5)
    with caplog.at_level(logging.WARNING, logger="edgemoe.moe.controller"):
        result = simulate(fast, [SCENARIOS["balanced"], SCENARIOS["slow-cpu"]], loads)
    switches = [r.getMessage() for r in caplog.records]
    assert fast.choice == "offload" and any("switching to offload" in s for s in switches)
    assert len(switches) <= 3  # hysteresis: no flapping
    late = [s.cpu for s in result["splits"][3000:] if not s.probe]
    assert sum(late) == 0
    assert result["total"] <= 1.05 * min(result["offload"], result["cpu"])


def test_auto_offload_reads_no_activations_until_a_probe_is_due() -> None:
    ctl = SplitController(SCENARIOS["slow-cpu"].rates(), mode="auto")
    ctl.decide_initial(6, EXPERT_BYTES)
    wants = []
    for tokens in workload(400, seed=6):
        wants.append(ctl.wants_cpu())
        ctl.split(tokens, have_x=wants[-1])
    assert 0 < sum(wants) <= 400 / PROBE_AFTER


def test_device_timings_fold_in_lazily_in_order() -> None:
    ctl = SplitController(Machine().rates())
    clock = [0]
    before = ctl.device.predict((1.0, 3))
    ctl.observe_device(3, LateTiming(10 * before, clock, delay=2))
    ctl.split([1, 1, 1])
    assert ctl.device.observations == 0  # not resolved yet: never waited for
    clock[0] = 2
    ctl.split([1, 1, 1])
    assert ctl.device.observations == 1 and ctl.device.predict((1.0, 3)) > before
