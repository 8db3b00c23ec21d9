"""`edgemoe chat`: a conversation in the terminal, with a model in this process or a running server.

    edgemoe chat                       # the demo model, in-process
    edgemoe chat --model DIR           # any model edgemoe loads (every engine flag applies)
    edgemoe chat --url 127.0.0.1:1919  # a running server

Answers stream as they are generated; thinking is shown dimmed. Line editing and
history with the arrow keys come from readline (kept in `chat_history` in the cache
directory, or `$EDGEMOE_CHAT_HISTORY`).
Ctrl-C stops the answer in progress (the request is aborted), not the program; Ctrl-D
or /exit quits. Commands: /clear, /system [TEXT], /stats, /help, /exit.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from edgemoe.chat_backends import (
    Answer,
    ChatBackend,
    LocalBackend,
    RemoteBackend,
    Sampling,
)

HELP = """commands:
  /clear          forget the conversation (the system prompt stays)
  /system [TEXT]  set the system prompt (no TEXT: show it; /system - : remove it)
  /stats          the engine's expert cache, KV cache and memory
  /help           this list
  /exit           quit (or Ctrl-D)
Ctrl-C stops an answer; the arrow keys walk through earlier inputs."""


class Style:
    """ANSI styling when writing to a terminal (and NO_COLOR is unset), else plain text."""

    def __init__(self, out: TextIO) -> None:
        self.on = out.isatty() and "NO_COLOR" not in os.environ

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[22m" if self.on else text

    def bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[22m" if self.on else text


class ChatSession:
    """The conversation and the commands; `backend` answers."""

    def __init__(self, backend: ChatBackend, system: str | None, out: TextIO = sys.stdout) -> None:
        self.backend, self.system, self.out = backend, system, out
        self.history: list[dict[str, Any]] = []
        self.style = Style(out)

    def messages(self) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.history

    def banner(self) -> str:
        note = " — random weights: its text means nothing" if self.backend.random_weights else ""
        return (f"edgemoe chat · model {self.style.bold(self.backend.name)}{note}\n"
                + self.style.dim("/help for commands · Ctrl-C stops an answer · Ctrl-D quits"))

    def command(self, line: str) -> bool:
        """Run a /command; False when it asks to quit."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/quit"):
            return False
        if name == "/clear":
            self.history.clear()
            self.say("conversation cleared")
        elif name == "/system":
            if arg == "-":
                self.system = None
            elif arg:
                self.system = arg
            self.say(f"system prompt: {self.system!r}" if self.system else "no system prompt")
        elif name == "/stats":
            self.say(self.backend.stats())
        elif name == "/help":
            self.say(HELP)
        else:
            self.say(f"unknown command {name}; /help lists them")
        return True

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def ask(self, text: str) -> None:
        """One turn: stream the answer; Ctrl-C stops it and keeps what came."""
        self.history.append({"role": "user", "content": text})
        answer, in_thought = Answer(), False
        try:
            with _stop_on_interrupt(self.backend):
                for piece in self.backend.stream(self.messages(), answer):
                    if piece.kind == "reasoning":
                        in_thought = True
                        self.out.write(self.style.dim(piece.text))
                    else:
                        if in_thought:
                            self.out.write("\n")
                            in_thought = False
                        self.out.write(piece.text)
                    self.out.flush()
                    answer.add(piece)
        except KeyboardInterrupt:
            answer.finish_reason = None
        except (ValueError, OSError) as exc:  # the server refused or went away: say so, keep going
            self.history.pop()
            self.say(f"\nerror: {exc}")
            return
        self.say("\n" + self.style.dim(f"[{answer.summary()}]"))
        self.history.append({"role": "assistant", "content": answer.content,
                             **({"reasoning_content": answer.reasoning} if answer.reasoning else {})})


@contextlib.contextmanager
def _stop_on_interrupt(backend: ChatBackend) -> Iterator[None]:
    """In-process: Ctrl-C asks the backend to stop between engine steps (an exception
    inside a step could leave the engine half updated). Over HTTP: Ctrl-C interrupts the
    read as usual, which closes the stream."""
    if not isinstance(backend, LocalBackend):
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: backend.stop())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _history_file() -> Path:
    """`$EDGEMOE_CHAT_HISTORY`, else `chat_history` in the cache directory."""
    from edgemoe.assets.cache import cache_dir

    return Path(os.environ.get("EDGEMOE_CHAT_HISTORY") or cache_dir() / "chat_history")


