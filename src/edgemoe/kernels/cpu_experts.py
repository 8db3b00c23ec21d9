"""Routed experts on the host CPU: y = down @ (silu(gate @ x) * (up @ x)), bf16 weights
read in place from the expert store, fp32 accumulation and output.

Forms (each with a torch reference of the same signature):
- `expert_mlp_cpu(x, gate_up, down)` → [n, H] fp32: one expert on its tokens;
- `experts_cpu(x, jobs, out)`: several experts of one layer in one call; each
  `ExpertJob` names its weights, its rows of x, the rows of `out` it writes and a
  per-token scale;
- `moe_experts_partial_cpu(...)`: `kernels.moe_experts.moe_experts_partial`'s
  signature (routing [T, K] + banks addressed by row → contrib [T, K, H] cells).

Kernel choice (`CpuExperts`, or `EDGEMOE_CPU_KERNEL`): `auto` takes the fastest of
amx > avx512 > avx2 that this CPU has and the compiler builds (`cpu_build`), else
torch; `torch`, `scalar` and each variant can be forced (tests, comparisons). The C
kernel runs its own pool of `threads` workers (default: physical cores) that sleep
between calls; torch's intra-op pool is idle meanwhile (the call blocks its caller).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from edgemoe.kernels import cpu_build, cpu_isa
from edgemoe.kernels.moe_experts import Activation, moe_experts_partial_ref

log = logging.getLogger(__name__)

KERNEL_ENV = "EDGEMOE_CPU_KERNEL"
KERNELS = ("auto", "torch", "amx", "avx512", "avx2", "scalar", "amx-emu")
GEMM_MIN_TOKENS = 16  # jobs with at least this many tokens take the blocked (GEMM) path


@dataclass(frozen=True)
class ExpertJob:
    """One expert's work: rows `tokens` of x through (gate_up [2I, H], down [H, I]);
    result row t goes to out[out_rows[t]] (default t), times scale[t] (default 1)."""

    gate_up: torch.Tensor
    down: torch.Tensor
    tokens: torch.Tensor
    out_rows: torch.Tensor | None = None
    scale: torch.Tensor | None = None


# ---- references ----


def expert_mlp_ref(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The oracle: everything in fp32 (weights upcast). x [n, H] → [n, H] fp32."""
    gate, up = F.linear(x.float(), gate_up.float()).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down.float())


