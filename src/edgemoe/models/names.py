"""Checkpoint-name → our-tensor placements, and the pieces Llama-style checkpoints share.

A Placement says where one checkpoint tensor goes: into our tensor `target` at `index`
(e.g. the q rows of the fused qkv, or expert 5's gate rows of a layer's bank).
Model files own their names; these helpers only cover the names they have in common.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgemoe.models.arch import DecoderArch

Index = tuple[int | slice, ...]


@dataclass(frozen=True)
class Placement:
    target: str  # "embed", "layers.3.qkv", "experts.3.gate_up", ...
    index: Index = ()


NameMap = dict[str, Placement]


@dataclass(frozen=True)
class Stacked:
    """One checkpoint tensor holding a whole layer's experts, stacked ([E, 2I, H] gate
    rows first, or [E, H, I]: transformers 5's layout, which some checkpoints ship): the
    other spelling of the per-expert names in `covers`, which it fills."""

    placement: Placement  # into the layer's bank, experts 0 .. E-1
    covers: tuple[str, ...]


StackedMap = dict[str, Stacked]


def common_names(a: DecoderArch, prefix: str = "model.") -> NameMap:
    """Embedding, final norm, LM head, and per-layer norms + attention."""
    m: NameMap = {
        f"{prefix}embed_tokens.weight": Placement("embed"),
        f"{prefix}norm.weight": Placement("norm"),
    }
    if not a.tie_word_embeddings:
        m["lm_head.weight"] = Placement("lm_head")
    q, k, _ = a.qkv_rows
    for i in range(a.num_layers):
        lp, our = f"{prefix}layers.{i}.", f"layers.{i}."
        m[lp + "input_layernorm.weight"] = Placement(our + "attn_norm")
        m[lp + "post_attention_layernorm.weight"] = Placement(our + "mlp_norm")
        m[lp + "self_attn.q_proj.weight"] = Placement(our + "qkv", (slice(0, q),))
        m[lp + "self_attn.k_proj.weight"] = Placement(our + "qkv", (slice(q, q + k),))
        m[lp + "self_attn.v_proj.weight"] = Placement(our + "qkv", (slice(q + k, None),))
        m[lp + "self_attn.o_proj.weight"] = Placement(our + "o_proj")
        if a.qk_norm != "none":
            m[lp + "self_attn.q_norm.weight"] = Placement(our + "q_norm")
            m[lp + "self_attn.k_norm.weight"] = Placement(our + "k_norm")
    return m


def expert_names(
    a: DecoderArch, layer: int, fmt: str, gate: str, up: str, down: str
) -> NameMap:
    """Per-expert tensors of one layer, stacked into the layer's [E, ...] banks.
    `fmt` is the name with `{e}` and `{w}` holes, e.g. "model.layers.0.mlp.experts.{e}.{w}.weight"."""
    inter = a.moe_intermediate_size
    m: NameMap = {}
    for e in range(a.num_experts):
        m[fmt.format(e=e, w=gate)] = Placement(f"experts.{layer}.gate_up", (e, slice(0, inter)))
        m[fmt.format(e=e, w=up)] = Placement(f"experts.{layer}.gate_up", (e, slice(inter, None)))
        m[fmt.format(e=e, w=down)] = Placement(f"experts.{layer}.down", (e,))
    return m


def dense_mlp_names(a: DecoderArch, layer: int, prefix: str) -> NameMap:
    inter, our = a.intermediate_size, f"layers.{layer}."
    return {
        prefix + "gate_proj.weight": Placement(our + "gate_up", (slice(0, inter),)),
        prefix + "up_proj.weight": Placement(our + "gate_up", (slice(inter, None),)),
        prefix + "down_proj.weight": Placement(our + "down"),
    }
