"""`random:qwen3.8-flash-next`: the reductions docs/benchmarks.md states (real widths; 24 of
40 layers so bf16 experts fit the GPU machine's RAM; PLE tables under 16 GiB), and the tiny
preset serving the same tokens with its tables written to disk by the seeded writer."""

from __future__ import annotations

from pathlib import Path

from edgemoe import LLM, SamplingParams
from edgemoe.engine.budget import GiB, expert_nbytes
from edgemoe.models.presets import parse_random
from edgemoe.models.registry import model_module


def test_flash_next_preset_has_the_documented_shape() -> None:
    spec = parse_random("random:qwen3.8-flash-next")
    a = model_module(spec.config["model_type"]).arch(spec.config)
    assert (a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim, a.vocab_size) == (2048, 16, 2, 256, 248320)
    assert (a.num_experts, a.top_k, a.moe_intermediate_size, a.store_experts) == (512, 10, 512, 513)
    assert (a.hc_count, a.hc_lowrank, a.rope.rotary_dim) == (4, 320, 64)
    assert (a.num_layers, len(a.gdn_layers), len(a.kv_layers), a.ple_layers) == (24, 18, 6, (1, 9, 17))
    assert (a.ple.heads, a.ple.head_dim, a.qsa.budget, a.qsa.ratio) == (16, 32, 2048, 4)
    assert 14 * GiB < a.ple.table_nbytes(2) <= 16 * GiB
    assert len(a.moe_layers) * a.store_experts * expert_nbytes(a) <= 80 * GiB


def test_tiny_preset_tokens_equal_from_device_and_disk_tables(tmp_path: Path) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompts = [[1, 2, 3, 248046, 4, 5, *range(100, 124)]]  # an EOS, then past the QSA budget of 16
    out = []
    for store in ("device", "disk"):
        with LLM("random:tiny-qwen3.8-flash-next", dtype="float32", ple_store=store, ple_dir=str(tmp_path)) as llm:
            out.append([o.token_ids for o in llm.generate(prompts, greedy)])
    assert out[0] == out[1] and all(len(t) == 4 for t in out[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ple.0.bin", "ple.0.json", "ple.1.bin", "ple.1.json"]
