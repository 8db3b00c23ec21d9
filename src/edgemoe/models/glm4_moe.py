"""GLM-4.5 / 4.6 / 4.7 MoE (zai-org/GLM-4.5-Air, GLM-4.5, GLM-4.6, GLM-4.7): transformers'
`Glm4MoeForCausalLM`.

Llama-style blocks with: biased q/k/v projections (`attention_bias`), optional per-head
q/k RMSNorm (`use_qk_norm`), rotary on the first half of each head (`partial_rotary_factor`
0.5); dense MLPs on the first `first_k_dense_replace` layers; in the others a sigmoid
router with a selection bias and group-limited top-k (`kernels/router_sigmoid.py`), the
routed experts' sum scaled by `routed_scaling_factor`, plus an ungated shared expert of
`n_shared_experts` × `moe_intermediate_size`. The multi-token-prediction layers a
checkpoint carries after the last layer (`num_nextn_predict_layers`) are not read, as
transformers does not read them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.router_sigmoid import GroupedSigmoid, SigmoidRouter
from edgemoe.layers.attention import Attention
from edgemoe.layers.mlp import DenseMLP, activation
from edgemoe.layers.moe import SparseMoE
from edgemoe.layers.shared_moe import SharedExpertMoE
from edgemoe.models.arch import ConfigError, DecoderArch, HFConfig, check_experts, common_fields
from edgemoe.models.llama_moe import MLP, Params, assemble, attention_spec, qk_norms, rope_table, to_device
from edgemoe.models.names import (
    NameMap,
    Placement,
    common_names,
    dense_mlp_names,
    expert_names,
    mlp_experts_stacked,
    qkv_bias_names,
)
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

MODEL_TYPE = "glm4_moe"
log = logging.getLogger(__name__)


def arch(config: dict[str, Any]) -> DecoderArch:
    c = HFConfig(config)
    layers, experts = c.layers(), c.integer("n_routed_experts", 128)
    moe = moe_layers(c, layers)
    fields = common_fields(c, eps=1e-5, max_pos=131072, kv_heads=8)
    check_experts(c, experts, fields["top_k"], moe)
    routing = GroupedSigmoid(c.integer("n_group", 1), c.integer("topk_group", 1),
                             float(c.number("routed_scaling_factor", 1.0)))
    if (why := routing.check(experts, fields["top_k"])) is not None:
        raise ConfigError(why)
    inter = c.integer("moe_intermediate_size", 1408)
    return DecoderArch(
        model_type=MODEL_TYPE,
        **fields,
        qk_norm="head" if c.flag("use_qk_norm", False) else "none",
        clip_qkv=None,
        sliding_window=None,
        num_experts=experts,
        moe_intermediate_size=inter,
        norm_topk_prob=c.flag("norm_topk_prob", True),
        moe_layers=moe,
        intermediate_size=c.integer("intermediate_size", 10944),
        attention_bias=c.flag("attention_bias", False),
        sigmoid_routing=routing,
        shared_intermediate_size=inter * c.integer("n_shared_experts", 1, minimum=0),
    )


def moe_layers(c: HFConfig, layers: int, default_dense: int = 1) -> tuple[int, ...]:
    """The sparse layers: from `first_k_dense_replace` on (`default_dense` when absent: the
    config class's default), transformers 5.24's rule for glm4_moe and deepseek_v3. NOTE: its `mlp_layer_types` is GLM-5's (glm_moe_dsa) field, which glm4_moe's
    modeling does not read; one naming other layers is ignored as transformers ignores it,
    with a warning."""
    first_dense = c.integer("first_k_dense_replace", default_dense, minimum=0)
    sparse = tuple(range(first_dense, layers))
    if not sparse:  # else check_experts' refusal names fields these families do not have
        raise ConfigError(f"first_k_dense_replace={first_dense} leaves no MoE layer of {layers}: a dense model, "
                          "which edgemoe does not serve")
    kinds = c.get("mlp_layer_types")
    if isinstance(kinds, list) and tuple(i for i, k in enumerate(kinds) if k == "sparse") != sparse:
        log.warning("mlp_layer_types=%r is not read for %s (transformers reads first_k_dense_replace=%d: "
                    "layers %d.. sparse)", kinds, c.model_type, first_dense, first_dense)
    return sparse


def ignored_prefixes(a: DecoderArch) -> tuple[str, ...]:
    """Checkpoint tensors not read: the MTP layers after the last decoder layer (GLM-4.5-Air
    ships one as model.layers.46; four would be 46..49, so a few indices are covered)."""
    return tuple(f"model.layers.{a.num_layers + j}." for j in range(8))


def checkpoint_map(a: DecoderArch) -> NameMap:
    m = common_names(a)
    for i in range(a.num_layers):
        if a.attention_bias:
            m |= qkv_bias_names(a, i)
        m |= mlp_names(a, i)
    return m


def mlp_names(a: DecoderArch, i: int) -> NameMap:
    """Layer i's MLP: dense, or the sigmoid router with its selection bias, the routed experts
    and the shared expert (GLM-4.5's names, DeepSeek-V3's and GLM-4.7-Flash's too; DeepSeek-V2's
    without the bias)."""
    our, mlp = f"layers.{i}.", f"model.layers.{i}.mlp."
    if i not in a.moe_layers:
        return dense_mlp_names(a, i, mlp)
    m = {mlp + "gate.weight": Placement(our + "router")}
    if a.sigmoid_routing is not None and a.sigmoid_routing.selection_bias:  # DeepSeek-V2's softmax router has none
        m[mlp + "gate.e_score_correction_bias"] = Placement(our + "router_bias")
    m |= expert_names(a, i, mlp + "experts.{e}.{w}.weight", "gate_proj", "up_proj", "down_proj")
    if a.shared_intermediate_size:
        m |= shared_expert_names(a, i, mlp + "shared_experts.")
    return m


def shared_expert_names(a: DecoderArch, i: int, prefix: str) -> NameMap:
    """The shared expert: expert E of the layer's bank when it has the routed width (every
    GLM release: one shared expert), else a dense MLP's params."""
    inter = a.shared_intermediate_size
    if a.shared_in_store:
        E, bank = a.num_experts, f"experts.{i}."
        return {
            prefix + "gate_proj.weight": Placement(bank + "gate_up", (E, slice(0, inter))),
            prefix + "up_proj.weight": Placement(bank + "gate_up", (E, slice(inter, None))),
            prefix + "down_proj.weight": Placement(bank + "down", (E,)),
        }
    our = f"layers.{i}."
    return {
        prefix + "gate_proj.weight": Placement(our + "shared_gate_up", (slice(0, inter),)),
        prefix + "up_proj.weight": Placement(our + "shared_gate_up", (slice(inter, None),)),
        prefix + "down_proj.weight": Placement(our + "shared_down"),
    }


