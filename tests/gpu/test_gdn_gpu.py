"""GDN fast paths on the GPU against the fp32 torch reference, at the Qwen3.5-35B-A3B GDN shape
(16 key / 32 value heads × 128): fla-core's chunked and recurrent kernels (skipped without
fla), our in-place Triton decode kernel, and a decode step captured in a CUDA graph.

Inputs are made as the model makes them (L2-normalised q/k inside the kernel, g ≤ 0, beta in
(0, 1), unit-scale states): an unvalidated probe is what returned NaN before (PERF-NOTES).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from gdn_support import GdnInputs, gdn_inputs, recurrence_atol  # noqa: E402

from edgemoe.kernels.causal_conv import causal_conv1d_update_ref  # noqa: E402
from edgemoe.kernels.gdn import (  # noqa: E402
    chunk_gated_delta_rule_ref,
    recurrent_gated_delta_rule_ref,
)

HK, HV, DK, DV = 16, 32, 128, 128
LENS = [3001, 64, 1, 2047, 3079]  # 8,192 tokens: multiples of 64 and not, a 1-token prompt
HAS_STATE = [True, False, True, True, False]
ROWS = [6, 0, 3, 7, 1]
POOL = 20  # rows; 2 MiB each at this shape
needs_fla = pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla-core not installed")
# Unit roundoff of what the kernels multiply: bf16 operands, or TF32 (Triton's default for fp32 dots).
UNIT = {torch.bfloat16: 2.0**-8, torch.float32: 2.0**-11}


def cuda_inputs(lens: list[int], dtype: torch.dtype, seed: int) -> GdnInputs:
    x = gdn_inputs(lens, HK, HV, DK, DV, seed, device="cuda", dtype=dtype)
    return x._replace(beta=x.beta.to(dtype))


def pools_for(x: GdnInputs, rows: list[int], has: list[bool], copies: int = 2) -> list[torch.Tensor]:
    """Pools of NaN rows with the initial states in `rows`; fresh sequences' rows stay NaN."""
    out = []
    for _ in range(copies):
        pool = torch.full((POOL, HV, DK, DV), float("nan"), device="cuda")
        for i, row in enumerate(rows):
            if has[i]:
                pool[row] = x.states[i]
        out.append(pool)
    return out


def check_close(got: torch.Tensor, want: torch.Tensor, unit: float, what: str) -> None:
    """A low-precision kernel against the fp32 reference. Each value passes ≤ 8 roundings to the
    kernel's precision (normalised q/k, the WY factors, corrected values, state snapshots, output),
    so the relative RMS error is ≤ 8u; a single entry may sit in the tail: ≤ 64u of the largest."""
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = (got.float() - want.float()).flatten()
    rel_rms = (err.norm() / want.float().norm().clamp_min(1e-30)).item()
    worst = err.abs().max().item()
    scale = max(1.0, want.abs().max().item())
    assert rel_rms <= 8 * unit and worst <= 64 * unit * scale, (
        f"{what}: relative RMS error {rel_rms:.3e} (bound {8 * unit:.3e}), max {worst:.3e} "
        f"(bound {64 * unit * scale:.3e})")


def run_both(fast, ref, x: GdnInputs, rows: list[int], has: list[bool]):  # noqa: ANN001, ANN201
    pools = pools_for(x, rows, has)
    idx = torch.tensor(rows, device="cuda")
    mask = torch.tensor(has, device="cuda")
    args = (x.q, x.k, x.v, x.g, x.beta, x.cu_seqlens)
    got = fast(*args, pools[0], idx, has_initial_state=mask, use_qk_l2norm=True)
    want = ref(*args, pools[1], idx, has_initial_state=mask, use_qk_l2norm=True)
    torch.cuda.synchronize()
    return got, want, pools


def check_per_sequence(got, want, pools, x: GdnInputs, rows: list[int], unit: float) -> None:  # noqa: ANN001
    bounds = x.cu_seqlens.tolist()
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        check_close(got[s:e], want[s:e], unit, f"sequence {i} ({e - s} tokens) output")
        check_close(pools[0][rows[i]], pools[1][rows[i]], unit, f"sequence {i} final state")
    untouched = [r for r in range(POOL) if r not in rows]
    assert pools[0][untouched].isnan().all(), "rows outside state_idx must not be written"


@needs_fla
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fla_chunk_matches_reference(dtype: torch.dtype) -> None:
    from edgemoe.kernels.gdn_fla import chunk_gated_delta_rule_fla

    x = cuda_inputs(LENS, dtype, seed=0)
    got, want, pools = run_both(chunk_gated_delta_rule_fla, chunk_gated_delta_rule_ref, x, ROWS, HAS_STATE)
    check_per_sequence(got, want, pools, x, ROWS, UNIT[dtype])


