"""The seeded routing process behind `--routing synthetic` (`moe/synthetic_routing.py`
says what it is for and how it enters the engine): per MoE layer and sequence, token t
keeps each expert of t-1 with probability `keep`, takes back each expert of t-2 … t-8
(not in t-1) with probability `back` (as many as fit, in a random order), and fills the
rest of its K by popularity (Zipf over a seeded permutation) without replacement, in the
order experts first come up in independent popularity draws (the order Gumbel top-k or an
exponential race gives).

The random numbers don't depend on the history, so `RoutingProcess` draws them for a
block of tokens at once; a token then costs a dozen small array operations over all
layers (~50 µs for Qwen3-30B-A3B's 48 layers on the development VM).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgemoe.moe.routing_spec import WINDOW


@dataclass
class Params:
    zipf: float  # popularity exponent s
    keep: float  # P(an expert of token t-1 is used again at t)
    back: float  # P(an expert of tokens t-2..t-8, not t-1, is used again at t)


# A token sees each expert by its age, the tokens since its last use: 1 — used by t-1;
# 2 … WINDOW — by one of t-2 … t-8 and not since (what back may take); 0 — kept by this
# token already. _AGES: the ages told apart, 0 … WINDOW and "older" (any age from there).
_AGES = WINDOW + 2
# What a candidate entry is: _DEAD — padding, a repeated draw, or a slot of t-1 not kept;
# _KEEP — a slot of t-1 kept; _BACK — an expert back drew; _FRESH — one the popularity
# draws drew; _FRESH_BACK — one both drew (back's entry decides for the experts back may
# take: taken, or the layer had no room left, so the popularity entry must not count them).
_DEAD, _KEEP, _BACK, _FRESH, _FRESH_BACK = range(5)


def _eligible(span: int) -> np.ndarray:
    """[kind · span + age] bool, for ages 0 … span-1: whether a candidate entry may be taken."""
    age = np.arange(span)
    earlier = (age >= 2) & (age <= WINDOW)  # what back may take
    table = np.zeros((5, span), dtype=bool)
    table[_KEEP] = True
    table[_BACK] = earlier
    table[_FRESH] = age != 0  # not kept already
    table[_FRESH_BACK] = (age != 0) & ~earlier
    return table.ravel()


class Stream:
    """One sequence's history over all MoE layers, flat over (layer, expert) = layer·E +
    expert: the position of each expert's last use (all the process reads: t-1's set is
    the age-1 experts, back's the age 2 … 8 ones) and t-1's experts; and the sequence's
    own random numbers (`RoutingProcess.stream` seeds them), so its ids depend on nothing
    but the seed and its place among the sequences: not on the steps it shares, or on
    draws another sequence takes (an extra step that overlap scheduling computes for a
    request that has just finished draws from that request's numbers alone)."""

    def __init__(self, layers: int, experts: int, entropy: int | list[int]) -> None:
        # never used: older than the window; one slot more, for padding candidates to point at
        self.used = np.full(layers * experts + 1, -_AGES, dtype=np.int32)
        self.pos = 0  # tokens so far
        self.last: np.ndarray | None = None  # t-1's experts, flat [layers, K]
        # independent streams of random numbers, each drawn a row at a time in token order,
        # so the ids don't depend on how the sequence's tokens are split into calls or blocks
        self.keep_rng, self.count_rng, self.back_rng, self.popular_rng, self.tail_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(entropy).spawn(5))
        self.plan: _Plan | None = None  # the block of drawn-ahead numbers being handed out

    def push(self, ids: np.ndarray, at: np.ndarray | int) -> None:
        """A token's experts, flat [layers, K]; at: the position of their use — or, for the
        experts the next token keeps, the next position (`RoutingProcess._begin`)."""
        self.used[ids.reshape(-1)] = at
        self.pos += 1
        self.last = ids


