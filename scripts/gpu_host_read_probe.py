"""Why the device-side gather reads host memory slower than the copy engine on some hosts.

On 2026-12-07 an H100 host copied an fp8 expert (4.72 MB) at 48.8 GB/s with the copy engine
and at ~33 GB/s with the gather kernel at every grid tried (2 KB to 32 KB items, 16 to 528
programs: GRIDS, then this file's predecessor, the `pin_memory` pool alone), where earlier
hosts gathered at 47–51 GB/s.
A grid-independent cap points at the host side of the link: how the pages are mapped (an
IOMMU translates each of the SMs' small reads; 2 MB pages need 512× fewer translations than
4 KB ones) or which NUMA node holds them. This prints the host's topology, then times both
movers over the same expert pool allocated three ways — `pin_memory()` (cudaHostAlloc),
pageable memory in 4 KB pages registered in place (`cudaHostRegister`, as the engine's
expert store is), and the same in transparent huge pages — once per NUMA node (the pool
first-touched by a thread bound to that node's CPUs). Seconds. Writes $OUT/host-read-probe.json.

    run(command="python3 -m pip install -q --no-index --no-deps --target /tmp/pm .whl/msgspec*.whl;
                 PYTHONPATH=src:/tmp/pm python3 scripts/gpu_host_read_probe.py", carry=[".whl"])
"""

from __future__ import annotations

import glob
import json
import mmap
import os
import subprocess

import torch

from edgemoe.bench.cuda_timing import eager_us
from edgemoe.kernels.triton_ops.row_gather import gather_parts_into_triton
from edgemoe.moe.pinning import CudaRegistrar, uva_view

WIDTHS = (2 * 768 * 2048, 2048 * 768)  # gate/up and down of one fp8 expert, in bytes
POOL, SLOTS, LIST, REPS = 40, 8, 16, 30
HUGE = 2 << 20
GRIDS = [(32, 2048, 4), (64, 2048, 4), (132, 2048, 4), (528, 2048, 4), (32, 8192, 8), (32, 16384, 8),
         (64, 16384, 8), (132, 16384, 8), (16, 32768, 16), (32, 32768, 16)]  # (programs, block, warps)


def shell(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"({e})"


def topology() -> dict:
    bus = shell("nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader").lower()[-12:]
    return {
        "nvidia_smi_topo": shell("nvidia-smi topo -m"),
        "gpu_numa_node": shell(f"cat /sys/bus/pci/devices/{bus}/numa_node"),
        "gpu_link": shell(f"cat /sys/bus/pci/devices/{bus}/current_link_speed /sys/bus/pci/devices/{bus}/current_link_width"),
        "lscpu": shell("lscpu | grep -i -E 'model name|socket|numa|thread|core'"),
        "thp": shell("cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag"),
        "iommu_groups": len(glob.glob("/sys/kernel/iommu_groups/*")),
        "cmdline": shell("cat /proc/cmdline"),
        "hypervisor": shell("grep -m1 -o hypervisor /proc/cpuinfo; systemd-detect-virt 2>/dev/null"),
    }


def numa_nodes() -> dict[int, set[int]]:
    nodes = {}
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*")):
        cpus = set()
        for part in open(f"{path}/cpulist").read().strip().split(","):
            if part:
                lo, _, hi = part.partition("-")
                cpus.update(range(int(lo), int(hi or lo) + 1))
        if cpus:
            nodes[int(path.rsplit("node", 1)[1])] = cpus
    return nodes or {0: set(os.sched_getaffinity(0))}


def anon_huge_kb() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


class Registered:
    """A host tensor of `nbytes` in an anonymous mapping, huge pages advised or refused,
    first-touched here, then page-locked in place."""

    def __init__(self, nbytes: int, huge: bool, registrar: CudaRegistrar) -> None:
        self.map = mmap.mmap(-1, nbytes + HUGE)
        self.map.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
        whole = torch.frombuffer(self.map, dtype=torch.uint8)
        skip = (-whole.data_ptr()) % HUGE
        self.tensor = whole[skip:skip + nbytes]
        self.tensor.copy_(torch.randint(0, 255, (nbytes,), dtype=torch.uint8))
        self.registrar = registrar
        registrar.register(self.tensor.data_ptr(), nbytes)

    def close(self) -> None:
        self.registrar.unregister(self.tensor.data_ptr())


def movers(hosts: list[torch.Tensor], device: torch.device) -> list[dict]:
    """The copy engine and the gather's grids over one pool, one expert a call."""
    tables = [uva_view(h, device) for h in hosts]
    outs = [torch.empty(SLOTS, w, dtype=torch.uint8, device=device) for w in WIDTHS]
    lists = []
    for r in range(REPS + 1):
        ids, dst = (torch.full((LIST,), -1, dtype=torch.int32) for _ in range(2))
        ids[0], dst[0] = r % POOL, r % SLOTS
        lists.append((ids.to(device), dst.to(device)))

    def engine(r: int) -> None:
        for host, out in zip(hosts, outs, strict=True):
            out[r % SLOTS].copy_(host[r % POOL], non_blocking=True)

    def gather(grid):  # noqa: ANN001, ANN202
        return lambda r: gather_parts_into_triton(tables, lists[r][0], outs, lists[r][1], programs=grid[0],
                                                  block=grid[1], num_warps=grid[2])

    rows = [{"mover": "copy engine", "us": eager_us(engine, REPS)}]
    rows += [{"mover": "gather", "grid": list(g), "us": eager_us(gather(g), REPS)} for g in GRIDS]
    assert all(torch.equal(o[REPS % SLOTS].cpu(), h[REPS % POOL]) for o, h in zip(outs, hosts, strict=True))
    for row in rows:
        row["us"] = round(row["us"], 1)
        row["gb_s"] = round(sum(WIDTHS) / row["us"] / 1000, 1)
    return rows


def pool(kind: str, registrar: CudaRegistrar) -> tuple[list[torch.Tensor], list[Registered]]:
    if kind == "pin_memory":
        return [torch.randint(0, 255, (POOL, w), dtype=torch.uint8).pin_memory() for w in WIDTHS], []
    held = [Registered(POOL * w, kind == "registered THP", registrar) for w in WIDTHS]
    return [r.tensor.view(POOL, w) for r, w in zip(held, WIDTHS, strict=True)], held


def main() -> None:
    device = torch.device("cuda", 0)
    torch.cuda.init()
    registrar = CudaRegistrar(device)
    report = {"device": torch.cuda.get_device_name(), "topology": topology(), "runs": []}
    print(json.dumps(report["topology"], indent=1), flush=True)
    everyone = os.sched_getaffinity(0)
    for node, cpus in numa_nodes().items():
        os.sched_setaffinity(0, cpus & everyone or everyone)
        for kind in ("pin_memory", "registered 4K", "registered THP"):
            before = anon_huge_kb()
            hosts, held = pool(kind, registrar)
            huge_mb = (anon_huge_kb() - before) / 1024
            for row in movers(hosts, device):
                row.update(node=node, pool=kind, anon_huge_mb=round(huge_mb))
                report["runs"].append(row)
                print(row, flush=True)
            for r in held:
                r.close()
    os.sched_setaffinity(0, everyone)
    path = os.path.join(os.environ.get("OUT", "bench/results"), "host-read-probe.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
