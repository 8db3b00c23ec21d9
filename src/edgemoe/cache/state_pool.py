"""Per-sequence recurrent state of the GDN layers (Qwen3-Next, Qwen3.5), in device rows.

For each GDN layer: a recurrent state `[N, Hv, Dk, Dv]` fp32 and a conv state
`[N, C, K-1]` (the last K-1 inputs of the short conv, in the model dtype); a model may add
per-sequence tensors of its own (`RowState`, e.g. Qwen3.8-Flash-Next's n-gram context and
PLE conv state), which every row operation (copy, snapshot, host tier) carries along. A sequence's
state is one row index into every layer's tensors, so the kernels take a batch's states
as a row vector (`kernels/gdn.py`: `state_pool[state_idx]`, read first, written back in
place) and one captured decode step serves any set of requests. A step's rows reach the
layers through `layers/context.StateStep`.

Rows: row r < `live_rows` belongs to the running request whose page-table row is r
(`Request.row`, assigned at admission); row `live_rows - 1` is the page table's scratch
row (padded batch entries of a CUDA graph point there, never a request). NOTE: several
padded entries of one step name that row together; each starts from zeros (position 0)
with the same token, so they all write the same values and the kernels' distinct-rows
rule is only bent where nobody reads. Rows past
`live_rows` hold prefix-cache snapshots: a copy of a sequence's state at a page boundary,
handed out by `alloc_snapshot` / `free_snapshot` (the prefix cache and the running
requests own them in turn, `cache/tiered_radix.py`).

NOTE: a row is only ever written by the kernels of a step that names it, and a fresh
sequence's first chunk does not read its row (`has_initial_state` False), so a row
needs no clearing when a request takes it over.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class RowState(NamedTuple):
    """A model's own per-sequence tensor beside the GDN states: `shape` per row."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


class StateShape(NamedTuple):
    """One sequence's state, per GDN layer: what a model's arch reports."""

    num_layers: int  # GDN layers
    num_v_heads: int  # Hv
    key_dim: int  # Dk
    value_dim: int  # Dv
    conv_channels: int  # C = 2·Hk·Dk + Hv·Dv (q|k|v)
    conv_history: int  # K - 1
    conv_dtype: torch.dtype  # the model's dtype
    extras: tuple[RowState, ...] = ()  # the model's own per-sequence tensors (all layers at once)

    @property
    def recurrent_bytes(self) -> int:
        return self.num_v_heads * self.key_dim * self.value_dim * 4

    @property
    def conv_bytes(self) -> int:
        return self.conv_channels * self.conv_history * self.conv_dtype.itemsize

    @property
    def row_nbytes(self) -> int:
        """One sequence's state over all GDN layers (~61 MiB at the Qwen3.5-35B-A3B shape)."""
        return self.num_layers * (self.recurrent_bytes + self.conv_bytes) + sum(e.nbytes for e in self.extras)


class StatePool:
    """The device tensors and their snapshot-row free list. Not thread-safe: the engine loop owns it.

    NOTE: every snapshot row is, at any time, exactly one of: free (in the free list) or
    owned by whoever `alloc_snapshot` gave it to until it is passed on or freed; a double
    free or a free of a live row raises.
    """

    def __init__(self, shape: StateShape, live_rows: int, snapshot_rows: int, device: torch.device) -> None:
        if live_rows < 1 or snapshot_rows < 0:
            raise ValueError(f"need live_rows >= 1 and snapshot_rows >= 0, got {live_rows}, {snapshot_rows}")
        self.shape, self.live_rows, self.snapshot_rows = shape, live_rows, snapshot_rows
        rows, s = live_rows + snapshot_rows, shape
        # zeros, not empty: a scratch row read by a padded entry stays finite.
        self.recurrent = torch.zeros(
            (s.num_layers, rows, s.num_v_heads, s.key_dim, s.value_dim), dtype=torch.float32, device=device
        )
        self.conv = torch.zeros(
            (s.num_layers, rows, s.conv_channels, s.conv_history), dtype=s.conv_dtype, device=device
        )
        self.extras = {e.name: torch.zeros((rows, *e.shape), dtype=e.dtype, device=device) for e in s.extras}
        self._free = list(range(rows - 1, live_rows - 1, -1))  # pop() hands out low rows first
        self._is_free = set(self._free)

    @property
    def num_rows(self) -> int:
        return self.live_rows + self.snapshot_rows

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv [N, C, K-1], recurrent [N, Hv, Dk, Dv]) of GDN layer i: views the kernels update."""
        return self.conv[i], self.recurrent[i]

    @property
    def num_free_snapshots(self) -> int:
        return len(self._free)

    def alloc_snapshot(self) -> int | None:
        """A free snapshot row, or None when all are taken."""
        if not self._free:
            return None
        row = self._free.pop()
        self._is_free.discard(row)
        return row

    def free_snapshot(self, row: int) -> None:
        if not self.live_rows <= row < self.num_rows or row in self._is_free:
            raise ValueError(f"state row {row} is not an allocated snapshot row")
        self._free.append(row)
        self._is_free.add(row)

    def extra(self, name: str) -> torch.Tensor:
        """The model's own per-sequence tensor `name`: [N, *shape], indexed by row."""
        return self.extras[name]

    def read_row(self, row: int) -> tuple[torch.Tensor, ...]:
        """Views of one row: recurrent [Lg, Hv, Dk, Dv], conv [Lg, C, K-1] (every GDN layer),
        then each extra's [*shape], in `StateShape.extras` order."""
        return (self.recurrent[:, row], self.conv[:, row], *(t[row] for t in self.extras.values()))

    def copy_row(self, src: int, dst: int) -> None:
        """Row `dst` := row `src` in every tensor (a snapshot, or its restore): device copies."""
        self.recurrent[:, dst].copy_(self.recurrent[:, src])
        self.conv[:, dst].copy_(self.conv[:, src])
        for t in self.extras.values():
            t[dst].copy_(t[src])

    def nbytes(self) -> int:
        return self.recurrent.nbytes + self.conv.nbytes + sum(t.nbytes for t in self.extras.values())
