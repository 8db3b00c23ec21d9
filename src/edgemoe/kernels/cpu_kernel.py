"""The CPU expert kernel as an object: which variant runs, its thread pool, the call.

Variant choice (`CpuExperts(kernel=…)`, else `$EDGEMOE_CPU_KERNEL`, else `auto`):
`auto` takes the fastest of amx > avx512 > avx2 that this CPU has and the compiler
builds (`cpu_build`), else `torch` (one warning when no compiler exists); an explicit
variant (`amx`, `avx512`, `avx2`, `scalar`, test-only `amx-emu`) or `torch` is honoured
or refused with a reason.

Threads: the C kernel runs its own pool of `threads` workers (default: the physical
cores this process may use). They spin `spin_us` after a call for the next one, then
sleep, so they neither burn a core between layers for long nor wait on torch's
OpenMP pool; torch's pool is idle while a call runs (the call blocks its caller).
`EDGEMOE_CPU_SPIN_US` sets the default spin (a decode step's layers come every few
hundred µs: a longer spin trades an idle core's time for the wake-up's latency).
The workers are pinned one to a core unless `EDGEMOE_CPU_PIN=0` (`cpu_pinning.py`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from edgemoe.env_switch import env_whole
from edgemoe.kernels import cpu_build, cpu_isa, cpu_pinning
from edgemoe.kernels.activations import kernel_name
from edgemoe.kernels.expert_bias import ExpertBias

log = logging.getLogger(__name__)

KERNEL_ENV = "EDGEMOE_CPU_KERNEL"
KERNELS = ("auto", "torch", "amx", "avx512", "avx2", "scalar", "amx-emu")
GEMM_MIN_TOKENS = 16  # jobs with at least this many tokens take the blocked (GEMM) path
# On AMX the blocked path wins from fewer tokens. A layer's 8 experts a call on the GPU
# machine's 16 cores (`scripts/gpu_cpu_ab.py --gemm-min-tokens 16 2`, 2026-12-04 18:18 UTC,
# the blocked path against the GEMV): bf16 ×0.98 / ×1.06 / ×1.36 at 6 / 8 / 12 tokens, fp8
# ×1.02 / ×1.08 / ×1.34, int4 ×0.89 / ×1.02 / ×1.35, int8 ×0.83 / ×0.96 / ×1.25. The GEMV
# converts and multiplies every weight again for each 4 tokens; the blocked path converts
# once and runs the tiles. AVX-512 without AMX keeps 16: its GEMV was ×2.3 the blocked bf16
# path at 8 tokens on the dev VM's AMD EPYC (AVX-512 BF16).
AMX_GEMM_MIN_TOKENS = {"bf16": 8, "fp8": 8, "int8": 12, "int4": 8, "mxfp4": 8}

_creating = threading.Lock()  # one pool starting at a time: its workers are found as the new threads
SPIN_US = 200  # idle workers spin this long for the next call (a layer later), then sleep
# NOTE: em_job in expert.c: gate_up, down, tokens, out_rows, scale addresses; n; gate_up/down
# scales; gate_up/down zero points (int4); gate_up/down bias rows (0: none)
JOB_FIELDS = 12
BIAS_FIELDS = slice(10, 12)  # a job's gate_up [2I] and down [H] bias addresses
# Weight formats of a call (EM_W_* in em_quant.h).
WEIGHT_FORMATS = {"bf16": 0, "int8": 1, "fp8": 2, "int4": 3, "mxfp4": 4}
# The GLUs the C kernel computes (EM_ACT_* in em_glu.h), by `Activation.kernel_name`.
KERNEL_ACTS = {"silu": 0, "swiglu_oai": 1}


class Glu(NamedTuple):
    """A call's GLU and its jobs' bias dtype, as `em_experts` takes them (em_glu.h): `act`
    an EM_ACT_* code, swiglu_oai's `alpha` and `limit`, biases bf16 (`bias_bf16`) or fp32."""

    act: int = KERNEL_ACTS["silu"]
    alpha: float = 0.0
    limit: float = 0.0
    bias_bf16: bool = False


