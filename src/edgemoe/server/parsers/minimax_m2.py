"""MiniMax-M2 / M2.1 / M2.5 tool calls (what vLLM and SGLang call ``minimax_m2``).

Format (MiniMax-M2's chat template and its tool-calling guide): one block holds a turn's
calls, one ``<invoke>`` each (several are parallel calls)::

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="KEY">VALUE</parameter>
    …
    </invoke>
    <invoke name="…">…</invoke>
    </minimax:tool_call>

Any whitespace may separate the tags. A name is written ``name="…"`` (single quotes or
none are read too; blanks around it are dropped; no ``<``, ``>``, quote or line break in
it). The template writes a string value as it is and anything else as JSON
(``v | tojson``), so a value is typed by the tool's JSON schema as glm45's are
(``edgemoe.tool_values``): a string parameter keeps the text verbatim, nothing stripped
(the template adds no newline; an edit's ``old_string`` keeps its indentation), any
other type is JSON (else a Python literal, else the raw text). A value may contain
``</parameter>``: it closes the value only when what follows (after whitespace) is
``<parameter name=``, or ``</invoke>`` that closes the invoke, i.e. is followed by
``<invoke name=`` or ``</minimax:tool_call>``. At the end of the output a closing
sequence cut off by the stop counts as complete.

Streaming: a block is one "call" of `TaggedToolParser`; each invoke in it is announced
(id + name) once its ``<invoke name="NAME">`` tag is complete, then ``{"k": v`` /
``, "k": v`` per completed parameter, and ``}`` at its ``</invoke>``. A block whose first
invoke is none (no ``<invoke name=…>``, or cut off before its ``>``) is text:
``<minimax:tool_call>`` stays content and what follows is read again as text. After a
call was announced, anything that breaks the format (or the model's end, EOS or a stop
string, inside a value) closes its arguments with the completed parameters, and the rest
of the raw text is content; so is the rest from a later ``<invoke`` that opens no call. A
length limit (max_tokens, the context) that cuts the block after a call was announced
closes that call with the completed parameters and drops the rest of the block's text
(``ToolParser``): a value cut short, a tag cut off, the next ``<invoke`` cut before its name.

NOTE: ``<minimax:tool_call>`` and ``</minimax:tool_call>`` are added tokens of MiniMax's
tokenizer that vLLM finds in its vocabulary; like DeepSeek's markers they are text the
detokenizer keeps with the default ``skip_special_tokens`` (the parser reads them as text
either way).
"""

from __future__ import annotations

import re

from edgemoe.server.parsers.base import Scan, expect, skip_ws
from edgemoe.server.parsers.hermes import MAX_NAME
from edgemoe.server.parsers.keyed_values import MAX_KEY, KeyedValuesParser, Phase, followed_by, value_ends

BLOCK_OPEN = "<minimax:tool_call>"
BLOCK_CLOSE = "</minimax:tool_call>"
INVOKE_OPEN = "<invoke name="
INVOKE_CLOSE = "</invoke>"
PARAM_OPEN = "<parameter name="
PARAM_CLOSE = "</parameter>"

# An attribute's text: what the parser reads as a name (within its quotes, if any).
_ATTR = re.compile(r"""[^<>"'\n]*""")


def writable_name(name: str) -> bool:
    """Whether a call to `name` reads back as that name (forced_call's check)."""
    return 0 < len(name) <= MAX_NAME and name == name.strip() and _ATTR.fullmatch(name) is not None


def call_opening(name: str | None) -> str:
    """The forced opening of a call, as the template writes a call turn: through the
    invoke's line (``<invoke name="NAME">\\n``), or for any tool up to the name's quote."""
    head = f"{BLOCK_OPEN}\n{INVOKE_OPEN}"
    return f'{head}"' if name is None else f'{head}"{name}">\n'


