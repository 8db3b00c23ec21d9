"""The live hybrid controller: per layer, how many misses the CPU computes while the rest
are copied in and computed on the device, so that both sides finish together.

Cost model (seconds, one layer), fitted online from the executor's timings:
- device side, `copies` experts copied in and computed: G = g0 + g1·copies (g0: the
  hits' compute and the host's planning gap; measured with CUDA events from before the
  hit pass to after the last copy, resolved lazily: never a synchronisation);
- CPU side, n experts on t tokens in all: C = c0 + c1·n + c2·t for n > 0, else 0
  (c0: the hand-off to the worker thread; measured by wall clock, submission to result).
A layer with misses of token counts m_1 <= … <= m_M takes max(G(M − n), C(first n)): the
controller picks the n that minimises it (the CPU takes the fewest-token misses, where it
is least behind the device; ties go to the copies, which also fill the cache), and, when
the device side then has slack, lets some CPU experts be admitted into slots too.

Learning: each side is a `LinearCost`, weighted least squares with forgetting, started
from the start-up probe's rates (`moe/rate_probe.py`). A side that gets no work gets no
observations, so the controller spends a small, accounted share of the predicted time
(`explore_share`) on probes (one miss sent to the idle side) to keep it current: a wrong
start-up rate or a change (another process taking cores) is found, not locked in.

`auto` mode decides between offload (the CPU gets nothing, x is not read back) and
hybrid from the same model: over each window of layers, the predicted saving of the
best split over copies only; hybrid above `HYBRID_ON`, offload below `HYBRID_OFF`
(hysteresis), one log line when it switches.

Contract: one controller per executor, used from the forward thread only, in layer
order: `wants_cpu()` before the routing read-back (may the CPU take a share?),
`split(...)` once the misses are known, then `observe_cpu` / `observe_device` with that
layer's timings. Nothing here touches tensors or the device except `Timing.query()`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

HYBRID_ON = 0.03  # auto → hybrid when the best split is predicted ≥ 3% faster than copies only
HYBRID_OFF = 0.01  # auto → offload when it is predicted < 1% faster
FORGET = 0.97  # forgetting: ~30 observations of memory, so a change shows within a step or two
EXPLORE_SHARE = 0.01  # at most 1% of the predicted time goes to probing an idle side
PROBE_AFTER = 32  # splits without work for a side before it is probed
FLOOR_S = 10e-6  # timings below this are noise-dominated (a kernel launch, a thread wake-up)
SOLVE_EVERY = 8  # timings between re-solving a cost law (the solve is the costly part)
NOISE = 0.2  # relative spread of one timing around the cost law (the fit's measurement noise)


@dataclass(frozen=True)
class Rates:
    """Start-up estimates, seconds: the probe's, or a test's."""

    copy_s: float  # one expert copied in and computed on the device
    cpu_s: float  # one expert at one token on the CPU
    cpu_token_s: float  # each further token of an expert on the CPU
    cpu_call_s: float = 50e-6  # per CPU job: hand-off, job table, results back
    device_fixed_s: float = 20e-6  # per layer on the device whatever the split

    def describe(self, expert_bytes: int) -> str:
        def gbs(seconds: float) -> float:
            return expert_bytes / max(seconds, 1e-12) / 1e9

        return (f"copies {gbs(self.copy_s):.1f} GB/s, CPU experts {gbs(self.cpu_s):.1f} GB/s "
                f"(+{self.cpu_call_s * 1e6:.0f} µs per call)")


class LinearCost:
    """seconds ≈ θ·φ for features φ: weighted least squares with forgetting, toward a prior.

    Kept as exponentially forgotten sums A = Σ λ^age w φφᵀ, b = Σ λ^age w φ y (the
    information form: it cannot lose positive-definiteness as the covariance form of RLS
    does in floating point), and solved lazily (`theta`) as (A + A0) θ = b + A0 θ0. A0
    says "each prior rate is known to ±100%": worth a fraction of one timing, it steers
    only the directions the timings leave open (one token per expert in decode makes the
    per-expert and per-token CPU costs inseparable; the prior splits them). Each timing
    is weighted as if within ±`NOISE` of the law and clipped to [¼, 4]× the prediction,
    so one preempted call cannot throw the estimate far (a real change still converges
    geometrically). θ stays non-negative. Pure Python floats, θ re-solved every
    `SOLVE_EVERY` timings (every one at first): a layer's share costs a few microseconds.
    """

    def __init__(self, prior: Sequence[float], forget: float = FORGET) -> None:
        self.prior = [float(v) for v in prior]
        n = len(self.prior)
        self._a0 = [1.0 / max(abs(v), FLOOR_S) ** 2 for v in self.prior]  # diagonal prior precision
        self._a = [[0.0] * n for _ in range(n)]
        self._b = [0.0] * n
        self.forget = forget
        self.observations = 0
        self._theta: list[float] | None = list(self.prior)

    @property
    def theta(self) -> list[float]:
        if self._theta is None:
            n, a0 = len(self.prior), self._a0
            a = [[self._a[i][j] + (a0[i] if i == j else 0.0) for j in range(n)] for i in range(n)]
            b = [self._b[i] + a0[i] * self.prior[i] for i in range(n)]
            self._theta = [max(v, 0.0) for v in _solve(a, b)]
        return self._theta

    def predict(self, phi: Sequence[float]) -> float:
        return sum(t * f for t, f in zip(self.theta, phi, strict=True))

    @classmethod
    def from_sums(cls, prior: Sequence[float], a: Sequence[Sequence[float]], b: Sequence[float]) -> LinearCost:
        """A law whose timings another producer summed (the CPU share's host function keeps
        Σφφᵀ and Σφy in C, `moe/cpu_share.fit_cpu_rates`): `a`, `b` already weighted."""
        cost = cls(prior)
        cost._a = [[float(v) for v in row] for row in a]
        cost._b = [float(v) for v in b]
        cost._theta = None
        return cost

    def update(self, phi: Sequence[float], seconds: float) -> None:
        scale = max(self.predict(phi), FLOOR_S)  # a near-zero prediction must not make one timing all-powerful
        y = min(max(seconds, scale / 4), scale * 4)
        w, lam, n = 1.0 / (NOISE * scale) ** 2, self.forget, len(phi)
        for i in range(n):
            row = self._a[i]
            for j in range(n):
                row[j] = lam * row[j] + w * phi[i] * phi[j]
            self._b[i] = lam * self._b[i] + w * phi[i] * y
        self.observations += 1
        if self.observations <= SOLVE_EVERY or self.observations % SOLVE_EVERY == 0:
            self._theta = None  # re-solved at the next prediction


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting for the tiny symmetric positive
    definite systems above (n <= 3)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for k in range(c, n + 1):
                m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


@dataclass(frozen=True)
class Split:
    """A layer's decision: the first `cpu` misses (in `order`) run on the CPU; the last
    `admit` of those are also copied into slots (the device side had slack)."""

    order: tuple[int, ...]  # miss indices, fewest tokens first
    cpu: int
    admit: int
    predicted_s: float  # max(device, CPU) for this split
    copies_only_s: float  # the same layer with every miss copied
    probe: bool = False


class Timing(Protocol):
    """A device interval being measured: `query()` → seconds once known, else None."""

    def query(self) -> float | None: ...


class SplitController:
    """See the module docstring. `mode`: "hybrid" (may always split) or "auto"."""

    def __init__(self, rates: Rates, mode: str = "hybrid", window: int = 64,
                 explore_share: float = EXPLORE_SHARE) -> None:
        if mode not in ("hybrid", "auto"):
            raise ValueError(f"controller mode {mode!r}: hybrid or auto")
        self.rates, self.mode, self.window, self.explore_share = rates, mode, window, explore_share
        self.device = LinearCost([rates.device_fixed_s, rates.copy_s])
        self.cpu = LinearCost([rates.cpu_call_s, rates.cpu_s - rates.cpu_token_s, rates.cpu_token_s])
        # auto starts on the simpler path until the model says the CPU pays (decide_initial)
        self.choice = "offload" if mode == "auto" else "hybrid"
        self.reason = ""
        self._pending: list[tuple[int, Timing]] = []
        self._budget = 0.0  # seconds of predicted time available for probes
        self._idle = {"cpu": PROBE_AFTER, "device": 0}  # splits since each side last got work
        self._saved = self._total = 0.0  # predicted, this window
        self._seen = 0
        self._last_misses = 0
        self.splits = self.cpu_experts = self.misses = self.probes = 0

    # ---- the decision ---------------------------------------------------------------

    def decide_initial(self, misses: int, expert_bytes: int) -> str:
        """auto's start-up choice for a decode layer of `misses` one-token misses (logged)."""
        if self.mode == "auto":
            _, best, copies = self._best([1] * misses)
            self._choose((copies - best) / copies if copies else 0.0,
                         f"at start-up, {misses} misses per layer ({self.rates.describe(expert_bytes)})")
        return self.choice

    def wants_cpu(self) -> bool:
        """Before a layer's read-back: may the CPU take a share (so x is needed on the host)?"""
        if self.choice == "hybrid":
            return True
        if self._idle["cpu"] < PROBE_AFTER:
            return False
        # a probe is affordable if one expert on the CPU fits the budget for a layer like the last
        return self._times([1] * max(self._last_misses, 1))[1] - self._times([1] * self._last_misses)[0] <= self._budget

    def split(self, tokens: Sequence[int], have_x: bool = True) -> Split:
        """The split of a layer whose misses have `tokens[i]` tokens each; `have_x`: the
        layer's activations were read back (`wants_cpu`), so the CPU can take some."""
        self._fold_device_timings()
        order = tuple(sorted(range(len(tokens)), key=lambda i: tokens[i]))
        ordered = [tokens[i] for i in order]
        n, best, copies = self._best(ordered)
        self._account(copies - best, copies)
        if not have_x or self.choice == "offload":
            n, best = 0, copies
        n, best, probe = self._maybe_probe(ordered, n, best, have_x)
        m = self._last_misses = len(ordered)
        self._idle["cpu"] = 0 if n else self._idle["cpu"] + 1
        self._idle["device"] = 0 if n < m else self._idle["device"] + 1
        self.splits, self.misses, self.cpu_experts, self.probes = (
            self.splits + 1, self.misses + m, self.cpu_experts + n, self.probes + probe)
        return Split(order, n, self._admit(ordered, n, best), best, copies, probe)

    def _times(self, ordered: Sequence[int]) -> list[float]:
        """Predicted layer time, max(device, CPU), when the first n misses go to the CPU, n = 0..m."""
        (g0, g1), (c0, c1, c2) = self.device.theta, self.cpu.theta
        m, tokens, times = len(ordered), 0, [g0 + g1 * len(ordered)]
        for n in range(1, m + 1):
            tokens += ordered[n - 1]
            times.append(max(g0 + g1 * (m - n), c0 + c1 * n + c2 * tokens))
        return times

    def _best(self, ordered: Sequence[int]) -> tuple[int, float, float]:
        """(n, its time, the time with every miss copied)."""
        times = self._times(ordered)
        n = min(range(len(times)), key=times.__getitem__)  # the first minimum: ties go to the copies
        return n, times[n], times[0]

    def _admit(self, ordered: Sequence[int], n: int, best: float) -> int:
        """CPU experts that can also be copied in without the device side exceeding `best`."""
        if n == 0:
            return 0
        g0, g1 = self.device.theta
        spare = best - (g0 + g1 * (len(ordered) - n))
        return min(n, max(0, int(spare // max(g1, 1e-9))))

    def _maybe_probe(self, ordered: Sequence[int], n: int, best: float, have_x: bool) -> tuple[int, float, bool]:
        """Give one miss to a side idle for PROBE_AFTER splits, if the banked budget pays
        for the predicted extra time (so probing costs at most `explore_share`)."""
        m = len(ordered)
        if m and n == 0 and have_x and self._idle["cpu"] >= PROBE_AFTER:
            cand = 1
        elif m and n == m and self._idle["device"] >= PROBE_AFTER:
            cand = m - 1
        else:
            return n, best, False
        cost = self._times(ordered)[cand]
        extra = max(cost - best, 0.0)
        if extra > self._budget:
            return n, best, False
        self._budget -= extra
        return cand, max(cost, best), True

    def _account(self, saved: float, copies: float) -> None:
        """Bank the probe budget; in auto, judge the window's predicted saving."""
        self._budget = min(self._budget + self.explore_share * (copies - saved), 0.05)  # ≤ 50 ms banked
        self._saved += saved
        self._total += copies
        self._seen += 1
        if self.mode == "auto" and self._seen >= self.window:
            self._choose(self._saved / self._total if self._total else 0.0, f"over the last {self._seen} layers")
            self._saved = self._total = 0.0
            self._seen = 0

    def _choose(self, gain: float, why: str) -> None:
        new = "hybrid" if gain >= HYBRID_ON else "offload" if gain < HYBRID_OFF else self.choice
        first = not self.reason
        if new != self.choice or first:
            self.reason = (f"{new}: the best CPU/copy split is predicted {gain:.1%} faster than copies only "
                           f"{why} (hybrid from {HYBRID_ON:.0%}, offload below {HYBRID_OFF:.0%})")
            log.warning("moe auto: %s%s", "" if first else "switching to ", self.reason)
            self.choice = new

    # ---- observations ---------------------------------------------------------------

    def observe_cpu(self, experts: int, tokens: int, seconds: float) -> None:
        """A CPU job of `experts` experts on `tokens` tokens took `seconds` (wall clock)."""
        if experts:
            self.cpu.update((1.0, experts, tokens), seconds)

    def observe_device(self, copies: int, timing: Timing) -> None:
        """The device side of a layer with `copies` experts copied in; folded in lazily."""
        self._pending.append((copies, timing))
        if len(self._pending) > 4096:  # a device that never completes: keep memory bounded
            del self._pending[:-1024]

    def _fold_device_timings(self) -> None:
        while self._pending:
            seconds = self._pending[0][1].query()
            if seconds is None:
                return  # NOTE: one stream completes in order: nothing later has finished either
            copies, _ = self._pending.pop(0)
            self.device.update((1.0, copies), seconds)

    def snapshot(self) -> dict[str, object]:
        g0, g1 = self.device.theta
        c0, c1, c2 = self.cpu.theta
        return {"split": {
            "mode": self.mode, "choice": self.choice, "reason": self.reason, "layers": self.splits,
            "misses": self.misses, "cpu_share": self.cpu_experts / self.misses if self.misses else 0.0,
            "probes": self.probes, "device_fixed_us": g0 * 1e6, "copy_us_per_expert": g1 * 1e6,
            "cpu_call_us": c0 * 1e6, "cpu_us_per_expert": (c1 + c2) * 1e6, "cpu_us_per_token": c2 * 1e6,
            "observations": {"device": self.device.observations, "cpu": self.cpu.observations},
        }}
