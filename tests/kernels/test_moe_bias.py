"""Biased experts and gpt-oss's clamped SwiGLU (`ExpertBias`, `clamped_swiglu`) through every
MoE expert path: the torch paths, the Triton kernels (under the interpreter on CPU: bf16
decode with and without split-K, prefill; each quantised format's decode and prefill) and
the CPU experts' torch fallback (no compiler; the C kernel: test_cpu_experts_bias.py),
against the fp32 formula within `cell_bound` (the dtype's roundings propagated through
the magnitudes of this very case). Weights sit in a permuted slot map (slot != expert id),
so a bias read by slot instead of expert id shows."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from tolerances import eps

from edgemoe.kernels import moe_experts, moe_fused, moe_quant
from edgemoe.kernels.activations import ACTIVATIONS, Activation, clamped_swiglu
from edgemoe.kernels.cpu_experts import (
    ExpertJob,
    expert_mlp_cpu,
    experts_cpu,
    moe_expert_cells_cpu,
    moe_experts_partial_cpu,
)
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.moe_experts import moe_slots, moe_slots_gather, moe_slots_grouped
from edgemoe.kernels.moe_quant import moe_quant_ref, moe_slots_parts
from edgemoe.quant import Fp8Block, Int4Group, Int8Channel, Mxfp4, dequantise_expert, quantise_expert

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")

E, S = 6, 5
SLOT_OF = torch.tensor([3, -1, 0, 4, 1, 2])  # expert e's slot; expert 1 is not resident (its pairs: -1)
ALPHA, LIMIT = 1.702, 7.0
OAI, SILU = clamped_swiglu(ALPHA, LIMIT), ACTIVATIONS["silu"]
KINDS = {"swiglu_oai+bias": (OAI, True), "silu+bias": (SILU, True), "swiglu_oai": (OAI, False)}
FORMATS = {"int8": Int8Channel(), "fp8": Fp8Block(block=16), "int4": Int4Group(group=16), "mxfp4": Mxfp4()}
U32 = eps(torch.float32) / 2


@dataclasses.dataclass(frozen=True)
class Case:
    x: torch.Tensor  # [T, H] in the dtype
    expert_ids: torch.Tensor  # [T, K] int32
    slot_ids: torch.Tensor  # [T, K] int32: SLOT_OF[expert_ids], -1 where not resident or dropped
    weights: torch.Tensor  # [T, K] fp32
    gate_up: torch.Tensor  # [E, 2I, H] fp32, the exact weights (dtype values, or dequantised)
    down: torch.Tensor  # [E, H, I] fp32
    bias: ExpertBias | None  # in the dtype


def make_case(dtype: torch.dtype, seed: int, biased: bool, tokens: int = 5, top_k: int = 2, hidden: int = 48,
              inter: int = 40) -> Case:
    """gate/up outputs ~ N(0, 4²) (biases ~ N(0, 1)): beyond LIMIT = 7 in ~8% of the lanes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    gate_up = (torch.randn(E, 2 * inter, hidden, generator=g) * 4 * hidden**-0.5).to(dtype).float()
    down = (torch.randn(E, hidden, inter, generator=g) * inter**-0.5).to(dtype).float()
    bias = ExpertBias(torch.randn(E, 2 * inter, generator=g).to(dtype), torch.randn(E, hidden, generator=g).to(dtype))
    ids = torch.rand(tokens, E, generator=g).argsort(dim=1)[:, :top_k].to(torch.int32)
    drop = torch.rand(tokens, top_k, generator=g) < 0.2
    slots = torch.where(drop, -1, SLOT_OF[ids.long()]).to(torch.int32)
    slots[0, -1] = -1  # a skipped pair in every case
    w = torch.rand(tokens, top_k, generator=g)
    return Case(x, ids, slots, w / w.sum(1, keepdim=True), gate_up, down, bias if biased else None)


