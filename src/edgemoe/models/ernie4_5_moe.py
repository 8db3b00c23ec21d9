"""ERNIE-4.5 MoE (`ernie4_5_moe`: baidu/ERNIE-4.5-21B-A3B-PT, -Base-PT, -Thinking,
ERNIE-4.5-300B-A47B-PT): transformers' `Ernie4_5_MoeForCausalLM`, read as transformers 5.24
reads it (its modular file: Llama's attention, Qwen3-MoE's decoder layer, Mixtral's experts,
ERNIE-4.5's rotary).

Llama-style blocks with:
- rotary on whole heads in interleaved pairs (2j, 2j + 1) rotated by frequency j
  (`apply_rotary_pos_emb` of ernie4_5: cos/sin repeat-interleaved, `rotate_half` on even/odd
  lanes), computed in fp32. We reorder each q and k head's rows evens first, then odds, at
  build: the rotate-half pairs (j, j + D/2) our rotary applies (scores are dot products,
  unchanged by one permutation of both q and k; the keys are cached in that order);
- dense MLPs (`intermediate_size`) except on layer i with (i + 1) % `moe_layer_interval` == 0
  and `moe_layer_start_index` <= i <= `moe_layer_end_index` (-1: the last layer);
- the router (`Ernie4_5_MoeTopKRouter`, fp32 weight and bias, as transformers keeps them:
  `_keep_in_fp32_modules_strict`): s = softmax(x·Wᵀ) in fp32; the top-k chosen by
  s + `e_score_correction_bias` (the bias only chooses); the weights are the chosen plain
  scores divided by max(Σ, `moe_norm_min`): the grouped router's softmax mode with a selection
  bias and one group (`kernels/router_sigmoid.py`), exact (its NOTE on the clamp);
- `moe_num_shared_experts` shared experts, one ungated MLP of n × `moe_intermediate_size`
  added after the routed sum (GLM-4.5's block: in the bank when n = 1, beside it otherwise).

Checkpoint names: Baidu's, which transformers' `save_pretrained` writes too (`mlp.gate.weight`,
`mlp.moe_statics.e_score_correction_bias` [1, E], `mlp.experts.E.gate_proj/up_proj/down_proj`,
`mlp.shared_experts.*`); transformers' module names (`mlp.gate.moe_statics.…`, stacked
`mlp.experts.gate_up_proj` / `down_proj`: `save_pretrained(save_original_format=False)`) load
too. The multi-token-prediction weights (`model.mtp_*`) are not read, as transformers skips them.

Refused by name: `use_bias` true (every linear, LM head included, would carry a bias; no release
sets it), a `moe_gate_act` other than softmax (Baidu's field, which transformers does not read:
another value would name another router), layer-placement fields that leave no MoE layer.
Not read, as transformers does not read them: `moe_use_aux_free` (the bias tensor is read
whatever it says), `moe_capacity`, `moe_gate`. Nor `num_nextn_predict_layers` (transformers
5.25's `num_mtp_layers`, saved under that name, null by default): transformers reads it only
for MTP speculative decoding (`generate(use_mtp=True)`) and refuses a value above 1.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.router_sigmoid import GroupedSigmoid
from edgemoe.layers.attention import Attention
from edgemoe.layers.mla_attention import deinterleave_rope
from edgemoe.models.arch import ConfigError, DecoderArch, HFConfig, check_experts, common_fields
from edgemoe.models.glm4_moe import moe_block, shared_expert_names
from edgemoe.models.llama_moe import assemble, attention_spec, rope_table, to_device
from edgemoe.models.names import (
    NameMap,
    Placement,
    Spelling,
    common_names,
    dense_mlp_names,
    expert_names,
    mlp_experts_stacked,
)
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

__all__ = ["IGNORED_PREFIXES", "SPELLINGS", "arch", "build", "checkpoint_map", "routing", "stacked_expert_names"]

MODEL_TYPE = "ernie4_5_moe"
NORM_MIN = 1e-12  # Ernie4_5_MoeConfig's moe_norm_min
IGNORED_PREFIXES = ("model.mtp_",)  # Baidu's MTP block and norms; transformers ignores "mtp" keys


def arch(config: dict[str, Any]) -> DecoderArch:
    c = HFConfig(config)
    _refuse_unsupported(c)
    fields = common_fields(c, eps=1e-5, max_pos=131072, kv_heads=4)
    fields["tie_word_embeddings"] = c.flag("tie_word_embeddings", True)  # the class default (common_fields': false)
    experts, moe = c.integer("moe_num_experts", 64), moe_layers(c, fields["num_layers"])
    check_experts(c, experts, fields["top_k"], moe)
    inter = c.integer("moe_intermediate_size", 1536)
    return DecoderArch(
        model_type=MODEL_TYPE,
        **fields,
        qk_norm="none",
        clip_qkv=None,
        sliding_window=None,
        num_experts=experts,
        moe_intermediate_size=inter,
        norm_topk_prob=True,  # always renormalised (not a config field)
        moe_layers=moe,
        intermediate_size=c.integer("intermediate_size", 12288),
        sigmoid_routing=routing(c),
        shared_intermediate_size=inter * c.integer("moe_num_shared_experts", 2, minimum=0),
    )


def moe_layers(c: HFConfig, layers: int) -> tuple[int, ...]:
    """The sparse layers, by `Ernie4_5_MoeDecoderLayer`'s rule. NOTE: an end index of -1 is the
    last layer (the config class's __post_init__); a null one too (Baidu's own code's meaning;
    transformers fails on it: nothing to match)."""
    start = c.integer("moe_layer_start_index", 1, minimum=0)
    end = c.integer("moe_layer_end_index", -1, minimum=-1)
    interval = c.integer("moe_layer_interval", 1)
    last = layers - 1 if end == -1 else end
    sparse = tuple(i for i in range(layers) if (i + 1) % interval == 0 and start <= i <= last)
    if not sparse:
        raise ConfigError(f"moe_layer_start_index={start}, moe_layer_end_index={end} and moe_layer_interval="
                          f"{interval} leave no MoE layer of {layers}: a dense model, which edgemoe does not serve")
    return sparse


def routing(c: HFConfig) -> GroupedSigmoid:
    """Softmax scores with a selection bias, one group, no routed scale, renormalised by
    max(Σ, moe_norm_min)."""
    norm_min = c.get("moe_norm_min")
    if norm_min is None:
        norm_min = NORM_MIN
    elif isinstance(norm_min, bool) or not isinstance(norm_min, int | float) or not 0 <= norm_min < math.inf:
        raise ConfigError(f"moe_norm_min={norm_min!r}: expected a number >= 0")
    return GroupedSigmoid(1, 1, 1.0, softmax=True, selection_bias=True, norm_min=float(norm_min))


def _refuse_unsupported(c: HFConfig) -> None:
    if c.flag("use_bias", False):
        raise ConfigError("use_bias=true: biased q/k/v/o, MLP, expert and LM-head projections are not supported "
                          "(no ERNIE-4.5 release sets it)")
    gate_act = c.get("moe_gate_act")
    if gate_act not in (None, "softmax"):
        raise ConfigError(f"moe_gate_act={gate_act!r}: ernie4_5_moe is computed with a softmax router only")


def checkpoint_map(a: DecoderArch) -> NameMap:
    m = common_names(a)
    for i in range(a.num_layers):
        m |= mlp_names(a, i)
    return m


def mlp_names(a: DecoderArch, i: int) -> NameMap:
    """Layer i's MLP: dense, or the router, its selection bias, the experts and the shared ones."""
    our, mlp = f"layers.{i}.", f"model.layers.{i}.mlp."
    if i not in a.moe_layers:
        return dense_mlp_names(a, i, mlp)
    m = {
        mlp + "gate.weight": Placement(our + "router"),
        # [1, E]: one row per modality in Baidu's layout, one for a text model; into our [E] with a new axis
        mlp + "moe_statics.e_score_correction_bias": Placement(our + "router_bias", (None,)),
    }
    m |= expert_names(a, i, mlp + "experts.{e}.{w}.weight", "gate_proj", "up_proj", "down_proj")
    if a.shared_intermediate_size:
        m |= shared_expert_names(a, i, mlp + "shared_experts.")
    return m


