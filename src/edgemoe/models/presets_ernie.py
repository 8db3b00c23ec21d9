"""ERNIE-4.5 random presets (`random:ernie-4.5-21b-a3b`, `random:tiny-ernie-4.5`): see `presets.py`.

baidu/ERNIE-4.5-21B-A3B-PT's config.json (ERNIE-4.5-21B-A3B-Thinking and -Base-PT share its
shapes; values as published, not checked against the Hub here; they agree with transformers
5.24's `Ernie4_5_MoeConfig` defaults, which are modelled on it): 28 layers of hidden 2560, the
first dense (intermediate 12,288), the rest 64 experts of width 1,536 (top-6, softmax with a
selection bias, renormalised) plus two shared experts (one MLP of 3,072); 20 q / 4 kv heads x
128, interleaved rotary (theta 500,000); 131,072 positions; tied embeddings; bf16. ~21B
parameters, ~3B active: its experts are ~41 GB in bf16 (the
dense weights 2.9 GiB). Torch-free.

NOTE: as every random preset, it speaks Qwen3's tokenizer and chat template (the only ones
offline) and Qwen3's special ids; ERNIE's vocabulary (103,424) is smaller than Qwen3's
tokenizer's ids (151,669), so the preset takes Qwen3's 151,936 rows (the tied embedding ~0.25
GB larger than the real model's). Baidu's own fields that transformers does not read
(`moe_capacity`, `moe_gate`, `moe_use_aux_free`, the MTP ones) are kept as published.
"""

from __future__ import annotations

from typing import Any

ERNIE_4_5_21B_A3B: dict[str, Any] = {
    "architectures": ["Ernie4_5_MoeForCausalLM"],
    "bos_token_id": 151643,  # Qwen3's (the NOTE above; ERNIE's: 1 / 2, pad 0)
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "intermediate_size": 12288,
    "max_position_embeddings": 131072,
    "model_type": "ernie4_5_moe",
    "moe_capacity": [64, 64, 64],
    "moe_gate": "topk",
    "moe_intermediate_size": 1536,
    "moe_k": 6,
    "moe_layer_end_index": 27,
    "moe_layer_interval": 1,
    "moe_layer_start_index": 1,
    "moe_num_experts": 64,
    "moe_num_shared_experts": 2,
    "moe_use_aux_free": True,
    "multi_token_pred_lambda": 0.3,
    "num_attention_heads": 20,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 151643,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_bias": False,
    "use_cache": False,
    "vocab_size": 151936,  # ERNIE's 103,424 (the NOTE above)
}

# Every code path of the big preset at a few MB: the dense first layer, the biased softmax
# router, two shared experts beside the bank, interleaved rotary. `moe_layer_end_index` -1
# (the last layer) keeps `num_hidden_layers` overrides whole.
TINY_ERNIE_4_5: dict[str, Any] = {
    **ERNIE_4_5_21B_A3B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "moe_k": 2,
    "moe_layer_end_index": -1,
    "moe_num_experts": 8,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
}
