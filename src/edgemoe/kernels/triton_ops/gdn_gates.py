"""The GDN layer's gates in one launch (contract: `kernels/gdn.gdn_gates_ref`): g =
-exp(A_log) · softplus(a + dt_bias) in fp32, beta = sigmoid(b) rounded to b's dtype. One
program a token, every value head in it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import exp_torch, interpreting, pdl_start, round_to, sigmoid_torch, tl_dtype

SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # torch's: above it softplus(x) is x


@triton.jit
def _log1p(u):
    """log(1 + u) for u >= 0 to about an ulp without libdevice (the interpreter has none):
    Goldberg's correction of log(1 + u) by the rounding of 1 + u; u where 1 + u rounds to 1."""
    w = 1.0 + u
    d = w - 1.0
    return tl.where(d == 0.0, u, tl.log(w) * (u / tl.where(d == 0.0, 1.0, d)))  # no 0/0 in the branch not taken


@triton.jit
def _gdn_gates(
    a_ptr, b_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, HV, stride_a, stride_b, stride_g, stride_beta,
    B_DTYPE: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK)
    ok = h < HV
    pdl_start(USE_PDL)
    x = tl.load(a_ptr + t * stride_a + h, mask=ok, other=0.0).to(tl.float32) + \
        tl.load(dt_ptr + h, mask=ok, other=0.0).to(tl.float32)
    softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, _log1p(exp_torch(x, INTERP)))
    decay = exp_torch(tl.load(alog_ptr + h, mask=ok, other=0.0).to(tl.float32), INTERP)
    tl.store(g_ptr + t * stride_g + h, -decay * softplus, mask=ok)
    b = tl.load(b_ptr + t * stride_b + h, mask=ok, other=0.0).to(tl.float32)
    tl.store(beta_ptr + t * stride_beta + h, round_to(sigmoid_torch(b, INTERP), B_DTYPE, INTERP), mask=ok)


def gdn_gates_triton(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g [T, Hv] fp32, beta [T, Hv] in b's dtype); a, b [T, Hv] may be row-strided views."""
    T, hv = a.shape
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        a, b = a.contiguous(), b.contiguous()
    g = torch.empty(T, hv, dtype=torch.float32, device=a.device)
    beta = torch.empty(T, hv, dtype=b.dtype, device=a.device)
    if T:
        pdl = pdl_enabled(a.device)
        _gdn_gates[(T,)](
            a, b, A_log.contiguous(), dt_bias.contiguous(), g, beta, hv, a.stride(0), b.stride(0), g.stride(0),
            beta.stride(0), B_DTYPE=tl_dtype(b.dtype), BLOCK=triton.next_power_of_2(hv), INTERP=interpreting(a),
            USE_PDL=pdl, launch_pdl=pdl, num_warps=1,
        )
    return g, beta