stacked_expert_names = mlp_experts_stacked  # transformers 5's stacked `mlp.experts.*`

# transformers' module names: the statics live under the gate (conversion_mapping's renaming).
SPELLINGS: tuple[Spelling, ...] = (((r"\.mlp\.moe_statics\.", ".mlp.gate.moe_statics."),),)


def rotate_half_rows(a: DecoderArch, qkv: torch.Tensor) -> torch.Tensor:
    """qkv [(Hq + 2 Hkv) D, H] with each q and k head's rows in the rotate-half order (evens,
    then odds): ERNIE's interleaved pairs become ours; v's rows stay (a new tensor)."""
    q, k, _ = a.qkv_rows
    return torch.cat((deinterleave_rope(qkv[:q], a.num_heads, 0), deinterleave_rope(qkv[q:q + k], a.num_kv_heads, 0),
                      qkv[q + k:]))


def build(arch: DecoderArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    """Llama attention over the reordered q/k rows; GLM-4.5's MoE block (the softmax router
    with its selection bias, the shared experts)."""
    p, rope = to_device(arch, params, device), rope_table(arch, device)

    def attention(i: int) -> Attention:
        pre = f"layers.{i}."
        qkv = rotate_half_rows(arch, p.pop(pre + "qkv"))  # popped: the device holds one copy
        return Attention(attention_spec(arch, i, rope), qkv, p[pre + "o_proj"], linear=linear)

    return assemble(arch, p, attention, executor, device, linear, lambda i: moe_block(arch, i, p, executor, linear),
                    embed=embed)
