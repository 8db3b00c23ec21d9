"""Static batch buffers: a step's ForwardBatch written once, copied to the device once.

Every field has a fixed region in one int64 and one int32 device buffer, sized for the
largest step (`max_tokens`, `max_seqs`), so kernels and CUDA graphs see the same
addresses every step. The host fills a staging copy (pinned on CUDA, two of them used in
turn so filling step N+1 never races step N's copy still in flight) and issues one copy
per buffer.

Overlap scheduling: a decode whose input token was sampled by the step still in flight
stages `PENDING` for it; `last_token` [rows] holds each page-table row's latest sampled
id on the device (`keep_sampled`, after every draw) and `fetch_pending` replaces the
placeholders from it before the forward (device work only, inside the decode graphs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from edgemoe.cache.page_table import PageTable
from edgemoe.layers.batch import BatchHost, BatchMode, ForwardBatch

# int64 fields, each a region of max_tokens entries; int32 fields of max_seqs (+1).
_I64 = ("input_ids", "positions", "out_loc", "logits_indices")
_I32 = ("req_rows", "seq_lens", "cu_seqlens_q", "sample_rows")

# A decode's input id that is still on the device (the step in flight sampled it).
PENDING = -1


@dataclass(frozen=True)
class SeqChunk:
    """What the batch needs to know of one scheduled sequence."""

    row: int  # page-table row
    start: int  # first position computed in this step
    token_ids: Sequence[int]  # the tokens at positions [start, start + len); PENDING: a decode's id on the device
    pages: Sequence[int]  # the request's page ids (at least up to the chunk's end)
    in_prompt: bool  # the chunk lies in the prompt (prefill), not a decode token
    wants_logits: bool  # sample after its last token
    all_logits: bool = False  # logits at every position (prompt scoring)
    context: Sequence[int] = ()  # the tokens before `start` a model hashes with on the host (PLE n-grams)


class _Staging:
    """One host-side copy of both buffers (pinned on CUDA) and the event that says
    when the device has finished reading it."""

    def __init__(self, n64: int, n32: int, pinned: bool) -> None:
        self.i64 = torch.zeros(n64, dtype=torch.int64, pin_memory=pinned)
        self.i32 = torch.zeros(n32, dtype=torch.int32, pin_memory=pinned)
        self.np64, self.np32 = self.i64.numpy(), self.i32.numpy()
        self.copied: torch.cuda.Event | None = None


class BatchBuffers:
    """`overlap`: keep `last_token` and resolve PENDING ids from it (see the module doc)."""

    def __init__(
        self, max_tokens: int, max_seqs: int, page_table: PageTable, page_size: int, overlap: bool = False
    ) -> None:
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.page_table, self.page_size = page_table, page_size
        device = page_table.device
        self.cuda = device.type == "cuda"
        self.n32 = 4 * max_seqs + 1
        self.dev64 = torch.zeros(len(_I64) * max_tokens, dtype=torch.int64, device=device)
        self.dev32 = torch.zeros(self.n32, dtype=torch.int32, device=device)
        self._staging = [_Staging(self.dev64.numel(), self.n32, self.cuda) for _ in range(2 if self.cuda else 1)]
        self._turn = 0
        # Indexed by page-table row, the scratch row included (padded entries read it).
        rows = page_table.max_rows + 1
        self.last_token = torch.zeros(rows, dtype=torch.int64, device=device) if overlap else None

    def keep_sampled(self, sample_rows: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Record a step's sampled ids by row (stream-ordered, no sync); the next step's
        PENDING ids of those rows read them."""
        if self.last_token is not None and token_ids.numel():
            self.last_token.scatter_(0, sample_rows.long(), token_ids)

    def fetch_pending(self, batch: ForwardBatch) -> None:
        """Replace the PENDING ids among the batch's leading one-token chunks with their
        rows' last sampled ids, in place (device work only: capturable, no sync).
        NOTE: only a decode stages PENDING (`_fill` checks it), and the scheduler puts every
        one-token step (decodes, and a prompt's last token) first, so token b of that
        leading run is sequence b."""
        if self.last_token is None:
            return
        n = _leading_single_tokens(batch.host.q_lens)
        if n == 0:
            return
        ids = batch.input_ids[:n]
        ids.copy_(torch.where(ids >= 0, ids, self.last_token.index_select(0, batch.req_rows[:n].long())))

    def _region64(self, name: str) -> slice:
        i = _I64.index(name) * self.max_tokens
        return slice(i, i + self.max_tokens)

    def _region32(self, name: str) -> slice:
        B = self.max_seqs
        return {
            "req_rows": slice(0, B), "seq_lens": slice(B, 2 * B),
            "cu_seqlens_q": slice(2 * B, 3 * B + 1), "sample_rows": slice(3 * B + 1, 4 * B + 1),
        }[name]

    def build(self, chunks: Sequence[SeqChunk]) -> ForwardBatch:
        """Fill the staging buffers from `chunks`, copy them to the device, and return
        the batch as views. Flushes the page table first (stream order)."""
        T = sum(len(c.token_ids) for c in chunks)
        B = len(chunks)
        if not 0 < T <= self.max_tokens or B > self.max_seqs:
            raise ValueError(f"batch of {T} tokens / {B} sequences exceeds {self.max_tokens} / {self.max_seqs}")
        stage = self._next_staging()
        host, n_logits, n_sample = self._fill(stage, chunks, T)
        self.page_table.flush()
        self._copy(stage)
        d64, d32 = self.dev64, self.dev32
        r = self._region64
        return ForwardBatch(
            mode=_mode(chunks),
            input_ids=d64[r("input_ids")][:T],
            positions=d64[r("positions")][:T],
            out_loc=d64[r("out_loc")][:T],
            req_rows=d32[self._region32("req_rows")][:B],
            seq_lens=d32[self._region32("seq_lens")][:B],
            cu_seqlens_q=d32[self._region32("cu_seqlens_q")][: B + 1],
            logits_indices=d64[r("logits_indices")][:n_logits],
            sample_rows=d32[self._region32("sample_rows")][:n_sample],
            page_table=self.page_table.table,
            page_size=self.page_size,
            host=host,
        )

    def _fill(self, stage: _Staging, chunks: Sequence[SeqChunk], T: int) -> tuple[BatchHost, int, int]:
        a64, a32, P = stage.np64, stage.np32, self.page_size
        ids, pos, loc, logit = (a64[self._region64(n)] for n in _I64)
        rows, lens, cu, sample_rows = (a32[self._region32(n)] for n in _I32)
        q, n_logits, n_sample = 0, 0, 0
        cu[0] = 0
        single = _leading_single_tokens([len(c.token_ids) for c in chunks])
        for b, c in enumerate(chunks):
            n, end = len(c.token_ids), c.start + len(c.token_ids)
            if b >= single and n == 1 and c.token_ids[0] == PENDING:
                raise ValueError("a PENDING id outside the batch's leading one-token chunks")
            ids[q : q + n] = c.token_ids
            p = np.arange(c.start, end, dtype=np.int64)
            first_page = c.start // P
            # Only the pages this chunk touches: never the whole context.
            pages = np.asarray(c.pages[first_page : (end - 1) // P + 1], dtype=np.int64)
            pos[q : q + n] = p
            loc[q : q + n] = pages[p // P - first_page] * P + p % P
            if c.all_logits:
                logit[n_logits : n_logits + n] = np.arange(q, q + n)
                n_logits += n
            elif c.wants_logits:
                logit[n_logits] = q + n - 1
                sample_rows[n_sample] = c.row
                n_logits, n_sample = n_logits + 1, n_sample + 1
            rows[b], lens[b] = c.row, end
            q += n
            cu[b + 1] = q
        host = BatchHost(
            q_lens=tuple(len(c.token_ids) for c in chunks),
            seq_lens=tuple(c.start + len(c.token_ids) for c in chunks),
            req_rows=tuple(c.row for c in chunks),
            num_decode=_leading_decodes(chunks),
            num_padding=sum(1 for c in chunks if c.row == self.page_table.scratch_row),
        )
        return host, n_logits, n_sample

    def _next_staging(self) -> _Staging:
        stage = self._staging[self._turn]
        self._turn = (self._turn + 1) % len(self._staging)
        # The copy two steps ago is long done in practice: query first, so the common
        # case costs no host synchronisation.
        if stage.copied is not None and not stage.copied.query():
            stage.copied.synchronize()
        return stage

    def _copy(self, stage: _Staging) -> None:
        self.dev64.copy_(stage.i64, non_blocking=self.cuda)
        self.dev32.copy_(stage.i32, non_blocking=self.cuda)
        if self.cuda:
            stage.copied = torch.cuda.Event()
            stage.copied.record()


def _leading_single_tokens(q_lens: Sequence[int]) -> int:
    n = 0
    while n < len(q_lens) and q_lens[n] == 1:
        n += 1
    return n


def _leading_decodes(chunks: Sequence[SeqChunk]) -> int:
    n = 0
    while n < len(chunks) and len(chunks[n].token_ids) == 1 and not chunks[n].in_prompt:
        n += 1
    return n


def all_decode(chunks: Sequence[SeqChunk]) -> bool:
    """Every chunk adds one generated token (a decode batch)."""
    return all(len(c.token_ids) == 1 and not c.in_prompt for c in chunks)


def _mode(chunks: Sequence[SeqChunk]) -> BatchMode:
    if all_decode(chunks):
        return BatchMode.DECODE
    if all(c.in_prompt for c in chunks):
        return BatchMode.PREFILL
    return BatchMode.MIXED