SILU = Glu()  # the kernel's GLU without biases: every caller before gpt-oss


def kernel_glu(act: Callable[[torch.Tensor], torch.Tensor], bias: ExpertBias | None = None) -> Glu | None:
    """The C kernel's form of `act` (SiLU as F.silu or an Activation, swiglu_oai with its
    alpha and limit) with `bias` (None: no biases), or None when the kernel can't compute
    them — an activation it lacks (gelu, …), or biases it can't read in place (off the CPU,
    another dtype than bf16 / fp32, gate_up's unlike down's, rows not dense): the caller's
    torch path."""
    bf16 = False
    if bias is not None:
        gu, dn = bias.gate_up, bias.down
        if not (gu.device.type == dn.device.type == "cpu" and gu.dtype == dn.dtype
                and gu.dtype in (torch.bfloat16, torch.float32) and gu.stride(-1) == dn.stride(-1) == 1):
            return None
        bf16 = gu.dtype == torch.bfloat16
    name = "silu" if act is F.silu else kernel_name(act)
    if name == "silu":
        return Glu(bias_bf16=bf16)
    if name == "swiglu_oai":
        return Glu(KERNEL_ACTS[name], float(act.alpha), float(act.limit), bf16)  # type: ignore[attr-defined]
    return None


def _spin_us() -> int:
    """`EDGEMOE_CPU_SPIN_US` (µs idle workers spin before sleeping), else SPIN_US."""
    return env_whole("EDGEMOE_CPU_SPIN_US", SPIN_US, "microseconds")


def default_gemm_min_tokens(variant: str, weights: str) -> int:
    """The fewest tokens a job in `weights` takes `variant`'s blocked path with."""
    return AMX_GEMM_MIN_TOKENS[weights] if variant == "amx" else GEMM_MIN_TOKENS


def _gemm_min_tokens_env() -> int | None:
    """`EDGEMOE_CPU_GEMM_MIN_TOKENS` (one threshold for every format: an A/B), else None."""
    value = env_whole("EDGEMOE_CPU_GEMM_MIN_TOKENS", 0, "tokens", minimum=1)
    return value or None

POOL_STATS = ("rescued", "left_behind", "slots_peak", "inside")  # em_pool_stats' order


