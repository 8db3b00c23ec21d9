"""Tiny seeded random MoE checkpoints in the Hugging Face Hub layout.

A checkpoint directory holds what a Hub repo holds: ``config.json``,
``generation_config.json``, sharded ``model-0000X-of-0000N.safetensors`` with
``model.safetensors.index.json`` and per-expert tensor names, ``tokenizer.json``
(Qwen3's real tokenizer), ``tokenizer_config.json`` and ``chat_template.jinja``.
Model-type knowledge is two table entries per type: tiny config defaults and the
Hub tensor names with their shapes. The GDN hybrids (qwen3_next, qwen3_5_moe) have
their own tables in ``hybrid_checkpoint.py``, Qwen3.8 in ``qwen4_checkpoint.py``; what all
of them share (the seeded weights, the common config) is ``tensor_specs.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from edgemoe.assets import hybrid_checkpoint, qwen4_checkpoint
from edgemoe.assets.cache import write_json
from edgemoe.assets.model_files import write_model_files
from edgemoe.assets.tensor_specs import COMMON_CONFIG, Shape, TensorSpec, init_tensor


def _attention(p: str, c: dict[str, Any], head_dim: int) -> Iterator[TensorSpec]:
    h, q, kv = c["hidden_size"], c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    yield f"{p}.self_attn.q_proj.weight", (q, h)
    yield f"{p}.self_attn.k_proj.weight", (kv, h)
    yield f"{p}.self_attn.v_proj.weight", (kv, h)
    yield f"{p}.self_attn.o_proj.weight", (h, q)


_GLU = ("gate_proj", "up_proj", "down_proj")
_MIXTRAL_GLU = ("w1", "w3", "w2")  # Mixtral's names for gate, up, down


def _mlp(p: str, h: int, i: int, names: tuple[str, str, str] = _GLU) -> Iterator[TensorSpec]:
    """One SwiGLU MLP: gate [I, H], up [I, H], down [H, I]."""
    gate, up, down = names
    yield f"{p}.{gate}.weight", (i, h)
    yield f"{p}.{up}.weight", (i, h)
    yield f"{p}.{down}.weight", (h, i)


def _moe(p: str, n: int, h: int, i: int, names: tuple[str, str, str] = _GLU) -> Iterator[TensorSpec]:
    """Router [E, H] then per-expert MLPs, named as on the Hub (one tensor per expert)."""
    yield f"{p}.gate.weight", (n, h)
    for e in range(n):
        yield from _mlp(f"{p}.experts.{e}", h, i, names)


def _qwen3_moe_layer(p: str, c: dict[str, Any], idx: int) -> Iterator[TensorSpec]:
    h, d = c["hidden_size"], c["head_dim"]
    yield from _attention(p, c, d)
    yield f"{p}.self_attn.q_norm.weight", (d,)  # per head
    yield f"{p}.self_attn.k_norm.weight", (d,)
    # NOTE: same sparsity rule as transformers' Qwen3MoeDecoderLayer.
    sparse = (
        idx not in c["mlp_only_layers"]
        and c["num_experts"] > 0
        and (idx + 1) % c["decoder_sparse_step"] == 0
    )
    if sparse:
        yield from _moe(f"{p}.mlp", c["num_experts"], h, c["moe_intermediate_size"])
    else:
        yield from _mlp(f"{p}.mlp", h, c["intermediate_size"])


def _olmoe_layer(p: str, c: dict[str, Any], idx: int) -> Iterator[TensorSpec]:
    h = c["hidden_size"]
    d = h // c["num_attention_heads"]  # OLMoE has no head_dim field
    yield from _attention(p, c, d)
    # OLMoE normalises q and k over all heads at once, before the head split.
    yield f"{p}.self_attn.q_norm.weight", (c["num_attention_heads"] * d,)
    yield f"{p}.self_attn.k_norm.weight", (c["num_key_value_heads"] * d,)
    yield from _moe(f"{p}.mlp", c["num_experts"], h, c["intermediate_size"])


def _mixtral_layer(p: str, c: dict[str, Any], idx: int) -> Iterator[TensorSpec]:
    yield from _attention(p, c, c["head_dim"])
    n, h, i = c["num_local_experts"], c["hidden_size"], c["intermediate_size"]
    yield from _moe(f"{p}.block_sparse_moe", n, h, i, _MIXTRAL_GLU)


@dataclass(frozen=True)
class _Family:
    architecture: str
    defaults: dict[str, Any]
    layer: Callable[[str, dict[str, Any], int], Iterator[TensorSpec]]


FAMILIES: dict[str, _Family] = {
    "qwen3_moe": _Family(
        "Qwen3MoeForCausalLM",
        {
            "num_hidden_layers": 3,
            "head_dim": 16,
            "intermediate_size": 64,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "rms_norm_eps": 1e-6,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 3,
            "router_aux_loss_coef": 0.001,
        },
        _qwen3_moe_layer,
    ),
    "olmoe": _Family(
        "OlmoeForCausalLM",
        {
            "num_hidden_layers": 2,
            "intermediate_size": 32,
            "num_experts": 8,
            "norm_topk_prob": False,
            "clip_qkv": None,
            "rms_norm_eps": 1e-5,
            "pad_token_id": 151643,
            "router_aux_loss_coef": 0.01,
        },
        _olmoe_layer,
    ),
    "mixtral": _Family(
        "MixtralForCausalLM",
        {
            "num_hidden_layers": 2,
            "head_dim": 16,
            "intermediate_size": 32,
            "num_local_experts": 8,
            "rms_norm_eps": 1e-5,
            "sliding_window": None,
            "router_jitter_noise": 0.0,
            "router_aux_loss_coef": 0.001,
        },
        _mixtral_layer,
    ),
}


def model_config(model_type: str, **overrides: Any) -> dict[str, Any]:
    """The ``config.json`` contents for a tiny ``model_type`` with ``overrides`` applied."""
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r}; choose from {sorted(FAMILIES)}")
    family = FAMILIES[model_type]
    config = {"architectures": [family.architecture], "model_type": model_type, **COMMON_CONFIG, **family.defaults}
    config.update(overrides)
    return dict(sorted(config.items()))


def tensor_specs(config: dict[str, Any]) -> Iterator[TensorSpec]:
    """Hub tensor names and shapes, in model order."""
    family = FAMILIES[config["model_type"]]
    h, v = config["hidden_size"], config["vocab_size"]
    yield "model.embed_tokens.weight", (v, h)
    for idx in range(config["num_hidden_layers"]):
        p = f"model.layers.{idx}"
        yield f"{p}.input_layernorm.weight", (h,)
        yield from family.layer(p, config, idx)
        yield f"{p}.post_attention_layernorm.weight", (h,)
    yield "model.norm.weight", (h,)
    if not config["tie_word_embeddings"]:
        yield "lm_head.weight", (v, h)


def _shard_plan(specs: list[TensorSpec], itemsize: int, max_shard_bytes: int | None) -> list[list[TensorSpec]]:
    """Greedy contiguous shards; the default limit is half the total so even tiny models get >= 2."""
    sizes = [math.prod(shape) * itemsize for _, shape in specs]
    limit = max_shard_bytes or max(max(sizes), sum(sizes) // 2)
    shards: list[list[TensorSpec]] = [[]]
    used = 0
    for spec, size in zip(specs, sizes):
        if shards[-1] and used + size > limit:
            shards.append([])
            used = 0
        shards[-1].append(spec)
        used += size
    return shards


Init = Callable[[str, Shape, int], torch.Tensor]


def write_weights(
    out: Path, specs: list[TensorSpec], dtype: torch.dtype, seed: int, max_shard_bytes: int | None,
    init: Init = init_tensor,
) -> None:
    """Sharded safetensors + index for `specs`, each tensor `init(name, shape, seed)` in `dtype`."""
    shards = _shard_plan(specs, torch.empty((), dtype=dtype).element_size(), max_shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        # integer buffers (Qwen3.8-Flash-Next's PLE hash constants) keep their dtype
        tensors = {name: _cast(init(name, shape, seed), dtype) for name, shape in shard}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json(out / "model.safetensors.index.json", index)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype) if t.is_floating_point() else t


def make_checkpoint(
    model_type: str,
    out_dir: str | Path,
    seed: int = 0,
    *,
    max_shard_bytes: int | None = None,
    stacked_experts: bool = False,
    **config_overrides: Any,
) -> Path:
    """Write a tiny random ``model_type`` checkpoint into ``out_dir`` and return its path.

    ``config_overrides`` replace config fields (e.g. ``num_hidden_layers=4``,
    ``mlp_only_layers=[0]``, ``torch_dtype="float32"``). Same arguments give
    byte-identical files. ``stacked_experts`` (the GDN hybrids): each layer's experts as
    ``mlp.experts.gate_up_proj`` / ``down_proj`` stacks, as transformers 5 and Qwen3.5's
    checkpoints store them (the same values as the per-expert tensors).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model_type in qwen4_checkpoint.QWEN4_TYPES:
        config = qwen4_checkpoint.qwen4_config(model_type, **config_overrides)
        specs, init = list(qwen4_checkpoint.qwen4_specs(config)), qwen4_checkpoint.qwen4_init(config)
    elif model_type in hybrid_checkpoint.HYBRID_TYPES:
        config = hybrid_checkpoint.hybrid_config(model_type, **config_overrides)
        specs = list(hybrid_checkpoint.hybrid_specs(config, stacked_experts))
        init = hybrid_checkpoint.init_hybrid
    else:
        config = model_config(model_type, **config_overrides)
        specs, init = list(tensor_specs(config)), init_tensor
    dtype = getattr(torch, hybrid_checkpoint.config_dtype(config))
    write_weights(out, specs, dtype, seed, max_shard_bytes, init)
    write_model_files(out, config)
    return out
