"""Qwen3-Coder XML tool calls held to their tools' schemas (structured/xml_calls.py,
xml_value.py, xml_tools.py), against independent references: every call the grammar
lets through, read by the server's own qwen3_coder parser, has arguments valid for the
tool's schema (`jsonschema_rs`); what the Qwen3.5 template writes for valid arguments is
accepted; and the token masks equal feeding each token's bytes on their own."""

from __future__ import annotations

import json
import random

import jsonschema_rs
import numpy as np
import pytest
from grammar_support import CASES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mask_support import brute_force, qwen_vocab

from edgemoe.assets.chat_template import QWEN3_5_CHAT_TEMPLATE
from edgemoe.server.parsers import ResponseParser
from edgemoe.server.parsers.qwen3_coder import Qwen3CoderToolParser
from edgemoe.server.templates import ChatTemplate
from edgemoe.structured.errors import GrammarError
from edgemoe.structured.token_masks import TokenMasks
from edgemoe.structured.xml_calls import XmlCalls
from edgemoe.structured.xml_tools import xml_calls, xml_tool

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"], "properties": {
    "city": {"type": "string"},
    "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "opts": {"type": ["object", "null"], "properties": {"a": {"type": "boolean"}, "n": {"type": "number"}},
             "additionalProperties": False},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3}},
    "$defs": {"tag": {"type": "string", "enum": ["x", "y<z", "</parameter"]}}}
NOTE = {"type": "object", "required": ["text", "tag"], "properties": {
    "text": {"type": "string", "maxLength": 6},
    "tag": {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "null"}]},
    "body": {"type": "string", "minLength": 1},
    "anything": {}}}
EMPTY = {"type": "object", "properties": {}}
TOOLS = [("get_weather", WEATHER), ("note", NOTE), ("ping", EMPTY), ("noargs", None)]
OPENAI_TOOLS = [{"type": "function", "function": {"name": n, "parameters": p or {"type": "object"}}} for n, p in TOOLS]
FRAGMENTS = [b"</parameter>", b"\n</parameter>\n", b"\n</parameter>", b"<parameter=", b"</function>", b"\n",
             b"null", b"NULL", b'"', b"\\", b"<", b"\t", "é中".encode(), b"5", b"-1.5", b"true", b"{", b"}",
             b"[", b"]", b",", b":", b">", b" ", b'"a"', b"city", b"days", b"text", b"tag", b"body", b"get_weather",
             b"note", b"ping", b"<function=", b"y<z", b"\n<parameter=tag>\n"]


@pytest.fixture(scope="module")
def calls() -> XmlCalls:
    return XmlCalls([xml_tool(name, parameters, strict=True) for name, parameters in TOOLS])


def parse(text: bytes) -> list:
    parser = Qwen3CoderToolParser(OPENAI_TOOLS, lambda: "id")
    parsed = ResponseParser(None, parser).parse_complete("<tool_call>" + text.decode("utf-8", "replace") + "</tool_call>")
    assert not parsed.content.strip(), parsed
    return parsed.tool_calls


def random_call(calls: XmlCalls, rng: random.Random, limit: int = 500,
                fragments: list[bytes] = FRAGMENTS) -> bytes | None:
    """A call the grammar accepts, grown from `fragments` and bytes it allows (None if it ran
    past `limit`). Every state on the way allows some byte or is complete: no dead end."""
    state, out = calls.start(), bytearray()
    while len(out) < limit:
        allowed = [b for b in range(256) if calls.advance(state, b) is not None]
        if calls.is_complete(state) and (not allowed or rng.random() < 0.3):
            return bytes(out)
        assert allowed, (bytes(out), state)
        pieces = [f for f in fragments if calls.advance_bytes(state, f) is not None] if rng.random() < 0.5 else []
        piece = rng.choice(pieces) if pieces else bytes([rng.choice(allowed)])
        state = calls.advance_bytes(state, piece)
        out += piece
    return None


def test_random_calls_parse_to_valid_arguments(calls: XmlCalls) -> None:
    rng = random.Random(7)
    schemas = {n: p or {"type": "object"} for n, p in TOOLS}
    made = 0
    for _ in range(240):
        text = random_call(calls, rng)
        if text is None:
            continue
        got = parse(text)
        assert len(got) == 1, text
        arguments = json.loads(got[0].arguments)
        assert jsonschema_rs.is_valid(schemas[got[0].name], arguments), (text, arguments)
        made += 1
    assert made > 150


