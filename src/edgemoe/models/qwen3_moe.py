"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B).

Per-head q/k RMSNorm; softmax top-k routing, renormalised when `norm_topk_prob`;
dense MLP on `mlp_only_layers` and on layers off the `decoder_sparse_step` grid.
"""

from __future__ import annotations

from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.layers.attention import Attention
from edgemoe.models.arch import ConfigError, DecoderArch, HFConfig, common_fields
from edgemoe.models.llama_moe import (
    assemble,
    attention_spec,
    qk_norms,
    rope_table,
    to_device,
)
from edgemoe.models.names import (
    NameMap,
    Placement,
    common_names,
    dense_mlp_names,
    expert_names,
)
from edgemoe.models.transformer import CausalLM
from edgemoe.moe.executor import MoEExecutor

MODEL_TYPE = "qwen3_moe"


def arch(config: dict[str, Any]) -> DecoderArch:
    c = HFConfig(config)
    if c.get("use_sliding_window"):
        raise ConfigError("qwen3_moe with use_sliding_window=true is not supported yet")
    if c.get("attention_bias"):
        raise ConfigError("qwen3_moe with attention_bias=true is not supported yet")
    layers, experts = c.require("num_hidden_layers"), c.require("num_experts")
    step, dense_only = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers") or [])
    moe = tuple(i for i in range(layers) if i not in dense_only and experts > 0 and (i + 1) % step == 0)
    return DecoderArch(
        model_type=MODEL_TYPE,
        **common_fields(c, eps=1e-6, max_pos=32768),
        qk_norm="head",
        clip_qkv=None,
        sliding_window=None,
        num_experts=experts,
        moe_intermediate_size=c.require("moe_intermediate_size"),
        norm_topk_prob=c.get("norm_topk_prob", False),
        moe_layers=moe,
        intermediate_size=c.get("intermediate_size", 0),
    )


def checkpoint_map(a: DecoderArch) -> NameMap:
    m = common_names(a)
    for i in range(a.num_layers):
        mlp = f"model.layers.{i}.mlp."
        if i in a.moe_layers:
            m[mlp + "gate.weight"] = Placement(f"layers.{i}.router")
            m |= expert_names(a, i, mlp + "experts.{e}.{w}.weight", "gate_proj", "up_proj", "down_proj")
        else:
            m |= dense_mlp_names(a, i, mlp)
    return m


def build(arch: DecoderArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref) -> CausalLM:
    """Per-head q/k RMSNorm before rotary."""
    p, rope = to_device(arch, params, device), rope_table(arch, device)

    def attention(i: int) -> Attention:
        q_norm, k_norm = qk_norms(arch, i, p)
        pre = f"layers.{i}."
        return Attention(attention_spec(arch, i, rope), p[pre + "qkv"], p[pre + "o_proj"], q_norm, k_norm,
                         qk_norm="head", linear=linear)

    return assemble(arch, p, attention, executor, device, linear)
