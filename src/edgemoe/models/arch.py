"""DecoderArch: the shape of a pre-norm decoder-only MoE transformer, read from a
Hugging Face `config.json` (through `HFConfig`, which knows its aliases) by each model
file; the Llama-style families map onto it. `ModelArch` is what the loader, the memory
plans and the runtime read of any model file's arch (a family of another structure,
e.g. the GDN hybrids in `models/hybrid_arch.py`, has its own dataclass)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from edgemoe.cache.state_pool import StateShape
from edgemoe.kernels.activations import ACTIVATIONS, Activation, activation
from edgemoe.kernels.router_sigmoid import GroupedSigmoid
from edgemoe.layers.rotary import RopeSpec
from edgemoe.models.hf_config import (
    ConfigError,
    HFConfig,
    checkpoint_dtype,
    context_length,
    rope_spec,
)

__all__ = ["ConfigError", "DecoderArch", "HFConfig", "ModelArch", "check_experts", "common_fields",
           "expert_activation", "kept_dtypes", "shared_kv"]


class ModelArch(Protocol):
    """What everything outside the model files reads of an arch: the loader (param
    shapes, expert banks), the memory plans (KV, experts, state, workspace) and the
    runtime. A model file's arch is a frozen dataclass (so `dataclasses.replace` sets
    `dtype`)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int  # query heads of the attention layers
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str
    num_experts: int  # routed experts per MoE layer
    top_k: int
    moe_intermediate_size: int
    intermediate_size: int
    moe_layers: tuple[int, ...]
    dtype: torch.dtype

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """Layer indices that hold KV, in order: KV pool layer j is layer kv_layers[j]."""
        ...

    @property
    def store_experts(self) -> int:
        """Experts per MoE layer in the expert store (routed ones, plus a shared one
        that runs through the same slot-addressed call)."""
        ...

    @property
    def moe_pairs(self) -> int:
        """(token, expert) cells per token per MoE layer: top_k, plus a shared expert."""
        ...

    @property
    def state_bytes(self) -> int:
        """Recurrent state per sequence, all layers (0: attention only)."""
        ...

    @property
    def index_key_dim(self) -> int:
        """Per-token sparse-attention index keys per KV layer (0: none; QSA's head dim)."""
        ...

    @property
    def projection_width(self) -> int:
        """The widest per-token projection output of a layer (workspace planning)."""
        ...

    @property
    def state_workspace_per_token(self) -> int:
        """Bytes per prefill token the recurrent layers' prefill kernels allocate (0: none)."""
        ...

    def state_shape(self) -> StateShape | None:
        """One sequence's recurrent state per layer (None: attention only)."""
        ...

    def param_shapes(self) -> dict[str, tuple[int, ...]]: ...


