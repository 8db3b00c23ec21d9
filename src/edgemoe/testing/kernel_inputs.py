"""Seeded random inputs in the engine's kernel layouts, for kernel tests and benchmarks.

`paged_batch` scatters each sequence's pages over a shuffled pool (and its page-table
row among spare rows), so a kernel that ignores the page table or the row map fails.
`moe_batch` builds slot banks with realistic magnitudes (gate/up outputs ~ N(0, 1)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemoe.bench.inputs import MoEBatch, moe_batch  # noqa: F401 - re-exported for tests


@dataclass(frozen=True)
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D] (decode: T = B)
    k_cache: torch.Tensor  # [num_slots, Hkv, D]
    v_cache: torch.Tensor
    page_table: torch.Tensor  # [R, max_pages] int32
    req_rows: torch.Tensor  # [B] int32
    seq_lens: torch.Tensor  # [B] int32
    cu_seqlens_q: torch.Tensor  # [B+1] int32
    page_size: int
    max_q_len: int


def paged_batch(
    seq_lens: list[int], q_lens: list[int], hq: int, hkv: int, d: int, page_size: int,
    dtype: torch.dtype, device: str | torch.device = "cpu", seed: int = 0, spare_pages: int = 2,
) -> PagedBatch:
    g = torch.Generator().manual_seed(seed)
    pages_per = [-(-n // page_size) for n in seq_lens]
    max_pages = max(pages_per) + spare_pages  # capacity past the longest context
    num_pages = sum(pages_per) + 3  # a few pages nobody owns
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    rows = torch.randperm(len(seq_lens) + 2, generator=g)[: len(seq_lens)].to(torch.int32)
    table = torch.zeros(len(seq_lens) + 2, max_pages, dtype=torch.int32)
    used = 0
    for row, n in zip(rows.tolist(), pages_per, strict=True):
        table[row, :n] = perm[used : used + n]
        used += n
    shape = (num_pages * page_size, hkv, d)
    k_cache, v_cache = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    move = lambda t: t.to(device)  # noqa: E731
    return PagedBatch(
        move(q), move(k_cache), move(v_cache), move(table), move(rows),
        move(torch.tensor(seq_lens, dtype=torch.int32)), move(cu), page_size, max(q_lens),
    )


def rope_bound(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """How far two evaluations of x·cos + rotate_half(x)·sin in x's dtype may part, with
    a = x·c, b = x'·s on the tables as rounded to that dtype (both round them alike): one
    rounds each product and the sum (u = 2^-8 in bf16 each: <= 2u·(|a| + |b|) from exact),
    one keeps the products in fp32 and rounds once (<= u·(|a| + |b|)): 3u·(|a| + |b|), and
    (1 + 2^-7) for the products' own rounding inside that sum. 0 on the dims not rotated."""
    u = torch.finfo(x.dtype).eps / 2
    size = rotation_size(x, positions, cos, sin)
    bound = torch.zeros(x.shape, device=x.device)
    bound[..., : size.shape[-1]] = 3 * u * (1 + 2 * u) * size
    return bound


def rotation_size(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """|x·c| + |x'·s| on the rotated dims [T, H, R] (x' = x's rotate-half partner, c and s the
    tables at each token's position as rounded to x's dtype): the scale of the rotation's
    roundings."""
    half = cos.shape[1]
    xr = x[..., : 2 * half].float().abs()
    c, s = (t[positions].to(x.dtype).float().abs().repeat(1, 2)[:, None, :] for t in (cos, sin))
    partner = torch.cat([xr[..., half:], xr[..., :half]], dim=-1)
    return xr * c + partner * s


def head_norm_rel(dtype: torch.dtype, head_dim: int) -> float:
    """How far two evaluations of `rms_norm_ref` (weight offset 0) over `head_dim` dims may
    part, relative to the result. Each is within e of exact: its fp32 sum of squares within
    γ_D (any order; the rsqrt halves a relative error), the mean, + eps, the rsqrt and x·r
    within 10 fp32 roundings (a GPU's approximate rsqrt and division err by 2-3 ulps), then
    the cast to the dtype and the × weight in it, u each. Two: 2e, on |exact| <= |result| / (1 - e)."""
    u32, u = 2.0**-24, torch.finfo(dtype).eps / 2
    gamma = head_dim * u32 / (1 - head_dim * u32)
    e = gamma / 2 + 10 * u32 + 2 * u * (1 + u)
    return 2 * e / (1 - e)


def head_norm_rope_bound(
    normed: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """How far a fused per-head RMSNorm + rotary may part from the reference's, given the
    reference's normalised heads `normed` [T, H, D] (rms_norm_ref's output): the two
    normalised inputs part by rel·|n| (`head_norm_rel`); on the rotated dims the exact
    rotations of the two inputs part by rel·(|a| + |b|) (a = n·c, b = n'·s on the tables as
    rounded to the dtype), and each evaluation's rounded rotation (each product and the sum
    rounded, or fewer roundings with an FMA) is within 2u(1 + u)·(|a| + |b|)·(1 + rel) of the
    exact rotation of its own input. Dims not rotated: rel·|n|. Plus 8 subnormal spacings of
    the dtype for values rounded near 0 (the relative bounds hold for normal numbers)."""
    fi = torch.finfo(normed.dtype)
    u = fi.eps / 2
    rel = head_norm_rel(normed.dtype, normed.shape[-1])
    size = rotation_size(normed, positions, cos, sin)
    bound = rel * normed.float().abs()
    bound[..., : size.shape[-1]] = (4 * u * (1 + u) * (1 + rel) + rel) * size
    return bound + 8 * fi.smallest_normal * fi.eps
