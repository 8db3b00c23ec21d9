"""FP8 MoE checkpoints holding a layer's experts in one tensor per projection.

`save_pretrained` of a model quantised by transformers' FineGrainedFP8 writes each
expert's `gate_proj` / `up_proj` / `down_proj` weight under its own name (the per-expert
layout, reversed from its fused experts module) but the block scales as that module
holds them, one tensor per layer and projection; checkpoints that stack their experts
(Qwen3.5's layout) hold the fp8 weights that way too ("<P>.experts.gate_up_proj"
[E, 2I, H], gate rows first, and "<P>.experts.down_proj" [E, H, I]) beside those scales:

- "<P>.experts.gate_up_proj_scale_inv" [E, ceil(2I/B), ceil(H/B)]: the gate rows first,
  blocked over the fused 2I rows;
- "<P>.experts.down_proj_scale_inv" [E, ceil(H/B), ceil(I/B)]: each expert's own scales.

The per-expert names are the model's own: `gate_proj` / `up_proj` / `down_proj`, or
Mixtral's `w1` / `w3` / `w2`. `split_fused_scale` hands each expert matrix the scales of
its own layout (`Fp8Block`: gate and up blocked apart), losslessly: a gate or up block
row of ours lies inside one fused block row whenever I is a multiple of B (every
published shape) or 2I <= B (one fused block row), or when each expert has one scale
(`weight_block_size` null: the experts' gate and up share it). Anything else is refused
by name, never approximated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from edgemoe.quant.published import QuantConfigError

NAMINGS = {"gate_proj": ("gate_proj", "up_proj", "down_proj"), "w1": ("w1", "w3", "w2")}  # gate, up, down
_FUSED = re.compile(r"^(?P<prefix>.+)\.experts\.(?P<proj>gate_up_proj|down_proj)(_(?P<part>[a-z_]+))?$")
_PER_EXPERT = re.compile(r"^(?P<prefix>.+)\.experts\.(?P<e>\d+)\.(?P<gate>gate_proj|w1)\.weight$")


def naming_by_prefix(names: Iterable[str]) -> dict[str, tuple[list[int], tuple[str, ...]]]:
    """Per "<P>.experts" holding per-expert weights: its expert ids and its (gate, up,
    down) names."""
    found: dict[str, tuple[set[int], str]] = {}
    for name in names:
        if (m := _PER_EXPERT.match(name)) is not None:
            found.setdefault(m["prefix"], (set(), m["gate"]))[0].add(int(m["e"]))
    return {p: (sorted(ids), NAMINGS[gate]) for p, (ids, gate) in found.items()}


class FusedExperts:
    """Which of a checkpoint's tensors (`names`) hold a layer's experts in one tensor — the
    scales of `scale_part` ("weight_scale_inv"), and stacked weights beside such scales —
    and each one's per-expert parts, named by the per-expert linears ("X.weight") they belong
    to. `inter`: the experts' intermediate size; `block`: the fp8 block; `experts`: the
    count, for layers whose names list no expert."""

    def __init__(self, names: list[str], scale_part: str, inter: int, block: int, experts: int) -> None:
        self.scale_part, self.inter, self.block, self.experts = scale_part, inter, block, experts
        self.naming = naming_by_prefix(names)
        listed, scale_suffix = set(names), scale_part.removeprefix("weight")
        self.fused: dict[str, tuple[str, str, str]] = {}  # tensor name → (prefix, projection, part)
        for name in names:
            if (m := _FUSED.match(name)) is None:
                continue
            if m["part"] is None and name + scale_suffix in listed:
                self.fused[name] = (m["prefix"], m["proj"], "weight")
            elif m["part"] is not None and "weight_" + m["part"] == scale_part:
                self.fused[name] = (m["prefix"], m["proj"], scale_part)

    def part(self, name: str) -> str:
        return self.fused[name][2]

    def bases(self, name: str) -> list[str]:
        """The per-expert linears a fused tensor covers."""
        prefix, proj, _ = self.fused[name]
        ids, naming = self.naming.get(prefix, (list(range(self.experts)), NAMINGS["gate_proj"]))
        halves = naming[:2] if proj == "gate_up_proj" else naming[2:]
        return [f"{prefix}.experts.{e}.{half}.weight" for e in ids for half in halves]

    def split(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """A fused tensor → each expert matrix's part, by its linear's name."""
        prefix, proj, part = self.fused[name]
        naming = self.naming.get(prefix, ([], NAMINGS["gate_proj"]))[1]
        if part != "weight":
            return split_fused_scale(prefix, proj, tensor, self.inter, self.block, naming)
        if tensor.dim() != 3 or (proj == "gate_up_proj" and tensor.shape[1] != 2 * self.inter):
            raise QuantConfigError(f"{name} {tuple(tensor.shape)}: expected [experts, rows, cols]"
                                   + (f" with 2 x {self.inter} rows" if proj == "gate_up_proj" else ""))
        gate, up, down = naming
        if proj == "down_proj":
            return {f"{prefix}.experts.{e}.{down}.weight": tensor[e] for e in range(tensor.shape[0])}
        out = {}
        for e in range(tensor.shape[0]):
            out[f"{prefix}.experts.{e}.{gate}.weight"] = tensor[e, : self.inter]
            out[f"{prefix}.experts.{e}.{up}.weight"] = tensor[e, self.inter :]
        return out


def split_fused_scale(prefix: str, proj: str, scale: torch.Tensor, inter: int, block: int,
                      naming: tuple[str, ...] = NAMINGS["gate_proj"]) -> dict[str, torch.Tensor]:
    """A layer's fused scales [E, R, C] → each expert matrix's own, by its linear's name."""
    if scale.dim() != 3:
        raise QuantConfigError(f"{prefix}.experts.{proj} scales {tuple(scale.shape)}: expected [experts, rows, cols]")
    gate, up, down = naming
    if tuple(scale.shape[1:]) == (1, 1):  # one scale per expert and projection (no blocks): each matrix's
        halves = (down,) if proj == "down_proj" else (gate, up)
        return {f"{prefix}.experts.{e}.{h}.weight": scale[e] for e in range(scale.shape[0]) for h in halves}
    if proj == "down_proj":
        return {f"{prefix}.experts.{e}.{down}.weight": scale[e] for e in range(scale.shape[0])}
    gate_rows, up_rows = (_block_rows(offset, inter, block, scale.shape[1], prefix) for offset in (0, inter))
    out = {}
    for e in range(scale.shape[0]):
        out[f"{prefix}.experts.{e}.{gate}.weight"] = scale[e, gate_rows]
        out[f"{prefix}.experts.{e}.{up}.weight"] = scale[e, up_rows]
    return out


def _block_rows(offset: int, inter: int, block: int, fused_rows: int, prefix: str) -> torch.Tensor:
    """For each block row of a half (its rows at `offset` in the fused 2I), the fused block
    row holding all of its rows."""
    rows = []
    for start in range(0, inter, block):
        first, last = (offset + start) // block, (offset + min(start + block, inter) - 1) // block
        if first != last or last >= fused_rows:
            raise QuantConfigError(
                f"{prefix}.experts.gate_up_proj scales: the FP8 blocks of {block} rows straddle the gate and up "
                f"halves (moe intermediate size {inter} is not a multiple of the block size)")
        rows.append(first)
    return torch.tensor(rows, dtype=torch.long)
