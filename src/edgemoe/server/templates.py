"""Chat templates from the checkpoint, rendered in a Jinja sandbox exactly like transformers.

The environment mirrors `transformers.utils.chat_template_utils` (5.x): the same
sandbox, whitespace settings, globals and filters, so a template renders here byte for
byte as `tokenizer.apply_chat_template(..., tokenize=False)` renders it. Before
rendering, OpenAI-style messages are normalised to what templates expect (string
content, dict tool arguments); anything a text-only model cannot take is refused.

NOTE: no loader is configured, so `{% include %}`/`{% import %}` cannot read files.
Renders are bounded in time and output size (`template_sandbox`), and a request's
`chat_template_kwargs` cannot replace what the server passes or the template's globals
(`RESERVED_VARIABLES`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils

from edgemoe.server.json_body import InvalidUnicode, find_surrogate
from edgemoe.server.names import Names
from edgemoe.server.template_sandbox import BoundedSandbox, RenderBudget, RenderLimits

if TYPE_CHECKING:
    from edgemoe.tokenizer import TokenizerBundle

__all__ = [
    "ChatInputError",
    "ChatTemplate",
    "TemplateRenderError",
    "UnsupportedContentError",
    "normalize_messages",
    "prompt_opens_thinking",
]

_TEXT_PARTS = Names({"text", "input_text", "output_text"})
_IMAGE_PARTS = Names({"image_url", "input_image", "image"})
# transformers fills `reasoning_content` (the standard name) and `thinking` (gpt-oss
# templates read it) from whichever of these names a message uses first.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatInputError(ValueError):
    """The request's messages cannot become a prompt; upstream answers HTTP 400."""


class UnsupportedContentError(ChatInputError):
    """A message carries content a text-only model cannot take (images, audio, files)."""


class TemplateRenderError(ChatInputError):
    """The chat template refused the conversation or failed while rendering it."""


