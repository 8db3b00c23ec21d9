"""Checkpoints written by transformers 5.24 (and 5.25)'s own `save_pretrained` at settings the other
model tests do not use, each once a bug: loaded with `edgemoe.LLM` and compared with
transformers' logits (its own class for the checkpoint, float64 for the hybrids).

- a multimodal Qwen3.5 checkpoint whose model ties its LM head: `save_pretrained` writes
  `tie_word_embeddings` true at the top level, false in `text_config`, and no
  `lm_head.weight` (we read the text_config's flag and refused the checkpoint);
- a tied config whose checkpoint also stores `lm_head.weight` (transformers uses the stored
  head; we used the embedding);
- Qwen3-MoE with `use_sliding_window` (we refused it) on a prompt longer than the window;
- Qwen3-MoE with `use_sliding_window` and `sliding_window=None`, saved as null (transformers
  attends to the whole context; we windowed at the class default, 4096 tokens);
- a saved config.json with one field dropped, read with the config class's default;
- a float64 checkpoint (`save_pretrained` of a `.double()` model: we refused its dtype, even
  under an explicit float32);
- DeepSeek-V3 with `norm_topk_prob` or `rope_interleave` null (its class keeps the null and
  its modelling reads it as false; we read the class default, true).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from hf_saved import save
from tolerances import network_atol, peer_atol

from edgemoe import LLM
from edgemoe.models.hf_config import ConfigError
from edgemoe.models.registry import model_arch

transformers = pytest.importorskip("transformers")

SEQ = [5, 90, 17, 150, 3, 3, 200, 42] + list(range(100, 160, 3))  # 28 tokens
SMALL = dict(vocab_size=512, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
             max_position_embeddings=256, pad_token_id=None)


def ours(path: Path, seq: list[int] = SEQ) -> torch.Tensor:
    with LLM(str(path), dtype="float32", max_prefill_tokens=max(4096, len(seq))) as llm:
        return llm.prompt_logits(seq)


def test_multimodal_qwen3_5_ties_its_head_by_the_top_level_flag(tmp_path: Path) -> None:
    text = dict(SMALL, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=1, out_hidden_size=32, patch_size=4,
                  num_position_embeddings=16)
    config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)
    path = save(transformers.Qwen3_5MoeForConditionalGeneration(config), tmp_path)
    assert "lm_head.weight" not in load_file(path / "model.safetensors")  # tied: the head is the embedding

    def reference(dtype: torch.dtype) -> torch.Tensor:
        model = transformers.AutoModelForImageTextToText.from_pretrained(
            path, dtype=dtype, attn_implementation="eager", experts_implementation="eager").eval()
        with torch.no_grad():
            return model(torch.tensor([SEQ])).logits[0].double()

    exact = reference(torch.float64)
    peer = (reference(torch.float32) - exact).abs().max().item()
    # the GDN's chunked rule amplifies rounding by its inputs' conditioning (tolerances.peer_atol)
    atol = peer_atol(torch.float32, peer, 64, exact.abs().max().item())
    torch.testing.assert_close(ours(path).double(), exact, atol=atol, rtol=0)


def qwen3_moe(**overrides: object) -> transformers.Qwen3MoeForCausalLM:
    config = transformers.Qwen3MoeConfig(**{**SMALL, "num_hidden_layers": 2, "intermediate_size": 32,
                                            "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                            **overrides})
    return transformers.Qwen3MoeForCausalLM(config)


def assert_matches_transformers(path: Path, seq: list[int] = SEQ, width: int = 32) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        theirs = model.eval()(torch.tensor([seq])).logits[0]
    # the longest reduction: `width` (the hidden size, 32, where experts and heads are narrower) or the context
    atol = network_atol(torch.float32, max(width, len(seq)), theirs.abs().max().item())
    torch.testing.assert_close(ours(path, seq), theirs, atol=atol, rtol=0)


def test_a_stored_lm_head_wins_over_a_tied_config(tmp_path: Path) -> None:
    path = save(qwen3_moe(tie_word_embeddings=True), tmp_path)
    tensors = load_file(path / "model.safetensors")
    head = torch.randn(tensors["model.embed_tokens.weight"].shape, generator=torch.Generator().manual_seed(1))
    save_file({**tensors, "lm_head.weight": head / math.sqrt(SMALL["hidden_size"])}, path / "model.safetensors",
              metadata={"format": "pt"})
    assert_matches_transformers(path)  # transformers warns that it does not tie, and uses the stored head


def test_qwen3_moe_sliding_window_attends_within_the_window(tmp_path: Path) -> None:
    path = save(qwen3_moe(use_sliding_window=True, sliding_window=8), tmp_path)  # SEQ: 28 tokens
    assert_matches_transformers(path)


def test_qwen3_moe_null_sliding_window_attends_to_the_whole_context(tmp_path: Path) -> None:
    path = save(qwen3_moe(use_sliding_window=True, sliding_window=None, max_position_embeddings=8192), tmp_path)
    assert json.loads((path / "config.json").read_text())["sliding_window"] is None  # not absent: no window
    seq = [(7 * i) % 500 for i in range(4200)]  # past the class default window, 4096
    assert_matches_transformers(path, seq)


def test_a_float64_checkpoint_loads_in_float32(tmp_path: Path) -> None:
    path = save(qwen3_moe().double(), tmp_path)
    assert json.loads((path / "config.json").read_text())["dtype"] == "float64"
    assert_matches_transformers(path)  # transformers reads it in float32 too


MLA_SMALL = {**{k: v for k, v in SMALL.items() if k != "head_dim"}, "num_attention_heads": 16, "q_lora_rank": 16,
             "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}
CONFIGS = {  # 16 heads: every family's default kv heads (4, 8, 2) divides it, none equals it
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**{**SMALL, "num_attention_heads": 16, "head_dim": 8},
                                                     num_experts=4, num_experts_per_tok=2),
    "mixtral": lambda: transformers.MixtralConfig(**{**SMALL, "num_attention_heads": 16, "head_dim": 8},
                                                  num_local_experts=4, num_experts_per_tok=2),
    "olmoe": lambda: transformers.OlmoeConfig(**{k: v for k, v in SMALL.items() if k != "head_dim"},
                                              num_experts=4, num_experts_per_tok=2),
    "qwen3_next": lambda: transformers.Qwen3NextConfig(**{**SMALL, "num_attention_heads": 16, "head_dim": 8},
                                                       num_experts=4, num_experts_per_tok=2),
    "qwen3_5_moe_text": lambda: transformers.Qwen3_5MoeTextConfig(**{**SMALL, "num_attention_heads": 16, "head_dim": 8},
                                                                  num_experts=4, num_experts_per_tok=2),
    "glm4_moe": lambda: transformers.Glm4MoeConfig(**{**SMALL, "num_attention_heads": 16, "head_dim": 8},
                                                   n_routed_experts=4, num_experts_per_tok=2),
    "glm4_moe_lite": lambda: transformers.Glm4MoeLiteConfig(**MLA_SMALL, n_routed_experts=4, num_experts_per_tok=2),
    # The published `rotary_dim` saved beside rope_parameters' factor: either alone decides.
    "minimax_m2": lambda: transformers.MiniMaxM2Config(**{**SMALL, "num_attention_heads": 16, "head_dim": 8},
                                                       num_local_experts=4, num_experts_per_tok=2, rotary_dim=4),
    "deepseek_v3": lambda: transformers.DeepseekV3Config(**MLA_SMALL, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                                                         topk_group=1, first_k_dense_replace=1),
    # The group-limited router: n_group / topk_group (class default null) are read, and refused absent.
    "deepseek_v2": lambda: transformers.DeepseekV2Config(**MLA_SMALL, n_routed_experts=8, num_experts_per_tok=2,
                                                         topk_method="group_limited_greedy", n_group=2, topk_group=1,
                                                         first_k_dense_replace=1, routed_scaling_factor=2.0),
    # Aliased counts (moe_num_experts / moe_k), a tied head by default, MoE on every second layer from
    # the start index to an end index that the class saves as the last layer (its default, -1).
    "ernie4_5_moe": lambda: transformers.Ernie4_5_MoeConfig(**{**SMALL, "num_attention_heads": 16, "head_dim": 8},
                                                            moe_num_experts=4, moe_k=2, moe_layer_interval=2),
}


@pytest.mark.parametrize("field", ["norm_topk_prob", "rope_interleave"])
def test_deepseek_v3_reads_a_null_flag_as_false(field: str, tmp_path: Path) -> None:
    config = transformers.DeepseekV3Config(**{**MLA_SMALL, "num_key_value_heads": 16}, n_routed_experts=8,
                                           num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                                           **{field: None})
    path = save(transformers.DeepseekV3ForCausalLM(config), tmp_path)
    assert json.loads((path / "config.json").read_text())[field] is None  # saved as null, not dropped
    assert_matches_transformers(path, width=16 * 8)  # the longest reduction: o_proj's 16 heads x v_head_dim 8


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_an_absent_field_reads_as_the_config_class_default(model_type: str) -> None:
    """Each field of a saved config.json dropped in turn: we read what transformers' class
    reads (its default), or refuse naming the field. Once Qwen3-MoE, Mixtral and the hybrids
    took one kv head per query head (their classes: 4, 8, 2) and Qwen3.5 512 experts (256)."""
    saved = CONFIGS[model_type]().to_dict()
    for field in sorted(set(saved) - {"model_type"}):
        partial = {k: v for k, v in saved.items() if k != field}
        try:
            theirs = type(CONFIGS[model_type]()).from_dict(partial).to_dict()
        except Exception:  # noqa: BLE001 - transformers refuses the config without it
            continue
        try:
            ours = model_arch(partial)
        except ConfigError as e:
            assert field in str(e), f"{field}: {e}"  # a refusal names the field
            continue
        assert ours == model_arch(theirs), f"config.json without {field!r}"
