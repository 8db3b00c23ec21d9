"""Batched sampling for one engine step: logits [B, V] -> one token per row.

Order (HF's, and vLLM's up to v0, with OpenAI's logit_bias first): logit_bias ->
structured outputs' masks -> min_tokens mask -> repetition penalty -> frequency/presence penalties -> greedy rows take
the argmax -> temperature -> top-k -> top-p -> min-p -> draw. Logprobs describe the raw
model distribution (before all that).

The draw is an exponential race, argmax(p / E) = argmax(logit - log E) with E ~ Exp(1)
i.i.d., which picks token i with probability p_i and needs no softmax. Every request
has a seed (its own, or one the engine draws for it from its seeded generator), and E
for its n-th draw is a counter-based hash of (seed, n, token id) computed on the
device: its tokens depend only on its seed and its own logits, not on which other
requests share the batch, where its row is, or whether it was preempted — and no
generator object has to be stepped from the host.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from edgemoe.messages import SamplingParams

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS): dividing by them overflows.
GREEDY_BELOW = 1e-5
NEG_INF = float("-inf")
SEED_MASK = (1 << 63) - 1  # seeds are kept as non-negative int64 on the device


def request_seed(params: SamplingParams, rng: random.Random) -> int:
    """The request's own seed, or a fresh one from the engine's seeded generator."""
    return (params.seed if params.seed is not None else rng.getrandbits(63)) & SEED_MASK


@dataclass(eq=False)
class SamplingState:
    """One request's sampling inputs (the host-side form; the engine keeps the same in
    device rows, engine/sampling.py).

    `eos_ids` are masked, with `stop_token_ids`, while fewer than `min_tokens` were
    generated. The engine decides what goes in it (vLLM leaves EOS out for
    `ignore_eos` requests); the sampler never reads `ignore_eos`, nor stops anything.
    `seed` drives the request's draws (`request_seed`); the n-th draw uses counter n =
    the number of tokens generated so far.
    """

    params: SamplingParams
    prompt_ids: Sequence[int] = ()
    eos_ids: frozenset[int] = frozenset()
    device: torch.device | str = "cpu"
    output_ids: list[int] = field(default_factory=list)
    seed: int = 0
    _prompt_tensor: Tensor | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self.seed = self.params.seed & SEED_MASK

    @property
    def num_generated(self) -> int:
        return len(self.output_ids)

    def append(self, token_id: int) -> None:
        """Record a generated token (the penalties and min_tokens read these)."""
        self.output_ids.append(token_id)

    def banned_ids(self) -> list[int]:
        """Ids masked this step to honour `min_tokens`."""
        if self.num_generated >= self.params.min_tokens:
            return []
        return sorted(self.eos_ids.union(self.params.stop_token_ids))

    def prompt_tensor(self) -> Tensor:
        """The prompt ids on `device`, built once (prompts can be long)."""
        if self._prompt_tensor is None:
            self._prompt_tensor = _as_ids(self.prompt_ids, torch.device(self.device))
        return self._prompt_tensor


def _is_greedy(p: SamplingParams) -> bool:
    return p.temperature < GREEDY_BELOW


def _flat_ids(rows: Sequence[tuple[int, Tensor]], vocab_size: int, device: torch.device) -> Tensor:
    """Token ids of several rows as indices into a flattened [B * V] tensor."""
    parts = [ids.to(device) + row * vocab_size for row, ids in rows if ids.numel()]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long, device=device)


def _as_ids(ids: Sequence[int], device: torch.device) -> Tensor:
    return torch.tensor(list(ids), dtype=torch.long, device=device)


class Banned(NamedTuple):
    rows: Tensor  # [N] long
    ids: Tensor  # [N] long: logits[rows[j], ids[j]] = -inf


class LogitBias(NamedTuple):
    """Each row's bias as padded (id, value) pairs: logits[b, ids[b, j]] += values[b, j].
    NOTE: padding is (some id in the vocabulary, 0.0) and a row's real ids are distinct, so
    the scatter-add is exact in any order (adding 0.0 changes nothing)."""

    ids: Tensor  # [B, K] long
    values: Tensor  # [B, K] f32


@dataclass(frozen=True)
class SamplingBatch:
    """The tensors one step needs; a field is None when no row uses that feature."""

    vocab_size: int
    temperature: Tensor  # [B] f32, 1.0 on greedy rows
    greedy: Tensor  # [B] bool
    greedy_rows: tuple[bool, ...]  # the same on the host (no device sync to read it)
    all_greedy: bool
    top_k: Tensor | None  # [B] long, vocab_size where off
    max_top_k: int  # the largest top_k in use (host copy)
    top_p: Tensor | None  # [B] f32, 1.0 where off
    min_p: Tensor | None  # [B] f32, 0.0 where off
    repetition: Tensor | None  # [B] f32
    seen: Tensor | None  # [B, V] bool: in prompt or output (repetition penalty)
    frequency: Tensor | None  # [B] f32
    presence: Tensor | None  # [B] f32
    output_counts: Tensor | None  # [B, V] f32: occurrences in the output so far
    banned: Banned | None  # min_tokens mask
    logit_bias: LogitBias | None  # None: no row has a bias
    seeds: Tensor  # [B] int64, every row's seed
    counters: Tensor  # [B] int64, every row's draw number (tokens generated so far)
    num_logprobs: int | None  # the largest `logprobs` asked for; None: nobody asked
    allowed: Tensor | None = None  # [B, V] bool: structured outputs' masks (True: allowed); None: none

    @classmethod
    def build(
        cls, states: Sequence[SamplingState], vocab_size: int, device: torch.device | str
    ) -> SamplingBatch:
        device = torch.device(device)
        params = [s.params for s in states]
        greedy = [_is_greedy(p) for p in params]
        V = vocab_size
        top_k = [p.top_k if 0 < p.top_k < V else V for p in params]
        rep = [p.repetition_penalty for p in params]
        freq = [p.frequency_penalty for p in params]
        pres = [p.presence_penalty for p in params]
        # One host->device copy for all per-row floats.
        floats = torch.tensor(
            [
                [1.0 if g else p.temperature for g, p in zip(greedy, params)],
                [p.top_p for p in params],
                [p.min_p for p in params],
                rep,
                freq,
                pres,
            ],
            dtype=torch.float32,
        ).to(device)
        temperature, top_p, min_p, repetition, frequency, presence = floats.unbind(0)
        use_rep = [r != 1.0 for r in rep]
        use_freq = [f != 0.0 or q != 0.0 for f, q in zip(freq, pres)]
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            vocab_size=V,
            temperature=temperature,
            greedy=torch.tensor(greedy, dtype=torch.bool).to(device),
            greedy_rows=tuple(greedy),
            all_greedy=all(greedy),
            top_k=_as_ids(top_k, device) if any(k < V for k in top_k) else None,
            max_top_k=max((k for k in top_k if k < V), default=V),
            top_p=top_p if any(p.top_p < 1.0 for p in params) else None,
            min_p=min_p if any(p.min_p > 0.0 for p in params) else None,
            repetition=repetition if any(use_rep) else None,
            seen=_seen_mask(states, use_rep, V, device) if any(use_rep) else None,
            frequency=frequency if any(use_freq) else None,
            presence=presence if any(use_freq) else None,
            output_counts=_output_counts(states, use_freq, V, device) if any(use_freq) else None,
            banned=_banned(states, V, device),
            logit_bias=_logit_bias(params, device),
            seeds=_as_ids([s.seed for s in states], device),
            counters=_as_ids([s.num_generated for s in states], device),
            num_logprobs=max(logprobs) if logprobs else None,
        )


def _seen_mask(
    states: Sequence[SamplingState], use: Sequence[bool], V: int, device: torch.device
) -> Tensor:
    """[B, V] bool: token appears in the row's prompt or output (rows in `use` only)."""
    rows = [(i, s.prompt_tensor()) for i, s in enumerate(states) if use[i]]
    rows += [(i, _as_ids(s.output_ids, device)) for i, s in enumerate(states) if use[i]]
    seen = torch.zeros(len(states) * V, dtype=torch.bool, device=device)
    seen[_flat_ids(rows, V, device)] = True
    return seen.view(len(states), V)


