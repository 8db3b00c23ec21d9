"""A response format beside tools: the content is the JSON value, or the turn is tool calls.

Where the value would begin (after any think block and leading whitespace) the mask is the
value's first tokens and `<tool_call>`: taking the tag makes the rest a `CallConstraint`
from inside that call (each call held to its tool's schema; after the calls only
whitespace, another call or EOS); any other token commits to the value, as a response
format alone would. So an agent that asks for a structured final answer can still call
its tools first (OpenAI's Agents SDK sends `text.format` and tools together).
"""

from __future__ import annotations

import numpy as np

from edgemoe.structured.call_constraint import CallConstraint
from edgemoe.structured.constraint import OutputConstraint


class ValueOrCalls:
    """One request's value constraint and call constraint, whichever its first token picks."""

    def __init__(self, value: OutputConstraint, calls: CallConstraint, open_tag: int) -> None:
        self._value, self._calls, self._open = value, calls, open_tag
        self.calling = False
        self._before = 0  # tokens before the calls began (they count towards min_tokens)
        self._after_think: np.ndarray | None = None

    def mask(self) -> np.ndarray | None:
        if self.calling:
            return self._calls.mask()
        allowed = self._value.mask()
        if allowed is not None and self._value.before_value():
            allowed[self._open] = True
        return allowed

    def accept(self, token_id: int) -> None:
        if not self.calling and token_id == self._open and self._value.before_value():
            self.calling = True
            self._calls.count = self._before
        if not self.calling:
            self._before += 1
        (self._calls if self.calling else self._value).accept(token_id)

    def waits_for_token(self) -> bool:
        return (self._calls if self.calling else self._value).waits_for_token()

    def pending_mask(self) -> tuple[int, np.ndarray] | None:
        """The value's think block (OutputConstraint.pending_mask); after it, a call may open too."""
        pending = None if self.calling else self._value.pending_mask()
        if pending is None:
            return None
        if self._after_think is None:
            self._after_think = pending[1].copy()
            self._after_think[self._open] = True
        return pending[0], self._after_think

    def unconstrain(self) -> None:
        self._value.unconstrain()
        self._calls.unconstrain()
