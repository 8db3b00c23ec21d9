#!/usr/bin/env python
"""Soak test: N concurrent clients hammer a local edgemoe server for a while.

    python scripts/soak.py --clients 8 --duration 60            # starts `edgemoe serve` (demo model)
    python scripts/soak.py --url http://127.0.0.1:1919 --duration 1800 --api-key KEY
    python scripts/soak.py --duration 60 -- --model /path/to/ckpt --cache-type radix   # serve flags

Each client loops over streaming chats, tool-call turns (with tools and a tool result
in the history), legacy completions, and Responses / Anthropic Messages streams when
the server has those routes; a share of requests disconnect on purpose (before the
first byte, i.e. mid-prefill, or mid-stream). It reports unexpected errors (any
non-200, error event, malformed or unterminated stream, hung request), client-side
TTFT p50/p99, and whether the server returned to idle with every KV page back
(`/v1/stats`: free + cached == total, nothing running). Exit status 0 only if clean.

Bounded on purpose: loopback servers only, at most 64 clients and one hour.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx

MAX_CLIENTS = 64
MAX_DURATION_S = 3600.0
REQUEST_TIMEOUT_S = 120.0  # a request taking longer than this counts as hung
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
WORDS = ("file function test error value return class module import change line path build "
         "config server client token cache page expert layer stream request model").split()
SYSTEM = "You are a coding agent. " + " ".join(WORDS[i % len(WORDS)] for i in range(240))
TOOLS = [{"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


class Unexpected(Exception):
    """Something a healthy server never does."""


@dataclass
class Tally:
    requests: dict[str, int] = field(default_factory=dict)
    disconnects: int = 0
    errors: list[str] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)

    def count(self, scenario: str) -> None:
        self.requests[scenario] = self.requests.get(scenario, 0) + 1


@dataclass
class Client:
    http: httpx.AsyncClient
    rnd: random.Random
    tally: Tally
    disconnect_rate: float
    max_tokens: int


# --------------------------------------------------------------------------- one request


def _user_text(rnd: random.Random) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(5, 120)))


async def _stream(c: Client, path: str, body: dict[str, Any], finished: Callable[[list[str]], bool]) -> None:
    """POST a streaming request; maybe hang up on purpose; check the stream ended well."""
    plan = c.rnd.random()
    if plan < c.disconnect_rate / 2:  # before the first byte: mid-prefill (or just after)
        try:
            await asyncio.wait_for(_read_stream(c, path, body, None, finished), c.rnd.uniform(0.0, 0.1))
        except asyncio.TimeoutError:
            c.tally.disconnects += 1
        return
    stop_after = c.rnd.randint(1, 8) if plan < c.disconnect_rate else None
    if not await _read_stream(c, path, body, stop_after, finished) and stop_after is not None:
        c.tally.disconnects += 1


async def _read_stream(c: Client, path: str, body: dict[str, Any], stop_after: int | None,
                       finished: Callable[[list[str]], bool]) -> bool:
    """True if the stream was read to its end (and checked), False if we hung up."""
    t0 = time.monotonic()
    lines: list[str] = []
    async with c.http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            raise Unexpected(f"{path}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line:
                continue
            if not lines:
                c.tally.ttft_s.append(time.monotonic() - t0)
            lines.append(line)
            if _is_error(line):
                raise Unexpected(f"{path}: error event: {line[:300]}")
            if stop_after is not None and len(lines) >= stop_after:
                return False
    if not finished(lines):
        raise Unexpected(f"{path}: the stream ended without its terminator (last: {lines[-1:]})")
    return True


def _is_error(line: str) -> bool:
    """An error event of any protocol (OpenAI `{"error"}`, Responses/Anthropic `type` error/failed)."""
    if line.startswith("event: error"):
        return True
    if not line.startswith("data: {"):
        return False
    event = json.loads(line[6:])  # malformed JSON raises: counted as unexpected
    kind = event.get("type")
    return kind in ("error", "response.failed") or (kind is None and "error" in event)


async def chat_stream(c: Client) -> None:
    body = {"model": "m", "stream": True, "max_tokens": c.rnd.randint(1, c.max_tokens),
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _user_text(c.rnd)}]}
    await _stream(c, "/v1/chat/completions", body, lambda lines: lines[-1] == "data: [DONE]")


async def tool_turn(c: Client) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    messages = [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Open a.py"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": _user_text(c.rnd)},
    ]
    body = {"model": "m", "messages": messages, "max_tokens": c.rnd.randint(1, c.max_tokens),
            "tools": [{"type": "function", "function": TOOLS[0]}], "stream": c.rnd.random() < 0.7}
    if body["stream"]:
        await _stream(c, "/v1/chat/completions", body, lambda lines: lines[-1] == "data: [DONE]")
        return
    r = await c.http.post("/v1/chat/completions", json=body)
    if r.status_code != 200 or r.json()["choices"][0]["finish_reason"] not in ("stop", "length", "tool_calls"):
        raise Unexpected(f"tool turn: HTTP {r.status_code}: {r.text[:300]}")


async def completion(c: Client) -> None:
    body = {"model": "m", "prompt": _user_text(c.rnd), "max_tokens": c.rnd.randint(1, c.max_tokens)}
    r = await c.http.post("/v1/completions", json=body)
    if r.status_code != 200 or r.json()["choices"][0]["finish_reason"] not in ("stop", "length"):
        raise Unexpected(f"completion: HTTP {r.status_code}: {r.text[:300]}")


async def responses_stream(c: Client) -> None:
    body = {"model": "m", "instructions": SYSTEM, "input": _user_text(c.rnd), "stream": True, "store": False,
            "max_output_tokens": c.rnd.randint(1, c.max_tokens),
            "tools": [{"type": "function", **TOOLS[0]}]}
    # `response.incomplete` is the normal end at max_output_tokens.
    await _stream(c, "/v1/responses", body,
                  lambda lines: '"response.completed"' in lines[-1] or '"response.incomplete"' in lines[-1])


async def anthropic_stream(c: Client) -> None:
    tool = {"name": TOOLS[0]["name"], "description": TOOLS[0]["description"], "input_schema": TOOLS[0]["parameters"]}
    body = {"model": "m", "system": SYSTEM, "max_tokens": c.rnd.randint(1, c.max_tokens), "stream": True,
            "messages": [{"role": "user", "content": _user_text(c.rnd)}], "tools": [tool]}
    await _stream(c, "/v1/messages", body, lambda lines: "message_stop" in "".join(lines[-2:]))


Scenario = Callable[[Client], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {
    "chat_stream": chat_stream, "tool_turn": tool_turn, "completion": completion,
    "responses_stream": responses_stream, "anthropic_stream": anthropic_stream,
}
OPTIONAL_ROUTES = {"responses_stream": "/v1/responses", "anthropic_stream": "/v1/messages"}


# --------------------------------------------------------------------------- the run


async def available_scenarios(http: httpx.AsyncClient) -> list[str]:
    """Every scenario whose route exists (an empty body gets 400 there, 404 elsewhere)."""
    names = []
    for name in SCENARIOS:
        route = OPTIONAL_ROUTES.get(name)
        if route is None or (await http.post(route, json={})).status_code != 404:
            names.append(name)
    return names


async def client_loop(c: Client, scenarios: list[str], deadline: float, min_requests: int = 0,
                      hard_deadline: float | None = None) -> None:
    """Requests until `deadline`, and past it until the clients have sent `min_requests`
    together (a slow host still soaks that much), but never past `hard_deadline`."""
    def going() -> bool:
        now = time.monotonic()
        if now < deadline:
            return True
        return sum(c.tally.requests.values()) < min_requests and now < (hard_deadline or deadline)

    while going():
        name = c.rnd.choice(scenarios)
        c.tally.count(name)
        try:
            await asyncio.wait_for(SCENARIOS[name](c), REQUEST_TIMEOUT_S)
        except asyncio.TimeoutError:
            c.tally.errors.append(f"{name}: no answer within {REQUEST_TIMEOUT_S:.0f} s")
        except (Unexpected, httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            c.tally.errors.append(f"{name}: {type(exc).__name__}: {exc}"[:400])


async def wait_idle(http: httpx.AsyncClient, timeout_s: float = 15.0) -> dict[str, Any]:
    """The server's idle state: nothing running and every KV page free or cached."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = (await http.get("/v1/stats")).json()
        engine, req = stats.get("engine"), stats["requests"]
        pool = engine["kv_pool"] if engine else None
        idle = req["running"] == 0 and req["queued"] == 0 and engine is not None and \
            engine["requests_running"] == 0 and engine["requests_waiting"] == 0
        back = pool is not None and pool["pages_free"] + pool["pages_cached"] == pool["pages_total"] \
            and pool["pages_in_use"] == 0
        if (idle and back) or time.monotonic() > deadline:
            return {"idle": idle, "kv_pool_back": back, "kv_pool": pool, "server_stats": stats}
        await asyncio.sleep(0.25)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


