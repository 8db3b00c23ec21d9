"""What decode prefetch could reach — at most with an oracle (every miss of layer l+1 known
during layer l), less with a predictor's `--recall` and `--precision` — on the CPU alone, as
the engine orders it (`moe/prefetch.py`, `DecodePrefetch`):

- a layer's chain is its plan part (attention, router, the plan: `--plan-us`) then the rest
  (its expert GEMVs and the combine: `--chain-us` less the plan part);
- after layer l's plan and own gather, its `after_move` forks the side stream, which copies
  layer l+1's misses once both the stream's work so far and the side's previous copy are
  done, each at `--side-copy-us` (the side grid's rate beside compute); layer l then joins
  its own prefetched copies before it computes;
- the step's first MoE layer has no prefetch (the last layer prefetches nothing): its misses
  copy on the stream at `--copy-us`, before anything else is on the link; so do the misses a
  predictor missed, after their layer's plan, behind the side stream's copy in flight
  (its unused copies' evictions are left out).

The trace is synthetic routing's at the scenario's slots through the engine's LRU (every miss
loaded), as `scripts/split_miss_model.py` replays it; offload (each layer's own misses on
the stream, at `--copy-us`) prints beside it. fp8 at 16 GiB (2026-12-06's profiles):
`--slots 2426 --copy-us 92 --chain-us 73 --plan-us 50 --side-copy-us 135` (18:29's offload
profile a layer: qkv, RoPE, attention, o_proj, the norm, the router and the plan ≈ 50 µs
before its copies, the expert GEMVs ≈ 21 after; a copy at 32 programs ≈ 135 on 2026-12-02).

    PYTHONPATH=src:scripts python3 scripts/prefetch_model.py [--side-copy-us 92 ...]
"""

from __future__ import annotations

import argparse

from share_ceiling import EXPERTS, LAYERS, add_layer_model_args, trace

from edgemoe.moe.quota_levels import quota_rows
from edgemoe.moe.replay import replay_share


def step_times(misses: list[int], args: argparse.Namespace) -> tuple[float, float]:
    """(offload µs, prefetch µs) of one step whose MoE layers miss `misses` experts: a
    predictor with `recall` (its share of a layer's misses copied ahead; the rest copied on
    the stream after the layer's plan, queued behind the side stream's copy) and
    `precision` (its unused copies take side time too), `depth` layers ahead (1: the engine
    today — layer i's copies fork after layer i-1's plan; 2: after layer i-2's, the layers
    before the depth after the first layer's)."""
    rest = args.chain_us - args.plan_us
    offload = sum(args.chain_us + m * args.copy_us for m in misses)
    moved = [args.plan_us + misses[0] * args.copy_us]  # the first layer: planned, its own copies on the stream
    landed = [moved[0]]  # when each layer's copies are in
    side_free = moved[0]  # when the side stream is free
    for i, m in enumerate(misses[1:], start=1):
        ahead, late = args.recall * m, (1 - args.recall) * m
        fork = moved[max(i - args.depth, 0)]
        side_free = max(side_free, fork) + ahead / args.precision * args.side_copy_us
        planned = max(moved[-1], landed[-1]) + rest + args.plan_us  # the previous layer joins, computes; this one plans
        moved.append(max(planned, side_free) + late * args.copy_us if late else planned)
        landed.append(side_free)
    return offload, max(moved[-1], landed[-1]) + rest


def model(accesses, args: argparse.Namespace) -> tuple[float, float, float]:  # noqa: ANN001
    """(offload ms a token, prefetch ms a token, misses a token) over the trace's whole steps."""
    layers: list[int] = []

    def observe(layer: int, misses: int, cpu: int) -> None:  # noqa: ARG001 - quota 0: cpu is 0
        layers.append(misses)

    replay_share(accesses, args.slots, LAYERS, EXPERTS, quota_rows(0, LAYERS), observe=observe)
    steps = [layers[i:i + LAYERS] for i in range(len(layers) - len(layers) % LAYERS - LAYERS, -1, -LAYERS)]
    if not steps:
        raise SystemExit(f"--tokens {args.tokens} leave no whole step after {args.slots} slots fill")
    # The warm-up may end mid-step: whole steps are counted from the trace's end.
    times = [step_times(s, args) for s in steps]
    n = len(steps)
    return (sum(o for o, _ in times) / n / 1e3, sum(p for _, p in times) / n / 1e3,
            sum(sum(s) for s in steps) / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_layer_model_args(ap, host_gbps=0.0)
    ap.add_argument("--plan-us", type=float, default=50.0, help="a layer's chain before its copies (µs)")
    ap.add_argument("--recall", type=float, default=1.0, help="the predictor's share of a layer's misses (1: an oracle)")
    ap.add_argument("--precision", type=float, default=1.0, help="its used share of what it copies (1: no waste)")
    ap.add_argument("--depth", type=int, default=1, choices=(1, 2, 3),
                    help="layers ahead the copies start (1: the engine's: after the previous layer's plan)")
    ap.add_argument("--side-copy-us", type=float, default=135.0,
                    help="a prefetched expert's copy on the side grid beside compute (µs; fp8 at ~35 GB/s)")
    args = ap.parse_args()
    offload, prefetch, misses = model(trace(args.tokens, args.seed), args)
    print(f"{args.slots} slots, {misses:.1f} misses a token: offload {offload:.2f} ms ({1e3 / offload:.1f} tok/s), "
          f"prefetch (recall {args.recall:g}, precision {args.precision:g}, depth {args.depth}) {prefetch:.2f} ms ({1e3 / prefetch:.1f} tok/s), ×{offload / prefetch:.2f}")


if __name__ == "__main__":
    main()
