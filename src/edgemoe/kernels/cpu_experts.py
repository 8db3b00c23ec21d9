"""Routed experts on the host CPU: y = down @ (silu(gate @ x) * (up @ x)) with bf16
weights read in place from the expert store, fp32 accumulation, fp32 results; or
gpt-oss's experts, y = down @ glu(gate @ x + b_g, up @ x + b_u) + b_d with its clamped
SwiGLU (`kernels/cpu/em_glu.h`).

Entry points (the kernel object and its variants: `cpu_kernel.CpuExperts`):
- `expert_mlp_cpu(x, gate_up, down, kernel, act, bias)` → [n, H]: one expert on its tokens
  (reference: `expert_mlp_ref`, everything fp32);
- `experts_cpu(x, jobs, out)`: several experts of one layer in one call, each an
  `ExpertJob` (weights, rows of x, rows of out, per-token scale) (`experts_ref`);
- `moe_experts_partial_cpu(...)`: `kernels.moe_experts.moe_experts_partial`'s
  signature — routing [T, K], banks [S, …] addressed by row, contrib [T, K, H] cells;
- `moe_experts_cpu(...)`: the same with per-expert (gate_up, down) pairs, for stores
  that hand out experts one by one (`ExpertStore.expert`);
- `moe_expert_cells_cpu(...)`: per-expert pairs too, but the cells come back compact
  (cell indices + values), for executors that scatter them into device cells.
The routed forms build their job table in numpy in one pass (a few µs), since a
decode step calls them once per MoE layer.

The C kernel computes SiLU and swiglu_oai (`clamped_swiglu`: its alpha and limit are
the call's), with or without expert biases (`ExpertBias`, bf16 or fp32, read in place:
the routed forms' `bias` [E, …] by expert id, an `ExpertJob`'s its expert's rows). Other
activations (gelu, …), biases elsewhere than on the CPU, or no compiler take the torch
path (`expert_mlp_torch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from edgemoe.kernels.cpu_kernel import BIAS_FIELDS, JOB_FIELDS, CpuExperts, default_cpu_experts, kernel_glu
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.moe_reference import Activation, expert_mlp, moe_experts_partial_ref

# (x, gate_up, down, act, this expert's biases) → y fp32
ExpertMLP = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Activation, ExpertBias | None], torch.Tensor]


@dataclass(frozen=True)
class ExpertJob:
    """One expert's work: rows `tokens` of x through (gate_up [2I, H], down [H, I]) and
    its biases (`bias`: [2I], [H], or None); result row t goes to out[out_rows[t]]
    (default t), times scale[t] (default 1)."""

    gate_up: torch.Tensor
    down: torch.Tensor
    tokens: torch.Tensor
    out_rows: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    bias: ExpertBias | None = None


def bias_addresses(bias: ExpertBias | None, experts: Sequence[int], hidden: int, inter: int) -> np.ndarray:
    """int64 [len(experts), 2]: each expert's gate_up and down bias rows in the bias banks
    [E, 2I] / [E, H], by expert id (a job table's BIAS_FIELDS); zeros without biases."""
    out = np.zeros((len(experts), 2), dtype=np.int64)
    if bias is None:
        return out
    E = bias.gate_up.shape[0]
    if tuple(bias.gate_up.shape) != (E, 2 * inter) or tuple(bias.down.shape) != (E, hidden):
        raise ValueError(f"bias gate_up {tuple(bias.gate_up.shape)} / down {tuple(bias.down.shape)} "
                         f"are not [E, 2I={2 * inter}] / [E, H={hidden}]")
    ids = np.asarray(experts, dtype=np.int64)
    # NOTE: the C kernel trusts every address: an id past the banks would read wild memory.
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        raise IndexError(f"expert ids outside the biases' [0, {E})")
    for col, bank in enumerate((bias.gate_up, bias.down)):
        out[:, col] = bank.data_ptr() + ids * bank.stride(0) * bank.element_size()
    return out


def _one_expert(bias: ExpertBias) -> ExpertBias:
    """An expert's biases ([2I], [H]) as banks of one expert ([1, 2I], [1, H])."""
    return ExpertBias(bias.gate_up.unsqueeze(0), bias.down.unsqueeze(0))


# ---- references ----


def expert_mlp_ref(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: Activation = F.silu,
                   bias: ExpertBias | None = None) -> torch.Tensor:
    """The oracle: everything in fp32 (weights and biases upcast). x [n, H] → [n, H] fp32."""
    return expert_mlp(x.float(), gate_up.float(), down.float(), act, bias).float()


def expert_mlp_torch(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: Activation = F.silu,
                     bias: ExpertBias | None = None) -> torch.Tensor:
    """The fallback: torch in the weights' dtype (bf16 on CPU is slow: PERF-NOTES), at
    `moe_reference.expert_mlp`'s rounding points."""
    return expert_mlp(x.to(gate_up.dtype), gate_up, down, act, bias).float()


def _run_jobs(mlp: ExpertMLP, x: torch.Tensor, jobs: Sequence[ExpertJob], out: torch.Tensor,
              act: Activation = F.silu) -> None:
    for job in jobs:
        if job.tokens.numel() == 0:
            continue
        y = mlp(x[job.tokens.long()], job.gate_up, job.down, act, job.bias)  # [n, H] fp32
        if job.scale is not None:
            y = y * job.scale.float()[:, None]
        rows = job.out_rows.long() if job.out_rows is not None else torch.arange(y.shape[0])
        out[rows.to(out.device)] = y.to(out.device)


def experts_ref(x: torch.Tensor, jobs: Sequence[ExpertJob], out: torch.Tensor, act: Activation = F.silu) -> None:
    """`experts_cpu` through `expert_mlp_ref`."""
    _run_jobs(expert_mlp_ref, x, jobs, out, act)


# ---- one expert, explicit jobs ----


def expert_mlp_cpu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, kernel: CpuExperts | None = None,
                   act: Activation = F.silu, bias: ExpertBias | None = None) -> torch.Tensor:
    """One expert on its tokens: x [n, H], gate_up [2I, H], down [H, I] (biases [2I], [H])
    → [n, H] fp32."""
    out = torch.empty(x.shape[0], x.shape[1], dtype=torch.float32)
    job = ExpertJob(gate_up, down, torch.arange(x.shape[0], dtype=torch.int32), bias=bias)
    experts_cpu(x, [job], out, kernel, act)
    return out


