"""The hybrids' arch at the real Qwen3.5-35B-A3B / Qwen3-Next-80B-A3B shapes: parameter
counts against transformers' own modules (built on the meta device), the KV and GDN state
sizes, and the memory plan that caps running requests at the state rows."""

from __future__ import annotations

import pytest
import torch

from edgemoe.engine.budget import (
    GiB,
    MiB,
    dense_weight_bytes,
    kv_bytes_per_token,
    plan_memory,
)
from edgemoe.models import qwen3_5_moe, qwen3_next
from edgemoe.models.presets import QWEN3_5_35B_A3B

transformers = pytest.importorskip("transformers")


def hf_param_count(model_cls, config) -> int:  # noqa: ANN001
    with torch.device("meta"):
        return sum(p.numel() for p in model_cls(config).parameters())


def our_param_count(arch) -> int:  # noqa: ANN001
    dense = dense_weight_bytes(arch) // arch.dtype.itemsize
    return dense + len(arch.moe_layers) * arch.store_experts * 3 * arch.hidden_size * arch.moe_intermediate_size


def test_qwen3_5_preset_matches_transformers_modules() -> None:
    arch = qwen3_5_moe.arch(QWEN3_5_35B_A3B)
    config = transformers.Qwen3_5MoeTextConfig(**{k: v for k, v in QWEN3_5_35B_A3B.items() if k != "model_type"})
    assert our_param_count(arch) == hf_param_count(transformers.Qwen3_5MoeForCausalLM, config)
    assert tuple(i for i, t in enumerate(config.layer_types) if t == "full_attention") == arch.kv_layers
    assert len(arch.gdn_layers) == 30 and arch.kv_layers == tuple(range(3, 40, 4))
    assert arch.store_experts == 257 and arch.moe_pairs == 9  # the shared expert is bank row 256
    assert arch.rope.rotary_dim == 64 and arch.rope.theta == 1e7 and arch.max_position_embeddings == 262144


def test_qwen3_next_default_config_matches_transformers_modules() -> None:
    config = transformers.Qwen3NextConfig(num_hidden_layers=8, mlp_only_layers=[2])
    arch = qwen3_next.arch(config.to_dict())
    assert our_param_count(arch) == hf_param_count(transformers.Qwen3NextForCausalLM, config)
    assert arch.moe_layers == (0, 1, 3, 4, 5, 6, 7) and arch.kv_layers == (3, 7)
    assert arch.num_experts == 512 and arch.top_k == 10 and arch.head_dim == 256


def test_multimodal_config_reads_its_text_config() -> None:
    config = transformers.Qwen3_5MoeConfig(text_config=dict(num_hidden_layers=8)).to_dict()
    arch = qwen3_5_moe.arch(config)
    assert arch.model_type == "qwen3_5_moe" and arch.checkpoint_prefix == "model.language_model."
    assert arch.num_layers == 8 and arch.vocab_size == 248320 and arch.kv_layers == (3, 7)
    assert qwen3_5_moe.arch({**config["text_config"]}).checkpoint_prefix == "model."


def test_kv_and_state_sizes_at_the_35b_shape() -> None:
    arch = qwen3_5_moe.arch(QWEN3_5_35B_A3B)
    assert kv_bytes_per_token(arch) == 2 * 10 * 2 * 256 * 2  # K and V of the 10 attention layers only
    # 30 GDN layers x (32 x 128 x 128 fp32 recurrent + 8,192 channels x 3 bf16 conv)
    assert arch.state_bytes == 30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)
    assert 61 * MiB < arch.state_bytes < 62 * MiB


def plan(arch, **kw):  # noqa: ANN001, ANN003, ANN201
    base = dict(backend="auto", moe_slots=None, kv_tokens=None, max_model_len=32768, max_prefill_tokens=2048,
                max_running=64, budget=16 * GiB, context=600 * MiB)
    return plan_memory(arch, **(base | kw))


def test_16gib_plan_caps_running_requests_at_the_state_rows() -> None:
    arch = qwen3_5_moe.arch(QWEN3_5_35B_A3B)
    p = plan(arch)
    assert p.backend == "auto" and p.total <= 16 * GiB  # the slot cache; offload or hybrid chosen live
    assert 1 <= p.max_running == p.state_rows < 64 and p.snapshot_rows == 0
    assert p.state_bytes == (p.state_rows + 1) * arch.state_bytes  # + the scratch row
    table = p.table()
    assert "GDN state" in table and "--state-slots" in table and f"max running requests: {p.max_running}" in table
    # with the prefix cache, a third of the rows are live, the rest hold snapshots
    s = plan(arch, snapshots=True)
    assert s.state_rows == p.state_rows and s.max_running == s.state_rows // 3
    assert s.snapshot_rows == s.state_rows - s.max_running and s.total <= 16 * GiB


def test_state_slots_setting_caps_and_cpu_plan_follows_running() -> None:
    arch = qwen3_5_moe.arch(QWEN3_5_35B_A3B)
    p = plan(arch, state_slots=4, max_running=8)
    assert (p.state_rows, p.max_running) == (4, 4)
    cpu = plan(arch, budget=None, max_running=8)
    assert (cpu.state_rows, cpu.max_running, cpu.running_note) == (8, 8, "")
    cpu = plan(arch, budget=None, max_running=8, snapshots=True)
    assert (cpu.state_rows, cpu.max_running, cpu.snapshot_rows) == (24, 8, 16)
    with pytest.raises(ValueError, match="--state-slots"):
        plan(arch, state_slots=400)
