"""DeepSeek-V2 family (`deepseek_v2`: DeepSeek-V2-Lite(-Chat), DeepSeek-Coder-V2-Lite /
-Instruct, DeepSeek-V2(-Chat), DeepSeek-V2.5, DeepSeek-Coder-V2): transformers'
`DeepseekV2ForCausalLM`, served by the multi-head latent attention model of `models/mla.py`
(the same blocks, names and build as DeepSeek-V3's).

What differs from DeepSeek-V3, each read as transformers 5.24 reads it:
- the router: fp32 softmax scores with no selection bias; `topk_method` "greedy" (the top-k
  of all experts) or "group_limited_greedy" (only the best `topk_group` of `n_group` groups
  compete, a group ranked by its best score); the weights are the scores ×
  `routed_scaling_factor` (the grouped router's softmax mode, `kernels/router_sigmoid.py`).
  NOTE: `norm_topk_prob` is not read: transformers' V2 router never renormalises. DeepSeek's
  own code renormalised where it was true (and then did not scale); every release sets it
  false, where the two agree. A true one is served as transformers serves it, with a warning;
- rotary: always DeepSeek's interleaved pairs (2i, 2i + 1) (complex products in
  transformers; no `rope_interleave` field), de-interleaved in the weights at build as V3's;
  YaRN's mscale(factor, mscale_all_dim)² in the softmax scale as V3's;
- dense MLPs (`intermediate_size`) on the first `first_k_dense_replace` layers (default 0),
  then MoE (`moe_intermediate_size`). `moe_layer_freq`, which DeepSeek's own code read, is not
  (every release sets 1): a value other than 1 is ignored with a warning, as transformers
  ignores it;
- `n_shared_experts` (default 2) shared experts, one MLP of n × `moe_intermediate_size`:
  wider than a routed expert, so a dense MLP beside the bank (`glm4_moe.moe_block`);
- no multi-token-prediction layers.
Refused by name: a `topk_method` other than those two (V3's "noaux_tc" is `deepseek_v3`'s),
a group-limited router without `n_group` / `topk_group` or whose kept groups hold fewer than
top-k experts, a `scoring_func` other than softmax, `mlp_bias` true.
"""

from __future__ import annotations

import logging
from typing import Any

from edgemoe.kernels.router_sigmoid import GroupedSigmoid
from edgemoe.models.arch import ConfigError, HFConfig, check_experts
from edgemoe.models.glm4_moe import moe_layers
from edgemoe.models.mla import MlaArch, build, checkpoint_map, latent_attention, stacked_expert_names

__all__ = ["arch", "build", "checkpoint_map", "routing", "stacked_expert_names"]

MODEL_TYPE = "deepseek_v2"
TOPK_METHODS = ("greedy", "group_limited_greedy")
log = logging.getLogger(__name__)


def arch(config: dict[str, Any]) -> MlaArch:
    c = HFConfig(config)
    layers, experts = c.layers(), c.integer("n_routed_experts", 64)
    moe = moe_layers(c, layers, default_dense=0)
    _warn_unread(c)
    fields, attn = latent_attention(config, eps=1e-6, max_pos=2048, q_lora=1536, nope=128, v=128)
    check_experts(c, experts, fields["top_k"], moe)
    route = routing(c)
    if (why := route.check(experts, fields["top_k"])) is not None:
        raise ConfigError(why)
    if c.flag("mlp_bias", False):
        raise ConfigError("mlp_bias=true: biased dense and shared-expert MLPs are not supported")
    inter = c.integer("moe_intermediate_size", 1407)
    return MlaArch(
        model_type=MODEL_TYPE,
        **fields,
        **attn,  # q_lora_rank null on the Lite models: one q projection
        num_experts=experts,
        moe_intermediate_size=inter,
        norm_topk_prob=False,  # the NOTE above: transformers' V2 router never renormalises
        moe_layers=moe,
        intermediate_size=c.integer("intermediate_size", 11008),
        attention_bias=c.flag("attention_bias", False),
        sigmoid_routing=route,
        shared_intermediate_size=inter * c.integer("n_shared_experts", 2, minimum=0),
        rope_interleave=True,
    )


def routing(c: HFConfig) -> GroupedSigmoid:
    """The router's settings: softmax scores, all experts (greedy) or the kept groups'."""
    method = c.get("topk_method", "greedy")
    if method not in TOPK_METHODS:
        raise ConfigError(f"topk_method={method!r} is not a DeepSeek-V2 router ({' / '.join(TOPK_METHODS)})")
    scoring = c.get("scoring_func", "softmax")  # DeepSeek's own config.json writes it; transformers does not
    if scoring != "softmax":
        raise ConfigError(f"scoring_func={scoring!r}: DeepSeek-V2's router is a softmax (a sigmoid one is "
                          "deepseek_v3's)")
    scale = float(c.number("routed_scaling_factor", 1.0))
    if method == "greedy":  # n_group / topk_group are not read (V2-Lite sets both 1)
        return GroupedSigmoid(1, 1, scale, softmax=True, selection_bias=False)
    return GroupedSigmoid(c.integer("n_group"), c.integer("topk_group"), scale, softmax=True, selection_bias=False)


def _warn_unread(c: HFConfig) -> None:
    """Fields DeepSeek's own modeling code read and transformers' does not (the docstring)."""
    if c.flag("norm_topk_prob", False):
        log.warning("norm_topk_prob=true is not read for deepseek_v2: transformers' router never renormalises "
                    "(DeepSeek's original code would, without routed_scaling_factor); served as transformers "
                    "serves it")
    freq = c.integer("moe_layer_freq", 1)
    if freq != 1:
        log.warning("moe_layer_freq=%d is not read for deepseek_v2: transformers makes every layer from "
                    "first_k_dense_replace on sparse", freq)
