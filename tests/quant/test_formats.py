"""Expert formats: round trips within each format's bound, known values, and the
gpt-oss MXFP4 layout against transformers' own dequantiser."""

from __future__ import annotations

import pytest
import torch

from edgemoe.quant import (
    Dense,
    Fp8Block,
    Int4Group,
    Int8Channel,
    Mxfp4,
    dequantise_expert,
    expert_format,
    expert_nbytes,
    expert_specs,
    quantise_expert,
)
from edgemoe.quant.int4 import pack_nibbles, unpack_nibbles
from edgemoe.quant.mxfp4 import e2m1_encode

FORMATS = ["bf16", "fp8", "int8", "int4", "mxfp4"]


def weights(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # Rows of different magnitudes (scales must follow each row/block) and a zero row.
    w = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 1, rows)[:, None]
    w[1] = 0.0
    return w


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize(("rows", "cols"), [(40, 200), (32, 64), (130, 33)])  # partial groups/blocks, odd K
def test_round_trip_within_bound(name: str, rows: int, cols: int) -> None:
    fmt = expert_format(name)
    w = weights(rows, cols, seed=rows + cols)
    parts = fmt.quantise(w)
    specs = fmt.matrix_specs(rows, cols)
    assert {s: (tuple(t.shape), t.dtype) for s, t in parts.items()} == specs
    got = fmt.dequantise(parts, rows, cols)
    assert got.dtype == torch.float32 and got.shape == w.shape
    assert ((got - w).abs() <= fmt.error_bound(w)).all()
    assert (got[1] == 0).all()  # a zero row stays exactly zero
    assert fmt.matrix_nbytes(rows, cols) == sum(t.numel() * t.element_size() for t in parts.values())


