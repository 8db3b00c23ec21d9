"""A step's PLE inputs: the n-gram context carried per sequence, the hashed table rows, and
the store's gathers, built once per step before the layers run (device work only)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemoe.kernels.ngram_hash import ngram_ids, ngram_shifts
from edgemoe.layers.context import StepContext
from edgemoe.ple.geometry import PleGeometry
from edgemoe.ple.store import PleStore


@dataclass
class PleStep:
    """`PleRows` of one step: each PLE layer's rows [T, P] through the store."""

    store: PleStore
    ids: torch.Tensor | None  # [L, T, heads] table rows (None: the store brought the rows itself)
    tokens: int  # T

    def rows(self, j: int) -> torch.Tensor:
        got = self.store.gather(j, None if self.ids is None else self.ids[j], self.tokens)
        return got.reshape(self.tokens, -1)


class PleInputs:
    """The hash constants on the device and the state pool extra of the n-gram contexts."""

    def __init__(
        self, geometry: PleGeometry, store: PleStore, device: torch.device, ctx_name: str = "ngram_ctx"
    ) -> None:
        g = geometry
        self.geometry, self.store, self.ctx_name = g, store, ctx_name
        self.multipliers = torch.tensor([x.multipliers for x in g.layers], dtype=torch.int64, device=device)
        self.vocab_sizes = torch.tensor([x.vocab_sizes for x in g.layers], dtype=torch.int64, device=device)
        self.offsets = torch.tensor([x.offsets for x in g.layers], dtype=torch.int64, device=device)

    def step(self, ctx: StepContext) -> PleStep:
        """Advance every sequence's n-gram context by the step's tokens and hash them (when
        the store gathers on the device)."""
        st, g = ctx.state, self.geometry
        assert st is not None, "PLE needs the step's state rows (the n-gram contexts)"
        shifted = ngram_shifts(ctx.batch.input_ids, st.cu_seqlens, st.pool.extra(self.ctx_name), st.rows,
                               st.has_initial_state, g.ngram_size, g.eos)
        T = ctx.batch.num_tokens
        if not self.store.hashes_on_device:
            return PleStep(self.store, None, T)
        return PleStep(self.store, ngram_ids(shifted, self.multipliers, self.vocab_sizes, self.offsets,
                                             g.heads_per_ngram), T)
