"""Which requests' tool calls are held to their schemas, and with what (no engine):
annotations never count against the schema limit, a tool that can't be enforced falls
back to any JSON object unless it is strict, and the chooser in generation.py picks the
right constraint for each kind of request."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from edgemoe.messages import MAX_SCHEMA_BYTES, SamplingParams
from edgemoe.server.api_error import APIError
from edgemoe.server.call_format import call_format, named_call_format
from edgemoe.server.generation import _output_constraint
from edgemoe.server.generation_request import GenerationRequest, TextPrompt
from edgemoe.server.output_format import OutputFormat

OPENING = '<tool_call>\n{"name": "'


def tool(name: str, parameters: object, strict: bool | None = None) -> dict:
    f = {"name": name, "parameters": parameters}
    if strict is not None:
        f["strict"] = strict
    return {"type": "function", "function": f}


def alternatives(fmt: OutputFormat | None) -> dict[str, object]:
    assert fmt is not None and fmt.schema is not None
    return {a["properties"]["name"]["const"]: a["properties"]["arguments"] for a in json.loads(fmt.schema)["anyOf"]}


def test_only_strict_or_forced_requests_are_constrained() -> None:
    plain = [tool("a", {"type": "object"})]
    assert call_format("hermes", plain, "") is None
    assert call_format("hermes", plain, OPENING) is not None
    assert call_format("hermes", [tool("a", {"type": "object"}, True)], "") is not None
    xml = call_format("qwen3_coder", [tool("a", {"type": "object"}, True)], "")
    assert xml is not None and xml.tool_format == "qwen3_coder" and json.loads(xml.schema or "") == [
        ["a", {"type": "object"}, True]]
    assert call_format("qwen3_coder", plain, "") is None
    assert call_format(None, [tool("a", {"type": "object"}, True)], "") is None
    fmt = call_format("hermes", plain, OPENING, one_call=True)
    assert fmt is not None and fmt.target == "calls" and fmt.primed == '\n{"name": "' and fmt.one_call


def test_tools_that_cannot_be_enforced_take_any_object_unless_strict() -> None:
    odd = {"type": "object", "properties": {"a": {"not": {}}}}
    shell = {"type": "array", "items": {"type": "string"}}
    fmt = call_format("hermes", [tool("odd", odd), tool("shell", shell), tool("note", {"type": "object"})], OPENING)
    assert alternatives(fmt)["odd"] == {"type": "object"} and alternatives(fmt)["shell"] == {"type": "object"}
    for params, why in ((odd, "properties.a"), (shell, "allow no JSON object")):
        with pytest.raises(APIError) as info:
            call_format("hermes", [tool("t", params, True)], "")
        assert info.value.status == 400 and info.value.param == "tools" and "'t'" in info.value.message
        assert why in info.value.message


def test_descriptions_do_not_count_against_the_limit() -> None:
    """A large agent tool set (most of it descriptions) is still constrained."""
    prop = {"type": "string", "description": "x" * 200, "title": "T"}
    tools = [tool(f"t{i}", {"type": "object", "description": "d" * 500,
                            "properties": {f"p{j}": prop for j in range(25)}, "required": ["p0"]})
             for i in range(60)]
    assert len(json.dumps(tools)) > MAX_SCHEMA_BYTES
    fmt = call_format("hermes", tools, OPENING)
    assert fmt is not None and "description" not in fmt.schema and len(fmt.schema) < MAX_SCHEMA_BYTES  # type: ignore[operator]
    named = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    assert alternatives(call_format("hermes", [tool("n", named, True)], "")) is not None
    assert "title" in json.loads(call_format("hermes", [tool("n", named, True)], "").schema)["$defs"]["tool0"]["properties"]  # type: ignore[union-attr]


def model(parser: str = "hermes", tags: bool = True) -> SimpleNamespace:
    return SimpleNamespace(tool_parser=parser, teaches_calls=True, writes_call_tags=tags)


def request(**kw: object) -> GenerationRequest:
    base = dict(prompt=TextPrompt("hi"), params=SamplingParams(), tools=[tool("a", {"type": "object"}, True)])
    return GenerationRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_the_chooser() -> None:
    fmt = OutputFormat(None)
    assert _output_constraint(model(), request(), "").target == "calls"  # type: ignore[arg-type,union-attr]
    beside = _output_constraint(model(), request(output_format=fmt), "")  # type: ignore[arg-type]
    assert beside is not None and beside.target == "value" and beside.calls  # the JSON, or calls
    xml_beside = _output_constraint(model("qwen3_coder"), request(output_format=fmt), "")  # type: ignore[arg-type]
    assert xml_beside is not None and xml_beside.calls and xml_beside.tool_format == "qwen3_coder"
    assert _output_constraint(model(), request(output_format=fmt, tool_choice="none"), "") is fmt  # type: ignore[arg-type]
    assert _output_constraint(model(), request(tool_choice="none"), "") is None  # type: ignore[arg-type]
    assert _output_constraint(model(), request(parse_output=False), "") is None  # type: ignore[arg-type]
    assert _output_constraint(model(tags=False), request(), "") is None  # type: ignore[arg-type]
    xml = _output_constraint(model("qwen3_coder"), request(), "")  # type: ignore[arg-type]
    assert xml is not None and xml.target == "calls" and xml.tool_format == "qwen3_coder"
    xml_named = _output_constraint(model("qwen3_coder"), request(named_tool="a"), "<tool_call>\n<function=a>\n")  # type: ignore[arg-type]
    assert xml_named is not None and xml_named.target == "calls" and xml_named.primed == "\n<function=a>\n"
    forced = _output_constraint(model(), request(output_format=fmt, tool_choice="required"), OPENING)  # type: ignore[arg-type]
    assert forced is not None and forced.target == "calls" and forced.primed  # the forced call wins
    named = _output_constraint(model(), request(named_tool="a"), OPENING[:-1] + 'a", "arguments":')  # type: ignore[arg-type]
    assert named is not None and named.target == "value"


def test_too_many_tools_for_strict_calls() -> None:
    many = [tool(f"t{i}", {"type": "object"}) for i in range(600)]
    assert call_format("hermes", many, OPENING) is None  # required, not strict: served unconstrained
    with pytest.raises(APIError, match="at most 512 tools"):
        call_format("hermes", [*many, tool("s", {"type": "object"}, True)], "")


def test_qwen3_coder_tools() -> None:
    """XML calls: a strict tool the format can't hold is a 400 naming it and the parameter;
    a named forced call holds the one tool (strict or not), primed past its opening."""
    mixed = {"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}
    with pytest.raises(APIError) as info:
        call_format("qwen3_coder", [tool("t", mixed, True)], "")
    assert info.value.status == 400 and "'t'" in info.value.message and "properties.a" in info.value.message
    assert call_format("qwen3_coder", [tool("t", mixed), tool("u", {"type": "object"}, True)], "") is not None
    described = {"type": "object", "description": "d" * 100, "properties": {"a": {"type": "string", "title": "A"}}}
    fmt = named_call_format("qwen3_coder", [tool("t", mixed), tool("u", described)], "u", "<tool_call>\n<function=u>\n")
    assert fmt is not None and fmt.one_call and fmt.primed == "\n<function=u>\n"
    assert json.loads(fmt.schema or "") == [["u", {"type": "object", "properties": {"a": {"type": "string"}}}, False]]
    assert named_call_format("hermes", [tool("u", described)], "u", "<tool_call>") is None
    assert call_format("qwen3_coder", [tool("bad name ", {"type": "object"})], "<tool_call>\n<function") is None
    with pytest.raises(APIError, match="'a<b'"):
        call_format("qwen3_coder", [tool("a<b", {"type": "object"}, True)], "")
    hostile = {"type": "object", "properties": {"a": {}}, "required": [{"a": 1}]}
    with pytest.raises(APIError):  # was a TypeError: a 500
        call_format("qwen3_coder", [tool("t", hostile, True)], "")
    assert call_format("qwen3_coder", [tool("t", hostile)], "<tool_call>\n<function") is not None


def test_responses_tools_are_held_unless_they_say_strict_false() -> None:
    """The Responses API holds a tool that doesn't say `strict` (OpenAI's default there;
    Chat Completions' is not to), never with a 400; `strict: false` opts out."""
    from edgemoe.server.responses import to_generation_request
    from edgemoe.server.responses_protocol import ResponsesRequest

    body = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "a", "parameters": {"type": "object"}}]}
    served = SimpleNamespace(sampling_defaults={})
    req = to_generation_request(ResponsesRequest.model_validate(body), served)  # type: ignore[arg-type]
    assert req.strict_default
    held = _output_constraint(model(), req, "")  # type: ignore[arg-type]
    assert held is not None and held.target == "calls"
    opted_out = {**body, "tools": [{**body["tools"][0], "strict": False}]}  # type: ignore[dict-item]
    assert _output_constraint(model(), to_generation_request(ResponsesRequest.model_validate(opted_out), served), "") is None  # type: ignore[arg-type]
    plain = request(tools=[tool("a", {"type": "object"})])
    assert _output_constraint(model(), plain, "") is None  # type: ignore[arg-type]  (Chat Completions)
    odd = {"type": "object", "properties": {"a": {"not": {}}}}
    loose = _output_constraint(model(), request(tools=[tool("odd", odd)], strict_default=True), "")  # type: ignore[arg-type]
    assert loose is not None and alternatives(loose)["odd"] == {"type": "object"}  # no 400: held loosely
    xml = _output_constraint(model("qwen3_coder"), request(tools=[tool("odd", odd)], strict_default=True), "")  # type: ignore[arg-type]
    assert xml is not None and xml.tool_format == "qwen3_coder"


