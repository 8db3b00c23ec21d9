"""What the host CPU offers the CPU expert kernels: instruction sets and physical cores.

Read from `/proc/cpuinfo` (Linux): the kernel lists only features it has enabled, so
`amx_tile` there means the OS supports tile state (the process must still ask for it,
see `cpu_build`). Elsewhere nothing is detected and the torch path runs.
"""

from __future__ import annotations

import functools
import math
import os
import platform
from pathlib import Path

# Kernel variants, fastest first, with the CPU flags each one needs.
VARIANT_FLAGS: dict[str, frozenset[str]] = {
    "amx": frozenset({"amx_tile", "amx_bf16", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "fma"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "fma"}),
    "avx2": frozenset({"avx2", "fma", "f16c"}),  # f16c: fp8 weights convert through fp16
    "scalar": frozenset(),
}
# Test-only: AMX tiling logic with the tile instructions emulated in C (needs AVX-512 BF16).
EMULATED = {"amx-emu": "avx512"}
AUTO_ORDER = ("amx", "avx512", "avx2")  # scalar only on request: torch is faster than plain C


@functools.cache
def cpu_flags() -> frozenset[str]:
    """Feature flags of the first CPU in /proc/cpuinfo (empty where unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def supported(variant: str, flags: frozenset[str] | None = None) -> bool:
    """Can this CPU run `variant` (before AMX permission, which `cpu_build` asks for)?"""
    flags = cpu_flags() if flags is None else flags
    if variant == "scalar":
        return True
    base = EMULATED.get(variant, variant)
    if base not in VARIANT_FLAGS or not is_x86_64():
        return False
    return VARIANT_FLAGS[base] <= flags


def physical_cores() -> int:
    """Physical cores this process may run on: SMT siblings count once; a cgroup CPU
    quota caps the count (containers often see every host CPU)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = len(core_cpus(allowed))
    quota = _cgroup_cpu_quota()
    return max(1, min(cores, quota) if quota else cores)


def core_cpus(allowed: set[int]) -> list[int]:
    """One logical CPU per physical core among `allowed` (distinct (package, core) pairs),
    in CPU order: SMT siblings skipped; a CPU whose topology is unreadable counts as a core."""
    seen, cpus = set(), []
    for cpu in sorted(allowed):
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            core = (topo.joinpath("physical_package_id").read_text(), topo.joinpath("core_id").read_text())
        except OSError:
            core = ("cpu", str(cpu))
        if core not in seen:
            seen.add(core)
            cpus.append(cpu)
    return cpus


def _cgroup_cpu_quota() -> int | None:
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
