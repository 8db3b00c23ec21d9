"""Paged KV pool: fixed-size pages of key/value slots for every attention layer.

A request owns a list of page ids (its page table). Token position p of a request
lives in slot `pages[p // page_size] * page_size + p % page_size` in every layer.
With `kv_cache_dtype="fp8"` the keys/values are e4m3 with one fp32 scale per (slot, kv
head) in `k_scale` / `v_scale` [L, slots, Hkv] (`edgemoe.quant.kv`); else they are None.
A model with a sparse-attention indexer (Qwen3.8-Flash-Next's QSA) keeps one more
per-slot tensor, `index_k` [L, S, index_dim] in the model dtype (`layers/qsa_attention.py`
says what it holds). With `shared_kv` (multi-head latent attention, `layers/mla_attention.py`)
the value is the key: `v` is `k`'s tensor (and `v_scale` `k_scale`'s), one row a token.
Every page operation carries every per-slot tensor once (`slot_tensors`).
"""

from __future__ import annotations

import torch

from edgemoe.quant.kv import KV_FP8


class OutOfPages(RuntimeError):
    """Raised when an allocation asks for more pages than are free."""


class KVPool:
    """Owns the KV tensors and the free list. Not thread-safe: the engine loop owns it."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        kv_cache_dtype: str = "auto",
        index_dim: int = 0,
        shared_kv: bool = False,
    ) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        # NOTE: one page more than planned, never handed out: padded batch entries (CUDA
        # graphs) write their K/V there, so they never touch a live request's cache.
        self.scratch_page = num_pages
        shape = (num_layers, (num_pages + 1) * page_size, num_kv_heads, head_dim)
        fp8 = kv_cache_dtype == "fp8"
        self.k = torch.zeros(shape, dtype=KV_FP8 if fp8 else dtype, device=device)
        self.v = self.k if shared_kv else torch.zeros(shape, dtype=KV_FP8 if fp8 else dtype, device=device)
        # Scales of 1 for unwritten slots: a dequantised padding row reads as zeros.
        self.k_scale = torch.ones(shape[:3], dtype=torch.float32, device=device) if fp8 else None
        self.v_scale = self.k_scale if shared_kv else (
            torch.ones(shape[:3], dtype=torch.float32, device=device) if fp8 else None)
        self.index_k = (
            torch.zeros((num_layers, shape[1], index_dim), dtype=dtype, device=device) if index_dim else None
        )
        # Pop from the end: low page ids are handed out first, which keeps tests readable.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"need {n} KV pages, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))

    def slots(self, pages: list[int], start: int, end: int) -> torch.Tensor:
        """Slots of positions [start, end) for a request with page table `pages`."""
        pos = torch.arange(start, end)
        page_idx = torch.tensor(pages, dtype=torch.long)[pos // self.page_size]
        return (page_idx * self.page_size + pos % self.page_size).to(self.k.device)

    @property
    def slot_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every per-slot tensor, each [L, S, ...]: K, V, their fp8 scales and the index keys, if any."""
        every = (self.k, self.v, self.k_scale, self.v_scale, self.index_k)
        return tuple(t for i, t in enumerate(every) if t is not None and all(t is not u for u in every[:i]))

    def read_pages(self, pages: list[int]) -> tuple[torch.Tensor, ...]:
        """Each of `slot_tensors` at `pages`: [L, len(pages) * page_size, ...] (gathered copies)."""
        slots = self._page_slots(pages)
        return tuple(_bits(t).index_select(1, slots).view(t.dtype) for t in self.slot_tensors)

    def write_pages(self, pages: list[int], data: tuple[torch.Tensor, ...]) -> None:
        """The inverse of `read_pages`: each of `data` into its tensor at `pages`."""
        slots = self._page_slots(pages)
        for t, d in zip(self.slot_tensors, data, strict=True):
            _bits(t).index_copy_(1, slots, _bits(d.to(t.device, non_blocking=True)))

    def _page_slots(self, pages: list[int]) -> torch.Tensor:
        ps = self.page_size
        idx = torch.tensor(pages, dtype=torch.long)[:, None] * ps + torch.arange(ps)
        return idx.flatten().to(self.k.device)

    @property
    def page_nbytes(self) -> int:
        """K and V (and index keys) of one page in every layer."""
        return sum(t[:, : self.page_size].nbytes for t in self.slot_tensors)

    def scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(k_scale, v_scale) [slots, Hkv] of one layer; (None, None) unless fp8."""
        if self.k_scale is None or self.v_scale is None:
            return None, None
        return self.k_scale[layer], self.v_scale[layer]

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.slot_tensors)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors as their bytes: a page copy moves bits, and the CPU has no fp8 index kernels."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t