class CpuExperts:
    """A kernel variant with its thread pool (`name == "torch"`: no C kernel).

    Contract: calls on one instance are serialised (a lock in C; ctypes releases the
    GIL, so other Python threads run meanwhile). Every address in a job table must
    stay valid and unmodified for the call. `close()` joins the workers.
    """

    def __init__(self, kernel: str | None = None, threads: int | None = None,
                 gemm_min_tokens: int | None = None, spin_us: int | None = None,
                 lib: ctypes.CDLL | None = None) -> None:
        """`gemm_min_tokens`: jobs of this many tokens or more take the blocked path, in
        every weight format (None: `EDGEMOE_CPU_GEMM_MIN_TOKENS`, else `gemm_threshold`'s
        per-format default). `lib`: the variant's library built otherwise
        (`cpu_build.load_tuned`: an A/B script's builds), instead of its default build."""
        self._pool: int | None = None
        self._pid = -1
        self.pinned: dict[int, int] = {}  # worker thread id -> CPU (cpu_pinning.py)
        cpu_pinning.pin_mode()  # a bad $EDGEMOE_CPU_PIN fails here, at start-up, not at the first call
        self.requested = kernel or os.environ.get(KERNEL_ENV) or "auto"
        if self.requested not in KERNELS:
            raise ValueError(f"CPU expert kernel {self.requested!r}: choose one of {', '.join(KERNELS)}")
        self.name = resolve_kernel(self.requested)
        self.threads = threads or cpu_isa.physical_cores()
        self.gemm_min_tokens = gemm_min_tokens if gemm_min_tokens is not None else _gemm_min_tokens_env()
        self.spin_us = spin_us if spin_us is not None else _spin_us()
        self._lib = lib or (None if self.name == "torch" else cpu_build.load(self.name))

    def __repr__(self) -> str:
        return f"CpuExperts({self.name!r}, threads={self.threads})"

    def gemm_threshold(self, weights: str) -> int:
        """The fewest tokens a job in `weights` takes the blocked path with: the one this
        kernel was given (its argument or the environment's), else AMX's per-format
        crossover, else GEMM_MIN_TOKENS."""
        if self.gemm_min_tokens is not None:
            return self.gemm_min_tokens
        return default_gemm_min_tokens(self.name, weights)

    @property
    def native(self) -> bool:
        """True when a C variant runs (False: the torch path)."""
        return self._lib is not None

    @property
    def lib(self) -> ctypes.CDLL | None:
        """The loaded C library (`cpu_build._declare`'s entry points); None for "torch"."""
        return self._lib

    def handle(self) -> int:
        """The C thread pool (created on first use in this process): `em_*` calls' first argument."""
        return self._handle()

    def _handle(self) -> int:
        # NOTE: worker threads do not survive fork(): a child builds its own pool.
        if self._pool is None or self._pid != os.getpid():
            self.pinned = {}  # a forked child's copy names its parent's threads
            mode = cpu_pinning.pin_mode()
            pin = cpu_pinning.pin_wanted(mode) and os.path.isdir("/proc/self/task")
            with _creating:  # the new threads are told apart by who started since `before`
                before = cpu_pinning.thread_ids() if pin else set()
                self._pool = self._lib.em_create(self.threads, self.spin_us)
                if not self._pool:
                    raise MemoryError("CPU expert thread pool")
                self._pid = os.getpid()
                if pin:
                    self._pin(cpu_pinning.new_workers(before, self.threads - 1), all_or_none=mode == "auto")
        return self._pool

    def _pin(self, workers: set[int], all_or_none: bool) -> None:
        self.pinned = cpu_pinning.pin_workers(workers, all_or_none)
        if self.pinned:
            log.info("CPU expert pool: %d workers pinned to CPUs %s", len(self.pinned), sorted(self.pinned.values()))
        elif workers:
            log.info("CPU expert pool: %d workers float (fewer free cores than workers)", len(workers))

    def call(self, x: torch.Tensor, table: np.ndarray, out: torch.Tensor, hidden: int, inter: int,
             weights: str = "bf16", block: int = 0, glu: Glu = SILU) -> None:
        """Run a job table (int64 [jobs, JOB_FIELDS], see expert.c's em_job) on x [T, H]
        (fp32/bf16, CPU) into out [R, H] fp32, the weights in `weights` (bf16, int8, fp8
        in `block` x `block` blocks, or int4 in groups of `block` along K), the GLU `glu`
        (`kernel_glu`; its bias dtype that of the jobs' bias rows, BIAS_FIELDS). The caller
        guarantees the addresses."""
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        if x.stride(-1) != 1:
            x = x.contiguous()
        if out.dtype != torch.float32 or out.dim() != 2 or out.stride(-1) != 1 or out.device.type != "cpu":
            raise ValueError("out must be a CPU fp32 [R, H] tensor with unit inner stride")
        if x.shape[1] != hidden or out.shape[1] != hidden or x.device.type != "cpu":
            raise ValueError(f"x [T, {x.shape[1]}] / out [R, {out.shape[1]}] must be CPU tensors with H={hidden}")
        assert table.dtype == np.int64 and table.shape[1:] == (JOB_FIELDS,) and table.flags.c_contiguous
        rc = self._lib.em_experts(
            self._handle(), x.data_ptr(), int(x.dtype == torch.bfloat16), x.stride(0), out.data_ptr(),
            out.stride(0), hidden, inter, table.__array_interface__["data"][0], table.shape[0], self.gemm_threshold(weights),
            WEIGHT_FORMATS[weights], block, glu.act, glu.alpha, glu.limit, int(glu.bias_bf16),
        )
        if rc == -2:
            raise MemoryError("CPU expert kernel: workspace allocation failed")
        if rc != 0:
            raise ValueError(f"CPU expert kernel rejected its arguments ({rc})")

    def _live_pool(self) -> bool:
        """This process's C pool exists (none before the first call, after close, or in a
        forked child, whose copy of the handle names its parent's threads)."""
        return self._pool is not None and self._pid == os.getpid() and self._lib is not None

    def pool_stats(self) -> dict[str, int]:
        """The pool's counters (`em_pool_stats`, kernels/cpu/em_detach.h): tasks run again
        for a late worker (`rescued`), the CPU share's calls that returned with a worker still
        inside (`left_behind`: most only leaving it; stragglers show as `rescued`), the most
        call slots in use at once (`slots_peak`), and the
        threads inside a call now (`inside`); zeros before the pool's first call."""
        if not self._live_pool():
            return dict.fromkeys(POOL_STATS, 0)
        out = (ctypes.c_int64 * len(POOL_STATS))()
        self._lib.em_pool_stats(self._pool, out)
        return dict(zip(POOL_STATS, out, strict=True))

    def quiesce(self) -> None:
        """Return once no pool thread is inside a call — a detached call's late worker may
        still read the call's inputs after it returned (kernels/cpu/em_detach.h): call this
        before freeing a host function's mailbox buffers or banks while the pool lives on."""
        if self._live_pool():
            self._lib.em_quiesce(self._pool)

    def read(self, buf: torch.Tensor) -> int:
        """Read `buf` once across the pool (memory bandwidth probe); returns a checksum."""
        if self._lib is None:
            return int(buf.view(torch.int64).sum())
        return int(self._lib.em_read(self._handle(), buf.data_ptr(), buf.numel() * buf.element_size() // 8 * 8))

    def close(self) -> None:
        if self._live_pool():
            self._lib.em_destroy(self._pool)
            cpu_pinning.release(self.pinned)
        self._pool, self.pinned = None, {}

    def __del__(self) -> None:
        self.close()


@functools.cache
def _warn_no_compiler() -> None:
    log.warning("no C compiler found ($CC, cc, gcc or clang): CPU experts use torch's slower bf16 path")


@functools.cache
def _auto_kernel() -> str:
    if cpu_build.find_compiler() is None:
        _warn_no_compiler()
        return "torch"
    for variant in cpu_isa.AUTO_ORDER:
        if not cpu_isa.supported(variant):
            continue
        try:
            cpu_build.load(variant)
            return variant
        except (cpu_build.BuildError, RuntimeError, OSError) as e:
            # NOTE: a warning: this CPU runs the variant, so its loss costs speed the user
            # should hear about (a build error showed only as a slower fallback, 2026-12-04)
            log.warning("CPU expert kernel %s unavailable, trying the next: %s", variant, e)
    return "torch"


def best_variant_strictly() -> str:
    """The variant `auto` picks, refusing a fallback from a better one this CPU runs: for
    measurements, where an avx512 figure taken on an AMX machine (its amx build failed)
    would be a wrong answer, not a slower one (two GPU calls lost so on 2026-12-04)."""
    variant = _auto_kernel()
    best = next((v for v in cpu_isa.AUTO_ORDER if cpu_isa.supported(v)), "torch")
    if variant != best:
        raise RuntimeError(f"this CPU runs the {best} kernel but it did not load (the log says why); "
                           f"{variant} would be measured in its place")
    return variant


def resolve_kernel(requested: str) -> str:
    """`requested` → the variant to run ("auto" picks; an explicit one must be supported)."""
    if requested == "auto":
        return _auto_kernel()
    if requested != "torch" and not cpu_isa.supported(requested):
        raise ValueError(f"CPU expert kernel {requested!r} needs instructions this CPU lacks")
    return requested


@functools.cache
def default_cpu_experts() -> CpuExperts:
    """The process-wide kernel (`EDGEMOE_CPU_KERNEL`, physical cores)."""
    return CpuExperts()
