"""MiniMax-M2 (`minimax_m2`) on the GPU: a small checkpoint of its shape (whole-projection q/k
norms, rotary on half of each head, a sigmoid router whose selection bias matters) written
by transformers' `save_pretrained`: fp32 on the GPU against transformers' fp32 logits, the
same greedy tokens for every expert residency and with graphs off (bf16, the Triton
kernels: the fused norms, the sigmoid router's GEMV and launch); and a slice of
random:minimax-m2 at its real layer shape at fp8 under a cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_saved import save
from tolerances import network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.testing.isolation import DeviceUse, isolated

transformers = pytest.importorskip("transformers")

E = 16
SMALL = dict(
    vocab_size=151936, hidden_size=256, intermediate_size=128, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, num_local_experts=E, num_experts_per_tok=4,
    rotary_dim=32, pad_token_id=None, eos_token_id=None, bos_token_id=None,
)
PROMPTS = [[9707, 11, 1879, 0], list(range(2000, 2040)), [(7 * i * i + 3 * i) % 150000 + 100 for i in range(300)]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = transformers.MiniMaxM2ForCausalLM(transformers.MiniMaxM2Config(**SMALL))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a buffer: save's rescaling does not reach it; N(0, 0.5²) reorders the scores
        for layer in model.model.layers:
            layer.mlp.e_score_correction_bias.copy_(0.5 * torch.randn(E, generator=g))
    return save(model, tmp_path_factory.mktemp("minimax"))


def greedy(path: Path, **settings: object) -> list[list[int]]:
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_fp32_on_the_gpu_matches_transformers(ckpt: Path) -> None:
    seq = PROMPTS[2]
    with LLM(str(ckpt), dtype="float32", device="cuda") as llm:
        got = llm.prompt_logits(seq).cpu()
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        ref = model.cuda().eval()(torch.tensor([seq]).cuda()).logits[0].float().cpu()
    atol = network_atol(torch.float32, max(SMALL["hidden_size"], len(seq)), ref.abs().max().item())
    torch.testing.assert_close(got, ref, atol=atol, rtol=0)


def test_offload_and_graphs_give_resident_tokens(ckpt: Path) -> None:
    resident = greedy(ckpt, moe_backend="resident")
    assert greedy(ckpt, moe_backend="offload", moe_slots=6) == resident
    assert greedy(ckpt, moe_backend="resident", no_cuda_graph=True) == resident


@isolated  # measures the driver-counted device memory of a fresh process
def test_a_slice_of_the_real_shape_at_fp8_runs_under_the_cap() -> None:
    cap = 8 * 2**30
    use = DeviceUse()
    with LLM("random:minimax-m2?num_hidden_layers=4", device="cuda", gpu_memory="8GiB", expert_dtype="fp8",
             kv_tokens=8192) as llm:
        out = llm.generate([list(range(1000, 3000)), [5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True))
        assert all(len(o.token_ids) == 8 for o in out)
        peak = use.now()
    assert peak <= cap, peak / 2**30
