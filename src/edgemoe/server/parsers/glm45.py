"""GLM-4.5 / 4.6 / 4.7 tool calls (what vLLM calls ``glm45`` / ``glm47``).

Format (GLM-4.5's chat template; GLM-4.7's writes the same without the newlines)::

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

Any whitespace may separate the tags. The template writes a string value as it is and
anything else as JSON (``v | tojson``), so a value is typed by the tool's JSON schema
exactly as the qwen3_coder parser types its values (``edgemoe.tool_values``): a string
parameter keeps the text verbatim (no newline stripped: the template adds none), any
other type is JSON (else a Python literal, else the raw text). A value may contain
``</arg_value>``: it closes the value only when what follows (after whitespace) is
``<arg_key>`` or ``</tool_call>``; at the end of the output a closing sequence cut off
by the stop counts as complete.

Streaming: id + name once the name is certain, i.e. followed (after whitespace) by
``<arg_key>`` or ``</tool_call>``; ``{"k": v`` / ``, "k": v`` per completed pair; ``}``
when the call closes. ``<tool_call>`` not followed by such a name (no blank, tag, quote
or bracket in it, at most 256 characters) is prose and stays content. After the call is
announced, anything that breaks the format (or the model's end, EOS or a stop string,
inside a pair) closes the arguments with the completed pairs, and the rest of the raw text
is content. A length limit (max_tokens, the context) that cuts the call closes it with the
completed pairs and drops the rest (``ToolParser``), an ``</arg_value>`` left without its
lookahead included.
"""

from __future__ import annotations

import re

from edgemoe.server.parsers.base import Scan, TaggedToolParser, expect, skip_ws
from edgemoe.server.parsers.hermes import MAX_NAME
from edgemoe.server.parsers.keyed_values import MAX_KEY, KeyedValuesParser, expect_any, followed_by

KEY_OPEN = "<arg_key>"
KEY_CLOSE = "</arg_key>"
VALUE_OPEN = "<arg_value>"
VALUE_CLOSE = "</arg_value>"

# A name is one run of these: prose ("<tool_call> tags are…") and other formats' JSON
# (`<tool_call>{"name": …}`) never read as a call.
_NAME = re.compile(r"""[^\s<>{}\[\]"'`]*""")


def writable_name(name: str) -> bool:
    """Whether a call to `name` reads back as that name (forced_call's check)."""
    return 0 < len(name) <= MAX_NAME and _NAME.fullmatch(name) is not None


def compact_template(source: str) -> bool:
    """Whether a chat template teaches GLM-4.7's spelling (no newline after the name)."""
    return "{function-name}<arg_key>" in source


def call_opening(name: str | None, compact: bool) -> str:
    """The forced opening of a call, as the template writes it after the closed think
    block (4.5/4.6: ``\\n<tool_call>NAME\\n``; 4.7, ``compact``: ``<tool_call>NAME``)."""
    lead, tail = ("", "") if compact else ("\n", "\n")
    return f"{lead}<tool_call>" if name is None else f"{lead}<tool_call>{name}{tail}"


def parse_name(buf: str, pos: int) -> tuple[str, int] | Scan:
    """``NAME`` after ``<tool_call>``, certain once ``<arg_key>`` or ``</tool_call>``
    follows: the name and where that tag starts."""
    p = skip_ws(buf, pos)
    end = _NAME.match(buf, p).end()  # type: ignore[union-attr]  # matches empty
    if end - p > MAX_NAME:
        return Scan.FAIL
    if end == len(buf):
        return Scan.NEED
    if end == p:
        return Scan.FAIL  # a tag, quote or bracket where the name should be
    q = skip_ws(buf, end)
    after = expect_any(buf, q, (KEY_OPEN, TaggedToolParser.CLOSE))
    return (buf[p:end], q) if isinstance(after, int) else after


def parse_pair_head(buf: str, pos: int) -> tuple[str, int] | Scan:
    """``<arg_key>KEY</arg_key><arg_value>`` at ``pos``: the key and where its value starts."""
    r = expect(buf, pos, KEY_OPEN)
    if not isinstance(r, int):
        return r
    lt = buf.find("<", r, r + MAX_KEY + 1)
    if lt < 0:
        return Scan.NEED if len(buf) - r <= MAX_KEY else Scan.FAIL
    close = expect(buf, lt, KEY_CLOSE)
    if not isinstance(close, int):
        return close
    key = buf[r:lt].strip()
    if not key:
        return Scan.FAIL
    value = expect(buf, skip_ws(buf, close), VALUE_OPEN)
    return (key, value) if isinstance(value, int) else value


def value_closes(buf: str, pos: int) -> bool | Scan:
    """Is the ``</arg_value>`` ending at ``pos`` the real end of its value?"""
    return followed_by(buf, pos, (KEY_OPEN, TaggedToolParser.CLOSE))


class Glm45ToolParser(KeyedValuesParser):
    """Streaming parser for GLM-4.5/4.6/4.7 tool calls (see the module docstring)."""

    VALUE_TAG = VALUE_CLOSE
    _value_closes = staticmethod(value_closes)

    def _header(self) -> tuple[str, int] | Scan:
        return parse_name(self.buf, self.pos)

    def _pair_head(self, pos: int) -> tuple[str, int] | Scan:
        return parse_pair_head(self.buf, pos)

    def _body_close(self, pos: int) -> int | Scan:
        return expect(self.buf, pos, self.CLOSE)