MINIMAX_ANY = '<minimax:tool_call>\n<invoke name="'


def test_minimax_m2_tools() -> None:
    """MiniMax's blocks are held as Qwen3-Coder's calls are (the same schemas, the same 400
    for a strict tool that can't be), primed past the block's own tag, a quote kept out of
    its names; without single block tokens (`writes_call_tags`) nothing is held, no 400."""
    mixed = {"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}
    with pytest.raises(APIError) as info:
        call_format("minimax_m2", [tool("t", mixed, True)], "")
    assert info.value.status == 400 and info.value.param == "tools"
    assert "'t'" in info.value.message and "properties.a" in info.value.message and "minimax_m2" in info.value.message
    held = call_format("minimax_m2", [tool("t", mixed), tool("u", {"type": "object"}, True)], "", one_call=True)
    assert held is not None and held.tool_format == "minimax_m2" and held.one_call
    forced = call_format("minimax_m2", [tool("t", mixed)], MINIMAX_ANY)
    assert forced is not None and forced.primed == '\n<invoke name="' and not forced.one_call
    named = named_call_format("minimax_m2", [tool("t", mixed), tool("u", {"type": "object"})], "u",
                              '<minimax:tool_call>\n<invoke name="u">\n')
    assert named is not None and named.one_call and named.primed == '\n<invoke name="u">\n'
    assert json.loads(named.schema or "") == [["u", {"type": "object"}, False]]
    assert call_format("qwen3_coder", [tool('say"hi', {"type": "object"}, True)], "") is not None
    with pytest.raises(APIError, match="say\"hi"):
        call_format("minimax_m2", [tool('say"hi', {"type": "object"}, True)], "")
    assert call_format("minimax_m2", [tool('say"hi', {"type": "object"})], MINIMAX_ANY) is None  # no name to hold
    assert _output_constraint(model("minimax_m2"), request(), "").tool_format == "minimax_m2"  # type: ignore[arg-type,union-attr]
    beside = _output_constraint(model("minimax_m2"), request(output_format=OutputFormat(None)), "")  # type: ignore[arg-type]
    assert beside is not None and beside.target == "value" and beside.calls and beside.tool_format == "minimax_m2"
    named_req, named_opening = request(named_tool="a"), '<minimax:tool_call>\n<invoke name="a">\n'
    got = _output_constraint(model("minimax_m2"), named_req, named_opening)  # type: ignore[arg-type]
    assert got is not None and got.target == "calls" and got.one_call
    for req, forced_text in ((request(), ""), (named_req, named_opening), (request(tool_choice="required"), MINIMAX_ANY)):
        assert _output_constraint(model("minimax_m2", tags=False), req, forced_text) is None  # type: ignore[arg-type]


def test_each_format_looks_for_its_own_call_tags(demo_tokenizer) -> None:  # noqa: ANN001
    """Qwen3's tokenizer has `<tool_call>` as one token, not MiniMax's block tags."""
    from edgemoe.server.model import ServedModel

    def served(parser: str) -> bool:
        model = SimpleNamespace(tokenizer=demo_tokenizer, tool_parser=parser)
        return ServedModel.writes_call_tags.fget(model)  # type: ignore[attr-defined]

    assert served("hermes") and served("qwen3_coder") and not served("minimax_m2")


@pytest.mark.parametrize("name", ["get_weather", "mcp__fs__read", "a b", " a", "a\tb", 'say"hi', "it's", "a<b", "a>b",
                                  "a\nb", "x" * 256, "x" * 257, "", "é中"])
def test_minimax_names_the_grammar_holds_are_those_the_parser_reads(name: str) -> None:
    """A forced call's name check (the parser's) and the grammar's agree, limits included."""
    from edgemoe.server.parsers.keyed_values import MAX_KEY
    from edgemoe.server.parsers.minimax_m2 import writable_name
    from edgemoe.structured.xml_calls import MINIMAX_M2
    from edgemoe.structured.xml_tools import nameable

    assert nameable(name, MINIMAX_M2) == writable_name(name)
    assert MINIMAX_M2.max_key == MAX_KEY
