"""gpt-oss's harmony format: channels (reasoning / content) and tool calls, streamed.

The output after the prompt's ``<|start|>assistant`` is a run of messages::

    HEADER<|message|>BODY<|end|> <|start|>assistant HEADER<|message|>BODY<|call|> …

A HEADER holds ``<|channel|>CHANNEL``, maybe a recipient ``to=RECIPIENT`` (before or after
the channel) and a content type (``<|constrain|>json``, or a bare ``json`` as the published
template writes history). ``<|end|>``, ``<|call|>`` and ``<|return|>`` end a BODY (the last
two are EOS ids: the engine stops there and never shows them, so a body also ends with
the output). Each message becomes, by its header:

- recipient ``functions.NAME`` (or a bare NAME that is one of the request's tools), tools
  active: a tool call NAME whose arguments are the BODY, a JSON object, streamed as the
  Hermes parser streams them (``{"k": v`` / ``, "k": v`` per completed member, then ``}``;
  values re-serialised). A body that is no JSON object is content, no call; one cut off
  or broken after the call was announced closes the arguments with the completed
  members, and the rest of the body is content, unless a length limit (max_tokens, the
  context) cut it unfinished: then the rest is dropped (``ToolParser``). Whitespace after
  the object is dropped.
- channel ``analysis`` → reasoning; ``final``, ``commentary`` (a preamble the user may
  see) and any other channel → content. A recipient that is no function (the built-in
  ``python`` / ``browser.*`` tools) follows its channel.

Malformed text degrades to content, as harmony's own non-strict parser does: a header
that a line break, more than MAX_HEADER characters or no ``<|message|>`` before the end
shows to be none is plain text (its raw text is content, markers included); a header cut
off by a terminator or by the end of the output is dropped when it is framing (it began
with ``<|start|>`` or holds ``<|channel|>``). Whitespace between messages is dropped.

NOTE: the markers are special tokens: the detokenizer keeps them only with
``skip_special_tokens=False``, which the server sets for this format (generation.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum
from typing import Any, NamedTuple

from edgemoe.server.parsers.base import (
    BufferedToolParser,
    IdFactory,
    ParsedDelta,
    Scan,
    ToolCallDelta,
    ToolSpec,
    dumps,
    expect,
    hold_start,
    merge_call_deltas,
    skip_ws,
)
from edgemoe.server.parsers.hermes import MAX_NAME, Member, ObjectEnd, ValueScan, parse_member
from edgemoe.server.templates import normalize_messages
from edgemoe.tool_values import tool_schemas

START, END, MESSAGE = "<|start|>", "<|end|>", "<|message|>"
CHANNEL, CONSTRAIN = "<|channel|>", "<|constrain|>"
CALL, RETURN = "<|call|>", "<|return|>"
TERMINATORS = (END, CALL, RETURN)
FUNCTIONS = "functions."
MAX_HEADER = 512  # longer is no header (a recipient is a tool's name: at most MAX_NAME)
# The answer's channel, opened by the prompt when a response format holds it (forced_call).
FINAL_OPENING = f"{CHANNEL}final{MESSAGE}"

_TERMINATOR = re.compile("|".join(re.escape(t) for t in TERMINATORS))
_HEADER_END = re.compile("|".join(re.escape(t) for t in (MESSAGE, *TERMINATORS, START)) + r"|\n")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"([^\s<]*)")
_EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
            "xhigh": "high", "max": "high"}


class Header(NamedTuple):
    channel: str | None
    recipient: str | None


def parse_header(text: str) -> Header:
    """The channel and recipient of a message's header (the text before ``<|message|>``)."""
    channel = None
    m = _CHANNEL_NAME.search(text)
    if m is not None:
        channel, text = m.group(1), text[: m.start()] + " " + text[m.end() :]
    words = text.replace(CONSTRAIN, " ").split()
    recipient = next((w[3:] for w in words if w.startswith("to=")), None)
    return Header(channel or None, recipient or None)


def call_opening(name: str | None) -> str:
    """A forced call's opening after ``<|start|>assistant``, as the model writes a call.
    Any tool: up to ``to=functions``, a token boundary (``.NAME`` starts the next token)."""
    if name is None:
        return f"{CHANNEL}commentary to=functions"
    return f"{CHANNEL}commentary to={FUNCTIONS}{name} {CONSTRAIN}json{MESSAGE}"


def writable_name(name: str) -> bool:
    """Whether a call to `name` reads back as that name: a header word, no marker in it."""
    return 0 < len(name) <= MAX_NAME and not any(c.isspace() for c in name) and "<|" not in name


def template_effort(effort: str) -> str:
    """A request's reasoning effort as gpt-oss knows it (``Reasoning: low|medium|high``)."""
    return _EFFORTS.get(effort.lower(), effort)


