"""`--dense-kernel` reaches the model: every decode-path projection (attention q/k/v and
o, GDN in/out, routers, shared-expert gates, the LM head) goes through the dispatcher
the engine built, and the default (auto) keeps the torch reference on a CPU."""

from __future__ import annotations

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.kernels import dense_gemv as dense

PROJECTIONS = ("qkv", "o_proj", "in_proj", "out_proj", "router", "shared_gate")
GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def projection_weights(model, names: tuple[str, ...] = PROJECTIONS) -> set[int]:  # noqa: ANN001 - a CausalLM
    """data_ptr of every projection weight the layers hold, and the LM head's."""
    found = {model.lm_head.data_ptr()}
    for block in model.blocks:
        for part in vars(block).values():
            for sub in (part, getattr(part, "routed", None)):
                for name in names:
                    w = getattr(sub, name, None)
                    if isinstance(w, torch.Tensor):
                        found.add(w.data_ptr())
    return found


def record_projections(monkeypatch) -> set[int]:  # noqa: ANN001
    """The weights every later projection call reads (data_ptr), filled as they run:
    `dense_gemv` looks the reference up at call time (CPU tensors take it)."""
    seen: set[int] = set()
    reference = dense.dense_gemv_ref

    def recording(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        seen.add(w.data_ptr())
        return reference(x, w, bias)

    monkeypatch.setattr(dense, "dense_gemv_ref", recording)
    return seen


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_next"])
def test_every_projection_goes_through_the_dispatcher(make_ckpt, monkeypatch, model_type: str) -> None:  # noqa: ANN001
    path = str(make_ckpt(model_type))
    with LLM(path, dtype="float32") as plain:
        assert plain.engine.runtime.model.linear is dense.dense_gemv_ref  # the default (auto) on a CPU: torch
        want = plain.generate([[5, 6, 7, 8]], GREEDY)[0].token_ids
    seen = record_projections(monkeypatch)
    with LLM(path, dtype="float32", dense_kernel="triton") as llm:
        model = llm.engine.runtime.model
        assert model.linear is dense.dense_gemv
        got = llm.generate([[5, 6, 7, 8]], GREEDY)[0].token_ids
        expected = projection_weights(model)
    assert len(expected) > 4 and seen == expected
    assert got == want  # on the CPU the dispatcher runs the reference: the same tokens


def test_qwen38_projections_go_through_the_dispatcher(monkeypatch) -> None:  # noqa: ANN001
    """Qwen3.8-Flash-Next's too: its QSA layers' q/k/v, o and indexer projections and its PLE
    layers' key and value (until 2026-12-03 the QSA layers were built without the engine's
    projection function and took cuBLAS whatever `--dense-kernel` said), the hyper-
    connections' down and up projections. (The final stream mixer's two are not reachable
    from the blocks: a subset, not an equality.)"""
    seen = record_projections(monkeypatch)
    with LLM("random:tiny-qwen3.8-flash-next", dtype="float32", dense_kernel="triton", progress=False) as llm:
        model = llm.engine.runtime.model
        llm.generate([[5, 6, 7, 8, 9, 10, 11, 12, 13]], GREEDY)
        expected = projection_weights(model, (*PROJECTIONS, "idx_qk", "down", "up", "key", "value"))
    kinds = {type(p).__name__ for b in model.blocks for p in vars(b).values()}
    assert {"QsaAttention", "PleLayer", "HyperConnection"} <= kinds
    assert len(expected) > 10 and expected <= seen, len(expected - seen)
