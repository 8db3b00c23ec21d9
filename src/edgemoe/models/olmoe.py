"""OLMoE (allenai/OLMoE-1B-7B). Differs from Qwen3-MoE in two lines: q/k RMSNorm over
the whole projection (not per head) and optional `clip_qkv`; no dense layers."""

from __future__ import annotations

from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.layers.attention import Attention
from edgemoe.models.arch import (
    ConfigError,
    DecoderArch,
    HFConfig,
    check_experts,
    common_fields,
)
from edgemoe.models.llama_moe import (
    assemble,
    attention_spec,
    qk_norms,
    rope_table,
    to_device,
)
from edgemoe.models.names import NameMap, Placement, common_names, expert_names, mlp_experts_stacked
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

MODEL_TYPE = "olmoe"


def arch(config: dict[str, Any]) -> DecoderArch:
    c = HFConfig(config)
    if c.flag("attention_bias", False):
        raise ConfigError("attention_bias=true (biased q/k/v/o projections) is not supported for olmoe")
    # NOTE: OLMoE has no head_dim field; its norms assume hidden / heads. transformers' projections
    # read a head_dim written anyway, and its q/k norms then fail: refused by name, not by tensor shape.
    head_dim = c.integer("hidden_size") // c.integer("num_attention_heads")
    if c.get("head_dim") not in (None, head_dim):
        raise ConfigError(f"head_dim={c.get('head_dim')!r}: olmoe's q/k norms need hidden_size / num_attention_heads "
                          f"= {head_dim} (transformers cannot run another either)")
    fields = common_fields(c, eps=1e-5, max_pos=4096, head_dim=head_dim)
    experts, moe = c.integer("num_experts"), tuple(range(fields["num_layers"]))
    check_experts(c, experts, fields["top_k"], moe)
    return DecoderArch(
        model_type=MODEL_TYPE,
        **fields,
        qk_norm="full",
        clip_qkv=c.number("clip_qkv", None),
        sliding_window=None,
        num_experts=experts,
        moe_intermediate_size=c.integer("intermediate_size"),
        norm_topk_prob=c.flag("norm_topk_prob", False),
        moe_layers=moe,
        intermediate_size=0,
    )


def checkpoint_map(a: DecoderArch) -> NameMap:
    m = common_names(a)
    for i in range(a.num_layers):
        mlp = f"model.layers.{i}.mlp."
        m[mlp + "gate.weight"] = Placement(f"layers.{i}.router")
        m |= expert_names(a, i, mlp + "experts.{e}.{w}.weight", "gate_proj", "up_proj", "down_proj")
    return m


stacked_expert_names = mlp_experts_stacked  # transformers 5's stacked `mlp.experts.*`


def build(arch: DecoderArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    """q/k RMSNorm over the whole projection, then the optional clip."""
    p, rope = to_device(arch, params, device), rope_table(arch, device)

    def attention(i: int) -> Attention:
        q_norm, k_norm = qk_norms(arch, i, p)
        pre = f"layers.{i}."
        return Attention(
            attention_spec(arch, i, rope), p[pre + "qkv"], p[pre + "o_proj"], q_norm, k_norm,
            qk_norm="full", clip_qkv=arch.clip_qkv, linear=linear,
        )

    return assemble(arch, p, attention, executor, device, linear, embed=embed)
