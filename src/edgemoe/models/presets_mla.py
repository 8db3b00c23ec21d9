"""Multi-head latent attention presets (`random:glm-4.7-flash`, `random:tiny-glm-4.7-flash`):
see `presets.py`.

zai-org/GLM-4.7-Flash's shape, as transformers 5.24's `Glm4MoeLiteConfig` defaults hold it
(the class is modelled on that release; values not checked against the Hub here): 47 layers
of hidden 2048, the first dense (intermediate 10,240), the rest 64 routed experts of width
1,536 (top-4, one group, scale 1.8) plus one shared expert; 20 query heads of MLA (a q rank
of 768, a 512-wide latent and 64 rotary dims cached: 576 values a token and layer; 192
no-position and 256 value dims a head); theta 1e6; a 202,752-token context; bf16. ~30B
parameters, ~3B active; its experts are ~56 GB in bf16. Torch-free.

NOTE: as every random preset, it speaks Qwen3's tokenizer and chat template (the only ones
offline) and Qwen3's special ids; GLM's vocabulary of 154,880 is larger than Qwen3's, so it
is kept (its last rows are never produced by the tokenizer). No `mlp_layer_types`: transformers'
default (the first layer dense) keeps `num_hidden_layers` overrides valid.
"""

from __future__ import annotations

from typing import Any

GLM_4_7_FLASH: dict[str, Any] = {
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 151643,  # Qwen3's (the NOTE above)
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 10240,
    "kv_lora_rank": 512,
    "max_position_embeddings": 202752,
    "model_type": "glm4_moe_lite",
    "moe_intermediate_size": 1536,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 20,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 47,
    "num_key_value_heads": 20,
    "pad_token_id": 151643,
    "q_lora_rank": 768,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-05,
    "rope_interleave": True,
    "rope_theta": 1000000,
    "routed_scaling_factor": 1.8,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "torch_dtype": "bfloat16",
    "v_head_dim": 256,
    "vocab_size": 154880,
}

# Every code path of the big preset at a few MB, and ones it leaves idle: two expert groups
# of which one is kept.
TINY_GLM_4_7_FLASH: dict[str, Any] = {
    **GLM_4_7_FLASH,
    "hidden_size": 64,
    "intermediate_size": 128,
    "kv_lora_rank": 32,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "n_group": 2,
    "n_routed_experts": 8,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "q_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
}