# --------------------------------------------------------------------------- messages


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Turn OpenAI-style messages into the plain dicts chat templates expect. Pure.

    - content: a string stays; null becomes "" (as vLLM does: templates that concatenate
      `message['content']` fail on a missing key); a list of parts becomes its text parts
      joined with "\\n" (vLLM's choice for text-only models, so prompts match theirs).
    - image parts anywhere, and any other non-text part, raise UnsupportedContentError.
    - keys whose value is null are dropped (transformers does; templates test presence).
    - assistant tool_calls[].function.arguments as a JSON-object string becomes a dict
      (templates iterate or `tojson` it); "" / null become {}; other strings stay.
    - reasoning: `reasoning` / `thinking` alias `reasoning_content`, as in transformers.
    Idempotent, so rendering may apply it again.
    """
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatInputError(f"messages[{index}] must be an object, got {type(message).__name__}")
        msg = {key: value for key, value in message.items() if value is not None}
        msg["content"] = _content_text(message.get("content"), index)
        if isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = [_normalize_tool_call(call, f"messages[{index}].tool_calls[{i}]")
                                 for i, call in enumerate(msg["tool_calls"])]
        out.append(_alias_reasoning(msg))
    return out


def _content_text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatInputError(f"messages[{index}].content must be a string, null or a list of parts")
    texts: list[str] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in _IMAGE_PARTS:
            # NOTE: never render the data URL into the prompt; refuse the request.
            raise UnsupportedContentError(
                f"messages[{index}]: images are not supported: this is a text-only model"
            )
        else:
            raise UnsupportedContentError(
                f"messages[{index}]: content part of type {kind!r} is not supported (text only)"
            )
    return "\n".join(texts)


def _normalize_tool_call(call: object, where: str) -> object:
    """`where`'s call with its JSON-object `arguments` string as a dict (`normalize_messages`).
    A lone surrogate the JSON's escapes decode to is refused: the request body held it as
    plain text (`\\ud800` inside a string), which the body's own check can't see, and no
    tokenizer encodes it."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    arguments = function.get("arguments")
    if arguments is None or arguments == "":
        function["arguments"] = {}
    elif isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            # Not JSON, or JSON Python won't build: nested past the recursion limit, or an
            # integer of more digits than int() converts (both client text): stays a string.
            parsed = None
        if isinstance(parsed, dict):
            if (found := find_surrogate(parsed)) is not None:
                bad = InvalidUnicode(*found)  # its path escaped: a key may hold the surrogate
                raise ChatInputError(f"{where}.function.arguments holds invalid Unicode: its JSON decodes to a "
                                     f"lone surrogate (U+{ord(bad.char):04X}) at {bad.path}")
            function["arguments"] = ToolArguments(parsed, arguments)
    return {**call, "function": function}


class ToolArguments(dict):
    """A call's parsed arguments that are still their text where a template adds them to a
    string: Qwen's and GLM's templates iterate or `tojson` the object, DeepSeek's write
    `'<｜tool▁sep｜>' + arguments` (the client's JSON text, as sent)."""

    def __init__(self, parsed: dict[str, Any], text: str) -> None:
        super().__init__(parsed)
        self.text = text

    def __add__(self, other: object) -> str:
        if isinstance(other, str):
            return self.text + other
        return NotImplemented

    def __radd__(self, other: object) -> str:
        if isinstance(other, str):
            return other + self.text
        return NotImplemented


def _alias_reasoning(msg: dict[str, Any]) -> dict[str, Any]:
    # Same key order as transformers' `_alias_reasoning_fields`, for templates that
    # iterate over message items.
    reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
    if reasoning is None:
        return msg
    return {"thinking": reasoning, **msg, "reasoning_content": reasoning}


def prompt_opens_thinking(prompt: str, start: str = "<think>", end: str = "</think>") -> bool:
    """Whether the rendered prompt leaves a `<think>` block open, so generation starts in reasoning.

    Only the prompt's tail counts (after trailing whitespace): a `<think>` quoted in a user
    message earlier must not flip the reasoning parser.
    """
    tail = prompt.rstrip()
    return tail.endswith(start) and not tail.endswith(end)


# --------------------------------------------------------------------------- environment


class _GenerationBlock(jinja2.ext.Extension):
    """Parses `{% generation %}…{% endgeneration %}` (assistant-mask markers) as plain content.

    transformers renders the body unchanged; we never need the mask, only the text.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _TemplateDict:
    # `dict` without its class attributes, so templates cannot reach type internals.
    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    # Namespaces refuse underscore names, which could otherwise shadow internals.
    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_namespace_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes and sorts keys; templates expect plain json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> BoundedSandbox:
    env = BoundedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


# --------------------------------------------------------------------------- template

# Template mistakes and input the template cannot handle (e.g. `'a' + 1`) both mean
# "this conversation cannot be rendered": the client's request, not a server fault.
# TypeError also covers `{% include %}` with no loader; RecursionError a macro calling
# itself without end, MemoryError an allocation the size checks did not foresee.
_RENDER_ERRORS = (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError, RecursionError,
                  MemoryError)

# Names a request's template kwargs may not set: what `render` passes itself, the
# special tokens, and the environment's globals (`raise_exception`, `namespace`, …).
RESERVED_VARIABLES = frozenset({
    "messages", "tools", "documents", "add_generation_prompt", "enable_thinking", "bos_token", "eos_token",
    "pad_token", "unk_token", "raise_exception", "strftime_now", "range", "dict", "namespace", "cycler",
    "joiner", "lipsum",
})


class ChatTemplate:
    """A chat template compiled once; `render` is safe to call from any thread."""

    def __init__(
        self,
        source: str,
        bos_token: str | None = None,
        eos_token: str | None = None,
        *,
        name: str = "<chat_template>",
        limits: RenderLimits | None = None,
    ) -> None:
        """Compile `source`; `name` (the file it came from) labels compile errors."""
        self.source = source
        self.name = name
        self.limits = limits or RenderLimits()
        # NOTE: tokens that are None stay undefined, as in transformers: passing None
        # would print "None" in templates that write `{{ bos_token }}`.
        self._special = {k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token)) if v is not None}
        # A template that never names "developer" would reject that role or drop it.
        self.keeps_developer_role = "developer" in source
        try:
            self._template = _environment().compile_bounded(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"{name}: chat template does not compile (line {exc.lineno}): {exc.message}") from exc

    @classmethod
    def from_tokenizer(cls, bundle: TokenizerBundle, limits: RenderLimits | None = None) -> ChatTemplate | None:
        """The checkpoint's chat template, or None when it ships none."""
        if bundle.chat_template is None:
            return None
        name = str(bundle.chat_template_path) if bundle.chat_template_path else "<chat_template>"
        return cls(bundle.chat_template, bundle.bos_token, bundle.eos_token, name=name, limits=limits)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for `messages`, as transformers' apply_chat_template(tokenize=False).

        `enable_thinking` reaches the template only when set: templates test
        `enable_thinking is defined`. `template_kwargs` named in RESERVED_VARIABLES are
        dropped. Raises UnsupportedContentError or TemplateRenderError (also when the
        render goes past `self.limits`).
        """
        chat = normalize_messages(messages)
        if not self.keeps_developer_role:
            chat = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in chat]
        extra = {k: v for k, v in template_kwargs.items() if k not in RESERVED_VARIABLES}
        kwargs = {**extra, **self._special}
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        kwargs.update(
            messages=chat,
            tools=list(tools) if tools is not None else None,
            documents=None,  # transformers passes it, and `documents is none` must hold
            add_generation_prompt=add_generation_prompt,
        )
        try:
            with RenderBudget(self.limits):
                return self._template.render(**kwargs)
        except _RENDER_ERRORS as exc:
            # The template's own words (e.g. raise_exception's) are the most useful to clients.
            message = exc.message if isinstance(exc, jinja2.TemplateError) and exc.message else str(exc)
            raise TemplateRenderError(message or type(exc).__name__) from exc
