"""The protocol-neutral event stream one generation produces.

Every API (Chat Completions, Completions, Responses, Anthropic Messages) is a
translation of this stream. For each choice, in order: any mix of `TokensDelta`,
`ReasoningDelta`, `TextDelta`, `ToolCallStart` and `ToolCallArgumentsDelta`, then
exactly one `ChoiceDone`; after every choice is done, one `Done` with the totals.

NOTE: concatenating a choice's `TextDelta.text` gives exactly its non-streamed content
(likewise reasoning, and each call's arguments): protocols build their non-streamed
responses by folding these same events (`fold_choices`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from edgemoe.messages import TokenLogprob


@dataclass(frozen=True, slots=True)
class TokensDelta:
    """Tokens the engine generated (their text arrives in the text/reasoning/call events)."""

    choice: int
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None


@dataclass(frozen=True, slots=True)
class TextDelta:
    choice: int
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    choice: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins; `index` counts calls within the choice from 0."""

    choice: int
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgumentsDelta:
    """More of call `index`'s arguments; the pieces concatenate to one JSON object text."""

    choice: int
    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class ChoiceDone:
    """A choice ended. `finish_reason`: stop | length | tool_calls (a call was emitted).

    `stop_reason` is the stop string or stop token id that ended it (None for EOS).
    """

    choice: int
    finish_reason: str
    stop_reason: str | int | None
    completion_tokens: int
    reasoning_tokens: int


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Done:
    usage: Usage


Event = TokensDelta | TextDelta | ReasoningDelta | ToolCallStart | ToolCallArgumentsDelta | ChoiceDone | Done


@dataclass
class ToolCallResult:
    id: str
    name: str
    arguments: str = ""


@dataclass
class ChoiceResult:
    """One choice, folded from its events (the non-streamed view)."""

    index: int
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallResult] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


def fold_event(choices: dict[int, ChoiceResult], event: Event) -> None:
    """Apply one event to the per-choice results (`Done` is ignored)."""
    if isinstance(event, Done):
        return
    c = choices.setdefault(event.choice, ChoiceResult(event.choice))
    if isinstance(event, TextDelta):
        c.text += event.text
    elif isinstance(event, ReasoningDelta):
        c.reasoning += event.text
    elif isinstance(event, ToolCallStart):
        c.tool_calls.append(ToolCallResult(event.id, event.name))
    elif isinstance(event, ToolCallArgumentsDelta):
        c.tool_calls[event.index].arguments += event.arguments
    elif isinstance(event, TokensDelta):
        c.token_ids.extend(event.token_ids)
        if event.logprobs is not None:
            c.logprobs = (c.logprobs or []) + list(event.logprobs)
    elif isinstance(event, ChoiceDone):
        c.finish_reason, c.stop_reason = event.finish_reason, event.stop_reason


def fold_choices(events: Iterable[Event]) -> list[ChoiceResult]:
    choices: dict[int, ChoiceResult] = {}
    for event in events:
        fold_event(choices, event)
    return [choices[i] for i in sorted(choices)]
