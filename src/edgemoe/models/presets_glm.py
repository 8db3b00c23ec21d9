"""GLM random presets (`random:glm-4.5-air`, `random:tiny-glm4-moe`): see `presets.py`.

zai-org/GLM-4.5-Air's config.json as published on the Hub (values from its model card and
config, not checked here): 46 layers of hidden 4096, the first dense (intermediate 10,944),
the rest 128 routed experts of width 1,408 (top-8, one group, scale 1.0) plus one shared
expert; 96 q / 8 kv heads x 128 with biased q/k/v, no q/k norm, rotary on half of each head
(theta 1e6); 131,072-token context; one MTP layer (not read); bf16. ~106B parameters, 12B
active: its experts are 205 GB in bf16, so on a 128 GB host it runs with a smaller
`--expert-dtype` (int4: ~56 GB). Torch-free.

NOTE: a random preset speaks Qwen3's tokenizer and chat template (`assets/model_files.py`,
the only ones offline), so the vocabulary is padded from 151,552 to Qwen3's 151,936 (3 MB
more of the LM head's 1.2 GB) and the special ids are Qwen3's: GLM's own would be ordinary
text tokens there, and Qwen's chat ids would fall outside GLM's vocabulary.
"""

from __future__ import annotations

from typing import Any

GLM_4_5_AIR: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,  # Qwen3's (the NOTE above); GLM's pad / eos are 151329 / [151329, 151336, 151338]
    "eos_token_id": 151645,
    "first_k_dense_replace": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "max_position_embeddings": 131072,
    "model_type": "glm4_moe",
    "moe_intermediate_size": 1408,
    "n_group": 1,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 96,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 46,
    "num_key_value_heads": 8,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 151643,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "routed_scaling_factor": 1.0,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_qk_norm": False,
    "vocab_size": 151936,  # 151552 published: the NOTE above
}

# Every code path of the big preset at a few MB, and the ones it leaves idle: two expert
# groups of which one is kept, a routed scale, q/k norms.
TINY_GLM4_MOE: dict[str, Any] = {
    **GLM_4_5_AIR,
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "n_group": 2,
    "n_routed_experts": 8,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "routed_scaling_factor": 2.5,
    "use_qk_norm": True,
}
