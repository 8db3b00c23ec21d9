"""Quantised MoE kernels on the GPU (compiled Triton, bf16 activations) against the
dequantise-first torch reference at the Qwen3-30B-A3B expert shape (H=2048, I=768,
128 x 128 fp8 blocks, int4 groups of 128), every format, decode and prefill; the decode
GEMV at tiles of the sweep's families (scripts/gpu_kernel_bench.py moe_q_sweep: software
pipelined, nibble sub-tiles at 2 and 8 warps, 8 and 32 rows), each batch-invariant; the
fp8 tensor-core prefill (sm_89+) within its activation-rounding bound; a tiny model served
with quantised experts on CUDA gives the CPU path's greedy tokens; a graph capture of
the decode kernel needs no host sync."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from test_moe_quant import f8_activation_bound  # noqa: E402

from edgemoe import LLM, SamplingParams  # noqa: E402
from edgemoe.kernels import moe_quant  # noqa: E402
from edgemoe.kernels.moe_gemv_q_tiles import env_name  # noqa: E402
from edgemoe.kernels.moe_quant import moe_decode_quant, moe_prefill_quant, moe_quant_ref  # noqa: E402
from edgemoe.quant import dequantise_expert, expert_format, quantise_expert  # noqa: E402
from edgemoe.testing.kernel_inputs import moe_batch  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
H, I, S, K = 2048, 768, 16, 8
FORMATS = ["int8", "fp8", "int4", "mxfp4"]


def banks(fmt_name: str, tokens: int, seed: int = 0):  # noqa: ANN201
    fmt = expert_format(fmt_name)
    b = moe_batch(tokens, K, H, I, S, torch.float32, device="cuda", seed=seed, unrouted=0.1)
    experts = [quantise_expert(fmt, b.gate_up[s, :I], b.gate_up[s, I:], b.down[s]) for s in range(S)]
    parts = {n: torch.stack([e[n] for e in experts]) for n in experts[0]}
    deq = [dequantise_expert(fmt, e, H, I) for e in experts]
    return fmt, b, parts, torch.stack([d[0] for d in deq]), torch.stack([d[1] for d in deq])


@pytest.fixture(autouse=True)
def dispatch_must_pick_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    def strict(t: torch.Tensor, dtype: torch.dtype | None = None, _pick=moe_quant.use_triton) -> bool:
        if not t.is_cuda:  # a CPU run beside the GPU one (token comparisons) takes the reference
            return _pick(t, dtype)
        assert _pick(t, dtype), "dispatcher fell back to the torch reference"
        return True

    monkeypatch.setattr(moe_quant, "use_triton", strict)


@pytest.mark.parametrize("tokens", [1, 4, 64, 300])
@pytest.mark.parametrize("path", ["decode", "prefill"])
@pytest.mark.parametrize("fmt_name", FORMATS)
def test_quant_kernels_match_reference(fmt_name: str, path: str, tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMOE_FP8_DOT", "0")  # weight-only here; the fp8 arithmetic has its own test
    fmt, b, parts, _, _ = banks(fmt_name, tokens)
    x = b.x.bfloat16()
    want = torch.full((tokens, K, H), float("nan"), device="cuda")
    moe_quant_ref(x, b.slot_ids, b.weights, parts, fmt, want, "silu")
    got = torch.full_like(want, float("nan"))
    (moe_decode_quant if path == "decode" else moe_prefill_quant)(x, b.slot_ids, b.weights, parts, fmt, got, "silu")
    skipped = (b.slot_ids < 0)[..., None].expand_as(got)
    assert got[skipped].isnan().all() and not got[~skipped].isnan().any()
    # moe_fused's 4 roundings of the chain plus the weights' rounding to bf16 in one
    # projection each (the reference's cast; the decode kernel keeps fp32 weights).
    scale = want.nan_to_num().abs().amax(dim=-1, keepdim=True)
    assert ((got - want).nan_to_num().abs() <= 6 * 2**-7 * scale).all()


# Tile families of the decode sweep (EDGEMOE_MOE_GEMV_Q_TILES_<FMT>): rows, cols, warps of
# gate_up and down, then their software-pipelining stages.
SWEEP_TILES = [("fp8", "16,256,4,16,256,4,3,3"), ("fp8", "8,512,4,8,512,4,2,2"), ("int4", "16,512,8,16,512,8,1,1"),
               ("int4", "16,256,4,16,256,4,3,3"), ("int4", "32,512,2,32,512,2,1,1"), ("int8", "32,256,4,32,256,4,2,2")]


@pytest.mark.parametrize("tokens", [1, 8])
@pytest.mark.parametrize(("fmt_name", "tiles"), SWEEP_TILES)
def test_decode_sweep_tiles_match_reference(fmt_name: str, tiles: str, tokens: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_name(fmt_name), tiles)
    fmt, b, parts, _, _ = banks(fmt_name, tokens, seed=2)
    x = b.x.bfloat16()
    want = torch.full((tokens, K, H), float("nan"), device="cuda")
    moe_quant_ref(x, b.slot_ids, b.weights, parts, fmt, want, "silu")
    got = torch.full_like(want, float("nan"))
    moe_decode_quant(x, b.slot_ids, b.weights, parts, fmt, got, "silu")
    skipped = (b.slot_ids < 0)[..., None].expand_as(got)
    assert got[skipped].isnan().all() and not got[~skipped].isnan().any()
    scale = want.nan_to_num().abs().amax(dim=-1, keepdim=True)  # the bound of test_quant_kernels_match_reference
    assert ((got - want).nan_to_num().abs() <= 6 * 2**-7 * scale).all()
    alone = torch.full_like(want[:1], float("nan"))  # the last token by itself: the same bits
    moe_decode_quant(x[-1:], b.slot_ids[-1:], b.weights[-1:], parts, fmt, alone, "silu")
    assert torch.equal(alone[0].nan_to_num(), got[-1].nan_to_num())


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 tensor cores need sm_89+")
def test_fp8_arithmetic_prefill_within_activation_rounding() -> None:
    fmt, b, parts, gate_up, down = banks("fp8", 64, seed=1)
    x = b.x.bfloat16()
    want = torch.zeros(64, K, H, device="cuda")
    moe_quant_ref(x, b.slot_ids.clamp(min=0), b.weights, parts, fmt, want, "silu")
    got = torch.zeros_like(want)
    moe_prefill_quant(x, b.slot_ids.clamp(min=0), b.weights, parts, fmt, got, "silu")
    bound = 6 * 2**-7 * want.abs().amax(dim=-1, keepdim=True).expand_as(want).clone()
    for t in range(0, 64, 9):  # a sample of tokens: the bound is computed per cell in fp64
        for k in range(K):
            s = int(b.slot_ids[t, k].clamp(min=0))
            bound[t, k] += b.weights[t, k] * f8_activation_bound(x[t].float().cpu(), gate_up[s].cpu(), down[s].cpu()).cuda()
        assert ((got[t] - want[t]).abs() <= bound[t]).all()


def test_decode_kernel_captures_in_a_graph() -> None:
    fmt, b, parts, _, _ = banks("fp8", 1)
    x, cells = b.x.bfloat16(), torch.zeros(1, K, H, device="cuda")
    workspace = torch.empty(K * I, dtype=torch.bfloat16, device="cuda")
    moe_decode_quant(x, b.slot_ids, b.weights, parts, fmt, cells, "silu", workspace)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe_decode_quant(x, b.slot_ids, b.weights, parts, fmt, cells, "silu", workspace)
    want = cells.clone()
    cells.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(cells, want)


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = [[9707, 11, 1879, 0], list(range(2000, 2023))]


@pytest.mark.parametrize("expert_dtype", ["fp8", "int4"])
@pytest.mark.parametrize("backend", ["resident", "offload"])
def test_quantised_model_on_cuda_gives_cpu_tokens(small_ckpt, expert_dtype: str, backend: str) -> None:  # noqa: ANN001
    from tolerances import bf16_logit_error

    with LLM(str(small_ckpt), dtype="float32", device="cpu", expert_dtype=expert_dtype) as cpu:
        want = [o.token_ids for o in cpu.generate(PROMPTS, GREEDY)]
        slots = {} if backend == "resident" else {"moe_slots": 24}  # resident has no slots (refused)
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", expert_dtype=expert_dtype, moe_backend=backend,
                 **slots) as llm:
            got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        # bf16 activations against the fp32 path (the same quantised weights): the tokens
        # agree, or first part where the fp32 path's top two logits are closer than two
        # bf16 logit errors (a near-tie either may break; later tokens follow other text).
        layers = json.loads((Path(small_ckpt) / "config.json").read_text())["num_hidden_layers"]
        _, worst = bf16_logit_error(layers)
        for prompt, w, g in zip(PROMPTS, want, got, strict=True):
            if g == w:
                continue
            j = next(i for i, (a, b) in enumerate(zip(w, g, strict=True)) if a != b)
            logits = cpu.prompt_logits(prompt + w[:j])[-1]
            margin = (logits[w[j]] - logits[g[j]]).item()
            assert margin <= 2 * worst * logits.std().item(), f"parted at token {j}, fp32 margin {margin:.3g}"
