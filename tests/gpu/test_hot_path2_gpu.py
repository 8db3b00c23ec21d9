"""Hot path II on the GPU: Triton kernels behind the seams, CUDA-graph decode.

- greedy tokens bitwise identical with CUDA graphs on and off (decode batches are
  padded to the captured sizes either way), and for offload vs resident;
- the Triton path (q/k head norms fused into the rope + KV write) against the torch path
  (separate norms): tie-aware top-1 agreement ≥ 99% over 512 teacher-forced positions;
- a graph-replayed decode step is one graph launch and waits for the device once;
- every captured size writes one static logits buffer, and a batch shrinking through the
  sizes gives eager decoding's tokens.
"""

from __future__ import annotations

import json

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.bench.api_trace import count_api_calls

PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def tokens(path, **settings) -> list[list[int]]:  # noqa: ANN001, ANN003
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def graphed(small_ckpt):  # noqa: ANN001, ANN201
    return tokens(small_ckpt, moe_backend="resident")


def test_graphs_on_and_off_give_the_same_tokens(small_ckpt, graphed) -> None:  # noqa: ANN001
    assert tokens(small_ckpt, moe_backend="resident", no_cuda_graph=True) == graphed


def test_offload_gives_resident_tokens_through_the_triton_path(small_ckpt, graphed) -> None:  # noqa: ANN001
    assert tokens(small_ckpt, moe_backend="offload", moe_slots=8) == graphed


def tie_aware_agreement(fast: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    """Share of positions where fast's argmax is ref's argmax, or within `tol` of ref's
    best logit (a near-tie the two paths may break differently)."""
    best = ref.max(-1).values
    picked = ref.gather(1, fast.argmax(-1, keepdim=True)).squeeze(1)
    return ((best - picked) <= tol).float().mean().item()


def fused_head_norm_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Spies on the Triton backend's rope + KV write: one entry per call, whether the
    layer's q/k head norms were fused into it (qwen3_moe: qk_norm="head")."""
    from edgemoe.kernels import rope_kv

    calls: list[bool] = []
    kernel = rope_kv.rope_write_kv

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(kwargs.get("q_norm_w") is not None)
        return kernel(*args, **kwargs)

    monkeypatch.setattr("edgemoe.layers.triton_attention.rope_write_kv", spy)
    return calls


def test_triton_path_agrees_with_torch_path(small_ckpt, graphed, monkeypatch) -> None:  # noqa: ANN001
    # 512 positions: prompt 2's prefill (extend attention, grouped MoE) and its decode
    # tokens teacher-forced through the torch path.
    seq = (PROMPTS[2] + graphed[2] + list(range(1000, 1400)))[:512]
    fused = fused_head_norm_calls(monkeypatch)
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident") as llm:
        fast = llm.prompt_logits(seq).float().cpu()
    assert fused and all(fused), fused  # every layer's q/k head norms ran inside the rope kernel
    monkeypatch.undo()
    monkeypatch.setenv("EDGEMOE_TRITON", "0")
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident",
             attention_backend="torch") as llm:
        ref = llm.prompt_logits(seq).float().cpu()
    # bf16 activations through 4 layers: logits move by a few bf16 ulps of their scale.
    tol = 8 * 2**-8 * ref.abs().max().item()
    agree = tie_aware_agreement(fast, ref, tol)
    assert agree >= 0.99, agree
    assert len(seq) == 512


def test_a_graph_decode_step_is_one_launch_and_one_wait(small_ckpt) -> None:  # noqa: ANN001
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident") as llm:
        engine = llm.engine
        assert engine.runner.graphs is not None
        engine.add_request(PROMPTS[0], GREEDY)
        for _ in range(4):
            engine.step()
        counts = count_api_calls(engine.step)
        print("\n" + json.dumps(counts.by_name))
        assert counts.graph_launches == 1
        assert counts.syncs <= 1, json.dumps(counts.by_name)


def test_every_graph_writes_one_logits_buffer_as_the_batch_shrinks(small_ckpt) -> None:  # noqa: ANN001
    # Requests ending at different steps walk the batch down through sizes 4, 2 and 1:
    # each replay's logits come from the one static buffer every graph writes.
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (40, 24, 9)]
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident") as llm:
        graphs = llm.engine.runner.graphs
        assert graphs is not None and graphs.logits_out is not None
        base = graphs.logits_out.untyped_storage().data_ptr()
        assert {out.untyped_storage().data_ptr() for _, out in graphs.graphs.values()} == {base}
        graphed = [o.token_ids for o in llm.generate(PROMPTS, params)]
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident", no_cuda_graph=True) as llm:
        eager = [o.token_ids for o in llm.generate(PROMPTS, params)]
    assert graphed == eager
    assert [len(t) for t in graphed] == [40, 24, 9]
