"""How fast missed experts reach their slots over PCIe, and whether the CPU's reads add up.

1. The device cache's miss gather (`gather_rows_into_triton`: SMs read the mapped pinned
   store) over its grid and tiles (programs per SM x block x warps), against the copy
   engine (one async copy per expert and part), for lists of 3 and 8 misses at the
   Qwen3-30B-A3B expert shape (9.44 MB in bf16).
2. Each mover beside the CPU expert kernel (a layer's 8 experts at one token per call, on
   every core but one, in a thread): GB/s of each alone and together. Issue 13's copy +
   CPU bound assumes min(copy + CPU, host read); this measures what the host gives.

Experts rotate through a pool larger than L2, so no read is served from a cache.
Writes $OUT/gather-sweep.json. `SWEEP_PPS`, `SWEEP_BLOCKS`, `SWEEP_WARPS` (space-separated)
replace the grid. Through the device tool:
  run(command="source scripts/gpu_env.sh; python3 scripts/gpu_gather_sweep.py", carry=[".whl"])
"""

from __future__ import annotations

import json
import os
import threading
import time

import torch
import torch.nn.functional as F

from edgemoe.bench.bandwidth import unique_pages
from edgemoe.kernels import cpu_isa
from edgemoe.kernels.cpu_experts import moe_experts_partial_cpu
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.kernels.triton_ops.row_gather import gather_rows_into_triton
from edgemoe.moe.pinning import uva_view

H, I = 2048, 768
POOL = 96  # experts in the host pool (906 MB: far more than L2)
SLOTS = 16
LIST = 16  # the fixed-size miss list, -1 padded (as the device cache writes it)
REPS = 24


def ints(name: str, default: str) -> list[int]:
    return [int(v) for v in os.environ.get(name, default).split()]


def host_banks() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (unique_pages((POOL, 2 * I, H), g).pin_memory(), unique_pages((POOL, H, I), g).pin_memory())


def as_rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).view(torch.int32)


