"""The split controller's start-up rates, measured in a few milliseconds on what the
executor will really run: this store's experts (pinned, pageable or mapped), this
device's copy engine, this CPU kernel variant and thread count, this expert shape.

Why a probe and not the last `edgemoe bench bw` results: cached figures go stale (another
machine, another thread count, a store pageable this time, other processes on the
cores) and describe `bench bw`'s shapes, not the model's; the probe costs ~10-30 ms at
start-up, and the controller corrects its figures from every step's timings anyway.
`edgemoe bench bw` stays the tool for a person to read the machine's limits.

Timings: copies with CUDA events around a few expert copies into free slots (nothing
is mapped there yet); CPU calls by wall clock, each call on experts not used by the
previous one (so caches do not flatter it), the median of a few.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from edgemoe.moe.controller import Rates
from edgemoe.moe.store import ExpertStore

# (layer, experts, x [T, H], routing [T, K] numpy, weights [T, K]) → runs those experts on the CPU
CpuJob = Callable[[int, list[int], torch.Tensor, np.ndarray, torch.Tensor], object]
REPS = 5


def probe_rates(store: ExpertStore, gate_up: torch.Tensor, down: torch.Tensor, cpu_job: CpuJob) -> Rates:
    """Rates for `store`'s experts: copies into the free slot banks `gate_up`/`down`
    (device tensors [S, …]), CPU work through `cpu_job`."""
    copy_s = _copy_seconds(store, gate_up, down, _expert_keys(store, 8))
    one = cpu_seconds(store, cpu_job, experts=1, tokens=1)
    four = cpu_seconds(store, cpu_job, experts=4, tokens=1)
    eight_tokens = cpu_seconds(store, cpu_job, experts=1, tokens=8)
    spread = min(4, store.num_experts) - 1
    per_expert = max((four - one) / spread, 1e-7) if spread else max(one, 1e-7)  # at one token each
    per_token = min(max((eight_tokens - one) / 7, 0.0), per_expert)
    return Rates(copy_s=copy_s, cpu_s=per_expert, cpu_token_s=per_token, cpu_call_s=max(one - per_expert, 0.0))


def _expert_keys(store: ExpertStore, n: int) -> list[tuple[int, int]]:
    """n distinct (layer, expert) pairs spread over the store (fewer if it is small)."""
    total = len(store.layers) * store.num_experts
    step = max(1, total // n)
    flat = [(i * step * 7919) % total for i in range(min(n, total))]  # 7919: prime, scatters layers
    return [(store.layers[f // store.num_experts], f % store.num_experts) for f in dict.fromkeys(flat)]


def _copy_seconds(store: ExpertStore, gate_up: torch.Tensor, down: torch.Tensor, keys: list[tuple[int, int]]) -> float:
    """Seconds per expert copied host → slot (the first copy is a warm-up)."""
    slots = min(len(keys), gate_up.shape[0])
    # The data parts (any format; a quantised expert's scales are a rounding error of its bytes).
    pairs = [(p["gate_up"], p["down"]) for p in (store.expert_parts(layer, e) for layer, e in keys[:slots])]
    if gate_up.is_cuda:
        gate_up[0].copy_(pairs[0][0], non_blocking=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for slot, (gu, dn) in enumerate(pairs):
            gate_up[slot].copy_(gu, non_blocking=True)
            down[slot].copy_(dn, non_blocking=True)
        end.record()
        end.synchronize()  # NOTE: start-up only; the live path never waits for a timing
        return start.elapsed_time(end) / 1000 / len(pairs)
    t0 = time.perf_counter()
    for slot, (gu, dn) in enumerate(pairs):
        gate_up[slot].copy_(gu)
        down[slot].copy_(dn)
    return (time.perf_counter() - t0) / len(pairs)


def cpu_seconds(store: ExpertStore, job: CpuJob, experts: int, tokens: int) -> float:
    """Median wall-clock seconds of a CPU job of `experts` experts on `tokens` tokens
    each; each repetition takes other experts of another layer (also the CPU share's
    start-up rates, `moe/share_prior.py`)."""
    hidden, layers, count = store.down_shape[0], store.layers, store.num_experts
    experts = min(experts, count)
    act = torch.bfloat16 if store.format.quantised else store.dtype  # a quantised store's dtype is its data's
    x = (torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0)) * 0.1).to(act)
    weights = torch.full((tokens, experts), 1.0 / experts, dtype=act)
    times = []
    for rep in range(REPS + 1):  # the first call is a warm-up (thread pool start, first touch)
        chosen = [(rep * experts + i) % count for i in range(experts)]
        ids = np.tile(np.array(chosen, dtype=np.int64), (tokens, 1))  # every token to every chosen expert
        t0 = time.perf_counter()
        job(layers[(rep * 7) % len(layers)], chosen, x, ids, weights)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])
