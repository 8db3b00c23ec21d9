"""A step's host-drawn expert ids in one static device buffer (`--routing synthetic`).

The host draws a step's ids for its real tokens; `stage` writes them, with their count,
into a pinned staging copy and issues one non-blocking copy into a buffer allocated once
for the largest step, so every step's ids sit at the same device addresses. `view`
hands a MoE layer its [T, K] rows of that buffer for the router's row count T: a decode
step captured in a CUDA graph reads whatever the latest `stage` wrote, and its padding
rows (a batch padded to a captured size, T above the real count) hold fixed filler ids,
experts 0..K-1 — ids every executor handles (the device cache masks padding rows itself,
the host cache and the CPU drop them, the resident experts compute them like any row),
so a padded step routes its real tokens exactly as the unpadded one, and a layer's view
is the buffer itself: no op on the decode step's chain (a `torch.where` on the staged
count, the router's ids on the padding rows, cost two launches a layer, ~3 µs on an H200).

Layout: int32, [0] the real row count, then [layers, T, K] for the step's T rows
(T = the router's rows: the padded size of a padded batch), so one copy of
1 + layers·T·K entries carries a step and a layer's view is contiguous.
"""

from __future__ import annotations

import numpy as np
import torch


class _Staging:
    """One host copy of the buffer (pinned on CUDA) and the event that says when the
    device has finished reading it."""

    def __init__(self, n: int, pinned: bool) -> None:
        self.tensor = torch.zeros(n, dtype=torch.int32, pin_memory=pinned)
        self.array = self.tensor.numpy()
        self.copied: torch.cuda.Event | None = None


class StagedIds:
    """Contract: `stage(ids [layers, n, K], rows)` once per step, before the step's
    forward (n real rows of `rows` router rows, n ≤ rows ≤ max_tokens); `view(index,
    router_ids [T, K])` inside the forward: layer `index`'s ids, the staged ones on the
    first n rows and the filler (experts 0..K-1) on the rest. `buffer` is one storage for the runtime's
    life. NOTE: outside a capture, a view for T ≠ the staged rows is an error unless
    nothing was staged (a graph's warm-up: every row is padding)."""

    def __init__(self, layers: int, top_k: int, max_tokens: int, device: torch.device | str) -> None:
        self.layers, self.top_k, self.max_tokens = layers, top_k, max_tokens
        device = torch.device(device)
        self.cuda = device.type == "cuda"
        size = 1 + layers * max_tokens * top_k
        self.buffer = torch.zeros(size, dtype=torch.int32, device=device)
        self._filler = np.arange(top_k, dtype=np.int32)  # a padding row's ids: valid, fixed
        self.row_index = torch.arange(max_tokens, dtype=torch.int32, device=device)
        # Two copies used in turn on CUDA: filling step N+1 never races step N's copy.
        self._staging = [_Staging(size, self.cuda) for _ in range(2 if self.cuda else 1)]
        self._turn = 0
        self.rows = self.live = 0  # the latest stage's router rows and real rows

    def stage(self, ids: np.ndarray, rows: int) -> None:
        L, n, K = ids.shape
        if (L, K) != (self.layers, self.top_k) or not n <= rows <= self.max_tokens:
            raise ValueError(f"staged ids {ids.shape} for {rows} rows: the buffer holds "
                             f"[{self.layers}, ≤{self.max_tokens}, {self.top_k}]")
        stage = self._next_staging()
        end = 1 + L * rows * K
        stage.array[0] = n
        step = stage.array[1:end].reshape(L, rows, K)
        step[:, :n] = ids
        step[:, n:] = self._filler  # padding rows: computed or masked by the executor, never counted
        self.buffer[:end].copy_(stage.tensor[:end], non_blocking=self.cuda)
        if self.cuda:
            stage.copied = torch.cuda.Event()
            stage.copied.record()
        self.rows, self.live = rows, n

    def view(self, index: int, router_ids: torch.Tensor) -> torch.Tensor:
        T, K = router_ids.shape
        if T > self.max_tokens or K != self.top_k:
            raise RuntimeError(f"the router made {(T, K)} ids; the staged buffer holds ≤{self.max_tokens} x {self.top_k}")
        ids = self.buffer[1 : 1 + self.layers * T * K].view(self.layers, T, K)[index]
        if router_ids.is_cuda and torch.cuda.is_current_stream_capturing():
            return ids  # a replay reads the latest stage's ids, the filler on its padding rows
        if T != self.rows:
            if self.live:
                raise RuntimeError(f"synthetic routing prepared {self.rows} rows of ids, the router made {T}")
            return router_ids  # nothing staged for this shape: a graph's warm-up, all padding
        return ids

    def view_real(self, index: int, fill: torch.Tensor) -> torch.Tensor:
        """Layer `index`'s staged ids on the real rows (row < the staged count, read on the
        device) and `fill`'s [T, K] on the padding rows: for a reader that must not see the
        filler as routed (the prefetch's oracle)."""
        T, K = fill.shape
        ids = self.buffer[1 : 1 + self.layers * T * K].view(self.layers, T, K)[index]
        real = self.row_index[:T] < self.buffer[:1]
        return torch.where(real[:, None], ids, fill)

    def _next_staging(self) -> _Staging:
        stage = self._staging[self._turn]
        self._turn = (self._turn + 1) % len(self._staging)
        if stage.copied is not None and not stage.copied.query():  # long done in practice
            stage.copied.synchronize()
        return stage