def parse_attr(buf: str, pos: int, limit: int) -> tuple[str, int] | Scan:
    """``"VALUE">`` at `pos` (just after ``name=``; single quotes or none read too): the
    value, blanks around it dropped, and the position after ``>``. Longer than `limit`: FAIL."""
    if pos == len(buf):
        return Scan.NEED
    quote = buf[pos] if buf[pos] in "\"'" else ""
    start = pos + len(quote)
    end = _ATTR.match(buf, start, start + limit + 1).end()  # type: ignore[union-attr]  # matches empty
    if end - start > limit:
        return Scan.FAIL
    if end == len(buf):
        return Scan.NEED
    p = end
    if quote:
        closed = expect(buf, p, quote)
        if not isinstance(closed, int):
            return closed
        p = skip_ws(buf, closed)
    gt = expect(buf, p, ">")
    if not isinstance(gt, int):
        return gt
    value = buf[start:end].strip()
    return (value, gt) if value else Scan.FAIL


def parse_tag(buf: str, pos: int, tag: str, limit: int) -> tuple[str, int] | Scan:
    """``<invoke name="NAME">`` / ``<parameter name="KEY">`` at `pos` (`tag` up to ``=``)."""
    r = expect(buf, pos, tag)
    return parse_attr(buf, r, limit) if isinstance(r, int) else r


def invoke_closes(buf: str, pos: int) -> bool | Scan:
    """Is the ``</invoke>`` ending at ``pos`` followed by another invoke or the block's end?"""
    return followed_by(buf, pos, (INVOKE_OPEN, BLOCK_CLOSE))


def parameter_closes(buf: str, pos: int) -> bool | Scan:
    """Is the ``</parameter>`` ending at ``pos`` the real end of its value?"""
    return value_ends(buf, pos, PARAM_OPEN, INVOKE_CLOSE, invoke_closes)


class MiniMaxM2ToolParser(KeyedValuesParser):
    """Streaming parser for MiniMax-M2's tool calls (see the module docstring).

    The HEADER phase is between invokes: it commits the next one or ends the block."""

    OPEN = BLOCK_OPEN
    CLOSE = BLOCK_CLOSE
    VALUE_TAG = PARAM_CLOSE
    _value_closes = staticmethod(parameter_closes)

    def _begin_call(self) -> None:
        super()._begin_call()
        self._block_calls = 0  # invokes committed in this block

    def _step_header(self, final: bool) -> bool:
        buf = self.buf
        p = skip_ws(buf, self.pos)
        named = parse_tag(buf, p, INVOKE_OPEN, MAX_NAME)
        if isinstance(named, tuple):
            self._name = named[0]
            self._commit(named[0])
            self._block_calls += 1
            self.pos, self._phase = named[1], Phase.BODY
            return True
        end = expect(buf, p, self.CLOSE) if self._block_calls else Scan.FAIL
        if isinstance(end, int):
            self._end_call(end, lstrip=True)
            return True
        if Scan.NEED in (named, end) and not final:
            return False
        if not self._block_calls:
            self._reject()  # prose mentioning the tag, or cut off before the first name was certain
        elif p == len(buf) or (end is Scan.NEED and named is Scan.FAIL):
            self._end_call(len(buf), lstrip=True)  # the stop cut the block's closing tag
        elif self._length_cut(Scan.NEED in (named, end)):
            self._drop_tail()  # the length limit cut the next invoke's tag: the block's markup, no content
        else:
            self._end_call(p, lstrip=False)  # no invoke here: from here on, text
        return True

    def _pair_head(self, pos: int) -> tuple[str, int] | Scan:
        return parse_tag(self.buf, pos, PARAM_OPEN, MAX_KEY)

    def _body_close(self, pos: int) -> int | Scan:
        end = expect(self.buf, pos, INVOKE_CLOSE)
        if not isinstance(end, int):
            return end
        closes = invoke_closes(self.buf, end)  # only another invoke or the block's end follow an invoke
        return end if closes is True else Scan.NEED if closes is Scan.NEED else Scan.FAIL

    def _leave_body(self, end: int) -> None:
        self._close_args()  # the invoke ends; the block goes on (another invoke or its end)
        self.pos, self._phase = end, Phase.HEADER
