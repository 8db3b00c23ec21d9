"""Tiny seeded Qwen3.8-Flash-Next checkpoints in the Hub layout (what transformers 5.24's
`save_pretrained` writes): `qwen4_exp_text`, and `qwen4_exp` (the multimodal layout:
`text_config`, tensors under `model.language_model.*`, plus a vision and an MTP tensor a
text model must ignore). Each PLE table is written as `split_ngram_parts` row chunks
(`ngram_embedding.shard_<k>.weight`, transformers' `torch.chunk`), beside the hash
buffers transformers saves (`layer_multipliers`, `ngram_heads_vocab_sizes`,
`ngram_heads_offsets`, int64, derived from the config).

Weight scales as `tensor_specs.init_tensor`, except: every RMSNorm of this model is
zero-centred (x·(1 + w): w is small noise) but the GDN output norm's; A = exp(A_log) in
(1, 16). Defaults: 4 layers (three GDN, one indexed attention), PLE on GDN layers 1 and 3
(one-indexed), two hyper-connection streams, a QSA budget of 8 tokens in blocks of 4 (so
a 150-token prompt attends sparsely).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from edgemoe.assets.tensor_specs import COMMON_CONFIG, TensorSpec, init_tensor
from edgemoe.assets.hybrid_checkpoint import _attention, _gdn, _glu, init_hybrid
from edgemoe.ple.geometry import ple_geometry

QWEN4_TYPES = ("qwen4_exp", "qwen4_exp_text")
GDN, INDEXED = "linear_attention", "indexed_attention"

_TEXT: dict[str, Any] = {
    **{k: v for k, v in COMMON_CONFIG.items() if k not in ("rope_theta", "rope_scaling")},
    "architectures": ["Qwen4ExpForCausalLM"], "model_type": "qwen4_exp_text",
    "num_hidden_layers": 4, "layer_types": [GDN, GDN, GDN, INDEXED], "head_dim": 16, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "num_experts": 8, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "norm_topk_prob": True,
    "router_aux_loss_coef": 0.001, "hc_count": 2, "hc_lowrank": 8,
    "ple_layer_ids": [1, 3], "ple_embed_dim": 32, "ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 8,
    "ngram_vocab_size_base": 1000, "make_ngram_vocab_size_divisible_by": 128, "seed": 1234, "split_ngram_parts": 4,
    "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
    "indexer_compress_ratio": 4, "output_gate_type": None,
}
_TOP_LEVEL = ("torch_dtype", "tie_word_embeddings")


def qwen4_config(model_type: str, **overrides: Any) -> dict[str, Any]:
    """config.json of a tiny model; `overrides` change the language model's fields."""
    text = {**_TEXT, **overrides}
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        text["layer_types"] = [GDN if (i + 1) % 4 else INDEXED for i in range(text["num_hidden_layers"])]
    if model_type == "qwen4_exp_text":
        return dict(sorted(text.items()))
    top = {k: text[k] for k in _TOP_LEVEL}
    return {
        "architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp", **top,
        "text_config": dict(sorted(text.items())), "image_token_id": 248056, "video_token_id": 248057,
        "vision_start_token_id": 248053, "vision_end_token_id": 248054,
    }


def qwen4_specs(config: dict[str, Any]) -> Iterator[TensorSpec]:
    """Hub tensor names and shapes, in model order."""
    multimodal = config["model_type"] == "qwen4_exp"
    t = config["text_config"] if multimodal else config
    pre, h, v = ("model.language_model." if multimodal else "model."), t["hidden_size"], t["vocab_size"]
    yield f"{pre}embed_tokens.weight", (v, h)
    ple_ids = sorted(set(t.get("ple_layer_ids") or []))
    for i, kind in enumerate(t["layer_types"]):
        p = f"{pre}layers.{i}"
        if kind == GDN:
            yield from _gdn(f"{p}.linear_attn", t, "qwen3_5_moe")
        else:
            yield from _attention(f"{p}.self_attn", t)
            q = t["indexer_n_heads"] + t["indexer_kv_heads"]
            yield f"{p}.self_attn.indexer.index_qk_proj.weight", (q * t["indexer_head_dim"], h)
            yield f"{p}.self_attn.indexer.q_layernorm.weight", (t["indexer_head_dim"],)
            yield f"{p}.self_attn.indexer.k_layernorm.weight", (t["indexer_head_dim"],)
        yield from _moe(f"{p}.mlp", t)
        if i + 1 in ple_ids:
            yield from _ple(f"{p}.ple", t, ple_ids.index(i + 1))
        for hc in ("attn_hyper_connection", "mlp_hyper_connection"):
            yield from _hyper(f"{p}.{hc}", t, inject=True)
    yield from _hyper(f"{pre}hyper_connection_mixer", t, inject=False)
    if not config.get("tie_word_embeddings", t["tie_word_embeddings"]):
        yield "lm_head.weight", (v, h)
    if multimodal:  # parts of a real checkpoint the text model does not read
        yield "model.visual.patch_embed.proj.weight", (8, 12)
        yield "mtp.fc.weight", (h, 2 * h)


