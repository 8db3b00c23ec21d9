"""How long a structured output's token mask takes from a cold state (CPU, Qwen3's 151K
vocabulary): each schema's states along an instance, the walk timed without the cache;
then a Qwen3-Coder XML tool call's (structured/xml_calls.py) along a call.

    PYTHONPATH=src python3 scripts/structured_mask_times.py
"""

from __future__ import annotations

import time

from tokenizers import Tokenizer

from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json
from edgemoe.structured import Grammar
from edgemoe.structured.constraint import PaddedValue
from edgemoe.structured.token_masks import TokenMasks
from edgemoe.structured.vocab import Vocabulary, grammar_token_bytes
from edgemoe.structured.xml_tools import xml_calls

CASES = {
    "object, free strings, numbers": ({"type": "object", "properties": {"name": {"type": "string"}, "n": {
        "type": "number"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}},
        '{"name": "Zoë q", "n": -12.5e3, "tags": ["a", "b"]}'),
    "string maxLength 40": ({"type": "string", "maxLength": 40}, '"Zoë 中文 and more"'),
    "anyOf string | string maxLength 10": ({"anyOf": [{"type": "string"}, {"type": "string", "maxLength": 10}]},
                                           '"abcé"'),
    "any JSON object": (None, '{"a": [1, {"b": null}], "c": "d"}'),
    "bounded numbers": ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 500},
                                                       "x": {"type": "number", "exclusiveMinimum": 0}}},
                        '{"n": 250, "x": 0.125}'),
    "date-time and a pattern": ({"type": "array", "items": {"anyOf": [
        {"type": "string", "format": "date-time"}, {"type": "string", "pattern": "^[A-Z]{2}-\\d+$"}]}},
        '["2024-05-06T07:08:09Z", "AB-12"]'),
    "unanchored pattern": ({"type": "string", "pattern": "needle"}, '"a needle here"'),
}
XML_TOOL = ["write_file", {"type": "object", "required": ["path", "content"], "properties": {
    "path": {"type": "string", "maxLength": 200}, "content": {"type": "string"},
    "mode": {"enum": ["create", "append"]}, "lines": {"type": "array", "items": {"type": "integer"}}}}, True]
XML_CALL = ('\n<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n<parameter=content>\n'
            'def f(x: int) -> str:\n    return "<b>" + str(x)\n\n</parameter>\n<parameter=lines>\n[1, 20]\n'
            '</parameter>\n</function>\n')


def report(name: str, grammar: object, start: object, text: str, vocab: Vocabulary) -> None:
    """The cold mask time of each state along `text` from `start`."""
    state, times = start, []
    for b in text.encode():
        state = grammar.advance(state, b)  # type: ignore[attr-defined]
        t = time.perf_counter()
        TokenMasks(grammar, vocab).allowed(state)  # type: ignore[arg-type]  # a fresh cache: the cold cost
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    print(f"{name}: {len(times)} states, median {times[len(times) // 2]:.1f} ms, max {times[-1]:.1f} ms")


def main() -> None:
    t0 = time.perf_counter()
    token_bytes = grammar_token_bytes(Tokenizer.from_file(str(qwen3_tokenizer_json())))
    vocab = Vocabulary(token_bytes, len(token_bytes))
    print(f"vocabulary trie: {vocab.num_nodes} nodes, built in {time.perf_counter() - t0:.2f} s")
    for name, (schema, text) in CASES.items():
        lead = PaddedValue(Grammar.json_object() if schema is None else Grammar.from_schema(schema))
        report(name, lead, lead.start(), text, vocab)
    calls = xml_calls([XML_TOOL])
    report("qwen3_coder XML call (free, bounded, enum, JSON values)", calls, calls.start(), XML_CALL, vocab)


if __name__ == "__main__":
    main()
