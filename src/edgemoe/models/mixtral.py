"""Mixtral (mistralai/Mixtral-8x7B). No q/k norm, top-k weights always renormalised,
optional sliding-window attention; experts named `block_sparse_moe.experts.N.w1/w2/w3`
(w1 = gate, w3 = up, w2 = down)."""

from __future__ import annotations

from typing import Any

from edgemoe.models.arch import DecoderArch, checkpoint_dtype, require, rope_theta
from edgemoe.models.names import NameMap, Placement, common_names, expert_names

MODEL_TYPE = "mixtral"


def arch(c: dict[str, Any]) -> DecoderArch:
    layers, heads = require(c, "num_hidden_layers"), require(c, "num_attention_heads")
    return DecoderArch(
        model_type=MODEL_TYPE,
        vocab_size=require(c, "vocab_size"),
        hidden_size=require(c, "hidden_size"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or require(c, "hidden_size") // heads,
        rms_norm_eps=c.get("rms_norm_eps", 1e-5),
        rope_theta=rope_theta(c, 1e6),
        max_position_embeddings=c.get("max_position_embeddings", 32768),
        tie_word_embeddings=c.get("tie_word_embeddings", False),
        hidden_act=c.get("hidden_act", "silu"),
        qk_norm="none",
        clip_qkv=None,
        sliding_window=c.get("sliding_window"),
        num_experts=require(c, "num_local_experts"),
        top_k=require(c, "num_experts_per_tok"),
        moe_intermediate_size=require(c, "intermediate_size"),
        norm_topk_prob=True,
        moe_layers=tuple(range(layers)),
        intermediate_size=0,
        dtype=checkpoint_dtype(c),
    )


def checkpoint_map(a: DecoderArch) -> NameMap:
    m = common_names(a)
    for i in range(a.num_layers):
        moe = f"model.layers.{i}.block_sparse_moe."
        m[moe + "gate.weight"] = Placement(f"layers.{i}.router")
        m |= expert_names(a, i, moe + "experts.{e}.{w}.weight", "w1", "w3", "w2")
    return m
