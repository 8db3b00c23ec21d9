"""The engine's side of sampling: per-request sampling state in device rows (indexed
like the page table), gathered into a `SamplingBatch` each step and updated on the
device after each draw; plus conversion of the sampled tensors into TokenLogprob
records.

Rows are written once when a request is admitted (its parameters, seed, draw counter,
its logit_bias, and for penalties its prompt and outputs so far) and changed only by
device-side updates afterwards: nothing per step is rebuilt from Python lists.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from edgemoe.engine.request import Request
from edgemoe.engine.sampler import (
    GREEDY_BELOW,
    Banned,
    LogitBias,
    SampleOutput,
    SamplingBatch,
    request_seed,
    sample,
)
from edgemoe.messages import MAX_LOGIT_BIAS, SamplingParams, TokenLogprob

_FLOATS = ("temperature", "top_p", "min_p", "repetition", "frequency", "presence")


@dataclass
class SampledTokens:
    """One step's sampled tokens, rows in the order of the sampling sequences."""

    token_ids: list[int]
    output: SampleOutput

    def logprob_entry(self, row: int, num_top: int) -> TokenLogprob:
        out = self.output
        assert out.logprobs is not None
        top: list[tuple[int, float]] = []
        if out.top_logprobs is not None and num_top:
            ids = out.top_logprobs.ids[row, :num_top].tolist()
            vals = out.top_logprobs.values[row, :num_top].tolist()
            top = list(zip(ids, vals, strict=True))
        return TokenLogprob(self.token_ids[row], float(out.logprobs[row]), top)


@dataclass
class _RowInfo:
    """What the host keeps per row: enough to pick this step's features and bans."""

    params: SamplingParams
    banned_ids: list[int]  # EOS ∪ stop ids, masked while min_tokens is not reached
    greedy: bool


