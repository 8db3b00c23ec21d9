"""Qwen3.5 / Qwen3.6 MoE (Qwen3.5-35B-A3B, Qwen3.6-35B-A3B, …): GDN + gated attention
hybrid, every layer a sparse MoE with a shared expert.

Two model types: `qwen3_5_moe` is the multimodal checkpoint (`config.json` holds the
language model's settings in `text_config`; its tensors are under
`model.language_model.*`; the vision tower and multi-token-prediction weights are not
read, and the server refuses images), `qwen3_5_moe_text` a text-only one (`model.*`).
The GDN projections come apart (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`)
and load straight into one fused weight. Routing is softmax top-k, always renormalised.
Rotary: the interleaved multimodal rotary (mrope) gives every section the same position
for text, i.e. plain (partial) rotary.
"""

from __future__ import annotations

from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.models.arch import HFConfig
from edgemoe.models.hf_config import text_config as hf_text_config
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

MODEL_TYPE, TEXT_MODEL_TYPE = "qwen3_5_moe", "qwen3_5_moe_text"
__all__ = ["IGNORED_PREFIXES", "arch", "build", "checkpoint_map", "stacked_expert_names", "text_config"]


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's settings (`hf_config.text_config`: a multimodal config's
    `text_config` under its top level's tie_word_embeddings and dtype), or the config itself."""
    return hf_text_config(config, MODEL_TYPE, TEXT_MODEL_TYPE)


def arch(config: dict[str, Any]) -> HybridArch:
    multimodal = config.get("model_type") == MODEL_TYPE
    c = HFConfig(text_config(config))
    return hybrid_arch(
        c, model_type=MODEL_TYPE if multimodal else TEXT_MODEL_TYPE,
        checkpoint_prefix="model.language_model." if multimodal else "model.", gdn_layout="split",
        moe_layers=tuple(range(c.layers())), norm_topk_prob=True, num_experts=256,
    )


def checkpoint_map(a: HybridArch) -> NameMap:
    m = hybrid_names(a)
    qk, v, hv = 2 * a.linear_num_key_heads * a.linear_key_head_dim, a.value_width, a.linear_num_value_heads
    for i in a.gdn_layers:
        lp, proj = f"{a.checkpoint_prefix}layers.{i}.linear_attn.", f"layers.{i}.in_proj"
        rows = {"qkv": (0, qk + v), "z": (qk + v, qk + 2 * v), "b": (qk + 2 * v, qk + 2 * v + hv),
                "a": (qk + 2 * v + hv, qk + 2 * v + 2 * hv)}
        for name, (lo, hi) in rows.items():
            m[lp + f"in_proj_{name}.weight"] = Placement(proj, (slice(lo, hi),))
    return m


def build(arch: HybridArch, params: Params, executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    return assemble(arch, to_device(arch, params, device), executor, device, linear, embed=embed)