VALID = [
    ("get_weather", {"city": "Zoë \"q\" \\ <b>x</b>\n\nline </param", "days": 3, "unit": "f",
                     "opts": {"a": True, "n": -1.5e3}, "tags": ["y<z", "</parameter"]}),
    ("get_weather", {"days": 7, "city": "", "opts": None}),
    ("get_weather", {"city": "\n", "days": 1}),
    ("note", {"text": "中文é\tx", "tag": None, "body": "</function>\n</tool_call>", "anything": "free text"}),
    ("note", {"tag": "abc", "text": "null", "anything": {"k": [1, None]}}),
    ("ping", {}),
    ("noargs", {}),
]


@pytest.mark.parametrize("name, arguments", VALID)
def test_what_the_template_writes_is_accepted(calls: XmlCalls, name: str, arguments: dict) -> None:
    """The Qwen3.5 template's own rendering of a valid call (the model's habit) passes, and
    the parser reads the arguments back."""
    template = ChatTemplate(QWEN3_5_CHAT_TEMPLATE)
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}]}
    text = template.render([{"role": "user", "content": "hi"}, turn], tools=OPENAI_TOOLS)
    body = text[text.rindex("<tool_call>") + len("<tool_call>"):text.rindex("</tool_call>")].encode()
    state = calls.advance_bytes(calls.start(), body)
    assert state is not None and calls.is_complete(state), body
    got = parse(body)
    assert json.loads(got[0].arguments) == arguments


@pytest.mark.parametrize("body", [
    b"\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n",  # city is required
    b"\n<function=get_weather>\n<parameter=city>\na\n</parameter>\n<parameter=days>\n8\n</parameter>\n",
    b"\n<function=get_weather>\n<parameter=city>\na\n</parameter>\n<parameter=city>\n",  # twice
    b"\n<function=get_weather>\n<parameter=city>\na</parameter>\n<parameter=",  # content holds the tag
    b"\n<function=note>\n<parameter=text>\n1234567\n",  # maxLength 6
    b"\n<function=note>\n<parameter=tag>\nAb\n</parameter>",  # the pattern
    b"\n<function=get_weather>\n<parameter=unit>\nk\n",
    b"\n<function=get_weather>\n<parameter=days>\n\"3\"",  # JSON, not a string
    b"\n<function=nope>",
    b"\n<function=ping>\n<parameter=x>",  # no such key
])
def test_invalid_calls_are_refused(calls: XmlCalls, body: bytes) -> None:
    state = calls.advance_bytes(calls.start(), body)
    assert state is None or not calls.is_complete(state)
    if state is not None:  # it stops short: the last part can't be completed as written
        assert body.endswith(b"\n")


@pytest.mark.parametrize("parameters, where", [
    ({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}, "properties.a"),
    ({"type": "object", "properties": {"a": {"enum": ["x", 1]}}}, "properties.a"),
    ({"type": "object", "properties": {"a": {"type": "string", "enum": ["x", None]}}}, "properties.a"),
    ({"type": "object", "properties": {"a": {"not": {}}}}, "properties.a"),
    ({"anyOf": [{"type": "object"}]}, "anyOf"),
    ({"type": "object", "properties": {"a<b": {"type": "string"}}}, ""),
    ({"type": "object", "required": ["b"], "properties": {"a": {}}}, "required"),
    ({"type": "object", "required": [["a"]], "properties": {"a": {}}}, ""),  # was a TypeError: a 500
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, "allOf"),  # the parser merges later-wins
    ({"$ref": "#/$defs/A", "required": ["b"], "$defs": {"A": {"type": "object", "properties": {"b": {}}}}}, "required"),
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}, "properties.x"),
    ({"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}}, "properties.x"),
    ({"type": "object", "properties": {  # past the parser's typing budget: it would read values untyped
        "a": {"type": "object", "allOf": [{"properties": {f"p{i}_{j}": {"type": "integer"} for j in range(40)}}
                                          for i in range(40)]}, "b": {"type": "integer"}}}, "properties"),
])
def test_schemas_that_cannot_be_held(parameters: dict, where: str) -> None:
    with pytest.raises(GrammarError) as info:
        xml_tool("t", parameters, strict=True)
    assert info.value.path.startswith(where)
    loose = xml_tool("t", parameters, strict=False)  # not strict: its keys, any text, none required
    assert loose.required == 0


