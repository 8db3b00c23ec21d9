"""Mixtral (mistralai/Mixtral-8x7B). No q/k norm, top-k weights always renormalised,
optional sliding-window attention; experts named `block_sparse_moe.experts.N.w1/w2/w3`
(w1 = gate, w3 = up, w2 = down)."""

from __future__ import annotations

from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.layers.attention import Attention
from edgemoe.models.arch import DecoderArch, HFConfig, check_experts, common_fields
from edgemoe.models.llama_moe import assemble, attention_spec, rope_table, to_device
from edgemoe.models.names import NameMap, Placement, Spelling, StackedMap, common_names, expert_names
from edgemoe.models.names import stacked_expert_names as stacked_names
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

MODEL_TYPE = "mixtral"


def arch(config: dict[str, Any]) -> DecoderArch:
    c = HFConfig(config)
    fields = common_fields(c, eps=1e-5, max_pos=131072, kv_heads=8)  # MixtralConfig: 4096 * 32
    experts, moe = c.integer("num_local_experts"), tuple(range(fields["num_layers"]))
    check_experts(c, experts, fields["top_k"], moe)
    return DecoderArch(
        model_type=MODEL_TYPE,
        **fields,
        qk_norm="none",
        clip_qkv=None,
        sliding_window=c.integer("sliding_window", None),
        num_experts=experts,
        moe_intermediate_size=c.integer("intermediate_size"),
        norm_topk_prob=True,
        moe_layers=moe,
        intermediate_size=0,
    )


def checkpoint_map(a: DecoderArch) -> NameMap:
    m = common_names(a)
    for i in range(a.num_layers):
        moe = f"model.layers.{i}.block_sparse_moe."
        m[moe + "gate.weight"] = Placement(f"layers.{i}.router")
        m |= expert_names(a, i, moe + "experts.{e}.{w}.weight", "w1", "w3", "w2")
    return m


def stacked_expert_names(a: DecoderArch) -> StackedMap:
    """The experts stacked a layer at a time (transformers 5's `experts.gate_up_proj`)."""
    return stacked_names(a, a.moe_layers, "model.layers.{layer}.block_sparse_moe.experts.", "w1", "w3", "w2")


# Other tools' names for the experts: llm-compressor's (`block_sparse_moe.experts.E.gate_proj` /
# `up_proj` / `down_proj`) and gptqmodel's, transformers 5's module names (the same under `mlp`,
# with `mlp.gate` and the stacked `mlp.experts.gate_up_proj`)
_GLU_NAMES: Spelling = ((r"\.w1\.", ".gate_proj."), (r"\.w3\.", ".up_proj."), (r"\.w2\.", ".down_proj."))
SPELLINGS: tuple[Spelling, ...] = (_GLU_NAMES, ((r"\.block_sparse_moe\.", ".mlp."), *_GLU_NAMES))


def build(arch: DecoderArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    """No q/k norm; sliding-window attention when the config sets a window."""
    p, rope = to_device(arch, params, device), rope_table(arch, device)

    def attention(i: int) -> Attention:
        pre = f"layers.{i}."
        return Attention(attention_spec(arch, i, rope, arch.sliding_window), p[pre + "qkv"], p[pre + "o_proj"],
                         linear=linear)

    return assemble(arch, p, attention, executor, device, linear, embed=embed)