class SamplingRows:
    """Device rows [num_rows] of sampling parameters, seeds, draw counters, and (only
    once some request uses penalties) the seen-token mask and output counts [R, V], and
    (only once some request has a logit_bias) its padded (id, value) pairs [R, 300].

    NOTE: a row's penalty state is exact only while its request uses that penalty (it is
    reset at `assign` then); other rows may hold anything, which their neutral parameter
    (repetition 1, frequency/presence 0) makes irrelevant. A bias has no neutral
    parameter: a row's bias values are all 0.0 unless its request has a bias (`biased`)."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device, seed: int) -> None:
        self.V, self.device = vocab_size, device
        self.floats = torch.ones((len(_FLOATS), num_rows), dtype=torch.float32, device=device)
        self.top_k = torch.full((num_rows,), vocab_size, dtype=torch.int64, device=device)
        self.greedy = torch.ones(num_rows, dtype=torch.bool, device=device)
        self.seeds = torch.zeros(num_rows, dtype=torch.int64, device=device)
        self.counters = torch.zeros(num_rows, dtype=torch.int64, device=device)
        self.seen: torch.Tensor | None = None  # [R, V] bool: prompt or output (repetition)
        self.counts: torch.Tensor | None = None  # [R, V] f32: output occurrences (frequency/presence)
        self.bias_ids: torch.Tensor | None = None  # [R, MAX_LOGIT_BIAS] long: logit_bias ids, padded
        self.bias_values: torch.Tensor | None = None  # [R, MAX_LOGIT_BIAS] f32: 0.0 past a row's entries
        self.biased: set[int] = set()  # rows whose bias_values are not all 0.0
        self.info: dict[int, _RowInfo] = {}
        self.rng = random.Random(seed)  # seeds of unseeded requests: runs repeat

    # -- rows ---------------------------------------------------------------------------

    def assign(self, req: Request, eos_ids: frozenset[int]) -> None:
        """Write the request's row (at admission, and again after a preemption: its
        counter and penalty state continue from the tokens it already generated)."""
        row, p = req.row, req.params
        assert row is not None
        greedy = p.temperature < GREEDY_BELOW
        values = [1.0 if greedy else p.temperature, p.top_p, p.min_p, p.repetition_penalty,
                  p.frequency_penalty, p.presence_penalty]
        self.floats[:, row] = torch.tensor(values, dtype=torch.float32).to(self.device, non_blocking=True)
        top_k = p.top_k if 0 < p.top_k < self.V else self.V
        if req.seed is None:
            req.seed = request_seed(p, self.rng)
        ints = torch.tensor([top_k, req.seed, len(req.output_ids), greedy], dtype=torch.int64)
        ints = ints.to(self.device, non_blocking=True)
        self.top_k[row], self.seeds[row], self.counters[row] = ints[0], ints[1], ints[2]
        self.greedy[row] = ints[3].bool()
        req.sampling_row = row
        eos = frozenset() if p.ignore_eos else eos_ids
        self.info[row] = _RowInfo(p, sorted(eos.union(p.stop_token_ids)), greedy)
        self._write_bias(row, p.logit_bias)
        if p.repetition_penalty != 1.0:
            self._seen()[row] = False
            self._mark(self._seen(), row, req.prompt_ids, req.output_ids)
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            self._counts()[row] = 0.0
            ids = self._ids(req.output_ids)
            self._counts()[row].index_add_(0, ids, torch.ones(ids.shape, device=self.device))

    def release(self, row: int) -> None:
        self.info.pop(row, None)

    def _write_bias(self, row: int, bias: dict[int, float] | None) -> None:
        """The row's logit_bias. An unbiased request in a row that never held a bias costs
        nothing; one in a row that did zeroes it, so gathering it beside a biased row adds 0."""
        if not bias and row not in self.biased:
            return
        if self.bias_ids is None or self.bias_values is None:
            num_rows = self.floats.shape[1]
            self.bias_ids = torch.zeros((num_rows, MAX_LOGIT_BIAS), dtype=torch.int64, device=self.device)
            self.bias_values = torch.zeros((num_rows, MAX_LOGIT_BIAS), dtype=torch.float32, device=self.device)
        self.bias_values[row] = 0.0
        self.biased.discard(row)
        if bias:
            n = len(bias)
            self.bias_ids[row, :n] = self._ids(list(bias))
            values = torch.tensor(list(bias.values()), dtype=torch.float32)
            self.bias_values[row, :n] = values.to(self.device, non_blocking=True)
            self.biased.add(row)

    def _seen(self) -> torch.Tensor:
        if self.seen is None:
            self.seen = torch.zeros((self.floats.shape[1], self.V), dtype=torch.bool, device=self.device)
        return self.seen

    def _counts(self) -> torch.Tensor:
        if self.counts is None:
            self.counts = torch.zeros((self.floats.shape[1], self.V), dtype=torch.float32, device=self.device)
        return self.counts

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.device, non_blocking=True)

    def _mark(self, seen: torch.Tensor, row: int, *parts: list[int]) -> None:
        for ids in parts:
            if ids:
                seen[row].index_fill_(0, self._ids(ids), True)

    # -- one step -------------------------------------------------------------------------

    def plain_greedy(self, rows: tuple[int, ...], generated: tuple[int, ...]) -> bool:
        """Whether every row takes its raw argmax this step: greedy, no logit_bias, no penalty,
        no logprobs, and no min_tokens ban in force. Such a step needs no SamplingBatch (`greedy_tokens`).
        NOTE: its rows' draw counters are not advanced: only a sampled (non-greedy) row reads
        its counter, a request's parameters never change, and `assign` rewrites the counter
        from the request's output whenever it is (re)admitted."""
        for r, n in zip(rows, generated, strict=True):
            info = self.info[r]
            p = info.params
            if not info.greedy or p.logprobs is not None or p.repetition_penalty != 1.0 or p.logit_bias:
                return False
            if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
                return False
            if n < p.min_tokens and any(0 <= t < self.V for t in info.banned_ids):
                return False
        return True

    def batch(self, rows: tuple[int, ...], rows_dev: torch.Tensor, generated: tuple[int, ...],
              allowed: torch.Tensor | None = None) -> SamplingBatch:
        """The SamplingBatch for these rows (`rows_dev`: the same on the device);
        `generated[i]`: tokens row i's request generated so far (min_tokens bans);
        `allowed`: structured outputs' masks [B, V] (engine/constraints.py)."""
        infos = [self.info[r] for r in rows]
        params = [i.params for i in infos]
        idx = rows_dev.long()
        f = self.floats[:, idx]  # [6, B]
        use_rep = any(p.repetition_penalty != 1.0 for p in params)
        use_freq = any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params)
        top_ks = [p.top_k if 0 < p.top_k < self.V else self.V for p in params]
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        bias_width = max((len(p.logit_bias or ()) for p in params), default=0)
        return SamplingBatch(
            vocab_size=self.V,
            temperature=f[0],
            greedy=self.greedy[idx],
            greedy_rows=tuple(i.greedy for i in infos),
            all_greedy=all(i.greedy for i in infos),
            top_k=self.top_k[idx] if any(k < self.V for k in top_ks) else None,
            max_top_k=max((k for k in top_ks if k < self.V), default=self.V),
            top_p=f[1] if any(p.top_p < 1.0 for p in params) else None,
            min_p=f[2] if any(p.min_p > 0.0 for p in params) else None,
            repetition=f[3] if use_rep else None,
            seen=self._seen()[idx] if use_rep else None,
            frequency=f[4] if use_freq else None,
            presence=f[5] if use_freq else None,
            output_counts=self._counts()[idx] if use_freq else None,
            banned=self._banned(infos, generated),
            logit_bias=self._logit_bias(idx, bias_width) if bias_width else None,
            seeds=self.seeds[idx],
            counters=self.counters[idx],
            num_logprobs=max(logprobs) if logprobs else None,
            allowed=allowed,
        )

    def _banned(self, infos: list[_RowInfo], generated: tuple[int, ...]) -> Banned | None:
        rows, ids = [], []
        for b, (info, n) in enumerate(zip(infos, generated, strict=True)):
            if n < info.params.min_tokens:
                ok = [t for t in info.banned_ids if 0 <= t < self.V]
                rows += [b] * len(ok)
                ids += ok
        if not rows:
            return None
        return Banned(self._ids(rows), self._ids(ids))

    def _logit_bias(self, idx: torch.Tensor, width: int) -> LogitBias:
        """The batch rows' first `width` (id, value) pairs: the widest bias among them, so
        narrower and unbiased rows contribute their 0.0 padding."""
        assert self.bias_ids is not None and self.bias_values is not None  # a row has a bias
        return LogitBias(self.bias_ids[idx, :width], self.bias_values[idx, :width])

    def update(self, rows_dev: torch.Tensor, tokens: torch.Tensor, batch: SamplingBatch) -> None:
        """After a draw: advance the counters, record the tokens for penalties (device).
        NOTE: flat index_fill_/index_add_, never index_put_(accumulate=True), whose
        range check reads the indices back to the host."""
        idx = rows_dev.long()
        self.counters.index_add_(0, idx, torch.ones_like(idx))
        flat = idx * self.V + tokens
        if batch.seen is not None and self.seen is not None:
            self.seen.view(-1).index_fill_(0, flat, True)
        if batch.output_counts is not None and self.counts is not None:
            self.counts.view(-1).index_add_(0, flat, torch.ones(flat.shape, device=self.device))


def greedy_tokens(logits: torch.Tensor) -> SampleOutput:
    """A `plain_greedy` step: each row's argmax, one kernel. NOTE: exactly what `sample`
    returns for such a batch (no penalty or ban changes the logits, so its argmax, its
    dead-row fallback and the raw argmax are the same index; the argmax of bf16 logits is
    that of their exact fp32 values)."""
    return SampleOutput(logits.argmax(-1), None, None)


def sample_step(rows: SamplingRows, logits: torch.Tensor, batch: SamplingBatch, rows_dev: torch.Tensor) -> SampleOutput:
    """Draw one token per row and update the rows on the device."""
    out = sample(logits, batch)
    rows.update(rows_dev, out.token_ids, batch)
    return out
