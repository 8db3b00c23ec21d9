"""Shared by the CPU expert kernel tests (CI) and the AMX test (GPU machine): test
data, the kernel for a variant (or a skip saying why not), and the error bound.

(Importable because tests/kernels/conftest.py puts this folder on sys.path.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe.kernels import cpu_build, cpu_isa
from edgemoe.kernels.activations import kernel_name
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.kernels.expert_bias import ExpertBias

U32 = 2.0**-24  # fp32 unit roundoff
UBF = 2.0**-8  # bf16 unit roundoff (8 significant bits, round to nearest even)
SILU_SLOPE = 1.1  # max |d silu(g)/dg| is 1.0998
GEMM_VARIANTS = {"avx512", "amx", "amx-emu"}  # variants with a blocked bf16 path

_kernels: dict[tuple[str, str, int], CpuExperts] = {}


def kernel_for(variant: str, path: str = "gemv", threads: int = 2) -> CpuExperts:
    """A kernel for `variant` forced onto `path` ("gemv": fp32 GEMV for every n;
    "gemm": the blocked bf16 path for every n), or pytest.skip with the reason."""
    if variant != "torch":
        if not cpu_isa.supported(variant):
            needs = sorted(cpu_isa.VARIANT_FLAGS[cpu_isa.EMULATED.get(variant, variant)] - cpu_isa.cpu_flags())
            pytest.skip(f"this CPU lacks {', '.join(needs) or 'x86-64'} for the {variant} kernel")
        if cpu_build.find_compiler() is None:
            pytest.skip("no C compiler")
    if path == "gemm" and variant not in GEMM_VARIANTS:
        pytest.skip(f"{variant} has no blocked path")
    key = (variant, path, threads)
    if key not in _kernels:
        try:
            _kernels[key] = CpuExperts(variant, threads=threads, gemm_min_tokens=1 if path == "gemm" else 10**9)
        except RuntimeError as e:  # e.g. the OS refuses AMX tile state
            pytest.skip(f"{variant}: {e}")
    return _kernels[key]


def make_expert(hidden: int, inter: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 (gate_up [2I, H], down [H, I]) scaled like trained weights (unit outputs)."""
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(2 * inter, hidden, generator=g) / hidden**0.5).bfloat16()
    down = (torch.randn(hidden, inter, generator=g) / inter**0.5).bfloat16()
    return gate_up, down


def rounds(variant: str, path: str, x_dtype: torch.dtype) -> tuple[bool, bool, bool]:
    """(x rounded to bf16, h rounded to bf16, torch's all-bf16 path) for a kernel path."""
    if variant == "torch":
        return x_dtype != torch.bfloat16, True, True
    blocked = path == "gemm"
    return blocked and x_dtype != torch.bfloat16, blocked, False


def q_weights_rounded(variant: str, path: str) -> bool:
    """Whether a quantised kernel path rounds its weights to bf16: the blocked path folds
    the scales into bf16 rows (`em_qrow_bf16`); the GEMVs and torch's reference don't."""
    return path == "gemm" and variant != "torch"


def error_bound(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                x_rounded: bool, h_rounded: bool, bf16_ops: bool = False, w_rounded: bool = False,
                act=F.silu, bias: ExpertBias | None = None) -> torch.Tensor:  # noqa: ANN001
    """Per-element bound on |kernel − fp32 reference| for y = down @ (silu(g) * u) (or
    `act`'s GLU, and `bias`: this expert's [2I], [H] rows), to first order, from the exact
    (fp64) intermediates:
    - sums of n terms in fp32, in any order, err by at most n·u32·Σ|terms|, once in the
      kernel and once in the reference (hence 2n);
    - x and h rounded to bf16 (blocked paths) add u_bf·|x| and u_bf·|h|; the weights
      rounded to bf16 (`w_rounded`: a quantised blocked path) u_bf·|w| each;
    - the biases added in fp32 (both sides): 2·u32 of each sum;
    - the GLU in fp32 (`_glu_error`);
    - torch's bf16 path (`bf16_ops`) also rounds g, u, silu(g)·u and y to bf16."""
    xd, w, d = x.double(), gate_up.double(), down.double()
    hidden, inter = w.shape[1], d.shape[1]
    g, u = (xd @ w.T).chunk(2, dim=-1)
    ag, au = (xd.abs() @ w.abs().T).chunk(2, dim=-1)
    coef = UBF * (x_rounded + w_rounded) + 2 * hidden * U32
    eg, eu = coef * ag + UBF * bf16_ops * g.abs(), coef * au + UBF * bf16_ops * u.abs()
    if bias is not None:
        b_g, b_u = bias.gate_up.double().chunk(2, dim=-1)
        g, u = g + b_g, u + b_u
        eg, eu = eg + 2 * U32 * (g.abs() + eg), eu + 2 * U32 * (u.abs() + eu)
    h, eh = _glu_error(act, g, u, eg, eu)
    eh = eh + UBF * (h_rounded + 2 * bf16_ops) * (h.abs() + eh)
    y = h @ d.T
    ey = eh @ d.abs().T + 2 * inter * U32 * (h.abs() @ d.abs().T) + UBF * w_rounded * ((h.abs() + eh) @ d.abs().T)
    if bias is not None:
        y = y + bias.down.double()
        ey = ey + 2 * U32 * (y.abs() + ey)
    return (ey + UBF * bf16_ops * (y.abs() + ey)).float()


