"""Building the pre-norm GQA + MoE blocks of the Llama-style families (qwen3_moe, olmoe,
mixtral) from a DecoderArch and our named tensors. Each model file calls `build_model`
with its own attention choices; a family that differs in structure has its own file.
"""

from __future__ import annotations

import torch

from edgemoe.layers.attention import Attention
from edgemoe.layers.attention_backend import AttentionSpec
from edgemoe.layers.block import PreNormBlock
from edgemoe.layers.mlp import DenseMLP, activation
from edgemoe.layers.moe import SparseMoE
from edgemoe.layers.norm import RMSNorm
from edgemoe.layers.rotary import Rotary
from edgemoe.models.arch import DecoderArch
from edgemoe.models.transformer import CausalLM
from edgemoe.moe.executor import MoEExecutor


def to_device(arch: DecoderArch, params: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    p = {k: v.to(device=device, dtype=arch.dtype) for k, v in params.items()}
    if arch.tie_word_embeddings:
        p["lm_head"] = p["embed"]
    return p


def attention(arch: DecoderArch, i: int, p: dict[str, torch.Tensor]) -> Attention:
    pre, eps = f"layers.{i}.", arch.rms_norm_eps
    spec = AttentionSpec(
        layer=i, num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
        scale=arch.head_dim**-0.5, window=arch.sliding_window,
    )
    normed = arch.qk_norm != "none"
    return Attention(
        spec, p[pre + "qkv"], p[pre + "o_proj"],
        q_norm=RMSNorm(p[pre + "q_norm"], eps) if normed else None,
        k_norm=RMSNorm(p[pre + "k_norm"], eps) if normed else None,
        qk_norm=arch.qk_norm, clip_qkv=arch.clip_qkv,
    )


def mlp(arch: DecoderArch, i: int, p: dict[str, torch.Tensor], executor: MoEExecutor) -> SparseMoE | DenseMLP:
    pre = f"layers.{i}."
    if i in arch.moe_layers:
        return SparseMoE(i, p[pre + "router"], arch.top_k, arch.norm_topk_prob, executor)
    return DenseMLP(p[pre + "gate_up"], p[pre + "down"], activation(arch.hidden_act))


def build_model(
    arch: DecoderArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device
) -> CausalLM:
    p, eps = to_device(arch, params, device), arch.rms_norm_eps
    blocks = [
        PreNormBlock(
            attention(arch, i, p), RMSNorm(p[f"layers.{i}.attn_norm"], eps),
            mlp(arch, i, p, executor), RMSNorm(p[f"layers.{i}.mlp_norm"], eps),
        )
        for i in range(arch.num_layers)
    ]
    rotary = Rotary(arch.rope, device)
    return CausalLM(arch, p["embed"], blocks, RMSNorm(p["norm"], eps), p["lm_head"], rotary)
