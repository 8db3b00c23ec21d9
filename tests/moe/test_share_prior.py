"""The CPU share's start-up rates (`moe/share_prior.py`): the cost law's solve from the four
shapes' times, the calls themselves on every weight format the share reads (they must run:
a bad mailbox raises), and the share taking what they measured as its prior (or keeping
its constants when they can't be read or are turned off)."""

from __future__ import annotations

import math

import pytest
import torch

from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.moe import share_prior
from edgemoe.moe.cpu_share import CpuShare, host_weights, share_rates
from edgemoe.quant import Int4Group, Int8Channel, Mxfp4
from edgemoe.testing.moe_material import quantised_store, random_bank_store


@pytest.fixture(scope="module")
def kernel():  # noqa: ANN201
    k = CpuExperts(threads=2)
    if not k.native:
        pytest.skip("no C compiler: the share needs the C kernel")
    yield k
    k.close()


def test_the_solve_recovers_a_cost_law_and_refuses_a_contradiction() -> None:
    c, a, b = 20_000.0, 300_000.0, 4_000.0
    times = [c + a * j + b * j * t for j, t in share_prior.SHAPES]
    got = share_prior.solve(times)
    assert got is not None and math.isclose(got[0], a, rel_tol=1e-9) and math.isclose(got[1], b, rel_tol=1e-9)
    assert share_prior.solve([5.0, 4.0, 6.0, 5.0]) is None  # more experts took less time: a busy machine
    assert share_prior.solve([5.0, 9.0, 4.0, 8.0]) is None  # more tokens took less time
    # A disturbed first call: the fit's fixed part is most of the smallest call (GPU machine, a fresh VM)
    assert share_prior.solve([400_000.0, 404_000.0, 450_000.0, 500_000.0]) is None


@pytest.mark.parametrize("fmt", [None, Int8Channel(), Int4Group(32), Mxfp4()], ids=["bf16", "int8", "int4", "mxfp4"])
def test_the_calls_run_on_every_format(kernel: CpuExperts, fmt) -> None:  # noqa: ANN001
    store = random_bank_store(2, 16, 64, 32, torch.bfloat16)
    if fmt is not None:
        store = quantised_store(store, fmt)
    times = share_prior.measure_times(store, host_weights(store), kernel)  # raises if a call fails
    assert times is not None and len(times) == len(share_prior.SHAPES) and all(t > 0 for t in times)
    got = share_prior.solve(times)
    assert got is None or (got[0] > 0 and got[1] > 0 and all(math.isfinite(v) for v in got))


def test_the_solve_refuses_a_shape_off_the_law() -> None:
    c, a, b = 20_000.0, 300_000.0, 4_000.0
    times = [c + a * j + b * j * t for j, t in share_prior.SHAPES]
    times[-1] *= 4  # one shape disturbed (seen on the GPU machine: 5.3 ms where the law says 1.3)
    assert share_prior.solve(times) is None


def share_with_prompt_rule(store, kernel: CpuExperts) -> CpuShare:  # noqa: ANN001
    return CpuShare(store, kernel, 2, 0, torch.device("cpu"), rows=2, prompt_rows=32)


def test_the_share_takes_the_measured_prior(kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch) -> None:
    store = random_bank_store(2, 16, 64, 32, torch.bfloat16)
    constants = share_rates(store, host_weights(store))
    law = [20_000.0 + 123_456.0 * j + 789.0 * j * t for j, t in share_prior.SHAPES]
    monkeypatch.setattr(share_prior, "measure_times", lambda *_: law)
    share = share_with_prompt_rule(store, kernel)
    assert share.rate_ns == constants  # built: not measured yet (the engine measures once it is built)
    share.measure_prior()
    assert share.rate_ns == [123_456, 789, *constants[2:]] and share.rates.tolist() == share.rate_ns
    assert share.prior_times_ns == law  # in the stats: what the prior was read off
    assert share._prior == (123_456.0, 789.0)  # what the fit leans on until prompt chunks correct it
    for unreadable in (None, [5.0, 4.0, 6.0, 5.0]):  # too small a store; contradicting times: the constants
        monkeypatch.setattr(share_prior, "measure_times", lambda *_, t=unreadable: t)
        share = share_with_prompt_rule(store, kernel)
        share.measure_prior()
        assert share.rate_ns == constants and share.rates.tolist() == constants
    monkeypatch.setattr(share_prior, "measure_times", lambda *_: pytest.fail("measured without a prompt rule"))
    CpuShare(store, kernel, 2, 0, torch.device("cpu")).measure_prior()  # decode steps only: no rates to measure
    monkeypatch.setenv("EDGEMOE_SHARE_PRIOR", "0")
    share = share_with_prompt_rule(store, kernel)
    share.measure_prior()
    assert share.rate_ns == constants


def test_the_gemm_cost_can_be_replaced_for_an_ab(monkeypatch: pytest.MonkeyPatch) -> None:
    store = random_bank_store(2, 16, 64, 32, torch.bfloat16)
    assert share_rates(store, host_weights(store))[3] == 0  # the default: not counted (docs/offload.md)
    monkeypatch.setenv("EDGEMOE_SHARE_GEMM_NS", "12000")
    assert share_rates(store, host_weights(store))[3] == 12000
    for bad in ("x", "-5", "1.5"):  # "x" was int()'s message, naming no variable; -5 a negative cost
        monkeypatch.setenv("EDGEMOE_SHARE_GEMM_NS", bad)
        with pytest.raises(ValueError, match="EDGEMOE_SHARE_GEMM_NS"):
            share_rates(store, host_weights(store))
