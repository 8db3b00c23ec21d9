"""DecoderArch: the shape of a pre-norm decoder-only MoE transformer, read from a
Hugging Face `config.json` by each model file. Every supported model_type maps onto it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class ConfigError(ValueError):
    """config.json is missing a field or asks for something unsupported."""


@dataclass(frozen=True)
class DecoderArch:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str
    qk_norm: str  # "none" | "head" | "full"
    clip_qkv: float | None
    sliding_window: int | None
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    moe_layers: tuple[int, ...]  # layer indices with a sparse MoE block
    intermediate_size: int  # dense MLP layers
    dtype: torch.dtype

    @property
    def dense_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if i not in self.moe_layers)

    @property
    def qkv_rows(self) -> tuple[int, int, int]:
        return (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Our names and shapes of every non-expert tensor."""
        H, D = self.hidden_size, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab_size, H), "norm": (H,)}
        if not self.tie_word_embeddings:
            shapes["lm_head"] = (self.vocab_size, H)
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes[p + "attn_norm"] = (H,)
            shapes[p + "mlp_norm"] = (H,)
            shapes[p + "qkv"] = (sum(self.qkv_rows), H)
            shapes[p + "o_proj"] = (H, self.num_heads * D)
            if self.qk_norm == "head":
                shapes[p + "q_norm"], shapes[p + "k_norm"] = (D,), (D,)
            elif self.qk_norm == "full":
                shapes[p + "q_norm"], shapes[p + "k_norm"] = (self.num_heads * D,), (self.num_kv_heads * D,)
            if i in self.moe_layers:
                shapes[p + "router"] = (self.num_experts, H)
            else:
                shapes[p + "gate_up"] = (2 * self.intermediate_size, H)
                shapes[p + "down"] = (H, self.intermediate_size)
        return shapes


def require(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise ConfigError(f"config.json has no {key!r} (needed by model_type {config.get('model_type')!r})")
    return config[key]


def rope_theta(config: dict[str, Any], default: float) -> float:
    """RoPE base from either the v5 `rope_parameters` or the older `rope_theta`/`rope_scaling`."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ConfigError(f"rope_type {rope_type!r} is not supported yet (only 'default')")
    return float(params.get("rope_theta", config.get("rope_theta", default)))


def checkpoint_dtype(config: dict[str, Any]) -> torch.dtype:
    name = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    try:
        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]
    except KeyError:
        raise ConfigError(f"config.json dtype {name!r} is not supported") from None


def common_fields(c: dict[str, Any], *, eps: float, theta: float, max_pos: int) -> dict[str, Any]:
    """The DecoderArch fields every Llama-style MoE config spells the same way;
    `eps`, `theta` and `max_pos` are the model family's defaults when a field is absent."""
    heads, hidden = require(c, "num_attention_heads"), require(c, "hidden_size")
    return dict(
        vocab_size=require(c, "vocab_size"),
        hidden_size=hidden,
        num_layers=require(c, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or hidden // heads,
        rms_norm_eps=c.get("rms_norm_eps", eps),
        rope_theta=rope_theta(c, theta),
        max_position_embeddings=c.get("max_position_embeddings", max_pos),
        tie_word_embeddings=c.get("tie_word_embeddings", False),
        hidden_act=c.get("hidden_act", "silu"),
        top_k=require(c, "num_experts_per_tok"),
        dtype=checkpoint_dtype(c),
    )