def _output_counts(
    states: Sequence[SamplingState], use: Sequence[bool], V: int, device: torch.device
) -> Tensor:
    """[B, V] f32: how often each token occurs in the row's output (rows in `use` only)."""
    rows = [(i, _as_ids(s.output_ids, device)) for i, s in enumerate(states) if use[i]]
    idx = _flat_ids(rows, V, device)
    counts = torch.zeros(len(states) * V, dtype=torch.float32, device=device)
    counts.scatter_add_(0, idx, torch.ones(idx.shape, dtype=torch.float32, device=device))
    return counts.view(len(states), V)


def _banned(states: Sequence[SamplingState], V: int, device: torch.device) -> Banned | None:
    pairs = [(i, t) for i, s in enumerate(states) for t in s.banned_ids() if 0 <= t < V]
    if not pairs:
        return None
    rows, ids = zip(*pairs)
    return Banned(_as_ids(rows, device), _as_ids(ids, device))


def _logit_bias(params: Sequence[SamplingParams], device: torch.device) -> LogitBias | None:
    width = max((len(p.logit_bias or ()) for p in params), default=0)
    if not width:
        return None
    ids = torch.zeros((len(params), width), dtype=torch.long)
    values = torch.zeros((len(params), width), dtype=torch.float32)
    for row, p in enumerate(params):
        bias = p.logit_bias
        if not bias:
            continue
        ids[row, : len(bias)] = torch.tensor(list(bias), dtype=torch.long)
        values[row, : len(bias)] = torch.tensor(list(bias.values()), dtype=torch.float32)
    return LogitBias(ids.to(device), values.to(device))


