"""gpt-oss (openai/gpt-oss-20b, gpt-oss-120b): transformers' `GptOssForCausalLM`.

Llama-style pre-norm blocks with:
- attention: biased q/k/v *and* o projections, a learned per-head sink logit in every
  softmax (`AttentionSpec.sinks`), a 128-token sliding window on the layers
  `layer_types` marks "sliding_attention" (every other one by default), YaRN rotary;
- every layer a sparse MoE: a biased router (top-k of the logits, softmax over those k:
  the renormalised full softmax), experts with biases on both projections and the
  clamped SwiGLU `(clamp(up, ±L) + 1) · g · sigmoid(α g)`, g = min(gate, L)
  (`kernels/activations.clamped_swiglu`; the biases stay on the device for every expert,
  addressed by expert id: `kernels/expert_bias.py`).

Checkpoints hold the experts stacked, as transformers does: bf16 `mlp.experts.gate_up_proj`
[E, H, 2I] with gate and up *interleaved* along 2I and `down_proj` [E, I, H] (both
transposed against `F.linear`), or the published MXFP4 `*_blocks` / `*_scales` [E, 2I, …]
(rows interleaved, not transposed). `stored_layout` turns each into ours (gate rows first,
[E, 2I, H] / [E, H, I]) as it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from edgemoe.kernels.activations import Activation, clamped_swiglu
from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.layers.attention import Attention
from edgemoe.layers.moe import SparseMoE
from edgemoe.models.arch import ConfigError, DecoderArch, HFConfig, check_experts, common_fields
from edgemoe.models.llama_moe import MLP, Params, assemble, attention_spec, rope_table, to_device
from edgemoe.models.names import NameMap, Placement, common_names, expert_names, mlp_experts_stacked, qkv_bias_names
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

MODEL_TYPE = "gpt_oss"
LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class GptOssArch(DecoderArch):
    """DecoderArch plus gpt-oss's per-layer windows and its experts' activation; the
    sinks, the o_proj bias, the router's bias and the experts' biases are always there."""

    layer_windows: tuple[int | None, ...] = ()  # each layer's sliding window (None: full causal)
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def expert_activation(self) -> Activation:
        return clamped_swiglu(self.swiglu_alpha, self.swiglu_limit)

    @property
    def expert_bias(self) -> bool:
        return True

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = super().param_shapes()
        H, E, I = self.hidden_size, self.num_experts, self.moe_intermediate_size
        for i in range(self.num_layers):
            p = f"layers.{i}."
            if self.attention_bias:  # q/k/v's and o's together, as transformers' `attention_bias`
                shapes[p + "o_bias"] = (H,)
            shapes[p + "sinks"] = (self.num_heads,)
            shapes[p + "router_bias"] = (E,)
            shapes[p + "expert_gate_up_bias"] = (E, 2 * I)
            shapes[p + "expert_down_bias"] = (E, H)
        return shapes


def arch(config: dict[str, Any]) -> GptOssArch:
    c = HFConfig(config)
    layers, experts = c.layers(), c.integer("num_local_experts", 128)
    # Its experts' clamped SwiGLU whatever `hidden_act` says (transformers' modelling never reads it).
    fields = common_fields(c, eps=1e-5, max_pos=131072, head_dim=c.integer("head_dim", 64), kv_heads=8,
                           hidden_act="silu")
    moe = tuple(range(layers))
    check_experts(c, experts, fields["top_k"], moe)
    inter = c.integer("intermediate_size", 2880)
    alpha, limit = float(c.number("swiglu_alpha", 1.702)), float(c.number("swiglu_limit", 7.0))
    if limit <= 0:
        raise ConfigError(f"swiglu_limit={limit}: expected a positive clamp")
    return GptOssArch(
        model_type=MODEL_TYPE,
        **fields,
        qk_norm="none",
        clip_qkv=None,
        sliding_window=None,  # per layer: layer_windows
        num_experts=experts,
        moe_intermediate_size=inter,
        norm_topk_prob=True,  # softmax over the top-k logits: the renormalised softmax
        moe_layers=moe,
        intermediate_size=inter,
        attention_bias=c.flag("attention_bias", True),
        layer_windows=layer_windows(c, layers),
        swiglu_alpha=alpha,
        swiglu_limit=limit,
    )


def layer_windows(c: HFConfig, layers: int) -> tuple[int | None, ...]:
    """Each layer's window from `layer_types` (transformers' default when absent: sliding on
    even layers, full on odd), the window `sliding_window` (128). NOTE: a null window is
    refused where a layer slides: transformers' sliding mask raises on it (5.24 and 5.25,
    eager and flex), so no reference says what it means; plain causal attention there
    would be a guess (the model trained with some window), and wrong logits unannounced."""
    kinds = c.get("layer_types")
    if kinds is None:
        kinds = [LAYER_TYPES[i % 2] for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in LAYER_TYPES for k in kinds):
        raise ConfigError(f"layer_types must list num_hidden_layers={layers} of {' / '.join(LAYER_TYPES)}")
    if c.get("sliding_window", 128) is None:
        if "sliding_attention" in kinds:
            raise ConfigError("sliding_window=null with sliding_attention layers (layer_types): gpt_oss needs "
                              "the window's size (transformers cannot run it either)")
        return (None,) * layers
    window = c.integer("sliding_window", 128)
    return tuple(window if k == "sliding_attention" else None for k in kinds)


def checkpoint_map(a: GptOssArch) -> NameMap:
    m = common_names(a)
    for i in range(a.num_layers):
        lp, our, mlp = f"model.layers.{i}.self_attn.", f"layers.{i}.", f"model.layers.{i}.mlp."
        if a.attention_bias:
            m |= qkv_bias_names(a, i)
            m[lp + "o_proj.bias"] = Placement(our + "o_bias")
        m[lp + "sinks"] = Placement(our + "sinks")
        m[mlp + "router.weight"] = Placement(our + "router")
        m[mlp + "router.bias"] = Placement(our + "router_bias")
        m[mlp + "experts.gate_up_proj_bias"] = Placement(our + "expert_gate_up_bias")
        m[mlp + "experts.down_proj_bias"] = Placement(our + "expert_down_bias")
        # Never stored one by one: the stacked tensors below fill them (the MXFP4 ones too).
        m |= expert_names(a, i, mlp + "experts.{e}.{w}.weight", "gate_proj", "up_proj", "down_proj")
    return m


stacked_expert_names = mlp_experts_stacked  # `mlp.experts.gate_up_proj` / `down_proj`, after `stored_layout`


def gate_first(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Interleaved gate/up along `dim` (gate 0, up 0, gate 1, …) → the gate half, then up."""
    pairs = t.unflatten(dim, (-1, 2))
    return torch.cat((pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)), dim)


