"""The host memory plan: rows, the refusal's wording, and the 48-layer preset on a 24 GB host."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

import edgemoe
from edgemoe.engine.budget import GiB, PlanError, plan_memory
from edgemoe.engine.host_budget import HostRow, host_budget, mem_available, plan_host
from edgemoe.models.presets import parse_random
from edgemoe.models.registry import model_module

# Qwen3-30B-A3B in bf16, counted by hand from the published shape (not by our code):
EXPERTS = 48 * 128 * 3 * 2048 * 768 * 2  # 57.98 GB = 54.00 GiB
PER_LAYER = ((4096 + 2 * 512) * 2048 + 2048 * 4096 + 128 * 2048 + 2 * 2048 + 2 * 128) * 2  # qkv, o, router, norms
DENSE = 2 * 151936 * 2048 * 2 + 48 * PER_LAYER + 2048 * 2  # embed + lm_head, layers, final norm: 3.08 GB


def _arch(spec: str = "random:qwen3-30b-a3b"):  # noqa: ANN202
    return model_module("qwen3_moe").arch(parse_random(spec).config)


def test_a_plan_that_fits_lists_its_rows() -> None:
    plan = plan_host(_arch(), expert_store="pinned", available=80 * GiB, source="--host-memory",
                     extra=(HostRow("host KV tier", 2 * GiB),))
    plan.check()
    assert [r.nbytes for r in plan.rows] == [EXPERTS, DENSE, 2 * GiB]
    table = plan.table()
    assert "expert store (pinned)" in table and "host KV tier" in table and "available (--host-memory)" in table
    mmap = plan_host(_arch(), expert_store="mmap", available=4 * GiB, source="MemAvailable")
    mmap.check()  # mapped experts are the page cache's, not ours
    assert mmap.total == DENSE


def test_the_48_layer_preset_is_refused_on_a_24_gb_host_with_the_numbers() -> None:
    plan = plan_host(_arch(), expert_store="pinned", available=24 * GiB, source="MemAvailable")
    need = (EXPERTS + DENSE) / GiB  # 56.87 GiB
    assert f"{need:.2f}" == "56.87"
    with pytest.raises(PlanError) as err:
        plan.check()
    assert str(err.value) == (
        f"the model needs {need:.2f} GiB of host memory (expert store {EXPERTS / GiB:.2f} + dense weights "
        f"{DENSE / GiB:.2f} GiB) but 24.00 GiB is available (MemAvailable): raise host_memory (--host-memory) "
        "if the machine has more to give"
    )


def test_llm_refuses_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_weights(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights were allocated before the host plan refused")

    monkeypatch.setattr("edgemoe.models.random_weights.materialise", no_weights)
    with pytest.raises(PlanError, match=r"needs \d+\.\d\d GiB .* 24\.00 GiB is available \(--host-memory\).*num_hidden_layers"):
        edgemoe.LLM(model="random:qwen3-30b-a3b", host_memory="24GiB", dtype="bfloat16")


@pytest.mark.skipif(mem_available() > (EXPERTS + DENSE), reason="this host has room for the whole model")
def test_default_budget_is_what_the_os_reports() -> None:
    available, source = host_budget(None)
    assert source == "MemAvailable" and 0 < available <= mem_available() * 1.1  # it moves a little
    with pytest.raises(PlanError, match=r"\(MemAvailable\)"):
        plan_host(_arch(), expert_store="ram", available=available, source=source).check()


def test_cpu_device_rows_and_settings(tmp_path: Path) -> None:
    arch = replace(_arch("random:tiny-qwen3-moe"), dtype=torch.float32)
    device = plan_memory(arch, backend="offload", moe_slots=4, kv_tokens=1000, max_model_len=4096,
                         max_prefill_tokens=256, max_running=4, budget=None)
    plan = plan_host(arch, expert_store="ram", available=GiB, source="MemAvailable", device_plan=device)
    names = [r.name for r in plan.rows]
    assert names == ["expert store", "dense weights", "expert slots", "KV cache", "workspace"]
    assert plan.rows[3].nbytes == 1000 * 2 * 2 * 2 * 16 * 4  # tokens x (k, v) x layers x kv heads x head_dim x fp32
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683584 kB\nMemAvailable:   23220604 kB\n")
    assert mem_available(meminfo) == 23220604 * 1024
    assert host_budget("1.5GiB") == (int(1.5 * GiB), "--host-memory")
    with pytest.raises(ValueError, match=r"host_memory \(--host-memory\): cannot parse size 'lots'"):
        host_budget("lots")
