"""scripts/gpu_kernel_profile.py's `quotas=`: a fixed CPU share's pick set between profiles,
either experts a layer (quarters allowed) or a share of each layer's own misses ("13/16",
the live share's rule) — written into the share's quota rows and fraction as the executor
would (CPU: no profile is taken here)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from edgemoe.kernels.share_state import FRACTION_ONE
from edgemoe.moe.quota_levels import quota_rows

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_kernel_profile.py"


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("EDGEMOE_PDL", os.environ.get("EDGEMOE_PDL", "0"))  # the import's setdefault, undone after
    spec = importlib.util.spec_from_file_location("gpu_kernel_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def engine_with_share(layers: int = 6, experts: int = 16) -> SimpleNamespace:
    share = SimpleNamespace(quota=torch.zeros(layers, dtype=torch.int64), fraction=torch.tensor(FRACTION_ONE),
                            num_experts=experts)
    return SimpleNamespace(runtime=SimpleNamespace(executor=SimpleNamespace(cpu_share=share)))


def test_quotas_by_count_and_by_fraction(script) -> None:  # noqa: ANN001
    batch, prompt, _, quotas, settings, tag, _, env = script.parse_args(
        ["x", "1", "1024", "moe_backend=hybrid", "cpu_experts_per_layer=2", "quotas=1.5,13/16,2",
         "EDGEMOE_PREFETCH_PROGRAMS=64"])
    assert (batch, prompt, quotas) == (1, 1024, ["1.5", "13/16", "2"]) and settings["cpu_experts_per_layer"] == 2
    assert env == {"EDGEMOE_PREFETCH_PROGRAMS": "64"} and "EDGEMOE_PREFETCH_PROGRAMS" not in settings  # the environment's
    assert "_EDGEMOE_PREFETCH_PROGRAMS-64" in tag  # and named in the file
    engine = engine_with_share()
    share = engine.runtime.executor.cpu_share
    script.set_quota(engine, "13/16")
    assert share.quota.tolist() == [16] * 6 and int(share.fraction) == 13
    script.set_quota(engine, "1.5")  # back to a count: the whole of each layer's misses may go
    assert share.quota.tolist() == quota_rows(6, 6) and int(share.fraction) == FRACTION_ONE
    script.set_quota(engine, "1/2")
    assert int(share.fraction) == 8


def kernel(name: str, stream: int, start: float, end: float) -> SimpleNamespace:
    return SimpleNamespace(name=name, device_resource_id=stream, device_type=torch.autograd.DeviceType.CUDA,
                           time_range=SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start))


def test_a_side_streams_copies_are_apart_from_the_steps_gaps(script, monkeypatch) -> None:  # noqa: ANN001
    """Kernels of other streams (a side stream's copies, spread by a graph's replay over
    streams of its own) overlap the step's own stream: the gaps are the step's stream's
    alone, and the other streams' time is counted together, apart."""
    monkeypatch.setattr(script, "STEPS", 1)
    step = [kernel("attn", 7, 0, 10), kernel("gemv", 7, 30, 40), kernel("gemv", 7, 40, 45)]
    side = [kernel("gather", 9, 12, 28), kernel("gather", 11, 46, 50)]  # inside the step's gap: not what it ran next
    gaps = script.idle_before(step + side)
    assert dict(gaps) == {"gemv": [20.0, 1]}
    table = script.stream_table([step + side])
    assert [(r["streams"], r["us_per_step"], r["calls_per_step"]) for r in table] == [
        ("the step's stream", 25.0, 3), ("2 other streams", 20.0, 2)]
    assert table[1]["top"] == [{"kernel": "gather", "us_per_step": 20.0, "us_per_call": 10.0}]


def test_the_device_waits_only_where_no_stream_runs(script, monkeypatch) -> None:  # noqa: ANN001
    """A forked graph: the side stream's gap while the chain runs is not the device's; the
    device's gaps (no kernel on any stream) go to the kernel that ended each."""
    monkeypatch.setattr(script, "STEPS", 1)
    chain = [kernel("attn", 7, 0, 10), kernel("gemv", 7, 12, 40), kernel("route", 7, 55, 60)]
    side = [kernel("gather", 9, 5, 20), kernel("gather", 9, 45, 50)]  # waits 20..45 beside the chain's 12..40
    assert dict(script.device_idle_before(chain + side)) == {"gather": [5.0, 1], "route": [5.0, 1]}
    assert dict(script.idle_before(side + [kernel("gather", 9, 60, 70)])) == {"gather": [35.0, 2]}
