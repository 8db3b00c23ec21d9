"""Fused MoE by slot: the torch reference against the executors' kernels, and the Triton
kernels (under the interpreter on CPU) against the reference."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

from edgemoe.kernels import moe_experts, moe_reference
from edgemoe.kernels.activations import ACTIVATIONS
from edgemoe.kernels.moe_fused import moe_slots_ref
from edgemoe.kernels.moe_reference import moe_combine_ref
from edgemoe.testing.kernel_inputs import moe_batch

T, K, H, I, S = 6, 3, 48, 40, 5  # H, I not multiples of the tiles: masks are exercised
# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")


def row_tolerance(want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-cell bound, scaled by the cell's largest element.

    bf16/fp16: each of the 4 roundings of the chain (projection, act, product, down)
    may land one ulp (2^-7 / 2^-10 relative) apart once fp32 sums run in another order.
    fp32: sums of <= 48 terms in another order, ~48 * 2^-24 relative, with margin."""
    rel = {torch.bfloat16: 4 * 2**-7, torch.float16: 4 * 2**-10, torch.float32: 1e-5}[dtype]
    return rel * want.abs().amax(dim=-1, keepdim=True) + 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slot_ref_matches_executor_kernel(dtype: torch.dtype) -> None:
    # Experts live in a slot cache (expert e in slot slot_of[e], -1 = not resident): the
    # slot form must equal `moe_experts_partial_ref` called with the (expert, row) pairs.
    E = 7
    b = moe_batch(T, K, H, I, E, dtype, seed=1)
    slot_of = torch.tensor([3, -1, 0, 4, -1, 1, 2])
    resident = [e for e in range(E) if slot_of[e] >= 0]
    gu_slots = torch.zeros(S, 2 * I, H, dtype=dtype)
    down_slots = torch.zeros(S, H, I, dtype=dtype)
    for e in resident:
        gu_slots[slot_of[e]], down_slots[slot_of[e]] = b.gate_up[e], b.down[e]
    want = torch.full((T, K, H), float("nan"))
    moe_reference.moe_experts_partial_ref(
        b.x, b.slot_ids, b.weights, resident, slot_of[resident].tolist(), gu_slots, down_slots, ACTIVATIONS["silu"], want
    )
    got = torch.full((T, K, H), float("nan"))
    moe_slots_ref(b.x, slot_of[b.slot_ids.long()].to(torch.int32), b.weights, gu_slots, down_slots, got, "silu")
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    assert got.isnan().any()  # some cells were routed to non-resident experts and left alone


