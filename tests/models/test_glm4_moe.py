"""GLM-4.5 MoE (`glm4_moe`) against transformers' `Glm4MoeForCausalLM`: checkpoints written by
its own `save_pretrained`, and the same weights in the Hub's per-expert layout with an MTP
layer after the last one (as zai-org publishes them). The tiny config takes every branch:
q/k/v biases, per-head q/k norms, half-head rotary, a dense first layer, two expert groups
of which one is kept, a non-zero selection bias, a routed scale and the shared expert."""

from __future__ import annotations

from pathlib import Path

import backend_tokens
import pytest
import torch
from hf_saved import assert_greedy_matches_transformers, save, transformers_logits
from hf_saved import assert_logits_match as assert_logits_match_on
from safetensors.torch import load_file, save_file

from edgemoe import LLM
from edgemoe.kernels.router_sigmoid import GroupedSigmoid, SigmoidRouter, route_grouped_sigmoid
from edgemoe.models.hf_config import ConfigError
from edgemoe.models.registry import model_arch

transformers = pytest.importorskip("transformers")

SEQ = [5, 90, 17, 150, 3, 3, 200, 42] + list(range(100, 160, 3))  # 28 tokens
TINY = dict(vocab_size=512, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
            n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1, routed_scaling_factor=2.5,
            n_shared_experts=1, first_k_dense_replace=1, attention_bias=True, use_qk_norm=True,
            norm_topk_prob=True, pad_token_id=None)


def glm(**overrides: object) -> transformers.Glm4MoeForCausalLM:
    model = transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(**{**TINY, **overrides}))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a buffer, not a parameter: `save`'s rescaling does not reach it
        for layer in model.model.layers[model.config.first_k_dense_replace:]:
            layer.mlp.gate.e_score_correction_bias.copy_(0.2 * torch.randn(TINY["n_routed_experts"], generator=g))
    return model


def reference(path: Path, seq: list[int] = SEQ) -> torch.Tensor:
    return transformers_logits(path, seq)


def assert_logits_match(path: Path, theirs: torch.Tensor) -> None:
    assert_logits_match_on(path, SEQ, theirs)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(glm(), tmp_path_factory.mktemp("glm"))


def test_save_pretrained_checkpoint_matches_transformers(saved: Path) -> None:
    assert_logits_match(saved, reference(saved))


def test_greedy_tokens_match_transformers(saved: Path) -> None:
    assert_greedy_matches_transformers(saved, [SEQ[:5], SEQ])


