"""One parser for the tuning sweeps' tile overrides (`EDGEMOE_*_TILES` environment variables)
of the kernels' Triton-free tile modules (`moe_gemv_tiles.py`, `moe_gemv_q_tiles.py`,
`attn_decode_tiles.py`): the values are read at every call, so a sweep can change them
between launches, and a malformed value is refused with the variable's name and its shape.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

Tiles = TypeVar("Tiles", bound=tuple[Any, ...])  # a NamedTuple of ints


def power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _counts(lengths: Collection[int]) -> str:
    """How many values an override may give, in words: 4 to 6; 6 or 8; 6, 7 or 9."""
    n = sorted(lengths)
    if len(n) > 2 and n == list(range(n[0], n[-1] + 1)):
        return f"{n[0]} to {n[-1]}"
    return str(n[0]) if len(n) == 1 else f"{', '.join(map(str, n[:-1]))} or {n[-1]}"


def override(env: str, default: Tiles, lengths: Collection[int], shape: str,
             powers_of_two: Sequence[str] = ()) -> Tiles:
    """`default`, or the comma-separated values `env` holds: as many as one of `lengths`,
    each a positive integer, the fields left out keeping `default`'s; the fields named in
    `powers_of_two` must be powers of two (Triton tile sizes). `shape` describes the values
    in the error message."""
    text = os.environ.get(env)
    if not text:
        return default
    why = f"{env}={text!r}: {_counts(lengths)} positive integers separated by commas ({shape})"
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(why) from None
    if len(values) not in lengths or min(values) < 1:
        raise ValueError(why)
    tiles = default._make([*values, *default[len(values):]])  # type: ignore[attr-defined]
    bad = [name for name in powers_of_two if not power_of_two(getattr(tiles, name))]
    if bad:
        raise ValueError(f"{env}={text!r}: {', '.join(bad)} must be powers of two (Triton tiles)")
    return tiles
