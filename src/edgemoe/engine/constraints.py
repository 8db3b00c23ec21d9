"""The engine's structured outputs (`SamplingParams.structured`): a grammar per schema,
a constraint per request, and each step's allowed-token masks for the sampler.

A request's mask depends on every token it sampled before, so a step that samples for a
constrained request needs the previous step's tokens on the host first: overlap
scheduling completes the step in flight before scheduling while one runs
(`Engine.needs_host_tokens`), unless no request's next mask needs that token on the host
(`wait_for_tokens`): inside a think block a tool-call constraint's mask is None whatever
comes, and a JSON output's is the value's first where the token in flight is the close,
else None — picked on the device (`step_masks`). Masks are built on the host while the step's forward pass
runs on the device, and go to the device as one bool [B, V] copy.

The vocabulary's trie is built at the first constrained request (~1 s at 150K tokens),
grammars are compiled once per schema text and kept for the last `GRAMMARS`. A request's
constraint is an `OutputConstraint` (the output is one JSON value), a `CallConstraint`
(its tool calls: Hermes JSON, Qwen3-Coder or MiniMax-M2 XML, `StructuredOutput.target="calls"`), or a
`ValueOrCalls` (a value, or calls, as its first token picks: `calls_schema` beside a
response format).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from edgemoe.engine.mask_upload import MaskUpload
from edgemoe.messages import StructuredOutput
from edgemoe.structured import Grammar, GrammarError
from edgemoe.structured.call_constraint import CallConstraint, CallRules
from edgemoe.structured.call_tokens import CallTags, CallTokens, SpaceTokens, SpelledTag, tag_texts
from edgemoe.structured.constraint import OutputConstraint, PaddedValue, ThinkTokens
from edgemoe.structured.token_masks import TokenMasks
from edgemoe.structured.value_or_calls import ValueOrCalls
from edgemoe.structured.vocab import Vocabulary, grammar_token_bytes
from edgemoe.structured.xml_calls import SPELLINGS, XmlCalls
from edgemoe.structured.xml_tools import xml_calls

GRAMMARS = 32
Constraint = OutputConstraint | CallConstraint | ValueOrCalls
log = logging.getLogger(__name__)


def compile_grammar(text: str | None) -> Grammar:
    """The grammar of a structured output's schema text (None: any JSON object); ValueError
    naming the schema's fault."""
    if text is None:
        return Grammar.json_object()
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"structured output: the schema is not JSON ({exc})") from exc
    try:
        return Grammar.from_schema(schema)
    except GrammarError as exc:
        raise ValueError(f"structured output: {exc}") from exc
    except RecursionError as exc:
        raise ValueError("structured output: the schema nests too deeply") from exc


def compile_xml_calls(text: str | None, tool_format: str = "qwen3_coder", one_call: bool = False) -> XmlCalls:
    """The XML calls' grammar of a "qwen3_coder" or "minimax_m2" calls text (the tools'
    [name, parameters, strict] as JSON); ValueError naming the fault."""
    try:
        return xml_calls(json.loads(text or "null"), SPELLINGS[tool_format], one_call)
    except GrammarError as exc:
        raise ValueError(f"structured output: {exc}") from exc
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"structured output: the tools are not [name, parameters, strict] lists ({exc})") from exc