def expert_mlp_torch(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The fallback: torch in the weights' dtype (bf16 on CPU: slow, see PERF-NOTES)."""
    gate, up = F.linear(x.to(gate_up.dtype), gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down).float()


def _run_jobs(mlp, x: torch.Tensor, jobs: Sequence[ExpertJob], out: torch.Tensor) -> None:  # noqa: ANN001
    for job in jobs:
        if job.tokens.numel() == 0:
            continue
        y = mlp(x[job.tokens.long()], job.gate_up, job.down)  # [n, H] fp32
        if job.scale is not None:
            y = y * job.scale.float()[:, None]
        rows = job.out_rows.long() if job.out_rows is not None else torch.arange(y.shape[0])
        out[rows] = y


def experts_ref(x: torch.Tensor, jobs: Sequence[ExpertJob], out: torch.Tensor) -> None:
    """`experts_cpu` through `expert_mlp_ref`."""
    _run_jobs(expert_mlp_ref, x, jobs, out)


# ---- the kernel ----


class CpuExperts:
    """A kernel variant with its thread pool (or the torch path, `name == "torch"`).

    Contract: calls on one instance are serialised (a lock in C; ctypes releases the
    GIL, so other Python threads run meanwhile). Tensors passed must stay alive and
    unmodified for the call. `close()` joins the workers.
    """

    def __init__(self, kernel: str | None = None, threads: int | None = None,
                 gemm_min_tokens: int = GEMM_MIN_TOKENS) -> None:
        self._pool: int | None = None
        self._pid = -1
        self.requested = kernel or os.environ.get(KERNEL_ENV) or "auto"
        if self.requested not in KERNELS:
            raise ValueError(f"CPU expert kernel {self.requested!r}: choose one of {', '.join(KERNELS)}")
        self.name = resolve_kernel(self.requested)
        self.threads = threads or cpu_isa.physical_cores()
        self.gemm_min_tokens = gemm_min_tokens
        self._lib = None if self.name == "torch" else cpu_build.load(self.name)

    def __repr__(self) -> str:
        return f"CpuExperts({self.name!r}, threads={self.threads})"

    def _handle(self) -> int:
        # NOTE: worker threads do not survive fork(): a child builds its own pool.
        if self._pool is None or self._pid != os.getpid():
            self._pool = self._lib.em_create(self.threads)
            if not self._pool:
                raise MemoryError("CPU expert thread pool")
            self._pid = os.getpid()
        return self._pool

    def run(self, x: torch.Tensor, jobs: Sequence[ExpertJob], out: torch.Tensor) -> None:
        """out[job.out_rows] = job.scale * expert(x[job.tokens]) for every job; other
        rows of `out` are untouched. x [T, H] fp32/bf16; out [R, H] fp32."""
        if not jobs:
            return
        if self._lib is None or not self.accepts(jobs) or x.device.type != "cpu":
            _run_jobs(expert_mlp_torch, x, jobs, out)
            return
        keep: list[torch.Tensor] = []  # NOTE: holds converted tensors alive through the call
        table = np.zeros((len(jobs), 6), dtype=np.int64)
        for j, job in enumerate(jobs):
            tokens = _i32(job.tokens, keep)
            _check_rows(tokens, x.shape[0], "tokens")
            n = tokens.numel()
            rows = _i32(job.out_rows, keep) if job.out_rows is not None else None
            if rows is not None:
                _check_rows(rows, out.shape[0], "out_rows")
            scale = _f32(job.scale, keep) if job.scale is not None else None
            for t, name, size in ((rows, "out_rows", n), (scale, "scale", n)):
                if t is not None and t.numel() != size:
                    raise ValueError(f"ExpertJob.{name} has {t.numel()} entries for {n} tokens")
            table[j] = (job.gate_up.data_ptr(), job.down.data_ptr(), tokens.data_ptr(),
                        rows.data_ptr() if rows is not None else 0, scale.data_ptr() if scale is not None else 0, n)
        self._call(x, out, table, *_shape(jobs[0]))

    def _call(self, x: torch.Tensor, out: torch.Tensor, table: np.ndarray, hidden: int, inter: int) -> None:
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        if x.stride(-1) != 1:
            x = x.contiguous()
        if out.dtype != torch.float32 or out.dim() != 2 or out.stride(-1) != 1 or out.device.type != "cpu":
            raise ValueError("out must be a CPU fp32 [R, H] tensor with unit inner stride")
        if x.shape[1] != hidden or out.shape[1] != hidden:
            raise ValueError(f"x [T, {x.shape[1]}] / out [R, {out.shape[1]}] do not match H={hidden}")
        rc = self._lib.em_experts(
            self._handle(), x.data_ptr(), int(x.dtype == torch.bfloat16), x.stride(0), out.data_ptr(),
            out.stride(0), hidden, inter, table.ctypes.data, table.shape[0], self.gemm_min_tokens,
        )
        if rc != 0:
            raise MemoryError("CPU expert kernel: workspace allocation failed") if rc == -2 else ValueError(f"em_experts: {rc}")

    def accepts(self, jobs: Sequence[ExpertJob]) -> bool:
        """Whether the C kernel takes these weights: bf16, contiguous, one [H, I] shape."""
        if not jobs:
            return True
        shape = _shape(jobs[0])
        return all(
            j.gate_up.dtype == torch.bfloat16 and j.down.dtype == torch.bfloat16
            and j.gate_up.is_contiguous() and j.down.is_contiguous() and j.gate_up.device.type == "cpu"
            and j.down.device.type == "cpu" and _shape(j) == shape
            for j in jobs
        )

    def read(self, buf: torch.Tensor) -> int:
        """Read `buf` once across the pool (memory bandwidth probe); returns a checksum."""
        if self._lib is None:
            return int(buf.view(torch.int64).sum())
        return int(self._lib.em_read(self._handle(), buf.data_ptr(), buf.numel() * buf.element_size() // 8 * 8))

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid() and self._lib is not None:
            self._lib.em_destroy(self._pool)
        self._pool = None

    def __del__(self) -> None:
        self.close()


def _shape(job: ExpertJob) -> tuple[int, int]:
    """(H, I) of a job, checking gate_up [2I, H] against down [H, I]."""
    two_i, hidden = job.gate_up.shape
    if tuple(job.down.shape) != (hidden, two_i // 2) or two_i % 2:
        raise ValueError(f"gate_up {tuple(job.gate_up.shape)} and down {tuple(job.down.shape)} are not [2I, H], [H, I]")
    return hidden, two_i // 2


def _i32(t: torch.Tensor, keep: list[torch.Tensor]) -> torch.Tensor:
    t = t.to(device="cpu", dtype=torch.int32).contiguous()
    keep.append(t)
    return t


def _f32(t: torch.Tensor, keep: list[torch.Tensor]) -> torch.Tensor:
    t = t.to(device="cpu", dtype=torch.float32).contiguous()
    keep.append(t)
    return t


def _check_rows(rows: torch.Tensor, limit: int, name: str) -> None:
    # NOTE: the C kernel trusts every index; one bad row would read or write wild memory.
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= limit):
        raise IndexError(f"ExpertJob.{name} outside [0, {limit})")


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
            log.info("CPU expert kernel %s unavailable: %s", variant, e)
    return "torch"


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


# ---- entry points ----


def expert_mlp_cpu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                   kernel: CpuExperts | None = None) -> torch.Tensor:
    """One expert on its tokens: x [n, H], gate_up [2I, H], down [H, I] → [n, H] fp32."""
    out = torch.empty(x.shape[0], x.shape[1], dtype=torch.float32)
    job = ExpertJob(gate_up, down, torch.arange(x.shape[0], dtype=torch.int32))
    (kernel or default_cpu_experts()).run(x, [job], out)
    return out


def experts_cpu(x: torch.Tensor, jobs: Sequence[ExpertJob], out: torch.Tensor,
                kernel: CpuExperts | None = None) -> None:
    """Several experts of one layer in one call (see `CpuExperts.run`)."""
    (kernel or default_cpu_experts()).run(x, jobs, out)


def moe_experts_partial_cpu(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
    rows: Sequence[int], gate_up: torch.Tensor, down: torch.Tensor, act: Activation, contrib: torch.Tensor,
    kernel: CpuExperts | None = None,
) -> None:
    """`moe_experts_partial_ref`'s contract on the CPU kernel: fill contrib[t, k] for
    every (t, k) routed to one of `experts`, the weights of experts[i] being bank row
    rows[i] of gate_up [S, 2I, H] / down [S, H, I]. Any activation but SiLU, or
    weights the kernel does not take, run the reference instead."""
    kernel = kernel or default_cpu_experts()
    jobs = routed_jobs(topk_ids, topk_weights, experts, [(gate_up[r], down[r]) for r in rows])
    if act is not F.silu or kernel.name == "torch" or not kernel.accepts(jobs):
        moe_experts_partial_ref(x, topk_ids, topk_weights, experts, rows, gate_up, down, act, contrib)
        return
    kernel.run(x, jobs, contrib.view(-1, contrib.shape[-1]))


def routed_jobs(topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
                weights: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[ExpertJob]:
    """Jobs for `experts` under a routing [T, K]: expert i's tokens, the contrib cells
    t*K + k they fill (a [T*K, H] view of [T, K, H]) and their routing weights."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).cpu()
    ids = torch.as_tensor(list(experts), dtype=flat.dtype)
    cells = torch.nonzero(torch.isin(flat, ids)).squeeze(1)
    cells = cells[torch.argsort(flat[cells], stable=True)]  # grouped by expert, cells ascending
    bounds = torch.searchsorted(flat[cells], torch.stack([ids, ids + 1])).tolist()
    scale = topk_weights.reshape(-1).cpu().float()[cells]
    tokens, cells32 = (cells // k).int(), cells.int()
    return [
        ExpertJob(gu, dn, tokens[lo:hi], cells32[lo:hi], scale[lo:hi])
        for (gu, dn), lo, hi in zip(weights, bounds[0], bounds[1], strict=True)
    ]