class _Alias:
    """Walker's alias table over a fixed distribution: O(1) a draw (a binary search over
    the cumulative distribution costs several times more here)."""

    def __init__(self, weight: np.ndarray) -> None:
        n = len(weight)
        scaled = weight * (n / weight.sum())
        self.cut, self.other = np.ones(n), np.arange(n)
        small = [i for i in range(n) if scaled[i] < 1]
        large = [i for i in range(n) if scaled[i] >= 1]
        while small and large:  # what is left over (rounding) keeps cut 1: always itself
            s, big = small.pop(), large.pop()
            self.cut[s], self.other[s] = scaled[s], big
            scaled[big] -= 1 - scaled[s]
            (small if scaled[big] < 1 else large).append(big)

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        n = len(self.cut)
        x = rng.random(shape)
        x *= n
        column = x.astype(np.intp)
        if n & (n - 1):  # x may round up to n (not for a power of two: exact)
            np.minimum(column, n - 1, out=column)
        x -= column
        return np.where(x < self.cut.take(column), column, self.other.take(column))


def _poisson_cdf(rate: float) -> np.ndarray:
    """Poisson(rate)'s cumulative distribution, for inverse-transform draws (twice as fast
    as Generator.poisson here, and monotone in the rate: calibration's common random
    numbers stay common). Up to 12 standard deviations past the mean, then 1."""
    if rate == 0:
        return np.ones(1)
    k = np.arange(int(rate + 12 * np.sqrt(rate) + 30))
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(k[1:]))])
    cdf = np.cumsum(np.exp(k * np.log(rate) - rate - log_factorial))
    cdf[-1] = 1.0
    return cdf


def _first_seen(draws: np.ndarray) -> np.ndarray:
    """[R, M] bool: draw j of row r is the first of its value in that row (values < 2^16).
    Each draw against the earlier ones, a column at a time over all R rows: O(M²), but the
    fewest operations for the dozen draws a row takes."""
    columns = np.ascontiguousarray(draws.T, dtype=np.uint8 if draws.max(initial=0) < 256 else np.uint16)
    first = np.ones(columns.shape, dtype=bool)
    for j in range(1, len(columns)):
        np.logical_and.reduce(columns[:j] != columns[j], axis=0, out=first[j])
    return first.T


def _draw_count(weight: np.ndarray, k: int) -> int:
    """How many popularity draws each (token, layer) takes: the fewest whose expected
    number of distinct experts reaches K + 2, so that few fall short of K (those finish
    with an exponential race); at least K, at most 4K — or none where popularity is so
    steep that 4K draws fall short (then the race does all)."""
    p = weight / weight.sum()
    return next((m for m in range(k, 4 * k + 1) if (1 - (1 - p) ** m).sum() >= k + 2), 0)


@dataclass
class _Plan:
    """A block of tokens' random choices, drawn together (all but what the history decides),
    handed out a token at a time in the order the tokens are asked for. keep [n, layers·K]:
    which of t-1's experts to keep, by position; candidates [n, layers, C]: flat expert
    indices — K columns for t-1's experts, back's draws, the popularity draws; base [n,
    layers, C]: kind · span, plus the token's position once handed out, so that base -
    used[candidate] indexes the eligibility table (`_eligible`); starts [layers]: each
    layer's first entry in a token's flattened candidates; handed: the tokens handed out."""

    keep: np.ndarray
    candidates: np.ndarray
    base: np.ndarray
    starts: np.ndarray
    handed: int = 0


