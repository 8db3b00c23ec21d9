"""The gated delta rule over a varlen batch with a state pool, against transformers' torch
functions (which take one padded batch and return the final state), and chunked vs recurrent."""

from __future__ import annotations

import os

import pytest
import torch
from gdn_support import gdn_inputs, recurrence_atol
from hf_reference import torch_function
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from edgemoe.kernels.gdn import (
    chunk_gated_delta_rule_ref,
    gdn_gates,
    recurrent_gated_delta_rule_ref,
)

# The torch functions themselves, even where a kernel package would replace them.
HF_CHUNK = torch_function(hf.torch_chunk_gated_delta_rule)
HF_RECURRENT = torch_function(hf.torch_recurrent_gated_delta_rule)
HK, HV, DK, DV = 2, 4, 16, 8  # two value heads per key head, as the 35B-A3B's 16 / 32
POOL, ROWS = 7, [5, 2, 6, 0, 3]


def pool_with(states: torch.Tensor | None, rows: list[int]) -> torch.Tensor:
    """A pool of NaN rows (any read of a row the call should not touch shows), `states` in `rows`."""
    pool = torch.full((POOL, HV, DK, DV), float("nan"))
    if states is not None:
        pool[rows] = states
    return pool


def hf_per_sequence(fn, x, i: int, s: int, e: int, initial: bool):  # noqa: ANN001, ANN201
    args = [t[s:e][None] for t in (x.q, x.k, x.v, x.g, x.beta)]
    h0 = x.states[i : i + 1] if initial else None
    o, state = fn(*args, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    return o[0], state[0]


def check_against_hf(ours, hf_fn, lens: list[int], initial: bool, seed: int) -> None:  # noqa: ANN001
    x = gdn_inputs(lens, HK, HV, DK, DV, seed)
    rows = ROWS[: len(lens)]
    pool = pool_with(x.states if initial else None, rows)
    fresh = None if initial else torch.zeros(len(lens), dtype=torch.bool)
    o = ours(x.q, x.k, x.v, x.g, x.beta, x.cu_seqlens, pool, torch.tensor(rows), has_initial_state=fresh,
             use_qk_l2norm=True)
    bounds = x.cu_seqlens.tolist()
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        want_o, want_state = hf_per_sequence(hf_fn, x, i, s, e, initial)
        atol = recurrence_atol(e - s, DK, want_o, want_state)  # fp32 rounding of two evaluations
        torch.testing.assert_close(o[s:e], want_o, rtol=0, atol=atol)
        torch.testing.assert_close(pool[rows[i]], want_state, rtol=0, atol=atol)
    untouched = [r for r in range(POOL) if r not in rows]
    assert pool[untouched].isnan().all(), "rows outside state_idx must not be written"


@pytest.mark.parametrize("initial", [True, False])
def test_chunked_matches_transformers(initial: bool) -> None:
    # Lengths below, at, and past the chunk of 64, and one of two chunks plus a tail.
    check_against_hf(chunk_gated_delta_rule_ref, HF_CHUNK, [1, 63, 64, 65, 130], initial, seed=1)


@pytest.mark.parametrize("lens", [[1, 1, 1], [2, 1, 5]], ids=["decode", "few-tokens"])
@pytest.mark.parametrize("initial", [True, False])
def test_recurrent_matches_transformers(lens: list[int], initial: bool) -> None:
    check_against_hf(recurrent_gated_delta_rule_ref, HF_RECURRENT, lens, initial, seed=2)


def test_chunked_equals_recurrent() -> None:
    # Two algorithms (UT-transform chunks vs token steps) on the same inputs and pool.
    lens = [70, 3, 128]
    x = gdn_inputs(lens, HK, HV, DK, DV, seed=3)
    rows = torch.tensor(ROWS[:3], dtype=torch.int32)  # int32 rows work as well as int64
    pools = [pool_with(x.states, ROWS[:3]) for _ in range(2)]
    outs = [
        fn(x.q, x.k, x.v, x.g, x.beta, x.cu_seqlens, pool, rows, use_qk_l2norm=True)
        for fn, pool in zip((chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref), pools)
    ]
    atol = recurrence_atol(max(lens), DK, outs[1], pools[1][rows.long()])  # fp32 rounding of two evaluations
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=atol)
    torch.testing.assert_close(pools[0], pools[1], rtol=0, atol=atol, equal_nan=True)


