"""Load a Hugging Face checkpoint directory into our layout, one tensor at a time.

Dense tensors land in a dict of our names; per-expert tensors are written straight into
the host ExpertStore's stacked banks. Each checkpoint tensor is read, copied into its
place and dropped, so the model is never held twice in memory. A pinned store's banks
are allocated pageable (exactly their size) and page-locked in place on a background
thread, each as soon as its last expert tensor is written (`moe/pinning.py`), so
pinning overlaps reading instead of following it.

Quantised checkpoints (`quantization_config`: fp8, awq, gptq, compressed-tensors, mxfp4)
load as published: a linear's parts are gathered and decoded (`models/quant_load.py`);
experts stay quantised in a `PartsStore`, others dequantised to the model's dtype;
`expert_dtype` quantises a bf16 checkpoint's experts as they stream in; a model file's
`stored_layout` turns tensors in another layout (gpt-oss's) into ours.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from edgemoe.models.arch import ModelArch, kept_dtypes
from edgemoe.models.checkpoint_files import (
    CheckpointError,
    all_names,
    check_plain,
    read_json,
    safetensors_files,
    with_stored_lm_head,
)
from edgemoe.models.mmap_load import map_expert, map_stacked
from edgemoe.models.names import NameMap, Placement, StackedMap, names_as_stored
from edgemoe.models.quant_load import (
    PartCollector,
    Upcasts,
    Value,
    check_decoded,
    checkpoint_scheme,
    dense_value,
    expert_parts,
    expert_shape,
    per_expert,
    pin_keys,
    place_expert_parts,
    stored_expert_format,
)
from edgemoe.models.registry import model_arch, model_module, skipped_prefixes
from edgemoe.moe.mmap_store import MmapStore
from edgemoe.moe.parts_store import PartsStore
from edgemoe.moe.pinning import InPlacePinner, PinWhenFilled, Registrar
from edgemoe.moe.store import BankStore, ExpertStore
from edgemoe.quant import ExpertFormat, resolve_expert_format
from edgemoe.quant.published import Scheme

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Tensors some checkpoints carry that we derive ourselves (rotary frequencies) or do not use
# (a quantised KV cache's static scales: --kv-cache-dtype fp8 keeps its own per head; static
# activation scales of W8A8 / FP8 / NVFP4 recipes: every quantised linear computes weight-only).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "self_attn.k_scale", "self_attn.v_scale", ".input_scale",
                    ".input_zero_point", ".input_global_scale", ".activation_scale")


@dataclass
class LoadedModel:
    arch: ModelArch
    params: dict[str, torch.Tensor]
    experts: ExpertStore
    config: dict[str, Any]
    note: str = ""  # what loading changed: dequantised layers, experts quantised at load
    tables: dict[str, torch.Tensor] = field(default_factory=dict)  # tables a store holds (PLE), by our name


# Where a table (`arch.table_shapes()`: too large to stage with the params, e.g. PLE) is
# written while loading: (our name, shape, dtype) → a tensor to fill (RAM, pinned, a mapped
# file), or None when the destination already holds it (its checkpoint tensors are skipped).
TableAlloc = Callable[[str, tuple[int, ...], torch.dtype], "torch.Tensor | None"]
Layout = Callable[[str, Value], Value]  # a model file's `stored_layout`



def ram_tables(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def read_arch(model_dir: Path, dtype: str = "auto") -> tuple[ModelArch, dict[str, Any]]:
    config = read_json(model_dir / "config.json")
    arch = with_stored_lm_head(model_arch(config, model_dir / "config.json"), model_dir)
    if dtype != "auto":
        arch = replace(arch, dtype=DTYPES[dtype])
    return arch, config


def load_checkpoint(
    model_dir: str | Path, dtype: str = "auto", progress: bool = True, expert_store: str = "ram",
    registrar: Registrar | None = None, expert_dtype: str = "auto", table_alloc: TableAlloc = ram_tables,
) -> LoadedModel:
    """`expert_store`: "ram" (stacked banks), "pinned" (the banks page-locked in place by
    `registrar` as each fills; pageable with a warning without one, or if the OS refuses),
    or "mmap" (experts stay in the checkpoint files, mapped, never read at load time).
    `expert_dtype` (`--expert-dtype`): auto keeps the checkpoint's experts as stored.
    `table_alloc`: where the arch's tables (if any) are written."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    arch, config = read_arch(model_dir, dtype)
    module = model_module(arch.model_type)
    scheme = checkpoint_scheme(config, model_dir / "config.json")
    files = safetensors_files(model_dir)
    stored = all_names(model_dir, files)
    names, stacked = names_as_stored(module, arch, stored)
    layout = getattr(module, "stored_layout", None)  # a stored layout that isn't ours (gpt-oss's experts)
    fmt = resolve_expert_format(expert_dtype, stored_expert_format(model_dir, arch, scheme, names, files), arch.dtype)
    kept = kept_dtypes(arch)
    params = {k: torch.empty(s, dtype=kept.get(k, arch.dtype)) for k, s in arch.param_shapes().items()}
    table_shapes: dict[str, tuple[int, ...]] = getattr(arch, "table_shapes", dict)()
    tables = {k: table_alloc(k, s, arch.dtype) for k, s in table_shapes.items()}
    experts = _allocate_store(model_dir, arch, fmt, scheme, expert_store)
    pins = _pin_tracker(experts, names, registrar) if expert_store == "pinned" else None
    collector = (PartCollector(scheme, stored, arch.moe_intermediate_size, arch.store_experts)
                 if scheme else None)
    upcasts = Upcasts()
    # A model file may name checkpoint parts it does not read (vision tower, MTP head) ...
    ignored = (IGNORED_SUFFIXES + tuple(getattr(module, "IGNORED_SUFFIXES", ())), skipped_prefixes(module, arch))
    # ... or a table its destination already holds (a disk store's files): not read again.
    held = {n for n, p in (*names.items(), *((n, s.placement) for n, s in stacked.items()))
            if p.target in tables and tables[p.target] is None}
    names = {n: p for n, p in names.items() if n not in held}
    stacked = {n: s for n, s in stacked.items() if n not in held}
    ignored = (ignored[0] + tuple(held), ignored[1])
    dests = {**params, **{k: t for k, t in tables.items() if t is not None}}
    try:
        filled = _stream_files(
            model_dir, files, names, dests, experts, progress, pins, collector, upcasts, ignored, stacked, layout
        )
        _check_complete(model_dir, files, names, filled)
    except BaseException:
        if pins is not None:  # give back what was locked; the store is dropped with the error
            pins.pinner.finish()
            pins.pinner.release()
        raise
    if pins is not None:
        experts.own_pins(pins.pinner)  # type: ignore[union-attr]  # waits for the last layers
    if arch.tie_word_embeddings:
        params["lm_head"] = params["embed"]
    if upcasts.note():
        log.info("%s: %s", model_dir, upcasts.note())
    return LoadedModel(arch, params, experts, config, upcasts.note(),
                       {k: t for k, t in tables.items() if t is not None})


