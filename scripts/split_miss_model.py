"""What decode could reach if each missed expert were split by intermediate channels between
the CPU and the link — on the CPU alone, before any of it is built (docs/benchmarks.md,
"A miss split by channels, modelled").

Today's CPU share takes whole experts and never loads them (`scripts/share_layer_model.py`):
a layer with one miss (fp8 averages ~1.1) uses the link or the CPU, never both, and the
share's picks miss again at their next use. Split instead, every miss of a layer gives the
CPU a fraction `f` of its channels (gate/up rows and down columns: the two partial outputs
add in the combine) and the link the rest, so a layer of `m` misses waits for

    max(fixed + m·f·cpu, m·(1 − f)·copy, m·bytes / host) + chain

with `f` chosen per layer to balance the two sides (in `--grain` steps of the channels).
The CPU's channels are copied into the slot afterwards, while the link idles during the
layers' chains, so every miss is loaded and the cache keeps LRU's hit rate: the link
carries `m·copy` a layer in all, and a step can't be shorter than the link's whole load.
The trace is synthetic routing's at the scenario's slots through the engine's LRU
(`moe/replay.py`, `replay_share` at quota 0); offload (`f = 0`), the share's grain (`whole`:
the CPU takes k of a layer's m misses, every one loaded after) and the CPU alone (`f = 1`,
every miss's copy still made, to keep the hits) print beside it.

`--carried-loads` charges each layer's host reads with the previous layer's CPU part being
loaded beside them: the GPU machine measured that contention (2026-12-06 23:21, docs/benchmarks.md,
"The share's loads on the GPU, measured and removed"), which the model without it left out.

Defaults are bf16's (the profile `scripts/share_layer_model.py` fits); fp8 at its slots:
`--slots 2426 --copy-us 92 --cpu-us 55 --chain-us 73 --expert-mb 4.72` (2026-12-06 18:29's
profile: 108 µs of gather a layer for ~1.16 misses, ~3.5 ms of other kernels a step).

    PYTHONPATH=src:scripts python3 scripts/split_miss_model.py [--slots 1213 --copy-us 184 --cpu-us 92
        --fixed-us 25 --chain-us 108 --host-gbps 122 --grain 16]
"""

from __future__ import annotations

import argparse

from share_ceiling import EXPERTS, LAYERS, add_layer_model_args, trace

from edgemoe.moe.quota_levels import quota_rows
from edgemoe.moe.replay import replay_share


def balanced_fraction(misses: int, args: argparse.Namespace) -> float:
    """The CPU's fraction of a layer's channels that finishes both sides together, rounded
    to the nearest `--grain` step whose layer time is the shorter."""
    if misses == 0:
        return 0.0
    exact = (misses * args.copy_us - args.fixed_us) / (misses * (args.cpu_us + args.copy_us))
    steps = [min(max(int(exact * args.grain) + d, 0), args.grain) / args.grain for d in (0, 1)]
    return min(steps, key=lambda f: miss_us(misses, f, args))


def whole_fraction(misses: int, args: argparse.Namespace) -> float:
    """The balanced fraction when the CPU takes whole experts: k of the layer's m misses."""
    if misses == 0:
        return 0.0
    return min((k / misses for k in range(misses + 1)), key=lambda f: miss_us(misses, f, args))


def miss_us(misses: int, f: float, args: argparse.Namespace, carried: float = 0.0) -> float:
    """A layer's wait for its misses with `f` of their channels on the CPU; `carried`: the
    experts' worth of the previous layer's CPU part being loaded in this layer's window
    (`--carried-loads`), read from host memory beside them."""
    cpu = args.fixed_us + misses * f * args.cpu_us if f > 0 else 0.0
    host = (misses + carried) * args.expert_mb / args.host_gbps * 1e3 if args.host_gbps else 0.0
    return max(cpu, misses * (1 - f) * args.copy_us, host)


def step_ms(accesses, args: argparse.Namespace, rule: str) -> tuple[float, float, float, float]:  # noqa: ANN001
    """(ms a token, the layers' sum, the link's whole load, misses a token) under `rule`:
    `offload` (f = 0), `split` (balanced to the grain), `whole` (balanced in whole experts:
    today's share with its picks loaded after), `cpu` (f = 1)."""
    layers_us, link_us, misses_seen, counted, carried = [0.0], [0.0], [0], [0], [0.0]

    def observe(layer: int, misses: int, cpu: int) -> None:  # noqa: ARG001 - quota 0: cpu is 0
        if rule == "offload":
            f = 0.0
        elif rule == "cpu":
            f = 1.0 if misses else 0.0
        else:
            f = (balanced_fraction if rule == "split" else whole_fraction)(misses, args)
        layers_us[0] += miss_us(misses, f, args, carried[0]) + args.chain_us
        carried[0] = f * misses if args.carried_loads else 0.0  # loaded in the next layer's window
        link_us[0] += misses * args.copy_us
        misses_seen[0] += misses
        counted[0] += 1

    replay_share(accesses, args.slots, LAYERS, EXPERTS, quota_rows(0, LAYERS), observe=observe)
    if not counted[0]:
        raise SystemExit(f"--tokens {args.tokens} never fill {args.slots} slots: no access after the warm-up")
    per_token = LAYERS / counted[0] / 1e3
    layers, link = layers_us[0] * per_token, link_us[0] * per_token
    return max(layers, link), layers, link, misses_seen[0] * per_token * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_layer_model_args(ap, host_gbps=122.0)
    ap.add_argument("--grain", type=int, default=16, help="the split's steps: the channels in this many parts")
    ap.add_argument("--carried-loads", action="store_true",
                    help="the CPU's part of a layer is loaded in the next layer's window, its host reads beside that "
                         "layer's (the GPU machine, 2026-12-06 23:25: the CPU's fp8 experts 93 -> 155 µs beside the loads)")
    args = ap.parse_args()
    accesses = trace(args.tokens, args.seed)
    print(f"{args.slots} slots, {args.tokens} tokens: a copy {args.copy_us:g} µs, a CPU expert {args.cpu_us:g} µs "
          f"+ {args.fixed_us:g} a call, {args.chain_us:g} µs a layer besides, host "
          f"{args.host_gbps or 'unlimited'} GB/s, channels in {args.grain} parts")
    print(f"{'rule':>8} {'step ms':>8} {'tok/s':>6} {'layers ms':>9} {'link ms':>8} {'misses':>7}")
    for rule in ("offload", "whole", "split", "cpu"):
        ms, layers, link, misses = step_ms(accesses, args, rule)
        print(f"{rule:>8} {ms:8.2f} {1e3 / ms:6.1f} {layers:9.2f} {link:8.2f} {misses:7.1f}")


if __name__ == "__main__":
    main()
