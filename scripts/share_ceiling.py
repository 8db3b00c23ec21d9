"""What the hybrid backend's CPU share can reach against issue 13's decode bound, on the
CPU alone: a synthetic-routing decode trace (`moe/synthetic_routing.py`, the published
Qwen3-30B-A3B statistics) replayed at the scenario's slot count through the engine's LRU
and through LRU with the share's rule at each quota level (`moe/replay.py`,
`replay_share`: the coldest misses computed on the CPU and never loaded), and for each the
step time no overlap can beat — the longest of the link's copies, the CPU's reads and the
host's reads — as a ratio to the bound (93.8 GB/s over the LRU replay's missed bytes).
`--pick farthest`: the CPU takes the misses whose next use is farthest (future knowledge)
instead of the coldest: what any prediction of reuse could reach with this admission rule;
`--heat-shift N`: the coldest by a heat that decays 1/2**N an access (30: popularity).

    PYTHONPATH=src python3 scripts/share_ceiling.py [--slots 1213 --tokens 1200 --cpu-gbps 80 --link-gbps 52.6]
        [--pick heat|farthest] [--heat-shift 3]
"""

from __future__ import annotations

import argparse

from edgemoe.moe.quota_levels import QUARTERS, quota_rows
from edgemoe.moe.replay import replay_share, warmup_accesses
from edgemoe.moe.routing_spec import RoutingSpec
from edgemoe.moe.routing_trace import Access
from edgemoe.moe.synthetic_routing import RoutingProcess, calibrate

LAYERS, EXPERTS, TOP_K = 48, 128, 8  # Qwen3-30B-A3B
EXPERT_MB = 9.437  # bf16: 3 x 2048 x 768 x 2 bytes
HOST_GBPS, LINK_GBPS = 93.8, 52.6  # issue 13's bound: the host's read rate, the pinned copy rate


def trace(tokens: int, seed: int) -> list[Access]:
    process = RoutingProcess(LAYERS, EXPERTS, TOP_K, calibrate(RoutingSpec(seed=seed), LAYERS, EXPERTS, TOP_K), seed)
    ids = process.tokens(process.stream(), tokens)
    return [Access(layer, tuple(int(e) for e in ids[t, layer])) for t in range(tokens) for layer in range(LAYERS)]


def add_layer_model_args(ap: argparse.ArgumentParser, host_gbps: float) -> None:
    """The layer-by-layer step models' inputs (`share_layer_model.py`, `split_miss_model.py`):
    issue 13's bf16 scenario as the GPU machine profiled it by default; `host_gbps` the host
    memory's read rate, the copies and the CPU together, in a layer's miss window (0: no limit)."""
    ap.add_argument("--slots", type=int, default=1213, help="the plan's slots (bf16, 16 GiB, 8K KV)")
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--copy-us", type=float, default=184.0, help="a copied expert's time in the step (µs)")
    ap.add_argument("--cpu-us", type=float, default=92.0, help="a CPU expert's time in its layer's call (µs)")
    ap.add_argument("--fixed-us", type=float, default=25.0, help="a CPU call's own time: the bell, the wake-up (µs)")
    ap.add_argument("--chain-us", type=float, default=108.0, help="a layer's other kernels and gaps (µs)")
    ap.add_argument("--host-gbps", type=float, default=host_gbps,
                    help="the host memory's read rate, the copies and the CPU together (2026-12-02: 122; 0: no limit)")
    ap.add_argument("--expert-mb", type=float, default=EXPERT_MB, help="an expert's bytes (MB; bf16 Qwen3-30B-A3B)")


def per_token(count: int, accesses: int) -> float:
    return count * LAYERS / accesses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=1213, help="the plan's slots (16 GiB, 8K KV, with the loan)")
    ap.add_argument("--tokens", type=int, default=1200)
    ap.add_argument("--cpu-gbps", type=float, default=80.0, help="the CPU share's rate (bench bw: bf16, 8 experts a call)")
    ap.add_argument("--link-gbps", type=float, default=LINK_GBPS,
                    help="the copies' rate (52.6 alone; ~35 measured beside the step's compute, 2026-12-02)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pick", choices=["heat", "farthest"], default="heat",
                    help="the CPU's misses: the coldest (the engine's rule) or the farthest next use (an oracle)")
    ap.add_argument("--heat-shift", type=int, default=None,
                    help="the heat's decay, 1/2**shift an access (the engine's 3 by default; 30: popularity)")
    args = ap.parse_args()
    accesses = trace(args.tokens, args.seed)
    shares = {level: replay_share(accesses, args.slots, LAYERS, EXPERTS, quota_rows(level, LAYERS), pick=args.pick,
                                  heat_shift=args.heat_shift)
              for level in range(0, 3 * QUARTERS + 1, 2)}
    lru = shares[0]  # quota 0: the policy itself (tests/moe/test_replay.py)
    after = len(accesses) - warmup_accesses(accesses, args.slots)  # the layer accesses the replays count
    bound_misses = per_token(lru.misses, after)
    bound = HOST_GBPS / (bound_misses * EXPERT_MB / 1e3)
    print(f"{args.slots} slots, {args.tokens} tokens: LRU {bound_misses:.1f} misses a token (hit {lru.hit_rate:.3f}); "
          f"bound {bound:.1f} tok/s; the CPU's pick: {args.pick}")
    print(f"{'quota':>5} {'misses':>7} {'CPU':>6} {'copies':>7} {'link ms':>7} {'CPU ms':>7} {'host ms':>7} "
          f"{'ceiling tok/s':>13} {'of bound':>8}")
    for level, share in shares.items():
        misses = per_token(share.misses, after)
        cpu = per_token(share.cpu, after)
        link_ms = (misses - cpu) * EXPERT_MB / args.link_gbps
        cpu_ms = cpu * EXPERT_MB / args.cpu_gbps
        host_ms = misses * EXPERT_MB / HOST_GBPS
        ceiling = 1e3 / max(link_ms, cpu_ms, host_ms)
        print(f"{level / QUARTERS:5.2f} {misses:7.1f} {cpu:6.1f} {misses - cpu:7.1f} {link_ms:7.2f} {cpu_ms:7.2f} "
              f"{host_ms:7.2f} {ceiling:13.1f} {ceiling / bound:8.2f}")


if __name__ == "__main__":
    main()
