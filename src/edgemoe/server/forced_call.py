"""Forced tool calls: `tool_choice` "required" or naming a function, by a forced opening.

The assistant's turn is made to start with the opening of a call in the format the
server parses, written as the model's own chat template writes an assistant tool call, so
the model continues in distribution (where the format's calls can be held, the grammar
then holds the rest of the call from inside the opening: `server/call_format.py`):

    format       named                                              required
    hermes       <tool_call>\\n{"name": "NAME", "arguments":         <tool_call>\\n{"name": "
    qwen3_coder  <tool_call>\\n<function=NAME>\\n                     <tool_call>\\n<function
    glm45        \\n<tool_call>NAME\\n (GLM-4.7: <tool_call>NAME)     \\n<tool_call> (GLM-4.7: <tool_call>)
    harmony      <|channel|>commentary to=functions.NAME             <|channel|>commentary to=functions
                 <|constrain|>json<|message|> (one line)
    deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>
                 (V3/R1: …function<｜tool▁sep｜>NAME\\n```json\\n)
    minimax_m2   <minimax:tool_call>\\n<invoke name="NAME">\\n             <minimax:tool_call>\\n<invoke name="

NOTE: each opening ends on a token boundary of the template's rendering of a whole call
(Qwen's tokenizer writes `":` then ` {"`, and `<` `function` then `=get`; GLM's `<arg_key>`
is a special token): an opening ending in the space before `{`, or in `=`, would split a
token the model was trained to produce in one piece. GLM's opening follows the template's
spelling (4.5/4.6 put a newline before `<tool_call>` and after the name, 4.7 none);
DeepSeek's too (V3.1's `NAME<｜tool▁sep｜>`, V3/R1's `function<｜tool▁sep｜>NAME` and a ```json
fence), its markers single tokens. MiniMax-M2's ends on the invoke's line (named) or at the
name's opening quote (`="` is one pre-token of GPT-style byte-level BPE), its block marker a
single token.
Harmony's follows the model's own spelling of a call after `<|start|>assistant` (the
template writes history as `<|start|>assistant to=… json<|message|>`); o200k's pre-tokenizer
starts a word at `.NAME`, so "required" stops at `to=functions`.

Harmony also opens the final channel (`<|channel|>final<|message|>`) for a response
format when no tool is active, so the format's constraint holds the answer, not the
channel's header (`answer_opening`).

The prompt ends with the opening (after the template and any prefill), rendered with
thinking off: the template closes an empty think block first, as it does for a turn
that calls a tool without reasoning; a template that leaves it open all the same
(MiniMax-M2's always ends `<think>\\n`) has it closed by the server (`</think>\\n\\n`).
Each choice's tool parser reads the opening as if the model had generated it
(`PrimedParser`): its tokens are not completion tokens and its text is no content,
unless the model's continuation does not make a valid call, when the parser does
exactly what it does with any invalid call it reads (the raw text, opening included,
becomes content). A length cut (max_tokens, the context) before the parser could read the
call's name back (e.g. `<tool_call>\n<function` + `=get_wea`) returns none of that text:
it is the opening plus an unfinished call, not a message (`PrimedParser`); after the name,
a cut call closes with its completed arguments as any call does (`parsers.base.ToolParser`).

Nothing is forced when tools are inactive (`tool_choice` "none", no tools), for raw
prompts, or when the model's chat template teaches no tool-call format we parse.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from edgemoe.server.errors import bad_request
from edgemoe.server.parsers import ParsedDelta, ResponseParser, ToolParser
from edgemoe.server.tool_functions import tool_functions
from edgemoe.structured.xml_tools import nameable

if TYPE_CHECKING:
    from edgemoe.server.generation_request import GenerationRequest
    from edgemoe.server.model import ServedModel


def call_opening(tool_format: str, name: str | None, template: str = "") -> str:
    """The opening of a call to `name` (None: any tool) in `tool_format`; '' if unknown.
    `template`: the chat template's source (GLM-4.7's spells calls without newlines)."""
    if tool_format == "hermes":
        if name is None:
            return '<tool_call>\n{"name": "'
        # The template writes the name raw; escaping keeps the JSON valid for the parser
        # (the same text for every name without quotes, backslashes or control characters).
        return '<tool_call>\n{"name": "' + json.dumps(name, ensure_ascii=False)[1:-1] + '", "arguments":'
    if tool_format == "qwen3_coder":
        return "<tool_call>\n<function" if name is None else f"<tool_call>\n<function={name}>\n"
    if tool_format == "glm45":
        from edgemoe.server.parsers import glm45  # parsers load when chosen (parsers/__init__.py)

        return glm45.call_opening(name, compact=glm45.compact_template(template))
    if tool_format == "harmony":
        from edgemoe.server.parsers import harmony

        return harmony.call_opening(name)
    if tool_format == "deepseek_v3":
        from edgemoe.server.parsers import deepseek_v3

        return deepseek_v3.call_opening(name, fenced=deepseek_v3.fenced_template(template))
    if tool_format == "minimax_m2":
        from edgemoe.server.parsers import minimax_m2

        return minimax_m2.call_opening(name)
    return ""


def forced_opening(model: ServedModel, req: GenerationRequest) -> str:
    """What a chat prompt for `req` must end with to force its tool call (or its answer:
    `answer_opening`); '' = nothing forced."""
    forcing = req.tool_choice == "required" or req.named_tool is not None
    if not (forcing and req.parse_output and req.tools and req.tool_choice != "none"):
        return answer_opening(model, req)
    if model.template is None or model.tool_parser is None or not model.teaches_calls:
        return ""  # no template, or one that never shows the model a call: an opening would be noise
    if req.named_tool is not None and not _writable(model.tool_parser, req.named_tool):
        raise bad_request(f"tool_choice names {req.named_tool!r}, a name the model's tool-call format "
                          f"({model.tool_parser}) cannot write", param="tool_choice")
    return call_opening(model.tool_parser, req.named_tool, model.template.source)


def answer_opening(model: ServedModel, req: GenerationRequest) -> str:
    """Harmony with a response format and no active tool: the prompt opens the final
    channel (thinking off, as for a forced call), so the format holds the answer itself."""
    if model.tool_parser != "harmony" or req.output_format is None or not req.parse_output:
        return ""
    if model.template is None or not model.teaches_calls or (req.tools and req.tool_choice != "none"):
        return ""
    from edgemoe.server.parsers.harmony import FINAL_OPENING

    return FINAL_OPENING


def _writable(tool_format: str, name: str) -> bool:
    """Whether the parser reads `name` back from a call to it: never a blank name, and in
    `<function=NAME>` none with a tag character or a line break, or with spaces around it."""
    if tool_format == "qwen3_coder":
        return nameable(name)  # the XML calls' grammar asks the same of a name
    if tool_format == "glm45":
        from edgemoe.server.parsers.glm45 import writable_name

        return writable_name(name)  # one run without blanks, tags, quotes or brackets
    if tool_format == "harmony":
        from edgemoe.server.parsers import harmony

        return harmony.writable_name(name)  # a header word: no blank, no marker
    if tool_format == "deepseek_v3":
        from edgemoe.server.parsers import deepseek_v3

        return deepseek_v3.writable_name(name)  # as glm45's: one run without blanks, tags, quotes or brackets
    if tool_format == "minimax_m2":
        from edgemoe.server.parsers import minimax_m2

        return minimax_m2.writable_name(name)  # an attribute: no tag, quote or line break, no blanks around it
    return bool(name.strip())


def check_tool_choice(req: GenerationRequest) -> None:
    """A `tool_choice` that forces a call needs a tool to call (400 otherwise, as OpenAI,
    Anthropic and vLLM answer; it was served as `auto`), and a named one must be in tools."""
    names = _tool_names(req.tools)
    if req.tool_choice == "required" and req.named_tool is None and not names:
        raise bad_request("tool_choice forces a tool call, but the request has no function tool to call "
                          "(none in tools, or none allowed)", param="tool_choice")
    if req.named_tool is not None and req.named_tool not in names:
        raise bad_request(f"tool_choice names {req.named_tool!r}, which is not in tools", param="tool_choice")


def _tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    return {function["name"] for function in tool_functions(tools)}


class PrimedParser(ResponseParser):
    """A tool parser that has read the forced opening; no reasoning stage (the template
    closed the think block before the opening; harmony's parser splits reasoning itself).

    `opening` is what reading the opening produced (a qwen3_coder call's start, its name
    being complete): the choice emits it before anything generated, streamed or not.

    A length cut before the parser could tell what the forced call is (nothing read back
    yet: `_undecided`) returns nothing of it: the text it holds is the server's own opening
    plus the model's unfinished continuation, markup rather than a message (`_cut_opening`).
    """

    def __init__(self, tools: ToolParser, opening: str) -> None:
        super().__init__(None, tools)
        self.opening: ParsedDelta = tools.feed(opening)
        self._undecided = self.opening.empty  # the parser still holds all of the call's text

    def feed(self, text: str) -> ParsedDelta:
        delta = super().feed(text)
        self._undecided = self._undecided and delta.empty
        return delta

    def finish(self, cut: bool = False) -> ParsedDelta:
        tail = super().finish(cut)
        return _cut_opening(tail) if cut and self._undecided else tail


def _cut_opening(tail: ParsedDelta) -> ParsedDelta:
    """What is left of a forced call the length limit cut before anything of it was read
    back: a call the end completed (a Hermes object read whole), none of the held text.
    (EOS or a stop there keep the rule of any invalid call: the raw text is content.)"""
    return tail if tail.tool_calls else ParsedDelta(reasoning=tail.reasoning)
