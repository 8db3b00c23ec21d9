"""The Jinja sandbox chat templates render in, bounded in time and output size.

A chat template is code from the checkpoint, run on every chat request. Jinja's
`ImmutableSandboxedEnvironment` keeps it from reaching Python internals, but not from
spinning (nested `range(100000)` loops ran past 8 s) or allocating (`'a' * 2000000000`
took 2 GB). This environment adds, per render (`RenderBudget`, held per thread):

- a deadline, checked at every loop iteration (a check is inserted at the top of every
  `{% for %}` body when the template is compiled), every call (macros, methods,
  globals, filters) and every piece of output joined;
- an output limit in characters on everything a render builds: the output, macro and
  `{% set %}` block results, `~` concatenations, call and filter results, namespace
  attributes; operators that multiply sizes (`*`, `**`, `%`, `+`) and size arguments
  (`'a'.ljust(n)`, `center(n)`, format widths) are refused before they allocate.

Past either limit the render raises `TemplateLimitError` (a client error: HTTP 400).
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.nodes as nodes
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

# Format widths/precisions ("%2000000000s", "{:>2000000000}") allocate that many characters.
_FORMAT_WIDTH = re.compile(r"%[-+ #0]*(\d{7,})|%[-+ #0]*\d*\.(\d{7,})|\{[^{}]*:[^{}]*?(\d{7,})[^{}]*\}")
_SIZED = (str, list, tuple, dict)


class TemplateLimitError(jinja2.TemplateError):
    """A render went past its time or size limit."""


@dataclass(frozen=True)
class RenderLimits:
    timeout_s: float = 10.0
    max_output_chars: int = 128 * 2**20


class _Budget(threading.local):
    deadline: float = float("inf")
    limits: RenderLimits = RenderLimits()


_budget = _Budget()


class RenderBudget:
    """`with RenderBudget(limits):` bounds the renders this thread runs inside it."""

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits

    def __enter__(self) -> RenderBudget:
        _budget.limits = self.limits
        _budget.deadline = time.monotonic() + self.limits.timeout_s
        return self

    def __exit__(self, *exc: object) -> None:
        _budget.deadline = float("inf")
        _budget.limits = RenderLimits()


def tick() -> None:
    """Raise if this thread's render is past its deadline."""
    if time.monotonic() > _budget.deadline:
        raise TemplateLimitError(f"the chat template took longer than {_budget.limits.timeout_s:g} s to render")


def check_size(value: object) -> object:
    """Raise if `value` is a string or container past the output limit; return it."""
    limit = _budget.limits.max_output_chars
    if isinstance(value, _SIZED) and len(value) > limit:
        raise TemplateLimitError(f"the chat template built a value of {len(value)} items; the limit is {limit}")
    return value


def _check_request(size: int) -> None:
    limit = _budget.limits.max_output_chars
    if size > limit:
        raise TemplateLimitError(f"the chat template asked for {size} characters; the limit is {limit}")


def _check_arguments(args: Iterable[Any]) -> None:
    """Integers are sizes to some callee (`ljust(n)`, `indent(n)`): none past the limit."""
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool):
            _check_request(abs(arg))


def _check_format(fmt: object) -> None:
    """A format string's widths and precisions are sizes too."""
    if isinstance(fmt, str) and (m := _FORMAT_WIDTH.search(fmt)) is not None:
        _check_request(int(next(g for g in m.groups() if g)))


def bounded_concat(pieces: Iterable[str]) -> str:
    """`environment.concat`: joins every render's output, macro and block result."""
    out: list[str] = []
    size = 0
    for piece in pieces:
        size += len(piece)
        _check_request(size)
        tick()
        out.append(piece)
    return "".join(out)


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    # Arguments: [context/environment,] value, then the filter's own (checked as sizes).
    first = 2 if hasattr(fn, "jinja_pass_arg") else 1

    @functools.wraps(fn)  # keeps Jinja's pass_context/pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        tick()
        _check_arguments([*args[first:], *kwargs.values()])
        if name == "format":
            _check_format(args[first - 1] if len(args) >= first else None)
        return check_size(fn(*args, **kwargs))

    return bounded


class _BoundedFilters(dict[str, Any]):
    """The filter table: every filter, also those added later, wrapped by `_bounded_filter`."""

    def __init__(self, filters: dict[str, Any]) -> None:
        super().__init__()
        for name, fn in filters.items():
            self[name] = fn

    def __setitem__(self, name: str, fn: Any) -> None:
        super().__setitem__(name, _bounded_filter(name, fn))


class _Instrument(NodeTransformer):
    """Compile-time: a deadline check at the top of every loop body; `~` through a bounded join."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        call = nodes.Call(nodes.EnvironmentAttribute("edgemoe_tick"), [], [], None, None, lineno=node.lineno)
        node.body.insert(0, nodes.ExprStmt(call, lineno=node.lineno))
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        items = [self.visit(n) for n in node.nodes]
        return nodes.Call(nodes.EnvironmentAttribute("edgemoe_join"), items, [], None, None, lineno=node.lineno)


def _bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    # Jinja's `lipsum` writes n paragraphs of up to `max` words in one call: size it first.
    _check_request(abs(n) * abs(max) * 16)
    return str(generate_lorem_ipsum(n, html, min, max))


def _join(*items: Any) -> str:
    return bounded_concat(str(x) for x in items)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with the time and size bounds of this module (see its docstring)."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.concat = bounded_concat  # type: ignore[assignment]
        self.edgemoe_tick = tick
        self.edgemoe_join = _join
        self.globals["lipsum"] = _bounded_lipsum
        self.filters = _BoundedFilters(self.filters)

    def compile_bounded(self, source: str) -> jinja2.Template:
        """Compile `source` with the loop checks and bounded joins inserted."""
        tree = _Instrument().visit(self.parse(source))
        return self.from_string(tree)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        tick()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, _SIZED) and isinstance(n, int):
                    _check_request(len(seq) * max(n, 0))
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            _check_request(left.bit_length() * max(right, 0) // 8)  # the result's size in bytes
        elif operator == "%":
            _check_format(left)
        elif operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED):
            _check_request(len(left) + len(right))
        return check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        tick()
        _check_arguments([*args, *kwargs.values()])
        # The sandbox hands templates `str.format` wrapped; the wrapper keeps the bound method.
        method = getattr(__obj, "__wrapped__", __obj)
        receiver = getattr(method, "__self__", None)
        if isinstance(receiver, str) and getattr(method, "__name__", "") in ("format", "format_map"):
            _check_format(receiver)
        return check_size(super().call(__context, __obj, *args, **kwargs))
