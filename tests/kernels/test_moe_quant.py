"""Fused MoE over quantised slot banks: the Triton kernels (under the interpreter on CPU)
against the dequantise-first torch reference, every format, decode and prefill; the
reference against the plain slot reference on dequantised banks."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest
import torch

from edgemoe.kernels.moe_fused import moe_slots_ref
from edgemoe.kernels.moe_quant import moe_quant_ref, moe_slots_parts
from edgemoe.quant import (
    Fp8Block,
    Int4Group,
    Int8Channel,
    Mxfp4,
    dequantise_expert,
    quantise_expert,
)
from edgemoe.testing.kernel_inputs import moe_batch

T, K, H, I, S = 6, 3, 80, 40, 5  # H, I not multiples of the tiles; several groups/blocks per row
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
# Small groups/blocks so the tiny banks hold several per row and per column (fp8: gate/up
# halves of I = 40 rows end mid-block).
FORMATS = {"int8": Int8Channel(), "fp8": Fp8Block(block=16), "int4": Int4Group(group=16), "mxfp4": Mxfp4()}


def quantised_banks(fmt, dtype: torch.dtype, seed: int, unrouted: float = 0.25,  # noqa: ANN001, ANN201
                    tokens: int = T, top_k: int = K):
    """A routed batch with its banks quantised: (batch, parts [S, ...], dequantised banks in fp32)."""
    b = moe_batch(tokens, top_k, H, I, S, torch.float32, seed=seed, unrouted=unrouted)
    experts = [quantise_expert(fmt, b.gate_up[s, :I], b.gate_up[s, I:], b.down[s]) for s in range(S)]
    parts = {name: torch.stack([e[name] for e in experts]) for name in experts[0]}
    deq = [dequantise_expert(fmt, e, H, I) for e in experts]
    return dataclasses.replace(b, x=b.x.to(dtype)), parts, torch.stack([d[0] for d in deq]), torch.stack([d[1] for d in deq])


@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_quant_ref_is_the_slot_ref_on_dequantised_banks(fmt_name: str) -> None:
    b, parts, gate_up, down = quantised_banks(FORMATS[fmt_name], torch.float32, seed=1)
    want, got = torch.full((T, K, H), float("nan")), torch.full((T, K, H), float("nan"))
    moe_slots_ref(b.x, b.slot_ids, b.weights, gate_up, down, want, "silu")
    moe_quant_ref(b.x, b.slot_ids, b.weights, parts, FORMATS[fmt_name], got, "silu")
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    again = torch.full((T, K, H), float("nan"))
    moe_slots_parts(b.x, b.slot_ids, b.weights, parts, FORMATS[fmt_name], torch.nn.functional.silu, again)
    assert torch.equal(again.nan_to_num(), got.nan_to_num())


def tolerance(want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-cell bound scaled by the cell's row maximum. fp32: the kernels dequantise to the
    reference's exact fp32 weights; only the order of <= 80-term fp32 sums differs (~80·2^-24,
    with margin). bf16: moe_fused's 4 roundings of the chain, one ulp (2^-7) each, plus the
    weights' rounding to bf16 (the reference's, and the prefill MMA's), one more per projection."""
    rel = {torch.float32: 1e-5, torch.bfloat16: 6 * 2**-7}[dtype]
    return rel * want.abs().amax(dim=-1, keepdim=True) + 1e-30


def triton_kernel(path: str):  # noqa: ANN201
    if path == "decode":
        from edgemoe.kernels.triton_ops.moe_gemv_q import moe_decode_q_triton

        return moe_decode_q_triton
    from edgemoe.kernels.triton_ops.moe_gemm_q import moe_prefill_q_triton

    return moe_prefill_q_triton