def interleaved(t: torch.Tensor, dim: int) -> torch.Tensor:
    """`gate_first`'s inverse: the gate half and the up half along `dim` → interleaved."""
    gate, up = t.chunk(2, dim)
    return torch.stack((gate, up), dim + 1).flatten(dim, dim + 1)


def to_stored(name: str, t: torch.Tensor) -> torch.Tensor:
    """A tensor `edgemoe convert` writes, from our layout into gpt-oss's: the gate_up bias
    and the MXFP4 gate_up parts interleaved (per-expert matrices in other formats are
    written one by one, a layout our loader reads and transformers' gpt-oss does not)."""
    if name.endswith((".experts.gate_up_proj_bias", ".experts.gate_up_proj_blocks", ".experts.gate_up_proj_scales")):
        return interleaved(t, 1).contiguous()
    return t


def stored_layout(name: str, value: Any) -> Any:
    """A checkpoint tensor (or a collected quantised linear: (format, parts)) in our layout."""
    if isinstance(value, tuple):  # MXFP4 parts [E, 2I, …] per suffix: rows interleaved
        fmt, parts = value
        if name.endswith(".experts.gate_up_proj"):
            return fmt, {s: gate_first(t, 1).contiguous() for s, t in parts.items()}
        return value
    if name.endswith(".experts.gate_up_proj"):  # [E, H, 2I] → [E, 2I, H], gate rows first
        return gate_first(value.transpose(1, 2), 1).contiguous()
    if name.endswith(".experts.down_proj"):  # [E, I, H] → [E, H, I]
        return value.transpose(1, 2).contiguous()
    if name.endswith(".experts.gate_up_proj_bias"):
        return gate_first(value, 1).contiguous()
    return value


def build(arch: GptOssArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device,
          linear: Linear = dense_gemv_ref, embed: Embed | None = None) -> CausalLM:
    p, rope = to_device(arch, params, device), rope_table(arch, device)

    def attention(i: int) -> Attention:
        pre = f"layers.{i}."
        spec = attention_spec(arch, i, rope, arch.layer_windows[i], sinks=p[pre + "sinks"].float())
        return Attention(spec, p[pre + "qkv"], p[pre + "o_proj"], linear=linear, qkv_bias=p.get(pre + "qkv_bias"),
                         o_bias=p.get(pre + "o_bias"))

    return assemble(arch, p, attention, executor, device, linear, lambda i: moe_block(arch, i, p, executor, linear),
                    embed=embed)


def moe_block(arch: GptOssArch, i: int, p: Params, executor: MoEExecutor, linear: Linear) -> MLP:
    pre = f"layers.{i}."
    executor.register_expert_bias(i, ExpertBias(p[pre + "expert_gate_up_bias"], p[pre + "expert_down_bias"]))
    return SparseMoE(i, p[pre + "router"], arch.top_k, arch.norm_topk_prob, executor, linear,
                     router_bias=p[pre + "router_bias"])
