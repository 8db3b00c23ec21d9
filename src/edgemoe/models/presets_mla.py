"""Multi-head latent attention presets (`random:glm-4.7-flash`, `random:tiny-glm-4.7-flash`,
`random:deepseek-v2-lite`, `random:tiny-deepseek-v2-lite`): see `presets.py`.

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

deepseek-ai/DeepSeek-V2-Lite's config.json (DeepSeek-V2-Lite-Chat and
DeepSeek-Coder-V2-Lite-Instruct share its shapes; values as published, not checked against
the Hub here): 27 layers of hidden 2048, the first dense (intermediate 10,944), the rest 64
routed experts of width 1,408 (softmax, greedy top-6, unscaled, not renormalised) plus two
shared ones (one MLP of 2,816); 16 query heads of MLA with one q projection (`q_lora_rank`
null), a 512-wide latent and 64 rotary dims cached (576 values a token and layer), 128
no-position and 128 value dims a head; YaRN x40 from 4,096 positions (mscale 0.707 both):
163,840; bf16. ~15.7B parameters, ~2.4B active; its experts are ~29 GB in bf16. NOTE: its
vocabulary (102,400) is smaller than Qwen3's tokenizer's ids (151,669), which every random
preset speaks: the preset takes Qwen3's 151,936 rows (embedding and head ~0.4 GB larger than
the real model's) and Qwen3's special ids. DeepSeek's own fields that transformers does not
read (`moe_layer_freq`, `scoring_func`, `aux_loss_alpha`, `seq_aux`) are kept as published.
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

DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 151643,  # Qwen3's (the NOTE above; DeepSeek's: 100000 / 100001)
    "eos_token_id": 151645,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 151936,  # DeepSeek's 102,400 (the NOTE above)
}

# The big preset's code paths at a few MB (one q projection, YaRN's mscale, the dense first
# layer, two shared experts beside the bank), with a 4,096-position context.
TINY_DEEPSEEK_V2_LITE: dict[str, Any] = {
    **DEEPSEEK_V2_LITE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "kv_lora_rank": 32,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_attention_heads": 4,
    "num_experts_per_tok": 3,
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "rope_scaling": {**DEEPSEEK_V2_LITE["rope_scaling"], "factor": 4, "original_max_position_embeddings": 1024},
    "v_head_dim": 16,
}
