"""The CPU's share of a MoE layer as a C host function (`kernels/cpu/em_host.h`): the
mailboxes it reads and writes, and the direct call.

`em_host_layer(mailbox)` has a CUDA host callback's signature, so a captured decode step
holds it as a host node (`kernels/host_func.py`) and no Python runs between the device's
writes and the CPU experts. Per MoE layer one mailbox (an int64 row, `MAILBOX_FIELDS`):
the layer's bank addresses and the kernel's settings, written once here; the buffers
the device fills before the node runs are shared by every layer (`MailboxBuffers`): a
layer's node has finished, and its cells been copied out, before the next layer writes
them (one stream orders the layers).

Everything is allocated once, at fixed addresses (a captured graph holds them): pinned
and mapped into the device's address space on a GPU (`moe/cpu_share.device_views`), plain memory on a
CPU. `HostLayerMailboxes.fill` + `run` are the CPU-test path (the same mailbox and C
function, called directly).

gpt-oss's experts: the model's activation (`act`: swiglu_oai's alpha and limit) and each
layer's expert biases (`ExpertBias` banks [E, 2I] / [E, H] on the CPU, bf16 or fp32) are
registered once, with the banks; the function reads a pair's biases by its expert id.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.nn.functional import silu

from edgemoe.kernels.cpu_kernel import JOB_FIELDS, WEIGHT_FORMATS, CpuExperts, Glu, kernel_glu
from edgemoe.kernels.expert_bias import ExpertBias

Parts = dict[str, torch.Tensor]  # a layer's banks by part: gate_up [E, 2I, H], down [E, H, I], scales

# NOTE: the order of em_mailbox's fields in em_host.h, every one int64.
MAILBOX_FIELDS = (
    "pool", "gate_up", "down", "gate_up_stride", "down_stride", "gate_up_scale", "down_scale",
    "gate_up_scale_stride", "down_scale_stride", "gate_up_zero", "down_zero", "gate_up_zero_stride",
    "down_zero_stride", "num_experts", "H", "I", "wfmt", "blk", "gemm_min_tokens",
    "x", "x_bf16", "x_stride", "x_rows", "count", "pairs", "weights", "cap", "out", "scratch", "status",
    "calls", "busy_ns",
    "fit_seq", "fit_n", "fit_j", "fit_p", "fit_t", "fit_jj", "fit_jp", "fit_pp", "fit_jt", "fit_pt",
    "act", "alpha", "limit", "bias_bf16", "gate_up_bias", "down_bias", "gate_up_bias_stride", "down_bias_stride",
)
FIT_SUMS = ("fit_n", "fit_j", "fit_p", "fit_t", "fit_jj", "fit_jp", "fit_pp", "fit_jt", "fit_pt")
F = {name: i for i, name in enumerate(MAILBOX_FIELDS)}
JOB_BYTES = 8 * JOB_FIELDS  # sizeof(em_job): int64 fields


def _alloc(shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, pin_memory=pinned)


def _f64_bits(value: float) -> int:
    """A double's bits as an int64 (the mailbox's alpha and limit)."""
    return struct.unpack("<q", struct.pack("<d", value))[0]


def _glu_fields(glu: Glu, bias: ExpertBias | None, shape: tuple[int, int, int]) -> dict[str, int]:
    """A layer's GLU and bias banks (checked: [E, 2I] / [E, H], dense, on the CPU) as mailbox fields."""
    out = {"act": glu.act, "alpha": _f64_bits(glu.alpha), "limit": _f64_bits(glu.limit),
           "bias_bf16": int(glu.bias_bf16)}
    if bias is None:
        return out
    E, hidden, inter = shape
    for name, bank, want in (("gate_up_bias", bias.gate_up, (E, 2 * inter)), ("down_bias", bias.down, (E, hidden))):
        if tuple(bank.shape) != want or not bank.is_contiguous():
            raise ValueError(f"expert bias {name} {tuple(bank.shape)} must be a contiguous [{want[0]}, {want[1]}] bank")
        out[name], out[f"{name}_stride"] = bank.data_ptr(), bank.stride(0) * bank.element_size()
    return out