def experts_cpu(x: torch.Tensor, jobs: Sequence[ExpertJob], out: torch.Tensor,
                kernel: CpuExperts | None = None, act: Activation = F.silu) -> None:
    """out[job.out_rows] = job.scale * expert(x[job.tokens]) for every job; other rows
    of out are untouched. x [T, H] fp32/bf16; out [R, H] fp32; weights bf16; the jobs'
    biases (if any) in one dtype (others, or an activation the C kernel lacks: torch)."""
    kernel = kernel or default_cpu_experts()
    if not jobs:
        return
    biased = [j.bias for j in jobs if j.bias is not None]
    glus = {kernel_glu(act, b) for b in biased} if biased else {kernel_glu(act)}
    glu = glus.pop() if len(glus) == 1 else None  # jobs' biases in two dtypes: torch
    native = kernel.native and x.device.type == "cpu" and glu is not None
    if not (native and all(_weights_ok(j.gate_up, j.down) for j in jobs)):
        _run_jobs(expert_mlp_torch, x, jobs, out, act)
        return
    assert glu is not None
    hidden, inter = _shape(jobs[0].gate_up, jobs[0].down)
    keep: list[torch.Tensor] = []  # NOTE: converted index tensors must outlive the call
    table = np.zeros((len(jobs), JOB_FIELDS), dtype=np.int64)
    for j, job in enumerate(jobs):
        if _shape(job.gate_up, job.down) != (hidden, inter):
            raise ValueError("experts_cpu: every job of a call must have the same [H, I]")
        tokens = _index(job.tokens, x.shape[0], "tokens", keep)
        n = tokens.numel()
        rows = _index(job.out_rows, out.shape[0], "out_rows", keep, n) if job.out_rows is not None else None
        scale = _keep(job.scale.to("cpu", torch.float32).contiguous(), keep, n, "scale") if job.scale is not None else None
        # bf16: no scale or zero-point addresses (the table's later fields stay 0)
        table[j, :6] = (job.gate_up.data_ptr(), job.down.data_ptr(), tokens.data_ptr(),
                        rows.data_ptr() if rows is not None else 0, scale.data_ptr() if scale is not None else 0, n)
        if job.bias is not None:
            table[j, BIAS_FIELDS] = bias_addresses(_one_expert(job.bias), [0], hidden, inter)[0]
    kernel.call(x, table, out, hidden, inter, glu=glu)


