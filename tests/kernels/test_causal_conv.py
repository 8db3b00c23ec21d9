"""Causal conv1d with a state pool against transformers' torch path: `causal_conv1d_fn` over the
whole sequence (the one-shot oracle) and `torch_causal_conv1d_update` for a decode step."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from hf_reference import torch_function
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from edgemoe.kernels.causal_conv import (
    causal_conv1d_update_ref,
    causal_conv1d_varlen_ref,
)

HF_CONV = torch_function(hf.causal_conv1d_fn)
HF_UPDATE = torch_function(hf.causal_conv1d_update)
C, K, POOL = 6, 4, 5
EPS = {torch.float32: torch.finfo(torch.float32).eps, torch.bfloat16: torch.finfo(torch.bfloat16).eps}


def hf_one_shot(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """transformers' prefill conv of one whole sequence x [L, C] -> [L, C]."""
    return HF_CONV(x.T[None], weight, None, activation="silu")[0].T


def tolerance(x: torch.Tensor, weight: torch.Tensor) -> dict[str, float]:
    """fp32: K products summed in another order, ≤ K·eps·Σ|w·x| (SiLU's slope ≤ 1.1 < 2).
    bf16: transformers rounds the conv and the SiLU to bf16, we round once: ≤ an ulp of the
    pre-activation magnitude plus an ulp of the output."""
    eps = EPS[x.dtype]
    scale = F.conv1d(x.float().abs().T[None], weight.float().abs()[:, None], padding=K - 1, groups=C).max().item()
    if x.dtype == torch.float32:
        return dict(rtol=0, atol=2 * K * eps * scale)
    return dict(rtol=eps, atol=eps * scale)


def setup(lens: list[int], dtype: torch.dtype, seed: int):  # noqa: ANN201
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lens), C, generator=gen).to(dtype)
    weight = (torch.randn(C, K, generator=gen) * 0.5).to(dtype)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return x, weight, cu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fresh_prefill_matches_transformers(dtype: torch.dtype) -> None:
    # Sequences shorter than, equal to and longer than the K-1 = 3 inputs of history.
    lens, rows = [1, 2, 3, 9], [3, 0, 4, 1]
    x, weight, cu = setup(lens, dtype, seed=0)
    pool = torch.full((POOL, C, K - 1), float("nan"), dtype=dtype)  # fresh rows are not read
    out = causal_conv1d_varlen_ref(x, weight, None, pool, torch.tensor(rows), cu,
                                   has_initial_state=torch.zeros(4, dtype=torch.bool))
    b = cu.tolist()
    for i, (s, e) in enumerate(zip(b[:-1], b[1:])):
        torch.testing.assert_close(out[s:e], hf_one_shot(x[s:e], weight), **tolerance(x[s:e], weight))
        padded = torch.cat([torch.zeros(K - 1, C, dtype=dtype), x[s:e]])
        assert torch.equal(pool[rows[i]], padded[-(K - 1):].T), "state = the last K-1 inputs, zeros before"
    assert pool[2].isnan().all(), "a row outside state_idx must not be written"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_prefill_then_decode_equals_one_shot(dtype: torch.dtype) -> None:
    # Three sequences, each as prefill chunks of [2, 5], [1, 1], [4, 2] tokens then two decode
    # steps, batched together: the outputs concatenated equal one conv over each whole sequence.
    chunks, rows = [[2, 5], [1, 1], [4, 2]], torch.tensor([4, 1, 2])
    total = [sum(c) + 2 for c in chunks]
    x, weight, _ = setup(total, dtype, seed=1)
    starts = [0, *torch.tensor(total).cumsum(0).tolist()]
    pool = torch.full((POOL, C, K - 1), float("nan"), dtype=dtype)
    pieces: list[list[torch.Tensor]] = [[] for _ in chunks]
    done = [0, 0, 0]
    for step, n in enumerate([[c[0] for c in chunks], [c[1] for c in chunks]]):
        seqs = [x[starts[i] + done[i] : starts[i] + done[i] + n[i]] for i in range(3)]
        cu = torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
        out = causal_conv1d_varlen_ref(torch.cat(seqs), weight, None, pool, rows, cu,
                                       has_initial_state=torch.tensor([step > 0] * 3))
        for i, piece in enumerate(out.split(n)):
            pieces[i].append(piece)
            done[i] += n[i]
    for _ in range(2):
        tok = torch.stack([x[starts[i] + done[i]] for i in range(3)])
        unread = torch.full((3, C, 1), float("nan"), dtype=dtype)  # transformers keeps K columns; the 1st is not read
        hf_state = torch.cat([unread, pool[rows]], -1)
        want = HF_UPDATE(tok[:, :, None], hf_state, weight, None, "silu")[:, :, 0]
        got = causal_conv1d_update_ref(tok, weight, None, pool, rows)
        torch.testing.assert_close(got, want, **tolerance(tok, weight))
        for i in range(3):
            pieces[i].append(got[i : i + 1])
            done[i] += 1
    for i in range(3):
        seq = x[starts[i] : starts[i + 1]]
        torch.testing.assert_close(torch.cat(pieces[i]), hf_one_shot(seq, weight), **tolerance(seq, weight))
    assert pool[[0, 3]].isnan().all(), "rows outside state_idx must not be written"


