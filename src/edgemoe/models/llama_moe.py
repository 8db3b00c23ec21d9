"""Shared assembly for the Llama-style MoE families (qwen3_moe, olmoe, mixtral): each
model file builds its own attention for layer i (its q/k norm, clipping, window) and
hands it to `assemble`, which adds the norms, the MoE or dense MLP and the pre-norm
block. A family that differs in structure has its own blocks, not options here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.layers.attention import Attention
from edgemoe.layers.attention_backend import AttentionSpec, RopeTable
from edgemoe.layers.block import PreNormBlock, chain_norms
from edgemoe.layers.mlp import DenseMLP, activation
from edgemoe.layers.moe import SparseMoE
from edgemoe.layers.shared_moe import SharedExpertMoE
from edgemoe.layers.norm import RMSNorm
from edgemoe.layers.rotary import Rotary
from edgemoe.models.arch import DecoderArch, kept_dtypes
from edgemoe.models.transformer import CausalLM, Embed
from edgemoe.moe.executor import MoEExecutor

Params = dict[str, torch.Tensor]
MLP = SparseMoE | SharedExpertMoE | DenseMLP  # a layer's MLP: PreNormBlock fuses more around a SparseMoE


def to_device(arch: DecoderArch, params: Params, device: torch.device) -> Params:
    kept = kept_dtypes(arch)
    p = {k: v.to(device=device, dtype=kept.get(k, arch.dtype)) for k, v in params.items()}
    if arch.tie_word_embeddings:
        p["lm_head"] = p["embed"]
    return p


def rope_table(arch: DecoderArch, device: torch.device) -> RopeTable:
    """The rotary tables by position for the whole context (shared by every layer)."""
    cos, sin = Rotary(arch.rope, device).cos_sin_table(arch.max_position_embeddings)
    return RopeTable(cos, sin)


def attention_spec(arch: DecoderArch, i: int, rope: RopeTable, window: int | None = None,
                   sinks: torch.Tensor | None = None) -> AttentionSpec:
    return AttentionSpec(
        layer=i, num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
        scale=arch.head_dim**-0.5, window=window, rope=rope, sinks=sinks,
    )


def qk_norms(arch: DecoderArch, i: int, p: Params) -> tuple[RMSNorm, RMSNorm]:
    pre, eps = f"layers.{i}.", arch.rms_norm_eps
    return RMSNorm(p[pre + "q_norm"], eps), RMSNorm(p[pre + "k_norm"], eps)


def mlp(
    arch: DecoderArch, i: int, p: Params, executor: MoEExecutor, linear: Linear = dense_gemv_ref,
) -> SparseMoE | DenseMLP:
    pre = f"layers.{i}."
    if i in arch.moe_layers:
        return SparseMoE(i, p[pre + "router"], arch.top_k, arch.norm_topk_prob, executor, linear)
    return DenseMLP(p[pre + "gate_up"], p[pre + "down"], activation(arch.hidden_act))


def assemble(
    arch: DecoderArch, p: Params, attention: Callable[[int], Attention], executor: MoEExecutor,
    device: torch.device, linear: Linear = dense_gemv_ref, mlp_of: Callable[[int], MLP] | None = None,
    embed: Embed | None = None,
) -> CausalLM:
    """A CausalLM of pre-norm blocks with the model file's `attention(i)` per layer and its
    `mlp_of(i)` (default: `mlp`, the softmax-routed experts or a dense MLP); `linear`: the
    routers' and LM head's projection kernel (the model file hands the same one to its
    attention layers); `embed`: a host-resident embedding (`--embed-weights`; `p` then has
    no "embed")."""
    eps = arch.rms_norm_eps
    blocks = [
        PreNormBlock(
            attention(i), RMSNorm(p[f"layers.{i}.attn_norm"], eps),
            mlp(arch, i, p, executor, linear) if mlp_of is None else mlp_of(i), RMSNorm(p[f"layers.{i}.mlp_norm"], eps),
        )
        for i in range(arch.num_layers)
    ]
    chain_norms(blocks)  # each MoE combine also writes the next block's input norm
    return CausalLM(arch, p["embed"] if embed is None else embed, blocks, RMSNorm(p["norm"], eps), p["lm_head"],
                    Rotary(arch.rope, device), linear=linear)
