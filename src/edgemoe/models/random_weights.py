"""Seeded random weights at a model's real shape, written in place into host memory.

Speed over statistics: one seeded block of N(0, std²) values (std = the config's
`initializer_range`, 0.02 as in Hugging Face's init; norms are 1) is tiled across
every tensor from an offset of its own, so a 30B-parameter model costs memory
bandwidth, not random number generation. Offsets come from a hash of the tensor's
name plus a stride per expert, so no two experts (or layers) hold the same values.
Expert banks are page-locked in place when a registrar is given, layer l's
registration overlapping the filling of layer l+1 (`moe/pinning.py`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

import torch
from tqdm import tqdm

from edgemoe.models.arch import ModelArch, kept_dtypes
from edgemoe.models.loader import LoadedModel, TableAlloc, ram_tables
from edgemoe.moe.parts_store import PartsStore
from edgemoe.moe.pinning import InPlacePinner, Registrar
from edgemoe.moe.store import BankStore, ExpertStore
from edgemoe.quant import ExpertFormat, quantise_expert

log = logging.getLogger(__name__)

# NOTE: the block length is prime, so no tensor repeats a row: row r of width H starts
# at offset + r*H (mod BLOCK), and r*H ≡ r'*H (mod a prime > H) only when r ≡ r'
# (mod BLOCK). Likewise experts e < BLOCK all start at distinct offsets.
BLOCK = 2_097_143  # 2^21 - 9, prime: 4 MiB of bf16
EXPERT_STRIDE = 104_729  # prime < BLOCK: expert e starts e * stride further on
CHUNK = 1 << 22  # elements per copy call (8 MiB of bf16): large enough to run on all threads
DEFAULT_STD = 0.02


class TiledInit:
    """Fills tensors with windows of one seeded random block (dtype of the tensors)."""

    def __init__(self, seed: int, dtype: torch.dtype, std: float = DEFAULT_STD) -> None:
        self.seed = seed
        gen = torch.Generator().manual_seed(seed)
        block = (torch.randn(BLOCK, generator=gen) * std).to(dtype)
        # The block repeated far enough that any window of CHUNK elements is one slice.
        reps = -(-(BLOCK + CHUNK) // BLOCK)
        self.source = block.repeat(reps)[: BLOCK + CHUNK]

    def offset(self, name: str, index: int = 0) -> int:
        digest = hashlib.blake2b(f"{self.seed}/{name}".encode(), digest_size=8).digest()
        return (int.from_bytes(digest, "little") + index * EXPERT_STRIDE) % BLOCK

    def fill(self, dest: torch.Tensor, name: str, index: int = 0) -> None:
        """dest.flatten()[i] = block[(offset(name, index) + i) % BLOCK]: copies, no per-element Python."""
        flat = dest.view(-1)  # NOTE: dest must be contiguous (banks and params are)
        off, pos, n = self.offset(name, index), 0, flat.numel()
        while pos < n:
            k = min(CHUNK, n - pos)
            flat[pos : pos + k].copy_(self.source[off : off + k])
            off, pos = (off + k) % BLOCK, pos + k


def materialise(
    arch: ModelArch,
    config: dict[str, Any],
    seed: int = 0,
    *,
    registrar: Registrar | None = None,
    progress: bool = False,
    expert_format: ExpertFormat | None = None,
    table_alloc: TableAlloc = ram_tables,
) -> LoadedModel:
    """Random weights for `arch` in host memory: the LoadedModel the checkpoint loader
    returns. `registrar`: page-lock the expert banks in place (pageable, with one
    warning, if it refuses). Experts first, so their pinning overlaps the dense fill.
    `expert_format` (quantised): experts are written in that format (`fill_quantised`)."""
    t0 = time.perf_counter()
    init = TiledInit(seed, arch.dtype, float(config.get("initializer_range", DEFAULT_STD)))
    pinner = InPlacePinner(registrar, "expert store") if registrar is not None else None
    if expert_format is not None and expert_format.quantised:
        store: ExpertStore = fill_quantised(arch, expert_format, init, pinner, progress)
    else:
        store = fill_dense(arch, init, pinner, progress)
    kept = kept_dtypes(arch)
    params = {name: dense_tensor(init, name, shape, kept.get(name, arch.dtype))
              for name, shape in arch.param_shapes().items()}
    if arch.tie_word_embeddings:
        params["lm_head"] = params["embed"]
    tables = fill_tables(init, arch, table_alloc, progress)
    if pinner is not None:
        pinner.finish(progress=progress)  # a bar while the last layers' pinning completes
        store.own_pins(pinner)  # type: ignore[attr-defined]
    seconds = time.perf_counter() - t0
    dense = {t.data_ptr(): t.numel() * t.element_size() for t in params.values()}  # tied: counted once
    nbytes = store.nbytes() + sum(dense.values()) + sum(t.nbytes for t in tables.values())
    # WARNING level on purpose: the load time is what a benchmark run wants to see.
    log.warning(
        "random weights (seed %d): %.2f GB in %.2f s (%.2f GB/s)%s", seed, nbytes / 1e9, seconds,
        nbytes / 1e9 / seconds, "; experts pinned in place" if store.pinned else "",
    )
    return LoadedModel(arch, params, store, config, tables=tables)


def fill_tables(init: TiledInit, arch: ModelArch, alloc: TableAlloc, progress: bool) -> dict[str, torch.Tensor]:
    """The arch's tables (PLE), tiled like every tensor, where `alloc` puts them (skipped
    when it already holds them: a disk store's files written by an earlier start)."""
    tables = {}
    shapes: dict[str, tuple[int, ...]] = getattr(arch, "table_shapes", dict)()
    for name, shape in tqdm(shapes.items(), desc="random tables", unit="table", disable=not progress, leave=False):
        t = alloc(name, shape, arch.dtype)
        if t is not None:
            init.fill(t, name)
            tables[name] = t
    return tables