def _glu_error(act, g: torch.Tensor, u: torch.Tensor, eg: torch.Tensor,  # noqa: ANN001
               eu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, its error bound) for h = act's GLU of the exact (g, u), whose errors are (eg, eu):
    - silu(g)·u: silu's slope is at most 1.1; its fp32 ops (expf, a divide, a multiply;
      both sides): 16·u32·|h|;
    - swiglu_oai, (clamp(u, ±L) + 1) · g'·sigmoid(α·g'), g' = min(g, L): the clamps are
      1-Lipschitz and d/dg (g·sigmoid(α·g)) is silu's slope at α·g (at most 1.1); its fp32
      ops 16·u32·|h|, and α·g rounded before expf (both sides): 2·α·|g'|·u32·|h|. (The
      blocked path's polynomial exp errs by < 4·u32, and its h is rounded to bf16 next.)"""
    if kernel_name(act) != "swiglu_oai":
        s = F.silu(g)
        h = s * u
        return h, SILU_SLOPE * eg * u.abs() + s.abs() * eu + SILU_SLOPE * eg * eu + 16 * U32 * h.abs()
    gc, uc = g.clamp(max=act.limit), u.clamp(-act.limit, act.limit)
    psi = gc * torch.sigmoid(act.alpha * gc)
    h = (uc + 1) * psi
    eh = SILU_SLOPE * eg * (uc.abs() + 1) + psi.abs() * eu + SILU_SLOPE * eg * eu
    return h, eh + (16 + 2 * act.alpha * gc.abs()) * U32 * h.abs()


def routed_q_cells(experts: list, fmt, kernel: CpuExperts, H: int, weight_floor: float = 0.0):  # noqa: ANN001, ANN201
    """The routed quantised form against the partial reference, shared by the format tests:
    7 tokens x top-2 of len(experts) experts (each (parts, (gate_up, down) dequantised)),
    experts 1, 3 and 4 computed, the others' cells left NaN. Returns (got, want, x, ids, w,
    gate_up, down) after checking both left the same cells alone."""
    from edgemoe.kernels.cpu_experts import moe_experts_partial_ref
    from edgemoe.kernels.cpu_experts_quant import moe_experts_q_cpu

    E = len(experts)
    g = torch.Generator().manual_seed(3)
    T, K = 7, 2
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g) + weight_floor
    x = torch.randn(T, H, generator=g)
    chosen = [1, 3, 4]  # experts 0 and 2: another pass's cells, left alone
    got = torch.full((T, K, H), float("nan"))
    moe_experts_q_cpu(x, ids, w, chosen, [experts[e][0] for e in chosen], fmt, got, kernel)
    want = torch.full((T, K, H), float("nan"))
    gate_up = torch.stack([experts[e][1][0] for e in range(E)])
    down = torch.stack([experts[e][1][1] for e in range(E)])
    moe_experts_partial_ref(x, ids, w, chosen, chosen, gate_up, down, F.silu, want)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    return got, want, x, ids, w, gate_up, down


def assert_q_expert_within_bound(kernel: CpuExperts, variant: str, path: str, x: torch.Tensor, parts, fmt,  # noqa: ANN001
                                 gate_up: torch.Tensor, down: torch.Tensor) -> None:
    """One quantised expert on x against the dequantise-first fp32 reference, within the
    float kernel's bound for the dequantised (gate_up, down): the kernel rebuilds each weight
    as the reference does (blocked: then rounded to bf16, a term of the bound)."""
    from edgemoe.kernels.cpu_experts_quant import expert_mlp_q_cpu, expert_mlp_q_ref

    y, ref = expert_mlp_q_cpu(x, parts, fmt, kernel), expert_mlp_q_ref(x, parts, fmt)
    excess = (y - ref).abs() - error_bound(x, gate_up, down, *rounds(variant, path, x.dtype)[:2],
                                           w_rounded=q_weights_rounded(variant, path))
    assert (excess <= 0).all(), f"error exceeds its bound by {excess.max().item():.3g}"


def assert_routed_q_within_bound(experts: list, fmt, kernel: CpuExperts, variant: str, path: str,  # noqa: ANN001
                                 H: int) -> None:
    """`routed_q_cells`' computed cells against each expert's fp32 reference, within the
    kernel's bound scaled by the routing weight, plus w·y's rounding in fp32."""
    from edgemoe.kernels.cpu_experts import expert_mlp_ref

    got, want, x, ids, w, gate_up, down = routed_q_cells(experts, fmt, kernel, H, weight_floor=0.1)
    x_r, h_r = rounds(variant, path, torch.float32)[:2]
    for t, k in zip(*torch.nonzero(~want[..., 0].isnan(), as_tuple=True), strict=True):
        e, wt = int(ids[t, k]), float(w[t, k])
        ref = wt * expert_mlp_ref(x[t : t + 1], gate_up[e], down[e])[0]
        bound = wt * error_bound(x[t : t + 1], gate_up[e], down[e], x_r, h_r,
                                 w_rounded=q_weights_rounded(variant, path))[0] + U32 * ref.abs()
        assert ((got[t, k] - ref).abs() <= bound).all(), (int(t), int(k))