def test_slot_ref_formula_fp64() -> None:
    b = moe_batch(T, K, H, I, S, torch.float32, seed=2, unrouted=0.3)
    cells = torch.full((T, K, H), float("nan"))
    moe_slots_ref(b.x, b.slot_ids, b.weights, b.gate_up, b.down, cells, "gelu_tanh")
    for t in range(T):
        for k in range(K):
            s = int(b.slot_ids[t, k])
            if s < 0:
                assert cells[t, k].isnan().all()
                continue
            gate, up = (b.gate_up[s].double() @ b.x[t].double()).chunk(2)
            h = torch.nn.functional.gelu(gate, approximate="tanh") * up
            want = b.weights[t, k].double() * (b.down[s].double() @ h)
            # fp32 sums of <= 48 terms per stage: relative error well under 1e-5.
            torch.testing.assert_close(cells[t, k].double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_combine_ref_matches_executor_combine(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    # Multiples of 1/16 below 8: every partial sum is exact in fp32, in any order, so the
    # fixed-order sum must equal torch's sum bitwise; the residual add then rounds once.
    cells = torch.randint(-128, 128, (T, K, H), generator=g).float() / 16
    residual = torch.randn(T, H, generator=g).to(dtype)
    assert torch.equal(moe_combine_ref(cells, dtype), moe_experts.moe_combine(cells, dtype))
    assert torch.equal(moe_combine_ref(cells, dtype, residual), residual + moe_experts.moe_combine(cells, dtype))
    random_cells = torch.randn(T, K, H, generator=g)
    # Arbitrary fp32 cells: sum orders may differ by fp32 rounding, which can move the
    # rounded result by at most one ulp of the dtype.
    ulp = {torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]
    got, want = moe_combine_ref(random_cells, dtype).float(), moe_experts.moe_combine(random_cells, dtype).float()
    assert ((got - want).abs() <= ulp * want.abs() + 1e-6).all()


def triton_moe(name: str):  # noqa: ANN201
    if name == "decode":
        from edgemoe.kernels.triton_ops.moe_gemv import moe_decode_triton

        return moe_decode_triton
    from edgemoe.kernels.triton_ops.moe_gemm import moe_prefill_triton

    return moe_prefill_triton


@needs_triton
@pytest.mark.parametrize("path", ["decode", "prefill"])
@pytest.mark.parametrize(("dtype", "act"), [(torch.float32, "silu"), (torch.bfloat16, "silu"), (torch.bfloat16, "gelu"),
                                            (torch.float16, "gelu_tanh")])
def test_triton_moe_matches_ref(path: str, dtype: torch.dtype, act: str) -> None:
    b = moe_batch(T, K, H, I, S, dtype, seed=4, unrouted=0.25)
    want = torch.full((T, K, H), float("nan"))
    moe_slots_ref(b.x, b.slot_ids, b.weights, b.gate_up, b.down, want, act)
    got = torch.full((T, K, H), float("nan"))  # poisoned: unwritten cells stay NaN
    triton_moe(path)(b.x, b.slot_ids, b.weights, b.gate_up, b.down, got, act)
    skipped = (b.slot_ids < 0)[..., None].expand_as(got)
    assert skipped.any() and got[skipped].isnan().all()  # -1 cells untouched
    assert not got[~skipped].isnan().any()
    assert ((got - want).abs()[~skipped] <= row_tolerance(want, dtype).expand_as(got)[~skipped]).all()


@needs_triton
@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_triton_moe_batch_invariant(path: str) -> None:
    # A token's cells must not depend on the other tokens of the batch (tiles never
    # depend on T): token 2 alone, and among others (prefill: 72 tokens give several
    # BLOCK_M blocks per slot; decode programs are per pair, 9 tokens are enough).
    tokens = 72 if path == "prefill" else 9
    b = moe_batch(tokens, K, H, I, S, torch.bfloat16, seed=5)
    kernel = triton_moe(path)
    full = torch.zeros(tokens, K, H)
    kernel(b.x, b.slot_ids, b.weights, b.gate_up, b.down, full, "silu")
    alone = torch.zeros(1, K, H)
    kernel(b.x[2:3], b.slot_ids[2:3], b.weights[2:3], b.gate_up, b.down, alone, "silu")
    assert torch.equal(alone[0], full[2])


@needs_triton
def test_triton_moe_workspace() -> None:
    from edgemoe.kernels.triton_ops.moe_gemv import moe_decode_triton

    b = moe_batch(2, K, H, I, S, torch.bfloat16, seed=6)
    want, got = torch.zeros(2, K, H), torch.zeros(2, K, H)
    moe_decode_triton(b.x, b.slot_ids, b.weights, b.gate_up, b.down, want, "silu")
    workspace = torch.empty(1000 + 2 * K * I, dtype=torch.bfloat16)  # larger than needed: a graph's static buffer
    moe_decode_triton(b.x, b.slot_ids, b.weights, b.gate_up, b.down, got, "silu", workspace)
    assert torch.equal(got, want)


# Split-K of the decode gate/up launch: odd H and I (no multiple of COLS or of S), and
# 16-column tiles so that H = 75 splits into 48 + 27 (S = 2), 32 + 32 + 11 (S = 3) and
# 32 + 32 + 11 + 0 (S = 4: an empty split must contribute zeros); 3 row tiles each way,
# the last partial. Few programs: the interpreter's cost is per program and op.
SPLIT_H, SPLIT_I, SPLIT_K = 75, 37, 2


def split_tiles(monkeypatch: pytest.MonkeyPatch, splits: int) -> None:
    monkeypatch.setenv("EDGEMOE_MOE_GEMV_TILES", f"16,16,1,32,16,1,{splits}")


@needs_triton
@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("splits", [1, 2, 3, 4])
def test_triton_decode_split_k_matches_ref(monkeypatch: pytest.MonkeyPatch, splits: int, tokens: int) -> None:
    split_tiles(monkeypatch, splits)
    b = moe_batch(tokens, SPLIT_K, SPLIT_H, SPLIT_I, 4, torch.bfloat16, seed=10 + tokens, unrouted=0.3)
    b.slot_ids[0, 1] = -1  # a padding pair in every case (T = 1 too)
    want = torch.full((tokens, SPLIT_K, SPLIT_H), float("nan"))
    moe_slots_ref(b.x, b.slot_ids, b.weights, b.gate_up, b.down, want, "silu")
    got = torch.full_like(want, float("nan"))  # poisoned: unwritten cells stay NaN
    triton_moe("decode")(b.x, b.slot_ids, b.weights, b.gate_up, b.down, got, "silu")
    skipped = (b.slot_ids < 0)[..., None].expand_as(got)
    assert got[skipped].isnan().all() and not got[~skipped].isnan().any()
    # S only reorders the fp32 sums of each projection: the 4-rounding bound of the S = 1 path.
    assert ((got - want).abs()[~skipped] <= row_tolerance(want, torch.bfloat16).expand_as(got)[~skipped]).all()


@needs_triton
@pytest.mark.parametrize(("dtype", "act", "splits"), [(torch.float32, "gelu", 4), (torch.float16, "gelu_tanh", 3)])
def test_triton_decode_split_k_dtypes(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, act: str,
                                      splits: int) -> None:
    # fp32: no rounding between the partial sums and the activation, so only the order of
    # <= 75-term fp32 sums differs (~75 * 2^-24 relative, inside row_tolerance's 1e-5).
    split_tiles(monkeypatch, splits)
    b = moe_batch(3, SPLIT_K, SPLIT_H, SPLIT_I, 4, dtype, seed=12, unrouted=0.2)
    want, got = torch.zeros(3, SPLIT_K, SPLIT_H), torch.zeros(3, SPLIT_K, SPLIT_H)
    moe_slots_ref(b.x, b.slot_ids, b.weights, b.gate_up, b.down, want, act)
    triton_moe("decode")(b.x, b.slot_ids, b.weights, b.gate_up, b.down, got, act)
    assert ((got - want).abs() <= row_tolerance(want, dtype)).all()


@needs_triton
def test_triton_decode_split_k_batch_invariant(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pair's partials and their fixed-order sum depend on its token alone: bitwise the
    # same cell whether the token runs alone or in a batch of 3.
    split_tiles(monkeypatch, 4)
    b = moe_batch(3, SPLIT_K, SPLIT_H, SPLIT_I, 4, torch.bfloat16, seed=13)
    kernel = triton_moe("decode")
    full, alone = torch.zeros(3, SPLIT_K, SPLIT_H), torch.zeros(1, SPLIT_K, SPLIT_H)
    kernel(b.x, b.slot_ids, b.weights, b.gate_up, b.down, full, "silu")
    kernel(b.x[1:2], b.slot_ids[1:2], b.weights[1:2], b.gate_up, b.down, alone, "silu")
    assert torch.equal(alone[0], full[1])


@needs_triton
def test_triton_decode_split_k_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    # With a split the workspace holds the fp32 partials: the memory plan's size for them
    # (split_partials_bytes) must be enough, and an activation-dtype buffer is refused.
    from edgemoe.kernels.moe_gemv_tiles import split_partials_bytes

    split_tiles(monkeypatch, 3)
    b = moe_batch(1, SPLIT_K, SPLIT_H, SPLIT_I, 4, torch.bfloat16, seed=14)
    kernel = triton_moe("decode")
    want, got = torch.zeros(1, SPLIT_K, SPLIT_H), torch.zeros(1, SPLIT_K, SPLIT_H)
    kernel(b.x, b.slot_ids, b.weights, b.gate_up, b.down, want, "silu")
    planned = split_partials_bytes(SPLIT_K, SPLIT_I) // 4
    kernel(b.x, b.slot_ids, b.weights, b.gate_up, b.down, got, "silu", torch.empty(planned, dtype=torch.float32))
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="workspace needs"):
        kernel(b.x, b.slot_ids, b.weights, b.gate_up, b.down, got, "silu", torch.empty(planned, dtype=torch.bfloat16))


def spy_stages(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Records the STAGES each decode kernel is launched with (then launches it)."""
    from edgemoe.kernels.triton_ops import moe_gemv

    seen: dict[str, int] = {}

    class Spy:
        def __init__(self, name: str) -> None:
            self.name, self.kernel = name, getattr(moe_gemv, name)

        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]:
            def launch(*args: Any, **kwargs: Any) -> object:
                seen[self.name] = kwargs["STAGES"]
                return self.kernel[grid](*args, **kwargs)

            return launch

    for name in ("_gate_up_gemv", "_down_gemv"):
        monkeypatch.setattr(moe_gemv, name, Spy(name))
    return seen


@needs_triton
@pytest.mark.parametrize(("splits", "stages"), [(1, 2), (1, 3), (3, 2)])
def test_triton_decode_stages(monkeypatch: pytest.MonkeyPatch, splits: int, stages: int) -> None:
    # Software pipelining (the 8th and 9th override values, `num_stages` of the step loops)
    # only moves when a step's loads are issued, never what is summed in which order: the
    # cells must be the unpipelined kernel's bit for bit, and within the reference's bound.
    # (The interpreter runs the loop as written; tests/gpu/test_moe_gemv_gpu.py checks the
    # compiled pipelines.) Odd H and I: the last step is partial, the masks feed the stages.
    b = moe_batch(2, SPLIT_K, SPLIT_H, SPLIT_I, 4, torch.bfloat16, seed=15, unrouted=0.25)
    want = torch.zeros(2, SPLIT_K, SPLIT_H)
    moe_slots_ref(b.x, b.slot_ids, b.weights, b.gate_up, b.down, want, "silu")
    plain, piped = torch.zeros_like(want), torch.zeros_like(want)
    split_tiles(monkeypatch, splits)
    triton_moe("decode")(b.x, b.slot_ids, b.weights, b.gate_up, b.down, plain, "silu")
    monkeypatch.setenv("EDGEMOE_MOE_GEMV_TILES", f"16,16,1,32,16,2,{splits},{stages},{stages + 1}")
    launched = spy_stages(monkeypatch)
    triton_moe("decode")(b.x, b.slot_ids, b.weights, b.gate_up, b.down, piped, "silu")
    assert launched == {"_gate_up_gemv": stages, "_down_gemv": stages + 1}  # the override reached both launches
    assert torch.equal(piped, plain)
    assert ((piped - want).abs() <= row_tolerance(want, torch.bfloat16)).all()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_combine_bitwise(dtype: torch.dtype) -> None:
    from edgemoe.kernels.triton_ops.moe_combine import moe_combine_triton

    g = torch.Generator().manual_seed(7)
    cells = torch.randn(T, K, 600, generator=g)  # two column blocks, the second partial
    residual = torch.randn(T, 600, generator=g).to(dtype)
    assert torch.equal(moe_combine_triton(cells, dtype), moe_combine_ref(cells, dtype))
    assert torch.equal(moe_combine_triton(cells, dtype, residual), moe_combine_ref(cells, dtype, residual))


@needs_triton
def test_align_pairs() -> None:
    from edgemoe.kernels.triton_ops.moe_gemm import align_pairs

    slot_ids = torch.tensor([[2, 0], [2, -1], [-1, 2], [0, 4]], dtype=torch.int32)
    blocks = align_pairs(slot_ids, num_slots=5, block_m=4)
    P = slot_ids.numel()
    rows = blocks.sorted_pairs.view(-1, 4)
    assert rows.shape[0] == blocks.block_slot.numel() == -(-(P + 5 * 3) // 4)
    # slot 0: pairs 1, 6; slot 2: pairs 0, 2, 5; slot 4: pair 7; then padding blocks.
    assert blocks.block_slot.tolist()[:3] == [0, 2, 4] and set(blocks.block_slot.tolist()[3:]) == {-1}
    assert rows[:3].tolist() == [[1, 6, P, P], [0, 2, 5, P], [7, P, P, P]]