def test_masks_equal_brute_force_along_a_call(calls: XmlCalls) -> None:
    """At every kind of state — tags, names, keys, raw strings (free, bounded, pattern,
    enum), held closing prefixes, JSON values — the walk (raw text's own free bytes) gives
    exactly the tokens whose bytes the grammar takes one by one."""
    token_bytes, vocab = qwen_vocab()
    masks = TokenMasks(calls, vocab)
    body = ("\n<function=note>\n<parameter=body>\nZoë \"q\" \\ <b>\t</para\n</param x\n\n</parameter>\n"
            "<parameter=text>\naé\"c\n</parameter>\n<parameter=tag>\nnull\n</parameter>\n"
            "<parameter=anything>\n{\"a\": 1}\n</parameter>\n</function>\n").encode()
    rng = random.Random(3)
    cuts = sorted(rng.sample(range(1, len(body)), 24))
    kinds = set()
    for cut in cuts:
        state = calls.advance_bytes(calls.start(), body[:cut])
        assert state is not None, body[:cut]
        kinds.add((state[0], calls.free_string(state), calls.string_room(state) is not None))
        got = masks.allowed(state)
        assert np.array_equal(got, brute_force(calls, state, token_bytes, vocab.width)), body[:cut]
    assert len(kinds) >= 5, kinds


def test_a_raw_value_mask_is_fast(calls: XmlCalls) -> None:
    """A free raw string's mask skips its free tokens (RAW_FREE's class of the trie), as a
    JSON string's does: a few thousand nodes visited, not the whole vocabulary."""
    from edgemoe.structured.token_masks import _Walk

    _, vocab = qwen_vocab()
    state = calls.advance_bytes(calls.start(), b"\n<function=get_weather>\n<parameter=city>\nPar")
    explicit, ranges = _Walk(calls, vocab).run(state)
    assert len(explicit) < vocab.num_nodes // 20 and ranges


def test_primed_openings(calls: XmlCalls) -> None:
    """A forced call's prompt ends in `<function` (any tool) or `<function=NAME>\\n` (named)."""
    assert calls.advance_bytes(calls.start(), b"\n<function") is not None
    named = calls.advance_bytes(calls.start(), b"\n<function=note>\n")
    assert named is not None and calls.advance_bytes(named, b"<parameter=text>\n") is not None


@pytest.mark.parametrize("parameters, text", [
    ({"type": "object", "properties": {"x": {"enum": ["a</parameter>b", "c"]}}}, b"a</parameter"),
    ({"type": "object", "properties": {"x": {"type": "string", "const": "</parameter>"}}}, b"</parameter"),
    ({"type": "object", "properties": {"x": {"type": "array", "items": {"const": "</parameter>"}}}}, b'["</parameter'),
])
def test_a_value_the_closing_tag_would_complete_is_no_dead_end(parameters: dict, text: bytes) -> None:
    """A member holding `</parameter>` can't be written (the parser would end the value
    there): its prefix is refused where it would leave no byte, not accepted into a dead end."""
    calls = XmlCalls([xml_tool("f", parameters, strict=True)])
    state = calls.advance_bytes(calls.start(), b"<function=f>\n<parameter=x>\n" + text)
    assert state is None or any(calls.advance(state, b) is not None for b in range(256))


def test_a_non_strict_tool_a_tag_cannot_name_is_left_out() -> None:
    """Its calls can't be written (nor read), so it is not held; the others are."""
    calls = xml_calls([["bad name ", {"type": "object"}, False], ["a<b", None, False], ["g", {"type": "object"}, True]])
    assert [t.name for t in calls.tools] == [b"g"]
    with pytest.raises(GrammarError):
        xml_calls([["bad name ", {"type": "object"}, True]])


def test_an_enum_member_reads_back_as_written() -> None:
    """" a" and "a" both members: the raw text " a" is " a" (the parser tried the stripped
    text first and read "a", which the minLength refused)."""
    schema = {"type": "object", "properties": {"x": {"enum": ["a", " a"], "minLength": 2}}, "required": ["x"]}
    calls = XmlCalls([xml_tool("f", schema, strict=True)])
    body = b"\n<function=f>\n<parameter=x>\n a\n</parameter>\n</function>\n"
    state = calls.advance_bytes(calls.start(), body)
    assert state is not None and calls.is_complete(state)
    parser = Qwen3CoderToolParser([{"type": "function", "function": {"name": "f", "parameters": schema}}], lambda: "id")
    got = ResponseParser(None, parser).parse_complete("<tool_call>" + body.decode() + "</tool_call>").tool_calls
    assert json.loads(got[0].arguments) == {"x": " a"}


