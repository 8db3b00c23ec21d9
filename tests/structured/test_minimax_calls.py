"""MiniMax-M2 tool-call blocks held to their tools' schemas (structured/xml_calls.py in
the MINIMAX_M2 spelling, xml_value.py, xml_tools.py), against independent references:
what MiniMax-M2's own chat template writes for valid arguments is accepted and the
server's minimax_m2 parser reads it back; every block the grammar lets through reads back
(that parser) as calls whose arguments are valid for the tool's schema (`jsonschema_rs`);
hand-written invalid blocks are refused at the very byte that breaks them; and the token
masks equal feeding each token's bytes on their own."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema_rs
import numpy as np
import pytest
from mask_support import brute_force, qwen_vocab
from test_xml_calls import random_call

from edgemoe.server.parsers import ResponseParser
from edgemoe.server.parsers.minimax_m2 import MiniMaxM2ToolParser
from edgemoe.server.templates import ChatTemplate
from edgemoe.structured.constraint import LEAD_SPACE
from edgemoe.structured.errors import GrammarError
from edgemoe.structured.token_masks import TokenMasks
from edgemoe.structured.xml_calls import GAP, MINIMAX_M2, QWEN3_CODER, VALUE, XmlCalls
from edgemoe.structured.xml_tools import xml_calls, xml_tool

TEMPLATE = ChatTemplate((Path(__file__).parents[1] / "server" / "fixtures" / "minimax_m2_chat_template.jinja")
                        .read_text(encoding="utf-8"))
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"], "properties": {
    "city": {"type": "string"},
    "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "on": {"type": "boolean"},
    "opts": {"type": ["object", "null"], "properties": {"n": {"type": "number"}}, "additionalProperties": False},
    "tags": {"type": "array", "items": {"enum": ["x", "y<z"]}, "maxItems": 3}}}
NOTE = {"type": "object", "required": ["text"], "properties": {
    "text": {"type": "string", "maxLength": 6},
    "tag": {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "null"}]},
    "anything": {}}}
TOOLS = [("get_weather", WEATHER), ("note", NOTE), ("ping", None)]
OPENAI_TOOLS = [{"type": "function", "function": {"name": n, "parameters": p or {"type": "object"}}} for n, p in TOOLS]
FRAGMENTS = [b"</parameter>", b"</parameter>\n", b'<parameter name="', b"</invoke>", b"</invoke>\n",
             b'<invoke name="', b'">', b"\n", b" ", b"null", b"true", b"True", b"5", b"-1.5", b"{", b"}", b"[",
             b"]", b'"', b"<", b"\\", "é中".encode(), b"city", b"days", b"text", b"tag", b"get_weather", b"note",
             b"ping", b"y<z"]


def held(one_call: bool = False) -> XmlCalls:
    return xml_calls([[name, parameters, True] for name, parameters in TOOLS], MINIMAX_M2, one_call)


def parse(body: bytes) -> list:
    """The calls the minimax_m2 parser reads from the block around `body`; nothing else."""
    parser = MiniMaxM2ToolParser(OPENAI_TOOLS, lambda: "id")
    text = "<minimax:tool_call>" + body.decode("utf-8", "replace") + "</minimax:tool_call>"
    parsed = ResponseParser(None, parser).parse_complete(text)
    assert not parsed.content.strip(), parsed
    return parsed.tool_calls


def accepts(calls: XmlCalls, body: bytes) -> bool:
    state = calls.advance_bytes(calls.start(), body)
    return state is not None and calls.is_complete(state)


def template_block(calls: list[tuple[str, dict]]) -> bytes:
    """What MiniMax-M2's template writes between the block's tags for these calls."""
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]}
    text = TEMPLATE.render([{"role": "user", "content": "hi"}, turn], tools=OPENAI_TOOLS, add_generation_prompt=False)
    return text[text.rindex("<minimax:tool_call>") + len("<minimax:tool_call>"):text.rindex("</minimax:tool_call>")
                ].encode()


VALID = [
    [("get_weather", {"city": "  Zoë \"q\" \\ <b>x</b>\n\nline </param\n", "days": 3, "unit": "f", "on": False,
                      "opts": {"n": -1.5e3}, "tags": ["y<z", "x"]})],
    [("get_weather", {"days": 7, "city": "", "opts": None})],
    [("note", {"text": "中文é\tx", "tag": None, "anything": "free </invoke> text"}),
     ("note", {"tag": "abc", "text": "null", "anything": {"k": [1, None]}}), ("ping", {})],
]


@pytest.mark.parametrize("calls", VALID)
def test_what_the_template_writes_is_accepted_and_reads_back(calls: list[tuple[str, dict]]) -> None:
    """A string value verbatim (its spaces and newlines kept), any other as JSON, several
    invokes in one block: the template's own rendering passes and the parser reads it back."""
    body = template_block(calls)
    assert accepts(held(), body), body
    assert [(c.name, json.loads(c.arguments)) for c in parse(body)] == calls
    assert accepts(held(one_call=True), body) == (len(calls) == 1)


