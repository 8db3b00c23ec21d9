"""Shared checks for the parser tests: run a parser over chunkings, compare with one shot."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from edgemoe.server.parsers import ResponseParser, ThinkReasoningParser, get_tool_parser
from edgemoe.server.parsers.base import ParsedDelta, ParsedMessage, accumulate

MakeParser = Callable[[], ResponseParser]


def counter_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def maker(
    tool_parser: str | None,
    tools: Sequence[dict[str, Any]] | None = None,
    reasoning: bool | None = None,
) -> MakeParser:
    """``reasoning``: None = no reasoning parser, else its ``starts_in_reasoning``."""

    def make() -> ResponseParser:
        tp = get_tool_parser(tool_parser)(tools, counter_ids()) if tool_parser else None
        rp = ThinkReasoningParser(starts_in_reasoning=reasoning) if reasoning is not None else None
        return ResponseParser(rp, tp)

    return make


def stream(make: MakeParser, chunks: Sequence[str]) -> ParsedMessage:
    parser = make()
    deltas = [parser.feed(c) for c in chunks] + [parser.finish()]
    check_deltas(deltas)
    message = accumulate(deltas)
    assert parser.tool_calls_emitted == len(message.tool_calls)
    return message


def check_deltas(deltas: Sequence[ParsedDelta]) -> None:
    """Stream shape clients rely on: id/name on a call's first piece only, 0-based
    contiguous indices in order, and each call's arguments a JSON object."""
    seen: dict[int, str] = {}
    for delta in deltas:
        for piece in delta.tool_calls:
            if piece.index not in seen:
                assert piece.index == len(seen), "indices are contiguous and in order"
                assert piece.id and piece.name, "first piece carries id and name"
                seen[piece.index] = piece.arguments
            else:
                assert piece.id is None and piece.name is None
                assert piece.index == len(seen) - 1, "only the newest call grows"
                seen[piece.index] += piece.arguments
    for args in seen.values():
        assert isinstance(json.loads(args), dict), args


def single_splits(text: str) -> Iterator[list[str]]:
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]


def pair_splits(text: str) -> Iterator[list[str]]:
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            yield [text[:i], text[i:j], text[j:]]


def chunks_at(text: str, cuts: Sequence[int]) -> list[str]:
    points = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in zip(points, points[1:])]


def assert_chunking_invariant(make: MakeParser, text: str, pairs_up_to: int = 200) -> ParsedMessage:
    """Every single split, every pair of splits (short texts) and per-character
    feeding give exactly the one-shot result; returns that result."""
    whole = make().parse_complete(text)
    splits: Iterator[list[str]] = single_splits(text)
    if len(text) <= pairs_up_to:
        splits = itertools.chain(splits, pair_splits(text))
    for chunks in itertools.chain(splits, [list(text)]):
        got = stream(make, chunks)
        assert got == whole, f"chunks={chunks!r}"
    return whole


def summary(message: ParsedMessage) -> tuple[str, str, list[tuple[str, Any]]]:
    """(content, reasoning, [(name, arguments as dict)]) for readable expectations."""
    calls = [(c.name, json.loads(c.arguments)) for c in message.tool_calls]
    return message.content, message.reasoning, calls


# A tool's parameters of every type, values as the XML formats write them, and what they
# read as (glm45, minimax_m2: strings raw, anything else as JSON).
TYPED_PROPERTIES: dict[str, Any] = {
    "city": {"type": "string"},
    "days": {"type": "integer"},
    "scale": {"type": "number"},
    "dry_run": {"type": "boolean"},
    "opts": {"type": "object"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "line": {"type": ["integer", "null"]},
    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "text": {"type": "string"},
}
TYPED_PAIRS = [("city", "San Francisco"), ("days", "3"), ("scale", "2.5"), ("dry_run", "false"),
               ("opts", '{"a": [1, "ü"]}'), ("tags", '["x", "y"]'), ("line", "null"), ("note", "null"),
               ("text", '{"looks": "like JSON"}')]
TYPED_ARGS = {"city": "San Francisco", "days": 3, "scale": 2.5, "dry_run": False, "opts": {"a": [1, "ü"]},
              "tags": ["x", "y"], "line": None, "note": None, "text": '{"looks": "like JSON"}'}

Written = Callable[[random.Random], tuple[str, list[dict[str, Any]]]]


def fuzz_written_and_damaged(make: MakeParser, written: Written, damage: Sequence[str], seed: int,
                             rounds: int = 150) -> None:
    """Fixed-seed fuzz: `written(rnd)` gives the text of calls to "f" as a template writes them
    and their arguments; prose goes around them, then random `damage`. Undamaged, the calls read
    back exactly; always, streamed (char by char, and at random cuts) equals one shot."""
    rnd = random.Random(seed)
    for _ in range(rounds):
        parts = [written(rnd) for _ in range(rnd.randint(0, 2))]
        text = "".join(rnd.choice(["", "Ok.\n", "a <b> c\n"]) + t for t, _ in parts)
        damaged = rnd.random() < 0.5
        for _ in range(rnd.randint(1, 2) if damaged else 0):
            i = rnd.randint(0, len(text))
            text = text[:i] + rnd.choice(damage) + text[i + rnd.randint(0, 3):]
        whole = make().parse_complete(text)
        if not damaged:
            expected = [("f", args) for _, calls in parts for args in calls]
            assert expected == [(c.name, json.loads(c.arguments)) for c in whole.tool_calls]
        for chunks in (list(text), chunks_at(text, [rnd.randint(0, len(text)) for _ in range(8)])):
            assert stream(make, chunks) == whole, chunks
