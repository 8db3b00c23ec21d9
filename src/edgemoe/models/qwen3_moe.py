"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B).

Per-head q/k RMSNorm; softmax top-k routing, renormalised when `norm_topk_prob`;
dense MLP on `mlp_only_layers` and on layers off the `decoder_sparse_step` grid;
sliding-window attention on every layer when `use_sliding_window`.
"""

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
from edgemoe.models.names import (
    NameMap,
    Placement,
    common_names,
    dense_mlp_names,
    expert_names,
    mlp_experts_stacked,
)
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

MODEL_TYPE = "qwen3_moe"


def arch(config: dict[str, Any]) -> DecoderArch:
    c = HFConfig(config)
    if c.flag("attention_bias", False):
        raise ConfigError("attention_bias=true (biased q/k/v/o projections) is not supported for qwen3_moe")
    layers, experts = c.layers(), c.integer("num_experts", minimum=0)
    step, dense_only = c.integer("decoder_sparse_step", 1), set(c.int_list("mlp_only_layers"))
    moe = tuple(i for i in range(layers) if i not in dense_only and experts > 0 and (i + 1) % step == 0)
    fields = common_fields(c, eps=1e-6, max_pos=32768, kv_heads=4)
    check_experts(c, experts, fields["top_k"], moe)
    return DecoderArch(
        model_type=MODEL_TYPE,
        **fields,
        qk_norm="head",
        clip_qkv=None,
        sliding_window=sliding_window(c),
        num_experts=experts,
        moe_intermediate_size=c.integer("moe_intermediate_size", 768),  # Qwen3MoeConfig's defaults
        norm_topk_prob=c.flag("norm_topk_prob", False),
        moe_layers=moe,
        intermediate_size=c.integer("intermediate_size", 6144),
    )


def sliding_window(c: HFConfig) -> int | None:
    """The window of every layer (transformers 5.24 windows them all when use_sliding_window;
    max_window_layers is not read), or None. NOTE: an absent `sliding_window` is the class
    default 4096, but a null one (what save_pretrained writes for `sliding_window=None`)
    leaves transformers' mask plain causal: no window, not the default."""
    if not c.flag("use_sliding_window", False) or c.get("sliding_window", 4096) is None:
        return None
    return c.integer("sliding_window", 4096)


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


stacked_expert_names = mlp_experts_stacked  # transformers 5's stacked `mlp.experts.*`


def build(arch: DecoderArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    """Per-head q/k RMSNorm before rotary; every layer windowed when the config sets a window."""
    p, rope = to_device(arch, params, device), rope_table(arch, device)

    def attention(i: int) -> Attention:
        q_norm, k_norm = qk_norms(arch, i, p)
        pre = f"layers.{i}."
        spec = attention_spec(arch, i, rope, arch.sliding_window)
        return Attention(spec, p[pre + "qkv"], p[pre + "o_proj"], q_norm, k_norm, qk_norm="head", linear=linear)

    return assemble(arch, p, attention, executor, device, linear, embed=embed)
