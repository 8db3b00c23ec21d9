"""Multi-head latent attention (GLM-4.7-Flash's `glm4_moe_lite`) on the GPU: fp32 against
transformers' fp32 reference, bf16 with CUDA graphs and the Triton attention kernels over
the latent cache (one kv head of rope + kv_lora dims, K and V one tensor) against the same
reference within bf16's rounding, identical tokens for every expert residency and for
graphs on or off, the Triton backend against the torch one, and a slice of
random:glm-4.7-flash at its real attention shape (576-wide rows, 20 heads) under a cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_family import (
    GREEDY,
    PROMPTS,
    assert_fp32_matches_transformers,
    assert_residencies_agree,
    assert_slice_runs_under_cap,
)
from hf_saved import save
from tolerances import bf16_logit_error

from edgemoe import LLM
from edgemoe.testing.isolation import isolated

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=151936, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=8, q_lora_rank=96, kv_lora_rank=128, qk_nope_head_dim=48,
    qk_rope_head_dim=32, v_head_dim=64, n_routed_experts=16, num_experts_per_tok=4, n_group=2, topk_group=1,
    routed_scaling_factor=1.8, pad_token_id=None, eos_token_id=None, bos_token_id=None,
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = transformers.Glm4MoeLiteForCausalLM(transformers.Glm4MoeLiteConfig(**SMALL))
    return save(model, tmp_path_factory.mktemp("mla"))


def reference_logits(path: Path, seq: list[int], dtype: torch.dtype) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    with torch.no_grad():
        return model.cuda().eval()(torch.tensor([seq]).cuda()).logits[0].float().cpu()


def test_offload_and_graphs_give_resident_tokens(ckpt: Path) -> None:
    assert_residencies_agree(ckpt)


def test_triton_attention_agrees_with_torch(ckpt: Path) -> None:
    """The same function on another kernel: bf16's rounding apart, the same top-1 nearly everywhere."""
    seq = PROMPTS[2]
    logits = {}
    for backend in ("triton", "torch"):
        with LLM(str(ckpt), dtype="bfloat16", device="cuda", attention_backend=backend) as llm:
            logits[backend] = llm.prompt_logits(seq).cpu().float()
    typical, _ = bf16_logit_error(SMALL["num_hidden_layers"])
    want = logits["torch"]
    assert (logits["triton"] - want).abs().mean().item() < typical * want.std().item()
    assert (logits["triton"].argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.9


def test_fp32_on_the_gpu_matches_transformers(ckpt: Path) -> None:
    assert_fp32_matches_transformers(ckpt, SMALL["intermediate_size"])


def test_bf16_gpu_agrees_with_fp32_reference(ckpt: Path) -> None:
    """Prompt logits (the extend kernel) and a decode of 24 tokens (the decode kernel in a
    graph, each step's logits against the reference's at that position)."""
    with LLM(str(ckpt), dtype="bfloat16", device="cuda") as llm:
        out = llm.generate([PROMPTS[2]], GREEDY)[0].token_ids
        got = llm.prompt_logits(PROMPTS[2] + out).cpu().float()
    seq = PROMPTS[2] + out
    ref = reference_logits(ckpt, seq, torch.float32)
    peer = reference_logits(ckpt, seq, torch.bfloat16)  # transformers' own bf16 on the same tokens
    agree, peer_agree = ((x.argmax(-1) == ref.argmax(-1)).float().mean().item() for x in (got, peer))
    print(f"top-1 agreement with fp32: ours {agree:.3f}, transformers' bf16 {peer_agree:.3f}")
    assert agree >= min(0.9, peer_agree - 0.05), (agree, peer_agree)
    typical, worst = bf16_logit_error(SMALL["num_hidden_layers"])
    scale = ref.std().item()
    assert (ref - got).abs().mean().item() < typical * scale
    flipped, peer_flipped = (int(((x - ref).abs().amax(-1) >= worst * scale).sum()) for x in (got, peer))
    assert flipped <= 2 * peer_flipped + 2, (flipped, peer_flipped)


@isolated  # measures the driver-counted device memory of a fresh process
def test_flash_slice_at_its_attention_shape_runs_under_the_cap() -> None:
    """576-wide latent rows and 20 heads through the compiled kernels, graphs included."""
    assert_slice_runs_under_cap("random:glm-4.7-flash?num_hidden_layers=6", 6)