def test_hub_layout_with_an_mtp_layer_loads_the_same(saved: Path, tmp_path: Path) -> None:
    """Per-expert tensors and `model.layers.3.*` (the MTP layer GLM-4.5-Air ships) as on the Hub."""
    tensors = load_file(saved / "model.safetensors")
    hub = {}
    for name, t in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base, inter = name.removesuffix("gate_up_proj"), t.shape[1] // 2
            for e in range(t.shape[0]):
                hub[f"{base}{e}.gate_proj.weight"], hub[f"{base}{e}.up_proj.weight"] = t[e, :inter], t[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(t.shape[0]):
                hub[f"{name.removesuffix('down_proj')}{e}.down_proj.weight"] = t[e]
        else:
            hub[name] = t
    hub["model.layers.3.eh_proj.weight"] = torch.zeros(32, 64)  # the MTP layer: not read
    hub["model.layers.3.enorm.weight"] = torch.ones(32)
    for f in saved.iterdir():
        if f.name != "model.safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    save_file({k: v.contiguous() for k, v in hub.items()}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert_logits_match(tmp_path, reference(saved))


def test_router_matches_transformers_on_many_rows() -> None:
    """Our sigmoid router against transformers' on 500 rows with near-ties and four groups."""
    config = transformers.Glm4MoeConfig(**{**TINY, "n_routed_experts": 16, "n_group": 4, "topk_group": 2,
                                           "num_experts_per_tok": 4})
    gate = transformers.models.glm4_moe.modeling_glm4_moe.Glm4MoeTopkRouter(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(16, 32, generator=g) / 6)
        gate.e_score_correction_bias.copy_(0.3 * torch.randn(16, generator=g))
        x = torch.randn(500, 32, generator=g)
        _, weights, ids = gate(x)
    spec = GroupedSigmoid(4, 2, config.routed_scaling_factor)
    our_ids, our_weights = route_grouped_sigmoid(x, SigmoidRouter(gate.weight, gate.e_score_correction_bias, spec),
                                                 4, True)
    order, our_order = ids.sort(dim=-1), our_ids.long().sort(dim=-1)
    assert torch.equal(order.values, our_order.values)
    torch.testing.assert_close(our_weights.gather(1, our_order.indices), weights.gather(1, order.indices))


@pytest.mark.parametrize(("overrides", "named"), [
    ({"n_group": 3}, "n_group=3"),
    ({"topk_group": 3}, "topk_group=3"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok=5"),
    ({"first_k_dense_replace": 3}, "first_k_dense_replace=3"),  # every layer of 3 dense (the message named others)
])
def test_configs_it_cannot_route_are_refused_by_name(overrides: dict[str, object], named: str) -> None:
    config = {**transformers.Glm4MoeConfig(**TINY).to_dict(), **overrides}
    with pytest.raises(ConfigError, match=named):
        model_arch(config)


def test_mlp_layer_types_is_not_read(caplog: pytest.LogCaptureFixture) -> None:
    """GLM-5's field: transformers 5.24's glm4_moe reads first_k_dense_replace (default 1) only."""
    base = {k: v for k, v in transformers.Glm4MoeConfig(**TINY).to_dict().items() if k != "first_k_dense_replace"}
    assert model_arch({**base, "mlp_layer_types": ["dense", "sparse", "sparse"]}).moe_layers == (1, 2)
    assert not caplog.records
    assert model_arch({**base, "mlp_layer_types": ["sparse", "dense", "sparse"]}).moe_layers == (1, 2)
    assert "not read" in caplog.text


@pytest.fixture(scope="module")
def resident_tokens(saved: Path) -> list[list[int]]:
    """The resident executor's greedy tokens: one run, shared by every backend's test."""
    return backend_tokens.resident(saved, SEQ)


@pytest.mark.parametrize("settings", [dict(moe_backend="cpu", moe_slots=3), *backend_tokens.OFFLOAD_AND_HYBRID],
                         ids=lambda s: s["moe_backend"])
def test_backends_give_resident_tokens(saved: Path, resident_tokens: list[list[int]],
                                       settings: dict[str, object]) -> None:
    """The sparse layers (1 and 2, after the dense one) through every executor."""
    got, by_layer = backend_tokens.backend(saved, SEQ, **settings)
    assert got == resident_tokens  # and the dense layer 0 has no experts to miss:
    assert by_layer[0] == 0 and min(by_layer[1:]) > 0


def test_the_air_preset_plans_its_fp32_routers_at_four_bytes() -> None:
    from edgemoe.engine.budget import dense_weight_bytes
    from edgemoe.models.presets import parse_random

    a = model_arch(parse_random("random:glm-4.5-air").config)
    assert (a.num_layers, a.moe_layers[0], a.num_experts, a.shared_intermediate_size) == (46, 1, 128, 1408)
    n = sum(torch.Size(s).numel() for s in a.param_shapes().values())
    routers = 45 * 128 * (4096 + 1)  # weight and bias of 45 sparse layers
    assert dense_weight_bytes(a) == 2 * n + 2 * routers


def test_convert_keeps_the_mtp_layer_and_loads_as_its_source(saved: Path, tmp_path: Path) -> None:
    """`edgemoe convert` copies what the loader skips (GLM's MTP layer) as stored, and its
    output loads as the source quantised at load does."""
    from safetensors import safe_open

    from edgemoe.convert import convert

    src = tmp_path / "src"
    src.mkdir()
    for f in saved.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    tensors = load_file(src / "model.safetensors")
    tensors["model.layers.3.eh_proj.weight"] = torch.ones(32, 64)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    out = convert(src, "int8", tmp_path / "out", progress=False)
    names: set[str] = set()
    for f in out.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            names |= set(h.keys())
    assert "model.layers.3.eh_proj.weight" in names
    with LLM(str(src), dtype="float32", expert_dtype="int8") as llm:
        want = llm.prompt_logits(SEQ)
    with LLM(str(out), dtype="float32") as llm:
        assert torch.equal(llm.prompt_logits(SEQ), want)


@pytest.mark.parametrize("shared", [0, 2])
def test_no_shared_expert_or_a_wider_one(shared: int, tmp_path: Path) -> None:
    """One shared expert rides in the bank (the other tests); none, or two (a dense MLP of
    twice the width beside the routed sum), are as transformers computes them."""
    path = save(glm(n_shared_experts=shared), tmp_path)
    assert model_arch(transformers.Glm4MoeConfig(**{**TINY, "n_shared_experts": shared}).to_dict()).store_experts == 8
    assert_logits_match(path, reference(path))


def test_the_shared_expert_is_the_banks_last_pair() -> None:
    a = model_arch(transformers.Glm4MoeConfig(**TINY).to_dict())
    assert (a.shared_in_store, a.store_experts, a.moe_pairs) == (True, 9, 4)
    assert not any("shared" in name for name in a.param_shapes())


def test_padded_router_logits_are_the_rows_own() -> None:
    """A decode batch's logits through one padded GEMM shape (`router_logits`): each row's
    as unpadded, whatever the batch (on the CPU's GEMM, to fp32 rounding of a 32-term sum)."""
    from edgemoe.kernels.router_sigmoid import router_logits

    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 32, generator=g).bfloat16(), torch.randn(8, 32, generator=g)
    want = torch.nn.functional.linear(x.float(), w)
    got = router_logits(x, w, fixed_rows=32)
    assert got.shape == (5, 8) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=64 * 2**-24 * want.abs().max().item(), rtol=0)
    torch.testing.assert_close(router_logits(x[:1], w, fixed_rows=32), got[:1], atol=0, rtol=0)
    assert torch.equal(router_logits(x, w, fixed_rows=4), want)  # past the fixed rows: unpadded