def _shape(gate_up: torch.Tensor, down: torch.Tensor) -> tuple[int, int]:
    """(H, I), checking gate_up [2I, H] against down [H, I]."""
    two_i, hidden = gate_up.shape[-2:]
    if tuple(down.shape[-2:]) != (hidden, two_i // 2) or two_i % 2:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} are not [2I, H], [H, I]")
    return hidden, two_i // 2


def _weights_ok(gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """bf16 CPU tensors whose last two dims are dense (bank rows or single experts)."""
    return all(
        t.dtype == torch.bfloat16 and t.device.type == "cpu" and t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]
        for t in (gate_up, down)
    )


def _keep(t: torch.Tensor, keep: list[torch.Tensor], n: int, name: str) -> torch.Tensor:
    if t.numel() != n:
        raise ValueError(f"ExpertJob.{name} has {t.numel()} entries for {n} tokens")
    keep.append(t)
    return t


def _index(t: torch.Tensor, limit: int, name: str, keep: list[torch.Tensor], n: int | None = None) -> torch.Tensor:
    t = t.to("cpu", torch.int32).contiguous()
    # NOTE: the C kernel trusts every index; one bad row would read or write wild memory.
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= limit):
        raise IndexError(f"ExpertJob.{name} outside [0, {limit})")
    return _keep(t, keep, t.numel() if n is None else n, name)


# ---- routed forms (the executors' entry points) ----


@dataclass(frozen=True)
class RoutedCells:
    """A routing's (token, k) cells grouped by expert: expert i owns [lo[i], hi[i])."""

    tokens: np.ndarray  # int32 [C]: token of each cell
    cells: np.ndarray  # int32 [C]: t*K + k, a row of contrib viewed [T*K, H]
    scale: np.ndarray  # float32 [C]: routing weight of the cell
    lo: np.ndarray  # int64 [len(experts)]
    hi: np.ndarray


