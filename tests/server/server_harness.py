"""Test harness: the real app in-process (uvicorn in a thread, real HTTP on loopback),
talking over the real ZMQ link to an engine loop (`edgemoe.engine.service.run_loop`)
in another thread. The engine is either the real `Engine` or `ScriptedEngine`, a
stand-in that emits chosen token sequences through the real detokenizer and stop
logic, so tool calls and reasoning go through the real parser path.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import uvicorn

from edgemoe.detokenizer import TextStream
from edgemoe.engine.service import EngineCrashed, EngineLike, run_loop
from edgemoe.messages import EngineReady, RequestOutput, SamplingParams, TokenLogprob
from edgemoe.server.app import create_app
from edgemoe.server.config import ServerConfig
from edgemoe.server.templates import ChatTemplate
from edgemoe.server.connections import uvicorn_options
from edgemoe.server.engine_client import EngineClient, EngineLink
from edgemoe.tokenizer import TokenizerBundle

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


@dataclass
class _Scripted:
    prompt_ids: list[int]
    params: SamplingParams
    plan: list[int]
    stream: TextStream
    output: list[int] = field(default_factory=list)
    hang: bool = False
    crash: bool = False


class ScriptedEngine:
    """An `EngineLike` that generates from scripts instead of a model.

    A prompt containing `[[NAME]]` emits `scripts[NAME]` (tokenised with the real
    tokenizer) then EOS. `[[hang]]` emits words until aborted (slowly), `[[crash]]`
    makes the next step raise. Otherwise it emits words chosen by a generator seeded
    from the request's seed (or the prompt when greedy), then EOS. One token per
    request per step; the rules for stop strings, stop ids, EOS, min/max tokens and
    the context length are the real engine's.
    """

    def __init__(self, tokenizer: TokenizerBundle, scripts: dict[str, str] | None = None,
                 max_model_len: int = 4096, vocab_size: int = 151936) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts or {}
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_ids = sorted(tokenizer.eos_token_ids)
        self.requests: dict[str, _Scripted] = {}
        self.seen: list[tuple[list[int], SamplingParams]] = []  # every accepted request
        self.ended: list[tuple[str, str | None]] = []  # (request id, finish reason), for diagnostics

    def ready(self, model_dir: Path) -> EngineReady:
        return EngineReady(model_dir=str(model_dir), model_type="qwen3_moe", max_model_len=self.max_model_len,
                           vocab_size=self.vocab_size, eos_token_ids=self.eos_ids, pid=0)

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> str:
        params.validate(self.vocab_size)
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens, the context length is {self.max_model_len}")
        text = self.tokenizer.decode(prompt_ids)
        req = _Scripted(prompt_ids, params, self._plan(text, prompt_ids, params),
                        TextStream.for_request(self.tokenizer.tokenizer, params),
                        hang="[[hang]]" in text, crash="[[crash]]" in text)
        self.requests[request_id] = req
        self.seen.append((prompt_ids, params))
        return request_id

    def _plan(self, text: str, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        for name, output in self.scripts.items():
            if f"[[{name}]]" in text:
                return self.tokenizer.encode(output, add_special_tokens=False) + self.eos_ids[:1]
        seed = params.seed if params.seed is not None else (hash(tuple(prompt_ids)) if params.temperature == 0 else None)
        rng = random.Random(seed)
        words = " ".join(rng.choice(WORDS) for _ in range(60)) + "."
        return self.tokenizer.encode(" " + words, add_special_tokens=False) + self.eos_ids[:1]

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.ended.append((request_id, "abort"))
        return self._out(request_id, req, [], req.stream.finish().text, "abort", None)

    def has_work(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        if any(r.crash for r in self.requests.values()):
            raise RuntimeError("scripted crash")
        if any(r.hang for r in self.requests.values()):
            time.sleep(0.01)
        return [self._advance(rid, req) for rid, req in list(self.requests.items())]

    def _advance(self, rid: str, req: _Scripted) -> RequestOutput:
        n = len(req.output)
        if req.hang:
            token = self.tokenizer.encode(" " + WORDS[n % len(WORDS)], add_special_tokens=False)[0]
        else:
            token = req.plan[min(n, len(req.plan) - 1)]
        req.output.append(token)
        p = req.params
        can_stop = len(req.output) >= p.min_tokens
        reason: tuple[str, str | int | None] | None = None
        text = ""
        if can_stop and token in p.stop_token_ids:
            reason = ("stop", token)
        elif can_stop and not p.ignore_eos and token in self.eos_ids:
            reason = ("stop", None)
        else:
            delta = req.stream.push(token)
            text = delta.text
            if delta.stopped:
                reason = ("stop", req.stream.stop_reason)
        if reason is None and p.max_tokens is not None and len(req.output) >= p.max_tokens:
            reason = ("length", None)
        if reason is None and len(req.prompt_ids) + len(req.output) >= self.max_model_len:
            reason = ("length", None)
        if reason is None:
            return self._out(rid, req, [token], text, None, None)
        del self.requests[rid]
        self.ended.append((rid, reason[0]))
        tail = req.stream.finish()
        return self._out(rid, req, [token], text + tail.text, *reason)

    def _out(self, rid: str, req: _Scripted, tokens: list[int], text: str,
             finish: str | None, stop: str | int | None) -> RequestOutput:
        logprobs = None
        if req.params.logprobs is not None and tokens:
            t = tokens[0]
            lp = -0.25 - 0.01 * (len(req.output) % 7)
            top = [((t + k) % self.vocab_size, lp - k) for k in range(req.params.logprobs)]
            logprobs = [TokenLogprob(t, lp, top)]
        return RequestOutput(request_id=rid, token_ids=tokens, text=text, logprobs=logprobs,
                             finished=finish is not None, finish_reason=finish, stop_reason=stop,
                             num_prompt_tokens=len(req.prompt_ids), num_output_tokens=len(req.output))


class ThreadHandle:
    """`EngineHandle` for an engine loop running in a thread."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread

    @property
    def pid(self) -> int | None:
        return None

    def alive(self) -> bool:
        return self.thread.is_alive()

    def exit_description(self) -> str:
        return "engine thread ended"


