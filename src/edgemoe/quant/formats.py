"""Expert formats: how one expert's weights are stored, and their fp32 references.

A format says how one weight matrix W [N, K] (N output rows, K inputs, as `F.linear`
reads it) is stored: a dict of *parts* keyed by suffix — "" the data, "_scale" the
scales, "_zero" the zero points — each with dim 0 indexed by rows (or row blocks).
An expert is three matrices, gate [I, H], up [I, H] and down [H, I], quantised one by
one as checkpoints store them; gate and up are concatenated along dim 0 into the
"gate_up" parts (gate first), so an expert's parts are "gate_up", "gate_up_scale", …,
"down", "down_scale", … and a bank stacks them [E, …].

Every format has a quantiser (from bf16/fp32), a dequantise-to-fp32 reference (the
oracle the kernels are tested against) and an elementwise error bound for the round
trip. Group and block sizes are ceil-divided, so a dimension below the group size is
one (partial) group: min(group, dimension), and tiny models work.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

Shape = tuple[int, ...]
PartSpec = tuple[Shape, torch.dtype]
Parts = dict[str, torch.Tensor]
PROJECTIONS = ("gate_up", "down")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class ExpertFormat(ABC):
    """One storage format for weight matrices (frozen dataclasses: equal formats are equal)."""

    name: ClassVar[str]
    quantised: ClassVar[bool] = True

    @abstractmethod
    def matrix_specs(self, rows: int, cols: int) -> dict[str, PartSpec]:
        """Suffix → (shape, dtype) of each part of one [rows, cols] matrix."""

    @abstractmethod
    def quantise(self, w: torch.Tensor) -> Parts:
        """w [N, K] (any float dtype) → parts keyed by suffix."""

    @abstractmethod
    def dequantise(self, parts: Parts, rows: int, cols: int, halves: int = 1) -> torch.Tensor:
        """Parts (keyed by suffix) → fp32 [rows, cols]. `halves`: the parts hold that many
        matrices of rows/halves rows each, quantised separately and concatenated (gate_up)."""

    @abstractmethod
    def error_bound(self, w: torch.Tensor) -> torch.Tensor:
        """Elementwise bound on |dequantise(quantise(w)) - w| (fp32, w's shape)."""

    def matrix_nbytes(self, rows: int, cols: int) -> int:
        return sum(math.prod(shape) * dt.itemsize for shape, dt in self.matrix_specs(rows, cols).values())

    @property
    def label(self) -> str:
        """What logs and plans print (e.g. "int4 (group 128)")."""
        return self.name


@dataclass(frozen=True)
class Dense(ExpertFormat):
    """Unquantised: the data in `dtype` (the model's dtype; the `bf16` setting)."""

    dtype: torch.dtype = torch.bfloat16
    name: ClassVar[str] = "bf16"
    quantised: ClassVar[bool] = False

    def matrix_specs(self, rows: int, cols: int) -> dict[str, PartSpec]:
        return {"": ((rows, cols), self.dtype)}

    def quantise(self, w: torch.Tensor) -> Parts:
        return {"": w.to(self.dtype)}

    def dequantise(self, parts: Parts, rows: int, cols: int, halves: int = 1) -> torch.Tensor:
        return parts[""].float()

    def error_bound(self, w: torch.Tensor) -> torch.Tensor:
        # One rounding to dtype: half an ulp, relative (subnormals aside, which a weight never is).
        return w.float().abs() * (torch.finfo(self.dtype).eps / 2) if self.dtype != torch.float32 else torch.zeros_like(w, dtype=torch.float32)

    @property
    def label(self) -> str:
        return f"unquantised ({str(self.dtype).removeprefix('torch.')})"


# ---- the expert level: gate and up concatenated, down ----


def expert_specs(fmt: ExpertFormat, hidden: int, inter: int) -> dict[str, PartSpec]:
    """Name → (shape, dtype) of one expert's parts: gate_up* (gate then up), down*."""
    out: dict[str, PartSpec] = {}
    for suffix, (shape, dt) in fmt.matrix_specs(inter, hidden).items():
        out["gate_up" + suffix] = ((2 * shape[0], *shape[1:]), dt)
    for suffix, (shape, dt) in fmt.matrix_specs(hidden, inter).items():
        out["down" + suffix] = (shape, dt)
    return out


def expert_nbytes(fmt: ExpertFormat, hidden: int, inter: int) -> int:
    """Bytes one expert takes in `fmt` (what a slot holds and a miss copies)."""
    return sum(math.prod(shape) * dt.itemsize for shape, dt in expert_specs(fmt, hidden, inter).values())


def quantise_expert(fmt: ExpertFormat, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> Parts:
    """gate [I, H], up [I, H], down [H, I] → the expert's parts."""
    g, u, d = fmt.quantise(gate), fmt.quantise(up), fmt.quantise(down)
    parts = {"gate_up" + s: torch.cat([g[s], u[s]]) for s in g}
    parts |= {"down" + s: t for s, t in d.items()}
    return parts


def matrix_parts(parts: Parts, proj: str) -> Parts:
    """The parts of one projection ("gate_up" or "down"), keyed by suffix."""
    return {name[len(proj):]: t for name, t in parts.items() if name.startswith(proj)}


def dequantise_expert(fmt: ExpertFormat, parts: Parts, hidden: int, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An expert's parts → (gate_up [2I, H], down [H, I]) in fp32: the reference."""
    gate_up = fmt.dequantise(matrix_parts(parts, "gate_up"), 2 * inter, hidden, halves=2)
    down = fmt.dequantise(matrix_parts(parts, "down"), hidden, inter)
    return gate_up, down