async def soak(url: str, *, clients: int, duration_s: float, disconnect_rate: float = 0.2,
               max_tokens: int = 32, seed: int = 0, api_key: str | None = None,
               min_requests: int = 0) -> dict[str, Any]:
    """Run the soak against `url`; returns the report (see `report_ok`). `min_requests`:
    go on past `duration_s` (up to 4x it) until the clients have sent that many."""
    check_bounds(url, clients, duration_s)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S, limits=limits) as http:
        scenarios = await available_scenarios(http)
        tally, t0 = Tally(), time.monotonic()
        rnd = random.Random(seed)
        loops = [client_loop(Client(http, random.Random(rnd.random()), tally, disconnect_rate, max_tokens),
                             scenarios, t0 + duration_s, min_requests, t0 + 4 * duration_s)
                 for _ in range(clients)]
        await asyncio.gather(*loops)
        elapsed = time.monotonic() - t0
        idle = await wait_idle(http)
    return {
        "url": url, "clients": clients, "duration_s": round(elapsed, 1), "scenarios": scenarios,
        "requests": sum(tally.requests.values()), "by_scenario": tally.requests, "disconnects": tally.disconnects,
        "errors": len(tally.errors), "error_samples": tally.errors[:20],
        "ttft_p50_s": percentile(tally.ttft_s, 50), "ttft_p99_s": percentile(tally.ttft_s, 99),
        "idle": idle["idle"], "kv_pool_back": idle["kv_pool_back"], "kv_pool": idle["kv_pool"],
        "server_stats": idle["server_stats"],
    }


