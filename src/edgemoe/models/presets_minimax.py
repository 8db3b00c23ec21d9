"""MiniMax random presets (`random:minimax-m2`, `random:tiny-minimax-m2`): see `presets.py`.

MiniMaxAI/MiniMax-M2's config.json as published (M2.1 and M2.5 share it; values as the
Hub's file and transformers 5.24's `MiniMaxM2Config` defaults agree on every shape; not
checked against the Hub here) without its FP8 `quantization_config` (a preset is bf16;
`--expert-dtype fp8` gives the published experts' format): 62 layers of hidden 3072, 48 q / 8 kv heads x 128 with q/k
norms over the whole projection, rotary on 64 dims of each head (theta 5e6); 256 experts of
width 1,536, top-8, a sigmoid router with a selection bias, no shared expert; 196,608-token
context; bf16. ~229B parameters, ~10B active: its experts are ~449 GB in bf16 (~112 GB at
int4), so a host holds a slice (`?num_hidden_layers=N`) with a smaller `--expert-dtype`.
Torch-free.

NOTE: as every random preset, it speaks Qwen3's tokenizer and chat template (the only ones
offline) and Qwen3's special ids (MiniMax's, 200034 / 200020, would be ordinary text tokens
there); MiniMax's vocabulary of 200,064 is larger than Qwen3's, so it is kept (its last rows
are never produced by the tokenizer). The MTP fields are kept as published (not read).
"""

from __future__ import annotations

from typing import Any

MINIMAX_M2: dict[str, Any] = {
    "architectures": ["MiniMaxM2ForCausalLM"],
    "attn_type_list": [1] * 62,  # every layer full attention
    "bos_token_id": 151643,  # Qwen3's (the NOTE above)
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "intermediate_size": 1536,
    "max_position_embeddings": 196608,
    "model_type": "minimax_m2",
    "mtp_transformer_layers": 1,
    "num_attention_heads": 48,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 62,
    "num_key_value_heads": 8,
    "num_local_experts": 256,
    "num_mtp_modules": 3,
    "pad_token_id": 151643,
    "qk_norm_type": "per_layer",
    "rms_norm_eps": 1e-06,
    "rope_theta": 5000000,
    "rotary_dim": 64,
    "scoring_func": "sigmoid",
    "shared_intermediate_size": 0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_mtp": True,
    "use_qk_norm": True,
    "use_routing_bias": True,
    "vocab_size": 200064,
}

# Every code path of the big preset at a few MB: partial rotary (8 of 16 dims), whole-projection
# q/k norms, the biased sigmoid router.
TINY_MINIMAX_M2: dict[str, Any] = {
    **MINIMAX_M2,
    "attn_type_list": [1] * 3,
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 32,
    "max_position_embeddings": 4096,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "rotary_dim": 8,
}
