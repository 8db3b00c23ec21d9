"""What every tiny random checkpoint shares (`checkpoint.py`, `hybrid_checkpoint.py`,
`qwen4_checkpoint.py`): a tensor spec's type, the config fields common to the families,
and the seeded weights.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch

# Weight scales, chosen so activations keep unit scale through the layers and greedy
# decisions are decisive (see tests/testing: top-1 margins and non-degenerate output).
EMBED_STD = 1.0  # the residual stream starts at rms ~1
NORM_NOISE = 0.1  # norm weights are 1 + N(0, NORM_NOISE^2): non-trivial but mild
LINEAR_GAIN = 1.0  # std = LINEAR_GAIN / sqrt(fan_in): each projection preserves rms
ROUTER_GAIN = 4.0  # router logits std ~4, so top-k choices are far from ties
LM_HEAD_GAIN = 4.0  # logits std ~4 over the vocab: clear top-1 margins

Shape = tuple[int, ...]
TensorSpec = tuple[str, Shape]

COMMON_CONFIG: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "initializer_range": 0.02,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "num_experts_per_tok": 2,
    "output_router_logits": False,
}


def init_tensor(name: str, shape: Shape, seed: int) -> torch.Tensor:
    """Seeded fp32 weight; each tensor has its own stream so specs can grow without reshuffling."""
    # NOTE: torch's CPU generator keeps only the low 32 bits of a seed, so hash (seed, name) to 32 bits.
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=4).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest, "little"))
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    if name.endswith("embed_tokens.weight"):
        return x * EMBED_STD
    if name.endswith("norm.weight"):
        return 1.0 + NORM_NOISE * x
    if name.endswith(".gate.weight"):  # router [E, H]
        gain = ROUTER_GAIN
    elif name == "lm_head.weight":
        gain = LM_HEAD_GAIN
    else:
        gain = LINEAR_GAIN
    if len(shape) == 1:  # a vector that is not a norm (e.g. a GDN layer's dt_bias): unit scale
        return x
    return x * (gain / math.sqrt(math.prod(shape[1:])))  # fan-in (a conv [C, 1, K]: its K taps)
