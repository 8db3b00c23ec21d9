"""Shared pieces of the Responses / Anthropic tests: an engine that reports prefix-cache
hits and can fail midway, the scripts of a multi-turn tool conversation, and strict
validation helpers.

(Importable because conftest.py puts this folder on sys.path.)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter
from server_harness import ScriptedEngine, ServerHarness, _Scripted
from server_scripts import SCRIPTS

from edgemoe.messages import RequestOutput
from edgemoe.server.config import ServerConfig
from edgemoe.tokenizer import TokenizerBundle

T = TypeVar("T")

ANSWER = "It is sunny in Paris, 21 degrees."
# "[[answer]]" sits in the tool result, so it must win over "[[tool]]" earlier in the
# conversation: scripts are matched in dict order.
AGENT_SCRIPTS: dict[str, str] = {"answer": f"<think>\nThe tool answered.\n</think>\n\n{ANSWER}", **SCRIPTS}
FAIL_AFTER = 3  # "[[fail]]": the engine fails the request after this many tokens

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}


class CachingEngine(ScriptedEngine):
    """The scripted engine, plus what a prefix cache would report: each request's
    `num_cached_tokens` is its longest common prefix with any earlier prompt.
    A prompt with `[[fail]]` ends in an engine error after `FAIL_AFTER` tokens."""

    def __init__(self, tokenizer: TokenizerBundle, scripts: dict[str, str]) -> None:
        super().__init__(tokenizer, scripts)
        self._earlier: list[list[int]] = []
        self._cached: dict[str, int] = {}
        self._fail: set[str] = set()

    def add_request(self, prompt_ids: list[int], params: Any, request_id: str) -> str:
        super().add_request(prompt_ids, params, request_id)
        self._cached[request_id] = max((common_prefix(prompt_ids, p) for p in self._earlier), default=0)
        self._earlier.append(list(prompt_ids))
        if "[[fail]]" in self.tokenizer.decode(prompt_ids):
            self._fail.add(request_id)
        return request_id

    def last_cached(self) -> int:
        """What the last request was told its cached prefix is."""
        return list(self._cached.values())[-1]

    def _advance(self, rid: str, req: _Scripted) -> RequestOutput:
        if rid in self._fail and len(req.output) >= FAIL_AFTER:
            del self.requests[rid]
            return RequestOutput(request_id=rid, finished=True, finish_reason="error", error="scripted failure")
        return super()._advance(rid, req)

    def _out(self, rid: str, req: _Scripted, *args: Any) -> RequestOutput:
        out = super()._out(rid, req, *args)
        out.num_cached_tokens = self._cached.get(rid, 0)
        return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def start_caching_server(demo_dir: Path, tokenizer: TokenizerBundle, **config: Any) -> ServerHarness:
    engine = CachingEngine(tokenizer, AGENT_SCRIPTS)
    return ServerHarness(engine, engine.ready(demo_dir), ServerConfig(**config)).start()


def last_prompt(harness: ServerHarness, tokenizer: TokenizerBundle) -> str:
    return tokenizer.decode(harness.engine.seen[-1][0])  # type: ignore[attr-defined]


def strict(model: type[BaseModel] | Any, data: Any) -> Any:
    """Validate `data` against an SDK type (a model class or a union) in strict mode."""
    adapter: TypeAdapter[Any] = TypeAdapter(model)
    return adapter.validate_python(data, strict=True)


@contextmanager
def no_warnings() -> Iterator[None]:
    """Any warning the SDKs emit (e.g. pydantic serialisation warnings) fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    with no_warnings():
        return fn(*args, **kwargs)