def _moe(p: str, t: dict[str, Any]) -> Iterator[TensorSpec]:
    h, n, i = t["hidden_size"], t["num_experts"], t["moe_intermediate_size"]
    yield f"{p}.gate.weight", (n, h)
    for e in range(n):
        yield from _glu(f"{p}.experts.{e}", h, i)
    yield from _glu(f"{p}.shared_expert", h, t["shared_expert_intermediate_size"])
    yield f"{p}.shared_expert_gate.weight", (1, h)


def _hyper(p: str, t: dict[str, Any], inject: bool) -> Iterator[TensorSpec]:
    w, r = t["hc_count"] * t["hidden_size"], t["hc_lowrank"]
    yield f"{p}.hc_norm.weight", (w,)
    yield f"{p}.input_mix_weight_down.weight", (r, w)
    yield f"{p}.input_mix_weight_up.weight", (w, r)
    if inject:
        yield f"{p}.block_inject_weight.weight", (t["hc_count"], w)


def geometry(t: dict[str, Any]):  # noqa: ANN201 - PleGeometry
    eos = t["eos_token_id"]
    return ple_geometry(
        ple_layers=tuple(i - 1 for i in sorted(set(t["ple_layer_ids"]))), vocab_size=t["vocab_size"],
        ngram_size=t["ngram_size"], heads_per_ngram=t["heads_per_ngram"], embed_dim=t["ple_embed_dim"],
        vocab_base=t["ngram_vocab_size_base"], divisor=t["make_ngram_vocab_size_divisible_by"], seed=t["seed"],
        split_parts=t["split_ngram_parts"], eos=eos[0] if isinstance(eos, list) else eos,
    )


def _ple(p: str, t: dict[str, Any], j: int) -> Iterator[TensorSpec]:
    w, h, dim = t["hc_count"] * t["hidden_size"], t["hidden_size"], t["ple_embed_dim"]
    g = geometry(t)
    yield f"{p}.conv1d.weight", (w, 1, t["ple_conv_kernel_size"])
    yield f"{p}.key_proj.weight", (w, dim)
    yield f"{p}.value_proj.weight", (h, dim)
    for name in ("norm_conv", "norm_key", "norm_query"):
        yield f"{p}.{name}.weight", (w,)
    e = f"{p}.ple_embedding"
    yield f"{e}.layer_multipliers", (t["ngram_size"],)
    yield f"{e}.ngram_heads_offsets", (g.heads,)
    yield f"{e}.ngram_heads_vocab_sizes", (g.heads,)
    for k, rows in enumerate(g.chunk_rows(j)):
        yield f"{e}.ngram_embedding.shard_{k}.weight", (rows, g.head_dim)


def qwen4_init(config: dict[str, Any]):  # noqa: ANN201 - the checkpoint's Init
    """init_tensor's scales with these models' zero-centred norms, and the hash buffers."""
    t = config.get("text_config") or config
    g = geometry(t) if t.get("ple_layer_ids") else None

    def init(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
        if "ple_embedding." in name and not name.endswith(".weight"):
            assert g is not None
            j = int(name.split(".layers.")[1].split(".")[0])
            layer = g.layers[[x.layer for x in g.layers].index(j)]
            field = {"layer_multipliers": layer.multipliers, "ngram_heads_offsets": layer.offsets,
                     "ngram_heads_vocab_sizes": layer.vocab_sizes}[name.rsplit(".", 1)[1]]
            return torch.tensor(field, dtype=torch.int64)
        if len(shape) == 1 and "norm" in name and not name.endswith("linear_attn.norm.weight"):
            return init_tensor(name, shape, seed) - 1.0  # zero-centred: 1 + w, w ~ 0.1·N(0, 1)
        return init_hybrid(name, shape, seed)

    return init
