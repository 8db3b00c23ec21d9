"""A tool's parameters schema as its XML calls are held (`xml_calls.XmlTool`), in
Qwen3-Coder's or MiniMax-M2's spelling (`xml_calls.XmlSpelling`): both parsers type values
alike, so one schema is held alike in both; only how a value closes differs.

The parser types each value's raw text by the parameter's schema (edgemoe/tool_values.py,
`convert_typed`), so a value's matcher is chosen by what the parser will read it as:

- a string (the parser's type for it is `string` alone, or an enum of strings): raw
  text, held to the schema's string rules (length, pattern, format, enum) through the
  JSON grammar (`xml_value.ParamValue`); where the parser reads `null` as None (the type
  is nullable) the text `null` is allowed too, if the schema allows null;
- no type and no other keyword (`{}`): any raw text (the parser reads JSON where it
  parses, else the string; either is valid);
- no string possible: JSON text matching the schema (numbers, booleans, objects, arrays, null).

A parameter that may be a string or another type (the parser would read `5` as 5 where
the model meant "5"), a string the parser would read as null but the schema does not
allow, and a parameters schema beyond an object of properties (`anyOf`, `allOf` or a
keyword beside `$ref` at the top, `patternProperties`, …) raise GrammarError: a strict
tool's calls can't be enforced then.
Names and keys must be writable in a tag (no `<`, `>`, line break or surrounding space;
in MiniMax-M2's `name="…"` no quote either, and within its parser's length limits).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from edgemoe.structured.call_schema import rebase_refs
from edgemoe.structured.errors import GrammarError
from edgemoe.structured.keywords import ANNOTATIONS, CONTAINERS
from edgemoe.structured.matcher import Grammar
from edgemoe.structured.xml_calls import QWEN3_CODER, XmlCalls, XmlSpelling, XmlTool
from edgemoe.structured.xml_value import ParamValue
from edgemoe.tool_values import SchemaResolver, lookup_ref

_OBJECT_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties"}) | ANNOTATIONS | CONTAINERS
_BASE = "#/$defs/tool"
MAX_PARAMETERS = 64  # a tool's parameters held in one call (the seen set is a bitmask)
MAX_REF_CHAIN = 32


def xml_calls(entries: object, spelling: XmlSpelling = QWEN3_CODER, one_call: bool = False) -> XmlCalls:
    """The grammar of a block of calls to any of the tools `entries` lists as [name,
    parameters, strict] (a strict tool that can't be held raises GrammarError, `path`
    prefixed by its name; a non-strict one whose name a tag can't carry is left out: the
    parser can't read its calls either). ValueError where no tool is left."""
    if not isinstance(entries, list):
        raise TypeError("a list of tools")
    tools = []
    for name, parameters, strict in entries:
        try:
            tool = xml_tool(name, parameters, strict is True, spelling)
        except GrammarError as exc:
            raise GrammarError(f"{name}: {exc.path}" if exc.path else str(name), exc.problem) from exc
        if tool is not None:
            tools.append(tool)
    return XmlCalls(tools, spelling, one_call)


def xml_tool(name: str, parameters: object, strict: bool, spelling: XmlSpelling = QWEN3_CODER) -> XmlTool | None:
    """`name`'s calls held to `parameters` (None: no parameters). A tool that is not strict
    and whose schema can't be held gets its declared keys with any text as values; one
    whose name can't be written in a tag, None."""
    if not strict and not nameable(name, spelling):
        return None
    _check_writable(name, "the tool's name", spelling)
    try:
        return _held(name, parameters, spelling)
    except (GrammarError, RecursionError) as exc:
        if strict:
            raise exc if isinstance(exc, GrammarError) else GrammarError("", "the schema nests too deeply") from exc
        return _loose(name, parameters, spelling)


def _held(name: str, parameters: object, spelling: XmlSpelling) -> XmlTool:
    if parameters is None or parameters is True or parameters == {}:
        return XmlTool(name.encode(), (), (), 0)
    if not isinstance(parameters, Mapping):
        raise GrammarError("", "the parameters are not a schema object")
    top = _top_object(parameters)
    props = top.get("properties") or {}
    required = top.get("required") or []
    if not isinstance(props, Mapping) or not isinstance(required, list) or not all(
            isinstance(k, str) for k in required):
        raise GrammarError("", "properties must be an object and required a list of names")
    missing = [k for k in required if k not in props]
    if missing:
        raise GrammarError("required", f"{missing[0]!r} is required but not among the properties")
    if len(props) > MAX_PARAMETERS:
        raise GrammarError("properties", f"more than {MAX_PARAMETERS} parameters")
    defs = {"tool": rebase_refs(parameters, _BASE, drop=ANNOTATIONS)}  # each value's $refs resolve here
    resolver = SchemaResolver(parameters)  # the parser's own typing of each value
    keys, values = [], []
    for key, schema in props.items():
        _check_writable(key, f"the parameter {key!r}", spelling, key=True)
        keys.append(key)
        values.append(_param_value(defs, resolver, key, schema, spelling.newline_close))
    if resolver.exhausted:  # the parser would read some values untyped
        raise GrammarError("properties", "the schema takes too much work to type its values")
    mask = sum(1 << keys.index(k) for k in set(required))
    return XmlTool(name.encode(), tuple(k.encode() for k in keys), tuple(values), mask)


def _loose(name: str, parameters: object, spelling: XmlSpelling) -> XmlTool:
    """Declared keys (those writable, as the parser finds them), any text for each, none required."""
    props = None
    if isinstance(parameters, Mapping):
        props = SchemaResolver(parameters).resolve(parameters).get("properties")
    keys = [k for k in props if nameable(k, spelling, key=True)][:MAX_PARAMETERS] if isinstance(props, Mapping) else []
    values = tuple(_any_text(spelling.newline_close) for _ in keys)
    return XmlTool(name.encode(), tuple(k.encode() for k in keys), values, 0)


def _top_object(parameters: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object schema the parameters are, through a chain of `$ref`s (each alone, as the
    parser resolves them: a sibling or an `allOf` there would be merged its own way)."""
    node: Mapping[str, Any] = parameters
    for _ in range(MAX_REF_CHAIN):
        if "allOf" in node:
            raise GrammarError("allOf", "allOf at the top of the parameters can't be held in an XML call")
        ref = node.get("$ref")
        if ref is None:
            _check_object(node)
            return node
        extra = sorted(k for k in node if k != "$ref" and k not in ANNOTATIONS and k not in CONTAINERS)
        if extra:
            raise GrammarError(extra[0], "a keyword beside $ref at the top of the parameters")
        node = lookup_ref(ref, parameters) if isinstance(ref, str) else {}
        if not node:
            raise GrammarError("$ref", f"{ref!r} names no schema in the parameters")
    raise GrammarError("$ref", f"more than {MAX_REF_CHAIN} $refs in a chain")


def _check_object(top: Mapping[str, Any]) -> None:
    kind = top.get("type", "object")
    if kind not in ("object", ["object"]):
        raise GrammarError("type", "the parameters must be an object")
    extra = sorted(k for k in top if k not in _OBJECT_KEYWORDS)
    if extra:
        raise GrammarError(extra[0], "not enforced on an XML call's parameters")


def _param_value(defs: dict[str, Any], resolver: SchemaResolver, key: str, schema: object,
                 newline_close: bool) -> ParamValue:
    where = f"properties.{key}"
    if not isinstance(schema, Mapping):
        if schema is True:
            return _any_text(newline_close)
        raise GrammarError(where, "not a schema object")
    if all(k in ANNOTATIONS for k in schema):  # {}: any value, and the parser reads any text as one
        return _any_text(newline_close)
    if _plain_boolean(schema):
        return _boolean_text(schema["type"] != "boolean", newline_close)
    vt = resolver.property_type(key)
    string_only = set(vt.types) == {"string"} or (
        not vt.types and vt.enum is not None and all(isinstance(m, str) or m is None for m in vt.enum))
    # the text null reads as null: allowed as the string "null" too (its JSON null stays the schema's)
    grammar = _grammar(defs, schema, where, extra_null=string_only and vt.nullable)
    if string_only:
        if vt.nullable and not _accepts(grammar, b"null"):
            raise GrammarError(where, "the parser reads the text null as null here, which the schema refuses")
        try:
            return ParamValue(grammar, raw=True, newline_close=newline_close)
        except ValueError as exc:
            raise GrammarError(where, "the parser reads a string here, which the schema refuses") from exc
    if "string" in vt.types or any(isinstance(m, str) for m in vt.enum or ()):
        raise GrammarError(where, "a value that may be a string or another type can't be held in an "
                                  "XML call (the parser reads 5 as a number)")
    return ParamValue(grammar, raw=False, newline_close=newline_close)


def _plain_boolean(schema: Mapping[str, Any]) -> bool:
    """`{"type": "boolean"}` (or with null), nothing else to hold."""
    return schema.get("type") in ("boolean", ["boolean", "null"], ["null", "boolean"]) and all(
        k == "type" or k in ANNOTATIONS for k in schema)


@cache
def _boolean_text(nullable: bool, newline_close: bool) -> ParamValue:
    """A boolean as either template writes it: JSON's `true` (Qwen3.5/3.6, MiniMax-M2:
    tojson) or Python's `True` (Qwen3-Coder: `| string`); the parsers read either, in any case."""
    words = ["true", "false", "True", "False"] + (["null"] if nullable else [])
    return ParamValue(Grammar.from_schema({"enum": words}), raw=True, newline_close=newline_close)


def _grammar(defs: dict[str, Any], schema: Mapping[str, Any], where: str, extra_null: bool) -> Grammar:
    """The JSON grammar of one parameter, its `$ref`s resolved in the tool's schema (under
    `defs`); `extra_null`: the string "null" allowed too (the parser reads it as null)."""
    branches: list[object] = [rebase_refs(schema, _BASE, drop=ANNOTATIONS)]
    if extra_null:
        branches.append({"const": "null"})
    doc = {"$defs": defs, "anyOf": branches}
    try:
        return Grammar.from_schema(doc)
    except GrammarError as exc:
        path = exc.path.removeprefix("anyOf.0").lstrip(".")
        raise GrammarError(f"{where}.{path}" if path else where, exc.problem) from exc


def _accepts(grammar: Grammar, text: bytes) -> bool:
    state = grammar.advance_bytes(grammar.start(), text)
    return state is not None and grammar.is_complete(state)


@cache
def _any_text(newline_close: bool) -> ParamValue:
    return ParamValue(Grammar.from_schema({"type": "string"}), raw=True, newline_close=newline_close)


def nameable(text: object, spelling: XmlSpelling = QWEN3_CODER, key: bool = False) -> bool:
    """Whether a tag in `spelling` can carry `text` as a tool's name (or a parameter's `key`):
    `<function=…>`, `<invoke name="…">`, and read it back as written."""
    limit = spelling.max_key if key else spelling.max_name
    return (isinstance(text, str) and bool(text) and text == text.strip()
            and not any(c in text for c in spelling.forbidden) and (limit is None or len(text) <= limit))


def _check_writable(text: str, what: str, spelling: XmlSpelling, key: bool = False) -> None:
    if not nameable(text, spelling, key):
        shown = ", ".join(repr(c) for c in spelling.forbidden)
        raise GrammarError("", f"{what} can't be written in a {spelling.format} tag (empty, or a {shown} in it, "
                               f"space around it, or too long)")