def test_decode_form_equals_prefill_form_bitwise() -> None:
    # One token per sequence through either form: the same accumulation order, identical bits.
    x, weight, _ = setup([1, 1, 1], torch.float32, seed=2)
    history = torch.randn(POOL, C, K - 1, generator=torch.Generator().manual_seed(3))
    rows, cu = torch.tensor([2, 0, 4]), torch.tensor([0, 1, 2, 3])
    pools = [history.clone(), history.clone()]
    a = causal_conv1d_varlen_ref(x, weight, None, pools[0], rows, cu)
    b = causal_conv1d_update_ref(x, weight, None, pools[1], rows)
    assert torch.equal(a, b) and torch.equal(pools[0], pools[1])


# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")


def silu_tolerance(want: torch.Tensor) -> torch.Tensor:
    """The interpreter's exp is not torch's CPU exp (on CUDA both are CUDA's expf, bitwise):
    torch's vectorised CPU SiLU has an exp of its own, not correctly rounded (≤ 2 ulps), and
    the difference is rounded again in 1 + e and in the division: the fp32 SiLU differs by
    up to 4 ulps (4·eps relative; 2.3 seen), which moves a narrower dtype by at most one
    rounding (one ulp, eps relative)."""
    eps = max(torch.finfo(want.dtype).eps, 4 * torch.finfo(torch.float32).eps)
    return eps * want.float().abs()


def decode_inputs(
    B: int, C: int, dilation: int, dtype: torch.dtype, pool_dtype: torch.dtype, fresh: list[bool]
) -> tuple[torch.Tensor, ...]:
    """x [B, C] (strided rows: a slice of a projection, as in the layer), weight [C, K], bias
    [C], a pool of B + 2 rows (rows of fresh sequences NaN: they must not be read) and the
    distinct rows of the B sequences."""
    gen = torch.Generator().manual_seed(B * 1000 + C + dilation)
    x = torch.randn(B, 2 * C, generator=gen).to(dtype)[:, C:]
    weight = (torch.randn(C, K, generator=gen) * 0.5).to(dtype)
    bias = (torch.randn(C, generator=gen) * 0.1).to(dtype)
    pool = torch.randn(B + 2, C, (K - 1) * dilation, generator=gen).to(pool_dtype)
    rows = torch.randperm(B + 2, generator=gen)[:B]
    pool[rows[torch.tensor(fresh)]] = float("nan")
    return x, weight, bias, pool, rows


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("init", ["none", "mixed"])
@pytest.mark.parametrize("dilation", [1, 3])
@pytest.mark.parametrize("B,C", [(1, 100), (3, 100), (1, 300), (3, 300)])  # C not a multiple of the 256-channel block
def test_triton_conv_update_matches_reference(
    dtype: torch.dtype, activation: str | None, with_bias: bool, init: str, dilation: int, B: int, C: int,
) -> None:
    from edgemoe.kernels.triton_ops.causal_conv import causal_conv1d_update_triton

    fresh = [init == "mixed" and b % 2 == 0 for b in range(B)]  # B = 3: fresh, continued, fresh
    has_init = None if init == "none" else ~torch.tensor(fresh)
    x, weight, bias, pool, rows = decode_inputs(B, C, dilation, dtype, dtype, fresh)
    bias = bias if with_bias else None
    want_pool, got_pool = pool.clone(), pool.clone()
    kw = dict(has_initial_state=has_init, activation=activation, dilation=dilation)
    want = causal_conv1d_update_ref(x, weight, bias, want_pool, rows, **kw)
    got = causal_conv1d_update_triton(x, weight, bias, got_pool, rows, **kw)
    assert got.dtype == want.dtype and got.shape == want.shape
    if activation is None:  # the fp32 accumulation in the reference's order: identical bits
        assert torch.equal(got, want)
    else:
        assert ((got.float() - want.float()).abs() <= silu_tolerance(want)).all()
    assert not got_pool[rows].isnan().any(), "a fresh sequence's row is overwritten whole"
    assert torch.equal(got_pool, want_pool), "the shifted windows, in place, bitwise"
    others = torch.ones(B + 2, dtype=torch.bool)
    others[rows] = False
    assert torch.equal(got_pool[others], pool[others]), "rows outside state_idx must not be written"


@needs_triton
def test_triton_conv_update_rounds_a_wider_pool_to_the_activations() -> None:
    # An fp32 pool under bf16 activations: the state is rounded to bf16 before the taps, and
    # the written-back window holds those rounded values (the reference's `state.to(x.dtype)`).
    from edgemoe.kernels.triton_ops.causal_conv import causal_conv1d_update_triton

    x, weight, bias, pool, rows = decode_inputs(3, 100, 1, torch.bfloat16, torch.float32, [False, True, False])
    assert not torch.equal(pool[rows[0]], pool[rows[0]].to(torch.bfloat16).float()), "the rounding must show"
    want_pool, got_pool = pool.clone(), pool.clone()
    kw = dict(has_initial_state=torch.tensor([True, False, True]), activation=None)
    want = causal_conv1d_update_ref(x, weight, bias, want_pool, rows, **kw)
    got = causal_conv1d_update_triton(x, weight, bias, got_pool, rows, **kw)
    assert torch.equal(got, want) and torch.equal(got_pool, want_pool)
