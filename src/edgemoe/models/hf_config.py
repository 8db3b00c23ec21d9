"""Reading a Hugging Face `config.json` the way transformers' config classes read it.

One setting can be spelled several ways: each config class's `attribute_map` (Qwen3-MoE
saves `num_local_experts` since transformers 5 and `num_experts` before), `dtype` /
`torch_dtype`, and RoPE as `rope_parameters` or as `rope_theta` + `rope_scaling`.
`HFConfig` answers for a setting under any of its names; `ConfigSchema` holds what a
config class knows beyond the JSON (aliases, RoPE defaults), copied from transformers
5.24 (with 5.25's one new alias) and checked against the installed one in
tests/models/test_hf_config.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from edgemoe.layers.rotary import ROPE_TYPES, RopeSpec


class ConfigError(ValueError):
    """config.json is missing a field or asks for something unsupported. The message names
    the field; `models/registry.model_arch` prefixes the file."""


@dataclass(frozen=True)
class ConfigSchema:
    """A transformers config class's knowledge of its JSON."""

    attribute_map: Mapping[str, str] = field(default_factory=dict)  # alias → the name it stands for
    default_theta: float = 10000.0  # RotaryEmbeddingConfigMixin.default_theta
    partial_rotary_factor: float | None = None  # __post_init__'s default, where it sets one
    default_rope: Mapping[str, Any] | None = None  # rope_parameters when config.json has none
    partial_rotary: bool = True  # False: the modeling code rotates whole heads whatever the config says


_FULL_HEAD = {"partial_rotary": False}  # Llama-style modeling: default rope ignores partial_rotary_factor
SCHEMAS: dict[str, ConfigSchema] = {
    "qwen3_moe": ConfigSchema({"num_experts": "num_local_experts"}, **_FULL_HEAD),
    "olmoe": ConfigSchema({"num_local_experts": "num_experts"}, **_FULL_HEAD),
    "mixtral": ConfigSchema({"num_experts": "num_local_experts"}, default_theta=1000000.0, **_FULL_HEAD),
    "qwen3_next": ConfigSchema(partial_rotary_factor=0.25),
    "qwen3_5_moe_text": ConfigSchema(partial_rotary_factor=0.25),
    # Its __post_init__ skips Qwen3.5's: partial_rotary_factor comes from config.json only (1.0 if absent).
    "qwen4_exp_text": ConfigSchema(),
    # Its default rope rotates whole heads whatever partial_rotary_factor says (its YaRN fails on one).
    "gpt_oss": ConfigSchema(
        {"num_experts": "num_local_experts"},
        default_theta=150000.0,
        default_rope={
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 4096,
        },
        **_FULL_HEAD,
    ),
    # Its default rope ignores partial_rotary_factor; its YaRN fails on one (as _FULL_HEAD's families).
    "deepseek_v2": ConfigSchema({"num_experts": "n_routed_experts"}, **_FULL_HEAD),
    "deepseek_v3": ConfigSchema({"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"}),
    "glm4_moe_lite": ConfigSchema({"num_local_experts": "n_routed_experts", "head_dim": "qk_rope_head_dim"}),
    "glm4_moe": ConfigSchema(
        {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
        partial_rotary_factor=0.5,
    ),
    # Its legacy `rotary_dim` (the factor's other spelling) is read by models/minimax_m2.py.
    "minimax_m2": ConfigSchema({"num_experts": "num_local_experts"}, default_theta=5000000.0),
    # Its default rope ignores partial_rotary_factor; its interleaved rotary fails on a partial scaled one.
    "ernie4_5_moe": ConfigSchema({"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k",
                                  "num_mtp_layers": "num_nextn_predict_layers"},
                                 default_theta=500000.0, **_FULL_HEAD),
}

_MISSING = object()
MAX_LAYERS = 1024  # the deepest published models have ~130


class HFConfig:
    """A config.json dict read through its model_type's aliases: `c.get("num_experts")`
    finds `num_experts` or `num_local_experts` on Qwen3-MoE, as `config.num_experts` does."""

    def __init__(self, raw: Mapping[str, Any], schema: ConfigSchema | None = None) -> None:
        self.raw = raw
        self.model_type = raw.get("model_type")
        self.schema = schema if schema is not None else SCHEMAS.get(str(self.model_type), ConfigSchema())

    def names(self, key: str) -> list[str]:
        """Every spelling of the setting `key`, the one transformers saves first."""
        amap = self.schema.attribute_map
        canonical = amap.get(key, key)
        return [canonical] + sorted(a for a, target in amap.items() if target == canonical)

    def spelled(self, key: str) -> str:
        """The name the setting `key` has in config.json (ERNIE's `moe_k`), for messages: a
        refusal names the field the file holds; `key` when it holds none."""
        return next((n for n in self.names(key) if n in self.raw), key)

    def get(self, key: str, default: Any = None) -> Any:
        found = [(n, self.raw[n]) for n in self.names(key) if n in self.raw]
        if not found:
            return default
        if any(v != found[0][1] for _, v in found):
            given = " and ".join(f"{n}={v!r}" for n, v in found)
            raise ConfigError(f"{given}: two names of one setting that disagree")
        return found[0][1]

    def require(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            spelled = " nor ".join(repr(n) for n in self.names(key))
            raise ConfigError(f"no {spelled} (needed by model_type {self.model_type!r})")
        return value

    # Typed reads: transformers' config classes are @strict dataclasses that refuse a value of
    # the wrong type; so do these, naming the field, before a bad value reaches the model.
    # A null counts as absent (the class default), as for the `X | None` fields.

    def integer(self, key: str, default: Any = _MISSING, minimum: int = 1, maximum: int | None = None) -> int:
        """An integer >= `minimum` (and <= `maximum`; a bool is not one); `default` when absent or null."""
        value = self.get(key)
        if value is None:
            if default is _MISSING:
                self.require(key)
                raise ConfigError(f"{self.spelled(key)}=null: expected an integer >= {minimum}")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{self.spelled(key)}={value!r}: expected an integer >= {minimum}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"{self.spelled(key)}={value!r}: expected at most {maximum}")
        return value

    def layers(self) -> int:
        """`num_hidden_layers`, at most MAX_LAYERS (a typo's million layers planned for minutes)."""
        return self.integer("num_hidden_layers", maximum=MAX_LAYERS)

    def number(self, key: str, default: float | None) -> float | None:
        """A finite number > 0; `default` when absent or null."""
        value = self.get(key)
        if value is None:
            return default
        return positive_number(self.spelled(key), value)

    def flag(self, key: str, default: bool, null: bool | None = None) -> bool:
        """true or false; `default` when absent. A null is `null` where given: a class whose
        field is `bool | None` keeps the null, and modelling that tests the field's truth
        then reads it as false (DeepSeek-V3's `norm_topk_prob`, `rope_interleave`)."""
        value = self.get(key)
        if value is None:
            return default if null is None or key not in self else null
        if not isinstance(value, bool):
            raise ConfigError(f"{self.spelled(key)}={value!r}: expected true or false")
        return value

    def int_list(self, key: str) -> list[int]:
        """A list of integers >= 0 ([] when absent or null)."""
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
            raise ConfigError(f"{self.spelled(key)}={value!r}: expected a list of integers >= 0")
        return value

    def __contains__(self, key: str) -> bool:
        return self.get(key, _MISSING) is not _MISSING


def positive_number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ConfigError(f"{key}={value!r}: expected a number > 0")
    return float(value)


def text_config(config: Mapping[str, Any], multimodal_type: str, text_type: str) -> dict[str, Any]:
    """The language model's settings: a multimodal config's `text_config`, or the config itself.

    NOTE: the multimodal model (`...ForConditionalGeneration`) ties its LM head by the top
    level's `tie_word_embeddings` (default false), whatever `text_config` says:
    `save_pretrained` of a tied model writes true at the top and false in `text_config`,
    and drops `lm_head.weight`. Its dtype is the top level's too, where it has one."""
    if config.get("model_type") != multimodal_type:
        return dict(config)
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"model_type {multimodal_type!r} needs a text_config object")
    top = {k: config[k] for k in ("dtype", "torch_dtype") if config.get(k) is not None}
    tie = config.get("tie_word_embeddings")
    return {**text, **top, "tie_word_embeddings": False if tie is None else tie, "model_type": text_type}


