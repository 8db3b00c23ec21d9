"""gpt-oss on the GPU: fp32 against transformers' fp32 reference, bf16 with CUDA graphs and
the Triton kernels (sinks in the decode and prompt attention, biased clamped-SwiGLU experts
in the decode GEMV and the prompt GEMM) against the same reference within bf16's rounding,
identical tokens for every expert residency, and a slice of random:gpt-oss-20b in MXFP4
under a device cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_family import assert_slice_runs_under_cap
from hf_saved import save
from tolerances import bf16_logit_error, network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.testing.isolation import isolated

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=151936, hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=2, head_dim=64, num_local_experts=16, num_experts_per_tok=4, sliding_window=32,
    swiglu_limit=2.0, pad_token_id=None, eos_token_id=None, bos_token_id=None,
)
PROMPTS = [[9707, 11, 1879, 0], list(range(2000, 2040)), [(7 * i * i + 3 * i) % 150000 + 100 for i in range(300)]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(transformers.GptOssForCausalLM(transformers.GptOssConfig(**SMALL)), tmp_path_factory.mktemp("oss"))


def greedy(path: Path, **settings: object) -> list[list[int]]:
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def reference_logits(path: Path, seq: list[int], dtype: torch.dtype) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    with torch.no_grad():
        return model.cuda().eval()(torch.tensor([seq]).cuda()).logits[0].float().cpu()


def test_offload_and_graphs_give_resident_tokens(ckpt: Path) -> None:
    resident = greedy(ckpt, moe_backend="resident")
    assert greedy(ckpt, moe_backend="offload", moe_slots=6) == resident
    assert greedy(ckpt, moe_backend="resident", no_cuda_graph=True) == resident


def test_fp32_on_the_gpu_matches_transformers(ckpt: Path) -> None:
    seq = PROMPTS[2]
    with LLM(str(ckpt), dtype="float32", device="cuda") as llm:
        got = llm.prompt_logits(seq).cpu()
    ref = reference_logits(ckpt, seq, torch.float32)
    atol = network_atol(torch.float32, max(SMALL["intermediate_size"], len(seq)), ref.abs().max().item())
    torch.testing.assert_close(got, ref, atol=atol, rtol=0)


def test_bf16_gpu_agrees_with_fp32_reference(ckpt: Path) -> None:
    """Prompt logits (the prompt kernels) and a decode of 24 tokens (the decode kernels in a
    graph, each step's logits against the reference's at that position)."""
    with LLM(str(ckpt), dtype="bfloat16", device="cuda") as llm:
        out = llm.generate([PROMPTS[2]], GREEDY)[0].token_ids
        got = llm.prompt_logits(PROMPTS[2] + out).cpu().float()
    seq = PROMPTS[2] + out
    ref = reference_logits(ckpt, seq, torch.float32)
    peer = reference_logits(ckpt, seq, torch.bfloat16)  # transformers' own bf16 on the same tokens
    agree, peer_agree = ((x.argmax(-1) == ref.argmax(-1)).float().mean().item() for x in (got, peer))
    print(f"top-1 agreement with fp32: ours {agree:.3f}, transformers' bf16 {peer_agree:.3f}")
    # A random model's top two logits are often near-ties, which bf16's rounding flips:
    # 0.9, or as near to fp32 as transformers' own bf16 run gets less 0.05.
    assert agree >= min(0.9, peer_agree - 0.05), (agree, peer_agree)
    typical, worst = bf16_logit_error(SMALL["num_hidden_layers"])
    scale = ref.std().item()
    assert (ref - got).abs().mean().item() < typical * scale
    # A near-tie in the router may route other experts in bf16 than in fp32: held to
    # transformers' own bf16 count of positions past the bound on the same tokens.
    flipped, peer_flipped = (int(((x - ref).abs().amax(-1) >= worst * scale).sum()) for x in (got, peer))
    assert flipped <= 2 * peer_flipped + 2, (flipped, peer_flipped)


@pytest.mark.parametrize("expert_dtype", ["auto", "mxfp4"])
def test_hybrid_cpu_share_agrees_with_resident(ckpt: Path, expert_dtype: str) -> None:
    """The device cache's CPU share (the C kernel's biased clamped SwiGLU on half of each
    layer's misses, prompt chunks' too) against resident: the same function to bf16's
    rounding (another arithmetic on the CPU: not bitwise), and the CPU did compute."""
    seq, fmt = PROMPTS[2], {"expert_dtype": expert_dtype}
    with LLM(str(ckpt), dtype="bfloat16", device="cuda", moe_backend="resident", **fmt) as llm:
        want = llm.prompt_logits(seq).cpu().float()
    with LLM(str(ckpt), dtype="bfloat16", device="cuda", moe_backend="hybrid", moe_slots=6, moe_hybrid_fraction=0.5,
             **fmt) as llm:
        got = llm.prompt_logits(seq).cpu().float()
        llm.generate([PROMPTS[1]], GREEDY)
        assert llm.stats()["moe"]["experts_cpu"] > 0
    typical, _ = bf16_logit_error(SMALL["num_hidden_layers"])
    assert (got - want).abs().mean().item() < typical * want.std().item()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.9


@isolated  # measures the driver-counted device memory of a fresh process
def test_20b_slice_in_mxfp4_runs_under_the_cap() -> None:
    assert_slice_runs_under_cap("random:gpt-oss-20b?num_hidden_layers=6", 6, expert_dtype="mxfp4")
