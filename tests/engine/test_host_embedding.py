"""`--embed-weights`: the token embedding kept in host memory for every model file (its rows
gathered per step: the same bits as the device table's), and `auto`'s choice: host on a GPU
whose experts don't all fit, for an untied embedding with host room, else device."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.engine.big_tables import auto_embed_on_host, check_embed_setting, embed_nbytes
from edgemoe.engine.budget import expert_nbytes
from edgemoe.layers.embedding import HostEmbedding
from edgemoe.models.presets import parse_random
from edgemoe.models.registry import MODEL_MODULES, model_module
from edgemoe.quant import expert_format

PROMPTS = [[9707, 11, 1879, 0], [(7 * i * i + 3 * i) % 150 + 100 for i in range(19)]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
CUDA = torch.device("cuda")  # a device object: nothing runs on it


def greedy(path, **settings: object) -> tuple[list[list[int]], object]:  # noqa: ANN001
    with LLM(str(path), dtype="float32", moe_backend="offload", **settings) as llm:
        embed = llm.engine.runtime.model.embed
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)], embed


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "qwen3_5_moe_text"])
def test_a_host_embedding_gives_the_device_tables_tokens(make_ckpt, model_type: str) -> None:  # noqa: ANN001
    # One model file a layout: the decoder's assemble (llama_moe) and the hybrids' (qwen_hybrid).
    path = make_ckpt(model_type, torch_dtype="float32")
    want, on_device = greedy(path, embed_weights="device")
    got, on_host = greedy(path, embed_weights="host")
    assert isinstance(on_device, torch.Tensor) and isinstance(on_host, HostEmbedding)
    assert got == want


def test_every_model_file_takes_a_host_embedding() -> None:
    for model_type, module_name in MODEL_MODULES.items():
        build = importlib.import_module(module_name).build
        assert "embed" in inspect.signature(build).parameters, model_type


def test_auto_puts_the_embedding_on_the_host_only_where_it_buys_slots() -> None:
    arch = model_module("qwen3_moe").arch(parse_random("random:qwen3-30b-a3b").config)
    need = embed_nbytes(arch)
    assert need == 151936 * 2048 * 2
    room = lambda: need  # noqa: E731 - exactly enough
    assert auto_embed_on_host("auto", arch, CUDA, "offload", room)
    assert auto_embed_on_host("auto", arch, CUDA, "auto", room)
    assert not auto_embed_on_host("auto", arch, CUDA, "resident", room)  # every expert on the device already
    assert not auto_embed_on_host("auto", arch, torch.device("cpu"), "offload", room)  # nothing to free
    assert not auto_embed_on_host("auto", arch, CUDA, "offload", lambda: need - 1)  # no host room
    assert not auto_embed_on_host("device", arch, CUDA, "offload", room)
    tied = model_module("qwen3_moe").arch({**parse_random("random:qwen3-30b-a3b").config, "tie_word_embeddings": True})
    assert not auto_embed_on_host("auto", tied, CUDA, "offload", room)  # the LM head reads it every step
    assert not check_embed_setting("auto", arch) and check_embed_setting("host", arch)
    with pytest.raises(ValueError, match="ties its embedding"):
        check_embed_setting("host", tied)
    with pytest.raises(ValueError, match="embed_weights.*auto, device, host"):
        check_embed_setting("somewhere", arch)


def test_the_room_is_asked_only_when_the_rest_holds() -> None:
    arch = model_module("qwen3_moe").arch(parse_random("random:qwen3-30b-a3b").config)

    def room() -> int:
        raise AssertionError("asked")

    assert not auto_embed_on_host("auto", arch, CUDA, "resident", room)
    assert not auto_embed_on_host("device", arch, CUDA, "offload", room)


def test_auto_on_a_cpu_keeps_the_table_where_it_was(make_ckpt) -> None:  # noqa: ANN001
    _, embed = greedy(make_ckpt("qwen3_moe", torch_dtype="float32"))
    assert isinstance(embed, torch.Tensor)


def test_the_plan_gives_the_embedding_to_slots_under_auto() -> None:
    from edgemoe.cli import build_parser
    from edgemoe.plan import plan_rows

    def slots(*flags: str) -> int:
        argv = ["plan", "--model", "random:qwen3-30b-a3b", "--gpu-memory", "16GiB", "--formats", "fp8",
                "--kv-tokens", "8192", "--pcie-gbps", "50", "--cpu-gbps", "50", "--device-gbps", "3000", *flags]
        return plan_rows(build_parser().parse_args(argv))[3][0].num_slots

    auto, device = slots(), slots("--embed-weights", "device")
    assert slots("--embed-weights", "host") == auto
    arch = model_module("qwen3_moe").arch(parse_random("random:qwen3-30b-a3b").config)
    fp8_slot = expert_nbytes(arch, expert_format("fp8"))
    assert fp8_slot == 2048 * 768 * 3 + (12 * 16 + 16 * 6) * 4  # e4m3, and a 128x128 block's fp32 scale
    assert auto - device == pytest.approx(151936 * 2048 * 2 / fp8_slot, abs=1)  # ~131 slots
