"""OLMoE (allenai/OLMoE-1B-7B). Differs from Qwen3-MoE in two lines: q/k RMSNorm over
the whole projection (not per head) and optional `clip_qkv`; no dense layers."""

from __future__ import annotations

from typing import Any

from edgemoe.models.arch import DecoderArch, checkpoint_dtype, require, rope_theta
from edgemoe.models.names import NameMap, Placement, common_names, expert_names

MODEL_TYPE = "olmoe"


def arch(c: dict[str, Any]) -> DecoderArch:
    layers, heads = require(c, "num_hidden_layers"), require(c, "num_attention_heads")
    return DecoderArch(
        model_type=MODEL_TYPE,
        vocab_size=require(c, "vocab_size"),
        hidden_size=require(c, "hidden_size"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=require(c, "hidden_size") // heads,
        rms_norm_eps=c.get("rms_norm_eps", 1e-5),
        rope_theta=rope_theta(c, 10000.0),
        max_position_embeddings=c.get("max_position_embeddings", 4096),
        tie_word_embeddings=c.get("tie_word_embeddings", False),
        hidden_act=c.get("hidden_act", "silu"),
        qk_norm="full",
        clip_qkv=c.get("clip_qkv"),
        sliding_window=None,
        num_experts=require(c, "num_experts"),
        top_k=require(c, "num_experts_per_tok"),
        moe_intermediate_size=require(c, "intermediate_size"),
        norm_topk_prob=c.get("norm_topk_prob", False),
        moe_layers=tuple(range(layers)),
        intermediate_size=0,
        dtype=checkpoint_dtype(c),
    )


def checkpoint_map(a: DecoderArch) -> NameMap:
    m = common_names(a)
    for i in range(a.num_layers):
        mlp = f"model.layers.{i}.mlp."
        m[mlp + "gate.weight"] = Placement(f"layers.{i}.router")
        m |= expert_names(a, i, mlp + "experts.{e}.{w}.weight", "gate_proj", "up_proj", "down_proj")
    return m