def checkpoint_dtype(c: HFConfig) -> torch.dtype:
    """`dtype` (transformers 5) wins over `torch_dtype` (4.x) when both are set. A float64
    checkpoint (`save_pretrained` of a `.double()` model) computes in float32, the widest
    dtype we have: refusing it refused `--dtype float32` / bfloat16 too, which cast it fine."""
    name = c.get("dtype") or c.get("torch_dtype") or "bfloat16"
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float32}
    if not isinstance(name, str) or name not in dtypes:
        raise ConfigError(f"dtype {name!r} is not supported ({', '.join(dtypes)})")
    return dtypes[name]


def rope_parameters(c: HFConfig, max_position_embeddings: int) -> dict[str, Any]:
    """`rope_parameters` after transformers' standardisation: `rope_scaling` (4.x) wins
    over `rope_parameters`, then the family default; `rope_theta`, `partial_rotary_factor`
    and yarn's `original_max_position_embeddings` filled from the top level or defaults."""
    given = c.get("rope_scaling") or c.get("rope_parameters") or c.schema.default_rope or {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"rope_parameters={given!r}: expected an object")
    params = dict(given)
    # NOTE: a layer_types that is no list (a number) is the model file's to refuse by name.
    kinds = c.get("layer_types")
    if isinstance(kinds, list) and any(key in kinds for key in params):
        raise ConfigError("rope_parameters per layer type are not supported yet")
    if params.get("rope_theta") is None:
        theta = c.get("rope_theta")
        params["rope_theta"] = c.schema.default_theta if theta is None else theta
    partial = c.get("partial_rotary_factor", c.schema.partial_rotary_factor)
    if params.get("partial_rotary_factor") is None and partial is not None:
        params["partial_rotary_factor"] = partial
    params.setdefault("rope_type", params.get("type", "default"))
    if params["rope_type"] in ("yarn", "llama3", "longrope"):
        # NOTE: a top-level original_max_position_embeddings (Phi-3) takes priority.
        top = c.get("original_max_position_embeddings")
        params["original_max_position_embeddings"] = (
            top if top is not None else params.get("original_max_position_embeddings", max_position_embeddings)
        )
    return params


