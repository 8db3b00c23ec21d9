"""One request's tool calls, constrained: free text, and inside each `<tool_call>` …
`</tool_call>` a call the grammar accepts: the Hermes JSON (`call_schema`, in a
`PaddedValue`) or the Qwen3-Coder XML (`xml_calls.XmlCalls`). MiniMax-M2's calls are a
`<minimax:tool_call>` … `</minimax:tool_call>` block of invokes (`XmlCalls` too): its tags
stand for `<tool_call>` / `</tool_call>` below (`call_tokens.tag_texts`), and `one_call`
holds the block to one invoke in its grammar as well.

Phases, as tokens come:
- `text`: free, but for `<tool_call>` spelled out in plain tokens (the parser would read it
  as a call the grammar never saw); the `<tool_call>` token opens a call, `<think>` a think
  block;
- `thinking`: unconstrained until `</think>` (a call written while reasoning is not one
  the parser reads, so it is not constrained either);
- `call`: masked by the grammar (whitespace, the JSON, whitespace; or the XML);
  `</tool_call>` is allowed exactly where the call is complete;
- `after`: once a call closed, only whitespace (LEAD_SPACE bytes), the next call's
  `<tool_call>` (not with `one_call`: `parallel_tool_calls` false) or EOS — the calls end
  the turn, as Hermes templates write them and as OpenAI's and Anthropic's replies are.
  While `min_tokens` still bans EOS only EOS is allowed (the engine then writes EOS until
  it may stop, as after a complete JSON value): another call must not be the only choice;
- `off`: a token the mask did not allow, or a grammar failure: unconstrained from then on.

A request forced to call (`tool_choice` "required") starts in `call`, its prompt having
written the opening (`primed`: the bytes after the opening tag).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgemoe.structured.call_tokens import CallTokens
from edgemoe.structured.constraint import (
    LEAD_SPACE,
    Reasoning,
    ThinkTokens,
    advance_bytes,
    advance_token,
)
from edgemoe.structured.token_masks import TokenMasks

log = logging.getLogger(__name__)


class CallGrammar(Protocol):
    """What is inside a call's tags: the JSON (`PaddedValue`) or the XML (`XmlCalls`)."""

    def start(self) -> object: ...
    def advance(self, state: object, byte: int) -> object | None: ...
    def is_complete(self, state: object) -> bool: ...


@dataclass(frozen=True)
class CallRules:
    """What a request's calls end with: its EOS ids, whether one call is all it may write,
    and the tokens it must write before EOS may end it."""

    eos: frozenset[int]
    one_call: bool = False
    min_tokens: int = 0


class CallConstraint:
    """The mask for a request's next token while it may write tool calls."""

    def __init__(self, masks: TokenMasks, token_bytes: list[bytes | None], tokens: CallTokens,
                 rules: CallRules, reasoning: Reasoning, think: ThinkTokens | None,
                 primed: bytes | None = None) -> None:
        self._masks = masks
        self._grammar: CallGrammar = masks.grammar  # type: ignore[assignment]
        self._bytes = token_bytes
        self._tokens = tokens
        self._tags = tokens.tags
        self._eos = np.array(sorted(t for t in rules.eos if 0 <= t < masks.vocab.width), dtype=np.int64)
        self._rules = rules
        self._think = think
        self.phase = "thinking" if reasoning == "open" and think is not None else "text"
        self.state: object | None = None
        self._spelled = 0  # bytes of `<tool_call>` the text ends with
        self._spaces_after = 0  # whitespace bytes since the last call closed
        self.count = 0  # tokens of the output so far (min_tokens), ValueOrCalls' before it too
        if primed is not None:
            self.phase, self.state = "call", advance_bytes(self._grammar, self._grammar.start(), primed)
            if self.state is None:
                raise ValueError(f"structured output: the call's opening {primed!r} does not start a call")

    def mask(self) -> np.ndarray | None:
        """bool [width], True where the next token is allowed; None: unconstrained."""
        if self.phase == "after":
            return self._after_mask()
        if self.phase == "text":
            blocked = self._tokens.spelled.blocked(self._spelled)
            if blocked is None:
                return None
            allowed = ~blocked
            allowed[self._tags.open] = True  # the tag itself, were it a plain vocabulary entry too
            return allowed
        if self.phase != "call":
            return None
        allowed = self._masks.allowed(self.state)
        if self._grammar.is_complete(self.state):
            allowed[self._tags.close] = True
        return allowed

    def waits_for_token(self) -> bool:
        """Whether the mask after the next token depends on that token. Not while thinking
        (after any token, the close included, the mask is None: free text starts with no tag
        spelled) nor once off: overlap scheduling goes on through a long think block."""
        if self.phase == "off":
            return False
        return not (self.phase == "thinking" and self._tokens.spelled.blocked(0) is None)

    def pending_mask(self) -> None:
        """No mask waits on the device: inside a think block every next one is None."""
        return None

    def _after_mask(self) -> np.ndarray:
        allowed = np.zeros(self._masks.vocab.width, dtype=bool)
        allowed[self._eos] = True
        if self.count < self._rules.min_tokens:
            return allowed
        allowed[self._tokens.spaces.within(LEAD_SPACE - self._spaces_after)] = True
        allowed[self._tags.open] = not self._rules.one_call
        return allowed

    def accept(self, token_id: int) -> None:
        """The token the request sampled."""
        self.count += 1
        if self.phase == "thinking":
            if self._think is not None and token_id == self._think.close:
                self.phase, self._spelled = "text", 0
        elif self.phase == "text":
            if token_id == self._tags.open:
                self.phase, self.state = "call", self._grammar.start()
            elif self._think is not None and token_id == self._think.open:
                self.phase = "thinking"
            else:
                self._spelled = self._tokens.spelled.after(self._spelled, token_id)
        elif self.phase == "call":
            self._accept_in_call(token_id)
        elif self.phase == "after":
            self._accept_after(token_id)

    def _accept_in_call(self, token_id: int) -> None:
        if token_id == self._tags.close and self._grammar.is_complete(self.state):
            self.phase, self.state, self._spaces_after = "after", None, 0
            return
        nxt = advance_token(self._grammar, self.state, self._bytes, token_id)
        if nxt is None:
            log.warning("structured output: token %d is not allowed in a tool call; the rest of this output is "
                        "not constrained", token_id)
            self.phase = "off"
        self.state = nxt

    def _accept_after(self, token_id: int) -> None:
        if token_id == self._tags.open and not self._rules.one_call:
            self.phase, self.state = "call", self._grammar.start()
        elif token_id in self._tokens.spaces.length_of:
            self._spaces_after += self._tokens.spaces.length_of[token_id]
        elif token_id not in self._eos:
            log.warning("structured output: token %d is not allowed after a tool call; the rest of this output is "
                        "not constrained", token_id)
            self.phase = "off"

    def unconstrain(self) -> None:
        """The rest of the output goes unconstrained (a grammar failure)."""
        self.phase, self.state = "off", None
