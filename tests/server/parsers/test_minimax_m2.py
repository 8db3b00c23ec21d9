"""MiniMax-M2 tool calls: typed values, several invokes, malformed text, chunking."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from parsers_harness import TYPED_ARGS, TYPED_PAIRS, TYPED_PROPERTIES, fuzz_written_and_damaged
from parsers_harness import assert_chunking_invariant, maker, stream, summary

from edgemoe.server.parsers import parser_for_chat_template, parser_for_model_type
from edgemoe.server.parsers.minimax_m2 import call_opening, writable_name

SEARCH = {"type": "object", "properties": {"query_list": {"type": "array", "items": {"type": "string"}},
                                            "query_tag": {"type": "array", "items": {"type": "string"}}}}
F_PARAMETERS = {"type": "object", "properties": TYPED_PROPERTIES}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": F_PARAMETERS}},
         {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "search_web", "parameters": SEARCH}}]
MAKE = maker("minimax_m2", TOOLS)


def invoke(name: str, pairs: list[tuple[str, str]]) -> str:
    """One invoke as MiniMax-M2's template writes it (values already as it writes them)."""
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in pairs)
    return f'<invoke name="{name}">\n{body}</invoke>\n'


def block(*invokes: str) -> str:
    return "<minimax:tool_call>\n" + "".join(invokes) + "</minimax:tool_call>"


# The model output MiniMax-AI/MiniMax-M2's docs/tool_calling_guide.md shows, verbatim.
GUIDE_EXAMPLE = """<minimax:tool_call>
<invoke name="search_web">
<parameter name="query_tag">["technology", "events"]</parameter>
<parameter name="query_list">["\\"OpenAI\\" \\"latest\\" \\"release\\""]</parameter>
</invoke>
<invoke name="search_web">
<parameter name="query_tag">["technology", "events"]</parameter>
<parameter name="query_list">["\\"Gemini\\" \\"latest\\" \\"release\\""]</parameter>
</invoke>
</minimax:tool_call>"""
GUIDE_CALLS = [("search_web", {"query_tag": ["technology", "events"], "query_list": ['"OpenAI" "latest" "release"']}),
               ("search_web", {"query_tag": ["technology", "events"], "query_list": ['"Gemini" "latest" "release"']})]

CODE = 'if a < b:\n    s = "</parameter>"  # </invoke> <minimax:tool_call>\n'
OPEN = "<minimax:tool_call>"