stacked_expert_names = mlp_experts_stacked  # transformers 5's stacked `mlp.experts.*`


def build(arch: DecoderArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    p, rope = to_device(arch, params, device), rope_table(arch, device)

    def attention(i: int) -> Attention:
        pre = f"layers.{i}."
        q_norm, k_norm = qk_norms(arch, i, p) if arch.qk_norm == "head" else (None, None)
        return Attention(attention_spec(arch, i, rope), p[pre + "qkv"], p[pre + "o_proj"], q_norm, k_norm,
                         qk_norm=arch.qk_norm, linear=linear, qkv_bias=p.get(pre + "qkv_bias"))

    return assemble(arch, p, attention, executor, device, linear, lambda i: moe_block(arch, i, p, executor, linear),
                    embed=embed)


def moe_block(arch: DecoderArch, i: int, p: Params, executor: MoEExecutor, linear: Linear) -> MLP:
    """Layer i's MLP: dense, or the sigmoid-routed experts plus the ungated shared expert
    (in the bank as one more pair of weight 1: a plain SparseMoE, whose combine fuses the
    next layer's norm; a wider one as a dense MLP beside it)."""
    pre, act = f"layers.{i}.", activation(arch.hidden_act)
    if i not in arch.moe_layers:
        return DenseMLP(p[pre + "gate_up"], p[pre + "down"], act)
    assert arch.sigmoid_routing is not None
    shared = arch.num_experts if arch.shared_in_store else None
    router = SigmoidRouter(p[pre + "router"], p.get(pre + "router_bias"), arch.sigmoid_routing, shared)
    routed = SparseMoE(i, p[pre + "router"], arch.top_k, arch.norm_topk_prob, executor, linear, sigmoid=router)
    if not arch.shared_intermediate_size or arch.shared_in_store:
        return routed
    return SharedExpertMoE(routed, None, None, DenseMLP(p[pre + "shared_gate_up"], p[pre + "shared_down"], act))