def test_fp8_known_values_and_blocks() -> None:
    fmt = Fp8Block(block=4)
    w = torch.zeros(8, 8)
    w[:4, :4] = torch.tensor([448.0, 1.5, -0.25, 2**-9])  # block (0, 0): amax 448 → scale 1, all exact in e4m3
    w[4:, 4:] = 896.0  # block (1, 1): scale 2
    parts = fmt.quantise(w)
    assert parts["_scale"].tolist() == [[1.0, 1.0], [1.0, 2.0]]  # empty blocks keep scale 1
    assert torch.equal(fmt.dequantise(parts, 8, 8), w)
    # The plain definition: W[r, k] = q[r, k] * scale_inv[r // B, k // B].
    want = torch.empty(8, 8)
    for r in range(8):
        for k in range(8):
            want[r, k] = parts[""][r, k].float() * parts["_scale"][r // 4, k // 4]
    assert torch.equal(fmt.dequantise(parts, 8, 8), want)


def test_fp8_gate_up_halves_blocked_separately() -> None:
    # gate and up [I=6, H] are blocked on their own (I is not a multiple of the block):
    # row 6 (up's first row) uses up's first block scale, not gate's second.
    fmt = Fp8Block(block=4)
    gate, up, down = weights(6, 8, 1), weights(6, 8, 2) * 100, weights(8, 6, 3)
    parts = quantise_expert(fmt, gate, up, down)
    assert parts["gate_up_scale"].shape == (4, 2)
    gate_up, down_deq = dequantise_expert(fmt, parts, hidden=8, inter=6)
    want = torch.cat([fmt.dequantise(fmt.quantise(gate), 6, 8), fmt.dequantise(fmt.quantise(up), 6, 8)])
    assert torch.equal(gate_up, want)
    assert torch.equal(down_deq, fmt.dequantise(fmt.quantise(down), 8, 6))


def test_int8_known_values() -> None:
    w = torch.tensor([[127.0, -63.5, 0.4, 0.6], [0.0, 0.0, 0.0, 0.0]])
    parts = Int8Channel().quantise(w)
    assert parts["_scale"].flatten().tolist() == [1.0, 1.0]
    assert parts[""].tolist() == [[127, -64, 0, 1], [0, 0, 0, 0]]  # round half to even


def test_int4_known_values_and_packing() -> None:
    w = torch.tensor([[7.0, -7.0, 3.5, 0.0, 14.0, 1.0]])
    parts = Int4Group(group=4).quantise(w)
    assert parts["_scale"].tolist() == [[1.0, 2.0]] and parts["_zero"].tolist() == [[8, 8]]
    # group 0: 7 → 15, -7 → 1, 3.5 → 4 (half to even) + 8 = 12, 0 → 8; group 1: 14/2 → 15, 0.5 → 0 → 8
    assert unpack_nibbles(parts[""], 6).tolist() == [[15, 1, 12, 8, 15, 8]]
    assert parts[""].tolist() == [[15 | 1 << 4, 12 | 8 << 4, 15 | 8 << 4]]
    q = torch.randint(0, 16, (3, 7))
    assert torch.equal(unpack_nibbles(pack_nibbles(q), 7), q.to(torch.uint8))


def test_int4_scale_never_clips() -> None:
    # amax / 7 rounds down in fp16 for these: the scale must be nudged up, or 7.0x would clip.
    w = torch.tensor([[7.0001, 1.0], [7 * 1.0009765625 + 1e-4, 0.5]])
    fmt = Int4Group(group=2)
    assert ((fmt.dequantise(fmt.quantise(w), 2, 2) - w).abs() <= fmt.error_bound(w)).all()
    assert (fmt.quantise(w)["_scale"].float() * 7 >= w.abs().amax(dim=1, keepdim=True)).all()


def test_mxfp4_known_values() -> None:
    assert e2m1_encode(torch.tensor([6.0, 3.0, -0.5, 0.25, 0.75, 5.0, 2.5, -1.75, -0.0])).tolist() == [
        7, 5, 9, 0, 2, 6, 4, 12, 0]  # ties go to the even code; -0 encodes as +0
    w = torch.zeros(1, 32)
    w[0, :4] = torch.tensor([12.0, -1.0, 0.5, 3.0])  # amax 12 → X = 2 (12/6 = 2 exactly)
    parts = Mxfp4().quantise(w)
    assert parts["_scale"].tolist() == [[128]]  # E8M0: 2^(128 - 127)
    assert torch.equal(Mxfp4().dequantise(parts, 1, 32)[0, :4], torch.tensor([12.0, -1.0, 0.0, 3.0]))  # 0.25 → 0


def test_mxfp4_matches_transformers_gpt_oss_dequantiser() -> None:
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    w = weights(12, 96, 7)
    parts = Mxfp4().quantise(w)
    # gpt-oss stores blocks [E, N, K/32, 16] and scales [E, N, K/32]; transformers returns W^T per expert.
    blocks = parts[""].view(1, 12, 3, 16)
    theirs = mx.convert_moe_packed_tensors(blocks, parts["_scale"].view(1, 12, 3), dtype=torch.float32)
    assert torch.equal(theirs[0].T, Mxfp4().dequantise(parts, 12, 96))


@pytest.mark.parametrize("name", FORMATS)
def test_expert_specs_and_bytes(name: str) -> None:
    fmt = expert_format(name)
    H, I = 64, 32
    parts = quantise_expert(fmt, weights(I, H, 1), weights(I, H, 2), weights(H, I, 3))
    assert {n: (tuple(t.shape), t.dtype) for n, t in parts.items()} == expert_specs(fmt, H, I)
    assert expert_nbytes(fmt, H, I) == sum(t.numel() * t.element_size() for t in parts.values())


def test_bytes_per_expert_at_qwen3_30b_shape() -> None:
    # One Qwen3-30B-A3B expert: 3 x 2048 x 768 weights (PERF-NOTES: 9.44 MB bf16, 4.72 MB fp8).
    n = 3 * 2048 * 768
    assert expert_nbytes(Dense(torch.bfloat16), 2048, 768) == 2 * n
    assert expert_nbytes(Fp8Block(), 2048, 768) == n + 4 * (2 * 6 * 16 + 16 * 6)  # + fp32 block scales
    assert expert_nbytes(Int8Channel(), 2048, 768) == n + 4 * (2 * 768 + 2048)
    assert expert_nbytes(Int4Group(), 2048, 768) == n // 2 + 3 * (2 * 768 * 16 + 2048 * 6)
    assert expert_nbytes(Mxfp4(), 2048, 768) == n // 2 + (2 * 768 * 64 + 2048 * 24)
