"""DeepSeek-V3-style MoE with multi-head latent attention: transformers' `DeepseekV3ForCausalLM`
(`deepseek_v3`: DeepSeek-V3 / V3.1 / R1, Kimi-K2) and `Glm4MoeLiteForCausalLM` (`glm4_moe_lite`:
GLM-4.7-Flash).

Pre-norm blocks with:
- attention: MLA (`layers/mla_attention.py`): a low-rank query (`q_a_proj` → RMSNorm →
  `q_b_proj`, or one `q_proj` where `q_lora_rank` is null), one shared latent and rotary key
  (`kv_a_proj_with_mqa` → RMSNorm'd latent + `k_pe`), `kv_b_proj` absorbed into the query and
  the output, so the KV cache holds kv_lora_rank + qk_rope_head_dim values a token and layer
  (576 for both releases) instead of 2 × heads × head dims; the latent norms' eps is
  transformers' fixed 1e-6; scale (qk_nope + qk_rope)^-0.5, times YaRN's mscale(factor,
  mscale_all_dim)² where the rope is scaled; interleaved rotary pairs (`rope_interleave`)
  de-interleaved in the weights at build;
- MLP: dense on the first layers (deepseek_v3: `first_k_dense_replace`; glm4_moe_lite:
  `mlp_layer_types`, transformers' default the first one dense), then GLM-4.5's MoE (the same
  modeling in all three families): a sigmoid router with a selection bias and group-limited
  top-k, the routed sum scaled, plus the shared expert (`models/glm4_moe.py`).
The multi-token-prediction layers after the last one are not read, as transformers does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.router_sigmoid import GroupedSigmoid
from edgemoe.layers.attention_backend import AttentionSpec
from edgemoe.layers.mla_attention import MlaAttention, MlaDims, MlaWeights, deinterleave_rope, split_kv_b
from edgemoe.layers.norm import RMSNorm
from edgemoe.layers.rotary import RopeSpec
from edgemoe.models.arch import ConfigError, DecoderArch, HFConfig, check_experts, common_fields
from edgemoe.models.glm4_moe import ignored_prefixes, mlp_names, moe_block, moe_layers
from edgemoe.models.llama_moe import Params, assemble, rope_table, to_device
from edgemoe.models.names import NameMap, Placement, mlp_experts_stacked
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

__all__ = ["MlaArch", "arch", "build", "checkpoint_map", "ignored_prefixes", "stacked_expert_names"]

LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm without the config's eps
MLP_KINDS = ("dense", "sparse")


@dataclass(frozen=True)
class MlaArch(DecoderArch):
    """DecoderArch whose attention is MLA: `num_kv_heads` 1 and `head_dim` the cached row
    (qk_rope_head_dim + kv_lora_rank), the value being the key (`shared_kv`)."""

    q_lora_rank: int = 0  # 0: one q projection
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_interleave: bool = True
    attn_scale: float = 1.0

    @property
    def shared_kv(self) -> bool:
        return True

    @property
    def mla_dims(self) -> MlaDims:
        return MlaDims(self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank, self.v_head_dim)

    @property
    def projection_width(self) -> int:
        """The absorbed query [Hq, rope + kv_lora] is the widest a token holds."""
        d = self.mla_dims
        return self.num_heads * max(d.cache_dim, d.nope + d.rope, d.nope + d.v)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {k: v for k, v in super().param_shapes().items()
                  if k.rpartition(".")[2] not in ("qkv", "qkv_bias", "o_proj", "q_norm", "k_norm")}
        H, d, q_in = self.hidden_size, self.mla_dims, self.q_lora_rank or self.hidden_size
        for i in range(self.num_layers):
            p = f"layers.{i}."
            if self.q_lora_rank:
                shapes[p + "q_a"], shapes[p + "q_a_norm"] = (self.q_lora_rank, H), (self.q_lora_rank,)
            shapes[p + "q"] = (d.num_heads * (d.nope + d.rope), q_in)
            shapes[p + "kv_a"], shapes[p + "kv_a_norm"] = (d.kv_lora + d.rope, H), (d.kv_lora,)
            shapes[p + "kv_b"] = (d.num_heads * (d.nope + d.v), d.kv_lora)
            shapes[p + "o_proj"] = (H, d.num_heads * d.v)
            if self.attention_bias:  # transformers' q_a / kv_a / o projections (a lone q_proj has none)
                if self.q_lora_rank:
                    shapes[p + "q_a_bias"] = (self.q_lora_rank,)
                shapes[p + "kv_a_bias"], shapes[p + "o_bias"] = (d.kv_lora + d.rope,), (H,)
        return shapes


def arch(config: dict[str, Any]) -> MlaArch:
    c = HFConfig(config)
    model_type = c.model_type
    glm = model_type == "glm4_moe_lite"
    layers, experts = c.layers(), c.integer("n_routed_experts", 64 if glm else 256)
    moe = _glm_lite_moe_layers(c, layers) if glm else moe_layers(c, layers, default_dense=3)
    fields, attn = latent_attention(config, eps=1e-5 if glm else 1e-6, max_pos=202752 if glm else 4096,
                                    q_lora=768 if glm else 1536, nope=192 if glm else 128, v=256 if glm else 128)
    if fields["rope"].rotary_dim != (rope_dim := attn["qk_rope_head_dim"]):
        raise ConfigError(f"partial_rotary_factor: MLA rotates all qk_rope_head_dim={rope_dim} dims")
    check_experts(c, experts, fields["top_k"], moe)
    routing = GroupedSigmoid(c.integer("n_group", 1 if glm else 8), c.integer("topk_group", 1 if glm else 4),
                             float(c.number("routed_scaling_factor", 1.8 if glm else 2.5)))
    if (why := routing.check(experts, fields["top_k"])) is not None:
        raise ConfigError(why)
    inter = c.integer("moe_intermediate_size", 1536 if glm else 2048)
    return MlaArch(
        model_type=str(model_type),
        **fields,
        **attn,
        num_experts=experts,
        moe_intermediate_size=inter,
        # NOTE: null is false here: DeepseekV3Config keeps it and the modelling tests its truth
        # (Glm4MoeLiteConfig refuses a null outright).
        norm_topk_prob=c.flag("norm_topk_prob", True, null=False),
        moe_layers=moe,
        intermediate_size=c.integer("intermediate_size", 10240 if glm else 18432),
        attention_bias=c.flag("attention_bias", False),
        sigmoid_routing=routing,
        shared_intermediate_size=inter * c.integer("n_shared_experts", 1, minimum=0),
        rope_interleave=c.flag("rope_interleave", True, null=False),
    )


def latent_attention(config: dict[str, Any], *, eps: float, max_pos: int, q_lora: int, nope: int,
                     v: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(common_fields, the MlaArch attention fields) of an MLA family's config.json, with
    the family's class defaults for `q_lora_rank`, `qk_nope_head_dim` and `v_head_dim`:
    one kv head of rope + kv_lora dims (num_key_value_heads means nothing to MLA: one
    latent serves every head, and V3's class default, 128, need not divide the heads), a
    null `q_lora_rank` one q projection, the softmax scale with YaRN's mscale."""
    c = HFConfig({k: val for k, val in config.items() if k != "num_key_value_heads"})
    rope_dim, kv_lora = c.integer("qk_rope_head_dim", 64), c.integer("kv_lora_rank", 512)
    fields = common_fields(c, eps=eps, max_pos=max_pos, head_dim=rope_dim)
    q_null = "q_lora_rank" in c and c.get("q_lora_rank") is None  # absent: the class default
    nope = c.integer("qk_nope_head_dim", nope)
    attn = dict(
        qk_norm="none", clip_qkv=None, sliding_window=None,
        q_lora_rank=0 if q_null else c.integer("q_lora_rank", q_lora), kv_lora_rank=kv_lora,
        qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim, v_head_dim=c.integer("v_head_dim", v),
        attn_scale=attention_scale(nope + rope_dim, fields["rope"]),
    )
    return {**fields, "num_kv_heads": 1, "head_dim": rope_dim + kv_lora}, attn