def report_ok(report: dict[str, Any]) -> bool:
    return report["errors"] == 0 and report["idle"] and report["kv_pool_back"] and report["requests"] > 0


def check_bounds(url: str, clients: int, duration_s: float) -> None:
    host = urlparse(url).hostname or ""
    if host not in LOOPBACK:
        raise ValueError(f"the soak only targets loopback servers, not {host!r}")
    if not 1 <= clients <= MAX_CLIENTS:
        raise ValueError(f"--clients must be in [1, {MAX_CLIENTS}]")
    if not 0 < duration_s <= MAX_DURATION_S:
        raise ValueError(f"--duration must be in (0, {MAX_DURATION_S:.0f}] seconds")


# --------------------------------------------------------------------------- a local server

READY = re.compile(r"^edgemoe ready on (http://\S+) ")


@contextmanager
def local_server(serve_args: Sequence[str], timeout_s: float = 120.0) -> Iterator[str]:
    """`edgemoe serve --port 0 …` in a subprocess; yields its URL; stops it (SIGTERM) after."""
    command = [sys.executable, "-m", "edgemoe.cli", "serve", "--host", "127.0.0.1", "--port", "0", *serve_args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        url = _wait_ready(proc, timeout_s)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"edgemoe serve exited with {proc.returncode} before it was ready")
        if (m := READY.match(line)) is not None:
            return m.group(1)
    raise RuntimeError("edgemoe serve did not become ready in time")


# --------------------------------------------------------------------------- command line


def print_report(report: dict[str, Any]) -> None:
    fmt = lambda s: "-" if s is None else f"{s * 1000:.0f} ms"  # noqa: E731
    pool = report["kv_pool"] or {}
    print(f"soak: {report['clients']} clients for {report['duration_s']} s against {report['url']}")
    print(f"  requests      {report['requests']} {report['by_scenario']}, {report['disconnects']} disconnects")
    print(f"  errors        {report['errors']}")
    for sample in report["error_samples"]:
        print(f"    {sample}")
    print(f"  TTFT          p50 {fmt(report['ttft_p50_s'])}, p99 {fmt(report['ttft_p99_s'])}")
    print(f"  KV pool       {pool.get('pages_free')} free + {pool.get('pages_cached')} cached of "
          f"{pool.get('pages_total')} pages; back to full: {report['kv_pool_back']}; idle: {report['idle']}")
    print("PASS" if report_ok(report) else "FAIL")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="a running loopback server (default: start one)")
    p.add_argument("--api-key", default=os.environ.get("EDGEMOE_API_KEY"))
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=60.0, help="seconds")
    p.add_argument("--disconnect-rate", type=float, default=0.2, help="share of requests that hang up")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the report to this file")
    args = p.parse_args(argv)
    kwargs = dict(clients=args.clients, duration_s=args.duration, disconnect_rate=args.disconnect_rate,
                  max_tokens=args.max_tokens, seed=args.seed, api_key=args.api_key)
    if args.url is not None:
        report = asyncio.run(soak(args.url, **kwargs))
    else:
        check_bounds("http://127.0.0.1", args.clients, args.duration)
        with local_server(serve_args) as url:
            report = asyncio.run(soak(url, **kwargs))
    print_report(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0 if report_ok(report) else 1


if __name__ == "__main__":
    sys.exit(main())