def fill_dense(arch: ModelArch, init: TiledInit, pinner: InPlacePinner | None, progress: bool) -> BankStore:
    store = BankStore.allocate(
        list(arch.moe_layers), arch.store_experts, arch.hidden_size, arch.moe_intermediate_size, arch.dtype
    )
    for layer in tqdm(store.layers, desc="random experts", unit="layer", disable=not progress, leave=False):
        bank = store.banks[layer]
        for e in range(store.num_experts):
            init.fill(bank.gate_up[e], f"layers.{layer}.experts.gate_up", e)
            init.fill(bank.down[e], f"layers.{layer}.experts.down", e)
        if pinner is not None:  # registered on the pinner's thread while the next layer fills
            pinner.submit(bank.gate_up)
            pinner.submit(bank.down)
    return store


def fill_quantised(arch: ModelArch, fmt: ExpertFormat, init: TiledInit, pinner: InPlacePinner | None,
                   progress: bool) -> PartsStore:
    """Experts in a quantised format at the speed of copies: one random expert is
    quantised as a template; every expert gets the template's scales and a window of its
    data bytes at an offset of its own (values still drawn from the same distribution)."""
    H, I = arch.hidden_size, arch.moe_intermediate_size
    store = PartsStore.allocate_parts(list(arch.moe_layers), arch.store_experts, H, I, fmt)
    g = torch.Generator().manual_seed(init.seed)
    std = float(init.source[:4096].float().std())
    gate, up, down = (torch.randn(shape, generator=g) * std for shape in ((I, H), (I, H), (H, I)))
    template = quantise_expert(fmt, gate, up, down)
    for layer in tqdm(store.layers, desc="random experts", unit="layer", disable=not progress, leave=False):
        for name, bank in store.layer_parts(layer).items():
            src = template[name]
            for e in range(store.num_experts):
                if name in ("gate_up", "down"):  # data: a window of the template's bytes
                    fill_window(bank[e], src, init.offset(f"layers.{layer}.experts.{name}", e))
                else:
                    bank[e].copy_(src)
            if pinner is not None:
                pinner.submit(bank)
    return store


def fill_window(dest: torch.Tensor, src: torch.Tensor, offset: int) -> None:
    """dest's bytes = src's bytes from `offset` on, wrapping around (same byte size)."""
    d, s = dest.view(-1).view(torch.uint8), src.reshape(-1).view(torch.uint8)
    off = offset % s.numel()
    d[: s.numel() - off].copy_(s[off:])
    d[s.numel() - off :].copy_(s[:off])


def dense_tensor(init: TiledInit, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A non-expert tensor by our name: norms are ones (HF's init), the rest tiled."""
    t = torch.empty(shape, dtype=dtype)
    if name == "norm" or name.endswith("_norm"):
        t.fill_(1.0)
    else:
        init.fill(t, name)
    return t