def test_random_blocks_parse_to_valid_calls() -> None:
    calls, rng, made, parallel = held(), random.Random(11), 0, 0
    schemas = {n: p or {"type": "object"} for n, p in TOOLS}
    for _ in range(200):
        body = random_call(calls, rng, fragments=FRAGMENTS)
        if body is None:
            continue
        got = parse(body)
        assert got, body
        for call in got:
            assert jsonschema_rs.is_valid(schemas[call.name], json.loads(call.arguments)), (body, call)
        made, parallel = made + 1, parallel + (len(got) > 1)
    assert made > 120 and parallel > 10


W = b'\n<invoke name="get_weather">\n'
CITY = b'<parameter name="city">Paris</parameter>\n'


@pytest.mark.parametrize("body", [
    b'\n<invoke name="get_weathe>',  # not a tool's name
    b'\n<invoke name="nop',
    b"\n<invoke name='",  # the parser reads single quotes, the grammar holds the template's spelling
    b'\n<invoke name=" ',  # nor blanks around the name
    b"\n<f",  # Qwen3-Coder's `<function=`
    W + b'<parameter name="days">3</parameter>\n</',  # city is required before </invoke>
    W + CITY + b'<parameter name="c',  # a key twice
    W + CITY + b'<parameter name="x',  # no such key
    W + b'<parameter name="days">"',  # an integer, not a string
    W + b'<parameter name="days">8',  # maximum 7
    W + b'<parameter name="unit">k',
    W + b'<parameter name="city">a</parameter>x',  # text after a value's closing tag
    W + b'<parameter name="on">y',
    b'\n<invoke name="ping">\n</invoke>\nx',  # text after an invoke
    b'\n<invoke name="note">\n<parameter name="text">1234567',  # maxLength 6
    b'\n<invoke name="note">\n<parameter name="tag">A',  # the pattern
    b'\n<invoke name="ping">\n<p',  # ping has no parameter
    W + b" " * LEAD_SPACE,  # whitespace past LEAD_SPACE
])
def test_invalid_blocks_are_refused_at_the_breaking_byte(body: bytes) -> None:
    calls = held()
    assert calls.advance_bytes(calls.start(), body[:-1]) is not None, body[:-1]
    assert calls.advance_bytes(calls.start(), body) is None


def test_a_value_never_holds_the_closing_tag() -> None:
    """`</parameter>` ends a value wherever it may end (the parser would end it there);
    where the value can't end yet (no JSON value written), the tag is refused."""
    calls = held()
    state = calls.advance_bytes(calls.start(), W + b'<parameter name="city">a</parameter')
    assert state is not None and state[0] == VALUE and calls.advance(state, ord(">"))[0] == GAP
    assert calls.advance_bytes(calls.start(), W + b'<parameter name="days"></parameter>') is None
    assert calls.advance_bytes(calls.start(), W + b'<parameter name="city">a\n</parameter>\n') is not None


def test_whitespace_between_tags() -> None:
    """None at all or up to LEAD_SPACE bytes where the parser skips whitespace."""
    tight = b'<invoke name="ping"></invoke><invoke name="note"><parameter name="text">a</parameter></invoke>'
    assert accepts(held(), tight) and [c.name for c in parse(tight)] == ["ping", "note"]
    loose = b' \n\t<invoke name="ping">\r\n </invoke>  \n'
    assert accepts(held(), loose) and [c.name for c in parse(loose)] == ["ping"]
    assert not accepts(held(), b"\n"), "a block holds a call"
    assert not accepts(held(), W + CITY), "an invoke is complete at its closing tag"