class TopLogprobs(NamedTuple):
    ids: Tensor  # [B, N] long, most likely first
    values: Tensor  # [B, N] f32


class SampleOutput(NamedTuple):
    token_ids: Tensor  # [B] long
    logprobs: Tensor | None  # [B] f32, the sampled token's raw logprob; None: nobody asked
    top_logprobs: TopLogprobs | None  # N = the largest `logprobs` in the batch; rows
    # that asked for fewer use their first entries, rows that asked for none ignore it


def sample(logits: Tensor, batch: SamplingBatch) -> SampleOutput:
    """Pick one token per row.

    Never NaN: every filter keeps each row's best token, and a row left with no finite
    logit at all (which a sane model never produces, or min_tokens banning the EOS that
    is all a structured output's mask allows) falls back to the argmax of its raw logits
    among the mask's tokens, i.e. token 0 when every raw logit is -inf.
    """
    raw = logits.float()  # [B, V]
    x = apply_penalties(raw.clone(), batch)
    tokens = x.argmax(-1)
    if not batch.all_greedy:
        sampled = _draw(apply_filters(x, batch), batch)
        tokens = torch.where(batch.greedy, tokens, sampled)
    dead = x.amax(-1) == NEG_INF
    # A structured output's mask holds even then (min_tokens may ban the only allowed EOS).
    fallback = raw if batch.allowed is None else raw.masked_fill(~batch.allowed, NEG_INF)
    tokens = torch.where(dead, fallback.argmax(-1), tokens)
    logprobs, top = _logprobs(raw, tokens, batch.num_logprobs)
    return SampleOutput(tokens, logprobs, top)


def apply_penalties(x: Tensor, b: SamplingBatch) -> Tensor:
    """logit_bias, then the structured outputs' masks, then the min_tokens mask, then repetition, then frequency/presence
    penalties: everything that changes the logits before the greedy argmax.

    `x` is float32 [B, V] and may be modified in place; use the returned tensor.
    """
    if b.logit_bias is not None:
        x.scatter_add_(1, b.logit_bias.ids, b.logit_bias.values)
    if b.allowed is not None:
        x.masked_fill_(~b.allowed, NEG_INF)
    if b.banned is not None:
        x[b.banned.rows, b.banned.ids] = NEG_INF
    if b.seen is not None and b.repetition is not None:
        # HF/vLLM: a seen token's positive logit is divided, a negative one multiplied.
        p = b.repetition[:, None]
        x = torch.where(b.seen, torch.where(x > 0, x / p, x * p), x)
    if b.output_counts is not None and b.frequency is not None and b.presence is not None:
        # OpenAI: over output tokens only, frequency per occurrence, presence once.
        counts = b.output_counts
        x -= b.frequency[:, None] * counts + b.presence[:, None] * (counts > 0)
    return x


