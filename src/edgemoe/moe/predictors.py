"""What decode prefetch copies (`moe/prefetch.py`): a predictor ranks a later MoE layer's
experts from an earlier layer's MoE input.

- `RouterPredictor`: the target layer's own router on that input, the input first scaled by
  the two layers' norm gains (`moe_input_gains`: what differs between the layers' inputs when
  the residual doesn't). The usual approximation; on random weights its recall says nothing
  about a trained model's. `EDGEMOE_PREFETCH_MIN_PROB=p` keeps only the experts it gives
  probability ≥ p (`prefetch_min_prob`): a smaller, surer guess.
- `StagedPredictor`: under `--routing synthetic`, the target layer's drawn ids: an oracle
  (recall 1), labelled so, which shows what the mechanism saves at perfect prediction; or,
  with `synthetic:recall=R`, a guess of recall R drawn from them, which shows what it saves
  at a trained predictor's recall.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Protocol

import torch

from edgemoe.kernels.router import fused_router_workspace, route_logits_topk


class Predictor(Protocol):
    label: str

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor, source: int | None = None) -> torch.Tensor:
        """[T, K] int32 ids predicted for MoE `layer` from x [T, H], MoE layer `source`'s input
        (an earlier layer's); `like`: a [T, K] int32 tensor of -1 (the shape; padding rows' ids)."""
        ...

    def prepare(self, pairs: list[tuple[int, int]]) -> None:
        """Before any graph captures a prediction: the (source, target) pairs it will make."""
        ...


class RouterScores(NamedTuple):
    """How a layer's router ranks its experts, for prediction: the logits x·Wᵀ (a softmax
    router's top-k is theirs), plus gpt-oss's logit `bias`; or, `sigmoid`, GLM's scores
    sigmoid(x·Wᵀ) plus its selection bias (its expert groups left out: one in GLM-4.5); or,
    `softmax`, ERNIE's softmax(x·Wᵀ) plus its selection bias (a bias on probabilities
    reorders what the logits alone would pick)."""

    weight: torch.Tensor  # [E, H]
    bias: torch.Tensor | None = None  # [E]
    sigmoid: bool = False
    softmax: bool = False

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x.to(self.weight.dtype), self.weight.t()).float()

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """[T, E] the ranking of `logits` (x·Wᵀ, fp32) this router selects by."""
        s = logits.sigmoid() if self.sigmoid else logits.softmax(-1) if self.softmax else logits
        return s if self.bias is None else s + self.bias.float()

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[T, E] the softmax of `logits` (gpt-oss's logit bias in them): a softmax router's own
        probabilities, and for the others a confidence ranked as their logits are."""
        biased = self.bias is not None and not (self.sigmoid or self.softmax)
        return (logits + self.bias.float() if biased else logits).softmax(-1)


def prefetch_min_prob() -> float:
    """EDGEMOE_PREFETCH_MIN_PROB=p (0 ≤ p < 1; default 0: the whole top-k): the router predictor
    names only the experts of its top-k it gives probability ≥ p (the softmax of the target
    router's logits), the rest -1 (nothing to copy). Prefetch's gain is decided by the precision
    of what it copies, not its recall: a miss the guess leaves out is copied by its own layer as
    without prefetch, a wrong copy is link time for nothing (docs/benchmarks.md, "decode
    prefetch below the oracle"; `--routing synthetic:recall=R,precision=P` measures the same
    trade on synthetic routing). Unmeasured on a trained router: no default but 0."""
    raw = os.environ.get("EDGEMOE_PREFETCH_MIN_PROB", "")
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise ValueError(f"EDGEMOE_PREFETCH_MIN_PROB={raw!r}: a probability, 0 <= p < 1")
    return value