class RoutingProcess:
    """The process for `layers` MoE layers of `experts` experts, K per token.

    Each token takes, per layer, its first K eligible candidates: t-1's kept experts, then
    the experts back drew in their (random) order, then the popularity draws in theirs;
    eligibility depends only on an entry's kind and the expert's age (`_eligible`). So the
    random numbers for a block of tokens are drawn ahead in a few array operations
    (`_plan`), and a token costs a dozen small ones (`_step`)."""

    BLOCK = 64  # tokens whose random numbers are drawn together

    def __init__(self, layers: int, experts: int, top_k: int, params: Params, seed: int) -> None:
        self.layers, self.experts, self.top_k, self.params, self.seed = layers, experts, top_k, params, seed
        by_rank = np.argsort(np.random.default_rng([seed, 1]).random((layers, experts)), axis=1)  # [layer, rank-1]: expert
        self.layer_base = np.arange(layers, dtype=np.int32) * experts
        self.by_rank = (by_rank + self.layer_base[:, None]).ravel()  # [layer·E + rank-1]: layer·E + expert
        self.block_base = np.tile(self.layer_base, self.BLOCK)[:, None]  # a block's rows' layer·E
        self.weight = np.arange(1, experts + 1, dtype=np.float64) ** -params.zipf  # by rank, unnormalised
        self.alias = _Alias(self.weight)
        self.draws = _draw_count(self.weight, top_k)
        # back's draws: a Poisson number of uniform draws hits each expert independently with
        # probability 1 - exp(-rate / E) = back (capped below 1: the rate would be infinite)
        self.back_counts = _poisson_cdf(-experts * np.log1p(-min(params.back, 1 - 2**-20)))
        self.span = self.BLOCK + _AGES  # the ages a block sees (`_begin` clamps them at its start)
        self.eligible = _eligible(self.span)
        self.first_k = np.arange(top_k)

    def stream(self, ordinal: int = 0) -> Stream:
        """A fresh sequence, the `ordinal`-th of a run: its random numbers from the seed and
        the ordinal (the first's from the seed alone: one sequence draws as it always has)."""
        return Stream(self.layers, self.experts, self.seed if ordinal == 0 else [self.seed, ordinal])

    def tokens(self, stream: Stream, n: int) -> np.ndarray:
        """The next n tokens' experts: [n, layers, K] int64 (a layer's: kept, taken back,
        then by popularity)."""
        out = np.empty((n, self.layers, self.top_k), dtype=np.int64)
        done = 0
        while done < n:
            if stream.plan is None or stream.plan.handed == len(stream.plan.keep):
                stream.plan = self._plan(stream, self.BLOCK)
            plan = stream.plan
            rows = slice(plan.handed, min(plan.handed + n - done, len(plan.keep)))
            plan.handed = rows.stop
            push = self._begin(plan, rows, stream)
            for i, row in enumerate(range(rows.start, rows.stop)):
                out[done + i] = self._step(stream, plan.candidates[row], plan.base[row], plan.starts, push[i])
            done += len(push)
        out -= self.layer_base[:, None]  # flat indices → expert ids
        return out

    def _begin(self, plan: _Plan, rows: slice, stream: Stream) -> np.ndarray:
        """Fit a plan's rows to the stream that takes them: ages by position, t-1's kept
        experts used now. Returns what each token's push writes [n, layers·K]: its position,
        or the next one's for the experts the next token keeps (their marking for free)."""
        k = self.top_k
        np.maximum(stream.used, stream.pos - _AGES + 1, out=stream.used)  # ages within the span
        at = stream.pos + np.arange(rows.stop - rows.start, dtype=np.int32)[:, None]
        plan.base[rows] += at[:, :, None]
        if stream.last is None:  # a sequence's first token: nothing to keep
            plan.candidates[rows.start, :, :k] = self.layer_base[:, None]
            plan.base[rows.start, :, :k] = stream.pos  # _DEAD
        else:
            stream.used[stream.last.reshape(-1)[plan.keep[rows.start]]] = stream.pos
        push = np.repeat(at, self.layers * k, axis=1)
        push[:-1] += plan.keep[rows.start + 1 : rows.stop]
        return push

    def _step(self, stream: Stream, candidates: np.ndarray, base: np.ndarray, starts: np.ndarray,
              push: np.ndarray) -> np.ndarray:
        """One token's experts, flat [layers, K]: each layer's first K eligible candidates."""
        if stream.last is not None:
            candidates[:, : self.top_k] = stream.last
        eligible = np.flatnonzero(self.eligible.take(base - stream.used.take(candidates)))
        # every layer has K eligible (the popularity draws alone hold K): its first is the
        # first at or after its row's start
        first = np.searchsorted(eligible, starts)
        ids = candidates.reshape(-1).take(eligible.take(first[:, None] + self.first_k))
        stream.push(ids, push)
        return ids

    def _plan(self, stream: Stream, count: int) -> _Plan:
        """The next count tokens' random choices (see `_Plan`)."""
        L, E, K, span = self.layers, self.experts, self.top_k, self.span
        rows = count * L  # (token, layer), token-major
        layer_base = self.block_base[:rows]
        keep = stream.keep_rng.random((count, L * K)) < self.params.keep
        back, back_alive, back_first = self._back(stream, rows)
        fresh, fresh_alive = self._fresh(stream, rows, layer_base)
        split = K + back.shape[1]
        base = np.empty((rows, split + fresh.shape[1]), dtype=np.int32)  # kind · span, for now
        np.multiply(keep.reshape(rows, K), _KEEP * span, out=base[:, :K])
        np.multiply(back_alive, _BACK * span, out=base[:, K:split])
        # the popularity draws that back drew too (by its first draw of each expert)
        drawn_back = back_first.take(fresh - layer_base + np.arange(0, rows * (E + 1), E + 1)[:, None]) < back.shape[1]
        np.multiply(drawn_back, (_FRESH_BACK - _FRESH) * span, out=base[:, split:])
        base[:, split:] += _FRESH * span
        base[:, split:] *= fresh_alive
        candidates = np.empty(base.shape, dtype=np.int32)
        np.add(back, layer_base, out=candidates[:, K:split])  # padding (E): layer·E + E, a slot of `used`
        candidates[:, split:] = fresh
        starts = np.arange(0, L * base.shape[1], base.shape[1])
        return _Plan(keep, candidates.reshape(count, L, -1), base.reshape(count, L, -1), starts)

    def _back(self, stream: Stream, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The experts back may take, per row in a uniformly random order [rows, W] (padding:
        E), which entries count [rows, W], and where each row first drew each expert
        [rows·(E+1)] (W: not drawn). The distinct experts of a Poisson number of uniform
        draws, in the order first drawn: each expert independently with probability back,
        in an order that treats all experts alike, hence uniform."""
        E = self.experts
        counts = np.searchsorted(self.back_counts, stream.count_rng.random(rows), side="right")
        width = counts.max(initial=0)
        draws = np.full((rows, width), E, dtype=np.int32)
        draws[np.arange(width) < counts[:, None]] = (stream.back_rng.random(counts.sum()) * E).astype(np.int32)  # uniform (to 2^-53)
        at = (draws + np.arange(0, rows * (E + 1), E + 1, dtype=np.int32)[:, None]).reshape(-1)
        position = np.tile(np.arange(width, dtype=np.int16 if width < 2**15 else np.int32), rows)
        first = np.full(rows * (E + 1), width, dtype=position.dtype)
        np.minimum.at(first, at, position)  # a minimum: the same in whatever order it runs
        first[E :: E + 1] = width  # padding: never drawn
        return draws, (first.take(at) == position).reshape(rows, width), first

    def _fresh(self, stream: Stream, rows: int, layer_base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The experts by popularity without replacement, per row as flat indices [rows, M],
        and which entries count [rows, M]: the order in which experts first come up in
        independent popularity draws (the order an exponential race, or Gumbel top-k,
        gives); at least K count in every row. layer_base [rows, 1]: each row's layer·E."""
        k = self.top_k
        if self.draws:
            ranks = self.alias.sample(stream.popular_rng, (rows, self.draws))
            first = _first_seen(ranks)
            short = np.flatnonzero(first.sum(axis=1) < k)
            if len(short):
                ranks[short, :k] = self._finish(stream, ranks[short], first[short])
                first[short] = np.arange(self.draws) < k
        else:
            ranks = self._finish(stream, np.zeros((rows, 0), dtype=np.intp), np.zeros((rows, 0), dtype=bool))
            first = np.ones(ranks.shape, dtype=bool)
        ranks += layer_base
        return self.by_rank.take(ranks), first

    def _finish(self, stream: Stream, ranks: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Rows whose draws came up with fewer than K distinct experts [n, K]: those, then
        the rest from an exponential race over the experts not drawn yet (what more draws
        would give: the next new expert is a popularity draw among the others)."""
        n, k = len(ranks), self.top_k
        keys = stream.tail_rng.standard_exponential((n, self.experts)) / self.weight
        keys[np.arange(n)[:, None], ranks] = np.inf
        both = np.concatenate([ranks, np.argsort(keys, axis=1)[:, :k]], axis=1)
        valid = np.concatenate([first, np.ones((n, k), dtype=bool)], axis=1)
        return both[valid & (valid.cumsum(axis=1) <= k)].reshape(n, k)
