"""`edgemoe launch claude|codex|opencode [-- ARGS]`: a coding agent pointed at edgemoe.

1. Find the agent's command (`claude`, `codex`, `opencode` on PATH): a clear message and
   exit 127 when it is not installed, before anything starts.
2. Use the server at `--url` or, without it, one already answering on 127.0.0.1:1919;
   otherwise (or with `--new-server`) start `edgemoe serve` on a free port (every engine flag applies) with a
   fresh API key, in its own process group so the terminal's Ctrl-C reaches only the agent.
3. Run the agent with the settings docs/agents.md documents, passed so that the user's
   own files are never written: environment variables for Claude Code, `-c` overrides for
   Codex, `OPENCODE_CONFIG_CONTENT` for OpenCode. ARGS after `--` go to the agent.
4. When the agent exits, stop the server if this command started it; exit with the
   agent's status.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from edgemoe.ctl import DEFAULT_URL, server_url

AGENTS = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai"}
NAMES = {"claude": "Claude Code", "codex": "Codex", "opencode": "OpenCode"}
READY = re.compile(r"^edgemoe ready on (http://\S+) ")
START_TIMEOUT_S = 600.0  # a large model takes minutes to load
NOT_INSTALLED = 127  # the shell's "command not found"


@dataclass(frozen=True)
class Endpoint:
    url: str  # no trailing slash, no /v1
    api_key: str | None
    model: str  # the served name
    context: int  # the server's context length


def agent_command(agent: str) -> str | None:
    return shutil.which(agent)


def not_installed(agent: str) -> str:
    return (f"edgemoe launch: {NAMES[agent]} is not installed (no `{agent}` on PATH). Install it with\n"
            f"  npm install -g {AGENTS[agent]}\nthen run this again.")


def describe(url: str, api_key: str | None) -> Endpoint | None:
    """The served model behind `url`, or None when no edgemoe server answers there."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{url}/v1/models", headers=headers, timeout=3)
    except httpx.HTTPError:
        return None
    if r.status_code == 401:
        raise ValueError(f"the server at {url} wants an API key: --api-key KEY or $EDGEMOE_API_KEY")
    if r.status_code != 200:
        return None
    try:
        card = r.json()["data"][0]
        return Endpoint(url, api_key, card["id"], int(card.get("max_model_len") or 32768))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise ValueError(f"{url}/v1/models does not list a model as an edgemoe server does (--url)") from None


# --------------------------------------------------------------------------- agents' settings


# Claude Code compacts at its window less min(its output, 20,000) tokens, and its own prompt is
# ~12K: below this window compacting ahead cannot work, and the server's "prompt is too long"
# (reactive compaction) is the better signal.
CLAUDE_WINDOW_MIN = 32768