def _allocate_store(model_dir: Path, arch: ModelArch, fmt: ExpertFormat, scheme: Scheme | None,
                    expert_store: str) -> ExpertStore:
    """Pageable banks (pinned in place as they fill), quantised banks, or an mmap store."""
    layers, dims = list(arch.moe_layers), (arch.store_experts, arch.hidden_size, arch.moe_intermediate_size)
    if expert_store == "mmap":
        if scheme is not None or fmt.quantised or hasattr(model_module(arch.model_type), "stored_layout"):
            raise CheckpointError(f"{model_dir}: expert_store (--expert-store) mmap serves unquantised checkpoints "
                                  "with experts in our layout only (not gpt-oss's transposed ones); use pinned or "
                                  "pageable")
        return MmapStore(layers, *dims, arch.dtype)
    if fmt.quantised:
        return PartsStore.allocate_parts(layers, *dims, fmt)
    return BankStore.allocate(layers, *dims, arch.dtype)


def _pin_tracker(experts: ExpertStore, names: NameMap, registrar: Registrar | None) -> PinWhenFilled | None:
    """Which checkpoint tensors fill each bank (each part's bank, quantised), so each bank
    is locked once complete."""
    if registrar is None:
        log.warning("expert_store (--expert-store) pinned needs a CUDA device; using pageable memory")
        return None
    assert isinstance(experts, BankStore)
    expected: dict[str, tuple[torch.Tensor, set[str]]] = {}
    for name, place in names.items():
        if place.target.startswith("experts."):
            layer = int(place.target.split(".")[1])
            for key, part in pin_keys(experts, place.target):
                expected.setdefault(key, (experts.tensor(layer, part), set()))[1].add(name)
    return PinWhenFilled(InPlacePinner(registrar, "expert store"), expected)


