"""The CPU expert kernel on gpt-oss's experts — per-expert biases and the clamped SwiGLU
(`kernels/cpu/em_glu.h`) — against the fp32 reference (`moe_reference.expert_mlp(...,
bias=)`; quantised experts dequantised first) within `error_bound` (its bias and GLU
terms): every variant this CPU runs (others skip, saying why), the GEMV and the blocked
path (forced, and both in one call under the real threshold), bf16 and every quantised
format, biases in bf16 and fp32, every entry point and the CPU share's host function.
Gate/up values pass both clamps; bank rows differ from expert ids (biases go by id); a
SiLU job without biases computes bitwise as in a call without any."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cpu_expert_support import GEMM_VARIANTS, U32, error_bound, kernel_for, make_expert, q_weights_rounded, rounds

from edgemoe.kernels import cpu_isa
from edgemoe.kernels.activations import ACTIVATIONS, clamped_swiglu
from edgemoe.kernels.cpu_experts import (
    ExpertJob,
    expert_mlp_cpu,
    expert_mlp_ref,
    experts_cpu,
    moe_expert_cells_cpu,
    moe_experts_cpu,
    moe_experts_partial_cpu,
    moe_experts_partial_ref,
)
from edgemoe.kernels.cpu_experts_quant import (
    expert_mlp_q_cpu,
    expert_mlp_q_ref,
    moe_expert_cells_q_cpu,
    moe_experts_q_cpu,
    native_weights,
)
from edgemoe.kernels.cpu_host_layer import HostLayerMailboxes
from edgemoe.kernels.cpu_kernel import JOB_FIELDS, CpuExperts, Glu, default_gemm_min_tokens
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.quant import Fp8Block, Int4Group, Int8Channel, dequantise_expert, quantise_expert
from edgemoe.quant.mxfp4 import Mxfp4

VARIANTS = ["scalar", "avx2", "avx512", "amx-emu", "amx"]
OAI, SILU = clamped_swiglu(1.702, 7.0), ACTIVATIONS["silu"]
ACTS = {"swiglu_oai": OAI, "silu": SILU}
FORMATS = {"int8": Int8Channel(), "fp8": Fp8Block(block=32), "int4": Int4Group(group=32), "mxfp4": Mxfp4()}
E, H, I, T, K = 6, 67, 45, 24, 2  # odd H and I: every vector tail and partial block
# Tokens a forced path runs: the GEMV's 1-token and token-block cases; on the blocked path
# one and two token tiles, and 40 (48 padded): AMX's int8 / fp8 scratch path, not em_qjit.h.
TOKENS = {"gemv": (1, 5), "gemm": (20, 40)}


def best_variant() -> str:
    return next(v for v in ("avx512", "avx2", "scalar") if cpu_isa.supported(v))


def expert(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 (gate_up, down): gate/up outputs ~ N(0, 4²), past ±7 in ~8% of the lanes."""
    gate_up, down = make_expert(H, I, seed)
    return gate_up * 4, down  # exact in bf16


def biases(dtype: torch.dtype, seed: int = 0) -> ExpertBias:
    """[E, 2I] and [E, H] biases ~ N(0, 1): far apart from expert to expert."""
    g = torch.Generator().manual_seed(seed)
    return ExpertBias(torch.randn(E, 2 * I, generator=g).to(dtype), torch.randn(E, H, generator=g).to(dtype))