def slot_banks(case: Case, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gate_up = torch.zeros(S, *case.gate_up.shape[1:], dtype=dtype)
    down = torch.zeros(S, *case.down.shape[1:], dtype=dtype)
    for e in range(E):
        if SLOT_OF[e] >= 0:
            gate_up[SLOT_OF[e]], down[SLOT_OF[e]] = case.gate_up[e].to(dtype), case.down[e].to(dtype)
    return gate_up, down


def quantised(case: Case, fmt) -> tuple[Case, dict[str, torch.Tensor]]:  # noqa: ANN001
    """The case's experts quantised: (the case with the dequantised weights as the exact
    ones, the slot banks' parts)."""
    inter, hidden = case.down.shape[2], case.down.shape[1]
    experts = [quantise_expert(fmt, case.gate_up[e, :inter], case.gate_up[e, inter:], case.down[e]) for e in range(E)]
    deq = [dequantise_expert(fmt, p, hidden, inter) for p in experts]
    in_slot = [int((SLOT_OF == s).nonzero()) for s in range(S)]
    parts = {name: torch.stack([experts[e][name] for e in in_slot]) for name in experts[0]}
    exact = dataclasses.replace(case, gate_up=torch.stack([d[0] for d in deq]), down=torch.stack([d[1] for d in deq]))
    return exact, parts


def pair_terms(case: Case) -> tuple[torch.Tensor, ...]:
    """Per routed pair, in fp64: x, W_gu, W_d, b_gu, b_d (zeros without biases)."""
    e = case.expert_ids.flatten().long()
    x = case.x.double().repeat_interleave(case.expert_ids.shape[1], dim=0)
    inter, hidden = case.down.shape[2], case.down.shape[1]
    if case.bias is None:
        b_gu = torch.zeros(len(e), 2 * inter, dtype=torch.float64)
        b_d = torch.zeros(len(e), hidden, dtype=torch.float64)
    else:
        b_gu, b_d = case.bias.gate_up[e].double(), case.bias.down[e].double()
    return x, case.gate_up[e].double(), case.down[e].double(), b_gu, b_d


def glu_exact(act: Activation, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if act.kernel_name == "swiglu_oai":
        g, u = gate.clamp(max=LIMIT), up.clamp(-LIMIT, LIMIT)
        return (u + 1) * g * torch.sigmoid(ALPHA * g)
    return F.silu(gate) * up


def formula(case: Case, act: Activation) -> torch.Tensor:
    """The fp32 formula: cells [T, K, H], NaN where the slot is -1."""
    x, w_gu, w_d, b_gu, b_d = (t.float() for t in pair_terms(case))
    gate, up = (torch.einsum("pih,ph->pi", w_gu, x) + b_gu).chunk(2, dim=-1)
    y = torch.einsum("phi,pi->ph", w_d, glu_exact(act, gate, up)) + b_d
    cells = (y * case.weights.reshape(-1, 1)).view(*case.slot_ids.shape, -1)
    return torch.where((case.slot_ids >= 0)[..., None], cells, float("nan"))


def chain_error(case: Case, act: Activation, r: float, w_r: float) -> torch.Tensor:
    """|computed - exact| per cell [T, K, H] for a chain that rounds each projection's output,
    h and the down projection to a unit roundoff `r`, its weights to `w_r` (0: used as they
    are), sums, adds biases and evaluates the GLU in fp32 (Higham's γ_n for the sums). The
    GLU's error from its inputs by the mean value theorem: d/dg (g·sigmoid(a·g)) and silu'
    never exceed 1.1 (1.0998 at their maximum), clamps are 1-Lipschitz."""
    x, w_gu, w_d, b_gu, b_d = pair_terms(case)
    n_h, n_i = x.shape[1] + 1, w_d.shape[2] + 1  # the products' rounding counted as a term

    def gamma(n: int) -> float:
        return n * U32 / (1 - n * U32)

    a = torch.einsum("pih,ph->pi", w_gu, x)
    mag = torch.einsum("pih,ph->pi", w_gu.abs(), x.abs())
    d_in = r * a.abs() + (1 + r) * (gamma(n_h) + w_r) * mag
    d_in = d_in + U32 * ((a + b_gu).abs() + d_in)  # the fp32 bias add
    (gate, up), (d_g, d_u) = (a + b_gu).chunk(2, dim=-1), d_in.chunk(2, dim=-1)
    if act.kernel_name == "swiglu_oai":
        g, u = gate.clamp(max=LIMIT), up.clamp(-LIMIT, LIMIT)
        psi = g * torch.sigmoid(ALPHA * g)
        e_h = 1.1 * (u.abs() + 1) * d_g + (psi.abs() + 1.1 * d_g) * d_u
        e_h = e_h + (16 + ALPHA * g.abs()) * U32 * (u.abs() + 1) * g.abs()  # fp32 ops; exp's argument rounding
    else:
        silu = F.silu(gate)
        e_h = 1.1 * d_g * (up.abs() + d_u) + silu.abs() * d_u + (16 + gate.abs()) * U32 * gate.abs() * up.abs()
    h = glu_exact(act, gate, up)
    e_h = e_h + r * (h.abs() + e_h)  # h rounded once
    d_abs = torch.einsum("phi,pi->ph", w_d.abs(), h.abs() + e_h)
    y = torch.einsum("phi,pi->ph", w_d, h)
    e_y = torch.einsum("phi,pi->ph", w_d.abs(), e_h) + (gamma(n_i) + w_r) * d_abs
    e_y = e_y + r * (y.abs() + e_y) + U32 * ((y + b_d).abs() + e_y)  # rounded, then the fp32 bias add
    weight = case.weights.reshape(-1, 1).double()
    cell = weight * e_y + U32 * weight * ((y + b_d).abs() + e_y)  # the routing weight's product
    return cell.view(*case.slot_ids.shape, -1)


def cell_bound(case: Case, act: Activation, dtype: torch.dtype, weights_rounded: bool = False) -> torch.Tensor:
    """The kernel's chain (rounding to `dtype`) plus the fp32 formula's own error."""
    r = eps(dtype) / 2
    return chain_error(case, act, r, r if weights_rounded else 0.0) + chain_error(case, act, U32, 0.0)


def assert_cells(got: torch.Tensor, case: Case, act: Activation, dtype: torch.dtype,
                 weights_rounded: bool = False) -> None:
    want = formula(case, act)
    skipped = (case.slot_ids < 0)[..., None].expand_as(got)
    assert skipped.any(), "the case must hold skipped pairs"
    assert got[skipped].isnan().all()  # poisoned cells of slot -1 left alone
    assert not got[~skipped].isnan().any()
    excess = ((got - want).abs() - cell_bound(case, act, dtype, weights_rounded).float())[~skipped]
    assert (excess <= 0).all(), f"beyond the bound by {excess.max():.3g} (|cell| max {want[~skipped].abs().max():.3g})"


def poisoned(case: Case) -> torch.Tensor:
    return torch.full((*case.slot_ids.shape, case.x.shape[1]), float("nan"))


def test_cases_exercise_both_clamps() -> None:
    case = make_case(torch.bfloat16, seed=1, biased=True)
    _, w_gu, _, b_gu, _ = pair_terms(case)
    gate, up = (torch.einsum("pih,ph->pi", w_gu, pair_terms(case)[0]) + b_gu).chunk(2, dim=-1)
    assert (gate > LIMIT).any() and (up > LIMIT).any() and (up < -LIMIT).any()


def test_clamped_swiglu_is_transformers_gate() -> None:
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    experts = GptOssExperts(GptOssConfig(num_local_experts=1, hidden_size=8, intermediate_size=64))
    gate, up = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(0)).mul(6).unbind(0)
    interleaved = torch.stack((gate, up), dim=-1).flatten(-2)  # gpt-oss's column order
    assert torch.equal(OAI.glu(gate, up), experts._apply_gate(interleaved))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("path", [moe_slots_grouped, moe_slots_gather], ids=["grouped", "gather"])
def test_torch_paths(path, kind: str) -> None:  # noqa: ANN001
    act, biased = KINDS[kind]
    case = make_case(torch.bfloat16, seed=2, biased=biased)
    gate_up, down = slot_banks(case, torch.bfloat16)
    got = poisoned(case)
    path(case.x, case.slot_ids, case.weights, gate_up, down, act, got, case.bias, case.expert_ids)
    assert_cells(got, case, act, torch.bfloat16)


def test_references() -> None:
    case = make_case(torch.bfloat16, seed=3, biased=True)
    gate_up, down = slot_banks(case, torch.bfloat16)
    got = poisoned(case)
    moe_fused.moe_slots_ref(case.x, case.slot_ids, case.weights, gate_up, down, got, OAI, None, case.bias,
                            case.expert_ids)
    assert_cells(got, case, OAI, torch.bfloat16)


def test_bias_needs_expert_ids() -> None:
    case = make_case(torch.bfloat16, seed=4, biased=True)
    gate_up, down = slot_banks(case, torch.bfloat16)
    with pytest.raises(ValueError, match="expert_ids"):
        moe_slots(case.x, case.slot_ids, case.weights, gate_up, down, OAI, poisoned(case), bias=case.bias)
    parts = {"gate_up": gate_up, "down": down}
    with pytest.raises(ValueError, match="expert_ids"):
        moe_slots_parts(case.x, case.slot_ids, case.weights, parts, Int8Channel(), OAI, poisoned(case), bias=case.bias)


def test_silu_without_bias_is_bitwise_the_unchanged_formula() -> None:
    # The code before biases: each used slot's pairs in (t, k) order through
    # F.linear(silu(gate) * up, down) (grouped), every pair through gathered bmm (gather).
    case = make_case(torch.bfloat16, seed=5, biased=False)
    gate_up, down = slot_banks(case, torch.bfloat16)
    got, want = poisoned(case), poisoned(case)
    moe_slots(case.x, case.slot_ids, case.weights, gate_up, down, SILU, got)  # on CPU: the grouped path
    for slot in range(S):
        t, k = torch.where(case.slot_ids == slot)
        gate, up = F.linear(case.x[t], gate_up[slot]).chunk(2, dim=-1)
        want[t, k] = F.linear(F.silu(gate) * up, down[slot]).float() * case.weights[t, k, None]
    assert torch.equal(got.nan_to_num(), want.nan_to_num()) and torch.equal(got.isnan(), want.isnan())
    gathered = poisoned(case)
    moe_slots_gather(case.x, case.slot_ids, case.weights, gate_up, down, SILU, gathered)
    T, K = case.slot_ids.shape
    slots = case.slot_ids.flatten().clamp(min=0).long()
    gate, up = torch.bmm(gate_up[slots], case.x.repeat_interleave(K, dim=0)[:, :, None]).squeeze(-1).chunk(2, dim=-1)
    y = torch.bmm(down[slots], (F.silu(gate) * up)[:, :, None]).squeeze(-1).float() * case.weights.reshape(-1, 1)
    routed = (case.slot_ids >= 0).flatten()
    assert torch.equal(gathered.view(T * K, -1)[routed], y[routed])


@pytest.fixture
def triton_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatchers take their Triton branch on CPU tensors (the interpreter runs it)."""
    for module in (moe_experts, moe_fused, moe_quant):
        monkeypatch.setattr(module, "use_triton", lambda *a, **k: True)


@needs_triton
@pytest.mark.parametrize("kind", list(KINDS))
def test_triton_decode_and_prefill(triton_on_cpu: None, kind: str) -> None:
    # moe_slots' Triton branch: rows 0-1 decode (GEMV), rows 2-4 prefill (grouped GEMM).
    act, biased = KINDS[kind]
    case = make_case(torch.bfloat16, seed=6, biased=biased)
    gate_up, down = slot_banks(case, torch.bfloat16)
    got = poisoned(case)
    moe_slots(case.x, case.slot_ids, case.weights, gate_up, down, act, got, num_decode=2, bias=case.bias,
              expert_ids=case.expert_ids)
    assert_cells(got, case, act, torch.bfloat16)


@needs_triton
@pytest.mark.parametrize("splits", [1, 3])
def test_triton_decode_fp32_and_split_k(monkeypatch: pytest.MonkeyPatch, splits: int) -> None:
    # Split-K: the down launch builds h (bias, GLU) from the partials. 16-column tiles over
    # H = 75 give splits of 32 + 32 + 11; fp32 keeps the bound tight (a misplaced bias shows).
    from edgemoe.kernels.triton_ops.moe_gemv import moe_decode_triton

    monkeypatch.setenv("EDGEMOE_MOE_GEMV_TILES", f"16,16,1,32,16,1,{splits}")
    for dtype in (torch.float32, torch.bfloat16):
        case = make_case(dtype, seed=7, biased=True, tokens=3, hidden=75, inter=37)
        gate_up, down = slot_banks(case, dtype)
        got = poisoned(case)
        moe_decode_triton(case.x, case.slot_ids, case.weights, gate_up, down, got, OAI, None, case.bias,
                          case.expert_ids)
        assert_cells(got, case, OAI, dtype)


@needs_triton
@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_triton_quantised(triton_on_cpu: None, fmt_name: str) -> None:
    # Row 0 through the quantised GEMV, rows 1-2 through the quantised GEMM. The GEMM rounds
    # the dequantised weights to bf16 before its MMA (the GEMV multiplies them in fp32).
    case, parts = quantised(make_case(torch.bfloat16, seed=8, biased=True, tokens=3, hidden=64, inter=32),
                            FORMATS[fmt_name])
    got = poisoned(case)
    moe_slots_parts(case.x, case.slot_ids, case.weights, parts, FORMATS[fmt_name], OAI, got, num_decode=1,
                    bias=case.bias, expert_ids=case.expert_ids)
    assert_cells(got, case, OAI, torch.bfloat16, weights_rounded=True)
    ref = poisoned(case)  # the dequantise-first reference (weights cast to bf16)
    moe_quant_ref(case.x, case.slot_ids, case.weights, parts, FORMATS[fmt_name], ref, OAI, None, case.bias,
                  case.expert_ids)
    assert_cells(ref, case, OAI, torch.bfloat16, weights_rounded=True)


class NoNativeCall:
    """A machine without a compiler (`CpuExperts("torch")`): the entry points take torch."""

    native = False

    def call(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("no C kernel to call")


@pytest.mark.parametrize("kind", ["swiglu_oai+bias", "silu+bias"])
def test_cpu_experts_fall_back_to_torch(kind: str) -> None:
    act, _ = KINDS[kind]
    case = make_case(torch.bfloat16, seed=9, biased=True)
    elsewhere = int(case.expert_ids[0, -1])  # computed by another pass: its pairs' cells stay untouched
    case = dataclasses.replace(case, slot_ids=torch.where(case.expert_ids == elsewhere, -1, case.expert_ids))
    experts = [e for e in range(E) if e != elsewhere]
    gate_up, down = case.gate_up.bfloat16(), case.down.bfloat16()
    contrib = poisoned(case)
    moe_experts_partial_cpu(case.x, case.expert_ids, case.weights, experts, experts, gate_up, down, act, contrib,
                            NoNativeCall(), case.bias)
    assert_cells(contrib, case, act, torch.bfloat16)
    cells, values = moe_expert_cells_cpu(case.x, case.expert_ids, case.weights, experts,
                                         [(gate_up[e], down[e]) for e in experts], NoNativeCall(), act, case.bias)
    compact = poisoned(case)
    compact.view(-1, compact.shape[-1])[cells] = values
    assert_cells(compact, case, act, torch.bfloat16)
    jobs, out = [], poisoned(case)
    for e in experts:
        t, k = torch.where(case.expert_ids == e)
        jobs.append(ExpertJob(gate_up[e], down[e], t, t * case.expert_ids.shape[1] + k, case.weights[t, k],
                              case.bias.of(e)))  # type: ignore[union-attr]
    experts_cpu(case.x, jobs, out.view(-1, out.shape[-1]), NoNativeCall(), act)
    assert_cells(out, case, act, torch.bfloat16)
    t, k = torch.where(case.expert_ids == experts[0])  # the one-expert form: the same torch path
    one = expert_mlp_cpu(case.x[t], gate_up[experts[0]], down[experts[0]], NoNativeCall(), act,
                         case.bias.of(experts[0]))  # type: ignore[union-attr]
    assert torch.equal(one * case.weights[t, k, None], out[t, k])
