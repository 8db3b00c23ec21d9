"""`edgemoe serve` as a real subprocess pair (server + engine) on a free loopback port."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

READY = re.compile(r"^edgemoe ready on http://127\.0\.0\.1:(\d+) \(model (.+?)(; random weights)?\)$")
CLI = "import sys; from edgemoe.cli import main; sys.exit(main(sys.argv[1:]))"


class Served:
    """A running `edgemoe serve`; stdout lines are collected by a reader thread."""

    def __init__(self, *args: str) -> None:
        from edgemoe.testing.tokenizer_factory import cache_dir

        # The demo model was built in this cache by the session; the child reuses it.
        env = {**os.environ, "EDGEMOE_CACHE_DIR": str(cache_dir())}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLI, "serve", "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))

    def wait_ready(self, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no ready line; stderr:\n{self.stderr()}") from None
            if (m := READY.match(line)) is not None:
                self.url = f"http://127.0.0.1:{m.group(1)}"
                return m

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def wait_exit(self, timeout: float) -> tuple[int, float]:
        t0 = time.monotonic()
        code = self.proc.wait(timeout)
        return code, time.monotonic() - t0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def served(demo_dir: Path) -> Iterator[Any]:
    started: list[Served] = []

    def start(*args: str) -> Served:
        s = Served(*args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def _engine_pid(url: str) -> int:
    pid = httpx.get(f"{url}/debug/engine").json()["engine_pid"]
    assert isinstance(pid, int) and pid != os.getpid()
    return pid


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); the server reaps its child, so wait a moment.
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_answers_then_stops_cleanly(served: Any, sig: signal.Signals, demo_dir: Path) -> None:
    s = served()
    m = s.wait_ready()
    assert m.group(2) == demo_dir.name and m.group(3)  # the demo model says it is random weights
    client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="anything", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
    assert reply.choices[0].finish_reason in ("length", "stop")
    health = httpx.get(f"{s.url}/health").json()
    assert health["status"] == "ok" and health["model"] == demo_dir.name and health["uptime"] > 0
    engine_pid = _engine_pid(s.url)
    s.proc.send_signal(sig)
    code, took = s.wait_exit(10)
    assert code == 0, s.stderr()
    assert took < 5
    assert len(s.stdout) == 1  # exactly the ready line
    deadline = time.monotonic() + 3
    while not _gone(engine_pid):
        assert time.monotonic() < deadline, "the engine process outlived the server"
        time.sleep(0.05)


def test_engine_death_gives_503_and_nonzero_exit(served: Any) -> None:
    s = served()
    s.wait_ready()
    client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0, timeout=30)
    long = dict(model="m", messages=[{"role": "user", "content": "go"}], max_tokens=3000,
                extra_body={"ignore_eos": True})
    stream = client.chat.completions.create(stream=True, **long)
    next(iter(stream))
    result: dict[str, BaseException] = {}

    def plain() -> None:
        try:
            client.chat.completions.create(**long)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            result["plain"] = exc

    waiter = threading.Thread(target=plain)
    waiter.start()
    time.sleep(0.3)  # the plain request is in flight
    os.kill(_engine_pid(s.url), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    waiter.join(5)
    assert isinstance(result.get("plain"), openai.InternalServerError)
    assert result["plain"].status_code == 503  # type: ignore[attr-defined]
    assert time.monotonic() - t0 < 3
    code, _ = s.wait_exit(5)
    assert code != 0
    assert "engine" in s.stderr()


def test_bad_model_dir_fails_fast(served: Any, tmp_path: Path) -> None:
    s = served("--model", str(tmp_path / "missing"))
    code, _ = s.wait_exit(60)
    assert code != 0 and not s.stdout
    assert "missing" in s.stderr()


def test_a_refused_checkpoint_is_a_message_not_a_traceback(served: Any, tmp_path: Path) -> None:
    """The engine refuses the config at load: its message names the file and the field."""
    import json

    from edgemoe.testing.checkpoint import model_config, write_tokenizer_files

    (tmp_path / "config.json").write_text(json.dumps(model_config("olmoe", attention_bias=True)))
    write_tokenizer_files(tmp_path)
    s = served("--model", str(tmp_path))
    code, _ = s.wait_exit(120)
    err = s.stderr()
    assert code != 0 and not s.stdout
    assert f"{tmp_path / 'config.json'}: attention_bias=true" in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["port in use", "unresolvable host"])
def test_a_place_it_cannot_listen_on_is_named_and_the_engine_stops(served: Any, where: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = ("--port", str(taken.getsockname()[1])) if where == "port in use" else ("--host", "999.1.1.1")
        s = served(*args)
        code, _ = s.wait_exit(120)
    err = s.stderr()
    assert code != 0 and not any(READY.match(line) for line in s.stdout)
    assert f"edgemoe serve: error: cannot listen on --host {'127.0.0.1' if where == 'port in use' else '999.1.1.1'}" in err
    assert "Traceback" not in err


def test_random_preset_is_served_under_its_name_and_says_so(served: Any) -> None:
    spec = "random:tiny-qwen3-moe?num_hidden_layers=1"
    s = served("--model", spec)
    m = s.wait_ready()
    assert m.group(2) == spec and m.group(3) == "; random weights"
    models = httpx.get(f"{s.url}/v1/models").json()["data"]
    assert [d["id"] for d in models] == [spec]
    client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0, timeout=30)
    reply = client.chat.completions.create(model=spec, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].finish_reason in ("length", "stop")
    s.proc.send_signal(signal.SIGTERM)
    code, _ = s.wait_exit(10)
    assert code == 0
    log = s.stderr()
    assert "has random weights" in log and "host memory plan" in log
