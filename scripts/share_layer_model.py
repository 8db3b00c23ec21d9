"""What the hybrid backend's decode step takes layer by layer, under each rule for how many
of a layer's misses the CPU computes — on the CPU alone, before any GPU time.

A decode layer waits for the later of its CPU call and its copies: `max(fixed + k·cpu,
(m − k)·copy)` for a layer that missed m experts and gave the CPU k of them, and for the
host memory that both read from: `m · bytes / host` with `--host-gbps` (default 0: the two
sides independent, the rule the figures quoted in docs/benchmarks.md used), plus the
layer's other work (`chain`: attention, dense GEMVs, the router, the plan, the share's
launches and the gaps between them). `scripts/share_ceiling.py` sums each side over the
whole step (a bound no overlap beats); here each layer pays its own maximum, which is what
a step does: a layer that missed few experts leaves the link idle while the CPU works, one
that missed many the CPU idle while the link copies. The trace is synthetic routing's
(`moe/synthetic_routing.py`, the published Qwen3-30B-A3B statistics) at the scenario's
slots, replayed through the engine's LRU with the share's admission rule
(`moe/replay.py`, `replay_share`), once per level of each rule:

- `count`: the same number of CPU experts in every layer, `level` quarters of an expert a
  layer on average (`moe/quota_levels.quota_rows`; the live share before 2026-12-04);
- `fraction`: `level` sixteenths of each layer's own misses, rounded half up
  (`kernels/share_split.decode_take`; the live share's default since).

`--parts N` views each expert as N experts of 1/N of its channels (the routing's pick of e
is a pick of all N parts, each part a slot of its own and 1/N of the times and bytes): the
share's rules at a finer grain, still never loading its picks (2026-12-06, fp8's flags below and
`--host-gbps 122 --expert-mb 4.72 --chain-us 73`: the best fraction 7.68 ms at whole experts, 7.53
at halves, 7.37 at quarters — the split's gain in
`scripts/split_miss_model.py` is the loading of the CPU's part afterwards, not the grain).

The defaults are issue 13's bf16 scenario as the GPU machine profiled it (2026-12-04,
`kernel-profile-…-quotas-2,1…`: 10.47 ms of gather for ~53 copies a token, 182 µs a CPU
call of ~1.9 experts, ~83 µs of other kernels and ~25 µs of gaps a layer); the model's
count-2 step, 18.4 ms, is the live run's 18.4–19.0. fp8 at its 2,426 slots:
`--slots 2426 --copy-us 92 --cpu-us 55`.

    PYTHONPATH=src python3 scripts/share_layer_model.py [--slots 1213 --tokens 600 --copy-us 184 --cpu-us 92
        --fixed-us 25 --chain-us 108 --host-gbps 0 --parts 1]
"""

from __future__ import annotations

import argparse

from share_ceiling import EXPERTS, LAYERS, add_layer_model_args, trace

from edgemoe.moe.quota_levels import COUNT, FRACTION, LevelScale
from edgemoe.moe.replay import replay_share
from edgemoe.moe.routing_trace import Access


def in_parts(accesses: list[Access], parts: int) -> list[Access]:
    """Each routed expert e as its `parts` channel parts, experts e·parts … e·parts + parts − 1."""
    if parts == 1:
        return accesses
    return [Access(a.layer, tuple(e * parts + p for e in a.experts for p in range(parts))) for a in accesses]


def step_ms(accesses, slots: int, scale: LevelScale, level: int,  # noqa: ANN001
            args: argparse.Namespace) -> tuple[float, float, float]:
    """(ms a token, misses a token, CPU experts a token) at `level` of `scale`."""
    layer_us, counted = [0.0, 0.0, 0.0], [0]

    def observe(layer: int, misses: int, cpu: int) -> None:  # noqa: ARG001 - every layer alike
        n = args.parts
        cpu_us = args.fixed_us + cpu * args.cpu_us / n if cpu else 0.0
        host_us = misses * args.expert_mb / n / args.host_gbps * 1e3 if args.host_gbps else 0.0
        layer_us[0] += max(cpu_us, (misses - cpu) * args.copy_us / n, host_us) + args.chain_us
        layer_us[1] += misses
        layer_us[2] += cpu
        counted[0] += 1

    experts = EXPERTS * args.parts
    replay_share(accesses, slots, LAYERS, experts, scale.rows(level, LAYERS, experts), fraction=scale.fraction(level),
                 observe=observe)
    per_token = LAYERS / counted[0]
    return layer_us[0] * per_token / 1e3, layer_us[1] * per_token, layer_us[2] * per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_layer_model_args(ap, host_gbps=0.0)
    ap.add_argument("--parts", type=int, default=1, help="each expert as this many channel parts, slots and misses in parts")
    args = ap.parse_args()
    if args.parts < 1:
        ap.error("--parts must be at least 1")
    accesses = in_parts(trace(args.tokens, args.seed), args.parts)
    print(f"{args.slots} slots, {args.tokens} tokens: a copy {args.copy_us:g} µs, a CPU expert {args.cpu_us:g} µs "
          f"+ {args.fixed_us:g} a call, {args.chain_us:g} µs a layer besides, host memory "
          f"{args.host_gbps or 'unlimited'} GB/s" + (f"; experts in {args.parts} parts (misses in parts)" if args.parts > 1 else ""))
    print(f"{'rule':>8} {'level':>36} {'step ms':>8} {'tok/s':>6} {'misses':>7} {'CPU':>6}")
    best = {}
    for scale, levels in ((COUNT, range(0, 4 * 4 + 1, 2)), (FRACTION, range(0, 17, 2))):
        for level in levels:
            ms, misses, cpu = step_ms(accesses, args.slots * args.parts, scale, level, args)
            best[scale.name] = min(best.get(scale.name, ms), ms)
            print(f"{scale.name:>8} {scale.describe(level):>36} {ms:8.2f} {1e3 / ms:6.1f} {misses:7.1f} {cpu:6.1f}")
    print(f"best: count {best['count']:.2f} ms, fraction {best['fraction']:.2f} ms "
          f"(x{best['count'] / best['fraction']:.3f})")


if __name__ == "__main__":
    main()