def template_inputs(messages: list[dict[str, Any]], variables: dict[str, Any], thinking: bool,
                    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The conversation and template variables as gpt-oss's published template takes them:
    the effort as a level it knows (thinking off and no effort: "low", the least gpt-oss
    thinks), and a call turn's content (a commentary preamble, as this parser returns it)
    folded into that turn's reasoning, after it. NOTE: that template renders a call turn's
    content as its analysis, and refuses a turn with both (clients echo both back): the
    fold keeps a conversation going. Raises ChatInputError."""
    effort = variables.get("reasoning_effort")
    if isinstance(effort, str):
        variables = {**variables, "reasoning_effort": template_effort(effort)}
    elif effort is None and not thinking:
        variables = {**variables, "reasoning_effort": "low"}
    return [_fold_preamble(m) for m in normalize_messages(messages)], variables


def _fold_preamble(message: dict[str, Any]) -> dict[str, Any]:
    reasoning, content = message.get("thinking"), message.get("content")
    if message.get("role") != "assistant" or not message.get("tool_calls") or not (reasoning and content):
        return message
    joined = f"{reasoning}\n\n{content}"
    return {**message, "thinking": joined, "reasoning_content": joined, "content": ""}


class _State(Enum):
    HEADER = "header"  # reading a header, up to <|message|>
    BODY = "body"  # a reasoning or content body
    ARGS = "args"  # a call's body: its JSON object
    BETWEEN = "between"  # after a terminator: expecting <|start|>


class _Args(Enum):
    OPEN = "open"  # before the object's "{"
    MEMBERS = "members"  # committed: inside the object
    TAIL = "tail"  # after its "}": expecting the terminator


class HarmonyToolParser(BufferedToolParser):
    """Streaming parser for the harmony format (see the module docstring).

    It reads the whole output, reasoning included (``reads_whole_output``): its deltas
    carry reasoning, and no reasoning parser runs before it. With no tools, no message is
    a call (a function's message is content)."""

    reads_whole_output = True

    def __init__(self, tools: Sequence[ToolSpec] | None = None, id_factory: IdFactory | None = None) -> None:
        super().__init__(tools, id_factory)
        self._names = set(tool_schemas(self.tools))
        self.pos = 0
        self._state = _State.HEADER
        self._framed = False  # the header began after <|start|>: every word of it is framing
        self._reasoning_body = False
        self._args = _Args.OPEN
        self._name = ""  # the function the current call message calls
        self._members = 0
        self._memo = ValueScan()
        self._no_terminator_before = 0  # in a call's body: no terminator starts before this
        self._body: str | None = None  # the call's text up to its terminator, once that arrived
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCallDelta] = []

    def _drain(self, final: bool) -> ParsedDelta:
        while self._step(final):
            pass
        if self._state is not _State.ARGS:  # a call's positions stay valid: compact outside one
            self.buf, self.pos = self.buf[self.pos :], 0
        out = ParsedDelta("".join(self._content), "".join(self._reasoning), merge_call_deltas(self._calls))
        self._content, self._reasoning, self._calls = [], [], []
        return out

    def _step(self, final: bool) -> bool:
        if self._state is _State.HEADER:
            return self._step_header(final)
        if self._state is _State.BODY:
            return self._step_body(final)
        if self._state is _State.ARGS:
            return self._step_args(final)
        return self._step_between(final)

    # ------------------------------------------------------------------ headers

    def _step_header(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        end = _HEADER_END.search(buf, pos, pos + MAX_HEADER + len(MESSAGE))
        if end is None or end.start() > pos + MAX_HEADER:
            if len(buf) - pos > MAX_HEADER:
                return self._headerless(pos + MAX_HEADER)
            if final:
                self._header_cut(len(buf))
            return False
        if end.group() == "\n":
            return self._headerless(end.end())
        if end.group() == MESSAGE:
            self._open(parse_header(buf[pos : end.start()]))
            self.pos = end.end()
            return True
        self._header_cut(end.start())  # a terminator or <|start|>: the message has no body
        self._state = _State.BETWEEN
        return True

    def _headerless(self, cut: int) -> bool:
        """No header after all: its raw text up to `cut` and the rest of the body are content."""
        self._content.append(self.buf[self.pos : cut])
        self.pos, self._state, self._reasoning_body = cut, _State.BODY, False
        return True

    def _header_cut(self, end: int) -> None:
        """A header that ends at `end` without <|message|>: framing is dropped, plain text kept."""
        text = self.buf[self.pos : end]
        if not (self._framed or CHANNEL in text or CONSTRAIN in text):
            self._content.append(text)
        self.pos = end

    def _open(self, header: Header) -> None:
        name = self._function(header.recipient)
        if name is not None:
            self._name, self._state, self._args = name, _State.ARGS, _Args.OPEN
            self._no_terminator_before, self._body = 0, None
        else:
            self._state, self._reasoning_body = _State.BODY, header.channel == "analysis"

    def _function(self, recipient: str | None) -> str | None:
        """The function a message to `recipient` calls, if tools are active and it names one."""
        if not self.tools or recipient is None:
            return None
        name = recipient[len(FUNCTIONS) :] if recipient.startswith(FUNCTIONS) else recipient
        if recipient.startswith(FUNCTIONS) or name in self._names:
            return name if 0 < len(name) <= MAX_NAME else None
        return None

    def _step_between(self, final: bool) -> bool:
        p = skip_ws(self.buf, self.pos)
        self.pos = p
        for marker in (START, *TERMINATORS):
            r = expect(self.buf, p, marker)
            if isinstance(r, int):  # a terminator here ends a message that had no body
                self.pos = r
                self._framed = marker == START
                self._state = _State.HEADER if self._framed else _State.BETWEEN
                return True
            if r is Scan.NEED and not final:
                return False
        if p == len(self.buf):
            return False
        # Text where a message should start: a header without <|start|>, or plain text.
        self._state, self._framed = _State.HEADER, False
        return True

    # ------------------------------------------------------------------ bodies

    def _step_body(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        end = _TERMINATOR.search(buf, pos)
        if end is not None:
            self._emit(buf[pos : end.start()])
            self.pos, self._state = end.end(), _State.BETWEEN
            return True
        stop = len(buf) if final else min(hold_start(buf, pos, t, "") for t in TERMINATORS)
        self._emit(buf[pos:stop])
        self.pos = stop
        return False

    def _emit(self, text: str) -> None:
        if text:
            (self._reasoning if self._reasoning_body else self._content).append(text)

    def _as_content(self, at: int) -> bool:
        """The rest of the message from `at` is content (a body that is no call's JSON)."""
        self.pos, self._state, self._reasoning_body = at, _State.BODY, False
        return True

    # ------------------------------------------------------------------ calls

    def _call_text(self) -> tuple[str, bool]:
        """The call's text to parse, and whether its terminator has arrived (then the text
        stops there). Resumable: a long body is searched once, however many pieces it takes."""
        if self._body is not None:
            return self._body, True
        end = _TERMINATOR.search(self.buf, max(self.pos, self._no_terminator_before))
        if end is None:
            longest = max(len(t) for t in TERMINATORS)
            self._no_terminator_before = max(self._no_terminator_before, len(self.buf) - longest + 1)
            return self.buf, False
        self._body = self.buf[: end.start()]
        return self._body, True

    def _step_args(self, final: bool) -> bool:
        if self._args is _Args.OPEN:
            return self._step_open(final)
        if self._args is _Args.MEMBERS:
            return self._step_members(final)
        return self._step_tail(final)

    def _step_open(self, final: bool) -> bool:
        p = skip_ws(self.buf, self.pos)
        if p == len(self.buf):
            return False  # nothing yet (at the end: a call cut off before its body, no call)
        if self.buf[p] != "{":
            return self._as_content(self.pos)  # no JSON object: not a call
        self._calls.append(ToolCallDelta(self._count, self.new_id(), self._name, ""))
        self._count += 1
        self._members, self._memo = 0, ValueScan()
        self.pos, self._args = p + 1, _Args.MEMBERS
        return True

    def _step_members(self, final: bool) -> bool:
        # NOTE: a terminator ends the body wherever it stands, inside a string too (harmony's rule).
        text, ended = self._call_text()
        r = parse_member(text, self.pos, self._members == 0, self._memo)
        if isinstance(r, Member):
            sep = "{" if self._members == 0 else ", "
            self._members += 1
            self._piece(f"{sep}{dumps(r.key)}: {dumps(r.value)}")
            self.pos = r.end
            return True
        if isinstance(r, ObjectEnd):
            self._close_args()
            self.pos, self._args = r.end, _Args.TAIL
            return True
        if r is Scan.NEED and not ended and not final:
            return False
        self._close_args()  # broken, or cut off by the terminator or the end of the output
        if self._length_cut(r is Scan.NEED and not ended):
            return self._as_content(len(self.buf))  # the length limit cut it: the completed members only
        return self._as_content(self.pos)

    def _step_tail(self, final: bool) -> bool:
        p = skip_ws(self.buf, self.pos)
        self.pos = p
        if p == len(self.buf):
            return False
        results = [expect(self.buf, p, t) for t in TERMINATORS]
        done = next((r for r in results if isinstance(r, int)), None)
        if done is not None:
            self.pos, self._state = done, _State.BETWEEN
            return True
        if Scan.NEED in results and not final:
            return False
        if self._length_cut(Scan.NEED in results):
            return self._as_content(len(self.buf))  # the length limit cut the terminator: markup, no content
        return self._as_content(p)  # text after the object: content

    def _piece(self, arguments: str) -> None:
        self._calls.append(ToolCallDelta(self._count - 1, None, None, arguments))

    def _close_args(self) -> None:
        self._piece("}" if self._members else "{}")