@dataclass(frozen=True)
class DecoderArch:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeSpec  # theta, scaling, rotary_dim (partial rotary)
    max_position_embeddings: int  # the context length: config.json's, stretched by RoPE scaling
    tie_word_embeddings: bool
    hidden_act: str
    qk_norm: str  # "none" | "head" | "full"
    clip_qkv: float | None
    sliding_window: int | None
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    moe_layers: tuple[int, ...]  # layer indices with a sparse MoE block
    intermediate_size: int  # dense MLP layers
    dtype: torch.dtype
    attention_bias: bool = False  # biased q/k/v projections (GLM-4.5)
    # GLM-4.5's router (fp32 weight and bias; its softmax mode: DeepSeek-V2's without a bias, ERNIE's
    # with); None: softmax
    sigmoid_routing: GroupedSigmoid | None = None
    shared_intermediate_size: int = 0  # an ungated shared expert in each MoE layer (GLM-4.5); 0: none

    @property
    def dense_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if i not in self.moe_layers)

    @property
    def kv_layers(self) -> tuple[int, ...]:
        return tuple(range(self.num_layers))

    @property
    def shared_in_store(self) -> bool:
        """The shared expert (GLM's, ungated) is expert `num_experts` of each bank, routed
        as one more pair of weight 1: it has the routed experts' width."""
        return self.shared_intermediate_size == self.moe_intermediate_size

    @property
    def store_experts(self) -> int:
        return self.num_experts + int(self.shared_in_store)

    @property
    def moe_pairs(self) -> int:
        return self.top_k + int(self.shared_in_store)

    @property
    def state_bytes(self) -> int:
        return 0

    @property
    def index_key_dim(self) -> int:
        return 0

    @property
    def projection_width(self) -> int:
        return sum(self.qkv_rows)

    @property
    def state_workspace_per_token(self) -> int:
        return 0

    def state_shape(self) -> StateShape | None:
        return None

    @property
    def qkv_rows(self) -> tuple[int, int, int]:
        return (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Our names and shapes of every non-expert tensor."""
        H, D = self.hidden_size, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab_size, H), "norm": (H,)}
        if not self.tie_word_embeddings:
            shapes["lm_head"] = (self.vocab_size, H)
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes[p + "attn_norm"] = (H,)
            shapes[p + "mlp_norm"] = (H,)
            shapes[p + "qkv"] = (sum(self.qkv_rows), H)
            if self.attention_bias:
                shapes[p + "qkv_bias"] = (sum(self.qkv_rows),)
            shapes[p + "o_proj"] = (H, self.num_heads * D)
            if self.qk_norm == "head":
                shapes[p + "q_norm"], shapes[p + "k_norm"] = (D,), (D,)
            elif self.qk_norm == "full":
                shapes[p + "q_norm"], shapes[p + "k_norm"] = (self.num_heads * D,), (self.num_kv_heads * D,)
            if i in self.moe_layers:
                shapes[p + "router"] = (self.num_experts, H)
                if self.sigmoid_routing is not None and self.sigmoid_routing.selection_bias:
                    shapes[p + "router_bias"] = (self.num_experts,)
                if self.shared_intermediate_size and not self.shared_in_store:
                    shapes[p + "shared_gate_up"] = (2 * self.shared_intermediate_size, H)
                    shapes[p + "shared_down"] = (H, self.shared_intermediate_size)
            else:
                shapes[p + "gate_up"] = (2 * self.intermediate_size, H)
                shapes[p + "down"] = (H, self.intermediate_size)
        return shapes

    def param_dtypes(self) -> dict[str, torch.dtype]:
        """The params kept in another dtype than the model's: a sigmoid router's weight and
        bias stay fp32, as transformers keeps them (`_keep_in_fp32_modules_strict`): the
        bias only chooses, and its fine differences decide between near-equal scores."""
        if self.sigmoid_routing is None:
            return {}
        names = ("router", "router_bias") if self.sigmoid_routing.selection_bias else ("router",)  # DeepSeek-V2: none
        return {f"layers.{i}.{n}": torch.float32 for i in self.moe_layers for n in names}


def expert_activation(arch: ModelArch) -> Activation:
    """The routed experts' activation: the arch's own (`expert_activation()`, gpt-oss's clamped
    SwiGLU) or `hidden_act`'s."""
    own = getattr(arch, "expert_activation", None)
    return own() if own is not None else activation(arch.hidden_act)


def kept_dtypes(arch: ModelArch) -> dict[str, torch.dtype]:
    """The params an arch keeps in another dtype than its own (`DecoderArch.param_dtypes`;
    other archs keep none): every other param is `arch.dtype`."""
    dtypes = getattr(arch, "param_dtypes", None)
    return dtypes() if dtypes is not None else {}


def shared_kv(arch: ModelArch) -> bool:
    """Whether the arch's value is its key (multi-head latent attention, `models/mla.py`):
    the KV pool then holds one row a token and layer, not two."""
    return bool(getattr(arch, "shared_kv", False))


def common_fields(
    c: HFConfig, *, eps: float, max_pos: int, head_dim: int | None = None, kv_heads: int | None = None,
    hidden_act: str | None = None,
) -> dict[str, Any]:
    """The DecoderArch fields every Llama-style MoE config spells the same way (through
    its aliases), each checked for its type and range; `eps`, `max_pos` and `kv_heads` are
    the family's defaults when a field is absent (NOTE: kv_heads as the config class's
    default, e.g. Qwen3-MoE's 4; None: one per query head, as OLMoE's class), `head_dim`
    the family's own rule where it has one, `hidden_act` the family's fixed activation where
    its modelling never reads the field (gpt-oss: whatever `hidden_act` says)."""
    heads, hidden = c.integer("num_attention_heads"), c.integer("hidden_size")
    kv_heads = c.integer("num_key_value_heads", kv_heads or heads)
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    head_dim = head_dim or c.integer("head_dim", hidden // heads)
    if head_dim < 1:  # more heads than hidden dims, no head_dim: else refused as rotary dim 0
        raise ConfigError(f"num_attention_heads={heads} is more than hidden_size={hidden} (and no head_dim is set)")
    native_len = c.integer("max_position_embeddings", max_pos)
    rope = rope_spec(c, head_dim, native_len)
    act = c.get("hidden_act", "silu") if hidden_act is None else hidden_act
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ConfigError(f"hidden_act={act!r} is not supported ({', '.join(ACTIVATIONS)})")
    return dict(
        vocab_size=c.integer("vocab_size"),
        hidden_size=hidden,
        num_layers=c.layers(),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=c.number("rms_norm_eps", eps),
        rope=rope,
        max_position_embeddings=context_length(rope),
        tie_word_embeddings=c.flag("tie_word_embeddings", False),
        hidden_act=act,
        top_k=c.integer("num_experts_per_tok"),
        dtype=checkpoint_dtype(c),
    )


def check_experts(c: HFConfig, num_experts: int, top_k: int, moe_layers: tuple[int, ...]) -> None:
    """Some layer is a sparse MoE block (the expert store and executors assume one), whose
    routing picks top_k of num_experts (transformers' torch.topk would fail past it)."""
    if not moe_layers:
        raise ConfigError(f"no layer has a sparse MoE block ({' / '.join(c.names('num_experts'))}, mlp_only_layers, "
                          "decoder_sparse_step): a dense model, which edgemoe does not serve")
    if top_k > num_experts:
        raise ConfigError(f"{c.spelled('num_experts_per_tok')}={top_k} is more than the {num_experts} experts "
                          f"({' / '.join(c.names('num_experts'))})")
