"""What the Qwen GDN hybrids (qwen3_next, qwen3_5_moe) share: checkpoint names and the
assembly of their blocks. Each model file adds its GDN projection names and layout.

A block is pre-norm: h += mixer(norm(h)); h += mlp(norm(h)), where the mixer is a GDN
layer or gated attention and the norms are zero-centred (x·(1 + w)). The KV pool holds
the attention layers only (KV index j = the j-th attention layer), the state pool the
GDN layers only.
"""

from __future__ import annotations

from typing import Protocol

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.gdn_backends import GdnKernels, gdn_kernels
from edgemoe.layers.attention_backend import AttentionSpec, RopeTable
from edgemoe.layers.context import StepContext
from edgemoe.layers.gated_attention import GatedAttention
from edgemoe.layers.gdn import GatedDeltaNet, GdnSpec
from edgemoe.layers.mlp import DenseMLP, activation
from edgemoe.layers.moe import SparseMoE, router_norm_enabled
from edgemoe.layers.norm import OffsetRMSNorm
from edgemoe.layers.rotary import Rotary
from edgemoe.layers.shared_moe import SharedExpertMoE
from edgemoe.models.hybrid_arch import HybridArch
from edgemoe.models.names import (
    NameMap,
    Placement,
    StackedMap,
    dense_mlp_names,
    expert_names,
)
from edgemoe.models.names import stacked_expert_names as stacked_names
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

Params = dict[str, torch.Tensor]
# Checkpoint tensors the text model does not use: multi-token prediction, the vision tower.
IGNORED_PREFIXES = ("mtp.", "model.visual.", "visual.")


class Mixer(Protocol):
    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> torch.Tensor: ...


