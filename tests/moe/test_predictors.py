"""The router predictor's norm-gain fold (moe/predictors.py): with the residual unchanged
between two MoE layers, x·(g_t / g_s) ranks the target's experts exactly as the target's own
router ranks its real input, whatever the layers' norm gains; without the fold the ranking
differs once the gains do. Equal gains store nothing (no launch on the chain); a channel the
source's gain zeroes gets 0. `moe_input_gains` reads each MoE block's norm (the zero-centred
norm's +1 included), and an engine built with prefetch hands the predictor the checkpoint's
post-attention norms."""

from __future__ import annotations

import pytest
import torch

from edgemoe.layers.norm import OffsetRMSNorm, RMSNorm
from edgemoe.moe.predictors import RouterPredictor, moe_input_gains

H, E, K, T = 64, 32, 4, 16


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    normed = torch.randn(T, H, generator=g)  # the residual after the RMS division, alike at both layers
    g_s, g_t = torch.rand(H, generator=g) * 3 + 0.05, torch.rand(H, generator=g) * 3 + 0.05
    router = torch.randn(E, H, generator=g) / H**0.5
    return normed, g_s, g_t, router


def test_the_fold_ranks_as_the_target_router_sees_its_input() -> None:
    normed, g_s, g_t, router = _inputs(1)
    like = torch.full((T, K), -1, dtype=torch.int32)
    want = torch.topk((normed * g_t) @ router.t(), K, dim=-1).indices
    folded = RouterPredictor({7: router}, K, {3: g_s, 7: g_t})
    folded.prepare([(3, 7)])
    got = folded(7, normed * g_s, like, source=3)
    assert torch.equal(torch.sort(got.long(), -1).values, torch.sort(want, -1).values)
    plain = RouterPredictor({7: router}, K)(7, normed * g_s, like, source=3)
    recall = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(plain, want, strict=True)) / want.numel()
    assert recall < 0.9  # the gains alone cost the plain prediction this much here


def test_equal_gains_and_unknown_layers_store_no_ratio() -> None:
    _, g_s, g_t, router = _inputs(2)
    predictor = RouterPredictor({1: router, 2: router, 5: router}, K, {1: g_s, 2: g_s.clone(), 5: g_t})
    predictor.prepare([(1, 2), (2, 9), (0, 5), (1, 5)])
    assert list(predictor.ratios) == [(1, 5)]


def test_a_channel_the_source_zeroes_gets_nothing() -> None:
    _, g_s, g_t, router = _inputs(3)
    g_s[5] = 0.0
    predictor = RouterPredictor({1: router}, K, {0: g_s, 1: g_t})
    predictor.prepare([(0, 1)])
    ratio = predictor.ratios[(0, 1)]
    assert ratio[5] == 0 and torch.isfinite(ratio).all()


class _Block:
    def __init__(self, norm) -> None:  # noqa: ANN001
        self.mlp_norm = norm


def test_moe_input_gains_reads_each_moe_blocks_norm() -> None:
    w = torch.linspace(-0.5, 0.5, H).bfloat16()
    blocks = [_Block(RMSNorm(w, 1e-6)), _Block(OffsetRMSNorm(w, 1e-6)), object(), _Block(RMSNorm(w, 1e-6))]
    gains = moe_input_gains(blocks, {0, 1, 2})
    assert set(gains) == {0, 1}
    assert torch.equal(gains[0], w.float()) and torch.equal(gains[1], w.float() + 1)


def test_an_engine_with_prefetch_folds_the_checkpoints_norms(make_ckpt, tmp_path) -> None:  # noqa: ANN001
    import re
    import shutil

    from safetensors.torch import load_file, save_file

    from edgemoe import LLM

    ckpt = tmp_path / "ckpt"  # a copy: the memoised checkpoint stays as other tests expect it
    shutil.copytree(make_ckpt("qwen3_moe", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                              moe_intermediate_size=32), ckpt)
    g = torch.Generator().manual_seed(0)
    norms = {}
    for path in sorted(ckpt.glob("*.safetensors")):  # its shards
        tensors = load_file(path)
        for name in tensors:  # a trained model's norms differ by layer; save_pretrained's are ones
            if name.endswith("post_attention_layernorm.weight"):
                tensors[name] = (torch.rand(tensors[name].shape, generator=g) + 0.5).to(tensors[name].dtype)
                norms[int(re.search(r"layers\.(\d+)\.", name).group(1))] = tensors[name].float()
        save_file(tensors, path, metadata={"format": "pt"})
    assert set(norms) == {0, 1, 2}
    with LLM(str(ckpt), dtype="float32", device="cpu", moe_backend="offload", moe_slots=12, expert_cache="device",
             moe_prefetch="on") as llm:
        predictor = llm.engine.runtime.executor.prefetch.predictor
        assert set(predictor.ratios) == {(0, 1), (1, 2)}
        assert torch.allclose(predictor.ratios[(0, 1)], norms[1] / norms[0])


@pytest.mark.parametrize("family", ["plain", "gpt-oss", "glm"])
def test_a_minimum_probability_names_only_the_surer_picks(family: str) -> None:
    """EDGEMOE_PREFETCH_MIN_PROB's rule: of the top-k by the router's own ranking, the picks the
    softmax of its logits (gpt-oss's logit bias in them) gives less than p are -1; the rest
    stay where they were."""
    from edgemoe.moe.predictors import RouterScores

    g = torch.Generator().manual_seed(8)
    x, w = 3 * torch.randn(T, H, generator=g), torch.randn(E, H, generator=g) / H**0.5
    bias = torch.randn(E, generator=g)
    router = {"plain": RouterScores(w), "gpt-oss": RouterScores(w, bias),
              "glm": RouterScores(w, bias, sigmoid=True)}[family]
    like = torch.full((T, K), -1, dtype=torch.int32)
    whole = RouterPredictor({0: router}, K)(0, x, like)
    p = 0.06
    surer = RouterPredictor({0: router}, K, min_prob=p)
    got = surer(0, x, like)
    logits = x @ w.t() + (bias if family == "gpt-oss" else 0)
    probs = logits.softmax(-1).gather(1, whole.long())
    assert torch.equal(got, whole.masked_fill(probs < p, -1))
    assert 0 < int((got < 0).sum()) < got.numel()  # some picks dropped, some kept: the rule is exercised
    assert surer.label == "router, probability >= 0.06" and RouterPredictor({0: router}, K).label == "router"


def test_the_minimum_probability_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemoe.moe.predictors import prefetch_min_prob

    assert prefetch_min_prob() == 0.0
    monkeypatch.setenv("EDGEMOE_PREFETCH_MIN_PROB", "0.05")
    assert prefetch_min_prob() == 0.05
    for bad in ("1", "-0.1", "x", "nan"):
        monkeypatch.setenv("EDGEMOE_PREFETCH_MIN_PROB", bad)
        with pytest.raises(ValueError, match="EDGEMOE_PREFETCH_MIN_PROB"):
            prefetch_min_prob()
