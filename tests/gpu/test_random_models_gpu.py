"""Random presets on the GPU machine: expert banks page-locked in place (no copy) and
unlocked on close; the full 48-layer random:qwen3-30b-a3b loads (opt-in, `-m slow -s`
prints its load time)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.models.presets import parse_random
from edgemoe.models.random_weights import materialise
from edgemoe.models.registry import model_module
from edgemoe.moe.pinning import CudaRegistrar


def test_banks_are_pinned_in_place_and_unpinned_on_close() -> None:
    spec = parse_random("random:qwen3-30b-a3b?num_hidden_layers=2")
    arch = model_module("qwen3_moe").arch(spec.config)
    t0 = time.perf_counter()
    m = materialise(arch, spec.config, registrar=CudaRegistrar(torch.device("cuda", torch.cuda.current_device())))
    seconds = time.perf_counter() - t0
    banks = [m.experts.banks[layer] for layer in m.experts.layers]
    ptrs = [b.gate_up.data_ptr() for b in banks]
    assert m.experts.pinned and all(b.gate_up.is_pinned() and b.down.is_pinned() for b in banks)
    # An async copy from a registered bank lands intact.
    dev = banks[1].gate_up[7].to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), banks[1].gate_up[7])
    m.experts.close()
    assert not any(b.gate_up.is_pinned() for b in banks)
    assert [b.gate_up.data_ptr() for b in banks] == ptrs  # registered where they lay: no copies
    print(f"\n2 layers ({m.experts.nbytes() / 1e9:.2f} GB of experts) filled and pinned in {seconds:.2f} s")


@pytest.mark.slow
def test_full_preset_loads_at_48_layers_and_decodes(caplog: pytest.LogCaptureFixture) -> None:
    """~61 GB of host RAM: the whole Qwen3-30B-A3B shape under a 16 GiB device cap."""
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING), LLM(
        model="random:qwen3-30b-a3b", device="cuda", gpu_memory="16GiB", kv_tokens=8192
    ) as llm:
        load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        out = llm.generate([list(range(1000, 1064))], SamplingParams(max_tokens=8, ignore_eos=True))
        assert len(out[0].token_ids) == 8
        generate_s = time.perf_counter() - t1
        backend = llm.engine.runtime.plan.backend
    fill = [r.getMessage() for r in caplog.records if r.getMessage().startswith("random weights")]
    assert len(fill) == 1 and "experts pinned in place" in fill[0], fill
    result = {"build_s": round(load_s, 2), "materialise": fill[0], "first_generate_s": round(generate_s, 2),
              "backend": backend}
    print("\n" + json.dumps(result))
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "random_qwen3_30b_load.json").write_text(json.dumps(result) + "\n")
