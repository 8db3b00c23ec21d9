"""Structured outputs: a byte-level matcher for JSON text matching a JSON Schema.

`Grammar.from_schema(schema)` / `Grammar.json_object()`; states advance byte by byte
(matcher.py: the JSON text rules). Keyword support: keywords.py; how a schema is read:
schema.py (and merge.py for allOf).
"""

from edgemoe.structured.errors import GrammarError
from edgemoe.structured.matcher import Grammar
from edgemoe.structured.scalars import FREE_STRING_BYTES

__all__ = ["FREE_STRING_BYTES", "Grammar", "GrammarError"]