def tokens(n: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(n, H, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_within(y: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> None:
    excess = (y - ref).abs() - bound
    assert (excess <= 0).all(), f"error beyond its bound by {excess.max().item():.3g} (|ref| max {ref.abs().max():.3g})"


def routing(seed: int, hot: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, K] (distinct per token; with `hot`: it first in every token's), weights [T, K]."""
    g = torch.Generator().manual_seed(seed)
    if hot is None:
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    else:
        others = torch.tensor([e for e in range(E) if e != hot])
        ids = torch.stack([torch.full((T,), hot), others[torch.randint(0, E - 1, (T,), generator=g)]], dim=1)
    return ids, torch.rand(T, K, generator=g) + 0.1


def assert_cells(got: torch.Tensor, x, ids, w, experts, weights, bias, path_of,  # noqa: ANN001
                 quantised: bool = False) -> None:
    """swiglu_oai cells [T, K, H] of `experts` (weights[i]: experts[i]'s exact fp32 (gate_up,
    down); `quantised`: dequantised ones) within the kernel's bound, scaled by the routing
    weight, plus that product's rounding; the other experts' cells still NaN. `path_of(n)`:
    the path a job of n tokens took."""
    assert got[~torch.isin(ids, torch.tensor(experts))].isnan().all()
    for e, (gate_up, down) in zip(experts, weights, strict=True):
        t, k = torch.where(ids == e)
        if t.numel() == 0:
            continue
        wt, b, blocked = w[t, k, None], bias.of(e), path_of(t.numel()) == "gemm"
        ref = expert_mlp_ref(x[t], gate_up, down, OAI, b) * wt
        bound = error_bound(x[t], gate_up, down, blocked and x.dtype != torch.bfloat16, blocked,
                            w_rounded=blocked and quantised, act=OAI, bias=b) * wt
        assert_within(got[t, k], ref, bound + 2 * U32 * ref.abs())


def test_the_data_passes_both_clamps_and_the_biases_matter() -> None:
    gate_up, down = expert(seed=1)
    bias = biases(torch.bfloat16).of(1)
    x = tokens(T, seed=2)
    pre = x.double() @ gate_up.double().T + bias.gate_up.double()
    gate, up = pre.chunk(2, dim=-1)
    assert (gate > OAI.limit).any() and (up > OAI.limit).any() and (up < -OAI.limit).any()
    # A kernel that dropped or misplaced a bias would be caught: the unbiased result is far outside the bound.
    ref, unbiased = expert_mlp_ref(x, gate_up, down, OAI, bias), expert_mlp_ref(x, gate_up, down, OAI)
    bound = error_bound(x, gate_up, down, False, True, act=OAI, bias=bias)  # the blocked path's, the looser
    assert ((ref - unbiased).abs() > bound).float().mean() > 0.5


@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_one_biased_expert(variant: str, path: str, act: str, bias_dtype: torch.dtype) -> None:
    kernel = kernel_for(variant, path)
    gate_up, down = expert(seed=3)
    bias = biases(bias_dtype, seed=4).of(2)
    for n, x_dtype in zip(TOKENS[path], (torch.float32, torch.bfloat16), strict=True):
        x = tokens(n, seed=n, dtype=x_dtype)
        y = expert_mlp_cpu(x, gate_up, down, kernel, ACTS[act], bias)
        bound = error_bound(x, gate_up, down, *rounds(variant, path, x_dtype)[:2], act=ACTS[act], bias=bias)
        assert_within(y, expert_mlp_ref(x, gate_up, down, ACTS[act], bias), bound)


def quantised(fmt, seed: int):  # noqa: ANN001, ANN201
    """An expert's parts in `fmt` and its dequantised fp32 (gate_up, down)."""
    gate_up, down = expert(seed)
    parts = quantise_expert(fmt, gate_up[:I], gate_up[I:], down)
    return parts, dequantise_expert(fmt, parts, H, I)


@pytest.mark.parametrize("fmt_name", list(FORMATS))
@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_one_biased_quantised_expert(variant: str, path: str, fmt_name: str) -> None:
    kernel, fmt = kernel_for(variant, path), FORMATS[fmt_name]
    assert native_weights(fmt) is not None
    parts, (gate_up, down) = quantised(fmt, seed=5)
    bias = biases(torch.bfloat16, seed=6).of(4)
    for n in TOKENS[path]:
        x = tokens(n, seed=10 + n, dtype=torch.float32 if n == 1 else torch.bfloat16)
        y, ref = expert_mlp_q_cpu(x, parts, fmt, kernel, OAI, bias), expert_mlp_q_ref(x, parts, fmt, OAI, bias)
        bound = error_bound(x, gate_up, down, *rounds(variant, path, x.dtype)[:2],
                            w_rounded=q_weights_rounded(variant, path), act=OAI, bias=bias)
        assert_within(y, ref, bound)


@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("variant", ["avx2", "avx512", "amx"])
def test_routed_forms_read_biases_by_expert_id(variant: str, path: str) -> None:
    kernel = kernel_for(variant, path)
    pairs = [expert(seed=20 + e) for e in range(E)]
    row_of = torch.randperm(E, generator=torch.Generator().manual_seed(7)).tolist()  # expert e at bank row row_of[e]
    gate_up = torch.stack([pairs[row_of.index(r)][0] for r in range(E)])
    down = torch.stack([pairs[row_of.index(r)][1] for r in range(E)])
    bias, (ids, w), x = biases(torch.bfloat16, seed=8), routing(seed=9), tokens(T, seed=10)
    experts = [5, 0, 3, 2]
    fp32 = [(pairs[e][0].float(), pairs[e][1].float()) for e in experts]
    path_of = (lambda n: path)  # noqa: E731

    contrib = torch.full((T, K, H), float("nan"))
    moe_experts_partial_cpu(x, ids, w, experts, [row_of[e] for e in experts], gate_up, down, OAI, contrib, kernel, bias)
    assert_cells(contrib, x, ids, w, experts, fp32, bias, path_of)
    ref = torch.full((T, K, H), float("nan"))  # the reference's own bank-row addressing agrees
    moe_experts_partial_ref(x.float(), ids, w, experts, [row_of[e] for e in experts], gate_up.float(), down.float(),
                            OAI, ref, bias)
    assert_cells(ref, x, ids, w, experts, fp32, bias, path_of)

    per_expert = torch.full((T, K, H), float("nan"))
    moe_experts_cpu(x, ids, w, experts, [pairs[e] for e in experts], per_expert, kernel, OAI, bias)
    assert torch.equal(per_expert.nan_to_num(), contrib.nan_to_num())  # the same jobs on the same kernel
    cells, values = moe_expert_cells_cpu(x, ids, w, experts, [pairs[e] for e in experts], kernel, OAI, bias)
    assert torch.equal(values, contrib.view(-1, H)[cells])


@pytest.mark.parametrize("variant", ["avx2", "avx512", "amx"])
def test_one_call_takes_both_paths_under_the_real_threshold(variant: str) -> None:
    """Expert 1 is in every token's top-K (T = 24 tokens: the blocked path at the default
    threshold, 16, AMX's 8); the others have a few tokens each (the GEMV)."""
    kernel_for(variant)  # skips where the variant can't run
    kernel = CpuExperts(variant, threads=2, gemm_min_tokens=default_gemm_min_tokens(variant, "bf16"))
    pairs = [expert(seed=30 + e) for e in range(E)]
    bias, (ids, w), x = biases(torch.float32, seed=11), routing(seed=12, hot=1), tokens(T, seed=13)
    counts = torch.bincount(ids.flatten(), minlength=E)
    threshold = kernel.gemm_threshold("bf16")
    assert counts[1] >= threshold and (counts < threshold).sum() >= 3
    contrib = torch.full((T, K, H), float("nan"))
    moe_experts_cpu(x, ids, w, list(range(E)), pairs, contrib, kernel, OAI, bias)
    blocked = variant in GEMM_VARIANTS
    assert_cells(contrib, x, ids, w, list(range(E)), [(gu.float(), dn.float()) for gu, dn in pairs], bias,
                 lambda n: "gemm" if blocked and n >= threshold else "gemv")
    kernel.close()


@pytest.mark.parametrize("fmt_name", list(FORMATS))
@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_routed_quantised_forms_read_biases_by_expert_id(path: str, fmt_name: str) -> None:
    kernel, fmt = kernel_for(best_variant(), path), FORMATS[fmt_name]
    experts_q = [quantised(fmt, seed=40 + e) for e in range(E)]
    bias, (ids, w), x = biases(torch.bfloat16, seed=14), routing(seed=15), tokens(T, seed=16)
    chosen = [4, 1, 2]
    contrib = torch.full((T, K, H), float("nan"))
    moe_experts_q_cpu(x, ids, w, chosen, [experts_q[e][0] for e in chosen], fmt, contrib, kernel, OAI, bias)
    assert_cells(contrib, x, ids, w, chosen, [experts_q[e][1] for e in chosen], bias, lambda n: path, quantised=True)
    cells, values = moe_expert_cells_q_cpu(x, ids, w, chosen, [experts_q[e][0] for e in chosen], fmt, kernel, OAI, bias)
    assert torch.equal(values, contrib.view(-1, H)[cells])
    reference = torch.full((T, K, H), float("nan"))  # kernel None: the dequantise-first reference, biased too
    cells, values = moe_expert_cells_q_cpu(x, ids, w, chosen, [experts_q[e][0] for e in chosen], fmt, None, OAI, bias)
    reference.view(-1, H)[cells] = values
    assert_cells(reference, x, ids, w, chosen, [experts_q[e][1] for e in chosen], bias, lambda n: "gemv")


@pytest.mark.parametrize("weights", ["bf16", "mxfp4", "int8"])
@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_the_host_function_reads_the_registered_biases(path: str, weights: str) -> None:
    """The CPU share's mailbox (biases and the activation registered once, with the banks):
    bitwise the routed form's cells (the same jobs on the same kernel), and each within the
    bound of its expert's — by id — reference."""
    kernel = kernel_for(best_variant(), path)
    if weights == "bf16":
        pairs = [expert(seed=50 + e) for e in range(E)]
        parts, exact = [{"gate_up": gu, "down": dn} for gu, dn in pairs], [(gu.float(), dn.float()) for gu, dn in pairs]
    else:
        experts_q = [quantised(FORMATS[weights], 50 + e) for e in range(E)]
        parts, exact = [p for p, _ in experts_q], [d for _, d in experts_q]
    banks = {name: torch.stack([p[name] for p in parts]) for name in parts[0]}
    bias, (ids, w), x = biases(torch.bfloat16, seed=17), routing(seed=18), tokens(T, seed=19)
    kind = native_weights(FORMATS[weights]) if weights != "bf16" else ("bf16", 0)
    mb = HostLayerMailboxes({3: banks}, kind, kernel, T, K, torch.bfloat16, act=OAI, biases={3: bias})
    chosen = [0, 2, 5]
    flat = ids.reshape(-1)
    pair_idx = torch.nonzero(torch.isin(flat, torch.tensor(chosen))).reshape(-1)
    mb.fill(x, pair_idx // K, flat[pair_idx], pair_idx, w.reshape(-1)[pair_idx])
    mb.run(3)
    assert mb.status(3) == 0
    got = mb.cells(pair_idx.numel())
    if weights == "bf16":
        cells, values = moe_expert_cells_cpu(x, ids, w, chosen, [pairs[e] for e in chosen], kernel, OAI, bias)
    else:
        cells, values = moe_expert_cells_q_cpu(x, ids, w, chosen, [parts[e] for e in chosen], FORMATS[weights],
                                               kernel, OAI, bias)
    assert torch.equal(values[torch.argsort(cells)], got)
    contrib = torch.full((T, K, H), float("nan"))
    contrib.view(-1, H)[pair_idx] = got
    assert_cells(contrib, x, ids, w, chosen, [exact[e] for e in chosen], bias, lambda n: path,
                 quantised=weights != "bf16")


@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_silu_jobs_without_biases_are_untouched(variant: str, path: str) -> None:
    """A job without biases computes bitwise as in a call of no biased job (em_plain_glu);
    SiLU with zero biases equals SiLU without (the biased branch's arithmetic is the plain
    one's, plus exact zeros)."""
    kernel = kernel_for(variant, path)
    n = TOKENS[path][1]
    x = tokens(n, seed=20)
    (gu_a, dn_a), (gu_b, dn_b) = expert(seed=21), expert(seed=22)
    bias_a = biases(torch.float32, seed=23).of(0)
    rows = torch.arange(2 * n).int()
    alone, mixed = torch.zeros(2 * n, H), torch.zeros(2 * n, H)
    experts_cpu(x, [ExpertJob(gu_b, dn_b, torch.arange(n), rows[n:])], alone, kernel, SILU)
    experts_cpu(x, [ExpertJob(gu_a, dn_a, torch.arange(n), rows[:n], bias=bias_a),
                    ExpertJob(gu_b, dn_b, torch.arange(n), rows[n:])], mixed, kernel, SILU)
    assert torch.equal(mixed[n:].view(torch.int32), alone[n:].view(torch.int32))
    zero = ExpertBias(torch.zeros(2 * I, dtype=torch.bfloat16), torch.zeros(H, dtype=torch.bfloat16))
    assert torch.equal(expert_mlp_cpu(x[:n], gu_b, dn_b, kernel, SILU, zero), alone[n:])
    parts, _ = quantised(FORMATS["fp8"], seed=24)
    assert torch.equal(expert_mlp_q_cpu(x[:n], parts, FORMATS["fp8"], kernel, SILU, zero),
                       expert_mlp_q_cpu(x[:n], parts, FORMATS["fp8"], kernel))


class MustNotCall:
    """A native kernel whose call fails: the entry point was to take its torch path."""

    native = True

    def call(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("the C kernel was called")


def test_what_the_kernel_cannot_take_goes_to_torch_or_is_refused() -> None:
    gate_up, down = expert(seed=25)
    x, ids, w = tokens(3, seed=26), *routing(seed=27)
    fp16 = biases(torch.float16)
    want = expert_mlp_ref(x, gate_up, down, OAI, fp16.of(1))
    got = expert_mlp_cpu(x, gate_up, down, MustNotCall(), OAI, fp16.of(1))  # fp16 biases: torch, in bf16
    assert (got - want).abs().max() < 0.1 * want.abs().max()
    gelu = ACTIVATIONS["gelu"]
    moe_experts_cpu(tokens(T, 28), ids, w, [1], [(gate_up, down)], torch.zeros(T, K, H), MustNotCall(), gelu, None)
    kernel = kernel_for(best_variant())
    bank = biases(torch.bfloat16)
    with pytest.raises(ValueError, match="bias"):  # biases of another I
        moe_experts_cpu(tokens(T, 28), ids, w, [1], [(gate_up, down)], torch.zeros(T, K, H), kernel, OAI,
                        ExpertBias(bank.gate_up[:, :-2], bank.down))
    with pytest.raises(IndexError, match="biases"):  # an expert id past the bias banks
        moe_experts_cpu(tokens(T, 28), ids, w, [E], [(gate_up, down)], torch.zeros(T, K, H), kernel, OAI, bank)
    with pytest.raises(ValueError, match="rejected"):  # em_experts: no such GLU
        kernel.call(x, np.zeros((1, JOB_FIELDS), dtype=np.int64), torch.empty(3, H), H, I, glu=Glu(act=7))
    with pytest.raises(ValueError, match="can't compute"):  # the CPU share refuses what the kernel lacks
        HostLayerMailboxes({0: {"gate_up": gate_up[None], "down": down[None]}}, ("bf16", 0), kernel, T, K,
                           torch.float32, act=gelu)