@needs_triton
@pytest.mark.parametrize("path", ["decode", "prefill"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_triton_quant_matches_reference(fmt_name: str, dtype: torch.dtype, path: str) -> None:
    fmt = FORMATS[fmt_name]
    b, parts, _, _ = quantised_banks(fmt, dtype, seed=4)
    want = torch.full((T, K, H), float("nan"))
    moe_quant_ref(b.x, b.slot_ids, b.weights, parts, fmt, want, "silu")
    got = torch.full((T, K, H), float("nan"))  # poisoned: unwritten cells stay NaN
    triton_kernel(path)(b.x, b.slot_ids, b.weights, parts, fmt, got, "silu")
    skipped = (b.slot_ids < 0)[..., None].expand_as(got)
    assert skipped.any() and got[skipped].isnan().all()  # -1 cells untouched
    assert not got[~skipped].isnan().any()
    assert ((got - want).abs()[~skipped] <= tolerance(want, dtype).expand_as(got)[~skipped]).all()


@needs_triton
def test_triton_quant_at_default_groups() -> None:
    # The production group/block sizes (128; mxfp4 32) on one tiny bank: one partial group per
    # row. Two tokens of two experts: the routing cases are the test above's (the interpreter
    # runs the int4 / mxfp4 unpacking op by op, ~1 s a routed pair).
    for fmt in (Fp8Block(), Int4Group(), Mxfp4()):
        b, parts, _, _ = quantised_banks(fmt, torch.float32, seed=5, unrouted=0.0, tokens=2, top_k=2)
        want, got = torch.zeros(2, 2, H), torch.zeros(2, 2, H)
        moe_quant_ref(b.x, b.slot_ids, b.weights, parts, fmt, want, "silu")
        triton_kernel("decode")(b.x, b.slot_ids, b.weights, parts, fmt, got, "silu")
        assert ((got - want).abs() <= tolerance(want, torch.float32)).all(), fmt.label


def f8_activation_bound(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Bound [H] on |y_fp8 − y| for one expert when its activations are rounded to e4m3
    with one scale per row per 128 inputs (scale = max|a| / 448): each activation is off by
    <= 2^-4·|a| (3 mantissa bits) + 2^-10·scale (the subnormal spacing); the error goes
    through silu·up (slope <= 1.1) and the down projection, in fp64 from the exact values."""
    xd, w, d = x.double(), gate_up.double(), down.double()

    def rounding(a: torch.Tensor) -> torch.Tensor:
        blocks = torch.nn.functional.pad(a.abs(), (0, -a.numel() % 128)).view(-1, 128)
        scale = (blocks.amax(dim=1) / 448).repeat_interleave(128)[: a.numel()]
        return 2**-4 * a.abs() + 2**-10 * scale

    inter = w.shape[0] // 2
    g, u = (w @ xd).split(inter)
    eg, eu = (w.abs() @ rounding(xd)).split(inter)
    s = torch.nn.functional.silu(g)
    h = s * u
    eh = 1.1 * eg * u.abs() + s.abs() * eu + 1.1 * eg * eu
    return (d.abs() @ (eh + rounding(h) + 2**-4 * eh)).float()


@needs_triton
@pytest.mark.parametrize("f8dot", [True, False])
def test_triton_prefill_fp8_arithmetic(f8dot: bool) -> None:
    from edgemoe.kernels.triton_ops.moe_gemm_q import moe_prefill_q_triton

    fmt = Fp8Block()  # 128 x 128 blocks: the fp8 path's tiles span one block of K
    b, parts, gate_up, down = quantised_banks(fmt, torch.bfloat16, seed=6, unrouted=0.0)
    want = torch.zeros(T, K, H)
    moe_quant_ref(b.x, b.slot_ids, b.weights, parts, fmt, want, "silu")
    got = torch.zeros(T, K, H)
    moe_prefill_q_triton(b.x, b.slot_ids, b.weights, parts, fmt, got, "silu", f8dot=f8dot)
    bound = tolerance(want, torch.bfloat16).expand(T, K, H).clone()
    if f8dot:
        for t in range(T):
            for k in range(K):
                s = int(b.slot_ids[t, k])
                bound[t, k] += b.weights[t, k] * f8_activation_bound(b.x[t].float(), gate_up[s], down[s])
    assert ((got - want).abs() <= bound).all()
    if f8dot:  # the fp8 path really ran: activations' rounding shows
        assert not torch.equal(got, want)


@needs_triton
@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_fp8_weights_without_the_e4m3_type(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # sm_80/86 Triton has no e4m3 type: the kernels convert the bytes with integer
    # arithmetic there (the GPU machine never runs that path).
    from edgemoe.kernels.triton_ops import moe_gemm_q, moe_gemv_q

    for module in (moe_gemv_q, moe_gemm_q):
        monkeypatch.setattr(module, "fp8_hardware", lambda t: False)
    fmt = FORMATS["fp8"]
    b, parts, _, _ = quantised_banks(fmt, torch.float32, seed=9)
    want, got = torch.zeros(T, K, H), torch.zeros(T, K, H)
    moe_quant_ref(b.x, b.slot_ids, b.weights, parts, fmt, want, "silu")
    triton_kernel(path)(b.x, b.slot_ids, b.weights, parts, fmt, got, "silu")
    assert ((got - want).abs() <= tolerance(want, torch.float32)).all()