class Movers:
    """The two movers over the same pinned pool and slot banks."""

    def __init__(self, banks: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
        self.host = banks
        self.tables = [uva_view(as_rows(b), device) for b in banks]
        self.slots = [torch.empty((SLOTS, *b.shape[1:]), dtype=b.dtype, device=device) for b in banks]
        self.dest = [as_rows(s) for s in self.slots]
        self.expert_bytes = sum(b[0].numel() * b.element_size() for b in banks)

    def lists(self, misses: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Miss lists rotating through the pool: (expert ids, slots), -1 padded."""
        out = []
        for r in range(POOL):
            ids = torch.full((LIST,), -1, dtype=torch.int64)
            ids[:misses] = torch.tensor([(r * misses + j) % POOL for j in range(misses)])
            slots = torch.arange(LIST, dtype=torch.int64) % SLOTS
            out.append((ids.to(device), slots.to(device)))
        return out

    def gather(self, ids: torch.Tensor, slots: torch.Tensor, programs: int, block: int, warps: int) -> None:
        for table, dest in zip(self.tables, self.dest, strict=True):
            gather_rows_into_triton(table, ids, dest, slots, programs=programs, block=block, num_warps=warps)

    def copy_engine(self, experts: list[int]) -> None:
        for j, e in enumerate(experts):
            for host, slot in zip(self.host, self.slots, strict=True):
                slot[j % SLOTS].copy_(host[e], non_blocking=True)


def gpu_rate(step, reps: int, nbytes: int) -> float:
    """GB/s of `step(i)` over `reps` calls, CUDA events around them."""
    step(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(reps):
        step(i + 1)
    end.record()
    end.synchronize()
    return reps * nbytes / (start.elapsed_time(end) / 1e3) / 1e9


class CpuLoad:
    """The CPU expert kernel in a thread: a layer's 8 experts at one token per call, from a
    pool of its own (the same host memory the movers read), until stopped."""

    def __init__(self, threads: int) -> None:
        g = torch.Generator().manual_seed(3)
        self.banks = (unique_pages((64, 2 * I, H), g), unique_pages((64, H, I), g))
        self.kernel = CpuExperts(threads=threads)
        self.x = torch.randn(1, H).bfloat16()
        self.w = torch.ones(1, 8)
        self.out = torch.zeros(1, 8, H)
        self.bytes, self.seconds, self._stop = 0, 0.0, threading.Event()

    def call(self, i: int) -> None:
        experts = [(8 * i + j) % 64 for j in range(8)]
        ids = torch.tensor(experts).view(1, 8)
        moe_experts_partial_cpu(self.x, ids, self.w, experts, experts, *self.banks, F.silu, self.out, self.kernel)

    def run_for(self, seconds: float) -> float:
        """GB/s alone over `seconds`."""
        self.bytes, t0, i = 0, time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            self.call(i)
            i += 1
        return i * 8 * 3 * H * I * 2 / (time.perf_counter() - t0) / 1e9

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        t0, i = time.perf_counter(), 0
        while not self._stop.is_set():
            self.call(i)
            i += 1
        self.seconds, self.bytes = time.perf_counter() - t0, i * 8 * 3 * H * I * 2

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.bytes / self.seconds / 1e9


def sweep(movers: Movers, device: torch.device, sms: int) -> list[dict]:
    rows = []
    for misses in (3, 8):
        lists = movers.lists(misses, device)
        nbytes = misses * movers.expert_bytes
        for pps in ints("SWEEP_PPS", "1 2 4 8"):
            for block in ints("SWEEP_BLOCKS", "1024 2048 4096 8192"):
                for warps in ints("SWEEP_WARPS", "4 8 16"):
                    def step(i: int) -> None:
                        movers.gather(*lists[i % POOL], programs=pps * sms, block=block, warps=warps)
                    gb_s = gpu_rate(step, REPS, nbytes)
                    rows.append({"mover": "gather", "misses": misses, "programs_per_sm": pps, "block": block,
                                 "warps": warps, "gb_s": round(gb_s, 2)})
                    print(rows[-1], flush=True)
        gb_s = gpu_rate(lambda i: movers.copy_engine([(i * misses + j) % POOL for j in range(misses)]), REPS, nbytes)
        rows.append({"mover": "copy", "misses": misses, "gb_s": round(gb_s, 2)})
        print(rows[-1], flush=True)
    return rows


def together(movers: Movers, device: torch.device, best: dict, sms: int, threads: int) -> dict:
    """Each mover for ~3 s with and without the CPU load; the CPU's rate alone and beside each."""
    load = CpuLoad(threads)
    out = {"cpu_threads": threads, "cpu_kernel": load.kernel.name, "cpu_alone_gb_s": round(load.run_for(3.0), 2)}
    lists = movers.lists(8, device)
    nbytes = 8 * movers.expert_bytes
    kinds = {
        "gather": lambda i: movers.gather(*lists[i % POOL], programs=best["programs_per_sm"] * sms,
                                          block=best["block"], warps=best["warps"]),
        "copy": lambda i: movers.copy_engine([(i * 8 + j) % POOL for j in range(8)]),
    }
    for name, step in kinds.items():
        reps = max(8, int(3.0 * 50e9 / nbytes))  # ~3 s at 50 GB/s
        out[f"{name}_alone_gb_s"] = round(gpu_rate(step, reps, nbytes), 2)
        load.start()
        moved = gpu_rate(step, reps, nbytes)
        cpu = load.stop()
        out[f"{name}_with_cpu_gb_s"] = round(moved, 2)
        out[f"cpu_with_{name}_gb_s"] = round(cpu, 2)
        out[f"{name}_plus_cpu_gb_s"] = round(moved + cpu, 2)
        print(out, flush=True)
    load.kernel.close()
    return out


def main() -> None:
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    movers = Movers(host_banks(), device)
    rows = sweep(movers, device, sms)
    gathers = [r for r in rows if r["mover"] == "gather" and r["misses"] == 8]
    best = max(gathers, key=lambda r: r["gb_s"])
    threads = max(1, cpu_isa.physical_cores() - 1)  # every core but the one driving the GPU
    result = {"device": torch.cuda.get_device_name(device), "sms": sms, "expert_bytes": movers.expert_bytes,
              "sweep": rows, "best_gather": best, "together": together(movers, device, best, sms, threads)}
    out = os.environ.get("OUT", "bench/results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gather-sweep.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("best gather (8 misses):", best, "\ntogether:", result["together"])


if __name__ == "__main__":
    main()
