"""Checkpoint-name → our-tensor placements, and the pieces Llama-style checkpoints share.

A Placement says where one checkpoint tensor goes: into our tensor `target` at `index`
(e.g. the q rows of the fused qkv, or expert 5's gate rows of a layer's bank).
Model files own their names; these helpers only cover the names they have in common.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType

from edgemoe.models.arch import DecoderArch

Index = tuple[int | slice | None, ...]  # None: a new axis of one (a [1, E] tensor into our [E])


@dataclass(frozen=True)
class Placement:
    target: str  # "embed", "layers.3.qkv", "experts.3.gate_up", ...
    index: Index = ()


NameMap = dict[str, Placement]


@dataclass(frozen=True)
class Stacked:
    """One checkpoint tensor holding a whole layer's experts, stacked ([E, 2I, H] gate
    rows first, or [E, H, I]: transformers 5's layout, which some checkpoints ship), or
    another whole that a checkpoint may store in parts (Qwen3.8's PLE table, sharded): the
    other spelling of the names in `covers`, which it fills."""

    placement: Placement  # into the layer's bank, experts 0 .. E-1
    covers: tuple[str, ...]


StackedMap = dict[str, Stacked]

# Another tool's spelling of a model's names: regex substitutions applied to ours (e.g.
# gptqmodel writes Mixtral's experts under transformers 5's module names, `mlp.experts.E.gate_proj`).
Spelling = tuple[tuple[str, str], ...]


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


def qkv_bias_names(a: DecoderArch, layer: int, prefix: str = "model.") -> NameMap:
    """q/k/v projection biases into the fused `qkv_bias` (GLM's, gpt-oss's `attention_bias`)."""
    q, k, _ = a.qkv_rows
    lp, our = f"{prefix}layers.{layer}.self_attn.", f"layers.{layer}.qkv_bias"
    return {
        lp + "q_proj.bias": Placement(our, (slice(0, q),)),
        lp + "k_proj.bias": Placement(our, (slice(q, q + k),)),
        lp + "v_proj.bias": Placement(our, (slice(q + k, None),)),
    }


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


def stacked_expert_names(a: DecoderArch, layers: Iterable[int], fmt: str, gate: str = "gate_proj",
                         up: str = "up_proj", down: str = "down_proj") -> StackedMap:
    """The routed experts as transformers 5 holds them: `<experts>.gate_up_proj` [E, 2I, H]
    (gate rows first) and `<experts>.down_proj` [E, H, I] per layer, the other spelling of
    `expert_names`' per-expert names. `fmt`: the experts' prefix with a `{layer}` hole,
    e.g. "model.layers.{layer}.mlp.experts."."""
    m: StackedMap = {}
    for i in layers:
        lp, bank, n = fmt.format(layer=i), f"experts.{i}.", a.num_experts
        per = expert_names(a, i, lp + "{e}.{w}.weight", gate, up, down)
        gate_up = tuple(k for k, p in per.items() if p.target.endswith("gate_up"))
        down_names = tuple(k for k, p in per.items() if p.target.endswith("down"))
        m[lp + "gate_up_proj"] = Stacked(Placement(bank + "gate_up", (slice(0, n),)), gate_up)
        m[lp + "down_proj"] = Stacked(Placement(bank + "down", (slice(0, n),)), down_names)
    return m


def mlp_experts_stacked(a: DecoderArch) -> StackedMap:
    """`stacked_expert_names` under `model.layers.L.mlp.experts.` (transformers 5's
    `gate_up_proj` / `down_proj`): qwen3_moe's, olmoe's and glm4_moe's spelling."""
    return stacked_expert_names(a, a.moe_layers, "model.layers.{layer}.mlp.experts.")


def names_as_stored(module: ModuleType, a: DecoderArch, stored: Iterable[str]) -> tuple[NameMap, StackedMap]:
    """A model module's maps (`checkpoint_map`, `stacked_expert_names` if it has one) in the
    spelling `stored`, the checkpoint's tensor names, uses (ours or one of its `SPELLINGS`)."""
    stacked = module.stacked_expert_names(a) if hasattr(module, "stacked_expert_names") else {}
    return spelled_as_stored(module.checkpoint_map(a), stacked, stored, getattr(module, "SPELLINGS", ()))


def spelled_as_stored(names: NameMap, stacked: StackedMap, stored: Iterable[str],
                      spellings: Iterable[Spelling]) -> tuple[NameMap, StackedMap]:
    """The name maps in whichever spelling (ours or one of `spellings`) matches more of the
    checkpoint's `stored` names; a quantised linear counts by its module (`X.qweight`: X)."""
    spellings = tuple(spellings)
    if not spellings:
        return names, stacked
    stored = set(stored)
    modules = stored | {n.rpartition(".")[0] for n in stored}

    def matches(m: NameMap, st: StackedMap) -> int:
        return sum(k.removesuffix(".weight") in modules for k in m) + sum(k in stored for k in st)

    best, score = (names, stacked), matches(names, stacked)
    for spelling in spellings:
        respelled = _respell(names, stacked, spelling)
        if (s := matches(*respelled)) > score:
            best, score = respelled, s
    return best


def _respell(names: NameMap, stacked: StackedMap, spelling: Spelling) -> tuple[NameMap, StackedMap]:
    def spell(name: str) -> str:
        for pattern, repl in spelling:
            name = re.sub(pattern, repl, name)
        return name

    return ({spell(k): p for k, p in names.items()},
            {spell(k): Stacked(v.placement, tuple(map(spell, v.covers))) for k, v in stacked.items()})
