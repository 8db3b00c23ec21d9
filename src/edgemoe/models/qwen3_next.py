"""Qwen3-Next (Qwen3-Next-80B-A3B): GDN + gated attention hybrid, MoE with a shared expert.

The GDN input projections come interleaved per key-head group: `in_proj_qkvz` rows are,
for each of the Hk groups, [q (Dk) | k (Dk) | v (r·Dv) | z (r·Dv)] (r = Hv / Hk value
heads per key head) and `in_proj_ba` rows [b (r) | a (r)]. `build()` reorders them once
into the q | k | v | z | b | a layout the GDN layer computes with one GEMM. Routing is
softmax top-k, renormalised when `norm_topk_prob`; `mlp_only_layers` and
`decoder_sparse_step` make some layers dense, as in Qwen3-MoE.
"""

from __future__ import annotations

from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.models.arch import HFConfig
from edgemoe.models.hybrid_arch import HybridArch, hybrid_arch
from edgemoe.models.names import NameMap, Placement
from edgemoe.models.qwen_hybrid import (
    IGNORED_PREFIXES,
    Params,
    assemble,
    hybrid_names,
    stacked_expert_names,
    to_device,
)
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

MODEL_TYPE = "qwen3_next"
__all__ = ["IGNORED_PREFIXES", "arch", "build", "checkpoint_map", "stacked_expert_names"]


def arch(config: dict[str, Any]) -> HybridArch:
    c = HFConfig(config)
    layers, experts = c.layers(), c.integer("num_experts", 512, minimum=0)
    step, dense_only = c.integer("decoder_sparse_step", 1), set(c.int_list("mlp_only_layers"))
    moe = tuple(i for i in range(layers) if i not in dense_only and experts > 0 and (i + 1) % step == 0)
    return hybrid_arch(
        c, model_type=MODEL_TYPE, checkpoint_prefix="model.", gdn_layout="interleaved", moe_layers=moe,
        norm_topk_prob=c.flag("norm_topk_prob", True),
    )


def checkpoint_map(a: HybridArch) -> NameMap:
    m = hybrid_names(a)
    for i in a.gdn_layers:
        lp = f"{a.checkpoint_prefix}layers.{i}.linear_attn."
        m[lp + "in_proj_qkvz.weight"] = Placement(f"layers.{i}.in_qkvz")
        m[lp + "in_proj_ba.weight"] = Placement(f"layers.{i}.in_ba")
    return m


def deinterleave(a: HybridArch, qkvz: torch.Tensor, ba: torch.Tensor) -> torch.Tensor:
    """Per-group [q|k|v|z] and [b|a] rows → one [q | k | v | z | b | a] weight. Value head
    i·r + j is group i's j-th (transformers' reshape), so groups concatenate in order."""
    hk, dk, dv = a.linear_num_key_heads, a.linear_key_head_dim, a.linear_value_head_dim
    r, H = a.linear_num_value_heads // hk, a.hidden_size
    q, k, v, z = qkvz.view(hk, 2 * dk + 2 * r * dv, H).split([dk, dk, r * dv, r * dv], dim=1)
    b, a_ = ba.view(hk, 2 * r, H).split([r, r], dim=1)
    return torch.cat([t.reshape(-1, H) for t in (q, k, v, z, b, a_)])


def build(arch: HybridArch, params: Params, executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    p = to_device(arch, params, device)
    for i in arch.gdn_layers:
        pre = f"layers.{i}."
        p[pre + "in_proj"] = deinterleave(arch, p.pop(pre + "in_qkvz"), p.pop(pre + "in_ba"))
    return assemble(arch, p, executor, device, linear, embed=embed)