def check_rope_values(p: Mapping[str, Any]) -> None:
    """Each rope_parameters value the rotary tables compute with is of its type, so a bad one
    is refused by name here, not a TypeError (or math domain error) when the tables are built."""
    rope_type = p["rope_type"]
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"rope_type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    # NOTE: transformers refuses these without the key, but YaRN's "factor": null means
    # max_position_embeddings / original_max_position_embeddings (layers/rotary.py).
    if rope_type in ("linear", "dynamic") and p.get("factor") is None or rope_type == "yarn" and "factor" not in p:
        raise ConfigError(f"rope_type {rope_type!r} needs rope_parameters.factor")
    for key in ("rope_theta", "factor", "partial_rotary_factor", "original_max_position_embeddings"):
        if p.get(key) is not None:
            positive_number(f"rope_parameters.{key}", p[key])
    if rope_type != "yarn":
        return  # the other types read none of YaRN's options
    if p.get("original_max_position_embeddings") is None:  # only an explicit null: absent is the native length
        raise ConfigError("rope_parameters.original_max_position_embeddings=null: rope_type 'yarn' needs a number")
    for key in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"):
        value = p.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"rope_parameters.{key}={value!r}: expected a number")
        if key.startswith("beta") and value < 0:  # rotations: 0 means the default, a log takes the rest
            raise ConfigError(f"rope_parameters.{key}={value!r}: expected a number >= 0")
    if p.get("truncate") is not None and not isinstance(p["truncate"], bool):
        raise ConfigError(f"rope_parameters.truncate={p['truncate']!r}: expected true or false")


def rope_spec(c: HFConfig, head_dim: int, max_position_embeddings: int) -> RopeSpec:
    """The model's RoPE; `max_position_embeddings` is config.json's (or the family default)."""
    p = rope_parameters(c, max_position_embeddings)
    rope_type = p["rope_type"]
    check_rope_values(p)
    partial = float(p.get("partial_rotary_factor") or 1.0)
    if not c.schema.partial_rotary:
        # NOTE: default RoPE ignores the factor there, but transformers' scaled RoPE computes
        # frequencies for the partial dim, which whole-head modeling cannot apply (it fails
        # on a shape mismatch): no model to match, so refused rather than rotated whole.
        if partial != 1.0 and rope_type != "default":
            raise ConfigError(f"partial_rotary_factor {partial} with rope_type {rope_type!r}: model_type "
                              f"{c.model_type!r} rotates whole heads (transformers cannot run it either)")
        partial = 1.0
    rotary_dim = int(head_dim * partial)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ConfigError(f"partial_rotary_factor {partial} gives rotary dim {rotary_dim} of head_dim {head_dim}")
    return RopeSpec(
        head_dim=head_dim,
        theta=float(p["rope_theta"]),
        rotary_dim=rotary_dim,
        rope_type=rope_type,
        factor=p.get("factor"),
        max_position_embeddings=max_position_embeddings,
        original_max_position_embeddings=p.get("original_max_position_embeddings"),
        attention_factor=p.get("attention_factor"),
        beta_fast=p.get("beta_fast"),
        beta_slow=p.get("beta_slow"),
        mscale=p.get("mscale"),
        mscale_all_dim=p.get("mscale_all_dim"),
        truncate=bool(p.get("truncate", True)),
    )


MAX_CONTEXT = 2**31 - 1  # positions are int32 on the device


def context_length(spec: RopeSpec) -> int:
    """Positions the model serves: the native length (`spec.max_position_embeddings`),
    stretched by linear and YaRN scaling.

    YaRN: `original × factor` (Qwen3-30B-A3B: 32,768 × 4 = 131,072, as Qwen documents),
    or `max_position_embeddings` where that is already the scaled length (DeepSeek-V3,
    gpt-oss). Linear: positions are divided by `factor`, so `max × factor`. Dynamic NTK
    stays at the native length (see layers/rotary.py)."""
    max_position_embeddings = spec.max_position_embeddings
    assert max_position_embeddings is not None
    length, fields = max_position_embeddings, "max_position_embeddings"
    if spec.rope_type == "linear":
        assert spec.factor is not None
        length, fields = int(max_position_embeddings * spec.factor), "max_position_embeddings x rope_parameters.factor"
    if spec.rope_type == "yarn" and spec.factor is not None:
        assert spec.original_max_position_embeddings is not None
        stretched = int(spec.original_max_position_embeddings * spec.factor)
        if stretched > length:
            length, fields = stretched, "rope_parameters.original_max_position_embeddings x factor"
    if length > MAX_CONTEXT:  # else the memory plan fails later, sized in GiB, naming no field
        raise ConfigError(f"{fields} = {length:.3g} positions, beyond the {MAX_CONTEXT:,} a context can hold")
    return length
