"""Issue 11, item 6: a long prefill does not look dead. Streams start after one heartbeat
period without a token and send a heartbeat every period until it comes, in a form the
official SDKs skip (SSE comment on the OpenAI routes, `event: ping` on Anthropic's).

The ops engine's `[[prefill]]` prompts spend ~1.5 s before their first token; the
heartbeat here is 0.2 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from attack_support import assert_idle
from ops_support import PREFILL_STEPS, STEP_S, start_ops_server
from server_harness import ServerHarness

from edgemoe.tokenizer import TokenizerBundle

BEAT = 0.2
PREFILL_S = PREFILL_STEPS * STEP_S


@pytest.fixture(scope="module")
def ops(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = start_ops_server(demo_dir, demo_tokenizer, stream_heartbeat=BEAT)
    yield harness
    harness.stop()


ROUTES: dict[str, tuple[str, dict[str, Any], bytes]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "[[prefill]]"}]}, b": ping"),
    "completions": ("/v1/completions", {"prompt": "[[prefill]]"}, b": ping"),
    "responses": ("/v1/responses", {"input": "[[prefill]]"}, b": ping"),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "[[prefill]]"}]}, b"event: ping"),
}


def _timed_lines(base_url: str, path: str, body: dict[str, Any]) -> list[tuple[float, bytes]]:
    t0 = time.monotonic()
    out = []
    with httpx.stream("POST", base_url + path, json={"model": "m", "stream": True, "max_tokens": 4, **body},
                      timeout=10) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                out.append((time.monotonic() - t0, line.encode()))
    return out


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_heartbeats_until_the_first_token(ops: ServerHarness, route: str) -> None:
    path, body, ping = ROUTES[route]
    lines = _timed_lines(ops.base_url, path, body)
    # NOTE: the prefill lasts at least PREFILL_S (its steps sleep), so every ping before
    # 0.9 x PREFILL_S came before the first token.
    window = 0.9 * PREFILL_S
    early = [t for t, line in lines if line.startswith(ping) and t < window]
    # The response starts after one period (with a ping), then one per period.
    assert len(early) >= (window - BEAT) / BEAT - 1, lines[:12]
    gaps = [b - a for a, b in zip([0.0, *early], early)]
    assert max(gaps) < 3 * BEAT, gaps  # never silent for long (3x: a loaded CI machine's jitter)
    assert any(b"data:" in line for t, line in lines if t > window)  # and the answer came
    assert_idle(ops.base_url)


def test_openai_sdk_streams_through_heartbeats(ops: ServerHarness) -> None:
    client = ops.openai()
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "[[prefill]]"}], max_tokens=4, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and chunks[-1].choices[0].finish_reason == "length"
    events = list(client.responses.create(model="m", input="[[prefill]]", max_output_tokens=4, stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_anthropic_sdk_streams_through_heartbeats(ops: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=ops.base_url, api_key="unused", max_retries=0)
    with client.messages.stream(model="m", max_tokens=4,
                                messages=[{"role": "user", "content": "[[prefill]]"}]) as stream:
        message = stream.get_final_message()
    assert message.content and message.stop_reason == "max_tokens"
    assert message.usage.input_tokens > 0


def test_quick_streams_get_no_heartbeat(ops: ServerHarness) -> None:
    lines = _timed_lines(ops.base_url, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "hello"}]})
    assert not [line for _, line in lines if line.startswith(b":")]


def test_a_client_gone_during_the_heartbeats_aborts_the_prefill(ops: ServerHarness) -> None:
    before = len(ops.engine.aborted_in_prefill)
    with httpx.stream("POST", ops.base_url + "/v1/chat/completions", timeout=10,
                      json={"model": "m", "stream": True, **ROUTES["chat"][1]}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith(": ping")  # the response started while prefilling
    assert_idle(ops.base_url, timeout=1.0)
    assert len(ops.engine.aborted_in_prefill) == before + 1