@needs_fla
@pytest.mark.parametrize("lens", [[1] * 16, [3, 1, 2]], ids=["decode", "few-tokens"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fla_recurrent_matches_reference(lens: list[int], dtype: torch.dtype) -> None:
    from edgemoe.kernels.gdn_fla import recurrent_gated_delta_rule_fla

    rows, has = list(range(len(lens)))[::-1], [i % 3 != 1 for i in range(len(lens))]
    x = cuda_inputs(lens, dtype, seed=1)
    got, want, pools = run_both(recurrent_gated_delta_rule_fla, recurrent_gated_delta_rule_ref, x, rows, has)
    check_per_sequence(got, want, pools, x, rows, UNIT[dtype])


@needs_fla
def test_fla_chunk_and_recurrent_agree() -> None:
    # The probe that returned NaN on unvalidated inputs, on inputs as the model makes them.
    from edgemoe.kernels.gdn_fla import (
        chunk_gated_delta_rule_fla,
        recurrent_gated_delta_rule_fla,
    )

    x = cuda_inputs([300, 77], torch.bfloat16, seed=2)
    got, want, pools = run_both(chunk_gated_delta_rule_fla, recurrent_gated_delta_rule_fla, x, [0, 1], [True, True])
    check_per_sequence(got, want, pools, x, [0, 1], 2 * UNIT[torch.bfloat16])  # two kernels' roundings


def assert_recurrent_close(got, want, got_pool, want_pool, seq_len: int) -> None:  # noqa: ANN001
    """fp32 arithmetic inside both: the recurrence bound; a bf16 output adds a rounding each."""
    atol = recurrence_atol(seq_len, DK, want.float(), want_pool.nan_to_num())
    out_atol = atol + (2 * UNIT[want.dtype] * want.abs().max().item() if want.dtype == torch.bfloat16 else 0.0)
    torch.testing.assert_close(got, want, rtol=0, atol=out_atol)
    torch.testing.assert_close(got_pool, want_pool, rtol=0, atol=atol, equal_nan=True)


@pytest.mark.parametrize("lens", [[1] * 16, [3, 1, 2]], ids=["decode", "few-tokens"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_recurrent_matches_reference(lens: list[int], dtype: torch.dtype) -> None:
    from edgemoe.kernels.gdn_triton import recurrent_gated_delta_rule_triton

    rows, has = list(range(len(lens)))[::-1], [i % 3 != 1 for i in range(len(lens))]
    x = cuda_inputs(lens, dtype, seed=3)
    got, want, pools = run_both(recurrent_gated_delta_rule_triton, recurrent_gated_delta_rule_ref, x, rows, has)
    assert_recurrent_close(got, want, pools[0], pools[1], max(lens))


@pytest.mark.parametrize("decode", ["triton", "fla", "torch"])
def test_decode_step_replays_in_a_cuda_graph(decode: str) -> None:
    # Conv update + recurrent rule over pool rows, captured once and replayed with new inputs:
    # no host sync inside, and the pools evolve as an eager reference's do.
    if decode == "fla" and importlib.util.find_spec("fla") is None:
        pytest.skip("fla-core not installed")
    from edgemoe.kernels.gdn_backends import gdn_kernels

    rule = gdn_kernels(f"torch+{decode}", torch.device("cuda")).decode
    batch, conv_dim, steps = 4, 2 * HK * DK + HV * DV, 3
    gen = torch.Generator(device="cuda").manual_seed(4)
    weight = torch.randn(conv_dim, 4, device="cuda", generator=gen) * 0.5
    idx, cu = torch.tensor([5, 2, 0, 7], device="cuda"), torch.arange(batch + 1, device="cuda", dtype=torch.int32)
    conv_pool = torch.randn(POOL, conv_dim, 3, device="cuda", generator=gen).to(torch.bfloat16)
    state_pool = torch.randn(POOL, HV, DK, DV, device="cuda", generator=gen) * 0.5
    eager = dict(conv=conv_pool.clone(), state=state_pool.clone())
    static = dict(x=torch.zeros(batch, conv_dim, device="cuda", dtype=torch.bfloat16),
                  g=torch.zeros(batch, HV, device="cuda"), beta=torch.zeros(batch, HV, device="cuda"))

    def step(fn, x, g, beta, conv, state):  # noqa: ANN001, ANN202
        qkv = causal_conv1d_update_ref(x, weight, None, conv, idx)
        q, k, v = qkv.split([HK * DK, HK * DK, HV * DV], -1)
        return fn(q.view(batch, HK, DK), k.view(batch, HK, DK), v.view(batch, HV, DV), g, beta, cu, state, idx,
                  use_qk_l2norm=True)

    side = torch.cuda.Stream()  # warm up (compiles Triton) off the capture, on scratch pools
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(rule, *static.values(), conv_pool.clone(), state_pool.clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(rule, *static.values(), conv_pool, state_pool)
    for s in range(steps):
        x = cuda_inputs([1] * batch, torch.bfloat16, seed=10 + s)
        new = dict(x=torch.randn(batch, conv_dim, device="cuda", generator=gen).to(torch.bfloat16), g=x.g,
                   beta=x.beta.float())
        for name, value in new.items():
            static[name].copy_(value)
        graph.replay()
        want = step(recurrent_gated_delta_rule_ref, *new.values(), eager["conv"], eager["state"])
        torch.cuda.synchronize()
        assert torch.equal(conv_pool, eager["conv"]), "the conv update is the same ops in and out of the graph"
        assert_recurrent_close(out, want, state_pool, eager["state"], s + 1)
