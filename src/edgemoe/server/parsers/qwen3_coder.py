"""Qwen3-Coder / Qwen3.5+ XML tool calls.

Format (from the model's chat template)::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Values are raw text: one leading and one trailing newline are stripped, the rest is
typed by the tool's JSON schema (``schema.convert_value``). A value may itself contain
``</parameter>`` or ``</function>``, so a ``</parameter>`` closes the value only when
what follows (after optional whitespace) is ``<parameter=``, or ``</function>`` and then
(after optional whitespace) ``</tool_call>``; a ``</function>`` closes the call only
when ``</tool_call>`` follows it. At the end of the output a closing sequence cut off by
the stop counts as complete (``…</parameter>\\n</function>`` then EOS closes the call).

Streaming: id + name when ``<function=NAME>`` is complete; ``{"k": v`` / ``, "k": v``
per completed parameter; ``}`` when the call closes. ``<tool_call>`` not followed by
``<function=`` is prose and stays content. After the call is announced, anything that
breaks the format (or the model's end, EOS or a stop string, inside a value) closes the
arguments with the completed parameters and the rest of the raw text is content. A length
limit (max_tokens, the context) that cuts the call instead closes it with the completed
parameters and drops the rest (``ToolParser``): the value being written, a tag cut off, and
a ``</parameter>`` the limit left without its lookahead (it may be a literal one inside the
value) are never content nor a value.
"""

from __future__ import annotations

from edgemoe.server.parsers.base import Scan, TaggedToolParser, expect, skip_ws
from edgemoe.server.parsers.keyed_values import KeyedValuesParser, followed_by, value_ends

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"


def parse_tag_name(buf: str, pos: int) -> tuple[str, int] | Scan:
    """``NAME>`` at ``pos`` (after ``<function=``/``<parameter=``): name and end."""
    gt = buf.find(">", pos)
    region = buf[pos : gt if gt >= 0 else len(buf)]
    if "\n" in region or "<" in region:
        return Scan.FAIL  # a name never spans lines or holds a tag
    if gt < 0:
        return Scan.NEED
    name = region.strip()
    return (name, gt + 1) if name else Scan.FAIL


def function_closes(buf: str, pos: int) -> bool | Scan:
    """Is the ``</function>`` ending at ``pos`` followed by ``</tool_call>``?"""
    return followed_by(buf, pos, (TaggedToolParser.CLOSE,))


def parameter_closes(buf: str, pos: int) -> bool | Scan:
    """Is the ``</parameter>`` ending at ``pos`` the real end of its value?"""
    return value_ends(buf, pos, PARAM_OPEN, FUNCTION_CLOSE, function_closes)


def strip_value(raw: str) -> str:
    """Drop exactly one leading and one trailing newline (the template's layout)."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


class Qwen3CoderToolParser(KeyedValuesParser):
    """Streaming parser for the Qwen3-Coder XML tool-call format (module docstring)."""

    VALUE_TAG = PARAM_CLOSE
    _value_closes = staticmethod(parameter_closes)

    def _raw_value(self, text: str) -> str:
        return strip_value(text)  # one leading and one trailing newline are the format's

    def _header(self) -> tuple[str, int] | Scan:
        r = expect(self.buf, skip_ws(self.buf, self.pos), FUNCTION_OPEN)
        return parse_tag_name(self.buf, r) if isinstance(r, int) else r

    def _pair_head(self, pos: int) -> tuple[str, int] | Scan:
        r = expect(self.buf, pos, PARAM_OPEN)
        return parse_tag_name(self.buf, r) if isinstance(r, int) else r

    def _body_close(self, pos: int) -> int | Scan:
        end = expect(self.buf, pos, FUNCTION_CLOSE)
        if not isinstance(end, int):
            return end
        closes = function_closes(self.buf, end)  # a </function> closes only before </tool_call>
        if closes is True:
            return expect(self.buf, skip_ws(self.buf, end), self.CLOSE)
        return Scan.NEED if closes is Scan.NEED else Scan.FAIL
