"""Tables that need not sit on the device: Qwen3.8-Flash-Next's PLE tables (`--ple-store`,
`--ple-dir`) and the token embedding (`--embed-weights`: host, or auto: host on a GPU whose
experts don't all fit). Decided before anything is allocated, so both memory plans count
them: the device plan reserves what stays on the device (a device PLE store, the disk
store's step rows; an embedding left on the device is in the dense weights), the host plan
what is pinned in RAM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from edgemoe.assets.cache import cache_dir
from edgemoe.config import EngineConfig, flag_name
from edgemoe.engine.host_budget import HostRow
from edgemoe.engine.model_source import ModelSource
from edgemoe.models.arch import ModelArch
from edgemoe.ple.factory import PlePlan, plan_ple, resolve_kind

EMBED_CHOICES = ("auto", "device", "host")


@dataclass(frozen=True)
class TablePlan:
    ple: PlePlan | None
    embed_on_host: bool
    max_tokens: int  # the largest step (the disk store's step rows)

    def device_rows(self) -> tuple[tuple[str, int], ...]:
        """(name, bytes) the device plan reserves."""
        p = self.ple
        if p is None:
            return ()
        size = p.dtype.itemsize
        if p.kind == "device":
            return (("PLE tables", p.geometry.table_nbytes(size)),)
        if p.kind == "disk":
            rows = self.max_tokens * len(p.geometry.layers) * p.geometry.embed_dim * size
            return (("PLE step rows (disk store)", rows),)
        return ()

    def host_rows(self, arch: ModelArch, on_cuda: bool) -> tuple[HostRow, ...]:
        rows = []
        p = self.ple
        if p is not None and p.kind in ("host", "device") and (p.kind == "host" or not on_cuda):
            note = "pinned, gathered over PCIe" if p.kind == "host" and on_cuda else "RAM"
            rows.append(HostRow("PLE tables", p.geometry.table_nbytes(p.dtype.itemsize), note))
        if p is not None and p.kind == "disk":
            staging = 4 * self.max_tokens * len(p.geometry.layers) * p.geometry.embed_dim * p.dtype.itemsize
            rows.append(HostRow("PLE staging", staging, "pinned rows the filler reads into"))
        if self.embed_on_host:
            rows.append(HostRow("token embedding", embed_nbytes(arch), "pinned, gathered per step (--embed-weights)"))
        return tuple(rows)

    @property
    def host_params(self) -> tuple[str, ...]:
        """Params the device plan does not hold."""
        return ("embed",) if self.embed_on_host else ()


def plan_tables(config: EngineConfig, source: ModelSource, arch: ModelArch, device: torch.device,
                device_budget: int | None, host_available: int) -> TablePlan:
    m, sched = config.model, config.scheduler
    max_tokens = sched.max_prefill_tokens + sched.max_running_requests
    embed = check_embed_setting(m.embed_weights, arch)
    geometry = getattr(arch, "ple", None)
    if geometry is None:
        return TablePlan(None, embed, max_tokens)
    size = arch.dtype.itemsize
    kind = resolve_kind(m.ple_store, geometry.table_nbytes(size), device, device_budget, host_available)
    return TablePlan(plan_ple(kind, geometry, device, arch.dtype, _path(m.ple_dir), identity(source), cache_dir()),
                     embed, max_tokens)


def check_embed_setting(setting: str, arch: ModelArch) -> bool:
    """Whether the embedding goes to host memory before the device plan is known: `host`
    (checked against the model); `device` and `auto` not yet (`auto_embed_on_host` decides
    auto with the plan)."""
    if setting not in EMBED_CHOICES:
        raise ValueError(f"{flag_name('embed_weights')}={setting!r}: choose one of {', '.join(EMBED_CHOICES)}")
    if setting != "host":
        return False
    if arch.tie_word_embeddings:
        raise ValueError(
            f"{flag_name('embed_weights')} host: this model ties its embedding to the LM head "
            "(tie_word_embeddings), which needs it on the device every step; use --embed-weights device"
        )
    return True


def auto_embed_on_host(setting: str, arch: ModelArch, device: torch.device, backend: str,
                       host_room: Callable[[], int]) -> bool:
    """`--embed-weights auto`: the embedding goes to pinned host memory where its device
    bytes become expert slots — on a GPU whose plan keeps experts off the device (`backend`
    not resident; Qwen3-30B-A3B's 0.58 GiB are 131 more fp8 slots at 16 GiB, ~5% fewer
    misses), an untied embedding (a tied one is the LM head, read whole every step), and
    room for it in the host plan (`host_room()`: bytes, asked last). A step gathers its
    tokens' rows over PCIe: 4 KiB a token at H = 2048 in bf16."""
    return (setting == "auto" and device.type == "cuda" and backend != "resident"
            and not arch.tie_word_embeddings and embed_nbytes(arch) <= host_room())


def embed_nbytes(arch: ModelArch) -> int:
    return math.prod(arch.param_shapes()["embed"]) * arch.dtype.itemsize


def identity(source: ModelSource) -> str:
    """What wrote a disk store's files: the preset (name with its seed), or the checkpoint
    directory and its index's size and modification time."""
    if source.random is not None:
        return source.random.name + f"?seed={source.random.seed}"
    index = source.model_dir / "model.safetensors.index.json"
    stamp = f"{index.stat().st_size}:{index.stat().st_mtime_ns}" if index.exists() else "single"
    return f"{source.model_dir.resolve()}:{stamp}"


def _path(setting: str | None):  # noqa: ANN202 - Path | None
    from pathlib import Path

    return Path(setting).expanduser() if setting else None
