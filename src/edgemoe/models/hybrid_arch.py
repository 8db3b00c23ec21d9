"""HybridArch: the shape of the Qwen GDN hybrids (Qwen3-Next, Qwen3.5/3.6 MoE).

Layers alternate gated-delta-net ("linear_attention") and gated attention
("full_attention"), by default three to one; every layer has a pre-norm MLP, a sparse
MoE with a shared expert (Qwen3-Next may make some layers dense). Only the attention
layers hold KV; the GDN layers hold a recurrent state per sequence. Read from
`config.json` by `models/qwen3_next.py` and `models/qwen3_5_moe.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from edgemoe.cache.state_pool import StateShape
from edgemoe.layers.rotary import RopeSpec
from edgemoe.models.arch import ConfigError, HFConfig, check_experts, common_fields

GDN, ATTENTION = "linear_attention", "full_attention"
GDN_CHUNK = 64  # the chunked rule's chunk (kernels/gdn.CHUNK): sizes the prefill workspace


@dataclass(frozen=True)
class HybridArch:
    model_type: str
    checkpoint_prefix: str  # "model." or, in a multimodal checkpoint, "model.language_model."
    gdn_layout: str  # "interleaved": Qwen3-Next's in_proj_qkvz/in_proj_ba; "split": Qwen3.5's four
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeSpec
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    moe_layers: tuple[int, ...]
    intermediate_size: int  # dense MLP layers (Qwen3-Next's mlp_only_layers)
    layer_types: tuple[str, ...]  # GDN or ATTENTION per layer
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    dtype: torch.dtype

    @property
    def kv_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == ATTENTION)

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == GDN)

    @property
    def index_key_dim(self) -> int:
        return 0

    @property
    def shared_in_store(self) -> bool:
        """The shared expert is expert `num_experts` of each bank (same shape as the routed ones)."""
        return self.shared_expert_intermediate_size == self.moe_intermediate_size

    @property
    def store_experts(self) -> int:
        return self.num_experts + int(self.shared_in_store)

    @property
    def moe_pairs(self) -> int:
        return self.top_k + int(self.shared_in_store)

    @property
    def conv_channels(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.value_width

    @property
    def value_width(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def gdn_proj_rows(self) -> int:
        """q | k | v | z | b | a: the fused GDN input projection's output width."""
        return self.conv_channels + self.value_width + 2 * self.linear_num_value_heads

    @property
    def attn_proj_rows(self) -> int:
        return (2 * self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def projection_width(self) -> int:
        return max(self.gdn_proj_rows, self.attn_proj_rows)

    @property
    def state_workspace_per_token(self) -> int:
        """The torch chunked rule's fp32 temporaries per prefill token and GDN layer call:
        ~10 head-wide vectors (q, k repeated to Hv heads, v, u, w, decayed q/k, output…) and
        3 chunk-wide rows (decay, UT and intra-chunk matrices) per value head; fla's kernel
        needs less (docs/architecture.md). Freed between layers."""
        width = max(self.linear_key_head_dim, self.linear_value_head_dim)
        return self.linear_num_value_heads * (10 * width + 3 * GDN_CHUNK) * 4

    def state_shape(self) -> StateShape:
        return StateShape(
            len(self.gdn_layers), self.linear_num_value_heads, self.linear_key_head_dim,
            self.linear_value_head_dim, self.conv_channels, self.linear_conv_kernel_dim - 1, self.dtype,
        )

    @property
    def state_bytes(self) -> int:
        return self.state_shape().row_nbytes

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Our names and shapes of every tensor not in the expert store."""
        H = self.hidden_size
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab_size, H), "norm": (H,)}
        if not self.tie_word_embeddings:
            shapes["lm_head"] = (self.vocab_size, H)
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes[p + "attn_norm"], shapes[p + "mlp_norm"] = (H,), (H,)
            shapes |= {p + k: v for k, v in (self._gdn_shapes() if i in self.gdn_layers else self._attn_shapes()).items()}
            shapes |= {p + k: v for k, v in self._mlp_shapes(i).items()}
        return shapes

    def _attn_shapes(self) -> dict[str, tuple[int, ...]]:
        D = self.head_dim
        return {"qkv": (self.attn_proj_rows, self.hidden_size), "o_proj": (self.hidden_size, self.num_heads * D),
                "q_norm": (D,), "k_norm": (D,)}

    def _gdn_shapes(self) -> dict[str, tuple[int, ...]]:
        H, Hv = self.hidden_size, self.linear_num_value_heads
        if self.gdn_layout == "interleaved":  # reordered into `in_proj` by the model file's build()
            proj = {"in_qkvz": (self.conv_channels + self.value_width, H), "in_ba": (2 * Hv, H)}
        else:
            proj = {"in_proj": (self.gdn_proj_rows, H)}
        return {
            **proj, "conv": (self.conv_channels, 1, self.linear_conv_kernel_dim), "A_log": (Hv,),
            "dt_bias": (Hv,), "gdn_norm": (self.linear_value_head_dim,), "out_proj": (H, self.value_width),
        }

    def _mlp_shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        H = self.hidden_size
        if i not in self.moe_layers:
            return {"gate_up": (2 * self.intermediate_size, H), "down": (H, self.intermediate_size)}
        shapes = {"router": (self.num_experts, H), "shared_gate": (1, H)}
        if not self.shared_in_store:
            inter = self.shared_expert_intermediate_size
            shapes |= {"shared_gate_up": (2 * inter, H), "shared_down": (H, inter)}
        return shapes


def layer_types(c: HFConfig, num_layers: int) -> tuple[str, ...]:
    """`layer_types`, or transformers' default: every `full_attention_interval`-th layer (4) attends."""
    given = c.get("layer_types")
    if given is None:
        interval = c.integer("full_attention_interval", 4)
        return tuple(GDN if (i + 1) % interval else ATTENTION for i in range(num_layers))
    if not isinstance(given, list) or len(given) != num_layers or not set(given) <= {GDN, ATTENTION}:
        raise ConfigError(f"layer_types must list {GDN!r} or {ATTENTION!r} for each of the {num_layers} layers")
    return tuple(given)


def hybrid_arch(
    c: HFConfig, *, model_type: str, checkpoint_prefix: str, gdn_layout: str, moe_layers: tuple[int, ...],
    norm_topk_prob: bool, num_experts: int = 512,
) -> HybridArch:
    """The fields both families spell the same way, with transformers 5.24's defaults
    (`num_experts`: the family's, where its config class differs: Qwen3.5's 256)."""
    if c.flag("attention_bias", False):
        raise ConfigError(f"attention_bias=true (biased q/k/v/o projections) is not supported for {model_type}")
    if c.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ConfigError(f"hidden_act={c.get('hidden_act')!r}: the GDN short conv of {model_type} supports silu only")
    fields: dict[str, Any] = common_fields(c, eps=1e-6, max_pos=32768, head_dim=c.integer("head_dim", 256), kv_heads=2)
    layers = fields["num_layers"]
    arch = HybridArch(
        model_type=model_type, checkpoint_prefix=checkpoint_prefix, gdn_layout=gdn_layout, **fields,
        num_experts=c.integer("num_experts", num_experts),
        moe_intermediate_size=c.integer("moe_intermediate_size", 512),
        shared_expert_intermediate_size=c.integer("shared_expert_intermediate_size", 512, minimum=0),
        norm_topk_prob=norm_topk_prob, moe_layers=moe_layers, intermediate_size=c.integer("intermediate_size", 5632),
        layer_types=layer_types(c, layers), linear_num_key_heads=c.integer("linear_num_key_heads", 16),
        linear_num_value_heads=c.integer("linear_num_value_heads", 32),
        linear_key_head_dim=c.integer("linear_key_head_dim", 128),
        linear_value_head_dim=c.integer("linear_value_head_dim", 128),
        linear_conv_kernel_dim=c.integer("linear_conv_kernel_dim", 4, minimum=2),
    )
    check_experts(c, arch.num_experts, arch.top_k, moe_layers)
    if arch.linear_num_value_heads % arch.linear_num_key_heads:
        raise ConfigError(f"linear_num_value_heads={arch.linear_num_value_heads} is not a multiple of "
                          f"linear_num_key_heads={arch.linear_num_key_heads}")
    if arch.shared_expert_intermediate_size < 1:  # transformers' empty shared expert adds zeros
        raise ConfigError(f"shared_expert_intermediate_size=0 (no shared expert) is not supported for {model_type}")
    return arch