def _check_complete(model_dir: Path, files: dict[str, list[str]], names: NameMap, filled: set[str]) -> None:
    missing = sorted(set(names) - filled)
    if missing:
        where = {n: f for f, ns in files.items() for n in ns}
        first = missing[0]
        raise CheckpointError(
            f"{model_dir}: missing tensor {first!r}"
            + (f" (the index puts it in {where[first]})" if first in where else "")
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )


def _stream_files(
    model_dir: Path,
    files: dict[str, list[str]],
    names: NameMap,
    params: dict[str, torch.Tensor],
    experts: ExpertStore,
    progress: bool,
    pins: PinWhenFilled | None = None,
    collector: PartCollector | None = None,
    upcasts: Upcasts | None = None,
    ignored: tuple[tuple[str, ...], tuple[str, ...]] = (IGNORED_SUFFIXES, ()),
    stacked: StackedMap | None = None,
    layout: Layout | None = None,
) -> set[str]:
    """Place every tensor `names` (or `stacked`: filling the names it covers) knows,
    quantised linears through `collector`; `ignored` (suffixes, prefixes) are skipped
    silently, any other with one warning; `layout`: the model file's `stored_layout`."""
    upcasts, stacked = upcasts or Upcasts(), stacked or {}
    layout = layout or (lambda _name, value: value)
    filled: set[str] = set()
    unexpected: list[str] = []
    bar = tqdm(total=len(names), desc="loading", unit="tensor", disable=not progress, leave=False)
    for fname in files:
        path = model_dir / fname
        try:
            handle = safe_open(str(path), framework="pt")
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{path}: corrupt or truncated safetensors file ({e})") from None
        with handle:
            for name in handle.keys():
                if collector is not None and collector.base(name) is not None:
                    for base, value in collector.add(name, _read(handle, path, name), path):
                        new = _place_linear(path, base, layout(base, value), names, params, experts, upcasts)
                        if not new and not base.startswith(ignored[1]):  # a vision tower's: skipped quietly
                            unexpected.append(base)
                        filled.update(new)
                        _mark_filled(pins, experts, names, new)
                        bar.update(len(new))
                    continue
                place, covers = names.get(name), ()
                if place is None and name in stacked:
                    place, covers = stacked[name].placement, stacked[name].covers
                if place is None:
                    if not (name.endswith(ignored[0]) or name.startswith(ignored[1])):
                        unexpected.append(name)
                    continue
                if isinstance(experts, MmapStore) and place.target.startswith("experts."):
                    (map_stacked if covers else map_expert)(path, name, place, experts)
                else:
                    _place(path, name, layout(name, _read(handle, path, name)), place, params, experts, upcasts)
                    _mark_filled(pins, experts, names, list(covers) or [name])
                filled.update((name, *covers))
                bar.update(len(covers) or 1)
    bar.close()
    if collector is not None and collector.pending:
        base, got = next(iter(collector.pending.items()))
        raise CheckpointError(f"{model_dir}: quantised tensor {base!r} is incomplete (found {sorted(got)}, "
                              f"expected {sorted(collector.expected[base])})")
    if unexpected:
        log.warning("ignored %d unexpected tensor(s), e.g. %s", len(unexpected), unexpected[:3])
    return filled