def _readline() -> Any:
    try:
        import readline
    except ImportError:  # not on every platform: plain input() then
        return None
    with contextlib.suppress(OSError):
        readline.read_history_file(_history_file())
    readline.set_history_length(1000)
    return readline


def repl(session: ChatSession, stdin: TextIO = sys.stdin) -> int:
    readline = _readline() if stdin.isatty() else None
    session.say(session.banner())
    try:
        while True:
            try:
                line = input("> ").strip()
            except KeyboardInterrupt:
                session.say("^C (Ctrl-D or /exit quits)")
                continue
            except EOFError:
                session.say("")
                return 0
            if not line:
                continue
            if line.startswith("/"):
                if not session.command(line):
                    return 0
                continue
            session.ask(line)
    finally:
        if readline is not None:
            with contextlib.suppress(OSError):
                _history_file().parent.mkdir(parents=True, exist_ok=True)
                readline.write_history_file(_history_file())


def add_chat_parser(sub: Any, add_engine_flags: Any) -> None:
    chat = sub.add_parser("chat", help="chat in the terminal, in-process (default: the demo model) or with --url a server",
                          description=__doc__.split("\n\n", 1)[1])
    chat.add_argument("--url", default=None, help="a running server (URL or host:port) instead of a model in this process")
    chat.add_argument("--api-key", default=os.environ.get("EDGEMOE_API_KEY"),
                      help="with --url: the server's key (default: $EDGEMOE_API_KEY)")
    chat.add_argument("--system", default=None, help="system prompt")
    chat.add_argument("--max-tokens", type=int, default=1024, help="most tokens per answer")
    chat.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the model's)")
    chat.add_argument("--thinking", choices=("on", "off"), default=None,
                      help="let the model think first (default: the template's, or the server's)")
    add_engine_flags(chat)


def _load(settings: dict[str, Any]) -> Any:
    """The engine in-process, with a progress bar and one line about it instead of the
    memory-plan tables `serve` prints (`edgemoe plan` shows those)."""
    from edgemoe import LLM

    print(f"loading {settings.get('model') or 'the demo model'} …", file=sys.stderr, flush=True)
    quiet = [logging.getLogger(n) for n in ("edgemoe.engine.build", "edgemoe.engine.device_plan",
                                            "edgemoe.engine.model_source")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        llm = LLM(progress=True, **settings)
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)
    plan, engine = llm.engine.runtime.plan, llm.engine
    slots = f", {plan.num_slots} expert slots" if plan.num_slots else ""
    print(f"moe backend {plan.backend}{slots}, KV cache {plan.kv_tokens} tokens, context {engine.max_model_len}",
          file=sys.stderr, flush=True)
    return llm


def run_chat(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from edgemoe.messages import SamplingParams

    sampling = Sampling(args.max_tokens, args.temperature, None if args.thinking is None else args.thinking == "on")
    chosen = {"max_tokens": args.max_tokens, **({} if args.temperature is None else {"temperature": args.temperature})}
    try:  # the engine's own bounds, here rather than on every turn (NaN too), named as flags
        SamplingParams(**chosen).validate()
    except ValueError as exc:
        field, _, why = str(exc).partition(" ")
        raise ValueError(f"--{field.replace('_', '-')} {why}") from None
    backend: ChatBackend
    if args.url is not None:  # given, even empty: never the in-process model instead
        from edgemoe.ctl import server_url

        if settings:
            raise ValueError(f"--url talks to a running server; engine flags ({', '.join(sorted(settings))}) "
                             "belong to `edgemoe serve` there")
        backend = RemoteBackend(server_url(args.url), args.api_key, sampling)
    else:
        backend = LocalBackend(_load(settings), sampling)
    try:
        return repl(ChatSession(backend, args.system))
    finally:
        backend.close()
