"""MiniMax-M2 (MiniMaxAI/MiniMax-M2, M2.1, M2.5: `minimax_m2`): transformers'
`MiniMaxM2ForCausalLM`, read as transformers 5.24 reads it (its modular file: Mixtral's
blocks, FlexOlmo's attention, GLM-4.5's rotary).

Llama-style blocks, every layer sparse, with:
- q/k RMSNorm over the whole q / k projection, all heads together (OLMoE's `qk_norm="full"`);
- rotary on the first `rotary_dim` dims of each head (64 of 128 in every release): config.json
  spells it `rotary_dim`, which `MiniMaxM2Config` turns into `partial_rotary_factor` =
  rotary_dim / head_dim unless a factor is given (`rope_parameters` first, then the top
  level); theta 5e6 by default;
- a sigmoid router with a selection bias (`e_score_correction_bias`): fp32 sigmoid of the
  logits, the bias only chooses the top-k, the chosen plain scores renormalised, no routed
  scale and no groups: GLM-4.5's router (`kernels/router_sigmoid.py`) with one group.
  NOTE: transformers 5.24 keeps neither the router's weight nor the bias in fp32 (they
  take the model's dtype, bf16 in the releases); we keep both in fp32, as vLLM and SGLang
  do, so a bf16 run chooses by the checkpoint's bias, not its bf16 rounding (the same in fp32);
- experts of width `intermediate_size`; no shared expert, no dense layers.

Checkpoint names: MiniMax's (`block_sparse_moe.gate`, `block_sparse_moe.e_score_correction_bias`,
`block_sparse_moe.experts.E.w1/w3/w2`), which transformers' `save_pretrained` writes too;
transformers' module names (`mlp.gate`, `mlp.e_score_correction_bias`, the stacked
`mlp.experts.gate_up_proj` / `down_proj`: `save_pretrained(save_original_format=False)`)
and the other tools' spellings load as Mixtral's do. The published weights are FP8 (e4m3,
128 x 128 `weight_scale_inv` blocks; gate, bias and LM head unquantised): `quant/`.

Published fields that transformers does not read, but which name another model than the
one it computes, are refused by name (`scoring_func`, `use_qk_norm`, `qk_norm_type`,
`shared_intermediate_size`, `attn_type_list`); the multi-token-prediction modules
(`use_mtp`, `num_mtp_modules`) are not read, as transformers builds none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.router_sigmoid import GroupedSigmoid
from edgemoe.layers.attention import Attention
from edgemoe.models import mixtral
from edgemoe.models.arch import ConfigError, DecoderArch, HFConfig, check_experts, common_fields
from edgemoe.models.glm4_moe import moe_block
from edgemoe.models.llama_moe import assemble, attention_spec, qk_norms, rope_table, to_device
from edgemoe.models.names import NameMap, Placement, Spelling, StackedMap, common_names, expert_names
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

__all__ = ["SPELLINGS", "arch", "build", "checkpoint_map", "stacked_expert_names"]

MODEL_TYPE = "minimax_m2"
HEAD_DIM = 128  # MiniMaxM2Config's default: not hidden_size / heads (3072 / 48 = 64)
ROUTING = GroupedSigmoid(n_group=1, topk_group=1, scale=1.0)  # no groups, no routed scale
log = logging.getLogger(__name__)


def arch(config: dict[str, Any]) -> DecoderArch:
    c = HFConfig(config)
    _refuse_other_models(c)
    head_dim = c.integer("head_dim", HEAD_DIM)
    c = HFConfig(with_rotary_factor(c, head_dim))
    fields = common_fields(c, eps=1e-6, max_pos=196608, head_dim=head_dim, kv_heads=8)
    experts, moe = c.integer("num_local_experts", 256), tuple(range(fields["num_layers"]))
    check_experts(c, experts, fields["top_k"], moe)
    if ROUTING.check(experts, fields["top_k"]) is not None:  # its one group ranks by its two best scores
        raise ConfigError(f"num_local_experts={experts}: the sigmoid router needs two or more experts")
    if (scale := c.get("routed_scaling_factor")) not in (None, 1, 1.0):
        log.warning("routed_scaling_factor=%r is not read for minimax_m2 (transformers does not scale)", scale)
    return DecoderArch(
        model_type=MODEL_TYPE,
        **fields,
        qk_norm="full",
        clip_qkv=None,
        sliding_window=None,  # transformers: "No sliding window opposed to mixtral"
        num_experts=experts,
        moe_intermediate_size=c.integer("intermediate_size", 1536),
        norm_topk_prob=True,  # always renormalised (not a config field)
        moe_layers=moe,
        intermediate_size=0,
        sigmoid_routing=ROUTING,
    )


def with_rotary_factor(c: HFConfig, head_dim: int) -> Mapping[str, Any]:
    """config.json with `rotary_dim` as the top-level `partial_rotary_factor` it stands for,
    where it decides (`MiniMaxM2Config.convert_rope_params_to_dict`: a factor in
    `rope_parameters` / `rope_scaling`, or a top-level one, wins over it)."""
    raw = c.raw
    rotary_dim = c.integer("rotary_dim", None)
    given = c.get("rope_scaling") or c.get("rope_parameters")
    if rotary_dim is None or "partial_rotary_factor" in raw or (
            isinstance(given, Mapping) and given.get("partial_rotary_factor") is not None):
        return raw
    if rotary_dim % 2 or rotary_dim > head_dim:  # rotate-half pairs dims within the rotated part
        raise ConfigError(f"rotary_dim={rotary_dim}: expected an even number of dims up to head_dim={head_dim}")
    return {**raw, "partial_rotary_factor": rotary_dim / head_dim}


# Published fields transformers does not read, and the one value of each it computes.
_EXPECTED: dict[str, Any] = {
    "scoring_func": "sigmoid",
    "use_qk_norm": True,
    "qk_norm_type": "per_layer",  # over the whole projection; MiniMax-M3's "per_head" is another model
}


def _refuse_other_models(c: HFConfig) -> None:
    """A published field that says the checkpoint is not the model transformers computes."""
    for key, want in _EXPECTED.items():
        if (value := c.get(key)) is not None and value != want:
            raise ConfigError(f"{key}={value!r}: minimax_m2 is computed with {key}={want!r} only")
    if c.get("shared_intermediate_size") not in (None, 0):
        raise ConfigError(f"shared_intermediate_size={c.get('shared_intermediate_size')!r}: minimax_m2 has no "
                          "shared expert")
    kinds = c.get("attn_type_list")
    if kinds is not None and (not isinstance(kinds, list) or any(k != 1 for k in kinds)):
        raise ConfigError(f"attn_type_list={kinds!r}: only full attention (1) layers are supported "
                          "(0 is MiniMax-01's lightning attention)")


def checkpoint_map(a: DecoderArch) -> NameMap:
    """MiniMax's names (Mixtral's, plus the selection bias beside the gate)."""
    m = common_names(a)
    for i in range(a.num_layers):
        moe, our = f"model.layers.{i}.block_sparse_moe.", f"layers.{i}."
        m[moe + "gate.weight"] = Placement(our + "router")
        m[moe + "e_score_correction_bias"] = Placement(our + "router_bias")
        m |= expert_names(a, i, moe + "experts.{e}.{w}.weight", "w1", "w3", "w2")
    return m


def stacked_expert_names(a: DecoderArch) -> StackedMap:
    """A layer's experts stacked (`block_sparse_moe.experts.gate_up_proj`; `mlp.` under the
    module-name spelling: transformers 5's in-memory layout)."""
    return mixtral.stacked_expert_names(a)


# Mixtral's: `.block_sparse_moe.` -> `.mlp.` also gives transformers' `mlp.e_score_correction_bias`.
SPELLINGS: tuple[Spelling, ...] = mixtral.SPELLINGS


def build(arch: DecoderArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    """q/k norms over the whole projection before the partial rotary; GLM-4.5's sigmoid-routed
    MoE block (no shared expert: a plain SparseMoE)."""
    p, rope = to_device(arch, params, device), rope_table(arch, device)

    def attention(i: int) -> Attention:
        q_norm, k_norm = qk_norms(arch, i, p)
        pre = f"layers.{i}."
        return Attention(attention_spec(arch, i, rope), p[pre + "qkv"], p[pre + "o_proj"], q_norm, k_norm,
                         qk_norm="full", linear=linear)

    return assemble(arch, p, attention, executor, device, linear, lambda i: moe_block(arch, i, p, executor, linear),
                    embed=embed)