CASES = [
    ("plain", "Just text.\n", ("Just text.\n", "", [])),
    ("the guide's example", GUIDE_EXAMPLE, ("", "", GUIDE_CALLS)),
    ("typed by the schema", "Sure.\n" + block(invoke("f", TYPED_PAIRS)), ("Sure.", "", [("f", TYPED_ARGS)])),
    ("string keeps its text", block(invoke("f", [("city", "  007\n"), ("text", "null"), ("note", "true")])),
     ("", "", [("f", {"city": "  007\n", "text": "null", "note": "true"})])),
    ("type mismatch falls back", block(invoke("f", [("days", "three"), ("dry_run", "maybe"), ("opts", "[1]"),
                                                    ("scale", "1e400"), ("tags", "('a', 'b')")])),
     ("", "", [("f", {"days": "three", "dry_run": "maybe", "opts": [1], "scale": "1e400", "tags": ["a", "b"]})])),
    ("several invokes, several blocks", block(invoke("f", [("days", "1")]), invoke("list_files", []))
     + "\n" + block(invoke("f", [("city", "Oslo")])),
     ("", "", [("f", {"days": 1}), ("list_files", {}), ("f", {"city": "Oslo"})])),
    ("text between blocks", "A\n" + block(invoke("list_files", [])) + "\nB\n" + block(invoke("list_files", []))
     + "\n\nC", ("ABC", "", [("list_files", {}), ("list_files", {})])),
    ("whitespace and quoting", "<minimax:tool_call><invoke name=' f '>  <parameter name=city>Rome</parameter>"
     '\n\n<parameter name="days" > 4 </parameter></invoke>  \n</minimax:tool_call>',
     ("", "", [("f", {"city": "Rome", "days": 4})])),
    ("name not among the tools", block(invoke("mcp__fs.read", [("n", "42"), ("s", "hi there"), ("o", '{"k": [1]}')])),
     ("", "", [("mcp__fs.read", {"n": 42, "s": "hi there", "o": {"k": [1]}})])),
    ("tags, < and newlines in a value", block(invoke("f", [("text", CODE), ("city", "a<b\n\nc")])),
     ("", "", [("f", {"text": CODE, "city": "a<b\n\nc"})])),
    ("closing tags then text in a value", block(invoke("f", [("text", "a</parameter>b</invoke>\n</parameter>c")])),
     ("", "", [("f", {"text": "a</parameter>b</invoke>\n</parameter>c"})])),
    ("unfinished value at stop", 'Ok.\n<minimax:tool_call>\n<invoke name="f">\n<parameter name="city">Rome'
     '</parameter>\n<parameter name="text">print(',
     ('Ok.<parameter name="text">print(', "", [("f", {"city": "Rome"})])),
    ("unfinished parameter tag at stop", '<minimax:tool_call><invoke name="f"><parameter name="days">2</parameter>'
     '<parameter name="ci', ('<parameter name="ci', "", [("f", {"days": 2})])),
    ("stop after the last invoke", '<minimax:tool_call>\n<invoke name="f">\n<parameter name="days">2</parameter>\n'
     "</invoke>\n", ("", "", [("f", {"days": 2})])),
    ("stop cuts </invoke>", '<minimax:tool_call><invoke name="f"><parameter name="days">2</parameter></inv',
     ("", "", [("f", {"days": 2})])),
    ("stop cuts the block's end", block(invoke("f", [("days", "2")]))[:-5], ("", "", [("f", {"days": 2})])),
    ("stop before the name is certain", 'Ok <minimax:tool_call>\n<invoke name="get_wea',
     ('Ok <minimax:tool_call>\n<invoke name="get_wea', "", [])),
    ("prose mentions the tag", f"Use {OPEN} blocks, or {OPEN}<invoke> ones.",
     (f"Use {OPEN} blocks, or {OPEN}<invoke> ones.", "", [])),
    ("a block without an invoke", f"{OPEN}\nhello\n</minimax:tool_call>",
     (f"{OPEN}\nhello\n</minimax:tool_call>", "", [])),
    ("an empty name", f'{OPEN}<invoke name="">\n</invoke></minimax:tool_call>',
     (f'{OPEN}<invoke name="">\n</invoke></minimax:tool_call>', "", [])),
    ("a name with a line break", f'{OPEN}<invoke name="a\nb">', (f'{OPEN}<invoke name="a\nb">', "", [])),
    ("other formats are no call", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><function=f>',
     ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><function=f>', "", [])),
    ("text after the block", block(invoke("f", [("city", "Oslo")])) + "\n\nDone.",
     ("Done.", "", [("f", {"city": "Oslo"})])),
    # "oops" means that the last </parameter> did not close its value, and nothing later does:
    # the call keeps the pairs before it and the raw text from that pair on is content (as glm45's).
    ("garbage after </invoke>", f'{OPEN}<invoke name="f"><parameter name="days">1</parameter></invoke>oops'
     "</minimax:tool_call>",
     ('<parameter name="days">1</parameter></invoke>oops</minimax:tool_call>', "", [("f", {})])),
    ("garbage in a parameter tag", f'{OPEN}<invoke name="f"><parameter name="days">1</parameter>'
     '<parameter name="city" x>2</parameter></invoke></minimax:tool_call>',
     ('<parameter name="city" x>2</parameter></invoke></minimax:tool_call>', "", [("f", {"days": 1})])),
    ("an unknown tag after a value", f'{OPEN}<invoke name="f"><parameter name="days">1</parameter>'
     '<param name="city">x</param></invoke></minimax:tool_call>',
     ('<parameter name="days">1</parameter><param name="city">x</param></invoke></minimax:tool_call>', "",
      [("f", {})])),
    ("a later invoke opens no call",
     f'{OPEN}<invoke name="f"></invoke><invoke name="a b"c"></invoke></minimax:tool_call>',
     ('<invoke name="a b"c"></invoke></minimax:tool_call>', "", [("f", {})])),
    ("an empty key", f'{OPEN}<invoke name="f"><parameter name=" ">1</parameter></invoke></minimax:tool_call>',
     ('<parameter name=" ">1</parameter></invoke></minimax:tool_call>', "", [("f", {})])),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_expected_and_chunking_invariant(text: str, expected: tuple) -> None:
    """Every split point (pairs of them for short texts) and char-by-char feeding give the
    whole-text parse, and the streamed deltas keep the clients' shape (harness)."""
    whole = assert_chunking_invariant(MAKE, text, pairs_up_to=60)
    assert summary(whole) == expected


def test_reasoning_then_calls() -> None:
    """The prompt opens `<think>` (`]~b]ai\\n<think>\\n`); a block inside reasoning is reasoning,
    and the template's `</think>\\n\\n` and the newline before the block are dropped."""
    inner = block(invoke("f", [("days", "9")]))
    text = f"plan {inner}\n</think>\n\nChecking.\n" + block(invoke("f", [("days", "1")]), invoke("list_files", []))
    got = assert_chunking_invariant(maker("minimax_m2", TOOLS, reasoning=True), text, pairs_up_to=0)
    assert summary(got) == ("Checking.", f"plan {inner}", [("f", {"days": 1}), ("list_files", {})])


def test_types_are_exact() -> None:
    """1 == 1.0 == True in Python: check the JSON text, not just equality."""
    args = MAKE().parse_complete(block(invoke("f", [("scale", "2.0"), ("line", "7"), ("dry_run", "TRUE")])))
    assert args.tool_calls[0].arguments == '{"scale": 2, "line": 7, "dry_run": true}'


def test_invokes_stream_one_by_one() -> None:
    """Id and name once the invoke's tag is complete, a piece per completed parameter (known
    once the tag after it shows it closed), `}` at each `</invoke>`."""
    parser = MAKE()
    assert parser.feed('Ok.\n<minimax:tool_call>\n<invoke name="f"').content == "Ok."
    head = parser.feed('>\n<parameter name="city">Rome</parameter>')
    assert [(d.index, d.id, d.name, d.arguments) for d in head.tool_calls] == [(0, "call_0", "f", "")]
    nxt = parser.feed('\n<parameter name="days">5</parameter>\n<')
    assert [d.arguments for d in nxt.tool_calls] == ['{"city": "Rome"']
    tail = parser.feed('/invoke>\n<invoke name="list_files">\n</invoke>\n</minimax:tool_call>')
    pieces = [(d.index, d.name, d.arguments) for d in tail.tool_calls]
    assert pieces == [(0, None, ', "days": 5}'), (1, "list_files", "{}")]
    assert parser.finish().empty
    assert parser.tool_calls_emitted == 2


def test_long_value_streams_in_linear_time() -> None:
    body = "x = '</parameter>'\n" * 3000
    text = block(invoke("f", [("text", body)]))
    got = stream(MAKE, [text[i : i + 4] for i in range(0, len(text), 4)])
    assert json.loads(got.tool_calls[0].arguments)["text"] == body


def test_long_garbage_after_the_tag_is_content_early() -> None:
    """A run past any name's length is decided as text before the output ends."""
    parser = MAKE()
    out = parser.feed(OPEN + '<invoke name="' + "a" * 300)
    assert out.content.startswith(OPEN) and parser.tool_calls_emitted == 0


def test_format_selection() -> None:
    assert parser_for_model_type("minimax_m2") == "minimax_m2"
    template = "{%- set toolcall_begin_token = '<minimax:tool_call>' -%}<invoke name=\"tool-name-1\">\n" \
               '<parameter name="param-key-1">param-value-1</parameter>'
    assert parser_for_chat_template(template) == "minimax_m2"


def test_openings_and_names() -> None:
    assert call_opening("get_weather") == '<minimax:tool_call>\n<invoke name="get_weather">\n'
    assert call_opening(None) == '<minimax:tool_call>\n<invoke name="'
    assert all(writable_name(n) for n in ("get_weather", "mcp__fs.read", "a-b:c/d", "two words"))
    assert not any(writable_name(n) for n in ("", " a", "a ", "a<b", 'a"b', "a'b", "a>", "x" * 257, "a\nb"))
    for name in ("get_weather", "mcp__fs.read", "two words"):  # what an opening names reads back as that name
        got = MAKE().parse_complete(call_opening(name) + "</invoke>\n</minimax:tool_call>")
        assert [c.name for c in got.tool_calls] == [name]
        got = MAKE().parse_complete(call_opening(None) + name + '">\n</invoke>\n</minimax:tool_call>')
        assert [c.name for c in got.tool_calls] == [name]


# Fixed-seed fuzz: calls written as the template writes them (values of each parameter's
# type, strings holding the format's own tags), prose around them, then random damage.
# Undamaged: the calls read back exactly; always: streamed == one shot.
SAMPLES: dict[str, list[Any]] = {
    "city": ["Paris", "", " a\nb ", "</parameter>x", OPEN, "</invoke>", "null", "{\"k\": 1}", "é😀", "a < b"],
    "days": [0, -3, 10**20], "scale": [0.5, -2.25, 1e-7], "dry_run": [True, False],
    "opts": [{}, {"a": [1, None, "</minimax:tool_call>"]}], "tags": [[], ["x", '<parameter name="y">']],
    "line": [None, 4],
}
DAMAGE = [OPEN, "</minimax:tool_call>", '<invoke name="f">', "</invoke>", '<parameter name="days">', "</parameter>",
          "\n", " ", "x", "<", '"']


def written_blocks(rnd: random.Random) -> tuple[str, list[dict[str, Any]]]:
    calls = [{k: rnd.choice(SAMPLES[k]) for k in rnd.sample(sorted(SAMPLES), rnd.randint(0, 3))}
             for _ in range(rnd.randint(1, 3))]
    invokes = [invoke("f", [(k, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
                            for k, v in args.items()]) for args in calls]
    return block(*invokes), calls


# Damage can put `\<` in an array's text, whose Python-literal fallback (tool_values) then warns.
@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
def test_fuzz_written_and_damaged_calls() -> None:
    fuzz_written_and_damaged(MAKE, written_blocks, DAMAGE, seed=2025)
