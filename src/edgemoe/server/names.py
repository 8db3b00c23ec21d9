"""A set of names a request's raw JSON values are looked up in.

A field read from a client's JSON without a schema (a content block's `type`, an input
item's `role`) can be any JSON value; `value in frozenset(...)` hashes it first, so a list
or an object there raised TypeError, a 500 instead of the 400 the unknown name gets
(found by the schema fuzz: an Anthropic system block with `"type": []`).
"""

from __future__ import annotations


class Names(frozenset):
    """Strings; any other value (a list, an object, a number) is in none of them."""

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and frozenset.__contains__(self, value)
