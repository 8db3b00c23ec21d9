"""The host memory plan: what the engine will hold in RAM, checked before anything is allocated.

The device plan (`budget.py`) covers the GPU; this one covers host RAM under
`--host-memory` (default: what the OS reports available, MemAvailable). It is a list of
named rows so later features add theirs (a host KV tier, per-layer embedding tables):
the expert store (pinned or pageable banks; 0 for mmap, whose pages are the page
cache's to drop), the dense weights staged on the host while loading, and, when the
model runs on the CPU, the KV cache and the step workspace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from edgemoe.engine.budget import (
    GiB,
    MemoryPlan,
    PlanError,
    dense_weight_bytes,
    expert_nbytes,
    parse_size,
)
from edgemoe.models.arch import ModelArch
from edgemoe.quant import ExpertFormat

HOST_FLAG = "host_memory (--host-memory)"


@dataclass(frozen=True)
class HostRow:
    name: str
    nbytes: int
    note: str = ""


@dataclass(frozen=True)
class HostPlan:
    rows: tuple[HostRow, ...]
    available: int  # bytes the plan may use
    source: str  # where `available` came from: the flag, or MemAvailable
    hints: tuple[str, ...] = field(default=())  # what else would lower the need

    @property
    def total(self) -> int:
        return sum(r.nbytes for r in self.rows)

    def table(self) -> str:
        rows = [(r.name + (f" ({r.note})" if r.note else ""), r.nbytes) for r in self.rows]
        rows += [("total", self.total), (f"available ({self.source})", self.available)]
        width = max(len(name) for name, _ in rows)
        lines = ["host memory plan"] + [f"  {name:<{width}}  {n / GiB:8.2f} GiB" for name, n in rows]
        return "\n".join(lines)

    def check(self) -> None:
        """Raise PlanError naming the need, what is available and the flag to change."""
        if self.total <= self.available:
            return
        parts = " + ".join(f"{r.name} {r.nbytes / GiB:.2f}" for r in self.rows if r.nbytes)
        hints = "".join(f", {h}" for h in self.hints)
        raise PlanError(
            f"the model needs {self.total / GiB:.2f} GiB of host memory ({parts} GiB) but "
            f"{self.available / GiB:.2f} GiB is available ({self.source}): raise {HOST_FLAG} "
            f"if the machine has more to give{hints}"
        )


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemAvailable in bytes: the kernel's estimate of what can be allocated without swapping."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    # No /proc (macOS): free physical pages, a lower bound of what is available.
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def host_budget(setting: str | None) -> tuple[int, str]:
    """(bytes, where they came from) for `--host-memory`."""
    if setting is None:
        return mem_available(), "MemAvailable"
    try:
        return parse_size(setting), "--host-memory"
    except ValueError:
        raise ValueError(f"{HOST_FLAG}: cannot parse size {setting!r} (e.g. 64GiB, 900MiB)") from None


def plan_host(
    arch: ModelArch,
    *,
    expert_store: str,
    available: int,
    source: str,
    device_plan: MemoryPlan | None = None,
    extra: tuple[HostRow, ...] = (),
    hints: tuple[str, ...] = (),
    expert_format: ExpertFormat | None = None,
) -> HostPlan:
    """Rows for the expert store (`expert_store`: pinned | ram | mmap) in `expert_format`
    (default: unquantised), the dense weights, and, with `device_plan` (the model runs on
    the host), its slots, KV cache and workspace; `extra` rows come from features with host
    tables of their own."""
    expert_bytes = len(arch.moe_layers) * arch.store_experts * expert_nbytes(arch, expert_format)
    fmt = f", {expert_format.label}" if expert_format is not None and expert_format.quantised else ""
    store = {
        "pinned": HostRow("expert store", expert_bytes, "pinned" + fmt),
        "ram": HostRow("expert store", expert_bytes, "pageable" + fmt),
        "mmap": HostRow("expert store", 0, "mmap: page cache, not resident"),
    }[expert_store]
    rows = [store, HostRow("dense weights", dense_weight_bytes(arch), "staged while loading")]
    if device_plan is not None:
        d = device_plan
        if d.num_slots:
            rows.append(HostRow("expert slots", d.num_slots * d.slot_bytes, f"{d.num_slots} slots, device cpu"))
        rows.append(HostRow("KV cache", d.kv_bytes, f"{d.kv_tokens} tokens, device cpu"))
        if d.state_rows:
            rows.append(HostRow("GDN state", d.state_bytes, f"{d.state_rows} rows + 1 scratch, device cpu"))
        rows.append(HostRow("workspace", d.workspace, "device cpu"))
    return HostPlan((*rows, *extra), available, source, hints)