class RouterPredictor:
    """The next layer's router on x: its experts' top-k by `RouterScores` (a plain weight
    [E, H]: the logits'). Where the ranking is the logits' (plus a logit bias: gpt-oss) and
    the fused router runs (CUDA, bf16/fp16), one `_route_fused` launch on a workspace of the
    predictor's own — the torch form's projection, cast, top-k and cast are four launches on
    the decode chain a layer; a softmax's top-k is its logits'.

    `gains` {layer: [H]}: each MoE layer's input norm's effective weight (`moe_input_gains`).
    x is layer s's normed residual scaled by s's gain, while layer t's router sees its own
    residual scaled by t's; with the residual alike across the layers between (the premise of
    predicting at all), x·(g_t / g_s) is what t's router sees up to a positive factor, which
    no top-k of logits or softmax changes. So each pair whose gains differ (a trained model's
    do: they vary by layer and channel) multiplies x by that ratio first (one launch); a
    channel s's gain zeroes carries nothing and gets 0. Equal gains (random presets, all
    ones) cost nothing."""

    label = "router"

    def __init__(self, routers: dict[int, RouterScores | torch.Tensor], top_k: int,
                 gains: dict[int, torch.Tensor] | None = None, min_prob: float = 0.0) -> None:
        # A plain weight is the logits' ranking: wrapped once here, not per prediction.
        self.routers = {layer: r if isinstance(r, RouterScores) else RouterScores(r) for layer, r in routers.items()}
        self.top_k, self.gains, self.min_prob = top_k, gains or {}, min_prob
        if min_prob > 0:
            self.label = f"router, probability >= {min_prob:g}"
        first = next(iter(self.routers.values()), None)  # NOTE: allocated now, never inside a graph's capture
        self.workspace = None if first is None else fused_router_workspace(first.weight, top_k)
        self.ratios: dict[tuple[int, int], torch.Tensor] = {}  # (source, target): t's gain over s's

    def prepare(self, pairs: list[tuple[int, int]]) -> None:
        for source, target in pairs:
            g_s, g_t = self.gains.get(source), self.gains.get(target)
            if g_s is None or g_t is None or torch.equal(g_s, g_t):
                continue
            g_s, g_t = g_s.float(), g_t.float()
            ratio = torch.where(g_s.abs() > torch.finfo(torch.float32).tiny, g_t / g_s, torch.zeros_like(g_t))
            self.ratios[(source, target)] = ratio.to(self.routers[target].weight.dtype)  # one launch: x's dtype

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor, source: int | None = None) -> torch.Tensor:
        ratio = self.ratios.get((source, layer)) if source is not None else None
        router = self.routers[layer]
        w = router.weight
        if ratio is not None:
            x = x.to(w.dtype) * ratio
        if self.workspace is not None and not (router.sigmoid or router.softmax):
            bias = None if router.bias is None else router.bias.to(w.dtype)
            ids, probs = route_logits_topk(x.to(w.dtype), w, self.top_k, False, w.dtype, self.workspace, bias=bias)
            return self._surest(ids, probs)  # not renormalised: each pick's softmax probability
        logits = router.logits(x)
        ids = torch.topk(router.scores(logits), self.top_k, dim=-1).indices
        return self._surest(ids.to(torch.int32), router.probs(logits).gather(1, ids) if self.min_prob > 0 else None)

    def _surest(self, ids: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
        """`ids` with the picks below `min_prob` named -1 (no launch when it is 0)."""
        if self.min_prob <= 0 or probs is None:
            return ids
        return ids.masked_fill(probs < self.min_prob, -1)


def moe_input_gains(blocks: list, layers: set[int]) -> dict[int, torch.Tensor]:  # noqa: ANN001 - model blocks
    """{layer: [H] fp32}: the effective weight of the norm in front of each MoE layer in
    `layers` (RMSNorm's weight, plus 1 for the zero-centred norm of Qwen3-Next / Qwen3.5),
    from blocks that have one (`mlp_norm`); others are left out (their pairs unscaled)."""
    gains = {}
    for i, block in enumerate(blocks):
        norm = getattr(block, "mlp_norm", None)
        weight = getattr(norm, "weight", None)
        if i in layers and isinstance(weight, torch.Tensor) and weight.dim() == 1:
            gains[i] = weight.float() + float(getattr(norm, "weight_offset", 0.0))
    return gains


class StagedPredictor:
    """Synthetic routing's drawn ids for the layer: an oracle (the step's draws are staged
    before its forward); with `--routing synthetic:recall=R` (R < 1), a guess of that recall
    drawn from them (`moe/noisy_prediction.py`; `precision=P`: a smaller guess of that
    precision), labelled with them."""

    def __init__(self, routing) -> None:  # noqa: ANN001 - moe/synthetic_routing.SyntheticRouting
        self.routing = routing
        recall, precision = routing.spec.recall, routing.spec.precision
        self.label = "synthetic oracle" if recall >= 1 else f"synthetic guess, recall {recall:g}" + (
            f", precision {precision:g}" if precision is not None else "")

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor, source: int | None = None) -> torch.Tensor:
        return self.routing.predicted_ids(layer, like).to(torch.int32)  # padding rows: like's -1

    def prepare(self, pairs: list[tuple[int, int]]) -> None:
        pass
