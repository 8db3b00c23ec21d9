"""Decode-step tuning on the GPU machine, one process:

1. where a graph-replayed decode step's time goes, kernel by kernel (torch.profiler
   over replays of a 4-layer slice of random:qwen3-30b-a3b, per layer and per step);
2. `moe_decode` tile configurations at the Qwen3-30B-A3B shape (T = 1, 8), in graphs;
3. `decode_attention` at 1K and 32K context, batch 1, in graphs.

    PYTHONPATH=/tmp/site:src python3 scripts/gpu_decode_tuning.py   (after gpu_tests.sh installed the wheels)
Prints tables; writes $OUT/decode_tuning.json.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import torch

from edgemoe.bench.cuda_timing import graph_us


def step_kernels(layers: int = 4) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    from edgemoe import LLM, SamplingParams

    with LLM(model=f"random:qwen3-30b-a3b?num_hidden_layers={layers}", moe_backend="resident") as llm:
        engine = llm.engine
        engine.add_request(list(range(1000, 2024)), SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        for _ in range(5):
            engine.step()
        steps = 20
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                engine.step()
            torch.cuda.synchronize()
    by_kernel: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        if e.device_time_total > 0:
            by_kernel[e.key[:70]] += e.device_time_total / steps  # µs per step
    return dict(sorted(by_kernel.items(), key=lambda kv: -kv[1]))


def moe_configs() -> list[dict]:
    from edgemoe.kernels.moe_fused import moe_decode

    H, I, E, K = 2048, 768, 128, 8
    gu = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16) * 0.02
    dn = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16) * 0.02
    rows = []
    configs = ["16,256,4,16,256,4", "8,512,4,8,512,4", "32,256,8,32,256,8", "16,512,8,16,256,4",
               "8,256,2,8,256,2", "4,1024,4,8,512,4", "16,128,4,16,128,4", "32,128,4,16,256,4"]
    for T in (1, 8):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        ids = torch.stack([torch.randperm(E, device="cuda")[:K] for _ in range(T)]).int()
        w = torch.rand(T, K, device="cuda")
        cells = torch.empty(T, K, H, device="cuda")
        for cfg in configs:
            os.environ["EDGEMOE_MOE_GEMV_TILES"] = cfg
            us = graph_us([lambda: moe_decode(x, ids, w, gu, dn, cells, "silu")], replays=50)  # noqa: B023
            gbs = T * K * 3 * H * I * 2 / us / 1e3 if T == 1 else len(set(ids.flatten().tolist())) * 3 * H * I * 2 / us / 1e3
            rows.append({"T": T, "tiles": cfg, "us": us, "GB/s": gbs})
    os.environ.pop("EDGEMOE_MOE_GEMV_TILES", None)
    return rows


def attention_times() -> list[dict]:
    from edgemoe.kernels.paged_attention import decode_attention

    rows = []
    for ctx in (1024, 8192, 32768):
        P, Hq, Hkv, D = 16, 32, 4, 128
        pages = ctx // P + 1
        k = torch.randn(pages * P, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        table = torch.arange(pages, device="cuda", dtype=torch.int32)[None]
        rows_ = torch.zeros(1, dtype=torch.int32, device="cuda")
        lens = torch.tensor([ctx], dtype=torch.int32, device="cuda")
        q = torch.randn(1, Hq, D, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q)
        us = graph_us([lambda: decode_attention(q, k, v, table, rows_, lens, P, D**-0.5, None, out)], replays=50)  # noqa: B023
        rows.append({"ctx": ctx, "us": us, "GB/s": ctx * Hkv * D * 4 / us / 1e3})
    return rows


def main() -> None:
    out = {"step_kernels_us": step_kernels()}
    print("graph decode step, 4 layers of random:qwen3-30b-a3b, µs per step by kernel:")
    total = sum(out["step_kernels_us"].values())
    for name, us in list(out["step_kernels_us"].items())[:30]:
        print(f"  {us:8.1f}  {name}")
    print(f"  total {total:.1f} µs per step = {total / 4:.1f} per layer")
    out["moe_decode"] = moe_configs()
    for r in out["moe_decode"]:
        print(f"moe_decode T={r['T']} tiles {r['tiles']:>20}: {r['us']:7.1f} µs  {r['GB/s']:7.0f} GB/s")
    out["decode_attention"] = attention_times()
    for r in out["decode_attention"]:
        print(f"decode_attention ctx {r['ctx']:6d}: {r['us']:6.1f} µs  {r['GB/s']:6.0f} GB/s")
    Path(os.environ.get("OUT", "/tmp"), "decode_tuning.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
