"""What `--model` names, and loading it under the host memory plan.

`resolve_model` turns the setting into a `ModelSource` without allocating anything: a
checkpoint directory, the demo model (no `--model`), or a random preset
(`random:qwen3-30b-a3b?num_hidden_layers=12`, see `models/presets.py`), whose config,
tokenizer and chat template are written to a directory under the cache dir so the
server and the stats see an ordinary model directory. `load_model` plans host memory
(refusing before any allocation), then reads the checkpoint or materialises the preset;
both return the same `LoadedModel`, so everything after is one path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from edgemoe.assets.cache import atomic_dir, cache_dir
from edgemoe.assets.model_files import write_model_files
from edgemoe.engine.budget import MemoryPlan
from edgemoe.engine.host_budget import HostPlan, HostRow, host_budget, plan_host
from edgemoe.models.arch import ModelArch
from edgemoe.models.checkpoint_files import with_stored_lm_head
from edgemoe.models.loader import (
    DTYPES,
    LoadedModel,
    TableAlloc,
    checkpoint_scheme,
    load_checkpoint,
    ram_tables,
    read_json,
    stored_expert_format,
)
from edgemoe.models.presets import RandomSpec, is_random, parse_random
from edgemoe.models.registry import model_arch
from edgemoe.moe.pinning import CudaRegistrar, Registrar
from edgemoe.quant import ExpertFormat, resolve_expert_format

log = logging.getLogger(__name__)

PRESET_ROOT = "random-v1"  # bump when the files written for a preset change


@dataclass(frozen=True)
class ModelSource:
    """`name`: what /v1/models and the ready line show; `model_dir`: config, tokenizer and
    template files (a checkpoint's, or written for a preset); `random`: the preset, if any."""

    name: str
    model_dir: Path
    config: dict[str, Any]
    random: RandomSpec | None = None
    demo: bool = False

    @property
    def random_weights(self) -> bool:
        """Seeded random weights (a preset or the demo model): its text means nothing."""
        return self.random is not None or self.demo

    def arch(self, dtype: str = "auto") -> ModelArch:
        arch = model_arch(self.config, self.model_dir / "config.json")
        if self.random is None:
            arch = with_stored_lm_head(arch, self.model_dir)
        return arch if dtype == "auto" else replace(arch, dtype=DTYPES[dtype])

    @property
    def quant_method(self) -> str | None:
        """The checkpoint's `quant_method` (fp8, awq, …), None when unquantised."""
        scheme = checkpoint_scheme(self.config, self.model_dir / "config.json")
        return scheme.method if scheme else None

    def expert_format(self, expert_dtype: str, arch: ModelArch) -> ExpertFormat:
        """The experts' format for `--expert-dtype` (auto: as the checkpoint stores them)."""
        scheme = checkpoint_scheme(self.config, self.model_dir / "config.json")
        stored = stored_expert_format(self.model_dir, arch, scheme) if self.random is None else None
        return resolve_expert_format(expert_dtype, stored, arch.dtype)


def resolve_model(model: str | None) -> ModelSource:
    """The source `--model` names; raises ValueError / FileNotFoundError naming the setting."""
    if model is None:
        from edgemoe.assets.demo import demo_model_path

        path = demo_model_path()
        return ModelSource(path.name, path, read_json(path / "config.json"), demo=True)
    if is_random(model):
        spec = parse_random(model)
        return ModelSource(spec.name, preset_dir(spec), spec.config, random=spec)
    if not model.strip():  # `--model "$MODEL"` with $MODEL unset read the working directory
        raise ValueError("model (--model) is empty: give a model directory, or leave it out for the demo model")
    path = Path(model).expanduser()
    if not path.is_dir():
        why = "not a directory (give the checkpoint's directory)" if path.exists() else "no such directory"
        raise FileNotFoundError(f"model (--model) {model!r}: {why}")
    return ModelSource(path.name, path, read_json(path / "config.json"))


def preset_dir(spec: RandomSpec) -> Path:
    """`<cache>/random-v1/<preset>[@overrides]`: the preset's config.json, generation
    config, Qwen3 tokenizer and chat template (built once, atomically)."""
    dest = cache_dir() / PRESET_ROOT / spec.dir_name
    if not (dest / "config.json").exists():
        with atomic_dir(dest) as tmp:
            write_model_files(tmp, spec.config)
    return dest


def host_plan(source: ModelSource, arch: ModelArch, expert_store: str, device: torch.device, host_memory: str | None,
              device_plan: MemoryPlan, extra: tuple[HostRow, ...] = (), expert_dtype: str = "auto") -> HostPlan:
    """What loading `source` will hold in host RAM against `--host-memory` (load_model's
    arguments, which it checks before allocating anything)."""
    available, where = host_budget(host_memory)
    hints = ("or a smaller preset (random:…?num_hidden_layers=N)",) if source.random else (
        ("or --expert-store mmap",) if expert_store != "mmap" else ()
    )
    return plan_host(
        arch, expert_store=expert_store, available=available, source=where,
        device_plan=device_plan if device.type == "cpu" else None, extra=extra, hints=hints,
        expert_format=source.expert_format(expert_dtype, arch),
    )


def load_model(
    source: ModelSource,
    arch: ModelArch,
    *,
    expert_store: str,
    device: torch.device,
    host_memory: str | None,
    device_plan: MemoryPlan,
    progress: bool = True,
    extra: tuple[HostRow, ...] = (),
    expert_dtype: str = "auto",
    table_alloc: TableAlloc = ram_tables,
) -> LoadedModel:
    """Check the host plan (PlanError before allocating), log it, then load `source`.

    `expert_store`: pinned | ram | mmap (resolved, see build.host_store_kind);
    `device_plan` adds the KV cache and workspace rows when `device` is the CPU;
    `expert_dtype`: `--expert-dtype` (experts quantised at load, or kept as published);
    `table_alloc` places the arch's tables (PLE), `extra` rows count them.
    """
    fmt = source.expert_format(expert_dtype, arch)
    if source.random is not None and expert_store == "mmap":
        raise ValueError(f"expert_store (--expert-store) mmap maps checkpoint files; {source.name} has none")
    plan = host_plan(source, arch, expert_store, device, host_memory, device_plan, extra, expert_dtype)
    # WARNING level on purpose, like the device plan: what a person starting a server wants to see.
    log.warning("%s", plan.table())
    plan.check()
    if source.random_weights:
        log.warning("model %s has random weights: a benchmark and test model, its text means nothing", source.name)
    registrar = _registrar(expert_store, device)
    if source.random is None:
        store = "ram" if expert_store == "pinned" and registrar is None else expert_store  # warned already
        return load_checkpoint(source.model_dir, _dtype_name(arch), progress, store, registrar, expert_dtype=expert_dtype,
                               table_alloc=table_alloc)
    from edgemoe.models.random_weights import materialise

    return materialise(arch, source.config, source.random.seed, registrar=registrar, progress=progress,
                       expert_format=fmt, table_alloc=table_alloc)


def _registrar(expert_store: str, device: torch.device) -> Registrar | None:
    """What page-locks the expert banks in place as they fill (a checkpoint's or a
    preset's): the device's driver, when pinned on CUDA."""
    if expert_store != "pinned":
        return None
    if device.type != "cuda":
        log.warning("expert_store (--expert-store) pinned needs a CUDA device; using pageable memory")
        return None
    return CudaRegistrar(device)


def _dtype_name(arch: ModelArch) -> str:
    return next(name for name, dt in DTYPES.items() if dt == arch.dtype)
