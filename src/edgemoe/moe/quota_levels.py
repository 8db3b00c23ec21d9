"""What a level of the CPU share's live quota means (`LevelScale`: `COUNT`, `FRACTION`),
the per-layer quota rows a level gives, and the level where the CPU and the link balance
(the informed start's prediction). The controller that searches the levels is
`moe/quota_controller.py`; this module is its vocabulary, shared with the executor
(`moe/cpu_share.py`), the benchmarks and the scripts."""

from __future__ import annotations

import os
from dataclasses import dataclass

QUARTERS = 4  # levels per expert (the count scale)
SIXTEENTHS = 16  # levels of the whole of a layer's misses (the fraction scale; kernels/share_split.FRACTION_ONE)


@dataclass(frozen=True)
class LevelScale:
    """What a level means (`CountScale`, `FractionScale`): `per_unit` levels a unit of
    `unit`; each level's per-layer quota and fraction for the share's tensors (`rows`,
    `fraction`), and the levels' range and hybrid's start."""

    name: str
    per_unit: int  # levels a unit
    unit: str  # what a unit is, for the log and the statistics

    def value(self, level: int) -> float:
        return level / self.per_unit

    def describe(self, level: int) -> str:
        raise NotImplementedError

    def max_level(self, top_k: int) -> int:
        """Every miss on the CPU (a decode token misses at most top-k a layer)."""
        raise NotImplementedError

    def hybrid_start(self) -> int:
        """hybrid's first level (auto starts at 0: offload)."""
        raise NotImplementedError

    def rows(self, level: int, num_layers: int, experts: int) -> list[int]:
        """Each layer's quota (a cap on its CPU experts) at `level`."""
        raise NotImplementedError

    def fraction(self, level: int) -> int:
        """The share of each layer's misses the CPU may take at `level`, in sixteenths."""
        raise NotImplementedError

    def taken(self, misses: float, part: float) -> float:
        """The level's units where a layer that misses `misses` gives the CPU `part` of them."""
        raise NotImplementedError


class CountScale(LevelScale):
    """`level` quarters of an expert a layer on average, the same count whatever a layer
    missed (`quota_rows`); the fraction is the whole."""

    def describe(self, level: int) -> str:
        return f"{self.value(level):g} misses a layer"

    def max_level(self, top_k: int) -> int:
        return self.per_unit * top_k

    def hybrid_start(self) -> int:
        return self.per_unit  # one expert a layer

    def rows(self, level: int, num_layers: int, experts: int) -> list[int]:
        return quota_rows(level, num_layers)

    def fraction(self, level: int) -> int:
        return SIXTEENTHS

    def taken(self, misses: float, part: float) -> float:
        return misses * part


class FractionScale(LevelScale):
    """`level` sixteenths of each layer's own misses (`kernels/share_split.decode_take`): a
    layer that missed 4 gives the CPU more than one that missed 2, so each layer's CPU call
    and copies end closer together — a layer's time is the later of the two, and a fixed
    count leaves the CPU the longer side where a layer missed few and the link where it
    missed many (docs/offload.md, "The split by each layer's misses"). No count cap."""

    def describe(self, level: int) -> str:
        return f"{level}/{self.per_unit} of each layer's misses"

    def max_level(self, top_k: int) -> int:
        return self.per_unit

    def hybrid_start(self) -> int:
        return self.per_unit // 2  # half of each layer's misses

    def rows(self, level: int, num_layers: int, experts: int) -> list[int]:
        return [experts if level else 0] * num_layers

    def fraction(self, level: int) -> int:
        return level

    def taken(self, misses: float, part: float) -> float:
        return part


COUNT = CountScale("count", QUARTERS, "CPU experts a layer")
FRACTION = FractionScale("fraction", SIXTEENTHS, "the share of each layer's misses on the CPU")
SCALES = {s.name: s for s in (COUNT, FRACTION)}


def share_scale() -> LevelScale:
    """The live share's scale: `EDGEMOE_SHARE_SPLIT` (fraction, the default; count: the
    same number of CPU experts in every layer, as before 2026-12-04) — for an A/B."""
    name = os.environ.get("EDGEMOE_SHARE_SPLIT", FRACTION.name)
    if name not in SCALES:
        raise ValueError(f"EDGEMOE_SHARE_SPLIT must be one of {', '.join(SCALES)} (got {name!r})")
    return SCALES[name]


def quota_rows(level: int, num_layers: int) -> list[int]:
    """The per-layer quota of a count level: `level` quarters of an expert a layer on average."""
    return [(level + layer % QUARTERS) // QUARTERS for layer in range(num_layers)]


def balance_level(misses: float, link_s: float, cpu_s: float, max_level: int, scale: LevelScale = COUNT) -> int:
    """The level where a layer's CPU experts take as long as its copies of the rest:
    q·t_cpu = (m − q)·t_link, so q* = m·t_link / (t_link + t_cpu) — in quarters of an
    expert (count), or the part t_link / (t_link + t_cpu) of the misses in sixteenths
    (fraction; 0 where nothing is missed) — within 0..max_level. `misses`: m, a layer's
    misses a decode step; `link_s`, `cpu_s`: one expert's copy and one CPU expert at one
    token, seconds."""
    if link_s + cpu_s <= 0.0 or misses <= 0.0:
        return 0
    return min(max(round(scale.per_unit * scale.taken(misses, link_s / (link_s + cpu_s))), 0), max_level)
