"""Which JSON Schema keywords the grammar enforces, accepts without enforcing, or ignores.

Enforced (ENFORCED):
  type (a name or a list of: object, array, string, number, integer, boolean, null),
  properties, required, additionalProperties, items, prefixItems, minItems, maxItems,
  enum, const, anyOf, oneOf (generated as anyOf: an output may match two alternatives),
  allOf (merged: see merge.py), $ref (local only: "#", "#/$defs/NAME",
  "#/definitions/NAME" or any "#/json/pointer"), minLength, maxLength (code points),
  nullable (OpenAPI: adds null), minimum, maximum, exclusiveMinimum, exclusiveMaximum
  (numbers, or draft 4's flags), multipleOf (exact decimals; a bounded number or a multiple
  is written without an exponent: ranged_number.py), pattern and format (a regex subset and the formats of
  pattern_string.py, with minLength/maxLength where given; a pattern outside them or an
  unknown format is accepted, not enforced).
Accepted but NOT enforced (UNENFORCED; they narrow values in ways a byte grammar cannot
check cheaply, so the output may break them):
  uniqueItems, minProperties, maxProperties, contentEncoding, contentMediaType.
Ignored annotations (ANNOTATIONS):
  title, description, default, examples, $schema, $id, $comment, deprecated, readOnly,
  writeOnly, strict, discriminator.
$defs / definitions only hold subschemas for $ref (compiled only where referenced).
Anything else raises GrammarError naming the subschema: not, if/then/else,
patternProperties, dependentSchemas, dependentRequired, contains, unevaluatedProperties,
unevaluatedItems, propertyNames, additionalItems, $anchor, $dynamicRef, unknown names;
so does a `pattern` or `format` that is not a string, or a `pattern` that is no regular
expression at all (`check_keywords`).
"""

from __future__ import annotations

from typing import Any

from edgemoe.structured.errors import GrammarError
from edgemoe.structured.regex import syntax_error

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")

ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
    "minLength", "maxLength", "nullable", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "pattern", "format",
})
UNENFORCED = frozenset({
    "uniqueItems", "minProperties", "maxProperties", "contentEncoding", "contentMediaType",
})
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "strict", "discriminator",
})
CONTAINERS = frozenset({"$defs", "definitions"})
KNOWN = ENFORCED | UNENFORCED | ANNOTATIONS | CONTAINERS

# Keywords that imply a type when `type` is absent: such a schema is generated as only
# those types (e.g. {"properties": ...} as an object), which is sound but narrower than
# JSON Schema's "any other type also passes".
IMPLIES = {
    "object": frozenset({"properties", "required", "additionalProperties", "minProperties", "maxProperties"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format", "contentEncoding", "contentMediaType"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
}


def check_keywords(schema: dict[str, Any], path: str) -> None:
    """Refuse unknown keywords and malformed string rules. Without this a `pattern` of 5
    or `"([a-"` was silently dropped: the client believed the strings were held to it."""
    for key in schema:
        if key not in KNOWN:
            raise GrammarError(path, f"unsupported keyword {key!r}")
    for key in ("pattern", "format"):
        if key in schema and not isinstance(schema[key], str):
            raise GrammarError(_at(path, key), f"{key} must be a string, not {schema[key]!r:.80}")
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and (why := syntax_error(pattern)) is not None:
        raise GrammarError(_at(path, "pattern"), f"pattern {pattern!r:.80} is not a regular expression: {why}")


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
