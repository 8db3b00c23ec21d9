"""The CPU share's start-up rates, measured on this machine's own kernel calls.

The prompt rule (`kernels/share_split.py`) splits a chunk's misses by a CPU expert's cost,
ns = a·experts + b·pairs, fitted from the host function's calls (`cpu_share.fit_cpu_rates`)
toward a prior. Fixed priors are one machine's: the GPU machine's 16 AMX cores fit ~2 µs a
pair for bf16 where the constants say 11 (2026-12-04), and the dev VM's 2 cores measured
1.4–4.6× them an expert and 1.7–3.5× a token. Until prompt chunks have corrected the fit,
the first chunks after start-up split by that prior, so it is measured here: a few calls of
the real kernel on this store's experts through a mailbox of their own (the share's fit
sums and busy counters stay clean), at four shapes, 4 or 8 experts at 1 or 6 tokens each,
timed as the host cache's start-up probe times its calls (`rate_probe.cpu_seconds`: the
median of five, each on other experts of another layer, so caches do not flatter it).
Twice over, each shape's least time kept: about 40 ms on the GPU machine's 16 cores, once
the engine is built (`build_runtime`: after loading, pinning, preloading and graph capture,
whose host traffic disturbed the readings taken at the share's construction). Timings that
contradict the cost law (`solve`) keep the constants, as does `EDGEMOE_SHARE_PRIOR=0` (an A/B).
"""

from __future__ import annotations

import numpy as np
import torch

from edgemoe.env_switch import env_switch
from edgemoe.kernels.cpu_host_layer import HostLayerMailboxes
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.moe.rate_probe import cpu_seconds
from edgemoe.moe.store import ExpertStore

# (experts, tokens each): t = c + a·J + b·J·T, over-determined. Tokens below the kernel's
# blocked-path threshold (`CpuExperts.gemm_threshold`: 8 on AMX, 16 elsewhere): one path,
# as for the few-token misses the prompt rule gives the CPU. At 16 tokens fp8 took the
# blocked path (experts dequantised first: another a), and on the GPU machine's AMX cores
# the four fp8 readings fell 19-48% off one law (2026-12-04).
SHAPES = ((4, 1), (8, 1), (4, 6), (8, 6))
PASSES = 2  # over the shapes; each shape's least time (a disturbance only adds)
FIXED_SHARE_MAX = 0.5  # of the smallest call: a call's hand-off is ~20 µs where 4 experts take ~400
RESIDUAL_MAX = 0.1  # a shape's time off the fitted law, of that time (quiet runs: <= 0.035)


def wanted() -> bool:
    return env_switch("EDGEMOE_SHARE_PRIOR", True)


def measure_times(store: ExpertStore, weights: tuple[str, int], kernel: CpuExperts) -> list[float] | None:
    """The ns of this machine's C kernel at each of SHAPES on `store`'s experts (`weights`:
    the kernel's kind and block; `solve` reads the rates off them), or None: the store too
    small to spread the calls."""
    if store.num_experts < 16:
        return None
    x_dtype = torch.bfloat16 if store.format.quantised else store.dtype  # as `cpu_seconds` draws x
    mailboxes = HostLayerMailboxes({layer: store.layer_parts(layer) for layer in store.layers}, weights, kernel,
                                   rows=max(t for _, t in SHAPES), top_k=max(j for j, _ in SHAPES), x_dtype=x_dtype)

    def call(layer: int, _experts: list[int], x: torch.Tensor, ids: np.ndarray, w: torch.Tensor) -> None:
        """One host-function call: every token of x to each of its row's experts in `ids`."""
        tokens, k = ids.shape
        rows = torch.arange(tokens).repeat_interleave(k)
        mailboxes.fill(x, rows, torch.from_numpy(ids).reshape(-1), torch.arange(tokens * k), w.reshape(-1).float())
        mailboxes.run(layer)
        if mailboxes.status(layer) != 0:
            raise RuntimeError(f"the CPU share's start-up call failed (status {mailboxes.status(layer)})")

    passes = [[1e9 * cpu_seconds(store, call, j, t) for j, t in SHAPES] for _ in range(PASSES)]
    return [min(shape) for shape in zip(*passes)]


def solve(ns: list[float]) -> tuple[float, float] | None:
    """(a, b) of t = c + a·experts + b·pairs, least squares over the SHAPES' times, or None
    where the times contradict the law: a rate <= 0, the call's fixed part c most of the
    smallest call (the shapes then differ by less than what disturbed them, or the experts
    are too small for the rates to matter), or a shape off the fitted law by more than
    RESIDUAL_MAX. On the GPU machine's fresh VMs (2026-12-04) about half the start-up
    readings were such: 0.9 µs an expert (a 9.4 MB read), 4 experts slower than 8, one
    shape 4x the law."""
    times = np.asarray(ns, dtype=float)
    design = np.array([[1.0, j, j * t] for j, t in SHAPES])
    fit = np.linalg.lstsq(design, times, rcond=None)[0]
    fixed, per_expert, per_pair = fit
    off = np.abs(times - design @ fit) / times
    if per_pair <= 0 or per_expert <= 0 or fixed > FIXED_SHARE_MAX * times.min() or off.max() > RESIDUAL_MAX:
        return None
    return float(per_expert), float(per_pair)
