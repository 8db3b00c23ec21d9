"""The speed model of `edgemoe plan`: a batch-1 decode step's milliseconds from the bytes it
moves, with constants fitted to `edgemoe bench decode` runs on one GPU (docs/plan.md).

    step_ms = base_ms + misses/token × bytes per expert ÷ (PCIe GB/s × COPY_EFFICIENCY)
    base_ms = dense weights ÷ (device GB/s × E[bf16])            (LM head whole, embedding one row)
            + the token's experts in the format ÷ (device GB/s × E[format])
            + KV at the context (+ GDN state, read and written) ÷ (device GB/s × KV_EFFICIENCY)
            + SLOT_CACHE_US × MoE layers                          (the device expert cache's bookkeeping)

The efficiencies are shares of the device's bandwidth, so the base step scales with the
bandwidth given (a 1 TB/s card: ~4× the H200's); SLOT_CACHE_US is a latency and does not.
Prefill is the copy bound of one chunk (`prefill_bound`) × PREFILL_EFFICIENCY, fitted to a
realistic-routing run; a chunk the device cache streams (`moe/prefill_stream.py`: ≥ 1,024
tokens, a pool of ≥ 2·E slots) copies every expert it doesn't hold, the lent slots' experts
included, at STREAM_EFFICIENCY of the link (`prefill_streamed`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

GB = 1e9


class Calibration(NamedTuple):
    gpu: str
    device_gbps: float  # HBM traffic: 2 × `bench bw`'s d2d copy rate (each byte read once, written once)
    pcie_gbps: float  # pinned host→device copies of one expert
    source: str


# NOTE: every constant below is fitted to this machine's runs by `edgemoe.bench.plan_fit.fit` (the
# runs, the order and the measured-vs-predicted table: docs/plan.md).
CALIBRATION = Calibration("NVIDIA H200", 2 * 2116.93, 54.66, "bench/results/bw-20261201-150027.json")

# NOTE: share of the device bandwidth the expert (and, for bf16, dense) GEMVs reach at batch 1,
# CUDA graphs on. bf16 from the resident runs (decode-20261201-204102.json, 1K: 3.83 ms p50,
# with KV_EFFICIENCY from 204346's 32K); fp8 from decode-20261201-204603.json (5.90 ms) and int4
# from decode-20261201-204659.json (9.90 ms), each after bf16's dense time, the KV, the slot
# cache and its copies: the quantised kernels dequantise in registers and do not reach the
# bandwidth at one token (int4 is latency-bound: 7 µs a layer's expert call for 20 MB).
EXPERT_EFFICIENCY: dict[str, float] = {"bf16": 0.3794, "fp8": 0.1472, "int4": 0.0328}
# NOTE: not measured: int8 takes fp8's kernel efficiency (same one-byte GEMV), mxfp4 int4's (4-bit).
BORROWED_EFFICIENCY: dict[str, str] = {"int8": "fp8", "mxfp4": "int4"}
# NOTE: KV (and GDN state) bytes: the slope of the resident 1K → 32K runs (3.83 → 5.13 ms p50,
# decode-20261201-204102.json, decode-20261201-204346.json; 3.12 GB more KV a token).
KV_EFFICIENCY = 0.5648
# NOTE: the device expert cache's per-layer work (routing → slots, victims, the miss gather's
# launch) in µs a MoE layer: bf16 with the cache (decode-20261201-204535.json, 5.45 ms p50 at
# 1.125 misses) minus the resident step (3.83 ms) and its copies. A latency: not scaled by bandwidth.
SLOT_CACHE_US = 29.34
# NOTE: share of the PCIe rate a miss's copy reaches inside a step: the runs where copies
# dominate, pooled (bytes over time after the base): every expert missing at bf16 / 8 GiB
# (decode-20261201-204633.json, 384 misses, 77.47 ms p50) and synthetic routing at bf16 / 16 GiB
# (decode-20261201-204237.json, 112.6 misses, 27.72 ms p50).
COPY_EFFICIENCY = 0.9053

# NOTE: the share of the prefill copy bound (`prefill_bound`) a chunk reaches: synthetic routing's
# 1K prefill at bf16 / 16 GiB (decode-20261201-204237.json, 677.6 tok/s; every expert touched),
# checked on a later run of the same setting (decode-20261201-234509.json: 729.6, predicted −7.4%).
PREFILL_EFFICIENCY = 0.5607

# NOTE: the share of the streamed chunk's copy bound (`prefill_streamed`) it reaches: the 8K prompt
# in one 8K chunk at bf16 / 16 GiB, kv 40,960 (decode-20261202-103747.json, 7,298 tok/s without
# synthetic routing's host draws, which a real router doesn't make).
STREAM_EFFICIENCY = 0.8906

# What is calibrated and what is only modelled (the report says which).
DECODE_CALIBRATED = True  # the step time given the misses, on the calibration GPU, batch 1
HIT_RATE_CALIBRATED = False  # needs a trained checkpoint's routing; the random presets' router is not one
CPU_SHARE_CALIBRATED = False  # no run measured the CPU's share beside the device cache


class StepBytes(NamedTuple):
    """Bytes one decode token reads on the device, by the efficiency they run at."""

    dense: int  # dense weights: the LM head whole, the embedding one row
    experts: int  # the token's routed (+ a shared in-store) experts, in the format
    kv: int  # K/V (+ QSA index keys) at the context, + GDN state read and written


class StepTime(NamedTuple):
    base_ms: float  # every expert a hit
    copy_ms: float  # the misses' copies

    @property
    def total_ms(self) -> float:
        return self.base_ms + self.copy_ms

    @property
    def tok_s(self) -> float:
        return 1000.0 / self.total_ms


def expert_efficiency(fmt: str) -> tuple[float, bool]:
    """(share of the device bandwidth the format's expert kernel reaches, measured or borrowed)."""
    if fmt in EXPERT_EFFICIENCY:
        return EXPERT_EFFICIENCY[fmt], True
    return EXPERT_EFFICIENCY[BORROWED_EFFICIENCY[fmt]], False


def step_bytes(arch: Any, expert_bytes: int, context: int) -> StepBytes:
    """What a decode token at `context` tokens reads, from the config alone."""
    from edgemoe.engine.budget import dense_weight_bytes, kv_bytes_per_token

    size = arch.dtype.itemsize
    embed = math.prod(arch.param_shapes()["embed"])
    # The embedding is gathered (one row), unless it is also the LM head (tied), read whole.
    dense = dense_weight_bytes(arch) - (0 if arch.tie_word_embeddings else (embed - arch.hidden_size) * size)
    experts = len(arch.moe_layers) * arch.moe_pairs * expert_bytes
    return StepBytes(dense, experts, kv_read_bytes(arch, context, kv_bytes_per_token(arch)) + 2 * arch.state_bytes)


def kv_read_bytes(arch: Any, context: int, per_token: int) -> int:
    """KV read by one decode token: every cached token, or under QSA sparse attention the
    selected ones (at most budget + ratio - 1) plus one index key per block scored."""
    qsa = getattr(arch, "qsa", None)
    if qsa is None:
        return context * per_token
    layers, key = len(arch.kv_layers), arch.index_key_dim * arch.dtype.itemsize
    kv_row = per_token // layers - key
    return layers * (min(context, qsa.max_selected) * kv_row + context // qsa.ratio * key)


def base_ms(b: StepBytes, fmt: str, device_gbps: float, slot_layers: int) -> float:
    """The step with every expert a hit; `slot_layers`: MoE layers behind the slot cache (0: resident)."""
    rate = device_gbps * GB / 1000  # bytes per ms
    dense = b.dense / (rate * EXPERT_EFFICIENCY["bf16"])  # dense weights stay in the model's dtype
    experts = b.experts / (rate * expert_efficiency(fmt)[0])
    return dense + experts + b.kv / (rate * KV_EFFICIENCY) + SLOT_CACHE_US * slot_layers / 1000


def copy_ms(misses_per_token: float, expert_bytes: int, rate_gbps: float) -> float:
    """The misses' copies at `rate_gbps` (PCIe, or PCIe + CPU for the uncalibrated split)."""
    return misses_per_token * expert_bytes / (rate_gbps * COPY_EFFICIENCY * GB / 1000)


def decode_step(arch: Any, fmt: str, expert_bytes: int, context: int, misses: float, slot_cache: bool,
                device_gbps: float, miss_gbps: float) -> StepTime:
    """One batch-1 decode step: the base at `device_gbps`, `misses` copied at `miss_gbps`."""
    b = step_bytes(arch, expert_bytes, context)
    base = base_ms(b, fmt, device_gbps, len(arch.moe_layers) if slot_cache else 0)
    return StepTime(base, copy_ms(misses, expert_bytes, miss_gbps) if misses > 0 else 0.0)


def decode_bound(rate_gbps: float, misses_per_token: float, expert_bytes: int) -> float:
    """tok/s when each token's missed experts move at `rate_gbps` and nothing else costs time."""
    if misses_per_token <= 0:
        return math.inf
    return rate_gbps * GB / (misses_per_token * expert_bytes)


def prefill_streamed(pcie_gbps: float, chunk: int, moe_layers: int, experts: int, slots: int,
                     expert_bytes: int) -> float:
    """tok/s for one streamed chunk: every expert the cache doesn't hold once the 2·E
    slots are lent is copied (routed or not)."""
    held = max(0, slots - 2 * experts)
    copied = max(0, moe_layers * experts - held) * expert_bytes
    return math.inf if copied <= 0 else chunk * pcie_gbps * GB / copied


def prefill_bound(pcie_gbps: float, chunk: int, moe_layers: int, experts: int, top_k: int,
                  resident_share: float, expert_bytes: int) -> float:
    """tok/s for one chunk whose touched, non-resident experts are copied once."""
    touched = 1 - (1 - top_k / experts) ** chunk
    copied = moe_layers * experts * touched * (1 - resident_share) * expert_bytes
    return math.inf if copied <= 0 else chunk * pcie_gbps * GB / copied