def attention_scale(qk_head_dim: int, rope: RopeSpec) -> float:
    """qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)² where the rope is scaled
    and mscale_all_dim is set (transformers' `yarn_apply_mscale`)."""
    scale = qk_head_dim**-0.5
    if rope.rope_type != "default" and rope.mscale_all_dim and rope.factor is not None and rope.factor > 1:
        mscale = 0.1 * rope.mscale_all_dim * math.log(rope.factor) + 1.0
        scale *= mscale * mscale
    return scale


def _glm_lite_moe_layers(c: HFConfig, layers: int) -> tuple[int, ...]:
    """glm4_moe_lite's sparse layers: `mlp_layer_types` (transformers' default: the first dense)."""
    kinds = c.get("mlp_layer_types")
    if kinds is None:
        kinds = ["dense"] + ["sparse"] * (layers - 1)
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in MLP_KINDS for k in kinds):
        raise ConfigError(f"mlp_layer_types must list num_hidden_layers={layers} of {' / '.join(MLP_KINDS)}")
    if "sparse" not in kinds:
        raise ConfigError("mlp_layer_types has no 'sparse' layer: a dense model, which edgemoe does not serve")
    return tuple(i for i, k in enumerate(kinds) if k == "sparse")


def checkpoint_map(a: MlaArch) -> NameMap:
    m: NameMap = {"model.embed_tokens.weight": Placement("embed"), "model.norm.weight": Placement("norm")}
    if not a.tie_word_embeddings:
        m["lm_head.weight"] = Placement("lm_head")
    for i in range(a.num_layers):
        lp, our = f"model.layers.{i}.", f"layers.{i}."
        m[lp + "input_layernorm.weight"] = Placement(our + "attn_norm")
        m[lp + "post_attention_layernorm.weight"] = Placement(our + "mlp_norm")
        m |= _attention_names(a, lp + "self_attn.", our) | mlp_names(a, i)
    return m


