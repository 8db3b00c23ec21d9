"""Random-weight model presets: `--model random:PRESET[?key=value,...]`.

A preset is a Hugging Face `config.json` dict, read by the same model module as a
real checkpoint's (`models/registry.py`), so everything after loading is the path a
real checkpoint takes; only the weights are seeded random numbers (`random_weights.py`).
Overrides change config fields for slices and sweeps
(`random:qwen3-30b-a3b?num_hidden_layers=12`); `seed` picks the weights. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from edgemoe.models.presets_ernie import ERNIE_4_5_21B_A3B, TINY_ERNIE_4_5
from edgemoe.models.presets_glm import GLM_4_5_AIR, TINY_GLM4_MOE
from edgemoe.models.presets_minimax import MINIMAX_M2, TINY_MINIMAX_M2
from edgemoe.models.presets_mla import DEEPSEEK_V2_LITE, GLM_4_7_FLASH, TINY_DEEPSEEK_V2_LITE, TINY_GLM_4_7_FLASH
from edgemoe.models.presets_gpt_oss import GPT_OSS_20B, GPT_OSS_120B, TINY_GPT_OSS

RANDOM_PREFIX = "random:"
SEED_KEY = "seed"  # not a config field: the seed of the random weights

# Qwen/Qwen3-30B-A3B's published config.json, every field. Qwen3-Coder-30B-A3B shares
# its weight shapes (hidden 2048, 48 layers, 32 q / 4 kv heads x 128, 128 experts
# top-8, moe_intermediate 768, vocab 151,936, untied embeddings, bf16); its own
# config.json is the next preset.
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,  # unused: every layer is sparse
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# Qwen/Qwen3-Coder-30B-A3B-Instruct's config.json: the same shapes; rope_theta 1e7 and
# a 262,144-token native context; intermediate_size 5472 (unused), no bos_token_id.
QWEN3_CODER_30B_A3B: dict[str, Any] = {
    **{k: v for k, v in QWEN3_30B_A3B.items() if k != "bos_token_id"},
    "intermediate_size": 5472,
    "max_position_embeddings": 262144,
    "max_window_layers": 28,
    "qkv_bias": False,
    "rope_theta": 10000000.0,  # published as the integer 10000000
    "router_aux_loss_coef": 0.0,
    "shared_expert_intermediate_size": 0,
    "use_qk_norm": True,
}

# For tests: every code path of the big preset at a few MB (the vocabulary stays real,
# so the real tokenizer and chat template work).
TINY_QWEN3_MOE: dict[str, Any] = {
    **QWEN3_30B_A3B,
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "max_window_layers": 2,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
}

# Qwen/Qwen3.5-35B-A3B's language model (its config.json's `text_config`, written as the
# text-only `qwen3_5_moe_text` so overrides reach every field; Qwen3.6-35B-A3B has the
# same shapes): 40 layers, three GDN to one gated attention (`full_attention_interval`
# rather than the 40-entry `layer_types`, so `num_hidden_layers` overrides stay valid);
# GDN 16 key / 32 value heads x 128, conv kernel 4; attention 16 q / 2 kv heads x 256,
# rotary on the first 25% (64 dims), theta 1e7 (the interleaved multimodal sections are
# plain rotary for text); 256 experts top-8 + one shared expert, all of width 512;
# vocab 248,320 (the Qwen3.5 tokenizer's 248,077 ids, padded); 262,144-token context; bf16.
# Values as published on the Hub (the model card and config.json), not checked here
# against the file itself: no network.
QWEN3_5_35B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 248044,
    "eos_token_id": 248046,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "model_type": "qwen3_5_moe_text",
    "moe_intermediate_size": 512,
    "num_attention_heads": 16,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
        "rope_theta": 10000000.0, "rope_type": "default",
    },
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 248320,
}

# Its every code path at a few MB (the vocabulary stays real: the Qwen3.5 tokenizer and
# chat template work). 4 layers: three GDN, one attention.
TINY_QWEN3_5_MOE: dict[str, Any] = {
    **QWEN3_5_35B_A3B,
    "head_dim": 16,
    "hidden_size": 64,
    "linear_key_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 16,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "shared_expert_intermediate_size": 32,
}

# Qwen3.8-Flash-Next (`qwen4_exp_text`) at its real widths, reduced in depth and n-gram
# tables so it runs on the GPU machine (one H200, ~125 GiB of RAM, a bare disk each start):
# - widths as Qwen3.5-35B-A3B's language model (hidden 2048; GDN 16 key / 32 value heads x 128;
#   attention 16 q / 2 kv heads x 256, 25% rotary, theta 1e7; vocab 248,320) with 512 experts
#   top-10 of width 512 plus a shared expert of width 512, 4 hyper-connection streams, rank 320;
# - 24 layers instead of 40 (18 GDN + 6 indexed attention): bf16 experts 24 x 513 x 6 MiB = 72 GiB
#   of host RAM (40 layers would need 120 GiB);
# - PLE on 3 GDN layers (one-indexed 2, 10, 18) instead of 5, 16 hash heads x 32 dims each
#   (ple_embed_dim 512), each head's table ~5M rows (ngram_vocab_size_base 5,000,000 instead of
#   20,000,000): 3 x 16 x 5M x 64 B = 14.3 GiB of tables instead of ~95 GiB;
# - QSA: 16 indexer heads x 128, budget 2048 tokens in blocks of 4 (our assumption: transformers
#   has no defaults for them).
# No published config.json was at hand: the widths and the PLE/QSA sizes are assumptions
# documented in docs/benchmarks.md.
QWEN38_FLASH_NEXT: dict[str, Any] = {
    **{k: v for k, v in QWEN3_5_35B_A3B.items() if k != "full_attention_interval"},
    "architectures": ["Qwen4ExpForCausalLM"],
    "model_type": "qwen4_exp_text",
    "num_hidden_layers": 24,
    "full_attention_interval": 4,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "hc_count": 4,
    "hc_lowrank": 320,
    "ple_layer_ids": [2, 10, 18],
    "ple_embed_dim": 512,
    "ple_conv_kernel_size": 4,
    "ngram_size": 3,
    "heads_per_ngram": 8,
    "ngram_vocab_size_base": 5_000_000,
    "make_ngram_vocab_size_divisible_by": 128,
    "seed": 1234,
    "split_ngram_parts": 512,
    "indexer_n_heads": 16,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 128,
    "indexer_budget": 2048,
    "indexer_compress_ratio": 4,
    "norm_topk_prob": True,
    "output_gate_type": "silu",
}

# Its every code path at a few MB: two GDN layers with PLE (tiny tables), one indexed layer.
TINY_QWEN38_FLASH_NEXT: dict[str, Any] = {
    **QWEN38_FLASH_NEXT,
    **{k: TINY_QWEN3_5_MOE[k] for k in (
        "head_dim", "hidden_size", "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        "linear_value_head_dim", "max_position_embeddings", "moe_intermediate_size", "num_attention_heads",
        "shared_expert_intermediate_size")},
    "num_hidden_layers": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "hc_count": 2,
    "hc_lowrank": 8,
    "ple_layer_ids": [1, 3],
    "ple_embed_dim": 32,
    "ngram_vocab_size_base": 1000,
    "indexer_n_heads": 4,
    "indexer_head_dim": 16,
    "indexer_budget": 16,
}

PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "qwen3-coder-30b-a3b": QWEN3_CODER_30B_A3B,
    "qwen3.5-35b-a3b": QWEN3_5_35B_A3B,
    "qwen3.8-flash-next": QWEN38_FLASH_NEXT,
    "tiny-qwen3-moe": TINY_QWEN3_MOE,
    "tiny-qwen3.5-moe": TINY_QWEN3_5_MOE,
    "tiny-qwen3.8-flash-next": TINY_QWEN38_FLASH_NEXT,
    "glm-4.5-air": GLM_4_5_AIR,
    "tiny-glm4-moe": TINY_GLM4_MOE,
    "glm-4.7-flash": GLM_4_7_FLASH,
    "tiny-glm-4.7-flash": TINY_GLM_4_7_FLASH,
    "deepseek-v2-lite": DEEPSEEK_V2_LITE,
    "tiny-deepseek-v2-lite": TINY_DEEPSEEK_V2_LITE,
    "gpt-oss-20b": GPT_OSS_20B,
    "gpt-oss-120b": GPT_OSS_120B,
    "tiny-gpt-oss": TINY_GPT_OSS,
    "minimax-m2": MINIMAX_M2,
    "tiny-minimax-m2": TINY_MINIMAX_M2,
    "ernie-4.5-21b-a3b": ERNIE_4_5_21B_A3B,
    "tiny-ernie-4.5": TINY_ERNIE_4_5,
}

# Integer fields that are sizes or counts: an override must be >= 1.
POSITIVE_FIELDS = frozenset({
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "intermediate_size", "vocab_size",
    "max_position_embeddings", "decoder_sparse_step", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "shared_expert_intermediate_size",
    "full_attention_interval", "n_routed_experts", "n_group", "topk_group", "num_local_experts",
    "moe_num_experts", "moe_k", "moe_layer_interval",
})
_SAFE_QUERY = re.compile(r"[A-Za-z0-9_.,=+\-\[\]]+")


@dataclass(frozen=True)
class RandomSpec:
    """A parsed `random:PRESET?key=value,...`: the preset, its overrides (sorted) and the seed."""

    preset: str
    overrides: tuple[tuple[str, Any], ...]
    seed: int = 0

    @property
    def config(self) -> dict[str, Any]:
        """The config.json dict the model module reads."""
        return {**PRESETS[self.preset], **dict(self.overrides)}

    @property
    def query(self) -> str:
        items = [*self.overrides, *([(SEED_KEY, self.seed)] if self.seed else [])]
        return ",".join(f"{k}={_format(v)}" for k, v in sorted(items))

    @property
    def name(self) -> str:
        """Canonical spelling (keys sorted): what /v1/models and the logs show."""
        return RANDOM_PREFIX + self.preset + (f"?{self.query}" if self.query else "")

    @property
    def dir_name(self) -> str:
        """A file name for this spec: readable when the query is, else a digest."""
        query = self.query
        if not query:
            return self.preset
        if _SAFE_QUERY.fullmatch(query):
            return f"{self.preset}@{query}"
        return f"{self.preset}@{hashlib.blake2b(query.encode(), digest_size=6).hexdigest()}"


def is_random(model: str | None) -> bool:
    return model is not None and model.startswith(RANDOM_PREFIX)


def parse_random(text: str) -> RandomSpec:
    """`random:PRESET?key=value,key=value` (`&` works as a separator too) → RandomSpec.

    Values are JSON when they parse as JSON (`12`, `1e-5`, `true`, `[0,1]`), else strings.
    Raises ValueError naming the bad part and listing what is known.
    """
    if not is_random(text):
        raise ValueError(f"model (--model) {text!r} is not a random preset ({RANDOM_PREFIX}PRESET)")
    preset, _, query = text[len(RANDOM_PREFIX):].partition("?")
    if preset not in PRESETS:
        raise ValueError(f"model (--model) {text!r}: unknown preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
    base = PRESETS[preset]
    overrides: dict[str, Any] = {}
    seed, seen = 0, set()
    for item in _split(query):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"model (--model) {text!r}: {item!r} is not key=value")
        if key in seen:
            raise ValueError(f"model (--model) {text!r}: {key!r} given twice")
        seen.add(key)
        if key == SEED_KEY:
            seed = _check_seed(text, raw)
            continue
        if key not in base:
            known = ", ".join(sorted([*base, SEED_KEY]))
            raise ValueError(f"model (--model) {text!r}: unknown field {key!r} for preset {preset!r}; known: {known}")
        overrides[key] = _typed(text, key, _value(raw), base[key])
    spec = RandomSpec(preset, tuple(sorted(overrides.items())), seed)
    _check_shape(text, spec.config)
    return spec


def _split(query: str) -> list[str]:
    """Split on `,` or `&` outside brackets, so list values like `[0,1]` stay whole."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(query):
        depth += ch in "[{"
        depth -= ch in "]}"
        if depth == 0 and ch in ",&":
            items.append(query[start:i])
            start = i + 1
    items.append(query[start:])
    return [item for item in items if item.strip()]


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _format(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _typed(text: str, key: str, value: Any, like: Any) -> Any:
    """`value` checked against the preset's type for `key` (a null field takes anything)."""
    if like is None:
        return value
    if isinstance(like, bool) or isinstance(value, bool):
        ok = isinstance(like, bool) and isinstance(value, bool)
    elif isinstance(like, float):
        ok = isinstance(value, int | float)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, type(like))
    if not ok:
        raise ValueError(
            f"model (--model) {text!r}: {key}={_format(value)} must be {type(like).__name__} "
            f"like the preset's {_format(like)}"
        )
    if key in POSITIVE_FIELDS and value < 1:
        raise ValueError(f"model (--model) {text!r}: {key} must be >= 1 (got {value})")
    return value


def _check_seed(text: str, raw: str) -> int:
    value = _value(raw)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"model (--model) {text!r}: seed must be an integer >= 0 (got {raw!r})")
    return value


def _check_shape(text: str, c: dict[str, Any]) -> None:
    # GLM's, gpt-oss's, ERNIE's names
    experts = next(c[k] for k in ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts") if k in c)
    top_k = c.get("num_experts_per_tok", c.get("moe_k"))
    if top_k > experts:
        raise ValueError(f"model (--model) {text!r}: num_experts_per_tok {top_k} > num_experts {experts}")
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        raise ValueError(
            f"model (--model) {text!r}: num_attention_heads {c['num_attention_heads']} is not a multiple "
            f"of num_key_value_heads {c['num_key_value_heads']}"
        )
