"""Tiny seeded checkpoints of the GDN hybrids in the Hub layout (what transformers'
`save_pretrained` writes, per-expert names included): `qwen3_next`, `qwen3_5_moe` (the
multimodal layout: `text_config`, tensors under `model.language_model.*`, plus a vision
and an MTP tensor that a text model must ignore) and `qwen3_5_moe_text`.

Written through `checkpoint.make_checkpoint`, with the same weight scales
(`tensor_specs.init_tensor`) except where these models differ: their RMSNorms are
zero-centred (x·(1 + w), so w is small noise) but the GDN output norm's (plain w);
A = exp(A_log) in [1, 16] (transformers draws it from [0.01, 16]); dt_bias of unit scale.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from edgemoe.assets.tensor_specs import COMMON_CONFIG, TensorSpec, init_tensor

HYBRID_TYPES = ("qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")
GDN, ATTENTION = "linear_attention", "full_attention"

_TEXT: dict[str, Any] = {
    **COMMON_CONFIG,
    "num_hidden_layers": 4,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 8,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "router_aux_loss_coef": 0.001,
}
_NEXT: dict[str, Any] = {  # Qwen3-Next's config.json spells rotary and layer types this way
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", **_TEXT,
    "partial_rotary_factor": 0.25, "full_attention_interval": 4, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "intermediate_size": 64,
}
# Qwen3.5's: rope_parameters with the (text-inert) multimodal sections, explicit layer_types.
_QWEN35_ROPE = {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25,
                "mrope_section": [1, 1, 0], "mrope_interleaved": True}
_QWEN35_TEXT: dict[str, Any] = {
    **{k: v for k, v in _TEXT.items() if k not in ("rope_theta", "rope_scaling")},
    "model_type": "qwen3_5_moe_text", "rope_parameters": _QWEN35_ROPE,
    "layer_types": [GDN, GDN, GDN, ATTENTION],
}
_TOP_LEVEL = ("torch_dtype", "tie_word_embeddings")  # the multimodal config's own fields


def hybrid_config(model_type: str, **overrides: Any) -> dict[str, Any]:
    """config.json for a tiny hybrid; `overrides` change the language model's fields (in
    `text_config` for the multimodal layout; torch_dtype / tie_word_embeddings at both levels)."""
    if model_type == "qwen3_next":
        return dict(sorted({**_NEXT, **overrides}.items()))
    text = {**_QWEN35_TEXT, **overrides}
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        text["layer_types"] = [GDN if (i + 1) % 4 else ATTENTION for i in range(text["num_hidden_layers"])]
    if model_type == "qwen3_5_moe_text":
        return dict(sorted({"architectures": ["Qwen3_5MoeForCausalLM"], **text}.items()))
    top = {k: text[k] for k in _TOP_LEVEL}
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", **top,
        "text_config": dict(sorted(text.items())), "image_token_id": 248056, "video_token_id": 248057,
        "vision_start_token_id": 248053, "vision_end_token_id": 248054,
    }


def config_dtype(config: dict[str, Any]) -> str:
    return config.get("torch_dtype") or config.get("text_config", {}).get("torch_dtype") or "bfloat16"


def _layer_types(t: dict[str, Any]) -> list[str]:
    n = t["num_hidden_layers"]
    return t.get("layer_types") or [GDN if (i + 1) % t.get("full_attention_interval", 4) else ATTENTION for i in range(n)]


def hybrid_specs(config: dict[str, Any], stacked_experts: bool = False) -> Iterator[TensorSpec]:
    """Hub tensor names and shapes, in model order (`stacked_experts`: see `_mlp`)."""
    multimodal = config["model_type"] == "qwen3_5_moe"
    t = config["text_config"] if multimodal else config
    pre, h, v = ("model.language_model." if multimodal else "model."), t["hidden_size"], t["vocab_size"]
    yield f"{pre}embed_tokens.weight", (v, h)
    for i, kind in enumerate(_layer_types(t)):
        p = f"{pre}layers.{i}"
        yield f"{p}.input_layernorm.weight", (h,)
        yield from (_gdn(f"{p}.linear_attn", t, config["model_type"]) if kind == GDN else _attention(f"{p}.self_attn", t))
        yield f"{p}.post_attention_layernorm.weight", (h,)
        yield from _mlp(f"{p}.mlp", t, i, config["model_type"], stacked_experts)
    yield f"{pre}norm.weight", (h,)
    if not config.get("tie_word_embeddings", t["tie_word_embeddings"]):
        yield "lm_head.weight", (v, h)
    if multimodal:  # parts of a real checkpoint the text model does not read
        yield "model.visual.patch_embed.proj.weight", (8, 12)
        yield "mtp.fc.weight", (h, 2 * h)


def _attention(p: str, t: dict[str, Any]) -> Iterator[TensorSpec]:
    h, d, q, kv = t["hidden_size"], t["head_dim"], t["num_attention_heads"], t["num_key_value_heads"]
    yield f"{p}.q_proj.weight", (2 * q * d, h)  # query and output gate per head
    yield f"{p}.k_proj.weight", (kv * d, h)
    yield f"{p}.v_proj.weight", (kv * d, h)
    yield f"{p}.o_proj.weight", (h, q * d)
    yield f"{p}.q_norm.weight", (d,)
    yield f"{p}.k_norm.weight", (d,)


def _gdn(p: str, t: dict[str, Any], model_type: str) -> Iterator[TensorSpec]:
    h, hk, hv = t["hidden_size"], t["linear_num_key_heads"], t["linear_num_value_heads"]
    key, value = hk * t["linear_key_head_dim"], hv * t["linear_value_head_dim"]
    if model_type == "qwen3_next":  # interleaved per key-head group
        yield f"{p}.in_proj_qkvz.weight", (2 * key + 2 * value, h)
        yield f"{p}.in_proj_ba.weight", (2 * hv, h)
    else:
        yield f"{p}.in_proj_qkv.weight", (2 * key + value, h)
        yield f"{p}.in_proj_z.weight", (value, h)
        yield f"{p}.in_proj_b.weight", (hv, h)
        yield f"{p}.in_proj_a.weight", (hv, h)
    yield f"{p}.conv1d.weight", (2 * key + value, 1, t["linear_conv_kernel_dim"])
    yield f"{p}.dt_bias", (hv,)
    yield f"{p}.A_log", (hv,)
    yield f"{p}.norm.weight", (t["linear_value_head_dim"],)
    yield f"{p}.out_proj.weight", (h, value)


def _glu(p: str, h: int, i: int) -> Iterator[TensorSpec]:
    yield f"{p}.gate_proj.weight", (i, h)
    yield f"{p}.up_proj.weight", (i, h)
    yield f"{p}.down_proj.weight", (h, i)


def _mlp(p: str, t: dict[str, Any], idx: int, model_type: str, stacked: bool) -> Iterator[TensorSpec]:
    h = t["hidden_size"]
    # NOTE: transformers' rule: Qwen3.5 is MoE everywhere; Qwen3-Next as Qwen3-MoE.
    sparse = model_type != "qwen3_next" or (
        idx not in t["mlp_only_layers"] and t["num_experts"] > 0 and (idx + 1) % t["decoder_sparse_step"] == 0
    )
    if not sparse:
        yield from _glu(p, h, t["intermediate_size"])
        return
    yield f"{p}.gate.weight", (t["num_experts"], h)
    n, i = t["num_experts"], t["moe_intermediate_size"]
    if stacked:  # one tensor per kind: what init_hybrid fills from the per-expert ones
        yield f"{p}.experts.gate_up_proj", (n, 2 * i, h)
        yield f"{p}.experts.down_proj", (n, h, i)
    else:
        for e in range(n):
            yield from _glu(f"{p}.experts.{e}", h, i)
    yield from _glu(f"{p}.shared_expert", h, t["shared_expert_intermediate_size"])
    yield f"{p}.shared_expert_gate.weight", (1, h)


def init_hybrid(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """`init_tensor`, with these models' zero-centred norms and GDN decay parameters; a
    stacked experts tensor holds exactly the per-expert tensors' values."""
    if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        return _stacked(name, shape, seed)
    x = init_tensor(name, shape, seed)
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return x - 1.0  # init_tensor gives 1 + noise; these norms scale by 1 + w
    if name.endswith("A_log"):
        return torch.log(1.0 + 15.0 * torch.sigmoid(x))  # A in (1, 16)
    return x


def _stacked(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    experts, prefix = shape[0], name.rsplit(".", 1)[0]
    if name.endswith("down_proj"):
        return torch.stack([init_tensor(f"{prefix}.{e}.down_proj.weight", shape[1:], seed) for e in range(experts)])
    half = (shape[1] // 2, shape[2])
    return torch.stack([
        torch.cat([init_tensor(f"{prefix}.{e}.{w}.weight", half, seed) for w in ("gate_proj", "up_proj")])
        for e in range(experts)
    ])
