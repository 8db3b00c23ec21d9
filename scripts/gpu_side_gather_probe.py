"""Decode prefetch's side gather alone, at fp8's expert shape: µs a copied expert by grid.

An fp8 Qwen3-30B-A3B expert is two byte tables (gate/up 3 MB, down 1.5 MB; 4.72 MB with its
scales). `_gather_parts_into` copies a work item (`block` columns) with a load and then a
store, so a program has one item in flight: 2 KB at the default block of 2,048 bytes, and 32
programs hold 64 KB, ~35 GB/s at a mapped read's ~1.8 µs (docs/benchmarks.md, "Why 32
programs copy fp8 at ~35 GB/s"). This times one miss a call (a decode layer's ~1.1) per
(programs, block, warps), against the copy engine's async copy of the same bytes, experts
rotating through a pool larger than L2. Seconds, no engine. Writes $OUT/side-gather-probe.json.

    run(command="source scripts/gpu_env.sh; python3 scripts/gpu_side_gather_probe.py", carry=[".whl"])
"""

from __future__ import annotations

import json
import os

import torch

from edgemoe.bench.cuda_timing import eager_us
from edgemoe.kernels.triton_ops.row_gather import gather_parts_into_triton
from edgemoe.moe.pinning import uva_view

WIDTHS = (2 * 768 * 2048, 2048 * 768)  # gate/up and down of one fp8 expert, in bytes
POOL, SLOTS, LIST, REPS = 40, 8, 16, 30
GRIDS = [(32, 2048, 4), (64, 2048, 4), (132, 2048, 4), (32, 8192, 8), (32, 16384, 8), (64, 16384, 8),
         (32, 32768, 16), (16, 32768, 16), (528, 2048, 4)]


def main() -> None:
    device = torch.device("cuda")
    hosts = [torch.randint(0, 255, (POOL, w), dtype=torch.uint8).pin_memory() for w in WIDTHS]
    tables = [uva_view(h, device) for h in hosts]
    outs = [torch.empty(SLOTS, w, dtype=torch.uint8, device=device) for w in WIDTHS]
    lists = []  # per call: a fixed-size miss list, -1 padded (as the device cache writes it)
    for r in range(REPS + 1):
        ids, dst = (torch.full((LIST,), -1, dtype=torch.int32) for _ in range(2))
        ids[0], dst[0] = r % POOL, r % SLOTS
        lists.append((ids.to(device), dst.to(device)))
    expert_bytes = sum(WIDTHS)

    def gather(grid):  # noqa: ANN001, ANN202
        programs, block, warps = grid

        def call(r: int) -> None:
            gather_parts_into_triton(tables, lists[r][0], outs, lists[r][1], programs=programs, block=block,
                                     num_warps=warps)
        return call

    def engine(r: int) -> None:
        for host, out in zip(hosts, outs, strict=True):
            out[r % SLOTS].copy_(host[r % POOL], non_blocking=True)

    rows = [{"mover": "copy engine", "us": round(eager_us(engine, REPS), 1)}]
    for grid in GRIDS:
        us = eager_us(gather(grid), REPS)
        rows.append({"mover": "side gather", "programs": grid[0], "block": grid[1], "warps": grid[2],
                     "item_kb": grid[1] / 1024, "us": round(us, 1)})
    for row in rows:
        row["gb_s"] = round(expert_bytes / row["us"] / 1000, 1)
        print(row, flush=True)
    # Every timed run ends with call REPS: its slot holds that expert, bitwise (the last grid's copy).
    assert all(torch.equal(o[REPS % SLOTS].cpu(), h[REPS % POOL]) for o, h in zip(outs, hosts, strict=True))
    path = os.path.join(os.environ.get("OUT", "bench/results"), "side-gather-probe.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "expert_bytes": expert_bytes, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
