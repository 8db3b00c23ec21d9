"""GPU tests: marked `gpu`, skipped without CUDA; run on the GPU machine (docs/gpu.md)."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


SMALL = dict(
    hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
    num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
)


@pytest.fixture(scope="session")
def small_ckpt(make_ckpt):  # noqa: ANN001, ANN201
    return make_ckpt("qwen3_moe", **SMALL)
