"""One request's structured output: which tokens it may sample next, as it goes.

The output is `[<think> reasoning </think>] [whitespace] JSON value` then EOS:
- `reasoning="none"`: the JSON starts at the first token (thinking off, or a model
  without `<think>` blocks);
- `"open"`: the prompt ends inside `<think>`: unconstrained until `</think>`;
- `"start"`: thinking on, the prompt not inside a block: the first token is `<think>` or
  the JSON's first token (Qwen3's templates leave `<think>` to the model), after any
  leading whitespace (GLM-4.5's template has the model write "\n<think>").
Up to `LEAD_SPACE` whitespace bytes may precede the value (models write "\n\n" after
`</think>`) and as many follow it (a token such as `}\n` ends a value in one piece). EOS is allowed exactly where the value is complete; special and added
tokens never are inside the value. A token the mask did not allow (none should come:
the sampler applies the mask before every choice) ends the constraint, logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np

from edgemoe.structured import Grammar
from edgemoe.structured.token_masks import ByteGrammar, TokenMasks

log = logging.getLogger(__name__)

Reasoning = Literal["none", "open", "start"]
LEAD_SPACE = 8
_SPACE = frozenset(b" \t\n\r")


@dataclass(frozen=True)
class _Lead:
    """Before the value's first byte: `spaces` whitespace bytes read so far."""

    spaces: int


@dataclass(frozen=True)
class _Trail:
    """After a complete value: `spaces` whitespace bytes read since."""

    spaces: int


class PaddedValue:
    """`grammar` with up to LEAD_SPACE whitespace bytes allowed before its value and after it."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self._start = grammar.start()

    def start(self) -> object:
        return _Lead(0)

    def advance(self, state: object, byte: int) -> object | None:
        if isinstance(state, _Lead):
            if byte in _SPACE:
                return _Lead(state.spaces + 1) if state.spaces < LEAD_SPACE else None
            return self.grammar.advance(self._start, byte)
        if isinstance(state, _Trail):
            return _Trail(state.spaces + 1) if byte in _SPACE and state.spaces < LEAD_SPACE else None
        nxt = self.grammar.advance(state, byte)
        if nxt is None and byte in _SPACE and self.grammar.is_complete(state):
            return _Trail(1)
        return nxt

    def free_string(self, state: object) -> bool:
        return not isinstance(state, (_Lead, _Trail)) and self.grammar.free_string(state)

    def split(self, state: object) -> list[object]:
        return [state] if isinstance(state, (_Lead, _Trail)) else self.grammar.split(state)  # type: ignore[arg-type]

    def string_room(self, state: object) -> int | None:
        return None if isinstance(state, (_Lead, _Trail)) else self.grammar.string_room(state)

    def is_complete(self, state: object) -> bool:
        if isinstance(state, _Trail):
            return True
        return self.grammar.is_complete(self._start if isinstance(state, _Lead) else state)


def advance_bytes(grammar: ByteGrammar, state: object, data: bytes) -> object | None:
    """The state after `data` from `state`; None where a byte is refused."""
    for b in data:
        state = grammar.advance(state, b)
        if state is None:
            return None
    return state


def advance_token(grammar: ByteGrammar, state: object, token_bytes: list[bytes | None], token_id: int) -> object | None:
    """The state after token `token_id`; None where it is refused (or has no bytes: an
    added or special token, or one past the tokenizer's vocabulary)."""
    data = token_bytes[token_id] if 0 <= token_id < len(token_bytes) else None
    return advance_bytes(grammar, state, data) if data else None


@dataclass(frozen=True)
class ThinkTokens:
    open: int
    close: int


class OutputConstraint:
    """The mask for a request's next token, and its state as tokens come."""

    def __init__(self, masks: TokenMasks, token_bytes: list[bytes | None], eos_ids: frozenset[int],
                 reasoning: Reasoning, think: ThinkTokens | None) -> None:
        assert isinstance(masks.grammar, PaddedValue)
        self._masks = masks
        self._grammar: PaddedValue = masks.grammar
        self._bytes = token_bytes
        self._eos = np.array(sorted(t for t in eos_ids if 0 <= t < masks.vocab.width), dtype=np.int64)
        self._think = think
        self.state: object | None = self._grammar.start()
        self._after_think: np.ndarray | None = None  # pending_mask's, built once
        # "thinking" until the close tag; "first": <think> may still open the output.
        self.phase = {"none": "value", "open": "thinking", "start": "first"}[reasoning] if think else "value"

    @property
    def active(self) -> bool:
        """Whether the next token is masked (not while thinking, nor once ended)."""
        return self.phase in ("value", "first") and self.state is not None

    def before_value(self) -> bool:
        """Whether the value has not begun (its next token is the value's first, or space)."""
        return self.active and isinstance(self.state, _Lead)

    def waits_for_token(self) -> bool:
        """Whether the mask after the next token depends on that token in a way only the
        host can follow (overlap scheduling then completes the step in flight first): until
        the output is unconstrained for good, but for a think block, whose next mask is
        None unless the token is the close (`pending_mask`: the device picks)."""
        return self.state is not None and self.phase != "thinking"

    def pending_mask(self) -> tuple[int, np.ndarray] | None:
        """Inside a think block, with a token in flight this constraint has not seen: the
        close's id and the mask after it (the value's first: the same all through the
        block, so kept; read it, don't change it). The next mask is that where the token in
        flight is the close, else None."""
        if self.phase != "thinking" or self.state is None or self._think is None:
            return None
        if self._after_think is None:
            self._after_think = self._value_mask()
        return self._think.close, self._after_think

    def mask(self) -> np.ndarray | None:
        """bool [width], True where the next token is allowed; None: unconstrained."""
        if not self.active:
            return None
        allowed = self._value_mask()
        if self.phase == "first":
            assert self._think is not None
            allowed[self._think.open] = True
        return allowed

    def _value_mask(self) -> np.ndarray:
        allowed = self._masks.allowed(self.state)
        if self._grammar.is_complete(self.state):
            allowed[self._eos] = True
        return allowed

    def accept(self, token_id: int) -> None:
        """The token the request sampled (or took from its prompt's forced text: none yet)."""
        if self.phase == "thinking":
            if self._think is not None and token_id == self._think.close:
                self.phase = "value"
            return
        first = self.phase == "first"
        if first:
            if self._think is not None and token_id == self._think.open:
                self.phase = "thinking"
                return
            self.phase = "value"
        if self.state is None or token_id in self._eos:
            return
        nxt = advance_token(self._grammar, self.state, self._bytes, token_id)
        if nxt is None:
            log.warning("structured output: token %d is not allowed here; the rest of this output is not "
                        "constrained", token_id)
        self.state = nxt
        if first and isinstance(nxt, _Lead):
            self.phase = "first"  # whitespace only: a think block may still open (GLM-4.5 writes "\n<think>")

    def unconstrain(self) -> None:
        """The rest of the output goes unconstrained (a grammar failure)."""
        self.state = None
