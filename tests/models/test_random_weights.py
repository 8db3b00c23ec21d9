"""Random presets: seeded tiled weights at the configured shapes, pinned in place through
a registrar, and the same engine path as a checkpoint holding those weights."""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import edgemoe
from edgemoe.assets.model_files import write_model_files
from edgemoe.messages import SamplingParams
from edgemoe.models.loader import LoadedModel
from edgemoe.models.presets import parse_random
from edgemoe.models.random_weights import BLOCK, CHUNK, TiledInit, materialise
from edgemoe.models.registry import model_module

TINY = "random:tiny-qwen3-moe"


def _load(spec_text: str, seed: int | None = None, dtype: torch.dtype | None = None, **kw) -> LoadedModel:  # noqa: ANN003
    spec = parse_random(spec_text)
    arch = model_module("qwen3_moe").arch(spec.config)
    if dtype is not None:
        from dataclasses import replace

        arch = replace(arch, dtype=dtype)
    return materialise(arch, spec.config, spec.seed if seed is None else seed, **kw)


def _tensors(m: LoadedModel) -> dict[str, torch.Tensor]:
    out = dict(m.params)
    for layer in m.experts.layers:
        out[f"{layer}.gate_up"], out[f"{layer}.down"] = m.experts.layer_banks(layer)
    return out


def test_fill_is_the_block_tiled_from_the_offset() -> None:
    init = TiledInit(seed=3, dtype=torch.bfloat16)
    # Longer than one copy chunk and than the block, so chunk seams and wrap-around are covered.
    dest = torch.empty(CHUNK + BLOCK // 2 + 3, dtype=torch.bfloat16)
    init.fill(dest, "x", index=5)
    block = init.source[:BLOCK]
    want = block[(init.offset("x", 5) + torch.arange(dest.numel())) % BLOCK]
    assert torch.equal(dest, want)


def test_same_seed_same_weights_and_overrides_give_their_shapes() -> None:
    a, b = _tensors(_load(TINY)), _tensors(_load(TINY))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = _tensors(_load(TINY, seed=1))
    assert not any(torch.equal(a[k], c[k]) for k in a if not k.endswith("norm"))  # norms are ones either way
    m = _load(TINY + "?num_hidden_layers=3,num_experts=4,moe_intermediate_size=16,hidden_size=32,head_dim=8")
    assert m.experts.layers == [0, 1, 2]
    assert tuple(m.experts.banks[2].gate_up.shape) == (4, 32, 32) and tuple(m.experts.banks[2].down.shape) == (4, 32, 16)
    assert {k: tuple(v.shape) for k, v in m.params.items()} == m.arch.param_shapes()
    assert m.params["layers.2.qkv"].shape == (4 * 8 + 2 * 2 * 8, 32)


def test_values_look_like_hf_init_and_no_two_experts_or_rows_match() -> None:
    m = _load(TINY, dtype=torch.float32)
    bank = m.experts.banks[1].gate_up  # [8, 64, 64]
    x = bank.flatten()
    n = x.numel()
    # Sample std of n normals has relative error ~1/sqrt(2n) (0.3% here): 5% is > 10 sigma.
    assert abs(x.std().item() / 0.02 - 1) < 0.05
    assert abs(x.mean().item()) < 5 * 0.02 / n**0.5  # 5 sigma of the sample mean
    for e, f in itertools.combinations(range(bank.shape[0]), 2):
        assert not torch.equal(bank[e], bank[f]), (e, f)
    assert not torch.equal(m.experts.banks[0].gate_up, bank)  # layers differ too
    assert torch.all(m.params["norm"] == 1) and torch.all(m.params["layers.0.q_norm"] == 1)
    # The embedding (151,936 rows) is longer than the block, yet no two tokens share a row.
    embed = m.params["embed"]
    assert embed.numel() > BLOCK and torch.unique(embed, dim=0).shape[0] == embed.shape[0]


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []
        self.fail = fail

    def register(self, ptr: int, nbytes: int) -> None:
        if self.fail:
            raise RuntimeError("cudaHostRegister failed")
        self.registered.append((ptr, nbytes))

    def unregister(self, ptr: int) -> None:
        self.unregistered.append(ptr)


def test_expert_banks_are_registered_in_place_layer_by_layer(caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder()
    m = _load(TINY, registrar=rec)
    banks = [m.experts.banks[layer] for layer in m.experts.layers]
    want = [(t.data_ptr(), t.numel() * t.element_size()) for b in banks for t in (b.gate_up, b.down)]
    assert rec.registered == want and m.experts.pinned  # the filled banks themselves: no copies
    m.experts.close()
    assert sorted(rec.unregistered) == sorted(p for p, _ in want) and not m.experts.pinned
    with caplog.at_level(logging.WARNING):
        pageable = _load(TINY, registrar=Recorder(fail=True))
    assert not pageable.experts.pinned
    assert sum("pinning the expert store failed" in r.getMessage() for r in caplog.records) == 1


def test_tiny_preset_is_the_engine_path_of_a_checkpoint_with_its_weights(tmp_path: Path) -> None:
    """Write the preset's weights as a Hub-layout checkpoint: both load to the same tokens and logits."""
    spec = parse_random(TINY)
    config = {**spec.config, "torch_dtype": "float32"}  # what the engine uses on the CPU
    arch = model_module("qwen3_moe").arch(config)
    m = materialise(arch, config, spec.seed)
    tensors = {}
    for name, place in model_module("qwen3_moe").checkpoint_map(arch).items():
        if place.target.startswith("experts."):
            _, layer, which = place.target.split(".")
            src = m.experts.tensor(int(layer), which)
        else:
            src = m.params[place.target]
        tensors[name] = (src[place.index] if place.index else src).contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    write_model_files(tmp_path, config)
    prompts = ["Hello there", "def fib(n):"]
    params = SamplingParams(max_tokens=4)
    with edgemoe.LLM(model=TINY) as llm:
        assert llm.engine.runtime.source.name == TINY and llm.engine.runtime.source.random_weights
        assert (llm.engine.runtime.model_dir / "tokenizer.json").exists()
        got = [o.token_ids for o in llm.generate(prompts, params)]
        logits = llm.prompt_logits(prompts[1])
    with edgemoe.LLM(model=str(tmp_path)) as llm:
        want = [o.token_ids for o in llm.generate(prompts, params)]
        want_logits = llm.prompt_logits(prompts[1])
    assert got == want and all(len(t) == 4 for t in got)
    assert torch.equal(logits, want_logits)  # same weights, same path: bitwise


@pytest.mark.slow
def test_one_real_width_layer_materialises(caplog: pytest.LogCaptureFixture) -> None:
    """random:qwen3-30b-a3b?num_hidden_layers=1 in bf16: 1.21 GB of experts + 1.28 GB dense."""
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING):
        m = _load("random:qwen3-30b-a3b?num_hidden_layers=1")
    seconds = time.perf_counter() - t0
    assert tuple(m.experts.banks[0].gate_up.shape) == (128, 1536, 2048)
    assert m.experts.nbytes() == 128 * 3 * 2048 * 768 * 2
    assert any("random weights (seed 0)" in r.getMessage() for r in caplog.records)  # the load time is reported
    last = m.experts.banks[0].down[127]
    assert last.abs().max().item() > 0  # the last expert was written, not left as fresh zero pages
    print(f"\n1 layer of random:qwen3-30b-a3b: {seconds:.2f} s")
