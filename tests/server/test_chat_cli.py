"""`edgemoe chat` driven in a real terminal (tmux: send-keys, capture-pane): in-process on the
demo model, and against a running server by host:port. Streaming, thinking dimmed, the
commands, history on the arrow keys, Ctrl-C stopping an answer but not the program.

tmux comes from Debian (`make test` installs it); without it the test skips, except
under CI=true, where it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

DIM = "\x1b[2m"


class Terminal:
    """A tmux session running one command, 120 × 40."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.name = "edgemoe-test-" + uuid.uuid4().hex[:8]
        exports = " ".join(f"{k}={v!r}" for k, v in env.items())
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", "120", "-y", "40",
                        f"env {exports} {command}; echo EXITED $?; sleep 60"], check=True)

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def screen(self, escapes: bool = False) -> str:
        args = ["tmux", "capture-pane", "-p", "-J", "-S", "-200", "-t", self.name] + (["-e"] if escapes else [])
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout

    def wait(self, pattern: str, timeout: float = 60.0, after: int = 0) -> re.Match[str]:
        """The first match of `pattern` in the screen's text past character `after`."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if (m := re.compile(pattern, re.MULTILINE).search(text, after)) is not None:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} on the screen:\n{text}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator:  # noqa: ANN201
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed; under CI=true this test may not skip")
        pytest.skip("tmux is not installed (apt-get install tmux)")
    from edgemoe.assets.cache import cache_dir

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {"PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "EDGEMOE_CACHE_DIR": str(cache_dir()), "EDGEMOE_CHAT_HISTORY": str(tmp_path / "history"),
           "TERM": "xterm-256color"}
    opened: list[Terminal] = []

    def start(*args: str) -> Terminal:
        t = Terminal(" ".join([sys.executable, "-m", "edgemoe.cli", "chat", *args]), env)
        opened.append(t)
        return t

    yield start
    for t in opened:
        t.close()


def test_chat_in_process(terminal, tmp_path: Path) -> None:  # noqa: ANN001
    t = terminal("--max-tokens", "4000", "--thinking", "on")
    t.wait(r"Ctrl-D quits\n> $", timeout=120)
    assert "random weights" in t.screen()
    t.keys("hello there", "Enter")
    start = t.wait(r"> hello there\n").end()
    t.wait(r"\S", after=start)  # the answer streams
    time.sleep(0.5)
    assert DIM in t.screen(escapes=True)  # thinking is dimmed (the demo template opens <think>)
    t.keys("C-c")  # stops the answer, not the program
    stopped = t.wait(r"\[stopped · (\d+) tokens", after=start)
    assert int(stopped.group(1)) >= 1
    t.wait(r"\n> $", after=stopped.end())
    t.keys("/system be brief", "Enter")
    t.wait(r"system prompt: 'be brief'")
    t.keys("/stats", "Enter")
    t.wait(r"expert cache\s+100\.0% hits")
    t.keys("Up", "Up", "Up")  # history: /stats, /system be brief, hello there
    t.wait(r"\n> hello there$")
    t.keys("C-u", "/clear", "Enter")
    t.wait(r"conversation cleared")
    t.keys("second question", "Enter")
    again = t.wait(r"> second question\n").end()
    t.wait(r"\S", after=again)
    t.keys("C-c")
    t.wait(r"\[stopped", after=again)
    t.keys("C-d")
    t.wait(r"EXITED 0")
    assert "hello there" in (tmp_path / "history").read_text()


def test_chat_against_a_server(terminal, scripted) -> None:  # noqa: ANN001
    host_port = scripted.base_url.removeprefix("http://")  # host:port, no scheme
    t = terminal("--url", host_port, "--thinking", "off")
    t.wait(r"Ctrl-D quits\n> $", timeout=30)
    t.keys("hello", "Enter")
    done = t.wait(r"\[stop · (\d+) tokens")
    assert int(done.group(1)) > 10
    t.keys("/stats", "Enter")
    t.wait(r"throughput\s+prompt", after=done.end())
    t.keys("/exit", "Enter")
    t.wait(r"EXITED 0")