def route_cells(topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int]) -> RoutedCells:
    """Group the cells of a routing [T, K] by the given (distinct) experts."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).cpu().numpy()
    order = np.argsort(flat, kind="stable")  # cells grouped by expert id, ascending within
    if len(set(experts)) != len(experts):
        raise ValueError("route_cells: experts must be distinct")
    ids = np.asarray(experts, dtype=flat.dtype)
    grouped = flat[order]
    scale = topk_weights.reshape(-1).cpu().float().numpy()[order]
    return RoutedCells((order // k).astype(np.int32), order.astype(np.int32), np.ascontiguousarray(scale),
                       np.searchsorted(grouped, ids, "left"), np.searchsorted(grouped, ids, "right"))


def _routed_table(cells: RoutedCells, gate_up_addr: np.ndarray, down_addr: np.ndarray,
                  bias_addr: np.ndarray | None = None) -> np.ndarray:
    """The job table of `cells`: expert i's weights at gate_up_addr[i] / down_addr[i], its
    bias rows at bias_addr[i] ([jobs, 2], `bias_addresses`; None: none)."""
    table = np.zeros((len(cells.lo), JOB_FIELDS), dtype=np.int64)
    table[:, 0], table[:, 1] = gate_up_addr, down_addr
    if bias_addr is not None:
        table[:, BIAS_FIELDS] = bias_addr
    for col, arr in ((2, cells.tokens), (3, cells.cells), (4, cells.scale)):
        table[:, col] = _address(arr) + 4 * cells.lo  # 4 bytes: int32 / float32
    table[:, 5] = cells.hi - cells.lo
    return table


def _address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]  # NOTE: 10× cheaper than arr.ctypes.data


def _contrib_ok(x: torch.Tensor, topk_ids: torch.Tensor, contrib: torch.Tensor) -> bool:
    return (x.device.type == contrib.device.type == "cpu" and contrib.dtype == torch.float32
            and contrib.is_contiguous() and tuple(contrib.shape) == (*topk_ids.shape, x.shape[1]))


def moe_experts_partial_cpu(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
    rows: Sequence[int], gate_up: torch.Tensor, down: torch.Tensor, act: Activation, contrib: torch.Tensor,
    kernel: CpuExperts | None = None, bias: ExpertBias | None = None,
) -> None:
    """`moe_experts_partial_ref`'s contract on the CPU kernel: fill contrib[t, k] for
    every (t, k) routed to one of `experts`, whose weights are bank rows `rows` of
    gate_up [S, 2I, H] / down [S, H, I], biases `bias` [E, …] by expert id. Activations the
    C kernel lacks, weights other than bf16, or device tensors run the reference instead."""
    kernel = kernel or default_cpu_experts()
    glu = kernel_glu(act, bias)
    if not (kernel.native and glu is not None and _weights_ok(gate_up, down) and _contrib_ok(x, topk_ids, contrib)):
        moe_experts_partial_ref(x, topk_ids, topk_weights, experts, rows, gate_up, down, act, contrib, bias)
        return
    hidden, inter = _shape(gate_up, down)
    table, _cells = bank_job_table(topk_ids, topk_weights, experts, rows, gate_up, down, bias)
    kernel.call(x, table, contrib.view(-1, hidden), hidden, inter, glu=glu)


def bank_job_table(topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int], rows: Sequence[int],
                   gate_up: torch.Tensor, down: torch.Tensor,
                   bias: ExpertBias | None = None) -> tuple[np.ndarray, RoutedCells]:
    """`moe_experts_partial_cpu`'s job table (bf16 bank rows `rows` of `experts`, their
    biases by expert id) and the cells its addresses point into: keep both alive until the
    call returns."""
    r = np.asarray(rows, dtype=np.int64)
    if r.size and (r.min() < 0 or r.max() >= gate_up.shape[0] or gate_up.shape[0] != down.shape[0]):
        raise IndexError(f"bank rows outside [0, {gate_up.shape[0]})")
    hidden, inter = _shape(gate_up, down)
    cells = route_cells(topk_ids, topk_weights, experts)
    gate_up_addr, down_addr = gate_up.data_ptr() + r * gate_up.stride(0) * 2, down.data_ptr() + r * down.stride(0) * 2
    table = _routed_table(cells, gate_up_addr, down_addr, bias_addresses(bias, experts, hidden, inter))
    return table, cells


def moe_experts_cpu(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
    weights: Sequence[tuple[torch.Tensor, torch.Tensor]], contrib: torch.Tensor, kernel: CpuExperts | None = None,
    act: Activation = F.silu, bias: ExpertBias | None = None,
) -> None:
    """As `moe_experts_partial_cpu` with weights[i] = (gate_up [2I, H], down [H, I]) of
    experts[i], e.g. `[store.expert(layer, e) for e in experts]`; `bias` [E, …] by expert
    id. The C kernel for bf16 experts (`kernel_glu`), torch otherwise."""
    kernel = kernel or default_cpu_experts()
    cells = route_cells(topk_ids, topk_weights, experts)
    glu = kernel_glu(act, bias)
    native = kernel.native and glu is not None
    if not (native and _contrib_ok(x, topk_ids, contrib) and all(_weights_ok(*w) for w in weights)):
        jobs = _torch_jobs(cells, experts, weights, cells.cells, bias)
        _run_jobs(expert_mlp_torch, x, jobs, contrib.view(-1, contrib.shape[-1]), act)
        return
    hidden, inter = _shape(*weights[0]) if weights else (x.shape[1], 1)
    if any(_shape(*w) != (hidden, inter) for w in weights):
        raise ValueError("moe_experts_cpu: every expert of a call must have the same [H, I]")
    table = _routed_table(cells, np.array([w[0].data_ptr() for w in weights], dtype=np.int64),
                          np.array([w[1].data_ptr() for w in weights], dtype=np.int64),
                          bias_addresses(bias, experts, hidden, inter))
    kernel.call(x, table, contrib.view(-1, hidden), hidden, inter, glu=glu)


def _torch_jobs(cells: RoutedCells, experts: Sequence[int], weights: Sequence[tuple[torch.Tensor, torch.Tensor]],
                out_rows: np.ndarray, bias: ExpertBias | None) -> list[ExpertJob]:
    """The torch path's jobs: expert i's cells [lo, hi) into rows out_rows[lo:hi]."""
    return [ExpertJob(gu, dn, torch.from_numpy(cells.tokens[lo:hi]), torch.from_numpy(out_rows[lo:hi]),
                      torch.from_numpy(cells.scale[lo:hi]), bias.of(e) if bias is not None else None)
            for e, (gu, dn), lo, hi in zip(experts, weights, cells.lo, cells.hi, strict=True)]


def _only(cells: RoutedCells) -> RoutedCells:
    """`cells` cut down to the given experts' ranges, which become contiguous: cell
    i of the result is row i of a compact output."""
    n = cells.hi - cells.lo
    keep = np.concatenate([np.arange(lo, hi) for lo, hi in zip(cells.lo, cells.hi, strict=True)]
                          or [np.zeros(0, np.int64)])
    hi = np.cumsum(n)
    return RoutedCells(cells.tokens[keep], cells.cells[keep], np.ascontiguousarray(cells.scale[keep]), hi - n, hi)


def moe_expert_cells_cpu(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[int],
    weights: Sequence[tuple[torch.Tensor, torch.Tensor]], kernel: CpuExperts | None = None,
    act: Activation = F.silu, bias: ExpertBias | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cells of `experts` compactly, for executors that scatter them elsewhere (the
    device's cells): (cells [C] int64, values [C, H] fp32), values[i] = the contribution
    of cell `cells[i]` = t*K + k of the routing [T, K]; each expert's cells together, in
    (t, k) order. weights[i] = (gate_up [2I, H], down [H, I]) of experts[i]; `bias` [E, …]
    by expert id. Other weights than bf16, an activation or biases the C kernel can't take
    (`kernel_glu`), or no native kernel: torch in the weights' dtype."""
    kernel = kernel or default_cpu_experts()
    cells = _only(route_cells(topk_ids, topk_weights, experts))
    rows = np.arange(len(cells.cells), dtype=np.int32)  # cell i → row i of values
    values = torch.empty(len(rows), x.shape[1], dtype=torch.float32)
    glu = kernel_glu(act, bias)
    native = kernel.native and glu is not None
    if native and x.device.type == "cpu" and weights and all(_weights_ok(*w) for w in weights):
        hidden, inter = _shape(*weights[0])
        if any(_shape(*w) != (hidden, inter) for w in weights):
            raise ValueError("moe_expert_cells_cpu: every expert of a call must have the same [H, I]")
        table = _routed_table(RoutedCells(cells.tokens, rows, cells.scale, cells.lo, cells.hi),
                              np.array([w[0].data_ptr() for w in weights], dtype=np.int64),
                              np.array([w[1].data_ptr() for w in weights], dtype=np.int64),
                              bias_addresses(bias, experts, hidden, inter))
        kernel.call(x, table, values, hidden, inter, glu=glu)
    else:
        _run_jobs(expert_mlp_torch, x, _torch_jobs(cells, experts, weights, rows, bias), values, act)
    return torch.from_numpy(cells.cells.astype(np.int64)), values
