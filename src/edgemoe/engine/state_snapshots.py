"""When a hybrid's recurrent (GDN) state is kept for the prefix cache.

After each step's kernels (stream order) every request's state is captured at a page
boundary it reached; it is frozen (kept until the request ends) at the prompt's last
boundary, so a repeated or shared prompt resumes there, and after a generated tool-call
opener, so a client that re-renders the call resumes right after it.
"""

from __future__ import annotations

from collections.abc import Callable

from edgemoe.cache.prefix_cache import PrefixCache
from edgemoe.engine.request import Request
from edgemoe.engine.scheduler import ScheduledSeq, StepPlan

# Tokens after which a request keeps a GDN state snapshot until it ends: the assistant's
# tool-call opener.
SNAPSHOT_TOKENS = ("<tool_call>",)


def opener_token_ids(token_to_id: Callable[[str], int | None]) -> frozenset[int]:
    ids = (token_to_id(t) for t in SNAPSHOT_TOKENS)
    return frozenset(i for i in ids if i is not None)


class StateSnapshots:
    def __init__(self, prefix_cache: PrefixCache, page_size: int, opener_ids: frozenset[int]) -> None:
        self.prefix_cache, self.page_size, self.opener_ids = prefix_cache, page_size, opener_ids

    def capture(self, plan: StepPlan) -> tuple[ScheduledSeq, ...]:
        """Capture (and freeze where due) after a launched step. Returns the decodes whose
        token is still on the device (overlap): `check_openers` looks at them later."""
        unchecked = []
        for s in plan.seqs:
            req = s.request
            assert req.row is not None
            self.prefix_cache.capture_state(req.snapshots, req.row, req.num_computed)
            prompt_end = (len(req.prompt_ids) - 1) // self.page_size * self.page_size  # a chunk ends there
            if s.start < prompt_end == req.num_computed:
                self.prefix_cache.freeze_state(req.snapshots, "prompt")
            elif s.start >= req.num_known:
                unchecked.append(s)
            elif self.opens_tool_call(s):
                self.prefix_cache.freeze_state(req.snapshots, "tool_call")
        return tuple(unchecked)

    def check_openers(self, seqs: tuple[ScheduledSeq, ...], live: Callable[[Request], bool]) -> None:
        """Overlap: the tool-call opener check of a launched step's decodes whose token has
        reached the host since. NOTE: call it before the next launch, while the rolling
        snapshot still holds the state that step captured."""
        for s in seqs:
            if live(s.request) and self.opens_tool_call(s):
                self.prefix_cache.freeze_state(s.request.snapshots, "tool_call")

    def opens_tool_call(self, s: ScheduledSeq) -> bool:
        """The step computed a generated tool-call opener token."""
        req = s.request
        generated = s.length == 1 and s.start >= len(req.prompt_ids)
        return generated and req.token_slice(s.start, s.start + 1)[0] in self.opener_ids