class HybridBlock:
    """h = h + mixer(norm(h)); h = h + mlp(norm(h)) (the first add fused with the second norm)."""

    def __init__(self, mixer: Mixer, mixer_norm: OffsetRMSNorm, mlp: SharedExpertMoE | DenseMLP,
                 mlp_norm: OffsetRMSNorm, region: str) -> None:
        self.mixer, self.mixer_norm, self.mlp, self.mlp_norm, self.region = mixer, mixer_norm, mlp, mlp_norm, region
        # The first add and the second norm inside the MoE router's launch (as `PreNormBlock`).
        self.route_norm = isinstance(mlp, SharedExpertMoE) and router_norm_enabled()

    def __call__(
        self, h: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> torch.Tensor:
        with ctx.profiler.region(self.region):
            a = self.mixer(self.mixer_norm(h), cos, sin, ctx)
            if not self.route_norm:
                x, h = self.mlp_norm.add_and_norm(a, h)
        if isinstance(self.mlp, DenseMLP):
            with ctx.profiler.region("mlp"):
                return self.mlp(x, residual=h)
        with ctx.profiler.region("moe"):
            routing = None
            if self.route_norm:
                x, h, ids, weights = self.mlp.routed.add_norm_route(a, h, self.mlp_norm)
                routing = (ids, weights)
            host = ctx.batch.host
            return self.mlp(x, residual=h, num_decode=host.num_decode, num_padding=host.num_padding, routing=routing)


# -- checkpoint names ----------------------------------------------------------------------


def hybrid_names(a: HybridArch) -> NameMap:
    """Embedding, norms, attention, the GDN tensors both layouts share, and the MLPs."""
    pre = a.checkpoint_prefix
    m: NameMap = {f"{pre}embed_tokens.weight": Placement("embed"), f"{pre}norm.weight": Placement("norm")}
    if not a.tie_word_embeddings:
        m["lm_head.weight"] = Placement("lm_head")
    for i in range(a.num_layers):
        lp, our = f"{pre}layers.{i}.", f"layers.{i}."
        m[lp + "input_layernorm.weight"] = Placement(our + "attn_norm")
        m[lp + "post_attention_layernorm.weight"] = Placement(our + "mlp_norm")
        m |= _gdn_names(lp + "linear_attn.", our) if i in a.gdn_layers else _attention_names(a, lp + "self_attn.", our)
        m |= _mlp_names(a, i, lp + "mlp.", our)
    return m


def _attention_names(a: HybridArch, lp: str, our: str) -> NameMap:
    q, kv = 2 * a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim  # q_proj: query and gate
    return {
        lp + "q_proj.weight": Placement(our + "qkv", (slice(0, q),)),
        lp + "k_proj.weight": Placement(our + "qkv", (slice(q, q + kv),)),
        lp + "v_proj.weight": Placement(our + "qkv", (slice(q + kv, None),)),
        lp + "o_proj.weight": Placement(our + "o_proj"),
        lp + "q_norm.weight": Placement(our + "q_norm"),
        lp + "k_norm.weight": Placement(our + "k_norm"),
    }


def _gdn_names(lp: str, our: str) -> NameMap:
    return {
        lp + "conv1d.weight": Placement(our + "conv"),
        lp + "A_log": Placement(our + "A_log"),
        lp + "dt_bias": Placement(our + "dt_bias"),
        lp + "norm.weight": Placement(our + "gdn_norm"),
        lp + "out_proj.weight": Placement(our + "out_proj"),
    }


def _mlp_names(a: HybridArch, i: int, lp: str, our: str) -> NameMap:
    if i not in a.moe_layers:
        return dense_mlp_names(a, i, lp)  # type: ignore[arg-type]  # reads intermediate_size only
    m = {lp + "gate.weight": Placement(our + "router"), lp + "shared_expert_gate.weight": Placement(our + "shared_gate")}
    m |= expert_names(a, i, lp + "experts.{e}.{w}.weight", "gate_proj", "up_proj", "down_proj")  # type: ignore[arg-type]
    sh, inter = lp + "shared_expert.", a.shared_expert_intermediate_size
    if a.shared_in_store:  # expert E of the bank
        E, bank = a.num_experts, f"experts.{i}."
        m[sh + "gate_proj.weight"] = Placement(bank + "gate_up", (E, slice(0, inter)))
        m[sh + "up_proj.weight"] = Placement(bank + "gate_up", (E, slice(inter, None)))
        m[sh + "down_proj.weight"] = Placement(bank + "down", (E,))
    else:
        m[sh + "gate_proj.weight"] = Placement(our + "shared_gate_up", (slice(0, inter),))
        m[sh + "up_proj.weight"] = Placement(our + "shared_gate_up", (slice(inter, None),))
        m[sh + "down_proj.weight"] = Placement(our + "shared_down")
    return m


def stacked_expert_names(a: HybridArch) -> StackedMap:
    """The routed experts as transformers 5 stores them (and Qwen3.5's checkpoints ship
    them): `mlp.experts.gate_up_proj` [E, 2I, H] and `mlp.experts.down_proj` [E, H, I]
    per layer, the other spelling of the per-expert names."""
    return stacked_names(a, a.moe_layers, a.checkpoint_prefix + "layers.{layer}.mlp.experts.")  # type: ignore[arg-type]


# -- assembly ------------------------------------------------------------------------------


def to_device(arch: HybridArch, params: Params, device: torch.device) -> Params:
    p = {k: v.to(device=device, dtype=arch.dtype) for k, v in params.items()}
    if arch.tie_word_embeddings:
        p["lm_head"] = p["embed"]
    return p


def assemble(
    arch: HybridArch, p: Params, executor: MoEExecutor, device: torch.device, linear: Linear = dense_gemv_ref,
    embed: Embed | None = None,
) -> CausalLM:
    """A CausalLM of hybrid blocks; `p` on the device, every GDN layer's `in_proj` in the
    q | k | v | z | b | a layout (the model file's build() makes it so); `linear`: the
    dense projections' kernel (--dense-kernel); `embed`: a host-resident embedding
    (`--embed-weights`; `p` then has no "embed")."""
    eps, kernels = arch.rms_norm_eps, gdn_kernels("auto", device)
    rotary = Rotary(arch.rope, device)
    rope = RopeTable(*rotary.cos_sin_table(arch.max_position_embeddings))  # for backends that rotate by position
    kv_index = {layer: j for j, layer in enumerate(arch.kv_layers)}
    gdn_index = {layer: j for j, layer in enumerate(arch.gdn_layers)}
    blocks = []
    for i in range(arch.num_layers):
        pre = f"layers.{i}."
        mixer: Mixer
        if i in gdn_index:
            mixer = _gdn(arch, gdn_index[i], pre, p, kernels, linear)
        else:
            spec = AttentionSpec(layer=kv_index[i], num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads,
                                 head_dim=arch.head_dim, scale=arch.head_dim**-0.5, rope=rope)
            mixer = GatedAttention(spec, p[pre + "qkv"], p[pre + "o_proj"], OffsetRMSNorm(p[pre + "q_norm"], eps),
                                   OffsetRMSNorm(p[pre + "k_norm"], eps), linear)
        blocks.append(HybridBlock(
            mixer, OffsetRMSNorm(p[pre + "attn_norm"], eps), _mlp(arch, i, p, executor, linear),
            OffsetRMSNorm(p[pre + "mlp_norm"], eps), "gdn" if i in gdn_index else "attention",
        ))
    return CausalLM(arch, p["embed"] if embed is None else embed, blocks, OffsetRMSNorm(p["norm"], eps), p["lm_head"],
                    rotary, linear=linear)


def _gdn(arch: HybridArch, j: int, pre: str, p: Params, kernels: GdnKernels, linear: Linear) -> GatedDeltaNet:
    spec = GdnSpec(j, arch.linear_num_key_heads, arch.linear_num_value_heads, arch.linear_key_head_dim,
                   arch.linear_value_head_dim, arch.rms_norm_eps)
    return GatedDeltaNet(spec, p[pre + "in_proj"], p[pre + "conv"][:, 0], p[pre + "A_log"], p[pre + "dt_bias"],
                         p[pre + "gdn_norm"], p[pre + "out_proj"], kernels, linear)


def _mlp(arch: HybridArch, i: int, p: Params, executor: MoEExecutor, linear: Linear) -> SharedExpertMoE | DenseMLP:
    pre, act = f"layers.{i}.", activation(arch.hidden_act)
    if i not in arch.moe_layers:
        return DenseMLP(p[pre + "gate_up"], p[pre + "down"], act)
    routed = SparseMoE(i, p[pre + "router"], arch.top_k, arch.norm_topk_prob, executor, linear)
    if arch.shared_in_store:
        return SharedExpertMoE(routed, p[pre + "shared_gate"], arch.num_experts)
    return SharedExpertMoE(routed, p[pre + "shared_gate"], None, DenseMLP(p[pre + "shared_gate_up"], p[pre + "shared_down"], act))