def _attention_names(a: MlaArch, lp: str, our: str) -> NameMap:
    names = {"kv_a_proj_with_mqa": "kv_a", "kv_a_layernorm": "kv_a_norm", "kv_b_proj": "kv_b", "o_proj": "o_proj"}
    names |= {"q_a_proj": "q_a", "q_a_layernorm": "q_a_norm", "q_b_proj": "q"} if a.q_lora_rank else {"q_proj": "q"}
    m = {f"{lp}{theirs}.weight": Placement(our + mine) for theirs, mine in names.items()}
    if a.attention_bias:
        biased = {"kv_a_proj_with_mqa": "kv_a_bias", "o_proj": "o_bias"}
        biased |= {"q_a_proj": "q_a_bias"} if a.q_lora_rank else {}
        m |= {f"{lp}{theirs}.bias": Placement(our + mine) for theirs, mine in biased.items()}
    return m


stacked_expert_names = mlp_experts_stacked  # transformers 5's stacked `mlp.experts.*`


def build(arch: MlaArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    p, rope = to_device(arch, params, device), rope_table(arch, device)
    d = arch.mla_dims

    def attention(i: int) -> MlaAttention:
        spec = AttentionSpec(layer=i, num_heads=arch.num_heads, num_kv_heads=1, head_dim=d.cache_dim,
                             scale=arch.attn_scale, rope=rope)
        return MlaAttention(spec, d, _weights(arch, i, p), linear=linear)

    return assemble(arch, p, attention, executor, device, linear,  # type: ignore[arg-type]
                    lambda i: moe_block(arch, i, p, executor, linear), embed=embed)


def _weights(arch: MlaArch, i: int, p: Params) -> MlaWeights:
    """Layer i's MLA weights; its checkpoint params leave `p` (each becomes its kernel's layout)."""
    pre, d = f"layers.{i}.", arch.mla_dims
    q, kv_a, kv_a_bias = p.pop(pre + "q"), p.pop(pre + "kv_a"), p.pop(pre + "kv_a_bias", None)
    if arch.rope_interleave:  # the rotary rows: pairs (2j, 2j + 1) → the rotate-half pairs (j, j + rope/2)
        q = deinterleave_rope(q, d.num_heads, d.nope)
        kv_a = deinterleave_rope(kv_a, 1, d.kv_lora)
        kv_a_bias = None if kv_a_bias is None else deinterleave_rope(kv_a_bias, 1, d.kv_lora)
    w_uk, w_uv_t = split_kv_b(p.pop(pre + "kv_b"), d)
    q_a, q_a_bias = p.pop(pre + "q_a", None), p.pop(pre + "q_a_bias", None)
    q_first = q if q_a is None else q_a
    first_bias = None
    if kv_a_bias is not None:  # a lone q projection has no bias: zeros there add nothing
        q_bias = q_a_bias if q_a_bias is not None else kv_a_bias.new_zeros(q_first.shape[0])
        first_bias = torch.cat((q_bias, kv_a_bias))
    return MlaWeights(
        first=torch.cat((q_first, kv_a)), q_rows=q_first.shape[0],
        kv_a_norm=RMSNorm(p.pop(pre + "kv_a_norm"), LATENT_NORM_EPS), w_uk=w_uk, w_uv_t=w_uv_t,
        o_proj=p.pop(pre + "o_proj"), q_b=None if q_a is None else q,
        q_a_norm=None if q_a is None else RMSNorm(p.pop(pre + "q_a_norm"), LATENT_NORM_EPS),
        first_bias=first_bias, o_bias=p.pop(pre + "o_bias", None),
    )