PARAMETER_CASES = [c for c in CASES if isinstance(c.schema, dict) and "$ref" not in json.dumps(c.schema)]


@pytest.mark.parametrize("case", PARAMETER_CASES, ids=[c.name for c in PARAMETER_CASES])
def test_the_grammar_battery_as_parameters(case) -> None:  # noqa: ANN001
    """Each schema of the JSON grammar's battery as a parameter (and twice, as a required
    one beside an optional string): refused with a GrammarError, or every random call the
    grammar lets through reads back (the qwen3_coder parser) as valid arguments."""
    validate = case.validate if case.validate is not None else case.schema
    parameters = {"type": "object", "properties": {"p": case.schema, "s": {"type": "string", "maxLength": 3}},
                  "required": ["p"]}
    try:
        calls = XmlCalls([xml_tool("t", parameters, strict=True)])
    except GrammarError:
        return
    check = jsonschema_rs.validator_for({**parameters, "properties": {"p": validate, "s": parameters["properties"]["s"]}})
    tools = [{"type": "function", "function": {"name": "t", "parameters": parameters}}]
    rng, made = random.Random(case.name), 0
    for _ in range(40):
        text = random_call(calls, rng, limit=300)
        if text is None:
            continue
        parser = Qwen3CoderToolParser(tools, lambda: "id")
        got = ResponseParser(None, parser).parse_complete("<tool_call>" + text.decode("utf-8", "replace") + "</tool_call>")
        assert len(got.tool_calls) == 1 and not got.content.strip(), text
        arguments = json.loads(got.tool_calls[0].arguments)
        assert check.is_valid(arguments), (text, arguments)
        made += 1
    assert made >= 5


JUNK = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, allow_infinity=False),
              st.sampled_from(["string", "integer", "object", "array", "null", "number", "boolean", "#", "#/$defs/a",
                               "</parameter>", "a<b", "", " x"])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["type", "properties", "required", "enum", "const", "items", "anyOf", "allOf",
                                         "oneOf", "$ref", "$defs", "minLength", "maxLength", "minimum",
                                         "exclusiveMaximum", "multipleOf", "pattern", "nullable", "format",
                                         "additionalProperties", "p", "a<b", "x"]), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(parameters=JUNK, strict=st.booleans())
def test_hostile_parameters_are_refused_cleanly(parameters: object, strict: bool) -> None:
    """Whatever a client sends as a tool's parameters, the XML grammar is built or refused
    with a GrammarError (a 400 at the server), never another exception (a 500)."""
    try:
        tool = xml_tool("t", parameters, strict=strict)
    except GrammarError:
        assert strict
        return
    if tool is not None:
        random_call(XmlCalls([tool]), random.Random(0), limit=200)  # asserts no state on the way is a dead end


@pytest.mark.parametrize("written, value", [(b"True", True), (b"false", False), (b"null", None)])
def test_booleans_as_either_template_writes_them(written: bytes, value: object) -> None:
    """Qwen3-Coder's template writes a boolean with Python's str (`True`), Qwen3.5's with
    tojson (`true`): both are taken and read back as the boolean."""
    schema = {"type": "object", "properties": {"on": {"type": ["boolean", "null"]}}, "required": ["on"]}
    calls = XmlCalls([xml_tool("f", schema, strict=True)])
    body = b"\n<function=f>\n<parameter=on>\n" + written + b"\n</parameter>\n</function>\n"
    state = calls.advance_bytes(calls.start(), body)
    assert state is not None and calls.is_complete(state)
    parser = Qwen3CoderToolParser([{"type": "function", "function": {"name": "f", "parameters": schema}}], lambda: "id")
    got = ResponseParser(None, parser).parse_complete("<tool_call>" + body.decode() + "</tool_call>").tool_calls
    assert json.loads(got[0].arguments) == {"on": value}
    assert calls.advance_bytes(calls.start(), body.replace(written, b"yes")) is None