def _mark_filled(pins: PinWhenFilled | None, experts: ExpertStore, names: NameMap, filled: list[str]) -> None:
    """Tell the pin tracker which expert tensors were just written (every part's bank)."""
    if pins is None:
        return
    for name in filled:
        if (target := names[name].target).startswith("experts."):
            for key, _ in pin_keys(experts, target):
                pins.filled(key, name)


def _read(handle: Any, path: Path, name: str) -> torch.Tensor:
    try:
        return handle.get_tensor(name)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read tensor {name!r}: corrupt or truncated ({e})") from None


def _place_linear(
    path: Path, base: str, value: Value, names: NameMap, params: dict[str, torch.Tensor],
    experts: ExpertStore, upcasts: Upcasts,
) -> list[str]:
    """Place one decoded linear; returns the name-map entries it filled ([] if unknown)."""
    place = names.get(base)
    if place is None:
        return _place_fused(path, base, value, names, experts, upcasts)
    if place.target.startswith("experts."):
        shape = expert_shape(experts, place)
        check_decoded(path, base, value, shape)
        if isinstance(experts, PartsStore):
            _put_parts(path, base, experts, place, expert_parts(value, experts.format, shape, upcasts))
            return [base]
    else:
        dest = params[place.target]
        shape = tuple((dest[place.index] if place.index else dest).shape)
        check_decoded(path, base, value, shape)
    _place(path, base, dense_value(value, shape, upcasts), place, params, experts, upcasts)
    return [base]


def _place_fused(
    path: Path, base: str, value: Value, names: NameMap, experts: ExpertStore, upcasts: Upcasts,
) -> list[str]:
    """All experts of a layer in one tensor per part (gpt-oss MXFP4): "<p>.experts.gate_up_proj"
    fills "<p>.experts.{e}.gate_proj/up_proj.weight", "down_proj" the down weights."""
    prefix, _, proj = base.rpartition(".experts.")
    if not prefix or proj not in ("gate_up_proj", "down_proj") or isinstance(value, torch.Tensor):
        return []
    fmt, fused = value
    halves = ("gate_proj", "up_proj") if proj == "gate_up_proj" else ("down_proj",)
    filled = []
    for e in range(experts.num_experts):
        per = {s: t[e] for s, t in fused.items()}
        for i, half in enumerate(halves):
            name = f"{prefix}.experts.{e}.{half}.weight"
            if name not in names:
                return []
            # NOTE: fused layers come only as mxfp4, whose parts are all per row: half the rows is gate's.
            rows = {s: t[i * t.shape[0] // len(halves) : (i + 1) * t.shape[0] // len(halves)] for s, t in per.items()}
            _place_linear(path, name, (fmt, rows), names, {}, experts, upcasts)
            filled.append(name)
    return filled


def _put_parts(path: Path, name: str, store: PartsStore, place: Placement, parts: dict[str, torch.Tensor]) -> None:
    try:
        place_expert_parts(store, place, parts)
    except ValueError as e:
        raise CheckpointError(f"{path}: tensor {name!r}: {e}") from None


def _place(
    path: Path,
    name: str,
    tensor: torch.Tensor,
    place: Placement,
    params: dict[str, torch.Tensor],
    experts: ExpertStore,
    upcasts: Upcasts | None = None,
) -> None:
    check_plain(path, name, tensor)
    if place.target.startswith("experts.") and isinstance(experts, PartsStore):
        if tensor.dim() == 3:  # a layer's experts stacked (gpt-oss): each matrix quantised on its own
            for one, matrix in per_expert(place, tensor, experts.down_shape[1]):
                _place(path, name, matrix, one, params, experts, upcasts)
            return
        shape = expert_shape(experts, place)
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}")
        _put_parts(path, name, experts, place, expert_parts(tensor, experts.format, shape, upcasts or Upcasts()))
        return
    if place.target.startswith("experts."):
        _, layer, which = place.target.split(".")
        dest = experts.tensor(int(layer), which)
    else:
        dest = params[place.target]
    view = dest[place.index] if place.index else dest
    if tuple(view.shape) != tuple(tensor.shape):
        raise CheckpointError(
            f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(view.shape)}"
        )
    view.copy_(tensor)