def claude_env(e: Endpoint) -> tuple[list[str], dict[str, str]]:
    env = {
        "ANTHROPIC_BASE_URL": e.url,
        "ANTHROPIC_AUTH_TOKEN": e.api_key or "edgemoe",  # any token: a keyless local server ignores it
        "ANTHROPIC_MODEL": e.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": e.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if e.context >= CLAUDE_WINDOW_MIN:  # a model it doesn't know is taken for a 1M window (2.1.337): no compaction
        env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(e.context)  # its window for a custom model id
    return [], env


def codex_env(e: Endpoint) -> tuple[list[str], dict[str, str]]:
    provider = (f'{{name = "edgemoe", base_url = "{e.url}/v1", wire_api = "responses", '
                f'env_key = "EDGEMOE_API_KEY"}}')
    overrides = [f'model="{e.model}"', 'model_provider="edgemoe"', f"model_context_window={e.context}",
                 f"model_providers.edgemoe={provider}"]
    return [arg for o in overrides for arg in ("-c", o)], {"EDGEMOE_API_KEY": e.api_key or "edgemoe"}


def opencode_env(e: Endpoint) -> tuple[list[str], dict[str, str]]:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"edgemoe": {
            "npm": "@ai-sdk/openai-compatible", "name": "edgemoe",
            "options": {"baseURL": f"{e.url}/v1", "apiKey": "{env:EDGEMOE_API_KEY}"},
            "models": {e.model: {"name": f"{e.model} (edgemoe)",
                                 "limit": {"context": e.context, "output": min(8192, e.context // 2)}}},
        }},
        "model": f"edgemoe/{e.model}",
    }
    return [], {"OPENCODE_CONFIG_CONTENT": json.dumps(config), "EDGEMOE_API_KEY": e.api_key or "edgemoe"}


SETTINGS: dict[str, Callable[[Endpoint], tuple[list[str], dict[str, str]]]] = {
    "claude": claude_env, "codex": codex_env, "opencode": opencode_env,
}


# --------------------------------------------------------------------------- the server we start


class StartedServer:
    """`edgemoe serve` on a free loopback port with a fresh key; its output goes to our stderr."""

    def __init__(self, settings: dict[str, Any]) -> None:
        from edgemoe.config import setting_argv

        self.api_key = secrets.token_urlsafe(24)
        argv = [sys.executable, "-m", "edgemoe.cli", "serve", "--port", "0", "--quiet", *setting_argv(settings)]
        # NOTE: the key travels in the environment, never argv (visible in the process list).
        env = {**os.environ, "EDGEMOE_API_KEY": self.api_key}
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, env=env,
                                     start_new_session=True)  # the terminal's Ctrl-C is the agent's

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> str:
        found: list[str] = []
        done = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if (m := READY.match(line)) is not None and not found:
                    found.append(m.group(1))
                    done.set()
            done.set()

        threading.Thread(target=read, daemon=True).start()
        done.wait(timeout)
        if not found:
            self.stop()
            raise RuntimeError("edgemoe serve did not start (its messages are above)")
        return found[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def add_launch_parser(sub: Any, add_engine_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    """`edgemoe launch`; `add_engine_flags`: the CLI's engine flags (passed in, as for
    `edgemoe chat`: this module is the CLI's, never the other way round)."""
    launch = sub.add_parser("launch", help="run Claude Code, Codex or OpenCode against edgemoe (starting a server if needed)",
                            description=__doc__.split("\n\n", 1)[1], usage="%(prog)s AGENT [flags] [-- ARGS for the agent]")
    launch.add_argument("agent", choices=tuple(AGENTS), help="the coding agent to run")
    launch.add_argument("--url", default=None,
                        help=f"use this server (URL or host:port) (default: {DEFAULT_URL} if one answers there, "
                             "else start one)")
    launch.add_argument("--new-server", action="store_true",
                        help=f"always start a server for this run, even when one answers at {DEFAULT_URL}")
    launch.add_argument("--api-key", default=os.environ.get("EDGEMOE_API_KEY"),
                        help="the key of the server at --url (default: $EDGEMOE_API_KEY)")
    add_engine_flags(launch)


def run_launch(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    agent_args = list(getattr(args, "agent_args", []))
    if args.url is not None and args.new_server:
        raise ValueError("--url uses a running server, --new-server starts one: give one of them")
    url = server_url(args.url if args.url is not None else DEFAULT_URL)
    command = agent_command(args.agent)
    if command is None:
        print(not_installed(args.agent), file=sys.stderr)
        return NOT_INSTALLED
    endpoint = None if args.new_server else describe(url, args.api_key)
    if args.url is not None and endpoint is None:
        raise ValueError(f"no edgemoe server answers at {url} (--url)")
    started = None
    if endpoint is None:
        print("edgemoe launch: starting edgemoe serve …", file=sys.stderr, flush=True)
        started = StartedServer(settings)
        try:
            endpoint = describe(started.wait_ready(), started.api_key)
            if endpoint is None:
                raise RuntimeError("the server started but does not answer")
        except RuntimeError as e:  # its own messages (the flag or file at fault) are above
            started.stop()
            print(f"edgemoe launch: {e}", file=sys.stderr)
            return 1
    elif settings:
        print(f"edgemoe launch: using the server at {endpoint.url}; engine flags are ignored", file=sys.stderr)
    extra_args, env = SETTINGS[args.agent](endpoint)
    print(f"edgemoe launch: {NAMES[args.agent]} → {endpoint.url} (model {endpoint.model})", file=sys.stderr, flush=True)
    try:
        return _run_agent([command, *extra_args, *agent_args], {**os.environ, **env})
    finally:
        if started is not None:
            started.stop()


def _run_agent(argv: list[str], env: dict[str, str]) -> int:
    """The agent in the foreground; Ctrl-C is its to handle, so we ignore it meanwhile."""
    proc = subprocess.Popen(argv, env=env)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
