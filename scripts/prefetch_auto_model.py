"""What `--moe-prefetch auto` costs against the better of prefetch on and off: the engine's
chooser (`moe/prefetch_choice.PrefetchChooser`) replayed over simulated decode steps whose
times are drawn around measured figures (ms a step with prefetch on and off, a relative
noise), as the executor's `before_step` calls it. Prints auto's tok/s, the best manual
setting's, their ratio and the steps spent on the slower choice, per pair of figures.

A model, not a measurement: the steps' noise is drawn independently (a real host drifts,
and a switch's transient lasts longer than the chooser's settle on a cold cache).

    PYTHONPATH=src python3 scripts/prefetch_auto_model.py --steps 512 \\
        --pairs 6.02,8.43 7.35,8.43 8.75,8.43 11.8,8.43 --noise 0.03
"""

from __future__ import annotations

import argparse
import random

from edgemoe.moe.prefetch_choice import PrefetchChooser


def replay(on_ms: float, off_ms: float, steps: int, noise: float, seed: int) -> tuple[float, int]:
    """Seconds for `steps` decode steps under the chooser, and how many ran the slower choice."""
    rng, chooser, now, slow = random.Random(seed), PrefetchChooser(), 0.0, 0
    faster = on_ms < off_ms
    for _ in range(steps):
        chooser.step(now, 1)
        ms = on_ms if chooser.on else off_ms
        slow += chooser.on != faster
        now += ms * 1e-3 * max(0.5, rng.gauss(1.0, noise))
    return now, slow


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", nargs="+", default=["6.02,8.43", "7.35,8.43", "8.75,8.43", "11.8,8.43"],
                    help="ms a step with prefetch on,off (defaults: fp8 offload, 2026-12-07 19:35: the oracle, "
                         "recall 0.9, 0.8, 0.6)")
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--noise", type=float, default=0.03, help="relative σ of a step's time")
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    for pair in args.pairs:
        on_ms, off_ms = (float(v) for v in pair.split(","))
        runs = [replay(on_ms, off_ms, args.steps, args.noise, seed) for seed in range(args.seeds)]
        auto = args.steps / (sum(s for s, _ in runs) / len(runs))
        best = 1e3 / min(on_ms, off_ms)
        slow = sum(n for _, n in runs) / len(runs)
        print(f"on {on_ms:6.2f} ms, off {off_ms:6.2f} ms: auto {auto:6.1f} tok/s, best {best:6.1f} "
              f"({'on' if on_ms < off_ms else 'off'}): {auto / best:.3f}; {slow:.0f} of {args.steps} steps on the "
              f"slower choice")


if __name__ == "__main__":
    main()