class ServerHarness:
    """Engine loop thread + app served by uvicorn in a thread, on a free loopback port."""

    def __init__(self, engine: EngineLike, ready: EngineReady, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self._dir = tempfile.mkdtemp(prefix="em-")
        link = EngineLink.in_dir(Path(self._dir))
        self._stop = threading.Event()
        self.engine_thread = threading.Thread(
            target=self._run_engine, args=(engine, ready, link), daemon=True, name="engine")
        self.dead: list[str] = []
        self.client = EngineClient(link, ThreadHandle(self.engine_thread), on_dead=self.dead.append)
        self.app = create_app(config, self.client)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning",
                                                    timeout_graceful_shutdown=1, **uvicorn_options(config)))
        self._server_thread = threading.Thread(target=self.server.run, daemon=True, name="uvicorn")
        self.base_url = ""

    def _run_engine(self, engine: EngineLike, ready: EngineReady, link: EngineLink) -> None:
        try:
            run_loop(engine, ready, link.to_engine, link.from_engine, keys=link.keys.engine_keys(), stop=self._stop)
        except EngineCrashed:
            pass

    def start(self, timeout: float = 30.0) -> ServerHarness:
        self.engine_thread.start()
        self._server_thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        while not self._healthy():
            assert time.monotonic() < deadline, "the server did not become healthy"
            time.sleep(0.02)
        return self

    def _healthy(self) -> bool:
        # NOTE: while the model loads in this process, its threads can starve ours past a
        # short --keep-alive-timeout, and the server then closes our idle connection.
        try:
            return httpx.get(f"{self.base_url}/health").status_code == 200
        except httpx.TransportError:
            return False

    def openai(self, api_key: str = "unused", **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key, max_retries=0, timeout=60, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self._server_thread.join(10)
        self._stop.set()
        self.engine_thread.join(10)
        shutil.rmtree(self._dir, ignore_errors=True)


MakeServer = Callable[..., ServerHarness]


def scripted_server(tokenizer: TokenizerBundle, scripts: dict[str, str], model_dir: Path,
                    model_type: str | None = None, config: ServerConfig | None = None, **engine: Any) -> ServerHarness:
    """A started server over a `ScriptedEngine` for the checkpoint files in `model_dir`
    (`model_type`: the family the engine reports; default the demo's; `config`: the server's)."""
    scripted = ScriptedEngine(tokenizer, scripts, **engine)
    ready = scripted.ready(model_dir)
    if model_type is not None:
        ready = msgspec.structs.replace(ready, model_type=model_type)
    return ServerHarness(scripted, ready, config or ServerConfig()).start()


def streamed_completion(client: openai.OpenAI, **request: Any) -> Any:
    """The completion the openai SDK assembles from the streamed response to `request`."""
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion()


def last_request(server: ServerHarness, tokenizer: TokenizerBundle) -> tuple[str, SamplingParams]:
    """The prompt text and the params of the last request the scripted engine accepted."""
    prompt_ids, params = server.engine.seen[-1]  # type: ignore[attr-defined]
    return tokenizer.decode(prompt_ids), params


DEMO_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def demo_with_template(demo_dir: Path, model_dir: Path, template: str) -> Path:
    """`model_dir`: the demo model's config and tokenizer with `template` as its chat template."""
    for name in DEMO_FILES:
        shutil.copy(demo_dir / name, model_dir / name)
    (model_dir / "chat_template.jinja").write_text(template)
    return model_dir


def add_tokens(model_dir: Path, first_id: int, contents: Sequence[str], special: bool) -> None:
    """`contents` added to `model_dir`'s tokenizer at ids first_id, first_id + 1, … (single
    tokens, as a family's own tokenizer has its markers)."""
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for i, content in enumerate(contents):
        config["added_tokens_decoder"][str(first_id + i)] = {"content": content, "special": special}
    config_path.write_text(json.dumps(config))


class ScriptedLLM:
    """What `edgemoe chat`'s in-process backend uses of `edgemoe.LLM`, with scripted output."""

    def __init__(self, tokenizer: TokenizerBundle, model_type: str, output: str) -> None:
        from types import SimpleNamespace

        self.tokenizer, self.output, self.params = tokenizer, output, None
        arch = SimpleNamespace(model_type=model_type)
        source = SimpleNamespace(name="scripted", random_weights=False)
        self.engine = SimpleNamespace(runtime=SimpleNamespace(source=source, model=SimpleNamespace(arch=arch)))

    def render_chat(self, messages: list[dict[str, Any]], *, enable_thinking: bool | None = None,
                    chat_template_kwargs: dict[str, Any] | None = None) -> str:
        template = ChatTemplate.from_tokenizer(self.tokenizer)
        assert template is not None
        return template.render(messages, add_generation_prompt=True, enable_thinking=enable_thinking,
                               **(chat_template_kwargs or {}))

    def stream(self, prompt: list[int], params: Any) -> Iterator[Any]:
        from types import SimpleNamespace

        self.params = params
        cut = len(self.output) // 3  # in pieces that split markers: the parser joins them
        for i, piece in enumerate((self.output[:cut], self.output[cut:2 * cut], self.output[2 * cut:])):
            yield SimpleNamespace(text=piece, token_ids=[0], finished=i == 2, finish_reason="stop" if i == 2 else None)
