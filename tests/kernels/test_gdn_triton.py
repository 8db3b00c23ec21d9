"""The in-place Triton recurrent kernel against the torch reference. On CPU it runs only under
Triton's interpreter: `TRITON_INTERPRET=1` set before the run, in an environment with `triton`
(the CPU test venv has none, so this skips there); on CUDA it runs compiled."""

from __future__ import annotations

import os

import pytest
import torch
from gdn_support import gdn_inputs, recurrence_atol

if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)
pytest.importorskip("triton")

from edgemoe.kernels.gdn import recurrent_gated_delta_rule_ref  # noqa: E402
from edgemoe.kernels.gdn_triton import recurrent_gated_delta_rule_triton  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HK, HV, DK, DV = 2, 4, 16, 24  # Dv not a multiple of the kernel's value block: masked tail


def split_views(x, dtype: torch.dtype):  # noqa: ANN001, ANN201
    """q, k, v as the model has them: views into one [T, 2·Hk·Dk + Hv·Dv] conv output."""
    t = x.q.shape[0]
    qkv = torch.cat([x.q.reshape(t, -1), x.k.reshape(t, -1), x.v.reshape(t, -1)], -1).to(dtype)
    q, k, v = qkv.split([HK * DK, HK * DK, HV * DV], -1)
    return q.view(t, HK, DK), k.view(t, HK, DK), v.view(t, HV, DV)


@pytest.mark.parametrize("lens", [[1, 1, 1], [3, 1, 2]], ids=["decode", "few-tokens"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", [None, [True, False, True]])
def test_triton_recurrent_matches_reference(lens: list[int], dtype: torch.dtype, mask) -> None:  # noqa: ANN001
    x = gdn_inputs(lens, HK, HV, DK, DV, seed=sum(lens), device=DEVICE)
    q, k, v = split_views(x, dtype)
    rows = torch.tensor([4, 0, 2], device=DEVICE)
    pools = [torch.full((5, HV, DK, DV), float("nan"), device=DEVICE) for _ in range(2)]
    for pool in pools:
        pool[rows] = x.states
        pool[rows[1]] = float("nan") if mask else pool[rows[1]]  # a fresh row may hold garbage
    has = None if mask is None else torch.tensor(mask, device=DEVICE)
    args = (q, k, v, x.g, x.beta.to(dtype), x.cu_seqlens)
    got = recurrent_gated_delta_rule_triton(*args, pools[0], rows, has_initial_state=has, use_qk_l2norm=True)
    want = recurrent_gated_delta_rule_ref(*args, pools[1], rows, has_initial_state=has, use_qk_l2norm=True)
    # fp32 arithmetic inside both (rsqrt vs 1/sqrt, other sum orders): the recurrence bound;
    # outputs in bf16 are rounded once each, so one bf16 ulp of the magnitude more.
    atol = recurrence_atol(max(lens), DK, want.float(), pools[1][rows])
    out_atol = atol + (0 if dtype == torch.float32 else torch.finfo(dtype).eps * want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=0, atol=out_atol)
    torch.testing.assert_close(pools[0], pools[1], rtol=0, atol=atol, equal_nan=True)
