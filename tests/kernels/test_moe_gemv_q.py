"""The quantised decode GEMV's tile families (`moe_gemv_q_tiles.py`) under Triton's
interpreter against the dequantise-then-fp32 reference: several sub-tiles a step, scale
pieces narrower than a sub-tile, nibbles read as words and as bytes, group sizes above
the dimension, partial row and column tiles; and a token's cells bitwise the same alone
and in a batch (tiles never depend on T)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.kernels import moe_gemv_q_tiles
from edgemoe.kernels.moe_quant import moe_quant_ref
from edgemoe.quant import ExpertFormat, Fp8Block, Int4Group, Int8Channel, Mxfp4, quantise_expert
from edgemoe.testing.kernel_inputs import moe_batch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
K, S = 2, 4

# (format, tiles override, SUB_MAX, shapes) — each case a family of the kernel's structure.
# Shapes (hidden, inter): 80, 40 give nibble rows of whole int32 words (40, 20 bytes); 75,
# 37 odd rows (38, 19 bytes: the byte path), partial row tiles, fp8 halves ending mid-block.
WORDS, ODD = (80, 40), (75, 37)
CASES = {
    # one-byte weights, 2 sub-tiles of 16 a step, pieces of 8 (block 8) under each
    "fp8 sub-tiles, pieces": (Fp8Block(block=8), "4,32,1,8,32,1", 16, (WORDS, ODD)),
    "int8 sub-tiles": (Int8Channel(), "4,32,1,8,32,1", 16, (WORDS,)),
    # nibbles: rows x sub = 256 x warps codes, so 16 rows at 1 warp: sub 16, 4 a step
    "int4 sub-tiles, pieces": (Int4Group(group=8), "16,64,1,16,64,1", 128, (WORDS, ODD)),
    "int4 group above the dim": (Int4Group(group=128), "8,32,1,8,32,1", 128, (ODD,)),
    "mxfp4 sub-tiles": (Mxfp4(), "16,64,1,16,64,1", 128, (WORDS,)),
    # software pipelining (the interpreter runs the loop plainly: the results must not move)
    "fp8 stages": (Fp8Block(), "8,64,2,8,64,2,2,3", 128, (WORDS,)),
}


def banks(fmt: ExpertFormat, hidden: int, inter: int, tokens: int, seed: int, unrouted: float = 0.25):  # noqa: ANN201
    b = moe_batch(tokens, K, hidden, inter, S, torch.float32, seed=seed, unrouted=unrouted)
    experts = [quantise_expert(fmt, b.gate_up[s, :inter], b.gate_up[s, inter:], b.down[s]) for s in range(S)]
    return b, {name: torch.stack([e[name] for e in experts]) for name in experts[0]}


def run_kernel(x, slot_ids, weights, parts, fmt, cells) -> None:  # noqa: ANN001
    from edgemoe.kernels.triton_ops.moe_gemv_q import moe_decode_q_triton

    moe_decode_q_triton(x, slot_ids, weights, parts, fmt, cells, "silu")


@pytest.mark.parametrize(("case", "shape"), [pytest.param(c, s, id=f"{c}, {'words' if s == WORDS else 'odd'}")
                                             for c, v in CASES.items() for s in v[3]])
def test_tile_family_matches_reference(case: str, shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    fmt, override, sub_max, _ = CASES[case]
    monkeypatch.setenv(moe_gemv_q_tiles.env_name(fmt.name), override)
    monkeypatch.setattr(moe_gemv_q_tiles, "SUB_MAX", sub_max)
    hidden, inter = shape
    b, parts = banks(fmt, hidden, inter, tokens=2, seed=hidden + inter)
    want = torch.full((2, K, hidden), float("nan"))
    moe_quant_ref(b.x, b.slot_ids, b.weights, parts, fmt, want, "silu")
    got = torch.full_like(want, float("nan"))  # poisoned: unwritten cells stay NaN
    run_kernel(b.x, b.slot_ids, b.weights, parts, fmt, got)
    skipped = (b.slot_ids < 0)[..., None].expand_as(got)
    assert got[skipped].isnan().all() and not got[~skipped].isnan().any()
    # fp32 throughout: the kernel's dequantised weights are the reference's bit for bit,
    # only the order of <= 80-term fp32 sums differs (~80·2^-24 of the row's size, with margin).
    bound = 1e-5 * want.nan_to_num().abs().amax(dim=-1, keepdim=True)
    assert ((got - want).nan_to_num().abs() <= bound).all()


def test_nibble_sub_tiles_match_the_layout_rule() -> None:
    # 16 rows x 1 warp: 8 codes a thread → sub 16 (the int4 case above has 4 sub-tiles a step)
    assert moe_gemv_q_tiles.sub_cols(64, 16, 1, nibbles=True) == 16
    assert moe_gemv_q_tiles.sub_cols(64, 16, 1, nibbles=False) == 64


def test_a_token_is_bitwise_the_same_alone_and_in_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    fmt = Int4Group(group=16)
    monkeypatch.setenv(moe_gemv_q_tiles.env_name(fmt.name), "16,64,1,16,64,1")
    b, parts = banks(fmt, 48, 24, tokens=2, seed=7, unrouted=0.0)
    batch = torch.zeros(2, K, 48)
    run_kernel(b.x, b.slot_ids, b.weights, parts, fmt, batch)
    alone = torch.zeros(1, K, 48)
    run_kernel(b.x[1:2], b.slot_ids[1:2], b.weights[1:2], parts, fmt, alone)
    assert alone.abs().amax() > 0 and torch.equal(alone[0], batch[1])
