"""gpt-oss random presets (`random:gpt-oss-20b`, `random:gpt-oss-120b`, `random:tiny-gpt-oss`):
see `presets.py`.

openai/gpt-oss-20b's config.json as published on the Hub (values from its model card and
config, not checked here): 24 layers of hidden 2880, each a sparse MoE of 32 experts of
width 2880 (top-4) with biased projections and the clamped SwiGLU (α 1.702, limit 7); 64 q /
8 kv heads x 64 with biased q/k/v/o and a learned sink per head, a 128-token window on every
other layer (from the first), YaRN ×32 over 4,096 (θ 150,000); 131,072-token context;
vocab 201,088, untied; bf16 outside the experts (published as MXFP4). gpt-oss-120b: 36
layers, 128 experts. Torch-free.

The big presets leave `layer_types` out (transformers' default is the published
alternation), so `num_hidden_layers` overrides stay valid.

NOTE: a random preset speaks Qwen3's tokenizer and chat template (`assets/model_files.py`,
the only ones offline): the vocabulary keeps its real size (the LM head's bytes are real),
the special ids are Qwen3's; ids past Qwen3's are never-decoded padding, as Qwen3's own.
"""

from __future__ import annotations

from typing import Any

GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,  # Qwen3's (the NOTE above); gpt-oss's eos / pad are 200002 / 199999
    "eos_token_id": 151645,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 151643,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
        "rope_type": "yarn", "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 201088,
}

GPT_OSS_120B: dict[str, Any] = {
    **GPT_OSS_20B,
    "num_hidden_layers": 36,
    "num_local_experts": 128,
}

# Every code path of the big presets at a few MB: a window shorter than the tests' prompts,
# a layer pattern that isn't the default's, GQA 2.
TINY_GPT_OSS: dict[str, Any] = {
    **GPT_OSS_20B,
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 32,
    "layer_types": ["sliding_attention", "full_attention", "full_attention"],
    "max_position_embeddings": 4096,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "sliding_window": 8,
    "vocab_size": 151936,
}
