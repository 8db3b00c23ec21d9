"""Checkpoints as transformers 5 also writes them, for the families whose other tests load only
the default `save_pretrained` output: bfloat16 weights, sharded (`max_shard_size`, with an
index), in transformers 5's own module layout (`save_original_format=False`: each layer's
experts stacked, `mlp.experts.gate_up_proj` / `down_proj`, GLM's and DeepSeek's selection bias
under `mlp.gate`). Loaded with `edgemoe.LLM` in float32 and compared with transformers' float32
logits on the same checkpoint (both read the same bf16-rounded weights), pageable and mapped
(`expert_store="mmap"`: views into the shards) where the layout allows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_saved import scale_weights
from tolerances import network_atol

from edgemoe import LLM
from edgemoe.testing.checkpoint import write_tokenizer_files

transformers = pytest.importorskip("transformers")

SEQ = [5, 90, 17, 150, 3, 3, 200, 42] + list(range(100, 160, 3))  # 28 tokens
BASE = dict(vocab_size=512, hidden_size=32, num_hidden_layers=3, max_position_embeddings=256, pad_token_id=None)
MLA = dict(intermediate_size=48, moe_intermediate_size=16, num_attention_heads=4, num_key_value_heads=4,
           kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, n_routed_experts=8,
           num_experts_per_tok=3)
GQA = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
FAMILIES = {  # model_type: (config class, model class, settings), each with dense and sparse layers where it can
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(GQA, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
                       mlp_only_layers=[1])),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(GQA, intermediate_size=16, num_local_experts=8, num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=16, num_experts=8,
                   num_experts_per_tok=2)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(GQA, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=3,
                      n_group=2, topk_group=1, routed_scaling_factor=2.5, n_shared_experts=1,
                      first_k_dense_replace=1, attention_bias=True, use_qk_norm=True)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(GQA, intermediate_size=16, num_local_experts=8, num_experts_per_tok=3, sliding_window=6,
                     swiglu_limit=1.5, eos_token_id=None, bos_token_id=None)),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                    dict(MLA, q_lora_rank=None, n_shared_experts=2, first_k_dense_replace=1, topk_method="greedy",
                         n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(MLA, q_lora_rank=24, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                         n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True)),
    "glm4_moe_lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM",
                      dict(MLA, q_lora_rank=24, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                           n_shared_experts=1, norm_topk_prob=True)),
}


def saved(model_type: str, out: Path) -> Path:
    """The family's tiny model at unit scale (its selection bias, a buffer, set too), saved as
    bf16 shards in transformers 5's module layout."""
    config_cls, model_cls, settings = FAMILIES[model_type]
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**BASE, **settings))
    scale_weights(model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.2 * torch.randn(buf.shape, generator=g))
    model.tie_weights()
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="30KB", save_original_format=False)
    write_tokenizer_files(out)
    return out


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_bf16_shards_in_transformers_layout_match_transformers(model_type: str, tmp_path: Path) -> None:
    path = saved(model_type, tmp_path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        theirs = model.eval()(torch.tensor([SEQ])).logits[0]
    # the longest reduction: the hidden size (32) and expert widths are narrower than the context
    atol = network_atol(torch.float32, 48, theirs.abs().max().item())
    # gpt-oss's experts are stored transposed, which a mapped store cannot serve (refused by name)
    stores = ("pageable",) if model_type == "gpt_oss" else ("pageable", "mmap")
    for store in stores:
        with LLM(str(path), dtype="float32", expert_store=store) as llm:
            torch.testing.assert_close(llm.prompt_logits(SEQ), theirs, atol=atol, rtol=0, msg=lambda m: f"{store}: {m}")
