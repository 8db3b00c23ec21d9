"""A prefetch predictor of chosen recall under `--routing synthetic:recall=R` (R < 1).

Synthetic routing's own predictor is an oracle: decode prefetch copies exactly what each
layer will route to. A trained model's predictor (the next layer's router on this layer's
input) misses some experts and names others instead, and what prefetch saves depends on
how many: the misses it missed are copied by their layer as without prefetch, the experts it
named wrongly are copies nobody uses. `predict` makes that guess from the step's drawn ids:
each routed expert is kept with probability R, and each one dropped is replaced by an expert
the row does not route to, drawn by the layer's popularity (the process's Zipf), so a wrong
guess is a plausible expert, as a trained router's runner-up is, and is often one the cache
holds already. The predicted set has K experts, like the router's top-k, so its recall and
precision against the routed set are both R in expectation (the engine's measured precision
counts only the experts it copied, so it reads higher). `precision=P` (≥ R) makes a smaller
guess instead, a confident predictor's subset: of the dropped experts only the share
`wrong_share(R, P)` is replaced, the rest are left out (-1, nothing to copy), so the guess
has R·K right experts and precision P.

One draw per step and layer serves every depth: a trained router's guess three layers
ahead is weaker than one layer ahead, which `EDGEMOE_PREFETCH_DEPTH=1` isolates.
"""

from __future__ import annotations

import numpy as np

from edgemoe.moe.synthetic_process import RoutingProcess

ROUNDS = 64  # popularity draws for the replacements before the rest are filled in order


def predict(ids: np.ndarray, recall: float, process: RoutingProcess, rng: np.random.Generator,
            precision: float | None = None) -> np.ndarray:
    """[layers, n, K] routed ids → [layers, n, K] predicted ids: each kept with probability
    `recall`, the others replaced by distinct experts the row does not route to — or, with
    `precision` (≥ recall), each replaced with the probability that gives the guess that
    precision and the rest -1 (no expert: a smaller guess, a confident predictor's subset)."""
    out = ids.copy()
    dropped = rng.random(ids.shape) >= recall
    if precision is not None and precision > recall:
        named = rng.random(ids.shape) < wrong_share(recall, precision)
        out[dropped & ~named] = -1
        dropped &= named
    wrong = np.argwhere(dropped)  # [m, 3]: layer, row, k
    if len(wrong) == 0:
        return out
    L, n, _ = ids.shape
    taken = np.zeros((L, n, process.experts), dtype=bool)  # what a row routes to or already names
    np.put_along_axis(taken, ids, True, axis=2)
    for _ in range(ROUNDS):
        wrong = _replace_by_popularity(out, taken, wrong, process, rng)
        if len(wrong) == 0:
            return out
    _replace_in_order(out, taken, wrong)
    return out


def wrong_share(recall: float, precision: float) -> float:
    """The share of the dropped experts replaced by a wrong one for a guess of `precision`:
    per row recall·K right and (1 − recall)·K·q wrong, so precision = recall / (recall +
    (1 − recall)·q). Needs precision ≥ recall (q ≤ 1: the guess holds at most K)."""
    if recall >= 1 or precision >= 1:
        return 0.0
    return recall * (1 - precision) / (precision * (1 - recall))


def _replace_by_popularity(out: np.ndarray, taken: np.ndarray, wrong: np.ndarray, process: RoutingProcess,
                           rng: np.random.Generator) -> np.ndarray:
    """One popularity draw for each entry still to replace; an expert the row holds, or one
    drawn twice for the same row this round, waits for the next round. Returns the rest."""
    layer, row, k = wrong.T
    base = layer * process.experts
    experts = process.by_rank[base + process.alias.sample(rng, (len(wrong),))] - base
    free = ~taken[layer, row, experts]
    key = (layer * out.shape[1] + row) * process.experts + experts
    first = np.zeros(len(wrong), dtype=bool)
    first[np.unique(np.where(free, key, -1), return_index=True)[1]] = True  # a row's first of each expert
    accept = free & first
    out[layer[accept], row[accept], k[accept]] = experts[accept]
    taken[layer[accept], row[accept], experts[accept]] = True
    return wrong[~accept]


def _replace_in_order(out: np.ndarray, taken: np.ndarray, wrong: np.ndarray) -> None:
    """The lowest-numbered experts a row does not hold: only when K is near the expert
    count, where popularity draws keep landing on the row's own. A row with none left
    (fewer than 2K experts) keeps its routed expert: no wrong guess is possible there."""
    for layer, row, k in wrong:
        free = np.flatnonzero(~taken[layer, row])
        if len(free):
            out[layer, row, k] = free[0]
            taken[layer, row, free[0]] = True
