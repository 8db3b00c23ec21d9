"""Would copying some of the CPU share's misses into the cache anyway pay? On the CPU alone.

The share computes a layer's coldest misses on the CPU and never loads them (an admission
filter): at 13/16 of each layer's misses the cache admits ~38 experts a token and misses
172, where plain LRU misses 102 (`bench decode`'s replays). The question: copy the hottest
of the CPU's picks into the cache in the background, one every `--every` layers, the copy
running on the link while the chain runs and spilling into the next layer — fewer misses
later for more copies now?

Each layer of synthetic routing's trace (`moe/synthetic_routing.py`, at the scenario's
slots, plain LRU in a pool of its own: `replay_share`'s `SlotCache` can neither admit an
expert outside an access nor evict by heat) is charged the latest of its CPU call (`fixed + k·cpu`), its link (its
own copies and the admission's spill) and the host's memory (every expert read by either,
at `--host-gbps`: the copies and the CPU draw on one memory, 122 GB/s together on the GPU
machine, 2026-12-02), plus `--chain-us`; the fraction of each layer's misses on the CPU is
searched per setting. `--evict heat` evicts the coldest by the share's heat instead of the
least recent (another question of the same kind).

    PYTHONPATH=src python3 scripts/share_admission_model.py [--every 0 1 2 4] [--chain-us 60] [--evict lru|heat]
"""

from __future__ import annotations

import argparse
import collections

from share_ceiling import EXPERTS, EXPERT_MB, LAYERS, trace

from edgemoe.kernels.share_split import decode_take
from edgemoe.kernels.share_state import FRACTION_ONE, HEAT_SHIFT
from edgemoe.moe.cpu_share import HEAT_UNIT
from edgemoe.moe.replay import warmup_accesses

Key = tuple[int, int]


class Pool:
    """A plain slot pool: `evict` "lru" (least recent) or "heat" (coldest by `heat`, then least recent)."""

    def __init__(self, slots: int, evict: str, heat: list[list[int]]) -> None:
        self.slots, self.evict, self.heat = slots, evict, heat
        self.order: collections.OrderedDict[Key, int] = collections.OrderedDict()
        self.clock = 0

    def touch(self, key: Key) -> None:
        self.clock += 1
        self.order[key] = self.clock
        self.order.move_to_end(key)

    def load(self, key: Key, protect: set[Key]) -> None:
        while len(self.order) >= self.slots:
            del self.order[self._victim(protect)]
        self.touch(key)

    def _victim(self, protect: set[Key]) -> Key:
        keys = (k for k in self.order if k not in protect)
        if self.evict == "lru":
            return next(keys)
        return min(keys, key=lambda k: (self.heat[k[0]][k[1]], self.order[k]))


def step_ms(accesses, args: argparse.Namespace, fraction: int, every: int) -> tuple[float, float, float, float]:  # noqa: ANN001
    """(ms a token, misses, CPU experts, admissions a token)."""
    heat = [[0] * EXPERTS for _ in range(LAYERS)]
    pool = Pool(args.slots, args.evict, heat)
    host_us = EXPERT_MB / args.host_gbps * 1e3  # an expert read by either side, at the host's shared rate
    warm = warmup_accesses(accesses, args.slots)
    total, pending = [0.0, 0, 0, 0, 0], 0.0
    for i, (layer, experts) in enumerate(accesses):
        routed = list(dict.fromkeys(experts))
        missed = [e for e in routed if (layer, e) not in pool.order]
        k = decode_take(len(missed), len(missed), fraction)
        cold = sorted(missed, key=lambda e: (heat[layer][e], -e))[:k]
        protect = {(layer, e) for e in routed}
        for e in routed:
            if (layer, e) in pool.order:
                pool.touch((layer, e))
            elif e not in cold:
                pool.load((layer, e), protect)
        spill = max(0.0, pending - args.chain_us)  # the last admission's link time the chain didn't cover
        copies = len(missed) - k
        cpu_us = args.fixed_us + k * args.cpu_us if k else 0.0
        link_us = copies * args.copy_us + spill
        layer_us = max(cpu_us, link_us, (k + copies) * host_us + spill / args.copy_us * host_us) + args.chain_us
        row = heat[layer]
        for e in range(EXPERTS):
            row[e] -= row[e] >> HEAT_SHIFT
        for e in routed:
            row[e] += HEAT_UNIT
        admitted = 0
        if every and layer % every == 0 and cold:
            pool.load((layer, max(cold, key=lambda e: (heat[layer][e], -e))), protect)
            admitted = 1
        pending = admitted * args.copy_us
        if i >= warm:
            for j, v in enumerate((layer_us, len(missed), k, admitted, 1)):
                total[j] += v
    per_token = LAYERS / total[4]
    return total[0] * per_token / 1e3, total[1] * per_token, total[2] * per_token, total[3] * per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=1213)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, nargs="+", default=[0, 1, 2, 4], help="an admission every N layers (0: none)")
    ap.add_argument("--fractions", type=int, nargs="+", default=[6, 8, 10, 12, 13, 14])
    ap.add_argument("--copy-us", type=float, default=184.0)
    ap.add_argument("--cpu-us", type=float, default=92.0)
    ap.add_argument("--fixed-us", type=float, default=25.0)
    ap.add_argument("--chain-us", type=float, default=60.0)
    ap.add_argument("--host-gbps", type=float, default=122.0)
    ap.add_argument("--evict", choices=["lru", "heat"], default="lru")
    args = ap.parse_args()
    accesses = trace(args.tokens, args.seed)
    print(f"{args.slots} slots, {args.tokens} tokens, eviction by {args.evict}, chain {args.chain_us:g} µs, "
          f"host {args.host_gbps:g} GB/s shared")
    for every in args.every:
        rows = [(*step_ms(accesses, args, f, every), f) for f in args.fractions if f <= FRACTION_ONE]
        ms, misses, cpu, admitted, f = min(rows)
        print(f"admit every {every or '-'}: best {f}/16 {ms:.2f} ms ({1e3 / ms:.1f} tok/s), misses {misses:.1f} "
              f"(CPU {cpu:.1f}), admissions {admitted:.1f} a token | "
              + " ".join(f"{r[4]}/16 {r[0]:.1f}" for r in rows))


if __name__ == "__main__":
    main()