def apply_filters(x: Tensor, b: SamplingBatch) -> Tensor:
    """Temperature, top-k, top-p, min-p -> logits to sample from, -inf where filtered.

    Greedy rows pass through unscaled (they take the argmax, which no filter removes).
    """
    x = x / b.temperature[:, None]
    x = _top_k_top_p(x, b.top_k, b.max_top_k, b.top_p)
    if b.min_p is not None:
        # p_i >= min_p * p_max, in log space (no softmax); the best token always stays,
        # and min_p = 0 gives log 0 = -inf, which keeps everything.
        floor = x.amax(-1, keepdim=True) + b.min_p.log()[:, None]
        x = x.masked_fill(x < floor, NEG_INF)
    return x


def _top_k_top_p(x: Tensor, top_k: Tensor | None, max_k: int, top_p: Tensor | None) -> Tensor:
    """vLLM's semantics: top-k keeps ties with the k-th value; top-p drops the largest
    set of least likely tokens whose total probability is <= 1 - p, never the best."""
    if top_p is None:
        if top_k is None:
            return x
        # topk(max_k) is much cheaper than a full sort; rows with top-k off keep all.
        kth = x.topk(max_k, dim=-1).values.gather(1, (top_k.clamp(max=max_k) - 1)[:, None])
        kth = kth.masked_fill(top_k[:, None] >= x.shape[1], NEG_INF)
        return x.masked_fill(x < kth, NEG_INF)
    srt, idx = x.sort(dim=-1)  # ascending: the best token is last
    if top_k is not None:
        kth = srt.gather(1, (x.shape[1] - top_k)[:, None])
        srt = srt.masked_fill(srt < kth, NEG_INF)
    cum = srt.softmax(-1).cumsum(-1)
    drop = cum <= 1.0 - top_p[:, None]
    drop[:, -1] = False
    srt = srt.masked_fill(drop, NEG_INF)
    return torch.empty_like(x).scatter_(1, idx, srt)


def _draw(x: Tensor, b: SamplingBatch) -> Tensor:
    """Exponential race on logits [B, V] -> [B] long: argmax(p / E) = argmax(x - log E)."""
    noise = counter_exponential(b.seeds, b.counters, x.shape[1])
    return (x - noise.log()).argmax(-1)


# splitmix64's constants, as signed int64 (torch has no uint64 arithmetic).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
_STEP = 0xD1B54A32D192ED03 - (1 << 64)
_BELOW_ONE = 1.0 - 2.0**-24  # the largest float32 below 1


def _shr(z: Tensor, n: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> n) & ((1 << (64 - n)) - 1)


def _splitmix64(z: Tensor) -> Tensor:
    z = z + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1  # int64 products wrap modulo 2^64, as uint64 would
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


@functools.lru_cache(maxsize=4)
def _token_hashes(vocab_size: int, device: torch.device) -> Tensor:
    """splitmix64 of every token id, computed once per vocabulary and device."""
    return _splitmix64(torch.arange(vocab_size, dtype=torch.int64, device=device))


def counter_exponential(seeds: Tensor, counters: Tensor, vocab_size: int) -> Tensor:
    """E ~ Exp(1) [B, V] float32, a pure function of (seed, counter, token id).

    Two splitmix64 rounds mix the row's key with the token id; the top 24 bits give
    U in (0, 1) at float32 resolution, and E = -log U. NOTE: neither end may be reached:
    U = 0 makes E infinite, and U = 1 makes E = 0, so log E = -inf and a filtered token's
    -inf - log E is NaN, which argmax picks. The top value (2^24 - 0.5) / 2^24 rounds to
    1.0 in float32 (a 24-bit significand), so U is clamped to the float below 1: once in
    2^24 tokens a filtered token won, ~1% of draws over a 150K vocabulary.
    """
    key = _splitmix64(seeds.long() ^ (counters.long() * _STEP))[:, None]  # [B, 1]
    z = _splitmix64(key ^ _token_hashes(vocab_size, seeds.device)[None, :])
    u = ((_shr(z, 40).float() + 0.5) * (1.0 / (1 << 24))).clamp_(max=_BELOW_ONE)
    return -torch.log(u)


def _logprobs(
    raw: Tensor, tokens: Tensor, n: int | None
) -> tuple[Tensor | None, TopLogprobs | None]:
    if n is None:
        return None, None
    lp = raw.log_softmax(-1)
    lp = lp.masked_fill(lp.isnan(), NEG_INF)  # an all -inf row: every token impossible
    sampled = lp.gather(1, tokens[:, None]).squeeze(1)
    if n == 0:
        return sampled, None
    values, ids = lp.topk(n, dim=-1)
    return sampled, TopLogprobs(ids, values)