def test_split_prefill_carries_state_through_the_pool() -> None:
    # The engine's chunked prefill: 130 tokens as 70 + 60 (neither a multiple of 64), the state
    # handed over in the pool row, equal the one-shot prefill; then a decode step on both.
    x = gdn_inputs([131], HK, HV, DK, DV, seed=4)
    row = torch.tensor([2])

    def call(fn, pool, s: int, e: int, fresh: bool) -> torch.Tensor:  # noqa: ANN001
        cu = torch.tensor([0, e - s], dtype=torch.int32)
        first = torch.tensor([not fresh])
        return fn(x.q[s:e], x.k[s:e], x.v[s:e], x.g[s:e], x.beta[s:e], cu, pool, row,
                  has_initial_state=first, use_qk_l2norm=True)

    one, split = pool_with(None, []), pool_with(None, [])
    want = torch.cat([call(chunk_gated_delta_rule_ref, one, 0, 130, True),
                      call(recurrent_gated_delta_rule_ref, one, 130, 131, False)])
    got = torch.cat([call(chunk_gated_delta_rule_ref, split, 0, 70, True),
                     call(chunk_gated_delta_rule_ref, split, 70, 130, False),
                     call(recurrent_gated_delta_rule_ref, split, 130, 131, False)])
    atol = recurrence_atol(131, DK, want, one[2])  # fp32 rounding of two evaluations
    torch.testing.assert_close(got, want, rtol=0, atol=atol)
    torch.testing.assert_close(split[2], one[2], rtol=0, atol=atol)


def test_decode_reads_no_lengths() -> None:
    # One token per sequence takes the sync-free path: cu_seqlens is not read at all.
    x = gdn_inputs([1, 1], HK, HV, DK, DV, seed=5)
    pool, want_pool = pool_with(x.states, ROWS[:2]), pool_with(x.states, ROWS[:2])
    bogus = torch.tensor([0, 99, 98], dtype=torch.int32)
    got = recurrent_gated_delta_rule_ref(x.q, x.k, x.v, x.g, x.beta, bogus, pool, torch.tensor(ROWS[:2]),
                                         use_qk_l2norm=True)
    want = recurrent_gated_delta_rule_ref(x.q, x.k, x.v, x.g, x.beta, x.cu_seqlens, want_pool,
                                          torch.tensor(ROWS[:2]), use_qk_l2norm=True)
    assert torch.equal(got, want) and torch.equal(pool.nan_to_num(), want_pool.nan_to_num())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gates_match_transformers_layer(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    # Capture the g and beta that transformers' Qwen3-Next GDN layer hands to its rule, and
    # derive ours from the same layer's a/b projections (its own de-interleaving).
    config = hf.Qwen3NextConfig(
        hidden_size=32, linear_num_key_heads=HK, linear_num_value_heads=HV, linear_key_head_dim=DK,
        linear_value_head_dim=DV, num_hidden_layers=1, layer_types=["linear_attention"],
    )
    layer = hf.Qwen3NextGatedDeltaNet(config, 0).to(dtype)
    with torch.no_grad():
        layer.dt_bias.normal_()
    seen: dict[str, torch.Tensor] = {}

    def capture(*args, g, beta, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.update(g=g, beta=beta)
        return HF_CHUNK(*args, g=g, beta=beta, **kwargs)

    monkeypatch.setattr(hf, "torch_chunk_gated_delta_rule", capture)
    hidden = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(6)).to(dtype)
    with torch.no_grad():
        layer(hidden)
        *_, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(hidden), layer.in_proj_ba(hidden))
        gates = gdn_gates(a[0], b[0], layer.A_log, layer.dt_bias)
    # The same torch ops in the same order: bitwise equal.
    assert torch.equal(gates.g, seen["g"][0]) and torch.equal(gates.beta, seen["beta"][0])
    assert gates.g.dtype == torch.float32 and gates.beta.dtype == dtype


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gates_kernel_matches_reference(dtype: torch.dtype) -> None:
    """The one-launch gates on row-strided views of a projection: g within a few fp32 ulps
    (Triton's exp, log and division; softplus's linear branch above 20 and its tiny values
    far below 0 included), beta within one rounding of b's dtype."""
    from edgemoe.kernels.gdn import gdn_gates_ref
    from edgemoe.kernels.triton_ops.gdn_gates import gdn_gates_triton

    gen = torch.Generator().manual_seed(3)
    proj = (torch.randn(5, 3 * 24, generator=gen) * 8).to(dtype)
    proj[0, :24] = torch.linspace(-40, 40, 24)  # softplus's ends: e^x below fp32's eps, and x > 20
    a, b = proj[:, :24], proj[:, 24:48]  # views with the projection's row stride
    A_log = torch.randn(24, generator=gen)
    dt_bias = torch.randn(24, generator=gen).to(dtype)
    g, beta = gdn_gates_triton(a, b, A_log, dt_bias)
    want = gdn_gates_ref(a, b, A_log, dt_bias)
    assert ((g - want.g).abs() <= 4 * torch.finfo(torch.float32).eps * want.g.abs() + 1e-30).all()
    assert beta.dtype == dtype
    assert ((beta.float() - want.beta.float()).abs() <= torch.finfo(dtype).eps * want.beta.float().abs()).all()