class MailboxBuffers(NamedTuple):
    """The device-written areas, shared by every layer's mailbox (host tensors).

    `pairs` [3, cap] int32 (token row, expert id, pair index), `weights` [cap] fp32: the
    CPU pairs in pair order; column cap - 1 is a trash entry for masked writes, so at most
    cap - 1 pairs. `count` [1] int32. `x` [rows, H] in the activations' dtype. `out`
    [cap, H] fp32: the C function's cells."""

    count: torch.Tensor
    pairs: torch.Tensor
    weights: torch.Tensor
    x: torch.Tensor
    out: torch.Tensor
    scratch: torch.Tensor

    @property
    def cap(self) -> int:
        return self.pairs.shape[1]


class HostLayerMailboxes:
    """One mailbox per layer of `banks` (layer → its parts, weights in `weights`: the C
    kernel's kind and fp8 block or int4 group, `WEIGHT_FORMATS`) over shared buffers sized for `rows`
    token rows of `top_k` pairs each (or `pairs` CPU pairs a call, when fewer than the rows
    could route), activations in `x_dtype` (bf16 or fp32). `kernel`:
    a native `CpuExperts` (its pool runs the experts); `pinned`: page-locked buffers (a GPU
    writes them through mapped views, `moe/cpu_share.device_views`). `act`: the experts'
    activation (SiLU or swiglu_oai); `biases`: layer → its `ExpertBias` (gpt-oss; None or
    a layer left out: no biases).

    Contract: the banks, the biases, the kernel and this object outlive every call of the
    function on a mailbox (a captured graph included); calls on one object are serialised
    (one stream orders them). Dropping it waits for the kernel's late workers (`quiesce`)."""

    def __init__(self, banks: dict[int, Parts], weights: tuple[str, int], kernel: CpuExperts, rows: int,
                 top_k: int, x_dtype: torch.dtype, pinned: bool = False, pairs: int | None = None,
                 act: Callable[[torch.Tensor], torch.Tensor] = silu,
                 biases: dict[int, ExpertBias] | None = None) -> None:
        if not kernel.native or weights[0] not in WEIGHT_FORMATS:
            raise ValueError(f"the CPU share needs the C expert kernel and bf16/int8/fp8/int4/mxfp4 weights "
                             f"(got {weights[0]}, kernel {kernel.name})")
        if x_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"activations must be bf16 or fp32 (got {x_dtype})")
        biases = biases or {}
        if unknown := set(biases) - set(banks):
            raise ValueError(f"biases for layers without banks: {sorted(unknown)}")
        glus = {layer: kernel_glu(act, biases.get(layer)) for layer in banks}
        if None in glus.values():
            raise ValueError(f"the C expert kernel can't compute {getattr(act, 'kernel_name', act)!r} experts "
                             f"with these biases (CPU tensors, bf16 or fp32, gate_up's dtype as down's)")
        self.banks, self.biases, self.kernel, self.rows, self.top_k = banks, biases, kernel, rows, top_k
        first = next(iter(banks.values()))
        # NOTE: from gate_up's rows and down's rows: int4's packed columns are not I
        E, hidden, inter = first["down"].shape[0], first["down"].shape[1], first["gate_up"].shape[1] // 2
        cap = (rows * top_k if pairs is None else pairs) + 1  # + the trash column
        ints = 3 * cap + 2 * (E + 1)
        self.buffers = MailboxBuffers(
            count=_alloc((1,), torch.int32, pinned), pairs=_alloc((3, cap), torch.int32, pinned),
            weights=_alloc((cap,), torch.float32, pinned), x=_alloc((rows, hidden), x_dtype, pinned),
            out=_alloc((cap, hidden), torch.float32, pinned),
            scratch=_alloc(((ints * 4 + 63) // 64 * 64 + cap * JOB_BYTES,), torch.uint8, False),
        )
        self.layer_row = {layer: i for i, layer in enumerate(banks)}
        self.table = torch.zeros(len(banks), len(MAILBOX_FIELDS), dtype=torch.int64)
        b = self.buffers
        common = {
            "pool": kernel.handle(), "num_experts": E, "H": hidden, "I": inter, "wfmt": WEIGHT_FORMATS[weights[0]],
            "blk": weights[1], "gemm_min_tokens": kernel.gemm_threshold(weights[0]), "x": b.x.data_ptr(),
            "x_bf16": int(x_dtype == torch.bfloat16), "x_stride": hidden, "x_rows": rows,
            "count": b.count.data_ptr(), "pairs": b.pairs.data_ptr(), "weights": b.weights.data_ptr(), "cap": cap,
            "out": b.out.data_ptr(), "scratch": b.scratch.data_ptr(),
        }
        for layer, row in self.layer_row.items():
            glu = _glu_fields(glus[layer], biases.get(layer), (E, hidden, inter))  # type: ignore[arg-type]
            for name, value in {**common, **self._bank_fields(layer), **glu}.items():
                self.table[row, F[name]] = value

    def _bank_fields(self, layer: int) -> dict[str, int]:
        parts = self.banks[layer]
        out: dict[str, int] = {}
        for name in ("gate_up", "down", "gate_up_scale", "down_scale", "gate_up_zero", "down_zero"):
            t = parts.get(name)
            if t is None:
                continue
            if not t.is_contiguous() or t.device.type != "cpu":
                raise ValueError(f"layer {layer}'s {name} bank must be a contiguous host tensor")
            out[name], out[f"{name}_stride"] = t.data_ptr(), t.stride(0) * t.element_size()
        return out

    def __del__(self) -> None:
        # A detached call's late worker may still read the buffers and banks after the call
        # returned (kernels/cpu/em_detach.h): they go only once it has left.
        kernel = getattr(self, "kernel", None)
        if kernel is not None:
            try:
                kernel.quiesce()
            except Exception:  # noqa: BLE001 - interpreter shutdown: modules half gone, the pool's threads too
                pass

    def address(self, layer: int) -> int:
        """The mailbox of `layer` (the host function's argument)."""
        return self.table.data_ptr() + self.layer_row[layer] * len(MAILBOX_FIELDS) * 8

    def busy(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([layers] calls that had pairs, [layers] their wall time in ns), cumulative, in
        the order of `banks` (a racy read while a graph runs: a layer may be one call ahead)."""
        return self.table[:, F["calls"]].clone(), self.table[:, F["busy_ns"]].clone()

    def fit_sums(self) -> dict[str, float]:
        """The decayed sums of every layer's calls, added over the layers (`em_host_fit`:
        n, j = jobs, p = pairs, t = ns, and their products), each row read consistently
        (retried while its writer is inside)."""
        first, cols, seq_at = F["fit_n"], len(FIT_SUMS), F["fit_seq"]
        table = self.table.numpy()  # the same memory: the C thread's writes show
        total = [0.0] * cols
        for row in range(table.shape[0]):
            for _ in range(1000):
                seq = int(table[row, seq_at])
                values = table[row, first : first + cols].copy()
                if seq % 2 == 0 and int(table[row, seq_at]) == seq:
                    total = [t + v for t, v in zip(total, values.view("float64").tolist(), strict=True)]
                    break
        return dict(zip(FIT_SUMS, total, strict=True))

    def status(self, layer: int) -> int:
        """The last call's result on `layer`'s mailbox (0: done)."""
        return int(self.table[self.layer_row[layer], F["status"]])

    def run(self, layer: int) -> None:
        """Call the host function on `layer`'s mailbox now, on this thread (CPU tensors;
        a GPU launches it on a stream: `kernels/host_func.py`)."""
        self.kernel.lib.em_host_layer(self.address(layer))

    @property
    def function(self) -> int:
        """The address of `em_host_layer` (a host node's function)."""
        return ctypes.cast(self.kernel.lib.em_host_layer, ctypes.c_void_p).value or 0

    def fill(self, x: torch.Tensor, tokens: torch.Tensor, experts: torch.Tensor, pairs: torch.Tensor,
             weights: torch.Tensor) -> None:
        """Write a step's CPU pairs from host tensors (tests; the executor writes the same
        buffers with device ops): x [T, H], and per pair its token row, expert, pair index
        and routing weight ([n] each)."""
        b, n = self.buffers, tokens.numel()
        if n > b.cap - 1 or x.shape[0] > self.rows:
            raise ValueError(f"{n} pairs / {x.shape[0]} rows exceed the mailbox ({b.cap - 1} / {self.rows})")
        b.x[: x.shape[0]].copy_(x)
        b.pairs[:, :n].copy_(torch.stack((tokens, experts, pairs)).to(torch.int32))
        b.weights[:n].copy_(weights)
        b.count.fill_(n)

    def cells(self, n: int) -> torch.Tensor:
        """[n, H] fp32: the last call's cells (a view)."""
        return self.buffers.out[:n]
