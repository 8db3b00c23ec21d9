"""The shape and hash constants of Qwen3.8-Flash-Next's per-layer embedding (PLE) tables,
derived from config.json exactly as transformers derives them (`Qwen4ExpTextNGramEmbedding`,
`_build_layer_multipliers`, `_find_nth_prime_after`). Torch-free.

PLE layer j (the j-th of `ple_layer_ids`) has H = (ngram_size - 1) · heads_per_ngram hash
heads; head i reads its own sub-table of a prime number of rows, the
(j·H + i + 1)-th prime after `ngram_vocab_size_base - 1` (so every head of every layer has
a distinct prime), the sub-tables back to back in one table of `rows` rows (padded to a
multiple of `make_ngram_vocab_size_divisible_by`) and `ple_embed_dim / H` columns.
The checkpoint holds each table in `split_ngram_parts` row chunks (`torch.chunk`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

_MASK64 = (1 << 64) - 1
_SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
_SPLITMIX_M1 = 0xBF58476D1CE4E5B9
_SPLITMIX_M2 = 0x94D049BB133111EB
_PRIME_1 = 10007


def _splitmix64(value: int) -> int:
    value = (value + _SPLITMIX_GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _SPLITMIX_M1) & _MASK64
    value = ((value ^ (value >> 27)) * _SPLITMIX_M2) & _MASK64
    return (value ^ (value >> 31)) & _MASK64


def layer_multipliers(vocab_size: int, ngram_size: int, ple_index: int, seed: int) -> tuple[int, ...]:
    """Odd multipliers below (2^63 - 1) / vocab_size, so token · multiplier never overflows int64."""
    half_bound = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + _PRIME_1 * ple_index
    return tuple(
        2 * (_splitmix64((base + _SPLITMIX_GAMMA * (i + 1)) & _MASK64) % half_bound) + 1 for i in range(ngram_size)
    )


def _is_prime(value: int) -> bool:
    if value < 2:
        return False
    if value % 2 == 0:
        return value == 2
    return all(value % d for d in range(3, math.isqrt(value) + 1, 2))


@lru_cache(maxsize=64)
def primes_after(start: int, count: int) -> tuple[int, ...]:
    """The first `count` primes > start (transformers' `_find_nth_prime_after(start, n)` for n = 1..count)."""
    found, p = [], start
    while len(found) < count:
        p += 1
        if _is_prime(p):
            found.append(p)
    return tuple(found)


@dataclass(frozen=True)
class PleLayerGeometry:
    """One PLE layer's table and hash constants."""

    layer: int  # the decoder layer (zero-indexed)
    multipliers: tuple[int, ...]  # [ngram_size]
    vocab_sizes: tuple[int, ...]  # [heads] primes
    offsets: tuple[int, ...]  # [heads] first row of each head's sub-table
    rows: int  # the padded table's rows


@dataclass(frozen=True)
class PleGeometry:
    layers: tuple[PleLayerGeometry, ...]
    ngram_size: int
    heads_per_ngram: int
    head_dim: int  # columns of every table: ple_embed_dim / heads
    split_parts: int  # row chunks per table in the checkpoint
    eos: int

    @property
    def heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def embed_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def context(self) -> int:
        """Tokens of n-gram context a sequence carries from step to step."""
        return self.ngram_size - 1

    def row_nbytes(self, itemsize: int) -> int:
        return self.head_dim * itemsize

    def table_nbytes(self, itemsize: int) -> int:
        return sum(g.rows for g in self.layers) * self.row_nbytes(itemsize)

    def chunk_rows(self, j: int) -> list[int]:
        """Rows of each checkpoint chunk of table j (`torch.chunk`: ceil-sized, maybe fewer chunks)."""
        rows = self.layers[j].rows
        size = -(-rows // self.split_parts)
        return [min(size, rows - k * size) for k in range(self.split_parts) if k * size < rows]


def ple_geometry(
    *, ple_layers: tuple[int, ...], vocab_size: int, ngram_size: int, heads_per_ngram: int, embed_dim: int,
    vocab_base: int, divisor: int, seed: int, split_parts: int, eos: int,
) -> PleGeometry:
    heads = (ngram_size - 1) * heads_per_ngram
    primes = primes_after(vocab_base - 1, heads * len(ple_layers))
    layers = []
    for j, layer in enumerate(ple_layers):
        sizes = primes[j * heads : (j + 1) * heads]
        offsets = tuple(sum(sizes[:i]) for i in range(heads))
        rows = -(-sum(sizes) // divisor) * divisor
        layers.append(PleLayerGeometry(layer, layer_multipliers(vocab_size, ngram_size, j, seed), sizes, offsets, rows))
    return PleGeometry(tuple(layers), ngram_size, heads_per_ngram, embed_dim // heads, split_parts, eos)