def test_one_call_holds_the_block_to_one_invoke() -> None:
    one = held(one_call=True)
    first = one.advance_bytes(one.start(), b'\n<invoke name="ping">\n</invoke>\n')
    assert first is not None and one.is_complete(first)
    assert one.advance(first, ord("<")) is None and one.advance(first, ord(" ")) is not None
    many = held()
    assert many.advance(many.advance_bytes(many.start(), b'\n<invoke name="ping">\n</invoke>\n'), ord("<"))


@pytest.mark.parametrize("written, value", [(b"true", True), (b"False", False), (b"null", None)])
def test_booleans_as_the_parser_reads_them(written: bytes, value: object) -> None:
    schema = {"type": "object", "properties": {"on": {"type": ["boolean", "null"]}}, "required": ["on"]}
    calls = XmlCalls([xml_tool("f", schema, True, MINIMAX_M2)], MINIMAX_M2)
    body = b'<invoke name="f"><parameter name="on">' + written + b"</parameter></invoke>"
    assert accepts(calls, body)
    parser = MiniMaxM2ToolParser([{"type": "function", "function": {"name": "f", "parameters": schema}}], lambda: "i")
    got = ResponseParser(None, parser).parse_complete(f"<minimax:tool_call>{body.decode()}</minimax:tool_call>")
    assert json.loads(got.tool_calls[0].arguments) == {"on": value}
    assert not accepts(calls, body.replace(written, b"yes"))


def test_names_and_keys_an_attribute_can_carry() -> None:
    """A quote ends MiniMax's `name="…"` (Qwen3-Coder's `<function=…>` carries one), and
    its parser reads at most 256 characters of a name: a strict tool beyond that can't be held."""
    quoted = {"type": "object", "properties": {"it's": {"type": "string"}}}
    assert xml_tool("f", quoted, True, QWEN3_CODER) is not None
    for name, parameters in (("f", quoted), ('say"hi', None), ("x" * 257, None)):
        with pytest.raises(GrammarError):
            xml_tool(name, parameters, True, MINIMAX_M2)
    assert xml_tool("x" * 256, None, True, MINIMAX_M2) is not None
    loose = xml_tool("f", quoted, False, MINIMAX_M2)  # not strict: held without the key it can't write
    assert loose is not None and loose.keys == ()
    assert xml_tool('say"hi', None, False, MINIMAX_M2) is None


def test_values_built_for_one_spelling_are_refused_by_the_other() -> None:
    with pytest.raises(ValueError, match="another spelling"):
        XmlCalls([xml_tool("note", NOTE, True, QWEN3_CODER)], MINIMAX_M2)


def test_masks_equal_brute_force_along_a_block() -> None:
    """At every kind of state — tags, names, keys, raw strings (free: newlines are content
    here; bounded; pattern), held closing prefixes, JSON values, between invokes — the walk
    gives exactly the tokens whose bytes the grammar takes one by one."""
    token_bytes, vocab = qwen_vocab()
    calls = held()
    masks = TokenMasks(calls, vocab)
    body = template_block([("get_weather", {"city": "Zoë \"q\"\n\n <b>\t</para\n</param x", "days": 2,
                                            "tags": ["x"]}), ("note", {"text": "a\né", "tag": None})])
    rng = random.Random(5)
    kinds = set()
    for cut in sorted(rng.sample(range(1, len(body)), 28)):
        state = calls.advance_bytes(calls.start(), body[:cut])
        assert state is not None, body[:cut]
        kinds.add((state[0], calls.free_string(state), calls.string_room(state) is not None))
        assert np.array_equal(masks.allowed(state), brute_force(calls, state, token_bytes, vocab.width)), body[:cut]
    assert len(kinds) >= 6, kinds


def test_a_free_raw_value_keeps_newlines_free() -> None:
    """MiniMax's string value closes at `</parameter>` alone: a newline is a free byte
    there (only `<` may begin the tag), unlike Qwen3-Coder's, closed at `\\n</parameter>`."""
    calls = held()
    state = calls.advance_bytes(calls.start(), W + b'<parameter name="city">Par')
    assert calls.free_string(state) and calls.free_table(state)[ord("\n")] and not calls.free_table(state)[ord("<")]
    qwen = XmlCalls([xml_tool("get_weather", WEATHER, True)])
    state = qwen.advance_bytes(qwen.start(), b"\n<function=get_weather>\n<parameter=city>\nPar")
    assert qwen.free_string(state) and not qwen.free_table(state)[ord("\n")]
