"""How many more characters a state inside a length-bounded string may take.

The token-mask walk (token_masks.py) covers such a string's tokens by arrays instead of
visiting them, which needs the rule to be exact: from a state that is one
`BoundedString` body thread at a character boundary (mode 0) with `count` characters
read, a run of free-string bytes is accepted exactly when it is valid UTF-8 (the
string's decoder tables, scalars.py) and holds at most `hi - count` characters (ASCII and
lead bytes; a continuation byte after the last one is still accepted). A state with
other threads, or inside an escape or a UTF-8 sequence, has no room: the walk visits it.
"""

from __future__ import annotations

from edgemoe.structured.scalars import BoundedString

NO_MAX = 1 << 30  # only minLength pending: as many characters as a token holds


def string_room(state: frozenset) -> int | None:
    """`hi - count` (NO_MAX without a maxLength) for one bounded-string thread at a
    character boundary; None for any other state."""
    if len(state) != 1:
        return None
    ((frame, _),) = state
    leaf = frame[0]
    if not isinstance(leaf, BoundedString) or frame[2] != 0:
        return None
    return NO_MAX if leaf.hi is None else leaf.hi - frame[1]