class Constraints:
    """Every constrained request's `OutputConstraint`, by request id."""

    def __init__(self, tokenizer: Tokenizer, width: int, eos_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self._width = width
        self._upload = MaskUpload(width)
        self._eos = eos_ids
        self._bytes: list[bytes | None] | None = None
        self._vocab: Vocabulary | None = None
        self._spaces: SpaceTokens | None = None
        self._call_tokens: dict[tuple[bytes, bytes], CallTokens] = {}  # by the tags' text
        self._masks: OrderedDict[tuple[str, str | None, bool], TokenMasks] = OrderedDict()
        self._think = _think_tokens(tokenizer)
        self.by_request: dict[str, Constraint] = {}

    def check(self, spec: StructuredOutput) -> None:
        """Compile (or find) the spec's grammar; ValueError naming what is wrong with it."""
        holds_calls = spec.target == "calls" or spec.calls_schema is not None
        if holds_calls and _call_tags(self._tokenizer, spec.tool_format) is None:
            opening, closing = (t.decode() for t in tag_texts(spec.tool_format))
            raise ValueError(f"structured output: the tokenizer has no {opening} and {closing} tokens")
        self._constraint(spec, (), 0)

    def attach(self, request_id: str, spec: StructuredOutput, stop_ids: Sequence[int], min_tokens: int = 0) -> None:
        """Start constraining a request (its spec was checked by `check`)."""
        self.by_request[request_id] = self._constraint(spec, stop_ids, min_tokens)

    def _constraint(self, spec: StructuredOutput, stop_ids: Sequence[int], min_tokens: int) -> Constraint:
        reasoning = spec.reasoning if spec.reasoning in ("open", "start") else "none"
        eos = self._eos | frozenset(stop_ids)
        rules = CallRules(eos, spec.one_call, min_tokens)
        if spec.target == "calls":
            masks = self._masks_for(spec.schema, spec.tool_format, spec.one_call)
            assert self._bytes is not None
            primed = spec.primed.encode() if spec.primed is not None else None
            calls = self._calls(spec.tool_format)
            return CallConstraint(masks, self._bytes, calls, rules, reasoning, self._think, primed)
        masks = self._masks_for(spec.schema)
        assert self._bytes is not None
        value = OutputConstraint(masks, self._bytes, eos, reasoning, self._think)  # type: ignore[arg-type]
        if spec.calls_schema is None:
            return value
        calls_masks = self._masks_for(spec.calls_schema, spec.tool_format, spec.one_call)
        tokens = self._calls(spec.tool_format)
        calls = CallConstraint(calls_masks, self._bytes, tokens, rules, "none", None)
        return ValueOrCalls(value, calls, tokens.tags.open)

    def wait_for_tokens(self) -> bool:
        """Whether some request's next mask follows the token its step in flight samples."""
        return any(c.waits_for_token() for c in self.by_request.values())

    def release(self, request_id: str) -> None:
        self.by_request.pop(request_id, None)

    def accept(self, request_id: str, token_id: int) -> None:
        c = self.by_request.get(request_id)
        if c is not None:
            try:
                c.accept(token_id)
            except Exception:
                _unconstrain(request_id, c)

    def step_masks(self, rows: Iterable[tuple[str, int | None]], device: torch.device,
                   last_token: torch.Tensor | None = None) -> torch.Tensor | None:
        """bool [B, width] for a step's sampling rows (True: allowed); None when no row is
        masked (at once, without reading the rows, while no request is constrained).

        `rows`: each sampling row's request id and, where the step in flight sampled for
        it (overlap: its constraint hasn't seen that token), its page-table row, whose
        token `last_token` holds on the device. A constraint inside a think block then
        has its mask picked there: the value's first where that token is the close, else
        none (`pending_mask`), so the host needn't wait for the token."""
        if not self.by_request:
            return None
        masks, pending = [], []
        for i, (request_id, behind) in enumerate(rows):
            waiting = self._pending(request_id) if behind is not None and last_token is not None else None
            if waiting is not None:
                pending.append((i, behind, waiting))
            masks.append(None if waiting is not None else self._mask(request_id))
        if not pending and all(m is None for m in masks):
            return None
        allowed = self._upload.rows(masks, device)  # only the masked rows travel, page-locked
        for i, row, (trigger, after) in pending:
            assert last_token is not None
            fired = last_token[row] == trigger  # on the device: no wait for the token
            allowed[i] = torch.where(fired, self._upload.kept(after, device), allowed[i])
        return allowed

    def _pending(self, request_id: str) -> tuple[int, np.ndarray] | None:
        return self._ask(request_id, lambda c: c.pending_mask())

    def _mask(self, request_id: str) -> np.ndarray | None:
        return self._ask(request_id, lambda c: c.mask())

    def _ask(self, request_id: str, question: Callable[[Constraint], Any]) -> Any:
        """A request's constraint's answer; None for an unconstrained request, or one whose
        grammar failed (it goes unconstrained: a grammar bug must not stop the engine)."""
        c = self.by_request.get(request_id)
        if c is None:
            return None
        try:
            return question(c)
        except Exception:
            _unconstrain(request_id, c)
            return None

    def _masks_for(self, text: str | None, tool_format: str = "", one_call: bool = False) -> TokenMasks:
        """The masks of a value's schema text, or (`tool_format` given) of the calls' text;
        `one_call` shapes the grammar only where a block holds several calls (MiniMax's)."""
        spelling = SPELLINGS.get(tool_format)
        key = (tool_format, text, one_call and spelling is not None and spelling.repeats)
        masks = self._masks.get(key)
        if masks is None:
            grammar = (compile_xml_calls(text, tool_format, key[2]) if spelling is not None
                       else PaddedValue(compile_grammar(text)))
            if self._vocab is None:
                self._bytes = grammar_token_bytes(self._tokenizer)
                self._vocab = Vocabulary(self._bytes, self._width)
            masks = TokenMasks(grammar, self._vocab)
            self._masks[key] = masks
            if len(self._masks) > GRAMMARS:
                self._masks.popitem(last=False)
        self._masks.move_to_end(key)
        return masks

    def _calls(self, tool_format: str) -> CallTokens:
        """The format's call tags and the vocabulary's tables for them, built at its first call constraint."""
        texts = tag_texts(tool_format)
        tokens = self._call_tokens.get(texts)
        if tokens is None:
            tags = _call_tags(self._tokenizer, tool_format)
            assert tags is not None and self._bytes is not None
            if self._spaces is None:
                self._spaces = SpaceTokens(self._bytes)
            spelled = SpelledTag(self._bytes, self._width, texts[0])
            tokens = self._call_tokens[texts] = CallTokens(tags, self._spaces, spelled)
        return tokens


def _unconstrain(request_id: str, c: Constraint) -> None:
    """A grammar bug must not stop the engine: the request's output goes unconstrained."""
    log.exception("structured output: request %s's grammar failed; its output is no longer constrained", request_id)
    c.unconstrain()


def _think_tokens(tokenizer: Tokenizer) -> ThinkTokens | None:
    """`<think>` / `</think>` when both are single tokens (Qwen3's family); else None: the
    JSON starts at the first token."""
    open_id, close_id = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
    return ThinkTokens(open_id, close_id) if open_id is not None and close_id is not None else None


def _call_tags(tokenizer: Tokenizer, tool_format: str) -> CallTags | None:
    """The format's call tags (`<tool_call>` / `</tool_call>`, MiniMax's block tags) when
    both are single tokens; else None."""
    open_id, close_id = (tokenizer.token_to_id(t.decode()) for t in tag_texts(tool_format))
    return CallTags(open_id, close_id) if open_id is not None and close_id is not None else None
